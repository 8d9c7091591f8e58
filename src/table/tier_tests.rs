//! The tier section: overrides applied to a key's checks, allow and deny,
//! penalties started, enforced, sent and merged, and the table's
//! lookups through removals and filter rebuilds.

use std::collections::HashMap;

use super::*;
use crate::core::tier::{Override, Penalty, PenaltyTime, Rule};
use crate::core::{Nanos, Quota};

const SEC: Nanos = 1_000_000_000;

fn never() -> f64 {
    0.999_999
}

/// `api` (1000/s) over `api_user`, a per-key template (1/s, burst 3),
/// and `login` (1/s, burst 2) with a 15-minute penalty.
fn tiered_table() -> Table {
    let t = Table::new_heap_with(16, 16, 256, 256);
    t.apply_quotas(&[
        Quota::new(1, "api", 1000.0, 1000.0, 1000.0),
        Quota::new(2, "api_user", 1.0, 3.0, 3.0)
            .with_parent(Some(1))
            .keyed(),
        Quota::new(3, "login", 1.0, 2.0, 2.0).penalized(Some(PenaltyTime::parse("15m").unwrap())),
    ]);
    t
}

fn check(t: &Table, name: &[u8], key: Option<&[u8]>, now: Nanos) -> Outcome {
    let item = CheckItem {
        name,
        key,
        weight: 1,
        max_wait: None,
    };
    t.check_many(&[item], now, CheckOptions::default(), never)
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
    assert_eq!(t.apply_overrides(&[over(1, 2, paid, limit, 5)]).applied, 1);
    assert_eq!(passes(&t, b"api_user", Some(b"paid"), 20, 0), 10);
    assert_eq!(passes(&t, b"api_user", Some(b"free"), 20, 0), 3);
    t.fold_local(0);
    // Removed: the template's numbers again, from the next check on.
    let mut gone = over(1, 2, paid, limit, 6);
    gone.deleted = true;
    assert_eq!(t.apply_overrides(&[gone]).removed, 1);
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
    t.apply_overrides(&[over(1, 2, partner, Rule::Allow, 5)]);
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
    t.apply_overrides(&[over(1, 2, stolen, Rule::Deny, 5)]);
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
    t.apply_overrides(&[expiring]);
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
    t.fold_local(0);
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
        t.take_started_penalties(),
        [Penalty(3, 0, 900 * SEC as i64)]
    );
    assert_eq!(t.take_started_penalties(), []);
}

#[test]
fn a_draw_in_the_band_starts_no_penalty() {
    let t = Table::new_heap_with(16, 16, 0, 64);
    t.apply_quotas(&[
        Quota::new(1, "login", 1.0, 1.0, 10.0).penalized(Some(PenaltyTime::parse("1m").unwrap()))
    ]);
    let always = || 0.0;
    let item = CheckItem {
        name: b"login",
        key: None,
        weight: 1,
        max_wait: None,
    };
    t.check_many(&[item], 0, CheckOptions::default(), never);
    // Level 1 of a band 1..10: a draw of 0 rejects, without a penalty.
    match t
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
    let t = tiered_table();
    t.apply_quotas(&[Quota::new(2, "api_user", 1.0, 3.0, 3.0)
        .with_parent(Some(1))
        .keyed()
        .penalized(Some(PenaltyTime::parse("1m").unwrap()))
        .at_epoch(2)]);
    assert_eq!(passes(&t, b"api_user", Some(b"bot"), 4, 0), 3);
    t.fold_local(0);
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
        t.take_started_penalties(),
        [Penalty(2, bot, 60 * SEC as i64)]
    );
    // Another host's longer penalty of another key arrives by sync.
    let other = t.key_secret().hash(b"human");
    let merged = [
        Penalty(2, other, 200 * SEC as i64),
        Penalty(2, bot, 10 * SEC as i64),
    ];
    assert_eq!(
        t.merge_penalties(&merged),
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
        t.take_started_penalties().is_empty(),
        "merged ones are not resent"
    );
    assert_eq!(
        t.held_penalties(100 * SEC as i64),
        [Penalty(2, other, 200 * SEC as i64)]
    );
    // Ended penalties leave the section.
    t.sweep_tiers(300 * SEC as i64);
    assert_eq!(t.tiers().len(), 2, "the two quotas' penalty lengths");
}

#[test]
fn a_parent_under_a_penalty_bars_its_children() {
    let t = Table::new_heap_with(16, 16, 0, 64);
    t.apply_quotas(&[
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
    t.check_many(&[item], 0, options, never);
    assert_eq!(t.tier_stats().started, 0);
}

#[test]
fn lookups_survive_any_mix_of_inserts_and_removals() {
    let t = Table::new_heap_with(16, 16, 0, 200);
    t.apply_quotas(&[Quota::new(7, "t", 1.0, 1.0, 1.0).keyed()]);
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
            t.apply_overrides(&[o]);
            model.remove(&victim);
        } else {
            let limit = epoch as f64;
            let rule = Rule::Limit {
                limit,
                low_burst: limit,
                high_burst: limit,
            };
            assert_eq!(
                t.apply_overrides(&[over(epoch, 7, key, rule, epoch)])
                    .refused,
                0
            );
            model.insert(key, limit);
        }
        if epoch % 500 == 0 {
            t.sweep_tiers(0);
        }
    }
    t.sweep_tiers(0);
    for key in 1..=300 {
        let found = t.tier(7, key).map(|r| r.limit);
        assert_eq!(found, model.get(&key).copied(), "key {key}");
        if model.contains_key(&key) {
            assert!(t.tier_filter_holds(7, key), "key {key}");
        }
    }
    assert_eq!(t.tier_stats().live as usize, model.len());
}

#[test]
fn a_full_section_refuses_and_keeps_what_it_has() {
    let t = Table::new_heap_with(16, 16, 0, 64);
    t.apply_quotas(&[Quota::new(7, "t", 1.0, 1.0, 1.0).keyed()]);
    let overrides: Vec<Override> = (1..=100).map(|k| over(k, 7, k, Rule::Allow, k)).collect();
    let report = t.apply_overrides(&overrides);
    assert_eq!(report.applied as u64, t.tier_capacity());
    assert_eq!(report.refused as u64, 100 - t.tier_capacity());
    assert!(t.tier(7, 1).is_some());
    assert_eq!(t.tier_stats().refused as usize, report.refused);
}

#[test]
fn a_table_without_a_tier_section_ignores_tiers() {
    let t = Table::new_heap_with(16, 16, 64, 0);
    t.apply_quotas(&[
        Quota::new(1, "login", 1.0, 1.0, 1.0).penalized(Some(PenaltyTime::parse("1m").unwrap()))
    ]);
    assert_eq!(
        t.apply_overrides(&[over(1, 1, 5, Rule::Deny, 2)]).refused,
        1
    );
    assert_eq!(passes(&t, b"login", None, 3, 0), 1);
    t.fold_local(0);
    assert_eq!(t.merge_penalties(&[Penalty(1, 0, i64::MAX)]), 0);
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
    let grant = t.charge(&item, SEC);
    assert_eq!((grant.outcome, grant.granted), (Outcome::Pass, 5));
}
