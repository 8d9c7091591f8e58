//! Keyed checks (per-key quotas): the request path and the memory of the
//! key section. Results go to BENCHMARKS.md (`make bench-keys`).
//!
//! - `keys/hot_key`: one key, always in cache;
//! - `keys/hot_key_sliding`: the same with a sliding 1 min window (not
//!   the fast path: its entry's previous window's count and fill rate
//!   are read);
//! - `keys/first_seen`: a key never seen before, its insert included;
//! - `keys/random_10m`: a random key among 10,000,000 live keys (cache and
//!   TLB misses), beside `dram/chase`, one dependent DRAM miss measured in
//!   the same run, which it is read against;
//! - printed: bytes of the key section per live key, filled with as many
//!   distinct keys as it has entries, and with twice that many.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::core::rng::Rng;
use sluice::core::{Quota, Window};
use sluice::table::{CheckItem, CheckOptions, Table};

/// A table whose `per_key` template never rejects.
fn keyed_table(keys: u64) -> Table {
    let t = Table::new_heap_with_keys(16, 16, keys);
    t.books()
        .apply_quotas(&[Quota::new(1, "per_key", 1e12, 1e15, 1e15).keyed()]);
    t
}

/// A table whose `per_key` template counts in a sliding minute and never
/// rejects.
fn sliding_keyed_table() -> Table {
    let t = Table::new_heap_with_keys(16, 16, 1 << 16);
    t.books()
        .apply_quotas(&[Quota::new(1, "per_key", 1e12, 1e12, 1e12)
            .keyed()
            .windowed(Window::Minute, true)]);
    t
}

fn check(t: &Table, key: &[u8], now: u64) -> bool {
    let item = CheckItem {
        name: b"per_key",
        key: Some(key),
        weight: 1,
        max_wait: None,
    };
    let r = t
        .gate()
        .check_many(&[item], now, CheckOptions::default(), || 0.5);
    r.outcome == sluice::table::Outcome::Pass
}

/// Inserts `n` distinct 16-byte keys; returns the live keys.
fn fill(t: &Table, n: u64, now: u64) -> u64 {
    for i in 0..n {
        check(t, &key(i), now);
    }
    t.key_stats().live
}

/// The `i`-th key: 16 bytes, like a short token.
fn key(i: u64) -> [u8; 16] {
    let mut k = [b'k'; 16];
    k[8..].copy_from_slice(&i.to_le_bytes());
    k
}

/// A table whose `per_key_day` template allows each key one unit a day
/// (keys stay live all run), with room for `entries` keys.
fn daily_table(entries: u64) -> Table {
    let t = Table::new_heap_with_keys(16, 16, entries);
    let day = Quota::new(1, "per_key_day", 1.0, 1.0, 1.0)
        .keyed()
        .windowed(sluice::core::Window::Day, false);
    t.books().apply_quotas(&[day]);
    t
}

/// Keys lost as the section fills: `offered` distinct keys (a share of
/// the section's entries), each checked twice against a one-a-day
/// per-key quota. A stored key's second check is rejected; a key that
/// found no entry is an overflow (decided on the template's shared
/// counter, the default), and a second check that passes is a key whose
/// limit did not hold. Also the bytes of the key section per live key.
fn fill_report() {
    let now = sluice::clock::now();
    for entries in [4_096u64, 65_536, 1 << 20] {
        for share in [0.5, 0.9, 0.95, 1.0] {
            let t = daily_table(entries);
            let capacity = t.key_capacity();
            let offered = (capacity as f64 * share) as u64;
            let second = |i: u64| {
                let item = CheckItem {
                    name: b"per_key_day",
                    key: Some(&key(i)),
                    weight: 1,
                    max_wait: None,
                };
                t.gate()
                    .check_many(&[item], now, CheckOptions::default(), || 0.5)
            };
            for i in 0..offered {
                second(i);
            }
            let overflowed = t.key_stats().overflows;
            let passed_twice = (0..offered)
                .filter(|&i| second(i).outcome == sluice::table::Outcome::Pass)
                .count();
            let stats = t.key_stats();
            let g = t.geometry();
            let section = (g.region_len() - g.key_ring_offset()) as f64;
            eprintln!(
                "key fill: {capacity} entries, {:>4.0}% offered ({offered} keys): \
                 {overflowed} without an entry, {passed_twice} passed twice; \
                 {} live, {} moved; {:.1} bytes per live key",
                share * 100.0,
                stats.live,
                stats.relocations,
                section / stats.live.max(1) as f64,
            );
        }
    }
}

/// One dependent DRAM miss: a pointer chase through a random cycle over
/// 256 MiB (huge pages asked for, as the key section's heap table).
fn dram_chase(c: &mut Criterion) {
    const WORDS: usize = 64 << 20;
    // SAFETY: a fresh private anonymous mapping of 256 MiB, used only as
    // this slice, for the rest of the process.
    let next: &mut [u32] = unsafe {
        let len = WORDS * 4;
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::madvise(p, len, libc::MADV_HUGEPAGE);
        std::slice::from_raw_parts_mut(p.cast::<u32>(), WORDS)
    };
    for (i, w) in next.iter_mut().enumerate() {
        *w = i as u32;
    }
    let mut rng = Rng::new(11);
    // Sattolo's shuffle: one cycle through every word.
    for i in (1..WORDS).rev() {
        let j = (rng.next_u64() % i as u64) as usize;
        next.swap(i, j);
    }
    let mut at = 0u32;
    c.bench_function("dram/chase", |b| {
        b.iter(|| {
            at = next[at as usize];
            black_box(at)
        })
    });
}

fn bench_keys(c: &mut Criterion) {
    fill_report();
    let now = sluice::clock::now();
    let mut g = c.benchmark_group("keys");
    let hot = keyed_table(1 << 16);
    g.bench_function("hot_key", |b| {
        b.iter(|| check(&hot, black_box(b"a-user-token-0001"), now))
    });
    let sliding = sliding_keyed_table();
    g.bench_function("hot_key_sliding", |b| {
        b.iter(|| check(&sliding, black_box(b"a-user-token-0001"), now))
    });
    // New keys until a section of 4M entries is a quarter full, then a
    // fresh section (outside the timing).
    let mut fresh = keyed_table(1 << 22);
    let mut next = 0u64;
    g.bench_function("first_seen", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                if next >= 1 << 20 {
                    fresh = keyed_table(1 << 22);
                    next = 0;
                }
                let k = key(next);
                next += 1;
                let start = Instant::now();
                black_box(check(&fresh, black_box(&k), now));
                spent += start.elapsed();
            }
            spent
        })
    });
    const LIVE: u64 = 10_000_000;
    let big = keyed_table(4 * LIVE);
    let live = fill(&big, LIVE, now);
    eprintln!("random_10m: {live} live keys of {LIVE} inserted");
    let mut rng = Rng::new(7);
    let picks: Vec<[u8; 16]> = (0..1 << 16).map(|_| key(rng.next_u64() % LIVE)).collect();
    let mut i = 0usize;
    g.bench_function("random_10m", |b| {
        b.iter(|| {
            i = (i + 1) & (picks.len() - 1);
            check(&big, black_box(&picks[i]), now)
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_keys, dram_chase
}
criterion_main!(benches);
