//! The limiter's sync thread: local deltas out to every root, cluster
//! counters and quota changes back into the table.
//!
//! One thread per table owner (the C ABI's limiter, one nginx worker). It
//! touches the request path only through the table's atomics. Each cycle
//! (every interval, plus up to 10% random jitter so hosts do not sync in
//! lockstep):
//!
//! 1. collect the changed local deltas (`pending → unacked`, atomically);
//! 2. send every root that is neither backing off nor still busy with an
//!    earlier exchange what it is owed, all at once, each request with a
//!    timeout below the interval;
//! 3. apply each reply as it arrives: quotas by epoch, counters by max (in
//!    local time, through the root's clock offset); the first reply that
//!    includes a delta takes it off `unacked`;
//! 4. roots that failed keep what they are owed (bounded, leaking at the
//!    quota's limit) and are retried with capped backoff, or every cycle
//!    while no root is up. The next cycle starts on time whatever is still
//!    under way: a slow root delays nobody.
//!
//! With no roots configured, or when every root has been unreachable for
//! two intervals, the thread folds local weight into the levels itself:
//! limiting goes on with local counts only, per host, and the log says so
//! once a minute.
//!
//! # Root groups (shards)
//!
//! One group of masterless roots adds every host's deltas for every
//! counter; past what one group can add, the counter space is split into
//! shards, each served by its own group (`sluice_root <url> group=<n>`,
//! [`SyncConfig::root_groups`]). The design:
//!
//! - **Shard of a counter**: [`shard`], a stable hash of the quota id
//!   (named counters) or of the quota id and key hash (keys of per-key
//!   quotas, so one template's keys spread over every group), modulo the
//!   number of groups. Every host of a fleet configured with the same
//!   number of groups routes a counter to the same group; the key hash is
//!   the fleet's keyed hash, the same on every host.
//! - **Quotas**: every root reads every quota from the same database, so
//!   every group knows every quota and its epochs are the database's. A
//!   limiter takes quota changes from one group only: the lowest group with
//!   a root up (group 0 while it answers). Roots of the other groups are
//!   asked with a cursor past every epoch ([`link::NO_QUOTAS`]) and send
//!   none; their links keep the furthest cursor any group gave, so the
//!   next group in line takes over from there if the first goes down.
//! - **Deltas and counters**: each cycle's deltas are owed only to the
//!   roots of their shard, and the first of those roots to answer
//!   acknowledges them; replies are merged as before (a root only ever
//!   reports counters of its shard). "Unchanged" (a counter a complete
//!   reply leaves out) is vouched per group: only a reply of the counter's
//!   own group says so.
//! - **A group down**: when no root of a group answered for two
//!   intervals, the in-flight weight of that group's shard is folded into
//!   the local levels each cycle (per host, fail-open, as with every root
//!   down) while the other shards stay fleet-wide; what the group is owed
//!   still leaks and is resent when it is back. Once it has been silent
//!   for the in-flight lease, that shard's in-flight counters count this
//!   host's own slots only, as with every root down. Every group down is
//!   the old all-roots-down case.
//! - **One group** (no `group=`, or all 0): every counter's shard is 0,
//!   and nothing differs from a limiter without groups.
//! - **Reshaping** (a group added: config change, then reload or restart):
//!   the new sync thread starts with the new number of groups, so most
//!   counters move to another shard. The old thread's unacknowledged
//!   weight is handed back to pending when it stops
//!   ([`engine::SyncEngine::abandon`]) and goes out with the first cycle of
//!   the new one, to the counter's new group; what the old thread still
//!   owed the old group is dropped with it (that group already has the
//!   weight from its first answer, or will get it from the others: it
//!   leaks away there). The new group knows nothing of a moved counter at
//!   first: each host's first cycle gives it that host's delta only, and
//!   the fleet-wide level builds up as every host sends its deltas (within
//!   an interval); meanwhile hosts keep the level they had (max-merge
//!   never lowers it) and it leaks at the limit. So counters converge
//!   within two intervals of the last host's reload.

#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod ids;
pub mod link;
pub mod status;
mod vouch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::core::Nanos;
use crate::table::Table;
pub use config::{default_limiter_id, EarlySync, LogSink, SyncConfig};
pub use link::RootMetrics;

/// The shard (root group) of `counter` when there are `groups` groups:
/// a stable hash of the quota id and key hash, modulo `groups` (always 0
/// for one group). Every host and the simulator route by it.
pub fn shard(counter: crate::wire::CounterKey, groups: usize) -> usize {
    if groups <= 1 {
        return 0;
    }
    // splitmix64's finalizer: consecutive ids spread evenly.
    let mut x = counter.id ^ counter.key.rotate_left(32);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x % groups as u64) as usize
}

/// Severity of a sync log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Routine state changes (a root came back).
    Info,
    /// Degraded service (a root or all roots down).
    Warn,
    /// Something is wrong with sluice itself or its config.
    Error,
}

/// Watches the key section for pressure: keys that found no entry because
/// every entry they could have had holds a live count. Says so at most
/// once per call (the callers call once per interval), never per request.
#[derive(Debug, Default)]
pub struct KeyPressure {
    last: crate::table::KeyStats,
}

impl KeyPressure {
    /// A warning when keys found no entry since the last call.
    pub fn check(&mut self, table: &Table) -> Option<(LogLevel, String)> {
        let now = table.key_stats();
        let overflows = now.overflows.saturating_sub(self.last.overflows);
        let busy = now.busy.saturating_sub(self.last.busy).min(overflows);
        self.last = now;
        (overflows > 0).then(|| {
            let decided = match table.key_overflow() {
                crate::table::KeyOverflow::Shared => {
                    "checked on their template's shared overflow counter"
                }
                crate::table::KeyOverflow::Reject => "rejected",
                crate::table::KeyOverflow::Pass => "passed uncounted",
            };
            // A check that could not have the key lock in time says
            // nothing about room: the lock's holder was descheduled.
            let full = overflows - busy;
            let mut parts = Vec::new();
            if full > 0 {
                parts.push(format!(
                    "key section full: {full} check(s) of keys that found no entry \
                     since the last report were {decided} ({} of {} entries hold keys, \
                     drained ones included); give keys more memory",
                    now.live, now.capacity
                ));
            }
            if busy > 0 {
                parts.push(format!(
                    "key lock busy: {busy} check(s) of new keys whose buckets were full \
                     could not have the key lock in time to move entries (its holder, \
                     the sync thread or a check making room, was descheduled: the machine \
                     is overloaded) and were {decided} ({} of {} entries hold keys)",
                    now.live, now.capacity
                ));
            }
            (LogLevel::Warn, parts.join("; "))
        })
    }
}

/// A snapshot of the sync thread's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SyncMetrics {
    /// Completed cycles.
    pub cycles: u64,
    /// True while no root has answered for two intervals (or there are
    /// roots and none ever answered): limiting is per host.
    pub all_roots_down: bool,
    /// Per-root metrics, in configuration order.
    pub roots: Vec<RootMetrics>,
    /// Root groups none of whose roots answered for two intervals: their
    /// shards are limited per host (empty with one group, where
    /// `all_roots_down` says it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups_down: Vec<u32>,
}

/// State shared between the sync thread and its owner.
struct Shared {
    /// Set to stop the thread.
    stop: AtomicBool,
    /// Wakes the standalone loop early (to stop).
    wake: wake::Wake,
    /// Wakes the networked loop early (to stop).
    #[cfg(feature = "sync")]
    async_wake: tokio::sync::Notify,
    /// Latest metrics, copied out at the end of each cycle.
    metrics: Mutex<SyncMetrics>,
}

/// The running sync thread; stops it when dropped.
pub struct SyncHandle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SyncHandle {
    /// Starts the sync thread for `table`.
    pub fn start(table: Arc<Table>, config: SyncConfig) -> std::io::Result<SyncHandle> {
        let requeued = table.books().claim_sync();
        if requeued > 0 {
            (config.log)(
                LogLevel::Info,
                &format!(
                    "the previous sync thread of this table died with {requeued} units in \
                     flight; they are sent again"
                ),
            );
        }
        if table.utc_offset() == 0 {
            // Until a root says its time (or with none), this machine's.
            table.set_utc_offset(crate::clock::utc_offset() - config.clock_skew);
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake: wake::Wake::new(),
            #[cfg(feature = "sync")]
            async_wake: tokio::sync::Notify::new(),
            metrics: Mutex::new(SyncMetrics::default()),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("sluice-sync".into())
            .spawn(move || run(table, config, thread_shared))?;
        Ok(SyncHandle {
            shared,
            thread: Some(thread),
        })
    }

    /// The latest metrics.
    pub fn metrics(&self) -> SyncMetrics {
        self.shared
            .metrics
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    /// Stops the thread and waits for it (at most one request timeout).
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify();
        #[cfg(feature = "sync")]
        self.shared.async_wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SyncHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn run(table: Arc<Table>, config: SyncConfig, shared: Arc<Shared>) {
    #[cfg(feature = "sync")]
    if !config.roots.is_empty() {
        networked::run(table, config, shared);
        return;
    }
    if !config.roots.is_empty() {
        (config.log)(
            LogLevel::Error,
            "roots are configured but this build has no sync support (feature `sync`); \
             limiting with local counts only",
        );
    }
    run_standalone(&table, &config, &shared);
}

/// No roots: this host is its own root. Folds every 100 ms at most, so the
/// leak is applied smoothly.
fn run_standalone(table: &Table, config: &SyncConfig, shared: &Shared) {
    let tick = config.interval.min(Duration::from_millis(100));
    table.books().set_counting_locally(true);
    let mut pressure = KeyPressure::default();
    let mut reported = std::time::Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        if reported.elapsed() >= config.interval {
            reported = std::time::Instant::now();
            if let Some((level, line)) = pressure.check(table) {
                (config.log)(level, &line);
            }
        }
        let now = local_now(config.clock_skew);
        // Fold just after each window boundary too, so weight lands in its
        // window.
        let wait = window_wake(table, now, 0).map_or(tick, |ns| tick.min(Duration::from_nanos(ns)));
        shared.wake.wait_timeout(wait);
        let now = local_now(config.clock_skew);
        table.books().fold_local(now);
        table
            .books()
            .maintain_keys(key_sweep_budget(table, tick.as_nanos() as Nanos), now);
        if let Ok(mut m) = shared.metrics.lock() {
            m.cycles += 1;
            status::publish(table, &m);
        }
    }
}

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
            crate::core::WindowRule {
                window,
                sliding: false,
                utc_offset,
            }
            .end_of(now)
        })
        .min()?;
    let delay = WINDOW_WAKE_DELAY + spread % (crate::core::window::ATTRIBUTION_GRACE / 2);
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

/// A wake-up flag for the standalone loop's blocking sleep.
mod wake {
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    /// Wakes a sleeper early; a notification before the wait is kept.
    #[derive(Default)]
    pub struct Wake {
        flag: Mutex<bool>,
        cond: Condvar,
    }

    impl Wake {
        pub fn new() -> Self {
            Self::default()
        }

        pub fn notify(&self) {
            if let Ok(mut f) = self.flag.lock() {
                *f = true;
                self.cond.notify_all();
            }
        }

        /// Sleeps up to `timeout`, or less if notified.
        pub fn wait_timeout(&self, timeout: Duration) {
            if let Ok(f) = self.flag.lock() {
                if let Ok((mut f, _)) = self.cond.wait_timeout_while(f, timeout, |f| !*f) {
                    *f = false;
                }
            }
        }
    }
}

#[cfg(feature = "sync")]
mod networked;
#[cfg(feature = "sync")]
pub use networked::ENCODING_ENV;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Quota;

    #[test]
    fn standalone_sync_leaks_admitted_weight_and_stops_promptly() {
        let table = Arc::new(Table::new_heap(8, 16));
        table
            .books()
            .apply_quotas(&[Quota::new(1, "q", 1000.0, 10.0, 10.0)]);
        let config = SyncConfig {
            interval: Duration::from_millis(20),
            ..SyncConfig::default()
        };
        let handle = SyncHandle::start(Arc::clone(&table), config).unwrap();
        let now = crate::clock::now();
        for _ in 0..10 {
            assert_eq!(
                table.gate().check(b"q", 1, now),
                crate::table::Outcome::Pass
            );
        }
        assert!(matches!(
            table.gate().check(b"q", 1, now),
            crate::table::Outcome::Reject(_)
        ));
        // 1000/s drains the 10 units within ~10 ms once folded.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            table.gate().check(b"q", 1, crate::clock::now()),
            crate::table::Outcome::Pass
        );
        let started = std::time::Instant::now();
        handle.stop();
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
