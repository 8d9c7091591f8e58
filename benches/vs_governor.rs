//! Keyed checks against `governor`'s keyed limiter, in one process and
//! one run (`make bench-governor`; numbers in BENCHMARKS.md, "Per-key
//! checks against governor").
//!
//! governor is the in-process peer a Rust user would reach for: a
//! `DashMap` of GCRA cells keyed by anything hashable. sluice is called
//! the way an embedding program calls it, through the C ABI
//! (`sluice_check_key`: argument checks, the panic boundary, the clock
//! read, the name lookup, the key's hash under the fleet secret, the
//! decision and the count). Both are given limits they never reach, so
//! every check passes and counts.
//!
//! - `hot`: one key, checked over and over (always in cache);
//! - `random_1m`: a random key among 1,000,000 live ones, the same
//!   sequence of keys for both (cache and TLB misses);
//! - `parts`: what parts of a hot check cost alone (each side's clock
//!   read and key hash; sluice's table check without the C ABI);
//! - printed: each side's memory per live key at 1,000,000 keys (governor:
//!   the process's resident memory before and after inserting them;
//!   sluice: the key section, which is allocated whole up front, divided
//!   by the keys it holds at 90% of its capacity).

use std::ffi::c_char;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use sluice::core::rng::Rng;

const KEYS: u64 = 1_000_000;
const NAME: &[u8] = b"per_key";

/// The `i`-th key: 16 bytes, like a short API token.
fn key(i: u64) -> [u8; 16] {
    let mut k = *b"tok-............";
    k[8..].copy_from_slice(&i.to_le_bytes());
    k
}

/// Starts the process-wide C ABI limiter with room for 1/0.9 of
/// [`KEYS`] keys (so a million live keys fill it to 90%) and one per-key
/// template that never rejects.
fn sluice_start() {
    let capacity = (KEYS as f64 / 0.9).ceil() as u64;
    let config = format!("{{\"capacity\": 16, \"key_capacity\": {capacity}}}\0");
    let quotas = concat!(
        r#"{"quotas": [{"name": "per_key", "limit": 1e12, "#,
        r#""low_burst": 1e15, "high_burst": 1e15, "per_key": true}]}"#,
        "\0"
    );
    // SAFETY: NUL-terminated strings that outlive the calls.
    unsafe {
        assert_eq!(sluice::ffi::sluice_init(config.as_ptr().cast()), 0);
        assert_eq!(
            sluice::ffi::sluice_load_quotas_json(quotas.as_ptr().cast()),
            0
        );
    }
}

fn sluice_check(k: &[u8; 16]) -> i32 {
    // SAFETY: both pointers are valid for the lengths given.
    unsafe {
        sluice::ffi::sluice_check_key(
            NAME.as_ptr().cast::<c_char>(),
            NAME.len(),
            k.as_ptr().cast::<c_char>(),
            k.len(),
            1,
        )
    }
}

type Governor = governor::DefaultKeyedRateLimiter<[u8; 16]>;

fn governor_start() -> Governor {
    let quota = Quota::per_second(NonZeroU32::new(u32::MAX).unwrap())
        .allow_burst(NonZeroU32::new(u32::MAX).unwrap());
    RateLimiter::keyed(quota)
}

/// Resident memory of this process, bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// The count an environment variable of the profiling modes gives.
fn env_count(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// A fixed sequence of random key indices, the same for both limiters.
fn random_indices(n: usize) -> Vec<u64> {
    let mut rng = Rng::new(0x5eed);
    (0..n).map(|_| rng.next_u64() % KEYS).collect()
}

fn bench(c: &mut Criterion) {
    sluice_start();
    // `HOT_ONLY=n`: n checks of one key and nothing else, for a profiler
    // (`valgrind --tool=callgrind` counts what one check costs).
    if let Some(n) = env_count("HOT_ONLY") {
        let hot = key(7);
        let passed = (0..n)
            .filter(|_| sluice_check(black_box(&hot)) == 0)
            .count();
        eprintln!("{passed} of {n} hot checks passed");
        return;
    }
    // `GOVERNOR_HOT_ONLY=n`: the same for governor, to compare.
    if let Some(n) = env_count("GOVERNOR_HOT_ONLY") {
        let gov = governor_start();
        let hot = key(7);
        let passed = (0..n)
            .filter(|_| gov.check_key(black_box(&hot)).is_ok())
            .count();
        eprintln!("{passed} of {n} hot governor checks passed");
        return;
    }
    // `RANDOM_ONLY=n`: n checks of random keys among the million, after
    // storing them, and nothing else (for `perf stat`, paired runs).
    if let Some(n) = env_count("RANDOM_ONLY") {
        for i in 0..KEYS {
            assert_eq!(sluice_check(&key(i)), 0, "key {i}");
        }
        let indices = random_indices(1 << 20);
        let took = timed(n, &indices, sluice_check);
        eprintln!("{:.1} ns a random check", took.as_nanos() as f64 / n as f64);
        return;
    }
    // `GOVERNOR_RANDOM_ONLY=n`: the same for governor, to compare in
    // alternating runs.
    if let Some(n) = env_count("GOVERNOR_RANDOM_ONLY") {
        let gov = governor_start();
        for i in 0..KEYS {
            assert!(gov.check_key(&key(i)).is_ok());
        }
        let indices = random_indices(1 << 20);
        let took = timed(n, &indices, |k| gov.check_key(k).is_ok() as i32);
        eprintln!(
            "{:.1} ns a random governor check",
            took.as_nanos() as f64 / n as f64
        );
        return;
    }
    let before = rss();
    let gov = governor_start();
    for i in 0..KEYS {
        assert!(gov.check_key(&key(i)).is_ok());
    }
    let governor_bytes = rss().saturating_sub(before);
    for i in 0..KEYS {
        assert_eq!(sluice_check(&key(i)), 0, "key {i}");
    }
    let (section, live, capacity) = sluice_memory();
    eprintln!(
        "memory at {KEYS} keys: governor {:.1} B per key (resident growth); sluice {:.1} B per \
         live key ({live} live of {capacity} entries, key section {section} bytes)",
        governor_bytes as f64 / KEYS as f64,
        section as f64 / live as f64,
    );

    let mut g = c.benchmark_group("vs_governor/hot");
    let hot = key(7);
    g.bench_function("governor", |b| b.iter(|| gov.check_key(black_box(&hot))));
    g.bench_function("sluice", |b| b.iter(|| sluice_check(black_box(&hot))));
    g.finish();

    let indices = random_indices(1 << 20);
    let mut g = c.benchmark_group("vs_governor/random_1m");
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| timed(iters, &indices, |k| gov.check_key(k).is_ok() as i32))
    });
    g.bench_function("sluice", |b| {
        b.iter_custom(|iters| timed(iters, &indices, sluice_check))
    });
    g.finish();

    // What parts of a hot check cost alone, each side's: the clock read,
    // the key's hash, and (sluice) the table's check without the C ABI.
    // Last, so that the random keys are checked as soon after they were
    // stored as before this group was added (keys that drain are swept,
    // and storing them again is slower).
    let mut g = c.benchmark_group("vs_governor/parts");
    let gov_clock = governor::clock::DefaultClock::default();
    g.bench_function("governor_clock", |b| {
        b.iter(|| governor::clock::Clock::now(&gov_clock))
    });
    g.bench_function("sluice_clock", |b| b.iter(sluice::clock::now));
    let std_hasher = std::collections::hash_map::RandomState::new();
    g.bench_function("governor_key_hash", |b| {
        b.iter(|| std::hash::BuildHasher::hash_one(&std_hasher, black_box(&hot)))
    });
    let secret = sluice::core::key::KeySecret::built_in();
    g.bench_function("sluice_key_hash", |b| {
        b.iter(|| secret.hash(black_box(&hot)))
    });
    let (table, now) = sluice_table();
    g.bench_function("sluice_table_check", |b| {
        b.iter(|| table_check(&table, &hot, now))
    });
    // The same with the count of passed checks nginx's zone keeps for
    // `sluice_metrics` (the C ABI's table keeps none).
    let counted = sluice::table::Table::new_heap_with_keys(16, 32, 1024);
    counted
        .books()
        .apply_quotas(&[sluice::core::Quota::new(1, "per_key", 1e12, 1e15, 1e15).keyed()]);
    g.bench_function("sluice_table_check_counting_passes", |b| {
        b.iter(|| table_check(&counted, &hot, now))
    });
    g.finish();
}

/// One keyed check of `key` in `table` at `now`, without the C ABI.
fn table_check(table: &sluice::table::Table, key: &[u8; 16], now: u64) -> sluice::table::Outcome {
    let item = sluice::table::CheckItem {
        name: NAME,
        key: Some(black_box(key)),
        weight: 1,
        max_wait: None,
    };
    table
        .gate()
        .check_many(
            &[item],
            now,
            sluice::table::CheckOptions::default(),
            sluice::host::thread_unit,
        )
        .outcome
}

/// Runs `iters` checks of keys taken from `indices` in order.
fn timed(iters: u64, indices: &[u64], mut check: impl FnMut(&[u8; 16]) -> i32) -> Duration {
    let keys: Vec<[u8; 16]> = indices.iter().map(|&i| key(i)).collect();
    let start = Instant::now();
    let mut sum = 0i64;
    for n in 0..iters {
        sum += i64::from(check(&keys[n as usize % keys.len()]));
    }
    black_box(sum);
    start.elapsed()
}

/// A table built as the C ABI builds its own for the same configuration,
/// with the same template, and the time it was made.
fn sluice_table() -> (sluice::table::Table, u64) {
    let capacity = (KEYS as f64 / 0.9).ceil() as u64;
    let t = sluice::table::Table::new_heap_with_keys(16, 32, capacity).without_pass_tally();
    t.books()
        .apply_quotas(&[sluice::core::Quota::new(1, "per_key", 1e12, 1e15, 1e15).keyed()]);
    (t, sluice::clock::now())
}

/// [`sluice_table`] filled with the same million keys: the bytes of its
/// key section, its live keys and its entries.
fn sluice_memory() -> (u64, u64, u64) {
    let (t, now) = sluice_table();
    for i in 0..KEYS {
        let item = sluice::table::CheckItem {
            name: NAME,
            key: Some(&key(i)),
            weight: 1,
            max_wait: None,
        };
        t.gate()
            .check_many(&[item], now, sluice::table::CheckOptions::default(), || 0.5);
    }
    let g = t.geometry();
    let stats = t.key_stats();
    (
        (g.region_len() - g.key_ring_offset()) as u64,
        stats.live,
        stats.capacity,
    )
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
