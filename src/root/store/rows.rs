//! The SQL that writes quota rows, in one place: a single put and a bulk
//! apply both insert, rewrite and tombstone rows through these, so a new
//! quota column is added here once.
//!
//! Every statement names the parent by name (`(SELECT id FROM quotas
//! WHERE name = ...)`): both callers have the parent's name and have
//! already checked that it is a live quota inside the same transaction.

use sqlx::{Any, Transaction};

use crate::core::spec::QuotaSpec;
use crate::core::Window;

use super::StoreError;

/// Parameters one inserted row binds.
const INSERT_PARAMS: usize = 10;

/// Inserts new quotas whose parents already exist (or come earlier in
/// `specs`' parents-first order, in an earlier call), all at `epoch`, and
/// returns their ids in order.
pub(super) async fn insert(
    tx: &mut Transaction<'static, Any>,
    specs: &[&QuotaSpec],
    epoch: u64,
    now: i64,
) -> Result<Vec<u64>, StoreError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = String::from(
        r#"INSERT INTO quotas
           (name, parent, "limit", low_burst, high_burst, per_key, count_window, sliding,
            epoch, deleted, created_at, updated_at)
           VALUES "#,
    );
    for i in 0..specs.len() {
        let p = i * INSERT_PARAMS;
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(${}, (SELECT id FROM quotas WHERE name = ${}), ${}, ${}, ${}, ${}, ${}, ${}, ${}, 0, \
             ${}, ${})",
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5,
            p + 6,
            p + 7,
            p + 8,
            p + 9,
            p + 10,
            p + 10
        ));
    }
    sql.push_str(" RETURNING id");
    let mut query = sqlx::query_scalar::<_, i64>(&sql);
    for spec in specs {
        query = query
            .bind(spec.name.as_str())
            .bind(spec.parent.as_deref())
            .bind(spec.limit)
            .bind(spec.low())
            .bind(spec.high())
            .bind(i64::from(spec.per_key))
            .bind(spec.window.map(Window::name))
            .bind(i64::from(spec.sliding))
            .bind(epoch as i64)
            .bind(now);
    }
    let ids = query.fetch_all(&mut **tx).await?;
    Ok(ids.into_iter().map(|id| id as u64).collect())
}

/// Overwrites the row named `spec.name` (an update, or a revived
/// tombstone) at `epoch`.
pub(super) async fn rewrite(
    tx: &mut Transaction<'static, Any>,
    spec: &QuotaSpec,
    epoch: u64,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        r#"UPDATE quotas SET parent = (SELECT p.id FROM quotas p WHERE p.name = $1),
           "limit" = $2, low_burst = $3, high_burst = $4, per_key = $5, count_window = $6,
           sliding = $7, epoch = $8, deleted = 0, updated_at = $9 WHERE name = $10"#,
    )
    .bind(spec.parent.as_deref())
    .bind(spec.limit)
    .bind(spec.low())
    .bind(spec.high())
    .bind(i64::from(spec.per_key))
    .bind(spec.window.map(Window::name))
    .bind(i64::from(spec.sliding))
    .bind(epoch as i64)
    .bind(now)
    .bind(spec.name.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Turns the row named `name` into a tombstone at `epoch`.
pub(super) async fn tombstone(
    tx: &mut Transaction<'static, Any>,
    name: &str,
    epoch: u64,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE quotas SET deleted = 1, epoch = $1, updated_at = $2 WHERE name = $3")
        .bind(epoch as i64)
        .bind(now)
        .bind(name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
