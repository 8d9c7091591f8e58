//! Overrides of per-key templates: their rows, their writes (put, patch,
//! delete, expiry) and the reload's read by epoch.
//!
//! An override is a row of `overrides` keyed by `(quota, key_hash)`,
//! written in a transaction that takes the next epoch from `meta` like
//! every quota write, so limiters page through overrides by `(epoch, id)`
//! exactly as through quotas. Removing one, or its expiry, leaves a
//! tombstone with a new epoch; deleting a template (or making it a plain
//! quota) tombstones its overrides in the same transaction.

use std::collections::HashSet;

use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use crate::core::key::{format_hash, KeyHash};
use crate::core::quota::Kind;
use crate::core::tier::{parse_key_hash, Override, OverrideSpec, Rule};
use crate::core::{ValidationError, Window};
use crate::wire::QuotaCursor;

use super::{unix_millis, Expect, Store, StoreError};

/// An override as the root holds it: what limiters get, and the note
/// that stays at the roots.
#[derive(Clone, Debug, PartialEq)]
pub struct OverrideRow {
    /// The override.
    pub ov: Override,
    /// The operators' note.
    pub note: Option<String>,
    /// Last change, Unix milliseconds.
    pub updated_ms: i64,
}

/// An override row as read by a reload: valid, or where it is and why
/// not (a hand-edited row), which the reload skips.
pub type StoredOverride = Result<OverrideRow, (QuotaCursor, String)>;

/// What an override write did.
#[derive(Clone, Debug, PartialEq)]
pub enum OverrideOutcome {
    /// A new override (or a removed one back).
    Created(OverrideRow),
    /// An existing one changed.
    Updated(OverrideRow),
    /// It already was exactly so; no epoch was taken.
    Unchanged(OverrideRow),
}

impl OverrideOutcome {
    /// The override as it is now.
    pub fn row(&self) -> &OverrideRow {
        match self {
            Self::Created(row) | Self::Updated(row) | Self::Unchanged(row) => row,
        }
    }
}

/// The columns an override query selects, in [`override_from_row`]'s
/// order.
const COLUMNS: &str = r#"id, quota, key_hash, kind, "limit", low_burst, high_burst, note,
    expires_at, epoch, deleted, updated_at"#;

impl Store {
    /// Up to `limit` overrides after `after` in `(epoch, id)` order,
    /// tombstones included (see [`Store::load_after`]).
    pub async fn load_overrides_after(
        &self,
        after: QuotaCursor,
        limit: usize,
    ) -> Result<Vec<StoredOverride>, StoreError> {
        self.bounded("reading overrides", async {
            let rows = self.rows_after("overrides", COLUMNS, after, limit).await?;
            rows.iter().map(override_from_row).collect()
        })
        .await
    }

    /// Creates or replaces the override of `key` on the per-key template
    /// `template`, if it is as `expect` says: every field takes `spec`'s
    /// value (no expiry, no note when it gives none). `now_ms` counts a
    /// relative expiry.
    pub async fn put_override(
        &self,
        template: &str,
        key: KeyHash,
        spec: &OverrideSpec,
        now_ms: i64,
        expect: &Expect,
    ) -> Result<OverrideOutcome, StoreError> {
        let rule = spec.rule().map_err(invalid)?;
        let note = spec.checked_note().map_err(invalid)?;
        let expires = spec.expires_ms(now_ms).map_err(invalid)?;
        check_body_key(spec, key)?;
        self.bounded("the write", async {
            let (mut tx, epoch) = self.begin_write().await?;
            let (quota, kind) = template_and_kind(&mut tx, template).await?;
            rule.validate_for(kind).map_err(invalid)?;
            let current = by_key(&mut tx, quota, key).await?;
            let live = current.as_ref().filter(|c| !c.ov.deleted);
            expect.check(&override_of(template, key), live.map(|c| c.ov.epoch))?;
            self.write_override(tx, epoch, quota, key, current, rule, note, expires)
                .await
        })
        .await
    }

    /// Changes the fields `spec` gives of the live override of `key`, if
    /// it is as `expect` says: numbers merge into a `limit` override's (a
    /// bare `low_burst` keeps the limit), `allow`/`deny` replace the rule,
    /// a `note` (empty: none) and `expires` (`"never"`: none) replace
    /// theirs.
    pub async fn patch_override(
        &self,
        template: &str,
        key: KeyHash,
        spec: &OverrideSpec,
        now_ms: i64,
        expect: &Expect,
    ) -> Result<OverrideOutcome, StoreError> {
        check_body_key(spec, key)?;
        let note = spec.checked_note().map_err(invalid)?;
        let expires = match spec.expires.as_deref() {
            Some("never") => Some(None),
            Some(_) => Some(spec.expires_ms(now_ms).map_err(invalid)?),
            None => None,
        };
        self.bounded("the write", async {
            let (mut tx, epoch) = self.begin_write().await?;
            let (quota, kind) = template_and_kind(&mut tx, template).await?;
            let current = live_override(&mut tx, template, quota, key, expect).await?;
            let rule = merged_rule(&current.ov.rule, spec).map_err(invalid)?;
            rule.validate_for(kind).map_err(invalid)?;
            let note = match note {
                Some(text) if text.is_empty() => None,
                Some(text) => Some(text),
                None => current.note.clone(),
            };
            let expires = expires.unwrap_or(current.ov.expires_ms);
            self.write_override(tx, epoch, quota, key, Some(current), rule, note, expires)
                .await
        })
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_override(
        &self,
        mut tx: Transaction<'static, Any>,
        epoch: u64,
        quota: u64,
        key: KeyHash,
        current: Option<OverrideRow>,
        rule: Rule,
        note: Option<String>,
        expires_ms: Option<i64>,
    ) -> Result<OverrideOutcome, StoreError> {
        let now = unix_millis();
        if let Some(c) = current.as_ref().filter(|c| !c.ov.deleted) {
            if c.ov.rule == rule && c.note == note && c.ov.expires_ms == expires_ms {
                tx.rollback().await?;
                return Ok(OverrideOutcome::Unchanged(c.clone()));
            }
        }
        let written = OverrideWrite {
            quota,
            key,
            rule,
            note: Note::Set(note.as_deref()),
            expires_ms,
            epoch,
            now,
        };
        let id = upsert_override(&mut tx, &written).await?;
        self.commit_write(tx, epoch).await?;
        let row = OverrideRow {
            ov: Override {
                id: id as u64,
                quota,
                key,
                rule,
                expires_ms,
                epoch,
                deleted: false,
            },
            note,
            updated_ms: now,
        };
        Ok(match current {
            Some(c) if !c.ov.deleted => OverrideOutcome::Updated(row),
            _ => OverrideOutcome::Created(row),
        })
    }

    /// Removes the override of `key` on `template`, if it is as `expect`
    /// says, leaving a tombstone; returns the epoch it got.
    pub async fn delete_override(
        &self,
        template: &str,
        key: KeyHash,
        expect: &Expect,
    ) -> Result<u64, StoreError> {
        self.bounded("the delete", async {
            let (mut tx, epoch) = self.begin_write().await?;
            let quota = template_id(&mut tx, template).await?;
            let current = live_override(&mut tx, template, quota, key, expect).await?;
            sqlx::query(
                "UPDATE overrides SET deleted = 1, epoch = $1, updated_at = $2 WHERE id = $3",
            )
            .bind(epoch as i64)
            .bind(unix_millis())
            .bind(current.ov.id as i64)
            .execute(&mut *tx)
            .await?;
            self.commit_write(tx, epoch).await?;
            Ok(epoch)
        })
        .await
    }

    /// Tombstones every live override that expired by `now_ms`, in one
    /// transaction; returns how many (0 takes no epoch). Several roots
    /// may run it at once: the second finds nothing left.
    pub async fn expire_overrides(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.bounded("expiring overrides", async {
            let (mut tx, epoch) = self.begin_write().await?;
            let done = sqlx::query(
                "UPDATE overrides SET deleted = 1, epoch = $1, updated_at = $2 \
                 WHERE deleted = 0 AND expires_at IS NOT NULL AND expires_at <= $3",
            )
            .bind(epoch as i64)
            .bind(unix_millis())
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if done == 0 {
                tx.rollback().await?;
                return Ok(0);
            }
            self.commit_write(tx, epoch).await?;
            Ok(done)
        })
        .await
    }
}

/// Tombstones the live overrides of quota `id` at `epoch` (its template
/// was deleted, or became a plain quota).
pub(super) async fn drop_overrides_of(
    tx: &mut Transaction<'static, Any>,
    id: u64,
    epoch: u64,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE overrides SET deleted = 1, epoch = $1, updated_at = $2 WHERE quota = $3 AND deleted = 0")
        .bind(epoch as i64)
        .bind(now)
        .bind(id as i64)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// An override a quota file's template lists that is new or differs from
/// the one stored.
#[derive(Clone, Debug)]
pub(super) struct FileOverride {
    /// The template's name.
    template: String,
    /// The key.
    key: KeyHash,
    /// What it does.
    rule: Rule,
    /// `template/key_hash`, for the apply's report.
    pub(super) label: String,
}

/// Checks that the live overrides of template `id` (named `name`) have
/// numbers a quota of `kind` may have, before the template becomes one:
/// a conflict names the first key whose override does not, unless the
/// same write replaces it (`replaced`).
pub(super) async fn check_overrides_fit(
    tx: &mut Transaction<'static, Any>,
    id: u64,
    name: &str,
    kind: Kind,
    replaced: &HashSet<KeyHash>,
) -> Result<(), StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM overrides WHERE quota = $1 AND deleted = 0");
    let rows = sqlx::query(&sql)
        .bind(id as i64)
        .fetch_all(&mut **tx)
        .await?;
    for row in &rows {
        let Ok(row) = override_from_row(row)? else {
            continue; // a hand-edited row the reload skips anyway
        };
        if replaced.contains(&row.ov.key) {
            continue;
        }
        if let Err(e) = row.ov.rule.validate_for(kind) {
            let message = format!(
                "the override of key {} on {name:?} has numbers this kind of quota cannot \
                 have ({}: {}); change or remove the override first",
                format_hash(row.ov.key),
                e.field,
                e.message
            );
            return Err(StoreError::Conflict(ValidationError::new(
                "overrides",
                message,
            )));
        }
    }
    Ok(())
}

/// The overrides `set`'s templates list that are new or differ from the
/// live ones (`existing` has the rows of the quotas before the apply).
pub(super) async fn overrides_to_write(
    tx: &mut Transaction<'static, Any>,
    set: &[crate::core::spec::QuotaSpec],
    existing: &std::collections::HashMap<String, super::rows::StoredRow>,
) -> Result<Vec<FileOverride>, StoreError> {
    let mut out = Vec::new();
    for spec in set.iter().filter(|s| !s.overrides.is_empty()) {
        let listed = spec
            .validate_overrides()
            .map_err(|error| StoreError::Invalid {
                quota: Some(spec.name.clone()),
                error,
            })?;
        let quota = existing
            .get(&spec.name)
            .filter(|row| !row.deleted && row.spec.per_key)
            .map(|row| row.id);
        for (key, rule) in listed {
            let current = match quota {
                Some(id) => by_key(tx, id, key).await?.filter(|c| !c.ov.deleted),
                None => None,
            };
            let same = current.is_some_and(|c| c.ov.rule == rule && c.ov.expires_ms.is_none());
            if !same {
                out.push(FileOverride {
                    template: spec.name.clone(),
                    key,
                    rule,
                    label: format!("{}/{}", spec.name, format_hash(key)),
                });
            }
        }
    }
    Ok(out)
}

/// Writes an apply's overrides at `epoch`, after its quotas (so a new
/// template has its id): each replaces the key's override, note kept.
pub(super) async fn write_overrides(
    tx: &mut Transaction<'static, Any>,
    overrides: &[FileOverride],
    epoch: u64,
) -> Result<(), StoreError> {
    let now = unix_millis();
    for o in overrides {
        let quota = template_id(tx, &o.template).await?;
        let written = OverrideWrite {
            quota,
            key: o.key,
            rule: o.rule,
            note: Note::Kept,
            expires_ms: None,
            epoch,
            now,
        };
        upsert_override(tx, &written).await?;
    }
    Ok(())
}

/// The note an override write leaves.
enum Note<'a> {
    /// This one (`None`: no note).
    Set(Option<&'a str>),
    /// The note the key's override has (none for a new one): a quota
    /// file's overrides carry no note, and an apply keeps the operator's.
    Kept,
}

/// One override as a write leaves it.
struct OverrideWrite<'a> {
    quota: u64,
    key: KeyHash,
    rule: Rule,
    note: Note<'a>,
    expires_ms: Option<i64>,
    epoch: u64,
    now: i64,
}

/// Creates or replaces (a tombstone included) the override of
/// `w.key` on `w.quota`: the one statement every override write goes
/// through. Returns the row's id.
async fn upsert_override(
    tx: &mut Transaction<'static, Any>,
    w: &OverrideWrite<'_>,
) -> Result<i64, StoreError> {
    let (limit, low, high) = rule_numbers(w.rule);
    let (note, note_on_update) = match w.note {
        Note::Set(note) => (note, "$7"),
        Note::Kept => (None, "overrides.note"),
    };
    let sql = format!(
        r#"INSERT INTO overrides (quota, key_hash, kind, "limit", low_burst, high_burst,
           note, expires_at, epoch, deleted, created_at, updated_at)
           VALUES ($1, $2, $3, CASE WHEN $3 = 'limit' THEN $4 END,
           CASE WHEN $3 = 'limit' THEN $5 END, CASE WHEN $3 = 'limit' THEN $6 END,
           $7, $8, $9, 0, $10, $10)
           ON CONFLICT (quota, key_hash) DO UPDATE SET kind = $3,
           "limit" = CASE WHEN $3 = 'limit' THEN $4 END,
           low_burst = CASE WHEN $3 = 'limit' THEN $5 END,
           high_burst = CASE WHEN $3 = 'limit' THEN $6 END,
           note = {note_on_update}, expires_at = $8, epoch = $9, deleted = 0,
           updated_at = $10
           RETURNING id"#
    );
    let id = sqlx::query_scalar(&sql)
        .bind(w.quota as i64)
        .bind(format_hash(w.key))
        .bind(w.rule.kind())
        .bind(limit)
        .bind(low)
        .bind(high)
        .bind(note)
        .bind(w.expires_ms)
        .bind(w.epoch as i64)
        .bind(w.now)
        .fetch_one(&mut **tx)
        .await?;
    Ok(id)
}

/// The numbers columns of a rule, bound as numbers always: the SQL
/// stores NULL for allow and deny (`CASE WHEN kind = 'limit'`). A `None`
/// would be bound through sqlx's Any driver (0.8) as a `real` NULL on
/// PostgreSQL, and a statement prepared with it then refuses a
/// `double precision` value ("incorrect binary data format").
fn rule_numbers(rule: Rule) -> (f64, f64, f64) {
    match rule {
        Rule::Limit {
            limit,
            low_burst,
            high_burst,
        } => (limit, low_burst, high_burst),
        Rule::Allow | Rule::Deny => (0.0, 0.0, 0.0),
    }
}

fn invalid(error: ValidationError) -> StoreError {
    StoreError::Invalid { quota: None, error }
}

/// A body may repeat the path's key hash, not name another.
fn check_body_key(spec: &OverrideSpec, key: KeyHash) -> Result<(), StoreError> {
    match spec.key_hash.as_deref() {
        Some(text) if parse_key_hash(text).ok() != Some(key) => Err(StoreError::invalid(
            "key_hash",
            format!("{text:?} is not the path's key hash {}", format_hash(key)),
        )),
        _ => Ok(()),
    }
}

fn no_override(template: &str, key: KeyHash) -> StoreError {
    StoreError::NoOverride(template.to_string(), format_hash(key))
}

/// How a precondition names an override.
fn override_of(template: &str, key: KeyHash) -> String {
    format!("override of key {} on {template:?}", format_hash(key))
}

/// The live override of `key` on quota `quota` (named `template`) inside
/// the write, checked against `expect`: a 412 when it is not the version
/// expected (or gone, when one was), a 404 when it is gone.
async fn live_override(
    tx: &mut Transaction<'static, Any>,
    template: &str,
    quota: u64,
    key: KeyHash,
    expect: &Expect,
) -> Result<OverrideRow, StoreError> {
    let what = override_of(template, key);
    let current = by_key(tx, quota, key)
        .await?
        .filter(|c| !c.ov.deleted)
        .ok_or_else(|| expect.check_missing(&what, no_override(template, key)))?;
    expect.check(&what, Some(current.ov.epoch))?;
    Ok(current)
}

/// The id of the live per-key template `name`, inside the write.
async fn template_id(tx: &mut Transaction<'static, Any>, name: &str) -> Result<u64, StoreError> {
    template_and_kind(tx, name).await.map(|(id, _)| id)
}

/// The id and kind of the live per-key template `name`, inside the write:
/// its overrides' numbers follow its kind's rules.
async fn template_and_kind(
    tx: &mut Transaction<'static, Any>,
    name: &str,
) -> Result<(u64, Kind), StoreError> {
    let row = sqlx::query(
        "SELECT id, per_key, count_window, in_flight FROM quotas WHERE name = $1 AND deleted = 0",
    )
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else {
        return Err(StoreError::NotFound(name.to_string()));
    };
    if row.try_get::<i64, _>(1)? == 0 {
        return Err(StoreError::Conflict(ValidationError::new(
            "quota",
            format!(
                "{name:?} is not a per-key template: only a per-key quota's keys have \
                 overrides (give a plain quota other numbers instead)"
            ),
        )));
    }
    let window: Option<String> = row.try_get(2)?;
    let window = match window.as_deref() {
        None => None,
        Some(text) => Some(Window::parse(text).ok_or_else(|| {
            StoreError::Internal(format!("quota {name:?} has an unknown window {text:?}"))
        })?),
    };
    let kind = Kind::of(window, row.try_get::<i64, _>(3)? != 0);
    Ok((row.try_get::<i64, _>(0)? as u64, kind))
}

/// The override row of `key` on quota `quota`, live or a tombstone.
async fn by_key(
    tx: &mut Transaction<'static, Any>,
    quota: u64,
    key: KeyHash,
) -> Result<Option<OverrideRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM overrides WHERE quota = $1 AND key_hash = $2");
    let row = sqlx::query(&sql)
        .bind(quota as i64)
        .bind(format_hash(key))
        .fetch_optional(&mut **tx)
        .await?;
    match row.as_ref().map(override_from_row).transpose()? {
        Some(Ok(row)) => Ok(Some(row)),
        Some(Err((_, why))) => Err(StoreError::Internal(why)),
        None => Ok(None),
    }
}

/// The rule a patch makes of `current`.
fn merged_rule(current: &Rule, spec: &OverrideSpec) -> Result<Rule, ValidationError> {
    let numbers = spec.limit.is_some() || spec.low_burst.is_some() || spec.high_burst.is_some();
    if spec.allow || spec.deny || !numbers {
        if !(spec.allow || spec.deny) {
            return Ok(*current);
        }
        return spec.rule();
    }
    let merged = match *current {
        Rule::Limit {
            limit,
            low_burst,
            high_burst,
        } => OverrideSpec {
            limit: spec.limit.or(Some(limit)),
            low_burst: spec.low_burst.or(Some(low_burst)),
            high_burst: spec.high_burst.or(Some(high_burst)),
            ..OverrideSpec::default()
        },
        Rule::Allow | Rule::Deny => OverrideSpec {
            limit: spec.limit,
            low_burst: spec.low_burst,
            high_burst: spec.high_burst,
            ..OverrideSpec::default()
        },
    };
    merged.rule()
}

fn override_from_row(row: &AnyRow) -> Result<StoredOverride, StoreError> {
    let id: i64 = row.try_get(0)?;
    let epoch: i64 = row.try_get(9)?;
    let position = QuotaCursor {
        epoch: epoch.max(0) as u64,
        id: id.max(0) as u64,
    };
    let bad = |why: String| Ok(Err((position, format!("override row {id}: {why}"))));
    let key_text: String = row.try_get(2)?;
    let key = match parse_key_hash(&key_text) {
        Ok(key) => key,
        Err(e) => return bad(e.to_string()),
    };
    let kind: String = row.try_get(3)?;
    let number = |i: usize| row.try_get::<Option<f64>, _>(i);
    let rule = match kind.as_str() {
        "allow" => Rule::Allow,
        "deny" => Rule::Deny,
        "limit" => match (number(4)?, number(5)?, number(6)?) {
            (Some(limit), Some(low_burst), Some(high_burst)) => Rule::Limit {
                limit,
                low_burst,
                high_burst,
            },
            _ => return bad("a limit override without its numbers".into()),
        },
        other => return bad(format!("unknown kind {other:?}")),
    };
    let ov = Override {
        id: position.id,
        quota: row.try_get::<i64, _>(1)?.max(0) as u64,
        key,
        rule,
        expires_ms: row.try_get(8)?,
        epoch: position.epoch,
        deleted: row.try_get::<i64, _>(10)? != 0,
    };
    if epoch <= 0 {
        return bad("epoch below 1".into());
    }
    if let Err(e) = ov.validate() {
        return bad(e.to_string());
    }
    Ok(Ok(OverrideRow {
        ov,
        note: row.try_get(7)?,
        updated_ms: row.try_get(11)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_merges_numbers_and_switches_rules() {
        let limit = Rule::Limit {
            limit: 10.0,
            low_burst: 10.0,
            high_burst: 20.0,
        };
        let spec = |json: &str| serde_json::from_str::<OverrideSpec>(json).unwrap();
        assert_eq!(
            merged_rule(&limit, &spec(r#"{"high_burst": 30}"#)).unwrap(),
            Rule::Limit {
                limit: 10.0,
                low_burst: 10.0,
                high_burst: 30.0
            }
        );
        assert_eq!(
            merged_rule(&limit, &spec(r#"{"deny": true}"#)).unwrap(),
            Rule::Deny
        );
        assert_eq!(
            merged_rule(&Rule::Deny, &spec(r#"{"note": "x"}"#)).unwrap(),
            Rule::Deny
        );
        assert_eq!(
            merged_rule(&Rule::Deny, &spec(r#"{"high_burst": 3}"#))
                .unwrap_err()
                .field,
            "limit"
        );
        assert_eq!(
            merged_rule(&limit, &spec(r#"{"low_burst": 50}"#))
                .unwrap_err()
                .field,
            "low_burst"
        );
    }
}
