//! The decision: pass, reject, or reject with a probability rising across
//! the burst band; and the check of a quota with all its ancestors.

use super::estimate::{estimate_level, estimate_window, Estimator};
use super::snapshot::QuotaSnapshot;
use super::Nanos;

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

/// How much room a quota has as a check estimated it: what the rate-limit
/// response headers and `Retry-After` are computed from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    /// Leak rate, units per second.
    pub limit: f64,
    /// Level up to which everything passes: what passes with certainty
    /// from an empty bucket.
    pub low_burst: f64,
    /// Level from which everything is rejected.
    pub high_burst: f64,
    /// The estimated level (with the request's weight, when it was
    /// counted).
    pub level: f64,
    /// For a window quota, where its window stands: a window quota's
    /// level falls at window ends, not by leaking.
    pub window: Option<WindowRoom>,
}

/// Where a window quota's window stands, for [`Room`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowRoom {
    /// Seconds until the current window ends.
    pub to_end: f64,
    /// The current window's length, seconds.
    pub length: f64,
    /// The next window's length, seconds (months differ).
    pub next_length: f64,
    /// The current window's count (with the added units).
    pub count: f64,
    /// The previous window's count (0 unless sliding).
    pub prev: f64,
    /// The share of `prev` that counts now (sliding).
    pub prev_weight: f64,
    /// The window slides.
    pub sliding: bool,
}

impl WindowRoom {
    /// Seconds until a window quota at `level` is down to `target`: at
    /// once if it is there; for a fixed window, at the window's end; for a
    /// sliding one, when the previous window's share has shrunk enough, in
    /// this window or (when this window's own count is too high) the next.
    fn wait_for(&self, level: f64, target: f64) -> f64 {
        if level <= target {
            return 0.0;
        }
        if !self.sliding {
            return self.to_end;
        }
        if self.count <= target && self.prev > 0.0 {
            // prev * weight falls linearly to 0 over the window.
            let weight_then = (target - self.count) / self.prev;
            return ((self.prev_weight - weight_then) * self.length).max(0.0);
        }
        // Next window: this count becomes the previous one, weighing 1 at
        // its start.
        let weight_then = if self.count > 0.0 {
            (target / self.count).min(1.0)
        } else {
            1.0
        };
        self.to_end + (1.0 - weight_then) * self.next_length
    }
}

/// Longest wait a rejection announces (a year): a request that would have
/// to wait longer (a tiny limit, a level inflated far above its quota) is
/// told that waiting cannot help instead of a number no client honours.
pub const MAX_RETRY_SECS: f64 = 365.0 * 86_400.0;

/// Whether, and when, waiting lets a rejected request pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Wait {
    /// Seconds until the request passes for sure (a weight up to
    /// `low_burst`) or has its best odds (a weight inside the burst band:
    /// the bucket empty). Zero when only the draw rejected it.
    Seconds(f64),
    /// The request cannot pass this quota as it stands, however long it
    /// waits.
    Never(Never),
}

/// Why waiting cannot help a rejected request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Never {
    /// The weight is above `high_burst`: it is rejected even from an empty
    /// bucket (a check of weight 0 when `high_burst` is 0, too).
    OverHighBurst {
        /// The quota's `high_burst`.
        high_burst: f64,
    },
    /// The limit is 0: the level never drains.
    NoLeak,
    /// The level drains, but only after more than [`MAX_RETRY_SECS`].
    TooLong {
        /// Seconds it would take.
        seconds: f64,
    },
    /// An override denies the key (see [`crate::core::tier`]).
    Denied,
}

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Never::OverHighBurst { high_burst } => {
                write!(f, "the weight is above the quota's high_burst {high_burst}")
            }
            Never::NoLeak => f.write_str("the quota's limit is 0: its level never drains"),
            Never::TooLong { seconds } => write!(
                f,
                "its level would take {seconds:.0} s to drain, more than {MAX_RETRY_SECS:.0} s"
            ),
            Never::Denied => f.write_str("an override denies the key"),
        }
    }
}

impl Room {
    /// The room of `quota` at `now`, with `added` units on its estimated
    /// level.
    #[inline]
    pub fn of(quota: &QuotaSnapshot, added: f64, now: Nanos, estimator: &Estimator) -> Room {
        let mut room = Room {
            limit: quota.limit,
            low_burst: quota.low_burst,
            high_burst: quota.high_burst,
            level: 0.0,
            window: None,
        };
        let Some(rule) = &quota.window else {
            room.level = estimate_level(quota, now, estimator) + added;
            return room;
        };
        let estimate = estimate_window(quota, rule, now, estimator);
        // Divided, not multiplied by 1e-9 (which is inexact): a window
        // ending in whole seconds is whole seconds away, so a reset
        // rounded up is not one second late (31,535,000 s, not 31,535,001).
        let secs = |ns: i64| ns as f64 / 1e9;
        let at = estimate.at;
        room.level = estimate.level() + added;
        room.window = Some(WindowRoom {
            to_end: secs(at.to_end()),
            length: secs(at.length),
            next_length: secs(rule.window.length(at.index + 1)),
            count: estimate.count + added,
            prev: estimate.prev,
            prev_weight: if rule.sliding { at.prev_weight() } else { 0.0 },
            sliding: rule.sliding,
        });
        room
    }

    /// The span the quota is stated over, seconds: a window quota's window;
    /// for a leaky bucket the time an empty bucket takes to refill its low
    /// burst (at least 1; a day when nothing leaks).
    pub fn period(&self) -> f64 {
        match &self.window {
            Some(w) => w.length,
            None if self.limit > 0.0 => (self.low_burst / self.limit).ceil().max(1.0),
            None => 86_400.0,
        }
    }

    /// Units below `low_burst`: negative when the level is above it.
    pub fn slack(&self) -> f64 {
        self.low_burst - self.level
    }

    /// Units that would still pass with certainty.
    pub fn remaining(&self) -> f64 {
        self.slack().max(0.0)
    }

    /// Seconds until the bucket is empty again (infinite for limit 0 and
    /// a non-empty bucket).
    pub fn seconds_to_empty(&self) -> f64 {
        if let Some(w) = &self.window {
            // A sliding count lingers through the next window.
            return if w.sliding && w.count > 0.0 {
                w.to_end + w.next_length
            } else if w.count > 0.0 || w.prev * w.prev_weight > 0.0 {
                w.to_end
            } else {
                0.0
            };
        }
        if self.level <= 0.0 {
            0.0
        } else if self.limit > 0.0 {
            self.level / self.limit
        } else {
            f64::INFINITY
        }
    }

    /// When a request of `weight` that this quota rejected could pass
    /// (`level` is the level it was rejected at, without its weight).
    ///
    /// A weight up to `low_burst` passes for sure once the level has
    /// leaked to `low_burst - weight`; a weight inside the band never
    /// passes for sure, and has its best odds once the bucket is empty; a
    /// weight above `high_burst` never passes, nor does anything that
    /// needs a frozen (limit 0) level to drop. A rejection by the draw
    /// alone, at a level the request could pass at, waits 0 s.
    #[inline]
    pub fn wait(&self, weight: f64) -> Wait {
        match &self.window {
            None => leaky_wait(
                self.level,
                weight,
                self.limit,
                self.low_burst,
                self.high_burst,
            ),
            Some(w) => match wait_target(weight, self.low_burst, self.high_burst) {
                Ok(target) => Wait::Seconds(w.wait_for(self.level, target)),
                Err(never) => never,
            },
        }
    }
}

/// The level a request of `weight` can pass with certainty at (see
/// [`Room::wait`]), or why none is: a weight above `high_burst` (or a
/// zero weight against a `high_burst` of 0).
#[inline]
fn wait_target(weight: f64, low_burst: f64, high_burst: f64) -> Result<f64, Wait> {
    let counted = weight > 0.0;
    if (counted && weight > high_burst) || (!counted && high_burst <= 0.0) {
        return Err(Wait::Never(Never::OverHighBurst { high_burst }));
    }
    Ok(if weight <= low_burst {
        low_burst - weight
    } else {
        0.0
    })
}

/// [`Room::wait`] of a leaky quota at `level`: until the level has leaked
/// down to the request's target.
#[inline]
fn leaky_wait(level: f64, weight: f64, limit: f64, low_burst: f64, high_burst: f64) -> Wait {
    let target = match wait_target(weight, low_burst, high_burst) {
        Ok(target) => target,
        Err(never) => return never,
    };
    let excess = (level - target).max(0.0);
    if limit <= 0.0 {
        let after = level + weight;
        let full = if weight > 0.0 {
            after > high_burst
        } else {
            after >= high_burst
        };
        return if full {
            Wait::Never(Never::NoLeak)
        } else {
            Wait::Seconds(0.0)
        };
    }
    let seconds = excess / limit;
    if seconds > MAX_RETRY_SECS {
        Wait::Never(Never::TooLong { seconds })
    } else {
        Wait::Seconds(seconds)
    }
}

/// The quota of `chain` with the least room once `added` units are
/// counted on every level: its index in the chain and its room (the first
/// one on a tie). `chain` must not be empty.
pub fn tightest(
    chain: &[QuotaSnapshot],
    added: f64,
    now: Nanos,
    estimator: &Estimator,
) -> (usize, Room) {
    let mut best = (0, Room::of(&chain[0], added, now, estimator));
    for (depth, quota) in chain.iter().enumerate().skip(1) {
        let room = Room::of(quota, added, now, estimator);
        if room.slack() < best.1.slack() {
            best = (depth, room);
        }
    }
    best
}

/// A partial grant: the most units, up to `want`, that every quota of
/// `chain` allows with certainty now (its level plus the grant at most
/// `low_burst`), whole units only; and the index of the quota that
/// allows the least. `chain` must not be empty.
///
/// Only the certain part counts: in the burst band a partial grant would
/// be a coin toss per unit, and a caller that asked for several units
/// wants to know how many it may use, not a gamble.
pub fn grantable(
    chain: &[QuotaSnapshot],
    want: f64,
    now: Nanos,
    estimator: &Estimator,
) -> (f64, usize) {
    let (depth, room) = tightest(chain, 0.0, now, estimator);
    (room.slack().clamp(0.0, want).floor(), depth)
}

/// A reservation's wait: how long a request of `weight` counted now must
/// wait before it acts so that every quota of `chain` stays at its rate
/// (GCRA's theoretical arrival time, on the estimated fleet-wide level):
/// the longest of the quotas' waits until their level has leaked down to
/// room for the weight ([`Room::wait`]), in seconds. `Err` with the index
/// of the quota that refuses and why, when waiting cannot help (a weight
/// above a `high_burst`, a frozen level) or a window quota has no room
/// now: its next window's room cannot be taken in advance.
pub fn reserve_wait(
    chain: &[QuotaSnapshot],
    weight: f64,
    now: Nanos,
    estimator: &Estimator,
) -> Result<f64, (usize, Wait)> {
    let mut longest = 0.0f64;
    for (depth, quota) in chain.iter().enumerate() {
        // A leaky quota's wait straight from its level: building its Room
        // (sized for a window's) cost a reservation a quarter of its time.
        let wait = if quota.window.is_none() {
            let level = estimate_level(quota, now, estimator);
            leaky_wait(
                level,
                weight,
                quota.limit,
                quota.low_burst,
                quota.high_burst,
            )
        } else {
            match Room::of(quota, 0.0, now, estimator).wait(weight) {
                Wait::Seconds(s) if s > 0.0 => return Err((depth, Wait::Seconds(s))),
                wait => wait,
            }
        };
        match wait {
            Wait::Seconds(s) => longest = longest.max(s),
            never => return Err((depth, never)),
        }
    }
    Ok(longest)
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

/// True when a leaky quota passes `weight` whatever the time: its level
/// can be no higher than the known level plus all the others can add in a
/// horizon plus this host's own weight (the leak only lowers it), and that
/// much plus `weight` is still below `low_burst`. A check of a quota far
/// from its limit (most checks) so skips the clock arithmetic and the
/// draw; the verdict is the one [`decide`] would give.
#[inline(always)]
pub fn passes_for_sure(view: &QuotaSnapshot, weight: f64, estimator: &Estimator) -> bool {
    if view.window.is_some() {
        return false;
    }
    let others = match estimator.mode {
        crate::core::Extrapolation::ConstantRatio { ratio } => ratio * view.limit,
        crate::core::Extrapolation::Adaptive => view.fill_rate,
    };
    let horizon = estimator.horizon as f64 * super::SECS_PER_NANO;
    // Strictly below: a check of weight 0 is rejected at a full bucket
    // (`low_burst == high_burst`).
    let own = view.own_recent.max(0.0);
    view.known.level + others.max(0.0) * horizon + own + weight < view.low_burst
}

/// Checks a chain (the named quota first, then its ancestors): the request
/// passes only if every quota passes. Nothing is committed here; on
/// [`ChainVerdict::Pass`] the caller adds the weight to every counter in the
/// chain (check all, then commit), and a weight of 0 checks without
/// counting.
///
/// `draw` is called only for quotas whose level falls in the band.
#[inline]
pub fn check_chain(
    chain: &[QuotaSnapshot],
    weight: f64,
    now: Nanos,
    estimator: &Estimator,
    draw: impl FnMut() -> f64,
) -> ChainVerdict {
    // Most checks are far from every limit: decided here, inlined into the
    // caller, without the call, the frame and the loop of a quota near its
    // limit (about 50 of a hot keyed check's instructions, callgrind).
    if chain
        .iter()
        .all(|view| passes_for_sure(view, weight, estimator))
    {
        return ChainVerdict::Pass;
    }
    check_chain_near(chain, weight, now, estimator, draw)
}

/// [`check_chain`] of a chain in which some quota may be near its limit.
#[inline(never)]
fn check_chain_near(
    chain: &[QuotaSnapshot],
    weight: f64,
    now: Nanos,
    estimator: &Estimator,
    mut draw: impl FnMut() -> f64,
) -> ChainVerdict {
    for (at, view) in chain.iter().enumerate() {
        if passes_for_sure(view, weight, estimator) {
            continue;
        }
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
    use crate::core::Level;

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

    fn view(level: f64, low: f64, high: f64) -> QuotaSnapshot {
        QuotaSnapshot {
            limit: 1.0,
            low_burst: low,
            high_burst: high,
            known: Level { level, at: 0 },
            ..QuotaSnapshot::default()
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
    fn the_wait_is_the_time_to_leak_down_to_room_for_the_weight() {
        let room = Room {
            limit: 10.0,
            low_burst: 20.0,
            high_burst: 40.0,
            level: 20.0,
            window: None,
        };
        assert_eq!(room.wait(5.0), Wait::Seconds(0.5));
        assert_eq!(room.wait(0.0), Wait::Seconds(0.0));
        // Inside the band: the best odds come with an empty bucket.
        assert_eq!(room.wait(30.0), Wait::Seconds(2.0));
        let frozen = Room { limit: 0.0, ..room };
        assert_eq!(frozen.seconds_to_empty(), f64::INFINITY);
        assert_eq!(room.seconds_to_empty(), 2.0);
        assert_eq!(frozen.seconds_to_empty(), f64::INFINITY);
        assert_eq!(
            Room {
                level: 0.0,
                ..frozen
            }
            .seconds_to_empty(),
            0.0
        );
        assert_eq!((room.remaining(), room.slack()), (0.0, 0.0));
        assert_eq!(
            Room {
                level: 25.0,
                ..room
            }
            .slack(),
            -5.0
        );
    }

    #[test]
    fn waiting_cannot_help_over_high_burst_at_limit_zero_or_beyond_a_year() {
        let room = Room {
            limit: 10.0,
            low_burst: 20.0,
            high_burst: 40.0,
            level: 0.0,
            window: None,
        };
        let over = Wait::Never(Never::OverHighBurst { high_burst: 40.0 });
        assert_eq!(room.wait(41.0), over);
        assert_eq!(room.wait(crate::core::quota::MAX_WEIGHT as f64), over);
        let closed = Room {
            high_burst: 0.0,
            low_burst: 0.0,
            ..room
        };
        assert!(matches!(
            closed.wait(0.0),
            Wait::Never(Never::OverHighBurst { .. })
        ));
        // A frozen quota at its burst never drains...
        let frozen = Room {
            limit: 0.0,
            level: 40.0,
            window: None,
            ..room
        };
        assert_eq!(frozen.wait(1.0), Wait::Never(Never::NoLeak));
        assert_eq!(frozen.wait(0.0), Wait::Never(Never::NoLeak));
        // ...but inside its band a retry may pass the draw now.
        let banded = Room {
            level: 30.0,
            ..frozen
        };
        assert_eq!(banded.wait(1.0), Wait::Seconds(0.0));
        // An inflated level (a forged sync) drains in geological time.
        let inflated = Room {
            level: 9e20,
            ..room
        };
        assert!(matches!(
            inflated.wait(1.0),
            Wait::Never(Never::TooLong { .. })
        ));
        let year = Room {
            level: 20.0 + 10.0 * MAX_RETRY_SECS,
            ..room
        };
        assert_eq!(year.wait(0.0), Wait::Seconds(MAX_RETRY_SECS));
        assert_eq!(
            Never::OverHighBurst { high_burst: 40.0 }.to_string(),
            "the weight is above the quota's high_burst 40"
        );
    }

    #[test]
    fn the_tightest_quota_has_the_least_room_after_the_weight() {
        let est = Estimator::default();
        let chain = [
            view(0.0, 10.0, 10.0),
            view(5.0, 10.0, 10.0),
            view(95.0, 100.0, 100.0),
        ];
        let (depth, room) = tightest(&chain, 2.0, 0, &est);
        assert_eq!((depth, room.level, room.remaining()), (1, 7.0, 3.0));
        let (depth, _) = tightest(&chain[2..], 2.0, 0, &est);
        assert_eq!(depth, 0);
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

    #[test]
    fn a_grant_is_what_every_quota_allows_for_sure() {
        let est = Estimator::default();
        let chain = [view(3.5, 10.0, 20.0), view(0.0, 5.0, 5.0)];
        // The parent allows 5, the quota 6.5: 5 whole units.
        assert_eq!(grantable(&chain, 100.0, 0, &est), (5.0, 1));
        assert_eq!(grantable(&chain, 2.0, 0, &est), (2.0, 1));
        // In the band nothing is certain: nothing is granted.
        let full = [view(12.0, 10.0, 20.0)];
        assert_eq!(grantable(&full, 3.0, 0, &est), (0.0, 0));
    }

    #[test]
    fn a_reservation_waits_until_the_level_has_room() {
        let est = Estimator::default();
        // limit 1/s: 4 units over a low burst of 10 with weight 2 is 6 s.
        let chain = [view(14.0, 10.0, 20.0)];
        assert_eq!(reserve_wait(&chain, 2.0, 0, &est), Ok(6.0));
        assert_eq!(
            reserve_wait(&[view(3.0, 10.0, 20.0)], 2.0, 0, &est),
            Ok(0.0)
        );
        // The longest wait of the chain.
        let chain = [view(14.0, 10.0, 20.0), view(30.0, 10.0, 40.0)];
        assert_eq!(reserve_wait(&chain, 2.0, 0, &est), Ok(22.0));
        // A weight above high_burst never passes.
        assert!(matches!(
            reserve_wait(&[view(0.0, 10.0, 20.0)], 21.0, 0, &est),
            Err((0, Wait::Never(_)))
        ));
        // A full window cannot be reserved into.
        let window = QuotaSnapshot {
            window: Some(crate::core::WindowRule {
                window: crate::core::Window::TenSeconds,
                sliding: false,
                utc_offset: 0,
            }),
            ..view(10.0, 10.0, 10.0)
        };
        assert_eq!(
            reserve_wait(&[window], 1.0, 2_000_000_000, &est),
            Err((0, Wait::Seconds(8.0)))
        );
    }

    proptest::proptest! {
        /// The shortcut never passes what the full rule would reject,
        /// whatever the draw, the time since the known level, or the mode.
        #[test]
        fn a_sure_pass_is_a_pass_of_the_full_rule(
            level in 0.0..1e6f64,
            own in -1e5..1e6f64,
            fill in -1e3..1e6f64,
            limit in 0.0..1e6f64,
            low in 0.0..2e6f64,
            band in 0.0..1e6f64,
            weight in 0.0..1e5f64,
            ratio in proptest::option::of(0.0..4.0f64),
            horizon in 0u64..5_000_000_000,
            elapsed in 0u64..10_000_000_000,
        ) {
            let view = QuotaSnapshot {
                limit,
                low_burst: low,
                high_burst: low + band,
                known: Level { level, at: 1_000 },
                fill_rate: fill,
                own_recent: own,
                window: None,
                prev: 0.0,
            };
            let mode = match ratio {
                Some(ratio) => crate::core::Extrapolation::ConstantRatio { ratio },
                None => crate::core::Extrapolation::Adaptive,
            };
            let estimator = Estimator { mode, horizon };
            if passes_for_sure(&view, weight, &estimator) {
                let now = 1_000 + elapsed;
                let estimate = estimate_level(&view, now, &estimator);
                for draw in [0.0, 0.5, 0.999_999] {
                    proptest::prop_assert_eq!(
                        decide(estimate, weight, view.low_burst, view.high_burst, draw),
                        Verdict::Pass
                    );
                }
            }
        }
    }
}
