//! A counter as a level at a time.
//!
//! DESIGN.md describes each counter as a grow-only number `C` with a rising
//! floor `F(t) = limit * t` and a bucket level `max(C, F(t)) - F(t)`. Raw
//! `C` overflows 64 bits (1e12 units/s for 100 years is ~3e21), so a counter
//! is stored and sent as the equivalent pair `(level, at)`: the level at
//! time `at`. Leaking, adding and max-merging on pairs is exactly the
//! grow-only semantics:
//!
//! - leak to `t`: `level' = max(0, level - limit * (t - at))`
//!   (the floor rising; an idle quota banks no credit);
//! - add `w` at `t`: leak to `t`, then `level' + w` (`C = max(C, F) + w`);
//! - merge two views: leak both to the later `at`, keep the larger level
//!   (`max` of two grow-only numbers).
//!
//! Levels are `f64`: no operation can overflow (the largest level any caller
//! can build is a sum of clamped weights, far below `f64::MAX`), and with
//! bursts capped at 2^53 and weights at 2^40 every level that matters is held
//! exactly or to well under one unit.

use serde::{Deserialize, Serialize};

use super::window::{WindowLevel, WindowRule};
use super::{Nanos, SECS_PER_NANO};

/// A bucket level observed at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// Units in the bucket at `at`; never negative.
    pub level: f64,
    /// When the level was observed, in nanoseconds of the owner's clock.
    pub at: Nanos,
}

/// Seconds from `from` to `to`; zero when `to` is not after `from`, so a
/// clock that steps backwards never un-leaks a bucket.
pub fn seconds_between(from: Nanos, to: Nanos) -> f64 {
    to.saturating_sub(from) as f64 * SECS_PER_NANO
}

/// `seconds` as whole nanoseconds, rounded up (a wait never ends early);
/// 0 for anything not above 0, `Nanos::MAX` past it or for NaN (a wait
/// that cannot be computed does not end). Integer
/// arithmetic: `f64::ceil` is a libm call on baseline x86_64, a tenth of
/// a reservation's time.
#[inline]
pub fn ceil_nanos(seconds: f64) -> Nanos {
    let ns = seconds * 1e9;
    if ns <= 0.0 {
        return 0;
    }
    if ns.is_nan() || ns >= Nanos::MAX as f64 {
        return Nanos::MAX;
    }
    let whole = ns as Nanos;
    whole + Nanos::from((whole as f64) < ns)
}

impl Level {
    /// An empty bucket at `at`.
    pub const fn empty(at: Nanos) -> Self {
        Self { level: 0.0, at }
    }

    /// The level at `now` after leaking at `limit` units per second.
    ///
    /// A `now` before `at` keeps the level and the time (the clamp for a
    /// clock that stepped back).
    pub fn leaked(self, limit: f64, now: Nanos) -> Self {
        if now <= self.at {
            return self;
        }
        let level = (self.level - limit * seconds_between(self.at, now)).max(0.0);
        Self { level, at: now }
    }

    /// Leaks to `now`, then adds `weight`: `C = max(C, F(now)) + weight`.
    pub fn add(self, limit: f64, now: Nanos, weight: f64) -> Self {
        let leaked = self.leaked(limit, now);
        Self {
            level: leaked.level + weight,
            at: leaked.at,
        }
    }

    /// The larger of two views of one counter, compared at the later time.
    pub fn merge(self, other: Self, limit: f64) -> Self {
        let at = self.at.max(other.at);
        let a = self.leaked(limit, at);
        let b = other.leaked(limit, at);
        Self {
            level: a.level.max(b.level),
            at,
        }
    }

    /// True when the level is a finite, non-negative number: the only kind a
    /// sync reply may carry.
    pub fn is_valid(&self) -> bool {
        self.level.is_finite() && self.level >= 0.0
    }
}

/// What is kept of signed weight `of` (added, or given back when
/// negative) when `keep` is asked: at most all of it, and of its sign.
pub fn kept_of(keep: i64, of: i64) -> i64 {
    if of >= 0 {
        keep.clamp(0, of)
    } else {
        keep.clamp(of, 0)
    }
}

/// A counter's state whatever it counts: for a leaky bucket the level at
/// `at` (`prev` unused, 0); for a window quota the count of the window
/// holding `at` and the count of the window before it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// The level, or the window's count.
    pub level: f64,
    /// The previous window's count (window quotas only).
    pub prev: f64,
    /// When, in nanoseconds of the owner's clock.
    pub at: Nanos,
}

impl Tally {
    /// A leaky bucket's level as a tally.
    pub const fn leaky(level: Level) -> Self {
        Self {
            level: level.level,
            prev: 0.0,
            at: level.at,
        }
    }

    /// The level and its time.
    pub const fn level(&self) -> Level {
        Level {
            level: self.level,
            at: self.at,
        }
    }

    /// True for finite, non-negative numbers.
    pub fn is_valid(&self) -> bool {
        self.level().is_valid() && self.prev.is_finite() && self.prev >= 0.0
    }
}

/// How a counter moves with time: a leaky bucket drains at its limit; a
/// window quota's count starts over with every window. Every place that
/// adds to, merges or ages a counter (the table's slots and keys, the
/// roots, the simulator) goes through this, so the two kinds of quota
/// share all the machinery around their counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Counting {
    /// Leaks at this many units per second.
    Leak(f64),
    /// Counts in windows.
    Window(WindowRule),
}

impl Counting {
    /// The counting of a quota leaking at `limit`, or counting in windows.
    pub fn of(limit: f64, window: Option<WindowRule>) -> Self {
        window.map_or(Counting::Leak(limit), Counting::Window)
    }

    fn as_window(t: Tally) -> WindowLevel {
        WindowLevel {
            count: t.level,
            prev: t.prev,
            at: t.at,
        }
    }

    fn from_window(w: WindowLevel) -> Tally {
        Tally {
            level: w.count,
            prev: w.prev,
            at: w.at,
        }
    }

    /// Adds `weight` at `now`.
    pub fn add(&self, t: Tally, now: Nanos, weight: f64) -> Tally {
        match self {
            Counting::Leak(limit) => Tally::leaky(t.level().add(*limit, now, weight)),
            Counting::Window(rule) => Self::from_window(Self::as_window(t).add(rule, now, weight)),
        }
    }

    /// Adds `weight` that belongs to window `index` (leaky counters
    /// ignore it): see [`WindowLevel::add_in`]; `None` when it is too old
    /// to matter.
    pub fn add_in(&self, t: Tally, index: Option<i64>, now: Nanos, weight: f64) -> Option<Tally> {
        match (self, index) {
            (Counting::Window(rule), Some(index)) => Self::as_window(t)
                .add_in(rule, index, now, weight)
                .map(Self::from_window),
            _ => Some(self.add(t, now, weight)),
        }
    }

    /// Takes `units` back out of a counter at `now`: units counted earlier
    /// and returned (a held request that left before its turn, an
    /// estimate settled lower, a released slot). A leaky level drops by
    /// them once leaked to `now`; a window count drops in the window
    /// `index` names (the current one for `None`) only if that is still
    /// the current window at `now`: a return never touches an earlier
    /// window, so it never makes the past laxer. Never below zero, and it
    /// never raises anything: see docs/DESIGN.md, "Counters that give
    /// units back".
    pub fn give_back_in(&self, t: Tally, index: Option<i64>, now: Nanos, units: f64) -> Tally {
        let aged = self.aged(t, now);
        if let Counting::Window(rule) = self {
            if index.is_some_and(|i| i != rule.index_at(now)) {
                return aged;
            }
        }
        Tally {
            level: (aged.level - units.max(0.0)).max(0.0),
            ..aged
        }
    }

    /// A root's reply `value` merged into a limiter's `known` view of one
    /// counter; also says whether the result is the reply's. When `known`
    /// is that same root's earlier reply (`same_root`: the same root
    /// process), `value` replaces it, lower or not: one root's values only
    /// ever go down by returns, and its later value is the truer one (a
    /// limiter has one exchange at a time with a root, so its replies
    /// arrive in order). `known.at` says nothing here: merging another
    /// root's lower value moves it on without changing whose level it is.
    /// Otherwise the larger of the two, as [`Counting::merge`]. See
    /// docs/DESIGN.md, "Counters that give units back".
    pub fn merge_reply(&self, known: Tally, value: Tally, same_root: bool) -> (Tally, bool) {
        if same_root {
            return (value, true);
        }
        let merged = self.merge(known, value);
        let at = merged.at;
        (merged, self.current(value, at) >= self.current(known, at))
    }

    /// The larger of two views of one counter (a CRDT merge).
    pub fn merge(&self, a: Tally, b: Tally) -> Tally {
        match self {
            Counting::Leak(limit) => Tally::leaky(a.level().merge(b.level(), *limit)),
            Counting::Window(rule) => {
                Self::from_window(Self::as_window(a).merge(Self::as_window(b), rule))
            }
        }
    }

    /// The same counter restated at `now` (leaked to it; or moved to its
    /// window). A `now` before `at` keeps the tally.
    pub fn aged(&self, t: Tally, now: Nanos) -> Tally {
        if now <= t.at {
            return t;
        }
        match self {
            Counting::Leak(limit) => Tally::leaky(t.level().leaked(*limit, now)),
            Counting::Window(rule) => {
                let (level, prev) = Self::as_window(t).counts_at(rule, now);
                Tally {
                    level,
                    prev,
                    at: now,
                }
            }
        }
    }

    /// The level decisions compare at `now` (without extrapolation).
    pub fn current(&self, t: Tally, now: Nanos) -> f64 {
        match self {
            Counting::Leak(limit) => t.level().leaked(*limit, now).level,
            Counting::Window(rule) => Self::as_window(t).level_at(rule, now),
        }
    }

    /// True when the counter holds nothing that can matter at `now`: a
    /// drained bucket; a window quota with nothing in its current window
    /// (nor, sliding, in the one before).
    pub fn is_empty(&self, t: Tally, now: Nanos) -> bool {
        match self {
            Counting::Leak(_) => self.current(t, now) <= 0.0,
            Counting::Window(rule) => {
                let (count, prev) = Self::as_window(t).counts_at(rule, now);
                count <= 0.0 && (!rule.sliding || prev <= 0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_give_back_lowers_a_leaky_level_after_its_leak_and_never_below_zero() {
        let leak = Counting::Leak(10.0);
        let t = Tally::leaky(Level { level: 30.0, at: 0 });
        // One second leaks 10; 5 given back leaves 15.
        let back = leak.give_back_in(t, None, 1_000_000_000, 5.0);
        assert_eq!((back.level, back.at), (15.0, 1_000_000_000));
        assert_eq!(leak.give_back_in(t, None, 1_000_000_000, 50.0).level, 0.0);
        // Negative or NaN units give nothing back.
        assert_eq!(leak.give_back_in(t, None, 0, -5.0).level, 30.0);
    }

    #[test]
    fn a_give_back_lowers_only_its_own_window_and_only_while_it_is_current() {
        use crate::core::window::{Window, WindowRule};
        let rule = WindowRule {
            window: Window::TenSeconds,
            sliding: true,
            utc_offset: 0,
        };
        let w = Counting::Window(rule);
        let sec = 1_000_000_000;
        let t = w.add(Tally::default(), 2 * sec, 8.0);
        // The same window: 3 come back.
        let back = w.give_back_in(t, Some(0), 5 * sec, 3.0);
        assert_eq!((back.level, back.prev), (5.0, 0.0));
        // The next window: the count of the earlier one (now `prev`) is
        // history, and a return naming it changes nothing.
        let later = w.give_back_in(t, Some(0), 12 * sec, 3.0);
        assert_eq!((later.level, later.prev), (0.0, 8.0));
        // A return naming the current window does not reach back either.
        let current = w.give_back_in(t, Some(1), 12 * sec, 3.0);
        assert_eq!((current.level, current.prev), (0.0, 8.0));
    }

    #[test]
    fn waits_round_up_to_whole_nanoseconds() {
        assert_eq!(ceil_nanos(0.0), 0);
        assert_eq!(ceil_nanos(-1.0), 0);
        assert_eq!(ceil_nanos(f64::NAN), Nanos::MAX);
        assert_eq!(ceil_nanos(1.0), 1_000_000_000);
        assert_eq!(ceil_nanos(1.5e-9), 2);
        assert_eq!(ceil_nanos(0.25), 250_000_000);
        assert_eq!(ceil_nanos(1e-12), 1);
        assert_eq!(ceil_nanos(f64::INFINITY), Nanos::MAX);
        assert_eq!(ceil_nanos(1e11), Nanos::MAX);
        for s in [0.1, 0.333, 1.7, 12.345_678_9, 3_600.000_000_5] {
            assert_eq!(ceil_nanos(s), (s * 1e9).ceil() as Nanos, "{s}");
        }
    }
    use crate::core::quota::{MAX_LIMIT, MAX_WEIGHT};

    const SEC: Nanos = 1_000_000_000;
    const HUNDRED_YEARS: Nanos = 100 * 365 * 24 * 3600 * SEC + 25 * 24 * 3600 * SEC;

    #[test]
    fn leaking_drains_at_the_limit_and_stops_at_zero() {
        let l = Level {
            level: 100.0,
            at: 0,
        };
        assert_eq!(l.leaked(10.0, 5 * SEC).level, 50.0);
        assert_eq!(l.leaked(10.0, 20 * SEC).level, 0.0);
    }

    #[test]
    fn a_clock_stepping_back_does_not_unleak() {
        let l = Level {
            level: 100.0,
            at: 10 * SEC,
        };
        assert_eq!(l.leaked(10.0, 5 * SEC), l);
        assert_eq!(l.add(10.0, 5 * SEC, 1.0).level, 101.0);
    }

    #[test]
    fn an_idle_quota_banks_no_credit() {
        // C lifted to the floor: after a long idle period, adding w gives w.
        let l = Level { level: 3.0, at: 0 }.add(1.0, 3600 * SEC, 7.0);
        assert_eq!(l.level, 7.0);
    }

    #[test]
    fn merge_is_max_after_leaking_to_the_same_time() {
        let a = Level {
            level: 100.0,
            at: 0,
        };
        let b = Level {
            level: 60.0,
            at: 2 * SEC,
        };
        // a leaked to 2 s at 10/s is 80 > 60.
        assert_eq!(
            a.merge(b, 10.0),
            Level {
                level: 80.0,
                at: 2 * SEC
            }
        );
        assert_eq!(
            b.merge(a, 10.0),
            Level {
                level: 80.0,
                at: 2 * SEC
            }
        );
        let c = Level {
            level: 90.0,
            at: 2 * SEC,
        };
        assert_eq!(a.merge(c, 10.0).level, 90.0);
    }

    #[test]
    fn a_roots_later_reply_replaces_its_earlier_one_and_another_roots_is_max_merged() {
        let leak = Counting::Leak(10.0);
        let known = Tally::leaky(Level {
            level: 50.0,
            at: SEC,
        });
        // The same root, a second later, after a return of 30: 50 leaked
        // by 10 to 40, minus 30.
        let lower = Tally::leaky(Level {
            level: 10.0,
            at: 2 * SEC,
        });
        assert_eq!(leak.merge_reply(known, lower, true), (lower, true));
        // Another root's lower value loses, and the view stays the first's.
        let (merged, won) = leak.merge_reply(known, lower, false);
        assert!(!won);
        assert_eq!(leak.current(merged, 2 * SEC), 40.0);
        // Another root's higher value wins.
        let higher = Tally::leaky(Level {
            level: 45.0,
            at: 2 * SEC,
        });
        assert_eq!(leak.merge_reply(known, higher, false), (higher, true));
        // The same root's later reply replaces the view even when another
        // root's lower value, merged meanwhile, moved the view's time past
        // the change the reply reports (a return at the first root at
        // 2 s, answered after the other root's reply at 3 s): the
        // property test in sync/return_tests.rs found a host that kept
        // the higher level for good.
        let (moved, won) = leak.merge_reply(
            known,
            Tally::leaky(Level {
                level: 5.0,
                at: 3 * SEC,
            }),
            false,
        );
        assert!(!won && moved.at == 3 * SEC);
        let (merged, won) = leak.merge_reply(moved, lower, true);
        assert!(won);
        assert_eq!(merged, lower);
        // A window count drops the same way within its window.
        let rule = crate::core::WindowRule {
            window: crate::core::Window::Minute,
            sliding: false,
            utc_offset: 0,
        };
        let window = Counting::Window(rule);
        let seen = Tally {
            level: 9.0,
            prev: 0.0,
            at: SEC,
        };
        let back = Tally {
            level: 4.0,
            prev: 0.0,
            at: 2 * SEC,
        };
        assert_eq!(window.merge_reply(seen, back, true), (back, true));
        assert_eq!(window.merge_reply(seen, back, false).0.level, 9.0);
    }

    #[test]
    fn merge_is_commutative_associative_and_idempotent() {
        let xs = [
            Level { level: 5.0, at: 1 },
            Level {
                level: 50.0,
                at: 3 * SEC,
            },
            Level {
                level: 0.0,
                at: 9 * SEC,
            },
        ];
        for a in xs {
            assert_eq!(a.merge(a, 2.0), a);
            for b in xs {
                assert_eq!(a.merge(b, 2.0), b.merge(a, 2.0));
                for c in xs {
                    assert_eq!(a.merge(b, 2.0).merge(c, 2.0), a.merge(b.merge(c, 2.0), 2.0));
                }
            }
        }
    }

    #[test]
    fn hundred_years_at_1e12_per_second_with_max_weights_stays_finite_and_exact() {
        // The edge DESIGN.md names: raw C would be ~3e21 here.
        let limit = 1e12;
        let w = MAX_WEIGHT as f64;
        let mut l = Level::empty(0);
        l = l.add(limit, HUNDRED_YEARS - SEC, w);
        assert_eq!(l.level, w);
        l = l.add(limit, HUNDRED_YEARS - SEC, w);
        assert_eq!(l.level, 2.0 * w);
        // One second later at 1e12/s, 1e12 units leaked.
        let later = l.leaked(limit, HUNDRED_YEARS);
        assert_eq!(later.level, 2.0 * w - 1e12);
        assert_eq!(later.at, HUNDRED_YEARS);
        // The full span leaks everything, with no overflow at the top limit.
        assert_eq!(
            Level { level: w, at: 0 }.leaked(MAX_LIMIT, u64::MAX).level,
            0.0
        );
    }

    #[test]
    fn millions_of_max_weight_adds_stay_finite() {
        let mut l = Level::empty(0);
        for _ in 0..1_000_000 {
            l = l.add(0.0, 0, MAX_WEIGHT as f64);
        }
        assert!(l.is_valid());
        assert_eq!(l.level, 1e6 * MAX_WEIGHT as f64);
    }

    #[test]
    fn validity_rejects_nan_infinite_and_negative_levels() {
        assert!(Level { level: 0.0, at: 0 }.is_valid());
        assert!(!Level {
            level: f64::NAN,
            at: 0
        }
        .is_valid());
        assert!(!Level {
            level: f64::INFINITY,
            at: 0
        }
        .is_valid());
        assert!(!Level { level: -1.0, at: 0 }.is_valid());
    }

    #[test]
    fn counting_treats_both_kinds_through_one_interface() {
        use crate::core::window::Window;
        let leak = Counting::Leak(10.0);
        let t = leak.add(Tally::default(), 0, 50.0);
        assert_eq!(leak.current(t, SEC), 40.0);
        assert_eq!(
            leak.aged(t, 2 * SEC),
            Tally {
                level: 30.0,
                prev: 0.0,
                at: 2 * SEC
            }
        );
        assert!(leak.is_empty(t, 5 * SEC) && !leak.is_empty(t, 4 * SEC));
        // A leaky counter ignores a window index.
        assert_eq!(leak.add_in(t, Some(3), 0, 1.0).unwrap().level, 51.0);

        let rule = WindowRule {
            window: Window::TenSeconds,
            sliding: true,
            utc_offset: 0,
        };
        let win = Counting::Window(rule);
        let t = win.add(Tally::default(), SEC, 8.0);
        assert_eq!(win.current(t, 5 * SEC), 8.0);
        // Half into the next window: half of the 8 still slides in.
        assert_eq!(win.current(t, 15 * SEC), 4.0);
        assert_eq!(
            win.aged(t, 15 * SEC),
            Tally {
                level: 0.0,
                prev: 8.0,
                at: 15 * SEC
            }
        );
        assert!(!win.is_empty(t, 15 * SEC) && win.is_empty(t, 25 * SEC));
        let other = win.add(Tally::default(), 12 * SEC, 1.0);
        assert_eq!(
            win.merge(t, other),
            Tally {
                level: 1.0,
                prev: 8.0,
                at: 12 * SEC
            }
        );
        assert!(win.add_in(t, Some(-1), 25 * SEC, 1.0).is_none());
    }
}
