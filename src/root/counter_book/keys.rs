//! The lifecycle of key counters: a key's counter is created on its first
//! delta while fewer than `max_keys` are held across the shards, and is
//! forgotten when its quota is deleted or once it has drained to nothing.
//!
//! **Shares.** A key counter belongs to the limiter whose delta made it
//! (later deltas of other limiters add to it as usual), and no limiter
//! makes more than its share (`max_keys_per_limiter`, split evenly over
//! the shards, as keys are by their hash): one limiter's junk holds at most
//! that many places, however many keys it invents.
//!
//! **When the book is full**, a limiter within its share still gets its
//! key: first in the place of a key that drained (a window template's keys
//! drain the moment their window ends, a sliding one's a window later),
//! found by a bounded look ahead of the sweep; else in the place of a key
//! of the limiter holding the most keys of this shard, if that one holds
//! more than the asker (its least filled of a few). A limiter is refused a
//! key only when it is over its share, or when no one holds more keys than
//! it does: the book is full of fairly shared keys.

use std::sync::atomic::Ordering;

use crate::core::Nanos;
use crate::wire::CounterKey;

use super::{CounterBook, CounterView};

/// [`super::Slot::owner`] of a key counter no limiter made (a delta
/// without a caller: the simulator's, a test's).
pub const NO_OWNER: u32 = u32::MAX;

/// Slots the book looks at for a drained key when it is full, before it
/// refuses or displaces anything.
const RECLAIM_LOOK: usize = 512;

/// Keys of the largest owner compared when one must give way: the least
/// filled of them goes.
const DISPLACE_SAMPLE: usize = 4;

/// How many key counters a root (or one shard of it) holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyLimits {
    /// Most key counters at once, all shards together.
    pub max_keys: usize,
    /// Most key counters one limiter may make (in one shard, once
    /// [`KeyLimits::per_shard`] split it).
    pub per_limiter: usize,
}

impl KeyLimits {
    /// `max_keys` in all, `per_limiter` each (default: a quarter of
    /// `max_keys`, so that four limiters at their share fill it).
    pub fn new(max_keys: usize, per_limiter: Option<usize>) -> Self {
        Self {
            max_keys,
            per_limiter: per_limiter
                .unwrap_or(max_keys / 4)
                .clamp(1, max_keys.max(1)),
        }
    }

    /// No bound at all.
    pub fn unbounded() -> Self {
        Self {
            max_keys: usize::MAX,
            per_limiter: usize::MAX,
        }
    }

    /// A shard's part of a limiter's share, when keys spread over `shards`
    /// shards by their hash: an even split with room for the spread (an
    /// eighth more, and one). A limiter that picks its key hashes to fill
    /// every shard so holds at most its share and an eighth (and a key a
    /// shard).
    pub fn per_shard(self, shards: usize) -> Self {
        let even = self.per_limiter.div_ceil(shards.max(1));
        Self {
            per_limiter: even.saturating_add(even / 8).saturating_add(1),
            ..self
        }
    }
}

impl CounterBook {
    /// Takes a place for a new key counter, if fewer than `max_keys` are
    /// held in every shard together.
    fn claim_key(&self) -> bool {
        if self.clock.keys.fetch_add(1, Ordering::Relaxed) >= self.limits.max_keys {
            self.clock.keys.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Whether `limiter` may make a new key counter now (see the module
    /// doc); when it may, its place is claimed.
    pub(super) fn admit_key(&mut self, limiter: Option<u32>, now: Nanos) -> bool {
        let owner = limiter.unwrap_or(NO_OWNER);
        let held = self.owned.get(&owner).map_or(0, Vec::len);
        if owner != NO_OWNER && held >= self.limits.per_limiter {
            return false;
        }
        if self.claim_key() {
            return true;
        }
        if self.reclaim_drained(now) && self.claim_key() {
            return true;
        }
        self.displace_for(owner, held) && self.claim_key()
    }

    /// Looks ahead of the sweep for key counters that drained and forgets
    /// them; true when one was.
    fn reclaim_drained(&mut self, now: Nanos) -> bool {
        self.forget_drained(RECLAIM_LOOK, now) > 0
    }

    /// Forgets a key counter of the limiter holding the most in this shard,
    /// if it holds more than `held` (the asker's): the least filled of a
    /// few of its keys. True when one was.
    fn displace_for(&mut self, asker: u32, held: usize) -> bool {
        let Some((_, keys)) = self
            .owned
            .iter()
            .filter(|(&owner, _)| owner != asker)
            .max_by_key(|(_, keys)| keys.len())
        else {
            return false;
        };
        if keys.len() <= held.saturating_add(1) {
            return false;
        }
        let victim = keys
            .iter()
            .rev()
            .take(DISPLACE_SAMPLE)
            .min_by(|&&a, &&b| {
                let level = |i: u32| self.slots[i as usize].tally.level;
                level(a).total_cmp(&level(b))
            })
            .map(|&index| self.slots[index as usize].counter);
        let Some(victim) = victim else {
            return false;
        };
        self.drop_counter(victim);
        self.keys_displaced += 1;
        true
    }

    /// Records that `limiter` made the key counter in slot `index`.
    pub(super) fn own(&mut self, index: u32, limiter: Option<u32>) {
        let owner = limiter.unwrap_or(NO_OWNER);
        let keys = self.owned.entry(owner).or_default();
        let slot = &mut self.slots[index as usize];
        slot.owner = owner;
        slot.owned_at = keys.len() as u32;
        keys.push(index);
    }

    /// Takes the key counter in slot `index` off its owner's list.
    fn disown(&mut self, index: u32) {
        let (owner, at) = {
            let slot = &self.slots[index as usize];
            (slot.owner, slot.owned_at as usize)
        };
        let Some(keys) = self.owned.get_mut(&owner) else {
            return;
        };
        if keys.get(at) == Some(&index) {
            keys.swap_remove(at);
            if let Some(&moved) = keys.get(at) {
                self.slots[moved as usize].owned_at = at as u32;
            }
        }
        if keys.is_empty() {
            self.owned.remove(&owner);
        }
    }

    /// Key counters `limiter` made that this shard still holds.
    pub fn keys_of(&self, limiter: u32) -> usize {
        self.owned.get(&limiter).map_or(0, Vec::len)
    }

    /// Drops the counters of a deleted quota: its own, and its keys'.
    pub fn remove(&mut self, id: u64) {
        self.drop_counter(CounterKey::named(id));
        if self.keys > 0 {
            let keys: Vec<CounterKey> = self
                .slots
                .iter()
                .filter(|s| s.live && s.counter.id == id && s.counter.key != 0)
                .map(|s| s.counter)
                .collect();
            for key in keys {
                self.drop_counter(key);
            }
        }
    }

    pub(super) fn drop_counter(&mut self, counter: CounterKey) {
        if let Some(index) = self.index.remove(&counter) {
            self.unlink(index);
            let slot = &mut self.slots[index as usize];
            slot.seen = Vec::new();
            slot.live = false;
            if counter.key != 0 {
                self.keys -= 1;
                self.clock.keys.fetch_sub(1, Ordering::Relaxed);
                self.disown(index);
            }
            self.free.push(index);
        }
    }

    /// Looks at the next `budget` slots (round robin) and forgets the key
    /// counters among them that have leaked to nothing at `now`: a drained
    /// key is equal to no key. Returns how many were forgotten.
    pub fn forget_drained(&mut self, budget: usize, now: Nanos) -> usize {
        let n = self.slots.len();
        if self.keys == 0 || n == 0 {
            return 0;
        }
        let mut drained = Vec::new();
        for i in 0..budget.min(n) {
            let slot = &self.slots[(self.sweep + i) % n];
            if slot.live && slot.counter.key != 0 && slot.counting.is_empty(slot.tally, now) {
                drained.push(slot.counter);
            }
        }
        self.sweep = (self.sweep + budget) % n;
        for counter in &drained {
            self.drop_counter(*counter);
        }
        self.keys_forgotten += drained.len() as u64;
        drained.len()
    }

    /// The keys of template `id` with their views at `now`, busiest (the
    /// highest fill rate, then level) first, at most `max`. Reads every
    /// counter: for the admin API, not the sync path.
    pub fn top_keys(&self, id: u64, max: usize, now: Nanos) -> Vec<(u64, CounterView)> {
        let mut keys: Vec<(u64, CounterView)> = self
            .slots
            .iter()
            .filter(|s| s.live && s.counter.id == id && s.counter.key != 0)
            .filter_map(|s| Some((s.counter.key, self.view_counter(s.counter, now)?)))
            .collect();
        busiest_first(&mut keys, max);
        keys
    }

    /// Number of key counters.
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// Key deltas ignored because the book held `max_keys` keys or their
    /// limiter its share.
    pub fn keys_refused(&self) -> u64 {
        self.keys_refused
    }

    /// Key counters forgotten to make room for a limiter within its
    /// share.
    pub fn keys_displaced(&self) -> u64 {
        self.keys_displaced
    }

    /// Key counters forgotten after draining.
    pub fn keys_forgotten(&self) -> u64 {
        self.keys_forgotten
    }
}

/// Orders keys' views busiest first (the highest fill rate, then level)
/// and keeps the first `max`.
pub fn busiest_first(keys: &mut Vec<(u64, CounterView)>, max: usize) {
    keys.sort_by(|a, b| {
        b.1.fill_rate
            .total_cmp(&a.1.fill_rate)
            .then(b.1.level.total_cmp(&a.1.level))
    });
    keys.truncate(max);
}
