//! The region itself: where it lives (a heap mapping, or memory a caller
//! lends, such as an nginx zone), how a new one is formatted and an old
//! one attached to, and the accessors that turn its offsets into the
//! sections of [`super::layout`]. Every other file of the table reaches
//! the bytes through [`Region`]'s accessors; none does pointer arithmetic
//! of its own.

use crate::core::estimate::Estimator;
use crate::core::Extrapolation;
use std::sync::atomic::{AtomicU64, Ordering};

use super::geometry::Geometry;
use super::heap::HeapRegion;
use super::layout::{
    Header, HoldRecord, KeyBucket, Slot, SyncStatus, TierEntry, LAYOUT_VERSION, MAGIC,
};

pub(in crate::table) const ACQ: Ordering = Ordering::Acquire;
pub(in crate::table) const REL: Ordering = Ordering::Release;
pub(in crate::table) const RLX: Ordering = Ordering::Relaxed;

/// Seqlock read attempts that spin before a reader yields its CPU.
pub(in crate::table) const READ_RETRIES: u32 = 1000;

/// Seqlock read attempts in all, before a check gives up and fails open:
/// past [`READ_RETRIES`] each follows a yield of the CPU. A writer
/// descheduled mid-write (a loaded host, two cores) finishes only once it
/// runs again; spinning alone, a reader gave up within microseconds and a
/// known quota read as unknown (`vs_governor`'s million keys, one check
/// in a few hundred thousand).
pub(in crate::table) const READ_ATTEMPTS: u32 = READ_RETRIES + 10_000;

/// The pause after failed seqlock read attempt `attempt`: a spin at
/// first, then a yield of the CPU.
#[inline]
pub(in crate::table) fn read_pause(attempt: u32) {
    if attempt < READ_RETRIES {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A slot number in the table.
pub type SlotId = u32;

/// Errors of table construction and quota writes.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TableError {
    /// Every slot holds a live quota.
    #[error(
        "quota table is full ({capacity} quotas); quota {name:?} refused, existing quotas kept"
    )]
    Full {
        /// Slots in the table.
        capacity: u32,
        /// The quota that did not fit.
        name: String,
    },
    /// The name arena has no room for this name.
    #[error("quota table name space is full; quota {name:?} refused, existing quotas kept")]
    NamesFull {
        /// The quota that did not fit.
        name: String,
    },
    /// The quota itself is invalid.
    #[error("quota {name:?} is invalid: {error}")]
    Invalid {
        /// The quota's name.
        name: String,
        /// What is wrong.
        error: crate::core::ValidationError,
    },
    /// The region is too small for even one quota, or not aligned.
    #[error("table region of {have} bytes is unusable: {why}")]
    BadRegion {
        /// Bytes offered.
        have: usize,
        /// Why it cannot be used.
        why: &'static str,
    },
    /// The region holds a table of another format or size.
    #[error("table region holds an incompatible table: {0}")]
    Incompatible(&'static str),
}

/// The table's memory: a base pointer and the geometry that places its
/// sections. It decides nothing; the request face and the sync face
/// (`gate/`, `books/`) read and write the sections through it.
pub struct Region {
    base: *mut u8,
    geometry: Geometry,
    /// Where the sections start, worked out once: the request path reads
    /// them on every check.
    offsets: Offsets,
    /// Keeps a heap region alive; `None` for borrowed (shared) memory.
    _owned: Option<HeapRegion>,
}

/// Byte offsets of a region's sections (see [`Geometry`]).
#[derive(Clone, Copy, Debug)]
struct Offsets {
    slots: usize,
    held: usize,
    slot_ring: usize,
    arena: usize,
    key_ring: usize,
    key_buckets: usize,
    tier_entries: usize,
    tier_filter: usize,
    holds: usize,
    handover: usize,
}

impl Offsets {
    fn of(g: &Geometry) -> Self {
        Self {
            slots: g.slots_offset(),
            held: g.held_offset(),
            slot_ring: g.slot_ring_offset(),
            arena: g.arena_offset(),
            key_ring: g.key_ring_offset(),
            key_buckets: g.key_buckets_offset(),
            tier_entries: g.tier_entries_offset(),
            tier_filter: g.tier_filter_offset(),
            holds: g.holds_offset(),
            handover: g.handover_offset(),
        }
    }
}

// SAFETY: every byte of the region is accessed through atomics, and the
// region outlives the Region (owned, or guaranteed by `from_raw`'s caller).
unsafe impl Send for Region {}
// SAFETY: as above; all shared access is atomic.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl Region {
    /// A formatted region on the heap for `geometry`.
    pub(in crate::table) fn new_heap(geometry: Geometry) -> Region {
        // Anonymous mappings are zeroed: an all-zero region is valid.
        let owned = HeapRegion::new(geometry.region_len());
        let region = Region {
            base: owned.base,
            geometry,
            offsets: Offsets::of(&geometry),
            _owned: Some(owned),
        };
        region.format(geometry.region_len());
        region
    }

    /// The region over `len` bytes at `base` (see `Table::from_raw`, whose
    /// contract this is).
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes, 64-byte
    /// aligned, for as long as the returned region (and anything sharing
    /// the memory) lives, and only ever be accessed through `Region`s.
    /// Unless `reformat`, memory that does not hold a table must be all
    /// zeroes.
    pub(in crate::table) unsafe fn from_raw(
        base: *mut u8,
        len: usize,
        avg_name_bytes: usize,
        key_bytes: usize,
        tier_bytes: usize,
        reformat: bool,
    ) -> Result<Region, TableError> {
        if base.is_null() || (base as usize) % 64 != 0 {
            return Err(TableError::BadRegion {
                have: len,
                why: "not 64-byte aligned",
            });
        }
        let geometry = Geometry::fitting_with(len, avg_name_bytes, key_bytes, tier_bytes).ok_or(
            TableError::BadRegion {
                have: len,
                why: "too small for one quota",
            },
        )?;
        let region = Region {
            base,
            geometry,
            offsets: Offsets::of(&geometry),
            _owned: None,
        };
        let header = region.header();
        if reformat {
            // SAFETY: the caller guarantees `len` writable bytes.
            unsafe { std::ptr::write_bytes(base, 0, geometry.region_len()) };
        }
        if reformat || header.magic.load(ACQ) == 0 {
            region.format(len);
            return Ok(region);
        }
        if header.magic.load(ACQ) != MAGIC || header.layout_version.load(RLX) != LAYOUT_VERSION {
            return Err(TableError::Incompatible("another format or version"));
        }
        let found = Geometry {
            capacity: header.capacity.load(RLX),
            index_len: header.index_len.load(RLX),
            arena_granules: header.arena_granules.load(RLX),
            key_buckets: header.keys.config.buckets.load(RLX),
            key_ring: header.keys.config.ring_len.load(RLX),
            tier_entries: header.tiers.entries.load(RLX),
            tier_filter_blocks: header.tiers.filter_blocks.load(RLX),
            hold_records: header.holds.records.load(RLX),
            handover_bytes: header.handover.bytes.load(RLX),
        };
        if found.region_len() > len {
            return Err(TableError::Incompatible(
                "the region is smaller than its table",
            ));
        }
        Ok(Region {
            base,
            geometry: found,
            offsets: Offsets::of(&found),
            _owned: None,
        })
    }

    fn format(&self, region_len: usize) {
        let h = self.header();
        let g = self.geometry;
        h.layout_version.store(LAYOUT_VERSION, RLX);
        h.capacity.store(g.capacity, RLX);
        h.index_len.store(g.index_len, RLX);
        h.arena_granules.store(g.arena_granules, RLX);
        h.keys.config.buckets.store(g.key_buckets, RLX);
        h.keys.config.ring_len.store(g.key_ring, RLX);
        h.tiers.entries.store(g.tier_entries, RLX);
        h.tiers.filter_blocks.store(g.tier_filter_blocks, RLX);
        h.holds.records.store(g.hold_records, RLX);
        h.handover.bytes.store(g.handover_bytes, RLX);
        let (k0, k1) = crate::core::key::KeySecret::built_in().to_words();
        h.keys.config.secret[0].store(k0, RLX);
        h.keys.config.secret[1].store(k1, RLX);
        h.region_len.store(region_len as u64, RLX);
        self.set_estimator(Estimator::default());
        h.magic.store(MAGIC, REL);
    }

    // ---- the sections --------------------------------------------------

    /// The header: table-wide numbers, settings and locks.
    pub(in crate::table) fn header(&self) -> &Header {
        // SAFETY: the region starts with a Header (64-byte aligned), all of
        // whose fields are atomics for which any bit pattern is valid.
        unsafe { &*self.base.cast::<Header>() }
    }

    /// The sync status block.
    pub(in crate::table) fn status(&self) -> &SyncStatus {
        // SAFETY: the status block follows the header inside the region,
        // 64-byte aligned; it is all atomics.
        unsafe {
            &*self
                .base
                .add(Geometry::status_offset())
                .cast::<SyncStatus>()
        }
    }

    /// The name index.
    pub(in crate::table) fn index(&self) -> &[AtomicU64] {
        // SAFETY: `index_len` u64 atomics start at the index offset, inside
        // the region (Geometry::region_len covers them), 64-byte aligned.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(Geometry::index_offset()).cast::<AtomicU64>(),
                self.geometry().index_len as usize,
            )
        }
    }

    /// Every slot.
    pub(in crate::table) fn slots(&self) -> &[Slot] {
        // SAFETY: `capacity` slots start at the slots offset, 64-aligned,
        // inside the region; Slot is all atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.slots).cast::<Slot>(),
                self.geometry().capacity as usize,
            )
        }
    }

    /// The slots ever taken (below `next_unused`), with their ids: what
    /// every whole-table walk goes over.
    pub(in crate::table) fn used_slots(&self) -> impl Iterator<Item = (SlotId, &Slot)> {
        let used = self.header().next_unused.load(RLX) as usize;
        (0..).zip(&self.slots()[..used])
    }

    /// The held section: one word per slot (see `books/held.rs`).
    pub(in crate::table) fn held(&self) -> &[AtomicU64] {
        // SAFETY: `capacity` u64 atomics start at the held offset, 64-byte
        // aligned, inside the region (Geometry::region_len covers them).
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.held).cast::<AtomicU64>(),
                self.geometry().capacity as usize,
            )
        }
    }

    /// The named quotas' dirty ring (see `ring.rs`).
    pub(in crate::table) fn slot_ring(&self) -> &[AtomicU64] {
        // SAFETY: `slot_ring()` u64 atomics start at the ring offset
        // (64-byte aligned), inside the region (Geometry::region_len
        // covers them).
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.slot_ring).cast::<AtomicU64>(),
                self.geometry().slot_ring() as usize,
            )
        }
    }

    /// The name arena's words.
    pub(in crate::table) fn arena(&self) -> &[AtomicU64] {
        // SAFETY: `arena_granules` 16-byte granules (two u64 atomics each)
        // start at the arena offset, inside the region.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.arena).cast::<AtomicU64>(),
                self.geometry().arena_granules as usize * 2,
            )
        }
    }

    /// The dirty ring of the key section.
    pub(in crate::table) fn key_ring(&self) -> &[AtomicU64] {
        // SAFETY: `key_ring` u64 atomics start at the ring offset (64-byte
        // aligned), inside the region (Geometry::region_len covers them).
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.key_ring).cast::<AtomicU64>(),
                self.geometry().key_ring as usize,
            )
        }
    }

    /// The key section's buckets.
    pub(in crate::table) fn key_buckets(&self) -> &[KeyBucket] {
        // SAFETY: `key_buckets` buckets start at their offset, 64-byte
        // aligned, inside the region; KeyBucket is all atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.key_buckets).cast::<KeyBucket>(),
                self.geometry().key_buckets as usize,
            )
        }
    }

    /// The tier section's entries.
    pub(in crate::table) fn tier_entries(&self) -> &[TierEntry] {
        // SAFETY: `tier_entries` entries start at their offset, 64-byte
        // aligned, inside the region; TierEntry is all atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.tier_entries).cast::<TierEntry>(),
                self.geometry().tier_entries as usize,
            )
        }
    }

    /// Copy `copy` (0 or 1) of the tier filter: its blocks' words.
    pub(in crate::table) fn tier_filter(&self, copy: u32) -> &[AtomicU64] {
        let words = self.geometry().tier_filter_blocks as usize * 8;
        // SAFETY: two copies of `tier_filter_blocks` 64-byte blocks of u64
        // atomics follow the tier entries, inside the region.
        unsafe {
            std::slice::from_raw_parts(
                self.base
                    .add(self.offsets.tier_filter + (copy as usize & 1) * words * 8)
                    .cast::<AtomicU64>(),
                words,
            )
        }
    }

    /// The first byte of the handover section (see `handover.rs`),
    /// [`Geometry::handover_bytes`] long.
    pub(in crate::table) fn handover_base(&self) -> *mut u8 {
        // SAFETY: the section starts at its offset inside the region.
        unsafe { self.base.add(self.offsets.handover) }
    }

    /// The hold records (see `holds.rs`).
    pub(in crate::table) fn hold_records(&self) -> &[HoldRecord] {
        // SAFETY: `hold_records` records start at their offset, 64-byte
        // aligned, inside the region; HoldRecord is all atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.holds).cast::<HoldRecord>(),
                self.geometry().hold_records as usize,
            )
        }
    }

    /// Slot `id`, if the table has it.
    pub(in crate::table) fn slot(&self, id: SlotId) -> Option<&Slot> {
        self.slots().get(id as usize)
    }

    /// Where the region starts, for tests that read its bytes.
    #[cfg(test)]
    pub(in crate::table) fn base(&self) -> *mut u8 {
        self.base
    }

    // ---- table-wide numbers and settings ------------------------------

    /// Number of slots.
    pub(in crate::table) fn capacity(&self) -> u32 {
        self.geometry().capacity
    }

    /// Live quotas.
    pub(in crate::table) fn len(&self) -> u32 {
        self.header().live.load(RLX)
    }

    /// Bytes of the region the table uses.
    pub(in crate::table) fn region_len(&self) -> usize {
        self.geometry().region_len()
    }

    /// The region's geometry.
    pub(in crate::table) fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Highest quota epoch applied.
    pub(in crate::table) fn max_epoch(&self) -> u64 {
        self.header().max_epoch.load(ACQ)
    }

    /// Changes whenever slots are added, removed or re-linked.
    pub(in crate::table) fn generation(&self) -> u64 {
        self.header().generation.load(ACQ)
    }

    /// UTC nanoseconds minus the table's clock, for window quotas (see
    /// [`super::layout::Header::utc_offset`]).
    pub(in crate::table) fn utc_offset(&self) -> i64 {
        self.header().utc_offset.load(RLX) as i64
    }

    /// Sets the UTC offset window quotas use.
    pub(in crate::table) fn set_utc_offset(&self, offset: i64) {
        self.header().utc_offset.store(offset as u64, RLX);
    }

    /// The windows some live quota counts in.
    pub(in crate::table) fn windows_used(&self) -> Vec<crate::core::Window> {
        let used = self.header().windows_used.load(RLX);
        crate::core::Window::ALL
            .into_iter()
            .filter(|w| used & 1 << (w.code() - 1) != 0)
            .collect()
    }

    /// Sets how levels are extrapolated between syncs.
    pub(in crate::table) fn set_estimator(&self, estimator: Estimator) {
        let h = self.header();
        let (mode, ratio) = match estimator.mode {
            Extrapolation::Adaptive => (0, 0.0),
            Extrapolation::ConstantRatio { ratio } => (1, ratio),
        };
        h.estimator_ratio.store(f64::to_bits(ratio), RLX);
        h.estimator_horizon.store(estimator.horizon, RLX);
        h.estimator_mode.store(mode, REL);
    }

    /// How levels are extrapolated between syncs.
    pub(in crate::table) fn estimator(&self) -> Estimator {
        let h = self.header();
        let mode = match h.estimator_mode.load(ACQ) {
            1 => Extrapolation::ConstantRatio {
                ratio: f64::from_bits(h.estimator_ratio.load(RLX)),
            },
            _ => Extrapolation::Adaptive,
        };
        Estimator {
            mode,
            horizon: h.estimator_horizon.load(RLX),
        }
    }
}

/// Declares a view of the region: a copyable handle named for one file's
/// concern, whose methods are that concern's. A view reaches the sections
/// through [`Region`] (it derefs to it), and another file's methods only
/// through that file's view, which it must import: every call between
/// the table's files is an import a reader can follow.
macro_rules! region_view {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        pub(in crate::table) struct $name<'r>(&'r $crate::table::region::Region);

        impl<'r> $name<'r> {
            /// The view of `region`.
            #[inline(always)]
            pub(in crate::table) fn of(region: &'r $crate::table::region::Region) -> Self {
                Self(region)
            }

            /// The region, for what a method returns that lives in it.
            #[allow(dead_code)]
            #[inline(always)]
            pub(in crate::table) fn region(&self) -> &'r $crate::table::region::Region {
                self.0
            }
        }

        impl std::ops::Deref for $name<'_> {
            type Target = $crate::table::region::Region;
            #[inline(always)]
            fn deref(&self) -> &Self::Target {
                self.0
            }
        }
    };
}
pub(in crate::table) use region_view;
