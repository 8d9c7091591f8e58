//! The fast paths: a single check that is plainly far from its limit,
//! decided and counted without a chain, named or keyed.
//!
//! Most checks are far below every low burst of their quota's chain, of
//! quotas with no window and no tiers (and, keyed, of a per-key template
//! with no parent whose key already has an entry). For those the
//! general path's bookkeeping (the chain of views, its outcome structs,
//! the tier and overflow branches) was about 220 of a hot keyed check's
//! 720 instructions (callgrind), and a quarter of its time; a named
//! check in cache takes 333 instead of 415 (489 instead of 617 with two
//! ancestors) and a sixth less time (BENCHMARKS.md, "Hot path before and
//! after issue 33's two faces"). These paths read the same things with
//! the same functions (the name's hint, each quota's view under its
//! seqlock, the key's entry, [`passes_for_sure`]) and count the same
//! way; they only decline (with nothing counted) whatever they do not
//! decide at once, and the general path then decides the check from the
//! start, given the key's hash so that it is not computed twice.
//!
//! Declined: a name not in its hint yet; a quota of the chain with a
//! window or tiers, or that might be near its limit; a per-key template
//! checked without a key, or a quota that is not per key checked with
//! one; a per-key template with a parent, a key without an entry (it is
//! made, or overflows, on the general path), a key a root refused to
//! hold (the overflow mode decides it too). A declined check of a key it
//! found has recorded one use of the key more than the general path will
//! record again: a key's uses only count up to three, and a key near its
//! limit holds weight, which no eviction takes.

use crate::core::decision::passes_for_sure;
use crate::core::key::KeyHash;
use crate::core::quota::{weight_f64, MAX_DEPTH, MAX_WEIGHT};
use crate::core::Nanos;
use crate::table::region::key_entries::{apply_key, KeyEntries};
use crate::table::region::keys::Keys;
use crate::table::region::layout::{
    DIRTY_REFUSED, FLAG_PER_KEY, FLAG_SLIDING, FLAG_TIERS, FLAG_WINDOW_MASK,
};
use crate::table::region::slots::Slots;
use crate::table::region::RLX;
use std::mem::MaybeUninit;

use super::local::gate_view;

use super::count::Counter;
use super::read::Reader;

gate_view!(
    /// The fast paths.
    FastPath
);

/// What the fast path did with a check.
pub(in crate::table) enum Fast {
    /// Decided and counted: the check passed.
    Passed,
    /// Not decided, nothing counted; the key's hash when it got that far.
    Declined(Option<KeyHash>),
}

#[cfg(test)]
thread_local! {
    /// Checks this thread's fast paths decided (tests: that they ran).
    pub(in crate::table) static FAST_PASSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl FastPath<'_> {
    /// Checks the quota `name` (checked without a key) for `weight`, if
    /// the fast path can (see the module doc): what the general path
    /// does with a chain in which every quota passes for sure. Each quota
    /// of the chain is decided as it is read (the general path's reading:
    /// up to [`MAX_DEPTH`] quotas, an ancestor that vanished ends it), so
    /// no view is kept.
    #[inline(always)]
    pub(in crate::table) fn check_named_fast(&self, name: &[u8], weight: u64) -> Fast {
        let Some((first, name_at)) = self.view(Reader::of).hinted(name) else {
            return Fast::Declined(None);
        };
        // A look at the hinted slot's flags first: a quota declined for
        // them (most often a window) is left to the general path before a
        // read under its seqlock, which it would only make again. Only
        // the read decides: what this saw may be a moment old.
        let declined = FLAG_PER_KEY | FLAG_WINDOW_MASK | FLAG_SLIDING | FLAG_TIERS;
        if self
            .slot(first)
            .is_none_or(|s| s.flags.load(RLX) & declined != 0)
        {
            return Fast::Declined(None);
        }
        let mut view = MaybeUninit::uninit();
        let Some(read) = Slots::of(self).read_named_into(first, name_at, name, &mut view) else {
            return Fast::Declined(None);
        };
        let weight = weight.min(MAX_WEIGHT);
        let units = weight_f64(weight);
        let estimator = self.estimator();
        // SAFETY: `find_hinted_into` wrote the view when it found the slot.
        let view = unsafe { view.assume_init_ref() };
        // A window is declined by `passes_for_sure`.
        if read.per_key || read.tiers || !passes_for_sure(view, units, &estimator) {
            return Fast::Declined(None);
        }
        let mut chain = [first; MAX_DEPTH];
        let mut len = 1;
        let mut next = read.parent;
        while let Some(slot) = next.filter(|_| len < MAX_DEPTH) {
            let mut view = MaybeUninit::uninit();
            let Some(read) = Slots::of(self).read_view_into(slot, |_| true, &mut view) else {
                break;
            };
            // SAFETY: `read_view_into` wrote the view when it returned `Some`.
            let view = unsafe { view.assume_init_ref() };
            if read.tiers || !passes_for_sure(view, units, &estimator) {
                return Fast::Declined(None);
            }
            chain[len] = slot;
            len += 1;
            next = read.parent;
        }
        self.view(Counter::of).commit(&chain[..len], 0, 0, weight);
        #[cfg(test)]
        FAST_PASSES.with(|n| n.set(n.get() + 1));
        Fast::Passed
    }

    /// Checks the key `key` (not empty) of the per-key quota `name` for
    /// `weight` at `now`, if the fast path can (see the module doc).
    #[inline(always)]
    pub(in crate::table) fn check_key_fast(
        &self,
        name: &[u8],
        key: &[u8],
        weight: u64,
        now: Nanos,
    ) -> Fast {
        let mut view = MaybeUninit::uninit();
        let Some((slot, read)) = self.view(Reader::of).find_hinted_into(name, &mut view) else {
            return Fast::Declined(None);
        };
        // SAFETY: `find_hinted_into` wrote the view when it found the slot.
        let view = unsafe { view.assume_init_mut() };
        if !read.per_key || read.tiers || read.parent.is_some() || view.window.is_some() {
            return Fast::Declined(None);
        }
        let hash = KeyEntries::of(self).key_secret().hash(key);
        let Some(at) = Keys::of(self).find_key_touched(slot, hash, now) else {
            return Fast::Declined(Some(hash));
        };
        let Some(entry) = KeyEntries::of(self).key_at(at) else {
            return Fast::Declined(Some(hash));
        };
        if entry.dirty.load(RLX) & DIRTY_REFUSED != 0 {
            return Fast::Declined(Some(hash));
        }
        apply_key(entry, view, now);
        if !passes_for_sure(view, weight_f64(weight), &self.estimator()) {
            return Fast::Declined(Some(hash));
        }
        Keys::of(self).count_key(at, slot, hash, weight.min(MAX_WEIGHT));
        self.view(Counter::of).tally_pass(slot);
        #[cfg(test)]
        FAST_PASSES.with(|n| n.set(n.get() + 1));
        Fast::Passed
    }
}
