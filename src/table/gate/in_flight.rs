//! In-flight quotas on the request path: taking a slot is a check of
//! weight 1, giving it back a return of 1 (see docs/DESIGN.md,
//! "In-flight quotas"). What a caller keeps between the two is a
//! [`HeldSlot`].

use super::check::Checker;
use super::grants::Grants;
use super::local::gate_view;
use super::outcome::{CheckItem, CheckOptions, ManyOutcome, Outcome};
use crate::core::Nanos;

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
}
