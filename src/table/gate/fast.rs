//! The fast paths: a single check that is plainly far from its limit,
//! decided and counted without a chain, named or keyed.
//!
//! Most checks are of a quota with no parent, no window and no tiers,
//! far below its low burst (and, keyed, of a per-key template whose key
//! already has an entry). For those the general path's bookkeeping (the
//! chain of views, its outcome structs, the tier and overflow branches)
//! was about 220 of a hot keyed check's 720 instructions (callgrind), and
//! a quarter of its time; of a named check in cache, 180 of 415. These paths read the same things with the same
//! functions (the name's hint, the quota's view under its seqlock, the
//! key's entry, [`passes_for_sure`]) and count the same way; they only
//! decline (with nothing counted) whatever they do not decide at once,
//! and the general path then decides the check from the start, given the
//! key's hash so that it is not computed twice.
//!
//! Declined: a name not in its hint yet, a quota with a parent, a window
//! or tiers; a per-key template checked without a key, or a quota that
//! is not per key checked with one; a key without an entry (it is made,
//! or overflows, on the general path), a key a root refused to hold (the
//! overflow mode decides it too), and a quota or key that might be near
//! its limit. A declined check of a key it found has recorded one use of
//! the key more than the general path will record again: a key's uses
//! only count up to three, and a key near its limit holds weight, which
//! no eviction takes.

use crate::core::decision::passes_for_sure;
use crate::core::key::KeyHash;
use crate::core::quota::{weight_f64, MAX_WEIGHT};
use crate::core::Nanos;
use crate::table::region::key_entries::{apply_key, KeyEntries};
use crate::table::region::keys::Keys;
use crate::table::region::layout::DIRTY_REFUSED;
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
    /// does with a chain of one quota that passes for sure.
    #[inline(always)]
    pub(in crate::table) fn check_named_fast(&self, name: &[u8], weight: u64) -> Fast {
        let mut view = MaybeUninit::uninit();
        let Some((slot, read)) = self.view(Reader::of).find_hinted_into(name, &mut view) else {
            return Fast::Declined(None);
        };
        // SAFETY: `find_hinted_into` wrote the view when it found the slot.
        let view = unsafe { view.assume_init_ref() };
        // A window is declined by `passes_for_sure`.
        if read.per_key || read.tiers || read.parent.is_some() {
            return Fast::Declined(None);
        }
        let weight = weight.min(MAX_WEIGHT);
        if !passes_for_sure(view, weight_f64(weight), &self.estimator()) {
            return Fast::Declined(None);
        }
        self.view(Counter::of).commit(&[slot], 0, 0, weight);
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
