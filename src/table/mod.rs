//! The quota table: every quota and counter of a host in one region.
//!
//! The region is fixed-size and holds no pointers (see [`layout`]), so the
//! same bytes work as an nginx shared memory zone mapped into every worker
//! or as a heap block behind the C ABI. Concurrency:
//!
//! - **Checks** ([`Table::check`]) take no lock. They find the slot through
//!   the index, read each quota of the chain under its seqlock (retrying a
//!   bounded number of times, then failing open), decide with
//!   [`crate::core::check_chain`], and on pass add the weight to each
//!   slot's `pending` with one atomic add.
//! - **Writers** (applying quotas, merging counters, collecting deltas)
//!   hold the region's writer lock, a spin lock naming its holder's process
//!   id so a lock left by a crashed process is taken over. Writers never do
//!   IO while holding it.
//! - **Deltas** move `pending → inflight` when collected and leave
//!   `inflight` when a root's reply includes them; each move is an atomic
//!   add/sub pair ordered so a concurrent check may briefly count a weight
//!   twice (rejecting a little early) but never miss it, and no increment
//!   is ever lost.

pub mod file;
pub mod layout;
pub mod names;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::core::estimate::Estimator;
use crate::core::quota::{MAX_DEPTH, MAX_WEIGHT};
use crate::core::{check_chain, ChainVerdict, Extrapolation, Level, Nanos, Quota, QuotaView};

use layout::{
    entry_matches, entry_parts, index_entry, index_home, Geometry, Header, Slot, SyncStatus,
    FLAG_LIVE, FREE_LINK, INDEX_EMPTY, INDEX_TOMBSTONE, LAYOUT_VERSION, MAGIC, STATUS_ROOTS,
};

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

/// What [`Table::apply_quotas`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApplyReport {
    /// New quotas.
    pub inserted: usize,
    /// Existing quotas changed.
    pub updated: usize,
    /// Quotas removed by tombstones.
    pub deleted: usize,
    /// Changes ignored because the table already had that epoch or newer.
    pub stale: usize,
    /// Quotas refused, with why.
    pub refused: Vec<TableError>,
}

/// Outcome of a check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// Every quota in the chain passed; the weight was counted.
    Pass,
    /// A quota of the chain rejected; nothing was counted.
    Reject(Rejection),
    /// No quota has this name: the request passes uncounted.
    Unknown,
}

/// Details of a rejection, for status headers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rejection {
    /// Index in the chain of the quota that rejected (0: the named one).
    pub depth: usize,
    /// Slot of the quota that rejected (see [`Table::name_into`]).
    pub slot: SlotId,
    /// That quota's limit, units per second.
    pub limit: f64,
    /// Seconds until its level has leaked below `low_burst - weight`, when
    /// the request would surely pass (infinite for a zero limit).
    pub retry_after: f64,
}

/// Most quotas one [`Table::check_many`] call checks.
pub const MAX_CHECKS: usize = 8;

/// How [`Table::check_many`] checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// A rejection is counted as a dry-run rejection (the caller lets the
    /// request through) instead of a rejection. Nothing is counted either
    /// way, as for a real rejection.
    pub dry_run: bool,
    /// Report the [`Headroom`] of the tightest quota (costs one more level
    /// estimate per quota in the chains; for rate-limit headers).
    pub headroom: bool,
}

/// How much room the tightest quota of a request has left, for the
/// `RateLimit` response headers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Headroom {
    /// Index of the item whose chain holds the quota.
    pub item: usize,
    /// Index of the quota in that chain (0: the named quota).
    pub depth: usize,
    /// Slot of the quota (see [`Table::name_into`]).
    pub slot: SlotId,
    /// The quota's limit, units per second.
    pub limit: f64,
    /// The quota's low burst: what passes with certainty from empty.
    pub low_burst: f64,
    /// The estimated level after this request (its weight included if it
    /// passed).
    pub level: f64,
}

impl Headroom {
    /// Units that would still pass with certainty.
    pub fn remaining(&self) -> f64 {
        (self.low_burst - self.level).max(0.0)
    }

    /// Seconds until the bucket is empty again (infinite for limit 0 and
    /// a non-empty bucket).
    pub fn seconds_to_empty(&self) -> f64 {
        if self.level <= 0.0 {
            0.0
        } else if self.limit > 0.0 {
            self.level / self.limit
        } else {
            f64::INFINITY
        }
    }

    fn room(&self) -> f64 {
        self.low_burst - self.level
    }
}

/// Outcome of [`Table::check_many`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ManyOutcome {
    /// `Pass` if every known quota passed (and was counted), `Reject` with
    /// the first rejection, `Unknown` if no name had a quota.
    pub outcome: Outcome,
    /// Index of the item that rejected.
    pub item: Option<usize>,
    /// With [`CheckOptions::headroom`]: on a pass the quota with the least
    /// room left, on a rejection the quota that rejected.
    pub headroom: Option<Headroom>,
}

/// A quota and its ancestors as read for one check.
///
/// Only the first `len` views are initialised: a check reads one to three
/// of the eight, and the ~450 bytes of the array are never zeroed, copied
/// or returned (either showed as a third of a check's time).
struct Chain {
    views: [MaybeUninit<QuotaView>; MAX_DEPTH],
    slots: [SlotId; MAX_DEPTH],
    len: usize,
}

/// What a passed check of [`Table::check_many`] will count: a chain's
/// slots and the weight.
#[derive(Clone, Copy)]
struct Charge {
    slots: [SlotId; MAX_DEPTH],
    len: usize,
    weight: u64,
}

impl Chain {
    fn new() -> Self {
        Chain {
            views: [const { MaybeUninit::uninit() }; MAX_DEPTH],
            slots: [0; MAX_DEPTH],
            len: 0,
        }
    }

    fn push(&mut self, view: QuotaView, slot: SlotId) {
        self.views[self.len].write(view);
        self.slots[self.len] = slot;
        self.len += 1;
    }

    fn views(&self) -> &[QuotaView] {
        // SAFETY: `push` initialised the first `len` views, and
        // MaybeUninit<QuotaView> has QuotaView's layout.
        unsafe { std::slice::from_raw_parts(self.views.as_ptr().cast::<QuotaView>(), self.len) }
    }

    fn charge(&self, weight: u64) -> Charge {
        Charge {
            slots: self.slots,
            len: self.len,
            weight,
        }
    }

    /// The headroom of the quota at `depth`, `added` units on its level.
    fn headroom(
        &self,
        item: usize,
        depth: usize,
        added: f64,
        now: Nanos,
        e: &Estimator,
    ) -> Headroom {
        let v = &self.views()[depth];
        Headroom {
            item,
            depth,
            slot: self.slots[depth],
            limit: v.limit,
            low_burst: v.low_burst,
            level: crate::core::estimate::estimate_level(v, now, e) + added,
        }
    }

    /// The quota of this chain with the least room below its low burst
    /// once `added` units are counted.
    fn tightest(&self, item: usize, added: f64, now: Nanos, e: &Estimator) -> Headroom {
        (1..self.len)
            .map(|depth| self.headroom(item, depth, added, now, e))
            .fold(self.headroom(item, 0, added, now, e), |best, h| {
                if h.room() < best.room() {
                    h
                } else {
                    best
                }
            })
    }

    fn check(
        &self,
        weight: u64,
        now: Nanos,
        estimator: &Estimator,
        draw: impl FnMut() -> f64,
    ) -> Result<(), Rejection> {
        let views = self.views();
        match check_chain(views, weight as f64, now, estimator, draw) {
            ChainVerdict::Pass => Ok(()),
            ChainVerdict::Reject { at } => {
                let v = &views[at];
                let level = crate::core::estimate::estimate_level(v, now, estimator);
                let excess = (level + weight as f64 - v.low_burst).max(0.0);
                let retry_after = if v.limit > 0.0 {
                    excess / v.limit
                } else {
                    f64::INFINITY
                };
                Err(Rejection {
                    depth: at,
                    slot: self.slots[at],
                    limit: v.limit,
                    retry_after,
                })
            }
        }
    }
}

/// A collected local delta, ready to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectedDelta {
    /// Where the counter lives.
    pub slot: SlotId,
    /// Its quota id.
    pub id: u64,
    /// Weight moved from `pending` to `inflight`.
    pub delta: u64,
}

/// A quota as the table holds it, with its live state (for listings and
/// metrics; not used on the request path).
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaState {
    /// The quota as applied.
    pub quota: Quota,
    /// Slot it lives in.
    pub slot: SlotId,
    /// Estimated level now.
    pub level: f64,
    /// Other hosts' measured fill rate, units/s.
    pub fill_rate: f64,
    /// Weight admitted locally not yet collected.
    pub pending: u64,
    /// Weight sent and not yet acknowledged.
    pub inflight: u64,
    /// Checks passed.
    pub passed: u64,
    /// Checks rejected.
    pub rejected: u64,
    /// Checks that would have been rejected, let through by a dry run.
    pub dry_run: u64,
}

/// A private anonymous mapping holding a heap table's region.
///
/// Asked for transparent huge pages: a table of a million quotas spans
/// ~150 MB, and with 4 KiB pages every random lookup would also miss the
/// TLB.
struct HeapRegion {
    base: *mut u8,
    len: usize,
}

impl HeapRegion {
    fn new(len: usize) -> HeapRegion {
        // SAFETY: a fresh private anonymous mapping; arguments are valid.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len, 64)
                    .unwrap_or(std::alloc::Layout::new::<u8>()),
            );
        }
        // SAFETY: advice on our own mapping; failure only loses the hint.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        HeapRegion {
            base: p.cast(),
            len,
        }
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A quota table over a region of memory.
pub struct Table {
    base: *mut u8,
    geometry: Geometry,
    /// Keeps a heap region alive; `None` for borrowed (shared) memory.
    _owned: Option<HeapRegion>,
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
        let geometry = Geometry::new(capacity, avg_name_bytes);
        // Anonymous mappings are zeroed: an all-zero region is valid.
        let owned = HeapRegion::new(geometry.region_len());
        let table = Table {
            base: owned.base,
            geometry,
            _owned: Some(owned),
        };
        table.format(geometry.region_len());
        table
    }

    /// A table over `len` bytes at `base`: formats the region if it does
    /// not hold a table yet (all zeroes), or clears and formats it when
    /// `reformat`; otherwise attaches to the table in it (how an nginx zone
    /// survives a reload). An all-zero region is formatted without being
    /// written over, so a large fresh mapping costs no memory until used.
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
        reformat: bool,
    ) -> Result<Table, TableError> {
        if base.is_null() || (base as usize) % 64 != 0 {
            return Err(TableError::BadRegion {
                have: len,
                why: "not 64-byte aligned",
            });
        }
        let geometry = Geometry::fitting(len, avg_name_bytes).ok_or(TableError::BadRegion {
            have: len,
            why: "too small for one quota",
        })?;
        let table = Table {
            base,
            geometry,
            _owned: None,
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
        };
        if found.region_len() > len {
            return Err(TableError::Incompatible(
                "the region is smaller than its table",
            ));
        }
        Ok(Table {
            base,
            geometry: found,
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
                self.base.add(self.geometry.slots_offset()).cast::<Slot>(),
                self.geometry.capacity as usize,
            )
        }
    }

    fn arena(&self) -> &[AtomicU64] {
        // SAFETY: `arena_granules` 16-byte granules (two u64 atomics each)
        // start at the arena offset, inside the region.
        unsafe {
            std::slice::from_raw_parts(
                self.base
                    .add(self.geometry.arena_offset())
                    .cast::<AtomicU64>(),
                self.geometry.arena_granules as usize * 2,
            )
        }
    }

    fn slot(&self, id: SlotId) -> Option<&Slot> {
        self.slots().get(id as usize)
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

    /// Changes whenever slots are added, removed or re-linked.
    pub fn generation(&self) -> u64 {
        self.header().generation.load(ACQ)
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

    // ---- the request path ------------------------------------------------

    /// Finds the live slot named `name`.
    pub fn lookup(&self, name: &[u8]) -> Option<SlotId> {
        self.probe(name, |slot, name_at| {
            self.slot_is_named(slot, name_at, name).then_some(slot)
        })
    }

    /// Walks the index for `name`, calling `at_match` with the slot and
    /// name place of every entry whose tag matches, until it returns
    /// something.
    fn probe<T>(
        &self,
        name: &[u8],
        mut at_match: impl FnMut(SlotId, u32) -> Option<T>,
    ) -> Option<T> {
        let h = self.header();
        let index = self.index();
        let hash = names::hash(name);
        for _ in 0..READ_RETRIES {
            let seq = h.index_seq.load(ACQ);
            let mut pos = index_home(hash, index.len());
            for _ in 0..index.len() {
                let entry = index[pos].load(ACQ);
                if entry == INDEX_EMPTY {
                    break;
                }
                if entry_matches(entry, hash) {
                    let (slot, name_at) = entry_parts(entry);
                    if let Some(found) = at_match(slot, name_at) {
                        return Some(found);
                    }
                }
                pos = if pos + 1 == index.len() { 0 } else { pos + 1 };
            }
            // A miss is final unless the index was being rebuilt meanwhile.
            if seq & 1 == 0 && h.index_seq.load(ACQ) == seq {
                return None;
            }
            std::hint::spin_loop();
        }
        None
    }

    /// True when `slot` is live and named `name`, stored at `name_at`.
    /// The name's words and the slot are independent loads, so their cache
    /// misses overlap.
    fn slot_is_named(&self, slot: SlotId, name_at: u32, name: &[u8]) -> bool {
        let Some(s) = self.slot(slot) else {
            return false;
        };
        let Some(words) = names::name_words(self.arena(), name_at, name.len()) else {
            return false;
        };
        // The check will add to line B next: start fetching it now, beside
        // line A and the name, instead of after them.
        prefetch_for_write(&s.pending);
        for _ in 0..READ_RETRIES {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let same = names::equals(words, name)
                    && s.flags.load(RLX) & FLAG_LIVE != 0
                    && s.name_len.load(RLX) as usize == name.len()
                    && s.name_at.load(RLX) == name_at;
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    return same;
                }
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Reads one slot's quota numbers and cluster state consistently,
    /// plus its parent; `None` if it is not live or never stabilised.
    fn read_view(&self, slot: SlotId) -> Option<(QuotaView, Option<SlotId>)> {
        self.read_view_if(slot, |_| true)
    }

    /// [`Table::read_view`] of the slot named `name` (stored at
    /// `name_at`), comparing the name in the same seqlock read: the check
    /// path's first quota costs one read of the slot, not two.
    fn read_named_view(
        &self,
        slot: SlotId,
        name_at: u32,
        name: &[u8],
    ) -> Option<(QuotaView, Option<SlotId>)> {
        let words = names::name_words(self.arena(), name_at, name.len())?;
        // The check will add to line B next: start fetching it now, beside
        // line A and the name, instead of after them.
        prefetch_for_write(&self.slot(slot)?.pending);
        self.read_view_if(slot, |s| {
            names::equals(words, name)
                && s.name_len.load(RLX) as usize == name.len()
                && s.name_at.load(RLX) == name_at
        })
    }

    /// Reads a slot's view under its seqlock if `matches` holds in the same
    /// read.
    fn read_view_if(
        &self,
        slot: SlotId,
        matches: impl Fn(&Slot) -> bool,
    ) -> Option<(QuotaView, Option<SlotId>)> {
        let s = self.slot(slot)?;
        for _ in 0..READ_RETRIES {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let live = s.flags.load(RLX) & FLAG_LIVE != 0 && matches(s);
                let parent = s.parent.load(RLX);
                let mut view = QuotaView {
                    limit: f64::from_bits(s.limit.load(RLX)),
                    low_burst: f64::from_bits(s.low_burst.load(RLX)),
                    high_burst: f64::from_bits(s.high_burst.load(RLX)),
                    known: Level {
                        level: f64::from_bits(s.known_level.load(RLX)),
                        at: s.known_at.load(RLX),
                    },
                    fill_rate: f64::from_bits(s.fill_rate.load(RLX)),
                    own_recent: 0.0,
                };
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    if !live {
                        return None;
                    }
                    // Deltas are plain counters outside the seqlock: a
                    // check reads them after the quota, and the collector
                    // moves weight so that it is never absent from both.
                    view.own_recent = (s.pending.load(RLX) + s.inflight.load(RLX)) as f64;
                    return Some((view, parent.checked_sub(1)));
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Checks `name` for a request of `weight` at `now`, drawing from this
    /// thread's PRNG; on pass the weight is counted in the whole chain.
    pub fn check(&self, name: &[u8], weight: u64, now: Nanos) -> Outcome {
        self.check_with(name, weight, now, crate::core::rng::thread_unit)
    }

    /// [`Table::check`] with the random draws supplied (for tests and the
    /// simulator).
    pub fn check_with(
        &self,
        name: &[u8],
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        let mut chain = Chain::new();
        if !self.read_named_chain(name, &mut chain) {
            self.header().unknown_checks.fetch_add(1, RLX);
            return Outcome::Unknown;
        }
        self.check_chain_read(&chain, weight, now, draw)
    }

    /// Checks the quota in `first` (see [`Table::check`]).
    pub fn check_slot(
        &self,
        first: SlotId,
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        let mut chain = Chain::new();
        if !self.read_chain(first, &mut chain) {
            // Deleted or unstable: fail open, as for an unknown name.
            self.header().unknown_checks.fetch_add(1, RLX);
            return Outcome::Unknown;
        }
        self.check_chain_read(&chain, weight, now, draw)
    }

    /// Decides a chain just read and counts it if it passes.
    fn check_chain_read(
        &self,
        chain: &Chain,
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        let weight = weight.min(MAX_WEIGHT);
        let first = chain.slots[0];
        let estimator = self.estimator();
        match chain.check(weight, now, &estimator, draw) {
            Ok(()) => {
                self.commit(&chain.charge(weight));
                Outcome::Pass
            }
            Err(rejection) => {
                self.slots()[first as usize].rejected.fetch_add(1, RLX);
                Outcome::Reject(rejection)
            }
        }
    }

    /// Checks several quotas for one request (several `sluice` directives
    /// in one nginx location): the request passes only if every known quota
    /// and all their ancestors pass, and only then is each weight counted
    /// (check all, then commit). Unknown names are skipped. At most
    /// [`MAX_CHECKS`] items are checked; later ones are ignored.
    pub fn check_many(
        &self,
        items: &[(&[u8], u64)],
        now: Nanos,
        options: CheckOptions,
        mut draw: impl FnMut() -> f64,
    ) -> ManyOutcome {
        let estimator = self.estimator();
        let mut charges = [MaybeUninit::<Charge>::uninit(); MAX_CHECKS];
        let mut known = 0;
        let mut headroom: Option<Headroom> = None;
        let mut chain = Chain::new();
        for (i, &(name, weight)) in items.iter().take(MAX_CHECKS).enumerate() {
            let weight = weight.min(MAX_WEIGHT);
            if !self.read_named_chain(name, &mut chain) {
                self.header().unknown_checks.fetch_add(1, RLX);
                continue;
            }
            if let Err(rejection) = chain.check(weight, now, &estimator, &mut draw) {
                let first = chain.slots[0] as usize;
                if options.dry_run {
                    self.slots()[first].dry_run.fetch_add(1, RLX);
                } else {
                    self.slots()[first].rejected.fetch_add(1, RLX);
                }
                let headroom = options
                    .headroom
                    .then(|| chain.headroom(i, rejection.depth, 0.0, now, &estimator));
                return ManyOutcome {
                    outcome: Outcome::Reject(rejection),
                    item: Some(i),
                    headroom,
                };
            }
            if options.headroom {
                let h = chain.tightest(i, weight as f64, now, &estimator);
                if headroom.is_none_or(|best| h.room() < best.room()) {
                    headroom = Some(h);
                }
            }
            charges[known].write(chain.charge(weight));
            known += 1;
        }
        for charge in &charges[..known] {
            // SAFETY: the loop above wrote the first `known` charges.
            self.commit(unsafe { charge.assume_init_ref() });
        }
        let outcome = if known == 0 {
            Outcome::Unknown
        } else {
            Outcome::Pass
        };
        ManyOutcome {
            outcome,
            item: None,
            headroom,
        }
    }

    /// Reads the quota named `name` and its ancestors into `chain`; false
    /// if there is no such quota.
    fn read_named_chain(&self, name: &[u8], chain: &mut Chain) -> bool {
        let found = self.probe(name, |slot, name_at| {
            self.read_named_view(slot, name_at, name)
                .map(|(view, parent)| (slot, view, parent))
        });
        let Some((slot, view, parent)) = found else {
            return false;
        };
        chain.len = 0;
        chain.push(view, slot);
        self.read_ancestors(parent, chain);
        true
    }

    /// Reads a quota and its ancestors into `chain`; false if the quota
    /// itself is gone.
    fn read_chain(&self, first: SlotId, chain: &mut Chain) -> bool {
        chain.len = 0;
        self.read_ancestors(Some(first), chain);
        chain.len > 0
    }

    /// Appends `next` and its ancestors to `chain`, up to [`MAX_DEPTH`]
    /// quotas; an ancestor that vanished ends it.
    fn read_ancestors(&self, next: Option<SlotId>, chain: &mut Chain) {
        let mut cur = next;
        while let Some(slot) = cur {
            if chain.len == MAX_DEPTH {
                break;
            }
            let Some((view, parent)) = self.read_view(slot) else {
                break;
            };
            chain.push(view, slot);
            cur = parent;
        }
    }

    /// Counts a passed check: the weight into every counter of the chain.
    fn commit(&self, charge: &Charge) {
        let slots = self.slots();
        if charge.weight > 0 {
            for &s in &charge.slots[..charge.len] {
                slots[s as usize].pending.fetch_add(charge.weight, RLX);
            }
        }
        slots[charge.slots[0] as usize].passed.fetch_add(1, RLX);
    }

    // ---- writers ---------------------------------------------------------

    fn lock(&self) -> WriterGuard<'_> {
        WriterGuard::acquire(&self.header().writer)
    }

    /// Applies quota changes from a root or a file: upserts live quotas
    /// whose epoch is newer than the table's copy, removes tombstoned ones,
    /// then re-links parents. Invalid quotas and quotas that do not fit are
    /// refused (listed in the report) and everything else still applies.
    pub fn apply_quotas(&self, quotas: &[Quota]) -> ApplyReport {
        let _guard = self.lock();
        let mut report = ApplyReport::default();
        let mut freed = Vec::new();
        let mut relink = false;
        for q in quotas {
            match self.apply_one(q, &mut freed) {
                Ok(Applied::Inserted) => {
                    report.inserted += 1;
                    relink = true;
                }
                Ok(Applied::Updated { parent_changed }) => {
                    report.updated += 1;
                    relink |= parent_changed;
                }
                Ok(Applied::Deleted) => {
                    report.deleted += 1;
                    relink = true;
                }
                Ok(Applied::Stale) => report.stale += 1,
                Err(e) => {
                    if matches!(e, TableError::Full { .. } | TableError::NamesFull { .. }) {
                        self.header().refused_quotas.fetch_add(1, RLX);
                    }
                    report.refused.push(e);
                }
            }
            self.header().max_epoch.fetch_max(q.epoch, REL);
        }
        if relink {
            self.relink();
        }
        // Freed slots become reusable only now, after no live slot links to
        // them any more.
        for slot in freed {
            self.free_slot(slot);
        }
        if relink || report.deleted > 0 {
            self.maybe_rebuild_index();
            self.header().generation.fetch_add(1, REL);
        }
        report
    }

    fn apply_one(&self, q: &Quota, freed: &mut Vec<SlotId>) -> Result<Applied, TableError> {
        q.validate().map_err(|error| TableError::Invalid {
            name: q.name.clone(),
            error,
        })?;
        let existing = self.lookup(q.name.as_bytes());
        if let Some(slot) = existing {
            let s = &self.slots()[slot as usize];
            if s.epoch.load(RLX) >= q.epoch {
                return Ok(Applied::Stale);
            }
            if q.deleted {
                self.remove(slot);
                freed.push(slot);
                return Ok(Applied::Deleted);
            }
            let parent_changed = s.parent_id.load(RLX) != q.parent.unwrap_or(0);
            self.write_quota(slot, q);
            return Ok(Applied::Updated { parent_changed });
        }
        if q.deleted {
            return Ok(Applied::Stale);
        }
        let slot = self.alloc_slot().ok_or_else(|| TableError::Full {
            capacity: self.capacity(),
            name: q.name.clone(),
        })?;
        let Some(name_at) = self.alloc_name(q.name.len()) else {
            self.free_slot(slot);
            return Err(TableError::NamesFull {
                name: q.name.clone(),
            });
        };
        let s = &self.slots()[slot as usize];
        s.name_at.store(name_at, RLX);
        self.write_quota(slot, q);
        self.index_insert(q.name.as_bytes(), slot, name_at);
        self.header().live.fetch_add(1, RLX);
        Ok(Applied::Inserted)
    }

    /// Writes a quota into a slot under its seqlock. A new id (a new quota,
    /// or a name deleted and created again) starts a fresh counter.
    fn write_quota(&self, slot: SlotId, q: &Quota) {
        let s = &self.slots()[slot as usize];
        let fresh = s.quota_id() != Some(q.id);
        let w = SeqWrite::begin(s);
        s.flags.store(FLAG_LIVE, RLX);
        s.limit.store(q.limit.to_bits(), RLX);
        s.low_burst.store(q.low_burst.to_bits(), RLX);
        s.high_burst.store(q.high_burst.to_bits(), RLX);
        if fresh {
            s.name_len.store(q.name.len() as u16, RLX);
            if let Some(words) = names::name_words(self.arena(), s.name_at.load(RLX), q.name.len())
            {
                names::store(words, q.name.as_bytes());
            }
            s.known_level.store(0f64.to_bits(), RLX);
            s.known_at.store(0, RLX);
            s.fill_rate.store(0f64.to_bits(), RLX);
            s.parent.store(0, RLX);
            s.pending.store(0, RLX);
            s.inflight.store(0, RLX);
            s.passed.store(0, RLX);
            s.rejected.store(0, RLX);
            s.dry_run.store(0, RLX);
        }
        s.id.store(q.id, RLX);
        s.epoch.store(q.epoch, RLX);
        s.parent_id.store(q.parent.unwrap_or(0), RLX);
        drop(w);
    }

    fn remove(&self, slot: SlotId) {
        let s = &self.slots()[slot as usize];
        let len = s.name_len.load(RLX) as usize;
        let name = names::name_words(self.arena(), s.name_at.load(RLX), len)
            .map(|w| names::load(w, len))
            .unwrap_or_default();
        self.index_remove(&name, slot, s.name_at.load(RLX));
        let w = SeqWrite::begin(s);
        s.flags.store(0, RLX);
        drop(w);
        self.free_name(s.name_at.load(RLX), len);
        self.header().live.fetch_sub(1, RLX);
    }

    /// Points every live slot's `parent` at its parent id's slot.
    fn relink(&self) {
        let slots = self.slots();
        let used = self.header().next_unused.load(RLX) as usize;
        let by_id = self.slot_ids();
        for s in slots[..used]
            .iter()
            .filter(|s| s.flags.load(RLX) & FLAG_LIVE != 0)
        {
            let pid = s.parent_id.load(RLX);
            let want = if pid == 0 {
                0
            } else {
                by_id.get(&pid).map_or(0, |&p| p + 1)
            };
            if s.parent.load(RLX) != want {
                let w = SeqWrite::begin(s);
                s.parent.store(want, RLX);
                drop(w);
            }
        }
    }

    // ---- slot, name and index allocation (writer lock held) -------------

    fn alloc_slot(&self) -> Option<SlotId> {
        let h = self.header();
        let head = h.free_slots.load(RLX);
        if head != 0 {
            let slot = head - 1;
            let link = self.slots()[slot as usize].id.load(RLX);
            debug_assert_ne!(link & FREE_LINK, 0, "slot {slot} on the free list");
            h.free_slots.store((link & !FREE_LINK) as u32, RLX);
            return Some(slot);
        }
        let next = h.next_unused.load(RLX);
        if next < self.capacity() {
            h.next_unused.store(next + 1, RLX);
            return Some(next);
        }
        None
    }

    fn free_slot(&self, slot: SlotId) {
        let h = self.header();
        self.slots()[slot as usize]
            .id
            .store(FREE_LINK | u64::from(h.free_slots.load(RLX)), RLX);
        h.free_slots.store(slot + 1, RLX);
    }

    fn alloc_name(&self, len: usize) -> Option<u32> {
        let h = self.header();
        let k = names::granules_for(len);
        let head = &h.arena_free[k - 1];
        let first = head.load(RLX);
        if first != 0 {
            let at = first - 1;
            // A free chunk's first word links to the next free chunk.
            let next = self.arena()[at as usize * 2].load(RLX) as u32;
            head.store(next, RLX);
            return Some(at);
        }
        let next = h.arena_next.load(RLX);
        if next as usize + k <= self.geometry.arena_granules as usize {
            h.arena_next.store(next + k as u32, RLX);
            return Some(next);
        }
        None
    }

    fn free_name(&self, at: u32, len: usize) {
        let k = names::granules_for(len);
        let head = &self.header().arena_free[k - 1];
        self.arena()[at as usize * 2].store(u64::from(head.load(RLX)), RLX);
        head.store(at + 1, RLX);
    }

    fn index_insert(&self, name: &[u8], slot: SlotId, name_at: u32) {
        let h = self.header();
        let index = self.index();
        let hash = names::hash(name);
        let mut pos = index_home(hash, index.len());
        loop {
            let e = index[pos].load(RLX);
            if e == INDEX_EMPTY || e == INDEX_TOMBSTONE {
                if e == INDEX_TOMBSTONE {
                    h.index_tombstones.fetch_sub(1, RLX);
                }
                index[pos].store(index_entry(hash, slot, name_at), REL);
                return;
            }
            // The index has 1.5 entries per slot, so an empty or deleted
            // entry is always found.
            pos = if pos + 1 == index.len() { 0 } else { pos + 1 };
        }
    }

    fn index_remove(&self, name: &[u8], slot: SlotId, name_at: u32) {
        let index = self.index();
        let hash = names::hash(name);
        let entry = index_entry(hash, slot, name_at);
        let mut pos = index_home(hash, index.len());
        for _ in 0..index.len() {
            let e = index[pos].load(RLX);
            if e == INDEX_EMPTY {
                return;
            }
            if e == entry {
                index[pos].store(INDEX_TOMBSTONE, REL);
                self.header().index_tombstones.fetch_add(1, RLX);
                return;
            }
            pos = if pos + 1 == index.len() { 0 } else { pos + 1 };
        }
    }

    /// Rebuilds the index when tombstones make up a sixth of it, so
    /// misses keep ending at an empty entry soon. Lookups that miss during
    /// the rebuild see `index_seq` move and retry.
    fn maybe_rebuild_index(&self) {
        let h = self.header();
        let index = self.index();
        if (h.index_tombstones.load(RLX) as usize) * 6 < index.len() {
            return;
        }
        h.index_seq.fetch_add(1, REL);
        fence(Ordering::SeqCst);
        for e in index {
            e.store(INDEX_EMPTY, RLX);
        }
        h.index_tombstones.store(0, RLX);
        let used = h.next_unused.load(RLX) as usize;
        for (i, s) in self.slots()[..used].iter().enumerate() {
            if s.flags.load(RLX) & FLAG_LIVE != 0 {
                let len = s.name_len.load(RLX) as usize;
                let at = s.name_at.load(RLX);
                if let Some(w) = names::name_words(self.arena(), at, len) {
                    self.index_insert(&names::load(w, len), i as SlotId, at);
                }
            }
        }
        h.index_seq.fetch_add(1, REL);
    }

    // ---- counters ---------------------------------------------------------

    /// Moves every live slot's pending weight to in-flight and returns the
    /// moved amounts; what a sync sends. A weight admitted concurrently is
    /// either moved now or stays pending for the next collection, never
    /// lost or taken twice.
    pub fn collect_deltas(&self, out: &mut Vec<CollectedDelta>) {
        let _guard = self.lock();
        let used = self.header().next_unused.load(RLX) as usize;
        for (i, s) in self.slots()[..used].iter().enumerate() {
            let delta = s.pending.load(ACQ);
            if delta == 0 || s.flags.load(RLX) & FLAG_LIVE == 0 {
                continue;
            }
            // In-flight first, then out of pending: a check in between sees
            // the weight twice (conservative), never zero times.
            s.inflight.fetch_add(delta, RLX);
            s.pending.fetch_sub(delta, RLX);
            out.push(CollectedDelta {
                slot: i as SlotId,
                id: s.id.load(RLX),
                delta,
            });
        }
    }

    /// True when some live quota's weight admitted here and not collected
    /// yet (`pending`) has reached `fraction` of its burst band
    /// (`high_burst - low_burst`; with no band, any weight): the sync
    /// thread's early-sync probe. It reads every used slot's counter, so
    /// its cost grows with the table.
    pub fn unsent_beyond(&self, fraction: f64) -> bool {
        let used = self.header().next_unused.load(ACQ) as usize;
        self.slots()[..used].iter().any(|s| {
            let pending = s.pending.load(RLX);
            if pending == 0 || s.flags.load(RLX) & FLAG_LIVE == 0 {
                return false;
            }
            let band =
                f64::from_bits(s.high_burst.load(RLX)) - f64::from_bits(s.low_burst.load(RLX));
            pending as f64 >= fraction * band
        })
    }

    /// Merges a cluster counter value (already in local time) into the
    /// slot if it still holds quota `id`, takes `acked` weight off
    /// in-flight (the value includes it), and updates the others' fill
    /// rate. Returns false if the slot holds another quota now.
    pub fn merge_counter(&self, slot: SlotId, id: u64, value: Level, acked: u64) -> bool {
        let Some(s) = self.slot(slot) else {
            return false;
        };
        if !value.is_valid() {
            return false;
        }
        let _guard = self.lock();
        if s.quota_id() != Some(id) {
            return false;
        }
        let limit = f64::from_bits(s.limit.load(RLX));
        let known = Level {
            level: f64::from_bits(s.known_level.load(RLX)),
            at: s.known_at.load(RLX),
        };
        let merged = known.merge(value, limit);
        let old_rate = f64::from_bits(s.fill_rate.load(RLX));
        // Measure over a span of at least half an interval (a quarter of
        // the horizon): several roots answering one cycle milliseconds
        // apart must not turn a few units into a huge rate.
        let span = merged.at.saturating_sub(known.at);
        let rate = if span >= self.estimator().horizon / 4 {
            crate::core::estimate::measure_fill_rate(known, merged, limit, acked as f64, old_rate)
        } else {
            old_rate
        };
        let w = SeqWrite::begin(s);
        s.known_level.store(merged.level.to_bits(), RLX);
        s.known_at.store(merged.at, RLX);
        s.fill_rate.store(rate.to_bits(), RLX);
        drop(w);
        // After the new level is visible: a check may count `acked` twice
        // for an instant, never zero times.
        let taken = acked.min(s.inflight.load(RLX));
        s.inflight.fetch_sub(taken, RLX);
        true
    }

    /// Standalone mode (no roots): folds every pending and in-flight weight
    /// into the slot's own level at `now`, acting as this host's root.
    pub fn fold_local(&self, now: Nanos) {
        let _guard = self.lock();
        let used = self.header().next_unused.load(RLX) as usize;
        for s in self.slots()[..used].iter() {
            if s.flags.load(RLX) & FLAG_LIVE == 0 {
                continue;
            }
            let pending = s.pending.load(ACQ);
            let inflight = s.inflight.load(ACQ);
            let limit = f64::from_bits(s.limit.load(RLX));
            let known = Level {
                level: f64::from_bits(s.known_level.load(RLX)),
                at: s.known_at.load(RLX),
            };
            let folded = known.add(limit, now, (pending + inflight) as f64);
            let w = SeqWrite::begin(s);
            s.known_level.store(folded.level.to_bits(), RLX);
            s.known_at.store(folded.at, RLX);
            drop(w);
            s.pending.fetch_sub(pending, RLX);
            s.inflight.fetch_sub(inflight, RLX);
        }
    }

    /// The leak rate of the quota in `slot`, if the slot still holds quota
    /// `id`. The sync thread leaks deltas it still owes a root at this rate.
    pub fn counter_limit(&self, slot: SlotId, id: u64) -> Option<f64> {
        let s = self.slot(slot)?;
        for _ in 0..READ_RETRIES {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let live = s.quota_id() == Some(id);
                let limit = f64::from_bits(s.limit.load(RLX));
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    return live.then_some(limit);
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Takes `amount` off a slot's in-flight weight without a counter value:
    /// a root acknowledged the delta but sent no value for it (it does not
    /// know the quota). Ignored if the slot holds another quota now.
    pub fn release_inflight(&self, slot: SlotId, id: u64, amount: u64) {
        let Some(s) = self.slot(slot) else { return };
        let _guard = self.lock();
        if s.quota_id() == Some(id) {
            s.inflight.fetch_sub(amount.min(s.inflight.load(RLX)), RLX);
        }
    }

    /// Puts `amount` of a slot's in-flight weight back into pending: a sync
    /// thread that stops with deltas no root acknowledged hands them to the
    /// next one. Ignored if the slot holds another quota now.
    pub fn requeue_inflight(&self, slot: SlotId, id: u64, amount: u64) {
        let Some(s) = self.slot(slot) else { return };
        let _guard = self.lock();
        if s.quota_id() == Some(id) {
            let moved = amount.min(s.inflight.load(RLX));
            // Pending first: a concurrent check may count the weight twice
            // for an instant, never zero times.
            s.pending.fetch_add(moved, RLX);
            s.inflight.fetch_sub(moved, RLX);
        }
    }

    /// Makes this process the table's sync owner (a sync thread starts).
    /// When the previous owner's process is gone, it died mid-sync (a
    /// crashed nginx worker) and nobody will acknowledge the weight it had
    /// in flight: all of it goes back to pending, to be sent again.
    /// Returns the weight requeued.
    pub fn claim_sync(&self) -> u64 {
        let me = own_pid();
        let previous = self.header().sync_owner.swap(me, ACQ);
        if previous == 0 || previous == me || process_alive(previous) {
            return 0;
        }
        let _guard = self.lock();
        let used = self.header().next_unused.load(RLX) as usize;
        let mut requeued = 0u64;
        for s in &self.slots()[..used] {
            let moved = s.inflight.load(RLX);
            if moved > 0 {
                s.pending.fetch_add(moved, RLX);
                s.inflight.fetch_sub(moved, RLX);
                requeued = requeued.saturating_add(moved);
            }
        }
        requeued
    }

    // ---- sync status ---------------------------------------------------------

    /// Publishes the sync thread's metrics for every process sharing the
    /// region (the first [`STATUS_ROOTS`] roots).
    pub fn publish_sync_status(&self, m: &crate::sync::SyncMetrics) {
        let st = self.status();
        let _guard = self.lock();
        let seq = st.seq.load(RLX);
        st.seq.store(seq.wrapping_add(1) | 1, RLX);
        fence(REL);
        st.cycles.store(m.cycles, RLX);
        st.all_roots_down.store(u64::from(m.all_roots_down), RLX);
        st.roots.store(m.roots.len().min(STATUS_ROOTS) as u32, RLX);
        for (slot, r) in st.root.iter().zip(&m.roots) {
            slot.up.store(u64::from(r.up), RLX);
            slot.last_success.store(r.last_success, RLX);
            slot.syncs.store(r.syncs, RLX);
            slot.errors.store(r.errors, RLX);
            slot.round_trip.store(r.round_trip, RLX);
            slot.clock_offset.store(r.clock_offset as u64, RLX);
            slot.bytes_sent.store(r.bytes_sent, RLX);
            slot.bytes_received.store(r.bytes_received, RLX);
            slot.dropped_deltas.store(r.dropped_deltas, RLX);
        }
        st.seq.store((seq.wrapping_add(1) | 1).wrapping_add(1), REL);
    }

    /// The sync metrics last published (root URLs are left empty: every
    /// process knows them from its own configuration).
    pub fn sync_status(&self) -> crate::sync::SyncMetrics {
        let st = self.status();
        for _ in 0..READ_RETRIES {
            let seq = st.seq.load(ACQ);
            if seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let n = (st.roots.load(RLX) as usize).min(STATUS_ROOTS);
            let roots = st.root[..n]
                .iter()
                .map(|r| crate::sync::RootMetrics {
                    url: String::new(),
                    up: r.up.load(RLX) != 0,
                    last_success: r.last_success.load(RLX),
                    syncs: r.syncs.load(RLX),
                    errors: r.errors.load(RLX),
                    last_error: String::new(),
                    round_trip: r.round_trip.load(RLX),
                    clock_offset: r.clock_offset.load(RLX) as i64,
                    bytes_sent: r.bytes_sent.load(RLX),
                    bytes_received: r.bytes_received.load(RLX),
                    dropped_deltas: r.dropped_deltas.load(RLX),
                })
                .collect();
            let m = crate::sync::SyncMetrics {
                cycles: st.cycles.load(RLX),
                all_roots_down: st.all_roots_down.load(RLX) != 0,
                roots,
            };
            fence(ACQ);
            if st.seq.load(RLX) == seq {
                return m;
            }
        }
        crate::sync::SyncMetrics::default()
    }

    // ---- listing ------------------------------------------------------------

    /// Takes over everything `old` holds (an nginx zone that changed
    /// size): its quotas with their ids and epochs, each counter's cluster
    /// level, time and fill rate, and the weight admitted but not yet
    /// acknowledged by a root, which becomes pending here so it is sent
    /// again. Quotas that do not fit are refused as in
    /// [`Table::apply_quotas`].
    pub fn adopt(&self, old: &Table) -> ApplyReport {
        self.set_estimator(old.estimator());
        let states = old.quotas(0);
        let quotas: Vec<Quota> = states.iter().map(|s| s.quota.clone()).collect();
        let report = self.apply_quotas(&quotas);
        let slots = self.slot_ids();
        let _guard = self.lock();
        for state in &states {
            let (Some(&slot), Some(from)) = (slots.get(&state.quota.id), old.slot(state.slot))
            else {
                continue;
            };
            let to = &self.slots()[slot as usize];
            let w = SeqWrite::begin(to);
            to.known_level.store(from.known_level.load(RLX), RLX);
            to.known_at.store(from.known_at.load(RLX), RLX);
            to.fill_rate.store(from.fill_rate.load(RLX), RLX);
            drop(w);
            to.pending
                .store(state.pending.saturating_add(state.inflight), RLX);
            to.passed.store(state.passed, RLX);
            to.rejected.store(state.rejected, RLX);
            to.dry_run.store(state.dry_run, RLX);
        }
        report
    }

    /// `(quota id, slot)` of every live quota: what the sync thread maps
    /// root replies with. Rebuild it when [`Table::generation`] changes.
    pub fn slot_ids(&self) -> HashMap<u64, SlotId> {
        let used = self.header().next_unused.load(ACQ) as usize;
        self.slots()[..used]
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((s.quota_id()?, i as SlotId)))
            .collect()
    }

    /// Every live quota with its live state, in slot order.
    pub fn quotas(&self, now: Nanos) -> Vec<QuotaState> {
        let estimator = self.estimator();
        let used = self.header().next_unused.load(ACQ) as usize;
        let mut out = Vec::new();
        for (i, s) in self.slots()[..used].iter().enumerate() {
            if let Some(state) = self.quota_state(i as SlotId, s, now, &estimator) {
                out.push(state);
            }
        }
        out
    }

    /// Copies the name of the quota in `slot` into `out` without
    /// allocating; `None` if the slot is not live (or changes meanwhile)
    /// or `out` is too short.
    pub fn name_into<'a>(&self, slot: SlotId, out: &'a mut [u8]) -> Option<&'a [u8]> {
        let s = self.slot(slot)?;
        for _ in 0..READ_RETRIES {
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
            std::hint::spin_loop();
        }
        None
    }

    /// The live state of one quota by name.
    pub fn quota(&self, name: &[u8], now: Nanos) -> Option<QuotaState> {
        let slot = self.lookup(name)?;
        self.quota_state(slot, &self.slots()[slot as usize], now, &self.estimator())
    }

    fn quota_state(
        &self,
        slot: SlotId,
        s: &Slot,
        now: Nanos,
        estimator: &Estimator,
    ) -> Option<QuotaState> {
        let (view, _) = self.read_view(slot)?;
        let len = s.name_len.load(RLX) as usize;
        let name = names::name_words(self.arena(), s.name_at.load(RLX), len)
            .map(|w| names::load(w, len))?;
        let parent = s.parent_id.load(RLX);
        let id = s.quota_id()?; // None: freed while this ran
        Some(QuotaState {
            quota: Quota {
                id,
                name: String::from_utf8_lossy(&name).into_owned(),
                parent: (parent != 0).then_some(parent),
                limit: view.limit,
                low_burst: view.low_burst,
                high_burst: view.high_burst,
                epoch: s.epoch.load(RLX),
                deleted: false,
            },
            slot,
            level: crate::core::estimate::estimate_level(&view, now, estimator),
            fill_rate: view.fill_rate,
            pending: s.pending.load(RLX),
            inflight: s.inflight.load(RLX),
            passed: s.passed.load(RLX),
            rejected: s.rejected.load(RLX),
            dry_run: s.dry_run.load(RLX),
        })
    }
}

enum Applied {
    Inserted,
    Updated { parent_changed: bool },
    Deleted,
    Stale,
}

/// An open seqlock write on a slot: `seq` is odd until dropped.
struct SeqWrite<'a> {
    seq: &'a AtomicU32,
}

impl<'a> SeqWrite<'a> {
    fn begin(slot: &'a Slot) -> Self {
        let seq = &slot.seq;
        let s = seq.load(RLX);
        // A crashed writer may have left it odd; always move to odd.
        seq.store((s | 1).wrapping_add(if s & 1 == 1 { 2 } else { 0 }), RLX);
        fence(REL);
        SeqWrite { seq }
    }
}

impl Drop for SeqWrite<'_> {
    fn drop(&mut self) {
        let s = self.seq.load(RLX);
        self.seq.store(s.wrapping_add(1), REL);
    }
}

/// The region's writer lock, held for the guard's life.
struct WriterGuard<'a> {
    lock: &'a AtomicU32,
}

impl<'a> WriterGuard<'a> {
    fn acquire(lock: &'a AtomicU32) -> Self {
        let me = own_pid();
        let mut spins = 0u32;
        loop {
            let holder = lock.load(RLX);
            if holder == 0 {
                if lock.compare_exchange_weak(0, me, ACQ, RLX).is_ok() {
                    return WriterGuard { lock };
                }
            } else if spins > 10_000 && holder != me && !process_alive(holder) {
                // The holder died mid-write: take the lock over.
                if lock.compare_exchange(holder, me, ACQ, RLX).is_ok() {
                    return WriterGuard { lock };
                }
            }
            spins = spins.saturating_add(1);
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.lock.store(0, REL);
    }
}

/// Hints the CPU to fetch the cache line holding `at` for writing.
#[inline(always)]
fn prefetch_for_write<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults and reads nothing
    // visible to the program. SSE is baseline on x86_64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(
            (at as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// This process's id, cached: `getpid` is a system call, and the writer
/// lock asks once per merged counter (a fifth of a sync cycle's CPU when
/// uncached). A fork clears the cache in the child (nginx forks its
/// workers from the master, which may have used a table already).
fn own_pid() -> u32 {
    static PID: AtomicU32 = AtomicU32::new(0);
    static ATFORK: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget_pid() {
        PID.store(0, RLX);
    }
    let pid = PID.load(RLX);
    if pid != 0 {
        return pid;
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic, which
        // is async-signal-safe as a fork child handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(forget_pid)) };
    });
    let pid = std::process::id().max(1);
    PID.store(pid, RLX);
    pid
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for the process's existence.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests;
