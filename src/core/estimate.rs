//! The level estimate between syncs.
//!
//! At a sync the host learns the cluster level `known` (every host's
//! admitted weight up to then). Until the next sync it estimates
//!
//! ```text
//! L_est(t) = max(0, max(0, known.level + others(dt) - limit * dt) + own_recent)
//! ```
//!
//! where `dt = t - known.at`, `own_recent` is what this host admitted since
//! less what it gave back (known exactly, so never guessed; below zero
//! when it gave back more than it admitted since) and `others(dt)`
//! extrapolates what the rest of the fleet added:
//!
//! - [`Extrapolation::ConstantRatio`] — YARL's rule: the others fill at
//!   `ratio * limit`, whatever they really do;
//! - [`Extrapolation::Adaptive`] (default) — the others fill at the rate
//!   measured over the last syncs ([`measure_fill_rate`]), so the estimate
//!   follows real load up and down.
//!
//! Extrapolation stops `horizon` after `known.at`: when syncs stop (every
//! root down) the estimate falls back to "known level, leaking, plus what
//! this host admitted", i.e. per-host limiting, instead of guessing forever.

use serde::{Deserialize, Serialize};

use super::counter::{seconds_between, Level};
use super::quota::ValidationError;
use super::snapshot::QuotaSnapshot;
use super::window::{Located, WindowLevel, WindowRule};
use super::Nanos;

/// How the rest of the fleet's fill is extrapolated between syncs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Extrapolation {
    /// Others fill at `ratio * limit` (YARL's `correction_ratio`).
    ConstantRatio {
        /// Fraction of the limit the others are assumed to fill.
        ratio: f64,
    },
    /// Others fill at their measured rate (EWMA over the last syncs).
    Adaptive,
}

impl Extrapolation {
    /// Checks the mode's numbers: a constant ratio is a finite number, 0
    /// or more. The C ABI's `extrapolation`, the simulator's scenario
    /// `ratio` and its `--ratio` are refused by this one rule (the error
    /// names the field `ratio`).
    pub fn validate(&self) -> Result<(), ValidationError> {
        match *self {
            Extrapolation::ConstantRatio { ratio } if !(ratio.is_finite() && ratio >= 0.0) => {
                Err(ValidationError::new(
                    "ratio",
                    format!("{ratio} is not a finite number of at least 0"),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Extrapolation mode plus how long after a sync to keep extrapolating.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimator {
    /// The extrapolation rule.
    pub mode: Extrapolation,
    /// Nanoseconds after `known.at` past which nothing more is extrapolated
    /// (two sync intervals by default).
    pub horizon: Nanos,
}

impl Default for Estimator {
    fn default() -> Self {
        Self {
            mode: Extrapolation::Adaptive,
            horizon: 2_000_000_000,
        }
    }
}

/// Weight of the newest measurement in the fill-rate average.
pub const FILL_RATE_SMOOTHING: f64 = 0.5;

/// The estimated level of one quota at `now`.
pub fn estimate_level(view: &QuotaSnapshot, now: Nanos, estimator: &Estimator) -> f64 {
    if let Some(rule) = &view.window {
        return estimate_window(view, rule, now, estimator).level();
    }
    let others_rate = others_rate(view, estimator);
    let dt = seconds_between(view.known.at, now);
    let horizon = estimator.horizon as f64 * super::SECS_PER_NANO;
    let others = others_rate * dt.min(horizon);
    ((view.known.level + others - view.limit * dt).max(0.0) + view.own_recent).max(0.0)
}

/// The rate at which the rest of the fleet is assumed to fill a quota.
fn others_rate(view: &QuotaSnapshot, estimator: &Estimator) -> f64 {
    match estimator.mode {
        // A window quota's limit is per window: a constant ratio of it
        // per second would be meaningless, so it is the measured rate.
        Extrapolation::ConstantRatio { ratio } if view.window.is_none() => ratio * view.limit,
        _ => view.fill_rate,
    }
}

/// A window quota's estimated counts at a time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowEstimate {
    /// The current window's count: the known count if it is this window's,
    /// what the others added in this window since (extrapolated up to the
    /// horizon), and this host's own weight not yet known.
    pub count: f64,
    /// The previous window's count (sliding windows only; else 0).
    pub prev: f64,
    /// Where `now` is in its window.
    pub at: Located,
    /// The window slides.
    pub sliding: bool,
}

impl WindowEstimate {
    /// The level the decision compares: the count, plus the previous
    /// window's share when sliding.
    pub fn level(&self) -> f64 {
        if self.sliding {
            self.count + self.prev * self.at.prev_weight()
        } else {
            self.count
        }
    }
}

/// The estimate of a window quota at `now`, the window counterpart of
/// [`estimate_level`]'s leaky formula: no leak, the known count starting
/// over when its window ends, the others' extrapolated weight counted in
/// the window it falls in.
///
/// This host's own unsent weight all counts in the current window, even
/// the part admitted just before a boundary: an estimate errs high.
#[inline]
pub fn estimate_window(
    view: &QuotaSnapshot,
    rule: &WindowRule,
    now: Nanos,
    estimator: &Estimator,
) -> WindowEstimate {
    let here = rule.locate(now);
    let known = WindowLevel {
        count: view.known.level,
        prev: view.prev,
        at: view.known.at,
    };
    let (count, prev) = known.counts_in(rule, here.index);
    let rate = others_rate(view, estimator);
    let mut estimate = WindowEstimate {
        count: (count + view.own_recent).max(0.0),
        prev: 0.0,
        at: here,
        sliding: rule.sliding,
    };
    let start = now.saturating_sub(here.elapsed.max(0) as Nanos);
    let until = now.min(view.known.at.saturating_add(estimator.horizon));
    // A root's count lags the fleet: the others' weight since their own
    // last syncs (half an interval on average, a quarter of the horizon)
    // has not reached it. A leaky quota's steady state absorbs that lag;
    // a window's count is final, so the lag would be admitted twice over
    // at every window's end. The others' weight is counted from then.
    let since = view.known.at.saturating_sub(estimator.horizon / 4);
    if rate > 0.0 {
        estimate.count += rate * seconds_between(since.max(start), until);
    }
    if rule.sliding {
        estimate.prev = prev;
        if rate > 0.0 && since < start {
            let before = start.saturating_sub(1);
            let prev_start = before.saturating_sub(rule.locate(before).elapsed.max(0) as Nanos);
            estimate.prev += rate * seconds_between(since.max(prev_start), until.min(start));
        }
    }
    estimate
}

/// This host's weight that a root's reply acknowledges (the cluster value
/// it carries newly includes it): what it added, and what it gave back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Acked {
    /// Weight added (deltas).
    pub added: u64,
    /// Weight given back (returns).
    pub returned: u64,
}

impl Acked {
    /// A net change, all one way: added, or given back when below zero.
    pub fn of_net(net: i64) -> Self {
        Self {
            added: net.max(0) as u64,
            returned: net.min(0).unsigned_abs(),
        }
    }

    /// Added less given back, saturating.
    pub fn net(self) -> i64 {
        let signed = |w: u64| i64::try_from(w).unwrap_or(i64::MAX);
        signed(self.added).saturating_sub(signed(self.returned))
    }

    /// What a level (a count) of `before` becomes with this weight alone,
    /// as a root applies it: the returns first, stopped at zero (a root
    /// lowers a counter no further), then the adds.
    pub fn applied_to(self, before: f64) -> f64 {
        (before - self.returned as f64).max(0.0) + self.added as f64
    }
}

impl From<i64> for Acked {
    fn from(net: i64) -> Self {
        Self::of_net(net)
    }
}

/// Updates the others' fill rate of a window quota from two consecutive
/// cluster counts (the window counterpart of [`measure_fill_rate`]):
/// measured within one window; across a boundary the old rate stays.
pub fn measure_window_fill_rate(
    prev: WindowLevel,
    next: WindowLevel,
    rule: &WindowRule,
    own: Acked,
    prev_rate: f64,
) -> f64 {
    let dt = seconds_between(prev.at, next.at);
    if dt <= 0.0 || rule.index_at(prev.at) != rule.index_at(next.at) {
        return prev_rate;
    }
    let added_by_others = (next.count - own.applied_to(prev.count)).max(0.0);
    let rate = added_by_others / dt;
    FILL_RATE_SMOOTHING * rate + (1.0 - FILL_RATE_SMOOTHING) * prev_rate
}

/// Updates the others' fill rate from two consecutive cluster levels.
///
/// `own` is the weight this host sent that `next` newly includes, so it
/// is taken out: the host knows its own load exactly and only guesses the
/// others'. What the fleet added between the two is
/// `next.level - max(0, prev.level - limit * dt)`: exact when the bucket did
/// not run dry in between, a lower bound when it did. This host's returns
/// lowered that level at most to zero, as the root stopped them there
/// ([`Acked::applied_to`]): a return the root could not apply in full (the
/// units had leaked, or its adds were cut to the level cap) is not read
/// as the others' fill. Returns `prev_rate` when `next` is not later than
/// `prev`.
pub fn measure_fill_rate(prev: Level, next: Level, limit: f64, own: Acked, prev_rate: f64) -> f64 {
    let dt = seconds_between(prev.at, next.at);
    if dt <= 0.0 {
        return prev_rate;
    }
    let drained = prev.leaked(limit, next.at).level;
    let added_by_others = (next.level - own.applied_to(drained)).max(0.0);
    let rate = added_by_others / dt;
    FILL_RATE_SMOOTHING * rate + (1.0 - FILL_RATE_SMOOTHING) * prev_rate
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    fn view(level: f64, fill_rate: f64, own_recent: f64) -> QuotaSnapshot {
        QuotaSnapshot {
            limit: 100.0,
            low_burst: 100.0,
            high_burst: 200.0,
            known: Level { level, at: 0 },
            fill_rate,
            own_recent,
            ..QuotaSnapshot::default()
        }
    }

    #[test]
    fn a_constant_ratio_must_be_finite_and_not_negative() {
        for ok in [0.0, 0.5, 1.0, 3.0] {
            assert_eq!(
                Extrapolation::ConstantRatio { ratio: ok }.validate(),
                Ok(())
            );
        }
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            let e = Extrapolation::ConstantRatio { ratio: bad }
                .validate()
                .unwrap_err();
            assert_eq!(e.field, "ratio");
        }
        assert_eq!(Extrapolation::Adaptive.validate(), Ok(()));
    }

    #[test]
    fn own_recent_weight_is_added_exactly() {
        let est = Estimator::default();
        assert_eq!(estimate_level(&view(50.0, 0.0, 7.0), 0, &est), 57.0);
    }

    #[test]
    fn adaptive_follows_the_measured_fill_rate() {
        let est = Estimator::default();
        // Others fill at 300/s, leak 100/s: +200 over one second.
        assert_eq!(estimate_level(&view(50.0, 300.0, 0.0), SEC, &est), 250.0);
        // Others idle: plain leak.
        assert_eq!(estimate_level(&view(50.0, 0.0, 0.0), SEC / 4, &est), 25.0);
    }

    #[test]
    fn constant_ratio_assumes_a_fixed_share_of_the_limit() {
        let est = Estimator {
            mode: Extrapolation::ConstantRatio { ratio: 1.0 },
            horizon: 2 * SEC,
        };
        // Others fill exactly at the limit: the level stays put.
        assert_eq!(estimate_level(&view(50.0, 300.0, 0.0), SEC, &est), 50.0);
    }

    #[test]
    fn extrapolation_stops_at_the_horizon_and_the_level_then_leaks() {
        let est = Estimator {
            mode: Extrapolation::Adaptive,
            horizon: 2 * SEC,
        };
        // 2 s of others at 300/s = 600, 10 s of leak at 100/s = 1000.
        assert_eq!(
            estimate_level(&view(500.0, 300.0, 0.0), 10 * SEC, &est),
            100.0
        );
        // Long after, only this host's own weight remains.
        assert_eq!(
            estimate_level(&view(500.0, 300.0, 3.0), 100 * SEC, &est),
            3.0
        );
    }

    #[test]
    fn fill_rate_excludes_own_weight_and_smooths() {
        let prev = Level {
            level: 100.0,
            at: 0,
        };
        let next = Level {
            level: 150.0,
            at: SEC,
        };
        // Leak 100, so the fleet added 150; 30 was ours: others 120/s.
        // Smoothed with the previous 40/s: 80/s.
        let ours = Acked::of_net(30);
        assert_eq!(measure_fill_rate(prev, next, 100.0, ours, 40.0), 80.0);
        assert_eq!(measure_fill_rate(next, prev, 100.0, ours, 40.0), 40.0);
    }

    /// Issue 34, case 3: what this host gave back lowers the level only
    /// to zero, as the root applies it; the rest of a return is not the
    /// others' fill.
    #[test]
    fn a_return_stopped_at_zero_is_not_the_others_fill() {
        let prev = Level { level: 10.0, at: 0 };
        let at_one = |level| Level { level, at: SEC };
        // 10 leak to 9 in a second; 300 given back take that to 0.
        let back = Acked {
            added: 0,
            returned: 300,
        };
        assert_eq!(measure_fill_rate(prev, at_one(0.0), 1.0, back, 0.0), 0.0);
        // 5 added in the same sync count from 0, after the return.
        let both = Acked {
            added: 5,
            returned: 300,
        };
        assert_eq!(measure_fill_rate(prev, at_one(5.0), 1.0, both, 0.0), 0.0);
        // What the others added on top is still read: 4 in a second.
        assert_eq!(measure_fill_rate(prev, at_one(9.0), 1.0, both, 0.0), 2.0);
        // The same for a window's count.
        let rule = WindowRule {
            window: crate::core::Window::TenSeconds,
            sliding: false,
            utc_offset: 0,
        };
        let count = |count, at| WindowLevel {
            count,
            prev: 0.0,
            at,
        };
        let rate =
            measure_window_fill_rate(count(10.0, SEC), count(5.0, 2 * SEC), &rule, both, 0.0);
        assert_eq!(rate, 0.0);
    }

    /// A host syncing every second while the rest of the fleet adds
    /// `others[s]` units spread evenly over second `s`. Returns the mean
    /// absolute error of the estimate against the true cluster level,
    /// sampled 10 times a second (the host itself is idle, so the whole
    /// error is the extrapolation's).
    fn mean_error(others: &[f64], estimator: &Estimator) -> f64 {
        let limit = 100.0;
        let steps = 10u64;
        let step = SEC / steps;
        let mut truth = Level::empty(0);
        let mut known = Level::empty(0);
        let mut rate = 0.0;
        let mut error = 0.0;
        let mut samples = 0.0;
        for (s, added) in others.iter().enumerate() {
            for k in 1..=steps {
                let now = s as u64 * SEC + k * step;
                truth = truth.add(limit, now, added / steps as f64);
                if s >= 3 {
                    let v = QuotaSnapshot {
                        limit,
                        low_burst: 0.0,
                        high_burst: 0.0,
                        known,
                        fill_rate: rate,
                        own_recent: 0.0,
                        ..QuotaSnapshot::default()
                    };
                    error += (estimate_level(&v, now, estimator) - truth.level).abs();
                    samples += 1.0;
                }
            }
            rate = measure_fill_rate(known, truth, limit, Acked::default(), rate);
            known = truth;
        }
        error / samples
    }

    const ADAPTIVE: Estimator = Estimator {
        mode: Extrapolation::Adaptive,
        horizon: 2 * SEC,
    };
    const YARL: Estimator = Estimator {
        mode: Extrapolation::ConstantRatio { ratio: 1.0 },
        horizon: 2 * SEC,
    };

    #[test]
    fn adaptive_is_better_under_steady_overload() {
        // The fleet offers 2x the limit every second.
        let load = vec![200.0; 30];
        let (a, c) = (mean_error(&load, &ADAPTIVE), mean_error(&load, &YARL));
        assert!(a < c / 4.0, "adaptive {a} vs constant {c}");
    }

    #[test]
    fn constant_ratio_is_better_when_load_flips_every_sync() {
        // On for one second at 3x, off the next: the last measurement is
        // always the wrong guess for the coming second.
        let load: Vec<f64> = (0..30)
            .map(|s| if s % 2 == 0 { 300.0 } else { 0.0 })
            .collect();
        let (a, c) = (mean_error(&load, &ADAPTIVE), mean_error(&load, &YARL));
        assert!(c < a, "constant {c} vs adaptive {a}");
    }

    fn window_view(
        count: f64,
        prev: f64,
        at: Nanos,
        fill_rate: f64,
        sliding: bool,
    ) -> QuotaSnapshot {
        QuotaSnapshot {
            limit: 100.0,
            low_burst: 100.0,
            high_burst: 100.0,
            known: Level { level: count, at },
            fill_rate,
            window: Some(WindowRule {
                window: crate::core::Window::TenSeconds,
                sliding,
                utc_offset: 0,
            }),
            prev,
            ..QuotaSnapshot::default()
        }
    }

    #[test]
    fn a_window_count_does_not_leak_and_starts_over_with_the_next_window() {
        let est = Estimator::default();
        let v = QuotaSnapshot {
            own_recent: 2.0,
            ..window_view(30.0, 0.0, SEC, 0.0, false)
        };
        assert_eq!(estimate_level(&v, 9 * SEC, &est), 32.0);
        // The known count was the last window's; own weight errs high.
        assert_eq!(estimate_level(&v, 11 * SEC, &est), 2.0);
    }

    #[test]
    fn others_are_extrapolated_into_the_window_they_fall_in() {
        let est = Estimator {
            mode: Extrapolation::Adaptive,
            horizon: 2 * SEC,
        };
        // Others at 10/s, counted from a quarter of the horizon before the
        // known count (the root's lag, 8.5 s) up to the horizon (11 s):
        // 1.5 s of it in this window, 1 s in the next.
        let v = window_view(30.0, 0.0, 9 * SEC, 10.0, false);
        assert_eq!(estimate_level(&v, 9 * SEC + SEC / 2, &est), 40.0);
        assert!((estimate_level(&v, 10 * SEC - 1, &est) - 45.0).abs() < 1e-6);
        assert_eq!(estimate_level(&v, 12 * SEC, &est), 10.0);
        // Sliding: at 12.5 s, 3/4 of the last window (30 + 15) still counts.
        let v = window_view(30.0, 0.0, 9 * SEC, 10.0, true);
        assert_eq!(
            estimate_level(&v, 12 * SEC + SEC / 2, &est),
            10.0 + 45.0 * 0.75
        );
    }

    #[test]
    fn constant_ratio_does_not_apply_to_window_quotas() {
        let est = Estimator {
            mode: Extrapolation::ConstantRatio { ratio: 1.0 },
            horizon: 2 * SEC,
        };
        let v = window_view(30.0, 0.0, SEC, 0.0, false);
        assert_eq!(estimate_level(&v, 2 * SEC, &est), 30.0);
    }

    #[test]
    fn window_fill_rate_is_measured_within_a_window_only() {
        let rule = WindowRule {
            window: crate::core::Window::TenSeconds,
            sliding: false,
            utc_offset: 0,
        };
        let a = WindowLevel {
            count: 10.0,
            prev: 0.0,
            at: SEC,
        };
        let b = WindowLevel {
            count: 40.0,
            prev: 0.0,
            at: 3 * SEC,
        };
        // 30 added in 2 s, 10 of it ours: 10/s, smoothed with 0.
        assert_eq!(
            measure_window_fill_rate(a, b, &rule, Acked::of_net(10), 0.0),
            5.0
        );
        let c = WindowLevel {
            count: 1.0,
            prev: 40.0,
            at: 11 * SEC,
        };
        assert_eq!(
            measure_window_fill_rate(b, c, &rule, Acked::default(), 7.0),
            7.0
        );
    }
}
