//! The version clock and the list of counters in version order: an
//! update moves its counter to the newest end, and "changed since `v`" is
//! the tail of the list after `v`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rustc_hash::FxHashMap;

use crate::core::{Nanos, Tally};
use crate::wire::{CounterKey, CounterValue, KeyValue, KeyedValues};

use super::CounterBook;

/// End of the version list.
pub(super) const NIL: u32 = u32::MAX;

/// Counters changed since some version.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangedCounters {
    /// The named counters: oldest change first from one book, in counter
    /// order from a root's shards (what a reply carries).
    pub counters: Vec<CounterValue>,
    /// The keys' counters, by template.
    pub keyed: Vec<KeyedValues>,
    /// Version to ask from next time: the newest version when everything
    /// fit, else the version of the last counter included.
    pub version: u64,
}

impl ChangedCounters {
    /// Appends one counter's value: a named one to `counters`, a key's to
    /// its template's entry of `keyed` (found through `templates`, the
    /// index in `keyed` of each template seen so far).
    pub fn push(
        &mut self,
        counter: CounterKey,
        tally: Tally,
        templates: &mut FxHashMap<u64, usize>,
    ) {
        let Tally { level, prev, at } = tally;
        let CounterKey { id, key } = counter;
        if key == 0 {
            self.counters.push(CounterValue {
                id,
                level,
                at,
                prev,
            });
            return;
        }
        let keyed = &mut self.keyed;
        let at_template = *templates.entry(id).or_insert_with(|| {
            keyed.push(KeyedValues {
                id,
                values: Vec::new(),
                prev: Vec::new(),
            });
            keyed.len() - 1
        });
        let group = &mut keyed[at_template];
        // Previous counts only from the first key that has one (a sliding
        // template's), the keys before it 0.
        if prev != 0.0 || !group.prev.is_empty() {
            group.prev.resize(group.values.len(), 0.0);
            group.prev.push(prev);
        }
        group.values.push(KeyValue(key, level, at));
    }
}

/// What the books of one root's shards share: the version clock and the
/// count of key counters (`max_keys` holds across every shard).
#[derive(Debug, Default)]
pub struct BookClock {
    /// Last version handed out, by any shard.
    version: AtomicU64,
    /// Key counters held, in every shard (claimed and given back by
    /// `keys.rs`).
    pub(super) keys: AtomicUsize,
}

impl BookClock {
    /// The last version handed out.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }
}

/// A counter changed after some version, as [`CounterBook::changed_between`]
/// collects it for a merge across shards.
#[derive(Clone, Copy, Debug)]
pub struct ChangedEntry {
    /// Its version.
    pub version: u64,
    /// Its name.
    pub counter: CounterKey,
    /// Its tally.
    pub tally: Tally,
    /// At the floor and asked for by a limiter that knows nothing: not
    /// sent, but considered (a page ends after it).
    pub skipped: bool,
}

impl CounterBook {
    /// Takes `n` versions from the shared clock at once, for the updates
    /// made before [`Self::release`]: one atomic operation per shard and
    /// sync instead of one per update. Call it only while the shard is
    /// held by its lock, and release before letting go of it: a reader
    /// that sees the clock at `v` must find every version up to `v` in
    /// place when it takes the shard (versions left unused are gaps).
    pub fn reserve(&mut self, n: u64) {
        let start = self.clock.version.fetch_add(n, Ordering::SeqCst);
        self.reserved = start;
        self.reserved_end = start + n;
    }

    /// Gives up what is left of the reserved versions (see
    /// [`Self::reserve`]).
    pub fn release(&mut self) {
        self.reserved = 0;
        self.reserved_end = 0;
    }

    pub(super) fn next_version(&mut self) -> u64 {
        if self.reserved < self.reserved_end {
            self.reserved += 1;
            return self.reserved;
        }
        self.clock.version.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Counters updated after version `since`, oldest first, at most `max`.
    ///
    /// With `since == 0` (a limiter that knows nothing of this root) only
    /// counters above the floor at `now` are sent: an empty bucket is what
    /// the limiter assumes anyway.
    pub fn changed_since(&self, since: u64, max: usize, now: Nanos) -> ChangedCounters {
        let mut first = NIL;
        let mut cursor = self.newest;
        while cursor != NIL && self.slots[cursor as usize].version > since {
            first = cursor;
            cursor = self.slots[cursor as usize].older;
        }
        let mut changed = ChangedCounters {
            counters: Vec::new(),
            keyed: Vec::new(),
            version: self.version(),
        };
        // Where each template's group is in `changed.keyed`.
        let mut groups: FxHashMap<u64, usize> = FxHashMap::default();
        let mut sent = 0;
        let mut cursor = first;
        while cursor != NIL {
            let slot = &self.slots[cursor as usize];
            if sent >= max {
                // Everything before this slot was considered.
                changed.version = match slot.older {
                    NIL => since,
                    older => since.max(self.slots[older as usize].version),
                };
                break;
            }
            if since > 0 || !slot.counting.is_empty(slot.tally, now) {
                changed.push(slot.counter, slot.tally, &mut groups);
                sent += 1;
            }
            cursor = slot.newer;
        }
        changed
    }

    /// Appends to `out` the counters with a version in `(since, upto]`
    /// that `wanted` keeps, oldest first, stopping after `max` that are
    /// sent (with `since == 0`, counters at the floor at `now` are listed
    /// as skipped; counters `wanted` drops are passed over, never listed):
    /// the part of one shard in a reply, merged by version with the
    /// others'.
    pub fn changed_between(
        &self,
        (since, upto): (u64, u64),
        max: usize,
        now: Nanos,
        wanted: impl Fn(CounterKey) -> bool,
        out: &mut Vec<ChangedEntry>,
    ) {
        let mut first = NIL;
        let mut cursor = self.newest;
        while cursor != NIL && self.slots[cursor as usize].version > since {
            first = cursor;
            cursor = self.slots[cursor as usize].older;
        }
        let mut sent = 0;
        let mut cursor = first;
        while cursor != NIL && sent < max {
            let slot = &self.slots[cursor as usize];
            if slot.version > upto {
                break;
            }
            if !wanted(slot.counter) {
                cursor = slot.newer;
                continue;
            }
            let skipped = since == 0 && slot.counting.is_empty(slot.tally, now);
            out.push(ChangedEntry {
                version: slot.version,
                counter: slot.counter,
                tally: slot.tally,
                skipped,
            });
            sent += usize::from(!skipped);
            cursor = slot.newer;
        }
    }

    /// `counter` as a reply would carry it, whatever its version; `None`
    /// when the book holds no such counter.
    pub fn entry(&self, counter: CounterKey) -> Option<ChangedEntry> {
        let slot = &self.slots[*self.index.get(&counter)? as usize];
        Some(ChangedEntry {
            version: slot.version,
            counter,
            tally: slot.tally,
            skipped: false,
        })
    }

    /// The version of the most recently updated counter, 0 when none.
    pub fn newest_version(&self) -> u64 {
        match self.newest {
            NIL => 0,
            n => self.slots[n as usize].version,
        }
    }

    /// The last version handed out (by any shard sharing the clock).
    pub fn version(&self) -> u64 {
        self.clock.version()
    }

    /// Counters from the most recently updated back, each as `(counter,
    /// level, fill rate, rejection rate)` at `now`: the root's overview
    /// ranks as many of them as it can afford, the ones that moved last
    /// first.
    pub fn newest_first(
        &self,
        now: Nanos,
    ) -> impl Iterator<Item = (CounterKey, f64, f64, f64)> + '_ {
        self.newest_first_versioned(now).map(|(_, counter)| counter)
    }

    /// [`Self::newest_first`] with each counter's version, to merge the
    /// shards' lists.
    pub fn newest_first_versioned(
        &self,
        now: Nanos,
    ) -> impl Iterator<Item = (u64, (CounterKey, f64, f64, f64))> + '_ {
        let mut cursor = self.newest;
        std::iter::from_fn(move || {
            let slot = self.slots.get(cursor as usize)?;
            cursor = slot.older;
            let level = slot.counting.current(slot.tally, now);
            Some((
                slot.version,
                (
                    slot.counter,
                    level,
                    slot.fill.rate_at(now),
                    slot.rejected.rate_at(now),
                ),
            ))
        })
    }

    pub(super) fn unlink(&mut self, index: u32) {
        let (older, newer) = {
            let slot = &self.slots[index as usize];
            (slot.older, slot.newer)
        };
        match older {
            NIL => self.oldest = newer,
            o => self.slots[o as usize].newer = newer,
        }
        match newer {
            NIL => self.newest = older,
            n => self.slots[n as usize].older = older,
        }
        let slot = &mut self.slots[index as usize];
        slot.older = NIL;
        slot.newer = NIL;
    }

    pub(super) fn push_newest(&mut self, index: u32) {
        let previous = self.newest;
        {
            let slot = &mut self.slots[index as usize];
            slot.older = previous;
            slot.newer = NIL;
        }
        match previous {
            NIL => self.oldest = index,
            p => self.slots[p as usize].newer = index,
        }
        self.newest = index;
    }
}
