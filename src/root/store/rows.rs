//! The SQL that reads and writes quota rows as writes see them, in one
//! place: a single put or patch and a bulk apply both read rows, and
//! insert, rewrite and tombstone them, through these, so a new quota
//! column is added here once.
//!
//! Every write names the parent by name (`(SELECT id FROM quotas WHERE
//! name = ...)`): callers have the parent's name and have already checked
//! that it is a live quota inside the same transaction.

use std::sync::LazyLock;

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::query::QueryScalar;
use sqlx::{Any, Row, Transaction};

use crate::core::spec::QuotaSpec;
use crate::core::tier::PenaltyTime;
use crate::core::Window;

use super::StoreError;

/// A quota row with its parent by name.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct StoredRow {
    /// The quota's id.
    pub id: u64,
    /// The epoch of its last change.
    pub epoch: u64,
    /// A tombstone.
    pub deleted: bool,
    /// Its definition.
    pub spec: QuotaSpec,
}

/// The columns a write sets besides `name`, `parent` and the times, in
/// the order [`bind`] binds them (`$3` on; `$1` is the name, `$2` the
/// parent's name, the time comes last).
const WRITTEN: [&str; 9] = [
    r#""limit""#,
    "low_burst",
    "high_burst",
    "per_key",
    "count_window",
    "sliding",
    "penalty_secs",
    "in_flight",
    "epoch",
];

/// Parameters one written row binds: name, parent, [`WRITTEN`], time.
const ROW_PARAMS: usize = WRITTEN.len() + 3;

/// Binds `spec`'s row in [`WRITTEN`]'s order.
fn bind<'q>(
    query: QueryScalar<'q, Any, i64, AnyArguments<'q>>,
    spec: &'q QuotaSpec,
    epoch: u64,
    now: i64,
) -> QueryScalar<'q, Any, i64, AnyArguments<'q>> {
    query
        .bind(spec.name.as_str())
        .bind(spec.parent.as_deref())
        .bind(spec.limit)
        .bind(spec.low())
        .bind(spec.high())
        .bind(i64::from(spec.per_key))
        .bind(spec.window.map(Window::name))
        .bind(i64::from(spec.sliding))
        .bind(spec.penalty.map(|p| i64::from(p.secs())))
        .bind(i64::from(spec.in_flight))
        .bind(epoch as i64)
        .bind(now)
}

/// The `UPDATE` of [`rewrite`].
static REWRITE: LazyLock<String> = LazyLock::new(|| {
    let set: Vec<String> = WRITTEN
        .iter()
        .enumerate()
        .map(|(i, column)| format!("{column} = ${}", i + 3))
        .collect();
    format!(
        "UPDATE quotas SET parent = (SELECT p.id FROM quotas p WHERE p.name = $2), {}, \
         deleted = 0, updated_at = ${ROW_PARAMS} WHERE name = $1 RETURNING id",
        set.join(", ")
    )
});

/// The `INSERT` of [`insert`] for `rows` rows.
fn insert_sql(rows: usize) -> String {
    let mut sql = format!(
        "INSERT INTO quotas (name, parent, {}, deleted, created_at, updated_at) VALUES ",
        WRITTEN.join(", ")
    );
    for row in 0..rows {
        let p = row * ROW_PARAMS;
        if row > 0 {
            sql.push_str(", ");
        }
        let values: Vec<String> = (3..ROW_PARAMS).map(|i| format!("${}", p + i)).collect();
        let now = p + ROW_PARAMS;
        sql.push_str(&format!(
            "(${}, (SELECT id FROM quotas WHERE name = ${}), {}, 0, ${now}, ${now})",
            p + 1,
            p + 2,
            values.join(", ")
        ));
    }
    sql.push_str(" RETURNING id");
    sql
}

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
    let sql = insert_sql(specs.len());
    let mut query = sqlx::query_scalar::<_, i64>(&sql);
    for spec in specs {
        query = bind(query, spec, epoch, now);
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
    let query = sqlx::query_scalar::<_, i64>(REWRITE.as_str());
    bind(query, spec, epoch, now).fetch_all(&mut **tx).await?;
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

/// Rows with their parents by name, in [`stored_row`]'s order.
const SELECT_ROWS: &str = r#"SELECT q.id, q.epoch, q.deleted, q.name, p.name, q."limit",
    q.low_burst, q.high_burst, q.per_key, q.count_window, q.sliding, q.penalty_secs,
    q.in_flight FROM quotas q LEFT JOIN quotas p ON p.id = q.parent"#;

/// The row named `name`, live or a tombstone.
pub(super) async fn by_name(
    tx: &mut Transaction<'static, Any>,
    name: &str,
) -> Result<Option<StoredRow>, StoreError> {
    let sql = format!("{SELECT_ROWS} WHERE q.name = $1");
    let row = sqlx::query(&sql)
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
    row.as_ref().map(stored_row).transpose()
}

/// Every row, tombstones included.
pub(super) async fn all(tx: &mut Transaction<'static, Any>) -> Result<Vec<StoredRow>, StoreError> {
    let rows = sqlx::query(SELECT_ROWS).fetch_all(&mut **tx).await?;
    rows.iter().map(stored_row).collect()
}

fn stored_row(row: &AnyRow) -> Result<StoredRow, StoreError> {
    Ok(StoredRow {
        id: row.try_get::<i64, _>(0)? as u64,
        epoch: row.try_get::<i64, _>(1)? as u64,
        deleted: row.try_get::<i64, _>(2)? != 0,
        spec: QuotaSpec {
            name: row.try_get(3)?,
            parent: row.try_get(4)?,
            limit: row.try_get(5)?,
            low_burst: Some(row.try_get(6)?),
            high_burst: Some(row.try_get(7)?),
            per_key: row.try_get::<i64, _>(8)? != 0,
            // An unknown window in the database (written by a newer
            // sluice) reads as none: a write then rewrites the row.
            window: row
                .try_get::<Option<String>, _>(9)?
                .and_then(|w| Window::parse(&w)),
            sliding: row.try_get::<i64, _>(10)? != 0,
            // A penalty out of range (a hand-edited row) reads as none.
            penalty: row
                .try_get::<Option<i64>, _>(11)?
                .and_then(|secs| PenaltyTime::from_secs(secs.max(0) as u64).ok()),
            overrides: Vec::new(),
            in_flight: row.try_get::<i64, _>(12)? != 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_writes_bind_the_columns_in_one_order() {
        assert_eq!(
            insert_sql(2),
            "INSERT INTO quotas (name, parent, \"limit\", low_burst, high_burst, per_key, \
             count_window, sliding, penalty_secs, in_flight, epoch, deleted, created_at, \
             updated_at) VALUES ($1, (SELECT id FROM quotas WHERE name = $2), $3, $4, $5, $6, $7, \
             $8, $9, $10, $11, 0, $12, $12), ($13, (SELECT id FROM quotas WHERE name = $14), $15, \
             $16, $17, $18, $19, $20, $21, $22, $23, 0, $24, $24) RETURNING id"
        );
        assert_eq!(
            REWRITE.as_str(),
            "UPDATE quotas SET parent = (SELECT p.id FROM quotas p WHERE p.name = $2), \
             \"limit\" = $3, low_burst = $4, high_burst = $5, per_key = $6, count_window = $7, \
             sliding = $8, penalty_secs = $9, in_flight = $10, epoch = $11, deleted = 0, \
             updated_at = $12 WHERE name = $1 RETURNING id"
        );
    }
}
