//! Window quotas in the table (counted per window, started over at each
//! boundary, merged and folded by window, per key too), partial grants
//! and reservations.

use super::*;
use crate::core::{Level, Nanos, Quota, Tally, Window};

const SEC: Nanos = 1_000_000_000;

fn never() -> f64 {
    0.999_999
}

/// A table (UTC offset 0: its clock is UTC) with `q`, 5 per 10 s window.
fn window_table(sliding: bool) -> Table {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books()
        .apply_quotas(&[Quota::new(1, "q", 5.0, 5.0, 5.0).windowed(Window::TenSeconds, sliding)]);
    t
}

fn passes(t: &Table, name: &[u8], weight: u64, now: Nanos) -> bool {
    t.gate().check_with(name, weight, now, never) == Outcome::Pass
}

#[test]
fn a_fixed_window_admits_its_limit_and_starts_over_at_the_boundary() {
    let t = window_table(false);
    // Standalone: the own weight is folded as the sync thread would.
    for i in 0..5 {
        assert!(passes(&t, b"q", 1, SEC + i * SEC / 10), "request {i}");
    }
    assert!(!passes(&t, b"q", 1, 2 * SEC));
    t.books().fold_local(3 * SEC);
    assert!(!passes(&t, b"q", 1, 9 * SEC));
    // Nothing leaked: 8 s later it is still full; the next window is empty.
    t.books().fold_local(10 * SEC + SEC / 2);
    assert!(passes(&t, b"q", 5, 10 * SEC + SEC / 2));
    assert!(!passes(&t, b"q", 1, 11 * SEC));
}

#[test]
fn weight_folded_just_after_a_boundary_counts_in_the_window_before() {
    let t = window_table(false);
    assert!(passes(&t, b"q", 5, 9 * SEC));
    // The sync thread wakes a few ms after the boundary.
    t.books().fold_local(10 * SEC + 3_000_000);
    let state = t.quota(b"q", 10 * SEC + 4_000_000).unwrap();
    assert_eq!(state.level, 0.0, "the new window starts empty");
    assert!(passes(&t, b"q", 5, 10 * SEC + 4_000_000));
}

#[test]
fn a_sliding_window_weighs_the_previous_window() {
    let t = window_table(true);
    assert!(passes(&t, b"q", 4, 5 * SEC));
    t.books().fold_local(6 * SEC);
    // 2.5 s into the next window, 3/4 of the 4 still count: 3 + 2 > 5.
    assert!(!passes(&t, b"q", 3, 12 * SEC + SEC / 2));
    assert!(passes(&t, b"q", 2, 12 * SEC + SEC / 2));
    t.books().fold_local(13 * SEC);
    let state = t.quota(b"q", 15 * SEC).unwrap();
    assert!(
        (state.level - (2.0 + 4.0 * 0.5)).abs() < 1e-6,
        "{}",
        state.level
    );
}

#[test]
fn a_root_value_merges_by_window() {
    let t = window_table(false);
    let slot = t.gate().lookup(b"q").unwrap();
    assert!(passes(&t, b"q", 1, SEC));
    let mut deltas = Vec::new();
    t.books().collect_deltas(&mut deltas);
    // The fleet counted 3 in this window, our 1 included.
    let value = Tally {
        level: 3.0,
        prev: 0.0,
        at: 2 * SEC,
    };
    assert!(t.books().merge_counter(slot, 1, 0, value, 1, 0));
    // The fleet's 3, and the others' weight that had not reached the root
    // yet (their measured rate over a quarter of the horizon).
    let level = t.quota(b"q", 2 * SEC).unwrap().level;
    assert!((3.0..3.5).contains(&level), "{level}");
    // Later on, the others' measured rate is extrapolated within the window.
    assert!(t.quota(b"q", 3 * SEC).unwrap().level > level);
    assert!(passes(&t, b"q", 1, 2 * SEC));
    assert!(!passes(&t, b"q", 1, 2 * SEC));
    // In the next window, a late value of the last one changes nothing.
    t.books().fold_local(10 * SEC + 2_000_000);
    assert!(passes(&t, b"q", 2, 12 * SEC));
    t.books().fold_local(12 * SEC);
    let before = t.quota(b"q", 12 * SEC).unwrap().level;
    assert!(before >= 2.0, "{before}");
    let old = Tally {
        level: 50.0,
        prev: 0.0,
        at: 5 * SEC,
    };
    assert!(t.books().merge_counter(slot, 1, 0, old, 0, 0));
    assert_eq!(t.quota(b"q", 12 * SEC).unwrap().level, before);
}

#[test]
fn a_quota_that_changes_how_it_counts_starts_over() {
    let t = window_table(false);
    assert!(passes(&t, b"q", 5, SEC));
    t.books().fold_local(SEC);
    t.books().apply_quotas(&[Quota::new(1, "q", 5.0, 5.0, 5.0)
        .windowed(Window::TenSeconds, false)
        .at_epoch(2)]);
    assert_eq!(t.quota(b"q", SEC).unwrap().level, 5.0, "same window: kept");
    t.books().apply_quotas(&[Quota::new(1, "q", 5.0, 5.0, 5.0)
        .windowed(Window::Minute, false)
        .at_epoch(3)]);
    assert_eq!(t.quota(b"q", SEC).unwrap().level, 0.0, "another window");
    assert!(passes(&t, b"q", 5, SEC));
    t.books().fold_local(SEC);
    t.books()
        .apply_quotas(&[Quota::new(1, "q", 5.0, 5.0, 5.0).at_epoch(4)]);
    assert_eq!(t.quota(b"q", SEC).unwrap().level, 0.0, "leaky now");
}

#[test]
fn the_utc_offset_places_the_windows() {
    let t = window_table(false);
    // Local 0 is UTC 8 s: the window ends at local 2 s.
    t.set_utc_offset(8 * SEC as i64);
    assert!(passes(&t, b"q", 5, SEC));
    t.books().fold_local(SEC);
    assert!(!passes(&t, b"q", 1, SEC + SEC / 2));
    t.books().fold_local(2 * SEC + SEC / 10);
    assert!(passes(&t, b"q", 1, 2 * SEC + SEC / 10));
    assert_eq!(t.windows_used(), vec![Window::TenSeconds]);
}

#[test]
fn keys_of_a_window_template_count_per_window() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books()
        .apply_quotas(&[Quota::new(1, "per_user", 3.0, 3.0, 3.0)
            .keyed()
            .windowed(Window::Minute, false)]);
    let check = |key: &[u8], now| check_key(&t, b"per_user", key, 1, now);
    for i in 0..3 {
        assert_eq!(check(b"alice", SEC + i), Outcome::Pass);
    }
    assert!(matches!(check(b"alice", 2 * SEC), Outcome::Reject(_)));
    assert_eq!(check(b"bob", 2 * SEC), Outcome::Pass);
    t.books().fold_local(30 * SEC);
    assert!(matches!(check(b"alice", 59 * SEC), Outcome::Reject(_)));
    t.books().fold_local(60 * SEC + 2_000_000);
    assert_eq!(check(b"alice", 61 * SEC), Outcome::Pass);
    // A root's value for the key, in this window.
    let slot = t.gate().lookup(b"per_user").unwrap();
    let alice = t.key_secret().hash(b"alice");
    let value = Tally::leaky(Level {
        level: 3.0,
        at: 61 * SEC,
    });
    assert!(t.books().merge_counter(slot, 1, alice, value, 0, 0));
    assert!(matches!(check(b"alice", 62 * SEC), Outcome::Reject(_)));
    // Drained once its window is over: its entry can be reused.
    assert!(t.keys(Some(slot), 125 * SEC).iter().all(|k| k.level <= 1.0));
}

/// The outcome of a check of `key` of the per-key quota `name`.
fn check_key(t: &Table, name: &[u8], key: &[u8], weight: u64, now: Nanos) -> Outcome {
    let item = CheckItem {
        name,
        key: Some(key),
        weight,
        max_wait: None,
    };
    t.gate()
        .check_many(&[item], now, CheckOptions::default(), never)
        .outcome
}

/// A table with room for 64 keys and `per_token`, a per-key quota of
/// `limit` per sliding 10 s window.
fn sliding_per_token(limit: f64) -> Table {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books()
        .apply_quotas(&[Quota::new(1, "per_token", limit, limit, limit)
            .keyed()
            .windowed(Window::TenSeconds, true)]);
    t
}

/// A table with `per_token`, a per-key quota of 4 per sliding 10 s
/// window, and a check of one of its keys.
fn sliding_keys() -> (Table, impl Fn(&Table, &[u8], u64, Nanos) -> Outcome) {
    let t = sliding_per_token(4.0);
    (t, |t: &Table, key: &[u8], weight, now| {
        check_key(t, b"per_token", key, weight, now)
    })
}

#[test]
fn keys_of_a_sliding_template_weigh_their_previous_window() {
    let (t, check) = sliding_keys();
    assert_eq!(check(&t, b"alice", 4, 5 * SEC), Outcome::Pass);
    t.books().fold_local(6 * SEC);
    // 2.5 s into the next window, 3/4 of alice's 4 still count: 3 + 2 > 4.
    let later = 12 * SEC + SEC / 2;
    assert!(matches!(check(&t, b"alice", 2, later), Outcome::Reject(_)));
    assert_eq!(check(&t, b"alice", 1, later), Outcome::Pass);
    // Each key on its own counter.
    assert_eq!(check(&t, b"bob", 4, later), Outcome::Pass);
    // Folded into the new window, alice's 4 stay her previous count.
    t.books().fold_local(13 * SEC);
    let slot = t.gate().lookup(b"per_token").unwrap();
    let alice = t.key_secret().hash(b"alice");
    let level = |now| {
        t.keys(Some(slot), now)
            .into_iter()
            .find(|k| k.hash == alice)
            .map(|k| k.level)
            .unwrap()
    };
    // 1 this window, 4 x 1/2 of the last at 15 s.
    assert!((level(15 * SEC) - 3.0).abs() < 1e-6, "{}", level(15 * SEC));
    // Two windows on, nothing of either counts, and the key is drained.
    assert_eq!(level(30 * SEC), 0.0);
}

#[test]
fn a_sliding_keys_root_value_brings_its_previous_count() {
    let (t, check) = sliding_keys();
    let slot = t.gate().lookup(b"per_token").unwrap();
    let alice = t.key_secret().hash(b"alice");
    assert_eq!(check(&t, b"alice", 1, 11 * SEC), Outcome::Pass);
    // The fleet: 1 in this window (ours), 4 in the last one.
    let value = Tally {
        level: 1.0,
        prev: 4.0,
        at: 11 * SEC,
    };
    let mut deltas = Vec::new();
    t.books().collect_deltas(&mut deltas);
    assert!(t.books().merge_counter(slot, 1, alice, value, 1, 0));
    // At 12 s, 4 x 0.8 + 1 = 4.2 > 4: full; at 18 s, 4 x 0.2 + 1 = 1.8.
    assert!(matches!(
        check(&t, b"alice", 1, 12 * SEC),
        Outcome::Reject(_)
    ));
    assert_eq!(check(&t, b"alice", 2, 18 * SEC), Outcome::Pass);
    // Two values of one window merge to the larger previous count.
    let carol = t.key_secret().hash(b"carol");
    assert_eq!(check(&t, b"carol", 0, 11 * SEC), Outcome::Pass);
    for (prev, at) in [(4.0, 11 * SEC), (1.0, 13 * SEC)] {
        let value = Tally {
            level: 1.0,
            prev,
            at,
        };
        assert!(t.books().merge_counter(slot, 1, carol, value, 0, 0));
    }
    // At 15 s: 1 + 4 x 1/2 + 2 > 4 (with the smaller one, 3.5 would pass).
    assert!(matches!(
        check(&t, b"carol", 2, 15 * SEC),
        Outcome::Reject(_)
    ));
    assert_eq!(check(&t, b"carol", 1, 15 * SEC), Outcome::Pass);
}

/// Issue 38, item 4: a key of a sliding per-key template is extrapolated
/// between syncs at the other hosts' fill rate, as a named sliding quota
/// with the same counter is (its rate kept in 16 bits: within 0.4%).
#[test]
fn a_sliding_key_is_extrapolated_between_syncs_like_a_named_sliding_quota() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books().apply_quotas(&[
        Quota::new(1, "per_token", 100.0, 100.0, 100.0)
            .keyed()
            .windowed(Window::TenSeconds, true),
        Quota::new(2, "named", 100.0, 100.0, 100.0).windowed(Window::TenSeconds, true),
    ]);
    let key_slot = t.gate().lookup(b"per_token").unwrap();
    let named_slot = t.gate().lookup(b"named").unwrap();
    let alice = t.key_secret().hash(b"alice");
    assert_eq!(check_key(&t, b"per_token", b"alice", 0, 0), Outcome::Pass);
    // Two replies of root 1 a second apart: the others added 10 in the
    // window's first second and 20 in its second; 40 counted in the
    // window before.
    for (count, at) in [(10.0, SEC), (30.0, 2 * SEC)] {
        let value = Tally {
            level: count,
            prev: 40.0,
            at,
        };
        assert!(t.books().merge_counter(key_slot, 1, alice, value, 0, 1));
        assert!(t.books().merge_counter(named_slot, 2, 0, value, 0, 1));
    }
    let key = t.keys(Some(key_slot), 3 * SEC)[0];
    // 10/s, then 20/s, smoothed: 12.5/s.
    assert!((key.fill_rate - 12.5).abs() <= 12.5 * 0.004, "{key:?}");
    let named = t
        .quotas(3 * SEC)
        .into_iter()
        .find(|q| q.slot == named_slot)
        .unwrap()
        .level;
    // At 3 s: 30 known, 12.5/s of others from 1.5 s (a quarter of the 2 s
    // horizon before the known count) to now, 40 x 0.7 of the last window.
    let want = 30.0 + 12.5 * 1.5 + 40.0 * 0.7;
    assert!((named - want).abs() < 1e-6, "named {named}");
    assert!((key.level - want).abs() <= 0.1, "key {}", key.level);
    // Not extrapolated, 30 + 28 + 30 would pass: the others' 18.75
    // reject it.
    assert!(matches!(
        check_key(&t, b"per_token", b"alice", 30, 3 * SEC),
        Outcome::Reject(_)
    ));
    assert!(matches!(
        t.gate().check_with(b"named", 30, 3 * SEC, never),
        Outcome::Reject(_)
    ));
    assert_eq!(
        check_key(&t, b"per_token", b"alice", 20, 3 * SEC),
        Outcome::Pass
    );
    // At 10 s the last window counts whole: its 30, the others' 31.25
    // from 1.5 s up to the horizon (4 s), and this host's 20 in the new
    // one.
    let key = t.keys(Some(key_slot), 10 * SEC)[0];
    assert!((key.level - 81.25).abs() <= 0.1, "{key:?}");
}

/// A sliding key's fill rate lives in its entry's `dirty` word: entries
/// moved to make room keep their keys' rates, and new keys start without
/// one.
#[test]
fn a_sliding_keys_fill_rate_follows_it_through_moves() {
    let t = sliding_per_token(1e6);
    let slot = t.gate().lookup(b"per_token").unwrap();
    let key = |i: u32| format!("key {i}").into_bytes();
    for i in 0..40 {
        assert_eq!(check_key(&t, b"per_token", &key(i), 0, 0), Outcome::Pass);
        let hash = t.key_secret().hash(&key(i));
        // Each key its own rate: 10 (i + 1) a second, then 20 (i + 1).
        for (count, at) in [(10.0, SEC), (30.0, 2 * SEC)] {
            let value = Tally {
                level: count * f64::from(i + 1),
                prev: 0.0,
                at,
            };
            assert!(t.books().merge_counter(slot, 1, hash, value, 0, 1));
        }
    }
    let rates = |now| -> std::collections::HashMap<u64, f64> {
        t.keys(Some(slot), now)
            .iter()
            .map(|k| (k.hash, k.fill_rate))
            .collect()
    };
    let before = rates(2 * SEC);
    assert_eq!(before.len(), 40);
    assert!(before.values().all(|&r| r > 0.0), "{before:?}");
    let moved = t.key_stats().relocations;
    for i in 40..62 {
        check_key(&t, b"per_token", &key(i), 1, 2 * SEC);
    }
    assert!(t.key_stats().relocations > moved, "{:?}", t.key_stats());
    let after = rates(2 * SEC);
    for (hash, rate) in &before {
        assert_eq!(after.get(hash), Some(rate), "key {hash:x}");
    }
    for i in 40..62 {
        let hash = t.key_secret().hash(&key(i));
        assert!(after.get(&hash).is_none_or(|&r| r == 0.0), "key {i}");
    }
}

#[test]
fn a_window_rejection_waits_for_the_window_end() {
    let t = window_table(false);
    assert!(passes(&t, b"q", 5, SEC));
    let item = CheckItem {
        name: b"q",
        key: None,
        weight: 1,
        max_wait: None,
    };
    let out = t
        .gate()
        .check_many(&[item], 4 * SEC, CheckOptions::default(), never);
    let Outcome::Reject(rejection) = out.outcome else {
        panic!("{out:?}")
    };
    assert_eq!(rejection.wait, crate::core::Wait::Seconds(6.0));
}

fn item(name: &[u8], weight: u64) -> CheckItem<'_> {
    CheckItem {
        name,
        key: None,
        weight,
        max_wait: None,
    }
}

#[test]
fn obtain_grants_what_the_whole_chain_allows_and_counts_it() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[
        Quota::new(1, "parent", 100.0, 8.0, 8.0),
        Quota::new(2, "child", 100.0, 20.0, 30.0).with_parent(Some(1)),
    ]);
    let grant = t.gate().obtain(&item(b"child", 5), 0);
    assert_eq!((grant.outcome, grant.granted), (Outcome::Pass, 5));
    // The parent has 3 left.
    let grant = t.gate().obtain(&item(b"child", 10), 0);
    assert_eq!((grant.outcome, grant.granted), (Outcome::Pass, 3));
    let grant = t.gate().obtain(&item(b"child", 10), 0);
    let Outcome::Reject(rejection) = grant.outcome else {
        panic!("{grant:?}")
    };
    assert_eq!((grant.granted, rejection.depth), (0, 1));
    assert_eq!(t.quota(b"child", 0).unwrap().rejected, 1);
    assert_eq!(t.quota(b"parent", 0).unwrap().pending, 8);
    assert_eq!(
        t.gate().obtain(&item(b"nothing", 1), 0).outcome,
        Outcome::Unknown
    );
}

#[test]
fn obtain_on_a_window_quota_takes_the_rest_of_the_window() {
    let t = window_table(false);
    assert_eq!(t.gate().obtain(&item(b"q", 3), SEC).granted, 3);
    assert_eq!(t.gate().obtain(&item(b"q", 3), SEC).granted, 2);
    assert_eq!(t.gate().obtain(&item(b"q", 3), SEC).granted, 0);
    t.books().fold_local(10 * SEC + 2_000_000);
    assert_eq!(t.gate().obtain(&item(b"q", 30), 11 * SEC).granted, 5);
}

#[test]
fn reserve_counts_now_and_spaces_requests_at_the_limit() {
    let t = Table::new_heap(8, 16);
    // 10/s, a burst of 2 passes at once.
    t.books()
        .apply_quotas(&[Quota::new(1, "paced", 10.0, 2.0, 2.0)]);
    let waits: Vec<Nanos> = (0..6)
        .map(|_| {
            let r = t.gate().reserve(&item(b"paced", 1), SEC, 0);
            assert_eq!(r.outcome, Outcome::Pass);
            r.wait
        })
        .collect();
    // Two at once, then one every 100 ms.
    let ms: Vec<u64> = waits.iter().map(|w| w / 1_000_000).collect();
    assert_eq!(ms, [0, 0, 100, 200, 300, 400]);
    // One that would wait past max_wait is refused, uncounted.
    let r = t.gate().reserve(&item(b"paced", 1), 400_000_000, 0);
    let Outcome::Reject(rejection) = r.outcome else {
        panic!("{r:?}")
    };
    assert_eq!(r.wait, 500_000_000);
    assert_eq!(rejection.wait, crate::core::Wait::Seconds(0.5));
    assert_eq!(t.quota(b"paced", 0).unwrap().pending, 6);
    // Above high_burst: never.
    assert_eq!(
        t.gate().reserve(&item(b"paced", 3), SEC, 0).wait,
        Nanos::MAX
    );
}

#[test]
fn reserve_cannot_take_a_full_windows_next_window() {
    let t = window_table(false);
    assert_eq!(t.gate().reserve(&item(b"q", 5), SEC, SEC).wait, 0);
    let r = t.gate().reserve(&item(b"q", 1), 60 * SEC, 2 * SEC);
    assert!(matches!(r.outcome, Outcome::Reject(_)));
    assert_eq!(r.wait, 8 * SEC);
}

#[test]
fn a_paced_item_and_a_plain_one_pass_together_or_not_at_all() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[
        Quota::new(1, "plain", 100.0, 1.0, 1.0),
        Quota::new(2, "paced", 10.0, 1.0, 1.0),
    ]);
    let items = |plain_weight| {
        [
            item(b"plain", plain_weight),
            CheckItem {
                max_wait: Some(SEC),
                ..item(b"paced", 1)
            },
        ]
    };
    let out = t
        .gate()
        .check_many(&items(0), 0, CheckOptions::default(), never);
    assert_eq!((out.outcome, out.wait), (Outcome::Pass, 0));
    let out = t
        .gate()
        .check_many(&items(1), 0, CheckOptions::default(), never);
    assert_eq!((out.outcome, out.wait), (Outcome::Pass, 100_000_000));
    // The plain quota is full now: nothing is counted on the paced one.
    let out = t
        .gate()
        .check_many(&items(1), 0, CheckOptions::default(), never);
    assert!(matches!(out.outcome, Outcome::Reject(_)));
    assert_eq!(t.quota(b"paced", 0).unwrap().pending, 2);
}

#[test]
fn a_delayed_pass_names_the_item_with_the_longest_wait() {
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[
        Quota::new(1, "fast", 10.0, 1.0, 1.0),
        Quota::new(2, "slow", 2.0, 1.0, 1.0),
    ]);
    let paced = |name| CheckItem {
        max_wait: Some(10 * SEC),
        ..item(name, 1)
    };
    let items = [paced(b"fast".as_slice()), paced(b"slow".as_slice())];
    let out = t
        .gate()
        .check_many(&items, 0, CheckOptions::default(), never);
    assert_eq!((out.outcome, out.wait, out.item), (Outcome::Pass, 0, None));
    // Both full now: "fast" drains in 0.1 s, "slow" in 0.5 s.
    let out = t
        .gate()
        .check_many(&items, 0, CheckOptions::default(), never);
    assert_eq!(
        (out.outcome, out.wait, out.item),
        (Outcome::Pass, SEC / 2, Some(1))
    );
    // A rejection still names the item that rejected.
    let tight = [
        paced(b"fast".as_slice()),
        CheckItem {
            max_wait: Some(SEC / 10),
            ..item(b"slow", 1)
        },
    ];
    let out = t
        .gate()
        .check_many(&tight, 0, CheckOptions::default(), never);
    assert!(matches!(out.outcome, Outcome::Reject(_)));
    assert_eq!((out.item, out.wait), (Some(1), 0));
}

#[test]
fn a_window_quota_is_listed_and_adopted_with_its_window_and_terms() {
    let old = window_table(true);
    let listed = old.quota(b"q", 0).unwrap().quota;
    assert_eq!(
        (listed.window, listed.sliding),
        (Some(Window::TenSeconds), true)
    );
    let slot = old.gate().lookup(b"q").unwrap();
    assert_eq!(
        old.terms_of(slot).map(|t| t.to_string()).as_deref(),
        Some("5 / 10s sliding")
    );
    // A zone that changes size adopts the quotas as they are: a window
    // quota stays one.
    let new = Table::new_heap_with_keys(16, 16, 64);
    assert_eq!(new.books().adopt(old.books(), 0).inserted, 1);
    let adopted = new.quota(b"q", 0).unwrap().quota;
    assert_eq!(
        (adopted.window, adopted.sliding),
        (Some(Window::TenSeconds), true)
    );
}

/// Every window, fixed and sliding, is stored in a slot's flags and read
/// back as it was given (the epoch-aligned ones took codes past the first
/// seven, in a wider field).
#[test]
fn every_window_is_stored_and_listed_as_given() {
    for window in Window::ALL {
        for sliding in [false, true] {
            let t = Table::new_heap_with_keys(8, 16, 64);
            t.books()
                .apply_quotas(&[Quota::new(1, "q", 5.0, 5.0, 5.0).windowed(window, sliding)]);
            assert!(passes(&t, b"q", 1, SEC));
            let listed = t.quota(b"q", SEC).unwrap().quota;
            assert_eq!((listed.window, listed.sliding), (Some(window), sliding));
            assert_eq!(t.windows_used(), vec![window]);
            // Another quota beside it keeps its own way of counting.
            t.books()
                .apply_quotas(&[Quota::new(2, "leaky", 5.0, 5.0, 5.0).in_flight_if(true)]);
            let other = t.quota(b"leaky", SEC).unwrap().quota;
            assert_eq!((other.window, other.in_flight), (None, true));
        }
    }
}

/// A week of epoch time starts over when the epoch time divides by
/// 604,800 s (a Thursday), not on Monday as `7d` does.
#[test]
fn an_epoch_week_starts_over_when_the_epoch_divides_by_its_length() {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books().apply_quotas(&[
        Quota::new(1, "epoch", 5.0, 5.0, 5.0).windowed(Window::EpochWeek, false),
        Quota::new(2, "monday", 5.0, 5.0, 5.0).windowed(Window::Week, false),
    ]);
    let week = 604_800 * SEC;
    // Week 3 of the epoch, ends at 4 x 604,800 s; Monday weeks end three
    // days later (4 days into the epoch week).
    let before = 4 * week - SEC;
    assert!(passes(&t, b"epoch", 5, before));
    assert!(passes(&t, b"monday", 5, before));
    t.books().fold_local(before);
    assert!(!passes(&t, b"epoch", 1, before + SEC / 2));
    let after = 4 * week + 20_000_000;
    t.books().fold_local(after);
    assert_eq!(t.quota(b"epoch", after).unwrap().level, 0.0);
    assert_eq!(t.quota(b"monday", after).unwrap().level, 5.0);
    assert!(passes(&t, b"epoch", 5, after));
    assert!(!passes(&t, b"monday", 1, after));
}
