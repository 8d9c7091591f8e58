//! In-flight quotas in the simulated fleet: 50 hosts, requests lasting 1
//! to 10 s, offered twice the limit; and 10 of the 50 hosts crashing
//! while they hold slots (docs/DESIGN.md, "In-flight quotas").

use super::scenario::parse;
use super::series::Series;
use super::*;

const LIMIT: f64 = 500.0;
/// Requests last 1 to 10 s, 5.5 s on average: 2x the limit in flight is
/// 2 x 500 / 5.5 = 182 arrivals a second.
const ARRIVALS: f64 = 182.0;
/// The sync interval (the scenario's default).
const INTERVAL: f64 = 1.0;

fn scenario(events: &str) -> String {
    format!(
        r#"
    name = "in_flight"
    duration = 60
    hosts = {{ count = 50, clock_skew_ms = 50 }}
    network = {{ latency_ms = 1.0, jitter_ms = 1.0 }}
    [[quotas]]
    name = "uploads"
    limit = {LIMIT}
    in_flight = true
    [[load]]
    quota = "uploads"
    phases = [{{ at = 0, rate = {ARRIVALS} }}]
    hold_seconds = [1.0, 10.0]
    {events}
"#
    )
}

fn simulate_it(text: &str, seed: u64) -> Series {
    let checked = parse(text).unwrap();
    cluster::simulate(
        &checked,
        cluster::RunOptions {
            seed,
            mode: Mode::Adaptive,
        },
    )
}

/// Mean true level over seconds `[from, to)`.
fn mean_truth(series: &Series, from: usize, to: usize) -> f64 {
    let levels = &series.quotas[0].levels[from..to];
    levels.iter().map(|l| l.truth).sum::<f64>() / levels.len() as f64
}

/// The stated bound on the fleet's overshoot: the slots the whole fleet
/// can take in one sync interval before the hosts learn of one another's
/// (every arrival of that interval).
fn sync_bound() -> f64 {
    ARRIVALS * INTERVAL
}

#[test]
fn at_twice_the_limit_the_fleet_stays_within_its_bound_and_uses_the_limit() {
    for seed in [1, 2] {
        let series = simulate_it(&scenario(""), seed);
        let peak = series.quotas[0].peak;
        let utilisation = mean_truth(&series, 20, 60) / LIMIT;
        eprintln!(
            "seed {seed}: peak {peak} ({:.3}x), utilisation {utilisation:.3}",
            peak / LIMIT
        );
        assert!(
            peak <= 1.05 * LIMIT + sync_bound(),
            "peak {peak} above 1.05 x {LIMIT} + {}",
            sync_bound()
        );
        assert!(utilisation >= 0.95, "utilisation {utilisation}");
    }
}

#[test]
fn slots_of_crashed_hosts_come_back_within_the_lease() {
    // 10 of the 50 hosts crash at 30 s holding their slots; the roots'
    // lease is 10 s.
    let events = "[[events]]\n    at = 30\n    action = \"hosts_leave\"\n    count = 10\n";
    let series = simulate_it(&scenario(events), 3);
    let levels = &series.quotas[0].levels;
    // What the roots count beyond the slots truly held, on average over
    // seconds [from, to): the slots of hosts that are gone, plus the
    // live hosts' changes of the last interval not synced yet.
    let excess = |from: usize, to: usize| {
        levels[from..to]
            .iter()
            .map(|l| l.root_max - l.truth)
            .sum::<f64>()
            / (to - from) as f64
    };
    for (sec, l) in levels.iter().enumerate().take(50).skip(25) {
        eprintln!("{sec}: truth {:.0}, roots {:.0}", l.truth, l.root_max);
    }
    let (before, during, after) = (excess(20, 30), excess(31, 40), excess(42, 55));
    eprintln!("roots' excess: before {before:.1}, during the lease {during:.1}, after {after:.1}");
    // Before the lease runs out the roots still count the dead hosts'
    // slots...
    assert!(
        during > before + 0.1 * LIMIT,
        "during the lease: {during}, before {before}"
    );
    // ...after it they are gone: back to the excess before the crash.
    assert!(
        (after - before).abs() < 0.05 * LIMIT,
        "after: {after}, before {before}"
    );
    let utilisation = mean_truth(&series, 45, 60) / LIMIT;
    assert!(
        utilisation >= 0.95,
        "utilisation after the crash {utilisation}"
    );
}

#[test]
fn hold_seconds_are_for_in_flight_quotas_and_positive() {
    let bad = |limit_line: &str, hold: &str| {
        let text = scenario("")
            .replace("in_flight = true", limit_line)
            .replace("hold_seconds = [1.0, 10.0]", hold);
        parse(&text).unwrap_err()
    };
    let error = bad("low_burst = 500", "hold_seconds = [1.0, 10.0]");
    assert!(
        error.contains("hold_seconds is for an in-flight quota"),
        "{error}"
    );
    let error = bad("in_flight = true", "hold_seconds = [0.0, 1.0]");
    assert!(error.contains("0 < min <= max"), "{error}");
    let error = bad("in_flight = true", "hold_seconds = [5.0, 1.0]");
    assert!(error.contains("0 < min <= max"), "{error}");
}
