//! Tiers per key (issue 25): what the hot path of a key without an
//! override pays for tiers, and the zone memory of an override. Results
//! go to BENCHMARKS.md ("Tiers").
//!
//! Same run, same key section, same keys; the only difference is the
//! template:
//!
//! - `tiers/hot_plain` and `tiers/hot_flagged`: one key (always in
//!   cache), of a template without overrides, and of one whose 1,000,000
//!   other keys have overrides (its slot flagged: the check tests the
//!   tier mark in the key's own entry, which says there is nothing);
//! - `tiers/random_plain` and `tiers/random_flagged`: a random key among
//!   1,000,000 live ones (cache misses), the same two templates;
//! - `tiers/hot_overridden`: a key with an override of its own (the cold
//!   path: its entry is marked, so the check looks in the table);
//! - printed: zone bytes per override, from the region's geometry;
//! - printed: the two pairs again, interleaved (`tiers ab`): rounds of
//!   64Ki checks of one template then 64Ki of the other, the first of
//!   the two alternating, and the median of each and of the rounds'
//!   differences. Criterion measures one benchmark after the other, so on
//!   a machine whose load moves the later one of a pair pays for it; the
//!   interleaved rounds see the same load.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::core::rng::Rng;
use sluice::core::tier::{Override, Rule};
use sluice::core::Quota;
use sluice::table::geometry::Geometry;
use sluice::table::{CheckItem, CheckOptions, Outcome, Table};

/// Overrides held by the flagged template.
const OVERRIDES: u64 = 1_000_000;
/// Live keys of the random benchmarks.
const LIVE: u64 = 1_000_000;

/// A table with two templates that never reject: `plain` and `tiered`,
/// room for 4M keys and for [`OVERRIDES`] overrides.
fn table() -> Table {
    let t = Table::new_heap_with(16, 16, 4 * LIVE, OVERRIDES + 1);
    t.books().apply_quotas(&[
        Quota::new(1, "plain", 1e12, 1e15, 1e15).keyed(),
        Quota::new(2, "tiered", 1e12, 1e15, 1e15).keyed(),
    ]);
    t
}

/// The `i`-th key: 16 bytes, like a short token.
fn key(i: u64) -> [u8; 16] {
    let mut k = [b'k'; 16];
    k[8..].copy_from_slice(&i.to_le_bytes());
    k
}

/// Gives `tiered` [`OVERRIDES`] overrides, none for the keys checked
/// (those are below [`LIVE`]).
fn override_others(t: &Table) {
    let secret = t.key_secret();
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..OVERRIDES {
        batch.push(Override {
            id: i + 1,
            quota: 2,
            key: secret.hash(&key(10 * LIVE + i)),
            rule: Rule::Limit {
                limit: 1e12,
                low_burst: 1e15,
                high_burst: 1e15,
            },
            expires_ms: None,
            epoch: i + 1,
            deleted: false,
        });
        if batch.len() == batch.capacity() {
            let report = t.books().apply_overrides(&batch);
            assert_eq!(report.refused, 0, "the section holds them all");
            batch.clear();
        }
    }
    t.books().apply_overrides(&batch);
}

fn check(t: &Table, name: &[u8], key: &[u8], now: u64) -> bool {
    let item = CheckItem {
        name,
        key: Some(key),
        weight: 1,
        max_wait: None,
    };
    t.gate()
        .check_many(&[item], now, CheckOptions::default(), || 0.5)
        .outcome
        == Outcome::Pass
}

/// Zone bytes per override: the region with room for `n` overrides less
/// the region without, over `n`.
fn memory_report() {
    for n in [50_000u64, 1_000_000] {
        let base = Geometry::new(16, 16).with_keys(1 << 20);
        let bytes = base.with_tiers(n).region_len() - base.region_len();
        eprintln!(
            "tiers memory: {n} overrides take {bytes} bytes of zone, {:.1} bytes each",
            bytes as f64 / n as f64
        );
    }
}

/// Checks per round of [`interleaved`].
const ROUND: usize = 1 << 16;

/// Nanoseconds a check of `name` took over one round through `picks`.
fn round(t: &Table, name: &[u8], picks: &[[u8; 16]], now: u64) -> f64 {
    let start = Instant::now();
    for k in picks {
        black_box(check(t, name, black_box(k), now));
    }
    start.elapsed().as_nanos() as f64 / picks.len() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `plain` against `tiered` in alternating rounds over the same keys
/// (see the crate doc), printed.
fn interleaved(t: &Table, what: &str, picks: &[[u8; 16]], now: u64) {
    let (mut plain, mut flagged, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..41 {
        let (p, f) = if r % 2 == 0 {
            let p = round(t, b"plain", picks, now);
            (p, round(t, b"tiered", picks, now))
        } else {
            let f = round(t, b"tiered", picks, now);
            (round(t, b"plain", picks, now), f)
        };
        plain.push(p);
        flagged.push(f);
        diff.push(f - p);
    }
    eprintln!(
        "tiers ab {what}: plain {:.1} ns, flagged {:.1} ns, flagged - plain {:+.1} ns (median of 41 rounds of {ROUND})",
        median(plain),
        median(flagged),
        median(diff)
    );
}

fn bench_tiers(c: &mut Criterion) {
    memory_report();
    let now = sluice::clock::now();
    let t = table();
    override_others(&t);
    let stats = t.tier_stats();
    eprintln!("tiers: {} overrides held of {}", stats.live, stats.capacity);
    for i in 0..LIVE {
        check(&t, b"plain", &key(i), now);
        check(&t, b"tiered", &key(i), now);
    }
    eprintln!("tiers: {} live keys", t.key_stats().live);
    let mut g = c.benchmark_group("tiers");
    let hot = b"a-user-token-0001";
    g.bench_function("hot_plain", |b| {
        b.iter(|| check(&t, b"plain", black_box(hot), now))
    });
    g.bench_function("hot_flagged", |b| {
        b.iter(|| check(&t, b"tiered", black_box(hot), now))
    });
    let mut rng = Rng::new(7);
    let picks: Vec<[u8; 16]> = (0..1 << 16).map(|_| key(rng.next_u64() % LIVE)).collect();
    let mut i = 0usize;
    g.bench_function("random_plain", |b| {
        b.iter(|| {
            i = (i + 1) & (picks.len() - 1);
            check(&t, b"plain", black_box(&picks[i]), now)
        })
    });
    g.bench_function("random_flagged", |b| {
        b.iter(|| {
            i = (i + 1) & (picks.len() - 1);
            check(&t, b"tiered", black_box(&picks[i]), now)
        })
    });
    let overridden = key(10 * LIVE);
    g.bench_function("hot_overridden", |b| {
        b.iter(|| check(&t, b"tiered", black_box(&overridden), now))
    });
    g.finish();
    // Not under `cargo test`, which runs each benchmark once.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mut hot_key = [0u8; 16];
    hot_key.copy_from_slice(&hot[..16]);
    interleaved(&t, "hot", &vec![hot_key; ROUND], now);
    interleaved(&t, "random", &picks, now);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_tiers
}
criterion_main!(benches);
