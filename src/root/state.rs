//! The state one root process shares between its handlers and its reload
//! task.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::core::Nanos;
use crate::wire::QuotaCursor;

use super::api::admission::Admission;
use super::config::RootConfig;
use super::connections::Connections;
use super::counter_book::KeyLimits;
use super::counter_shards::{default_shards, Counters};
use super::credentials::{Credentials, LogGate};
use super::health::Health;
use super::ledger::Ledger;
use super::limiters::Limiters;
use super::metrics::{Metrics, Scrape};
use super::store::{DbState, OverrideRow, Store, StoreError, LOAD_PAGE};

/// Window in which a limiter counts as active (metrics, overview).
pub const ACTIVE_WINDOW: Nanos = 300 * 1_000_000_000;

/// Most database connections one root opens.
const MAX_DB_CONNECTIONS: u32 = 8;

/// Everything a root's handlers and tasks share.
#[derive(Debug)]
pub struct RootState {
    /// The configuration it was started with.
    pub config: RootConfig,
    /// The quota database.
    pub store: Store,
    /// Quotas, counters and limiters, each part under its own locks (see
    /// [`Ledger`]). Held only for in-memory work, never across IO or an
    /// `.await`.
    ledger: Ledger,
    /// Readiness and database state.
    pub health: Health,
    /// Event counts for `/metrics`.
    pub metrics: Metrics,
    /// The open connections: admission, trust, timeouts.
    pub connections: Arc<Connections>,
    /// What requests hold: body memory, slots, syncs per limiter.
    pub admission: Arc<Admission>,
    /// Who may sync as which limiter.
    pub credentials: Credentials,
    /// Refused syncs are logged once a minute per limiter id.
    pub forbidden_log: LogGate,
    /// Clipped deltas are logged once a minute per limiter.
    pub clipped_log: LogGate,
    /// Random id of this process, sent in every sync reply so limiters
    /// notice a restart (and the counters that went with it).
    pub instance: u64,
    /// Position of the last row a reload read (valid or skipped); also
    /// serialises reloads.
    reload_cursor: tokio::sync::Mutex<QuotaCursor>,
    /// Position of the last override row a reload read (taken under
    /// `reload_cursor`).
    override_cursor: std::sync::Mutex<QuotaCursor>,
    /// The schema has been migrated by this process.
    migrated: AtomicBool,
    /// Serialises this root's writes. The database serialises writers
    /// anyway; queueing them here keeps SQLite's busy handler out of it.
    write_gate: tokio::sync::Mutex<()>,
}

impl RootState {
    /// State for `config` with its sync `credentials`; the database is
    /// connected lazily.
    pub fn new(config: RootConfig, credentials: Credentials) -> Result<Self, StoreError> {
        let store = Store::open(&config.db, config.db_timeout, MAX_DB_CONNECTIONS)?
            .with_query_timeout(config.db_query_timeout);
        let ledger = Ledger {
            // The root's clock is the fleet's UTC for window quotas (every
            // limiter places windows by its roots'): read once, so it moves
            // with the monotonic clock, not with steps of the system clock.
            utc_offset: crate::clock::utc_offset(),
            level_cap_seconds: config.level_cap_seconds,
            in_flight_lease: config.in_flight_lease.as_nanos() as crate::core::Nanos,
            limiters: Mutex::new(Limiters::new(config.max_limiters, config.limiter_expiry)),
            counters: Counters::with_interest(
                default_shards(),
                KeyLimits::new(config.max_keys, config.max_keys_per_limiter),
                config.interest,
            ),
            ..Ledger::default()
        };
        Ok(Self {
            connections: Connections::new(config.connection_limits()),
            admission: Arc::new(Admission::new(&config)),
            credentials,
            forbidden_log: LogGate::default(),
            clipped_log: LogGate::default(),
            config,
            store,
            ledger,
            health: Health::default(),
            metrics: Metrics::default(),
            instance: new_instance_id(),
            reload_cursor: tokio::sync::Mutex::new(QuotaCursor::default()),
            override_cursor: std::sync::Mutex::new(QuotaCursor::default()),
            migrated: AtomicBool::new(false),
            write_gate: tokio::sync::Mutex::new(()),
        })
    }

    /// The root clock: monotonic nanoseconds, the time base of counters.
    /// The fine clock: a root reads it a few hundred times a second, and
    /// limiters estimate their offset to it from round trips.
    pub fn now(&self) -> Nanos {
        crate::clock::now_precise()
    }

    /// Forgets a slice of the key counters that have drained (the whole
    /// book about once a minute when called every second), every
    /// limiter allowance back at full, the interest records of limiters
    /// that stopped syncing, and the limiters not heard from within
    /// `limiter_expiry`.
    pub fn forget_drained_keys(&self) {
        let now = self.now();
        let ledger = self.ledger();
        let budget = (ledger.counters.len() / 60).max(1000);
        ledger.counters.forget_drained(budget, now);
        ledger.counters.forget_refilled(now);
        ledger.counters.forget_idle_interest(now);
        ledger.limiters().expire(now);
    }

    /// The in-memory state (it takes its own locks; [`Ledger::read`]
    /// holds all of them for a consistent look).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Looks at the database, then reads every quota change after the
    /// last one seen and applies them at once (so a bulk apply never shows
    /// half), migrating the schema first if this process has not yet.
    /// Returns how many quotas changed.
    ///
    /// A database that is not the one loaded (`store/watch.rs`) is not
    /// read: the root keeps what it holds and refuses writes until it is
    /// back. A read-only one is read, and writes refused.
    pub async fn reload(&self) -> Result<usize, StoreError> {
        let mut cursor = self.reload_cursor.lock().await;
        let looked = self.look_at_db().await;
        let db = match looked {
            Ok(DbState::Lost(reason)) => return Err(self.lost(reason)),
            Ok(db) => Ok(db),
            Err(error) => Err(error),
        };
        let result = match db {
            Ok(db) => self.read_changes(*cursor).await.map(|read| (db, read)),
            Err(error) => Err(error),
        };
        // Overrides after quotas: a limiter that gets an override has its
        // template by then, or soon after.
        let overrides = match &result {
            Ok(_) => Some(self.read_override_changes(self.override_position()).await),
            Err(_) => None,
        };
        let result = match (result, overrides) {
            (Ok(read), Some(Ok(overrides))) => Ok((read, overrides)),
            (Ok(_), Some(Err(error))) | (Err(error), _) => Err(error),
            (Ok(_), None) => unreachable!("overrides are read whenever quotas were"),
        };
        if let (Ok(_), DbState::Lost(reason)) = (&result, self.store.file_state()) {
            // The file changed while it was read: what was read may be
            // another database's.
            return Err(self.lost(reason));
        }
        let ((db, (quotas, after, invalid)), (overrides, override_after)) = match result {
            Ok(read) => read,
            Err(error) => {
                self.health.db_failed(&error.to_string());
                self.metrics.reload(false, 0, 0);
                return Err(error);
            }
        };
        let loaded = quotas.len();
        let changed = self.ledger().load(quotas, self.now())
            + self.ledger().load_overrides(overrides, self.now());
        *cursor = after;
        *self
            .override_cursor
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = override_after;
        self.health.reloaded();
        match db.refusal() {
            Some(reason) => self.health.db_read_only(reason),
            None => self.health.db_writable(),
        }
        self.metrics.reload(true, loaded, invalid);
        if changed > 0 {
            tracing::debug!(changed, epoch = after.epoch, "quotas reloaded");
        }
        Ok(changed)
    }

    /// Records a reload that did not read a lost database.
    fn lost(&self, reason: String) -> StoreError {
        self.health.db_read_only(&reason);
        self.metrics.reload(false, 0, 0);
        StoreError::ReadOnly(reason)
    }

    /// Before the first load, prepares the database (creating a missing
    /// SQLite file, adopting the file there) and migrates the schema; then
    /// looks whether it is still the one loaded and takes writes.
    ///
    /// A database that refuses writes cannot be migrated, but may hold a
    /// current schema (a root restarted on a read-only server or a
    /// standby): it is read, and the migration tried again next time.
    async fn look_at_db(&self) -> Result<DbState, StoreError> {
        if !self.migrated.load(Ordering::Acquire) {
            match self.store.migrate().await {
                Ok(()) => self.migrated.store(true, Ordering::Release),
                Err(StoreError::ReadOnly(reason)) => {
                    tracing::warn!(reason, "cannot migrate a database that takes no writes");
                }
                Err(error) => return Err(error),
            }
        } else if !self.health.is_ready() {
            self.store.prepare()?;
        }
        self.store.inspect().await
    }

    async fn read_changes(
        &self,
        mut after: QuotaCursor,
    ) -> Result<(Vec<crate::core::Quota>, QuotaCursor, usize), StoreError> {
        let mut quotas = Vec::new();
        let mut invalid = 0;
        loop {
            let page = self.store.load_after(after, LOAD_PAGE).await?;
            let full = page.len() == LOAD_PAGE;
            for row in page {
                match row {
                    Ok(quota) => {
                        after = QuotaCursor {
                            epoch: quota.epoch,
                            id: quota.id,
                        };
                        quotas.push(quota);
                    }
                    Err((position, reason)) => {
                        tracing::error!(id = position.id, reason, "skipping invalid quota row");
                        after = position;
                        invalid += 1;
                    }
                }
            }
            if !full {
                return Ok((quotas, after, invalid));
            }
        }
    }

    fn override_position(&self) -> QuotaCursor {
        *self
            .override_cursor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The override rows after `after`, every page; invalid rows are
    /// skipped and logged.
    async fn read_override_changes(
        &self,
        mut after: QuotaCursor,
    ) -> Result<(Vec<OverrideRow>, QuotaCursor), StoreError> {
        let mut rows = Vec::new();
        loop {
            let page = self.store.load_overrides_after(after, LOAD_PAGE).await?;
            let full = page.len() == LOAD_PAGE;
            for row in page {
                match row {
                    Ok(row) => {
                        after = QuotaCursor {
                            epoch: row.ov.epoch,
                            id: row.ov.id,
                        };
                        rows.push(row);
                    }
                    Err((position, reason)) => {
                        tracing::error!(id = position.id, reason, "skipping invalid override row");
                        after = position;
                    }
                }
            }
            if !full {
                return Ok((rows, after));
            }
        }
    }

    /// Tombstones the overrides that expired, when the book holds one:
    /// a write (its epoch carries the expiry to the limiters, which stop
    /// applying an expired override by themselves meanwhile). Quiet when
    /// the database takes no writes; another root may do it instead.
    pub async fn expire_overrides(&self) {
        let now_ms = self.utc_ms();
        let due = self
            .ledger()
            .overrides()
            .next_expiry()
            .is_some_and(|at| at <= now_ms);
        if !due || self.check_writable().is_err() {
            return;
        }
        match self.write(self.store.expire_overrides(now_ms)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(expired = n, "overrides expired"),
            Err(error) => tracing::debug!(%error, "expiring overrides failed"),
        }
    }

    /// The root's UTC clock (see `Ledger::utc_offset`), milliseconds.
    pub fn utc_ms(&self) -> i64 {
        (self.now() as i64 + self.ledger().utc_offset) / 1_000_000
    }

    /// Forgets the penalties that ended, and those of quotas gone.
    pub fn forget_ended_penalties(&self) {
        let now_utc = self.now() as i64 + self.ledger().utc_offset;
        self.ledger().forget_ended_penalties(now_utc);
    }

    /// Runs a database write: refused with 503 while the database is known
    /// to be down or to take no writes, or the root is not ready; queued
    /// behind this root's other writes, and followed by a reload so the
    /// reply reflects it.
    pub async fn write<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = self.read_only(operation).await;
        if result.is_ok() {
            self.metrics.admin_write();
            // A failed reload is logged by `reload`; the write stands.
            let _ = self.reload().await;
        }
        result
    }

    /// Runs a database operation that changes nothing (a dry run) under
    /// the same rules as [`Self::write`], without the reload.
    pub async fn read_only<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.check_writable()?;
        let _gate = self.write_gate.lock().await;
        let result = operation.await;
        match &result {
            Err(StoreError::Unavailable(reason)) => self.health.db_failed(reason),
            Err(StoreError::ReadOnly(reason)) => self.health.db_read_only(reason),
            Err(StoreError::Internal(_)) => {}
            _ => self.health.db_ok(),
        }
        result
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        if !self.health.is_ready() {
            return Err(StoreError::Unavailable(
                "quotas not loaded yet since the root started".into(),
            ));
        }
        if let Some(reason) = self.health.db_error() {
            return Err(if self.health.db_up() {
                StoreError::ReadOnly(reason)
            } else {
                StoreError::Unavailable(reason)
            });
        }
        Ok(())
    }

    /// What `/metrics` reads besides event counts.
    pub fn scrape(&self) -> Scrape {
        let now = self.now();
        let (stats, active_limiters, mut clipped) = {
            let ledger = self.ledger().read();
            let clipped: Vec<(Box<str>, u64, f64)> = ledger
                .limiters
                .iter()
                .map(|(_, l)| l)
                .filter(|l| l.clipped > 0)
                .map(|l| (l.name.clone(), l.clipped, l.clipped_weight))
                .collect();
            (
                ledger.stats(),
                ledger
                    .limiters
                    .active_since(now.saturating_sub(ACTIVE_WINDOW)),
                clipped,
            )
        };
        clipped.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        clipped.truncate(super::metrics::CLIPPED_SERIES);
        Scrape {
            stats,
            active_limiters,
            health: self.health.snapshot(),
            instance: self.instance,
            backend: self.store.backend().name(),
            connections: self.connections.stats(),
            body_memory: self.admission.memory_held(),
            clipped,
            limiter_tokens: self
                .config
                .limiter_tokens_file
                .as_ref()
                .map(|_| self.credentials.limiters()),
            token_reloads: self.credentials.reloads(),
            penalties: self.ledger().penalties().stats(),
        }
    }
}

/// A random, non-zero id for this process (zero means "no root yet" on the
/// wire).
fn new_instance_id() -> u64 {
    crate::host::random_seed()
}
