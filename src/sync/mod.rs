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

pub mod engine;
pub mod ids;
pub mod link;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::core::Nanos;
use crate::table::Table;
pub use engine::EarlySync;
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

/// Where the sync thread's log lines go (stderr, nginx's error log...).
pub type LogSink = Arc<dyn Fn(LogLevel, &str) + Send + Sync>;

/// How the sync thread runs.
#[derive(Clone)]
pub struct SyncConfig {
    /// Root base URLs (`http://host:port` or `https://...`); empty for
    /// standalone.
    pub roots: Vec<String>,
    /// Time between syncs (jitter adds up to 10%).
    pub interval: Duration,
    /// Time one request may take; defaults to 80% of the interval.
    pub timeout: Option<Duration>,
    /// Bearer token for `/v1/sync`, if the roots require one.
    pub token: Option<String>,
    /// This limiter's id (host name, by default).
    pub limiter_id: String,
    /// Most distinct counters owed to one unreachable root before new ones
    /// are dropped (with a metric).
    pub max_owed: usize,
    /// Added to the local clock (tests: a host whose clock is off).
    pub clock_skew: i64,
    /// Sync before the interval is up when a quota's unsent local weight
    /// passes a share of its burst band (off by default: it costs extra
    /// syncs at the roots and probes of the table; see [`EarlySync`]).
    pub early_sync: Option<EarlySync>,
    /// Log destination.
    pub log: LogSink,
}

impl std::fmt::Debug for SyncConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncConfig")
            .field("roots", &self.roots)
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("limiter_id", &self.limiter_id)
            .field("early_sync", &self.early_sync)
            .finish_non_exhaustive()
    }
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            roots: Vec::new(),
            interval: Duration::from_secs(1),
            timeout: None,
            token: None,
            limiter_id: default_limiter_id(),
            max_owed: 1_000_000,
            clock_skew: 0,
            early_sync: None,
            log: Arc::new(|level, msg| eprintln!("sluice sync [{level:?}]: {msg}")),
        }
    }
}

/// This host's name, or "limiter" if it has none.
pub fn default_limiter_id() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_string(),
        _ => "limiter".to_string(),
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
    while !shared.stop.load(Ordering::Acquire) {
        shared.wake.wait_timeout(tick);
        table.fold_local(local_now(config.clock_skew));
        if let Ok(mut m) = shared.metrics.lock() {
            m.cycles += 1;
            table.publish_sync_status(&m);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Quota;

    #[test]
    fn standalone_sync_leaks_admitted_weight_and_stops_promptly() {
        let table = Arc::new(Table::new_heap(8, 16));
        table.apply_quotas(&[Quota {
            id: 1,
            name: "q".into(),
            parent: None,
            limit: 1000.0,
            low_burst: 10.0,
            high_burst: 10.0,
            epoch: 1,
            deleted: false,
        }]);
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
