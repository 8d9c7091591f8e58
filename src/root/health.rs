//! Whether the root is ready and the database reachable, with rate-limited
//! logging of database trouble.
//!
//! A root is **ready** once it has loaded the quotas at least once; before
//! that it answers syncs and admin reads with 503 rather than serve a state
//! it does not have. Afterwards a database outage only makes it read-only:
//! syncs go on with the quotas it holds.
//!
//! Two things make a ready root read-only: the database cannot be reached
//! (**down**), or it can but takes no writes from this root (**read-only**:
//! a read-only file or server, or a database that is not the one loaded;
//! see `store/watch.rs`). Either is **degraded**: `/healthz` answers 503
//! with the reason while syncs are still served.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Least time between two "database still down" log lines.
pub const LOG_EVERY: Duration = Duration::from_secs(30);

/// Health as the endpoints and metrics show it.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthSnapshot {
    /// Quotas have been loaded at least once.
    pub ready: bool,
    /// The last database operation succeeded.
    pub db_up: bool,
    /// The database takes this root's writes.
    pub db_writable: bool,
    /// The last database error while down, or why it takes no writes.
    pub db_error: Option<String>,
    /// Seconds since the database went down, while down.
    pub down_for: Option<f64>,
    /// Seconds since the last successful reload.
    pub since_reload: Option<f64>,
    /// Database failures since start.
    pub db_failures: u64,
}

/// Log bookkeeping of an outage.
#[derive(Debug, Default)]
struct Outage {
    /// The last error.
    error: Option<String>,
    /// When the database went down.
    since: Option<Instant>,
    /// When the last line about it was logged.
    logged: Option<Instant>,
    /// Failures since that line.
    unlogged: u64,
}

impl HealthSnapshot {
    /// `starting` until the first load, `degraded` while writes are
    /// refused (database down or read-only), `ok` otherwise.
    pub fn status(&self) -> &'static str {
        match (self.ready, self.db_up && self.db_writable) {
            (false, _) => "starting",
            (true, false) => "degraded",
            (true, true) => "ok",
        }
    }

    /// Why the root is not `ok`, in words that name no file, host or
    /// database error (what anyone may read); `None` when it is.
    pub fn reason(&self) -> Option<&'static str> {
        if !self.ready {
            return Some(if self.db_up {
                "the quotas have not been loaded yet"
            } else {
                "the quotas have not been loaded yet: the database cannot be reached"
            });
        }
        match (self.db_up, self.db_writable) {
            (true, true) => None,
            (false, _) => {
                Some("the database cannot be reached: serving the quotas already loaded, read-only")
            }
            (true, false) => Some(
                "the database takes no writes (read-only, or not the database this root \
                 loaded): serving the quotas already loaded, read-only",
            ),
        }
    }

    /// The database as `/healthz` names its state: `up`, `down` or
    /// `read_only`.
    pub fn db_state(&self) -> &'static str {
        match (self.db_up, self.db_writable) {
            (false, _) => "down",
            (true, false) => "read_only",
            (true, true) => "up",
        }
    }
}

/// Readiness and database state of one root.
#[derive(Debug)]
pub struct Health {
    /// Quotas loaded at least once.
    ready: AtomicBool,
    /// The last database operation succeeded.
    db_up: AtomicBool,
    /// Why the database takes no writes, while it does not.
    read_only: Mutex<Option<String>>,
    /// Database failures since start.
    failures: AtomicU64,
    /// The current outage, for messages and log rate limiting.
    outage: Mutex<Outage>,
    /// When the quotas were last reloaded successfully.
    reloaded: Mutex<Option<Instant>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            ready: AtomicBool::new(false),
            // Unknown until the first attempt; starting "up" avoids a
            // spurious recovery line.
            db_up: AtomicBool::new(true),
            read_only: Mutex::new(None),
            failures: AtomicU64::new(0),
            outage: Mutex::new(Outage::default()),
            reloaded: Mutex::new(None),
        }
    }
}

impl Health {
    /// True once quotas have been loaded.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// True when the last database operation succeeded.
    pub fn db_up(&self) -> bool {
        self.db_up.load(Ordering::Acquire)
    }

    /// Records a successful reload (which also makes the root ready).
    pub fn reloaded(&self) {
        *lock(&self.reloaded) = Some(Instant::now());
        self.ready.store(true, Ordering::Release);
        self.db_ok();
    }

    /// Records a successful database operation; logs the recovery once.
    pub fn db_ok(&self) {
        if self.db_up.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut outage = lock(&self.outage);
        let down_for = outage.since.map_or(0.0, |s| s.elapsed().as_secs_f64());
        tracing::info!(down_for_secs = down_for, "database reachable again");
        *outage = Outage::default();
    }

    /// Records a failed database operation. Logs at once when the database
    /// was up, then at most every [`LOG_EVERY`].
    pub fn db_failed(&self, error: &str) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let was_up = self.db_up.swap(false, Ordering::AcqRel);
        let mut outage = lock(&self.outage);
        let now = Instant::now();
        outage.error = Some(error.to_string());
        if was_up || outage.since.is_none() {
            outage.since = Some(now);
        }
        let due = outage
            .logged
            .is_none_or(|t| now.duration_since(t) >= LOG_EVERY);
        if was_up || due {
            let down_for = outage
                .since
                .map_or(0.0, |s| now.duration_since(s).as_secs_f64());
            let unlogged = outage.unlogged;
            if self.is_ready() {
                tracing::warn!(
                    error,
                    down_for_secs = down_for,
                    failures_since_last_log = unlogged,
                    "database unavailable; serving the quotas already loaded, admin writes refused"
                );
            } else {
                tracing::warn!(
                    error,
                    down_for_secs = down_for,
                    failures_since_last_log = unlogged,
                    "database unavailable; no quotas loaded yet, answering syncs with 503"
                );
            }
            outage.logged = Some(now);
            outage.unlogged = 0;
        } else {
            outage.unlogged += 1;
        }
    }

    /// Records that the database takes no writes, and why; logged when
    /// the reason changes.
    pub fn db_read_only(&self, reason: &str) {
        let mut read_only = lock(&self.read_only);
        if read_only.as_deref() != Some(reason) {
            tracing::error!(
                reason,
                "the database takes no writes; serving the quotas already loaded, read-only, \
                 admin writes refused"
            );
            *read_only = Some(reason.to_string());
        }
    }

    /// Records that the database takes writes; logs the recovery once.
    pub fn db_writable(&self) {
        if lock(&self.read_only).take().is_some() {
            tracing::info!("the database takes writes again");
        }
    }

    /// Why writes are refused: the database's error while it is down, or
    /// why it takes no writes.
    pub fn db_error(&self) -> Option<String> {
        if !self.db_up() {
            return lock(&self.outage).error.clone();
        }
        lock(&self.read_only).clone()
    }

    /// Everything at once, for `/healthz` and `/metrics`.
    pub fn snapshot(&self) -> HealthSnapshot {
        let db_up = self.db_up();
        let read_only = lock(&self.read_only).clone();
        let outage = lock(&self.outage);
        HealthSnapshot {
            ready: self.is_ready(),
            db_up,
            db_writable: read_only.is_none(),
            db_error: if db_up {
                read_only
            } else {
                outage.error.clone()
            },
            down_for: if db_up {
                None
            } else {
                outage.since.map(|s| s.elapsed().as_secs_f64())
            },
            since_reload: lock(&self.reloaded).map(|t| t.elapsed().as_secs_f64()),
            db_failures: self.failures.load(Ordering::Relaxed),
        }
    }
}

/// Locks a mutex, ignoring poisoning: the data is plain bookkeeping that
/// stays consistent even if a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_mark_the_database_down_until_a_success() {
        let health = Health::default();
        assert!(!health.is_ready());
        health.db_failed("connection refused");
        health.db_failed("connection refused");
        let snap = health.snapshot();
        assert!(!snap.db_up && !snap.ready);
        assert_eq!(snap.db_error.as_deref(), Some("connection refused"));
        assert_eq!(snap.db_failures, 2);
        health.reloaded();
        let snap = health.snapshot();
        assert!(snap.db_up && snap.ready && snap.db_error.is_none());
        assert!(snap.since_reload.is_some());
        assert_eq!(snap.status(), "ok");
    }

    #[test]
    fn the_public_reason_names_the_state_not_the_error() {
        let health = Health::default();
        health.db_failed("unable to open database file: /srv/secret/q.db");
        let reason = health.snapshot().reason().unwrap();
        assert!(reason.contains("not been loaded") && reason.contains("cannot be reached"));
        health.reloaded();
        assert_eq!(health.snapshot().reason(), None);
        health.db_read_only("the database file /srv/secret/q.db was deleted");
        let reason = health.snapshot().reason().unwrap();
        assert!(reason.contains("takes no writes") && !reason.contains("/srv"));
        health.db_failed("connection to 10.0.0.7:5432 refused");
        let reason = health.snapshot().reason().unwrap();
        assert!(reason.contains("cannot be reached") && !reason.contains("10.0.0.7"));
    }

    #[test]
    fn a_database_that_takes_no_writes_degrades_until_it_does() {
        let health = Health::default();
        health.reloaded();
        health.db_read_only("the database file q.db was deleted");
        let snap = health.snapshot();
        assert!(snap.db_up && !snap.db_writable);
        assert_eq!((snap.status(), snap.db_state()), ("degraded", "read_only"));
        assert_eq!(
            health.db_error().as_deref(),
            Some("the database file q.db was deleted")
        );
        // Down wins: its error is what a write would meet first.
        health.db_failed("connection refused");
        assert_eq!(health.snapshot().db_state(), "down");
        assert_eq!(health.db_error().as_deref(), Some("connection refused"));
        health.reloaded();
        health.db_writable();
        let snap = health.snapshot();
        assert_eq!((snap.status(), snap.db_state()), ("ok", "up"));
        assert!(snap.db_error.is_none() && health.db_error().is_none());
    }
}
