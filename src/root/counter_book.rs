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
//! at most `max_keys` key counters exist at once (more keys' deltas are
//! ignored and counted): root memory per key is bounded.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::core::estimate::FILL_RATE_SMOOTHING;
use crate::core::{Counting, Nanos, Tally, SECS_PER_NANO};
use crate::wire::{CounterKey, CounterValue, KeyValue, KeyedValues};

/// End of the version list.
const NIL: u32 = u32::MAX;

/// Length of a fill-rate measurement window.
const FILL_WINDOW: Nanos = 1_000_000_000;

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

/// The rate weight arrives at, averaged over one-second windows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct FillMeter {
    /// Smoothed units per second as of `window_start`.
    rate: f64,
    /// Start of the window being summed.
    window_start: Nanos,
    /// Weight received since `window_start`.
    window_sum: f64,
}

impl FillMeter {
    fn new(now: Nanos) -> Self {
        Self {
            rate: 0.0,
            window_start: now,
            window_sum: 0.0,
        }
    }

    /// Closes the window when it is at least [`FILL_WINDOW`] old, giving the
    /// old rate the weight `(1 - s)^n` for `n` elapsed windows, so an idle
    /// counter's rate decays towards zero instead of freezing.
    fn roll(&mut self, now: Nanos) {
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed < FILL_WINDOW {
            return;
        }
        let windows = (elapsed / FILL_WINDOW).min(64) as i32;
        let keep = (1.0 - FILL_RATE_SMOOTHING).powi(windows);
        let measured = self.window_sum / (elapsed as f64 * SECS_PER_NANO);
        self.rate = measured * (1.0 - keep) + self.rate * keep;
        self.window_start = now;
        self.window_sum = 0.0;
    }

    fn record(&mut self, now: Nanos, weight: f64) {
        self.roll(now);
        self.window_sum += weight;
    }

    fn rate_at(mut self, now: Nanos) -> f64 {
        self.roll(now);
        self.rate
    }
}

/// How a counter counts, the most it may hold and what one limiter may
/// add to it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CounterRule {
    /// Its leak rate or its window.
    pub counting: Counting,
    /// The highest level (a window quota: the highest count of one window)
    /// the counter keeps; more is cut off. `f64::INFINITY`: no cap.
    pub cap: f64,
    /// The allowance each limiter has on it (see [`super::trust`]).
    pub allowance: AllowanceShape,
}

/// What one limiter may add to a counter: an allowance of `capacity`
/// units refilling at `refill` per second, measured for the quota as of
/// `epoch` (an edit starts every allowance over).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllowanceShape {
    /// Units a limiter may add at once.
    pub capacity: f64,
    /// Units per second the allowance refills at.
    pub refill: f64,
    /// Epoch of the quota it was measured for.
    pub epoch: u64,
}

impl From<Counting> for CounterRule {
    /// A rule without a cap or a bound on what a limiter adds.
    fn from(counting: Counting) -> Self {
        Self {
            counting,
            cap: f64::INFINITY,
            allowance: AllowanceShape {
                capacity: f64::INFINITY,
                refill: 0.0,
                epoch: 0,
            },
        }
    }
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
    /// Key counters held, in every shard.
    keys: AtomicUsize,
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
    /// Most key counters at once.
    max_keys: usize,
    /// Key deltas ignored because `max_keys` were live.
    keys_refused: u64,
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
            max_keys: usize::MAX,
            keys_refused: 0,
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
    /// A book holding at most `max_keys` key counters at once.
    pub fn with_max_keys(max_keys: usize) -> Self {
        Self {
            max_keys,
            ..Self::default()
        }
    }

    /// One shard of a book whose shards share `clock` and hold at most
    /// `max_keys` key counters between them.
    pub fn shard(clock: Arc<BookClock>, max_keys: usize) -> Self {
        Self {
            max_keys,
            clock,
            ..Self::default()
        }
    }

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

    fn next_version(&mut self) -> u64 {
        if self.reserved < self.reserved_end {
            self.reserved += 1;
            return self.reserved;
        }
        self.clock.version.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Takes a place for a new key counter, if fewer than `max_keys` are
    /// held in every shard together.
    fn claim_key(&self) -> bool {
        if self.clock.keys.fetch_add(1, Ordering::Relaxed) >= self.max_keys {
            self.clock.keys.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
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
            .is_some()
    }

    /// [`Self::add_counter`], with the weight cut to what `allow` grants
    /// of it given the counter's allowance shape (looked up with the
    /// counter, so a sync costs one lookup a delta). Returns the weight
    /// added (0 when `allow` granted none: nothing changes), or `None`
    /// when the delta counts nowhere (an unknown quota, a window too old).
    pub fn add_allowed<F, G>(
        &mut self,
        counter: CounterKey,
        mut delta: Delta,
        now: Nanos,
        limiter: Option<u32>,
        counting_of: F,
        allow: G,
    ) -> Option<f64>
    where
        F: FnOnce() -> Option<CounterRule>,
        G: FnOnce(&AllowanceShape) -> f64,
    {
        let index = match self.index.get(&counter) {
            Some(&index) => index,
            None => match counting_of() {
                Some(_) if counter.key != 0 && !self.claim_key() => {
                    self.keys_refused += 1;
                    return None;
                }
                Some(rule) => self.create(counter, rule, now),
                None => return None,
            },
        };
        delta.weight = allow(&self.slots[index as usize].allowance).min(delta.weight);
        if delta.weight <= 0.0 {
            return Some(0.0);
        }
        let slot = &self.slots[index as usize];
        let mut tally = slot
            .counting
            .add_in(slot.tally, delta.window, now, delta.weight)?;
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
        Some(weight)
    }

    /// Changes how quota `id`'s counter counts (and, for a per-key
    /// template, every key's: `keyed`). A new leak rate applies from `now`
    /// (each counter is leaked to `now` at the old rate first, so the
    /// change does not act retroactively); a counter that now counts
    /// another way (leaky to window, another window) starts over. A new
    /// cap applies from the next update.
    pub fn set_counting(&mut self, id: u64, keyed: bool, rule: CounterRule, now: Nanos) {
        let CounterRule {
            counting,
            cap,
            allowance,
        } = rule;
        let change = |slot: &mut Slot| {
            slot.cap = cap;
            slot.allowance = allowance;
            if slot.counting == counting {
                return;
            }
            slot.tally = match (slot.counting, counting) {
                (Counting::Leak(_), Counting::Leak(_)) => slot.counting.aged(slot.tally, now),
                (Counting::Window(a), Counting::Window(b))
                    if (a.window, a.sliding) == (b.window, b.sliding) =>
                {
                    slot.tally
                }
                _ => Tally {
                    at: now,
                    ..Tally::default()
                },
            };
            slot.counting = counting;
        };
        if keyed && self.keys > 0 {
            self.slots
                .iter_mut()
                .filter(|s| s.live && s.counter.id == id && s.counter.key != 0)
                .for_each(change);
        }
        // A per-key template's own counter is its keys' overflow counter:
        // it counts as they do.
        if let Some(&index) = self.index.get(&CounterKey::named(id)) {
            change(&mut self.slots[index as usize]);
        }
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

    fn drop_counter(&mut self, counter: CounterKey) {
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

    /// Number of counters.
    pub fn len(&self) -> usize {
        self.index.len()
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

    /// Updates whose level was cut to the counter's cap.
    pub fn capped(&self) -> u64 {
        self.capped
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

    /// True when no counter exists.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The last version handed out (by any shard sharing the clock).
    pub fn version(&self) -> u64 {
        self.clock.version()
    }

    /// Appends to `out` the counters with a version in `(since, upto]`,
    /// oldest first, stopping after `max` that are sent (with `since ==
    /// 0`, counters at the floor at `now` are listed as skipped): the
    /// part of one shard in a reply, merged by version with the others'.
    pub fn changed_between(
        &self,
        since: u64,
        upto: u64,
        max: usize,
        now: Nanos,
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

    /// The version of the most recently updated counter, 0 when none.
    pub fn newest_version(&self) -> u64 {
        match self.newest {
            NIL => 0,
            n => self.slots[n as usize].version,
        }
    }

    fn create(&mut self, counter: CounterKey, rule: CounterRule, now: Nanos) -> u32 {
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

    fn unlink(&mut self, index: u32) {
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

    fn push_newest(&mut self, index: u32) {
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

fn note_seen(seen: &mut Vec<Seen>, limiter: u32, now: Nanos) {
    if let Some(entry) = seen.iter_mut().find(|s| s.limiter == limiter) {
        entry.at = now;
    } else if seen.len() < MAX_SEEN {
        seen.push(Seen { limiter, at: now });
    } else if let Some(oldest) = seen.iter_mut().min_by_key(|s| s.at) {
        *oldest = Seen { limiter, at: now };
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

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    fn ids(changed: &ChangedCounters) -> Vec<u64> {
        changed.counters.iter().map(|c| c.id).collect()
    }

    #[test]
    fn adding_leaks_then_adds_in_root_time() {
        let mut book = CounterBook::default();
        assert!(book.add(1, 50.0, 0, None, || Some(Counting::Leak(10.0).into())));
        assert!(book.add(1, 5.0, 2 * SEC, None, || unreachable!("known counter")));
        // 50 leaked 20 over two seconds, then +5.
        assert_eq!(book.view(1, 2 * SEC).unwrap().level, 35.0);
        assert_eq!(book.view(1, 10 * SEC).unwrap().level, 0.0);
    }

    #[test]
    fn unknown_quotas_get_no_counter() {
        let mut book = CounterBook::default();
        assert!(!book.add(9, 1.0, 0, None, || None));
        assert!(book.is_empty());
        assert_eq!(book.version(), 0);
    }

    #[test]
    fn changed_since_returns_each_changed_counter_once_in_version_order() {
        let mut book = CounterBook::default();
        for id in 1..=4 {
            book.add(id, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
        }
        let v = book.version();
        book.add(2, 1.0, 0, None, || None);
        book.add(4, 1.0, 0, None, || None);
        book.add(2, 1.0, 0, None, || None);
        let changed = book.changed_since(v, 100, 0);
        assert_eq!(ids(&changed), [4, 2]);
        assert_eq!(changed.version, book.version());
        assert_eq!(changed.counters[1].level, 3.0);
        assert!(book
            .changed_since(book.version(), 100, 0)
            .counters
            .is_empty());
    }

    #[test]
    fn a_capped_answer_resumes_where_it_stopped() {
        let mut book = CounterBook::default();
        for id in 1..=5 {
            book.add(id, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
        }
        let first = book.changed_since(0, 2, 0);
        assert_eq!(ids(&first), [1, 2]);
        assert_eq!(first.version, 2);
        let rest = book.changed_since(first.version, 10, 0);
        assert_eq!(ids(&rest), [3, 4, 5]);
    }

    #[test]
    fn version_zero_skips_counters_back_at_the_floor() {
        let mut book = CounterBook::default();
        book.add(1, 5.0, 0, None, || Some(Counting::Leak(1.0).into()));
        book.add(2, 500.0, 0, None, || Some(Counting::Leak(1.0).into()));
        assert_eq!(ids(&book.changed_since(0, 10, 10 * SEC)), [2]);
        // An incremental reader still learns both changed.
        assert_eq!(book.changed_since(0, 10, 0).counters.len(), 2);
    }

    #[test]
    fn removed_counters_leave_the_list_and_their_slot_is_reused() {
        let mut book = CounterBook::default();
        for id in 1..=3 {
            book.add(id, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
        }
        book.remove(2);
        book.remove(7);
        assert_eq!(ids(&book.changed_since(0, 10, 0)), [1, 3]);
        book.add(4, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
        assert_eq!(book.slots.len(), 3);
        assert_eq!(ids(&book.changed_since(0, 10, 0)), [1, 3, 4]);
        book.remove(1);
        book.remove(4);
        book.remove(3);
        assert!(book.changed_since(0, 10, 0).counters.is_empty());
        assert_eq!((book.oldest, book.newest), (NIL, NIL));
    }

    #[test]
    fn levels_are_cut_to_the_cap_and_a_new_cap_applies_from_the_next_update() {
        let mut book = CounterBook::default();
        let rule = CounterRule {
            cap: 100.0,
            ..Counting::Leak(10.0).into()
        };
        assert!(book.add(1, 1e15, 0, None, || Some(rule)));
        assert_eq!(book.view(1, 0).unwrap().level, 100.0);
        assert_eq!(book.capped(), 1);
        // It drains from the cap: 9 s at 10/s.
        assert_eq!(book.view(1, 9 * SEC).unwrap().level, 10.0);
        book.add(1, 5.0, 9 * SEC, None, || None);
        assert_eq!(
            (book.view(1, 9 * SEC).unwrap().level, book.capped()),
            (15.0, 1)
        );
        book.set_counting(1, false, CounterRule { cap: 12.0, ..rule }, 9 * SEC);
        book.add(1, 1.0, 9 * SEC, None, || None);
        assert_eq!(book.view(1, 9 * SEC).unwrap().level, 12.0);
    }

    #[test]
    fn a_limit_change_leaks_at_the_old_rate_first() {
        let mut book = CounterBook::default();
        book.add(1, 100.0, 0, None, || Some(Counting::Leak(10.0).into()));
        book.set_counting(1, false, Counting::Leak(0.0).into(), 5 * SEC);
        // 50 leaked at 10/s, then nothing more at 0/s.
        assert_eq!(book.view(1, 100 * SEC).unwrap().level, 50.0);
    }

    #[test]
    fn fill_rate_follows_the_incoming_weight_and_decays_when_idle() {
        let mut book = CounterBook::default();
        for s in 0..10 {
            book.add(1, 100.0, s * SEC, None, || Some(Counting::Leak(0.0).into()));
        }
        let busy = book.view(1, 10 * SEC).unwrap().fill_rate;
        assert!((busy - 100.0).abs() < 1.0, "{busy}");
        let idle = book.view(1, 30 * SEC).unwrap().fill_rate;
        assert!(idle < 10.0, "{idle}");
    }

    #[test]
    fn newest_first_walks_from_the_last_update_back() {
        let mut book = CounterBook::default();
        for id in 1..=3 {
            book.add(id, 10.0, 0, None, || Some(Counting::Leak(1.0).into()));
        }
        book.add(1, 5.0, SEC, None, || None);
        let walked: Vec<(u64, f64)> = book
            .newest_first(2 * SEC)
            .map(|(counter, level, _, _)| (counter.id, level))
            .collect();
        assert_eq!(walked, [(1, 13.0), (3, 8.0), (2, 8.0)]);
        assert_eq!(CounterBook::default().newest_first(0).count(), 0);
    }

    #[test]
    fn recent_limiters_are_remembered_newest_first_and_bounded() {
        let mut book = CounterBook::default();
        for limiter in 0..(MAX_SEEN as u32 + 3) {
            book.add(1, 1.0, u64::from(limiter) * SEC, Some(limiter), || {
                Some(Counting::Leak(0.0).into())
            });
        }
        book.add(1, 1.0, 100 * SEC, Some(5), || None);
        let seen = book.view(1, 100 * SEC).unwrap().seen;
        assert_eq!(seen.len(), MAX_SEEN);
        assert_eq!(
            seen[0],
            Seen {
                limiter: 5,
                at: 100 * SEC
            }
        );
        assert!(seen.iter().all(|s| s.limiter >= 3));
    }
}
