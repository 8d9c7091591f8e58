//! The named quotas' dirty ring: every path that changes a slot's
//! `pending` (or its rejection count) from a collected state queues the
//! slot, so a collection that reads only the ring misses nothing; a full
//! ring or a position never written falls back to a scan; and checks
//! racing a collector lose and double nothing.

use super::*;
use crate::core::{Nanos, Quota};
use crate::table::region::layout::FLAG_QUEUED;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

const SEC: Nanos = 1_000_000_000;

fn never() -> f64 {
    0.999_999
}

fn item(name: &[u8]) -> CheckItem<'_> {
    weighted(name, 1)
}

fn weighted(name: &[u8], weight: u64) -> CheckItem<'_> {
    CheckItem {
        name,
        key: None,
        weight,
        max_wait: None,
    }
}

/// A leaky quota no test load reaches.
fn wide(id: u64, name: &str) -> Quota {
    Quota::new(id, name, 1e9, 1e9, 2e9)
}

/// Collects with the ring alone: asserts first that nothing asked for a
/// scan of every slot, so a path that did not queue its slot loses its
/// delta here. Returns `(slot, net)` of each named delta.
fn collect_ring_only(t: &Table) -> Vec<(u32, i64)> {
    assert_eq!(
        t.region().header().slot_ring.overflow.load(Relaxed),
        0,
        "the collection would scan every slot"
    );
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    out.iter()
        .filter(|d| d.key == 0)
        .map(|d| (d.slot, d.delta as i64 - d.returned as i64))
        .collect()
}

/// A table of `quotas`, collected once (nothing queued, no scan asked).
fn drained(quotas: &[Quota]) -> Table {
    let t = Table::new_heap(64, 16);
    t.books().apply_quotas(quotas);
    t.books().collect_deltas(&mut Vec::new());
    t
}

#[test]
fn a_check_queues_its_whole_chain() {
    let t = drained(&[wide(1, "parent"), wide(2, "child").with_parent(Some(1))]);
    assert_eq!(t.gate().check(b"child", 3, SEC), Outcome::Pass);
    let mut got = collect_ring_only(&t);
    got.sort();
    let (child, parent) = (
        t.gate().lookup(b"child").unwrap(),
        t.gate().lookup(b"parent").unwrap(),
    );
    let mut want = vec![(parent, 3), (child, 3)];
    want.sort();
    assert_eq!(got, want);
    // Collected: nothing queued, nothing left.
    assert!(collect_ring_only(&t).is_empty());
}

#[test]
fn a_check_after_a_collection_queues_again_and_one_slot_is_queued_once() {
    let t = drained(&[wide(1, "q")]);
    for round in 1..=3u64 {
        for _ in 0..5 {
            t.gate().check(b"q", round, round * SEC);
        }
        let head = &t.region().header().slot_ring;
        assert_eq!(
            head.head.load(Relaxed) - head.tail.load(Relaxed),
            1,
            "five checks, one cell"
        );
        assert_eq!(collect_ring_only(&t), vec![(0, 5 * round as i64)]);
    }
}

#[test]
fn a_charge_queues_its_quota() {
    let t = drained(&[wide(1, "q")]);
    let charged = weighted(b"q", 4);
    t.gate().charge(&charged, SEC);
    assert_eq!(collect_ring_only(&t), vec![(0, 4)]);
}

#[test]
fn a_rejection_queues_its_quota_for_its_count() {
    let t = Table::new_heap(64, 16);
    t.books()
        .apply_quotas(&[Quota::new(1, "q", 0.0, 10.0, 10.0)]);
    assert_eq!(t.gate().check(b"q", 10, SEC), Outcome::Pass);
    t.books().collect_deltas(&mut Vec::new());
    assert_ne!(t.gate().check(b"q", 1, SEC), Outcome::Pass);
    assert_eq!(t.region().header().slot_ring.overflow.load(Relaxed), 0);
    let (mut out, mut rejected) = (Vec::new(), Vec::new());
    t.books()
        .collect_deltas_and_rejections(&mut out, &mut rejected);
    assert_eq!(rejected, vec![(1, 1)]);
    assert!(out.is_empty());
}

#[test]
fn a_return_after_a_collection_queues_its_quota() {
    let t = drained(&[wide(1, "q")]);
    let three = weighted(b"q", 3);
    t.gate().charge(&three, SEC);
    assert_eq!(collect_ring_only(&t), vec![(0, 3)]);
    // Settled lower than charged: two units back, from a collected
    // counter (its `pending` at zero).
    assert_eq!(t.gate().give_back(&item(b"q"), 2, SEC, SEC, false), 2);
    assert_eq!(collect_ring_only(&t), vec![(0, -2)]);
    // A settle does the same.
    t.gate().settle(&three, 3, SEC, SEC);
    t.books().collect_deltas(&mut Vec::new());
    let one = weighted(b"q", 1);
    t.gate().settle(&one, 3, SEC, SEC);
    assert_eq!(collect_ring_only(&t), vec![(0, -2)]);
}

fn uploads() -> Quota {
    Quota::new(1, "uploads", 4.0, 4.0, 4.0).in_flight_if(true)
}

#[test]
fn an_in_flight_release_after_a_collection_queues_its_quota() {
    let t = drained(&[uploads()]);
    let (_, held) = t.gate().acquire(&item(b"uploads"), SEC, false, never);
    assert_eq!(collect_ring_only(&t), vec![(0, 1)]);
    assert!(t.gate().release(&item(b"uploads"), held.unwrap(), 2 * SEC));
    assert_eq!(collect_ring_only(&t), vec![(0, -1)]);
}

#[test]
fn a_dead_process_slot_given_back_queues_its_quota() {
    const DEAD: u64 = 0x22_0000_0002;
    let t = drained(&[uploads()]);
    let (_, held) = t.gate().acquire(&item(b"uploads"), SEC, false, never);
    assert_ne!(
        t.gate().record_slot(&item(b"uploads"), held.unwrap(), DEAD),
        0
    );
    assert_eq!(collect_ring_only(&t), vec![(0, 1)]);
    assert_eq!(t.reclaim_abandoned_slots(2 * SEC, |_| false), 1);
    assert_eq!(collect_ring_only(&t), vec![(0, -1)]);
}

#[test]
fn weight_requeued_by_a_stopping_sync_thread_queues_its_quota() {
    let t = drained(&[wide(1, "q")]);
    t.gate().check(b"q", 5, SEC);
    assert_eq!(collect_ring_only(&t), vec![(0, 5)]);
    t.books().requeue_unacked(0, 1, 0, 5);
    assert_eq!(collect_ring_only(&t), vec![(0, 5)]);
}

#[test]
fn a_dead_sync_owners_weight_is_collected_again() {
    let t = drained(&[wide(1, "q")]);
    t.books().claim_sync();
    t.books().collect_deltas(&mut Vec::new());
    t.gate().check(b"q", 7, SEC);
    assert_eq!(collect_ring_only(&t), vec![(0, 7)]);
    let dead = super::tests::dead_pid();
    t.region().header().sync_owner.store(dead, Relaxed);
    assert_eq!(t.books().claim_sync(), Some(dead));
    assert_eq!(t.books().requeue_unacked_beyond(|_, _, _| 0), 7);
    // The claim asks for a scan (a new sync thread's rejection
    // baseline); the requeue queued the slot besides.
    t.region().header().slot_ring.overflow.store(0, Relaxed);
    assert_eq!(collect_ring_only(&t), vec![(0, 7)]);
}

#[test]
fn a_refused_keys_weight_shared_onto_its_template_queues_the_template() {
    let t = Table::new_heap_with_keys(16, 16, 64);
    t.books().apply_quotas(&[wide(1, "per_ip").keyed()]);
    t.books().collect_deltas(&mut Vec::new());
    let alice = CheckItem {
        key: Some(b"alice"),
        weight: 3,
        ..item(b"per_ip")
    };
    t.gate()
        .check_many(&[alice], SEC, CheckOptions::default(), never);
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!(out.len(), 1);
    let key = out[0].key;
    assert_ne!(key, 0);
    // A root refused the key: its 3 units go onto the template's own
    // counter (overflow mode `shared`), to be sent as the template's.
    assert!(t.books().refuse_key(0, 1, key, 3, SEC));
    assert_eq!(collect_ring_only(&t), vec![(0, 3)]);
}

#[test]
fn an_adopted_tables_pending_weight_is_collected() {
    let old = drained(&[wide(1, "q")]);
    old.gate().check(b"q", 6, SEC);
    let t = drained(&[]);
    t.books().adopt(old.books(), SEC);
    assert_eq!(
        collect_ring_only(&t),
        vec![(t.gate().lookup(b"q").unwrap(), 6)]
    );
}

#[test]
fn a_quota_edit_keeps_the_queued_flag() {
    let t = drained(&[wide(1, "q")]);
    t.gate().check(b"q", 2, SEC);
    t.books()
        .apply_quotas(&[Quota::new(1, "q", 5e8, 1e9, 2e9).at_epoch(2)]);
    assert_ne!(t.region().slots()[0].flags.load(Relaxed) & FLAG_QUEUED, 0);
    assert_eq!(collect_ring_only(&t), vec![(0, 2)]);
    assert_eq!(t.region().slots()[0].flags.load(Relaxed) & FLAG_QUEUED, 0);
}

#[test]
fn a_full_ring_falls_back_to_one_scan_and_loses_nothing() {
    // 1,000 slots: a ring of 125 cells.
    let t = Table::new_heap(1000, 16);
    let quotas: Vec<Quota> = (0..1000).map(|i| wide(i + 1, &format!("q{i}"))).collect();
    t.books().apply_quotas(&quotas);
    t.books().collect_deltas(&mut Vec::new());
    assert_eq!(t.region().slot_ring().len(), 125);
    for (i, q) in quotas.iter().enumerate() {
        t.gate().check(q.name.as_bytes(), i as u64 % 7 + 1, SEC);
    }
    assert_eq!(t.region().header().slot_ring.overflow.load(Relaxed), 1);
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!(out.len(), 1000);
    for d in &out {
        assert_eq!(d.delta, u64::from(d.slot) % 7 + 1);
    }
    // Every queued flag was cleared: the next cycle is the ring's again.
    t.gate().check(b"q5", 1, 2 * SEC);
    t.gate().check(b"q999", 2, 2 * SEC);
    let mut got = collect_ring_only(&t);
    got.sort();
    assert_eq!(got, vec![(5, 1), (999, 2)]);
}

#[test]
fn a_position_never_written_is_skipped_and_its_slot_found_by_a_scan() {
    let t = drained(&[wide(1, "a"), wide(2, "b")]);
    // A producer that reserved a position and died before writing it.
    t.region().header().slot_ring.head.fetch_add(1, Relaxed);
    t.gate().check(b"b", 4, SEC);
    let mut total = 0;
    for _ in 0..20 {
        let mut out = Vec::new();
        t.books().collect_deltas(&mut out);
        total += out.iter().map(|d| d.delta).sum::<u64>();
    }
    assert_eq!(total, 4);
    // The ring moves again.
    t.gate().check(b"a", 1, SEC);
    assert_eq!(collect_ring_only(&t), vec![(0, 1)]);
}

#[test]
fn the_early_sync_probe_reads_the_queued_slots_and_scans_after_an_overflow() {
    let t = Table::new_heap(1000, 16);
    let quotas: Vec<Quota> = (0..1000)
        .map(|i| Quota::new(i + 1, format!("q{i}"), 10.0, 100.0, 300.0))
        .collect();
    t.books().apply_quotas(&quotas);
    t.books().collect_deltas(&mut Vec::new());
    t.gate().check(b"q3", 20, SEC);
    assert!(t.books().unsent_beyond(0.1));
    assert!(!t.books().unsent_beyond(0.2));
    t.books().collect_deltas(&mut Vec::new());
    assert!(!t.books().unsent_beyond(0.1));
    // 200 slots queued in a ring of 125: the one beyond the fraction is
    // the last, past the ring.
    for q in &quotas[..199] {
        t.gate().check(q.name.as_bytes(), 1, SEC);
    }
    t.gate().check(b"q199", 20, SEC);
    assert!(t.books().unsent_beyond(0.1));
}

#[test]
fn checks_racing_a_collector_lose_and_double_nothing() {
    // 500 quotas, a ring of 64 cells: the collector drains while checks
    // queue, and overflows make some collections scans.
    let t = Table::new_heap(500, 16);
    let quotas: Vec<Quota> = (0..500).map(|i| wide(i + 1, &format!("q{i}"))).collect();
    t.books().apply_quotas(&quotas);
    let names: Vec<String> = quotas.iter().map(|q| q.name.clone()).collect();
    let admitted = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let mut collected = vec![0i64; 500];
    std::thread::scope(|scope| {
        let (t, stop) = (&t, &stop);
        let collected = &mut collected;
        let collector = scope.spawn(move || {
            let mut out = Vec::new();
            while !stop.load(Relaxed) {
                out.clear();
                t.books().collect_deltas(&mut out);
                for d in &out {
                    collected[d.slot as usize] += d.delta as i64 - d.returned as i64;
                }
            }
        });
        let checkers: Vec<_> = (0..3u64)
            .map(|thread| {
                let (names, admitted) = (&names, &admitted);
                scope.spawn(move || {
                    let mut net = 0u64;
                    let mut x = thread * 7919 + 1;
                    for n in 0..60_000u64 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let name = names[(x >> 33) as usize % names.len()].as_bytes();
                        let weight = n % 3 + 1;
                        if t.gate().check(name, weight, SEC) == Outcome::Pass {
                            net += weight;
                        }
                        // Now and then a unit back, which may take
                        // `pending` below zero (a return).
                        if n % 5 == 0 {
                            net -= t.gate().give_back(&item(name), 1, SEC, SEC, false);
                        }
                    }
                    admitted.fetch_add(net, Relaxed);
                })
            })
            .collect();
        for c in checkers {
            c.join().unwrap();
        }
        stop.store(true, Relaxed);
        collector.join().unwrap();
    });
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    for d in &out {
        collected[d.slot as usize] += d.delta as i64 - d.returned as i64;
    }
    let total: i64 = collected.iter().sum();
    assert_eq!(total, admitted.load(Relaxed) as i64);
    for (i, q) in quotas.iter().enumerate() {
        let state = t.quota(q.name.as_bytes(), SEC).unwrap();
        assert_eq!(state.pending, 0, "{}", q.name);
        assert_eq!(state.unacked, collected[i], "{}", q.name);
    }
}

#[test]
fn a_key_queued_while_its_ring_was_full_and_back_at_zero_is_queued_again() {
    // 256 keys: a key ring of 64 cells.
    let t = Table::new_heap_with_keys(16, 16, 256);
    t.books().apply_quotas(&[wide(1, "per_ip").keyed()]);
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    fn keyed(k: &str, weight: u64) -> CheckItem<'_> {
        CheckItem {
            key: Some(k.as_bytes()),
            weight,
            ..item(b"per_ip")
        }
    }
    for k in &keys {
        t.gate()
            .check_many(&[keyed(k, 1)], SEC, CheckOptions::default(), never);
    }
    // The last key was queued on a full ring; its unit comes back.
    let last = keyed(&keys[99], 1);
    assert_eq!(t.gate().give_back(&last, 1, SEC, SEC, false), 1);
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!(out.len(), 99);
    // Checked again: collected with the ring alone.
    t.gate()
        .check_many(&[keyed(&keys[99], 2)], SEC, CheckOptions::default(), never);
    out.clear();
    t.books().collect_deltas(&mut out);
    assert_eq!(out.iter().map(|d| d.delta).collect::<Vec<_>>(), vec![2]);
}
