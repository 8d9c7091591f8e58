//! The sync thread and its owner's handle: starting it for a table
//! (taking the table's sync over from a thread that died, setting the
//! clock until a root says its own), choosing its loop (with roots, the
//! tokio loop of `networked.rs`; without, or in a build without the
//! feature `sync`, `standalone.rs`), and stopping it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::config::SyncConfig;
use super::log::LogLevel;
use super::metrics::SyncMetrics;
use super::shared::Shared;
use super::standalone::run_standalone;
use crate::table::Table;

/// The running sync thread; stops it when dropped.
pub struct SyncHandle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SyncHandle {
    /// Starts the sync thread for `table`.
    pub fn start(table: Arc<Table>, config: SyncConfig) -> std::io::Result<SyncHandle> {
        // A predecessor that died: the networked loop takes its sync over
        // (its handover record); the others hand its weight back whole.
        let predecessor = table.books().claim_sync();
        if table.utc_offset() == 0 {
            // Until a root says its time (or with none), this machine's.
            table.set_utc_offset(crate::clock::utc_offset() - config.clock_skew);
        }
        let shared = Arc::new(Shared::new());
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("sluice-sync".into())
            .spawn(move || run(table, config, thread_shared, predecessor))?;
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

/// The thread's body: the loop its configuration and build call for.
fn run(table: Arc<Table>, config: SyncConfig, shared: Arc<Shared>, predecessor: Option<u32>) {
    #[cfg(feature = "sync")]
    if !config.roots.is_empty() {
        super::networked::run(table, config, shared, predecessor);
        return;
    }
    if let Some(pid) = predecessor {
        let requeued = table.books().requeue_unacked_beyond(|_, _, _| 0);
        table.books().clear_handover_of(pid);
        if requeued > 0 {
            (config.log)(
                LogLevel::Info,
                &format!(
                    "the previous sync thread of this table (process {pid}) died with \
                     {requeued} units unacked; they are counted here"
                ),
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Quota;
    use std::time::Duration;

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
