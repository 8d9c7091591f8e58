//! What one process keeps for its own checks beside the shared region
//! ([`Local`]: the name hints, whether passes are counted), and the shape
//! of the request face's views ([`gate_view!`]): a view of the region
//! together with this process's [`Local`].

use crate::table::region::{SlotId, RLX};
use std::cell::Cell;
use std::sync::atomic::AtomicU64;

/// What a process keeps beside the shared region for the checks it makes
/// (a `Table` owns one; the request face's views borrow it).
pub(in crate::table) struct Local {
    /// Where names were last found, per process.
    pub(in crate::table) hints: NameHints,
    /// Passed checks are counted per quota, for `sluice_metrics`; off
    /// for a table nothing reads them from.
    pub(in crate::table) pass_tally: bool,
    /// Single checks try a fast path first (`fast.rs`); tests turn them
    /// off to compare them with the general path.
    #[cfg(test)]
    pub(in crate::table) fast_path: bool,
}

impl Local {
    /// No hints, passes counted, the fast paths on.
    pub(in crate::table) fn new() -> Self {
        Local {
            hints: NameHints::new(),
            pass_tally: true,
            #[cfg(test)]
            fast_path: true,
        }
    }
}

/// Declares a view of the request face: like a region view (it derefs to
/// the region), with this process's [`Local`] beside it. One view is made
/// from another with `self.view(Other::of)`, so a call into another
/// file's concern names that file's view, which the caller imports.
macro_rules! gate_view {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        pub(in crate::table) struct $name<'r> {
            region: &'r $crate::table::region::Region,
            local: &'r $crate::table::gate::local::Local,
        }

        #[allow(dead_code)]
        impl<'r> $name<'r> {
            /// The view of `region` with this process's `local` state.
            #[inline(always)]
            pub(in crate::table) fn of(
                region: &'r $crate::table::region::Region,
                local: &'r $crate::table::gate::local::Local,
            ) -> Self {
                Self { region, local }
            }

            /// The same region and state seen through another view.
            #[inline(always)]
            pub(in crate::table) fn view<V>(
                &self,
                of: fn(
                    &'r $crate::table::region::Region,
                    &'r $crate::table::gate::local::Local,
                ) -> V,
            ) -> V {
                of(self.region, self.local)
            }

            /// The region, for what a method returns that lives in it.
            #[inline(always)]
            pub(in crate::table) fn region(&self) -> &'r $crate::table::region::Region {
                self.region
            }
        }

        impl std::ops::Deref for $name<'_> {
            type Target = $crate::table::region::Region;
            #[inline(always)]
            fn deref(&self) -> &Self::Target {
                self.region
            }
        }
    };
}
pub(in crate::table) use gate_view;

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
/// table ([`Local`]), not in the shared region, where every worker of a host
/// would write the same lines.
pub(in crate::table) struct NameHints {
    entries: [NameHint; NAME_HINTS],
}

/// One name's hint: two words, written and read apart (a torn pair is
/// a wrong guess, which the name compare rejects).
#[derive(Default)]
pub(in crate::table) struct NameHint {
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
    pub(in crate::table) fn new() -> Self {
        Self {
            entries: std::array::from_fn(|_| NameHint::default()),
        }
    }

    /// The entry for a name of fingerprint `fp`.
    #[inline(always)]
    pub(in crate::table) fn of(&self, fp: u64) -> &NameHint {
        &self.entries[(fp >> 60) as usize % NAME_HINTS]
    }
}

impl NameHint {
    /// The slot and name place this hint holds for a name of
    /// fingerprint `fp`, if any.
    #[inline(always)]
    pub(in crate::table) fn get(&self, fp: u64) -> Option<(SlotId, u32)> {
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
    pub(in crate::table) fn set(&self, fp: u64, slot: SlotId, name_at: u32) {
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
