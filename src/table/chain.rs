//! Reading what a check decides on: a quota found by name through the
//! index, read under its seqlock straight into the check's chain (with,
//! for a per-key quota, its key's counter in place of the template's),
//! then its ancestors.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::atomic::AtomicU64;

use super::names;
use super::outcome::{Cause, Charge, CheckItem, Headroom, Outcome, Rejection};
use super::region::key_entries::KeyOverflow;
use super::region::key_entries::KeyTiers;
use super::region::slots::SlotRead;
use super::{SlotId, Table, RLX};
use crate::core::counter::ceil_nanos;
use crate::core::estimate::Estimator;
use crate::core::key::KeyHash;
use crate::core::quota::{weight_f64, MAX_DEPTH, MAX_WEIGHT};
use crate::core::{
    check_chain, reserve_wait, tightest, ChainVerdict, Nanos, QuotaSnapshot, Room, Wait,
};
use crate::table::region::index::NameIndex;
use crate::table::region::key_entries::KeyEntries;
use crate::table::region::keys::Keys;
use crate::table::region::slots::Slots;

/// A quota and its ancestors as read for one check.
///
/// Only the first `len` views are initialised: a check reads one to three
/// of the eight, and the ~450 bytes of the array are never zeroed, copied
/// or returned (either showed as a third of a check's time).
pub(super) struct Chain {
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
pub(super) enum Resolved {
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

/// Where the quotas of names checked lately were found, keyed by each
/// name's [`names::fingerprint`]: a caller names a quota with the same
/// bytes over and over (a C constant, an nginx directive's argument, or
/// a name built per request for the same hot bucket). A hit saves
/// hashing the name and walking the index, most of a name's lookup.
///
/// A miss must cost next to nothing, since most names built per request
/// are not the last one seen (a table of a million quotas checked by
/// bucket): the hint is rejected on its fingerprint, without reading the
/// hinted slot or the name arena (cold lines in a large table); only a
/// name that matches there (the same name, or one differing only in its
/// middle bytes) costs a slot read, and the name compare under the
/// slot's seqlock decides. And a miss seldom writes: the entries are
/// read by every thread of the process, and a store on each miss would
/// bounce their lines between cores. Hints live in this process's
/// [`Table`], not in the shared region, where every worker of a host
/// would write the same lines.
pub(super) struct NameHints {
    entries: [NameHint; NAME_HINTS],
}

/// One name's hint: two words, written and read apart (a torn pair is
/// a wrong guess, which the name compare rejects).
#[derive(Default)]
struct NameHint {
    /// The name's fingerprint.
    fingerprint: AtomicU64,
    /// `(slot + 1) << 32 | name_at`; 0: none.
    place: AtomicU64,
}

/// Hints per table (a power of two; 16 of 16 bytes: four cache lines).
const NAME_HINTS: usize = 16;

/// A miss replaces a hint holding another name once in this many misses
/// of a thread: a name checked again and again takes an entry within a
/// few checks, while a stream of names seen once writes the shared
/// entries seldom.
const REPLACE_EVERY: u32 = 8;

thread_local! {
    /// This thread's misses that found another name's hint, counted to
    /// pace replacing it ([`REPLACE_EVERY`]).
    static HINT_MISSES: Cell<u32> = const { Cell::new(0) };
}

impl NameHints {
    /// No hints.
    pub(super) fn new() -> Self {
        Self {
            entries: std::array::from_fn(|_| NameHint::default()),
        }
    }

    /// The entry for a name of fingerprint `fp`.
    #[inline(always)]
    fn of(&self, fp: u64) -> &NameHint {
        &self.entries[(fp >> 60) as usize % NAME_HINTS]
    }
}

impl NameHint {
    /// The slot and name place this hint holds for a name of
    /// fingerprint `fp`, if any.
    #[inline(always)]
    fn get(&self, fp: u64) -> Option<(SlotId, u32)> {
        if self.fingerprint.load(RLX) != fp {
            return None;
        }
        let place = self.place.load(RLX);
        let slot = ((place >> 32) as u32).checked_sub(1)?;
        Some((slot, place as u32))
    }

    /// Remembers where the name of fingerprint `fp` was found, after a
    /// miss: at once into an empty entry, else on every
    /// [`REPLACE_EVERY`]th miss of this thread (also when the entry holds
    /// this fingerprint: two names differing only in their middle bytes
    /// would otherwise rewrite it on every check). Nothing is written
    /// when nothing would change.
    fn set(&self, fp: u64, slot: SlotId, name_at: u32) {
        let place = u64::from(slot + 1) << 32 | u64::from(name_at);
        let held = self.fingerprint.load(RLX);
        if self.place.load(RLX) != 0 {
            let due = HINT_MISSES.with(|misses| {
                let n = misses.get().wrapping_add(1);
                misses.set(n);
                n % REPLACE_EVERY == 0
            });
            if !due {
                return;
            }
        }
        if held != fp {
            self.fingerprint.store(fp, RLX);
        }
        if self.place.load(RLX) != place {
            self.place.store(place, RLX);
        }
    }
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

    pub(super) fn charge(&self, weight: u64) -> Charge {
        Charge {
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

impl Table {
    /// Finds the live quota named `name` and reads its view into `out`
    /// (see [`Table::read_named_into`]): first in the slot the hint of
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

    /// [`Table::find_named_into`] through the hint alone: `None` when the
    /// hint holds no slot of this name (the keyed fast path then leaves
    /// the check to the path that walks the index and sets the hint).
    #[inline(always)]
    pub(super) fn find_hinted_into(
        &self,
        name: &[u8],
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<(SlotId, SlotRead)> {
        let fp = names::fingerprint(name);
        let (slot, name_at) = self.name_hints.of(fp).get(fp)?;
        let read = Slots::of(self).read_named_into(slot, name_at, name, out)?;
        Some((slot, read))
    }

    /// [`Table::find_named_into`] through the index, when the hint missed.
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
        self.name_hints.of(fp).set(fp, slot, name_at);
        Some((slot, read))
    }

    /// Resolves a single item for [`Table::obtain`] and
    /// [`Table::reserve`]: its weight (capped at [`MAX_WEIGHT`]) with its
    /// chain read, or the outcome of an item that is not checked or is
    /// rejected before any decision (counted as [`Table::check_many`]
    /// counts it; `chain.overflow` set for a key that found no entry).
    pub(super) fn resolve_counted(
        &self,
        item: &CheckItem,
        chain: &mut Chain,
        now: Nanos,
        dry_run: bool,
        key_hash: Option<KeyHash>,
    ) -> Result<u64, Outcome> {
        match self.resolve_hashed(item, chain, now, key_hash) {
            Resolved::Counted(weight, _) => Ok(weight.min(MAX_WEIGHT)),
            Resolved::Unknown => {
                self.header().unknown_checks.fetch_add(1, RLX);
                Err(Outcome::Unknown)
            }
            Resolved::NoKey => {
                self.header().keys.place.keyless.fetch_add(1, RLX);
                Err(Outcome::NoKey)
            }
            Resolved::OverflowPass => Err(Outcome::KeyOverflow),
            Resolved::OverflowReject(rejection) | Resolved::Barred(rejection) => {
                self.count_rejected(chain, dry_run);
                Err(Outcome::Reject(rejection))
            }
        }
    }

    /// Reads the quota `item` names (or, for a per-key quota, the key's
    /// counter under the template's numbers) and its ancestors into
    /// `chain`.
    pub(super) fn resolve(&self, item: &CheckItem, chain: &mut Chain, now: Nanos) -> Resolved {
        self.resolve_hashed(item, chain, now, None)
    }

    /// [`Table::resolve`] given the key's hash when the caller already has
    /// it (the keyed fast path that declined, `fast.rs`): a key is hashed
    /// once per check.
    #[inline(always)]
    pub(super) fn resolve_hashed(
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
            match Keys::of(self).use_key(slot, hash, now) {
                Ok(at) if KeyEntries::of(self).key_into(at, view, now) => {
                    chain.key = at + 1;
                    chain.key_hash = hash;
                    if read.tiers {
                        chain.key_tiers = KeyEntries::of(self).key_tiers(at, hash);
                    }
                }
                _ => {
                    chain.overflow = true;
                    match KeyEntries::of(self).key_overflow() {
                        KeyOverflow::Shared => {}
                        KeyOverflow::Pass => return Resolved::OverflowPass,
                        KeyOverflow::Reject => {
                            chain.key_hash = hash;
                            return Resolved::OverflowReject(Rejection {
                                depth: 0,
                                slot,
                                limit: view.limit,
                                wait: Wait::Seconds(KEY_OVERFLOW_RETRY_SECS),
                                key: hash,
                                cause: Cause::Limit,
                            });
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
            if let Some(barred) = self.apply_tiers(chain, chain.tier_key, now) {
                return Resolved::Barred(barred);
            }
        }
        Resolved::Counted(item.weight, item.max_wait)
    }

    /// Reads a quota and its ancestors into `chain`; false if the quota
    /// itself is gone.
    pub(super) fn read_chain(&self, first: SlotId, chain: &mut Chain) -> bool {
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
}

/// Seconds a check rejected for lack of room in the key section (overflow
/// mode `reject`) is told to wait: entries free as keys drain, and a
/// sync cycle is about this long.
const KEY_OVERFLOW_RETRY_SECS: f64 = 1.0;
