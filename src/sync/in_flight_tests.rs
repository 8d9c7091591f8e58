//! In-flight (slot) quotas end to end through the sync engine and real
//! root ledgers (the simulator's roots): every root silent for the lease
//! leaves each host its own slots, a root or a group comes back to the
//! fleet's count, a restarted root is sent the slots held from before and
//! its new instance's levels are adopted after the grace, and a sync
//! thread started anew (an nginx reload) takes over what the region
//! remembers of its roots.

use super::exact_tests::{exchange, Fate};
use super::return_tests::cycle;
use super::*;
use crate::core::Quota;
use crate::sim::root::SimRoot;
use crate::table::{CheckItem, Outcome};
use crate::wire::CounterKey;

const SEC: Nanos = 1_000_000_000;

/// Quota `uploads` (id 5): 10 slots at once.
fn uploads() -> Vec<Quota> {
    vec![Quota::new(5, "uploads", 10.0, 10.0, 10.0).in_flight_if(true)]
}

fn slot() -> CheckItem<'static> {
    CheckItem {
        name: b"uploads",
        key: None,
        weight: 1,
        max_wait: None,
    }
}

/// A host of `uploads` syncing with one root.
fn in_flight_host(name: &str) -> (Table, SyncEngine) {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&uploads());
    (
        t,
        SyncEngine::new(&["http://root0".to_string()], name.into(), SEC, 100, 0),
    )
}

/// Takes `n` slots at `now`; the slots taken (each must pass).
fn take(t: &Table, n: usize, now: Nanos) -> Vec<crate::table::HeldSlot> {
    (0..n)
        .map(|_| {
            let (r, held) = t.gate().acquire(&slot(), now, false, || 0.5);
            assert_eq!(r.outcome, Outcome::Pass);
            held.unwrap()
        })
        .collect()
}

/// Slots a host may still take at `now` (taking them, then giving them
/// back before any sync).
fn room(t: &Table, now: Nanos) -> usize {
    let mut taken = Vec::new();
    while let (Outcome::Pass, Some(held)) = {
        let (r, held) = t.gate().acquire(&slot(), now, false, || 0.5);
        (r.outcome, held)
    } {
        taken.push(held);
    }
    for held in &taken {
        t.gate().release(&slot(), *held, now);
    }
    taken.len()
}

/// Each host gives every slot it holds back at second `at`, then every
/// host runs four cycles, one a second, with every root up.
fn give_all_back(
    hosts: &mut [(&Table, &mut SyncEngine, Vec<crate::table::HeldSlot>)],
    roots: &mut [SimRoot],
    at: u64,
) {
    for (t, _, held) in hosts.iter_mut() {
        for slot_held in held.drain(..) {
            assert!(t.gate().release(&slot(), slot_held, at * SEC));
        }
    }
    for s in at..at + 4 {
        for (t, e, _) in hosts.iter_mut() {
            cycle(e, t, roots, &[], s * SEC, |_| {});
        }
    }
}

fn uploads_level(t: &Table, now: Nanos) -> f64 {
    t.quota(b"uploads", now).unwrap().level
}

#[test]
fn every_root_silent_for_the_lease_leaves_each_host_its_own_slots() {
    let mut roots = vec![SimRoot::new(&uploads(), 1, 0, 0)];
    let (a, mut ea) = in_flight_host("a");
    let (b, mut eb) = in_flight_host("b");
    let mut b_slots = take(&b, 6, 0);
    let a_slots = take(&a, 2, 0);
    cycle(&mut eb, &b, &mut roots, &[], SEC, |_| {});
    cycle(&mut ea, &a, &mut roots, &[], SEC, |_| {});
    cycle(&mut eb, &b, &mut roots, &[], SEC, |_| {});
    assert_eq!((uploads_level(&a, SEC), uploads_level(&b, SEC)), (8.0, 8.0));
    assert_eq!(room(&a, SEC), 2);
    // The root dies. Until the lease, a keeps counting b's 6 (their
    // releases cannot reach it): strict.
    roots[0].kill();
    for s in 2..11 {
        cycle(&mut ea, &a, &mut roots, &[0], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[0], s * SEC, |_| {});
        assert_eq!(room(&a, s * SEC), 2, "at {s} s");
    }
    // Past the lease (10 s of silence), each host counts its own slots
    // only: a may take the limit less its own 2.
    for s in 11..13 {
        cycle(&mut ea, &a, &mut roots, &[0], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[0], s * SEC, |_| {});
    }
    assert!(ea.all_down());
    assert_eq!(uploads_level(&a, 12 * SEC), 2.0);
    assert_eq!(room(&a, 12 * SEC), 8);
    assert_eq!(uploads_level(&b, 12 * SEC), 6.0);
    // a takes 3 more; b gives 4 back, during the outage.
    let a_more = take(&a, 3, 12 * SEC);
    for held in b_slots.drain(..4) {
        assert!(b.gate().release(&slot(), held, 12 * SEC));
    }
    cycle(&mut ea, &a, &mut roots, &[0], 13 * SEC, |_| {});
    cycle(&mut eb, &b, &mut roots, &[0], 13 * SEC, |_| {});
    assert_eq!(
        (uploads_level(&a, 13 * SEC), uploads_level(&b, 13 * SEC)),
        (5.0, 2.0)
    );
    // The root restarts knowing nothing: each host sends it what it owed
    // since the outage (a's 3 slots, b's 4 returns) and then, finding it
    // restarted, what it held there before (a's 2, b's 6), so the root
    // counts every slot held: a's 5 and b's 2. Both hosts take its view,
    // as it is.
    roots[0].restart(2, 14 * SEC);
    for s in 14..20 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[], s * SEC, |_| {});
    }
    let root = roots[0].level(5, 20 * SEC).unwrap();
    assert_eq!(root, 7.0);
    assert_eq!(uploads_level(&a, 20 * SEC), root);
    assert_eq!(uploads_level(&b, 20 * SEC), root);
    // Everything given back: every count comes down to nothing, at the
    // root and at both hosts (no slot stuck, none counted twice).
    let a_slots = a_slots.into_iter().chain(a_more).collect();
    let mut hosts = [(&a, &mut ea, a_slots), (&b, &mut eb, b_slots)];
    give_all_back(&mut hosts, &mut roots, 20);
    assert_eq!(roots[0].level(5, 24 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(uploads_level(&a, 24 * SEC), 0.0);
    assert_eq!(uploads_level(&b, 24 * SEC), 0.0);
    assert_eq!(
        (
            a.books().held_here(b"uploads"),
            b.books().held_here(b"uploads")
        ),
        (Some(0), Some(0))
    );
}

/// One step of the in-flight property: a host takes or gives back slots,
/// then both hosts run a cycle; the root may be unreachable for both.
#[derive(Clone, Debug)]
struct SlotStep {
    host: usize,
    /// Slots taken (at most what the host may), or given back (negative).
    slots: i64,
    /// The root is unreachable this cycle.
    down: bool,
}

fn slot_steps() -> impl proptest::strategy::Strategy<Value = Vec<SlotStep>> {
    use proptest::prelude::*;
    // Outages come in runs (a long one outlasts the lease).
    let step = (0..2usize, -4i64..5, 0..3u8);
    proptest::collection::vec((step, 0..25usize), 1..8).prop_map(|runs| {
        let mut steps = Vec::new();
        for ((host, slots, kind), len) in runs {
            for i in 0..len.max(1) {
                steps.push(SlotStep {
                    host: (host + i) % 2,
                    slots: if i % 3 == 0 { slots } else { 0 },
                    down: kind == 0,
                });
            }
        }
        steps
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// The local lease, on any interleaving of slots taken and given back
    /// with the root unreachable (briefly, and past the lease: it then
    /// drops both hosts' slots itself): a host past the lease reads its
    /// own slots exactly; once the root is back, both hosts read the
    /// root's level; and once every slot is given back, every count is 0
    /// (no slot stuck, none counted twice). (A root that restarts loses
    /// what it counted: see `every_root_silent_for_the_lease_leaves_each_
    /// host_its_own_slots` and docs/DESIGN.md.)
    #[test]
    fn in_flight_counts_through_outages_past_the_lease_come_back_to_the_roots(
        steps in slot_steps()
    ) {
        let mut roots = vec![SimRoot::new(&uploads(), 1, 0, 0)];
        let mut hosts = [in_flight_host("a"), in_flight_host("b")];
        let mut held: [Vec<crate::table::HeldSlot>; 2] = [Vec::new(), Vec::new()];
        let mut now = SEC;
        let mut silent = 0;
        for s in &steps {
            let t = &hosts[s.host].0;
            if s.slots > 0 {
                for _ in 0..s.slots {
                    let (r, taken) = t.gate().acquire(&slot(), now, false, || 0.5);
                    if r.outcome == Outcome::Pass {
                        held[s.host].push(taken.unwrap());
                    }
                }
            } else {
                for _ in 0..(-s.slots) {
                    if let Some(taken) = held[s.host].pop() {
                        proptest::prop_assert!(t.gate().release(&slot(), taken, now));
                    }
                }
            }
            silent = if s.down { silent + 1 } else { 0 };
            let down: &[usize] = if s.down { &[0] } else { &[] };
            for (h, (t, e)) in hosts.iter_mut().enumerate() {
                cycle(e, t, &mut roots, down, now, |_| {});
                let own = held[h].len() as i64;
                proptest::prop_assert_eq!(t.books().held_here(b"uploads"), Some(own));
                if silent > 11 {
                    proptest::prop_assert_eq!(uploads_level(t, now), own as f64);
                }
            }
            now += SEC;
        }
        // Back for good: both hosts read the root's view.
        for _ in 0..3 {
            for (t, e) in hosts.iter_mut() {
                cycle(e, t, &mut roots, &[], now, |_| {});
            }
            now += SEC;
        }
        let root = roots[0].level(5, now).unwrap_or(0.0);
        for (t, _) in &hosts {
            proptest::prop_assert_eq!(uploads_level(t, now), root);
        }
        // Everything given back.
        for (h, (t, _)) in hosts.iter().enumerate() {
            for taken in held[h].drain(..) {
                proptest::prop_assert!(t.gate().release(&slot(), taken, now));
            }
        }
        for _ in 0..3 {
            for (t, e) in hosts.iter_mut() {
                cycle(e, t, &mut roots, &[], now, |_| {});
            }
            now += SEC;
        }
        proptest::prop_assert_eq!(roots[0].level(5, now).unwrap_or(0.0), 0.0);
        for (t, _) in &hosts {
            proptest::prop_assert_eq!(uploads_level(t, now), 0.0);
        }
    }
}

#[test]
fn a_restarted_root_counts_the_slots_held_from_before_and_every_later_one() {
    let mut roots = vec![SimRoot::new(&uploads(), 1, 0, 0)];
    let (a, mut ea) = in_flight_host("a");
    let (b, mut eb) = in_flight_host("b");
    let a_old = take(&a, 4, 0);
    let b_old = take(&b, 3, 0);
    cycle(&mut ea, &a, &mut roots, &[], SEC, |_| {});
    cycle(&mut eb, &b, &mut roots, &[], SEC, |_| {});
    assert_eq!(roots[0].level(5, SEC), Some(7.0));
    // The root restarts knowing nothing. a gives its slots back before
    // its first exchange with the new instance (that request carries the
    // returns), b only after its first one.
    roots[0].restart(2, 2 * SEC);
    for held in a_old {
        assert!(a.gate().release(&slot(), held, 2 * SEC));
    }
    cycle(&mut ea, &a, &mut roots, &[], 2 * SEC, |_| {});
    cycle(&mut eb, &b, &mut roots, &[], 2 * SEC, |_| {});
    // Each host sends the new instance what it held there before: the
    // root counts b's 3 again, and a's returns leave it nothing there
    // (not -4).
    cycle(&mut ea, &a, &mut roots, &[], 3 * SEC, |_| {});
    cycle(&mut eb, &b, &mut roots, &[], 3 * SEC, |_| {});
    assert_eq!(roots[0].level(5, 3 * SEC), Some(3.0));
    // Within the grace the hosts keep the earlier instance's values (a
    // read 4 there, b 7), max-merged: the new one could still lack
    // another host's slots. Strict, never below the root.
    assert_eq!(uploads_level(&a, 3 * SEC), 4.0);
    assert_eq!(uploads_level(&b, 3 * SEC), 7.0);
    for held in b_old {
        assert!(b.gate().release(&slot(), held, 3 * SEC));
    }
    for s in 4..6 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].level(5, 5 * SEC).unwrap_or(0.0), 0.0);
    // Later slots all count at the root: none is hidden by returns of
    // slots the new instance never counted.
    let a_new = take(&a, 2, 6 * SEC);
    let b_new = take(&b, 3, 6 * SEC);
    for s in 6..8 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].level(5, 8 * SEC), Some(5.0));
    // Three intervals after the restart, the hosts take the new
    // instance's values as they are (not max-merged with the earlier
    // instance's 7, which would never come down).
    assert_eq!(uploads_level(&a, 8 * SEC), 5.0);
    assert_eq!(uploads_level(&b, 8 * SEC), 5.0);
    assert_eq!(room(&a, 8 * SEC), 5);
    let mut hosts = [(&a, &mut ea, a_new), (&b, &mut eb, b_new)];
    give_all_back(&mut hosts, &mut roots, 8);
    assert_eq!(roots[0].level(5, 12 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(uploads_level(&a, 12 * SEC), 0.0);
    assert_eq!(uploads_level(&b, 12 * SEC), 0.0);
}

#[test]
fn slots_taken_while_every_root_is_down_reach_the_roots_whenever_in_the_cycle() {
    let mut roots = vec![SimRoot::new(&uploads(), 1, 0, 0)];
    let (a, mut ea) = in_flight_host("a");
    cycle(&mut ea, &a, &mut roots, &[], SEC, |_| {});
    let mut held = Vec::new();
    for s in 2..6 {
        // Taken after the cycle's collection: the fold at its end takes
        // them locally, and they must still be owed to the root.
        let out = ea.begin_cycle(&a, s * SEC);
        held.extend(take(&a, 1, s * SEC));
        for o in out {
            ea.finish(&a, o.root, o.owed, &[], Some("down".into()), s * SEC);
        }
        ea.end_cycle(&a, s * SEC);
    }
    assert!(ea.all_down());
    assert_eq!(uploads_level(&a, 6 * SEC), 4.0);
    cycle(&mut ea, &a, &mut roots, &[], 6 * SEC, |_| {});
    assert_eq!(roots[0].level(5, 6 * SEC), Some(4.0));
    assert_eq!(uploads_level(&a, 6 * SEC), 4.0);
}

#[test]
fn a_group_silent_for_the_lease_leaves_its_shard_at_this_hosts_own_slots() {
    // Two groups of one root each; `uploads` lives in one of them.
    let mut roots: Vec<SimRoot> = (0..2)
        .map(|i| SimRoot::new(&uploads(), 1 + i, 0, 0))
        .collect();
    let urls = ["http://root0".to_string(), "http://root1".to_string()];
    let grouped = |name: &str| {
        let t = Table::new_heap(8, 16);
        t.books().apply_quotas(&uploads());
        let mut e = SyncEngine::new(&urls, name.into(), SEC, 100, 0);
        e.set_groups(&[0, 1]);
        (t, e)
    };
    let (a, mut ea) = grouped("a");
    let (b, mut eb) = grouped("b");
    let home = crate::sync::shard(CounterKey::named(5), 2);
    let b_slots = take(&b, 6, 0);
    let a_slots = take(&a, 2, 0);
    cycle(&mut eb, &b, &mut roots, &[], SEC, |_| {});
    cycle(&mut ea, &a, &mut roots, &[], SEC, |_| {});
    cycle(&mut eb, &b, &mut roots, &[], SEC, |_| {});
    assert_eq!(uploads_level(&a, SEC), 8.0);
    // The group holding `uploads` goes silent; the other still answers.
    for s in 2..11 {
        cycle(&mut ea, &a, &mut roots, &[home], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[home], s * SEC, |_| {});
        assert_eq!(room(&a, s * SEC), 2, "at {s} s");
    }
    for s in 11..13 {
        cycle(&mut ea, &a, &mut roots, &[home], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[home], s * SEC, |_| {});
    }
    assert!(!ea.all_down());
    assert_eq!(ea.metrics().groups_down, vec![home as u32]);
    assert_eq!(uploads_level(&a, 12 * SEC), 2.0);
    assert_eq!(room(&a, 12 * SEC), 8);
    // Back: both hosts read that root's level, and everything given back
    // brings every count to 0.
    for s in 13..18 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
        cycle(&mut eb, &b, &mut roots, &[], s * SEC, |_| {});
    }
    let root = roots[home].level(5, 18 * SEC).unwrap_or(0.0);
    assert_eq!(
        (uploads_level(&a, 18 * SEC), uploads_level(&b, 18 * SEC)),
        (root, root)
    );
    let mut hosts = [(&a, &mut ea, a_slots), (&b, &mut eb, b_slots)];
    give_all_back(&mut hosts, &mut roots, 18);
    assert_eq!(roots[home].level(5, 22 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(
        (uploads_level(&a, 22 * SEC), uploads_level(&b, 22 * SEC)),
        (0.0, 0.0)
    );
}

/// One root, and host `a` holding `n` slots, sent to the root in a
/// cycle at 1 s.
fn a_holding(n: usize) -> (Vec<SimRoot>, Table, SyncEngine, Vec<crate::table::HeldSlot>) {
    let mut roots = vec![SimRoot::new(&uploads(), 1, 0, 0)];
    let (a, mut ea) = in_flight_host("a");
    let held = take(&a, n, 0);
    cycle(&mut ea, &a, &mut roots, &[], SEC, |_| {});
    (roots, a, ea, held)
}

/// The root restarts at 2 s as 3 of the slots `a` holds end: the new
/// instance gets their returns, then (after cycles at 2 and 3 s) the
/// slots held before; it counts the one left.
fn restart_as_three_slots_end(
    a: &Table,
    ea: &mut SyncEngine,
    roots: &mut [SimRoot],
    held: &mut Vec<crate::table::HeldSlot>,
) {
    roots[0].restart(2, 2 * SEC);
    for slot_held in held.drain(..3) {
        assert!(a.gate().release(&slot(), slot_held, 2 * SEC));
    }
    for s in 2..4 {
        cycle(ea, a, roots, &[], s * SEC, |_| {});
    }
}

#[test]
fn a_root_restarting_again_before_the_resend_lands_counts_the_slots_once() {
    let (mut roots, a, mut ea, held) = a_holding(4);
    assert_eq!(roots[0].level(5, SEC), Some(4.0));
    // Found restarted, the root is owed a's 4 again; it goes down before
    // they reach it, and comes back as a third instance, which the
    // exchange carrying them finds restarted once more.
    roots[0].restart(2, 2 * SEC);
    cycle(&mut ea, &a, &mut roots, &[], 2 * SEC, |_| {});
    cycle(&mut ea, &a, &mut roots, &[0], 3 * SEC, |_| {});
    roots[0].restart(3, 4 * SEC);
    for s in 4..7 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
    }
    // The resend it carried counts them: they are not owed a third time.
    assert_eq!(roots[0].level(5, 7 * SEC), Some(4.0));
    let mut hosts = [(&a, &mut ea, held)];
    give_all_back(&mut hosts, &mut roots, 7);
    assert_eq!(roots[0].level(5, 11 * SEC).unwrap_or(0.0), 0.0);
}

#[test]
fn a_root_restarting_twice_within_the_grace_has_its_levels_taken_as_they_are() {
    let (mut roots, a, mut ea, mut held) = a_holding(2);
    roots[0].restart(2, 2 * SEC);
    cycle(&mut ea, &a, &mut roots, &[], 2 * SEC, |_| {});
    // The second instance's level wins the max over the first's (3 more
    // slots): the host's level now carries the second instance's source.
    held.extend(take(&a, 3, 2 * SEC));
    cycle(&mut ea, &a, &mut roots, &[], 3 * SEC, |_| {});
    assert_eq!(roots[0].level(5, 3 * SEC), Some(5.0));
    // A third instance, within the grace of the second, is first sent
    // returns of 3 slots; then the 5 held before. Its 2 lose the max
    // against the second's 5.
    for slot_held in held.drain(..3) {
        assert!(a.gate().release(&slot(), slot_held, 3 * SEC));
    }
    roots[0].restart(3, 4 * SEC);
    cycle(&mut ea, &a, &mut roots, &[], 4 * SEC, |_| {});
    cycle(&mut ea, &a, &mut roots, &[], 5 * SEC, |_| {});
    assert_eq!(roots[0].level(5, 5 * SEC), Some(2.0));
    assert_eq!(uploads_level(&a, 5 * SEC), 5.0);
    // Everything given back: past the grace the host takes the third
    // instance's 0, not the second's 5 for good.
    let mut hosts = [(&a, &mut ea, held)];
    give_all_back(&mut hosts, &mut roots, 6);
    for s in 10..12 {
        cycle(hosts[0].1, &a, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].level(5, 12 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(uploads_level(&a, 12 * SEC), 0.0);
}

#[test]
fn a_restarted_roots_level_is_taken_after_the_grace_even_if_it_no_longer_changes() {
    let (mut roots, a, mut ea, mut held) = a_holding(4);
    // 3 slots end as the root restarts: the new instance gets their
    // returns, then the 4 held before; it counts 1, and the host keeps
    // the earlier instance's 4 within the grace.
    restart_as_three_slots_end(&a, &mut ea, &mut roots, &mut held);
    assert_eq!(roots[0].level(5, 4 * SEC), Some(1.0));
    assert_eq!(uploads_level(&a, 4 * SEC), 4.0);
    // Past the grace the host takes the root's 1, which has not changed
    // there since.
    for s in 4..8 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(uploads_level(&a, 8 * SEC), 1.0);
    assert_eq!(room(&a, 8 * SEC), 9);
}

/// The sync thread of `t` stops and another starts on the same region
/// (an nginx reload): what was unacked goes back to pending, and the
/// new engine takes over what the region remembers of the roots.
fn restart_sync(t: &Table, e: &mut SyncEngine, now: Nanos) {
    e.abandon(t);
    *e = SyncEngine::new(&["http://root0".to_string()], "a".into(), SEC, 100, now);
    e.resume(t);
}

#[test]
fn a_sync_thread_started_anew_finds_a_root_restarted_meanwhile() {
    let (mut roots, a, mut ea, mut held) = a_holding(4);
    // An nginx reload while the root restarts: the new sync thread has
    // never talked to the root, and still sends it the 4 held from
    // before (its returns of 2 would otherwise leave it nothing, and hide
    // 2 later slots).
    restart_sync(&a, &mut ea, 2 * SEC);
    roots[0].restart(2, 2 * SEC);
    for slot_held in held.drain(..2) {
        assert!(a.gate().release(&slot(), slot_held, 2 * SEC));
    }
    held.extend(take(&a, 3, 2 * SEC));
    for s in 2..4 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].level(5, 4 * SEC), Some(5.0));
    // Everything given back: the root counts 0, and past the grace so
    // does the host (the earlier instance's level is not kept for good).
    let mut hosts = [(&a, &mut ea, held)];
    give_all_back(&mut hosts, &mut roots, 4);
    assert_eq!(roots[0].level(5, 8 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(uploads_level(&a, 8 * SEC), 0.0);
}

#[test]
fn a_sync_thread_started_anew_sends_a_root_that_did_not_restart_nothing_again() {
    let (mut roots, a, mut ea, held) = a_holding(4);
    restart_sync(&a, &mut ea, 2 * SEC);
    for s in 2..4 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].level(5, 4 * SEC), Some(4.0));
    assert_eq!(uploads_level(&a, 4 * SEC), 4.0);
    let mut hosts = [(&a, &mut ea, held)];
    give_all_back(&mut hosts, &mut roots, 4);
    assert_eq!(roots[0].level(5, 8 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(uploads_level(&a, 8 * SEC), 0.0);
}

#[test]
fn a_sync_thread_started_anew_takes_the_levels_of_a_root_that_restarted_before() {
    let (mut roots, a, mut ea, held) = a_holding(4);
    roots[0].restart(2, 2 * SEC);
    for s in 2..6 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
    }
    // The levels known are the second instance's; a new sync thread's
    // replies from it replace them as the earlier thread's did.
    restart_sync(&a, &mut ea, 6 * SEC);
    let mut hosts = [(&a, &mut ea, held)];
    give_all_back(&mut hosts, &mut roots, 6);
    assert_eq!(roots[0].level(5, 10 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(uploads_level(&a, 10 * SEC), 0.0);
}

#[test]
fn slots_given_back_before_a_new_sync_threads_first_exchange_reach_the_root() {
    let (mut roots, a, mut ea, held) = a_holding(4);
    // Its first request carries the returns: the root is known to take
    // them (not dropped as for a root that predates them).
    restart_sync(&a, &mut ea, 2 * SEC);
    for slot_held in held {
        assert!(a.gate().release(&slot(), slot_held, 2 * SEC));
    }
    cycle(&mut ea, &a, &mut roots, &[], 2 * SEC, |_| {});
    assert_eq!(roots[0].level(5, 2 * SEC).unwrap_or(0.0), 0.0);
    assert_eq!(ea.metrics().roots[0].dropped_returns, 0);
    // The root left the emptied counter out of its answer of every
    // counter: the host reads 0 too.
    assert_eq!(uploads_level(&a, 2 * SEC), 0.0);
}

#[test]
fn a_sync_thread_started_anew_within_a_restarts_grace_still_takes_the_new_instances_level() {
    let (mut roots, a, mut ea, mut held) = a_holding(4);
    // As the root restarts 3 slots end: its new instance counts 1, the
    // host keeps the earlier instance's 4 within the grace, and its sync
    // thread starts anew before the grace is over.
    restart_as_three_slots_end(&a, &mut ea, &mut roots, &mut held);
    restart_sync(&a, &mut ea, 4 * SEC);
    for s in 4..9 {
        cycle(&mut ea, &a, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].level(5, 9 * SEC), Some(1.0));
    assert_eq!(uploads_level(&a, 9 * SEC), 1.0);
}

#[test]
fn a_zone_that_changed_size_keeps_what_the_sync_thread_knew_of_its_roots() {
    let (mut roots, a, mut ea, _held) = a_holding(4);
    // A reload with a larger zone while the root restarts: the new zone
    // adopts the old one, and its sync thread still finds the restart.
    ea.abandon(&a);
    let bigger = Table::new_heap(16, 16);
    bigger.books().adopt(a.books(), 2 * SEC);
    let mut eb = SyncEngine::new(&["http://root0".to_string()], "a".into(), SEC, 100, 2 * SEC);
    eb.resume(&bigger);
    roots[0].restart(2, 2 * SEC);
    for s in 2..4 {
        cycle(&mut eb, &bigger, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].level(5, 4 * SEC), Some(4.0));
}

/// One cycle of each host at second `s` through two root processes
/// behind one URL: the first host's request reaches `pair[s % 2]`, the
/// second's the other.
fn in_turn(hosts: [(&Table, &mut SyncEngine); 2], pair: &mut [SimRoot; 2], s: u64) {
    let first = (s % 2) as usize;
    for (i, (t, e)) in hosts.into_iter().enumerate() {
        let process = std::slice::from_mut(&mut pair[(first + i) % 2]);
        cycle(e, t, process, &[], s * SEC, |_| {});
    }
}

/// Two root processes of `uploads` (instances 1 and 2), to stand behind
/// one URL.
fn two_processes() -> [SimRoot; 2] {
    [
        SimRoot::new(&uploads(), 1, 0, 0),
        SimRoot::new(&uploads(), 2, 0, 0),
    ]
}

/// Two root processes behind one URL (a load balancer) answer host `a`'s
/// requests in turn, host `b`'s the other way round, while slots come and
/// go: each process holds every slot (both take held slots, absolute),
/// and only the first reply of the second process is taken for a
/// restart.
#[test]
fn two_processes_behind_one_url_each_hold_every_slot_once_and_no_restart_is_found() {
    let mut pair = two_processes();
    let (a, mut ea) = in_flight_host("a");
    let (b, mut eb) = in_flight_host("b");
    let (mut a_held, mut b_held) = (Vec::new(), Vec::new());
    for s in 1..=16u64 {
        let now = s * SEC;
        // Slots change before even seconds only: after an odd second both
        // processes have heard of every change from both hosts.
        match s % 8 {
            2 => a_held.extend(take(&a, 3, now)),
            4 => {
                b_held.extend(take(&b, 2, now));
                for held in a_held.drain(..2) {
                    assert!(a.gate().release(&slot(), held, now));
                }
            }
            6 => {
                a_held.extend(take(&a, 1, now));
                for held in b_held.drain(..1) {
                    assert!(b.gate().release(&slot(), held, now));
                }
            }
            _ => {}
        }
        in_turn([(&a, &mut ea), (&b, &mut eb)], &mut pair, s);
        if s % 2 == 1 {
            let want = (a_held.len() + b_held.len()) as f64;
            for (i, process) in pair.iter().enumerate() {
                let got = process.level(5, now).unwrap_or(0.0);
                assert_eq!(got, want, "process {i} after {s} s");
            }
        }
    }
    // The first reply of the second process looks like a restart (it
    // cannot be told from one); every later turn is a switch.
    for e in [&ea, &eb] {
        let m = &e.metrics().roots[0];
        assert_eq!((m.restarts, m.switches), (1, 14));
    }
    // Every slot given back: both processes come down to nothing.
    for held in a_held.drain(..) {
        assert!(a.gate().release(&slot(), held, 17 * SEC));
    }
    for held in b_held.drain(..) {
        assert!(b.gate().release(&slot(), held, 17 * SEC));
    }
    for s in 17..=20u64 {
        in_turn([(&a, &mut ea), (&b, &mut eb)], &mut pair, s);
    }
    for process in &pair {
        assert_eq!(process.level(5, 20 * SEC).unwrap_or(0.0), 0.0);
    }
    assert_eq!(uploads_level(&a, 20 * SEC), 0.0);
    assert_eq!(room(&a, 20 * SEC), 10);
}

/// Two root processes behind one URL, and an nginx reload: the new sync
/// thread takes over the instances the old one had seen answer there, so
/// neither process's next reply is taken for a restart, and the slots stay
/// counted once at each.
#[test]
fn after_a_reload_two_processes_behind_one_url_are_still_switches() {
    let mut pair = two_processes();
    let (a, mut ea) = in_flight_host("a");
    let (b, mut eb) = in_flight_host("b");
    let held = take(&a, 3, SEC);
    for s in 1..=4u64 {
        in_turn([(&a, &mut ea), (&b, &mut eb)], &mut pair, s);
    }
    assert_eq!(ea.metrics().roots[0].restarts, 1);
    // The reload: a new sync thread on the same region.
    ea.abandon(&a);
    let mut ea = SyncEngine::new(&["http://root0".to_string()], "a".into(), SEC, 100, 5 * SEC);
    ea.resume(&a);
    for s in 5..=10u64 {
        in_turn([(&a, &mut ea), (&b, &mut eb)], &mut pair, s);
    }
    let m = &ea.metrics().roots[0];
    assert_eq!((m.restarts, m.switches), (0, 6), "the new thread's turns");
    for (i, process) in pair.iter().enumerate() {
        assert_eq!(process.level(5, 10 * SEC), Some(3.0), "process {i}");
    }
    for slot_held in held {
        assert!(a.gate().release(&slot(), slot_held, 11 * SEC));
    }
    for s in 11..=13u64 {
        in_turn([(&a, &mut ea), (&b, &mut eb)], &mut pair, s);
    }
    for process in &pair {
        assert_eq!(process.level(5, 13 * SEC).unwrap_or(0.0), 0.0);
    }
}

/// A root restarts while a host holds slots of a key of a per-key
/// in-flight quota, recorded as its requests' are (hold records): the
/// new instance is sent them again, counts them, and comes down to 0
/// when they are given back. Before, it was sent nothing and the returns
/// of those slots hid as many later ones there (the fault suite's
/// `root-restarts`: 0 of 6).
#[test]
fn a_restarted_root_is_sent_a_keys_slots_again() {
    let quotas = vec![Quota::new(6, "per_upload", 10.0, 10.0, 10.0)
        .keyed()
        .in_flight_if(true)];
    let item = CheckItem {
        name: b"per_upload",
        key: Some(b"tenant-a"),
        weight: 1,
        max_wait: None,
    };
    let mut roots = vec![SimRoot::new(&quotas, 1, 0, 0)];
    let t = Table::new_heap_with_keys(8, 16, 1024);
    t.books().apply_quotas(&quotas);
    let mut e = SyncEngine::new(&["http://root0".to_string()], "a".into(), SEC, 100, 0);
    let owner = 4242;
    let mut held = Vec::new();
    let take = |t: &Table, n: usize, now: Nanos, held: &mut Vec<_>| {
        for _ in 0..n {
            let (r, slot_held) = t.gate().acquire(&item, now, false, || 0.5);
            assert_eq!(r.outcome, Outcome::Pass);
            let slot_held = slot_held.unwrap();
            let record = t.gate().record_slot(&item, slot_held, owner);
            assert_ne!(record, 0);
            held.push((slot_held, record));
        }
    };
    take(&t, 4, SEC, &mut held);
    for s in 1..4 {
        cycle(&mut e, &t, &mut roots, &[], s * SEC, |_| {});
    }
    let key = CounterKey {
        id: 6,
        key: t.key_secret().hash(b"tenant-a"),
    };
    assert_eq!(roots[0].counter_level(key, 4 * SEC), Some(4.0));
    roots[0].restart(2, 4 * SEC);
    take(&t, 1, 4 * SEC, &mut held);
    for s in 4..8 {
        cycle(&mut e, &t, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(
        roots[0].counter_level(key, 8 * SEC),
        Some(5.0),
        "the new instance holds the 4 slots from before and the one after"
    );
    for (slot_held, record) in held.drain(..) {
        assert!(t
            .gate()
            .release_recorded(&item, slot_held, record, owner, 8 * SEC));
    }
    for s in 8..11 {
        cycle(&mut e, &t, &mut roots, &[], s * SEC, |_| {});
    }
    assert_eq!(roots[0].counter_level(key, 11 * SEC).unwrap_or(0.0), 0.0);
}

/// One exchange of host `(e, t)` with `r` at `now`, meeting `fate`.
fn meet((e, t): (&mut SyncEngine, &Table), r: &mut SimRoot, fate: Fate, now: Nanos) {
    exchange(e, t, r, fate, now, &mut Vec::new());
}

/// A host silent to a root past its lease (its requests lost) finds
/// the root dropped its slots: to a root that takes keys' held slots, it
/// reports every key it holds with the request after the one that got
/// through, and the root counts them again; given back, they leave
/// nothing counted there. Before, the root counted none of them until
/// they ended (fail-open).
#[test]
fn a_host_back_after_the_lease_reports_its_keys_slots_again() {
    let mut root = SimRoot::new(&per_upload(), 1, 0, 0);
    let host = |name: &str| {
        let t = Table::new_heap_with_keys(8, 16, 1024);
        t.books().apply_quotas(&per_upload());
        (t, keyed_engine(name, if name == "a" { 1 } else { 2 }))
    };
    let ((ta, mut ea), (tb, mut eb)) = (host("a"), host("b"));
    let item = key_slot(0);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(ta.gate().acquire(&item, SEC, false, || 0.5).1.unwrap());
    }
    let key = CounterKey {
        id: 6,
        key: ta.key_secret().hash(KEYS[0]),
    };
    let mut now = SEC;
    for _ in 0..2 {
        meet((&mut ea, &ta), &mut root, Fate::Answered, now);
        meet((&mut eb, &tb), &mut root, Fate::Answered, now);
        now += SEC;
    }
    assert_eq!(root.counter_level(key, now), Some(3.0));
    // 12 s of lost requests from "a"; "b" syncs on, and the root's lease
    // drops what "a" held.
    for _ in 0..12 {
        meet((&mut ea, &ta), &mut root, Fate::RequestLost, now);
        meet((&mut eb, &tb), &mut root, Fate::Answered, now);
        now += SEC;
    }
    assert_eq!(root.counter_level(key, now).unwrap_or(0.0), 0.0);
    for _ in 0..2 {
        meet((&mut ea, &ta), &mut root, Fate::Answered, now);
        now += SEC;
    }
    assert_eq!(root.counter_level(key, now), Some(3.0), "a's slots again");
    for slot in held.drain(..) {
        assert!(ta.gate().release(&item, slot, now));
    }
    for _ in 0..2 {
        meet((&mut ea, &ta), &mut root, Fate::Answered, now);
        now += SEC;
    }
    assert_eq!(root.counter_level(key, now).unwrap_or(0.0), 0.0);
}

/// What becomes of one host's sync in [`held_steps`].
#[derive(Clone, Copy, Debug)]
enum Trouble {
    /// The exchange meets this fate.
    Exchange(Fate),
    /// The root applies the request, and the sync thread dies before it
    /// reads the reply: another starts on the same region.
    ThreadDies,
}

/// One step of [`held_steps`]: host `host` takes (`slots` > 0) or gives
/// back slots (of key `key`, where the quota is per key), then syncs,
/// meeting `fate`; or the root restarts.
#[derive(Clone, Copy, Debug)]
struct HeldStep {
    host: usize,
    key: usize,
    slots: i64,
    fate: Trouble,
    root_restarts: bool,
}

/// The hosts of [`held_steps`].
const NAMES: [&str; 2] = ["a", "b"];

/// The keys of `per_upload` that [`held_steps`] take slots of.
const KEYS: [&[u8]; 2] = [b"tenant-a", b"tenant-b"];

/// Quota `per_upload` (id 6): 100 slots at once per key (more than
/// [`held_steps`] take: a root caps a counter's level at twice it, which
/// hosts deciding on views a sync old could pass).
fn per_upload() -> Vec<Quota> {
    vec![Quota::new(6, "per_upload", 100.0, 100.0, 100.0)
        .keyed()
        .in_flight_if(true)]
}

/// A sync engine of host `name`, its incarnation set.
fn keyed_engine(name: &str, incarnation: u64) -> SyncEngine {
    let mut e = SyncEngine::new(&["http://root0".to_string()], name.into(), SEC, 100, 0);
    e.set_incarnation(incarnation);
    e
}

/// The sync thread of host `name` on `t` dies (nothing of it runs again)
/// and a new one takes over from its handover record; the new engine.
fn die_and_take_over(name: &str, t: &Table, incarnation: u64) -> SyncEngine {
    let dead = {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    };
    t.books().pretend_handover_of(dead);
    assert_eq!(t.books().claim_sync(), Some(dead));
    let mut next = keyed_engine(name, incarnation);
    next.resume(t);
    next.take_over(t, dead);
    next
}

fn key_slot(key: usize) -> CheckItem<'static> {
    CheckItem {
        name: b"per_upload",
        key: Some(KEYS[key]),
        weight: 1,
        max_wait: None,
    }
}

fn held_steps() -> impl proptest::strategy::Strategy<Value = Vec<HeldStep>> {
    use proptest::prelude::*;
    let fate = prop_oneof![
        3 => Just(Trouble::Exchange(Fate::Answered)),
        1 => Just(Trouble::Exchange(Fate::RequestLost)),
        2 => Just(Trouble::Exchange(Fate::ReplyLost)),
        1 => Just(Trouble::Exchange(Fate::Twice)),
        1 => Just(Trouble::ThreadDies),
    ];
    let step = (
        (0..2usize, 0..KEYS.len()),
        -3i64..4,
        fate,
        proptest::bool::weighted(0.08),
    );
    proptest::collection::vec(step, 1..40).prop_map(|steps| {
        steps
            .into_iter()
            .map(|((host, key), slots, fate, root_restarts)| HeldStep {
                host,
                key,
                slots,
                fate,
                root_restarts,
            })
            .collect()
    })
}

/// One answered sync of each host of [`NAMES`] (`hosts`) with `root` at
/// `now`.
fn answer_all(hosts: &mut [(Table, SyncEngine); 2], root: &mut SimRoot, now: Nanos) {
    for (name, (t, e)) in NAMES.into_iter().zip(hosts.iter_mut()) {
        sync_meeting((name, e, t), root, Trouble::Exchange(Fate::Answered), now);
    }
}

/// One sync of host `name`'s `e` on `t` with root `r` at `now`, meeting
/// `trouble`; a thread that dies is replaced by a new one on the same
/// region.
fn sync_meeting(
    (name, e, t): (&str, &mut SyncEngine, &Table),
    r: &mut SimRoot,
    trouble: Trouble,
    now: Nanos,
) {
    let Trouble::Exchange(fate) = trouble else {
        for o in e.begin_cycle(t, now) {
            r.sync(&o.request, now);
        }
        e.abandon(t);
        *e = SyncEngine::new(&["http://root0".to_string()], name.into(), SEC, 100, now);
        e.resume(t);
        return;
    };
    exchange(e, t, r, fate, now, &mut Vec::new());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Held slots reach the root in absolute form: on any interleaving of
    /// slots taken and given back with requests lost, replies lost,
    /// requests applied twice, sync threads dying between the root
    /// applying a request and the reply, and root restarts, one answered
    /// sync of each host later the root counts exactly the slots held,
    /// and 0 once every slot is given back.
    #[test]
    fn the_root_counts_exactly_the_slots_held_one_sync_after_any_trouble(
        steps in held_steps()
    ) {
        let mut root = SimRoot::new(&uploads(), 1, 0, 0);
        let mut hosts = NAMES.map(in_flight_host);
        let mut held: [Vec<crate::table::HeldSlot>; 2] = [Vec::new(), Vec::new()];
        let mut now = SEC;
        let mut instance = 1;
        // Each host learns that the root takes numbered requests and held
        // slots (its first request, knowing nothing of the root, is not
        // numbered: one that predates them would refuse it).
        answer_all(&mut hosts, &mut root, now);
        for s in &steps {
            if s.root_restarts {
                instance += 1;
                root.restart(instance, now);
            }
            let (t, e) = &mut hosts[s.host];
            if s.slots > 0 {
                for _ in 0..s.slots {
                    let (r, taken) = t.gate().acquire(&slot(), now, false, || 0.5);
                    if r.outcome == Outcome::Pass {
                        held[s.host].push(taken.unwrap());
                    }
                }
            }
            for _ in 0..(-s.slots) {
                if let Some(taken) = held[s.host].pop() {
                    proptest::prop_assert!(t.gate().release(&slot(), taken, now));
                }
            }
            sync_meeting((NAMES[s.host], e, t), &mut root, s.fate, now);
            now += SEC / 4;
        }
        answer_all(&mut hosts, &mut root, now);
        let want = (held[0].len() + held[1].len()) as f64;
        proptest::prop_assert_eq!(root.level(5, now).unwrap_or(0.0), want);
        for (h, (t, _)) in hosts.iter().enumerate() {
            for taken in held[h].drain(..) {
                proptest::prop_assert!(t.gate().release(&slot(), taken, now));
            }
        }
        now += SEC;
        answer_all(&mut hosts, &mut root, now);
        proptest::prop_assert_eq!(root.level(5, now).unwrap_or(0.0), 0.0);
    }

    /// The same for the keys of a per-key in-flight quota, whose slots
    /// take no hold record here (as a slot that finds none along its
    /// probe, or a request of a program that names no process): two
    /// answered syncs of each host after any of that trouble (a restart
    /// is found in the first, the resend goes with the second), the root
    /// counts exactly the slots held of each key, and 0 once they are
    /// given back. A restarted root is sent each key's held slots again;
    /// counted from the hold records, as before, they were 0 here.
    #[test]
    fn the_root_counts_exactly_each_keys_slots_one_sync_after_any_trouble(
        steps in held_steps()
    ) {
        let mut root = SimRoot::new(&per_upload(), 1, 0, 0);
        let mut incarnation = 1;
        let mut hosts = NAMES.map(|name| {
            let t = Table::new_heap_handing_over(8, 16, 1024, 64 << 10);
            t.books().apply_quotas(&per_upload());
            t.books().claim_sync();
            incarnation += 1;
            (t, keyed_engine(name, incarnation))
        });
        let mut held: [[Vec<crate::table::HeldSlot>; 2]; 2] = Default::default();
        let mut now = SEC;
        let mut instance = 1;
        answer_all(&mut hosts, &mut root, now);
        for s in &steps {
            if s.root_restarts {
                instance += 1;
                root.restart(instance, now);
            }
            let (t, e) = &mut hosts[s.host];
            let item = key_slot(s.key);
            for _ in 0..s.slots.max(0) {
                let (r, taken) = t.gate().acquire(&item, now, false, || 0.5);
                if r.outcome == Outcome::Pass {
                    held[s.host][s.key].push(taken.unwrap());
                }
            }
            for _ in 0..(-s.slots) {
                if let Some(taken) = held[s.host][s.key].pop() {
                    proptest::prop_assert!(t.gate().release(&item, taken, now));
                }
            }
            match s.fate {
                Trouble::Exchange(fate) => exchange(e, t, &mut root, fate, now, &mut Vec::new()),
                Trouble::ThreadDies => {
                    // The root applies the request; the thread dies before
                    // the reply, and the next one takes over from its
                    // handover record (keys' slots go as adds, which only
                    // the record keeps from counting twice).
                    for o in e.begin_cycle(t, now) {
                        root.sync(&o.request, now);
                    }
                    incarnation += 1;
                    *e = die_and_take_over(NAMES[s.host], t, incarnation);
                }
            }
            now += SEC / 4;
        }
        // Two rounds: a host finds the restart in the first reply of the
        // new instance, and its resend goes with the next request.
        for _ in 0..2 {
            answer_all(&mut hosts, &mut root, now);
        }
        let counter = |t: &Table, key: usize| CounterKey {
            id: 6,
            key: t.key_secret().hash(KEYS[key]),
        };
        for (key, (a, b)) in held[0].iter().zip(&held[1]).enumerate() {
            let want = (a.len() + b.len()) as f64;
            let got = root.counter_level(counter(&hosts[0].0, key), now).unwrap_or(0.0);
            proptest::prop_assert_eq!(got, want, "key {}", key);
        }
        for (h, (t, _)) in hosts.iter().enumerate() {
            for (key, slots) in held[h].iter_mut().enumerate() {
                for taken in slots.drain(..) {
                    proptest::prop_assert!(t.gate().release(&key_slot(key), taken, now));
                }
            }
        }
        now += SEC;
        answer_all(&mut hosts, &mut root, now);
        for key in 0..KEYS.len() {
            let got = root.counter_level(counter(&hosts[0].0, key), now).unwrap_or(0.0);
            proptest::prop_assert_eq!(got, 0.0, "key {}", key);
        }
    }
}

#[test]
fn a_sync_thread_started_anew_finds_a_restart_of_a_root_past_the_16th() {
    // 20 roots (one group): the region remembers every one of them.
    let urls: Vec<String> = (0..20).map(|i| format!("http://root{i}")).collect();
    let mut roots: Vec<SimRoot> = (0..20)
        .map(|i| SimRoot::new(&uploads(), 1 + i, 0, 0))
        .collect();
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&uploads());
    let mut e = SyncEngine::new(&urls, "a".into(), SEC, 100, 0);
    let _held = take(&t, 3, 0);
    cycle(&mut e, &t, &mut roots, &[], SEC, |_| {});
    // An nginx reload while the 20th root restarts: the new sync thread
    // finds it restarted (a new source for its values, and the grace),
    // where it once knew only the first 16 roots.
    e.abandon(&t);
    e = SyncEngine::new(&urls, "a".into(), SEC, 100, 2 * SEC);
    e.resume(&t);
    roots[19].restart(100, 2 * SEC);
    for s in 2..4 {
        cycle(&mut e, &t, &mut roots, &[], s * SEC, |_| {});
    }
    let m = e.metrics();
    assert_eq!(m.roots[19].restarts, 1);
    assert_eq!(m.roots[15].restarts + m.roots[16].restarts, 0);
    assert_eq!(roots[19].level(5, 3 * SEC), Some(3.0));
}
