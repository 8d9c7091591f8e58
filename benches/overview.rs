//! What one sample of the root's overview costs (`cargo bench --bench
//! overview`): the time `GET /v1/overview` holds the ledger lock, at most
//! once a second whatever the number of console and `sluice top` clients,
//! during which syncs wait.
//!
//! Builds a ledger with `QUOTAS` quotas that all have a counter (more than
//! the overview ranks, so the scan cap applies) and `LIMITERS` limiters
//! (the registry's maximum), then takes `RUNS` samples and reports the
//! fastest, the median and the slowest. Under `cargo test` (no `--bench`
//! argument) it makes a small smoke run instead.

use std::time::{Duration, Instant};

use sluice::core::{Nanos, Quota};
use sluice::root::api::overview::{sample, MAX_SCAN};
use sluice::root::ledger::{Ledger, SyncPaging};
use sluice::root::limiters::DEFAULT_MAX_LIMITERS;
use sluice::wire::{CounterDelta, QuotaCursor, SyncRequest};

const SEC: Nanos = 1_000_000_000;

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (quotas, limiters, runs) = if bench {
        (
            size("QUOTAS", 2 * MAX_SCAN),
            size("LIMITERS", DEFAULT_MAX_LIMITERS),
            size("RUNS", 21),
        )
    } else {
        (2_000, 100, 3)
    };
    let ledger = Ledger::default();
    let set = (1..=quotas as u64)
        .map(|id| Quota::new(id, format!("quota_{id:08}"), 10.0, 100.0, 200.0).at_epoch(id))
        .collect();
    ledger.load(set, 0);
    let paging = SyncPaging {
        quotas: 1,
        counters: 1,
    };
    // Every limiter syncs once; together they send weight to every quota.
    let per_limiter = quotas.div_ceil(limiters);
    for l in 0..limiters {
        let first = (l * per_limiter) as u64 + 1;
        let last = (((l + 1) * per_limiter) as u64).min(quotas as u64);
        let request = SyncRequest {
            limiter: format!("edge-{l:06}"),
            quotas_after: QuotaCursor::default(),
            counter_version: 0,
            root_instance: 0,
            deltas: (first..=last)
                .map(|id| CounterDelta {
                    id,
                    delta: id % 300,
                    window: None,
                })
                .collect(),
            keyed: Vec::new(),
            rejected: Vec::new(),
            ..Default::default()
        };
        ledger.sync(&request, 1, SEC, paging);
    }
    let now = 2 * SEC;
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            let s = std::hint::black_box(sample(&ledger, now));
            let elapsed = started.elapsed();
            assert_eq!(s.scanned, quotas.min(MAX_SCAN));
            elapsed
        })
        .collect();
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "overview sample: {quotas} counters ({} ranked), {limiters} limiters: \
         min {:.2} ms, median {:.2} ms, max {:.2} ms over {runs} runs",
        quotas.min(MAX_SCAN),
        ms(times[0]),
        ms(times[runs / 2]),
        ms(times[runs - 1]),
    );
}
