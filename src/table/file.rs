//! Quotas from a local file applied to a table: nginx's `sluice_quotas` and
//! the C ABI's standalone loads.
//!
//! A file plays one of two roles:
//!
//! - **authoritative** (no roots): the file is the whole quota set. Every
//!   load gets a new epoch; a quota keeps its id (and so its counter) as
//!   long as its name stays in the file; names gone from the file are
//!   deleted.
//! - **seed** (roots configured): the file only bridges the time until a
//!   root first answers. Seeds take ids from [`SEED_ID_BASE`] up, far above
//!   any database id, so a seed never shares a counter with a root's quota,
//!   and epoch 0, so the root's copy of the same name (epoch 1 or more)
//!   replaces it. [`purge_seeds`] removes the rest once a root has
//!   answered.
//!
//! The overrides a per-key template lists in an authoritative file are
//! the template's overrides (the file replaces them all); a seed file's
//! are not applied (the roots' come with the roots' quotas).

use crate::core::spec::QuotaSet;
use crate::core::tier::{Override, Rule};
use crate::core::Quota;
use std::collections::{HashMap, HashSet};

use super::{ApplyReport, Table};

/// Lowest id given to a seed quota.
pub const SEED_ID_BASE: u64 = 1 << 60;

/// What a quota file is to the table it is loaded into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRole {
    /// The file is the quota set (standalone).
    Authoritative,
    /// The file stands in until a root answers.
    Seed,
}

/// Applies `set` to `table` in the given role. Quotas the table refuses
/// (full) are listed in the report; the rest still apply.
pub fn load_set(table: &Table, set: &QuotaSet, role: FileRole) -> ApplyReport {
    // What the table holds now, by name (one scan of the table).
    let held: HashMap<String, Quota> = table
        .quotas(0)
        .into_iter()
        .map(|s| (s.quota.name.clone(), s.quota))
        .collect();
    let wanted: HashSet<&str> = set.quotas.iter().map(|q| q.name.as_str()).collect();
    let (epoch, first_new_id, is_ours): (u64, u64, fn(u64) -> bool) = match role {
        FileRole::Authoritative => (table.max_epoch() + 1, 1, |id| id < SEED_ID_BASE),
        FileRole::Seed => (0, SEED_ID_BASE, |id| id >= SEED_ID_BASE),
    };
    let mut next_id = held
        .values()
        .map(|q| q.id)
        .filter(|&id| is_ours(id))
        .max()
        .map_or(first_new_id, |id| id + 1);
    let mut quotas = set.to_quotas(epoch);
    // `to_quotas` numbers the set 1..=n; map those to the table's ids.
    let mut ids: HashMap<u64, u64> = HashMap::with_capacity(quotas.len());
    for q in &quotas {
        // A name the table holds keeps its id: its counter survives, and a
        // seed whose parent came from a root links to the root's quota.
        let id = match held.get(&q.name) {
            Some(old) => old.id,
            None => {
                next_id += 1;
                next_id - 1
            }
        };
        ids.insert(q.id, id);
    }
    for q in &mut quotas {
        q.id = ids[&q.id];
        q.parent = q.parent.map(|p| ids[&p]);
    }
    let mut changes = Vec::with_capacity(quotas.len());
    let overrides = match role {
        FileRole::Authoritative => file_overrides(table, set, &ids, epoch),
        FileRole::Seed => Vec::new(),
    };
    match role {
        FileRole::Authoritative => {
            // Everything else in the table goes.
            changes.extend(
                held.iter()
                    .filter(|(name, _)| !wanted.contains(name.as_str()))
                    .map(|(name, old)| Quota::tombstone(old.id, name.as_str(), epoch)),
            );
            changes.extend(quotas);
        }
        FileRole::Seed => {
            // Seeds are never updated in place (epoch 0 cannot beat epoch
            // 0): a seed whose numbers changed, or that left the file, is
            // deleted, and the new one inserted. Names the table holds from
            // a root are left alone.
            let new: HashMap<&str, &Quota> = quotas.iter().map(|q| (q.name.as_str(), q)).collect();
            // A held quota is unchanged when the file has the same numbers.
            let unchanged = |old: &Quota| {
                new.get(old.name.as_str())
                    .is_some_and(|q| same_numbers(old, q))
            };
            for old in held.values().filter(|old| is_ours(old.id)) {
                if !unchanged(old) {
                    changes.push(Quota::tombstone(old.id, old.name.as_str(), 1));
                }
            }
            let inserts: Vec<Quota> = quotas
                .iter()
                .filter(|q| {
                    held.get(&q.name)
                        .is_none_or(|old| is_ours(old.id) && !unchanged(old))
                })
                .cloned()
                .collect();
            if !inserts.is_empty() {
                table.set_holds_seeds(true);
            }
            changes.extend(inserts);
        }
    }
    let report = table.books().apply_quotas(&changes);
    table.books().apply_overrides(&overrides);
    report
}

/// The overrides an authoritative file's templates list (with the table's
/// ids: `ids` maps the set's numbering to them), and tombstones for the
/// overrides the table holds that the file no longer lists.
fn file_overrides(
    table: &Table,
    set: &QuotaSet,
    ids: &HashMap<u64, u64>,
    epoch: u64,
) -> Vec<Override> {
    let mut wanted: HashMap<(u64, u64), Rule> = HashMap::new();
    for (i, spec) in set.quotas.iter().enumerate() {
        // A set is validated whole: every template's overrides parse.
        let Ok(listed) = spec.validate_overrides() else {
            continue;
        };
        let quota = ids[&(i as u64 + 1)];
        wanted.extend(listed.into_iter().map(|(key, rule)| ((quota, key), rule)));
    }
    let stale = table
        .tiers()
        .into_iter()
        .filter(|t| t.key != 0 && t.rule.is_some() && !wanted.contains_key(&(t.quota, t.key)))
        .map(|t| Override {
            deleted: true,
            ..file_override(t.quota, t.key, Rule::Deny, epoch)
        });
    let mut out: Vec<Override> = stale.collect();
    out.extend(
        wanted
            .into_iter()
            .map(|((quota, key), rule)| file_override(quota, key, rule, epoch)),
    );
    out
}

fn file_override(quota: u64, key: u64, rule: Rule, epoch: u64) -> Override {
    Override {
        id: 1,
        quota,
        key,
        rule,
        expires_ms: None,
        epoch,
        deleted: false,
    }
}

/// Deletes every seed quota (after a root has answered: from then on the
/// roots' quotas are the set).
pub fn purge_seeds(table: &Table) -> ApplyReport {
    // Cleared first: seeds loaded while this runs set it again.
    table.set_holds_seeds(false);
    let seeds: Vec<Quota> = table
        .quotas(0)
        .into_iter()
        .filter(|s| s.quota.id >= SEED_ID_BASE)
        .map(|s| Quota::tombstone(s.quota.id, s.quota.name, 1))
        .collect();
    if seeds.is_empty() {
        return ApplyReport::default();
    }
    table.books().apply_quotas(&seeds)
}

/// True when a held seed counts as the file's quota does: same numbers,
/// parent, kind and window.
fn same_numbers(a: &Quota, b: &Quota) -> bool {
    a.parent == b.parent
        && a.per_key == b.per_key
        && a.window == b.window
        && a.sliding == b.sliding
        && a.limit == b.limit
        && a.low_burst == b.low_burst
        && a.high_burst == b.high_burst
        && a.penalty == b.penalty
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Window;
    use crate::table::Outcome;

    fn set(text: &str) -> QuotaSet {
        QuotaSet::from_json(text).unwrap()
    }

    fn id_of(t: &Table, name: &str) -> u64 {
        t.quota(name.as_bytes(), 0).unwrap().quota.id
    }

    #[test]
    fn an_authoritative_file_keeps_ids_and_counters_by_name_and_deletes_the_rest() {
        let t = Table::new_heap(16, 16);
        load_set(
            &t,
            &set(r#"[{"name":"a","limit":1,"low_burst":5},{"name":"b","limit":1}]"#),
            FileRole::Authoritative,
        );
        let a = id_of(&t, "a");
        assert_eq!(t.gate().check(b"a", 3, 0), Outcome::Pass);
        let report = load_set(
            &t,
            &set(r#"[{"name":"c","limit":1},{"name":"a","limit":2,"low_burst":5}]"#),
            FileRole::Authoritative,
        );
        assert!(report.refused.is_empty());
        assert_eq!(id_of(&t, "a"), a);
        let state = t.quota(b"a", 0).unwrap();
        assert_eq!((state.quota.limit, state.pending), (2.0, 3));
        assert!(t.quota(b"b", 0).is_none());
        assert!(id_of(&t, "c") > a && id_of(&t, "c") < SEED_ID_BASE);
    }

    #[test]
    fn an_authoritative_file_sets_its_templates_overrides() {
        let t = Table::new_heap_with(16, 16, 64, 64);
        let text = |overrides: &str| {
            format!(
                r#"[{{"name":"api","limit":1,"low_burst":2,"per_key":true,"overrides":[{overrides}]}}]"#
            )
        };
        let paid = t.key_secret().hash(b"paid");
        let stolen = t.key_secret().hash(b"stolen");
        let entries = format!(
            r#"{{"key_hash":"{paid:016x}","limit":100}},{{"key_hash":"{stolen:016x}","deny":true}}"#
        );
        load_set(&t, &set(&text(&entries)), FileRole::Authoritative);
        let check = |key: &[u8]| {
            let item = crate::table::CheckItem {
                name: b"api",
                key: Some(key),
                weight: 1,
                max_wait: None,
            };
            (0..10)
                .filter(|_| {
                    t.gate()
                        .check_many(&[item], 0, Default::default(), || 0.5)
                        .outcome
                        == Outcome::Pass
                })
                .count()
        };
        assert_eq!(
            (check(b"paid"), check(b"stolen"), check(b"free")),
            (10, 0, 2)
        );
        // Gone from the file, gone from the table.
        load_set(
            &t,
            &set(&text(&format!(
                r#"{{"key_hash":"{paid:016x}","limit":100}}"#
            ))),
            FileRole::Authoritative,
        );
        assert!(t.tier(id_of(&t, "api"), stolen).is_none());
        assert!(t.tier(id_of(&t, "api"), paid).is_some());
    }

    #[test]
    fn a_root_quota_replaces_a_seed_of_the_same_name() {
        let t = Table::new_heap(16, 16);
        load_set(
            &t,
            &set(r#"[{"name":"a","limit":1},{"name":"b","limit":1}]"#),
            FileRole::Seed,
        );
        assert!(id_of(&t, "a") >= SEED_ID_BASE);
        t.books().apply_quotas(&[Quota::new(7, "a", 9.0, 9.0, 9.0)]);
        assert_eq!(id_of(&t, "a"), 7);
        // Loading the seeds again (nginx reload) leaves the root's copy.
        load_set(
            &t,
            &set(r#"[{"name":"a","limit":1},{"name":"b","limit":1}]"#),
            FileRole::Seed,
        );
        assert_eq!(t.quota(b"a", 0).unwrap().quota.limit, 9.0);
        purge_seeds(&t);
        assert!(t.quota(b"b", 0).is_none());
        assert_eq!(id_of(&t, "a"), 7);
    }

    #[test]
    fn changed_seeds_are_replaced_and_unchanged_ones_keep_their_counters() {
        let t = Table::new_heap(16, 16);
        load_set(
            &t,
            &set(r#"[{"name":"a","limit":1,"low_burst":9},{"name":"b","limit":1,"low_burst":9}]"#),
            FileRole::Seed,
        );
        assert_eq!(t.gate().check(b"a", 2, 0), Outcome::Pass);
        assert_eq!(t.gate().check(b"b", 2, 0), Outcome::Pass);
        load_set(
            &t,
            &set(r#"[{"name":"a","limit":1,"low_burst":9},{"name":"b","limit":5,"low_burst":9}]"#),
            FileRole::Seed,
        );
        assert_eq!(t.quota(b"a", 0).unwrap().pending, 2);
        let b = t.quota(b"b", 0).unwrap();
        assert_eq!((b.quota.limit, b.pending), (5.0, 0));
        load_set(
            &t,
            &set(r#"[{"name":"a","limit":1,"low_burst":9}]"#),
            FileRole::Seed,
        );
        assert!(t.quota(b"b", 0).is_none());
        // A window is part of a seed's numbers: a seed that only gains a
        // window (or starts to slide) is replaced too.
        let a_in = |extra: &str| {
            format!(r#"[{{"name":"a","limit":9,"low_burst":9,"high_burst":9{extra}}}]"#)
        };
        load_set(&t, &set(&a_in("")), FileRole::Seed);
        assert_eq!(t.gate().check(b"a", 2, 0), Outcome::Pass);
        load_set(&t, &set(&a_in(r#","window":"1m""#)), FileRole::Seed);
        let a = t.quota(b"a", 0).unwrap();
        assert_eq!((a.quota.window, a.pending), (Some(Window::Minute), 0));
        load_set(
            &t,
            &set(&a_in(r#","window":"1m","sliding":true"#)),
            FileRole::Seed,
        );
        assert!(t.quota(b"a", 0).unwrap().quota.sliding);
    }
}
