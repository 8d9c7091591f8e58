//! The key section's life outside the request path: the dirty ring a
//! sync drains, collecting keys' deltas, merging cluster values back,
//! folding locally, in-flight weight released or handed back, the upkeep
//! sweep, dropping a deleted template's keys and adopting another table's.
//!
//! Everything here holds the key lock (see `keys.rs`) besides the writer
//! lock its callers hold, so that no entry moves under it; long passes let
//! go of the key lock every [`SYNC_BATCH`] entries, so that a check making
//! room for a new key never waits long.

use std::sync::atomic::Ordering::SeqCst;

use super::merge::{merge, Known};
use super::tally::{
    self, fold_weight, folded_source, send_pending, settle_unacked, CollectedDelta,
};
use crate::core::estimate::Acked;
use crate::core::key::KeyHash;
use crate::core::{Nanos, Tally};
use crate::table::region::key_entries::KeyEntries;
use crate::table::region::key_entries::KeyOverflow;
use crate::table::region::key_entries::{
    clear_entry, key_rate, key_source, key_tally, set_key_rate_bits, set_key_source,
    store_key_rate, store_key_tally, KeyAt,
};
use crate::table::region::key_moves::{KeyLock, KeyMoves, SYNC_BATCH};
use crate::table::region::keys::Keys;
use crate::table::region::layout::Source;
use crate::table::region::layout::{
    KeyEntry, Slot, DIRTY_QUEUED, DIRTY_REFUSED, DIRTY_TIERS, DIRTY_TIERS_UNSURE, FLAG_IN_FLIGHT,
    KEY_CLAIMED, KEY_WAYS,
};
use crate::table::region::ring::DirtySlots;
use crate::table::region::slots::Slots;
use crate::table::region::tier_section::{TierLock, TierSection};
use crate::table::region::words::{pack_key_held, unpack_key_held};
use crate::table::region::{region_view, Region, SlotId, ACQ, REL, RLX};
use crate::wire::CounterKey;

region_view!(
    /// The keys outside the request path.
    KeySync
);

/// Known levels older than this are restamped (or the entry freed, if
/// drained) by the maintenance sweep, well within the ~26 days a packed
/// time can span.
const RESTAMP_AFTER: Nanos = 24 * 3600 * 1_000_000_000;

impl KeySync<'_> {
    /// Calls `each` with every entry queued since the last drain (or
    /// every entry, when the ring overflowed), under the key lock (let go
    /// every [`SYNC_BATCH`] entries). The writer lock is held.
    fn drain_dirty(&self, mut each: impl FnMut(KeyAt, &KeyEntry)) {
        if self.geometry().key_buckets == 0 {
            return;
        }
        let mut lock = KeyMoves::of(self).key_lock();
        let mut batch = 0;
        let mut each = |at: KeyAt, e: &KeyEntry, lock: &mut KeyLock| {
            batch += 1;
            if batch % SYNC_BATCH == 0 {
                lock.relax();
            }
            each(at, e);
        };
        let scan = KeyEntries::of(self).ring().drain(|at| {
            if let Some(e) = KeyEntries::of(self).key_at(at) {
                each(at, e, &mut lock);
            }
        });
        if scan {
            for (b, bucket) in self.key_buckets().iter().enumerate() {
                // Counted in buckets too, not only in entries handled: a
                // scan finding little pending (the flag set for one raced
                // claim) would else hold the lock over the whole section,
                // milliseconds, and every new key needing a move meanwhile
                // would be an overflow.
                if b % SYNC_BATCH == SYNC_BATCH - 1 {
                    lock.relax();
                }
                for (way, e) in bucket.ways.iter().enumerate() {
                    // A queued entry back at zero too: its flag, set when
                    // the ring was full, must be cleared, or no check
                    // would queue it again.
                    if e.pending.load(RLX) != 0 || e.dirty.load(RLX) & DIRTY_QUEUED != 0 {
                        each((b * KEY_WAYS + way) as KeyAt, e, &mut lock);
                    }
                }
            }
        }
    }

    /// Moves every queued key's pending weight to unacked and appends
    /// what moved to `out` (see [`crate::table::Books::collect_deltas`]).
    pub(in crate::table) fn collect_keys(&self, out: &mut Vec<CollectedDelta>) {
        let slots = self.slots();
        let h = self.header();
        self.drain_dirty(|_, e| {
            e.dirty.fetch_and(!DIRTY_QUEUED, SeqCst);
            let hash = e.hash.load(ACQ);
            if hash == KEY_CLAIMED && e.pending.load(SeqCst) != 0 {
                // A count raced the entry's claim: it belongs to the key
                // being made there. Scan every entry next time.
                h.keys.ring.overflow.store(1, REL);
                return;
            }
            if hash == 0 || hash == KEY_CLAIMED {
                return;
            }
            let Some(slot) = e.template.load(RLX).checked_sub(1) else {
                return;
            };
            let Some(s) = slots.get(slot as usize) else {
                return;
            };
            let Some(id) = s.quota_id() else {
                return;
            };
            let net = e.pending.load(SeqCst) as i64;
            if net == 0 {
                return;
            }
            send_pending(&e.pending, &e.unacked, net);
            count_key_held(e, s, net);
            out.push(CollectedDelta::of(slot, id, hash, net));
        });
    }

    /// Standalone: folds every queued key's pending weight into its level
    /// at `now` (see [`crate::table::Books::fold_local`]). The writer lock is held.
    pub(in crate::table) fn fold_keys(&self, now: Nanos) {
        self.drain_dirty(|_, e| {
            e.dirty.fetch_and(!DIRTY_QUEUED, SeqCst);
            let Some(counting) = KeyEntries::of(self).template_counting(e.template.load(RLX))
            else {
                set_key_source(e, 0);
                return;
            };
            let pending = e.pending.load(SeqCst);
            let unacked = e.unacked.load(RLX);
            let known = key_tally(e, &counting, now);
            let weight = pending.wrapping_add(unacked) as i64;
            let template = (e.template.load(RLX).checked_sub(1)).and_then(|t| self.slot(t));
            if let Some(s) = template {
                // In flight was counted as held when it was collected.
                count_key_held(e, s, pending as i64);
            }
            if weight != 0 {
                // As for named counters: own weight folded in, the level is
                // no longer only its root's (see `merge.rs`).
                let flags = template.map_or(0, |s| s.flags.load(RLX));
                set_key_source(e, folded_source(flags));
            }
            store_key_tally(e, &counting, fold_weight(&counting, known, weight, now));
            e.pending.fetch_sub(pending, RLX);
            e.unacked.fetch_sub(unacked, RLX);
        });
    }

    /// Merges a cluster value (in local time) from `source` into the key
    /// `hash` of the template in `slot` if the slot still holds template
    /// `id` (see [`crate::table::Books::merge_counter`]), takes `acked` off unacked and
    /// updates the fill rate. False when this host has no entry for the
    /// key (it is not tracked here; nothing to do).
    pub(in crate::table) fn merge_key(
        &self,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
        value: Tally,
        acked: Acked,
        source: Source,
    ) -> bool {
        let keys = KeyMoves::of(self).key_lock();
        let Some((s, e)) = self.template_key(&keys, slot, id, hash) else {
            return false;
        };
        let counting = Slots::of(self).slot_counting(s);
        let known = key_tally(e, &counting, value.at);
        let old_rate = key_rate(e, &counting);
        let horizon = self.estimator().horizon;
        let known = Known {
            tally: known,
            source: key_source(e),
            rate: old_rate,
        };
        let m = merge(&counting, known, (value, source), acked, horizon);
        if m.taken {
            set_key_source(e, source);
        }
        // A root holds the key now (another host made it there, or this
        // host's share had room again): its count is fleet-wide again.
        e.dirty.fetch_and(!DIRTY_REFUSED, SeqCst);
        // An in-flight key is not extrapolated (see `store_tally`).
        let in_flight = s.flags.load(RLX) & FLAG_IN_FLIGHT != 0;
        store_key_rate(e, &counting, if in_flight { 0.0 } else { m.rate });
        settle_unacked(&e.unacked, acked.net(), || {
            store_key_tally(e, &counting, m.tally)
        });
        true
    }

    /// Folds `amount` of a key's in-flight weight into its level at `now`
    /// (see [`crate::table::Books::fold_unacked`]), if its entry still holds it.
    pub(in crate::table) fn fold_key_unacked(
        &self,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
        amount: i64,
        now: Nanos,
    ) {
        let keys = KeyMoves::of(self).key_lock();
        let Some((s, e)) = self.template_key(&keys, slot, id, hash) else {
            return;
        };
        let counting = Slots::of(self).slot_counting(s);
        let known = key_tally(e, &counting, now);
        // Its own weight is in the level now: no root's value any more
        // (see `merge.rs`).
        set_key_source(e, folded_source(s.flags.load(RLX)));
        settle_unacked(&e.unacked, amount, || {
            store_key_tally(e, &counting, fold_weight(&counting, known, amount, now))
        });
    }

    /// A root made no counter for the key `hash` of the template in
    /// `slot` (see [`crate::table::Books::refuse_key`]): folds `amount`
    /// (signed) of its in-flight weight into its own level at `now`,
    /// marks it refused, and with overflow mode `shared` counts it on the
    /// template's own counter too. False when the key has no entry here.
    pub(in crate::table) fn refuse_key(
        &self,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
        amount: i64,
        now: Nanos,
    ) -> bool {
        let keys = KeyMoves::of(self).key_lock();
        let Some((s, e)) = self.template_key(&keys, slot, id, hash) else {
            return false;
        };
        self.fold_refused(s, e, amount, now);
        e.dirty.fetch_or(DIRTY_REFUSED, SeqCst);
        self.header().keys.place.refused.fetch_add(1, RLX);
        // Net of what the request gave back of the key: a return of
        // weight an earlier refusal put on the template leaves it there.
        self.share_refused(slot, s, amount);
        true
    }

    /// Takes (`requeue`: false) or hands back to pending (true) `amount`
    /// of a key's in-flight weight, if its entry still holds it. Taken
    /// from a key a root refused, it is folded into the key's level at
    /// `now` instead (no root counted it: see [`DIRTY_REFUSED`]), and
    /// what it gives back leaves the template's own counter too with
    /// overflow mode `shared` (where its adds went).
    pub(in crate::table) fn settle_key_unacked(
        &self,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
        amount: i64,
        requeue: bool,
        now: Nanos,
    ) {
        let Some(s) = self.slot(slot).filter(|s| s.quota_id() == Some(id)) else {
            return;
        };
        let _keys = KeyMoves::of(self).key_lock();
        let Some(at) = KeyEntries::of(self).find_key(slot, hash) else {
            return;
        };
        let Some(e) = KeyEntries::of(self).key_at(at) else {
            return;
        };
        if requeue {
            let moved = tally::requeue(&e.pending, &e.unacked, amount);
            count_key_held(e, s, -moved);
            KeyEntries::of(self).mark_dirty(at, e);
        } else if e.dirty.load(SeqCst) & DIRTY_REFUSED != 0 {
            self.fold_refused(s, e, amount, now);
            if amount < 0 {
                self.share_refused(slot, s, amount);
            }
        } else {
            settle_unacked(&e.unacked, amount, || {});
        }
    }

    /// The slot of template `id` at `slot` and the entry of its key
    /// `hash`, while the slot holds the template and the key has an entry
    /// (the key lock held: `_keys`).
    fn template_key(
        &self,
        _keys: &KeyLock,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
    ) -> Option<(&Slot, &KeyEntry)> {
        let s = self.slot(slot).filter(|s| s.quota_id() == Some(id))?;
        let entries = KeyEntries::of(self);
        let e = entries
            .find_key(slot, hash)
            .and_then(|at| entries.key_at(at))?;
        Some((s, e))
    }

    /// Folds `amount` (signed) of the in-flight weight of a key of the
    /// template in `s` into its level at `now`: no root counted it, and
    /// the key keeps its count here (the key lock held).
    fn fold_refused(&self, s: &Slot, e: &KeyEntry, amount: i64, now: Nanos) {
        let counting = Slots::of(self).slot_counting(s);
        let known = key_tally(e, &counting, now);
        // Its own weight is in the level: no root's value any more.
        set_key_source(e, folded_source(s.flags.load(RLX)));
        settle_unacked(&e.unacked, amount, || {
            store_key_tally(e, &counting, fold_weight(&counting, known, amount, now))
        });
    }

    /// With overflow mode `shared`, moves `amount` (signed) of a refused
    /// key's weight onto its template's own counter, which every key
    /// without a counter (here or at the roots) shares fleet-wide: it is
    /// sent to the roots as the template's, whose level every check of a
    /// refused key is held to besides the key's own.
    fn share_refused(&self, slot: SlotId, s: &Slot, amount: i64) {
        if KeyEntries::of(self).key_overflow() == KeyOverflow::Shared {
            s.pending.fetch_add(amount as u64, RLX);
            DirtySlots::of(self).mark(slot);
        }
    }

    /// Hands every key's unacknowledged weight back to pending but what
    /// `keep` keeps of it (see
    /// [`crate::table::Books::requeue_unacked_beyond`]); `ids` gives a
    /// template slot's quota id. Returns the weight moved.
    pub(in crate::table) fn requeue_keys_beyond(
        &self,
        ids: impl Fn(SlotId) -> Option<u64>,
        mut keep: impl FnMut(CounterKey, SlotId, i64) -> i64,
    ) -> u64 {
        let _keys = KeyMoves::of(self).key_lock();
        let mut moved = 0u64;
        for (b, bucket) in self.key_buckets().iter().enumerate() {
            for (way, e) in bucket.ways.iter().enumerate() {
                let unacked = e.unacked.load(RLX) as i64;
                if unacked == 0 {
                    continue;
                }
                let template = e.template.load(RLX).checked_sub(1);
                let slot = template.and_then(|t| self.slot(t));
                let kept = match template.and_then(|t| Some((t, ids(t)?))) {
                    Some((slot, id)) => {
                        let counter = CounterKey {
                            id,
                            key: e.hash.load(RLX),
                        };
                        crate::core::counter::kept_of(keep(counter, slot, unacked), unacked)
                    }
                    None => 0,
                };
                let back = unacked - kept;
                if back != 0 {
                    let back = tally::requeue(&e.pending, &e.unacked, back);
                    if let Some(s) = slot {
                        count_key_held(e, s, -back);
                    }
                    moved = moved.saturating_add(back.unsigned_abs());
                    KeyEntries::of(self).mark_dirty((b * KEY_WAYS + way) as KeyAt, e);
                }
            }
        }
        moved
    }

    /// The held slots of every key of a live per-key in-flight quota that
    /// holds some or that `also` names, by quota id and key hash (see
    /// [`key_held`]): what this host holds of each beyond its next
    /// collection, exactly (what the sync thread sends a root that
    /// restarted again). Reads the whole key section under the key lock:
    /// only when a root restarted.
    pub(in crate::table) fn held_keys(
        &self,
        also: impl Fn(CounterKey) -> bool,
    ) -> Vec<(CounterKey, i64)> {
        let _keys = KeyMoves::of(self).key_lock();
        let mut out = Vec::new();
        for bucket in self.key_buckets() {
            for e in &bucket.ways {
                let held = key_held(e);
                let hash = e.hash.load(RLX);
                if hash == 0 || hash == KEY_CLAIMED {
                    continue;
                }
                let Some(s) = (e.template.load(RLX).checked_sub(1)).and_then(|t| self.slot(t))
                else {
                    continue;
                };
                if s.flags.load(RLX) & FLAG_IN_FLIGHT == 0 {
                    continue;
                }
                let Some(id) = s.quota_id() else {
                    continue;
                };
                let counter = CounterKey { id, key: hash };
                if held != 0 || also(counter) {
                    out.push((counter, held));
                }
            }
        }
        out
    }

    /// The held slots of each of `keys` (a template's slot and the key)
    /// that is a key of a live per-key in-flight quota with an entry here
    /// (see [`key_held`]); the others are left out.
    pub(in crate::table) fn key_held_of(
        &self,
        keys: &[(SlotId, CounterKey)],
    ) -> Vec<(CounterKey, i64)> {
        let lock = KeyMoves::of(self).key_lock();
        keys.iter()
            .filter_map(|&(slot, c)| {
                let (s, e) = self.template_key(&lock, slot, c.id, c.key)?;
                (s.flags.load(RLX) & FLAG_IN_FLIGHT != 0).then(|| (c, key_held(e)))
            })
            .collect()
    }

    /// Frees every key of the template in `slot` (it was deleted). The
    /// writer lock is held.
    pub(in crate::table) fn drop_keys_of(&self, slot: SlotId) {
        let h = self.header();
        let mut lock = KeyMoves::of(self).key_lock();
        for (b, bucket) in self.key_buckets().iter().enumerate() {
            if b % SYNC_BATCH == SYNC_BATCH - 1 {
                lock.relax();
            }
            for e in &bucket.ways {
                let hash = e.hash.load(ACQ);
                if hash != 0 && hash != KEY_CLAIMED && e.template.load(RLX) == slot + 1 {
                    free_entry(e, hash, h);
                }
            }
        }
    }

    /// One step of the maintenance sweep (the sync thread calls it every
    /// cycle): looks at `buckets` buckets, frees entries equal to no entry
    /// (drained, or their template gone), restamps entries whose known
    /// level is older than a day, so packed times never wrap, and clears
    /// the tier marks of keys the tier section no longer holds anything
    /// of. The writer lock is held.
    pub(in crate::table) fn sweep_keys(&self, buckets: usize, now: Nanos) {
        let n = self.geometry().key_buckets as usize;
        if n == 0 {
            return;
        }
        let h = self.header();
        let mut lock = KeyMoves::of(self).key_lock();
        let start = h.keys.place.sweep.load(RLX) as usize % n;
        for i in 0..buckets.min(n) {
            if i % SYNC_BATCH == SYNC_BATCH - 1 {
                lock.relax();
            }
            let bucket = &self.key_buckets()[(start + i) % n];
            for e in &bucket.ways {
                let hash = e.hash.load(ACQ);
                if hash == 0 || hash == KEY_CLAIMED {
                    continue;
                }
                if KeyEntries::of(self).key_drained(e, now) {
                    free_entry(e, hash, h);
                    continue;
                }
                let template = e.template.load(RLX);
                let Some(counting) = KeyEntries::of(self).template_counting(template) else {
                    continue;
                };
                let known = key_tally(e, &counting, now);
                if now.saturating_sub(known.at) >= RESTAMP_AFTER {
                    store_key_tally(e, &counting, counting.aged(known, now));
                }
                if e.dirty.load(RLX) & (DIRTY_TIERS | DIRTY_TIERS_UNSURE) != 0 {
                    // After the key lock (the one place holding both: a
                    // check starting a penalty takes only the tier lock,
                    // and marks without the key lock); briefly, so that
                    // such a check seldom finds it busy.
                    let tiers = TierSection::of(self).tier_lock();
                    if !TierSection::of(self).tiers_hold_key(template - 1, hash) {
                        self.clear_tier_mark(&tiers, e, hash);
                    } else if e.dirty.load(RLX) & DIRTY_TIERS_UNSURE != 0 {
                        // Its maker left it unsure (moved meanwhile):
                        // marked, which is always safe.
                        e.dirty.fetch_or(DIRTY_TIERS, SeqCst);
                        e.dirty.fetch_and(!DIRTY_TIERS_UNSURE, SeqCst);
                    }
                }
            }
        }
        h.keys
            .place
            .sweep
            .store(((start + buckets) % n) as u32, RLX);
    }

    /// Clears the tier mark of `e`, which holds the key `hash` of which
    /// the tier section holds nothing (the key lock and the tier lock
    /// held, so no entry of the key is added meanwhile). The entry is
    /// claimed while its mark is cleared, so that no check retakes it for
    /// another key (whose own mark this would clear); a lookup that misses
    /// it meanwhile looks again, as during a move.
    fn clear_tier_mark(&self, _tiers: &TierLock, e: &KeyEntry, hash: KeyHash) {
        let p = &self.header().keys.place;
        p.moves.fetch_add(1, SeqCst);
        if e.hash
            .compare_exchange(hash, KEY_CLAIMED, SeqCst, RLX)
            .is_ok()
        {
            e.dirty
                .fetch_and(!(DIRTY_TIERS | DIRTY_TIERS_UNSURE), SeqCst);
            e.hash.store(hash, SeqCst);
        }
        p.moves.fetch_add(1, SeqCst);
    }

    /// Copies `old`'s keys into this table (an nginx zone that changed
    /// size): each key of a template this table has (`slot_of` maps the
    /// old template slot to the new one) keeps its level, fill rate and
    /// use, and its unacknowledged weight becomes pending here, to be sent
    /// again. Keys that find no entry are left behind.
    pub(in crate::table) fn adopt_keys(
        &self,
        old: &Region,
        slot_of: impl Fn(SlotId) -> Option<SlotId>,
        now: Nanos,
    ) {
        for bucket in old.key_buckets() {
            for e in &bucket.ways {
                let hash = e.hash.load(ACQ);
                let Some(t) = e.template.load(RLX).checked_sub(1) else {
                    continue;
                };
                if hash == 0 || hash == KEY_CLAIMED {
                    continue;
                }
                let Some(slot) = slot_of(t) else { continue };
                let Ok(at) = Keys::of(self).use_key(slot, hash, now) else {
                    continue;
                };
                let Some(to) = KeyEntries::of(self).key_at(at) else {
                    continue;
                };
                to.known.store(e.known.load(RLX), RLX);
                to.fill.store(e.fill.load(RLX), RLX);
                to.used.store(e.used.load(RLX), RLX);
                to.dirty.fetch_or(e.dirty.load(RLX) & DIRTY_REFUSED, SeqCst);
                set_key_rate_bits(to, e.dirty.load(RLX));
                // What was unacked is pending again here: held no longer
                // counts it.
                if let Some(s) = self.slot(slot) {
                    count_key_held(to, s, -(e.unacked.load(RLX) as i64));
                }
                let unsent = e.pending.load(RLX).wrapping_add(e.unacked.load(RLX));
                if unsent != 0 {
                    to.pending.fetch_add(unsent, SeqCst);
                    KeyEntries::of(self).mark_dirty(at, to);
                }
            }
        }
    }
}

/// A key's *held* slots (see `held.rs`, where a named counter keeps its
/// in a word of its own): for a key of a per-key in-flight quota, this
/// host's net weight that left its `pending`, collected for a sync or
/// folded, less what a stopping or dead sync thread's successor handed
/// back to `pending`. It lives in the 16 bits of the entry's `dirty`
/// word that a sliding key keeps its rate in (an in-flight quota has no
/// window, and its keys keep no rate: see `merge_key`), so it moves with
/// the entry and outlives the sync thread, and the checks never read it.
/// Kept within `0..=`[`MAX_KEY_HELD`](crate::table::region::words::MAX_KEY_HELD)
/// per key. Only the sync thread
/// writes it, under the writer and key locks.
fn key_held(e: &KeyEntry) -> i64 {
    unpack_key_held(e.dirty.load(RLX))
}

/// Adds `net` (signed) to the held slots of the key in `e` if its
/// template (`s`) is an in-flight quota's (see [`key_held`]).
fn count_key_held(e: &KeyEntry, s: &Slot, net: i64) {
    if net != 0 && s.flags.load(RLX) & FLAG_IN_FLIGHT != 0 {
        set_key_rate_bits(e, pack_key_held(key_held(e).saturating_add(net)));
    }
}

/// Frees an entry that held `hash` (unless someone claimed it meanwhile).
fn free_entry(e: &KeyEntry, hash: u64, h: &crate::table::region::layout::Header) {
    if e.hash.compare_exchange(hash, KEY_CLAIMED, ACQ, RLX).is_ok() {
        clear_entry(e);
        e.pending.store(0, RLX);
        e.hash.store(0, REL);
        h.keys.place.live.fetch_sub(1, RLX);
    }
}

#[cfg(test)]
mod ring_tests {
    use super::*;
    use crate::core::Quota;
    use crate::table::region::key_entries::init_entry;
    use crate::table::region::key_entries::KeyEntries;
    use crate::table::region::keys::Keys;
    use crate::table::region::ring::{ring_cell, ring_entry, RING_STUCK_LIMIT};
    use crate::table::Table;
    use crate::table::{CheckItem, CheckOptions, Outcome};
    use std::sync::atomic::Ordering::AcqRel;

    fn count(t: &Table, key: &[u8]) {
        let item = CheckItem {
            name: b"k",
            key: Some(key),
            weight: 1,
            max_wait: None,
        };
        let r = t
            .gate()
            .check_many(&[item], 0, CheckOptions::default(), || 0.5);
        assert_eq!(r.outcome, Outcome::Pass);
    }

    fn collected(t: &Table) -> u64 {
        let mut out = Vec::new();
        t.books().collect_deltas(&mut out);
        out.iter().map(|d| d.delta).sum()
    }

    /// What `count_key` does up to the ring write, for a producer that is
    /// then descheduled: returns the position it reserved.
    fn stall_before_ring_write(t: &Table, at: KeyAt) -> u64 {
        let e = KeyEntries::of(t.region()).key_at(at).unwrap();
        e.pending.fetch_add(1, SeqCst);
        assert_eq!(e.dirty.fetch_or(DIRTY_QUEUED, SeqCst) & DIRTY_QUEUED, 0);
        t.region().header().keys.ring.head.fetch_add(1, AcqRel)
    }

    /// The race CI caught (`concurrent_keyed_checks_and_collection_lose_no_increment`):
    /// a producer descheduled between reserving a ring position and
    /// writing it, skipped by the collector, writes late; a lap later the
    /// collector must not take that write for the entry of the producer
    /// now holding the same cell, or that producer's write lands behind
    /// the tail and its weight is never collected.
    #[test]
    fn a_late_ring_write_is_never_taken_for_a_later_lap() {
        let t = Table::new_heap_with_keys(16, 16, 256);
        t.books()
            .apply_quotas(&[Quota::new(2, "k", 1e9, 1e12, 1e12).keyed()]);
        let len = t.region().key_ring().len() as u64;
        assert_eq!(len, 64);
        let slot = t.gate().lookup(b"k").unwrap();
        count(&t, b"late");
        count(&t, b"next");
        assert_eq!(collected(&t), 2);
        let late = KeyEntries::of(t.region())
            .find_key(slot, t.key_secret().hash(b"late"))
            .unwrap();
        let next = KeyEntries::of(t.region())
            .find_key(slot, t.key_secret().hash(b"next"))
            .unwrap();

        // The late producer reserves a position and stalls; the collector
        // waits RING_STUCK_LIMIT collections, then skips it and scans.
        let p = stall_before_ring_write(&t, late);
        let mut total = 0;
        for _ in 0..RING_STUCK_LIMIT {
            total += collected(&t);
        }
        assert_eq!(total, 1, "the full scan collects the stalled weight");
        assert_eq!(t.region().header().keys.ring.tail.load(ACQ), p + 1);

        // A lap of other entries through the ring.
        while t.region().header().keys.ring.head.load(ACQ) < p + len {
            count(&t, b"busy");
            assert_eq!(collected(&t), 1);
        }
        // The late write lands; another producer reserves the same cell
        // and stalls before writing; a collection runs in between.
        t.region().key_ring()[(p % len) as usize].store(ring_cell(p, late), REL);
        let q = stall_before_ring_write(&t, next);
        assert_eq!(q, p + len);
        assert_eq!(collected(&t), 0);
        t.region().key_ring()[(q % len) as usize].store(ring_cell(q, next), REL);
        assert_eq!(
            collected(&t),
            1,
            "the second producer's weight is collected"
        );
        assert_eq!(
            KeyEntries::of(t.region())
                .key_at(next)
                .unwrap()
                .pending
                .load(SeqCst),
            0
        );
    }

    /// A fresh entry is drained (equal to no entry) until its first count,
    /// so a newcomer may take it between the check that made it and that
    /// check's count. The count must not be lost: the check sees that its
    /// entry holds another key now and takes its weight to where its key
    /// lives, here nowhere: the template's own counter, as an overflow's.
    #[test]
    fn a_count_racing_the_claim_of_its_fresh_entry_is_not_lost() {
        // One bucket: every key competes for it.
        let t = Table::new_heap_with_keys(16, 16, KEY_WAYS as u64);
        t.books()
            .apply_quotas(&[Quota::new(2, "k", 1e9, 1e12, 1e12).keyed()]);
        let slot = t.gate().lookup(b"k").unwrap();
        let secret = t.key_secret();
        // All but one way busy with weight pending: not reusable.
        for k in [b"b0", b"b1", b"b2"] {
            count(&t, k);
            count(&t, k);
        }
        let fresh_hash = secret.hash(b"fresh");
        let fresh = Keys::of(t.region()).use_key(slot, fresh_hash, 0).unwrap();
        // A newcomer claims the fresh entry (drained: the only one) ...
        assert_eq!(KeyEntries::of(t.region()).claim_in(0, 0), Some(fresh));
        // ... the check that made it counts now ...
        Keys::of(t.region()).count_key(fresh, slot, fresh_hash, 5);
        // ... a collection runs before the newcomer's entry is made ...
        let mut out = Vec::new();
        t.books().collect_deltas(&mut out);
        assert_eq!(out.iter().map(|d| d.delta).sum::<u64>(), 6 + 5, "{out:?}");
        assert!(out.iter().any(|d| (d.key, d.delta) == (0, 5)), "{out:?}");
        let newcomer = secret.hash(b"newcomer");
        init_entry(
            KeyEntries::of(t.region()).key_at(fresh).unwrap(),
            slot,
            newcomer,
            0,
            0,
            false,
        );
        // ... and nothing is left behind or collected twice.
        assert_eq!(collected(&t), 0);
        assert_eq!(
            KeyEntries::of(t.region()).find_key(slot, newcomer),
            Some(fresh)
        );
        assert_eq!(t.key_stats().reclaimed, 1);
    }

    #[test]
    fn ring_cells_carry_their_position() {
        let cell = ring_cell(5, 7);
        assert_eq!(ring_entry(cell, 5), Some(7));
        assert_eq!(ring_entry(cell, 5 + (1 << 32)), Some(7));
        assert_eq!(ring_entry(cell, 69), None);
        assert_eq!(ring_entry(0, 0), None);
        assert_eq!(
            ring_entry(ring_cell(u64::MAX, u32::MAX - 1), u64::MAX),
            Some(u32::MAX - 1)
        );
    }
}
