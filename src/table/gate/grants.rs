//! The one-item paths beside the plain check: a partial grant (the most
//! units that pass for certain), a reservation (count now, act after a
//! wait), weight given back, and charges after the fact (count without
//! deciding; settle an estimate).

use super::local::gate_view;
use crate::core::counter::ceil_nanos;
use crate::core::key::KeyHash;
use crate::core::quota::MAX_WEIGHT;
use crate::core::{grantable, Nanos, Wait};
use crate::table::region::index::NameIndex;
use crate::table::region::key_entries::KeyEntries;
use crate::table::region::ring::DirtySlots;
use crate::table::region::{SlotId, RLX};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use super::chain::{Chain, Resolved};
use super::check::Checker;
use super::count::Counter;
use super::outcome::{CheckItem, Outcome, Rejection};
use super::read::Reader;

gate_view!(
    /// Partial grants, reservations, charges and weight given back.
    Grants
);

/// What [`crate::table::Gate::obtain`] granted, or what [`crate::table::Gate::charge`] and
/// [`crate::table::Gate::settle`] counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grant {
    /// `Pass` when something was granted (and counted), `Reject` when
    /// nothing could be, `Unknown`/`NoKey` when the item was not checked.
    /// A charge is never `Reject`; `KeyOverflow` when its key found no
    /// entry and nothing was counted.
    pub outcome: Outcome,
    /// Units granted and counted (a settle that gave units back: 0).
    pub granted: u64,
    /// The key found no entry: decided by the overflow mode.
    pub overflow: bool,
}

/// What [`crate::table::Gate::reserve`] decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reservation {
    /// `Pass` when the weight was counted (the caller waits `wait`, then
    /// acts), `Reject` when it was not, `Unknown`/`NoKey` when the item was
    /// not checked.
    pub outcome: Outcome,
    /// Nanoseconds to wait: on a pass before acting; on a rejection what
    /// the wait would have been ([`Nanos::MAX`]: waiting cannot help).
    pub wait: Nanos,
    /// The key found no entry: decided by the overflow mode.
    pub overflow: bool,
}

/// The wait [`Reservation::wait`] reports for an outcome that is not a
/// pass: the rejection's, or none.
fn rejection_wait(outcome: Outcome) -> Nanos {
    match outcome {
        Outcome::Reject(Rejection {
            wait: Wait::Seconds(seconds),
            ..
        }) => ceil_nanos(seconds),
        Outcome::Reject(_) => Nanos::MAX,
        _ => 0,
    }
}

/// Takes `units` back out of a counter's `pending`, which may go below
/// zero: what it goes below is collected as a return for the roots, or
/// (counting locally) folded into the level. Returns the units taken.
fn take_back(pending: &AtomicU64, units: u64) -> u64 {
    pending.fetch_sub(units, SeqCst);
    units
}

/// What a charge or settle of an in-flight quota counts: nothing.
const NOT_CHARGED: Grant = Grant {
    outcome: Outcome::Unknown,
    granted: 0,
    overflow: false,
};

impl Grants<'_> {
    /// A partial grant: counts and returns the most units, up to
    /// `item.weight`, that the quota (or key) and all its ancestors allow
    /// with certainty now ([`crate::core::grantable`]). Granting nothing
    /// (asking for nothing, too) is a rejection (counted as one, with
    /// nothing added); an unknown
    /// name or a keyless check of a per-key quota grant nothing and say
    /// so.
    pub(in crate::table) fn obtain(&self, item: &CheckItem, now: Nanos) -> Grant {
        let estimator = self.estimator();
        let mut chain = Chain::new();
        let want = match self
            .view(Checker::of)
            .resolve_counted(item, &mut chain, now, false, None)
        {
            Ok(want) => want,
            Err(outcome) => {
                return Grant {
                    outcome,
                    granted: 0,
                    overflow: chain.overflow,
                }
            }
        };
        let (granted, depth) = grantable(chain.views(), want as f64, now, &estimator);
        if granted >= 1.0 {
            let granted = granted as u64;
            self.view(Counter::of).commit(
                &chain.slots[..chain.len],
                chain.key,
                chain.key_hash,
                granted,
            );
            return Grant {
                outcome: Outcome::Pass,
                granted,
                overflow: chain.overflow,
            };
        }
        let rejection = chain.rejection(depth, 1, now, &estimator);
        self.view(Counter::of).count_rejected(&chain, false);
        Grant {
            outcome: Outcome::Reject(rejection),
            granted: 0,
            overflow: chain.overflow,
        }
    }

    /// Pacing: counts `item.weight` now and says how long the caller must
    /// wait before acting so that the quota (or key) and its ancestors
    /// stay at their rates fleet-wide ([`crate::core::reserve_wait`]):
    /// GCRA's theoretical arrival time on the estimated cluster level.
    /// When the wait would exceed `max_wait` nanoseconds, or cannot end
    /// (a weight above a `high_burst`; a full window quota, whose next
    /// window cannot be taken in advance), nothing is counted and the
    /// rejection says how long it would have been.
    /// (The one-item case of [`crate::table::Gate::check_many`] with `max_wait`, on its
    /// own path as [`crate::table::Gate::obtain`] is: the general path's bookkeeping
    /// for several items cost a reservation a fifth of its time.)
    pub(in crate::table) fn reserve(
        &self,
        item: &CheckItem,
        max_wait: Nanos,
        now: Nanos,
    ) -> Reservation {
        let estimator = self.estimator();
        let mut chain = Chain::new();
        let weight = match self
            .view(Checker::of)
            .resolve_counted(item, &mut chain, now, false, None)
        {
            Ok(weight) => weight,
            Err(outcome) => {
                return Reservation {
                    outcome,
                    wait: rejection_wait(outcome),
                    overflow: chain.overflow,
                }
            }
        };
        match chain.pace(weight, max_wait, now, &estimator) {
            Ok(wait) => {
                self.view(Counter::of).commit(
                    &chain.slots[..chain.len],
                    chain.key,
                    chain.key_hash,
                    weight,
                );
                Reservation {
                    outcome: Outcome::Pass,
                    wait,
                    overflow: chain.overflow,
                }
            }
            Err(rejection) => {
                self.view(Counter::of).count_rejected(&chain, false);
                let outcome = Outcome::Reject(rejection);
                Reservation {
                    outcome,
                    wait: rejection_wait(outcome),
                    overflow: chain.overflow,
                }
            }
        }
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
    pub(in crate::table) fn charge(&self, item: &CheckItem, now: Nanos) -> Grant {
        if self.view(Reader::of).is_in_flight(item.name) {
            return NOT_CHARGED;
        }
        let mut chain = Chain::new();
        let counted = |outcome, granted, overflow| Grant {
            outcome,
            granted,
            overflow,
        };
        match self.view(Reader::of).resolve(item, &mut chain, now) {
            // A penalty or a deny bars checks, not costs already run up:
            // the request was admitted before it, so its charge counts.
            Resolved::Counted(..) | Resolved::Barred(_) => {
                let weight = item.weight.min(MAX_WEIGHT);
                self.view(Counter::of).add_weight(
                    &chain.slots[..chain.len],
                    chain.key,
                    chain.key_hash,
                    weight,
                );
                counted(Outcome::Pass, weight, chain.overflow)
            }
            Resolved::Unknown => {
                self.header().unknown_checks.fetch_add(1, RLX);
                counted(Outcome::Unknown, 0, false)
            }
            Resolved::NoKey => {
                self.header().keys.place.keyless.fetch_add(1, RLX);
                counted(Outcome::NoKey, 0, false)
            }
            Resolved::OverflowPass | Resolved::OverflowReject(_) => {
                counted(Outcome::KeyOverflow, 0, true)
            }
        }
    }

    /// Settles an estimate: a passed check of `estimate` units at
    /// `charged_at` is to cost `item.weight` in the end. The difference
    /// above the estimate is charged ([`crate::table::Gate::charge`]: counted
    /// whatever the level); one below it is given back
    /// ([`crate::table::Gate::give_back`]: uncounted if not sent yet, else a return
    /// to the roots, never below zero, nothing to a window that ended).
    /// `granted` is what was added (0 when units were given back). An
    /// in-flight quota is not settled (`Unknown`, as [`crate::table::Gate::charge`]):
    /// units given back would free slots still held.
    pub(in crate::table) fn settle(
        &self,
        item: &CheckItem,
        estimate: u64,
        charged_at: Nanos,
        now: Nanos,
    ) -> Grant {
        if self.view(Reader::of).is_in_flight(item.name) {
            return NOT_CHARGED;
        }
        let actual = item.weight.min(MAX_WEIGHT);
        let estimate = estimate.min(MAX_WEIGHT);
        if actual >= estimate {
            return self.charge(
                &CheckItem {
                    weight: actual - estimate,
                    ..*item
                },
                now,
            );
        }
        let outcome = match NameIndex::of(self).lookup(item.name) {
            None => Outcome::Unknown,
            Some(slot)
                if KeyEntries::of(self).is_per_key(slot)
                    && item.key.is_none_or(<[u8]>::is_empty) =>
            {
                Outcome::NoKey
            }
            Some(_) => {
                self.give_back(item, estimate - actual, charged_at, now, false);
                Outcome::Pass
            }
        };
        Grant {
            outcome,
            granted: 0,
            overflow: false,
        }
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
    pub(in crate::table) fn give_back(
        &self,
        item: &CheckItem,
        units: u64,
        charged_at: Nanos,
        now: Nanos,
        overflowed: bool,
    ) -> u64 {
        if units == 0 {
            return 0;
        }
        let Some(slot) = NameIndex::of(self).lookup(item.name) else {
            return 0;
        };
        let keyed = KeyEntries::of(self).is_per_key(slot) && !overflowed;
        let key = item
            .key
            .filter(|k| keyed && !k.is_empty())
            .map(|k| KeyEntries::of(self).key_secret().hash(k));
        self.give_back_to(slot, key, units, charged_at, now, overflowed)
    }

    /// [`Grants::give_back`] to the quota in `slot` and, for a per-key
    /// one, its key of hash `key` (the template's own counter when
    /// `overflowed`; none when `key` is `None`).
    pub(in crate::table) fn give_back_to(
        &self,
        slot: SlotId,
        key: Option<KeyHash>,
        units: u64,
        charged_at: Nanos,
        now: Nanos,
        overflowed: bool,
    ) -> u64 {
        let units = units.min(crate::core::quota::MAX_WEIGHT);
        let mut chain = Chain::new();
        if !self.view(Reader::of).read_chain(slot, &mut chain) {
            return 0;
        }
        let same_window = |depth: usize| {
            chain.views()[depth]
                .window
                .is_none_or(|rule| rule.index_at(charged_at) == rule.index_at(now))
        };
        let mut first = None;
        let mut counters = &chain.slots[..chain.len];
        if KeyEntries::of(self).is_per_key(slot) && !overflowed {
            counters = &counters[1..];
            let entry = key.and_then(|hash| KeyEntries::of(self).find_key(slot, hash));
            first = Some(0);
            if let (Some(at), true) = (entry, same_window(0)) {
                if let Some(e) = KeyEntries::of(self).key_at(at) {
                    first = Some(take_back(&e.pending, units));
                    KeyEntries::of(self).mark_dirty(at, e);
                }
            }
        }
        let skipped = chain.len - counters.len();
        let slots = self.slots();
        for (i, &s) in counters.iter().enumerate() {
            let given = if same_window(skipped + i) {
                // From zero: the return is the counter's first change
                // since it was collected, which queues it.
                if slots[s as usize].pending.fetch_sub(units, SeqCst) == 0 {
                    DirtySlots::of(self).mark(s);
                }
                units
            } else {
                0
            };
            first.get_or_insert(given);
        }
        first.unwrap_or(0)
    }
}
