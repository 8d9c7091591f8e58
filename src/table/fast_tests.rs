//! The named and keyed fast paths (`fast.rs`) against the general path:
//! the same outcomes and the same counts, whatever they decline.

use super::gate::fast::FAST_PASSES;
use super::*;
use crate::core::rng::Rng;
use crate::core::tier::PenaltyTime;
use crate::core::{Nanos, Quota, Window};

const MS: Nanos = 1_000_000;

/// A per-key template alone (`plain`, the fast path's case), one under a
/// parent (`child`), one counting windows (`windowed`), with bursts small
/// enough that checks reach the band and the limit.
fn table(fast: bool) -> Table {
    let t = Table::new_heap_with_keys(16, 16, 64);
    let t = if fast { t } else { t.without_fast_path() };
    t.books().apply_quotas(&[
        Quota::new(1, "plain", 20.0, 6.0, 10.0).keyed(),
        Quota::new(2, "parent", 50.0, 40.0, 40.0),
        Quota::new(3, "child", 20.0, 6.0, 10.0)
            .with_parent(Some(2))
            .keyed(),
        Quota::new(4, "windowed", 8.0, 8.0, 8.0)
            .windowed(Window::TenSeconds, false)
            .keyed(),
    ]);
    t
}

/// Named quotas: one alone (`solo`) and one under a parent and a
/// grandparent (`leaf`, under `under`, under `top`), the named fast
/// path's cases; one counting windows (`windowed`), one with a penalty
/// (`penalized`, flagged for the tier section, started by a rejection at
/// its high burst), one under each of those (`timed`, `guarded`) and a
/// per-key template (`keyed`), with bursts small enough that checks reach
/// the band and the limit.
fn named_table(fast: bool) -> Table {
    let t = Table::new_heap_with(16, 16, 64, 64);
    let t = if fast { t } else { t.without_fast_path() };
    t.books().apply_quotas(&[
        Quota::new(1, "solo", 5.0, 6.0, 10.0),
        Quota::new(2, "top", 8.0, 12.0, 12.0),
        Quota::new(3, "under", 5.0, 6.0, 10.0).with_parent(Some(2)),
        Quota::new(4, "windowed", 8.0, 8.0, 8.0).windowed(Window::TenSeconds, false),
        Quota::new(5, "penalized", 5.0, 6.0, 6.0)
            .penalized(Some(PenaltyTime::parse("1m").unwrap())),
        Quota::new(6, "keyed", 5.0, 6.0, 10.0).keyed(),
        Quota::new(7, "leaf", 5.0, 6.0, 10.0).with_parent(Some(3)),
        Quota::new(8, "timed", 5.0, 6.0, 10.0).with_parent(Some(4)),
        Quota::new(9, "guarded", 5.0, 6.0, 10.0).with_parent(Some(5)),
    ]);
    t
}

fn check(t: &Table, name: &[u8], key: &[u8], weight: u64, now: Nanos, rng: &mut Rng) -> Outcome {
    check_item(t, name, Some(key), weight, now, rng)
}

fn check_item(
    t: &Table,
    name: &[u8],
    key: Option<&[u8]>,
    weight: u64,
    now: Nanos,
    rng: &mut Rng,
) -> Outcome {
    let item = CheckItem {
        name,
        key,
        weight,
        max_wait: None,
    };
    t.gate()
        .check_many(&[item], now, CheckOptions::default(), || rng.next_unit())
        .outcome
}

/// A key's hash, template, pending weight and level (bits).
type KeyCounts = (u64, u32, i64, u64);

/// A quota's name, pending weight, passes and rejections.
type QuotaCounts = (String, i64, u64, u64);

/// Every key's counter and every quota's counts, in a comparable order.
fn counts(t: &Table, now: Nanos) -> (Vec<KeyCounts>, Vec<QuotaCounts>) {
    let mut keys: Vec<_> = t
        .keys(None, now)
        .into_iter()
        .map(|k| (k.hash, k.template, k.pending, k.level.to_bits()))
        .collect();
    keys.sort_unstable();
    let quotas = t
        .quotas(now)
        .into_iter()
        .map(|q| (q.quota.name.clone(), q.pending, q.passed, q.rejected))
        .collect();
    (keys, quotas)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Any sequence of keyed checks (of the fast path's template and the
    /// kinds it declines, keys new and known, weights from 0 up, near the
    /// limit and far from it) gets the same outcomes and leaves the same
    /// counts with the fast path as without it.
    #[test]
    fn the_fast_path_decides_and_counts_as_the_general_path(
        seed in 0u64..u64::MAX,
        steps in proptest::collection::vec((0usize..4, 0u8..6, 0u64..4, 0u64..120), 1..200),
    ) {
        let names: [&[u8]; 4] = [b"plain", b"child", b"windowed", b"nothing"];
        let (fast, slow) = (table(true), table(false));
        let (mut r1, mut r2) = (Rng::new(seed), Rng::new(seed));
        let mut now = 1_000 * MS;
        FAST_PASSES.with(|n| n.set(0));
        for (name, key, weight, advance) in steps {
            now += advance * MS;
            let key = [b'k', key];
            let a = check(&fast, names[name], &key, weight, now, &mut r1);
            let b = check(&slow, names[name], &key, weight, now, &mut r2);
            proptest::prop_assert_eq!(a, b);
        }
        proptest::prop_assert_eq!(counts(&fast, now), counts(&slow, now));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Any sequence of checks without a key (or with an empty one) of
    /// the named fast path's quota and the kinds it declines, weights
    /// from 0 up, near the limit and far from it, with the counted weight
    /// folded into the levels now and then (as with no roots), gets the
    /// same outcomes and leaves the same counts with the fast path as
    /// without it.
    #[test]
    fn the_named_fast_path_decides_and_counts_as_the_general_path(
        seed in 0u64..u64::MAX,
        steps in proptest::collection::vec((0usize..11, proptest::bool::ANY, 0u64..4, 0u64..400), 1..200),
    ) {
        let names: [&[u8]; 10] = [
            b"solo", b"top", b"under", b"leaf", b"windowed", b"timed", b"penalized", b"guarded",
            b"keyed", b"nothing",
        ];
        let (fast, slow) = (named_table(true), named_table(false));
        let (mut r1, mut r2) = (Rng::new(seed), Rng::new(seed));
        let mut now = 1_000 * MS;
        for (name, empty_key, weight, advance) in steps {
            now += advance * MS;
            if name == names.len() {
                fast.books().fold_local(now);
                slow.books().fold_local(now);
                continue;
            }
            let key = empty_key.then_some(&b""[..]);
            let a = check_item(&fast, names[name], key, weight, now, &mut r1);
            let b = check_item(&slow, names[name], key, weight, now, &mut r2);
            proptest::prop_assert_eq!(a, b);
        }
        proptest::prop_assert_eq!(counts(&fast, now), counts(&slow, now));
    }
}

#[test]
fn a_named_quota_far_from_its_limit_is_decided_on_the_fast_path() {
    let t = named_table(true);
    let mut rng = Rng::new(1);
    FAST_PASSES.with(|n| n.set(0));
    // The first check finds no hint: the general path, which sets it.
    assert_eq!(check_item(&t, b"solo", None, 1, 0, &mut rng), Outcome::Pass);
    assert_eq!(FAST_PASSES.with(|n| n.get()), 0);
    for i in 1..=4 {
        assert_eq!(check_item(&t, b"solo", None, 1, 0, &mut rng), Outcome::Pass);
        assert_eq!(FAST_PASSES.with(|n| n.get()), i);
    }
    // At 5 of a low burst of 6 a unit more might not pass for sure: the
    // general path takes it, and the next one is over the high burst.
    assert_eq!(check_item(&t, b"solo", None, 1, 0, &mut rng), Outcome::Pass);
    assert_eq!(FAST_PASSES.with(|n| n.get()), 4);
    assert!(matches!(
        check_item(&t, b"solo", None, 10, 0, &mut rng),
        Outcome::Reject(_)
    ));
    let q = t.quota(b"solo", 0).unwrap();
    assert_eq!((q.passed, q.rejected, q.pending), (6, 1, 6));
    // The first weight since the last collection queued the quota.
    let mut deltas = Vec::new();
    t.books().collect_deltas(&mut deltas);
    assert_eq!(deltas.len(), 1);
    // A quota under a parent and a grandparent: counted in all three.
    for i in 0..4 {
        assert_eq!(check_item(&t, b"leaf", None, 1, 0, &mut rng), Outcome::Pass);
        assert_eq!(FAST_PASSES.with(|n| n.get()), 4 + i);
    }
    for (name, passed, pending) in [("leaf", 4, 4), ("under", 0, 4), ("top", 0, 4)] {
        let q = t.quota(name.as_bytes(), 0).unwrap();
        assert_eq!((q.passed, q.pending), (passed, pending), "{name}");
    }
    // The kinds it declines never take it.
    for name in [&b"windowed"[..], b"timed", b"penalized", b"guarded"] {
        for _ in 0..3 {
            assert_eq!(check_item(&t, name, None, 1, 0, &mut rng), Outcome::Pass);
        }
    }
    assert_eq!(
        check_item(&t, b"keyed", None, 1, 0, &mut rng),
        Outcome::NoKey
    );
    assert_eq!(FAST_PASSES.with(|n| n.get()), 7);
}

#[test]
fn a_known_key_far_from_its_limit_is_decided_on_the_fast_path() {
    let t = table(true);
    let mut rng = Rng::new(1);
    FAST_PASSES.with(|n| n.set(0));
    // The first check finds no hint and no entry: the general path.
    assert_eq!(check(&t, b"plain", b"a", 1, 0, &mut rng), Outcome::Pass);
    assert_eq!(FAST_PASSES.with(|n| n.get()), 0);
    for i in 1..=4 {
        assert_eq!(check(&t, b"plain", b"a", 1, 0, &mut rng), Outcome::Pass);
        assert_eq!(FAST_PASSES.with(|n| n.get()), i);
    }
    // At 5 of a low burst of 6 a unit more might not pass for sure: the
    // general path takes it, and the next one is over the high burst.
    assert_eq!(check(&t, b"plain", b"a", 1, 0, &mut rng), Outcome::Pass);
    assert_eq!(FAST_PASSES.with(|n| n.get()), 4);
    assert!(matches!(
        check(&t, b"plain", b"a", 10, 0, &mut rng),
        Outcome::Reject(_)
    ));
    let q = t.quota(b"plain", 0).unwrap();
    assert_eq!((q.passed, q.rejected), (6, 1));
    let keys = t.keys(None, 0);
    assert_eq!((keys.len(), keys[0].pending), (1, 6));
    // The kinds it declines never take it.
    for name in [&b"child"[..], b"windowed"] {
        for _ in 0..3 {
            assert_eq!(check(&t, name, b"a", 1, 0, &mut rng), Outcome::Pass);
        }
    }
    assert_eq!(FAST_PASSES.with(|n| n.get()), 4);
}

#[test]
fn a_table_without_the_pass_tally_counts_the_same_but_no_passes() {
    let t = Table::new_heap_with_keys(16, 16, 64).without_pass_tally();
    t.books()
        .apply_quotas(&[Quota::new(1, "plain", 20.0, 6.0, 6.0).keyed()]);
    let mut rng = Rng::new(1);
    for _ in 0..6 {
        assert_eq!(check(&t, b"plain", b"a", 1, 0, &mut rng), Outcome::Pass);
    }
    assert!(matches!(
        check(&t, b"plain", b"a", 1, 0, &mut rng),
        Outcome::Reject(_)
    ));
    let q = t.quota(b"plain", 0).unwrap();
    assert_eq!((q.passed, q.rejected), (0, 1));
    assert_eq!(t.keys(None, 0)[0].pending, 6);
}
