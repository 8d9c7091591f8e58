//! In-flight slots in the table: taken and given back on the request
//! path, never leaking, and what a sync collects of them.

use super::*;
use crate::core::{Nanos, Quota};
use crate::wire::CounterKey;

const SEC: Nanos = 1_000_000_000;

fn never() -> f64 {
    0.999_999
}

fn named(name: &[u8]) -> CheckItem<'_> {
    CheckItem {
        name,
        key: None,
        weight: 1,
        max_wait: None,
    }
}

fn uploads(limit: f64) -> Quota {
    Quota::new(1, "uploads", limit, limit, limit).in_flight_if(true)
}

#[test]
fn three_slots_take_three_requests_and_a_release_lets_the_fourth_in() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(3.0)]);
    assert!(t.gate().is_in_flight(b"uploads") && !t.gate().is_in_flight(b"nobody"));
    let mut held = Vec::new();
    for _ in 0..3 {
        let (r, slot) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
        assert_eq!(r.outcome, Outcome::Pass);
        held.push(slot.unwrap());
    }
    // An hour later the three are still held: a slot does not leak.
    let (r, slot) = t
        .gate()
        .acquire(&named(b"uploads"), 3600 * SEC, false, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)) && slot.is_none());
    assert!(t
        .gate()
        .release(&named(b"uploads"), held.pop().unwrap(), 3600 * SEC));
    let (r, _) = t
        .gate()
        .acquire(&named(b"uploads"), 3600 * SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass);
}

#[test]
fn a_dry_run_holds_nothing() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(1.0)]);
    let (r, slot) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
    assert_eq!((r.outcome, slot.is_some()), (Outcome::Pass, true));
    let (r, slot) = t.gate().acquire(&named(b"uploads"), SEC, true, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)) && slot.is_none());
    assert_eq!(t.quota(b"uploads", SEC).unwrap().dry_run, 1);
}

#[test]
fn a_request_that_starts_and_ends_between_syncs_never_leaves_the_host() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(3.0)]);
    let (_, slot) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
    t.gate().release(&named(b"uploads"), slot.unwrap(), 2 * SEC);
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_slot_released_after_its_sync_travels_as_a_return() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(3.0)]);
    let (_, slot) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!((out[0].delta, out[0].returned), (1, 0));
    t.gate().release(&named(b"uploads"), slot.unwrap(), 2 * SEC);
    out.clear();
    t.books().collect_deltas(&mut out);
    assert_eq!((out[0].delta, out[0].returned), (0, 1));
}

#[test]
fn a_keys_slots_are_its_own() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books().apply_quotas(&[uploads(1.0).keyed()]);
    let keyed = |key: &'static [u8]| CheckItem {
        key: Some(key),
        ..named(b"uploads")
    };
    let (a, held) = t.gate().acquire(&keyed(b"alice"), SEC, false, never);
    let (b, _) = t.gate().acquire(&keyed(b"bob"), SEC, false, never);
    assert_eq!((a.outcome, b.outcome), (Outcome::Pass, Outcome::Pass));
    let (again, _) = t.gate().acquire(&keyed(b"alice"), SEC, false, never);
    assert!(matches!(again.outcome, Outcome::Reject(_)));
    t.gate().release(&keyed(b"alice"), held.unwrap(), 2 * SEC);
    let (again, _) = t.gate().acquire(&keyed(b"alice"), 2 * SEC, false, never);
    assert_eq!(again.outcome, Outcome::Pass);
}

#[test]
fn the_table_shows_an_in_flight_quota_with_its_limit() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(7.0)]);
    let q = t.quota(b"uploads", SEC).unwrap().quota;
    assert!(q.in_flight);
    assert_eq!((q.limit, q.low_burst, q.high_burst), (7.0, 7.0, 7.0));
    let terms = t.terms_of(t.gate().lookup(b"uploads").unwrap()).unwrap();
    assert_eq!(terms.to_string(), "7 at once");
}

#[test]
fn a_charge_or_settle_of_an_in_flight_quota_counts_nothing() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(2.0)]);
    let (_, slot) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
    assert!(slot.is_some());
    let five = CheckItem {
        weight: 5,
        ..named(b"uploads")
    };
    // A charge would hold slots nobody gives back; a settle below its
    // estimate would free the slot still held.
    assert_eq!(t.gate().charge(&five, SEC).outcome, Outcome::Unknown);
    assert_eq!(
        t.gate().settle(&named(b"uploads"), 5, SEC, SEC).outcome,
        Outcome::Unknown
    );
    let level = t.quota(b"uploads", SEC).unwrap().level;
    assert_eq!(level, 1.0);
    let (r, _) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass);
    let (r, _) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)));
}

#[test]
fn held_here_is_the_slots_this_host_holds_whatever_was_collected_or_handed_back() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(10.0)]);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            t.gate()
                .acquire(&named(b"uploads"), SEC, false, never)
                .1
                .unwrap(),
        );
    }
    assert_eq!(t.books().held_here(b"uploads"), Some(3));
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!(t.books().held_here(b"uploads"), Some(3));
    // A release after the collection, collected as a return.
    t.gate()
        .release(&named(b"uploads"), held.pop().unwrap(), 2 * SEC);
    assert_eq!(t.books().held_here(b"uploads"), Some(2));
    out.clear();
    t.books().collect_deltas(&mut out);
    assert_eq!(
        (out[0].returned, t.books().held_here(b"uploads")),
        (1, Some(2))
    );
    // A stopping sync thread hands what it had unacked back to pending;
    // a new slot is not collected yet.
    t.books().requeue_unacked(out[0].slot, 1, 0, -1);
    t.gate().acquire(&named(b"uploads"), 2 * SEC, false, never);
    assert_eq!(t.books().held_here(b"uploads"), Some(3));
    // Folded locally (every root down), it stays held.
    t.books().fold_local(3 * SEC);
    assert_eq!(t.books().held_here(b"uploads"), Some(3));
    assert_eq!(t.books().held_here(b"nobody"), None);
}

#[test]
fn held_counts_are_the_collected_slots_of_each_named_in_flight_quota() {
    let t = Table::new_heap(8, 16);
    let keyed = Quota {
        per_key: true,
        ..Quota::new(3, "per_client", 5.0, 5.0, 5.0).in_flight_if(true)
    };
    t.books()
        .apply_quotas(&[uploads(10.0), Quota::new(2, "rate", 1.0, 5.0, 5.0), keyed]);
    for _ in 0..2 {
        t.gate().acquire(&named(b"uploads"), SEC, false, never);
    }
    t.gate().check(b"rate", 1, SEC);
    // Not collected yet: still this host's `pending`, not its held word.
    assert_eq!(t.books().held_counts(), vec![(1, 0)]);
    t.books().collect_deltas(&mut Vec::new());
    // Only the named in-flight quota: not the rate, not the template.
    assert_eq!(t.books().held_counts(), vec![(1, 2)]);
}

/// A key of a per-key in-flight quota keeps its held slots as a named
/// counter keeps its held word: what was collected, less what a sync
/// thread handed back to pending; kept through a move of the table to
/// another zone size (less what went back to pending there); 0 for keys
/// of other quotas. No hold record is needed (none is claimed here).
#[test]
fn a_keys_held_slots_are_what_was_collected_less_what_was_handed_back() {
    let keyed = Quota::new(3, "per_client", 50.0, 50.0, 50.0)
        .keyed()
        .in_flight_if(true);
    let rate = Quota::new(4, "per_ip", 1.0, 50.0, 50.0).keyed();
    let t = Table::new_heap_with_keys(8, 16, 256);
    t.books().apply_quotas(&[keyed, rate]);
    let item = |name: &'static [u8], key: &'static [u8]| CheckItem {
        name,
        key: Some(key),
        weight: 1,
        max_wait: None,
    };
    let hash = |key: &[u8]| t.key_secret().hash(key);
    let held_of = |t: &Table| {
        let mut v = t.books().held_key_counts(|_| false);
        v.sort_by_key(|(c, _)| c.key);
        v
    };
    let mut slots = Vec::new();
    for _ in 0..3 {
        slots.push(
            t.gate()
                .acquire(&item(b"per_client", b"a"), SEC, false, never)
                .1
                .unwrap(),
        );
    }
    t.gate()
        .acquire(&item(b"per_client", b"b"), SEC, false, never);
    t.gate()
        .check_many(&[item(b"per_ip", b"a")], SEC, Default::default(), never);
    // Not collected yet: pending, not held.
    assert_eq!(held_of(&t), vec![]);
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    let a = CounterKey {
        id: 3,
        key: hash(b"a"),
    };
    let b = CounterKey {
        id: 3,
        key: hash(b"b"),
    };
    let mut want = vec![(a, 3), (b, 1)];
    want.sort_by_key(|(c, _)| c.key);
    assert_eq!(held_of(&t), want);
    // A release collected: a return, held one less.
    t.gate()
        .release(&item(b"per_client", b"a"), slots.pop().unwrap(), 2 * SEC);
    t.books().collect_deltas(&mut out);
    assert!(held_of(&t).contains(&(a, 2)));
    // A sync thread that takes over keeps 1 of a's unacknowledged weight
    // (3 - 1) and hands the rest back to pending: held 1 now.
    t.books()
        .requeue_unacked_beyond(|c, _, _| if c == a { 1 } else { 0 });
    assert_eq!(held_of(&t), vec![(a, 1)]);
    // A key holding none is listed when asked for.
    assert_eq!(t.books().held_key_counts(|c| c == b).len(), 2);
    // Collected again, it is all held; a larger zone keeps it, less what
    // was unacknowledged there (pending again in the new zone).
    t.books().collect_deltas(&mut out);
    want = vec![(a, 2), (b, 1)];
    want.sort_by_key(|(c, _)| c.key);
    assert_eq!(held_of(&t), want);
    let bigger = Table::new_heap_with_keys(16, 16, 512);
    bigger.books().adopt(t.books(), 3 * SEC);
    assert_eq!(held_of(&bigger), vec![]);
    bigger.books().collect_deltas(&mut Vec::new());
    assert_eq!(held_of(&bigger), want);
}

/// Walks of every slot for named in-flight quotas so far on this thread.
fn walks() -> u64 {
    books::IN_FLIGHT_WALKS.with(|n| n.get())
}

/// Everything the sync thread does with the named in-flight quotas each
/// cycle or on a root's word, on a table of 1,000 other quotas: none of
/// it walks their slots.
#[test]
fn a_table_without_in_flight_quotas_does_not_walk_its_slots_for_them() {
    let t = Table::new_heap(1024, 16);
    let quotas: Vec<Quota> = (1..=1000)
        .map(|id| Quota::new(id, format!("q{id}"), 1.0, 5.0, 5.0).keyed_if(id % 2 == 0))
        .collect();
    t.books().apply_quotas(&quotas);
    let before = walks();
    assert_eq!(t.books().held_counts(), vec![]);
    assert!(!t.books().holds_in_flight());
    assert_eq!(t.books().lease_locally(SEC, |_| true), 0);
    assert_eq!(t.books().settle_omitted(1, SEC, |_| true), 0);
    assert_eq!(t.books().adopt_source(|_| true, 2), 0);
    // With a few, what they hold, still without a walk.
    t.books().apply_quotas(&[
        uploads(3.0).at_epoch(2),
        Quota::new(1001, "downloads", 2.0, 2.0, 2.0).in_flight_if(true),
    ]);
    assert!(t.books().holds_in_flight());
    t.gate().acquire(&named(b"downloads"), SEC, false, never);
    t.books().collect_deltas(&mut Vec::new());
    assert_eq!(t.books().held_counts(), vec![(1, 0), (1001, 1)]);
    assert_eq!(walks(), before);
}

/// Random inserts, edits (to and from in-flight, per-key or not) and
/// deletes of 40 quotas, more of them in flight at times than the header
/// lists: after each write the named in-flight quotas the sync side finds
/// are the model's, and it walks every slot only while there are more
/// than the list holds.
#[test]
fn the_named_in_flight_quotas_are_found_through_writes_past_the_list() {
    use crate::table::region::layout::IN_FLIGHT_LISTED;
    use std::collections::{BTreeMap, BTreeSet};
    let t = Table::new_heap(64, 16);
    let mut rng = crate::core::rng::Rng::new(38);
    let mut live: BTreeMap<u64, (bool, bool)> = BTreeMap::new();
    let mut crossed = [false, false];
    for epoch in 1..3_000u64 {
        let id = 1 + rng.next_u64() % 40;
        let name = format!("q{id}");
        let quota = if live.contains_key(&id) && rng.next_u64() % 4 == 0 {
            live.remove(&id);
            Quota::tombstone(id, name, epoch)
        } else {
            // Mostly in flight, so the count goes past the list and back.
            let in_flight = rng.next_u64() % 8 != 0;
            let per_key = rng.next_u64() % 8 == 0;
            live.insert(id, (in_flight, per_key));
            Quota::new(id, name, 3.0, 3.0, 3.0)
                .in_flight_if(in_flight)
                .keyed_if(per_key)
                .at_epoch(epoch)
        };
        assert_eq!(t.books().apply_quotas(&[quota]).refused, vec![]);
        let want: BTreeSet<u64> = live
            .iter()
            .filter(|(_, &(in_flight, per_key))| in_flight && !per_key)
            .map(|(&id, _)| id)
            .collect();
        let before = walks();
        let found: BTreeSet<u64> = t.books().held_counts().iter().map(|&(id, _)| id).collect();
        assert_eq!(found, want, "epoch {epoch}");
        assert_eq!(t.books().holds_in_flight(), !want.is_empty());
        let walked = walks() - before;
        let listed = want.len() <= IN_FLIGHT_LISTED;
        assert_eq!(walked, u64::from(!listed), "epoch {epoch}: {}", want.len());
        crossed[usize::from(listed)] = true;
    }
    assert_eq!(crossed, [true, true], "past the list and within it");
}

#[test]
fn the_local_lease_leaves_the_level_at_this_hosts_own_slots() {
    let t = Table::new_heap(8, 16);
    t.books()
        .apply_quotas(&[uploads(10.0), Quota::new(2, "rate", 1.0, 5.0, 5.0)]);
    for _ in 0..2 {
        t.gate().acquire(&named(b"uploads"), SEC, false, never);
    }
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    // A root says 9: the other hosts hold 7 of them.
    let slot = t.gate().lookup(b"uploads").unwrap();
    let nine = crate::core::Tally::leaky(crate::core::Level {
        level: 9.0,
        at: SEC,
    });
    assert!(t.books().merge_counter(slot, 1, 0, nine, 2, 1));
    assert_eq!(t.quota(b"uploads", SEC).unwrap().level, 9.0);
    let (r, _) = t.gate().acquire(&named(b"uploads"), SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass);
    // Every root silent for the lease: the others' 7 are dropped, this
    // host's 3 stay.
    t.books().fold_local(11 * SEC);
    assert_eq!(t.books().lease_locally(11 * SEC, |_| true), 1);
    assert_eq!(t.quota(b"uploads", 11 * SEC).unwrap().level, 3.0);
    // Up to the limit with its own slots only: 7 more, not one beyond.
    for _ in 0..7 {
        let (r, _) = t.gate().acquire(&named(b"uploads"), 11 * SEC, false, never);
        assert_eq!(r.outcome, Outcome::Pass);
    }
    let (r, _) = t.gate().acquire(&named(b"uploads"), 11 * SEC, false, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)));
}

#[test]
fn a_roots_reply_after_a_fold_replaces_an_in_flight_level_lower_or_not() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(10.0)]);
    let slot = t.gate().lookup(b"uploads").unwrap();
    let at = |level: f64, at: Nanos| crate::core::Tally::leaky(crate::core::Level { level, at });
    assert!(t.books().merge_counter(slot, 1, 0, at(6.0, SEC), 0, 1));
    // Every root down: this host's slot is folded in over the 6 it knew.
    t.gate().acquire(&named(b"uploads"), 2 * SEC, false, never);
    t.books().fold_local(3 * SEC);
    assert_eq!(t.quota(b"uploads", 3 * SEC).unwrap().level, 7.0);
    // Back, another root says 2 (the other hosts released meanwhile; it
    // holds this host's slot, sent with the request): taken, not
    // max-merged, or the level would never come down.
    assert!(t.books().merge_counter(slot, 1, 0, at(2.0, 4 * SEC), 0, 2));
    assert_eq!(t.quota(b"uploads", 4 * SEC).unwrap().level, 2.0);
    // From then on it is that root's level: another root's lower, older
    // value is max-merged again.
    assert!(t.books().merge_counter(slot, 1, 0, at(1.0, 4 * SEC), 0, 3));
    assert_eq!(t.quota(b"uploads", 4 * SEC).unwrap().level, 2.0);
}

#[test]
fn a_roots_reply_after_a_fold_replaces_a_keys_in_flight_level_as_a_named_ones() {
    // The same rule as the named quota's above, for a key of an in-flight
    // per-key template: one merge, one "same root" rule (books/merge.rs).
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books().apply_quotas(&[uploads(10.0).keyed()]);
    let slot = t.gate().lookup(b"uploads").unwrap();
    let alice = CheckItem {
        key: Some(b"alice"),
        ..named(b"uploads")
    };
    let hash = t.key_secret().hash(b"alice");
    let at = |level: f64, at: Nanos| crate::core::Tally::leaky(crate::core::Level { level, at });
    let level = |now: Nanos| t.keys(Some(slot), now)[0].level;
    // The key needs an entry before a root's value can land in it.
    let (r, held) = t.gate().acquire(&alice, SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass);
    t.gate().release(&alice, held.unwrap(), SEC);
    assert!(t.books().merge_counter(slot, 1, hash, at(6.0, SEC), 0, 1));
    // Every root down: this host's slot is folded in over the 6 it knew.
    t.gate().acquire(&alice, 2 * SEC, false, never);
    t.books().fold_local(3 * SEC);
    assert_eq!(level(3 * SEC), 7.0);
    // Back, another root says 2: taken, not max-merged (a key's in-flight
    // level does not leak either, so it would never come down).
    assert!(t
        .books()
        .merge_counter(slot, 1, hash, at(2.0, 4 * SEC), 0, 2));
    assert_eq!(level(4 * SEC), 2.0);
    // From then on it is that root's level.
    assert!(t
        .books()
        .merge_counter(slot, 1, hash, at(1.0, 4 * SEC), 0, 3));
    assert_eq!(level(4 * SEC), 2.0);
}

#[test]
fn a_zone_that_changed_size_keeps_which_roots_reply_an_in_flight_level_is() {
    let old = Table::new_heap(8, 16);
    old.books().apply_quotas(&[uploads(10.0)]);
    let at = |level: f64, at: Nanos| crate::core::Tally::leaky(crate::core::Level { level, at });
    let slot = old.gate().lookup(b"uploads").unwrap();
    assert!(old.books().merge_counter(slot, 1, 0, at(6.0, SEC), 0, 1));
    let new = Table::new_heap(16, 16);
    new.books().adopt(old.books(), SEC);
    // The same root's later, lower value replaces it there too.
    let slot = new.gate().lookup(b"uploads").unwrap();
    assert!(new
        .books()
        .merge_counter(slot, 1, 0, at(2.0, 2 * SEC), 0, 1));
    assert_eq!(new.quota(b"uploads", 2 * SEC).unwrap().level, 2.0);
}

#[test]
fn what_this_host_holds_outlives_the_table_handle_over_the_same_region() {
    // An nginx reload attaches new workers to the same zone.
    // Room for 8 quotas and the sections beside them.
    let len = crate::table::geometry::Geometry::new(8, 16).region_len() + 4096;
    let mut region = vec![0u128; len.div_ceil(16) + 4];
    let base = region.as_mut_ptr().cast::<u8>();
    // SAFETY: the offset to the next 64-byte line is within the 64 spare
    // bytes at the end of `region`.
    let base = unsafe { base.add(base.align_offset(64)) };
    // SAFETY: `region` is zeroed, outlives both tables, and is aligned.
    let first = unsafe { Table::from_raw(base, len, 16, 0, 0, false) }.unwrap();
    first.books().apply_quotas(&[uploads(10.0)]);
    first.gate().acquire(&named(b"uploads"), SEC, false, never);
    first.gate().acquire(&named(b"uploads"), SEC, false, never);
    let mut out = Vec::new();
    first.books().collect_deltas(&mut out);
    drop(first);
    // SAFETY: as above.
    let second = unsafe { Table::from_raw(base, len, 16, 0, 0, false) }.unwrap();
    assert_eq!(second.books().held_here(b"uploads"), Some(2));
}

/// Two processes' identities, as the hold records name them.
const LIVE: u64 = 0x11_0000_0001;
const DEAD: u64 = 0x22_0000_0002;

#[test]
fn the_slots_of_a_process_that_died_are_given_back_and_a_live_ones_kept() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(2.0)]);
    let item = named(b"uploads");
    for owner in [LIVE, DEAD] {
        let (r, held) = t.gate().acquire(&item, SEC, false, never);
        assert_eq!(r.outcome, Outcome::Pass);
        assert_ne!(t.gate().record_slot(&item, held.unwrap(), owner), 0);
    }
    let (r, _) = t.gate().acquire(&item, 2 * SEC, false, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)), "both slots held");
    let given = t.reclaim_abandoned_slots(3 * SEC, |owner| owner == LIVE);
    assert_eq!(given, 1);
    assert_eq!(t.books().held_here(b"uploads"), Some(1));
    let (r, _) = t.gate().acquire(&item, 3 * SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass, "the dead process's slot is free");
    // Swept again: nothing more (the record went with its slot).
    assert_eq!(t.reclaim_abandoned_slots(4 * SEC, |owner| owner == LIVE), 0);
    let stats = t.hold_stats();
    assert_eq!((stats.live, stats.reclaimed), (1, 1));
}

#[test]
fn a_slot_released_by_its_process_is_not_given_back_again_when_it_dies() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(2.0)]);
    let item = named(b"uploads");
    let (_, held) = t.gate().acquire(&item, SEC, false, never);
    let held = held.unwrap();
    let record = t.gate().record_slot(&item, held, DEAD);
    assert!(t
        .gate()
        .release_recorded(&item, held, record, DEAD, 2 * SEC));
    assert_eq!(t.reclaim_abandoned_slots(3 * SEC, |_| false), 0);
    assert_eq!(t.books().held_here(b"uploads"), Some(0));
    assert_eq!(t.hold_stats().live, 0);
}

#[test]
fn a_slot_reclaimed_after_its_sync_travels_as_a_return() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(3.0)]);
    let item = named(b"uploads");
    let (_, held) = t.gate().acquire(&item, SEC, false, never);
    t.gate().record_slot(&item, held.unwrap(), DEAD);
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!((out[0].delta, out[0].returned), (1, 0));
    assert_eq!(t.reclaim_abandoned_slots(2 * SEC, |_| false), 1);
    out.clear();
    t.books().collect_deltas(&mut out);
    assert_eq!((out[0].delta, out[0].returned), (0, 1));
}

#[test]
fn a_dead_processs_key_slot_goes_back_to_its_key() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books().apply_quotas(&[uploads(1.0).keyed()]);
    let keyed = |key: &'static [u8]| CheckItem {
        key: Some(key),
        ..named(b"uploads")
    };
    for key in [&b"alice"[..], b"bob"] {
        let (r, held) = t.gate().acquire(&keyed(key), SEC, false, never);
        assert_eq!(r.outcome, Outcome::Pass);
        let owner = if key == b"alice" { DEAD } else { LIVE };
        assert_ne!(t.gate().record_slot(&keyed(key), held.unwrap(), owner), 0);
    }
    assert_eq!(t.reclaim_abandoned_slots(2 * SEC, |owner| owner == LIVE), 1);
    let (alice, _) = t.gate().acquire(&keyed(b"alice"), 2 * SEC, false, never);
    let (bob, _) = t.gate().acquire(&keyed(b"bob"), 2 * SEC, false, never);
    assert_eq!(alice.outcome, Outcome::Pass, "alice's slot came back");
    assert!(
        matches!(bob.outcome, Outcome::Reject(_)),
        "bob's is still held"
    );
}

#[test]
fn a_record_of_a_quota_deleted_and_its_slot_reused_gives_nothing_to_the_new_one() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(1.0)]);
    let item = named(b"uploads");
    let (_, held) = t.gate().acquire(&item, SEC, false, never);
    t.gate().record_slot(&item, held.unwrap(), DEAD);
    t.books()
        .apply_quotas(&[Quota::tombstone(1, "uploads", uploads(1.0).epoch + 1)]);
    let other = Quota::new(2, "other", 2.0, 2.0, 2.0).in_flight_if(true);
    t.books().apply_quotas(&[other]);
    assert!(t.gate().lookup(b"uploads").is_none());
    let (r, _) = t.gate().acquire(&named(b"other"), SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass);
    t.reclaim_abandoned_slots(2 * SEC, |_| false);
    assert_eq!(t.books().held_here(b"other"), Some(1));
}

#[test]
fn a_full_record_section_counts_the_slot_unrecorded_and_the_request_goes_on() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[uploads(1e6)]);
    let item = named(b"uploads");
    let records = t.hold_stats().records;
    let mut recorded = 0;
    for i in 0..records + 10 {
        let (r, held) = t.gate().acquire(&item, SEC + i, false, never);
        assert_eq!(r.outcome, Outcome::Pass);
        if t.gate().record_slot(&item, held.unwrap(), LIVE) != 0 {
            recorded += 1;
        }
    }
    let stats = t.hold_stats();
    assert!(recorded <= records && stats.unrecorded >= 10, "{stats:?}");
    assert_eq!(stats.live + stats.unrecorded, records + 10);
}
