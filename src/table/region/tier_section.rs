//! Tiers per key in the region: overrides of a per-key template for one
//! key (other numbers, `allow`, `deny`), penalties, and quotas' penalty
//! lengths, in the tier section (see [`crate::core::tier`] for what they
//! mean).
//!
//! # The hot path
//!
//! A quota with a penalty, or a per-key template some of whose keys have
//! overrides, carries [`FLAG_TIERS`] in its slot; a check reads the flags
//! anyway, so every other check pays one bit test. A key of a flagged
//! template then tests its own entry's mark
//! ([`DIRTY_TIERS`](super::layout::DIRTY_TIERS)), in a line
//! the check has read anyway: unmarked, the section holds nothing of the
//! key and the check goes on as if the template had no tiers; marked, it
//! looks in the table. A key that found no entry asks the filter (a
//! blocked Bloom filter: one cache line and a few bit tests, `(quota,
//! key)` hashed to a block) before the table. A named quota with a
//! penalty looks up its own entry. The cold path that applies what it
//! finds is `apply_tiers`.
//!
//! # Keeping the marks true
//!
//! A key entry is marked whenever the section may hold an entry of its
//! key, so an unmarked entry is never wrong to skip:
//!
//! - whoever adds an entry `(quota, key)` (the sync thread applying an
//!   override or merging a penalty, a check starting a penalty; all hold
//!   the tier lock) publishes it, then marks the key's entry if it has
//!   one (`mark_key_tiers` in `keys.rs`, which follows an entry that
//!   moves meanwhile) before it lets go: a key's next check takes the override
//!   from then on;
//! - a check making a new key entry asks the filter and the table before
//!   it publishes the entry, and once more after, a full fence between:
//!   an entry added meanwhile is either found by its adder's mark or by
//!   that second look (neither side can miss both). Until that second
//!   look the entry is *unsure* (`DIRTY_TIERS_UNSURE`): another check of
//!   the key meanwhile asks the filter instead of trusting the missing
//!   mark. The maker ends it after its look, or the sweep does (marking
//!   the entry when the section holds the key) if the entry moved away
//!   meanwhile;
//! - a move carries the mark; its move sequence is odd from the copy on,
//!   so a marker that marked the original meanwhile marks again where the
//!   key went (and the move also carries over a mark found on the
//!   original once it is retired);
//! - a check trusts the mark only if its entry still holds the key after
//!   the mark is read: an entry freed or retaken since the check found it
//!   has its mark cleared or another key's, and the filter answers
//!   instead;
//! - only the key upkeep sweep clears a mark, holding the key lock and
//!   the tier lock (so nothing is added meanwhile), on an entry it holds
//!   claimed for the moment, after finding the section holds nothing of
//!   the key (`key_sync.rs`).
//!
//! So the marks need no generation and no pass over the keys when
//! overrides change: an added entry marks its one key, and a removed one
//! leaves a mark that costs its key a look in the table until the sweep
//! comes by.
//!
//! # The table
//!
//! Open addressing with linear probing over [`TierEntry`]s (a cache line
//! each), keyed by `(quota id, key hash)`, at most 4/5 full; an entry's
//! fields are read under its own seqlock. Writers hold the tier lock:
//! the sync thread (applying overrides, merging penalties, sweeping) and a
//! check that starts a penalty (a bounded wait; on failure the penalty
//! starts at the next rejection). A removal shifts the entries after it
//! back (no tombstones), with the section's move sequence odd meanwhile,
//! so a lookup that missed during a move looks again.
//!
//! The filter has two copies: bits are only ever added to the one in use;
//! once removals left many stale bits, the sync thread builds the other
//! copy from the live entries and switches to it.
//!
//! # Penalties
//!
//! A penalty's end is UTC nanoseconds (the table's clock plus its UTC
//! offset, which the sync thread keeps on the roots' clocks), merged by
//! `max`: a check that rejects at the high burst of a quota with a penalty
//! raises the end and queues the penalty in the outbox; the sync thread
//! sends it to the roots, which answer it to every limiter.
//!
//! Penalties come only from what a key did, and they cannot crowd out
//! overrides: entries that hold only a penalty (no override, no quota's
//! penalty length) may take at most half the section
//! ([`PENALTY_SHARE`]). A penalty beyond that share, or one that finds
//! the section full, takes the place of the penalty ending first if that
//! one ends sooner, else it is refused (both counted); an override or a
//! quota's penalty length that finds the section full takes the place of
//! the penalty ending first, so an admin's override always has room
//! while any penalty holds some. The count of such entries is taken by a
//! pass over the section only when it is at least half full.

use crate::core::key::KeyHash;
use crate::core::tier::Rule;
use std::sync::atomic::{fence, AtomicU32, Ordering::SeqCst};

use super::key_entries::KeyEntries;
use super::layout::{TierEntry, TIER_ALLOW, TIER_DENY, TIER_KIND, TIER_LIMIT, TIER_NONE};
use super::lock::{own_pid, process_alive};
use super::sections::{read_pause, region_view, SlotId, ACQ, READ_ATTEMPTS, REL, RLX};

/// Bits a key sets in its filter block.
pub(in crate::table) const FILTER_BITS: u32 = 6;

/// Lookups that missed while entries moved retry at most this often.
pub(in crate::table) const MISS_RETRIES: u32 = 64;

/// An override, penalty or penalty length as a check reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierRead {
    /// [`TIER_NONE`], [`TIER_LIMIT`], [`TIER_ALLOW`] or [`TIER_DENY`].
    pub kind: u32,
    /// An override's numbers (a `limit` override).
    pub limit: f64,
    /// Its low burst.
    pub low_burst: f64,
    /// Its high burst.
    pub high_burst: f64,
    /// End of the penalty, UTC nanoseconds (0: none).
    pub until: i64,
    /// For `(quota, 0)`: the quota's penalty length, seconds.
    pub penalty_secs: u32,
    /// When the override stops applying, UTC seconds (0: never).
    pub expires: u32,
}

impl TierRead {
    /// The override in force at `now_utc` (UTC nanoseconds): its kind, or
    /// [`TIER_NONE`] once expired.
    pub fn kind_at(&self, now_utc: i64) -> u32 {
        if self.expires != 0 && i64::from(self.expires) * 1_000_000_000 <= now_utc {
            TIER_NONE
        } else {
            self.kind
        }
    }
}

/// Part of the section that entries holding only a penalty may take:
/// one in `PENALTY_SHARE`.
pub(in crate::table) const PENALTY_SHARE: u64 = 2;

/// What an entry of the section is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::table) enum EntryFor {
    /// A penalty ending at `until` (UTC nanoseconds): within the
    /// penalties' share, taking the place of one that ends sooner.
    Penalty { until: i64 },
    /// An override or a quota's penalty length: the penalty ending first
    /// gives way when the section is full.
    Rule,
}

/// What the tier section holds and did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Overrides and penalties it can hold.
    pub capacity: u64,
    /// Entries in use (overrides, penalties, quotas' penalty lengths).
    pub live: u64,
    /// Overrides and quotas' penalty lengths refused: the section was full
    /// of them.
    pub refused: u64,
    /// Penalties refused: the penalties' share (or the section) was full
    /// of penalties ending later.
    pub penalties_refused: u64,
    /// Penalties that gave way, ending first, to a later penalty or to an
    /// override.
    pub penalties_evicted: u64,
    /// Penalties this host started.
    pub started: u64,
    /// Checks rejected by a `deny` override.
    pub denied: u64,
    /// Checks rejected by a penalty in force.
    pub penalized: u64,
}

/// One entry as listings show it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierState {
    /// The quota id.
    pub quota: u64,
    /// The key's hash (0: the quota itself).
    pub key: KeyHash,
    /// The override, if any.
    pub rule: Option<Rule>,
    /// End of the penalty, UTC nanoseconds (0: none).
    pub until: i64,
}

/// What applying overrides did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierReport {
    /// Overrides written.
    pub applied: usize,
    /// Overrides removed (tombstones, or expired).
    pub removed: usize,
    /// Overrides refused: the section was full.
    pub refused: usize,
}

/// The tier lock, held for the guard's life.
pub(in crate::table) struct TierLock<'a> {
    lock: &'a AtomicU32,
}

impl<'a> TierLock<'a> {
    /// Takes the lock within `spins` attempts (spinning, then yielding),
    /// or not at all; `None` spins: however long it takes. A lock whose
    /// holder died is taken over.
    pub(in crate::table) fn acquire(lock: &'a AtomicU32, spins: Option<u32>) -> Option<Self> {
        let me = own_pid();
        let mut n = 0u32;
        loop {
            let holder = lock.load(RLX);
            if holder == 0 {
                if lock.compare_exchange_weak(0, me, ACQ, RLX).is_ok() {
                    return Some(TierLock { lock });
                }
            } else if n > 1000
                && n % 1000 == 1
                && holder != me
                && !process_alive(holder)
                && lock.compare_exchange(holder, me, ACQ, RLX).is_ok()
            {
                return Some(TierLock { lock });
            }
            n = n.saturating_add(1);
            if spins.is_some_and(|max| n >= max) {
                return None;
            }
            if n < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for TierLock<'_> {
    fn drop(&mut self) {
        self.lock.store(0, REL);
    }
}

/// Attempts a check makes at the tier lock before it gives up starting a
/// penalty (the next rejection tries again).
pub(in crate::table) const CHECK_LOCK_SPINS: u32 = 200;

/// A 64-bit mix of `(quota, key)`: where its entry and its filter bits
/// go.
#[inline(always)]
pub(in crate::table) fn mix(quota: u64, key: KeyHash) -> u64 {
    let h = (key ^ quota.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    h ^ (h >> 32)
}

/// Writes an entry's fields under its seqlock.
pub(in crate::table) fn write_entry(e: &TierEntry, write: impl FnOnce(&TierEntry)) {
    let s = e.seq.load(RLX);
    e.seq
        .store((s | 1).wrapping_add(if s & 1 == 1 { 2 } else { 0 }), RLX);
    fence(REL);
    write(e);
    let s = e.seq.load(RLX);
    e.seq.store(s.wrapping_add(1), REL);
}

/// Reads an entry's fields under its seqlock; `None` if it never
/// stabilised.
pub(in crate::table) fn read_entry(e: &TierEntry) -> Option<TierRead> {
    for attempt in 0..READ_ATTEMPTS {
        let seq = e.seq.load(ACQ);
        if seq & 1 == 0 {
            let read = TierRead {
                kind: e.rule.load(RLX) & TIER_KIND,
                limit: f64::from_bits(e.limit.load(RLX)),
                low_burst: f64::from_bits(e.low_burst.load(RLX)),
                high_burst: f64::from_bits(e.high_burst.load(RLX)),
                until: e.until.load(RLX) as i64,
                penalty_secs: e.penalty_secs.load(RLX),
                expires: e.expires.load(RLX),
            };
            fence(ACQ);
            if e.seq.load(RLX) == seq {
                return Some(read);
            }
        }
        read_pause(attempt);
    }
    None
}

/// The rule an entry's fields say.
pub(in crate::table) fn rule_of(read: &TierRead) -> Option<Rule> {
    match read.kind {
        TIER_LIMIT => Some(Rule::Limit {
            limit: read.limit,
            low_burst: read.low_burst,
            high_burst: read.high_burst,
        }),
        TIER_ALLOW => Some(Rule::Allow),
        TIER_DENY => Some(Rule::Deny),
        _ => None,
    }
}

region_view!(
    /// The tier section: its entries, its filter and its lock.
    TierSection
);

impl<'r> TierSection<'r> {
    /// Overrides and penalties the section holds (0: none).
    pub(in crate::table) fn tier_capacity(&self) -> u64 {
        self.geometry().tier_capacity()
    }

    /// The tier section's counters.
    pub(in crate::table) fn tier_stats(&self) -> TierStats {
        let t = &self.header().tiers;
        TierStats {
            capacity: self.tier_capacity(),
            live: t.live.load(RLX),
            refused: t.refused.load(RLX),
            penalties_refused: t.penalties_refused.load(RLX),
            penalties_evicted: t.penalties_evicted.load(RLX),
            started: t.started.load(RLX),
            denied: t.denied.load(RLX),
            penalized: t.penalized.load(RLX),
        }
    }

    /// The tier lock, however long it takes.
    pub(in crate::table) fn tier_lock(&self) -> TierLock<'r> {
        TierLock::acquire(&self.region().header().tiers.lock, None).expect("waits for the lock")
    }

    /// Where the probe for `(quota, key)` starts.
    fn tier_home(&self, quota: u64, key: KeyHash) -> usize {
        let n = self.geometry().tier_entries as u64;
        ((u128::from(mix(quota, key)) * u128::from(n)) >> 64) as usize
    }

    /// The filter block of `(quota, key)` and its bits in it (0..512).
    fn filter_place(&self, quota: u64, key: KeyHash) -> (usize, u64) {
        let h = mix(quota, key)
            .rotate_left(17)
            .wrapping_mul(0xa076_1d64_78bd_642f);
        let blocks = u64::from(self.geometry().tier_filter_blocks.max(1));
        (((u128::from(h) * u128::from(blocks)) >> 64) as usize, h)
    }

    /// True when the filter in use may hold `(quota, key)` (false: the
    /// table surely does not).
    #[inline]
    pub(in crate::table) fn tier_filter_holds(&self, quota: u64, key: KeyHash) -> bool {
        let t = &self.header().tiers;
        if self.geometry().tier_filter_blocks == 0 {
            return false;
        }
        let words = self.tier_filter(t.filter_active.load(ACQ));
        let (block, bits) = self.filter_place(quota, key);
        let block = &words[block * 8..block * 8 + 8];
        (0..FILTER_BITS).all(|i| {
            let bit = (bits >> (i * 9)) & 511;
            block[(bit >> 6) as usize].load(RLX) & (1 << (bit & 63)) != 0
        })
    }

    /// Adds `(quota, key)` to filter copy `copy`.
    fn tier_filter_add(&self, copy: u32, quota: u64, key: KeyHash) {
        let words = self.tier_filter(copy);
        let (block, bits) = self.filter_place(quota, key);
        let block = &words[block * 8..block * 8 + 8];
        for i in 0..FILTER_BITS {
            let bit = (bits >> (i * 9)) & 511;
            block[(bit >> 6) as usize].fetch_or(1 << (bit & 63), REL);
        }
    }

    /// The entry of `(quota, key)`, if the section has one. A miss while
    /// entries moved looks again.
    pub(in crate::table) fn find_tier(&self, quota: u64, key: KeyHash) -> Option<&'r TierEntry> {
        let entries = self.region().tier_entries();
        if entries.is_empty() {
            return None;
        }
        let moves = &self.header().tiers.moves;
        for _ in 0..MISS_RETRIES {
            let seq = moves.load(ACQ);
            let mut at = self.tier_home(quota, key);
            for _ in 0..entries.len() {
                let e = &entries[at];
                let q = e.quota.load(ACQ);
                if q == 0 {
                    break;
                }
                if q == quota && e.key.load(RLX) == key {
                    return Some(e);
                }
                at = if at + 1 == entries.len() { 0 } else { at + 1 };
            }
            fence(ACQ);
            if seq & 1 == 0 && moves.load(RLX) == seq {
                return None;
            }
            std::hint::spin_loop();
        }
        None
    }

    /// What the section holds for `(quota, key)`. A read while entries
    /// moved (the entry found may have been overwritten) looks again.
    pub(in crate::table) fn tier(&self, quota: u64, key: KeyHash) -> Option<TierRead> {
        let moves = &self.header().tiers.moves;
        for _ in 0..MISS_RETRIES {
            let seq = moves.load(ACQ);
            let read = read_entry(self.find_tier(quota, key)?);
            fence(ACQ);
            if seq & 1 == 0 && moves.load(RLX) == seq {
                return read;
            }
            std::hint::spin_loop();
        }
        None
    }

    /// True when the section holds an entry of the key `key` of the
    /// per-key template in slot `template` (the filter first: most keys
    /// cost it one line). What a new key entry is marked by.
    pub(in crate::table) fn tiers_hold_key(&self, template: SlotId, key: KeyHash) -> bool {
        let Some(quota) = self.slot(template).and_then(|s| s.quota_id()) else {
            return false;
        };
        self.tier_filter_holds(quota, key) && self.find_tier(quota, key).is_some()
    }

    /// Marks the entry of the key `key` of the quota in slot `template`
    /// after an entry of it was added to the section (see "Keeping the
    /// marks true").
    pub(in crate::table) fn mark_added(&self, template: SlotId, key: KeyHash) {
        if key == 0 {
            return;
        }
        // The tier entry is published; a check making the key's entry
        // publishes it, fences, and looks here: one of the two sees the
        // other.
        fence(SeqCst);
        KeyEntries::of(self).mark_key_tiers(template, key);
    }

    /// The entry of `(quota, key)`, made for `made_for` if there is none
    /// (the tier lock held); `None` when there is no room (counted): see
    /// "Penalties" in the module doc.
    pub(in crate::table) fn tier_entry_for(
        &self,
        lock: &TierLock,
        quota: u64,
        key: KeyHash,
        made_for: EntryFor,
    ) -> Option<&'r TierEntry> {
        if let Some(e) = self.find_tier(quota, key) {
            return Some(e);
        }
        let entries = self.region().tier_entries();
        let t = &self.header().tiers;
        if entries.is_empty() {
            t.refused.fetch_add(1, RLX);
            return None;
        }
        if !self.make_room(lock, made_for) {
            return None;
        }
        let mut at = self.tier_home(quota, key);
        while entries[at].quota.load(RLX) != 0 {
            at = if at + 1 == entries.len() { 0 } else { at + 1 };
        }
        let e = &entries[at];
        write_entry(e, |e| {
            e.rule.store(TIER_NONE, RLX);
            e.penalty_secs.store(0, RLX);
            e.expires.store(0, RLX);
            e.until.store(0, RLX);
        });
        e.key.store(key, RLX);
        if key != 0 {
            // Before the entry is published: a check that finds it passed
            // the filter.
            self.tier_filter_add(t.filter_active.load(RLX), quota, key);
        }
        e.quota.store(quota, REL);
        t.live.fetch_add(1, RLX);
        Some(e)
    }

    /// Whether an entry made for `made_for` has room, making it by
    /// removing the penalty ending first where the rules say (the tier
    /// lock held); a refusal is counted.
    fn make_room(&self, lock: &TierLock, made_for: EntryFor) -> bool {
        let t = &self.header().tiers;
        let capacity = self.tier_capacity();
        let share = (capacity / PENALTY_SHARE).max(1);
        let live = t.live.load(RLX);
        let full = live >= capacity;
        let penalty = matches!(made_for, EntryFor::Penalty { .. });
        if !(full || penalty && live >= share) {
            return true;
        }
        let (penalties, first) = self.penalty_entries();
        if !full && penalties < share {
            return true;
        }
        let gives_way = match (made_for, first) {
            (EntryFor::Penalty { until }, Some((_, end))) => end < until,
            (EntryFor::Rule, Some(_)) => true,
            (_, None) => false,
        };
        match first {
            Some((at, _)) if gives_way => {
                self.remove_tier_at(lock, at);
                t.penalties_evicted.fetch_add(1, RLX);
                true
            }
            _ => {
                let refused = match made_for {
                    EntryFor::Penalty { .. } => &t.penalties_refused,
                    EntryFor::Rule => &t.refused,
                };
                refused.fetch_add(1, RLX);
                false
            }
        }
    }

    /// The entries that hold only a penalty (no override, no quota's
    /// penalty length), counted, and the one ending first with its end
    /// (a pass over the section).
    fn penalty_entries(&self) -> (u64, Option<(usize, i64)>) {
        let mut count = 0;
        let mut first: Option<(usize, i64)> = None;
        for (at, e) in self.tier_entries().iter().enumerate() {
            if e.quota.load(RLX) == 0
                || e.rule.load(RLX) & TIER_KIND != TIER_NONE
                || e.penalty_secs.load(RLX) != 0
            {
                continue;
            }
            let until = e.until.load(RLX) as i64;
            count += 1;
            if first.is_none_or(|(_, end)| until < end) {
                first = Some((at, until));
            }
        }
        (count, first)
    }

    /// Removes the entry at `at` (the tier lock held), shifting back the
    /// entries of its run that belong before it.
    pub(in crate::table) fn remove_tier_at(&self, _lock: &TierLock, mut at: usize) {
        let entries = self.tier_entries();
        let t = &self.header().tiers;
        let n = entries.len();
        t.moves.fetch_add(1, SeqCst);
        let mut next = if at + 1 == n { 0 } else { at + 1 };
        loop {
            let q = entries[next].quota.load(RLX);
            if q == 0 {
                break;
            }
            let home = self.tier_home(q, entries[next].key.load(RLX));
            // The entry at `next` may move to `at` when its home is not
            // in the cyclic range (at, next].
            let stays = if at <= next {
                home > at && home <= next
            } else {
                home > at || home <= next
            };
            if !stays {
                copy_entry(&entries[next], &entries[at]);
                at = next;
            }
            next = if next + 1 == n { 0 } else { next + 1 };
        }
        entries[at].quota.store(0, REL);
        entries[at].key.store(0, RLX);
        t.moves.fetch_add(1, SeqCst);
        t.live.fetch_sub(1, RLX);
        t.removed.fetch_add(1, RLX);
    }

    pub(in crate::table) fn tier_index(&self, e: &TierEntry) -> usize {
        let first = self.tier_entries().as_ptr();
        // SAFETY: `e` is an entry of this table's tier section.
        unsafe { std::ptr::from_ref(e).offset_from(first) as usize }
    }

    /// Builds the filter copy not in use from the live entries, then
    /// switches checks to it (the tier lock held: no entry is added
    /// meanwhile).
    pub(in crate::table) fn rebuild_tier_filter(&self, _lock: &TierLock) {
        let t = &self.header().tiers;
        let next = t.filter_active.load(RLX) ^ 1;
        for word in self.tier_filter(next) {
            word.store(0, RLX);
        }
        for e in self.tier_entries() {
            let quota = e.quota.load(RLX);
            let key = e.key.load(RLX);
            if quota != 0 && key != 0 {
                self.tier_filter_add(next, quota, key);
            }
        }
        t.filter_active.store(next, REL);
        t.removed.store(0, RLX);
    }

    /// Every entry, for listings and metrics (not the request path).
    pub(in crate::table) fn tiers(&self) -> Vec<TierState> {
        self.tier_entries()
            .iter()
            .filter_map(|e| {
                let quota = e.quota.load(ACQ);
                if quota == 0 {
                    return None;
                }
                let read = read_entry(e)?;
                Some(TierState {
                    quota,
                    key: e.key.load(RLX),
                    rule: rule_of(&read),
                    until: read.until,
                })
            })
            .collect()
    }
}

/// Copies a live entry's whole state into `to` (a removal's shift; the
/// tier lock held, the move sequence odd).
pub(in crate::table) fn copy_entry(from: &TierEntry, to: &TierEntry) {
    write_entry(to, |to| {
        to.rule.store(from.rule.load(RLX), RLX);
        to.penalty_secs.store(from.penalty_secs.load(RLX), RLX);
        to.expires.store(from.expires.load(RLX), RLX);
        to.limit.store(from.limit.load(RLX), RLX);
        to.low_burst.store(from.low_burst.load(RLX), RLX);
        to.high_burst.store(from.high_burst.load(RLX), RLX);
        to.until.store(from.until.load(RLX), RLX);
    });
    to.key.store(from.key.load(RLX), RLX);
    to.quota.store(from.quota.load(RLX), REL);
}
