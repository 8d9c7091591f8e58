//! What this host holds of its in-flight quotas, and the local lease
//! that falls back to it when every root has been silent too long (see
//! docs/DESIGN.md, "In-flight quotas", failure rules).
//!
//! A counter's *held* word is this host's own net weight that has left
//! `pending`: collected for a sync, or folded into the level locally,
//! minus what a stopping sync thread handed back to `pending`. With
//! `pending` it is the slots this host holds. It lives in the region
//! (the held section, one word per slot) so that it outlives the sync
//! thread: an nginx reload starts a new one while the old workers'
//! requests still give their slots back. Only the sync thread writes it,
//! under the writer lock. The keys of per-key in-flight quotas keep
//! theirs in their entries (`key_sync.rs`, `key_held`).
//!
//! The quotas this walks are found through the header's list of named
//! in-flight slots ([`InFlightList`]), which quota writes keep: a table
//! without in-flight quotas pays nothing each cycle, one with a few pays
//! for those; past [`IN_FLIGHT_LISTED`] of them every slot is walked.

use super::tally::{set_slot_source, slot_source, store_level};
use crate::core::Nanos;
use crate::table::region::index::NameIndex;
use crate::table::region::layout::{
    InFlightList, Slot, Source, FLAG_IN_FLIGHT, FLAG_LIVE, FLAG_PER_KEY, FOLDED, IN_FLIGHT_LISTED,
};
use crate::table::region::slots::Slots;
use crate::table::region::{region_view, SlotId, ACQ, REL, RLX};
use crate::wire::CounterKey;

region_view!(
    /// What this host holds of its in-flight quotas.
    Held
);

impl Held<'_> {
    /// The slots this host holds of the named in-flight quota `name`:
    /// what its requests took and have not given back yet, whatever the
    /// roots know of it. `None` for a name that is not a live in-flight
    /// quota's own counter (a per-key template's slots are its keys').
    pub(in crate::table) fn held_here(&self, name: &[u8]) -> Option<i64> {
        let slot = NameIndex::of(self).lookup(name)?;
        let s = self.slot(slot)?;
        live_named_in_flight(s.flags.load(RLX)).then(|| {
            Slots::of(self)
                .held_word(slot)
                .wrapping_add(s.pending.load(RLX) as i64)
        })
    }

    /// The held word of every live named in-flight quota, by quota id
    /// (what the sync thread sends a root that restarted again).
    pub(in crate::table) fn held_counts(&self) -> Vec<(u64, i64)> {
        self.in_flight_slots()
            .into_iter()
            .filter_map(|(i, s)| Some((s.quota_id()?, Slots::of(self).held_word(i))))
            .collect()
    }

    /// A root restarted a while ago and every host has since sent it the
    /// slots it held there (see `SyncEngine::finish`): each named
    /// in-flight level known from its earlier instances (a source for
    /// which `earlier` is true) is marked as the new instance's (`to`),
    /// level unchanged, so that instance's next reply replaces it, lower
    /// or not. Max-merged, a level that never leaks would keep an earlier
    /// instance's value against every lower one. Levels with no source
    /// or [`FOLDED`] are left as they are. Returns the counters marked.
    pub(in crate::table) fn adopt_source(
        &self,
        earlier: impl Fn(Source) -> bool,
        to: Source,
    ) -> u64 {
        if to == 0 {
            return 0;
        }
        let _guard = self.lock();
        let mut set = 0u64;
        for (_, s) in self.in_flight_slots() {
            let from = slot_source(s);
            if from == 0 || from == FOLDED || !earlier(from) {
                continue;
            }
            set_slot_source(s, to);
            set += 1;
        }
        set
    }

    /// The local lease: every root has been silent for the in-flight
    /// lease, so each of them has dropped this host's slots, and this
    /// host drops the other hosts' in turn. Sets every in-flight
    /// counter's level to this host's own slots (its held word; the
    /// caller has folded what was unacked), so from now on it limits
    /// against its own slots only, per host, as the other kinds do with
    /// every root down. The level is marked [`FOLDED`]: the next reply of
    /// any root replaces it. Only counters `shard` takes (with root
    /// groups, those of the groups that are silent). Returns the counters
    /// set.
    pub(in crate::table) fn lease_locally(
        &self,
        now: Nanos,
        shard: impl Fn(CounterKey) -> bool,
    ) -> u64 {
        let _guard = self.lock();
        let mut set = 0u64;
        // A key's slots are not kept per host yet: its level stays the
        // last cluster view plus this host's changes (strict).
        for (i, s) in self.in_flight_slots() {
            if !s.quota_id().is_some_and(|id| shard(CounterKey::named(id))) {
                continue;
            }
            let own = Slots::of(self).held_word(i).max(0) as f64;
            set_slot_source(s, FOLDED);
            store_level(s, own, now);
            set += 1;
        }
        set
    }

    /// True when some live named quota counts slots in flight (the sync
    /// thread then asks the roots for all their counters after a fold).
    pub(in crate::table) fn holds_in_flight(&self) -> bool {
        self.header().in_flight.count.load(ACQ) != 0
    }

    /// A root (`source`) answered whole a request for all its counters,
    /// sent after a fold; `omitted` says which counters its reply left
    /// out. A root sends every counter that is not empty, so it holds
    /// nothing of those: not even slots this host folded in (it dropped
    /// them by its lease, and the returns sent since went to them). An
    /// in-flight counter among them whose level is [`FOLDED`] or that
    /// root's own takes that root's 0, at `now`: left as it is it would
    /// never come down (an in-flight level does not leak, and only a
    /// reply carrying the counter would replace it). One whose level is
    /// another root's keeps it (a max-merge with 0). Returns the counters
    /// set.
    pub(in crate::table) fn settle_omitted(
        &self,
        source: Source,
        now: Nanos,
        omitted: impl Fn(CounterKey) -> bool,
    ) -> u64 {
        let _guard = self.lock();
        let mut set = 0u64;
        for (_, s) in self.in_flight_slots() {
            let known = slot_source(s);
            if known != FOLDED && (source == 0 || known != source) {
                continue;
            }
            let Some(id) = s.quota_id() else { continue };
            if !omitted(CounterKey::named(id)) {
                continue;
            }
            set_slot_source(s, source);
            store_level(s, 0.0, now);
            set += 1;
        }
        set
    }
}

impl Held<'_> {
    /// The live named in-flight quotas' slots: the listed ones, or with
    /// more than the list holds, every used slot's that is one.
    fn in_flight_slots(&self) -> Vec<(SlotId, &Slot)> {
        let list = &self.header().in_flight;
        let count = list.count.load(ACQ) as usize;
        if count > IN_FLIGHT_LISTED {
            #[cfg(test)]
            WALKS.with(|n| n.set(n.get() + 1));
            return self
                .used_slots()
                .filter(|(_, s)| live_named_in_flight(s.flags.load(RLX)))
                .collect();
        }
        let mut out: Vec<(SlotId, &Slot)> = list.slots[..count]
            .iter()
            .filter_map(|w| {
                let slot = w.load(RLX).checked_sub(1)?;
                let s = self.slot(slot)?;
                live_named_in_flight(s.flags.load(RLX)).then_some((slot, s))
            })
            .collect();
        // A write moving a slot within the list shows it twice meanwhile.
        out.sort_unstable_by_key(|&(slot, _)| slot);
        out.dedup_by_key(|&mut (slot, _)| slot);
        out
    }

    /// Keeps the list of named in-flight quotas ([`InFlightList`]) true
    /// after a quota write took `slot`'s flags from `was` to `is` (the
    /// writer lock held).
    pub(in crate::table) fn note_flags(&self, slot: SlotId, was: u16, is: u16) {
        let (before, after) = (live_named_in_flight(was), live_named_in_flight(is));
        if before == after {
            return;
        }
        let list = &self.header().in_flight;
        let count = list.count.load(RLX) as usize;
        if after {
            if let Some(w) = list.slots.get(count) {
                w.store(slot + 1, RLX);
            }
            list.count.store(count as u32 + 1, REL);
            return;
        }
        let count = count.saturating_sub(1);
        if count == IN_FLIGHT_LISTED {
            // Back within the list: made again while readers still walk.
            self.relist(list);
        } else if count < IN_FLIGHT_LISTED {
            // The last listed slot takes the leaving one's word.
            let last = list.slots[count].load(RLX);
            if let Some(w) = list.slots[..count].iter().find(|w| w.load(RLX) == slot + 1) {
                w.store(last, RLX);
            }
        }
        list.count.store(count as u32, REL);
    }

    /// Lists every live named in-flight quota (their flags written).
    fn relist(&self, list: &InFlightList) {
        let listed = self
            .used_slots()
            .filter(|(_, s)| live_named_in_flight(s.flags.load(RLX)));
        for (w, (slot, _)) in list.slots.iter().zip(listed) {
            w.store(slot + 1, RLX);
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Walks of every slot for named in-flight quotas on this thread
    /// (tests: a table with few or none does not walk).
    pub(in crate::table) static WALKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A slot's `flags` say it is an in-flight quota's own counter (not a
/// per-key template's, whose slots are its keys').
fn named_in_flight(flags: u16) -> bool {
    flags & FLAG_IN_FLIGHT != 0 && flags & FLAG_PER_KEY == 0
}

/// [`named_in_flight`], and live.
fn live_named_in_flight(flags: u16) -> bool {
    flags & FLAG_LIVE != 0 && named_in_flight(flags)
}
