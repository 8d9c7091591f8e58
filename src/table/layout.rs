//! The table region's format: a header, an index, slots, a name arena.
//!
//! ```text
//! +--------+------------+-----------------+-------------------------+-------+
//! | Header | SyncStatus | index: [u64; N] | slots: [Slot; capacity] | arena |
//! +--------+------------+-----------------+-------------------------+-------+
//! ```
//!
//! Everything is an atomic integer at a fixed offset from the region's
//! start: no pointers, so the region works at any address in any process,
//! and all-zero bytes are a valid (empty) state of every field. Sections
//! start on 64-byte lines.
//!
//! A [`Slot`] is two cache lines. Line A holds everything a check reads
//! (quota numbers, the cluster level, the parent link) under the slot's
//! seqlock; line B holds what a check writes (the local delta, request
//! counts) and the quota's identity. A free slot keeps its free-list link
//! in `id`, marked so it never equals a quota id. An index entry names both
//! the slot and the name's place in the arena, so a lookup's second round
//! of cache misses (slot and name) happens in parallel: a cold check costs
//! about two memory latencies, not three.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

/// Marks a formatted region: "SLUICE" + layout version 1.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SLUICE\x00\x01");
/// Bumped whenever the layout changes, so an old zone is never misread.
pub const LAYOUT_VERSION: u32 = 4;
/// Bytes of one name-arena granule.
pub const GRANULE: usize = 16;
/// Size classes of name allocations: 1..=16 granules (names ≤ 256 bytes).
pub const NAME_CLASSES: usize = 16;
/// Largest slot count: index entries keep the slot in 24 bits.
pub const MAX_CAPACITY: u32 = (1 << 24) - 2;

/// Index entry meaning "never used": a probe stops here.
pub const INDEX_EMPTY: u64 = 0;
/// Index entry meaning "deleted": a probe continues past it.
pub const INDEX_TOMBSTONE: u64 = u64::MAX;

/// An index entry: 8-bit hash tag, slot + 1 (24 bits), name granule (32
/// bits). Slot + 1 is never 0 and never all ones, so no entry equals
/// [`INDEX_EMPTY`] or [`INDEX_TOMBSTONE`].
pub fn index_entry(hash: u64, slot: u32, name_at: u32) -> u64 {
    (hash >> 56) << 56 | u64::from(slot + 1) << 32 | u64::from(name_at)
}

/// True when `entry` is live and carries the tag of `hash`.
pub fn entry_matches(entry: u64, hash: u64) -> bool {
    entry != INDEX_EMPTY && entry != INDEX_TOMBSTONE && entry >> 56 == hash >> 56
}

/// The slot and name granule of a live entry.
pub fn entry_parts(entry: u64) -> (u32, u32) {
    (
        (((entry >> 32) & 0x00ff_ffff) as u32).wrapping_sub(1),
        entry as u32,
    )
}

/// Where a probe for `hash` starts in an index of `len` entries
/// (multiply-shift, so `len` need not be a power of two).
pub fn index_home(hash: u64, len: usize) -> usize {
    ((u128::from(hash as u32) * len as u128) >> 32) as usize
}

/// Slot flag: the slot holds a live quota.
pub const FLAG_LIVE: u16 = 1;

/// Marks a free slot's `id` as a free-list link, so no lookup by id ever
/// matches a free slot: `Quota::validate` refuses ids above
/// [`crate::core::quota::MAX_QUOTA_ID`], which is below this bit.
pub const FREE_LINK: u64 = 1 << 63;

/// The region's first lines: geometry, allocation state, table-wide state.
#[repr(C, align(64))]
#[derive(Default)]
pub struct Header {
    /// [`MAGIC`] once formatted.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`] of the format.
    pub layout_version: AtomicU32,
    /// Number of slots.
    pub capacity: AtomicU32,
    /// Number of index entries (1.5 per slot, whole cache lines).
    pub index_len: AtomicU32,
    /// Number of 16-byte granules in the name arena.
    pub arena_granules: AtomicU32,
    /// Total region bytes the format was laid out for.
    pub region_len: AtomicU64,
    /// Writer lock: 0 when free, else the holder's process id.
    pub writer: AtomicU32,
    /// Live quotas.
    pub live: AtomicU32,
    /// Head of the free slot list (slot + 1; 0 = empty).
    pub free_slots: AtomicU32,
    /// Slots `[next_unused, capacity)` were never used.
    pub next_unused: AtomicU32,
    /// Granules `[arena_next, arena_granules)` were never used.
    pub arena_next: AtomicU32,
    /// Tombstones in the index.
    pub index_tombstones: AtomicU32,

    /// Heads of the free name-chunk lists, per size class (granule + 1).
    pub arena_free: [AtomicU32; NAME_CLASSES],

    /// Highest quota epoch applied.
    pub max_epoch: AtomicU64,
    /// Even while the index is stable, odd while it is rebuilt; a lookup
    /// that misses retries if it changed.
    pub index_seq: AtomicU32,
    /// Extrapolation mode: 0 adaptive, 1 constant ratio.
    pub estimator_mode: AtomicU32,
    /// Constant-ratio `ratio` (f64 bits).
    pub estimator_ratio: AtomicU64,
    /// Extrapolation horizon, nanoseconds.
    pub estimator_horizon: AtomicU64,
    /// Checks of names with no quota.
    pub unknown_checks: AtomicU64,
    /// Quotas refused because the table or the arena was full.
    pub refused_quotas: AtomicU64,
    /// Bumped on every structural change (insert, delete, re-link), so
    /// holders of slot maps (the sync thread) know to rebuild them.
    pub generation: AtomicU64,
    /// Process id of the last process that started a sync thread on the
    /// table (0: none yet).
    pub sync_owner: AtomicU32,
}

/// Roots whose sync state the region can publish.
pub const STATUS_ROOTS: usize = 16;

/// Sync state of one root, as published by the sync thread.
#[repr(C, align(64))]
#[derive(Default)]
pub struct RootStatus {
    /// 1 when the last attempt succeeded.
    pub up: AtomicU64,
    /// Local monotonic time of the last success (ns; 0: never).
    pub last_success: AtomicU64,
    /// Successful syncs.
    pub syncs: AtomicU64,
    /// Failed syncs.
    pub errors: AtomicU64,
    /// Last round trip, ns.
    pub round_trip: AtomicU64,
    /// Clock offset to the root, ns (i64 bits).
    pub clock_offset: AtomicU64,
    /// Request bytes sent.
    pub bytes_sent: AtomicU64,
    /// Response bytes received.
    pub bytes_received: AtomicU64,
    /// Owed deltas dropped.
    pub dropped_deltas: AtomicU64,
}

/// What the sync thread publishes for every process sharing the region
/// (nginx workers other than the one running sync serve the metrics too).
#[repr(C, align(64))]
#[derive(Default)]
pub struct SyncStatus {
    /// Seqlock over the whole block.
    pub seq: AtomicU32,
    /// Roots published.
    pub roots: AtomicU32,
    /// Completed sync cycles.
    pub cycles: AtomicU64,
    /// 1 while every root has been unreachable for two intervals.
    pub all_roots_down: AtomicU64,
    /// Per-root state, in configuration order.
    pub root: [RootStatus; STATUS_ROOTS],
}

/// One quota and its counter: 128 bytes, two cache lines.
#[repr(C, align(64))]
#[derive(Default)]
pub struct Slot {
    // ---- line A: read by every check, written under `seq` ----
    /// Seqlock: odd while a writer changes line A (or the name).
    pub seq: AtomicU32,
    /// [`FLAG_LIVE`] or 0.
    pub flags: AtomicU16,
    /// Name length in bytes (at most 255).
    pub name_len: AtomicU16,
    /// Parent's slot + 1; 0 for none.
    pub parent: AtomicU32,
    /// First granule of the name in the arena.
    pub name_at: AtomicU32,
    /// Leak rate, units/s (f64 bits).
    pub limit: AtomicU64,
    /// Low burst (f64 bits).
    pub low_burst: AtomicU64,
    /// High burst (f64 bits).
    pub high_burst: AtomicU64,
    /// Cluster level at the last merge (f64 bits).
    pub known_level: AtomicU64,
    /// Local time of `known_level`, nanoseconds.
    pub known_at: AtomicU64,
    /// Other hosts' measured fill rate, units/s (f64 bits).
    pub fill_rate: AtomicU64,

    // ---- line B: written by checks and the sync thread ----
    /// Weight admitted here and not yet collected for a sync.
    pub pending: AtomicU64,
    /// Weight collected and sent, not yet included in `known_level`.
    pub inflight: AtomicU64,
    /// Checks that passed (requests, not weight).
    pub passed: AtomicU64,
    /// Checks that were rejected.
    pub rejected: AtomicU64,
    /// Checks that would have been rejected, let through by a dry run.
    pub dry_run: AtomicU64,
    /// Quota id (the counter's name in the sync protocol); while the slot
    /// is free, [`FREE_LINK`] | next free slot + 1 (0: end of list).
    pub id: AtomicU64,
    /// Epoch of the quota version held.
    pub epoch: AtomicU64,
    /// Parent quota id; 0 for none (ids start at 1).
    pub parent_id: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 128);

impl Slot {
    /// The id of the quota the slot holds; `None` when it is free, or was
    /// freed while the caller read it (its `id` is then a marked link).
    pub fn quota_id(&self) -> Option<u64> {
        let live = self.flags.load(Ordering::Relaxed) & FLAG_LIVE != 0;
        let id = self.id.load(Ordering::Relaxed);
        (live && id & FREE_LINK == 0).then_some(id)
    }
}
const _: () = assert!(std::mem::size_of::<Header>() % 64 == 0);

/// Rounds `n` up to a multiple of 64.
pub const fn line_up(n: usize) -> usize {
    (n + 63) & !63
}

/// Where each section of a region starts, for a given geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Number of slots.
    pub capacity: u32,
    /// Number of index entries.
    pub index_len: u32,
    /// Number of arena granules.
    pub arena_granules: u32,
}

impl Geometry {
    /// Geometry for `capacity` quotas with names averaging
    /// `avg_name_bytes` (rounded up to granules, at least one).
    pub fn new(capacity: u32, avg_name_bytes: usize) -> Self {
        let capacity = capacity.clamp(1, MAX_CAPACITY);
        // Load stays at most 2/3: a miss ends within a line or two.
        let index_len = ((capacity as usize * 3).div_ceil(2).div_ceil(8) * 8).max(16) as u32;
        let per_name = avg_name_bytes.div_ceil(GRANULE).max(1);
        let arena_granules = (capacity as usize * per_name).min(u32::MAX as usize) as u32;
        Self {
            capacity,
            index_len,
            arena_granules,
        }
    }

    /// The largest geometry that fits `bytes` for the given average name.
    pub fn fitting(bytes: usize, avg_name_bytes: usize) -> Option<Self> {
        let per_name = avg_name_bytes.div_ceil(GRANULE).max(1) * GRANULE;
        let per_quota = std::mem::size_of::<Slot>() + 12 + per_name;
        let fixed = Self::index_offset() + 64 * 4;
        let mut capacity =
            (bytes.checked_sub(fixed)? / per_quota).min(MAX_CAPACITY as usize) as u32;
        while capacity > 0 {
            let g = Self::new(capacity, avg_name_bytes);
            if g.region_len() <= bytes {
                return Some(g);
            }
            capacity -= (capacity / 64).max(1);
        }
        None
    }

    /// Offset of the sync status block.
    pub const fn status_offset() -> usize {
        line_up(std::mem::size_of::<Header>())
    }

    /// Offset of the index.
    pub const fn index_offset() -> usize {
        line_up(Self::status_offset() + std::mem::size_of::<SyncStatus>())
    }

    /// Offset of slot 0.
    pub fn slots_offset(&self) -> usize {
        line_up(Self::index_offset() + self.index_len as usize * 8)
    }

    /// Offset of the arena.
    pub fn arena_offset(&self) -> usize {
        line_up(self.slots_offset() + self.capacity as usize * std::mem::size_of::<Slot>())
    }

    /// Total bytes of a region with this geometry.
    pub fn region_len(&self) -> usize {
        line_up(self.arena_offset() + self.arena_granules as usize * GRANULE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_never_look_empty_or_deleted() {
        for (slot, at) in [(0, 0), (MAX_CAPACITY - 1, u32::MAX), (5, 77)] {
            for hash in [0, u64::MAX, 0x1234_5678_9abc_def0] {
                let e = index_entry(hash, slot, at);
                assert!(entry_matches(e, hash));
                assert_eq!(entry_parts(e), (slot, at));
            }
        }
        assert!(!entry_matches(INDEX_EMPTY, 0));
        assert!(!entry_matches(INDEX_TOMBSTONE, u64::MAX));
        assert!(index_home(u64::MAX, 1504) < 1504);
    }

    #[test]
    fn sections_are_line_aligned_and_do_not_overlap() {
        let g = Geometry::new(1000, 24);
        assert_eq!(g.index_len, 1504);
        assert_eq!(Geometry::index_offset() % 64, 0);
        assert_eq!(g.slots_offset() % 64, 0);
        assert!(g.slots_offset() >= Geometry::index_offset() + 1504 * 8);
        assert!(g.arena_offset() >= g.slots_offset() + 1000 * 128);
        assert!(g.region_len() >= g.arena_offset() + 2000 * GRANULE);
    }

    #[test]
    fn fitting_uses_the_space_it_is_given() {
        for bytes in [64 << 10, 1 << 20, 10 << 20, 100 << 20] {
            let g = Geometry::fitting(bytes, 32).unwrap();
            assert!(g.region_len() <= bytes);
            // At least 80% of what an ideal packing would hold.
            let ideal = bytes / (128 + 12 + 32);
            assert!(g.capacity as usize * 10 >= ideal * 7, "{bytes}: {g:?}");
        }
        assert!(Geometry::fitting(100, 32).is_none());
    }
}
