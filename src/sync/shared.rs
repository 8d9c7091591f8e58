//! What the sync thread and its owner share: the stop flag, the wake-ups
//! that cut a loop's sleep short, and the latest metrics. The owner's
//! handle (`thread.rs`) writes the first two, both loops (`standalone.rs`,
//! `networked.rs`) read them and write the metrics.

use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::metrics::SyncMetrics;

/// State shared between the sync thread and its owner.
pub(super) struct Shared {
    /// Set to stop the thread.
    pub(super) stop: AtomicBool,
    /// Wakes the standalone loop early (to stop).
    pub(super) wake: Wake,
    /// Wakes the networked loop early (to stop).
    #[cfg(feature = "sync")]
    pub(super) async_wake: tokio::sync::Notify,
    /// Latest metrics, copied out at the end of each cycle.
    pub(super) metrics: Mutex<SyncMetrics>,
}

impl Shared {
    /// Nothing asked yet: running, no metrics.
    pub(super) fn new() -> Self {
        Self {
            stop: AtomicBool::new(false),
            wake: Wake::default(),
            #[cfg(feature = "sync")]
            async_wake: tokio::sync::Notify::new(),
            metrics: Mutex::new(SyncMetrics::default()),
        }
    }
}

/// A wake-up flag for the standalone loop's blocking sleep: wakes a
/// sleeper early; a notification before the wait is kept.
#[derive(Default)]
pub(super) struct Wake {
    flag: Mutex<bool>,
    cond: Condvar,
}

impl Wake {
    /// Wakes the sleeper, or the next one to wait.
    pub(super) fn notify(&self) {
        if let Ok(mut f) = self.flag.lock() {
            *f = true;
            self.cond.notify_all();
        }
    }

    /// Sleeps up to `timeout`, or less if notified.
    pub(super) fn wait_timeout(&self, timeout: Duration) {
        if let Ok(f) = self.flag.lock() {
            if let Ok((mut f, _)) = self.cond.wait_timeout_while(f, timeout, |f| !*f) {
                *f = false;
            }
        }
    }
}
