//! The schema, embedded in the binary, one directory per backend.
//!
//! Files live in `src/root/migrations/{sqlite,postgres}/NNNN_description.sql`
//! and are applied by sqlx's migrator, which records them in
//! `_sqlx_migrations` and takes a database lock so several roots starting
//! at once apply each migration once. A new migration is a new file in
//! both directories plus a line in each list below.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::AnyConnection;

use super::{Backend, StoreError};

/// What [`MigrationSource::resolve`] returns.
type ResolveFuture = Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send>>;

/// One embedded migration: version, description, SQL.
type Embedded = (i64, &'static str, &'static str);

const SQLITE: &[Embedded] = &[
    (
        1,
        "quotas",
        include_str!("../migrations/sqlite/0001_quotas.sql"),
    ),
    (
        2,
        "per key",
        include_str!("../migrations/sqlite/0002_per_key.sql"),
    ),
    (
        3,
        "windows",
        include_str!("../migrations/sqlite/0003_windows.sql"),
    ),
    (
        4,
        "tiers",
        include_str!("../migrations/sqlite/0004_tiers.sql"),
    ),
    (
        5,
        "in flight",
        include_str!("../migrations/sqlite/0005_in_flight.sql"),
    ),
    (
        6,
        "epoch_windows",
        include_str!("../migrations/sqlite/0006_epoch_windows.sql"),
    ),
];

const POSTGRES: &[Embedded] = &[
    (
        1,
        "quotas",
        include_str!("../migrations/postgres/0001_quotas.sql"),
    ),
    (
        2,
        "per key",
        include_str!("../migrations/postgres/0002_per_key.sql"),
    ),
    (
        3,
        "windows",
        include_str!("../migrations/postgres/0003_windows.sql"),
    ),
    (
        4,
        "tiers",
        include_str!("../migrations/postgres/0004_tiers.sql"),
    ),
    (
        5,
        "in flight",
        include_str!("../migrations/postgres/0005_in_flight.sql"),
    ),
    (
        6,
        "epoch_windows",
        include_str!("../migrations/postgres/0006_epoch_windows.sql"),
    ),
];

/// The migrations of one backend, as a sqlx migration source.
#[derive(Debug)]
struct EmbeddedMigrations(&'static [Embedded]);

impl MigrationSource<'static> for EmbeddedMigrations {
    fn resolve(self) -> ResolveFuture {
        let migrations = self
            .0
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    Cow::Borrowed(sql),
                    false,
                )
            })
            .collect();
        Box::pin(std::future::ready(Ok(migrations)))
    }
}

/// Applies every migration of `backend` not applied yet, on `conn`.
pub(super) async fn run(conn: &mut AnyConnection, backend: Backend) -> Result<(), StoreError> {
    let source = match backend {
        Backend::Sqlite => EmbeddedMigrations(SQLITE),
        Backend::Postgres => EmbeddedMigrations(POSTGRES),
    };
    let migrator = Migrator::new(source).await.map_err(migrate_error)?;
    migrator.run_direct(conn).await.map_err(migrate_error)
}

fn migrate_error(error: sqlx::migrate::MigrateError) -> StoreError {
    match error {
        sqlx::migrate::MigrateError::Execute(e) => StoreError::from(e),
        other => StoreError::Internal(format!("migration: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::{Connection, Executor, Row};

    /// `(id, parent, count_window, sliding, per_key)` of a stored quota.
    type QuotaRow = (i64, Option<i64>, Option<String>, i64, i64);

    /// A SQLite database in a temp dir with `migrations` applied.
    async fn sqlite_at(dir: &tempfile::TempDir, migrations: &'static [Embedded]) -> AnyConnection {
        sqlx::any::install_default_drivers();
        let url = format!("sqlite://{}/q.db?mode=rwc", dir.path().display());
        let mut conn = AnyConnection::connect(&url).await.unwrap();
        let migrator = Migrator::new(EmbeddedMigrations(migrations)).await.unwrap();
        migrator.run_direct(&mut conn).await.unwrap();
        conn
    }

    /// A database made before the epoch-aligned windows keeps every quota,
    /// parent link and override through the rebuild of its quotas table,
    /// takes the new windows after it, and still refuses what it refused.
    #[tokio::test]
    async fn sqlite_takes_the_epoch_windows_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = sqlite_at(&dir, &SQLITE[..5]).await;
        conn.execute(
            "INSERT INTO quotas (id, name, parent, \"limit\", low_burst, high_burst, epoch, \
             created_at, updated_at, per_key, count_window, sliding, in_flight) VALUES \
             (7, 'child', NULL, 5, 5, 5, 2, 0, 0, 1, 'month', 1, 0), \
             (3, 'parent', NULL, 9, 9, 9, 1, 0, 0, 0, NULL, 0, 0);
             UPDATE quotas SET parent = 3 WHERE id = 7;
             INSERT INTO overrides (quota, key_hash, kind, epoch, created_at, updated_at) \
             VALUES (7, '00000000000000ff', 'deny', 3, 0, 0);",
        )
        .await
        .unwrap();
        let refused = "INSERT INTO quotas (name, \"limit\", low_burst, high_burst, epoch, \
                       created_at, updated_at, count_window) VALUES ('y', 1, 1, 1, 4, 0, 0, '30d')";
        assert!(conn.execute(refused).await.is_err(), "before: 30d refused");
        drop(conn);

        let mut conn = sqlite_at(&dir, SQLITE).await;
        let rows = conn
            .fetch_all("SELECT id, parent, count_window, sliding, per_key FROM quotas ORDER BY id")
            .await
            .unwrap();
        let rows: Vec<QuotaRow> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        assert_eq!(
            rows,
            vec![
                (3, None, None, 0, 0),
                (7, Some(3), Some("month".into()), 1, 1)
            ]
        );
        let overrides = conn
            .fetch_all("SELECT quota, kind FROM overrides")
            .await
            .unwrap();
        assert_eq!(overrides.len(), 1);
        assert_eq!(overrides[0].get::<i64, _>(0), 7);
        for (i, window) in ["epoch_week", "30d", "365d"].into_iter().enumerate() {
            let sql = format!(
                "INSERT INTO quotas (name, \"limit\", low_burst, high_burst, epoch, created_at, \
                 updated_at, count_window) VALUES ('n{i}', 1, 1, 1, 5, 0, 0, '{window}')"
            );
            conn.execute(sql.as_str()).await.unwrap();
        }
        for still_refused in [
            "INSERT INTO quotas (name, \"limit\", low_burst, high_burst, epoch, created_at, \
             updated_at, count_window) VALUES ('z', 1, 1, 1, 6, 0, 0, '2m')",
            "INSERT INTO quotas (name, parent, \"limit\", low_burst, high_burst, epoch, \
             created_at, updated_at) VALUES ('orphan', 99, 1, 1, 1, 6, 0, 0)",
            "INSERT INTO overrides (quota, key_hash, kind, epoch, created_at, updated_at) \
             VALUES (99, '0000000000000001', 'deny', 6, 0, 0)",
        ] {
            assert!(
                conn.execute(still_refused).await.is_err(),
                "{still_refused}"
            );
        }
    }
}
