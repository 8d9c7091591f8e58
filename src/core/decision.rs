//! The decision: pass, reject, or reject with a probability rising across
//! the burst band; and the check of a quota with all its ancestors.

use super::estimate::{estimate_level, Estimator};
use super::{Level, Nanos};

/// Outcome of checking one quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The request may pass this quota.
    Pass,
    /// The request is over this quota.
    Reject,
}

/// Decides one quota for a request of `weight` at estimated `level`.
///
/// - `level + weight <= low_burst` passes;
/// - `level + weight > high_burst` is rejected;
/// - in between it is rejected with probability
///   `(level + weight - low_burst) / (high_burst - low_burst)`, compared
///   against `draw`, a uniform number in `[0, 1)`.
///
/// With `low_burst == high_burst` the band is empty: a hard cut.
///
/// A weight-0 check asks "is this quota full?" on behalf of a caller that
/// counts elsewhere, so it rejects at `high_burst` itself (`level >=
/// high_burst`), where any counted request would be rejected; otherwise a
/// hard-cut quota filled exactly to its burst would never reject it.
pub fn decide(level: f64, weight: f64, low_burst: f64, high_burst: f64, draw: f64) -> Verdict {
    let after = level + weight;
    let full = if weight > 0.0 {
        after > high_burst
    } else {
        after >= high_burst
    };
    // Past `full`, the band is not empty, so the division is safe.
    let reject =
        full || (after > low_burst && draw < (after - low_burst) / (high_burst - low_burst));
    if reject {
        Verdict::Reject
    } else {
        Verdict::Pass
    }
}

/// Everything the decision needs to know about one quota at check time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QuotaView {
    /// Leak rate, units per second.
    pub limit: f64,
    /// Level up to which everything passes.
    pub low_burst: f64,
    /// Level from which everything is rejected.
    pub high_burst: f64,
    /// The cluster level at the last merge, in local time.
    pub known: Level,
    /// Measured fill rate of the other hosts, units per second (used by the
    /// adaptive extrapolation).
    pub fill_rate: f64,
    /// Weight this host admitted that `known` does not include yet (pending
    /// plus sent-but-unacknowledged).
    pub own_recent: f64,
}

/// Outcome of checking a quota and its ancestors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainVerdict {
    /// Every quota in the chain passed: commit the weight to all of them.
    Pass,
    /// The quota at this index of the chain (0 = the named quota) rejected.
    Reject {
        /// Index in the chain of the first quota that rejected.
        at: usize,
    },
}

/// Checks a chain (the named quota first, then its ancestors): the request
/// passes only if every quota passes. Nothing is committed here; on
/// [`ChainVerdict::Pass`] the caller adds the weight to every counter in the
/// chain (check all, then commit), and a weight of 0 checks without
/// counting.
///
/// `draw` is called only for quotas whose level falls in the band.
pub fn check_chain(
    chain: &[QuotaView],
    weight: f64,
    now: Nanos,
    estimator: &Estimator,
    mut draw: impl FnMut() -> f64,
) -> ChainVerdict {
    for (at, view) in chain.iter().enumerate() {
        let level = estimate_level(view, now, estimator);
        let after = level + weight;
        // Draw only inside the band: outside it the draw cannot matter.
        let x = if after > view.low_burst && after <= view.high_burst {
            draw()
        } else {
            0.0
        };
        if decide(level, weight, view.low_burst, view.high_burst, x) == Verdict::Reject {
            return ChainVerdict::Reject { at };
        }
    }
    ChainVerdict::Pass
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::rng::Rng;

    #[test]
    fn below_the_band_passes_above_it_rejects() {
        assert_eq!(decide(5.0, 5.0, 10.0, 20.0, 0.0), Verdict::Pass);
        assert_eq!(decide(15.0, 6.0, 10.0, 20.0, 0.999), Verdict::Reject);
    }

    #[test]
    fn equal_bursts_cut_hard() {
        assert_eq!(decide(99.0, 1.0, 100.0, 100.0, 0.0), Verdict::Pass);
        assert_eq!(decide(100.0, 1.0, 100.0, 100.0, 0.999), Verdict::Reject);
    }

    #[test]
    fn the_band_rejects_with_linearly_rising_probability() {
        let mut rng = Rng::new(1);
        for (level, expected) in [(10.0, 0.0), (12.5, 0.25), (15.0, 0.5), (17.5, 0.75)] {
            let n = 40_000;
            let rejected = (0..n)
                .filter(|_| decide(level, 0.0, 10.0, 20.0, rng.next_unit()) == Verdict::Reject)
                .count();
            let p = rejected as f64 / n as f64;
            assert!(
                (p - expected).abs() < 0.01,
                "level {level}: p {p} vs {expected}"
            );
        }
    }

    #[test]
    fn weight_zero_rejects_from_a_full_bucket_on() {
        assert_eq!(decide(9.5, 0.0, 10.0, 10.0, 0.0), Verdict::Pass);
        assert_eq!(decide(10.0, 0.0, 10.0, 10.0, 0.0), Verdict::Reject);
        assert_eq!(decide(0.0, 0.0, 0.0, 0.0, 0.0), Verdict::Reject);
        assert_eq!(decide(15.0, 0.0, 10.0, 20.0, 0.6), Verdict::Pass);
        assert_eq!(decide(15.0, 0.0, 10.0, 20.0, 0.4), Verdict::Reject);
    }

    fn view(level: f64, low: f64, high: f64) -> QuotaView {
        QuotaView {
            limit: 1.0,
            low_burst: low,
            high_burst: high,
            known: Level { level, at: 0 },
            ..QuotaView::default()
        }
    }

    #[test]
    fn a_chain_passes_only_if_every_quota_passes() {
        let est = Estimator::default();
        let ok = [
            view(0.0, 10.0, 10.0),
            view(5.0, 10.0, 10.0),
            view(9.0, 10.0, 10.0),
        ];
        assert_eq!(check_chain(&ok, 1.0, 0, &est, || 0.5), ChainVerdict::Pass);
        let full_parent = [view(0.0, 10.0, 10.0), view(10.0, 10.0, 10.0)];
        assert_eq!(
            check_chain(&full_parent, 1.0, 0, &est, || 0.5),
            ChainVerdict::Reject { at: 1 }
        );
    }

    #[test]
    fn a_chain_draws_only_inside_the_band() {
        let est = Estimator::default();
        let mut draws = 0;
        let chain = [
            view(0.0, 10.0, 20.0),
            view(15.0, 10.0, 20.0),
            view(0.0, 10.0, 20.0),
        ];
        check_chain(&chain, 1.0, 0, &est, || {
            draws += 1;
            0.99
        });
        assert_eq!(draws, 1);
    }
}
