//! The quota table: every quota and counter of a host in one region.
//!
//! The region is fixed-size and holds no pointers (see [`layout`]), so the
//! same bytes work as an nginx shared memory zone mapped into every worker
//! or as a heap block behind the C ABI. Concurrency:
//!
//! - **Checks** ([`Table::check`]) take no lock. They find the slot through
//!   the index, read each quota of the chain under its seqlock (retrying a
//!   bounded number of times, then failing open), decide (a plain check
//!   with [`crate::core::check_chain`], a partial grant with
//!   [`crate::core::grantable`], a paced one with
//!   [`crate::core::reserve_wait`]), and on pass add the weight to each
//!   slot's `pending` with one atomic add. A key of a per-key quota is
//!   found (or placed) in the key section the same way, without a lock;
//!   only a new key whose two buckets are full takes the key lock, for
//!   the moves that make room (see `keys.rs`).
//! - **Writers** (applying quotas, merging counters, collecting deltas)
//!   hold the region's writer lock, a spin lock naming its holder's process
//!   id so a lock left by a crashed process is taken over. Writers never do
//!   IO while holding it.
//! - **Deltas** move `pending → inflight` when collected and leave
//!   `inflight` when a root's reply includes them; each move is an atomic
//!   add/sub pair ordered so a concurrent check may briefly count a weight
//!   twice (rejecting a little early) but never miss it, and no increment
//!   is ever lost.
//!
//! # Layout
//!
//! Every file is one concern; all of them are `impl Table` blocks reaching
//! the same private region accessors defined here.
//!
//! - `mod.rs` — [`Table`], its constructors, the region accessors (header,
//!   status block, index, slots, arena) and table-wide numbers.
//! - `layout.rs` — the region's format: header, status block, slot and
//!   index entry layouts, geometry.
//! - `names.rs` — the name hash, the fingerprint the name hints key on,
//!   and the name arena's words.
//! - `chain.rs` — what a check reads: the name lookup through the index
//!   (and the per-process hints that usually skip it), a quota's view
//!   under its seqlock (with a key's counter in place of its template's),
//!   its ancestors.
//! - `outcome.rs` — what a check is given and answers (items, options,
//!   outcome, rejection, headroom, the charge of a pass), shared by the
//!   files below without their importing each other.
//! - `check.rs` — the request path's decisions: the decide-and-count path
//!   of plain and paced checks (one or several items) and counting a pass.
//! - `fast.rs` — the keyed fast path: a single keyed check of a template
//!   without parent, window or tiers, whose key has an entry and is far
//!   from its limit, decided and counted without a chain; it declines
//!   (counting nothing) whatever else, to `check.rs`.
//! - `grants.rs` — the one-item paths beside it: partial grants,
//!   reservations, weight given back (a held request whose client
//!   left), and charges after the response (counted whatever the level:
//!   a debt) with the settling of an estimate.
//! - `in_flight.rs` — in-flight quotas on the request path: a slot taken
//!   (a check of weight 1) and given back (a return of 1).
//! - `held.rs` — what this host holds of its in-flight quotas (its own
//!   net slots, kept in the region across sync threads), and the local
//!   lease that limits by them alone once every root has been silent
//!   for the in-flight lease.
//! - `write.rs` — applying quotas by epoch, re-linking parents, slot,
//!   name and index allocation.
//! - `counters.rs` — collecting deltas, merging cluster values, folding
//!   locally, in-flight weight, claiming the sync of a dead owner.
//! - `keys.rs` — the counters of per-key quotas and their guarantees:
//!   two candidate buckets a key (cuckoo placement), entries made on first
//!   use and reused only once equal to no entry, the overflow modes of a
//!   full section, counting on a key.
//! - `key_moves.rs` — the key lock, and making room for a new key by
//!   moving entries to their other bucket.
//! - `key_sync.rs` — keys outside the request path: the dirty ring a sync
//!   drains, collecting, merging, folding, in-flight weight, the upkeep
//!   sweep, deleted templates, adopting another table's keys.
//! - `tiers.rs` — tiers per key: overrides of a per-key template for
//!   one key (other numbers, allow, deny) and penalties, in the tier
//!   section behind a filter and a mark in each key's entry; applied to
//!   a check's chain, started by a rejection at the high burst, merged
//!   from the roots.
//! - `snapshot.rs` — reading the table whole (listings, metrics, the id
//!   map) and adopting another table's contents.
//! - `status.rs` — the sync status block every process sharing the region
//!   reads.
//! - `lock.rs` — the writer lock, the seqlock write, process-id helpers.
//! - `heap.rs` — the anonymous mapping behind a heap table.
//! - `file.rs` — quota files applied to a table (authoritative or seeds).
//! - `tests.rs`, `key_tests.rs`, `window_tests.rs`, `tier_tests.rs`,
//!   `in_flight_tests.rs` — unit tests by subject: named quotas, per-key
//!   quotas, window quotas with partial grants and reservations, overrides
//!   and penalties, in-flight slots.

mod chain;
mod check;
mod counters;
mod fast;
#[cfg(test)]
mod fast_tests;
pub mod file;
mod grants;
mod heap;
mod held;
mod in_flight;
mod key_moves;
mod key_sync;
mod keys;
pub mod layout;
mod lock;
pub mod names;
mod outcome;
mod snapshot;
mod status;
mod tiers;
mod write;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::estimate::Estimator;
use crate::core::Extrapolation;

pub use counters::{CollectedDelta, Source};
pub use grants::{Grant, Reservation};
pub use in_flight::HeldSlot;
pub use keys::{KeyOverflow, KeyState, KeyStats, MAX_MOVE_DEPTH};
pub use outcome::{
    Cause, CheckItem, CheckOptions, Headroom, ManyOutcome, Outcome, Rejection, MAX_CHECKS,
};
pub use snapshot::QuotaState;
pub use tiers::{TierRead, TierReport, TierState, TierStats};
pub use write::ApplyReport;

use chain::NameHints;
use heap::HeapRegion;
use layout::{Geometry, Header, KeyBucket, Slot, SyncStatus, TierEntry, LAYOUT_VERSION, MAGIC};

const ACQ: Ordering = Ordering::Acquire;
const REL: Ordering = Ordering::Release;
const RLX: Ordering = Ordering::Relaxed;

/// Seqlock read attempts before a check gives up and fails open.
const READ_RETRIES: u32 = 1000;

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

/// A quota table over a region of memory.
pub struct Table {
    base: *mut u8,
    geometry: Geometry,
    /// Where the sections start, worked out once: the request path reads
    /// them on every check.
    offsets: Offsets,
    /// Keeps a heap region alive; `None` for borrowed (shared) memory.
    _owned: Option<HeapRegion>,
    /// Where names were last found (`chain.rs`), per process.
    name_hints: NameHints,
    /// Passed checks are counted per quota, for `sluice_metrics`; off
    /// for a table nothing reads them from.
    pass_tally: bool,
    /// Single keyed checks try the fast path first (`fast.rs`); tests
    /// turn it off to compare it with the general path.
    #[cfg(test)]
    fast_path: bool,
}

/// Byte offsets of a region's sections (see [`Geometry`]).
#[derive(Clone, Copy, Debug)]
struct Offsets {
    slots: usize,
    held: usize,
    arena: usize,
    key_ring: usize,
    key_buckets: usize,
    tier_entries: usize,
    tier_filter: usize,
}

impl Offsets {
    fn of(g: &Geometry) -> Self {
        Self {
            slots: g.slots_offset(),
            held: g.held_offset(),
            arena: g.arena_offset(),
            key_ring: g.key_ring_offset(),
            key_buckets: g.key_buckets_offset(),
            tier_entries: g.tier_entries_offset(),
            tier_filter: g.tier_filter_offset(),
        }
    }
}

// SAFETY: every byte of the region is accessed through atomics, and the
// region outlives the Table (owned, or guaranteed by `from_raw`'s caller).
unsafe impl Send for Table {}
// SAFETY: as above; all shared access is atomic.
unsafe impl Sync for Table {}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl Table {
    /// A table on the heap for `capacity` quotas with names averaging
    /// `avg_name_bytes`.
    pub fn new_heap(capacity: u32, avg_name_bytes: usize) -> Table {
        Self::new_heap_with_keys(capacity, avg_name_bytes, 0)
    }

    /// [`Table::new_heap`] with room for `keys` keys of per-key quotas
    /// (see `keys.rs`; 0: per-key quotas pass uncounted).
    pub fn new_heap_with_keys(capacity: u32, avg_name_bytes: usize, keys: u64) -> Table {
        Self::new_heap_with(capacity, avg_name_bytes, keys, 0)
    }

    /// [`Table::new_heap_with_keys`] with room for `tiers` overrides and
    /// penalties (see `tiers.rs`; 0: none are held).
    pub fn new_heap_with(capacity: u32, avg_name_bytes: usize, keys: u64, tiers: u64) -> Table {
        let geometry = Geometry::new(capacity, avg_name_bytes)
            .with_keys(keys)
            .with_tiers(tiers);
        // Anonymous mappings are zeroed: an all-zero region is valid.
        let owned = HeapRegion::new(geometry.region_len());
        let table = Table {
            base: owned.base,
            geometry,
            offsets: Offsets::of(&geometry),
            _owned: Some(owned),
            name_hints: NameHints::new(),
            pass_tally: true,
            #[cfg(test)]
            fast_path: true,
        };
        table.format(geometry.region_len());
        table
    }

    /// A table over `len` bytes at `base`: formats the region if it does
    /// not hold a table yet (all zeroes), or clears and formats it when
    /// `reformat`; otherwise attaches to the table in it (how an nginx zone
    /// survives a reload). An all-zero region is formatted without being
    /// written over, so a large fresh mapping costs no memory until used.
    /// A new table gives up to `key_bytes` of the region to keys and up to
    /// `tier_bytes` to overrides and penalties.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes, 64-byte
    /// aligned, for as long as the returned table (and anything sharing the
    /// region) lives, and only ever be accessed through `Table`s. Unless
    /// `reformat`, a region that does not hold a table must be all zeroes.
    pub unsafe fn from_raw(
        base: *mut u8,
        len: usize,
        avg_name_bytes: usize,
        key_bytes: usize,
        tier_bytes: usize,
        reformat: bool,
    ) -> Result<Table, TableError> {
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
        let table = Table {
            base,
            geometry,
            offsets: Offsets::of(&geometry),
            _owned: None,
            name_hints: NameHints::new(),
            pass_tally: true,
            #[cfg(test)]
            fast_path: true,
        };
        let header = table.header();
        if reformat {
            // SAFETY: the caller guarantees `len` writable bytes.
            unsafe { std::ptr::write_bytes(base, 0, geometry.region_len()) };
        }
        if reformat || header.magic.load(ACQ) == 0 {
            table.format(len);
            return Ok(table);
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
        };
        if found.region_len() > len {
            return Err(TableError::Incompatible(
                "the region is smaller than its table",
            ));
        }
        Ok(Table {
            base,
            geometry: found,
            offsets: Offsets::of(&found),
            _owned: None,
            name_hints: NameHints::new(),
            pass_tally: true,
            #[cfg(test)]
            fast_path: true,
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
        let (k0, k1) = crate::core::key::KeySecret::built_in().to_words();
        h.keys.config.secret[0].store(k0, RLX);
        h.keys.config.secret[1].store(k1, RLX);
        h.region_len.store(region_len as u64, RLX);
        self.set_estimator(Estimator::default());
        h.magic.store(MAGIC, REL);
    }

    // ---- region access -------------------------------------------------

    fn header(&self) -> &Header {
        // SAFETY: the region starts with a Header (64-byte aligned), all of
        // whose fields are atomics for which any bit pattern is valid.
        unsafe { &*self.base.cast::<Header>() }
    }

    fn status(&self) -> &SyncStatus {
        // SAFETY: the status block follows the header inside the region,
        // 64-byte aligned; it is all atomics.
        unsafe {
            &*self
                .base
                .add(Geometry::status_offset())
                .cast::<SyncStatus>()
        }
    }

    fn index(&self) -> &[AtomicU64] {
        // SAFETY: `index_len` u64 atomics start at the index offset, inside
        // the region (Geometry::region_len covers them), 64-byte aligned.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(Geometry::index_offset()).cast::<AtomicU64>(),
                self.geometry.index_len as usize,
            )
        }
    }

    fn slots(&self) -> &[Slot] {
        // SAFETY: `capacity` slots start at the slots offset, 64-aligned,
        // inside the region; Slot is all atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.slots).cast::<Slot>(),
                self.geometry.capacity as usize,
            )
        }
    }

    /// The slots ever taken (below `next_unused`), with their ids: what
    /// every whole-table walk goes over.
    fn used_slots(&self) -> impl Iterator<Item = (SlotId, &Slot)> {
        let used = self.header().next_unused.load(RLX) as usize;
        (0..).zip(&self.slots()[..used])
    }

    /// The held section: one word per slot (see `held.rs`).
    fn held(&self) -> &[AtomicU64] {
        // SAFETY: `capacity` u64 atomics start at the held offset, 64-byte
        // aligned, inside the region (Geometry::region_len covers them).
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.held).cast::<AtomicU64>(),
                self.geometry.capacity as usize,
            )
        }
    }

    fn arena(&self) -> &[AtomicU64] {
        // SAFETY: `arena_granules` 16-byte granules (two u64 atomics each)
        // start at the arena offset, inside the region.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.arena).cast::<AtomicU64>(),
                self.geometry.arena_granules as usize * 2,
            )
        }
    }

    fn key_ring(&self) -> &[AtomicU64] {
        // SAFETY: `key_ring` u64 atomics start at the ring offset (64-byte
        // aligned), inside the region (Geometry::region_len covers them).
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.key_ring).cast::<AtomicU64>(),
                self.geometry.key_ring as usize,
            )
        }
    }

    fn key_buckets(&self) -> &[KeyBucket] {
        // SAFETY: `key_buckets` buckets start at their offset, 64-byte
        // aligned, inside the region; KeyBucket is all atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.key_buckets).cast::<KeyBucket>(),
                self.geometry.key_buckets as usize,
            )
        }
    }

    fn tier_entries(&self) -> &[TierEntry] {
        // SAFETY: `tier_entries` entries start at their offset, 64-byte
        // aligned, inside the region; TierEntry is all atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.offsets.tier_entries).cast::<TierEntry>(),
                self.geometry.tier_entries as usize,
            )
        }
    }

    /// Copy `copy` (0 or 1) of the tier filter: its blocks' words.
    fn tier_filter(&self, copy: u32) -> &[AtomicU64] {
        let words = self.geometry.tier_filter_blocks as usize * 8;
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

    fn slot(&self, id: SlotId) -> Option<&Slot> {
        self.slots().get(id as usize)
    }

    /// This table without the per-quota count of passed checks, for an
    /// owner that never reads it: the C ABI library has no metrics export
    /// (its sync reads rejections, which are still counted), and the count
    /// is an atomic add on a line every check of the quota writes (about
    /// 4 ns of a hot keyed check, `make bench-governor`). Decisions and
    /// counters are the same.
    pub fn without_pass_tally(mut self) -> Self {
        self.pass_tally = false;
        self
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.geometry.capacity
    }

    /// Live quotas.
    pub fn len(&self) -> u32 {
        self.header().live.load(RLX)
    }

    /// True when no quota is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the region the table uses.
    pub fn region_len(&self) -> usize {
        self.geometry.region_len()
    }

    /// The region's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Highest quota epoch applied.
    pub fn max_epoch(&self) -> u64 {
        self.header().max_epoch.load(ACQ)
    }

    /// Checks of names that have no quota.
    pub fn unknown_checks(&self) -> u64 {
        self.header().unknown_checks.load(RLX)
    }

    /// Quotas refused because the table was full.
    pub fn refused_quotas(&self) -> u64 {
        self.header().refused_quotas.load(RLX)
    }

    /// True while seed quotas from a file may be in the table.
    pub fn holds_seeds(&self) -> bool {
        self.header().seeds.load(ACQ) != 0
    }

    /// Records whether seed quotas may be in the table.
    pub(crate) fn set_holds_seeds(&self, seeds: bool) {
        self.header().seeds.store(u32::from(seeds), REL);
    }

    /// Changes whenever slots are added, removed or re-linked.
    pub fn generation(&self) -> u64 {
        self.header().generation.load(ACQ)
    }

    /// UTC nanoseconds minus the table's clock, for window quotas (see
    /// [`layout::Header::utc_offset`]).
    pub fn utc_offset(&self) -> i64 {
        self.header().utc_offset.load(RLX) as i64
    }

    /// Sets the UTC offset window quotas use.
    pub fn set_utc_offset(&self, offset: i64) {
        self.header().utc_offset.store(offset as u64, RLX);
    }

    /// The windows some live quota counts in.
    pub fn windows_used(&self) -> Vec<crate::core::Window> {
        let used = self.header().windows_used.load(RLX);
        crate::core::Window::ALL
            .into_iter()
            .filter(|w| used & 1 << (w.code() - 1) != 0)
            .collect()
    }

    /// Sets how levels are extrapolated between syncs.
    pub fn set_estimator(&self, estimator: Estimator) {
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
    pub fn estimator(&self) -> Estimator {
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

#[cfg(test)]
mod in_flight_tests;
#[cfg(test)]
mod key_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
#[cfg(test)]
mod window_tests;
