//! What each limiter holds of a root's in-flight counters, and its lease.
//!
//! An in-flight counter's level is the sum of what every limiter holds
//! there (see docs/DESIGN.md, "In-flight quotas"). A root keeps, per
//! limiter and counter, the slots that limiter holds (its *outstanding*):
//! an add raises it, a return lowers it by at most what it holds, and a
//! limiter not heard from for the lease loses all of it at once. Each
//! slot so leaves the counter once, by a return or by the lease, never
//! both: a limiter that comes back after its lease finds nothing to give
//! back. One [`Held`] lives in each counter shard, beside the counters it
//! accounts for, under the same lock.

use rustc_hash::FxHashMap;

use crate::core::Nanos;
use crate::wire::CounterKey;

/// Default of the root's `in_flight_lease`: ten default sync intervals.
pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// Most slots one limiter may hold on one counter, as a multiple of its
/// `high_burst` (the quota's limit): local decisions on a view one sync
/// old may briefly hold more than the limit, never twice it honestly.
pub const HELD_BURSTS: f64 = 2.0;

/// The slots each limiter holds of one shard's in-flight counters.
#[derive(Debug, Default)]
pub struct Held {
    /// Slots held, by limiter number and counter; never 0 (a pair that
    /// gives everything back is removed).
    outstanding: FxHashMap<(u32, CounterKey), f64>,
}

impl Held {
    /// Slots `limiter` holds on `counter`.
    pub fn of(&self, limiter: u32, counter: CounterKey) -> f64 {
        self.outstanding
            .get(&(limiter, counter))
            .copied()
            .unwrap_or(0.0)
    }

    /// How many of `weight` new slots `limiter` may take on `counter`
    /// whose quota allows `high_burst`: up to [`HELD_BURSTS`] of it held.
    pub fn room(&self, limiter: u32, counter: CounterKey, high_burst: f64, weight: f64) -> f64 {
        (HELD_BURSTS * high_burst - self.of(limiter, counter))
            .max(0.0)
            .min(weight)
    }

    /// How many of `weight` returned slots `limiter` may give back on
    /// `counter`: at most what it holds there.
    pub fn returnable(&self, limiter: u32, counter: CounterKey, weight: f64) -> f64 {
        self.of(limiter, counter).min(weight).max(0.0)
    }

    /// Records that `limiter` took `added` slots on `counter` (negative:
    /// gave them back), as the counter applied it.
    pub fn record(&mut self, limiter: u32, counter: CounterKey, added: f64) {
        if added == 0.0 {
            return;
        }
        let held = self.of(limiter, counter) + added;
        if held > 0.0 {
            self.outstanding.insert((limiter, counter), held);
        } else {
            self.outstanding.remove(&(limiter, counter));
        }
    }

    /// The limiters holding slots here.
    pub fn holders(&self) -> impl Iterator<Item = u32> + '_ {
        self.outstanding.keys().map(|&(limiter, _)| limiter)
    }

    /// Takes every slot of the limiters `expired` says are past their
    /// lease out of this shard, and returns them by counter (to be taken
    /// off the counters).
    pub fn expire(&mut self, mut expired: impl FnMut(u32) -> bool) -> Vec<(CounterKey, f64)> {
        let mut dropped = Vec::new();
        self.outstanding.retain(|&(limiter, counter), held| {
            if expired(limiter) {
                dropped.push((counter, *held));
                false
            } else {
                true
            }
        });
        dropped
    }

    /// Pairs held (for the ledger's stats).
    pub fn len(&self) -> usize {
        self.outstanding.len()
    }

    /// True when no limiter holds anything here.
    pub fn is_empty(&self) -> bool {
        self.outstanding.is_empty()
    }
}

/// True when a limiter last heard from at `last_sync` (`None`: forgotten)
/// is past a lease of `lease` nanoseconds at `now`.
pub fn lease_expired(last_sync: Option<Nanos>, lease: Nanos, now: Nanos) -> bool {
    last_sync.is_none_or(|at| now.saturating_sub(at) > lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: CounterKey = CounterKey::named(7);

    #[test]
    fn a_return_gives_back_at_most_what_its_limiter_holds() {
        let mut held = Held::default();
        held.record(1, C, 3.0);
        assert_eq!(held.returnable(1, C, 5.0), 3.0);
        assert_eq!(held.returnable(2, C, 5.0), 0.0, "another limiter's slots");
        held.record(1, C, -3.0);
        assert!(held.is_empty(), "a pair given back whole is forgotten");
    }

    #[test]
    fn a_limiter_holds_at_most_twice_the_limit() {
        let mut held = Held::default();
        held.record(1, C, 15.0);
        assert_eq!(held.room(1, C, 10.0, 9.0), 5.0);
        assert_eq!(held.room(2, C, 10.0, 9.0), 9.0);
    }

    #[test]
    fn expiry_drops_only_the_expired_limiters_slots() {
        let mut held = Held::default();
        held.record(1, C, 2.0);
        held.record(2, C, 4.0);
        held.record(1, CounterKey { id: 7, key: 9 }, 1.0);
        let mut dropped = held.expire(|l| l == 1);
        dropped.sort_by_key(|d| d.0);
        assert_eq!(dropped, vec![(C, 2.0), (CounterKey { id: 7, key: 9 }, 1.0)]);
        assert_eq!((held.of(1, C), held.of(2, C)), (0.0, 4.0));
        assert_eq!(held.returnable(1, C, 2.0), 0.0, "late returns find nothing");
    }

    #[test]
    fn the_lease_runs_from_the_last_sync() {
        assert!(!lease_expired(Some(100), 50, 150));
        assert!(lease_expired(Some(100), 50, 151));
        assert!(
            lease_expired(None, 50, 0),
            "a forgotten limiter holds nothing"
        );
    }
}
