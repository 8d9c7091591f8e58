//! Single-quota writes: put (create, update, re-parent) and delete.
//!
//! Each runs in one write transaction that first takes the next epoch (see
//! the module doc of `store`), then checks the change against the quotas
//! as they are inside that transaction, so concurrent writers through
//! other roots cannot slip a cycle or a too-deep chain past the check.

use sqlx::{Any, Row, Transaction};

use crate::core::quota::{validate_chain, MAX_DEPTH};
use crate::core::spec::{template_as_parent, QuotaSpec};
use crate::core::{ValidationError, Window};

use super::{rows, unix_millis, Store, StoreError};

/// A committed write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The quota's id.
    pub id: u64,
    /// The epoch the write got.
    pub epoch: u64,
}

/// What a put did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// A new quota (or a deleted one revived).
    Created(Written),
    /// An existing quota changed.
    Updated(Written),
    /// The quota already had exactly these values; no epoch was taken.
    Unchanged {
        /// The quota's id.
        id: u64,
        /// Its current epoch.
        epoch: u64,
    },
}

/// A quota row as the write checks need it.
#[derive(Clone, Debug, PartialEq)]
struct Current {
    id: u64,
    parent: Option<u64>,
    limit: f64,
    low_burst: f64,
    high_burst: f64,
    epoch: u64,
    deleted: bool,
    per_key: bool,
    window: Option<Window>,
    sliding: bool,
}

impl Store {
    /// Creates or replaces the quota `spec.name` (a deleted one is revived
    /// with its old id). The parent must be a live quota, the chain acyclic
    /// and, counting the quota's own subtree, at most
    /// [`MAX_DEPTH`] deep.
    pub async fn put(&self, spec: &QuotaSpec) -> Result<PutOutcome, StoreError> {
        self.bounded("the write", self.put_now(spec)).await
    }

    async fn put_now(&self, spec: &QuotaSpec) -> Result<PutOutcome, StoreError> {
        spec.validate()
            .map_err(|error| StoreError::Invalid { quota: None, error })?;
        let (mut tx, epoch) = self.begin_write().await?;
        let current = current_by_name(&mut tx, &spec.name).await?;
        let parent = match &spec.parent {
            Some(name) => Some(live_parent_id(&mut tx, name).await?),
            None => None,
        };
        check_placement(&mut tx, spec, current.as_ref()).await?;
        if let Some(c) = current.as_ref().filter(|c| spec.per_key && !c.deleted) {
            let children = live_children(&mut tx, c.id).await?;
            if !children.is_empty() {
                let message = format!(
                    "{:?} is the parent of {}; a per-key template cannot be a parent",
                    spec.name,
                    children.join(", ")
                );
                return Err(StoreError::Conflict(ValidationError::new(
                    "per_key", message,
                )));
            }
        }
        let now = unix_millis();
        let outcome = match current {
            Some(c) if !c.deleted && same_values(&c, spec, parent) => {
                tx.rollback().await?;
                return Ok(PutOutcome::Unchanged {
                    id: c.id,
                    epoch: c.epoch,
                });
            }
            Some(c) => {
                rows::rewrite(&mut tx, spec, epoch, now).await?;
                let written = Written { id: c.id, epoch };
                if c.deleted {
                    PutOutcome::Created(written)
                } else {
                    PutOutcome::Updated(written)
                }
            }
            None => {
                let ids = rows::insert(&mut tx, &[spec], epoch, now).await?;
                let id = ids
                    .first()
                    .copied()
                    .ok_or_else(|| StoreError::Internal("the insert returned no id".into()))?;
                PutOutcome::Created(Written { id, epoch })
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Deletes a live quota, leaving a tombstone. A quota with live
    /// children is not deleted: [`StoreError::Conflict`] names them.
    pub async fn delete(&self, name: &str) -> Result<Written, StoreError> {
        self.bounded("the delete", self.delete_now(name)).await
    }

    async fn delete_now(&self, name: &str) -> Result<Written, StoreError> {
        let (mut tx, epoch) = self.begin_write().await?;
        let current = current_by_name(&mut tx, name).await?;
        let Some(current) = current.filter(|c| !c.deleted) else {
            return Err(StoreError::NotFound(name.to_string()));
        };
        let children = live_children(&mut tx, current.id).await?;
        if !children.is_empty() {
            let message = format!(
                "{name:?} is the parent of {}; delete or re-parent them first",
                children.join(", ")
            );
            return Err(StoreError::Conflict(ValidationError::new("name", message)));
        }
        rows::tombstone(&mut tx, name, epoch, unix_millis()).await?;
        tx.commit().await?;
        Ok(Written {
            id: current.id,
            epoch,
        })
    }
}

fn same_values(current: &Current, spec: &QuotaSpec, parent: Option<u64>) -> bool {
    current.parent == parent
        && current.limit == spec.limit
        && current.low_burst == spec.low()
        && current.high_burst == spec.high()
        && current.per_key == spec.per_key
        && current.window == spec.window
        && current.sliding == spec.sliding
}

async fn current_by_name(
    tx: &mut Transaction<'static, Any>,
    name: &str,
) -> Result<Option<Current>, StoreError> {
    let row = sqlx::query(
        r#"SELECT id, parent, "limit", low_burst, high_burst, epoch, deleted, per_key,
                  count_window, sliding
           FROM quotas WHERE name = $1"#,
    )
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Current {
        id: row.try_get::<i64, _>(0)? as u64,
        parent: row.try_get::<Option<i64>, _>(1)?.map(|p| p as u64),
        limit: row.try_get(2)?,
        low_burst: row.try_get(3)?,
        high_burst: row.try_get(4)?,
        epoch: row.try_get::<i64, _>(5)? as u64,
        deleted: row.try_get::<i64, _>(6)? != 0,
        per_key: row.try_get::<i64, _>(7)? != 0,
        window: row
            .try_get::<Option<String>, _>(8)?
            .and_then(|w| Window::parse(&w)),
        sliding: row.try_get::<i64, _>(9)? != 0,
    }))
}

/// The id of the live quota `name` as a parent: it must exist and not be
/// a per-key template.
async fn live_parent_id(tx: &mut Transaction<'static, Any>, name: &str) -> Result<u64, StoreError> {
    let row = sqlx::query("SELECT id, per_key FROM quotas WHERE name = $1 AND deleted = 0")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = row else {
        return Err(StoreError::invalid(
            "parent",
            format!("no quota named {name:?}"),
        ));
    };
    if row.try_get::<i64, _>(1)? != 0 {
        return Err(StoreError::Invalid {
            quota: None,
            error: template_as_parent(name),
        });
    }
    Ok(row.try_get::<i64, _>(0)? as u64)
}

/// Most children a conflict message lists.
const CHILDREN_LISTED: i64 = 10;

async fn live_children(
    tx: &mut Transaction<'static, Any>,
    id: u64,
) -> Result<Vec<String>, StoreError> {
    let names = sqlx::query_scalar(
        "SELECT name FROM quotas WHERE parent = $1 AND deleted = 0 ORDER BY name LIMIT $2",
    )
    .bind(id as i64)
    .bind(CHILDREN_LISTED)
    .fetch_all(&mut **tx)
    .await?;
    Ok(names)
}

/// Checks that `spec` under its parent keeps every chain acyclic and at
/// most [`MAX_DEPTH`] deep: the quota's own chain, and (for an existing
/// quota that moves) the chains of its whole subtree.
async fn check_placement(
    tx: &mut Transaction<'static, Any>,
    spec: &QuotaSpec,
    current: Option<&Current>,
) -> Result<(), StoreError> {
    let Some(parent) = spec.parent.as_deref() else {
        return Ok(());
    };
    let ancestors = ancestors(tx, parent).await?;
    let parent_of = |name: &&str| -> Option<&str> {
        if *name == spec.name {
            return Some(parent);
        }
        let at = ancestors.iter().position(|a| a == name)?;
        ancestors.get(at + 1).map(String::as_str)
    };
    let depth = validate_chain(&spec.name.as_str(), parent_of)
        .map_err(|error| StoreError::Invalid { quota: None, error })?;
    let Some(current) = current.filter(|c| !c.deleted) else {
        return Ok(());
    };
    let height = subtree_height(tx, current.id).await?;
    if depth + height - 1 > MAX_DEPTH {
        return Err(StoreError::invalid(
            "parent",
            format!(
                "under {parent:?}, {:?} would be {depth} deep and its subtree {height} more \
                 levels: deeper than {MAX_DEPTH}",
                spec.name
            ),
        ));
    }
    Ok(())
}

/// `name` and its ancestors, nearest first, at most `MAX_DEPTH + 2` of them
/// (enough to see a chain too deep).
async fn ancestors(
    tx: &mut Transaction<'static, Any>,
    name: &str,
) -> Result<Vec<String>, StoreError> {
    let names = sqlx::query_scalar(
        "WITH RECURSIVE up(name, parent, depth) AS ( \
             SELECT name, parent, 1 FROM quotas WHERE name = $1 AND deleted = 0 \
             UNION ALL \
             SELECT q.name, q.parent, up.depth + 1 FROM quotas q JOIN up ON q.id = up.parent \
             WHERE up.depth < $2 \
         ) SELECT name FROM up ORDER BY depth",
    )
    .bind(name)
    .bind((MAX_DEPTH + 2) as i64)
    .fetch_all(&mut **tx)
    .await?;
    Ok(names)
}

/// Levels in the live subtree of `id`, counting `id` itself (1 for a
/// leaf), looked at down to `MAX_DEPTH + 1` levels.
async fn subtree_height(tx: &mut Transaction<'static, Any>, id: u64) -> Result<usize, StoreError> {
    let height: Option<i64> = sqlx::query_scalar(
        "WITH RECURSIVE down(id, depth) AS ( \
             SELECT id, 1 FROM quotas WHERE id = $1 \
             UNION ALL \
             SELECT q.id, down.depth + 1 FROM quotas q JOIN down ON q.parent = down.id \
             WHERE q.deleted = 0 AND down.depth <= $2 \
         ) SELECT MAX(depth) FROM down",
    )
    .bind(id as i64)
    .bind(MAX_DEPTH as i64)
    .fetch_one(&mut **tx)
    .await?;
    Ok(height.unwrap_or(1).max(1) as usize)
}
