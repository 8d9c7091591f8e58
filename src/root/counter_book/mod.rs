//! The cluster counters a root sums, in memory only.
//!
//! One counter per quota that received weight since the root started,
//! stored as a [`Tally`] in the root's clock and updated by the quota's
//! [`Counting`]: `C = max(C, F(now)) + delta` for a leaky bucket
//! ([`crate::core::Level::add`]), the delta added to its own window's count
//! for a window quota. A restarted root starts
//! every counter from the floor; limiters' deltas refill it within a sync or
//! two.
//!
//! Every update gives the counter the next **version**. Limiters ask for
//! "counters changed since version v", so the counters are also kept in a
//! doubly linked list in version order (slots in a vector, linked by index):
//! an update moves its counter to the newest end in O(1), and the answer is
//! the tail of the list after `v`, found by walking back from the newest
//! end. A sync costs what changed, never the number of counters, even when
//! a hundred limiters bump the same counters between two syncs of one of
//! them.
//!
//! Every counter has a **cap**, a level above which nothing it holds
//! changes a decision ([`CounterRule`]): whatever a sync adds, the level
//! is cut to it, so a forged or runaway delta (`2^53` on a `10/s` quota)
//! cannot hold a quota shut for longer than the cap takes to drain.
//!
//! Keys of per-key templates are counters like any, named by the template's
//! id and the key's hash ([`CounterKey`]), created on their first delta.
//! A key's counter that has leaked to nothing equals no counter, so
//! [`CounterBook::forget_drained`] sweeps them away a slice at a time, and
//! at most `max_keys` key counters exist at once: root memory per key is
//! bounded. A key counter belongs to the limiter whose delta made it, and
//! no limiter holds more than its share of them, so one sync token's junk
//! cannot crowd out other limiters' keys (see `keys.rs`).
//!
//! The book's files, one concern each:
//!
//! # Layout
//!
//! - `mod.rs` — the counters: a slot per counter, adding a delta, views;
//! - `versions.rs` — the version clock shared by shards and the list in
//!   version order: what changed since a version, newest first;
//! - `rules.rs` — how a counter counts, its cap, the allowance a limiter
//!   has on it, and the fill-rate meter;
//! - `keys.rs` — the lifecycle of key counters: the shared `max_keys`
//!   bound, each limiter's share, reclaiming drained keys when full,
//!   removal, sweeping drained keys, the busiest keys;
//! - `templates.rs` — the rejection rates of per-key templates, which
//!   have no counter of their own;
//! - `tests.rs` — the book's tests.

mod keys;
mod rules;
mod templates;
mod versions;

pub use keys::{busiest_first, KeyLimits};
pub use rules::{AllowanceShape, CounterRule};
pub use templates::TemplateRejections;
pub use versions::{BookClock, ChangedCounters, ChangedEntry};

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::core::{Counting, Nanos, Tally};
use crate::wire::CounterKey;

use rules::FillMeter;
use versions::NIL;

/// How many recent limiters each counter remembers (the admin API shows
/// them).
pub const MAX_SEEN: usize = 8;

/// A limiter that sent weight for a counter, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The limiter's index in [`super::limiters::Limiters`].
    pub limiter: u32,
    /// Root time of its last delta for this counter.
    pub at: Nanos,
}

/// Weight a limiter sent for one counter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Delta {
    /// The weight.
    pub weight: f64,
    /// For a window quota, the window it was admitted in (see
    /// [`crate::wire::CounterDelta::window`]); `None`: now's.
    pub window: Option<i64>,
}

/// Why a delta counted nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uncounted {
    /// No counter takes it: an unknown or deleted quota, or window
    /// weight too old to matter.
    Ignored,
    /// A key the book would not make a counter for: its limiter holds its
    /// share of keys, or the book holds `max_keys` that none may give way
    /// to it (see `keys.rs`). The limiter keeps the key's count itself.
    KeyRefused,
}

/// One counter and its place in the version list.
#[derive(Clone, Debug)]
struct Slot {
    /// The counter's name (meaningless while the slot is free).
    counter: CounterKey,
    /// The slot holds a counter (false while on the free list).
    live: bool,
    /// How the quota counts (its leak rate or its window), copied so an
    /// update needs one lookup.
    counting: Counting,
    /// The counter's [`CounterRule::cap`].
    cap: f64,
    /// The counter's [`CounterRule::allowance`].
    allowance: AllowanceShape,
    /// The cluster level (a window quota's counts), in root time.
    tally: Tally,
    /// Version of the last update.
    version: u64,
    /// Neighbour with the next lower version, or [`NIL`].
    older: u32,
    /// Neighbour with the next higher version, or [`NIL`].
    newer: u32,
    /// Rate of incoming weight.
    fill: FillMeter,
    /// Rate of checks the limiters rejected (named counters only).
    rejected: FillMeter,
    /// The most recent limiters that sent weight.
    seen: Vec<Seen>,
    /// For a key counter, the limiter whose delta made it
    /// ([`keys::NO_OWNER`] for none), and where it is in that limiter's
    /// list of keys (see `keys.rs`).
    owner: u32,
    owned_at: u32,
}

/// A counter as the admin API shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterView {
    /// Level leaked to the time of the view (a window quota: the current
    /// window's count, sliding with the previous one's share).
    pub level: f64,
    /// Units per second arriving, smoothed.
    pub fill_rate: f64,
    /// Checks per second the limiters reject, smoothed.
    pub rejected_rate: f64,
    /// Version of the last update.
    pub version: u64,
    /// Recent limiters, newest first.
    pub seen: Vec<Seen>,
}

/// The counters of one root, or of one shard of a root (see
/// [`super::ledger`]); the shards of a root share one [`BookClock`].
#[derive(Debug)]
pub struct CounterBook {
    /// Counter storage; free slots are listed in `free`.
    slots: Vec<Slot>,
    /// Indices of free slots.
    free: Vec<u32>,
    /// Counter to slot index.
    index: FxHashMap<CounterKey, u32>,
    /// Key counters (`index` entries whose key is not 0).
    keys: usize,
    /// Most key counters at once, and a limiter's share of them.
    limits: KeyLimits,
    /// The key counters each limiter made, in this shard.
    owned: FxHashMap<u32, Vec<u32>>,
    /// Key deltas ignored: `max_keys` were live, or the limiter held its
    /// share.
    keys_refused: u64,
    /// Key counters dropped to make room for a limiter within its share,
    /// from the limiter holding the most.
    keys_displaced: u64,
    /// Key counters forgotten after draining.
    keys_forgotten: u64,
    /// Updates whose level was cut to the counter's cap.
    capped: u64,
    /// Next slot [`CounterBook::forget_drained`] looks at.
    sweep: usize,
    /// Slot with the lowest version, or [`NIL`].
    oldest: u32,
    /// Slot with the highest version, or [`NIL`].
    newest: u32,
    /// The version clock and key count shared with the other shards.
    clock: Arc<BookClock>,
    /// Last version used of the block reserved while the shard is held
    /// (see [`CounterBook::reserve`]).
    reserved: u64,
    /// Last version of that block.
    reserved_end: u64,
}

impl Default for CounterBook {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            index: FxHashMap::default(),
            keys: 0,
            limits: KeyLimits::unbounded(),
            owned: FxHashMap::default(),
            keys_refused: 0,
            keys_displaced: 0,
            keys_forgotten: 0,
            capped: 0,
            sweep: 0,
            oldest: NIL,
            newest: NIL,
            clock: Arc::default(),
            reserved: 0,
            reserved_end: 0,
        }
    }
}

impl CounterBook {
    /// A book holding at most `max_keys` key counters at once (a
    /// limiter's share by [`KeyLimits::new`]).
    pub fn with_max_keys(max_keys: usize) -> Self {
        Self {
            limits: KeyLimits::new(max_keys, None),
            ..Self::default()
        }
    }

    /// One shard of a book whose shards share `clock` and hold at most
    /// `limits.max_keys` key counters between them (a limiter's share of
    /// this shard: `limits` as [`KeyLimits::per_shard`] makes them).
    pub fn shard(clock: Arc<BookClock>, limits: KeyLimits) -> Self {
        Self {
            limits,
            clock,
            ..Self::default()
        }
    }

    /// Adds `weight` to the named counter `id` at `now` (see
    /// [`CounterBook::add_counter`]).
    pub fn add<F>(
        &mut self,
        id: u64,
        weight: f64,
        now: Nanos,
        limiter: Option<u32>,
        counting_of: F,
    ) -> bool
    where
        F: FnOnce() -> Option<CounterRule>,
    {
        let delta = Delta {
            weight,
            window: None,
        };
        self.add_counter(CounterKey::named(id), delta, now, limiter, counting_of)
    }

    /// Adds a delta to `counter` at `now`: `C = max(C, F(now)) + weight`
    /// for a leaky quota; for a window quota, to the count of the window
    /// the delta names.
    ///
    /// A counter not seen before is created when `counting_of` knows the
    /// quota (a live one of the right kind) and, for a key, fewer than
    /// `max_keys` keys are counted; otherwise nothing happens and `false`
    /// is returned, so deltas for unknown or deleted quotas are ignored
    /// (and window weight too old to matter). The result is cut to the
    /// counter's cap.
    pub fn add_counter<F>(
        &mut self,
        counter: CounterKey,
        delta: Delta,
        now: Nanos,
        limiter: Option<u32>,
        counting_of: F,
    ) -> bool
    where
        F: FnOnce() -> Option<CounterRule>,
    {
        let weight = delta.weight;
        self.add_allowed(counter, delta, now, limiter, counting_of, |_| weight)
            .is_ok()
    }

    /// Gives `delta`'s weight back to `counter` at `now` (a limiter's
    /// return: see docs/DESIGN.md, "Counters that give units back"): at
    /// most what `allow` grants of it given the counter's allowance shape,
    /// the counter lowered by that much ([`Counting::give_back_in`]: after
    /// its leak, never below zero, a window counter only while the window
    /// named is the current one). Returns the weight granted, or `None`
    /// when the root holds no such counter (nothing to lower: it drained,
    /// or the root restarted).
    pub fn give_back<G>(
        &mut self,
        counter: CounterKey,
        delta: Delta,
        now: Nanos,
        allow: G,
    ) -> Option<f64>
    where
        G: FnOnce(&AllowanceShape) -> f64,
    {
        let index = *self.index.get(&counter)?;
        let slot = &self.slots[index as usize];
        let units = allow(&slot.allowance).min(delta.weight);
        if units <= 0.0 {
            return Some(0.0);
        }
        let tally = slot
            .counting
            .give_back_in(slot.tally, delta.window, now, units);
        if tally == slot.tally {
            return Some(units);
        }
        let version = self.next_version();
        let slot = &mut self.slots[index as usize];
        slot.tally = tally;
        slot.version = version;
        self.unlink(index);
        self.push_newest(index);
        Some(units)
    }

    /// [`Self::add_counter`], with the weight cut to what `allow` grants
    /// of it given the counter's allowance shape (looked up with the
    /// counter, so a sync costs one lookup a delta). Returns the weight
    /// added (0 when `allow` granted none: nothing changes), or why the
    /// delta counts nowhere ([`Uncounted`]).
    pub fn add_allowed<F, G>(
        &mut self,
        counter: CounterKey,
        mut delta: Delta,
        now: Nanos,
        limiter: Option<u32>,
        counting_of: F,
        allow: G,
    ) -> Result<f64, Uncounted>
    where
        F: FnOnce() -> Option<CounterRule>,
        G: FnOnce(&AllowanceShape) -> f64,
    {
        let index = match self.index.get(&counter) {
            Some(&index) => index,
            None => match counting_of() {
                Some(_) if counter.key != 0 && !self.admit_key(limiter, now) => {
                    self.keys_refused += 1;
                    return Err(Uncounted::KeyRefused);
                }
                Some(rule) => {
                    let index = self.create(counter, rule, now);
                    if counter.key != 0 {
                        self.own(index, limiter);
                    }
                    index
                }
                None => return Err(Uncounted::Ignored),
            },
        };
        delta.weight = allow(&self.slots[index as usize].allowance).min(delta.weight);
        if delta.weight <= 0.0 {
            return Ok(0.0);
        }
        let slot = &self.slots[index as usize];
        let mut tally = slot
            .counting
            .add_in(slot.tally, delta.window, now, delta.weight)
            .ok_or(Uncounted::Ignored)?;
        if tally.level > slot.cap || tally.prev > slot.cap {
            tally.level = tally.level.min(slot.cap);
            tally.prev = tally.prev.min(slot.cap);
            self.capped += 1;
        }
        let version = self.next_version();
        let weight = delta.weight;
        let slot = &mut self.slots[index as usize];
        slot.tally = tally;
        slot.version = version;
        slot.fill.record(now, weight);
        // Keys are too many to remember their limiters; quotas are not.
        if let Some(limiter) = limiter.filter(|_| counter.key == 0) {
            note_seen(&mut slot.seen, limiter, now);
        }
        self.unlink(index);
        self.push_newest(index);
        Ok(weight)
    }

    /// Records `count` checks of quota `id` rejected by a limiter, for the
    /// counter's rejection rate. Only a counter that exists is noted (a
    /// quota rejecting has received weight); returns whether it was.
    pub fn note_rejected(&mut self, id: u64, count: u64, now: Nanos) -> bool {
        let Some(&index) = self.index.get(&CounterKey::named(id)) else {
            return false;
        };
        let slot = &mut self.slots[index as usize];
        if !slot.live {
            return false;
        }
        slot.rejected.record(now, count as f64);
        true
    }

    /// A named counter's live view at `now`.
    pub fn view(&self, id: u64, now: Nanos) -> Option<CounterView> {
        self.view_counter(CounterKey::named(id), now)
    }

    /// A counter's live view at `now`.
    pub fn view_counter(&self, counter: CounterKey, now: Nanos) -> Option<CounterView> {
        let slot = &self.slots[*self.index.get(&counter)? as usize];
        let mut seen = slot.seen.clone();
        seen.sort_by_key(|s| std::cmp::Reverse(s.at));
        Some(CounterView {
            level: slot.counting.current(slot.tally, now),
            fill_rate: slot.fill.rate_at(now),
            rejected_rate: slot.rejected.rate_at(now),
            version: slot.version,
            seen,
        })
    }

    /// Number of counters.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when no counter exists.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(super) fn create(&mut self, counter: CounterKey, rule: CounterRule, now: Nanos) -> u32 {
        let slot = Slot {
            counter,
            live: true,
            counting: rule.counting,
            cap: rule.cap,
            allowance: rule.allowance,
            tally: Tally {
                at: now,
                ..Tally::default()
            },
            version: 0,
            older: NIL,
            newer: NIL,
            fill: FillMeter::new(now),
            rejected: FillMeter::new(now),
            seen: Vec::new(),
            owner: keys::NO_OWNER,
            owned_at: 0,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.slots[index as usize] = slot;
                index
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(counter, index);
        if counter.key != 0 {
            // Its place in the shared count was claimed by the caller.
            self.keys += 1;
        }
        // A fresh slot is linked as newest so that `add` can unlink it.
        self.push_newest(index);
        index
    }
}

fn note_seen(seen: &mut Vec<Seen>, limiter: u32, now: Nanos) {
    if let Some(entry) = seen.iter_mut().find(|s| s.limiter == limiter) {
        entry.at = now;
    } else if seen.len() < MAX_SEEN {
        seen.push(Seen { limiter, at: now });
    } else if let Some(oldest) = seen.iter_mut().min_by_key(|s| s.at) {
        *oldest = Seen { limiter, at: now };
    }
}

#[cfg(test)]
mod tests;
