//! In-flight quotas on the request path: taking a slot is a check of
//! weight 1, giving it back a return of 1 (see docs/DESIGN.md,
//! "In-flight quotas"). What a caller keeps between the two is a
//! [`HeldSlot`], and, when it names its process, the number of the hold
//! record that lets the sync thread give the slot back should that
//! process die first (`region/holds.rs`).

use super::check::Checker;
use super::grants::Grants;
use super::local::gate_view;
use super::outcome::{CheckItem, CheckOptions, ManyOutcome, Outcome};
use crate::core::Nanos;
use crate::table::region::holds::{Abandoned, Holds};
use crate::table::region::index::NameIndex;
use crate::table::region::key_entries::KeyEntries;
use crate::table::region::layout::Slot;

gate_view!(
    /// Slots of in-flight quotas taken and given back.
    InFlight
);

/// A slot taken by [`crate::table::Gate::acquire`]: what its release needs besides the
/// item (name and key) it was taken with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldSlot {
    /// When it was taken.
    pub at: Nanos,
    /// The key found no entry and was counted as the overflow mode says
    /// (on the template's own counter for `shared`).
    pub overflowed: bool,
}

impl InFlight<'_> {
    /// Takes a slot of the in-flight quota `item` names (its key's, for a
    /// per-key one): the decision of a check of weight 1, counted on a
    /// pass. Returns the outcome and, on a pass, the [`HeldSlot`] to give
    /// back with [`crate::table::Gate::release`] when the request ends. A dry run
    /// counts nothing and holds nothing. `item.weight` is ignored.
    pub(in crate::table) fn acquire(
        &self,
        item: &CheckItem,
        now: Nanos,
        dry_run: bool,
        draw: impl FnMut() -> f64,
    ) -> (ManyOutcome, Option<HeldSlot>) {
        let one = CheckItem {
            weight: 1,
            max_wait: None,
            ..*item
        };
        let options = CheckOptions {
            dry_run,
            headroom: false,
        };
        let result =
            self.view(Checker::of)
                .check_many(std::slice::from_ref(&one), now, options, draw);
        let held = (result.outcome == Outcome::Pass).then_some(HeldSlot {
            at: now,
            overflowed: result.overflow,
        });
        (result, held)
    }

    /// Gives back the slot `held` that [`crate::table::Gate::acquire`] took for `item`
    /// (the same name and key). Returns true when a counter got it back
    /// (false: the quota, or the key's entry, is gone).
    pub(in crate::table) fn release(&self, item: &CheckItem, held: HeldSlot, now: Nanos) -> bool {
        self.view(Grants::of)
            .give_back(item, 1, held.at, now, held.overflowed)
            > 0
    }

    /// Records that process `owner` holds the slot `held` of `item`
    /// (taken by a passed check). Returns the record's number for
    /// [`InFlight::release_recorded`], or 0 when nothing was recorded
    /// (no owner, the quota is gone, or no record was free).
    pub(in crate::table) fn record(&self, item: &CheckItem, held: HeldSlot, owner: u64) -> u32 {
        if owner == 0 {
            return 0;
        }
        let Some(slot) = NameIndex::of(self).lookup(item.name) else {
            return 0;
        };
        let Some(quota) = self.slot(slot).and_then(Slot::quota_id) else {
            return 0;
        };
        let keys = KeyEntries::of(self);
        let key = match item.key {
            Some(k) if !k.is_empty() && !held.overflowed && keys.is_per_key(slot) => {
                keys.key_secret().hash(k)
            }
            _ => 0,
        };
        let slot_of = Abandoned {
            slot,
            quota,
            key,
            overflowed: held.overflowed,
        };
        Holds::of(self).claim(owner, held.at, slot_of)
    }

    /// [`InFlight::release`] of a slot recorded as record `record` of
    /// `owner` (0: not recorded): the record is freed first, so a process
    /// dying in between leaves the slot held rather than given back
    /// twice.
    pub(in crate::table) fn release_recorded(
        &self,
        item: &CheckItem,
        held: HeldSlot,
        record: u32,
        owner: u64,
        now: Nanos,
    ) -> bool {
        if record != 0 {
            Holds::of(self).free(record, owner);
        }
        self.release(item, held, now)
    }

    /// Gives back a slot a dead process held, as its record names it;
    /// nothing when its slot holds another quota by now.
    pub(in crate::table) fn release_abandoned(&self, slot: Abandoned, now: Nanos) -> bool {
        if self.slot(slot.slot).and_then(Slot::quota_id) != Some(slot.quota) {
            return false;
        }
        let key = (slot.key != 0).then_some(slot.key);
        self.view(Grants::of)
            .give_back_to(slot.slot, key, 1, now, now, slot.overflowed)
            > 0
    }
}
