//! The tier section: overrides applied to a key's checks, allow and deny,
//! penalties started, enforced, sent and merged, and the table's
//! lookups through removals and filter rebuilds.

use crate::core::tier::{Override, Penalty, PenaltyTime, Rule};
use crate::core::{Nanos, Quota};
use crate::table::region::key_entries::KeyEntries;
use crate::table::region::keys::Keys;
use crate::table::region::tier_section::TierSection;
use std::collections::HashMap;

use super::*;

const SEC: Nanos = 1_000_000_000;

fn never() -> f64 {
    0.999_999
}

/// `api` (1000/s) over `api_user`, a per-key template (1/s, burst 3),
/// and `login` (1/s, burst 2) with a 15-minute penalty.
fn tiered_table() -> Table {
    let t = Table::new_heap_with(16, 16, 256, 256);
    t.books().apply_quotas(&[
        Quota::new(1, "api", 1000.0, 1000.0, 1000.0),
        Quota::new(2, "api_user", 1.0, 3.0, 3.0)
            .with_parent(Some(1))
            .keyed(),
        Quota::new(3, "login", 1.0, 2.0, 2.0).penalized(Some(PenaltyTime::parse("15m").unwrap())),
    ]);
    t
}

/// [`tiered_table`] with `api_user` given a one-minute penalty per key.
fn penalized_keys_table() -> Table {
    let t = tiered_table();
    t.books()
        .apply_quotas(&[Quota::new(2, "api_user", 1.0, 3.0, 3.0)
            .with_parent(Some(1))
            .keyed()
            .penalized(Some(PenaltyTime::parse("1m").unwrap()))
            .at_epoch(2)]);
    t
}

fn check(t: &Table, name: &[u8], key: Option<&[u8]>, now: Nanos) -> Outcome {
    let item = CheckItem {
        name,
        key,
        weight: 1,
        max_wait: None,
    };
    t.gate()
        .check_many(&[item], now, CheckOptions::default(), never)
        .outcome
}

fn passes(t: &Table, name: &[u8], key: Option<&[u8]>, n: usize, now: Nanos) -> usize {
    (0..n)
        .filter(|_| check(t, name, key, now) == Outcome::Pass)
        .count()
}

fn over(id: u64, quota: u64, key: u64, rule: Rule, epoch: u64) -> Override {
    Override {
        id,
        quota,
        key,
        rule,
        expires_ms: None,
        epoch,
        deleted: false,
    }
}

#[test]
fn an_override_gives_one_key_other_numbers_and_leaves_the_others_alone() {
    let t = tiered_table();
    let paid = t.key_secret().hash(b"paid");
    let limit = Rule::Limit {
        limit: 10.0,
        low_burst: 10.0,
        high_burst: 10.0,
    };
    assert_eq!(
        t.books()
            .apply_overrides(&[over(1, 2, paid, limit, 5)])
            .applied,
        1
    );
    assert_eq!(passes(&t, b"api_user", Some(b"paid"), 20, 0), 10);
    assert_eq!(passes(&t, b"api_user", Some(b"free"), 20, 0), 3);
    t.books().fold_local(0);
    // Removed: the template's numbers again, from the next check on.
    let mut gone = over(1, 2, paid, limit, 6);
    gone.deleted = true;
    assert_eq!(t.books().apply_overrides(&[gone]).removed, 1);
    assert_eq!(passes(&t, b"api_user", Some(b"paid"), 5, 20 * SEC), 3);
    assert_eq!(
        t.tier_stats().live,
        1,
        "only login's penalty length is left"
    );
}

#[test]
fn an_allowed_key_is_never_rejected_and_still_counted() {
    let t = tiered_table();
    let partner = t.key_secret().hash(b"partner");
    t.books()
        .apply_overrides(&[over(1, 2, partner, Rule::Allow, 5)]);
    assert_eq!(passes(&t, b"api_user", Some(b"partner"), 500, 0), 500);
    let api = t.quota(b"api", 0).unwrap();
    assert_eq!(api.pending, 500, "its weight counts on the parent");
    // The parent still applies.
    assert_eq!(passes(&t, b"api_user", Some(b"partner"), 1000, 0), 500);
}

#[test]
fn a_denied_key_is_always_rejected_uncounted_and_says_why() {
    let t = tiered_table();
    let stolen = t.key_secret().hash(b"stolen");
    t.books()
        .apply_overrides(&[over(1, 2, stolen, Rule::Deny, 5)]);
    match check(&t, b"api_user", Some(b"stolen"), 0) {
        Outcome::Reject(r) => {
            assert_eq!((r.cause, r.key, r.depth), (Cause::Denied, stolen, 0));
            assert_eq!(r.wait, crate::core::Wait::Never(crate::core::Never::Denied));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.quota(b"api", 0).unwrap().pending, 0);
    assert_eq!(t.tier_stats().denied, 1);
    // An expired deny no longer applies (the table's clock is UTC here).
    let mut expiring = over(1, 2, stolen, Rule::Deny, 6);
    expiring.expires_ms = Some(10_000);
    t.books().apply_overrides(&[expiring]);
    assert!(matches!(
        check(&t, b"api_user", Some(b"stolen"), 9 * SEC),
        Outcome::Reject(_)
    ));
    assert_eq!(
        check(&t, b"api_user", Some(b"stolen"), 10 * SEC),
        Outcome::Pass
    );
}

#[test]
fn a_rejection_at_the_high_burst_starts_a_penalty_that_bars_until_it_ends() {
    let t = tiered_table();
    assert_eq!(passes(&t, b"login", None, 2, 0), 2);
    match check(&t, b"login", None, 0) {
        Outcome::Reject(r) => {
            assert_eq!(r.cause, Cause::Penalty);
            assert_eq!(r.wait, crate::core::Wait::Seconds(900.0));
        }
        other => panic!("{other:?}"),
    }
    t.books().fold_local(0);
    // The bucket drained long ago; the penalty still bars.
    match check(&t, b"login", None, 600 * SEC) {
        Outcome::Reject(r) => {
            assert_eq!(r.cause, Cause::Penalty);
            assert_eq!(r.wait, crate::core::Wait::Seconds(300.0));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(check(&t, b"login", None, 900 * SEC), Outcome::Pass);
    let stats = t.tier_stats();
    assert_eq!((stats.started, stats.penalized), (1, 1));
    // Sent once.
    assert_eq!(
        t.books().take_started_penalties(),
        [Penalty(3, 0, 900 * SEC as i64)]
    );
    assert_eq!(t.books().take_started_penalties(), []);
}

#[test]
fn a_draw_in_the_band_starts_no_penalty() {
    let t = Table::new_heap_with(16, 16, 0, 64);
    t.books()
        .apply_quotas(&[Quota::new(1, "login", 1.0, 1.0, 10.0)
            .penalized(Some(PenaltyTime::parse("1m").unwrap()))]);
    let always = || 0.0;
    let item = CheckItem {
        name: b"login",
        key: None,
        weight: 1,
        max_wait: None,
    };
    t.gate()
        .check_many(&[item], 0, CheckOptions::default(), never);
    // Level 1 of a band 1..10: a draw of 0 rejects, without a penalty.
    match t
        .gate()
        .check_many(&[item], 0, CheckOptions::default(), always)
        .outcome
    {
        Outcome::Reject(r) => assert_eq!(r.cause, Cause::Limit),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.tier_stats().started, 0);
}

#[test]
fn a_key_penalty_bars_that_key_only_and_merges_from_the_roots_by_max() {
    let t = penalized_keys_table();
    assert_eq!(passes(&t, b"api_user", Some(b"bot"), 4, 0), 3);
    t.books().fold_local(0);
    assert!(matches!(
        check(&t, b"api_user", Some(b"bot"), 30 * SEC),
        Outcome::Reject(Rejection {
            cause: Cause::Penalty,
            ..
        })
    ));
    assert_eq!(
        check(&t, b"api_user", Some(b"human"), 30 * SEC),
        Outcome::Pass
    );
    let bot = t.key_secret().hash(b"bot");
    assert_eq!(
        t.books().take_started_penalties(),
        [Penalty(2, bot, 60 * SEC as i64)]
    );
    // Another host's longer penalty of another key arrives by sync.
    let other = t.key_secret().hash(b"human");
    let merged = [
        Penalty(2, other, 200 * SEC as i64),
        Penalty(2, bot, 10 * SEC as i64),
    ];
    assert_eq!(
        t.books().merge_penalties(&merged),
        1,
        "an earlier end changes nothing"
    );
    assert!(matches!(
        check(&t, b"api_user", Some(b"human"), 100 * SEC),
        Outcome::Reject(Rejection {
            cause: Cause::Penalty,
            ..
        })
    ));
    assert_eq!(
        check(&t, b"api_user", Some(b"bot"), 100 * SEC),
        Outcome::Pass
    );
    assert!(
        t.books().take_started_penalties().is_empty(),
        "merged ones are not resent"
    );
    assert_eq!(
        t.books().held_penalties(100 * SEC as i64),
        [Penalty(2, other, 200 * SEC as i64)]
    );
    // Ended penalties leave the section.
    t.books().sweep_tiers(300 * SEC as i64);
    assert_eq!(t.tiers().len(), 2, "the two quotas' penalty lengths");
}

#[test]
fn a_parent_under_a_penalty_bars_its_children() {
    let t = Table::new_heap_with(16, 16, 0, 64);
    t.books().apply_quotas(&[
        Quota::new(1, "site", 1.0, 1.0, 1.0).penalized(Some(PenaltyTime::parse("1m").unwrap())),
        Quota::new(2, "page", 100.0, 100.0, 100.0).with_parent(Some(1)),
    ]);
    assert_eq!(passes(&t, b"page", None, 2, 0), 1);
    match check(&t, b"page", None, 10 * SEC) {
        Outcome::Reject(r) => assert_eq!((r.cause, r.depth), (Cause::Penalty, 1)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_dry_run_starts_no_penalty() {
    let t = tiered_table();
    let options = CheckOptions {
        dry_run: true,
        headroom: false,
    };
    let item = CheckItem {
        name: b"login",
        key: None,
        weight: 5,
        max_wait: None,
    };
    t.gate().check_many(&[item], 0, options, never);
    assert_eq!(t.tier_stats().started, 0);
}

#[test]
fn lookups_survive_any_mix_of_inserts_and_removals() {
    let t = Table::new_heap_with(16, 16, 0, 200);
    t.books()
        .apply_quotas(&[Quota::new(7, "t", 1.0, 1.0, 1.0).keyed()]);
    let mut model: HashMap<u64, f64> = HashMap::new();
    let mut rng = crate::core::rng::Rng::new(42);
    for epoch in 1..3000u64 {
        let key = (rng.next_u64() % 300) + 1;
        let present = model.contains_key(&key);
        if present && rng.next_u64() % 2 == 0 || model.len() >= 160 {
            let Some(&victim) = model.keys().next() else {
                continue;
            };
            let victim = if present { key } else { victim };
            let mut o = over(epoch, 7, victim, Rule::Deny, epoch);
            o.deleted = true;
            t.books().apply_overrides(&[o]);
            model.remove(&victim);
        } else {
            let limit = epoch as f64;
            let rule = Rule::Limit {
                limit,
                low_burst: limit,
                high_burst: limit,
            };
            assert_eq!(
                t.books()
                    .apply_overrides(&[over(epoch, 7, key, rule, epoch)])
                    .refused,
                0
            );
            model.insert(key, limit);
        }
        if epoch % 500 == 0 {
            t.books().sweep_tiers(0);
        }
    }
    t.books().sweep_tiers(0);
    for key in 1..=300 {
        let found = t.tier(7, key).map(|r| r.limit);
        assert_eq!(found, model.get(&key).copied(), "key {key}");
        if model.contains_key(&key) {
            assert!(
                TierSection::of(t.region()).tier_filter_holds(7, key),
                "key {key}"
            );
        }
    }
    assert_eq!(t.tier_stats().live as usize, model.len());
}

#[test]
fn a_full_section_refuses_and_keeps_what_it_has() {
    let t = Table::new_heap_with(16, 16, 0, 64);
    t.books()
        .apply_quotas(&[Quota::new(7, "t", 1.0, 1.0, 1.0).keyed()]);
    let overrides: Vec<Override> = (1..=100).map(|k| over(k, 7, k, Rule::Allow, k)).collect();
    let report = t.books().apply_overrides(&overrides);
    assert_eq!(report.applied as u64, t.tier_capacity());
    assert_eq!(report.refused as u64, 100 - t.tier_capacity());
    assert!(t.tier(7, 1).is_some());
    assert_eq!(t.tier_stats().refused as usize, report.refused);
}

#[test]
fn a_table_without_a_tier_section_ignores_tiers() {
    let t = Table::new_heap_with(16, 16, 64, 0);
    t.books()
        .apply_quotas(&[Quota::new(1, "login", 1.0, 1.0, 1.0)
            .penalized(Some(PenaltyTime::parse("1m").unwrap()))]);
    assert_eq!(
        t.books()
            .apply_overrides(&[over(1, 1, 5, Rule::Deny, 2)])
            .refused,
        1
    );
    assert_eq!(passes(&t, b"login", None, 3, 0), 1);
    t.books().fold_local(0);
    assert_eq!(t.books().merge_penalties(&[Penalty(1, 0, i64::MAX)]), 0);
    assert_eq!(passes(&t, b"login", None, 3, 10 * SEC), 1);
}

#[test]
fn a_charge_under_a_penalty_still_counts() {
    let t = tiered_table();
    assert_eq!(passes(&t, b"login", None, 2, 0), 2);
    assert!(matches!(check(&t, b"login", None, 0), Outcome::Reject(_)));
    // A request admitted before the penalty ends and is charged during it.
    let item = CheckItem {
        name: b"login",
        key: None,
        weight: 5,
        max_wait: None,
    };
    let grant = t.gate().charge(&item, SEC);
    assert_eq!((grant.outcome, grant.granted), (Outcome::Pass, 5));
}

// ---- the tier mark in a key's entry -------------------------------------

/// `t` (1000/s, never rejects by its numbers here), a per-key template
/// flagged for tiers by an override of a key never checked.
fn flagged_table(keys: u64) -> Table {
    let t = Table::new_heap_with(16, 16, keys, 256);
    t.books()
        .apply_quotas(&[Quota::new(7, "t", 1000.0, 1000.0, 1000.0).keyed()]);
    let elsewhere = t.key_secret().hash(b"never checked");
    t.books()
        .apply_overrides(&[over(1, 7, elsewhere, Rule::Allow, 1)]);
    t
}

fn deny(t: &Table, key: &[u8], epoch: u64) {
    let hash = t.key_secret().hash(key);
    assert_eq!(
        t.books()
            .apply_overrides(&[over(epoch, 7, hash, Rule::Deny, epoch)])
            .applied,
        1
    );
}

fn undeny(t: &Table, key: &[u8], epoch: u64) {
    let mut o = over(epoch, 7, t.key_secret().hash(key), Rule::Deny, epoch);
    o.deleted = true;
    t.books().apply_overrides(&[o]);
}

fn denied(t: &Table, key: &[u8], now: Nanos) -> bool {
    match check(t, b"t", Some(key), now) {
        Outcome::Reject(r) => {
            assert_eq!(r.cause, Cause::Denied);
            true
        }
        Outcome::Pass => false,
        other => panic!("{other:?}"),
    }
}

/// Whether the entry of `key` carries the tier mark (`None`: no entry).
fn marked(t: &Table, key: &[u8]) -> Option<bool> {
    let at = KeyEntries::of(t.region()).find_key(0, t.key_secret().hash(key))?;
    Some(KeyEntries::of(t.region()).key_marked_for_tiers(at))
}

#[test]
fn a_key_checked_before_its_override_takes_it_from_its_next_check() {
    let t = flagged_table(64);
    assert!(!denied(&t, b"late", 0));
    assert_eq!(marked(&t, b"late"), Some(false), "checked unmarked");
    deny(&t, b"late", 2);
    assert_eq!(marked(&t, b"late"), Some(true));
    assert!(denied(&t, b"late", 0));
    // Numbers too, not only deny: a limit override on an unmarked key.
    assert!(!denied(&t, b"paid", 0));
    let paid = t.key_secret().hash(b"paid");
    let limit = Rule::Limit {
        limit: 1.0,
        low_burst: 2.0,
        high_burst: 2.0,
    };
    t.books().apply_overrides(&[over(3, 7, paid, limit, 3)]);
    assert_eq!(
        passes(&t, b"t", Some(b"paid"), 10, 0),
        1,
        "2 minus the 1 before"
    );
}

#[test]
fn a_key_entry_made_while_its_override_arrives_is_unsure_until_its_maker_looked_again() {
    // The race a new entry's second look closes: its maker looked in the
    // tier section (nothing), the sync then added a deny and found no
    // entry to mark, and the maker published the entry. Another check of
    // the key before the maker's second look must not trust the missing
    // mark.
    let t = flagged_table(64);
    let hash = t.key_secret().hash(b"racer");
    deny(&t, b"racer", 2);
    let (b1, _) = KeyEntries::of(t.region()).buckets_of(0, hash);
    let at = KeyEntries::of(t.region())
        .claim_in(b1, 0)
        .expect("a free entry");
    crate::table::region::key_entries::init_entry(
        KeyEntries::of(t.region()).key_at(at).unwrap(),
        0,
        hash,
        0,
        0,
        false,
    );
    assert_eq!(
        KeyEntries::of(t.region()).key_tiers(at, hash),
        crate::table::region::key_entries::KeyTiers::Unknown
    );
    assert!(denied(&t, b"racer", 0), "the filter answers meanwhile");
    // An entry made the ordinary way is sure once made: its checks trust
    // its mark, set or not.
    assert!(!denied(&t, b"plain", 0));
    let plain = t.key_secret().hash(b"plain");
    let plain_at = KeyEntries::of(t.region()).find_key(0, plain).unwrap();
    assert_eq!(
        KeyEntries::of(t.region()).key_tiers(plain_at, plain),
        crate::table::region::key_entries::KeyTiers::Clear
    );
    // The sweep settles an entry its maker left unsure (one holding
    // weight: a drained one it frees).
    Keys::of(t.region()).count_key(at, 0, hash, 1);
    t.books().maintain_keys(1 << 20, 0);
    assert_eq!(
        KeyEntries::of(t.region()).key_tiers(at, hash),
        crate::table::region::key_entries::KeyTiers::Marked
    );
}

#[test]
fn the_first_override_of_a_template_reaches_its_keys_checked_before() {
    let t = Table::new_heap_with(16, 16, 64, 256);
    t.books()
        .apply_quotas(&[Quota::new(7, "t", 1000.0, 1000.0, 1000.0).keyed()]);
    assert!(!denied(&t, b"early", 0));
    deny(&t, b"early", 1);
    assert!(denied(&t, b"early", 0));
}

#[test]
fn a_removed_override_stops_at_the_next_check_and_the_sweep_clears_the_mark() {
    let t = flagged_table(64);
    deny(&t, b"k", 2);
    assert!(denied(&t, b"k", 0));
    undeny(&t, b"k", 3);
    assert!(!denied(&t, b"k", 0), "the mark only makes it look");
    assert_eq!(marked(&t, b"k"), Some(true));
    t.books().maintain_keys(1 << 20, 0);
    assert_eq!(marked(&t, b"k"), Some(false), "nothing left of the key");
    assert!(!denied(&t, b"k", 0));
    deny(&t, b"k", 4);
    assert!(denied(&t, b"k", 0), "marked again when it comes back");
    // The sweep leaves a key the section still holds marked.
    t.books().maintain_keys(1 << 20, 0);
    assert!(denied(&t, b"k", 0));
}

#[test]
fn a_key_idle_through_many_changes_sees_the_last_one() {
    let t = flagged_table(64);
    for round in 0..3u64 {
        let base = 10 + round * 10_000;
        assert!(!denied(&t, b"idle", 0));
        for i in 0..2_000 {
            deny(&t, b"idle", base + 2 * i);
            undeny(&t, b"idle", base + 2 * i + 1);
            if i % 97 == 0 {
                t.books().maintain_keys(1 << 20, 0);
                t.books().sweep_tiers(0);
            }
        }
        assert!(!denied(&t, b"idle", 0));
        deny(&t, b"idle", base + 5_000);
        assert!(denied(&t, b"idle", 0));
        undeny(&t, b"idle", base + 5_001);
        t.books().sweep_tiers(0);
        t.books().maintain_keys(1 << 20, 0);
    }
}

#[test]
fn a_penalty_started_or_merged_marks_the_key() {
    let t = penalized_keys_table();
    assert_eq!(check(&t, b"api_user", Some(b"merged"), 0), Outcome::Pass);
    let hash = t.key_secret().hash(b"merged");
    let slot = 1;
    let at = KeyEntries::of(t.region()).find_key(slot, hash).unwrap();
    assert!(!KeyEntries::of(t.region()).key_marked_for_tiers(at));
    t.books()
        .merge_penalties(&[Penalty(2, hash, 60 * SEC as i64)]);
    assert!(KeyEntries::of(t.region()).key_marked_for_tiers(at));
    assert!(matches!(
        check(&t, b"api_user", Some(b"merged"), SEC),
        Outcome::Reject(Rejection {
            cause: Cause::Penalty,
            ..
        })
    ));
    // Ended and swept: unmarked, and passes.
    t.books().sweep_tiers(120 * SEC as i64);
    t.books().maintain_keys(1 << 20, 120 * SEC);
    if let Some(at) = KeyEntries::of(t.region()).find_key(slot, hash) {
        assert!(!KeyEntries::of(t.region()).key_marked_for_tiers(at));
    }
    assert_eq!(
        check(&t, b"api_user", Some(b"merged"), 120 * SEC),
        Outcome::Pass
    );
}

/// Random overrides added and removed, sweeps of both sections, and far
/// more keys than entries (entries drain, are retaken by other keys and
/// moved to make room), against a model of which keys are denied: every
/// check of a key says what the model says.
#[test]
fn marks_follow_keys_through_moves_reuse_and_sweeps() {
    let t = flagged_table(32);
    let mut model = std::collections::HashSet::new();
    let mut rng = crate::core::rng::Rng::new(7);
    let mut now: Nanos = 0;
    for epoch in 2..40_000u64 {
        let key = format!("k{}", rng.next_u64() % 90);
        match rng.next_u64() % 16 {
            0 => {
                deny(&t, key.as_bytes(), epoch);
                model.insert(key);
            }
            1 => {
                undeny(&t, key.as_bytes(), epoch);
                model.remove(&key);
            }
            2 => t.books().maintain_keys(3, now),
            3 => t.books().sweep_tiers(now as i64 + t.utc_offset()),
            4 => {
                // Time for levels to drain, so entries are retaken.
                now += 10 * SEC;
                t.books().fold_local(now);
            }
            _ => assert_eq!(
                denied(&t, key.as_bytes(), now),
                model.contains(&key),
                "{key} at {epoch}"
            ),
        }
    }
    let stats = t.key_stats();
    assert!(stats.relocations > 100, "{stats:?}");
    assert!(stats.reclaimed > 100, "{stats:?}");
}

/// The sync thread denies key `r` and then publishes round `r` (and lifts
/// the deny of key `r - 2`), while checkers check the key of the round
/// they see and the next one, and other checks churn keys through a small
/// key section (moves, entries retaken), and sweeps clear marks: a check
/// of a key whose deny was applied before it started is always denied.
#[test]
fn a_deny_applied_before_a_check_is_never_missed_under_concurrency() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let t = flagged_table(64);
    let round = AtomicU64::new(0);
    let checked = AtomicU64::new(0);
    let clock = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let missed = std::sync::Mutex::new(Vec::new());
    let key = |r: u64| format!("round {r}");
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !done.load(SeqCst) {
                    let r = round.load(SeqCst);
                    let now = clock.load(SeqCst);
                    // Maybe before its deny: either answer is right.
                    let _ = check(&t, b"t", Some(key(r + 1).as_bytes()), now);
                    if r == 0 {
                        continue;
                    }
                    let passed = check(&t, b"t", Some(key(r).as_bytes()), now) == Outcome::Pass;
                    if passed && round.load(SeqCst) < r + 2 {
                        missed.lock().unwrap().push(r);
                    }
                    checked.fetch_max(r, SeqCst);
                }
            });
        }
        s.spawn(|| {
            let mut n = 0u64;
            while !done.load(SeqCst) {
                n += 1;
                let now = clock.fetch_add(SEC, SeqCst);
                let _ = check(&t, b"t", Some(format!("churn {}", n % 200).as_bytes()), now);
            }
        });
        for r in 1..=1_000u64 {
            deny(&t, key(r).as_bytes(), 2 * r);
            round.store(r, SeqCst);
            if r > 2 {
                undeny(&t, key(r - 2).as_bytes(), 2 * r + 1);
            }
            if r % 7 == 0 {
                let now = clock.load(SeqCst);
                t.books().maintain_keys(8, now);
                t.books().sweep_tiers(now as i64 + t.utc_offset());
            }
            // Every round is checked at least once.
            while checked.load(SeqCst) < r {
                std::thread::yield_now();
            }
        }
        done.store(true, SeqCst);
    });
    let stats = t.key_stats();
    assert_eq!(*missed.lock().unwrap(), [0u64; 0], "{stats:?}");
    assert!(stats.relocations + stats.reclaimed > 0, "{stats:?}");
}

#[test]
fn a_check_decided_on_the_shared_overflow_counter_starts_no_penalty() {
    // Room for a few keys; `api_user` has a one-minute penalty per key.
    let t = Table::new_heap_with(16, 16, 4, 256);
    t.books().apply_quotas(&[
        Quota::new(1, "api", 1000.0, 1000.0, 1000.0),
        Quota::new(2, "api_user", 1.0, 3.0, 3.0)
            .with_parent(Some(1))
            .keyed()
            .penalized(Some(PenaltyTime::parse("1m").unwrap())),
    ]);
    let full = |key: &[u8]| {
        let item = CheckItem {
            name: b"api_user",
            key: Some(key),
            weight: 1,
            max_wait: None,
        };
        t.gate()
            .check_many(&[item], 0, CheckOptions::default(), never)
    };
    // Fresh keys until the key section is full: from then on each fresh
    // key is decided on the template's own counter, which stands for
    // every key without an entry (the `shared` overflow mode) and soon
    // rejects them past its high burst.
    let (mut overflowed, mut rejected) = (0, 0);
    for k in 0..200u32 {
        let r = full(&k.to_le_bytes());
        if !r.overflow {
            continue;
        }
        overflowed += 1;
        if let Outcome::Reject(rejection) = r.outcome {
            rejected += 1;
            assert_ne!(rejection.cause, Cause::Penalty, "key {k}");
        }
    }
    assert!(
        overflowed > 100 && rejected > 100,
        "{overflowed} {rejected}"
    );
    assert_eq!(t.tier_stats().started, 0);
    assert!(t.books().take_started_penalties().is_empty());
    // A key with an entry of its own still earns its penalty.
    let own = 0u32.to_le_bytes();
    while !matches!(full(&own).outcome, Outcome::Reject(_)) {}
    assert_eq!(t.tier_stats().started, 1);
}

#[test]
fn penalties_take_at_most_half_the_section_ending_first_giving_way() {
    let t = Table::new_heap_with(16, 16, 0, 64);
    t.books()
        .apply_quotas(&[Quota::new(7, "t", 1.0, 1.0, 1.0).keyed()]);
    let cap = t.tier_capacity();
    let half = cap / 2;
    // Penalties from the roots, key k ending at k seconds: once half the
    // section holds penalties, each later one takes the place of the one
    // ending first.
    let ending = |k: u64| Penalty(7, k, (k * SEC) as i64);
    let all: Vec<Penalty> = (1..=cap).map(ending).collect();
    t.books().merge_penalties(&all);
    let s = t.tier_stats();
    assert_eq!(
        (s.live, s.penalties_evicted, s.penalties_refused),
        (half, cap - half, 0)
    );
    let held = t.books().held_penalties(0);
    assert_eq!(held.len() as u64, half);
    assert!(held.iter().all(|p| p.key() > cap - half), "{held:?}");
    // One ending before every penalty held is refused.
    t.books().merge_penalties(&[ending(cap + 1000)]);
    t.books()
        .merge_penalties(&[Penalty(7, cap + 1, SEC as i64 / 2)]);
    let s = t.tier_stats();
    assert_eq!(
        (s.live, s.penalties_evicted, s.penalties_refused),
        (half, cap - half + 1, 1)
    );
    // Overrides: all `cap` have room, each penalty giving way in turn.
    let overrides: Vec<Override> = (1..=cap)
        .map(|k| over(k, 7, 10_000 + k, Rule::Deny, k))
        .collect();
    let report = t.books().apply_overrides(&overrides);
    assert_eq!((report.applied as u64, report.refused), (cap, 0));
    assert!(t.books().held_penalties(0).is_empty());
    // Past that the section is full of overrides: the next is refused.
    let report = t
        .books()
        .apply_overrides(&[over(cap + 1, 7, 20_000, Rule::Deny, cap + 1)]);
    assert_eq!(report.refused, 1);
    assert_eq!(t.tier_stats().refused, 1);
}
