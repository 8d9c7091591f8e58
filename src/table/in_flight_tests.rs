//! In-flight slots in the table: taken and given back on the request
//! path, never leaking, and what a sync collects of them.

use super::*;
use crate::core::{Nanos, Quota};

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
    t.apply_quotas(&[uploads(3.0)]);
    assert!(t.is_in_flight(b"uploads") && !t.is_in_flight(b"nobody"));
    let mut held = Vec::new();
    for _ in 0..3 {
        let (r, slot) = t.acquire(&named(b"uploads"), SEC, false, never);
        assert_eq!(r.outcome, Outcome::Pass);
        held.push(slot.unwrap());
    }
    // An hour later the three are still held: a slot does not leak.
    let (r, slot) = t.acquire(&named(b"uploads"), 3600 * SEC, false, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)) && slot.is_none());
    assert!(t.release(&named(b"uploads"), held.pop().unwrap(), 3600 * SEC));
    let (r, _) = t.acquire(&named(b"uploads"), 3600 * SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass);
}

#[test]
fn a_dry_run_holds_nothing() {
    let t = Table::new_heap(8, 16);
    t.apply_quotas(&[uploads(1.0)]);
    let (r, slot) = t.acquire(&named(b"uploads"), SEC, false, never);
    assert_eq!((r.outcome, slot.is_some()), (Outcome::Pass, true));
    let (r, slot) = t.acquire(&named(b"uploads"), SEC, true, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)) && slot.is_none());
    assert_eq!(t.quota(b"uploads", SEC).unwrap().dry_run, 1);
}

#[test]
fn a_request_that_starts_and_ends_between_syncs_never_leaves_the_host() {
    let t = Table::new_heap(8, 16);
    t.apply_quotas(&[uploads(3.0)]);
    let (_, slot) = t.acquire(&named(b"uploads"), SEC, false, never);
    t.release(&named(b"uploads"), slot.unwrap(), 2 * SEC);
    let mut out = Vec::new();
    t.collect_deltas(&mut out);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_slot_released_after_its_sync_travels_as_a_return() {
    let t = Table::new_heap(8, 16);
    t.apply_quotas(&[uploads(3.0)]);
    let (_, slot) = t.acquire(&named(b"uploads"), SEC, false, never);
    let mut out = Vec::new();
    t.collect_deltas(&mut out);
    assert_eq!((out[0].delta, out[0].returned), (1, 0));
    t.release(&named(b"uploads"), slot.unwrap(), 2 * SEC);
    out.clear();
    t.collect_deltas(&mut out);
    assert_eq!((out[0].delta, out[0].returned), (0, 1));
}

#[test]
fn a_keys_slots_are_its_own() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.apply_quotas(&[uploads(1.0).keyed()]);
    let keyed = |key: &'static [u8]| CheckItem {
        key: Some(key),
        ..named(b"uploads")
    };
    let (a, held) = t.acquire(&keyed(b"alice"), SEC, false, never);
    let (b, _) = t.acquire(&keyed(b"bob"), SEC, false, never);
    assert_eq!((a.outcome, b.outcome), (Outcome::Pass, Outcome::Pass));
    let (again, _) = t.acquire(&keyed(b"alice"), SEC, false, never);
    assert!(matches!(again.outcome, Outcome::Reject(_)));
    t.release(&keyed(b"alice"), held.unwrap(), 2 * SEC);
    let (again, _) = t.acquire(&keyed(b"alice"), 2 * SEC, false, never);
    assert_eq!(again.outcome, Outcome::Pass);
}

#[test]
fn the_table_shows_an_in_flight_quota_with_its_limit() {
    let t = Table::new_heap(8, 16);
    t.apply_quotas(&[uploads(7.0)]);
    let q = t.quota(b"uploads", SEC).unwrap().quota;
    assert!(q.in_flight);
    assert_eq!((q.limit, q.low_burst, q.high_burst), (7.0, 7.0, 7.0));
    let terms = t.terms_of(t.lookup(b"uploads").unwrap()).unwrap();
    assert_eq!(terms.to_string(), "7 at once");
}

#[test]
fn a_charge_or_settle_of_an_in_flight_quota_counts_nothing() {
    let t = Table::new_heap(8, 16);
    t.apply_quotas(&[uploads(2.0)]);
    let (_, slot) = t.acquire(&named(b"uploads"), SEC, false, never);
    assert!(slot.is_some());
    let five = CheckItem {
        weight: 5,
        ..named(b"uploads")
    };
    // A charge would hold slots nobody gives back; a settle below its
    // estimate would free the slot still held.
    assert_eq!(t.charge(&five, SEC).outcome, Outcome::Unknown);
    assert_eq!(
        t.settle(&named(b"uploads"), 5, SEC, SEC).outcome,
        Outcome::Unknown
    );
    let level = t.quota(b"uploads", SEC).unwrap().level;
    assert_eq!(level, 1.0);
    let (r, _) = t.acquire(&named(b"uploads"), SEC, false, never);
    assert_eq!(r.outcome, Outcome::Pass);
    let (r, _) = t.acquire(&named(b"uploads"), SEC, false, never);
    assert!(matches!(r.outcome, Outcome::Reject(_)));
}
