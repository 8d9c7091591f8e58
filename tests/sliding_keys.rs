//! A sliding per-key window across a fleet, against the exact sliding
//! window counter (issue 38, item 4).
//!
//! Thirty hosts, each with a real table and a real sync engine, syncing
//! every second with a real root ledger (the cluster simulator,
//! `sluice::sim`), send one key of a per-key quota of `LIMIT` per sliding
//! 10 s window at twice its limit for 200 s. The reference is the
//! simulator's ideal limiter: one central sliding window counter, known
//! exactly, deciding the same requests by the same rule with no sync
//! delay. From the third window on (the fill rate and the previous
//! window's count have settled), the fleet's admitted weight over all
//! windows must be the reference's within `TOLERANCE`, and no window may
//! be off by more than `WINDOW_TOLERANCE` of the limit.
//!
//! Between syncs each host estimates the key's level from the cluster
//! count it last heard, the previous window's weighted share, its own
//! weight, and the others' fill rate since. Without the last, the room
//! that opens as the previous window slides away is taken by every host
//! at once until the next sync: the fleet then admits 1.09 times the
//! reference (1.087–1.090 over four seeds; 0.96–0.99 with it, as a named
//! sliding quota does: its extrapolation errs a little high with windows
//! only ten sync intervals long).

use sluice::sim::scenario::{parse, Mode};
use sluice::sim::{run_scenario, Series};

/// Weight a window allows.
const LIMIT: f64 = 2000.0;
/// Seconds a window lasts.
const WINDOW: f64 = 10.0;
/// How far the fleet's admitted weight over every window measured may be
/// from the reference's, as a share of it.
const TOLERANCE: f64 = 0.04;
/// How far one window's admitted weight may be from the reference's, as
/// a share of the limit (a window's own noise is some 10%).
const WINDOW_TOLERANCE: f64 = 0.15;

/// 30 hosts, 1 s syncs, one key of a sliding per-key quota at 2x.
const SCENARIO: &str = r#"
    name = "sliding-key"
    duration = 200
    hosts = { count = 30, clock_skew_ms = 50 }
    sync = { interval_ms = 1000 }
    network = { latency_ms = 1.0, jitter_ms = 1.0 }
    roots = 1
    [[quotas]]
    name = "per_token"
    limit = 2000
    window = "10s"
    sliding = true
    per_key = true
    [[load]]
    quota = "per_token"
    keys = { count = 1 }
    phases = [{ at = 0, x = 2.0 }]
"#;

/// Per whole window from the third on: (admitted, the reference's).
fn windows(series: &Series) -> Vec<(u64, u64)> {
    let q = &series.quotas[0];
    let mut out = Vec::new();
    let mut start = 2.0 * WINDOW;
    while start + WINDOW <= series.seconds as f64 {
        let bin = q.total(start, start + WINDOW);
        out.push((bin.admitted, bin.ideal));
        start += WINDOW;
    }
    out
}

#[test]
fn a_sliding_key_across_a_fleet_admits_what_the_exact_sliding_window_counter_admits() {
    let checked = parse(SCENARIO).unwrap();
    assert_eq!(checked.quotas[0].limit, LIMIT);
    for seed in [1, 2] {
        let run = run_scenario(&checked, Some(seed), Some(Mode::Adaptive));
        let windows = windows(&run.series);
        assert_eq!(windows.len(), 18, "{windows:?}");
        for (i, &(admitted, reference)) in windows.iter().enumerate() {
            // The reference admits the limit: the load is twice it.
            assert!(
                (reference as f64 - LIMIT).abs() <= 0.01 * LIMIT,
                "seed {seed}, window {i}: the reference admitted {reference}"
            );
            let off = (admitted as f64 - reference as f64) / LIMIT;
            assert!(
                off.abs() <= WINDOW_TOLERANCE,
                "seed {seed}, window from {} s: admitted {admitted}, the reference \
                 {reference} ({:+.1}% of the limit; all windows {windows:?})",
                (i + 2) as f64 * WINDOW,
                off * 100.0,
            );
        }
        let admitted: u64 = windows.iter().map(|w| w.0).sum();
        let reference: u64 = windows.iter().map(|w| w.1).sum();
        let ratio = admitted as f64 / reference as f64;
        assert!(
            (ratio - 1.0).abs() <= TOLERANCE,
            "seed {seed}: admitted {admitted} against the reference's {reference} \
             ({ratio:.3}x; windows {windows:?})"
        );
    }
}
