//! Bulk apply: a whole quota set in one transaction and one epoch.
//!
//! The set is merged with the live quotas (with `prune`, the set replaces
//! them: live quotas missing from it are deleted), the merged result is
//! validated as a whole with [`QuotaSet::new`] (names, numbers, parents,
//! cycles, depth), and the difference is written, or only reported for a
//! dry run. Nothing is written unless everything is valid.
//!
//! Writes go parents first: new quotas level by level (so a new parent has
//! a smaller id than its new children and exists when they are inserted),
//! then updates and revivals, then deletions.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use sqlx::{Any, Transaction};

use crate::core::key::KeyHash;
use crate::core::spec::{QuotaSet, QuotaSpec, SpecError};
use crate::core::Window;

use super::overrides::{
    check_overrides_fit, drop_overrides_of, overrides_to_write, write_overrides,
};
use super::rows::{self, StoredRow};
use super::{unix_millis, Store, StoreError};

/// Options of an apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Delete live quotas that are not in the set.
    pub prune: bool,
    /// Report the difference without writing it.
    pub dry_run: bool,
}

/// One field an apply changes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldChange {
    /// `parent`, `per_key`, `window`, `sliding`, `limit`, `low_burst` or
    /// `high_burst`.
    pub field: &'static str,
    /// The value before.
    pub from: serde_json::Value,
    /// The value after.
    pub to: serde_json::Value,
}

/// A quota an apply changes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QuotaUpdate {
    /// The quota's name.
    pub name: String,
    /// What changes.
    pub changes: Vec<FieldChange>,
}

/// The difference between the live quotas and a set.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ApplyDiff {
    /// Quotas the set adds (or revives), parents first.
    pub created: Vec<String>,
    /// Quotas the set changes.
    pub updated: Vec<QuotaUpdate>,
    /// Live quotas deleted because the set lacks them (prune only).
    pub deleted: Vec<String>,
    /// Quotas in the set that already match.
    pub unchanged: usize,
    /// Overrides the set's templates list that are new or differ
    /// (`template/key_hash`); overrides it does not list are kept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
}

impl ApplyDiff {
    /// True when applying changes nothing.
    pub fn is_empty(&self) -> bool {
        self.created.is_empty()
            && self.updated.is_empty()
            && self.deleted.is_empty()
            && self.overrides.is_empty()
    }
}

/// What an apply did (or would do).
#[derive(Clone, Debug, PartialEq)]
pub struct ApplyOutcome {
    /// The difference.
    pub diff: ApplyDiff,
    /// The epoch the changes got; `None` for a dry run or an empty diff.
    pub epoch: Option<u64>,
}

/// Rows per multi-row INSERT (ten parameters each). Binding slows down
/// more than linearly with the parameter count on SQLite: 100k quotas take
/// 1.0 s in chunks of 50 rows, 2.2 s in chunks of 200 and 8.8 s in chunks
/// of 1000.
const INSERT_CHUNK: usize = 50;

impl Store {
    /// Applies a quota set in one transaction; see the module doc.
    pub async fn apply(
        &self,
        set: Vec<QuotaSpec>,
        options: ApplyOptions,
    ) -> Result<ApplyOutcome, StoreError> {
        self.bounded("the apply", self.apply_now(set, options))
            .await
    }

    async fn apply_now(
        &self,
        set: Vec<QuotaSpec>,
        options: ApplyOptions,
    ) -> Result<ApplyOutcome, StoreError> {
        check_set_alone(&set, options.prune)?;
        let (mut tx, epoch) = self.begin_write().await?;
        let existing = load_all(&mut tx).await?;
        let merged = merge(&set, &existing, options.prune);
        let depths = validate_merged(merged)?;
        let mut diff = diff(&set, &existing, options.prune, &depths);
        let overrides = overrides_to_write(&mut tx, &set, &existing).await?;
        check_kept_overrides(&mut tx, &set, &existing).await?;
        diff.overrides = overrides.iter().map(|o| o.label.clone()).collect();
        if options.dry_run || diff.is_empty() {
            tx.rollback().await?;
            return Ok(ApplyOutcome { diff, epoch: None });
        }
        write_diff(&mut tx, &set, &existing, &diff, &depths, epoch).await?;
        write_overrides(&mut tx, &overrides, epoch).await?;
        self.commit_write(tx, epoch).await?;
        Ok(ApplyOutcome {
            diff,
            epoch: Some(epoch),
        })
    }
}

/// Checks, for each template of `set` that changes kind, that the
/// overrides it keeps (those the set does not list) fit the new kind.
async fn check_kept_overrides(
    tx: &mut Transaction<'static, Any>,
    set: &[QuotaSpec],
    existing: &HashMap<String, StoredRow>,
) -> Result<(), StoreError> {
    for spec in set.iter().filter(|s| s.per_key) {
        let Some(row) = existing.get(&spec.name) else {
            continue;
        };
        if row.deleted || !row.spec.per_key || row.spec.kind() == spec.kind() {
            continue;
        }
        let listed: HashSet<KeyHash> = spec
            .validate_overrides()
            .map_err(|error| StoreError::Invalid {
                quota: Some(spec.name.clone()),
                error,
            })?
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        check_overrides_fit(tx, row.id, &spec.name, spec.kind(), &listed).await?;
    }
    Ok(())
}

/// Checks what needs no database: each quota on its own, unique names,
/// and for a pruning apply the whole set (it must stand alone).
fn check_set_alone(set: &[QuotaSpec], prune: bool) -> Result<(), StoreError> {
    if prune {
        return QuotaSet::new(set.to_vec()).map(|_| ()).map_err(spec_error);
    }
    let mut names = HashMap::with_capacity(set.len());
    for spec in set {
        spec.validate().map_err(|error| StoreError::Invalid {
            quota: Some(spec.name.clone()),
            error,
        })?;
        if names.insert(spec.name.as_str(), ()).is_some() {
            return Err(StoreError::Invalid {
                quota: Some(spec.name.clone()),
                error: crate::core::ValidationError::new("name", "appears more than once"),
            });
        }
    }
    Ok(())
}

fn spec_error(error: SpecError) -> StoreError {
    match error {
        SpecError::Invalid { name, error } => StoreError::Invalid {
            quota: Some(name),
            error,
        },
        SpecError::Parse(e) => StoreError::invalid("quotas", e.to_string()),
    }
}

/// Every row by name, tombstones included.
async fn load_all(
    tx: &mut Transaction<'static, Any>,
) -> Result<HashMap<String, StoredRow>, StoreError> {
    let rows = rows::all(tx).await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.spec.name.clone(), row))
        .collect())
}

/// The live quotas as they will be after the apply.
fn merge(set: &[QuotaSpec], existing: &HashMap<String, StoredRow>, prune: bool) -> Vec<QuotaSpec> {
    let mut merged = set.to_vec();
    if !prune {
        let in_set: HashMap<&str, ()> = set.iter().map(|q| (q.name.as_str(), ())).collect();
        merged.extend(
            existing
                .values()
                .filter(|e| !e.deleted && !in_set.contains_key(e.spec.name.as_str()))
                .map(|e| e.spec.clone()),
        );
    }
    merged
}

/// Validates the merged quotas as one set and returns each one's depth
/// (1 for a top-level quota).
fn validate_merged(merged: Vec<QuotaSpec>) -> Result<HashMap<String, usize>, StoreError> {
    let set = QuotaSet::new(merged).map_err(spec_error)?;
    let parent_of: HashMap<&str, Option<&str>> = set
        .quotas
        .iter()
        .map(|q| (q.name.as_str(), q.parent.as_deref()))
        .collect();
    let mut depths = HashMap::with_capacity(set.quotas.len());
    for q in &set.quotas {
        let mut depth = 1;
        let mut cur = q.parent.as_deref();
        while let Some(name) = cur {
            depth += 1;
            cur = parent_of.get(name).copied().flatten();
        }
        depths.insert(q.name.clone(), depth);
    }
    Ok(depths)
}

fn diff(
    set: &[QuotaSpec],
    existing: &HashMap<String, StoredRow>,
    prune: bool,
    depths: &HashMap<String, usize>,
) -> ApplyDiff {
    let mut diff = ApplyDiff::default();
    let mut created: Vec<(usize, &str)> = Vec::new();
    for spec in set {
        match existing.get(&spec.name).filter(|e| !e.deleted) {
            None => created.push((depths.get(&spec.name).copied().unwrap_or(1), &spec.name)),
            Some(current) => {
                let changes = field_changes(&current.spec, spec);
                if changes.is_empty() {
                    diff.unchanged += 1;
                } else {
                    diff.updated.push(QuotaUpdate {
                        name: spec.name.clone(),
                        changes,
                    });
                }
            }
        }
    }
    created.sort_by_key(|&(depth, _)| depth);
    diff.created = created
        .into_iter()
        .map(|(_, name)| name.to_string())
        .collect();
    if prune {
        let in_set: HashMap<&str, ()> = set.iter().map(|q| (q.name.as_str(), ())).collect();
        let mut deleted: Vec<String> = existing
            .values()
            .filter(|e| !e.deleted && !in_set.contains_key(e.spec.name.as_str()))
            .map(|e| e.spec.name.clone())
            .collect();
        deleted.sort();
        diff.deleted = deleted;
    }
    diff
}

fn field_changes(current: &QuotaSpec, wanted: &QuotaSpec) -> Vec<FieldChange> {
    let mut changes = Vec::new();
    if current.parent != wanted.parent {
        changes.push(FieldChange {
            field: "parent",
            from: current.parent.clone().into(),
            to: wanted.parent.clone().into(),
        });
    }
    let flags = [
        ("per_key", current.per_key, wanted.per_key),
        ("sliding", current.sliding, wanted.sliding),
        ("in_flight", current.in_flight, wanted.in_flight),
    ];
    for (field, from, to) in flags {
        if from != to {
            changes.push(FieldChange {
                field,
                from: from.into(),
                to: to.into(),
            });
        }
    }
    if current.penalty != wanted.penalty {
        changes.push(FieldChange {
            field: "penalty",
            from: current.penalty.map(|p| p.to_string()).into(),
            to: wanted.penalty.map(|p| p.to_string()).into(),
        });
    }
    if current.window != wanted.window {
        changes.push(FieldChange {
            field: "window",
            from: current.window.map(Window::name).into(),
            to: wanted.window.map(Window::name).into(),
        });
    }
    let numbers = [
        ("limit", current.limit, wanted.limit),
        ("low_burst", current.low(), wanted.low()),
        ("high_burst", current.high(), wanted.high()),
    ];
    for (field, from, to) in numbers {
        if from != to {
            changes.push(FieldChange {
                field,
                from: from.into(),
                to: to.into(),
            });
        }
    }
    changes
}

async fn write_diff(
    tx: &mut Transaction<'static, Any>,
    set: &[QuotaSpec],
    existing: &HashMap<String, StoredRow>,
    diff: &ApplyDiff,
    depths: &HashMap<String, usize>,
    epoch: u64,
) -> Result<(), StoreError> {
    let now = unix_millis();
    let by_name: HashMap<&str, &QuotaSpec> = set.iter().map(|q| (q.name.as_str(), q)).collect();
    let mut new_by_depth: BTreeMap<usize, Vec<&QuotaSpec>> = BTreeMap::new();
    let mut rewrites: Vec<&QuotaSpec> = Vec::new();
    for name in &diff.created {
        let spec = by_name[name.as_str()];
        if existing.contains_key(name) {
            rewrites.push(spec);
        } else {
            new_by_depth
                .entry(depths.get(name).copied().unwrap_or(1))
                .or_default()
                .push(spec);
        }
    }
    for level in new_by_depth.values() {
        for chunk in level.chunks(INSERT_CHUNK) {
            rows::insert(tx, chunk, epoch, now).await?;
        }
    }
    rewrites.extend(diff.updated.iter().map(|u| by_name[u.name.as_str()]));
    for spec in rewrites {
        rows::rewrite(tx, spec, epoch, now).await?;
        if let Some(row) = existing.get(&spec.name) {
            if row.spec.per_key && !spec.per_key {
                drop_overrides_of(tx, row.id, epoch, now).await?;
            }
        }
    }
    for name in &diff.deleted {
        rows::tombstone(tx, name, epoch, now).await?;
        if let Some(row) = existing.get(name) {
            drop_overrides_of(tx, row.id, epoch, now).await?;
        }
    }
    Ok(())
}
