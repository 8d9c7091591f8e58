//! Reading what a check decides on: a quota found by name through this
//! process's name hints or the index, read under its seqlock straight
//! into the check's chain (with, for a per-key quota, its key's counter
//! in place of the template's), then its ancestors.

use crate::core::estimate::estimate_level;
use crate::core::key::KeyHash;
use crate::core::quota::MAX_DEPTH;
use crate::core::Nanos;
use crate::core::{QuotaSnapshot, Wait};
use crate::table::gate::outcome::{Cause, CheckItem, Rejection};
use crate::table::region::index::NameIndex;
use crate::table::region::key_entries::{KeyEntries, KeyOverflow, KeyTiers};
use crate::table::region::keys::Keys;
use crate::table::region::layout::{FLAG_IN_FLIGHT, FLAG_LIVE};
use crate::table::region::slots::{SlotRead, Slots};
use crate::table::region::{names, SlotId};
use std::mem::MaybeUninit;

use super::chain::{Chain, Resolved, KEY_OVERFLOW_RETRY_SECS};
use super::local::gate_view;
use super::penalties::Penalties;

gate_view!(
    /// The request path's reads.
    Reader
);

impl Reader<'_> {
    /// Finds the live quota named `name` and reads its view into `out`
    /// (see `read_named_into`): first in the slot the hint of
    /// this name's fingerprint holds, else through the index (and the
    /// hint may remember the slot for the next check of that name).
    ///
    /// A hint is only ever a guess: the slot's name is compared in the
    /// same seqlock read as with a slot the index gave, so a slot since
    /// emptied, reused or renamed is never checked under the old name.
    #[inline]
    fn find_named_into(
        &self,
        name: &[u8],
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<(SlotId, SlotRead)> {
        if let Some(found) = self.find_hinted_into(name, out) {
            return Some(found);
        }
        self.find_named_by_index(name, out)
    }

    /// `find_named_into` through the hint alone: `None` when the
    /// hint holds no slot of this name (the keyed fast path then leaves
    /// the check to the path that walks the index and sets the hint).
    #[inline(always)]
    pub(in crate::table) fn find_hinted_into(
        &self,
        name: &[u8],
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<(SlotId, SlotRead)> {
        let (slot, name_at) = self.hinted(name)?;
        let read = Slots::of(self).read_named_into(slot, name_at, name, out)?;
        Some((slot, read))
    }

    /// The slot and name place the hint of `name`'s fingerprint holds,
    /// if any: a guess, until the name is compared under the slot's
    /// seqlock.
    #[inline(always)]
    pub(in crate::table) fn hinted(&self, name: &[u8]) -> Option<(SlotId, u32)> {
        let fp = names::fingerprint(name);
        self.local.hints.of(fp).get(fp)
    }

    /// `find_named_into` through the index, when the hint missed.
    /// Out of line: kept in, it made the check's inlined body large enough
    /// that the key's lookup was no longer inlined into it (40 more
    /// instructions a hot keyed check, callgrind), while this path pays
    /// for hashing and an index walk anyway.
    #[inline(never)]
    fn find_named_by_index(
        &self,
        name: &[u8],
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<(SlotId, SlotRead)> {
        let found = NameIndex::of(self).probe(name, |slot, name_at| {
            Slots::of(self)
                .read_named_into(slot, name_at, name, out)
                .map(|read| (slot, read, name_at))
        });
        let (slot, read, name_at) = found?;
        let fp = names::fingerprint(name);
        self.local.hints.of(fp).set(fp, slot, name_at);
        Some((slot, read))
    }

    /// Reads the quota `item` names (or, for a per-key quota, the key's
    /// counter under the template's numbers) and its ancestors into
    /// `chain`.
    pub(in crate::table) fn resolve(
        &self,
        item: &CheckItem,
        chain: &mut Chain,
        now: Nanos,
    ) -> Resolved {
        self.resolve_hashed(item, chain, now, None)
    }

    /// `resolve` given the key's hash when the caller already has
    /// it (the keyed fast path that declined, `fast.rs`): a key is hashed
    /// once per check.
    #[inline(always)]
    pub(in crate::table) fn resolve_hashed(
        &self,
        item: &CheckItem,
        chain: &mut Chain,
        now: Nanos,
        key_hash: Option<KeyHash>,
    ) -> Resolved {
        // The quota is read straight into the chain's first view.
        let found = self.find_named_into(item.name, &mut chain.views[0]);
        let Some((slot, read)) = found else {
            return Resolved::Unknown;
        };
        chain.slots[0] = slot;
        chain.len = 1;
        chain.key = 0;
        chain.key_hash = 0;
        chain.overflow = false;
        chain.tiers = read.tiers;
        chain.tier_key = 0;
        chain.key_tiers = KeyTiers::Unknown;
        if read.per_key {
            let Some(key) = item.key.filter(|k| !k.is_empty()) else {
                return Resolved::NoKey;
            };
            let hash = key_hash.unwrap_or_else(|| KeyEntries::of(self).key_secret().hash(key));
            chain.tier_key = hash;
            // SAFETY: the probe above wrote the first view.
            let view = unsafe { chain.views[0].assume_init_mut() };
            let found = Keys::of(self).use_key(slot, hash, now).ok();
            // A key a root refused to hold is held to the overflow mode
            // too: the template's own counter is kept before the key's
            // takes its place in the view.
            let template = found
                .filter(|&at| KeyEntries::of(self).key_refused(at))
                .map(|_| *view);
            match found {
                Some(at) if KeyEntries::of(self).key_into(at, view, now) => {
                    chain.key = at + 1;
                    chain.key_hash = hash;
                    if read.tiers {
                        chain.key_tiers = KeyEntries::of(self).key_tiers(at, hash);
                    }
                    if let Some(template) = template {
                        if let Some(rejected) = self.refused_key(view, &template, slot, hash, now) {
                            chain.overflow = true;
                            return rejected;
                        }
                    }
                }
                _ => {
                    chain.overflow = true;
                    match KeyEntries::of(self).key_overflow() {
                        KeyOverflow::Shared => {}
                        KeyOverflow::Pass => return Resolved::OverflowPass,
                        KeyOverflow::Reject => {
                            chain.key_hash = hash;
                            return overflow_reject(view, slot, hash);
                        }
                    }
                }
            }
        }
        // The tier section is looked at for a flagged ancestor, or for a
        // flagged first quota unless its key's entry says it holds
        // nothing of the key (`chain.tiers` keeps the flag either way: a
        // rejection may start the key's penalty).
        let first = read.tiers && chain.key_tiers != KeyTiers::Clear;
        chain.tiers = false;
        self.read_ancestors(read.parent, chain);
        let above = chain.tiers;
        chain.tiers |= read.tiers;
        if first || above {
            if let Some(barred) = Penalties::of(self).apply_tiers(chain, chain.tier_key, now) {
                return Resolved::Barred(barred);
            }
        }
        Resolved::Counted(item.weight, item.max_wait)
    }

    /// A check of a key a root refused to hold (see
    /// [`crate::table::Books::refuse_key`]), whose `view` holds its own
    /// count: besides it, the overflow mode decides. `shared` holds it to
    /// its template's own counter (`template`, which every key without a
    /// counter at the roots shares fleet-wide) as well: the higher of the
    /// two estimates stands in the view; `reject` rejects it (returned);
    /// `pass` leaves it to its own count, which the roots' share never
    /// frees it from.
    #[cold]
    #[inline(never)]
    fn refused_key(
        &self,
        view: &mut QuotaSnapshot,
        template: &QuotaSnapshot,
        slot: SlotId,
        hash: KeyHash,
        now: Nanos,
    ) -> Option<Resolved> {
        match KeyEntries::of(self).key_overflow() {
            KeyOverflow::Shared => {
                let estimator = self.estimator();
                let shared = estimate_level(template, now, &estimator);
                if shared > estimate_level(view, now, &estimator) {
                    view.known = template.known;
                    view.fill_rate = template.fill_rate;
                    view.own_recent = template.own_recent;
                    view.prev = template.prev;
                }
                None
            }
            KeyOverflow::Reject => Some(overflow_reject(view, slot, hash)),
            KeyOverflow::Pass => None,
        }
    }

    /// Reads a quota and its ancestors into `chain`; false if the quota
    /// itself is gone.
    pub(in crate::table) fn read_chain(&self, first: SlotId, chain: &mut Chain) -> bool {
        chain.len = 0;
        chain.tiers = false;
        chain.tier_key = 0;
        chain.key_tiers = KeyTiers::Unknown;
        self.read_ancestors(Some(first), chain);
        chain.len > 0
    }

    /// Appends `next` and its ancestors to `chain`, up to [`MAX_DEPTH`]
    /// quotas; an ancestor that vanished ends it.
    // Inlined into `resolve`, as before the table was split: a call here
    // cost a hot check ~1 ns (criterion A/B).
    #[inline(always)]
    fn read_ancestors(&self, next: Option<SlotId>, chain: &mut Chain) {
        let mut cur = next;
        while let Some(slot) = cur {
            if chain.len == MAX_DEPTH {
                break;
            }
            let Some(read) =
                Slots::of(self).read_view_into(slot, |_| true, &mut chain.views[chain.len])
            else {
                break;
            };
            chain.slots[chain.len] = slot;
            chain.len += 1;
            chain.tiers |= read.tiers;
            cur = read.parent;
        }
    }

    /// True when `name` names a live in-flight quota.
    pub(in crate::table) fn is_in_flight(&self, name: &[u8]) -> bool {
        let Some(slot) = NameIndex::of(self).lookup(name) else {
            return false;
        };
        self.slot(slot).is_some_and(|s| {
            let flags = s.flags.load(std::sync::atomic::Ordering::Relaxed);
            flags & FLAG_LIVE != 0 && flags & FLAG_IN_FLIGHT != 0
        })
    }
}

/// Overflow mode `reject`'s answer to a check of key `hash` of the
/// template in `slot` (`view` its view): rejected, to retry after
/// [`KEY_OVERFLOW_RETRY_SECS`].
#[cold]
fn overflow_reject(view: &QuotaSnapshot, slot: SlotId, hash: KeyHash) -> Resolved {
    Resolved::OverflowReject(Rejection {
        depth: 0,
        slot,
        limit: view.limit,
        wait: Wait::Seconds(KEY_OVERFLOW_RETRY_SECS),
        key: hash,
        cause: Cause::Limit,
    })
}
