//! The quota database: SQLite or PostgreSQL, one schema, one set of queries.
//!
//! Access goes through sqlx's `Any` driver, so both backends run the same
//! SQL (`$n` placeholders, `RETURNING`, recursive CTEs: all understood by
//! SQLite ≥ 3.35 and PostgreSQL). Only the migrations and the
//! statement that opens a write transaction differ.
//!
//! **Epochs.** Every write transaction starts with
//! `UPDATE meta SET epoch = epoch + 1 ... RETURNING epoch` and stamps the
//! rows it writes with that epoch. The update locks the single `meta` row
//! (PostgreSQL) or the whole database (SQLite, `BEGIN IMMEDIATE`), so
//! writers are serialised and commit in epoch order: a reader that sees
//! epoch `e` committed has already seen every epoch below it, and a reload
//! by "epoch greater than the last one seen" misses nothing.
//!
//! **Tombstones.** Deleting a quota keeps its row with `deleted = 1` and a
//! new epoch, so the deletion reaches limiters through the same incremental
//! reads. Setting a deleted name again revives the row with its old id.
//!
//! **Watch.** Every write commits only into the database the root loaded
//! and will read again, or is answered 503: see `watch.rs`.
//!
//! # Layout
//!
//! - `migrations.rs` — the schema, embedded per backend.
//! - `write.rs` — single-quota writes: put (create or replace), patch
//!   (merge some fields) and delete, with `If-Match`-style expectations.
//! - `apply.rs` — bulk apply of a whole quota set in one transaction.
//! - `overrides.rs` — overrides of per-key templates: their rows, puts,
//!   patches, deletes and expiry, and the reload's read by epoch.
//! - `rows.rs` — the statements that read, insert, rewrite and tombstone
//!   quota rows, shared by both.
//! - `watch.rs` — whether the database is still the one loaded (an SQLite
//!   file deleted or replaced, an epoch gone back) and takes writes.

mod apply;
mod migrations;
mod overrides;
mod rows;
mod watch;
mod write;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Connection, Executor, Row, Transaction};

use crate::core::tier::PenaltyTime;
use crate::core::{Quota, ValidationError, Window};
use crate::wire::QuotaCursor;

pub use apply::{ApplyDiff, ApplyOptions, ApplyOutcome, FieldChange, QuotaUpdate};
pub use overrides::{OverrideOutcome, OverrideRow, StoredOverride};
pub use watch::DbState;
pub use write::{Expect, PutOutcome, Written};

use watch::SqliteFile;

/// Which database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `sqlite:` URLs.
    Sqlite,
    /// `postgres:` and `postgresql:` URLs.
    Postgres,
}

impl Backend {
    /// The backend of a database URL.
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Self::Postgres)
        } else {
            Err(StoreError::Config(format!(
                "unsupported database URL {:?}: use sqlite://PATH or postgres://...",
                redact_url(url)
            )))
        }
    }

    /// Short lowercase name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

/// Why a database operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL or options are unusable.
    #[error("{0}")]
    Config(String),
    /// The database cannot be reached or is too busy: retry later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The request is invalid against the current quotas.
    #[error("{}{error}", quota.as_ref().map(|q| format!("quota {q:?}: ")).unwrap_or_default())]
    Invalid {
        /// The quota the error is about, when the request names several.
        quota: Option<String>,
        /// The offending field and why.
        error: ValidationError,
    },
    /// No live quota has this name.
    #[error("no quota named {0:?}")]
    NotFound(String),
    /// The template has no override for this key (`template`, `key`).
    #[error("{0:?} has no override for key {1}")]
    NoOverride(String, String),
    /// The write conflicts with other quotas (deleting a parent).
    #[error("{0}")]
    Conflict(ValidationError),
    /// The quota is not as the writer expected ([`Expect`]): someone
    /// changed it since the writer read it.
    #[error("{0}")]
    Precondition(ValidationError),
    /// The database takes no writes now (read-only, or not the database
    /// the root loaded: see [`DbState`]); the reason.
    #[error("the database takes no writes: {0}")]
    ReadOnly(String),
    /// Anything else: a bug or a schema the root does not understand.
    #[error("database error: {0}")]
    Internal(String),
}

impl StoreError {
    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            quota: None,
            error: ValidationError::new(field, message),
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &error {
            // Diagnosed by `Store::bounded`: the pool retried the real
            // error until it gave up, and only says it gave up.
            E::PoolTimedOut => Self::Unavailable(NO_CONNECTION.to_string()),
            E::Io(_) | E::Tls(_) | E::PoolClosed | E::WorkerCrashed => {
                Self::Unavailable(error.to_string())
            }
            E::Protocol(_) => Self::Unavailable(error.to_string()),
            E::Database(db) if is_read_only_code(db.code().as_deref()) => {
                Self::ReadOnly(error.to_string())
            }
            E::Database(db) if is_unavailable_code(db.code().as_deref()) => {
                Self::Unavailable(error.to_string())
            }
            _ => Self::Internal(error.to_string()),
        }
    }
}

/// Database error codes that mean "no writes here": SQLite's read-only
/// family, PostgreSQL's read-only transaction (a standby,
/// `default_transaction_read_only`) and insufficient privilege.
fn is_read_only_code(code: Option<&str>) -> bool {
    match code {
        Some("25006" | "42501") => true,
        Some(code) if code.len() != 5 => code.parse::<i32>().is_ok_and(|c| c & 0xff == 8),
        _ => false,
    }
}

/// Database error codes that mean "not now" rather than "never": SQLite
/// busy/locked/I-O/full/cannot-open, PostgreSQL connection exceptions
/// (08), insufficient resources (53) and shutdown (57P).
fn is_unavailable_code(code: Option<&str>) -> bool {
    let Some(code) = code else { return false };
    // SQLSTATEs are always five characters; SQLite's extended result codes
    // are decimal numbers below 10000.
    if code.len() == 5 {
        return code.starts_with("08") || code.starts_with("53") || code.starts_with("57P");
    }
    code.parse::<i32>()
        .is_ok_and(|sqlite| matches!(sqlite & 0xff, 5 | 6 | 10 | 13 | 14))
}

/// The URL with any password replaced, for messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// Milliseconds since the Unix epoch, for the rows' timestamps.
fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// How long one database operation may take unless the configuration
/// says otherwise (`db_query_timeout`). A bulk apply of 1M quotas takes
/// about 30 s on SQLite on the development machine.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(120);

/// Most rows one reload query reads.
pub const LOAD_PAGE: usize = 10_000;

/// The columns every quota query selects, in [`quota_from_row`]'s order.
const QUOTA_COLUMNS: &str = r#"id, name, parent, "limit", low_burst, high_burst, epoch, deleted, per_key, count_window, sliding, penalty_secs, in_flight"#;

/// What sqlx's "pool timed out" becomes until diagnosed.
const NO_CONNECTION: &str = "no database connection within db_timeout";

/// A database URL that never shows its password in `Debug`.
#[derive(Clone)]
struct Url(String);

impl std::fmt::Debug for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// A pool of connections to the quota database.
#[derive(Clone, Debug)]
pub struct Store {
    /// The connections (opened lazily, so a root starts with the database
    /// down and connects when it comes back).
    pool: AnyPool,
    /// Where they go, for a direct connection that tells why the pool
    /// cannot connect.
    url: Url,
    /// How long a connection may take.
    connect_timeout: Duration,
    /// Which database this is.
    backend: Backend,
    /// Longest one operation (a read, a write, a bulk apply, the
    /// migrations) may take before it is abandoned: a database that stops
    /// answering mid-query must not stall reloads and writes for ever.
    query_timeout: Duration,
    /// The SQLite file under watch (none for PostgreSQL or in memory).
    file: Option<Arc<SqliteFile>>,
    /// Highest epoch seen in the database (read or written): one below it
    /// means the database went back.
    highest_epoch: Arc<AtomicU64>,
}

impl Store {
    /// A store for `url`; connects on first use. SQLite files use
    /// write-ahead logging; one missing at the first load is created
    /// (unless the URL sets a `mode`), never one missing later.
    pub fn open(url: &str, timeout: Duration, max_connections: u32) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(url)?;
        let mut options = AnyPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(timeout);
        let (url, file) = match backend {
            Backend::Sqlite => {
                let own_mode = url.contains("mode=");
                let file = SqliteFile::of_url(url, !own_mode).map(Arc::new);
                let watch = file.clone();
                options = options.after_connect(move |conn, _meta| {
                    let watch = watch.clone();
                    Box::pin(async move {
                        // Opens the log too: the watch finds both.
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        if let Some(file) = watch {
                            file.connected();
                        }
                        Ok(())
                    })
                });
                (sqlite_url_opening(url), file)
            }
            Backend::Postgres => (url.to_string(), None),
        };
        let pool = options
            .connect_lazy(&url)
            .map_err(|e| StoreError::Config(format!("{}: {e}", redact_url(&url))))?;
        Ok(Self {
            pool,
            url: Url(url),
            connect_timeout: timeout,
            backend,
            query_timeout: DEFAULT_QUERY_TIMEOUT,
            file,
            highest_epoch: Arc::new(AtomicU64::new(0)),
        })
    }

    /// This store with another limit on one operation's duration.
    pub fn with_query_timeout(mut self, timeout: Duration) -> Self {
        self.query_timeout = timeout;
        self
    }

    /// Runs `op`, giving up after the query timeout. An abandoned
    /// operation's transaction is rolled back (or its connection closed)
    /// by the driver when the future is dropped.
    async fn bounded<T>(
        &self,
        what: &str,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = tokio::time::timeout(self.query_timeout, op)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(format!(
                    "{what} took longer than db_query_timeout ({} ms)",
                    self.query_timeout.as_millis()
                )))
            });
        match result {
            Err(StoreError::Unavailable(reason)) if reason == NO_CONNECTION => {
                Err(StoreError::Unavailable(self.why_no_connection().await))
            }
            other => other,
        }
    }

    /// Why the pool gets no connection: the error of one direct attempt
    /// (with the same setup as the pool's), such as `file is not a
    /// database` or `connection refused`; or, if that attempt works, that
    /// every connection was busy.
    async fn why_no_connection(&self) -> String {
        let attempt = async { self.connect_direct().await?.close().await };
        match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(Err(error)) => format!("{error} ({NO_CONNECTION})"),
            Err(_) => format!("connecting takes longer than db_timeout ({NO_CONNECTION})"),
            Ok(Ok(())) => format!("{NO_CONNECTION}: every connection busy"),
        }
    }

    /// A connection outside the pool, set up as the pool's are.
    async fn connect_direct(&self) -> Result<sqlx::AnyConnection, sqlx::Error> {
        let mut conn = sqlx::AnyConnection::connect(&self.url.0).await?;
        if self.backend == Backend::Sqlite {
            conn.execute("PRAGMA journal_mode = WAL").await?;
        }
        Ok(conn)
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Brings the schema up to date (idempotent; safe with several roots),
    /// after [`Self::prepare`].
    ///
    /// On a connection of its own, closed whatever happens: sqlx's
    /// migrator leaves its lock (a PostgreSQL advisory lock) held by the
    /// session when a migration fails (on a read-only database, say), and
    /// that session must not go back to the pool, where the next attempt
    /// would wait for it for ever.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.prepare()?;
        let connect = async {
            tokio::time::timeout(self.connect_timeout, self.connect_direct())
                .await
                .map_err(|_| {
                    StoreError::Unavailable("connecting takes longer than db_timeout".to_string())
                })?
                .map_err(StoreError::from)
        };
        self.bounded("the migrations", async {
            let mut conn = connect.await?;
            let result = migrations::run(&mut conn, self.backend).await;
            let _ = conn.close().await;
            result
        })
        .await
    }

    /// Up to `limit` quotas after `after` in `(epoch, id)` order, tombstones
    /// included.
    ///
    /// Two index seeks, the rest of the cursor's epoch and then the epochs
    /// after it: a single `(epoch, id) > (e, i)` condition makes SQLite
    /// scan the cursor's whole epoch from its start, which is quadratic
    /// when paging through a bulk apply of a million quotas (one epoch).
    pub async fn load_after(
        &self,
        after: QuotaCursor,
        limit: usize,
    ) -> Result<Vec<StoredQuota>, StoreError> {
        self.bounded("reading quotas", self.load_after_now(after, limit))
            .await
    }

    async fn load_after_now(
        &self,
        after: QuotaCursor,
        limit: usize,
    ) -> Result<Vec<StoredQuota>, StoreError> {
        let rows = self
            .rows_after("quotas", QUOTA_COLUMNS, after, limit)
            .await?;
        rows.iter().map(quota_from_row).collect()
    }

    /// At most `limit` rows of `table` (its `columns`) after `after` in
    /// `(epoch, id)` order: how quota pages and override pages are read.
    async fn rows_after(
        &self,
        table: &str,
        columns: &str,
        after: QuotaCursor,
        limit: usize,
    ) -> Result<Vec<AnyRow>, sqlx::Error> {
        let same_epoch = format!(
            "SELECT {columns} FROM {table} WHERE epoch = $1 AND id > $2 ORDER BY id LIMIT $3"
        );
        let mut rows = sqlx::query(&same_epoch)
            .bind(to_i64(after.epoch))
            .bind(to_i64(after.id))
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        if rows.len() < limit {
            let later = format!(
                "SELECT {columns} FROM {table} WHERE epoch > $1 ORDER BY epoch, id LIMIT $2"
            );
            let more = sqlx::query(&later)
                .bind(to_i64(after.epoch))
                .bind((limit - rows.len()) as i64)
                .fetch_all(&self.pool)
                .await?;
            rows.extend(more);
        }
        Ok(rows)
    }

    /// The newest epoch in the database.
    pub async fn epoch(&self) -> Result<u64, StoreError> {
        self.bounded("reading the epoch", async {
            let epoch: i64 = sqlx::query_scalar("SELECT epoch FROM meta WHERE id = 1")
                .fetch_one(&self.pool)
                .await?;
            Ok(epoch as u64)
        })
        .await
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Before the root's first load (and by [`Self::migrate`]): creates a
    /// missing SQLite file (when the store may) and adopts the file at its
    /// path as the database to watch. Later calls re-adopt, so call it
    /// only until a load works.
    pub fn prepare(&self) -> Result<(), StoreError> {
        match &self.file {
            Some(file) => file.prepare(),
            None => Ok(()),
        }
    }

    /// Looks at the database (see `watch.rs`): still the one loaded, its
    /// epoch not behind, writable. An error when it cannot be reached.
    pub async fn inspect(&self) -> Result<DbState, StoreError> {
        if let Some(file) = &self.file {
            let state = file.glance();
            if matches!(state, DbState::Lost(_)) {
                // Not touched: a new connection would open another file.
                return Ok(state);
            }
        }
        // The highest epoch seen is read before the database: every epoch
        // in it was committed before this read began, so a database that
        // is still the same cannot answer less. Read after, it could hold
        // a commit that landed while the read was under way, and the
        // older answer would pass for a restored copy.
        let highest = self.highest_epoch.load(Ordering::Acquire);
        let epoch = self.epoch().await?;
        if epoch < highest {
            return Ok(DbState::Lost(went_back(epoch, highest)));
        }
        self.saw_epoch(epoch);
        if let Some(file) = &self.file {
            return Ok(file.look());
        }
        match self.bounded("the write check", self.probe_writes()).await {
            Ok(()) => Ok(DbState::Writable),
            Err(StoreError::ReadOnly(reason)) => Ok(DbState::ReadOnly(reason)),
            Err(error) => Err(error),
        }
    }

    /// Records that the database holds `epoch`.
    pub fn saw_epoch(&self, epoch: u64) {
        self.highest_epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    /// A statement that writes nothing but is checked as every write is
    /// (read-only transaction, standby, privileges) on each table a write
    /// touches. It takes no row lock, so a long bulk apply does not hold
    /// it up.
    async fn probe_writes(&self) -> Result<(), StoreError> {
        sqlx::query(
            "WITH m AS (UPDATE meta SET epoch = epoch WHERE false RETURNING 1), \
                  u AS (UPDATE quotas SET epoch = epoch WHERE false RETURNING 1), \
                  i AS (INSERT INTO quotas (name, \"limit\", low_burst, high_burst, epoch, \
                            deleted, created_at, updated_at) \
                        SELECT name, \"limit\", low_burst, high_burst, epoch, deleted, \
                            created_at, updated_at FROM quotas WHERE false RETURNING 1) \
             SELECT 1",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The file at the SQLite path against the one adopted, and whether
    /// it may be written (writable for a database that is not a file): a
    /// reload that read while it changed drops what it read.
    pub fn file_state(&self) -> DbState {
        match &self.file {
            Some(file) => file.glance(),
            None => DbState::Writable,
        }
    }

    /// The SQLite file, as a write sees it: an error unless it is the one
    /// loaded and writable. `thorough` also looks at this process's
    /// descriptors (after a commit, before the write is acknowledged).
    fn check_file(&self, thorough: bool) -> Result<(), StoreError> {
        match &self.file {
            Some(file) if thorough => file.look().into_error(),
            _ => self.file_state().into_error(),
        }
    }

    /// Commits a write transaction, then makes sure it went where the
    /// root will read it again: a database file deleted or replaced
    /// meanwhile makes the write unacknowledged (an error), though its
    /// transaction committed into the file the root had open.
    async fn commit_write(
        &self,
        tx: Transaction<'static, Any>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        tx.commit().await?;
        self.saw_epoch(epoch);
        self.check_file(true).map_err(|error| match error {
            StoreError::ReadOnly(reason) => StoreError::ReadOnly(format!(
                "{reason} (this write was committed to the file the root had open, which \
                 is not at its path any more: it is lost; repeat it once the database is back)"
            )),
            other => other,
        })
    }

    /// Opens a write transaction and takes the next epoch in it; refused
    /// when the database is not the one loaded, or its epoch went back.
    async fn begin_write(&self) -> Result<(Transaction<'static, Any>, u64), StoreError> {
        self.check_file(false)?;
        let mut tx = match self.backend {
            // IMMEDIATE takes the write lock now, so two writers never both
            // read and then fail to upgrade.
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        };
        let epoch: i64 =
            sqlx::query_scalar("UPDATE meta SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch")
                .fetch_one(&mut *tx)
                .await?;
        let epoch = epoch.max(0) as u64;
        let highest = self.highest_epoch.load(Ordering::Acquire);
        if epoch <= highest {
            tx.rollback().await?;
            return Err(StoreError::ReadOnly(went_back(
                epoch.saturating_sub(1),
                highest,
            )));
        }
        Ok((tx, epoch))
    }
}

/// Why a database whose epoch is `epoch` when the root has seen `highest`
/// is refused.
fn went_back(epoch: u64, highest: u64) -> String {
    format!(
        "the database is at epoch {epoch}, behind the {highest} this root has seen: it was \
         replaced or restored from an older copy, and writes would take epochs the limiters \
         have passed; restore the newer database, or restart the root to serve this one"
    )
}

/// A quota row as read from the database: valid, or the reason it is not
/// (a hand-edited row); a reload skips the latter and says so.
pub type StoredQuota = Result<Quota, (QuotaCursor, String)>;

/// Appends `mode=rw` (never create: [`Store::prepare`] creates a missing
/// file before the first load, and a file deleted later must not come
/// back empty) unless the URL picks a mode.
fn sqlite_url_opening(url: &str) -> String {
    if url.contains("mode=") {
        return url.to_string();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}mode=rw")
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn quota_from_row(row: &AnyRow) -> Result<StoredQuota, StoreError> {
    let id: i64 = row.try_get(0)?;
    let epoch: i64 = row.try_get(6)?;
    let position = QuotaCursor {
        epoch: epoch.max(0) as u64,
        id: id.max(0) as u64,
    };
    let parent: Option<i64> = row.try_get(2)?;
    let quota = Quota {
        id: position.id,
        name: row.try_get(1)?,
        parent: parent.map(|p| p.max(0) as u64),
        limit: row.try_get(3)?,
        low_burst: row.try_get(4)?,
        high_burst: row.try_get(5)?,
        epoch: position.epoch,
        deleted: row.try_get::<i64, _>(7)? != 0,
        per_key: row.try_get::<i64, _>(8)? != 0,
        window: None,
        sliding: row.try_get::<i64, _>(10)? != 0,
        penalty: None,
        in_flight: row.try_get::<i64, _>(12)? != 0,
    };
    let window: Option<String> = row.try_get(9)?;
    let quota = match window.as_deref().map(|w| (w, Window::parse(w))) {
        None => quota,
        Some((_, Some(window))) => Quota {
            window: Some(window),
            ..quota
        },
        Some((name, None)) => {
            return Ok(Err((
                position,
                format!("row {id} has an unknown window {name:?}"),
            )));
        }
    };
    let quota = match row.try_get::<Option<i64>, _>(11)? {
        None => quota,
        Some(secs) => match PenaltyTime::from_secs(secs.max(0) as u64) {
            Ok(penalty) => quota.penalized(Some(penalty)),
            Err(e) => return Ok(Err((position, format!("row {id}: {e}")))),
        },
    };
    if id <= 0 || epoch <= 0 {
        return Ok(Err((position, format!("row {id} has id or epoch below 1"))));
    }
    Ok(quota
        .validate()
        .map(|()| quota)
        .map_err(|e| (position, e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_the_backend() {
        assert_eq!(Backend::of_url("sqlite://./x.db").unwrap(), Backend::Sqlite);
        assert_eq!(
            Backend::of_url("postgres://h/db").unwrap(),
            Backend::Postgres
        );
        assert_eq!(
            Backend::of_url("postgresql://h/db").unwrap(),
            Backend::Postgres
        );
        assert!(Backend::of_url("mysql://h/db").is_err());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:pw@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://./x.db"), "sqlite://./x.db");
    }

    #[test]
    fn sqlite_urls_never_create_the_file_unless_a_mode_is_given() {
        assert_eq!(sqlite_url_opening("sqlite://x.db"), "sqlite://x.db?mode=rw");
        assert_eq!(
            sqlite_url_opening("sqlite://x.db?cache=shared"),
            "sqlite://x.db?cache=shared&mode=rw"
        );
        assert_eq!(
            sqlite_url_opening("sqlite://x.db?mode=ro"),
            "sqlite://x.db?mode=ro"
        );
    }

    #[test]
    fn transient_database_codes_mean_unavailable() {
        assert!(is_unavailable_code(Some("5")));
        assert!(!is_unavailable_code(Some("8")));
        assert!(is_read_only_code(Some("8")));
        assert!(is_read_only_code(Some("1032")));
        assert!(is_read_only_code(Some("25006")));
        assert!(is_read_only_code(Some("42501")));
        assert!(!is_read_only_code(Some("5")));
        assert!(!is_read_only_code(Some("08006")));
        assert!(is_unavailable_code(Some("517")));
        assert!(is_unavailable_code(Some("57P01")));
        assert!(is_unavailable_code(Some("08006")));
        assert!(!is_unavailable_code(Some("23505")));
        assert!(!is_unavailable_code(Some("19")));
        assert!(!is_unavailable_code(None));
    }
}
