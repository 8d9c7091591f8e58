//! In-flight counters through the ledger's sync step: slots summed over
//! limiters, returns bounded by what a limiter holds, the lease, and no
//! double count of a late limiter's reports (docs/DESIGN.md, "In-flight
//! quotas").

use proptest::prelude::*;

use super::ledger::{test_request, Ledger, SyncPaging};
use crate::core::{Nanos, Quota};
use crate::wire::{CounterDelta, CounterKey, KeyedDeltas, SyncRequest};

const SEC: Nanos = 1_000_000_000;
const LEASE: Nanos = 5 * SEC;
const PAGING: SyncPaging = SyncPaging {
    quotas: 100,
    counters: 100,
};
const ID: u64 = 1;

/// A ledger holding one in-flight quota of `limit` slots (id 1).
fn ledger(limit: f64) -> Ledger {
    let ledger = Ledger {
        in_flight_lease: LEASE,
        ..Ledger::default()
    };
    let q = Quota::new(ID, "uploads", limit, limit, limit).in_flight_if(true);
    ledger.load(vec![q], 0);
    ledger
}

/// `limiter` takes `acquired` slots and gives `released` back, at `now`.
fn sync(ledger: &Ledger, limiter: &str, acquired: u64, released: u64, now: Nanos) {
    let mut request = test_request(limiter, 0, 0, &[], &[]);
    if acquired > 0 {
        request.deltas = vec![delta(acquired)];
    }
    if released > 0 {
        request.returned = vec![delta(released)];
    }
    ledger.sync(&request, 77, now, PAGING);
}

fn delta(weight: u64) -> CounterDelta {
    CounterDelta {
        id: ID,
        delta: weight,
        window: None,
    }
}

fn level(ledger: &Ledger, now: Nanos) -> f64 {
    ledger
        .counters
        .view_counter(CounterKey::named(ID), now)
        .map_or(0.0, |v| v.level)
}

#[test]
fn slots_never_leak_with_time() {
    let ledger = ledger(10.0);
    sync(&ledger, "a", 4, 0, SEC);
    assert_eq!(level(&ledger, 3600 * SEC), 4.0);
}

#[test]
fn slots_sum_over_limiters_and_a_limiter_gives_back_only_what_it_holds() {
    let ledger = ledger(10.0);
    sync(&ledger, "a", 3, 0, SEC);
    sync(&ledger, "b", 2, 0, SEC);
    assert_eq!(level(&ledger, SEC), 5.0);
    // b returns more than it holds: only its own 2 go, a's 3 stay.
    sync(&ledger, "b", 0, 9, 2 * SEC);
    assert_eq!(level(&ledger, 2 * SEC), 3.0);
    // A limiter that never took a slot gives back nothing.
    sync(&ledger, "c", 0, 3, 2 * SEC);
    assert_eq!(level(&ledger, 2 * SEC), 3.0);
}

#[test]
fn a_return_that_arrives_before_its_add_leaves_nothing_counted() {
    // Two syncs of one limiter in flight at once: the later one (the
    // return) is applied first.
    let ledger = ledger(10.0);
    sync(&ledger, "b", 2, 0, SEC);
    sync(&ledger, "a", 0, 1, SEC);
    assert_eq!(level(&ledger, SEC), 2.0, "b's slots are untouched");
    sync(&ledger, "a", 1, 0, SEC);
    assert_eq!(
        level(&ledger, SEC),
        2.0,
        "a's add was cancelled by its return"
    );
}

#[test]
fn a_limiter_holds_at_most_twice_the_limit() {
    let ledger = ledger(10.0);
    sync(&ledger, "a", 50, 0, SEC);
    assert_eq!(level(&ledger, SEC), 20.0);
}

#[test]
fn a_silent_limiter_loses_its_slots_after_the_lease_and_its_late_returns_count_nothing() {
    let ledger = ledger(10.0);
    sync(&ledger, "a", 4, 0, SEC);
    sync(&ledger, "b", 3, 0, SEC);
    // b keeps syncing, a is silent.
    for t in 2..=6 {
        sync(&ledger, "b", 0, 0, t * SEC);
        assert_eq!(
            ledger.expire_leases(t * SEC),
            0.0,
            "within the lease at {t} s"
        );
    }
    assert_eq!(level(&ledger, 6 * SEC), 7.0);
    sync(&ledger, "b", 0, 0, 7 * SEC);
    assert_eq!(ledger.expire_leases(7 * SEC), 4.0, "a's lease ran out");
    assert_eq!(level(&ledger, 7 * SEC), 3.0);
    // a comes back: the returns of its dropped slots find nothing, so b's
    // slots are not taken a second time; a new slot counts once.
    sync(&ledger, "a", 1, 4, 8 * SEC);
    assert_eq!(level(&ledger, 8 * SEC), 4.0);
    assert_eq!(ledger.expire_leases(8 * SEC), 0.0);
}

#[test]
fn a_keys_slots_go_with_the_lease_too() {
    let ledger = Ledger {
        in_flight_lease: LEASE,
        ..Ledger::default()
    };
    let q = Quota::new(ID, "per_client", 2.0, 2.0, 2.0)
        .in_flight_if(true)
        .keyed();
    ledger.load(vec![q], 0);
    let request = test_request("a", 0, 0, &[], &[(ID, 42, 2)]);
    ledger.sync(&request, 77, SEC, PAGING);
    let key = CounterKey { id: ID, key: 42 };
    assert_eq!(ledger.counters.view_counter(key, SEC).unwrap().level, 2.0);
    assert_eq!(ledger.expire_leases(SEC + LEASE + 1), 2.0);
    let left = ledger.counters.view_counter(key, SEC + LEASE + 1);
    assert_eq!(left.map_or(0.0, |v| v.level), 0.0);
    // Its late key return finds nothing held.
    let late = SyncRequest {
        keyed_returned: vec![KeyedDeltas {
            id: ID,
            deltas: vec![crate::wire::KeyDelta(42, 2)],
            window: None,
        }],
        ..test_request("a", 0, 0, &[], &[])
    };
    ledger.sync(&late, 77, 7 * SEC, PAGING);
    assert_eq!(ledger.expire_leases(7 * SEC), 0.0);
}

/// A limiter reports a key's slots absolute (`keyed_held`): the root
/// sets its count there to them, takes none of the request's adds and
/// returns of that key, applies a copy of the request once, and after
/// the lease dropped the key's slots counts them again from the next
/// report (what the lease forgave is settled by it: a later report of 0
/// leaves nothing counted).
#[test]
fn a_keys_held_slots_reported_absolute_set_its_count() {
    let ledger = Ledger {
        in_flight_lease: LEASE,
        ..Ledger::default()
    };
    let q = Quota::new(ID, "per_client", 5.0, 5.0, 5.0)
        .in_flight_if(true)
        .keyed();
    ledger.load(vec![q], 0);
    let key = CounterKey { id: ID, key: 42 };
    let level = |now| {
        ledger
            .counters
            .view_counter(key, now)
            .map_or(0.0, |v| v.level)
    };
    let report = |seq, held: u64, add: u64| SyncRequest {
        sequence: Some(crate::wire::Sequence {
            incarnation: 7,
            seq,
        }),
        keyed_held: vec![KeyedDeltas {
            id: ID,
            deltas: vec![crate::wire::KeyDelta(42, held)],
            window: None,
        }],
        ..test_request("a", 0, 0, &[], &[(ID, 42, add)])
    };
    // 3 held, though the request's own add says 2: the held count wins.
    let first = report(1, 3, 2);
    assert_eq!(first.check(), Ok(()));
    ledger.sync(&first, 77, SEC, PAGING);
    assert_eq!(level(SEC), 3.0);
    // A copy of the same request: applied once.
    ledger.sync(&first, 77, SEC, PAGING);
    assert_eq!(level(SEC), 3.0);
    // Another limiter's add of the key adds to it.
    ledger.sync(
        &test_request("b", 0, 0, &[], &[(ID, 42, 1)]),
        77,
        SEC,
        PAGING,
    );
    assert_eq!(level(SEC), 4.0);
    ledger.sync(&report(2, 1, 0), 77, 2 * SEC, PAGING);
    assert_eq!(level(2 * SEC), 2.0);
    // Silent past the lease, both limiters lose their slots there.
    assert_eq!(ledger.expire_leases(2 * SEC + LEASE + 1), 2.0);
    assert_eq!(level(9 * SEC), 0.0);
    // Back, "a" still holds 2: its report counts them again.
    ledger.sync(&report(3, 2, 0), 77, 9 * SEC, PAGING);
    assert_eq!(level(9 * SEC), 2.0);
    // Given back, nothing of the forgiven slots stays counted.
    ledger.sync(&report(4, 0, 0), 77, 10 * SEC, PAGING);
    assert_eq!(level(10 * SEC), 0.0);
}

#[test]
fn leaky_quotas_are_untouched_by_the_lease() {
    let ledger = Ledger {
        in_flight_lease: LEASE,
        ..Ledger::default()
    };
    ledger.load(vec![Quota::new(ID, "rate", 0.0, 100.0, 100.0)], 0);
    sync(&ledger, "a", 5, 0, SEC);
    assert_eq!(ledger.expire_leases(60 * SEC), 0.0);
    assert_eq!(level(&ledger, 60 * SEC), 5.0);
}

/// One step of a fleet of three honest limiters.
#[derive(Clone, Debug)]
enum Step {
    /// Limiter takes slots.
    Acquire(usize, u64),
    /// Limiter gives back up to this many of the slots it truly holds.
    Release(usize, u64),
    /// Time passes (seconds); the root sweeps leases.
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize, 1..4u64).prop_map(|(l, n)| Step::Acquire(l, n)),
        (0..3usize, 1..4u64).prop_map(|(l, n)| Step::Release(l, n)),
        (1..4u64).prop_map(Step::Advance),
    ]
}

proptest! {
    /// The counter is always the sum of what the root holds for each
    /// limiter, where a return takes at most what that limiter holds and a
    /// lease drops it whole; so a limiter's late returns never take
    /// another limiter's slots (no double count), and the root never
    /// counts more than the fleet truly holds.
    #[test]
    fn the_counter_is_the_sum_of_each_limiters_held_slots(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let limit = 1e6; // no allowance cut: the merge alone is tested
        let ledger = ledger(limit);
        let names = ["a", "b", "c"];
        let mut now = SEC;
        let mut truly = [0u64; 3];
        let mut counted = [0u64; 3];
        // Slots the lease dropped while the limiter still held them: its
        // returns of them take these first.
        let mut forgiven = [0u64; 3];
        let mut last = [None::<Nanos>; 3];
        for step in steps {
            match step {
                Step::Acquire(l, n) => {
                    sync(&ledger, names[l], n, 0, now);
                    truly[l] += n;
                    counted[l] += n;
                    last[l] = Some(now);
                }
                Step::Release(l, n) => {
                    let n = n.min(truly[l]);
                    sync(&ledger, names[l], 0, n, now);
                    truly[l] -= n;
                    let f = n.min(forgiven[l]);
                    forgiven[l] -= f;
                    counted[l] -= n - f;
                    last[l] = Some(now);
                }
                Step::Advance(s) => {
                    now += s * SEC;
                    let dropped = ledger.expire_leases(now);
                    let mut expected = 0;
                    for l in 0..3 {
                        if last[l].is_some_and(|at| now - at > LEASE) {
                            expected += counted[l];
                            forgiven[l] += counted[l];
                            counted[l] = 0;
                        }
                    }
                    prop_assert_eq!(dropped, expected as f64);
                }
            }
            let sum: u64 = counted.iter().sum();
            prop_assert_eq!(level(&ledger, now), sum as f64);
            for l in 0..3 {
                prop_assert_eq!(counted[l] + forgiven[l], truly[l]);
            }
        }
    }
}
