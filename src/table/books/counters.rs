//! The counters' life outside the request path: collecting local deltas
//! for a sync, merging cluster values back, folding weight locally when
//! no root answers, in-flight weight released or handed back, and taking
//! over the sync of a table whose previous owner died.
//!
//! A counter's `pending` and `unacked` words are signed (two's
//! complement in the `u64` atomic): weight admitted adds to `pending`,
//! weight given back ([`crate::table::Gate::give_back`]) subtracts from it. While the
//! host syncs with roots, a give-back takes back only weight not sent yet
//! (`pending` stays at or above zero); while it counts locally (no roots,
//! or every root down) `pending` may go below zero and the next fold
//! lowers the level by it (see docs/DESIGN.md, "Counters that give units
//! back"). Every move between the two words is ordered so that a check in
//! between errs strict.
//!
//! While the host syncs, a counter whose net change is negative is
//! collected as a return and travels to the roots. A root lowers its
//! counter by it, and its reply's lower value must not lose against the
//! higher one this host merged before: each counter remembers the
//! [`Source`] of its known level (which root's reply it is), and a later
//! reply of the same root replaces it where another root's is max-merged
//! ([`crate::core::Counting::merge_reply`]).

use crate::core::counter::kept_of;
use crate::core::estimate::Acked;
use crate::core::key::KeyHash;
use crate::core::{Counting, Nanos, Tally};
use crate::table::books::key_sync::KeySync;
use crate::table::books::merge::{merge, Known};
use crate::table::books::tally::{
    fold_weight, folded_source, requeue, send_pending, set_slot_source, settle_unacked, signed,
    slot_source, slot_tally, store_tally, CollectedDelta,
};
use crate::table::region::layout::{Slot, Source, FLAG_LIVE};
use crate::table::region::lock::{own_pid, process_alive};
use crate::table::region::ring::DirtySlots;
use crate::table::region::slots::Slots;
use crate::table::region::{read_pause, region_view, SlotId, ACQ, READ_ATTEMPTS, REL, RLX};
use crate::wire::CounterKey;
use std::sync::atomic::{fence, Ordering::SeqCst};

region_view!(
    /// Counters: collected, merged, folded, handed back.
    Counters
);

impl Counters<'_> {
    // ---- counters ---------------------------------------------------------

    /// Moves every live slot's pending weight (and every queued key's) to
    /// in-flight and returns the moved amounts; what a sync sends. A weight
    /// admitted concurrently is either moved now or stays pending for the
    /// next collection, never lost or taken twice.
    pub(in crate::table) fn collect_deltas(&self, out: &mut Vec<CollectedDelta>) {
        self.collect(out, None);
    }

    /// [`crate::table::Books::collect_deltas`], and in the same pass over the slots
    /// `(quota id, checks rejected)` for every live quota that has rejected
    /// a check since the region was made (the counts the metrics show,
    /// never reset): the sync thread sends the roots what grew.
    pub(in crate::table) fn collect_deltas_and_rejections(
        &self,
        out: &mut Vec<CollectedDelta>,
        rejected: &mut Vec<(u64, u64)>,
    ) {
        self.collect(out, Some(rejected));
    }

    /// Collects the slots queued in the dirty ring (every used slot when
    /// it overflowed, or a position in it was skipped), then the keys.
    pub(in crate::table) fn collect(
        &self,
        out: &mut Vec<CollectedDelta>,
        mut rejected: Option<&mut Vec<(u64, u64)>>,
    ) {
        let _guard = self.lock();
        let dirty = DirtySlots::of(self);
        let mut each = |i: SlotId| self.collect_slot(i, out, rejected.as_deref_mut());
        if dirty.ring().drain(&mut each) {
            for i in 0..self.header().next_unused.load(RLX) {
                each(i);
            }
        }
        KeySync::of(self).collect_keys(out);
    }

    /// Collects one slot's pending weight (and its rejection count): its
    /// queued flag cleared first, so that a check changing it after the
    /// read queues it again; what a check added between the read and the
    /// move stays pending, queued again here.
    fn collect_slot(
        &self,
        i: SlotId,
        out: &mut Vec<CollectedDelta>,
        rejected: Option<&mut Vec<(u64, u64)>>,
    ) {
        let Some(s) = self.slot(i) else { return };
        let dirty = DirtySlots::of(self);
        dirty.unmark(i);
        let net = signed(&s.pending);
        let rejections = rejected.as_ref().map_or(0, |_| s.rejected.load(SeqCst));
        if (net == 0 && rejections == 0) || s.flags.load(RLX) & FLAG_LIVE == 0 {
            return;
        }
        let id = s.id.load(RLX);
        if rejections != 0 {
            if let Some(rejected) = rejected {
                rejected.push((id, rejections));
            }
        }
        // A return is collected even while every root is down, as an
        // add is: the fold lowers the level here (the sync thread hands
        // unacknowledged weight back first), and it stays owed to the
        // roots, which hold the adds it cancels.
        if net == 0 {
            return;
        }
        send_pending(&s.pending, &s.unacked, net);
        Slots::of(self).count_held(i, s, net);
        out.push(CollectedDelta::of(i, id, 0, net));
        fence(SeqCst);
        if s.pending.load(RLX) != 0 {
            dirty.mark(i);
        }
    }

    /// True when some live quota's weight admitted here and not collected
    /// yet (`pending`) has reached `fraction` of its burst band
    /// (`high_burst - low_burst`; with no band, any weight): the sync
    /// thread's early-sync probe. It reads the slots queued in the dirty
    /// ring (every used slot only when the ring overflowed).
    pub(in crate::table) fn unsent_beyond(&self, fraction: f64) -> bool {
        let beyond = |s: &Slot| {
            let pending = s.pending.load(RLX) as i64;
            if pending <= 0 || s.flags.load(RLX) & FLAG_LIVE == 0 {
                return false;
            }
            let band =
                f64::from_bits(s.high_burst.load(RLX)) - f64::from_bits(s.low_burst.load(RLX));
            pending as f64 >= fraction * band
        };
        let mut found = false;
        let whole = DirtySlots::of(self).ring().peek(|i| {
            found = found || self.slot(i).is_some_and(beyond);
        });
        if found || whole {
            return found;
        }
        let used = self.header().next_unused.load(ACQ) as usize;
        self.slots()[..used].iter().any(beyond)
    }

    /// Merges a cluster counter value (already in local time) from root
    /// `source` into the slot if it still holds quota `id` (or into its
    /// key `key`, when not 0): it replaces the known level if that is the
    /// same root's earlier value, else the larger counts. Takes `acked`
    /// weight (its net: added less given back) off in-flight (the value
    /// includes it), and updates the others' fill rate: what the value
    /// holds beyond this host's weight, its returns stopped at zero as the
    /// root stops them. Returns false if the slot holds another quota now
    /// (or this host has no entry for the key).
    pub(in crate::table) fn merge_counter(
        &self,
        slot: SlotId,
        id: u64,
        key: KeyHash,
        value: Tally,
        acked: Acked,
        source: Source,
    ) -> bool {
        if !value.is_valid() {
            return false;
        }
        self.on_counter(
            slot,
            id,
            key,
            |keys| keys.merge_key(slot, id, key, value, acked, source),
            |s| self.merge_slot(s, value, acked, source),
        )
        .unwrap_or(false)
    }

    /// [`Counters::merge_counter`] for a named counter: `s` holds the quota.
    fn merge_slot(&self, s: &Slot, value: Tally, acked: Acked, source: Source) -> bool {
        let counting = Slots::of(self).slot_counting(s);
        let (known, old_rate) = slot_tally(s);
        let horizon = self.estimator().horizon;
        let known = Known {
            tally: known,
            source: slot_source(s),
            rate: old_rate,
        };
        let m = merge(&counting, known, (value, source), acked, horizon);
        if m.taken {
            set_slot_source(s, source);
        }
        settle_unacked(&s.unacked, acked.net(), || store_tally(s, m.tally, m.rate));
        true
    }

    /// Standalone mode (no roots): folds every pending and in-flight weight
    /// into the slot's own level at `now`, acting as this host's root.
    pub(in crate::table) fn fold_local(&self, now: Nanos) {
        let _guard = self.lock();
        for (i, s) in self.used_slots() {
            if s.flags.load(RLX) & FLAG_LIVE == 0 {
                continue;
            }
            let pending = s.pending.load(ACQ);
            let unacked = s.unacked.load(ACQ);
            let counting = Slots::of(self).slot_counting(s);
            let (known, rate) = slot_tally(s);
            let weight = pending.wrapping_add(unacked) as i64;
            // In flight was counted as held when it was collected.
            Slots::of(self).count_held(i, s, pending as i64);
            if weight != 0 {
                // The level is no longer only that root's: its later, lower
                // value must not replace this host's own weight.
                set_slot_source(s, folded_source(s.flags.load(RLX)));
            }
            store_tally(s, fold_weight(&counting, known, weight, now), rate);
            // Weight admitted since the read stays pending: queued, as
            // its check saw it added to weight not collected yet.
            if s.pending.fetch_sub(pending, RLX) != pending {
                DirtySlots::of(self).mark(i);
            }
            s.unacked.fetch_sub(unacked, RLX);
        }
        KeySync::of(self).fold_keys(now);
    }

    /// Folds `amount` of one counter's in-flight weight into its own level
    /// at `now`, as [`crate::table::Books::fold_local`] does for every counter: the
    /// roots of this counter's group (shard) are all unreachable, so this
    /// host counts it alone while the other shards stay fleet-wide.
    /// Ignored if the slot holds another quota now (or the key has no
    /// entry here).
    pub(in crate::table) fn fold_unacked(
        &self,
        slot: SlotId,
        id: u64,
        key: KeyHash,
        amount: i64,
        now: Nanos,
    ) {
        self.on_counter(
            slot,
            id,
            key,
            |keys| keys.fold_key_unacked(slot, id, key, amount, now),
            |s| {
                let counting = Slots::of(self).slot_counting(s);
                let (known, rate) = slot_tally(s);
                // Its own weight is in the level now: no root's value any more.
                set_slot_source(s, folded_source(s.flags.load(RLX)));
                settle_unacked(&s.unacked, amount, || {
                    store_tally(s, fold_weight(&counting, known, amount, now), rate)
                });
            },
        );
    }

    /// Under the writer's lock, `on_key` for a key of the template in
    /// `slot` (`key` not 0), else `on_slot` with the slot when it still
    /// holds quota `id`; None when it does not (or there is no such slot).
    fn on_counter<R>(
        &self,
        slot: SlotId,
        id: u64,
        key: KeyHash,
        on_key: impl FnOnce(KeySync<'_>) -> R,
        on_slot: impl FnOnce(&Slot) -> R,
    ) -> Option<R> {
        let s = self.slot(slot)?;
        let _guard = self.lock();
        if key != 0 {
            Some(on_key(KeySync::of(self)))
        } else {
            (s.quota_id() == Some(id)).then(|| on_slot(s))
        }
    }

    /// Says whether this host counts locally now (no roots, or every root
    /// down: the sync thread folds weight into the levels itself), for
    /// every process sharing the region: weight given back then lowers the
    /// levels ([`crate::table::Gate::give_back`]).
    pub(in crate::table) fn set_counting_locally(&self, local: bool) {
        self.header().counting_locally.store(u32::from(local), REL);
    }

    /// True while this host counts locally (see
    /// [`crate::table::Books::set_counting_locally`]).
    pub(in crate::table) fn counting_locally(&self) -> bool {
        self.header().counting_locally.load(ACQ) != 0
    }

    /// One step of the key section's upkeep (the sync thread calls it
    /// every cycle): looks at `buckets` key buckets, dropping keys of
    /// deleted templates and restamping old levels (see `keys.rs`).
    pub(in crate::table) fn maintain_keys(&self, buckets: usize, now: Nanos) {
        let _guard = self.lock();
        KeySync::of(self).sweep_keys(buckets, now);
    }

    /// How the quota in `slot` counts, if the slot still holds quota `id`.
    /// The sync thread keeps deltas it still owes a root by it.
    pub(in crate::table) fn counter_counting(&self, slot: SlotId, id: u64) -> Option<Counting> {
        let s = self.slot(slot)?;
        for attempt in 0..READ_ATTEMPTS {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let live = s.quota_id() == Some(id);
                let counting = Slots::of(self).slot_counting(s);
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    return live.then_some(counting);
                }
            }
            read_pause(attempt);
        }
        None
    }

    /// Takes `amount` off a slot's in-flight weight without a counter value:
    /// a root acknowledged the delta but sent no value for it (it does not
    /// know the quota). A key a root refused folds it into its level at
    /// `now` instead. Ignored if the slot holds another quota now.
    pub(in crate::table) fn release_unacked(
        &self,
        slot: SlotId,
        id: u64,
        key: KeyHash,
        amount: i64,
        now: Nanos,
    ) {
        self.on_counter(
            slot,
            id,
            key,
            |keys| keys.settle_key_unacked(slot, id, key, amount, false, now),
            |s| settle_unacked(&s.unacked, amount, || {}),
        );
    }

    /// A root made no counter for the key `key` of the template in `slot`
    /// (see [`crate::table::Books::refuse_key`]); false when the key has
    /// no entry here (or the slot holds another quota now).
    pub(in crate::table) fn refuse_key(
        &self,
        slot: SlotId,
        id: u64,
        key: KeyHash,
        amount: i64,
        now: Nanos,
    ) -> bool {
        let _guard = self.lock();
        KeySync::of(self).refuse_key(slot, id, key, amount, now)
    }

    /// Puts `amount` of a slot's in-flight weight back into pending: a sync
    /// thread that stops with deltas no root acknowledged hands them to the
    /// next one. Ignored if the slot holds another quota now.
    pub(in crate::table) fn requeue_unacked(
        &self,
        slot: SlotId,
        id: u64,
        key: KeyHash,
        amount: i64,
    ) {
        self.on_counter(
            slot,
            id,
            key,
            |keys| keys.settle_key_unacked(slot, id, key, amount, true, 0),
            |s| {
                let moved = requeue(&s.pending, &s.unacked, amount);
                Slots::of(self).count_held(slot, s, -moved);
                DirtySlots::of(self).mark(slot);
            },
        );
    }

    /// Makes this process the table's sync owner (a sync thread starts).
    /// Returns the previous owner's process id when that process is gone:
    /// it died mid-sync (a crashed nginx worker), and its weight is the
    /// new thread's to send (see `handover.rs`).
    pub(in crate::table) fn claim_sync(&self) -> Option<u32> {
        // The new sync thread's first collection reads every slot: its
        // rejection counts start from every quota's, not only the queued
        // ones'.
        DirtySlots::of(self).ring().scan_next();
        let me = own_pid();
        let previous = self.header().sync_owner.swap(me, ACQ);
        (previous != 0 && previous != me && !process_alive(previous)).then_some(previous)
    }

    /// Hands every counter's unacknowledged weight back to pending but
    /// what `keep` says to keep of it (given the counter and its weight;
    /// clamped to that weight), as the new sync thread's own unacked
    /// weight. Returns the weight handed back (adds and returns alike).
    pub(in crate::table) fn requeue_unacked_beyond(
        &self,
        mut keep: impl FnMut(CounterKey, SlotId, i64) -> i64,
    ) -> u64 {
        let _guard = self.lock();
        let mut requeued = 0u64;
        for (i, s) in self.used_slots() {
            let unacked = signed(&s.unacked);
            let Some(id) = s.quota_id().filter(|_| unacked != 0) else {
                continue;
            };
            let moved = unacked - kept_of(keep(CounterKey::named(id), i, unacked), unacked);
            if moved != 0 {
                let moved = requeue(&s.pending, &s.unacked, moved);
                Slots::of(self).count_held(i, s, -moved);
                DirtySlots::of(self).mark(i);
                requeued = requeued.saturating_add(moved.unsigned_abs());
            }
        }
        let ids = |slot: SlotId| self.slot(slot).and_then(|s| s.quota_id());
        requeued.saturating_add(KeySync::of(self).requeue_keys_beyond(ids, keep))
    }
}
