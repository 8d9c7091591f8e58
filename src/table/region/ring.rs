//! Dirty rings: bounded queues in the region of the counters (key entries,
//! named quotas' slots) that got weight since the last collection, so a
//! sync costs the counters that changed, not the counters that exist.
//!
//! Checks push, each counter at most once between two collections (its
//! own queued bit says whether it sits in the ring); the sync thread, the
//! writer lock held, drains. A full ring sets its overflow word and the
//! next collection scans every counter instead, so nothing is lost; a
//! position reserved and never written (its producer died mid-push)
//! holds the collector up for [`RING_STUCK_LIMIT`] collections, then is
//! skipped, and that collection scans too.
//!
//! [`DirtySlots`] marks named quotas: a check's add that finds `pending`
//! at zero, a rejection, and every other change of `pending` from zero
//! (returns, requeues, adopted weight) queue the slot.

use std::sync::atomic::{fence, AtomicU64, Ordering::AcqRel, Ordering::SeqCst};

use super::layout::{RingHead, FLAG_QUEUED};
use super::sections::{region_view, SlotId, ACQ, REL, RLX};

/// Collections a reserved but unwritten ring position may hold up the
/// collector before it is skipped (its producer died mid-write) and every
/// counter is scanned instead.
pub(in crate::table) const RING_STUCK_LIMIT: u32 = 16;

/// One dirty ring: its positions in the header and its cells.
#[derive(Clone, Copy)]
pub(in crate::table) struct Ring<'r> {
    pub(in crate::table) head: &'r RingHead,
    pub(in crate::table) cells: &'r [AtomicU64],
}

impl Ring<'_> {
    /// Queues `at`; a full ring (or one of no cells) makes the next
    /// collection scan everything instead.
    pub(in crate::table) fn push(&self, at: u32) {
        let len = self.cells.len() as u64;
        loop {
            let head = self.head.head.load(ACQ);
            if head.wrapping_sub(self.head.tail.load(ACQ)) >= len {
                self.head.overflow.store(1, REL);
                return;
            }
            if self
                .head
                .head
                .compare_exchange_weak(head, head + 1, AcqRel, RLX)
                .is_ok()
            {
                self.cells[(head % len) as usize].store(ring_cell(head, at), REL);
                return;
            }
        }
    }

    /// Calls `each` with every entry queued since the last drain, in
    /// order, and takes them off the ring; entries pushed meanwhile stay
    /// for the next drain. True when the caller must scan every counter
    /// as well: the ring overflowed since the last drain, or a position
    /// stayed unwritten too long and was skipped. Only one drain runs at
    /// a time (the writer lock).
    pub(in crate::table) fn drain(&self, mut each: impl FnMut(u32)) -> bool {
        let h = self.head;
        let len = self.cells.len() as u64;
        let head = h.head.load(ACQ);
        let mut tail = h.tail.load(RLX);
        let mut stuck = false;
        while tail != head {
            let cell = &self.cells[(tail % len) as usize];
            if let Some(at) = ring_entry(cell.load(ACQ), tail) {
                cell.store(0, RLX);
                each(at);
            } else {
                // Reserved, not written yet (or holding a late write for
                // an earlier lap): wait for the writer, unless it has held
                // the ring up for too long (it died, or was descheduled
                // that long). Its counter is then found by the scan; its
                // late write carries its own position, so it is never
                // taken for a later lap's entry.
                let waited = h.stuck.fetch_add(1, RLX) + 1;
                if waited < RING_STUCK_LIMIT {
                    break;
                }
                stuck = true;
            }
            h.stuck.store(0, RLX);
            tail = tail.wrapping_add(1);
        }
        h.tail.store(tail, REL);
        h.overflow.swap(0, ACQ) != 0 || stuck
    }

    /// Calls `each` with the entries queued now, leaving them queued;
    /// false when that is not every counter with unsent weight (the ring
    /// overflowed since the last drain).
    pub(in crate::table) fn peek(&self, mut each: impl FnMut(u32)) -> bool {
        let h = self.head;
        let len = self.cells.len() as u64;
        let head = h.head.load(ACQ);
        let mut at = h.tail.load(ACQ);
        while at != head {
            if let Some(entry) = ring_entry(self.cells[(at % len) as usize].load(ACQ), at) {
                each(entry);
            }
            at = at.wrapping_add(1);
        }
        h.overflow.load(ACQ) == 0
    }

    /// Makes the next drain ask for a scan of every counter.
    pub(in crate::table) fn scan_next(&self) {
        self.head.overflow.store(1, REL);
    }
}

region_view!(
    /// Named quotas' slots queued for the next collection.
    DirtySlots
);

impl<'r> DirtySlots<'r> {
    /// The ring of named quotas' slots.
    pub(in crate::table) fn ring(&self) -> Ring<'r> {
        let region = self.region();
        Ring {
            head: &region.header().slot_ring,
            cells: region.slot_ring(),
        }
    }

    /// Queues `slot` for the next collection unless it is queued already:
    /// its `pending` just changed from zero, or it rejected a check. Off
    /// the request path's straight line (a check calls it only when the
    /// add found `pending` at zero).
    #[cold]
    #[inline(never)]
    pub(in crate::table) fn mark(&self, slot: SlotId) {
        let Some(s) = self.slot(slot) else { return };
        // Between the change and the look at the flag, as the collector
        // has one between clearing the flag and reading the counter: one
        // of the two sees the other's write.
        fence(SeqCst);
        if s.flags.load(RLX) & FLAG_QUEUED == 0
            && s.flags.fetch_or(FLAG_QUEUED, SeqCst) & FLAG_QUEUED == 0
        {
            self.ring().push(slot);
        }
    }

    /// Takes `slot` off the queued state before the collector reads its
    /// counter (see [`DirtySlots::mark`]); the writer lock is held. A
    /// slot not queued needs nothing: a check that changes it now finds
    /// the flag clear and queues it.
    pub(in crate::table) fn unmark(&self, slot: SlotId) {
        let Some(s) = self.slot(slot) else { return };
        if s.flags.load(RLX) & FLAG_QUEUED != 0 {
            s.flags.fetch_and(!FLAG_QUEUED, SeqCst);
            fence(SeqCst);
        }
    }
}

/// A dirty-ring cell: the entry (plus one) with the low 32 bits of the
/// ring position it was written for, so that a write arriving after the
/// collector gave up on its position can never pass for the entry of a
/// later lap (whose producer's own write would then land behind the
/// tail and be lost).
pub(in crate::table) fn ring_cell(position: u64, at: u32) -> u64 {
    (position << 32) | (u64::from(at) + 1)
}

/// The entry a ring cell holds for `position`, if it was written for it.
pub(in crate::table) fn ring_entry(cell: u64, position: u64) -> Option<u32> {
    let at = (cell & 0xffff_ffff) as u32;
    (at != 0 && cell >> 32 == position & 0xffff_ffff).then(|| at - 1)
}
