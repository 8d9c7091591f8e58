//! The handover section: where the sync thread leaves, before every
//! exchange it starts, what a thread taking over from it needs to send
//! its requests again under their own numbers (see docs/DESIGN.md,
//! "Exactly once", *A sync thread that dies*).
//!
//! The section holds three parts. Two take turns for the live record,
//! with a header word saying which is current and how long it is: a
//! write fills the other part and then flips the word, so a thread
//! killed while writing leaves the earlier record current, whole. Only
//! the table's sync owner writes it (a thread an nginx reload replaced
//! stops writing), and the record names the process that wrote it, so a
//! successor takes over only the record of the owner it found dead. The
//! third part holds a *retired* record: what a thread that stopped
//! cleanly left unconfirmed (an nginx reload while a root's replies are
//! lost), which whichever thread syncs the table next sends again under
//! the stopped thread's numbers. Every access holds the writer lock. The
//! bytes are the sync side's own encoding; the region only keeps them.

use super::handover_header::{CURRENT_SECOND, CURRENT_SET, OVERFLOWED};
use super::lock::own_pid;
use super::sections::{region_view, ACQ, REL, RLX};

/// The handover section's counters, since the region was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoverStats {
    /// Bytes of the section (both halves).
    pub bytes: u64,
    /// Records written.
    pub written: u64,
    /// Records that did not fit a third of the section.
    pub overflowed: u64,
    /// Takeovers from a dead sync thread's record.
    pub continued: u64,
    /// Takeovers without a usable record (its weight sent again as new).
    pub resent: u64,
}

/// What a successor found of its predecessor's record.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    /// None: no record, or one another process wrote.
    Missing,
    /// The predecessor's last record did not fit the section.
    Overflowed,
    /// The record's bytes.
    Found(Vec<u8>),
}

region_view!(
    /// The handover section.
    Handover
);

impl Handover<'_> {
    /// Bytes of each of the section's three parts.
    fn part_len(&self) -> usize {
        (self.header().handover.bytes.load(RLX) as usize / 3) & !63
    }

    /// The first byte of part `n` (0 and 1: the live record's, 2: the
    /// retired record's).
    fn part(&self, n: usize) -> *mut u8 {
        // SAFETY: the section is `bytes` long from its offset, and three
        // parts of `part_len` fit it.
        unsafe { self.handover_base().add(n.min(2) * self.part_len()) }
    }

    /// Leaves `record` as the retired record of a thread that stopped
    /// cleanly; false when there is one already (not taken yet) or it
    /// does not fit.
    pub(in crate::table) fn retire(&self, record: &[u8]) -> bool {
        let _guard = self.lock();
        let h = &self.header().handover;
        if h.retired.load(ACQ) != 0 || record.is_empty() || record.len() > self.part_len() {
            return false;
        }
        // SAFETY: the part is `part_len` bytes and `record` fits it; the
        // writer lock keeps every other reader and writer out.
        unsafe { std::ptr::copy_nonoverlapping(record.as_ptr(), self.part(2), record.len()) };
        h.retired.store(CURRENT_SET | record.len() as u64, REL);
        true
    }

    /// True when a retired record waits (one load, no lock).
    pub(in crate::table) fn has_retired(&self) -> bool {
        self.header().handover.retired.load(ACQ) != 0
    }

    /// Takes the retired record, if there is one: it is gone from the
    /// region then.
    pub(in crate::table) fn take_retired(&self) -> Option<Vec<u8>> {
        let _guard = self.lock();
        let h = &self.header().handover;
        let retired = h.retired.swap(0, ACQ);
        let len = (retired & 0xffff_ffff) as usize;
        if retired == 0 || len > self.part_len() {
            return None;
        }
        let mut out = vec![0u8; len];
        // SAFETY: `len` bytes of the third part are the record's (checked
        // against the part's length); the writer lock is held.
        unsafe { std::ptr::copy_nonoverlapping(self.part(2), out.as_mut_ptr(), len) };
        Some(out)
    }

    /// Leaves `record` for a successor, if this process is the table's
    /// sync owner; false when it did not fit (a successor then finds
    /// [`Record::Overflowed`]) or this process is not the owner.
    pub(in crate::table) fn write(&self, record: &[u8]) -> bool {
        let _guard = self.lock();
        let h = &self.header().handover;
        let me = own_pid();
        if self.header().sync_owner.load(ACQ) != me || h.bytes.load(RLX) == 0 {
            return false;
        }
        if record.len() > self.part_len() {
            h.writer.store(me, RLX);
            h.current.store(OVERFLOWED, REL);
            h.overflowed.fetch_add(1, RLX);
            return false;
        }
        let second =
            h.current.load(ACQ) & (CURRENT_SECOND | CURRENT_SET) != CURRENT_SECOND | CURRENT_SET;
        // SAFETY: the part is `part_len` bytes and `record` fits it; the
        // writer lock keeps every other reader and writer out.
        unsafe {
            std::ptr::copy_nonoverlapping(
                record.as_ptr(),
                self.part(usize::from(second)),
                record.len(),
            )
        };
        let which = if second { CURRENT_SECOND } else { 0 };
        h.writer.store(me, RLX);
        h.current
            .store(which | CURRENT_SET | record.len() as u64, REL);
        h.written.fetch_add(1, RLX);
        true
    }

    /// The record `writer` left, if the current one is its.
    pub(in crate::table) fn read(&self, writer: u32) -> Record {
        let _guard = self.lock();
        let h = &self.header().handover;
        let current = h.current.load(ACQ);
        if current == 0 || h.writer.load(RLX) != writer {
            return Record::Missing;
        }
        if current == OVERFLOWED {
            return Record::Overflowed;
        }
        let len = (current & 0xffff_ffff) as usize;
        if len > self.part_len() {
            return Record::Missing;
        }
        let mut out = vec![0u8; len];
        // SAFETY: `len` bytes of the part are the record's (checked
        // against the part's length); the writer lock is held.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.part(usize::from(current & CURRENT_SECOND != 0)),
                out.as_mut_ptr(),
                len,
            )
        };
        Record::Found(out)
    }

    /// Forgets the record if `writer` wrote it (its weight was handed
    /// back or taken over: nobody is to send it again).
    pub(in crate::table) fn clear(&self, writer: u32) {
        let _guard = self.lock();
        let h = &self.header().handover;
        if h.writer.load(RLX) == writer {
            h.current.store(0, REL);
            h.writer.store(0, RLX);
        }
    }

    /// Counts a takeover from a dead sync thread: by its record
    /// (`continued`) or with its weight sent again as new.
    pub(in crate::table) fn count_takeover(&self, continued: bool) {
        let h = &self.header().handover;
        let word = if continued { &h.continued } else { &h.resent };
        word.fetch_add(1, RLX);
    }

    /// The section's counters.
    pub(in crate::table) fn stats(&self) -> HandoverStats {
        let h = &self.header().handover;
        HandoverStats {
            bytes: u64::from(h.bytes.load(RLX)),
            written: h.written.load(RLX),
            overflowed: h.overflowed.load(RLX),
            continued: h.continued.load(RLX),
            resent: h.resent.load(RLX),
        }
    }

    /// Pretends the current record and the sync ownership are those of
    /// process `pid` (tests: a successor in the same process).
    #[cfg(test)]
    pub(in crate::table) fn pretend_written_by(&self, pid: u32) {
        let _guard = self.lock();
        self.header().handover.writer.store(pid, RLX);
        self.header().sync_owner.store(pid, REL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_a_sixteenth_at_most_16_mib_in_whole_lines() {
        use crate::table::region::geometry::handover_bytes_for;
        assert_eq!(handover_bytes_for(0), 0);
        // Three parts of whole lines: 21 KiB each at 1 MiB.
        assert_eq!((handover_bytes_for(1 << 20) / 3) & !63, 21824);
        assert_eq!(handover_bytes_for(1 << 20), 64 << 10);
        assert_eq!(handover_bytes_for(32 << 20), 2 << 20);
        assert_eq!(handover_bytes_for(1 << 40), 16 << 20);
        assert_eq!(handover_bytes_for((32 << 20) + 100) % 64, 0);
    }

    #[test]
    fn the_owner_leaves_records_in_turns_and_a_successor_reads_the_last_whole() {
        let t = crate::table::Table::new_heap_handing_over(8, 16, 0, 64 << 10);
        let h = Handover::of(t.region());
        let me = own_pid();
        // Not the sync owner yet: nothing is written.
        assert!(!h.write(b"first"));
        assert_eq!(h.read(me), Record::Missing);
        t.books().claim_sync();
        assert!(h.write(b"first"));
        assert!(h.write(b"second, longer"));
        assert_eq!(h.read(me), Record::Found(b"second, longer".to_vec()));
        assert!(h.write(b"third"));
        assert_eq!(h.read(me), Record::Found(b"third".to_vec()));
        // Another process's record is not this one's to take.
        assert_eq!(h.read(me + 1), Record::Missing);
        // Too large for a part: a successor learns it overflowed.
        assert!(!h.write(&vec![7u8; h.part_len() + 1]));
        assert_eq!(h.read(me), Record::Overflowed);
        assert!(h.write(&vec![7u8; h.part_len()]));
        assert_eq!(h.read(me), Record::Found(vec![7u8; h.part_len()]));
        h.clear(me);
        assert_eq!(h.read(me), Record::Missing);
        let s = h.stats();
        assert_eq!((s.written, s.overflowed), (4, 1));
    }

    #[test]
    fn one_retired_record_waits_at_a_time_and_is_taken_once() {
        let t = crate::table::Table::new_heap_handing_over(8, 16, 0, 64 << 10);
        let h = Handover::of(t.region());
        assert!(!h.has_retired());
        assert_eq!(h.take_retired(), None);
        assert!(h.retire(b"stopped"));
        assert!(h.has_retired());
        assert!(!h.retire(b"another"), "the first still waits");
        assert_eq!(h.take_retired(), Some(b"stopped".to_vec()));
        assert_eq!(h.take_retired(), None);
        assert!(!h.retire(&vec![1u8; h.part_len() + 1]));
        assert!(h.retire(b"another"));
        // The live record's parts are not the retired one's.
        t.books().claim_sync();
        assert!(h.write(&vec![2u8; h.part_len()]));
        assert!(h.write(&vec![3u8; h.part_len()]));
        assert_eq!(h.take_retired(), Some(b"another".to_vec()));
        assert_eq!(h.read(own_pid()), Record::Found(vec![3u8; h.part_len()]));
    }
}
