//! The counters of per-key quotas: one per (template, key hash), created
//! by the check that first sees the key, in the key section of the region.
//!
//! # Placement: two buckets a key
//!
//! The section is bucketized cuckoo hashing. A key may live in either of
//! two buckets its hash picks ([`KEY_WAYS`] entries each); a lookup reads
//! both, and the misses of the two are issued together, so it costs one
//! round of memory latency. A new key takes a free entry of either
//! bucket, or an entry equal to no entry (below). When both buckets are
//! full, entries are moved to their own other bucket along the shortest
//! chain of moves (breadth first, [`MAX_MOVE_DEPTH`] steps at most) that
//! ends at a free entry, and the key takes the entry the chain freed
//! (`key_moves.rs`). The section so fills to well above 90% before a key
//! finds no room (BENCHMARKS.md, "Key store fill"), where one bucket
//! alone overflowed from half full on.
//!
//! # What is never lost
//!
//! An entry is reused for another key only when it is equal to no entry:
//! nothing pending or unacked, its level leaked to zero (a leaky quota),
//! nothing counted in its current window nor, sliding, in the previous
//! one (a window quota), or its template gone. A key whose count still
//! matters keeps its entry, however busy the section: there is no
//! eviction of live keys, so no spray of other keys can reset a key's
//! count. Moving an entry to its other bucket carries its whole state.
//!
//! # When the section is full of live keys
//!
//! A key that finds no room (every entry of the section it could reach
//! holds a live count) is an overflow, counted in `overflows` and decided
//! by the overflow mode ([`KeyOverflow`], a zone-wide setting):
//!
//! - `shared` (the default): it is checked against, and counted on, the
//!   template's own counter, which every key without an entry shares
//!   fleet-wide (it syncs as the template's named counter). Together such
//!   keys get one key's limit: degradation toward rejecting, never toward
//!   passing uncounted.
//! - `reject`: it is rejected.
//! - `pass`: it passes uncounted (the behaviour of earlier versions).
//!
//! A new key whose two buckets are full needs the key lock to move
//! entries, and a check waits for it only a bounded time
//! (`key_moves.rs`): when the holder (the sync thread, or a check making
//! room) was descheduled (an overloaded machine), the key is an overflow
//! for that one check, whatever the fill, counted apart in `busy` and
//! logged as such (it says nothing about room). Its next check tries
//! again.
//!
//! # Concurrency
//!
//! Checks take no lock: they find a key by its hash word, add to
//! `pending`, mark the entry dirty and record its use. A new key claims a
//! free (or drained) entry with a CAS on the hash word. Everything else
//! that writes an entry holds the key lock (`KeyPlacement::lock`): moves,
//! and the sync thread's collections, merges, folds and sweeps (which also
//! hold the writer lock, taken first), so a move never races a merge. A
//! move copies the entry, publishes the copy, retires the original and
//! hands on whatever was added to it meanwhile; the move sequence
//! (`KeyPlacement::moves`) lets a lookup that missed during a move look
//! again, so a moving key is never taken for a new one. A check that
//! counted on an entry just moved away takes its weight back and counts it
//! where the key lives now. The rare races left (two checks inserting one
//! new key at the same instant, a check stalled across two moves of its
//! entry) cost at most a duplicate entry whose weight is still collected,
//! or a few units counted on a neighbouring key: never a crash, never
//! weight counted twice at the roots.
//!
//! The dirty ring lists entries with weight not yet collected
//! (`key_sync.rs`): a check that adds to an entry not in the ring queues
//! it; the sync thread drains the ring. A full ring sets a flag and the
//! next collection scans every entry instead, so no weight is stranded.

use crate::core::key::KeyHash;
use crate::core::Nanos;
use crate::table::region::key_entries::{clear_entry, init_entry, prefetch, touch};
use crate::table::region::layout::{DIRTY_TIERS, KEY_CLAIMED, KEY_WAYS};
use crate::table::region::REL;
use std::sync::atomic::{fence, Ordering::SeqCst};

use super::key_entries::{KeyAt, KeyEntries, NoMove, NoRoom};
use super::key_moves::KeyMoves;
use super::layout::{key_tick, KeyEntry, DIRTY_QUEUED, DIRTY_TIERS_UNSURE};
use super::ring::DirtySlots;
use super::sections::{region_view, SlotId, ACQ, RLX};
use super::tier_section::TierSection;

region_view!(
    /// Keys placed and counted.
    Keys
);

impl Keys<'_> {
    /// The entry of a key a check sees at `now`, made if it has none (a
    /// free or drained entry of one of its buckets, else one freed by
    /// moving others); its use is recorded. [`NoRoom`] when the section
    /// has no room for it (counted in `overflows`).
    #[inline]
    pub(in crate::table) fn use_key(
        &self,
        template: SlotId,
        hash: KeyHash,
        now: Nanos,
    ) -> Result<KeyAt, NoRoom> {
        match self.find_key_touched(template, hash, now) {
            Some(at) => Ok(at),
            None => self.make_key(template, hash, now),
        }
    }

    /// The entry of a key that has one, its use at `now` recorded; `None`
    /// when the key has none (nothing made).
    #[inline]
    pub(in crate::table) fn find_key_touched(
        &self,
        template: SlotId,
        hash: KeyHash,
        now: Nanos,
    ) -> Option<KeyAt> {
        // The common case first: a known key in its first bucket, with the
        // second bucket's lines already on their way in case it is there.
        let buckets = self.key_buckets();
        if buckets.is_empty() {
            return None;
        }
        let (b1, b2) = KeyEntries::of(self).buckets_of(template, hash);
        prefetch(&buckets[b2]);
        if let Some(at) = KeyEntries::of(self).scan_bucket(b1, template, hash) {
            touch(&buckets[b1].ways[at as usize % KEY_WAYS], key_tick(now));
            return Some(at);
        }
        self.find_key_touched_slow(template, hash, now)
    }

    /// `find_key_touched` past its first bucket: the second, and
    /// a look again if entries were moving.
    #[cold]
    #[inline(never)]
    fn find_key_touched_slow(&self, template: SlotId, hash: KeyHash, now: Nanos) -> Option<KeyAt> {
        let at = KeyEntries::of(self).find_key(template, hash)?;
        if let Some(e) = KeyEntries::of(self).key_at(at) {
            touch(e, key_tick(now));
        }
        Some(at)
    }

    /// Makes an entry for a key found to have none, counting an overflow
    /// when there is no room.
    #[cold]
    #[inline(never)]
    fn make_key(&self, template: SlotId, hash: KeyHash, now: Nanos) -> Result<KeyAt, NoRoom> {
        let placed = if self.geometry().key_buckets == 0 {
            Err(NoMove::NoChain)
        } else {
            self.insert_key(template, hash, now)
        };
        placed.map_err(|why| {
            let p = &self.header().keys.place;
            p.overflows.fetch_add(1, RLX);
            if why == NoMove::Busy {
                p.busy.fetch_add(1, RLX);
            }
            NoRoom
        })
    }

    /// Makes an entry for a key that has none. A key lock held past the
    /// bounded wait ends the attempts at once ([`NoMove::Busy`]): its
    /// holder was descheduled, and waiting again would only hold up the
    /// request that much longer (the lock is held in short batches, so
    /// this happens on a loaded machine whatever the fill: it says
    /// nothing about room).
    pub(in crate::table) fn insert_key(
        &self,
        template: SlotId,
        hash: KeyHash,
        now: Nanos,
    ) -> Result<KeyAt, NoMove> {
        let (b1, b2) = KeyEntries::of(self).buckets_of(template, hash);
        for _ in 0..3 {
            let claimed = match KeyEntries::of(self)
                .claim_in(b1, now)
                .or_else(|| KeyEntries::of(self).claim_in(b2, now))
            {
                Some(at) => Ok(at),
                None => KeyMoves::of(self).make_room(b1, b2, now),
            };
            let at = match claimed {
                Ok(at) => at,
                Err(NoMove::Busy) => return Err(NoMove::Busy),
                Err(NoMove::NoChain) => continue,
            };
            let e = KeyEntries::of(self).key_at(at).ok_or(NoMove::NoChain)?;
            let tiers = TierSection::of(self).tiers_hold_key(template, hash);
            init_entry(e, template, hash, key_tick(now), now, tiers);
            let p = &self.header().keys.place;
            p.inserts.fetch_add(1, RLX);
            let at = self.settle_duplicate(at, template, hash, (b1, b2));
            if !tiers {
                // Published, then asked again: an override or penalty the
                // sync added meanwhile either finds the entry (and marks
                // it) or is found here (see `tiers.rs`). Until then the
                // entry is unsure, so a check of the key by another thread
                // in between asks the filter rather than trust the
                // missing mark.
                fence(SeqCst);
                if TierSection::of(self).tiers_hold_key(template, hash) {
                    KeyEntries::of(self).mark_key_tiers(template, hash);
                }
                self.settle_key_tiers(template, hash);
            }
            return Ok(at);
        }
        Err(NoMove::NoChain)
    }

    /// After a new key's entry at `at` was published: if another entry of
    /// the key's buckets holds the same key (two checks inserted it at
    /// once), the one first in lookup order stays and the other is retired
    /// into it. Returns where the key lives.
    fn settle_duplicate(
        &self,
        at: KeyAt,
        template: SlotId,
        hash: KeyHash,
        (b1, b2): (usize, usize),
    ) -> KeyAt {
        let entries = KeyEntries::of(self);
        let Some(first) = entries
            .scan_bucket(b1, template, hash)
            .or_else(|| entries.scan_bucket(b2, template, hash))
        else {
            return at;
        };
        if first == at {
            return at;
        }
        if let (Some(mine), Some(theirs)) = (
            KeyEntries::of(self).key_at(at),
            KeyEntries::of(self).key_at(first),
        ) {
            if mine
                .hash
                .compare_exchange(hash, KEY_CLAIMED, ACQ, RLX)
                .is_ok()
            {
                let moved = mine.pending.swap(0, SeqCst);
                if mine.dirty.load(SeqCst) & DIRTY_TIERS != 0 {
                    theirs.dirty.fetch_or(DIRTY_TIERS, SeqCst);
                }
                clear_entry(mine);
                mine.hash.store(0, REL);
                let p = &self.header().keys.place;
                p.live.fetch_sub(1, RLX);
                p.inserts.fetch_sub(1, RLX);
                if moved > 0 {
                    theirs.pending.fetch_add(moved, SeqCst);
                    KeyEntries::of(self).mark_dirty(first, theirs);
                }
            }
        }
        first
    }

    /// Ends the unsure state ([`DIRTY_TIERS_UNSURE`]) of the entry of the
    /// key `hash` of the template in slot `template`, wherever it is now,
    /// once its maker has looked in the tier section again. An entry
    /// that moved meanwhile and is missed keeps it until the sweep: a
    /// look in the filter per check, never a missed override.
    fn settle_key_tiers(&self, template: SlotId, hash: KeyHash) {
        if let Some(e) = KeyEntries::of(self)
            .find_key(template, hash)
            .and_then(|at| KeyEntries::of(self).key_at(at))
        {
            if e.hash.load(ACQ) == hash {
                e.dirty.fetch_and(!DIRTY_TIERS_UNSURE, SeqCst);
            }
        }
    }

    /// Counts a passed check's weight on the key `hash` of the template in
    /// slot `template`, found at `at`, and queues it for the next
    /// collection. If the entry moved away meanwhile, the weight follows
    /// the key (or, should it have no entry any more, goes to the
    /// template's own counter, as an overflow's would).
    // Inlined into the keyed fast path: called, it checked the entry's
    // place again and cost 16 instructions more a hot keyed check
    // (callgrind); `rehome` stays out of line.
    #[inline(always)]
    pub(in crate::table) fn count_key(
        &self,
        at: KeyAt,
        template: SlotId,
        hash: KeyHash,
        weight: u64,
    ) {
        let Some(e) = KeyEntries::of(self).key_at(at) else {
            return;
        };
        if weight == 0 {
            return;
        }
        e.pending.fetch_add(weight, SeqCst);
        if e.hash.load(SeqCst) != hash {
            self.rehome(e, template, hash, weight);
            return;
        }
        // After the add: a collector that cleared the flag before reading
        // `pending` either saw the weight or left the flag for us to set.
        if e.dirty.load(SeqCst) & DIRTY_QUEUED == 0 {
            KeyEntries::of(self).mark_dirty(at, e);
        }
    }

    /// Takes back what is left of `weight` just added to `e`, which no
    /// longer holds the key (a move forwarded what it found; whatever came
    /// after is still there), and counts it where the key lives now.
    #[cold]
    #[inline(never)]
    fn rehome(&self, e: &KeyEntry, template: SlotId, hash: KeyHash, weight: u64) {
        let mut now_there = e.pending.load(SeqCst);
        let taken = loop {
            // Only what is still there as an add (a return waiting in the
            // entry is not this check's).
            let take = (now_there as i64).clamp(0, weight as i64) as u64;
            if take == 0 {
                break 0;
            }
            match e
                .pending
                .compare_exchange(now_there, now_there - take, SeqCst, SeqCst)
            {
                Ok(_) => break take,
                Err(seen) => now_there = seen,
            }
        };
        if taken == 0 {
            return;
        }
        match KeyEntries::of(self).find_key(template, hash) {
            Some(at) => {
                if let Some(to) = KeyEntries::of(self).key_at(at) {
                    to.pending.fetch_add(taken, SeqCst);
                    KeyEntries::of(self).mark_dirty(at, to);
                }
            }
            None => {
                if let Some(s) = self.slot(template) {
                    if s.pending.fetch_add(taken, RLX) == 0 {
                        DirtySlots::of(self).mark(template);
                    }
                }
            }
        }
    }
}
