//! The limiter's sync thread: local deltas out to every root, cluster
//! counters and quota changes back into the table.
//!
//! One thread per table owner (the C ABI's limiter, one nginx worker). It
//! touches the request path only through the table's atomics. Each cycle
//! (every interval, plus up to 10% random jitter so hosts do not sync in
//! lockstep):
//!
//! 1. collect the changed local deltas (`pending → inflight`, atomically);
//! 2. send every root that is neither backing off nor still busy with an
//!    earlier exchange what it is owed, all at once, each request with a
//!    timeout below the interval;
//! 3. apply each reply as it arrives: quotas by epoch, counters by max (in
//!    local time, through the root's clock offset); the first reply that
//!    includes a delta takes it off `inflight`;
//! 4. roots that failed keep what they are owed (bounded, leaking at the
//!    quota's limit) and are retried with capped backoff, or every cycle
//!    while no root is up. The next cycle starts on time whatever is still
//!    under way: a slow root delays nobody.
//!
//! With no roots configured, or when every root has been unreachable for
//! two intervals, the thread folds local weight into the levels itself:
//! limiting goes on with local counts only, per host, and the log says so
//! once a minute.

pub mod config;
pub mod engine;
pub mod ids;
pub mod link;
pub mod status;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::core::Nanos;
use crate::table::Table;
pub use config::{default_limiter_id, EarlySync, LogSink, SyncConfig};
pub use link::RootMetrics;

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

/// Watches the key section for pressure: keys evicted while they still
/// held weight, and keys refused an entry. Says so at most once per call
/// (the callers call once per interval), never per request.
#[derive(Debug, Default)]
pub struct KeyPressure {
    last: crate::table::KeyStats,
}

impl KeyPressure {
    /// A warning when keys were evicted or refused since the last call.
    pub fn check(&mut self, table: &Table) -> Option<(LogLevel, String)> {
        let now = table.key_stats();
        let evicted = now.evictions.saturating_sub(self.last.evictions);
        let refused = now.refused.saturating_sub(self.last.refused);
        self.last = now;
        (evicted > 0 || refused > 0).then(|| {
            (
                LogLevel::Warn,
                format!(
                    "key section under pressure: {evicted} key(s) evicted while holding weight \
                     and {refused} key(s) checked uncounted for lack of room since the last \
                     report ({} of {} entries in use); give keys more memory",
                    now.live, now.capacity
                ),
            )
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
        let requeued = table.claim_sync();
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
        table.fold_local(now);
        table.maintain_keys(key_sweep_budget(table, tick.as_nanos() as Nanos), now);
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

/// Key buckets the upkeep sweep ([`Table::maintain_keys`]) looks at each
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
        table.apply_quotas(&[Quota::new(1, "q", 1000.0, 10.0, 10.0)]);
        let config = SyncConfig {
            interval: Duration::from_millis(20),
            ..SyncConfig::default()
        };
        let handle = SyncHandle::start(Arc::clone(&table), config).unwrap();
        let now = crate::clock::now();
        for _ in 0..10 {
            assert_eq!(table.check(b"q", 1, now), crate::table::Outcome::Pass);
        }
        assert!(matches!(
            table.check(b"q", 1, now),
            crate::table::Outcome::Reject(_)
        ));
        // 1000/s drains the 10 units within ~10 ms once folded.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            table.check(b"q", 1, crate::clock::now()),
            crate::table::Outcome::Pass
        );
        let started = std::time::Instant::now();
        handle.stop();
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
