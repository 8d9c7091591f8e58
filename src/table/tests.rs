use super::region::heap::HeapRegion;
use super::region::layout::Slot;
use super::region::lock::own_pid;
use super::*;
use crate::core::{Counting, Level, Nanos, Quota, Tally, Wait};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const SEC: Nanos = 1_000_000_000;

fn quota(id: u64, name: &str, parent: Option<u64>, limit: f64, low: f64, high: f64) -> Quota {
    Quota::new(id, name, limit, low, high)
        .with_parent(parent)
        .at_epoch(id)
}

fn never() -> f64 {
    0.999_999
}

/// Check items from `(name, weight)` pairs.
fn check_items<'a>(pairs: &[(&'a [u8], u64)]) -> Vec<CheckItem<'a>> {
    pairs
        .iter()
        .map(|&(name, weight)| CheckItem {
            name,
            key: None,
            weight,
            max_wait: None,
        })
        .collect()
}

#[test]
fn unknown_names_pass_and_are_counted() {
    let t = Table::new_heap(16, 16);
    assert_eq!(t.gate().check(b"nobody", 1, 0), Outcome::Unknown);
    assert_eq!(t.unknown_checks(), 1);
}

#[test]
fn a_hard_cut_quota_admits_exactly_its_burst_at_one_instant() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(1, "q", None, 100.0, 100.0, 100.0)]);
    let passed = (0..1000)
        .filter(|_| t.gate().check_with(b"q", 1, SEC, never) == Outcome::Pass)
        .count();
    assert_eq!(passed, 100);
    let st = t.quota(b"q", SEC).unwrap();
    assert_eq!((st.passed, st.rejected, st.pending), (100, 900, 100));
}

#[test]
fn weight_zero_checks_without_counting() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(1, "q", None, 1.0, 2.0, 2.0)]);
    for _ in 0..10 {
        assert_eq!(t.gate().check(b"q", 0, 0), Outcome::Pass);
    }
    assert_eq!(t.quota(b"q", 0).unwrap().pending, 0);
    assert_eq!(t.gate().check(b"q", 1, 0), Outcome::Pass);
    assert_eq!(t.gate().check(b"q", 0, 0), Outcome::Pass);
    assert_eq!(t.gate().check(b"q", 1, 0), Outcome::Pass);
    // Full: a weight-0 check now rejects, and still counts nothing.
    assert!(matches!(t.gate().check(b"q", 0, 0), Outcome::Reject(_)));
    assert_eq!(t.quota(b"q", 0).unwrap().pending, 2);
}

#[test]
fn a_chain_passes_only_if_every_ancestor_passes_and_commits_to_all() {
    let t = Table::new_heap(16, 16);
    t.books().apply_quotas(&[
        quota(1, "bucket", None, 1.0, 5.0, 5.0),
        quota(2, "bucket_read", Some(1), 1.0, 100.0, 100.0),
        quota(3, "bucket_write", Some(1), 1.0, 100.0, 100.0),
    ]);
    for _ in 0..3 {
        assert_eq!(
            t.gate().check_with(b"bucket_read", 1, 0, never),
            Outcome::Pass
        );
    }
    for _ in 0..2 {
        assert_eq!(
            t.gate().check_with(b"bucket_write", 1, 0, never),
            Outcome::Pass
        );
    }
    // The parent is full: both children reject, at depth 1.
    match t.gate().check_with(b"bucket_read", 1, 0, never) {
        Outcome::Reject(r) => assert_eq!(r.depth, 1),
        other => panic!("{other:?}"),
    }
    let st = |n: &str| t.quota(n.as_bytes(), 0).unwrap().pending;
    assert_eq!(
        (st("bucket"), st("bucket_read"), st("bucket_write")),
        (5, 3, 2)
    );
}

#[test]
fn rejection_reports_when_to_retry() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(1, "q", None, 10.0, 20.0, 20.0)]);
    for _ in 0..20 {
        t.gate().check(b"q", 1, 0);
    }
    match t.gate().check(b"q", 5, 0) {
        Outcome::Reject(r) => {
            assert_eq!(r.limit, 10.0);
            assert!(
                matches!(r.wait, Wait::Seconds(s) if (s - 0.5).abs() < 1e-9),
                "{r:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn parents_link_whatever_order_they_arrive_in_and_relink_on_reparent() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(2, "child", Some(1), 1.0, 100.0, 100.0)]);
    // Parent unknown yet: the child checks alone.
    assert_eq!(t.gate().check(b"child", 1, 0), Outcome::Pass);
    t.books().apply_quotas(&[
        quota(1, "p1", None, 1.0, 0.0, 0.0),
        quota(3, "p2", None, 1.0, 10.0, 10.0),
    ]);
    assert!(matches!(
        t.gate().check(b"child", 1, 0),
        Outcome::Reject(Rejection { depth: 1, .. })
    ));
    let mut moved = quota(2, "child", Some(3), 1.0, 100.0, 100.0);
    moved.epoch = 10;
    t.books().apply_quotas(&[moved]);
    assert_eq!(t.gate().check(b"child", 1, 0), Outcome::Pass);
    assert_eq!(t.quota(b"p2", 0).unwrap().pending, 1);
}

#[test]
fn upserts_apply_by_epoch_and_stale_ones_are_ignored() {
    let t = Table::new_heap(16, 16);
    let mut q = quota(1, "q", None, 1.0, 1.0, 1.0);
    q.epoch = 5;
    assert_eq!(t.books().apply_quotas(&[q.clone()]).inserted, 1);
    let mut older = q.clone();
    older.epoch = 4;
    older.limit = 99.0;
    assert_eq!(t.books().apply_quotas(&[older]).stale, 1);
    assert_eq!(t.quota(b"q", 0).unwrap().quota.limit, 1.0);
    let mut newer = q.clone();
    newer.epoch = 6;
    newer.limit = 7.0;
    assert_eq!(t.books().apply_quotas(&[newer]).updated, 1);
    assert_eq!(t.quota(b"q", 0).unwrap().quota.limit, 7.0);
    assert_eq!(t.max_epoch(), 6);
}

#[test]
fn an_update_keeps_the_counter_and_a_recreated_name_starts_fresh() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(1, "q", None, 1.0, 10.0, 10.0)]);
    t.gate().check(b"q", 4, 0);
    let mut changed = quota(1, "q", None, 2.0, 10.0, 10.0);
    changed.epoch = 2;
    t.books().apply_quotas(&[changed]);
    assert_eq!(t.quota(b"q", 0).unwrap().pending, 4);
    let mut recreated = quota(9, "q", None, 2.0, 10.0, 10.0);
    recreated.epoch = 3;
    t.books().apply_quotas(&[recreated]);
    let st = t.quota(b"q", 0).unwrap();
    assert_eq!((st.quota.id, st.pending, st.passed), (9, 0, 0));
}

#[test]
fn a_quota_recreated_under_a_new_id_keeps_its_parent_and_its_children() {
    // Found by the `table` fuzz target (tests/fuzz): the new id cleared
    // the slot's parent link and, the parent id being the same, nothing
    // linked it again; the child was checked without its parent.
    let t = Table::new_heap(16, 16);
    t.books().apply_quotas(&[
        quota(1, "parent", None, 1.0, 10.0, 10.0),
        quota(2, "child", Some(1), 1.0, 100.0, 100.0),
    ]);
    let mut recreated = quota(3, "child", Some(1), 1.0, 100.0, 100.0);
    recreated.epoch = 5;
    t.books().apply_quotas(&[recreated]);
    assert_eq!(t.gate().check_with(b"child", 8, 0, never), Outcome::Pass);
    assert_eq!(t.quota(b"parent", 0).unwrap().pending, 8);
    match t.gate().check_with(b"child", 8, 0, never) {
        Outcome::Reject(r) => assert_eq!(r.depth, 1),
        other => panic!("{other:?}"),
    }
    // And a quota naming the new id as its parent, sent before it, links
    // to it once it arrives under that id.
    t.books()
        .apply_quotas(&[quota(7, "grandchild", Some(9), 1.0, 100.0, 100.0)]);
    let mut renumbered = quota(9, "parent", None, 1.0, 10.0, 10.0);
    renumbered.epoch = 6;
    t.books().apply_quotas(&[renumbered]);
    assert_eq!(
        t.gate().check_with(b"grandchild", 4, 0, never),
        Outcome::Pass
    );
    assert_eq!(t.quota(b"parent", 0).unwrap().pending, 4);
}

#[test]
fn tombstones_delete_and_freed_slots_and_names_are_reused() {
    let t = Table::new_heap(4, 16);
    let qs: Vec<Quota> = (1..=4)
        .map(|i| quota(i, &format!("q{i}"), None, 1.0, 1.0, 1.0))
        .collect();
    assert_eq!(t.books().apply_quotas(&qs).inserted, 4);
    let q2 = t.gate().lookup(b"q2").unwrap();
    let mut gone = qs[1].clone();
    gone.deleted = true;
    gone.epoch = 10;
    assert_eq!(t.books().apply_quotas(&[gone]).deleted, 1);
    assert_eq!(t.gate().check(b"q2", 1, 0), Outcome::Unknown);
    assert_eq!(t.len(), 3);
    // The freed slot's id field now holds a free-list link, which must
    // not pass for any quota id.
    let ids = t.books().slot_ids();
    assert_eq!(ids.len(), 3);
    assert!(!ids.values().any(|&s| s == q2));
    assert!(!t
        .books()
        .merge_counter(q2, 2, 0, Tally::leaky(Level { level: 0.0, at: 0 }), 0, 0));
    for id in [0, 1, u64::from(q2) + 1, u64::from(q2) + 2] {
        assert!(t.books().counter_counting(q2, id).is_none());
    }
    let mut fifth = quota(5, "q5", None, 1.0, 1.0, 1.0);
    fifth.epoch = 11;
    assert_eq!(t.books().apply_quotas(&[fifth]).inserted, 1);
    assert_eq!(t.len(), 4);
    assert_eq!(t.gate().check(b"q5", 1, 0), Outcome::Pass);
    for i in [1, 3, 4] {
        assert!(t.gate().lookup(format!("q{i}").as_bytes()).is_some());
    }
}

#[test]
fn a_name_checked_from_the_same_memory_never_finds_a_stale_slot() {
    // One buffer names every check, as a caller reusing it would: the
    // name hint learned for it goes stale at each step below.
    let t = Table::new_heap(4, 16);
    t.books().apply_quotas(&[
        quota(1, "q1", None, 1.0, 1.0, 1.0),
        quota(2, "q2", None, 100.0, 100.0, 100.0),
    ]);
    let mut buf = *b"q1";
    assert_eq!(t.gate().check_with(&buf, 1, 0, never), Outcome::Pass);
    assert!(matches!(
        t.gate().check_with(&buf, 1, 0, never),
        Outcome::Reject(_)
    ));
    // Another name in the same bytes is its own quota.
    buf = *b"q2";
    assert_eq!(t.gate().check_with(&buf, 1, 0, never), Outcome::Pass);
    assert_eq!(t.quota(b"q2", 0).unwrap().passed, 1);
    // q1 is deleted and q9 takes its slot and name place: q1 is unknown,
    // q9 counts under its own numbers.
    let q1 = t.gate().lookup(b"q1").unwrap();
    buf = *b"q1";
    assert!(matches!(
        t.gate().check_with(&buf, 1, 0, never),
        Outcome::Reject(_)
    ));
    let mut gone = quota(1, "q1", None, 1.0, 1.0, 1.0);
    gone.deleted = true;
    gone.epoch = 10;
    assert_eq!(t.books().apply_quotas(&[gone]).deleted, 1);
    let mut ninth = quota(9, "q9", None, 100.0, 100.0, 100.0);
    ninth.epoch = 11;
    assert_eq!(t.books().apply_quotas(&[ninth]).inserted, 1);
    assert_eq!(t.gate().lookup(b"q9"), Some(q1), "the slot is reused");
    assert_eq!(t.gate().check_with(&buf, 1, 0, never), Outcome::Unknown);
    buf = *b"q9";
    for _ in 0..5 {
        assert_eq!(t.gate().check_with(&buf, 1, 0, never), Outcome::Pass);
    }
    assert_eq!(t.quota(b"q9", 0).unwrap().passed, 5);
}

#[test]
fn a_reused_buffer_holding_a_name_of_the_same_fingerprint_is_its_own_quota() {
    // Same length, same first and last 8 bytes: the two names share a
    // fingerprint, so the hint learned for one is tried for the other,
    // and only the name compare tells them apart.
    const EU: &[u8; 24] = b"s3_photos-eu-1-prod_read";
    const US: &[u8; 24] = b"s3_photos-us-1-prod_read";
    const AP: &[u8; 24] = b"s3_photos-ap-1-prod_read";
    assert_eq!(names::fingerprint(EU), names::fingerprint(US));
    assert_eq!(names::fingerprint(EU), names::fingerprint(AP));
    let t = Table::new_heap(4, 16);
    t.books().apply_quotas(&[
        quota(1, "s3_photos-eu-1-prod_read", None, 1.0, 1.0, 1.0),
        quota(2, "s3_photos-us-1-prod_read", None, 100.0, 100.0, 100.0),
    ]);
    let mut buf = *EU;
    assert_eq!(t.gate().check_with(&buf, 1, 0, never), Outcome::Pass);
    assert!(matches!(
        t.gate().check_with(&buf, 1, 0, never),
        Outcome::Reject(_)
    ));
    // The hint now points at eu's slot; us checked from the same bytes
    // counts under its own quota, every time (the hint is replaced only
    // now and then, so most of these find eu's slot hinted first).
    buf = *US;
    for _ in 0..20 {
        assert_eq!(t.gate().check_with(&buf, 1, 0, never), Outcome::Pass);
    }
    assert_eq!(t.quota(US, 0).unwrap().passed, 20);
    assert_eq!(t.quota(EU, 0).unwrap().passed, 1);
    // A name no quota has, of the same fingerprint, is unknown whichever
    // slot is hinted.
    buf = *AP;
    for _ in 0..20 {
        assert_eq!(t.gate().check_with(&buf, 1, 0, never), Outcome::Unknown);
    }
    buf = *EU;
    assert!(matches!(
        t.gate().check_with(&buf, 1, 0, never),
        Outcome::Reject(_)
    ));
    assert_eq!(t.quota(EU, 0).unwrap().passed, 1);
    assert_eq!(t.quota(US, 0).unwrap().passed, 20);
}

#[test]
fn a_full_table_refuses_new_quotas_loudly_and_keeps_the_old() {
    let t = Table::new_heap(2, 16);
    let qs: Vec<Quota> = (1..=3)
        .map(|i| quota(i, &format!("q{i}"), None, 1.0, 1.0, 1.0))
        .collect();
    let report = t.books().apply_quotas(&qs);
    assert_eq!(report.inserted, 2);
    assert_eq!(report.refused.len(), 1);
    let msg = report.refused[0].to_string();
    assert!(
        msg.contains("full") && msg.contains("q3") && msg.contains("kept"),
        "{msg}"
    );
    assert_eq!(t.refused_quotas(), 1);
    assert!(t.gate().lookup(b"q1").is_some() && t.gate().lookup(b"q2").is_some());
}

#[test]
fn a_full_name_arena_refuses_and_releases_the_slot() {
    let t = Table::new_heap(4, 16);
    // 4 granules in all: one 60-byte name takes 4.
    let long = "x".repeat(60);
    assert_eq!(
        t.books()
            .apply_quotas(&[quota(1, &long, None, 1.0, 1.0, 1.0)])
            .inserted,
        1
    );
    let r = t
        .books()
        .apply_quotas(&[quota(2, "short", None, 1.0, 1.0, 1.0)]);
    assert!(matches!(r.refused[..], [TableError::NamesFull { .. }]));
    assert_eq!(t.len(), 1);
}

#[test]
fn invalid_quotas_are_refused_and_the_rest_applies() {
    let t = Table::new_heap(4, 16);
    let r = t.books().apply_quotas(&[
        quota(1, "bad name", None, 1.0, 1.0, 1.0),
        quota(2, "ok", None, 1.0, 1.0, 1.0),
    ]);
    assert_eq!(r.inserted, 1);
    assert!(matches!(r.refused[..], [TableError::Invalid { .. }]));
}

#[test]
fn long_names_up_to_255_bytes_work() {
    let t = Table::new_heap(8, 128);
    let names: Vec<String> = [17, 64, 200, 255]
        .iter()
        .map(|&n| "n".repeat(n - 1) + "z")
        .collect();
    let qs: Vec<Quota> = names
        .iter()
        .enumerate()
        .map(|(i, n)| quota(i as u64 + 1, n, None, 1.0, 1.0, 1.0))
        .collect();
    assert_eq!(t.books().apply_quotas(&qs).inserted, 4);
    for n in &names {
        assert!(t.gate().lookup(n.as_bytes()).is_some());
        assert_eq!(t.quota(n.as_bytes(), 0).unwrap().quota.name, *n);
    }
    assert!(t
        .gate()
        .lookup(("n".repeat(254) + "y").as_bytes())
        .is_none());
}

#[test]
fn many_deletes_rebuild_the_index_and_lookups_still_work() {
    let t = Table::new_heap(64, 16);
    let mut epoch = 0;
    for round in 0..20u64 {
        let qs: Vec<Quota> = (0..64)
            .map(|i| {
                epoch += 1;
                let mut q = quota(
                    round * 100 + i + 1,
                    &format!("r{round}_{i}"),
                    None,
                    1.0,
                    1.0,
                    1.0,
                );
                q.epoch = epoch;
                q
            })
            .collect();
        assert_eq!(t.books().apply_quotas(&qs).inserted, 64, "round {round}");
        for q in &qs {
            assert!(t.gate().lookup(q.name.as_bytes()).is_some());
        }
        let dead: Vec<Quota> = qs
            .iter()
            .map(|q| {
                epoch += 1;
                Quota::tombstone(q.id, q.name.as_str(), epoch)
            })
            .collect();
        assert_eq!(t.books().apply_quotas(&dead).deleted, 64);
        assert!(t.is_empty());
    }
    assert!(t.gate().lookup(b"r3_3").is_none());
}

#[test]
fn collected_deltas_stay_counted_until_a_merge_acknowledges_them() {
    let t = Table::new_heap(4, 16);
    t.books()
        .apply_quotas(&[quota(7, "q", None, 10.0, 100.0, 100.0)]);
    for _ in 0..5 {
        t.gate().check(b"q", 2, 0);
    }
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!(
        out,
        vec![CollectedDelta {
            slot: 0,
            id: 7,
            key: 0,
            delta: 10,
            ..Default::default()
        }]
    );
    let st = t.quota(b"q", 0).unwrap();
    assert_eq!((st.pending, st.unacked, st.level), (0, 10, 10.0));
    // The root saw our 10 plus 30 from others.
    assert!(t.books().merge_counter(
        0,
        7,
        0,
        Tally::leaky(Level {
            level: 40.0,
            at: SEC
        }),
        10,
        0
    ));
    let st = t.quota(b"q", SEC).unwrap();
    assert_eq!((st.unacked, st.level), (0, 40.0));
    assert!(st.fill_rate > 0.0);
    // A value for another id (the slot was reused) is refused.
    assert!(!t.books().merge_counter(
        0,
        8,
        0,
        Tally::leaky(Level {
            level: 1.0,
            at: SEC
        }),
        0,
        0
    ));
    assert!(!t.books().merge_counter(
        0,
        7,
        0,
        Tally::leaky(Level {
            level: f64::NAN,
            at: SEC
        }),
        0,
        0
    ));
}

#[test]
fn a_counters_limit_is_read_only_while_its_slot_holds_that_quota() {
    let t = Table::new_heap(4, 16);
    t.books()
        .apply_quotas(&[quota(7, "q", None, 10.0, 100.0, 100.0)]);
    let slot = t.gate().lookup(b"q").unwrap();
    assert_eq!(
        t.books().counter_counting(slot, 7),
        Some(Counting::Leak(10.0))
    );
    assert_eq!(t.books().counter_counting(slot, 8), None);
    t.books().apply_quotas(&[Quota::tombstone(7, "q", 8)]);
    assert_eq!(t.books().counter_counting(slot, 7), None);
}

#[test]
fn unsent_weight_is_measured_against_each_quotas_burst_band() {
    let t = Table::new_heap(4, 16);
    t.books().apply_quotas(&[
        quota(1, "wide", None, 10.0, 100.0, 300.0),
        quota(2, "cut", None, 10.0, 100.0, 100.0),
    ]);
    assert!(!t.books().unsent_beyond(0.1));
    // 19 is under a tenth of the 200-wide band, 20 reaches it.
    t.gate().check(b"wide", 19, 0);
    assert!(!t.books().unsent_beyond(0.1));
    t.gate().check(b"wide", 1, 0);
    assert!(t.books().unsent_beyond(0.1));
    // Collected weight is no longer unsent.
    t.books().collect_deltas(&mut Vec::new());
    assert!(!t.books().unsent_beyond(0.1));
    // A hard cut has no band: any unsent weight counts.
    t.gate().check(b"cut", 1, 0);
    assert!(t.books().unsent_beyond(0.1));
}

#[test]
fn standalone_folding_leaks_admitted_weight_over_time() {
    let t = Table::new_heap(4, 16);
    t.books()
        .apply_quotas(&[quota(1, "q", None, 100.0, 100.0, 100.0)]);
    let mut now = 0;
    let mut passed = 0;
    // 10 seconds at 1000 requests per second, folding every 100 ms.
    for step in 0..10_000u64 {
        now = step * SEC / 1000;
        if t.gate().check_with(b"q", 1, now, never) == Outcome::Pass {
            passed += 1;
        }
        if step % 100 == 99 {
            t.books().fold_local(now);
        }
    }
    // Burst 100 plus 100/s for ~10 s.
    assert!((1050..=1110).contains(&passed), "passed {passed} by {now}");
}

#[test]
fn a_region_is_reattached_with_its_quotas_and_counters() {
    let len = 4096 * 64;
    let region = HeapRegion::new(len);
    let base = region.base;
    // SAFETY: the region is owned by this test, aligned, and outlives both tables.
    let first = unsafe { Table::from_raw(base, len, 16, 0, 0, false) }.unwrap();
    first
        .books()
        .apply_quotas(&[quota(1, "q", None, 1.0, 10.0, 10.0)]);
    first.gate().check(b"q", 3, 0);
    // SAFETY: as above.
    let second = unsafe { Table::from_raw(base, len, 16, 0, 0, false) }.unwrap();
    assert_eq!(second.quota(b"q", 0).unwrap().pending, 3);
    assert_eq!(second.geometry(), first.geometry());
    // SAFETY: as above; a smaller view of the same region is incompatible.
    let smaller = unsafe { Table::from_raw(base, len / 2, 16, 0, 0, false) };
    assert!(matches!(smaller, Err(TableError::Incompatible(_))));
    // SAFETY: as above; reformat starts empty.
    let fresh = unsafe { Table::from_raw(base, len, 16, 0, 0, true) }.unwrap();
    assert!(fresh.is_empty());
    drop(region);
}

#[test]
fn a_slot_is_128_bytes_and_a_quota_costs_166_with_index_held_word_ring_and_a_short_name() {
    let g = Geometry::new(1 << 20, 16);
    let per_quota = g.region_len() as f64 / f64::from(g.capacity);
    assert_eq!(std::mem::size_of::<Slot>(), 128);
    // 128 slot + 12 index + 8 held word + 1 dirty-ring cell + 16 name
    // granule.
    assert!(per_quota <= 166.0, "{per_quota}");
}

/// Readers check a hot quota chain, a writer keeps upserting and deleting
/// other quotas (so slots, names and the index churn), and a collector
/// moves deltas as a sync thread would. Every admitted weight must be found
/// exactly once: collected, or still pending.
#[test]
fn concurrent_checks_writes_and_collection_lose_no_increment() {
    let t = Arc::new(Table::new_heap(256, 16));
    t.books().apply_quotas(&[
        quota(1, "parent", None, 0.0, 1e15, 1e15),
        quota(2, "hot", Some(1), 0.0, 1e15, 1e15),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let t = Arc::clone(&t);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut admitted = 0u64;
                let mut i = 0u64;
                while !stop.load(RLX) || i < 10_000 {
                    let w = 1 + (i + r) % 7;
                    if t.gate().check(b"hot", w, 0) == Outcome::Pass {
                        admitted += w;
                    }
                    i += 1;
                }
                admitted
            })
        })
        .collect();
    let writer = {
        let t = Arc::clone(&t);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut epoch = 10;
            while !stop.load(RLX) {
                for i in 0..100u64 {
                    epoch += 1;
                    let mut q = quota(100 + i, &format!("churn_{i}"), Some(1), 1.0, 1.0, 1.0);
                    q.epoch = epoch;
                    q.deleted = epoch % 3 == 0;
                    t.books().apply_quotas(&[q]);
                }
            }
        })
    };
    let collector = {
        let t = Arc::clone(&t);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut collected: HashMap<u64, u64> = HashMap::new();
            let mut out = Vec::new();
            while !stop.load(RLX) {
                out.clear();
                t.books().collect_deltas(&mut out);
                for d in &out {
                    *collected.entry(d.id).or_default() += d.delta;
                }
                std::thread::yield_now();
            }
            collected
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(1500));
    stop.store(true, RLX);
    let admitted: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    writer.join().unwrap();
    let collected = collector.join().unwrap();
    let hot = t.quota(b"hot", 0).unwrap();
    let parent = t.quota(b"parent", 0).unwrap();
    assert!(admitted > 10_000);
    assert_eq!(
        collected.get(&2).copied().unwrap_or(0) + hot.pending as u64,
        admitted
    );
    assert_eq!(
        collected.get(&1).copied().unwrap_or(0) + parent.pending as u64,
        admitted
    );
    assert_eq!(hot.unacked as u64, collected.get(&2).copied().unwrap_or(0));
    assert_eq!(hot.passed + hot.rejected, hot.passed);
}

#[test]
fn several_checks_pass_together_or_count_nothing() {
    let t = Table::new_heap(16, 16);
    t.books().apply_quotas(&[
        quota(1, "a", None, 1.0, 10.0, 10.0),
        quota(2, "b", None, 1.0, 3.0, 3.0),
    ]);
    let items = check_items(&[(b"a", 1), (b"nobody", 1), (b"b", 1)]);
    for _ in 0..3 {
        assert_eq!(
            t.gate().check_many(&items, 0, PLAIN, never).outcome,
            Outcome::Pass
        );
    }
    // b is full: the request is rejected at item 2 and a is not charged.
    let r = t.gate().check_many(&items, 0, PLAIN, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)));
    assert_eq!(r.item, Some(2));
    assert_eq!(t.quota(b"a", 0).unwrap().pending, 3);
    assert_eq!(t.quota(b"b", 0).unwrap().rejected, 1);
    let unknown = check_items(&[(b"nobody", 1)]);
    assert_eq!(
        t.gate().check_many(&unknown, 0, PLAIN, never).outcome,
        Outcome::Unknown
    );
}

const PLAIN: CheckOptions = CheckOptions {
    dry_run: false,
    headroom: false,
};

#[test]
fn a_dry_run_rejection_counts_apart_and_charges_nothing() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(1, "a", None, 1.0, 2.0, 2.0)]);
    let items = check_items(&[(b"a", 1)]);
    let dry = CheckOptions {
        dry_run: true,
        ..PLAIN
    };
    for _ in 0..2 {
        assert_eq!(
            t.gate().check_many(&items, 0, dry, never).outcome,
            Outcome::Pass
        );
    }
    assert!(matches!(
        t.gate().check_many(&items, 0, dry, never).outcome,
        Outcome::Reject(_)
    ));
    let s = t.quota(b"a", 0).unwrap();
    assert_eq!((s.passed, s.rejected, s.dry_run, s.pending), (2, 0, 1, 2));
    assert!(matches!(
        t.gate().check_many(&items, 0, PLAIN, never).outcome,
        Outcome::Reject(_)
    ));
    let s = t.quota(b"a", 0).unwrap();
    assert_eq!((s.rejected, s.dry_run), (1, 1));
}

#[test]
fn headroom_names_the_tightest_quota_of_every_chain() {
    let t = Table::new_heap(16, 16);
    t.books().apply_quotas(&[
        quota(1, "parent", None, 10.0, 5.0, 5.0),
        quota(2, "child", Some(1), 10.0, 100.0, 100.0),
        quota(3, "other", None, 10.0, 50.0, 50.0),
    ]);
    let items = check_items(&[(b"other", 1), (b"child", 2)]);
    let opts = CheckOptions {
        headroom: true,
        ..PLAIN
    };
    let r = t.gate().check_many(&items, 0, opts, never);
    assert_eq!(r.outcome, Outcome::Pass);
    let h = r.headroom.unwrap();
    // The parent (low burst 5, now at level 2) is tighter than the child
    // (100) and than "other" (50, at 1).
    assert_eq!(
        (h.item, h.depth, h.room.low_burst, h.room.level),
        (1, 1, 5.0, 2.0)
    );
    assert_eq!(h.room.remaining(), 3.0);
    assert!((h.room.seconds_to_empty() - 0.2).abs() < 1e-9);
    // Fill the parent: the rejection reports the parent with no room left.
    for _ in 0..3 {
        t.gate().check_many(&items[1..], 0, opts, never);
    }
    let r = t.gate().check_many(&items, 0, opts, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)));
    let h = r.headroom.unwrap();
    assert_eq!(
        (h.item, h.depth, h.room.level, h.room.remaining()),
        (1, 1, 4.0, 1.0)
    );
    let mut name = [0u8; 256];
    assert_eq!(t.name_into(h.slot, &mut name), Some(&b"parent"[..]));
    match r.outcome {
        Outcome::Reject(rejection) => assert_eq!(rejection.slot, h.slot),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.name_into(h.slot, &mut [0u8; 3]), None);
    assert_eq!(PLAIN, CheckOptions::default());
    assert!(t
        .gate()
        .check_many(&items, 0, PLAIN, never)
        .headroom
        .is_none());
}

#[test]
fn a_table_adopts_another_tables_quotas_and_counters() {
    let old = Table::new_heap(16, 16);
    old.books().apply_quotas(&[
        quota(1, "parent", None, 1.0, 50.0, 50.0),
        quota(2, "child", Some(1), 1.0, 50.0, 50.0),
    ]);
    assert_eq!(old.gate().check(b"child", 5, 0), Outcome::Pass);
    let mut collected = Vec::new();
    old.books().collect_deltas(&mut collected);
    assert_eq!(old.gate().check(b"child", 2, 0), Outcome::Pass);
    let slot = old.gate().lookup(b"child").unwrap();
    assert!(old.books().merge_counter(
        slot,
        2,
        0,
        Tally::leaky(Level { level: 30.0, at: 0 }),
        5,
        0
    ));
    let new = Table::new_heap(32, 16);
    let report = new.books().adopt(old.books(), 0);
    assert_eq!((report.inserted, report.refused.len()), (2, 0));
    let child = new.quota(b"child", 0).unwrap();
    assert_eq!(child.quota.parent, Some(1));
    // The cluster level, plus the 2 units admitted since and not yet sent.
    assert_eq!((child.level, child.pending, child.unacked), (32.0, 2, 0));
    assert_eq!(child.passed, 2);
    // The chain works in the new table: the parent has the 5 + 2 units
    // admitted through the child (5 were sent, none acknowledged).
    let parent = new.quota(b"parent", 0).unwrap();
    assert_eq!(parent.pending, 7);
    let small = Table::new_heap(1, 16);
    assert_eq!(small.books().adopt(old.books(), 0).refused.len(), 1);
}

#[test]
fn the_cached_pid_is_forgotten_in_a_forked_child() {
    let parent = own_pid();
    assert_eq!(parent, std::process::id());
    // SAFETY: the child only calls async-signal-safe functions (getpid via
    // own_pid's slow path, write to a pipe, _exit) before exiting.
    unsafe {
        let mut fds = [0; 2];
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let child = libc::fork();
        assert!(child >= 0);
        if child == 0 {
            let ok = own_pid() == libc::getpid() as u32 && own_pid() != parent;
            let byte = [u8::from(ok)];
            libc::write(fds[1], byte.as_ptr().cast(), 1);
            libc::_exit(0);
        }
        let mut byte = [0u8];
        assert_eq!(libc::read(fds[0], byte.as_mut_ptr().cast(), 1), 1);
        libc::waitpid(child, std::ptr::null_mut(), 0);
        libc::close(fds[0]);
        libc::close(fds[1]);
        assert_eq!(byte[0], 1, "the child saw its own pid");
    }
}

/// The pid of a process that has exited (a child reaped at once).
pub(super) fn dead_pid() -> u32 {
    // SAFETY: the child exits at once.
    unsafe {
        let child = libc::fork();
        if child == 0 {
            libc::_exit(0);
        }
        libc::waitpid(child, std::ptr::null_mut(), 0);
        child as u32
    }
}

#[test]
fn a_dead_sync_owners_unacked_weight_is_sent_again_but_what_is_kept() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(1, "q", None, 0.0, 100.0, 100.0)]);
    assert_eq!(t.books().claim_sync(), None, "no previous owner");
    assert_eq!(t.gate().check(b"q", 7, 0), Outcome::Pass);
    let mut collected = Vec::new();
    t.books().collect_deltas(&mut collected);
    // A live previous owner (this process) keeps its in-flight weight.
    assert_eq!(t.books().claim_sync(), None);
    // A previous owner that is gone: a child that has exited.
    let dead = dead_pid();
    t.region().header().sync_owner.store(dead, RLX);
    assert_eq!(t.books().claim_sync(), Some(dead));
    // Without a record of it, all of its weight goes again.
    assert_eq!(t.books().requeue_unacked_beyond(|_, _, _| 0), 7);
    let s = t.quota(b"q", 0).unwrap();
    assert_eq!((s.pending, s.unacked), (7, 0));
    assert_eq!(t.region().header().sync_owner.load(RLX), std::process::id());
    // What `keep` keeps stays unacked (at most all of it); the rest goes.
    t.books().collect_deltas(&mut collected);
    let mut asked = Vec::new();
    let moved = t.books().requeue_unacked_beyond(|c, _, unacked| {
        asked.push((c.id, c.key, unacked));
        5
    });
    assert_eq!((moved, asked), (2, vec![(1, 0, 7)]));
    let s = t.quota(b"q", 0).unwrap();
    assert_eq!((s.pending, s.unacked), (2, 5));
    assert_eq!(t.books().requeue_unacked_beyond(|_, _, _| 99), 0);
}

#[test]
fn requeued_weight_moves_from_in_flight_to_pending() {
    let t = Table::new_heap(16, 16);
    t.books()
        .apply_quotas(&[quota(1, "q", None, 0.0, 100.0, 100.0)]);
    t.gate().check(b"q", 5, 0);
    let mut collected = Vec::new();
    t.books().collect_deltas(&mut collected);
    let slot = collected[0].slot;
    t.books().requeue_unacked(slot, 1, 0, 3);
    let s = t.quota(b"q", 0).unwrap();
    assert_eq!((s.pending, s.unacked), (3, 2));
    // Another quota's id in that slot: nothing moves.
    t.books().requeue_unacked(slot, 99, 0, 2);
    assert_eq!(t.quota(b"q", 0).unwrap().unacked, 2);
}

/// A plain check item of `name` with `weight`.
fn item(name: &[u8], weight: u64) -> CheckItem<'_> {
    CheckItem {
        name,
        key: None,
        weight,
        max_wait: None,
    }
}

#[test]
fn weight_given_back_before_it_is_sent_is_as_if_never_admitted_up_the_chain() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[
        quota(1, "parent", None, 0.0, 100.0, 100.0),
        quota(2, "child", Some(1), 0.0, 10.0, 10.0),
    ]);
    let r = t
        .gate()
        .check_many(&[item(b"child", 8)], 0, CheckOptions::default(), never);
    assert_eq!(r.outcome, Outcome::Pass);
    assert_eq!(t.gate().give_back(&item(b"child", 8), 5, 0, 0, false), 5);
    assert_eq!(t.quota(b"child", 0).unwrap().pending, 3);
    assert_eq!(t.quota(b"parent", 0).unwrap().pending, 3);
    // Syncing with roots, what was sent already is given back to them:
    // pending goes below zero, and the next collection makes it a return
    // (unacked, down, until a root acknowledges it).
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!(out.iter().map(|d| d.delta).sum::<u64>(), 6);
    assert_eq!(t.gate().give_back(&item(b"child", 8), 3, 0, 0, false), 3);
    let child = t.quota(b"child", 0).unwrap();
    assert_eq!((child.pending, child.unacked), (-3, 3));
    out.clear();
    t.books().collect_deltas(&mut out);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out.iter().all(|d| (d.delta, d.returned) == (0, 3)),
        "{out:?}"
    );
    let child = t.quota(b"child", 0).unwrap();
    assert_eq!((child.pending, child.unacked), (0, 0));
    // Acknowledged by a root (the net of the cycle: -3), and nothing is
    // unacked.
    let slot = out[0].slot;
    let value = Tally::leaky(Level { level: 0.0, at: 0 });
    assert!(t.books().merge_counter(slot, out[0].id, 0, value, -3, 1));
    assert_eq!(t.quota(b"child", 0).unwrap().unacked, 0);
}

#[test]
fn counting_locally_a_give_back_lowers_the_level_at_the_next_fold() {
    let t = Table::new_heap(8, 16);
    t.books()
        .apply_quotas(&[quota(1, "slow", None, 1.0, 10.0, 10.0)]);
    t.books().set_counting_locally(true);
    // Ten admitted and folded: full for ten seconds.
    let r = t
        .gate()
        .check_many(&[item(b"slow", 10)], 0, CheckOptions::default(), never);
    assert_eq!(r.outcome, Outcome::Pass);
    t.books().fold_local(0);
    assert!(matches!(
        t.gate().check(b"slow", 1, SEC / 2),
        Outcome::Reject(_)
    ));
    // The holds behind it leave: their eight units come back, the level
    // is 10 - 1 (a second's leak) - 8 = 1 at the next fold.
    assert_eq!(t.gate().give_back(&item(b"slow", 1), 8, 0, SEC, false), 8);
    // Collected as a return (owed to the roots, which may hold the adds
    // it cancels); the fold lowers the level by it here.
    let mut out = Vec::new();
    t.books().collect_deltas(&mut out);
    assert_eq!((out.len(), out[0].returned), (1, 8), "{out:?}");
    t.books().fold_local(SEC);
    let q = t.quota(b"slow", SEC).unwrap();
    assert_eq!((q.level, q.pending), (1.0, 0));
    assert_eq!(t.gate().check(b"slow", 8, SEC), Outcome::Pass);
}

#[test]
fn a_give_back_leaves_a_window_that_ended_alone() {
    let t = Table::new_heap(8, 16);
    let day =
        Quota::new(1, "daily", 10.0, 10.0, 10.0).windowed(crate::core::Window::TenSeconds, false);
    t.books().apply_quotas(&[day]);
    t.books().set_counting_locally(true);
    assert_eq!(t.gate().check(b"daily", 4, SEC), Outcome::Pass);
    // Charged in the window [0, 10 s), given back in the next: nothing.
    assert_eq!(
        t.gate()
            .give_back(&item(b"daily", 4), 4, SEC, 11 * SEC, false),
        0
    );
    assert_eq!(t.quota(b"daily", SEC).unwrap().pending, 4);
    // In the same window: all of it.
    assert_eq!(
        t.gate()
            .give_back(&item(b"daily", 4), 4, SEC, 2 * SEC, false),
        4
    );
}

#[test]
fn a_key_gets_its_weight_back_and_a_key_that_drained_gets_nothing() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books()
        .apply_quotas(&[Quota::new(1, "per_key", 1.0, 10.0, 10.0).keyed()]);
    let keyed = |key: &'static [u8], weight| CheckItem {
        name: b"per_key",
        key: Some(key),
        weight,
        max_wait: None,
    };
    let r = t
        .gate()
        .check_many(&[keyed(b"a", 6)], 0, CheckOptions::default(), never);
    assert_eq!(r.outcome, Outcome::Pass);
    assert_eq!(t.gate().give_back(&keyed(b"a", 6), 6, 0, 0, false), 6);
    assert_eq!(t.keys(None, 0)[0].pending, 0);
    // A key never seen gets nothing (no entry is made for it).
    assert_eq!(t.gate().give_back(&keyed(b"b", 6), 6, 0, 0, false), 0);
    assert_eq!(t.key_stats().live, 1);
}

#[test]
fn a_charge_counts_in_full_past_the_limit_and_the_debt_rejects_later_checks() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[
        quota(1, "parent", None, 10.0, 100.0, 100.0),
        quota(2, "bytes", Some(1), 10.0, 10.0, 10.0),
    ]);
    t.books().set_counting_locally(true);
    // Far over the child's burst: counted whole, up the chain.
    let charged = t.gate().charge(&item(b"bytes", 50), 0);
    assert_eq!((charged.outcome, charged.granted), (Outcome::Pass, 50));
    assert_eq!(t.quota(b"parent", 0).unwrap().pending, 50);
    t.books().fold_local(0);
    // In debt: 50 units at 10/s leave the level above the burst for 4 s.
    assert!(matches!(
        t.gate().check(b"bytes", 0, 3 * SEC),
        Outcome::Reject(_)
    ));
    assert_eq!(t.gate().check(b"bytes", 1, 5 * SEC), Outcome::Pass);
    // A charge is no check: it counted neither a pass nor a rejection.
    let q = t.quota(b"bytes", 5 * SEC).unwrap();
    assert_eq!((q.passed, q.rejected), (1, 1));
}

#[test]
fn a_charge_of_an_unknown_name_or_without_a_key_counts_nothing() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books()
        .apply_quotas(&[Quota::new(1, "per_key", 1.0, 10.0, 10.0).keyed()]);
    assert_eq!(
        t.gate().charge(&item(b"nobody", 5), 0).outcome,
        Outcome::Unknown
    );
    assert_eq!(
        t.gate().charge(&item(b"per_key", 5), 0).outcome,
        Outcome::NoKey
    );
    let keyed = CheckItem {
        key: Some(b"alice"),
        ..item(b"per_key", 25)
    };
    assert_eq!(t.gate().charge(&keyed, 0).outcome, Outcome::Pass);
    assert_eq!(t.keys(None, 0)[0].pending, 25);
    assert!(matches!(
        t.gate()
            .check_many(&[keyed], 0, CheckOptions::default(), never)
            .outcome,
        Outcome::Reject(_)
    ));
}

#[test]
fn a_settle_charges_what_exceeds_the_estimate_and_gives_back_what_is_short() {
    let t = Table::new_heap(8, 16);
    t.books()
        .apply_quotas(&[quota(1, "tokens", None, 1.0, 1000.0, 1000.0)]);
    assert_eq!(t.gate().check(b"tokens", 400, 0), Outcome::Pass);
    // Cost 650 against an estimate of 400: 250 more, counted.
    let more = t.gate().settle(&item(b"tokens", 650), 400, 0, SEC);
    assert_eq!((more.outcome, more.granted), (Outcome::Pass, 250));
    assert_eq!(t.quota(b"tokens", SEC).unwrap().pending, 650);
    // An estimate of 300 that cost 100: 200 given back.
    assert_eq!(t.gate().check(b"tokens", 300, SEC), Outcome::Pass);
    let less = t.gate().settle(&item(b"tokens", 100), 300, SEC, SEC);
    assert_eq!((less.outcome, less.granted), (Outcome::Pass, 0));
    assert_eq!(t.quota(b"tokens", SEC).unwrap().pending, 750);
    assert_eq!(
        t.gate().settle(&item(b"nobody", 1), 400, 0, SEC).outcome,
        Outcome::Unknown
    );
}

#[test]
fn a_fold_with_no_weight_of_its_own_keeps_the_roots_level_theirs() {
    let t = Table::new_heap(8, 16);
    t.books()
        .apply_quotas(&[quota(1, "slots", None, 0.0, 100.0, 100.0)]);
    let slot = t.gate().lookup(b"slots").unwrap();
    let at = |level, at| Tally::leaky(Level { level, at });
    assert!(t.books().merge_counter(slot, 1, 0, at(32.0, SEC), 0, 1));
    // Every root away for a while: the fold has nothing of this host's.
    t.books().fold_local(2 * SEC);
    // Back, root 1 says the others gave their 32 back: taken, not
    // max-merged away (a level that never leaks would stay 32 for good).
    assert!(t.books().merge_counter(slot, 1, 0, at(0.0, 3 * SEC), 0, 1));
    assert_eq!(t.quota(b"slots", 3 * SEC).unwrap().level, 0.0);
    // With weight of its own folded in, the level is no longer only
    // root 1's: its lower value is max-merged (strict).
    assert!(t.books().merge_counter(slot, 1, 0, at(10.0, 4 * SEC), 0, 1));
    assert_eq!(t.gate().check(b"slots", 5, 4 * SEC), Outcome::Pass);
    t.books().fold_local(5 * SEC);
    assert!(t.books().merge_counter(slot, 1, 0, at(0.0, 6 * SEC), 0, 1));
    assert_eq!(t.quota(b"slots", 6 * SEC).unwrap().level, 15.0);
}
