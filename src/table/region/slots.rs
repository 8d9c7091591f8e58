//! A slot as the table's files read it: its quota's view under the
//! slot's seqlock (what a check decides on, with the name compared in the
//! same read), its counting rule, its name and terms, and the held word
//! beside it (this host's own net slots of an in-flight quota).

use crate::core::{Counting, Level, QuotaSnapshot, Terms};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::fence;

use super::layout::{
    counting_rule, unpack_rate_prev, Slot, FLAG_IN_FLIGHT, FLAG_LIVE, FLAG_PER_KEY, FLAG_QUEUED,
    FLAG_SLIDING, FLAG_TIERS, FLAG_WINDOW_MASK,
};
use super::names;
use super::sections::{read_pause, region_view, SlotId, ACQ, READ_ATTEMPTS, RLX};

region_view!(
    /// A slot's reads, and the held word beside it.
    Slots
);

impl Slots<'_> {
    /// Reads one slot's quota numbers and cluster state consistently,
    /// plus its parent; `None` if it is not live or never stabilised.
    pub(in crate::table) fn read_view(
        &self,
        slot: SlotId,
    ) -> Option<(QuotaSnapshot, Option<SlotId>)> {
        let mut view = MaybeUninit::uninit();
        let read = self.read_view_into(slot, |_| true, &mut view)?;
        // SAFETY: `read_view_into` wrote the view when it returned `Some`.
        Some((unsafe { view.assume_init() }, read.parent))
    }

    /// `read_view` of the slot named `name` (stored at
    /// `name_at`) into `out`, comparing the name in the same seqlock read:
    /// the check path's first quota costs one read of the slot, not two.
    #[inline(always)]
    pub(in crate::table) fn read_named_into(
        &self,
        slot: SlotId,
        name_at: u32,
        name: &[u8],
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<SlotRead> {
        let words = names::name_words(self.arena(), name_at, name.len())?;
        // The check will add to line B next: start fetching it now, beside
        // line A and the name, instead of after them.
        prefetch_for_write(&self.slot(slot)?.pending);
        self.read_view_into(
            slot,
            |s| {
                names::equals(words, name)
                    && s.name_len.load(RLX) as usize == name.len()
                    && s.name_at.load(RLX) == name_at
            },
            out,
        )
    }

    /// Reads a slot's view under its seqlock into `out` (where a check's
    /// chain keeps it: no copy) if `matches` holds in the same read; `out`
    /// is written when `Some` is returned.
    #[inline(always)]
    pub(in crate::table) fn read_view_into(
        &self,
        slot: SlotId,
        matches: impl Fn(&Slot) -> bool,
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<SlotRead> {
        let s = self.slot(slot)?;
        for attempt in 0..READ_ATTEMPTS {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let flags = s.flags.load(RLX);
                let live = flags & FLAG_LIVE != 0 && matches(s);
                let parent = s.parent.load(RLX);
                let fill = s.fill_rate.load(RLX);
                let mut view = QuotaSnapshot {
                    limit: f64::from_bits(s.limit.load(RLX)),
                    low_burst: f64::from_bits(s.low_burst.load(RLX)),
                    high_burst: f64::from_bits(s.high_burst.load(RLX)),
                    known: Level {
                        level: f64::from_bits(s.known_level.load(RLX)),
                        at: s.known_at.load(RLX),
                    },
                    fill_rate: f64::from_bits(fill),
                    own_recent: 0.0,
                    window: None,
                    prev: 0.0,
                };
                if flags & (FLAG_WINDOW_MASK | FLAG_SLIDING) != 0 {
                    self.window_view(&mut view, flags, fill);
                }
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    if !live {
                        return None;
                    }
                    // Deltas are plain counters outside the seqlock: a
                    // check reads them after the quota, and the collector
                    // moves weight so that it is never absent from both.
                    let own = s.pending.load(RLX).wrapping_add(s.unacked.load(RLX));
                    view.own_recent = own as i64 as f64;
                    out.write(view);
                    return Some(SlotRead {
                        parent: parent.checked_sub(1),
                        per_key: flags & FLAG_PER_KEY != 0,
                        tiers: flags & FLAG_TIERS != 0,
                    });
                }
            }
            read_pause(attempt);
        }
        None
    }

    /// Completes the view of a window quota's slot: its rule, and for a
    /// sliding window the rate and previous count packed in `fill`.
    #[cold]
    pub(in crate::table) fn window_view(&self, view: &mut QuotaSnapshot, flags: u16, fill: u64) {
        view.window = counting_rule(flags, self.utc_offset());
        if flags & FLAG_SLIDING != 0 {
            (view.fill_rate, view.prev) = unpack_rate_prev(fill);
        }
    }

    /// How the quota in slot `s` counts.
    pub(in crate::table) fn slot_counting(&self, s: &Slot) -> Counting {
        let flags = s.flags.load(RLX);
        Counting::of(
            f64::from_bits(s.limit.load(RLX)),
            counting_rule(flags, self.utc_offset()),
        )
    }

    /// Copies the name of the quota in `slot` into `out` without
    /// allocating; `None` if the slot is not live (or changes meanwhile)
    /// or `out` is too short.
    pub(in crate::table) fn name_into<'a>(
        &self,
        slot: SlotId,
        out: &'a mut [u8],
    ) -> Option<&'a [u8]> {
        let s = self.slot(slot)?;
        for attempt in 0..READ_ATTEMPTS {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let live = s.flags.load(RLX) & FLAG_LIVE != 0;
                let len = s.name_len.load(RLX) as usize;
                let words = names::name_words(self.arena(), s.name_at.load(RLX), len)?;
                let copied = names::load_into(words, len, out);
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    return if live {
                        copied.map(|n| &out[..n])
                    } else {
                        None
                    };
                }
            }
            read_pause(attempt);
        }
        None
    }

    /// The terms of the quota in `slot` (its limit, window and whether it
    /// is per key: what a log line says of it), read under its seqlock
    /// without allocating; `None` if the slot is not live.
    pub(in crate::table) fn terms_of(&self, slot: SlotId) -> Option<Terms> {
        let (view, _) = self.read_view(slot)?;
        let flags = self.slot(slot)?.flags.load(RLX);
        let per_key = flags & FLAG_PER_KEY != 0;
        let in_flight = flags & FLAG_IN_FLIGHT != 0;
        Some(Terms {
            limit: if in_flight {
                view.high_burst
            } else {
                view.limit
            },
            in_flight,
            window: view.window.map(|rule| rule.window),
            sliding: view.window.is_some_and(|rule| rule.sliding),
            per_key,
        })
    }

    /// `(quota id, slot)` of every live quota: what the sync thread maps
    /// root replies with. Rebuild it when [`crate::table::Books::generation`] changes.
    pub(in crate::table) fn slot_ids(&self) -> HashMap<u64, SlotId> {
        let used = self.header().next_unused.load(ACQ) as usize;
        self.slots()[..used]
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((s.quota_id()?, i as SlotId)))
            .collect()
    }

    /// Adds `net` (signed) to the held word of the counter in `slot` if
    /// it is an in-flight quota's: weight that left its `pending` (or,
    /// negative, came back to it).
    pub(in crate::table) fn count_held(&self, slot: SlotId, s: &Slot, net: i64) {
        if net != 0 && s.flags.load(RLX) & FLAG_IN_FLIGHT != 0 {
            self.held()[slot as usize].fetch_add(net as u64, RLX);
        }
    }

    /// Sets the held word of `slot` (a new quota: 0; an adopted one).
    pub(in crate::table) fn set_held(&self, slot: SlotId, held: i64) {
        if let Some(h) = self.held().get(slot as usize) {
            h.store(held as u64, RLX);
        }
    }

    /// Sets a slot's flags to `flags` (the writer lock held), keeping
    /// [`FLAG_QUEUED`] as it is: checks set it concurrently, and the slot
    /// stays in the dirty ring whatever quota it holds.
    pub(in crate::table) fn set_flags(&self, s: &Slot, flags: u16) {
        let _ = s.flags.fetch_update(RLX, RLX, |old| {
            Some(flags & !FLAG_QUEUED | old & FLAG_QUEUED)
        });
    }

    /// The held word of `slot` (0 for a slot out of range).
    pub(in crate::table) fn held_word(&self, slot: SlotId) -> i64 {
        self.held()
            .get(slot as usize)
            .map_or(0, |h| h.load(RLX) as i64)
    }
}

/// What a check reads of a slot besides its view.
#[derive(Clone, Copy)]
pub(in crate::table) struct SlotRead {
    /// Its parent's slot.
    pub parent: Option<SlotId>,
    /// It is a per-key template.
    pub per_key: bool,
    /// It is flagged for the tier section.
    pub tiers: bool,
}

/// Hints the CPU to fetch the cache line holding `at` for writing.
#[inline(always)]
pub(in crate::table) fn prefetch_for_write<T>(at: &T) {
    prefetch_line(at, true);
}

/// Hints the CPU to fetch the cache line holding `at`: for writing (in
/// exclusive state) or for reading (shared, so that lines every worker
/// reads do not bounce between cores).
#[inline(always)]
pub(in crate::table) fn prefetch_line<T>(at: &T, write: bool) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults and reads nothing
    // visible to the program. SSE is baseline on x86_64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        let line = (at as *const T).cast();
        if write {
            _mm_prefetch::<_MM_HINT_ET0>(line);
        } else {
            _mm_prefetch::<_MM_HINT_T0>(line);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, write);
}
