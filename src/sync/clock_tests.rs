//! The engine under a stepped monotonic clock (issue 34, case 7): a step
//! moves the roots' values by the new offset at the next reply.

use super::*;
use crate::core::Quota;
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
