//! The handover section's shared words, in the region's header (see
//! `handover.rs` for the section itself).

use std::sync::atomic::{AtomicU32, AtomicU64};

/// The handover section's shared words (in the region's header).
#[repr(C, align(64))]
#[derive(Default)]
pub struct HandoverHeader {
    /// Bytes of the section, both halves (0: the region has none).
    pub bytes: AtomicU32,
    /// Process id of the sync thread that wrote the current record.
    pub writer: AtomicU32,
    /// The current record: [`CURRENT_SECOND`] says which of the first two
    /// parts holds it, the low 32 bits its length; 0 when there is none.
    pub current: AtomicU64,
    /// Records written.
    pub written: AtomicU64,
    /// Records that did not fit a part: the current one then says
    /// [`OVERFLOWED`], and a successor sends the weight again as new.
    pub overflowed: AtomicU64,
    /// The retired record: [`CURRENT_SET`] and its length; 0 when there
    /// is none.
    pub retired: AtomicU64,
    /// Sync threads that took over from a dead one by its record.
    pub continued: AtomicU64,
    /// Sync threads that took over from a dead one without a record they
    /// could use: its weight was sent again as new.
    pub resent: AtomicU64,
}

/// [`HandoverHeader::current`] bit: the record is in the second part.
pub const CURRENT_SECOND: u64 = 1 << 63;
/// [`HandoverHeader::current`] bit: a record is there (a 0-byte record
/// is one).
pub const CURRENT_SET: u64 = 1 << 62;
/// [`HandoverHeader::current`] value: the last record did not fit.
pub const OVERFLOWED: u64 = 1 << 61;
