//! When the sync thread wakes, and how much upkeep each wake does: the
//! local clock it reads, the wake just after each window boundary (spread
//! over a fleet's hosts), and the key sweep's share per run. The tokio
//! loop, the standalone loop, the engine and the simulator all time
//! themselves by these.

use crate::core::window::ATTRIBUTION_GRACE;
use crate::core::{Nanos, WindowRule};
use crate::table::Table;

/// Nanoseconds from `now` until the sync thread should wake for the next
/// boundary of a window some quota counts in: just after it, `spread`
/// into the window (so that a fleet's hosts do not all sync in the same
/// millisecond), where the weight collected still counts in the window
/// that ended ([`crate::core::window::ATTRIBUTION_GRACE`]). `None` when
/// no quota counts in windows.
pub fn window_wake(table: &Table, now: Nanos, spread: Nanos) -> Option<Nanos> {
    let utc_offset = table.utc_offset();
    let boundary = table
        .windows_used()
        .into_iter()
        .map(|window| {
            WindowRule {
                window,
                sliding: false,
                utc_offset,
            }
            .end_of(now)
        })
        .min()?;
    let delay = WINDOW_WAKE_DELAY + spread % (ATTRIBUTION_GRACE / 2);
    Some(boundary.saturating_sub(now) + delay)
}

/// How long after a window boundary the sync thread wakes at least: a
/// margin for timers that fire a little early.
const WINDOW_WAKE_DELAY: Nanos = 1_000_000;

/// This limiter's spread for [`window_wake`], from its id.
pub fn window_spread(limiter_id: &str) -> Nanos {
    limiter_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Key buckets the upkeep sweep ([`crate::table::Books::maintain_keys`]) looks at each
/// time it runs, every `every` nanoseconds: the whole key section about
/// once an hour.
pub fn key_sweep_budget(table: &Table, every: Nanos) -> usize {
    let runs_per_hour = (3_600_000_000_000 / every.max(1)).max(1);
    let buckets = u64::from(table.geometry().key_buckets);
    buckets.div_ceil(runs_per_hour) as usize
}

/// The local clock as the sync thread and the checks see it.
pub fn local_now(skew: i64) -> Nanos {
    crate::clock::now().saturating_add_signed(skew)
}
