//! Exactly once, through the sync engine and real root ledgers: a reply
//! lost after the root applied its request, a request sent twice, an old
//! copy arriving late, a root restart, a new sync thread, and limiters or
//! roots that predate numbered requests. The root's count of a day window
//! (nothing leaks) must equal exactly what the host admitted.

use proptest::prelude::*;

use super::return_tests::cycle;
use super::*;
use crate::core::{Quota, Window};
use crate::sim::root::SimRoot;
use crate::table::{CheckItem, CheckOptions, Outcome};
use crate::wire::SyncRequest;

const SEC: Nanos = 1_000_000_000;

/// Quota `day` (id 1): a day window far from its limit, so a count is
/// exactly the weight admitted, whatever the roots' allowances.
fn quotas() -> Vec<Quota> {
    vec![Quota::new(1, "day", 1e9, 1e9, 1e9).windowed(Window::Day, false)]
}

fn host(name: &str, incarnation: u64) -> (Table, SyncEngine) {
    let t = Table::new_heap_handing_over(8, 16, 0, 64 << 10);
    t.books().apply_quotas(&quotas());
    // As a sync thread starts: this process owns the table's sync (and
    // leaves its handover records).
    t.books().claim_sync();
    (t, engine(name, incarnation))
}

fn engine(name: &str, incarnation: u64) -> SyncEngine {
    let mut e = SyncEngine::new(&["http://root0".to_string()], name.into(), SEC, 100, 0);
    e.set_incarnation(incarnation);
    e
}

/// The id of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// `e`'s thread dies (an nginx worker killed: nothing of it runs again)
/// and a new one on `t` takes its sync over, as `SyncHandle::start` and
/// the networked loop do; returns the new thread's engine.
fn die_and_take_over(e: SyncEngine, t: &Table, incarnation: u64) -> SyncEngine {
    drop(e);
    let dead = dead_pid();
    t.books().pretend_handover_of(dead);
    assert_eq!(t.books().claim_sync(), Some(dead));
    let mut next = engine("h", incarnation);
    next.resume(t);
    let log = next.take_over(t, dead);
    assert!(log[0].1.contains(&format!("process {dead}")), "{log:?}");
    next
}

fn root() -> SimRoot {
    SimRoot::new(&quotas(), 100, 0, 0)
}

/// Admits `weight` on `day` at `now` (it always passes).
fn admit(t: &Table, weight: u64, now: Nanos) {
    let item = CheckItem {
        name: b"day",
        key: None,
        weight,
        max_wait: None,
    };
    let r = t
        .gate()
        .check_many(&[item], now, CheckOptions::default(), || 0.5);
    assert_eq!(r.outcome, Outcome::Pass);
}

/// What becomes of one exchange.
#[derive(Clone, Copy, Debug)]
pub(super) enum Fate {
    /// The root answers.
    Answered,
    /// The request never reaches the root.
    RequestLost,
    /// The root applies it; its reply is lost.
    ReplyLost,
    /// The request reaches the root twice (a relay's retry), then the
    /// reply of the second comes back.
    Twice,
}

/// One cycle of `e` on `t` with its one root, the exchange meeting
/// `fate`; the request is kept in `sent` (for late copies).
pub(super) fn exchange(
    e: &mut SyncEngine,
    t: &Table,
    r: &mut SimRoot,
    fate: Fate,
    now: Nanos,
    sent: &mut Vec<SyncRequest>,
) {
    for o in e.begin_cycle(t, now) {
        sent.push(o.request.clone());
        let reply = match fate {
            Fate::RequestLost => None,
            Fate::ReplyLost => {
                r.sync(&o.request, now);
                None
            }
            Fate::Answered => Some(r.sync(&o.request, now)),
            Fate::Twice => {
                r.sync(&o.request, now);
                Some(r.sync(&o.request, now))
            }
        };
        match reply {
            Some(reply) => {
                let page = Page {
                    sent_at: now,
                    received_at: now,
                    reply,
                };
                e.finish(t, o.root, o.owed, &[page], None, now);
            }
            None => {
                e.finish(t, o.root, o.owed, &[], Some("lost".into()), now);
            }
        }
    }
    e.end_cycle(t, now);
}

/// Cycles with every exchange answered until the host has nothing
/// owed or unacknowledged left (at most `n`), from `now` on; returns the
/// time after the last.
fn settle(e: &mut SyncEngine, t: &Table, r: &mut SimRoot, mut now: Nanos, n: usize) -> Nanos {
    let mut sent = Vec::new();
    for _ in 0..n {
        exchange(e, t, r, Fate::Answered, now, &mut sent);
        now += SEC;
    }
    now
}

/// A host `h` (incarnation 1) that synced once, then admitted 4 and 5
/// units in two cycles whose replies were lost (the root applied both).
fn replies_lost_twice(r: &mut SimRoot) -> (Table, SyncEngine) {
    let (t, mut e) = host("h", 1);
    let mut sent = Vec::new();
    exchange(&mut e, &t, r, Fate::Answered, SEC, &mut sent);
    admit(&t, 4, 2 * SEC);
    exchange(&mut e, &t, r, Fate::ReplyLost, 2 * SEC, &mut sent);
    admit(&t, 5, 3 * SEC);
    exchange(&mut e, &t, r, Fate::ReplyLost, 3 * SEC, &mut sent);
    (t, e)
}

/// The scenario the issue measured: replies lost for `lost` seconds of
/// steady traffic, then answered again: the root counts what the host
/// admitted, once.
fn lost_replies_for(lost: u64) {
    let (t, mut e) = host("h", 7);
    let mut r = root();
    let mut sent = Vec::new();
    let mut admitted = 0;
    let mut now = SEC;
    // Warm up: the host learns that the root takes numbered requests.
    exchange(&mut e, &t, &mut r, Fate::Answered, now, &mut sent);
    for s in 0..lost + 3 {
        now += SEC;
        admit(&t, 20, now);
        admitted += 20;
        let fate = if s < lost {
            Fate::ReplyLost
        } else {
            Fate::Answered
        };
        exchange(&mut e, &t, &mut r, fate, now, &mut sent);
    }
    let now = settle(&mut e, &t, &mut r, now + SEC, 5);
    assert_eq!(
        r.level(1, now),
        Some(admitted as f64),
        "{lost} s of lost replies"
    );
    // The host's estimate is the root's count plus a little
    // extrapolation of the others' (measured) fill.
    let seen = t.quota(b"day", now).unwrap().level;
    assert!(
        (seen - admitted as f64).abs() < 0.5,
        "{seen} for {admitted}"
    );
}

#[test]
fn four_seconds_of_lost_replies_count_once() {
    lost_replies_for(4);
}

#[test]
fn thirty_seconds_of_lost_replies_count_once() {
    lost_replies_for(30);
}

#[test]
fn a_request_that_arrives_twice_counts_once_and_the_root_says_so() {
    let (t, mut e) = host("h", 7);
    let mut r = root();
    let mut sent = Vec::new();
    exchange(&mut e, &t, &mut r, Fate::Answered, SEC, &mut sent);
    admit(&t, 5, 2 * SEC);
    exchange(&mut e, &t, &mut r, Fate::Twice, 2 * SEC, &mut sent);
    assert_eq!(r.level(1, 2 * SEC), Some(5.0));
    // A copy that turns up late, after later requests, counts nothing.
    admit(&t, 3, 3 * SEC);
    exchange(&mut e, &t, &mut r, Fate::Answered, 3 * SEC, &mut sent);
    let late = sent.iter().find(|q| !q.deltas.is_empty()).unwrap().clone();
    r.sync(&late, 4 * SEC);
    assert_eq!(r.level(1, 4 * SEC), Some(8.0));
}

#[test]
fn requests_are_numbered_only_to_a_root_that_says_it_takes_them() {
    let (t, mut e) = host("h", 7);
    let mut r = root();
    let older = |reply: &mut SyncResponse| reply.takes_sequence = false;
    let out = cycle(&mut e, &t, std::slice::from_mut(&mut r), &[], SEC, older);
    assert!(out[0].request.sequence.is_none(), "the first knows nothing");
    admit(&t, 5, 2 * SEC);
    let out = cycle(
        &mut e,
        &t,
        std::slice::from_mut(&mut r),
        &[],
        2 * SEC,
        older,
    );
    assert!(out[0].request.sequence.is_none(), "an older root");
    // The root is upgraded: from its first reply that says so on, the
    // requests are numbered, each new one with the next number.
    cycle(
        &mut e,
        &t,
        std::slice::from_mut(&mut r),
        &[],
        3 * SEC,
        |_| {},
    );
    let mut numbers = Vec::new();
    for s in 4..7 {
        admit(&t, 1, s * SEC);
        let out = cycle(
            &mut e,
            &t,
            std::slice::from_mut(&mut r),
            &[],
            s * SEC,
            |_| {},
        );
        let seq = out[0].request.sequence.expect("numbered");
        assert_eq!(seq.incarnation, 7);
        numbers.push(seq.seq);
    }
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    assert_eq!(r.level(1, 7 * SEC), Some(8.0));
}

#[test]
fn an_unnumbered_request_of_an_older_limiter_is_applied_every_time() {
    // A limiter that predates numbered requests: the root cannot tell a
    // copy from new weight, and counts both, as before.
    let mut r = root();
    let mut request = crate::root::ledger::test_request("old", 0, 0, &[(1, 4)], &[]);
    request.sequence = None;
    r.sync(&request, SEC);
    r.sync(&request, SEC);
    assert_eq!(r.level(1, SEC), Some(8.0));
}

#[test]
fn a_new_sync_thread_is_a_new_stream_and_an_old_one_still_counts_once() {
    // An nginx reload: the old thread's last request and the new thread's
    // first have their own numbers; each counts once, however they mix.
    let mut r = root();
    let (t, mut old) = host("h", 1);
    let mut sent = Vec::new();
    exchange(&mut old, &t, &mut r, Fate::Answered, SEC, &mut sent);
    admit(&t, 4, 2 * SEC);
    exchange(&mut old, &t, &mut r, Fate::ReplyLost, 2 * SEC, &mut sent);
    let (t2, mut new) = host("h", 2);
    new.resume(&t2);
    exchange(&mut new, &t2, &mut r, Fate::Answered, 3 * SEC, &mut sent);
    admit(&t2, 6, 3 * SEC);
    exchange(&mut new, &t2, &mut r, Fate::Answered, 4 * SEC, &mut sent);
    // The old thread is still there and sends its request again.
    exchange(&mut old, &t, &mut r, Fate::Answered, 5 * SEC, &mut sent);
    assert_eq!(r.level(1, 5 * SEC), Some(10.0));
}

#[test]
fn a_thread_that_dies_after_the_root_applied_its_request_is_taken_over_and_counts_once() {
    // The one case left: the root applied the request, the
    // thread died before it read the reply (its worker killed), after
    // replies had been lost for a while. Before handover records the new
    // thread sent all of it again as new: 4 + 5 + 3 = 12 counted twice.
    let mut r = root();
    let (t, mut e) = replies_lost_twice(&mut r);
    admit(&t, 3, 4 * SEC);
    for o in e.begin_cycle(&t, 4 * SEC) {
        r.sync(&o.request, 4 * SEC);
    }
    assert_eq!(r.level(1, 4 * SEC), Some(12.0));
    let mut e = die_and_take_over(e, &t, 2);
    admit(&t, 6, 5 * SEC);
    let now = settle(&mut e, &t, &mut r, 5 * SEC, 3);
    assert_eq!(r.level(1, now), Some(18.0));
    let seen = t.quota(b"day", now).unwrap().level;
    assert!((seen - 18.0).abs() < 0.5, "{seen}");
}

#[test]
fn a_thread_that_dies_before_its_request_left_is_taken_over_and_counts_once() {
    // The record is left before the request goes: here it never reached
    // the root, which counts it once when the new thread sends it.
    let mut r = root();
    let (t, mut e) = host("h", 1);
    admit(&t, 7, SEC);
    let _unsent = e.begin_cycle(&t, SEC);
    let mut e = die_and_take_over(e, &t, 2);
    admit(&t, 1, 2 * SEC);
    let now = settle(&mut e, &t, &mut r, 2 * SEC, 3);
    assert_eq!(r.level(1, now), Some(8.0));
}

#[test]
fn a_thread_whose_record_is_gone_hands_its_weight_back_whole() {
    // No record (another process wrote the last one): the weight is sent
    // again as new, as before records; a root that did not apply it
    // counts it once.
    let mut r = root();
    let (t, mut e) = host("h", 1);
    admit(&t, 7, SEC);
    let _unsent = e.begin_cycle(&t, SEC);
    drop(e);
    let dead = dead_pid();
    t.books().pretend_handover_of(dead);
    t.books().clear_handover_of(dead);
    assert_eq!(t.books().claim_sync(), Some(dead));
    let mut e = engine("h", 2);
    let log = e.take_over(&t, dead);
    assert!(log[0].1.contains("left no record"), "{log:?}");
    let now = settle(&mut e, &t, &mut r, 2 * SEC, 3);
    assert_eq!(r.level(1, now), Some(7.0));
}

#[test]
fn a_reload_while_replies_are_lost_counts_once() {
    // An nginx reload during lost replies: the old thread stops with its
    // requests unconfirmed (they reached the root), the new one already
    // syncs. Before retired records the old thread handed their weight
    // back and the new one sent it as new: 9 counted twice.
    let mut r = root();
    let (t, mut old) = replies_lost_twice(&mut r);
    let mut sent = Vec::new();
    // The new thread starts (this process owns the sync now) and syncs
    // beside the old one for a cycle.
    t.books().claim_sync();
    let mut new = engine("h", 2);
    new.resume(&t);
    admit(&t, 2, 4 * SEC);
    exchange(&mut new, &t, &mut r, Fate::Answered, 4 * SEC, &mut sent);
    let log = old.stop(&t);
    assert!(
        log[0]
            .1
            .contains("2 request(s) unconfirmed and weight owed to 1 root(s): left"),
        "{log:?}"
    );
    admit(&t, 3, 5 * SEC);
    let now = settle(&mut new, &t, &mut r, 5 * SEC, 3);
    assert_eq!(r.level(1, now), Some(14.0));
    let seen = t.quota(b"day", now).unwrap().level;
    assert!((seen - 14.0).abs() < 0.5, "{seen}");
    assert_eq!(t.quota(b"day", now).unwrap().unacked, 0);
}

#[test]
fn requests_a_stopped_thread_never_got_to_the_root_count_once_through_the_next() {
    let mut r = root();
    let (t, mut old) = host("h", 1);
    let mut sent = Vec::new();
    admit(&t, 6, SEC);
    exchange(&mut old, &t, &mut r, Fate::RequestLost, SEC, &mut sent);
    t.books().claim_sync();
    let mut new = engine("h", 2);
    new.resume(&t);
    old.stop(&t);
    let now = settle(&mut new, &t, &mut r, 2 * SEC, 3);
    assert_eq!(r.level(1, now), Some(6.0));
}

#[test]
fn a_restarted_root_counts_a_request_its_earlier_instance_applied() {
    // The earlier instance applied it and then died with its counts: the
    // new one counts it once (it starts from nothing).
    let (t, mut e) = host("h", 7);
    let mut r = root();
    let mut sent = Vec::new();
    exchange(&mut e, &t, &mut r, Fate::Answered, SEC, &mut sent);
    admit(&t, 9, 2 * SEC);
    exchange(&mut e, &t, &mut r, Fate::ReplyLost, 2 * SEC, &mut sent);
    r.restart(200, 3 * SEC);
    let now = settle(&mut e, &t, &mut r, 3 * SEC, 3);
    assert_eq!(r.level(1, now), Some(9.0));
}

#[test]
fn more_failed_requests_than_a_request_carries_go_over_several_and_count_once() {
    // Eight entries a request, half of them for earlier requests: an
    // earlier request takes two, so after three lost replies a request
    // carries only two earlier ones (the second as its own weight), and
    // this cycle's weight waits its turn.
    let (t, mut e) = host("h", 7);
    e.limit_request_entries(8);
    let mut r = root();
    let mut sent = Vec::new();
    let mut now = SEC;
    exchange(&mut e, &t, &mut r, Fate::Answered, now, &mut sent);
    for _ in 0..5 {
        now += SEC;
        admit(&t, 3, now);
        exchange(&mut e, &t, &mut r, Fate::ReplyLost, now, &mut sent);
    }
    assert_eq!(e.metrics().roots[0].unconfirmed, 3);
    now += SEC;
    admit(&t, 3, now);
    let start = sent.len();
    for _ in 0..10 {
        exchange(&mut e, &t, &mut r, Fate::Answered, now, &mut sent);
        now += SEC;
    }
    // The first request after the losses carries the oldest earlier one
    // and, as its own weight, the next: nothing new.
    let first = &sent[start];
    assert_eq!(first.replay.len(), 1, "{first:?}");
    assert_eq!(first.sequence.map(|s| s.seq), Some(first.replay[0].seq + 1));
    assert!(sent[start..].iter().all(|q| q.entry_count() <= 8));
    assert_eq!(r.level(1, now), Some(18.0));
    assert_eq!(e.metrics().roots[0].unconfirmed, 0);
}

#[test]
fn seventy_lost_replies_in_a_row_count_once_with_the_oldest_carried_as_one() {
    let (t, mut e) = host("h", 7);
    let mut r = root();
    let mut sent = Vec::new();
    let mut now = SEC;
    exchange(&mut e, &t, &mut r, Fate::Answered, now, &mut sent);
    for _ in 0..70 {
        now += SEC;
        admit(&t, 2, now);
        exchange(&mut e, &t, &mut r, Fate::ReplyLost, now, &mut sent);
    }
    let m = &e.metrics().roots[0];
    assert_eq!(m.unconfirmed as usize, crate::sync::link::MOST_UNCONFIRMED);
    assert_eq!(
        m.unconfirmed_merged,
        70 - crate::sync::link::MOST_UNCONFIRMED as u64
    );
    let now = settle(&mut e, &t, &mut r, now + SEC, 3);
    // The root applied every one of them, the merged ones too: the part
    // carrying two goes under the later number, which it had applied.
    assert_eq!(r.level(1, now), Some(140.0));
    assert_eq!(e.metrics().roots[0].unconfirmed, 0);
}

#[test]
fn a_request_carrying_earlier_ones_out_of_order_is_refused_whole() {
    let mut request = crate::root::ledger::test_request("h", 0, 0, &[(1, 4)], &[]);
    request.sequence = Some(crate::wire::Sequence {
        incarnation: 9,
        seq: 5,
    });
    let part = |seq| crate::wire::Replay {
        seq,
        deltas: vec![crate::wire::CounterDelta {
            id: 1,
            delta: 1,
            window: None,
        }],
        ..Default::default()
    };
    request.replay = vec![part(3), part(2)];
    let err = request.check().unwrap_err();
    assert!(err.to_string().contains("replay[0].seq"), "{err}");
    request.replay = vec![part(2), part(5)];
    assert!(request
        .check()
        .unwrap_err()
        .to_string()
        .contains("replay[1].seq"));
    request.replay = vec![part(2), part(4)];
    request.check().unwrap();
    request.sequence = None;
    assert!(request.check().unwrap_err().to_string().contains("replay"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any mix of admissions and exchanges that are answered, lose their
    /// request, lose their reply or arrive twice, with old copies turning
    /// up late, sync threads dying mid-exchange (another taking over) and
    /// stopping for a reload (another starting beside them):
    /// once every exchange is answered again, the root's count is exactly
    /// what the host admitted.
    #[test]
    fn any_mix_of_losses_copies_and_late_copies_counts_once(
        steps in proptest::collection::vec((0u64..5, 0u8..4, any::<bool>(), 0u8..12), 1..40),
        small in any::<bool>(),
    ) {
        let (t, mut e) = host("h", 3);
        if small {
            // Earlier requests fill a request: they go over several.
            e.limit_request_entries(4);
        }
        let mut r = root();
        let mut sent = Vec::new();
        let mut admitted = 0u64;
        let mut now = SEC;
        exchange(&mut e, &t, &mut r, Fate::Answered, now, &mut sent);
        let mut incarnation = 3;
        for (weight, fate, late, death) in steps {
            now += SEC;
            if weight > 0 {
                admit(&t, weight, now);
                admitted += weight;
            }
            let fate = [Fate::Answered, Fate::RequestLost, Fate::ReplyLost, Fate::Twice]
                [fate as usize];
            if death == 1 {
                // An nginx reload: this exchange meets its fate, then a
                // new thread starts beside the old one, which stops.
                exchange(&mut e, &t, &mut r, fate, now, &mut sent);
                incarnation += 1;
                t.books().claim_sync();
                let mut next = engine("h", incarnation);
                next.resume(&t);
                if small {
                    next.limit_request_entries(4);
                }
                e.stop(&t);
                e = next;
                continue;
            }
            if death == 0 {
                // The thread dies after the root applied (or lost) its
                // request, before any reply; another takes over.
                for o in e.begin_cycle(&t, now) {
                    sent.push(o.request.clone());
                    if !matches!(fate, Fate::RequestLost) {
                        r.sync(&o.request, now);
                    }
                }
                incarnation += 1;
                e = die_and_take_over(e, &t, incarnation);
                if small {
                    e.limit_request_entries(4);
                }
                continue;
            }
            exchange(&mut e, &t, &mut r, fate, now, &mut sent);
            if late && !sent.is_empty() {
                let old = sent[(now / SEC) as usize % sent.len()].clone();
                r.sync(&old, now);
            }
        }
        let now = settle(&mut e, &t, &mut r, now + SEC, if small { 45 } else { 6 });
        prop_assert_eq!(r.level(1, now).unwrap_or(0.0), admitted as f64);
        let seen = t.quota(b"day", now).unwrap().level;
        prop_assert!((seen - admitted as f64).abs() < 0.5, "{} for {}", seen, admitted);
    }
}
