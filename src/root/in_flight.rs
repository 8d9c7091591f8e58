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

/// Default of the root's `in_flight_lease`: ten default sync intervals
/// (the limiters' default too: they apply the same lease locally when
/// every root is silent).
pub const DEFAULT_LEASE: std::time::Duration = crate::sync::config::DEFAULT_IN_FLIGHT_LEASE;

/// Most slots one limiter may hold on one counter, as a multiple of its
/// `high_burst` (the quota's limit): local decisions on a view one sync
/// old may briefly hold more than the limit, never twice it honestly.
pub const HELD_BURSTS: f64 = 2.0;

/// What one limiter holds of one counter at a root.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Holding {
    /// Adds minus returns taken, in whatever order they arrived: below
    /// zero while a return overtook its add (two syncs of one limiter in
    /// flight at once), so the add, when it comes, is cancelled and the
    /// result does not depend on the order. The counter counts `max(net,
    /// 0)` of it.
    net: f64,
    /// Slots the lease dropped: the returns a limiter sends for them
    /// after it is back take these first, never another limiter's slots.
    forgiven: f64,
}

impl Holding {
    fn counted(&self) -> f64 {
        self.net.max(0.0)
    }

    fn is_empty(&self) -> bool {
        self.net == 0.0 && self.forgiven == 0.0
    }
}

/// The slots each limiter holds of one shard's in-flight counters.
#[derive(Debug, Default)]
pub struct Held {
    /// By limiter number and counter; a pair with nothing is removed.
    holdings: FxHashMap<(u32, CounterKey), Holding>,
}

impl Held {
    /// Slots `limiter` holds on `counter` (what the counter counts of it).
    pub fn of(&self, limiter: u32, counter: CounterKey) -> f64 {
        self.get(limiter, counter).counted()
    }

    fn get(&self, limiter: u32, counter: CounterKey) -> Holding {
        self.holdings
            .get(&(limiter, counter))
            .copied()
            .unwrap_or_default()
    }

    fn put(&mut self, limiter: u32, counter: CounterKey, h: Holding) {
        if h.is_empty() {
            self.holdings.remove(&(limiter, counter));
        } else {
            self.holdings.insert((limiter, counter), h);
        }
    }

    /// How many of `weight` new slots `limiter` may take on `counter`
    /// whose quota allows `high_burst`: up to [`HELD_BURSTS`] of it held.
    pub fn room(&self, limiter: u32, counter: CounterKey, high_burst: f64, weight: f64) -> f64 {
        (HELD_BURSTS * high_burst - self.of(limiter, counter))
            .max(0.0)
            .min(weight)
    }

    /// By how much the counter rises when `limiter` takes `weight` slots
    /// (less than `weight` while returns that overtook their adds are
    /// outstanding).
    pub fn add_effect(&self, limiter: u32, counter: CounterKey, weight: f64) -> f64 {
        let h = self.get(limiter, counter);
        (h.net + weight).max(0.0) - h.counted()
    }

    /// Records that `limiter` took `weight` slots on `counter`.
    pub fn add(&mut self, limiter: u32, counter: CounterKey, weight: f64) {
        let mut h = self.get(limiter, counter);
        h.net += weight;
        self.put(limiter, counter, h);
    }

    /// Records that `limiter` holds exactly `slots` on `counter` (what it
    /// reported, absolute: see `Ledger::sync`): returns that overtook
    /// their adds and slots the lease forgave are settled by it.
    pub fn set(&mut self, limiter: u32, counter: CounterKey, slots: f64) {
        self.put(
            limiter,
            counter,
            Holding {
                net: slots,
                forgiven: 0.0,
            },
        );
    }

    /// By how much the counter drops when `limiter` gives `weight` slots
    /// back on `counter`: at most what it holds there, after the slots
    /// its lease dropped.
    pub fn return_effect(&self, limiter: u32, counter: CounterKey, weight: f64) -> f64 {
        let h = self.get(limiter, counter);
        let weight = weight - weight.min(h.forgiven);
        h.counted() - (h.net - weight).max(0.0)
    }

    /// Records that `limiter` gave `weight` slots back on `counter`.
    pub fn give_back(&mut self, limiter: u32, counter: CounterKey, weight: f64) {
        let mut h = self.get(limiter, counter);
        let forgiven = weight.min(h.forgiven);
        h.forgiven -= forgiven;
        h.net -= weight - forgiven;
        self.put(limiter, counter, h);
    }

    /// The limiters with anything here (slots, returns ahead of their
    /// adds, or slots forgiven).
    pub fn holders(&self) -> impl Iterator<Item = u32> + '_ {
        self.holdings.keys().map(|&(limiter, _)| limiter)
    }

    /// Takes every slot of the limiters `expired` says are past their
    /// lease out of this shard (they become forgiven: their late returns
    /// go to nothing), and returns them by counter, to be taken off the
    /// counters.
    pub fn expire(&mut self, mut expired: impl FnMut(u32) -> bool) -> Vec<(CounterKey, f64)> {
        let mut dropped = Vec::new();
        for (&(limiter, counter), h) in &mut self.holdings {
            if h.counted() > 0.0 && expired(limiter) {
                dropped.push((counter, h.counted()));
                h.forgiven += h.counted();
                h.net = 0.0;
            }
        }
        dropped
    }

    /// Forgets what the limiters `gone` held or were forgiven (the
    /// registry forgot them: their numbers may be handed out again).
    pub fn forget(&mut self, mut gone: impl FnMut(u32) -> bool) {
        self.holdings.retain(|&(limiter, _), _| !gone(limiter));
    }

    /// Pairs held (for the ledger's stats).
    pub fn len(&self) -> usize {
        self.holdings.len()
    }

    /// True when no limiter holds anything here.
    pub fn is_empty(&self) -> bool {
        self.holdings.is_empty()
    }
}

/// True when a limiter last heard from at `last_sync` (`None`: forgotten)
/// is past a lease of `lease` nanoseconds at `now`, counted from
/// `awake_since` at the earliest (see [`Wakefulness`]).
pub fn lease_expired(
    last_sync: Option<Nanos>,
    lease: Nanos,
    now: Nanos,
    awake_since: Nanos,
) -> bool {
    last_sync.is_none_or(|at| now.saturating_sub(at.max(awake_since)) > lease)
}

/// When the root last woke from a stall of its own, as the lease sweep
/// sees it: a root stopped (SIGSTOP, a paused VM) or starved of CPU for
/// longer than its sweep's period did not hear its limiters meanwhile
/// because it was not listening, not because they were silent (their
/// requests waited in its queue). Leases then run from when it woke, so
/// such a stall forgives no limiter's slots; a limiter that is really
/// gone loses them one lease after the wake.
#[derive(Clone, Copy, Debug)]
pub struct Wakefulness {
    /// The sweep's period.
    every: Nanos,
    /// The sweep's last look.
    last: Nanos,
    /// The end of the last stall seen (0: none).
    awake_since: Nanos,
}

impl Wakefulness {
    /// For a sweep every `every` nanoseconds, started at `now`.
    pub fn new(every: Nanos, now: Nanos) -> Self {
        Self {
            every,
            last: now,
            awake_since: 0,
        }
    }

    /// The sweep looks at `now`: the time leases run from at the
    /// earliest. A look later than twice the period since the last one is
    /// a stall of the root's own, ending now.
    pub fn look(&mut self, now: Nanos) -> Nanos {
        if now.saturating_sub(self.last) > self.every.saturating_mul(2) {
            self.awake_since = now;
        }
        self.last = self.last.max(now);
        self.awake_since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: CounterKey = CounterKey::named(7);

    #[test]
    fn a_stall_of_the_root_itself_restarts_every_lease_from_its_end() {
        const S: Nanos = 1_000_000_000;
        let mut awake = Wakefulness::new(2 * S, 0);
        // On time, or a little late: no stall.
        assert_eq!(awake.look(2 * S), 0);
        assert_eq!(awake.look(5 * S), 0);
        // Stopped from 5 s to 17 s: leases run from 17 s.
        assert_eq!(awake.look(17 * S), 17 * S);
        assert_eq!(awake.look(19 * S), 17 * S);
        // A limiter last heard at 4 s with a lease of 10 s: not expired
        // when the root wakes, expired a lease after.
        assert!(!lease_expired(Some(4 * S), 10 * S, 17 * S, 17 * S));
        assert!(!lease_expired(Some(4 * S), 10 * S, 27 * S, 17 * S));
        assert!(lease_expired(Some(4 * S), 10 * S, 27 * S + 1, 17 * S));
        // Without the stall it had expired at 14 s.
        assert!(lease_expired(Some(4 * S), 10 * S, 14 * S + 1, 0));
    }

    #[test]
    fn a_return_gives_back_at_most_what_its_limiter_holds() {
        let mut held = Held::default();
        held.add(1, C, 3.0);
        assert_eq!(held.return_effect(1, C, 5.0), 3.0);
        assert_eq!(
            held.return_effect(2, C, 5.0),
            0.0,
            "another limiter's slots"
        );
        held.give_back(1, C, 3.0);
        assert!(held.is_empty(), "a pair given back whole is forgotten");
    }

    #[test]
    fn a_return_that_overtakes_its_add_cancels_it() {
        let mut held = Held::default();
        assert_eq!(held.return_effect(1, C, 1.0), 0.0);
        held.give_back(1, C, 1.0);
        assert_eq!(
            held.add_effect(1, C, 1.0),
            0.0,
            "the add it overtook counts nothing"
        );
        held.add(1, C, 1.0);
        assert!(held.is_empty());
    }

    #[test]
    fn a_limiter_holds_at_most_twice_the_limit() {
        let mut held = Held::default();
        held.add(1, C, 15.0);
        assert_eq!(held.room(1, C, 10.0, 9.0), 5.0);
        assert_eq!(held.room(2, C, 10.0, 9.0), 9.0);
    }

    #[test]
    fn expiry_forgives_only_the_expired_limiters_slots() {
        let mut held = Held::default();
        held.add(1, C, 2.0);
        held.add(2, C, 4.0);
        held.add(1, CounterKey { id: 7, key: 9 }, 1.0);
        let mut dropped = held.expire(|l| l == 1);
        dropped.sort_by_key(|d| d.0);
        assert_eq!(dropped, vec![(C, 2.0), (CounterKey { id: 7, key: 9 }, 1.0)]);
        assert_eq!((held.of(1, C), held.of(2, C)), (0.0, 4.0));
        assert_eq!(
            held.return_effect(1, C, 2.0),
            0.0,
            "late returns find nothing"
        );
        held.give_back(1, C, 2.0);
        assert_eq!(
            held.add_effect(1, C, 1.0),
            1.0,
            "a new slot after them counts"
        );
        held.forget(|l| l == 1);
        assert_eq!(held.len(), 1);
    }

    #[test]
    fn the_lease_runs_from_the_last_sync() {
        assert!(!lease_expired(Some(100), 50, 150, 0));
        assert!(lease_expired(Some(100), 50, 151, 0));
        assert!(
            lease_expired(None, 50, 0, 0),
            "a forgotten limiter holds nothing"
        );
    }
}
