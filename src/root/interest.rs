//! What each limiter holds, as one counter shard knows it: the keys whose
//! counters a reply to that limiter carries (docs/DESIGN.md, "Replies by
//! interest").
//!
//! A limiter's record in a shard is its keys of that shard. It is made by
//! the limiter's whole list ([`crate::wire::Interest::full`]), which
//! replaces it; keys the limiter sent deltas for, or listed as added, join
//! it. Without a record (a limiter that never sent its list, or sent it to
//! another instance of the root) the shard answers the limiter with every
//! changed counter, as a root that predates interest does, and the reply
//! asks for the list.
//!
//! **Bounded.** A limiter holds at most `per_limiter` keys in all (its
//! share of each shard), the root at most `total` for every limiter
//! together. A key beyond either bound puts the limiter's record in the
//! shard in *overflow*: its keys are let go and the shard answers it with
//! every changed counter again (correct, only as costly as before
//! interest), until its next whole list. So a limiter with a valid token
//! that claims millions of keys costs the root at most its share, and is
//! counted ([`InterestSizes::overflows`]). A record not touched by a sync
//! for [`IDLE_NANOS`] is forgotten (the limiter stopped, or was renamed).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::core::Nanos;
use crate::wire::CounterKey;

/// Default of `sync_interest_per_limiter`: keys one limiter's record may
/// hold, in all shards.
pub const DEFAULT_PER_LIMITER: usize = 1 << 20;

/// Default of `sync_interest_total`: keys every limiter's record holds
/// together, about 40 bytes each.
pub const DEFAULT_TOTAL: usize = 50_000_000;

/// A record no sync touched for this long is forgotten: ten whole lists
/// missed.
pub const IDLE_NANOS: Nanos = 10 * crate::wire::interest::REFRESH_SECONDS * 1_000_000_000;

/// The bounds of a root's interest records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterestLimits {
    /// Keys one limiter's record holds at most, in all shards.
    pub per_limiter: usize,
    /// Keys all records hold at most together.
    pub total: usize,
}

impl Default for InterestLimits {
    fn default() -> Self {
        Self {
            per_limiter: DEFAULT_PER_LIMITER,
            total: DEFAULT_TOTAL,
        }
    }
}

/// What every shard's records count together.
#[derive(Debug, Default)]
pub struct InterestCount {
    /// Keys held in records.
    held: AtomicUsize,
    /// Records that went into overflow, since the root started.
    overflows: AtomicU64,
}

/// Sizes of a root's interest records, summed over the shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterestSizes {
    /// Keys held in records.
    pub keys: usize,
    /// Limiters' records (one per limiter and shard).
    pub records: usize,
    /// Of them, records in overflow now.
    pub overflowed: usize,
    /// Records that went into overflow since the root started.
    pub overflows: u64,
}

/// One limiter's keys in one shard.
#[derive(Debug, Default)]
struct Record {
    keys: FxHashSet<CounterKey>,
    /// Past a bound: the keys were let go, every counter is sent.
    overflow: bool,
    /// Root time of the last sync that touched it.
    touched: Nanos,
}

/// What a sync tells a shard of its limiter's keys there.
#[derive(Clone, Copy, Debug, Default)]
pub struct Told<'a> {
    /// The request carried the limiter's whole list.
    pub full: bool,
    /// Keys the request listed (all of them in this shard).
    pub listed: &'a [CounterKey],
    /// Keys the request sent deltas for (in this shard).
    pub sent: &'a [CounterKey],
}

/// Which changed counters of a shard go to one limiter.
#[derive(Clone, Copy, Debug)]
pub enum Wanted<'a> {
    /// Every one: no record, or a record in overflow.
    All,
    /// Named counters and these keys.
    Keys(&'a FxHashSet<CounterKey>),
}

impl Wanted<'_> {
    /// True when `counter` goes.
    pub fn wants(&self, counter: CounterKey) -> bool {
        match self {
            Self::All => true,
            Self::Keys(keys) => counter.key == 0 || keys.contains(&counter),
        }
    }
}

/// The interest records of one shard.
#[derive(Debug)]
pub struct Interest {
    records: FxHashMap<u32, Record>,
    /// A limiter's share of this shard.
    per_limiter: usize,
    /// The root's bound, over every shard.
    total: usize,
    count: Arc<InterestCount>,
}

impl Interest {
    /// One of `shards` shards sharing `count`, within `limits`.
    pub fn shard(limits: InterestLimits, shards: usize, count: Arc<InterestCount>) -> Self {
        // A little over an even share: keys do not spread exactly evenly.
        let share = limits.per_limiter.div_ceil(shards.max(1));
        Self {
            records: FxHashMap::default(),
            per_limiter: share + share / 8,
            total: limits.total,
            count,
        }
    }

    /// Takes in what a sync of `limiter` at `now` tells of its keys in
    /// this shard, and returns the keys it listed that its record did not
    /// hold before: a reply sends them whatever their version (the
    /// limiter's cursor may be past their last change).
    pub fn learn(&mut self, limiter: u32, told: Told<'_>, now: Nanos) -> Vec<CounterKey> {
        let before = if told.full {
            let before = self.records.remove(&limiter);
            if let Some(old) = &before {
                self.release(old.keys.len());
            }
            self.records.insert(limiter, Record::default());
            before
        } else {
            None
        };
        let Some(record) = self.records.get_mut(&limiter) else {
            // Unknown: everything goes until the whole list comes.
            return Vec::new();
        };
        record.touched = now;
        let mut fresh = Vec::new();
        let known_before = |key: &CounterKey| {
            before
                .as_ref()
                .is_some_and(|b| !b.overflow && b.keys.contains(key))
        };
        let keys = told.listed.iter().map(|k| (k, true));
        let keys = keys.chain(told.sent.iter().map(|k| (k, false)));
        for (&key, listed) in keys {
            if record.overflow || key.key == 0 {
                continue;
            }
            if record.keys.contains(&key) {
                continue;
            }
            let full = record.keys.len() >= self.per_limiter
                || self.count.held.load(Ordering::Relaxed) >= self.total;
            if full {
                self.count
                    .held
                    .fetch_sub(record.keys.len(), Ordering::Relaxed);
                record.keys = FxHashSet::default();
                record.overflow = true;
                self.count.overflows.fetch_add(1, Ordering::Relaxed);
                fresh.clear();
                continue;
            }
            record.keys.insert(key);
            self.count.held.fetch_add(1, Ordering::Relaxed);
            if listed && (!told.full || !known_before(&key)) {
                fresh.push(key);
            }
        }
        if record.overflow {
            // Everything goes: nothing needs sending on its own.
            fresh.clear();
        }
        fresh
    }

    fn release(&self, n: usize) {
        self.count.held.fetch_sub(n, Ordering::Relaxed);
    }

    /// The changed counters of this shard that go to `limiter`.
    pub fn wanted(&self, limiter: u32) -> Wanted<'_> {
        match self.records.get(&limiter) {
            Some(r) if !r.overflow => Wanted::Keys(&r.keys),
            _ => Wanted::All,
        }
    }

    /// True when this shard holds a record of `limiter` (in overflow or
    /// not): it has had its whole list.
    pub fn knows(&self, limiter: u32) -> bool {
        self.records.contains_key(&limiter)
    }

    /// Forgets the records no sync touched for [`IDLE_NANOS`] before
    /// `now`; returns how many.
    pub fn forget_idle(&mut self, now: Nanos) -> usize {
        let before = self.records.len();
        let mut released = 0;
        self.records.retain(|_, r| {
            let keep = now.saturating_sub(r.touched) < IDLE_NANOS;
            if !keep {
                released += r.keys.len();
            }
            keep
        });
        self.release(released);
        before - self.records.len()
    }

    /// Adds this shard's sizes to `sizes` (the shared counts set once).
    pub fn add_sizes(&self, sizes: &mut InterestSizes) {
        sizes.records += self.records.len();
        sizes.overflowed += self.records.values().filter(|r| r.overflow).count();
        sizes.keys = self.count.held.load(Ordering::Relaxed);
        sizes.overflows = self.count.overflows.load(Ordering::Relaxed);
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let held: usize = self.records.values().map(|r| r.keys.len()).sum();
        self.release(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    fn key(key: u64) -> CounterKey {
        CounterKey { id: 1, key }
    }

    fn shard(per_limiter: usize, total: usize) -> Interest {
        let limits = InterestLimits { per_limiter, total };
        Interest::shard(limits, 1, Arc::default())
    }

    fn wants(interest: &Interest, limiter: u32, k: u64) -> bool {
        interest.wanted(limiter).wants(key(k))
    }

    fn full<'a>(listed: &'a [CounterKey], sent: &'a [CounterKey]) -> Told<'a> {
        Told {
            full: true,
            listed,
            sent,
        }
    }

    #[test]
    fn a_limiter_is_sent_everything_until_its_whole_list_then_its_keys_and_named_counters() {
        let mut interest = shard(100, 1000);
        // Deltas before any list: nothing recorded, everything goes.
        let told = Told {
            sent: &[key(1)],
            ..Told::default()
        };
        assert!(interest.learn(7, told, 0).is_empty());
        assert!(!interest.knows(7) && wants(&interest, 7, 99));
        // The whole list: its keys, fresh (sent whatever their version).
        let fresh = interest.learn(7, full(&[key(1), key(2)], &[]), SEC);
        assert_eq!(fresh, [key(1), key(2)]);
        assert!(interest.knows(7));
        assert!(wants(&interest, 7, 1) && wants(&interest, 7, 2));
        assert!(!wants(&interest, 7, 3));
        assert!(interest.wanted(7).wants(CounterKey::named(5)));
        // A key learned from a delta joins; not fresh (its version is new).
        let told = Told {
            sent: &[key(3)],
            ..Told::default()
        };
        assert!(interest.learn(7, told, 2 * SEC).is_empty());
        assert!(wants(&interest, 7, 3));
        // Another limiter's record is its own.
        assert!(wants(&interest, 8, 3) && !interest.knows(8));
    }

    #[test]
    fn a_whole_list_replaces_the_record_and_only_new_keys_are_fresh() {
        let mut interest = shard(100, 1000);
        interest.learn(7, full(&[key(1), key(2)], &[]), 0);
        // Key 1 forgotten by the limiter, key 4 new.
        let fresh = interest.learn(7, full(&[key(2), key(4)], &[]), SEC);
        assert_eq!(fresh, [key(4)]);
        assert!(!wants(&interest, 7, 1));
        assert!(wants(&interest, 7, 2) && wants(&interest, 7, 4));
        let mut sizes = InterestSizes::default();
        interest.add_sizes(&mut sizes);
        assert_eq!((sizes.keys, sizes.records), (2, 1));
        // Keys listed as added are fresh unless held.
        let told = Told {
            listed: &[key(2), key(5)],
            ..Told::default()
        };
        assert_eq!(interest.learn(7, told, 2 * SEC), [key(5)]);
    }

    #[test]
    fn past_its_share_a_limiter_overflows_and_is_sent_everything_until_its_next_list() {
        let mut interest = shard(4, 1000);
        // A share of 4 in one shard is 4 + 4/8 = 4.
        let many: Vec<_> = (1..=10).map(key).collect();
        let fresh = interest.learn(7, full(&many, &[]), 0);
        assert!(fresh.is_empty());
        let mut sizes = InterestSizes::default();
        interest.add_sizes(&mut sizes);
        assert_eq!(
            sizes,
            InterestSizes {
                keys: 0,
                records: 1,
                overflowed: 1,
                overflows: 1
            }
        );
        assert!(interest.knows(7) && wants(&interest, 7, 10) && wants(&interest, 7, 99));
        // The next whole list within the share is a record again.
        interest.learn(7, full(&many[..3], &[]), SEC);
        assert!(!wants(&interest, 7, 10) && wants(&interest, 7, 3));
        let mut sizes = InterestSizes::default();
        interest.add_sizes(&mut sizes);
        assert_eq!((sizes.keys, sizes.overflowed, sizes.overflows), (3, 0, 1));
    }

    #[test]
    fn the_roots_total_bounds_every_limiter_together() {
        let count = Arc::new(InterestCount::default());
        let limits = InterestLimits {
            per_limiter: 100,
            total: 5,
        };
        let mut a = Interest::shard(limits, 2, count.clone());
        let mut b = Interest::shard(limits, 2, count.clone());
        a.learn(1, full(&[key(1), key(2), key(3)], &[]), 0);
        b.learn(2, full(&[key(4), key(5)], &[]), 0);
        // Full: limiter 3's first key overflows its record.
        b.learn(3, full(&[key(6)], &[]), 0);
        assert!(wants(&b, 3, 99));
        assert!(!wants(&b, 2, 99));
        assert_eq!(count.held.load(Ordering::Relaxed), 5);
        drop(a);
        assert_eq!(count.held.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_record_no_sync_touched_for_the_idle_time_is_forgotten() {
        let mut interest = shard(100, 1000);
        interest.learn(7, full(&[key(1)], &[]), 0);
        interest.learn(8, full(&[key(2)], &[]), IDLE_NANOS / 2);
        assert_eq!(interest.forget_idle(IDLE_NANOS - 1), 0);
        assert_eq!(interest.forget_idle(IDLE_NANOS), 1);
        assert!(!interest.knows(7) && interest.knows(8));
        let mut sizes = InterestSizes::default();
        interest.add_sizes(&mut sizes);
        assert_eq!(sizes.keys, 1);
    }
}
