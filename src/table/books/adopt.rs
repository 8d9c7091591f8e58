//! Adopting another table's contents: an nginx zone that changed size
//! takes over the quotas, counters, keys, held slots and what the sync
//! thread remembered of the roots from the zone it replaces.

use crate::core::{Nanos, Quota};
use crate::table::books::key_sync::KeySync;
use crate::table::books::tally::{set_slot_source, slot_source};
use crate::table::books::write::{ApplyReport, Writer};
use crate::table::region::listing::Listing;
use crate::table::region::lock::SeqWrite;
use crate::table::region::ring::DirtySlots;
use crate::table::region::slots::Slots;
use crate::table::region::{region_view, Region, SlotId, RLX};
use std::collections::HashMap;

region_view!(
    /// Adoption of another table's contents.
    Adopt
);

impl Adopt<'_> {
    /// Takes over everything `old` holds (an nginx zone that changed
    /// size): its quotas with their ids and epochs, each counter's cluster
    /// level, time and fill rate, and the weight admitted but not yet
    /// acknowledged by a root, which becomes pending here so it is sent
    /// again, and what the sync thread remembered of the roots (the
    /// status block's per-root instance words). Quotas that do not fit are refused as in
    /// [`crate::table::Books::apply_quotas`].
    pub(in crate::table) fn adopt(&self, old: &Region, now: Nanos) -> ApplyReport {
        self.set_estimator(old.estimator());
        let states = Listing::of(old).quotas(0);
        let quotas: Vec<Quota> = states.iter().map(|s| s.quota.clone()).collect();
        let report = Writer::of(self).apply_quotas(&quotas);
        let slots = Slots::of(self).slot_ids();
        let guard = self.lock();
        for state in &states {
            let (Some(&slot), Some(from)) = (slots.get(&state.quota.id), old.slot(state.slot))
            else {
                continue;
            };
            let to = &self.slots()[slot as usize];
            let w = SeqWrite::begin(to);
            to.known_level.store(from.known_level.load(RLX), RLX);
            to.known_at.store(from.known_at.load(RLX), RLX);
            to.fill_rate.store(from.fill_rate.load(RLX), RLX);
            // The level is still that root's: its replies replace it as
            // before (max-merged, an in-flight level would never come
            // down).
            set_slot_source(to, slot_source(from));
            drop(w);
            to.pending
                .store(state.pending.wrapping_add(state.unacked) as u64, RLX);
            // What was unacked is pending again here: held no longer
            // counts it (see `held.rs`).
            Slots::of(self).set_held(
                slot,
                Slots::of(old)
                    .held_word(state.slot)
                    .wrapping_sub(state.unacked),
            );
            to.passed.store(state.passed, RLX);
            to.rejected.store(state.rejected, RLX);
            to.dry_run.store(state.dry_run, RLX);
            // Collected from the ring like weight a check added.
            DirtySlots::of(self).mark(slot);
        }
        let old_ids: HashMap<SlotId, u64> = states.iter().map(|s| (s.slot, s.quota.id)).collect();
        KeySync::of(self).adopt_keys(
            old,
            |old_slot| slots.get(old_ids.get(&old_slot)?).copied(),
            now,
        );
        // The status block takes the writer lock itself.
        drop(guard);
        self.adopt_remembered_roots(old);
        report
    }
}
