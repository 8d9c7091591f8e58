//! The cost of each quota kind and call relative to a leaky check, robust
//! to a busy machine (`cargo bench --bench kinds_ratio`).
//!
//! Criterion times one function after another, so on a shared 2-core
//! machine a burst of someone else's work lands on whichever function runs
//! then, and the ratios the targets are stated in (a window check within
//! 1.2x of a leaky one; obtain and reserve within 1.5x) swing by 50%. This
//! harness runs every variant in short interleaved rounds (`ROUNDS`, 400,
//! of `BATCH`, 20,000, calls each, about a millisecond, in a rotating
//! order) and keeps each
//! variant's fastest round: a round that someone else's work slowed down
//! only loses, so the minimum is the cost of the code, and the variants
//! are compared under the same conditions. It prints ns per call and the
//! ratio to the leaky check (the table's and, separately, the C ABI's).
//!
//! Under `cargo test` (no `--bench` argument) it makes a short smoke run.

use std::hint::black_box;
use std::time::Instant;

use sluice::core::window::Window;
use sluice::core::Quota;
use sluice::table::{CheckItem, Table};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One timed variant: its name and a call run `n` times.
type Variant<'a> = (&'static str, Box<dyn FnMut(usize) + 'a>);

/// Each variant's fastest round, ns per call.
/// `ONLY` (a variant's name) times that one alone, for a profiler.
fn best_of(variants: &mut [Variant], rounds: usize, batch: usize) -> Vec<f64> {
    let only = std::env::var("ONLY").ok();
    let mut best = vec![f64::INFINITY; variants.len()];
    for round in 0..rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            if only.as_deref().is_some_and(|o| o != variants[i].0) {
                continue;
            }
            let start = Instant::now();
            (variants[i].1)(batch);
            let ns = start.elapsed().as_nanos() as f64 / batch as f64;
            best[i] = best[i].min(ns);
        }
    }
    best
}

fn report(title: &str, variants: &[Variant], best: &[f64]) {
    println!("{title}");
    println!("  {:<16} {:>8} {:>7}", "variant", "ns/call", "ratio");
    for ((name, _), ns) in variants.iter().zip(best) {
        println!("  {name:<16} {ns:>8.1} {:>7.2}", ns / best[0]);
    }
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let rounds = if benching { env("ROUNDS", 400) } else { 2 };
    let batch = if benching { env("BATCH", 20_000) } else { 1000 };

    let t = Table::new_heap(1024, 32);
    let huge = 1e15;
    t.books().apply_quotas(&[
        Quota::new(1, "leaky", huge, huge, huge),
        Quota::new(2, "fixed_1m", huge, huge, huge).windowed(Window::Minute, false),
        Quota::new(3, "sliding_1m", huge, huge, huge).windowed(Window::Minute, true),
        Quota::new(4, "fixed_month", huge, huge, huge).windowed(Window::Month, false),
    ]);
    let now = sluice::clock::now();
    let item = |name: &'static [u8]| CheckItem {
        name,
        key: None,
        weight: 1,
        max_wait: None,
    };
    let check = |name: &'static [u8]| -> Box<dyn FnMut(usize) + '_> {
        let t = &t;
        Box::new(move |n| {
            for _ in 0..n {
                black_box(t.gate().check(black_box(name), 1, now));
            }
        })
    };
    let mut table: Vec<Variant> = vec![
        ("leaky", check(b"leaky")),
        ("window_fixed", check(b"fixed_1m")),
        ("window_sliding", check(b"sliding_1m")),
        ("window_month", check(b"fixed_month")),
        (
            "obtain",
            Box::new(|n| {
                let it = item(b"leaky");
                for _ in 0..n {
                    black_box(t.gate().obtain(black_box(&it), now));
                }
            }),
        ),
        (
            "reserve",
            Box::new(|n| {
                let it = item(b"leaky");
                for _ in 0..n {
                    black_box(t.gate().reserve(black_box(&it), 1_000_000_000, now));
                }
            }),
        ),
    ];
    let best = best_of(&mut table, rounds, batch);
    report("table (Table::check / obtain / reserve)", &table, &best);

    c_abi(rounds, batch);
}

/// The same through the C ABI (clock read and argument checks included).
fn c_abi(rounds: usize, batch: usize) {
    use sluice::ffi::{
        check_by_name, sluice_init, sluice_load_quotas_json, sluice_obtain, sluice_reserve,
    };
    let quotas = c"{\"quotas\":[
        {\"name\":\"single\",\"limit\":1e12,\"low_burst\":1e15,\"high_burst\":1e15},
        {\"name\":\"sliding\",\"limit\":1e15,\"low_burst\":1e15,\"high_burst\":1e15,\"window\":\"1m\",\"sliding\":true}]}";
    // SAFETY: NULL config and a NUL-terminated literal.
    unsafe {
        assert_eq!(sluice_init(std::ptr::null()), 0);
        assert_eq!(sluice_load_quotas_json(quotas.as_ptr()), 0);
    }
    let name = b"single";
    let mut variants: Vec<Variant> = vec![
        (
            "check_by_name",
            Box::new(|n| {
                for _ in 0..n {
                    // SAFETY: a NUL-terminated literal.
                    black_box(unsafe { check_by_name(black_box(c"single".as_ptr()), 1) });
                }
            }),
        ),
        (
            "sliding",
            Box::new(|n| {
                for _ in 0..n {
                    // SAFETY: a NUL-terminated literal.
                    black_box(unsafe { check_by_name(black_box(c"sliding".as_ptr()), 1) });
                }
            }),
        ),
        (
            "sluice_obtain",
            Box::new(move |n| {
                let mut out = 0u64;
                for _ in 0..n {
                    // SAFETY: `name` is readable for its length; `out` is a
                    // valid u64.
                    black_box(unsafe {
                        sluice_obtain(black_box(name.as_ptr().cast()), name.len(), 4, &mut out)
                    });
                }
            }),
        ),
        (
            "sluice_reserve",
            Box::new(move |n| {
                let mut out = 0u64;
                for _ in 0..n {
                    // SAFETY: as above.
                    black_box(unsafe {
                        sluice_reserve(
                            black_box(name.as_ptr().cast()),
                            name.len(),
                            1,
                            1000,
                            &mut out,
                        )
                    });
                }
            }),
        ),
    ];
    let best = best_of(&mut variants, rounds, batch);
    report("C ABI", &variants, &best);
}
