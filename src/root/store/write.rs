//! Single-quota writes: put (create or replace), patch (change some
//! fields) and delete.
//!
//! Each runs in one write transaction that first takes the next epoch (see
//! the module doc of `store`), then checks the change against the quotas
//! as they are inside that transaction, so concurrent writers through
//! other roots cannot slip a cycle or a too-deep chain past the check, and
//! a patch merges into the row as it is, not as some reader saw it.

use std::collections::HashSet;

use sqlx::{Any, Row, Transaction};

use crate::core::quota::in_flight_as_parent;
use crate::core::quota::{validate_chain, MAX_DEPTH};
use crate::core::spec::{template_as_parent, QuotaPatch, QuotaSpec};
use crate::core::ValidationError;

use super::overrides::{check_overrides_fit, drop_overrides_of};
use super::rows::{self, StoredRow};
use super::{unix_millis, Store, StoreError};

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

/// What a write expects to find, so that two editors do not overwrite
/// each other unseen: HTTP's `If-Match` (the quota's epoch is its
/// version) and `If-None-Match: *`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Expect {
    /// Write whatever is there.
    #[default]
    Anything,
    /// A live quota of that name (`If-Match: *`).
    Exists,
    /// No live quota of that name (`If-None-Match: *`).
    Absent,
    /// A live quota last changed at one of these epochs
    /// (`If-Match: "12"`).
    Epoch(Vec<u64>),
}

impl Expect {
    /// Checks `what` (`quota "q"`, `the override of key ... on "t"`) as
    /// the write finds it inside its transaction: `Some(epoch)` when it
    /// exists (live). Of writers that read one version, the first to
    /// commit moves the epoch, and the others fail here.
    pub(super) fn check(&self, what: &str, live: Option<u64>) -> Result<(), StoreError> {
        let met = match (self, live) {
            (Self::Anything, _) | (Self::Exists, Some(_)) | (Self::Absent, None) => true,
            (Self::Epoch(epochs), Some(epoch)) => epochs.contains(&epoch),
            _ => false,
        };
        if met {
            return Ok(());
        }
        let now = match live {
            Some(epoch) => format!("it is at epoch {epoch}"),
            None => "it does not exist".to_string(),
        };
        let (field, wanted) = match self {
            Self::Absent => ("If-None-Match", format!("no {what}")),
            Self::Epoch(epochs) => {
                let epochs: Vec<String> = epochs.iter().map(u64::to_string).collect();
                (
                    "If-Match",
                    format!("{what} at epoch {}", epochs.join(" or ")),
                )
            }
            _ => ("If-Match", format!("an existing {what}")),
        };
        Err(StoreError::Precondition(ValidationError::new(
            field,
            format!("expected {wanted}, but {now}: it changed since it was read; read it again"),
        )))
    }

    /// Checks a write to what does not exist: a 412 when a version was
    /// expected, else `missing` (a 404).
    pub(super) fn check_missing(&self, what: &str, missing: StoreError) -> StoreError {
        self.check(what, None).err().unwrap_or(missing)
    }
}

/// How a precondition names a quota.
fn quota_named(name: &str) -> String {
    format!("quota named {name:?}")
}

impl Store {
    /// Creates or replaces the quota `spec.name` (a deleted one is revived
    /// with its old id): every field takes the value in `spec`, defaults
    /// included. The parent must be a live quota, the chain acyclic and,
    /// counting the quota's own subtree, at most [`MAX_DEPTH`] deep.
    pub async fn put(&self, spec: &QuotaSpec) -> Result<PutOutcome, StoreError> {
        self.put_if(spec, &Expect::Anything).await
    }

    /// [`Self::put`] if the quota is as `expect` says.
    pub async fn put_if(
        &self,
        spec: &QuotaSpec,
        expect: &Expect,
    ) -> Result<PutOutcome, StoreError> {
        self.bounded("the write", self.put_now(spec, expect)).await
    }

    async fn put_now(&self, spec: &QuotaSpec, expect: &Expect) -> Result<PutOutcome, StoreError> {
        spec.validate()
            .map_err(|error| StoreError::Invalid { quota: None, error })?;
        if !spec.overrides.is_empty() {
            return Err(StoreError::invalid(
                "overrides",
                "a quota's overrides are written one by one at \
                 /v1/quotas/{name}/overrides/{key_hash}",
            ));
        }
        let (mut tx, epoch) = self.begin_write().await?;
        let current = rows::by_name(&mut tx, &spec.name).await?;
        let live = current.as_ref().filter(|c| !c.deleted).map(|c| c.epoch);
        expect.check(&quota_named(&spec.name), live)?;
        self.write_spec(tx, epoch, spec, current).await
    }

    /// Changes the fields `patch` names of the live quota `name` and keeps
    /// the others; the merged quota is checked as a put checks one.
    pub async fn patch(
        &self,
        name: &str,
        patch: &QuotaPatch,
        expect: &Expect,
    ) -> Result<PutOutcome, StoreError> {
        self.bounded("the write", self.patch_now(name, patch, expect))
            .await
    }

    async fn patch_now(
        &self,
        name: &str,
        patch: &QuotaPatch,
        expect: &Expect,
    ) -> Result<PutOutcome, StoreError> {
        let (mut tx, epoch) = self.begin_write().await?;
        let what = quota_named(name);
        let current = rows::by_name(&mut tx, name)
            .await?
            .filter(|c| !c.deleted)
            .ok_or_else(|| expect.check_missing(&what, StoreError::NotFound(name.to_string())))?;
        expect.check(&what, Some(current.epoch))?;
        let spec = patch.applied_to(&current.spec);
        spec.validate()
            .map_err(|error| StoreError::Invalid { quota: None, error })?;
        self.write_spec(tx, epoch, &spec, Some(current)).await
    }

    /// Writes a valid `spec` over `current` (its row, if any) at `epoch`
    /// after the checks that need the other quotas; commits unless nothing
    /// changes.
    async fn write_spec(
        &self,
        mut tx: Transaction<'static, Any>,
        epoch: u64,
        spec: &QuotaSpec,
        current: Option<StoredRow>,
    ) -> Result<PutOutcome, StoreError> {
        if let Some(parent) = &spec.parent {
            check_parent(&mut tx, parent).await?;
        }
        check_placement(&mut tx, spec, current.as_ref()).await?;
        let childless = [
            (spec.per_key, "per_key", "a per-key template"),
            (spec.in_flight, "in_flight", "an in-flight quota"),
        ];
        for (field, what) in childless.iter().filter(|c| c.0).map(|c| (c.1, c.2)) {
            let Some(c) = current.as_ref().filter(|c| !c.deleted) else {
                break;
            };
            let children = live_children(&mut tx, c.id).await?;
            if !children.is_empty() {
                let message = format!(
                    "{:?} is the parent of {}; {what} cannot be a parent",
                    spec.name,
                    children.join(", ")
                );
                return Err(StoreError::Conflict(ValidationError::new(field, message)));
            }
        }
        if let Some(c) = current.as_ref().filter(|c| !c.deleted && c.spec.per_key) {
            if spec.per_key && c.spec.kind() != spec.kind() {
                check_overrides_fit(&mut tx, c.id, &spec.name, spec.kind(), &HashSet::new())
                    .await?;
            }
        }
        let now = unix_millis();
        let outcome = match current {
            Some(c) if !c.deleted && same_values(&c.spec, spec) => {
                tx.rollback().await?;
                return Ok(PutOutcome::Unchanged {
                    id: c.id,
                    epoch: c.epoch,
                });
            }
            Some(c) => {
                rows::rewrite(&mut tx, spec, epoch, now).await?;
                if c.spec.per_key && !spec.per_key {
                    // A plain quota has no keys to override.
                    drop_overrides_of(&mut tx, c.id, epoch, now).await?;
                }
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
        self.commit_write(tx, epoch).await?;
        Ok(outcome)
    }

    /// Deletes a live quota, leaving a tombstone. A quota with live
    /// children is not deleted: [`StoreError::Conflict`] names them.
    pub async fn delete(&self, name: &str, expect: &Expect) -> Result<Written, StoreError> {
        self.bounded("the delete", self.delete_now(name, expect))
            .await
    }

    async fn delete_now(&self, name: &str, expect: &Expect) -> Result<Written, StoreError> {
        let (mut tx, epoch) = self.begin_write().await?;
        let what = quota_named(name);
        let current = rows::by_name(&mut tx, name).await?;
        let Some(current) = current.filter(|c| !c.deleted) else {
            return Err(expect.check_missing(&what, StoreError::NotFound(name.to_string())));
        };
        expect.check(&what, Some(current.epoch))?;
        let children = live_children(&mut tx, current.id).await?;
        if !children.is_empty() {
            let message = format!(
                "{name:?} is the parent of {}; delete or re-parent them first",
                children.join(", ")
            );
            return Err(StoreError::Conflict(ValidationError::new("name", message)));
        }
        let now = unix_millis();
        rows::tombstone(&mut tx, name, epoch, now).await?;
        drop_overrides_of(&mut tx, current.id, epoch, now).await?;
        self.commit_write(tx, epoch).await?;
        Ok(Written {
            id: current.id,
            epoch,
        })
    }
}

/// The stored quota has `spec`'s values (bursts compared with their
/// defaults applied, as they are stored).
fn same_values(current: &QuotaSpec, spec: &QuotaSpec) -> bool {
    current.parent == spec.parent
        && current.limit == spec.limit
        && current.low() == spec.low()
        && current.high() == spec.high()
        && current.per_key == spec.per_key
        && current.window == spec.window
        && current.sliding == spec.sliding
        && current.penalty == spec.penalty
        && current.in_flight == spec.in_flight
}

/// Checks that the quota `name` may be a parent: it exists, live, and is
/// not a per-key template nor an in-flight quota.
async fn check_parent(tx: &mut Transaction<'static, Any>, name: &str) -> Result<(), StoreError> {
    let row = sqlx::query("SELECT per_key, in_flight FROM quotas WHERE name = $1 AND deleted = 0")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = row else {
        return Err(StoreError::invalid(
            "parent",
            format!("no quota named {name:?}"),
        ));
    };
    if row.try_get::<i64, _>(0)? != 0 {
        return Err(StoreError::Invalid {
            quota: None,
            error: template_as_parent(name),
        });
    }
    if row.try_get::<i64, _>(1)? != 0 {
        return Err(StoreError::Invalid {
            quota: None,
            error: in_flight_as_parent(name),
        });
    }
    Ok(())
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
    current: Option<&StoredRow>,
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
