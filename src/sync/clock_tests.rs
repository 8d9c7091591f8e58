//! The engine under a stepped monotonic clock (issue 34, case 7): a step
//! forward is no outage, and a step back moves the roots' values by the
//! new offset at the next reply.

use super::*;
use crate::core::Quota;
use crate::table::Outcome;
use crate::wire::{CounterValue, QuotaCursor};

const SEC: Nanos = 1_000_000_000;

/// Quota `q` (id 1), leaking at 10/s.
fn table() -> Table {
    let t = Table::new_heap(8, 16);
    t.books()
        .apply_quotas(&[Quota::new(1, "q", 10.0, 100.0, 100.0)]);
    t
}

/// A page answering at local time `local`, the root's clock reading
/// `root_time`, reporting `level` of `q`.
fn page(local: Nanos, root_time: Nanos, level: f64) -> Page {
    Page {
        sent_at: local,
        received_at: local,
        reply: SyncResponse {
            root_instance: 7,
            root_time,
            quotas_after: QuotaCursor { epoch: 1, id: 1 },
            counters: vec![CounterValue {
                id: 1,
                level,
                at: root_time,
                prev: 0.0,
            }],
            counter_version: 1,
            ..Default::default()
        },
    }
}

/// One cycle at local time `local`, the root answering at its time
/// `root_time`; returns the weight the request carried and the log.
fn cycle(
    e: &mut SyncEngine,
    t: &Table,
    local: Nanos,
    root_time: Nanos,
    level: f64,
) -> (u64, Vec<LogLine>) {
    let mut sent = 0;
    let mut log = Vec::new();
    for o in e.begin_cycle(t, local) {
        sent += o.request.deltas.iter().map(|d| d.delta).sum::<u64>();
        let pages = [page(local, root_time, level)];
        log.extend(e.finish(t, o.root, o.owed, &pages, None, local));
    }
    log.extend(e.end_cycle(t, local));
    (sent, log)
}

fn admit(t: &Table, weight: u64, now: Nanos) {
    assert_eq!(t.gate().check(b"q", weight, now), Outcome::Pass);
}

/// The clock jumps 30 s forward between two cycles (a frozen VM, a
/// stepped clock): the cycle that ends at once has asked no root since,
/// so it is no outage (before, it folded this host's weight into its own
/// levels, counted locally and said every root was unreachable). The
/// weight admitted before the jump goes with the next request.
#[test]
fn a_step_forward_is_no_outage() {
    let t = table();
    let mut e = SyncEngine::new(&["http://a".to_string()], "h".into(), SEC, 100, 0);
    cycle(&mut e, &t, SEC, 100 * SEC, 0.0);
    admit(&t, 5, SEC + SEC / 2);
    // The loop's timer fires at once after the jump; the cycle ends, the
    // next begins.
    let jumped = 31 * SEC + SEC / 2;
    let mut log = e.end_cycle(&t, jumped);
    let (sent, more) = cycle(&mut e, &t, jumped, 101 * SEC + SEC / 2, 5.0);
    log.extend(more);
    assert!(log.is_empty(), "{log:?}");
    assert_eq!(sent, 5);
    // The roots still are down when asked in vain for two intervals.
    let mut log = Vec::new();
    for s in 33..37 {
        for o in e.begin_cycle(&t, s * SEC) {
            log.extend(e.finish(&t, o.root, o.owed, &[], Some("down".into()), s * SEC));
        }
        log.extend(e.end_cycle(&t, s * SEC));
    }
    assert!(
        log.iter()
            .any(|(_, l)| l.contains("unreachable; limiting with local counts")),
        "{log:?}"
    );
}

/// The clock steps 30 s back: the root's next value is placed by the new
/// offset at once, so the level leaks as it does at the root (with the
/// offset before the step, its time would be 30 s ahead of this host's
/// and the level would not leak until the clock caught up).
#[test]
fn a_step_back_places_the_next_value_by_the_new_offset() {
    let t = table();
    let mut e = SyncEngine::new(&["http://a".to_string()], "h".into(), SEC, 100, 0);
    // The root's clock is 99 s ahead of this host's.
    for s in 40..43 {
        cycle(&mut e, &t, s * SEC, (s + 99) * SEC, 0.0);
    }
    // Back 30 s: a second later this host reads 13 s, the root 142 s,
    // and the root says 50.
    cycle(&mut e, &t, 13 * SEC, 142 * SEC, 50.0);
    // 2 s later by both clocks, the level has leaked 20 of its 50.
    let level = t.quota(b"q", 15 * SEC).unwrap().level;
    assert!((level - 30.0).abs() < 1e-6, "{level}");
}
