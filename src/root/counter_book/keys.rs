//! The lifecycle of key counters: a key's counter is created on its first
//! delta while fewer than `max_keys` are held across the shards, and is
//! forgotten when its quota is deleted or once it has drained to nothing.

use std::sync::atomic::Ordering;

use crate::core::Nanos;
use crate::wire::CounterKey;

use super::{CounterBook, CounterView};

impl CounterBook {
    /// Takes a place for a new key counter, if fewer than `max_keys` are
    /// held in every shard together.
    pub(super) fn claim_key(&self) -> bool {
        if self.clock.keys.fetch_add(1, Ordering::Relaxed) >= self.max_keys {
            self.clock.keys.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
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

    /// Key deltas ignored because the book held `max_keys` keys.
    pub fn keys_refused(&self) -> u64 {
        self.keys_refused
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
