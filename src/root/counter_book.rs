//! The cluster counters a root sums, in memory only.
//!
//! One counter per quota that received weight since the root started,
//! stored as a [`Level`] in the root's clock and updated with
//! `C = max(C, F(now)) + delta` ([`Level::add`]). A restarted root starts
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

use rustc_hash::FxHashMap;

use crate::core::estimate::FILL_RATE_SMOOTHING;
use crate::core::{Level, Nanos, SECS_PER_NANO};
use crate::wire::CounterValue;

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

/// One counter and its place in the version list.
#[derive(Clone, Debug)]
struct Slot {
    /// Quota id (meaningless while the slot is free).
    id: u64,
    /// The quota's leak rate, copied so an update needs one lookup.
    limit: f64,
    /// The cluster level, in root time.
    level: Level,
    /// Version of the last update.
    version: u64,
    /// Neighbour with the next lower version, or [`NIL`].
    older: u32,
    /// Neighbour with the next higher version, or [`NIL`].
    newer: u32,
    /// Rate of incoming weight.
    fill: FillMeter,
    /// The most recent limiters that sent weight.
    seen: Vec<Seen>,
}

/// A counter as the admin API shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterView {
    /// Level leaked to the time of the view.
    pub level: f64,
    /// Units per second arriving, smoothed.
    pub fill_rate: f64,
    /// Version of the last update.
    pub version: u64,
    /// Recent limiters, newest first.
    pub seen: Vec<Seen>,
}

/// Counters changed since some version.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangedCounters {
    /// The counters, oldest change first.
    pub counters: Vec<CounterValue>,
    /// Version to ask from next time: the newest version when everything
    /// fit, else the version of the last counter included.
    pub version: u64,
}

/// All counters of one root.
#[derive(Debug)]
pub struct CounterBook {
    /// Counter storage; free slots are listed in `free`.
    slots: Vec<Slot>,
    /// Indices of free slots.
    free: Vec<u32>,
    /// Quota id to slot index.
    index: FxHashMap<u64, u32>,
    /// Slot with the lowest version, or [`NIL`].
    oldest: u32,
    /// Slot with the highest version, or [`NIL`].
    newest: u32,
    /// Last version handed out.
    version: u64,
}

impl Default for CounterBook {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            index: FxHashMap::default(),
            oldest: NIL,
            newest: NIL,
            version: 0,
        }
    }
}

impl CounterBook {
    /// Adds `weight` to counter `id` at `now`: `C = max(C, F(now)) + weight`.
    ///
    /// A counter not seen before is created when `limit_of` knows the quota
    /// (a live one); otherwise nothing happens and `false` is returned, so
    /// deltas for unknown or deleted quotas are ignored.
    pub fn add<F>(
        &mut self,
        id: u64,
        weight: f64,
        now: Nanos,
        limiter: Option<u32>,
        limit_of: F,
    ) -> bool
    where
        F: FnOnce() -> Option<f64>,
    {
        let index = match self.index.get(&id) {
            Some(&index) => index,
            None => match limit_of() {
                Some(limit) => self.create(id, limit, now),
                None => return false,
            },
        };
        self.version += 1;
        let version = self.version;
        let slot = &mut self.slots[index as usize];
        slot.level = slot.level.add(slot.limit, now, weight);
        slot.version = version;
        slot.fill.record(now, weight);
        if let Some(limiter) = limiter {
            note_seen(&mut slot.seen, limiter, now);
        }
        self.unlink(index);
        self.push_newest(index);
        true
    }

    /// Changes a counter's leak rate, leaking it to `now` at the old rate
    /// first so the change does not act retroactively.
    pub fn set_limit(&mut self, id: u64, limit: f64, now: Nanos) {
        if let Some(&index) = self.index.get(&id) {
            let slot = &mut self.slots[index as usize];
            if slot.limit != limit {
                slot.level = slot.level.leaked(slot.limit, now);
                slot.limit = limit;
            }
        }
    }

    /// Drops the counter of a deleted quota.
    pub fn remove(&mut self, id: u64) {
        if let Some(index) = self.index.remove(&id) {
            self.unlink(index);
            let slot = &mut self.slots[index as usize];
            slot.seen = Vec::new();
            self.free.push(index);
        }
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
            version: self.version,
        };
        let mut cursor = first;
        while cursor != NIL {
            let slot = &self.slots[cursor as usize];
            if changed.counters.len() >= max {
                // Everything before this slot was considered.
                changed.version = match slot.older {
                    NIL => since,
                    older => since.max(self.slots[older as usize].version),
                };
                break;
            }
            if since > 0 || slot.level.leaked(slot.limit, now).level > 0.0 {
                let Level { level, at } = slot.level;
                changed.counters.push(CounterValue {
                    id: slot.id,
                    level,
                    at,
                });
            }
            cursor = slot.newer;
        }
        changed
    }

    /// A counter's live view at `now`.
    pub fn view(&self, id: u64, now: Nanos) -> Option<CounterView> {
        let slot = &self.slots[*self.index.get(&id)? as usize];
        let mut seen = slot.seen.clone();
        seen.sort_by_key(|s| std::cmp::Reverse(s.at));
        Some(CounterView {
            level: slot.level.leaked(slot.limit, now).level,
            fill_rate: slot.fill.rate_at(now),
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

    /// The last version handed out.
    pub fn version(&self) -> u64 {
        self.version
    }

    fn create(&mut self, id: u64, limit: f64, now: Nanos) -> u32 {
        let slot = Slot {
            id,
            limit,
            level: Level::empty(now),
            version: 0,
            older: NIL,
            newer: NIL,
            fill: FillMeter::new(now),
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
        self.index.insert(id, index);
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
        assert!(book.add(1, 50.0, 0, None, || Some(10.0)));
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
            book.add(id, 1.0, 0, None, || Some(0.0));
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
            book.add(id, 1.0, 0, None, || Some(0.0));
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
        book.add(1, 5.0, 0, None, || Some(1.0));
        book.add(2, 500.0, 0, None, || Some(1.0));
        assert_eq!(ids(&book.changed_since(0, 10, 10 * SEC)), [2]);
        // An incremental reader still learns both changed.
        assert_eq!(book.changed_since(0, 10, 0).counters.len(), 2);
    }

    #[test]
    fn removed_counters_leave_the_list_and_their_slot_is_reused() {
        let mut book = CounterBook::default();
        for id in 1..=3 {
            book.add(id, 1.0, 0, None, || Some(0.0));
        }
        book.remove(2);
        book.remove(7);
        assert_eq!(ids(&book.changed_since(0, 10, 0)), [1, 3]);
        book.add(4, 1.0, 0, None, || Some(0.0));
        assert_eq!(book.slots.len(), 3);
        assert_eq!(ids(&book.changed_since(0, 10, 0)), [1, 3, 4]);
        book.remove(1);
        book.remove(4);
        book.remove(3);
        assert!(book.changed_since(0, 10, 0).counters.is_empty());
        assert_eq!((book.oldest, book.newest), (NIL, NIL));
    }

    #[test]
    fn a_limit_change_leaks_at_the_old_rate_first() {
        let mut book = CounterBook::default();
        book.add(1, 100.0, 0, None, || Some(10.0));
        book.set_limit(1, 0.0, 5 * SEC);
        // 50 leaked at 10/s, then nothing more at 0/s.
        assert_eq!(book.view(1, 100 * SEC).unwrap().level, 50.0);
    }

    #[test]
    fn fill_rate_follows_the_incoming_weight_and_decays_when_idle() {
        let mut book = CounterBook::default();
        for s in 0..10 {
            book.add(1, 100.0, s * SEC, None, || Some(0.0));
        }
        let busy = book.view(1, 10 * SEC).unwrap().fill_rate;
        assert!((busy - 100.0).abs() < 1.0, "{busy}");
        let idle = book.view(1, 30 * SEC).unwrap().fill_rate;
        assert!(idle < 10.0, "{idle}");
    }

    #[test]
    fn recent_limiters_are_remembered_newest_first_and_bounded() {
        let mut book = CounterBook::default();
        for limiter in 0..(MAX_SEEN as u32 + 3) {
            book.add(1, 1.0, u64::from(limiter) * SEC, Some(limiter), || {
                Some(0.0)
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
