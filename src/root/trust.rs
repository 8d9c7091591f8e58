//! What a root believes of a limiter's deltas: the level cap and the
//! per-limiter plausibility check.
//!
//! A root adds whatever a limiter says it admitted. Two rules keep a
//! forged or runaway delta from shutting a quota for long:
//!
//! - **The level cap** ([`level_cap`]). Once a leaky quota's level is at
//!   `high_burst` every request is refused; more only makes the refusal
//!   last longer, and makes reservations (`sluice_reserve`) wait longer.
//!   A root keeps a counter at most at
//!   `2 * high_burst + limit * cap_seconds` (`level_cap_seconds` in the
//!   root's config, default 5 s): room for a fleet's honest overshoot (the
//!   weight admitted before the limiters heard the level, about one sync
//!   interval's worth) and for reservations up to `cap_seconds` ahead
//!   (set it at least to the longest `max_wait` the fleet reserves with:
//!   a reservation counts its weight when it is made, so the level of a
//!   paced quota is `limit` times the wait), and no more. So after the
//!   last forged delta the
//!   level is back under `high_burst` within
//!   `high_burst / limit + cap_seconds` seconds. A window quota's counts
//!   (this window's and, sliding, the previous one's) are kept at most at
//!   `2 * limit`; a fixed window refuses until its end whatever the count,
//!   and a sliding one is back under `high_burst` by the end of the
//!   window after the forged delta (its share of the previous window falls
//!   to `high_burst` before the end when `high_burst` > 0). A quota with
//!   `limit` 0 never leaks: the cap bounds its level, nothing clears it
//!   but an edit of the quota.
//!
//! - **Plausibility** ([`Allowances`]). A limiter admits on a leaky quota
//!   only while its estimate, which counts everything it admitted since it
//!   last heard the cluster level, stays under `high_burst`; what it
//!   admitted before leaks at `limit`. So over any span `t` one limiter
//!   admits at most about `high_burst + limit * t` on one counter (plus
//!   `limit` times the longest reservation wait), and on a window quota
//!   about `high_burst` per window. A root keeps, per limiter and counter,
//!   an allowance bucket of that shape with a slack of [`SLACK`] (2x) for
//!   estimates, clocks and delays: capacity
//!   `2 * (high_burst + limit * cap_seconds)`, refilling at `2 * limit`
//!   per second (a window quota: capacity `2 * high_burst + rate * 1 s`,
//!   refilling at `2 * limit` per window: reservations never reach into
//!   a later window). What a delta asks beyond the allowance is
//!   clipped (not added) and counted for that limiter.
//!
//!   A return ([`Allowances::give_back`]) is units given back, not an
//!   add: the allowance holds the limiter's net on the counter (added
//!   less given back, leaking back to zero), an add has room up to
//!   `capacity` above zero and a return up to `capacity` below it. So a
//!   return gives its limiter's adds their room back (the units were not
//!   admitted after all: nine checks settled at nothing leave a burst of
//!   ten whole), and one limiter lowers a counter by no more than what it
//!   added and one allowance beyond (the refill included), as it raises
//!   it by no more than one allowance beyond what it gave back.
//!
//!   An edit of the quota gives every limiter a full allowance again. An
//!   allowance back at full (a net of zero) is the same as none, so the
//!   root forgets those every reload tick; and a delta or a return no
//!   larger than what refilled since the limiter's last sync (at most
//!   [`FREE_SECONDS`] of it) creates none, so steady traffic costs no
//!   state and only bursts are held until they refill (the bound loosens
//!   by at most one second of refill per burst). At most
//!   [`MAX_ALLOWANCES`] are held, and a delta or a return past that is
//!   checked against a full allowance (one sync's worth) without memory.
//!
//! A sync's rejection counts (statistics for the overview, which no
//! decision reads) are bounded the same way: all of one sync's together
//! at most what its limiter could have rejected since its previous sync
//! at [`MAX_REJECTIONS_PER_SECOND`] ([`plausible_rejections`]); beyond
//! that they are scaled down together, and the cut counted.
//!
//! Neither rule can tell a limiter that lies within its allowance from an
//! honest one: credentials ([`super::credentials`]) decide who may speak
//! for a limiter id, these rules bound what any one id can do.

use rustc_hash::FxHashMap;

use crate::core::{Nanos, Quota, SECS_PER_NANO};
use crate::wire::CounterKey;

use super::counter_book::{AllowanceShape, CounterRule};

/// A leaky quota's cap: this many `high_burst`s ...
pub const CAP_BURSTS: f64 = 2.0;
/// ... plus `limit` times the configured seconds (`level_cap_seconds`).
pub const DEFAULT_CAP_SECONDS: f64 = 5.0;
/// A window quota's counts are capped at this many `limit`s.
pub const CAP_WINDOWS: f64 = 2.0;
/// How much more than one limiter's admissions could be its deltas may
/// carry before they are clipped.
pub const SLACK: f64 = 2.0;
/// Delay and clock jitter a window quota's allowance absorbs, seconds of
/// its rate.
pub const JITTER_SECONDS: f64 = 1.0;
/// A delta up to this many seconds of refill since its limiter's last
/// sync is granted without keeping an allowance, when none is held.
pub const FREE_SECONDS: f64 = 1.0;
/// Most allowances (limiter and counter pairs not back at full) held.
pub const MAX_ALLOWANCES: usize = 2_000_000;

/// Most checks one limiter is believed to reject a second: ten times
/// what one busy nginx host serves (each rejection is a request it
/// answered).
pub const MAX_REJECTIONS_PER_SECOND: f64 = 1e7;
/// A sync's rejection `counts` (`[quota id, count]`), cut to what their
/// limiter could have rejected in the `since` seconds since its previous
/// sync (at least one second's worth, at most the longest interval's) at
/// [`MAX_REJECTIONS_PER_SECOND`]: over that, every count is scaled down
/// by the same factor. Returns the counts and how many rejections were
/// cut.
pub fn plausible_rejections(counts: &[(u64, u64)], since: f64) -> (Vec<(u64, u64)>, u64) {
    let total: u128 = counts.iter().map(|&(_, n)| u128::from(n)).sum();
    let seconds = if since.is_nan() { 1.0 } else { since };
    // A sync's counts cover one cycle, at most the longest interval.
    let longest = crate::sync::config::MAX_INTERVAL.as_secs_f64();
    let most = MAX_REJECTIONS_PER_SECOND * seconds.clamp(1.0, longest);
    if total as f64 <= most {
        return (counts.to_vec(), 0);
    }
    let scale = most / total as f64;
    let cut: Vec<(u64, u64)> = counts
        .iter()
        .map(|&(id, n)| (id, (n as f64 * scale) as u64))
        .collect();
    let kept: u128 = cut.iter().map(|&(_, n)| u128::from(n)).sum();
    (cut, u64::try_from(total - kept).unwrap_or(u64::MAX))
}

/// The highest level a root keeps for a counter of `quota` (see the
/// module doc).
pub fn level_cap(quota: &Quota, cap_seconds: f64) -> f64 {
    if quota.window.is_some() {
        CAP_WINDOWS * quota.limit
    } else {
        CAP_BURSTS * quota.high_burst + quota.leak() * cap_seconds
    }
}

/// How a counter of `quota` counts at a root, with its cap and the
/// allowance each limiter has on it (a window quota's measured with the
/// window holding `now`).
pub fn counter_rule(quota: &Quota, utc_offset: i64, cap_seconds: f64, now: Nanos) -> CounterRule {
    CounterRule {
        counting: quota.counting(utc_offset),
        cap: level_cap(quota, cap_seconds),
        allowance: shape(quota, utc_offset, cap_seconds, now),
    }
}

/// Which way a weight moves a counter: an add (a delta) or a return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Weight added (a delta).
    Add,
    /// Weight given back (a return).
    Return,
}

impl Direction {
    /// The sign of the weight on a limiter's net.
    fn sign(self) -> f64 {
        match self {
            Direction::Add => 1.0,
            Direction::Return => -1.0,
        }
    }
}

/// One limiter's allowance on one counter: what it added less what it
/// gave back, leaking back to zero at `rate`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Allowance {
    /// Weight added less weight given back, not yet refilled, at `at`:
    /// above zero the room its adds used, below it the room its returns
    /// used beyond what it added.
    net: f64,
    /// Root time of `net`.
    at: Nanos,
    /// Refill rate, units per second.
    rate: f64,
    /// Epoch of the quota the allowance was measured for: an edit starts
    /// over.
    epoch: u64,
}

impl Allowance {
    fn net_at(&self, now: Nanos) -> f64 {
        let refilled = self.rate * now.saturating_sub(self.at) as f64 * SECS_PER_NANO;
        if self.net > 0.0 {
            (self.net - refilled).max(0.0)
        } else {
            (self.net + refilled).min(0.0)
        }
    }
}

/// The shape of the allowance for a counter of `quota` at `now`.
pub fn shape(quota: &Quota, utc_offset: i64, cap_seconds: f64, now: Nanos) -> AllowanceShape {
    let (capacity, refill) = match quota.window_rule(utc_offset) {
        Some(rule) => {
            let length = rule.locate(now).length as f64 * SECS_PER_NANO;
            let rate = SLACK * quota.limit / length.max(1e-9);
            (SLACK * quota.high_burst + rate * JITTER_SECONDS, rate)
        }
        None => (
            SLACK * (quota.high_burst + quota.leak() * cap_seconds),
            SLACK * quota.leak(),
        ),
    };
    AllowanceShape {
        capacity,
        refill,
        epoch: quota.epoch,
    }
}

/// Every limiter's allowances.
#[derive(Debug)]
pub struct Allowances {
    /// By limiter index and counter.
    held: FxHashMap<(u32, CounterKey), Allowance>,
    /// Most entries in `held`.
    max: usize,
    /// Deltas checked without memory because `held` was full (or the
    /// limiter was not in the registry).
    untracked: u64,
}

impl Default for Allowances {
    fn default() -> Self {
        Self::with_max(MAX_ALLOWANCES)
    }
}

impl Allowances {
    /// At most `max` allowances held.
    pub fn with_max(max: usize) -> Self {
        Self {
            held: FxHashMap::default(),
            max,
            untracked: 0,
        }
    }

    /// How much of `delta` limiter `limiter` (its registry number and the
    /// seconds since its previous sync) may add to `counter`, whose
    /// allowances are shaped `shape`, at `now`; takes that much from its
    /// allowance (room for returns of it, too).
    pub fn admit(
        &mut self,
        limiter: (u32, f64),
        counter: CounterKey,
        shape: &AllowanceShape,
        delta: f64,
        now: Nanos,
    ) -> f64 {
        self.draw(Direction::Add, limiter, counter, shape, delta, now)
    }

    /// How much of `delta` limiter `limiter` may give back to `counter`
    /// at `now`, as [`Allowances::admit`] for a return: what it added,
    /// and at most one allowance beyond. What it gives back is room for
    /// its adds again: units given back were not admitted.
    pub fn give_back(
        &mut self,
        limiter: (u32, f64),
        counter: CounterKey,
        shape: &AllowanceShape,
        delta: f64,
        now: Nanos,
    ) -> f64 {
        self.draw(Direction::Return, limiter, counter, shape, delta, now)
    }

    /// Grants what the allowance has room for of `delta` in `direction`
    /// (capacity less the limiter's net in that direction) and moves the
    /// net by it.
    fn draw(
        &mut self,
        direction: Direction,
        limiter: (u32, f64),
        counter: CounterKey,
        shape: &AllowanceShape,
        delta: f64,
        now: Nanos,
    ) -> f64 {
        let AllowanceShape {
            capacity,
            refill: rate,
            epoch,
        } = *shape;
        // What refilled since the limiter's last sync (up to a second of
        // it) is granted without an allowance when none is held: a full
        // allowance would grant it too, and within a second's refill of
        // the same. So steady traffic keeps no state, and only bursts (and
        // abuse) are held until they refill.
        let (limiter, since) = limiter;
        let free = rate * since.clamp(0.0, FREE_SECONDS);
        if delta <= free && !self.held.contains_key(&(limiter, counter)) {
            return delta;
        }
        let fresh = Allowance {
            net: 0.0,
            at: now,
            rate,
            epoch,
        };
        if self.held.len() >= self.max && !self.held.contains_key(&(limiter, counter)) {
            self.untracked += 1;
            return delta.min(capacity);
        }
        let entry = self.held.entry((limiter, counter)).or_insert(fresh);
        let net = if entry.epoch == epoch {
            entry.net_at(now)
        } else {
            0.0
        };
        let sign = direction.sign();
        let granted = delta.min((capacity - sign * net).max(0.0));
        *entry = Allowance {
            net: net + sign * granted,
            ..fresh
        };
        granted
    }

    /// Forgets the allowances that are back at full at `now` (the same as
    /// none); returns how many.
    pub fn forget_refilled(&mut self, now: Nanos) -> usize {
        let before = self.held.len();
        self.held.retain(|_, a| a.net_at(now) != 0.0);
        // A burst of new limiters leaves a large, mostly empty table.
        if self.held.capacity() > 4 * self.held.len() + 4096 {
            self.held.shrink_to_fit();
        }
        before - self.held.len()
    }

    /// Allowances held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Deltas checked without memory so far.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Window;

    const SEC: Nanos = 1_000_000_000;

    fn leaky(limit: f64, high: f64) -> Quota {
        Quota::new(1, "q", limit, high / 2.0, high).at_epoch(1)
    }

    #[test]
    fn a_leaky_cap_is_two_bursts_and_some_seconds_of_limit() {
        assert_eq!(level_cap(&leaky(10.0, 20.0), 5.0), 40.0 + 50.0);
        assert_eq!(level_cap(&leaky(0.0, 20.0), 5.0), 40.0);
        let window = leaky(100.0, 80.0).windowed(Window::Minute, false);
        assert_eq!(level_cap(&window, 5.0), 200.0);
    }

    #[test]
    fn an_allowance_grants_a_burst_then_the_rate() {
        let mut a = Allowances::default();
        let q = leaky(10.0, 20.0);
        let c = CounterKey::named(1);
        // Capacity 2 * (20 + 10 * 1 s) = 60 (with a 1 s cap), refilling
        // at 20/s.
        assert_eq!(a.admit((0, 0.0), c, &shape(&q, 0, 1.0, 0), 1e9, 0), 60.0);
        assert_eq!(a.admit((0, 0.0), c, &shape(&q, 0, 1.0, 0), 1e9, 0), 0.0);
        assert_eq!(
            a.admit((0, 0.0), c, &shape(&q, 0, 1.0, SEC), 1e9, SEC),
            20.0
        );
        // Another limiter, or another counter, has its own.
        assert_eq!(a.admit((1, 0.0), c, &shape(&q, 0, 1.0, SEC), 5.0, SEC), 5.0);
        assert_eq!(
            a.admit(
                (0, 0.0),
                CounterKey { id: 1, key: 9 },
                &shape(&q, 0, 1.0, SEC),
                7.0,
                SEC,
            ),
            7.0
        );
        // Honest traffic at the limit is never clipped.
        let mut honest = Allowances::default();
        for s in 0..100 {
            assert_eq!(
                honest.admit((0, 0.0), c, &shape(&q, 0, 1.0, s * SEC), 10.0, s * SEC),
                10.0
            );
        }
        // An edit starts over.
        let edited = q.clone().at_epoch(2);
        assert_eq!(
            a.admit((0, 0.0), c, &shape(&edited, 0, 1.0, SEC), 1e9, SEC),
            60.0
        );
    }

    /// Issue 34, case 2, at the allowance: nine units added and given
    /// back leave the limiter its whole allowance for the adds that
    /// follow, however often; returns beyond what the limiter added are
    /// cut to one allowance.
    #[test]
    fn returns_give_the_adds_their_room_back_and_are_bounded_by_the_adds() {
        let mut a = Allowances::default();
        // Burst 10, no leak: capacity 2 * 10 = 20, refilling nothing.
        let q = leaky(0.0, 10.0);
        let (c, s) = (CounterKey::named(1), shape(&q, 0, 5.0, 0));
        assert_eq!(a.admit((0, 1.0), c, &s, 9.0, 0), 9.0);
        assert_eq!(a.give_back((0, 1.0), c, &s, 9.0, SEC), 9.0);
        for round in 0..5 {
            assert_eq!(a.admit((0, 1.0), c, &s, 20.0, SEC), 20.0, "{round}");
            assert_eq!(a.give_back((0, 1.0), c, &s, 20.0, SEC), 20.0, "{round}");
        }
        // All given back: the pair is back at full and forgotten.
        assert_eq!(a.forget_refilled(SEC), 1);
        // Another limiter that added nothing gives back one allowance at
        // most; after that only what it adds.
        assert_eq!(a.give_back((1, 1.0), c, &s, 1e9, SEC), 20.0);
        assert_eq!(a.give_back((1, 1.0), c, &s, 1e9, SEC), 0.0);
        assert_eq!(a.admit((1, 1.0), c, &s, 5.0, SEC), 5.0);
        assert_eq!(a.give_back((1, 1.0), c, &s, 1e9, SEC), 5.0);
        // What it gave back beyond its adds is room for adds again: its
        // net (40 added less 20 given back) stays within one allowance.
        assert_eq!(a.admit((1, 1.0), c, &s, 1e9, SEC), 40.0);
    }

    #[test]
    fn a_window_allowance_is_two_bursts_and_refills_per_window() {
        let mut a = Allowances::default();
        let q = leaky(100.0, 80.0).windowed(Window::TenSeconds, false);
        let c = CounterKey::named(1);
        // 2 * 80 + (2 * 100 / 10 s) * 1 s = 180, refilling at 20/s.
        assert_eq!(a.admit((0, 0.0), c, &shape(&q, 0, 1.0, 0), 1e9, 0), 180.0);
        assert_eq!(
            a.admit((0, 0.0), c, &shape(&q, 0, 1.0, 10 * SEC), 1e9, 10 * SEC),
            180.0
        );
    }

    #[test]
    fn steady_deltas_keep_no_allowance_and_bursts_do() {
        let mut a = Allowances::default();
        let q = leaky(10.0, 20.0);
        let c = CounterKey::named(1);
        // 20/s refill: 10 after half a second is free, and held nowhere.
        assert_eq!(a.admit((0, 0.5), c, &shape(&q, 0, 1.0, 0), 10.0, 0), 10.0);
        assert!(a.is_empty());
        // More is a burst: held, and from then on every delta counts
        // against it until it refilled.
        assert_eq!(a.admit((0, 0.5), c, &shape(&q, 0, 1.0, 0), 50.0, 0), 50.0);
        assert_eq!(a.admit((0, 0.5), c, &shape(&q, 0, 1.0, 0), 10.0, 0), 10.0);
        assert_eq!(a.admit((0, 0.5), c, &shape(&q, 0, 1.0, 0), 10.0, 0), 0.0);
        // Free refill is at most a second's, however long the gap.
        let d = CounterKey::named(2);
        assert_eq!(a.admit((0, 3600.0), d, &shape(&q, 0, 1.0, 0), 1e9, 0), 60.0);
    }

    #[test]
    fn full_allowances_are_forgotten_and_the_book_is_bounded() {
        let mut a = Allowances::with_max(2);
        let q = leaky(10.0, 20.0);
        for key in 1..=2 {
            a.admit(
                (0, 0.0),
                CounterKey { id: 1, key },
                &shape(&q, 0, 1.0, 0),
                30.0,
                0,
            );
        }
        // Past the bound: checked against a fresh allowance, not held.
        let third = CounterKey { id: 1, key: 3 };
        assert_eq!(
            a.admit((0, 0.0), third, &shape(&q, 0, 1.0, 0), 1e9, 0),
            60.0
        );
        assert_eq!(
            a.admit((0, 0.0), third, &shape(&q, 0, 1.0, 0), 1e9, 0),
            60.0
        );
        assert_eq!((a.len(), a.untracked()), (2, 2));
        assert_eq!(a.forget_refilled(SEC), 0);
        assert_eq!(a.forget_refilled(2 * SEC), 2);
        assert!(a.is_empty());
    }

    #[test]
    fn rejection_counts_are_cut_to_what_the_limiter_could_have_rejected() {
        // Within a second's worth: kept as sent.
        let honest = [(1, 5_000), (2, 3)];
        assert_eq!(plausible_rejections(&honest, 0.2), (honest.to_vec(), 0));
        // The forged counts of the issue: scaled down together to ten
        // million for the one second since the previous sync.
        let forged = [(1, u64::MAX), (2, u64::MAX)];
        let (cut, dropped) = plausible_rejections(&forged, 1.0);
        assert_eq!(cut, vec![(1, 5_000_000), (2, 5_000_000)]);
        assert_eq!(dropped, u64::MAX);
        // A longer gap believes more, up to an hour's worth.
        let (cut, _) = plausible_rejections(&[(1, u64::MAX)], 1e9);
        assert_eq!(cut, vec![(1, 36_000_000_000)]);
    }
}
