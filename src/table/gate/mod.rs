//! The request face: what nginx, the C ABI, the simulator and every
//! other caller on the request path may ask of a table, and nothing
//! else. A [`Gate`] decides and counts checks (plain, several at once,
//! paced), partial grants, charges after the response and their
//! settling, weight given back, and the slots of in-flight quotas. It
//! takes no lock but the key lock's bounded wait (docs/DESIGN.md,
//! "Failure rules").
//!
//! # Layout
//!
//! From the bottom up; a file uses only files listed before it.
//!
//! - `local.rs` — what a process keeps beside the region for its checks
//!   (name hints, whether passes are counted) and the shape of this
//!   face's views.
//! - `outcome.rs` — what a check is given and answers (items, options,
//!   outcome, rejection, headroom, the charge of a pass).
//! - `chain.rs` — a check's chain of quota views and what it decides
//!   with them.
//! - `penalties.rs` — overrides and penalties applied to a chain, and
//!   penalties started by a rejection.
//! - `read.rs` — reading a check item's chain: a name through its hint or
//!   the index, a key's counter in place of its template's, ancestors.
//! - `count.rs` — counting a decision: a pass's weight and the pass, or
//!   a rejection.
//! - `fast.rs` — the fast paths: a single named or keyed check far from
//!   its limit, decided and counted without a chain.
//! - `check.rs` — the one decide-and-count path of plain and paced
//!   checks, of one item or several.
//! - `grants.rs` — partial grants, reservations, weight given back,
//!   charges after the response and the settling of an estimate.
//! - `in_flight.rs` — a slot of an in-flight quota taken (a check of
//!   weight 1) and given back.
//! - `mod.rs` — [`Gate`], the face, which only hands each call to the
//!   file that owns it.

mod chain;
mod check;
mod count;
#[cfg(test)]
pub(in crate::table) mod fast;
#[cfg(not(test))]
mod fast;
mod grants;
mod in_flight;
pub(in crate::table) mod local;
pub(in crate::table) mod outcome;
mod penalties;
mod read;

use check::Checker;
use grants::Grants;
use in_flight::InFlight;
use read::Reader;

pub use grants::{Grant, Reservation};
pub use in_flight::HeldSlot;
pub use outcome::{
    Cause, CheckItem, CheckOptions, Headroom, ManyOutcome, Outcome, Rejection, MAX_CHECKS,
};

use crate::core::Nanos;
use crate::table::region::{Region, SlotId};
use local::Local;

/// The request face of a table: its checks, grants, charges and
/// in-flight slots (see the module doc). Made by `Table::gate`; it
/// borrows the table and costs nothing to make.
#[derive(Clone, Copy)]
pub struct Gate<'t> {
    region: &'t Region,
    local: &'t Local,
}

impl<'t> Gate<'t> {
    /// The face of `region`, with this process's `local` state.
    pub(in crate::table) fn of(region: &'t Region, local: &'t Local) -> Self {
        Gate { region, local }
    }

    /// The file that owns a call, as its view.
    #[inline(always)]
    fn view<V>(&self, of: fn(&'t Region, &'t Local) -> V) -> V {
        of(self.region, self.local)
    }

    /// Checks `name` for a request of `weight` at `now`, drawing from this
    /// thread's PRNG; on pass the weight is counted in the whole chain.
    pub fn check(&self, name: &[u8], weight: u64, now: Nanos) -> Outcome {
        self.view(Checker::of).check(name, weight, now)
    }

    /// [`Gate::check`] with the random draws supplied (for tests and the
    /// simulator).
    pub fn check_with(
        &self,
        name: &[u8],
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        self.view(Checker::of).check_with(name, weight, now, draw)
    }

    /// Checks several quotas for one request (several `sluice` directives
    /// in one nginx location): the request passes only if every known quota
    /// and all their ancestors pass, and only then is each weight counted
    /// (check all, then commit). Unknown names are skipped. At most
    /// [`MAX_CHECKS`] items are checked; later ones are ignored.
    // Inlined: a single check's fast path runs in the caller's body (see
    // `check.rs`, `Checker::check_many`).
    #[inline(always)]
    pub fn check_many(
        &self,
        items: &[CheckItem],
        now: Nanos,
        options: CheckOptions,
        draw: impl FnMut() -> f64,
    ) -> ManyOutcome {
        self.view(Checker::of).check_many(items, now, options, draw)
    }

    /// Checks the quota in slot `first`, found without a name lookup (a
    /// caller that kept the slot; the benchmarks measure the lookup apart
    /// with it). A slot that holds no quota passes as an unknown name.
    pub fn check_slot(
        &self,
        first: SlotId,
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        self.view(Checker::of).check_slot(first, weight, now, draw)
    }

    /// A partial grant: counts and returns the most units, up to
    /// `item.weight`, that the quota (or key) and all its ancestors allow
    /// with certainty now ([`crate::core::grantable`]). Granting nothing
    /// (asking for nothing, too) is a rejection (counted as one, with
    /// nothing added); an unknown
    /// name or a keyless check of a per-key quota grant nothing and say
    /// so.
    pub fn obtain(&self, item: &CheckItem, now: Nanos) -> Grant {
        self.view(Grants::of).obtain(item, now)
    }

    /// Pacing: counts `item.weight` now and says how long the caller must
    /// wait before acting so that the quota (or key) and its ancestors
    /// stay at their rates fleet-wide ([`crate::core::reserve_wait`]):
    /// GCRA's theoretical arrival time on the estimated cluster level.
    /// When the wait would exceed `max_wait` nanoseconds, or cannot end
    /// (a weight above a `high_burst`; a full window quota, whose next
    /// window cannot be taken in advance), nothing is counted and the
    /// rejection says how long it would have been.
    /// (The one-item case of [`Gate::check_many`] with `max_wait`, on its
    /// own path as [`Gate::obtain`] is: the general path's bookkeeping
    /// for several items cost a reservation a fifth of its time.)
    pub fn reserve(&self, item: &CheckItem, max_wait: Nanos, now: Nanos) -> Reservation {
        self.view(Grants::of).reserve(item, max_wait, now)
    }

    /// Counts `item.weight` on the quota (or key) and every ancestor
    /// without deciding anything: a charge after the response, when the
    /// cost is known only once the request is done and there is nothing
    /// left to reject. It counts in full even when that takes a quota
    /// past its `high_burst` (a debt): the level rises, and later checks
    /// are rejected until it has drained. A per-key quota's key gets an
    /// entry as a check's would; one that finds none is counted as the
    /// overflow mode counts a passed check (`shared`: on the template's
    /// counter; `pass` and `reject`: nowhere, `KeyOverflow`). An unknown
    /// name or a keyless charge of a per-key quota count nothing and say
    /// so. Neither a pass nor a rejection is counted: a charge is not a
    /// check. An in-flight quota counts slots held, not costs: a charge
    /// of one would hold slots that nothing gives back, so it counts
    /// nothing and answers `Unknown`.
    pub fn charge(&self, item: &CheckItem, now: Nanos) -> Grant {
        self.view(Grants::of).charge(item, now)
    }

    /// Settles an estimate: a passed check of `estimate` units at
    /// `charged_at` is to cost `item.weight` in the end. The difference
    /// above the estimate is charged ([`Gate::charge`]: counted
    /// whatever the level); one below it is given back
    /// ([`Gate::give_back`]: uncounted if not sent yet, else a return
    /// to the roots, never below zero, nothing to a window that ended).
    /// `granted` is what was added (0 when units were given back). An
    /// in-flight quota is not settled (`Unknown`, as [`Gate::charge`]):
    /// units given back would free slots still held.
    pub fn settle(&self, item: &CheckItem, estimate: u64, charged_at: Nanos, now: Nanos) -> Grant {
        self.view(Grants::of)
            .settle(item, estimate, charged_at, now)
    }

    /// Gives `units` back to the counters a passed check of `item` counted
    /// at `charged_at`: its quota's, or, for a per-key quota, its key's
    /// (the template's own when the key was an overflow, `overflowed`),
    /// and every ancestor's. A held request whose client left before its
    /// turn gives its weight back so.
    ///
    /// What was not collected for a sync yet is simply uncounted, as if
    /// never admitted. Weight already sent is given back to the roots
    /// with the next sync (a return, which a root lowers its counter by:
    /// see docs/DESIGN.md, "Counters that give units back"); while the
    /// host counts locally (no roots, or every root down) the next fold
    /// lowers the level by it instead. A window
    /// counter whose window changed since `charged_at` gets nothing back
    /// (the return would lower a later window); a key with no entry any
    /// more (it drained meanwhile: nothing to give back) or a quota
    /// deleted meanwhile gets nothing. Returns the units given back to the
    /// first counter (the quota's or the key's).
    pub fn give_back(
        &self,
        item: &CheckItem,
        units: u64,
        charged_at: Nanos,
        now: Nanos,
        overflowed: bool,
    ) -> u64 {
        self.view(Grants::of)
            .give_back(item, units, charged_at, now, overflowed)
    }

    /// Takes a slot of the in-flight quota `item` names (its key's, for a
    /// per-key one): the decision of a check of weight 1, counted on a
    /// pass. Returns the outcome and, on a pass, the [`HeldSlot`] to give
    /// back with [`Gate::release`] when the request ends. A dry run
    /// counts nothing and holds nothing. `item.weight` is ignored.
    pub fn acquire(
        &self,
        item: &CheckItem,
        now: Nanos,
        dry_run: bool,
        draw: impl FnMut() -> f64,
    ) -> (ManyOutcome, Option<HeldSlot>) {
        self.view(InFlight::of).acquire(item, now, dry_run, draw)
    }

    /// Gives back the slot `held` that [`Gate::acquire`] took for `item`
    /// (the same name and key). Returns true when a counter got it back
    /// (false: the quota, or the key's entry, is gone).
    pub fn release(&self, item: &CheckItem, held: HeldSlot, now: Nanos) -> bool {
        self.view(InFlight::of).release(item, held, now)
    }

    /// Records that process `owner` (its [`crate::host::process_identity`])
    /// holds the slot `held` of `item`, taken by a passed check, so that
    /// the sync thread gives it back should that process die holding it
    /// ([`crate::table::Table::reclaim_abandoned_slots`]). Returns the record's number for
    /// [`Gate::release_recorded`]; 0 when nothing was recorded (`owner` 0,
    /// an unknown quota, or every record along the probe in use: counted
    /// as unrecorded, the request goes on).
    pub fn record_slot(&self, item: &CheckItem, held: HeldSlot, owner: u64) -> u32 {
        self.view(InFlight::of).record(item, held, owner)
    }

    /// [`Gate::release`] of a slot [`Gate::record_slot`] recorded as
    /// `record` for `owner`: frees the record, then gives the slot back.
    pub fn release_recorded(
        &self,
        item: &CheckItem,
        held: HeldSlot,
        record: u32,
        owner: u64,
        now: Nanos,
    ) -> bool {
        self.view(InFlight::of)
            .release_recorded(item, held, record, owner, now)
    }

    /// Gives back a slot that a dead process held, as its record names it.
    pub(in crate::table) fn release_abandoned(
        &self,
        slot: crate::table::region::holds::Abandoned,
        now: Nanos,
    ) -> bool {
        self.view(InFlight::of).release_abandoned(slot, now)
    }

    /// True when `name` names a live in-flight quota.
    pub fn is_in_flight(&self, name: &[u8]) -> bool {
        self.view(Reader::of).is_in_flight(name)
    }

    /// Finds the live slot named `name`.
    pub fn lookup(&self, name: &[u8]) -> Option<SlotId> {
        crate::table::region::index::NameIndex::of(self.region).lookup(name)
    }
}
