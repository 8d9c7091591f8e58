//! Request-path benchmarks: one check, through the core table and through
//! the C ABI. Results go to BENCHMARKS.md (`make bench`).
//!
//! - `hot_single`: one quota, always in cache;
//! - `hot_depth3`: a quota with a parent and a grandparent;
//! - `random_1m`: a random name among 1M loaded quotas (cache misses);
//! - `random_1m_by_slot`: the same quotas checked by slot, no lookup;
//! - `random_1m_one_buffer`: the same names, each copied into one buffer
//!   before its check (a name built per request into reused memory, as
//!   nginx evaluates `sluice s3_${bucket}_read;` into a request's pool);
//! - `contended_2threads`: two threads checking one quota at once.
//! - `kinds/*`: one quota of each kind in the same run (leaky, a fixed
//!   and a sliding 1 min window, a sliding calendar month window) and
//!   the leaky one by `obtain` and
//!   `reserve`, so their ratios to the leaky check are measured together;
//!   `c_abi/obtain` and `c_abi/reserve` beside `c_abi/hot_single`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::core::rng::Rng;
use sluice::core::{Quota, Window};
use sluice::table::{CheckItem, Table};

fn quota(id: u64, name: String, parent: Option<u64>) -> Quota {
    // Huge limits: the benchmarks measure passing checks, as in production.
    Quota::new(id, name, 1e12, 1e15, 1e15).with_parent(parent)
}

fn bench_table(c: &mut Criterion) {
    let t = Table::new_heap(1024, 32);
    t.books().apply_quotas(&[
        quota(1, "s3_photos".into(), None),
        quota(2, "s3_photos_rw".into(), Some(1)),
        quota(3, "s3_photos_read".into(), Some(2)),
        quota(4, "s3_single_read".into(), None),
    ]);
    let now = sluice::clock::now();
    let mut g = c.benchmark_group("table");
    g.bench_function("hot_single", |b| {
        b.iter(|| t.gate().check(black_box(b"s3_single_read"), 1, now))
    });
    g.bench_function("hot_depth3", |b| {
        b.iter(|| t.gate().check(black_box(b"s3_photos_read"), 1, now))
    });
    g.bench_function("unknown_name", |b| {
        b.iter(|| t.gate().check(black_box(b"s3_nobody_read"), 1, now))
    });
    g.finish();
}

fn bench_kinds(c: &mut Criterion) {
    let t = Table::new_heap(1024, 32);
    let window = |id, name: &str, sliding| {
        Quota::new(id, name, 1e15, 1e15, 1e15).windowed(Window::Minute, sliding)
    };
    t.books().apply_quotas(&[
        quota(1, "leaky".into(), None),
        window(2, "fixed_1m", false),
        window(3, "sliding_1m", true),
        Quota::new(4, "month", 1e15, 1e15, 1e15).windowed(Window::Month, true),
    ]);
    let now = sluice::clock::now();
    let item = |name: &'static [u8]| CheckItem {
        name,
        key: None,
        weight: 1,
        max_wait: None,
    };
    let mut g = c.benchmark_group("kinds");
    g.bench_function("leaky", |b| {
        b.iter(|| t.gate().check(black_box(b"leaky"), 1, now))
    });
    g.bench_function("window_fixed", |b| {
        b.iter(|| t.gate().check(black_box(b"fixed_1m"), 1, now))
    });
    g.bench_function("window_sliding", |b| {
        b.iter(|| t.gate().check(black_box(b"sliding_1m"), 1, now))
    });
    g.bench_function("window_month", |b| {
        b.iter(|| t.gate().check(black_box(b"month"), 1, now))
    });
    g.bench_function("obtain", |b| {
        b.iter(|| t.gate().obtain(black_box(&item(b"leaky")), now))
    });
    g.bench_function("reserve", |b| {
        b.iter(|| {
            t.gate()
                .reserve(black_box(&item(b"leaky")), 1_000_000_000, now)
        })
    });
    g.finish();
}

fn bench_random_1m(c: &mut Criterion) {
    const N: u64 = 1_000_000;
    let t = Table::new_heap(N as u32, 16);
    let quotas: Vec<Quota> = (1..=N).map(|i| quota(i, format!("q{i}"), None)).collect();
    let report = t.books().apply_quotas(&quotas);
    assert_eq!(report.inserted, N as usize);
    eprintln!(
        "random_1m: region {} MiB for {} quotas = {:.1} bytes per quota",
        t.region_len() >> 20,
        t.capacity(),
        t.region_len() as f64 / f64::from(t.capacity())
    );
    // Names drawn up front so the loop measures the check, not formatting.
    let mut rng = Rng::new(7);
    let names: Vec<Vec<u8>> = (0..1 << 16)
        .map(|_| format!("q{}", 1 + rng.next_u64() % N).into_bytes())
        .collect();
    let now = sluice::clock::now();
    let mut i = 0usize;
    c.bench_function("table/random_1m", |b| {
        b.iter(|| {
            i = (i + 1) & (names.len() - 1);
            t.gate().check(black_box(&names[i]), 1, now)
        })
    });
    // The same names built into one buffer per check: the name at that
    // address changes every time.
    let mut buf = [0u8; 16];
    c.bench_function("table/random_1m_one_buffer", |b| {
        b.iter(|| {
            i = (i + 1) & (names.len() - 1);
            let name = &names[i];
            buf[..name.len()].copy_from_slice(name);
            t.gate().check(black_box(&buf[..name.len()]), 1, now)
        })
    });
    // The same checks by slot, with no name lookup: one round of misses
    // (the slot's two lines), the floor of any layout that finds a slot
    // from the name's hash without an index.
    let slots: Vec<_> = names.iter().map(|n| t.gate().lookup(n).unwrap()).collect();
    c.bench_function("table/random_1m_by_slot", |b| {
        b.iter(|| {
            i = (i + 1) & (slots.len() - 1);
            t.gate()
                .check_slot(black_box(slots[i]), 1, now, sluice::core::rng::thread_unit)
        })
    });
}

fn bench_contended(c: &mut Criterion) {
    let t = Arc::new(Table::new_heap(16, 32));
    t.books().apply_quotas(&[quota(1, "shared".into(), None)]);
    c.bench_function("table/contended_2threads", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let other = {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    let now = sluice::clock::now();
                    for _ in 0..iters {
                        black_box(t.gate().check(black_box(b"shared"), 1, now));
                    }
                })
            };
            let now = sluice::clock::now();
            for _ in 0..iters {
                black_box(t.gate().check(black_box(b"shared"), 1, now));
            }
            other.join().unwrap();
            // Time per check as each thread sees it (both run at once).
            start.elapsed()
        })
    });
}

fn bench_c_abi(c: &mut Criterion) {
    use sluice::ffi::{
        check_by_name, sluice_init, sluice_load_quotas_json, sluice_obtain, sluice_reserve,
    };
    let quotas = c"{\"quotas\":[
        {\"name\":\"s3_photos\",\"limit\":1e12,\"low_burst\":1e15,\"high_burst\":1e15},
        {\"name\":\"s3_photos_rw\",\"parent\":\"s3_photos\",\"limit\":1e12,\"low_burst\":1e15,\"high_burst\":1e15},
        {\"name\":\"s3_photos_read\",\"parent\":\"s3_photos_rw\",\"limit\":1e12,\"low_burst\":1e15,\"high_burst\":1e15},
        {\"name\":\"s3_single_read\",\"limit\":1e12,\"low_burst\":1e15,\"high_burst\":1e15}]}";
    // SAFETY: NULL config and a NUL-terminated literal.
    unsafe {
        assert_eq!(sluice_init(std::ptr::null()), 0);
        assert_eq!(sluice_load_quotas_json(quotas.as_ptr()), 0);
    }
    let mut g = c.benchmark_group("c_abi");
    g.bench_function("hot_single", |b| {
        // SAFETY: a NUL-terminated literal.
        b.iter(|| unsafe { check_by_name(black_box(c"s3_single_read".as_ptr()), 1) })
    });
    g.bench_function("hot_depth3", |b| {
        // SAFETY: a NUL-terminated literal.
        b.iter(|| unsafe { check_by_name(black_box(c"s3_photos_read".as_ptr()), 1) })
    });
    let name = b"s3_single_read";
    let mut out = 0u64;
    g.bench_function("obtain", |b| {
        // SAFETY: `name` is readable for its length; `out` is a valid u64.
        b.iter(|| unsafe {
            sluice_obtain(black_box(name.as_ptr().cast()), name.len(), 4, &mut out)
        })
    });
    g.bench_function("reserve", |b| {
        // SAFETY: `name` is readable for its length; `out` is a valid u64.
        b.iter(|| unsafe {
            sluice_reserve(
                black_box(name.as_ptr().cast()),
                name.len(),
                1,
                1000,
                &mut out,
            )
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_table, bench_kinds, bench_c_abi, bench_contended, bench_random_1m
}
criterion_main!(benches);
