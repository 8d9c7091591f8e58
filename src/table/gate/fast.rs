//! The keyed fast path: a single keyed check that is plainly far from its
//! limit, decided and counted without a chain.
//!
//! Most keyed checks are of a per-key template with no parent, no
//! window and no tiers, whose key already has an entry and is far below
//! its low burst. For those the general path's bookkeeping (the chain of
//! views, its outcome structs, the tier and overflow branches) was about
//! 220 of a hot keyed check's 720 instructions (callgrind), and a quarter
//! of its time. This path reads the same things with the same functions
//! (the name's hint, the template's view under its seqlock, the key's
//! entry, [`passes_for_sure`]) and counts the same way; it only declines
//! (with nothing counted) whatever it does not decide at once, and the
//! general path then decides the check from the start, given the key's
//! hash so that it is not computed twice.
//!
//! Declined: a name not in its hint yet, a template with a parent, a
//! window or tiers, a key without an entry (it is made, or overflows, on
//! the general path), a key a root refused to hold (the overflow mode
//! decides it too), and a key that might be near its limit. A declined
//! check of a key it found has recorded one use of the key more than the
//! general path will record again: a key's uses only count up to three,
//! and a key near its limit holds weight, which no eviction takes.

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
    /// The keyed fast path.
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
    /// Checks this thread's fast path decided (tests: that it ran).
    pub(in crate::table) static FAST_PASSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl FastPath<'_> {
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
