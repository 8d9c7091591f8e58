//! A check's chain: the quota a check item names (or its key's counter
//! under the template's numbers) and its ancestors as read for one check,
//! and what the check decides with them (pass or reject, pace, headroom,
//! the rejection to answer). Reading it is `read.rs`.

use crate::core::counter::ceil_nanos;
use crate::core::estimate::Estimator;
use crate::core::key::KeyHash;
use crate::core::quota::{weight_f64, MAX_DEPTH};
use crate::table::region::key_entries::KeyTiers;
use crate::table::region::SlotId;
use std::mem::MaybeUninit;

use super::outcome::{Cause, Commit, Headroom, Rejection};
use crate::core::{
    check_chain, reserve_wait, tightest, ChainVerdict, Nanos, QuotaSnapshot, Room, Wait,
};

/// A quota and its ancestors as read for one check.
///
/// Only the first `len` views are initialised: a check reads one to three
/// of the eight, and the ~450 bytes of the array are never zeroed, copied
/// or returned (either showed as a third of a check's time).
pub(in crate::table) struct Chain {
    pub(super) views: [MaybeUninit<QuotaSnapshot>; MAX_DEPTH],
    pub(super) slots: [SlotId; MAX_DEPTH],
    pub(super) len: usize,
    /// The key entry + 1 whose counter stands first in the chain (the
    /// first view is the key's, the first slot its template's); 0: none.
    pub(super) key: u32,
    /// That key's hash.
    pub(super) key_hash: KeyHash,
    /// The chain's first quota is a per-key template read for a key that
    /// found no entry: its own counter stands for the key (overflow
    /// mode `shared`).
    pub(super) overflow: bool,
    /// Some quota of the chain is flagged for the tier section
    /// ([`FLAG_TIERS`]): the check applies overrides and penalties.
    pub(super) tiers: bool,
    /// The key's hash for the tier section, whether or not the key found
    /// an entry (0: no key).
    pub(super) tier_key: KeyHash,
    /// What the key's entry says of its tiers (a flagged template's key).
    pub(super) key_tiers: KeyTiers,
}

/// What a check item's quota turned out to be.
pub(in crate::table) enum Resolved {
    /// Read into the chain; count this weight if everything passes (paced
    /// with this longest wait, if any).
    Counted(u64, Option<Nanos>),
    /// No quota has the name.
    Unknown,
    /// A per-key quota checked without a key.
    NoKey,
    /// A key that found no entry, let through uncounted (overflow mode
    /// `pass`).
    OverflowPass,
    /// A key that found no entry, rejected (overflow mode `reject`).
    OverflowReject(Rejection),
    /// Rejected before any decision: an override denies the key, or the
    /// key or a quota of the chain is under a penalty.
    Barred(Rejection),
}

impl Chain {
    pub(super) fn new() -> Self {
        Chain {
            views: [const { MaybeUninit::uninit() }; MAX_DEPTH],
            slots: [0; MAX_DEPTH],
            len: 0,
            key: 0,
            key_hash: 0,
            overflow: false,
            tiers: false,
            tier_key: 0,
            key_tiers: KeyTiers::Unknown,
        }
    }

    /// The view at `depth` (below `len`), to change.
    pub(super) fn view_mut(&mut self, depth: usize) -> &mut QuotaSnapshot {
        debug_assert!(depth < self.len);
        // SAFETY: the first `len` views are initialised (see `views`).
        unsafe { self.views[depth].assume_init_mut() }
    }

    pub(super) fn views(&self) -> &[QuotaSnapshot] {
        // SAFETY: `push` initialised the first `len` views, and
        // MaybeUninit<QuotaSnapshot> has QuotaSnapshot's layout.
        unsafe { std::slice::from_raw_parts(self.views.as_ptr().cast::<QuotaSnapshot>(), self.len) }
    }

    pub(super) fn commit(&self, weight: u64) -> Commit {
        Commit {
            slots: self.slots,
            len: self.len,
            key: self.key,
            key_hash: self.key_hash,
            weight,
        }
    }

    /// The headroom of the quota at `depth`, `added` units on its level.
    pub(super) fn headroom(
        &self,
        item: usize,
        depth: usize,
        added: f64,
        now: Nanos,
        e: &Estimator,
    ) -> Headroom {
        Headroom {
            item,
            depth,
            slot: self.slots[depth],
            room: Room::of(&self.views()[depth], added, now, e),
        }
    }

    /// The quota of this chain with the least room below its low burst
    /// once `added` units are counted.
    pub(super) fn tightest(&self, item: usize, added: f64, now: Nanos, e: &Estimator) -> Headroom {
        let (depth, room) = tightest(self.views(), added, now, e);
        Headroom {
            item,
            depth,
            slot: self.slots[depth],
            room,
        }
    }

    #[inline]
    pub(super) fn check(
        &self,
        weight: u64,
        now: Nanos,
        estimator: &Estimator,
        draw: impl FnMut() -> f64,
    ) -> Result<(), Rejection> {
        match check_chain(self.views(), weight_f64(weight), now, estimator, draw) {
            ChainVerdict::Pass => Ok(()),
            ChainVerdict::Reject { at } => Err(self.rejection(at, weight, now, estimator)),
        }
    }

    /// Paces a request of `weight`: its wait in nanoseconds when that is at
    /// most `max_wait`, else the rejection (its `wait` what the wait would
    /// have been, or why there is none).
    pub(super) fn pace(
        &self,
        weight: u64,
        max_wait: Nanos,
        now: Nanos,
        estimator: &Estimator,
    ) -> Result<Nanos, Rejection> {
        let views = self.views();
        let (depth, wait) = match reserve_wait(views, weight as f64, now, estimator) {
            Ok(seconds) => {
                let ns = ceil_nanos(seconds);
                if ns <= max_wait {
                    return Ok(ns);
                }
                let depth = tightest(views, weight as f64, now, estimator).0;
                (depth, Wait::Seconds(seconds))
            }
            Err(refused) => refused,
        };
        let mut rejection = self.rejection(depth, weight, now, estimator);
        rejection.wait = wait;
        Err(rejection)
    }

    /// The rejection of a request of `weight` by the quota at `depth`.
    pub(super) fn rejection(
        &self,
        depth: usize,
        weight: u64,
        now: Nanos,
        estimator: &Estimator,
    ) -> Rejection {
        let room = Room::of(&self.views()[depth], 0.0, now, estimator);
        Rejection {
            depth,
            slot: self.slots[depth],
            limit: room.limit,
            wait: room.wait(weight as f64),
            key: if depth == 0 { self.key_hash } else { 0 },
            cause: Cause::Limit,
        }
    }
}

/// Seconds a check rejected for lack of room in the key section (overflow
/// mode `reject`) is told to wait: entries free as keys drain, and a
/// sync cycle is about this long.
pub(in crate::table) const KEY_OVERFLOW_RETRY_SECS: f64 = 1.0;
