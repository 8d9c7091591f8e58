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
