//! The quota table: every quota and counter of a host in one region.
//!
//! The region is fixed-size and holds no pointers (see [`layout`]), so the
//! same bytes work as an nginx shared memory zone mapped into every worker
//! or as a heap block behind the C ABI. A [`Table`] owns (or attaches to)
//! the region and shows it through two faces:
//!
//! - **the request face**, [`Gate`] (`table.gate()`): what nginx, the C
//!   ABI, the simulator and any other caller on the request path may ask
//!   (checks, partial grants, pacing, charges and their settling, weight
//!   given back, in-flight slots). Checks take no lock: they find the
//!   slot through this process's name hints or the index, read each
//!   quota of the chain under its seqlock (retrying a bounded number of
//!   times, then failing open), decide (with [`crate::core::check_chain`],
//!   [`crate::core::grantable`] or [`crate::core::reserve_wait`]), and on
//!   a pass add the weight to each counter's `pending` with one atomic
//!   add. A key of a per-key quota is found (or placed) in the key section
//!   the same way; only a new key whose two buckets are full takes the key
//!   lock, for the moves that make room, with a bounded wait.
//! - **the sync face**, [`Books`] (`table.books()`): what the sync thread
//!   asks (deltas collected, the roots' values merged, local folds, quota
//!   sets, overrides and penalties applied, held slots and their lease,
//!   adoption of another table). Writers hold the region's writer lock, a
//!   spin lock naming its holder's process id so a lock left by a crashed
//!   process is taken over, and never do IO while holding it. Deltas move
//!   `pending → unacked` when collected and leave `unacked` when a root's
//!   reply includes them; each move is an atomic add/sub pair ordered so a
//!   concurrent check may briefly count a weight twice (rejecting a little
//!   early) but never miss it, and no increment is ever lost.
//!
//! [`Table`] itself keeps what is neither: construction, settings (key
//! secret, overflow mode, estimator, UTC offset) and read-only listings
//! for metrics and consoles.
//!
//! # Layout
//!
//! Three folders, each a floor: `region/` at the bottom, the two faces on
//! it, and this file on top. A file uses only files below it; a call into
//! another file's concern goes through that file's view (a small `Copy`
//! handle on the region), which the caller imports, so the imports show
//! every dependency.
//!
//! - `region/` — the region core: its memory and sections, format and
//!   geometry, names, locks, the status block, slot reads, the name
//!   index, the key section (entries, placement, moves), the tier
//!   section, whole-table listings. Its files are listed in its module
//!   doc.
//! - `gate/` — the request face ([`Gate`]) and the files it hands calls
//!   to; listed in its module doc.
//! - `books/` — the sync face ([`Books`]) and the files it hands calls to;
//!   listed in its module doc.
//! - `file.rs` — quota files applied to a table (authoritative or seeds).
//! - `mod.rs` — [`Table`]: construction, the two faces, settings and
//!   listings.
//! - `tests.rs`, `key_tests.rs`, `window_tests.rs`, `tier_tests.rs`,
//!   `in_flight_tests.rs`, `fast_tests.rs`, `dirty_tests.rs` — unit tests
//!   by subject: named quotas, per-key quotas, window quotas with partial
//!   grants and reservations, overrides and penalties, in-flight slots,
//!   the named and keyed fast paths against the general one, the named
//!   quotas' dirty ring.

pub mod books;
#[cfg(test)]
mod dirty_tests;
#[cfg(test)]
mod fast_tests;
pub mod file;
pub mod gate;

pub mod region;

pub use books::{ApplyReport, Books, CollectedDelta, HandoverRecord};
pub use gate::{
    Cause, CheckItem, CheckOptions, Gate, Grant, Headroom, HeldSlot, ManyOutcome, Outcome,
    Rejection, Reservation, MAX_CHECKS,
};
pub use layout::Source;
pub use region::handover::HandoverStats;
pub use region::holds::HoldStats;
pub use region::key_entries::{KeyOverflow, KeyState, KeyStats};
pub use region::key_moves::MAX_MOVE_DEPTH;
pub use region::listing::QuotaState;
pub use region::tier_section::{TierRead, TierReport, TierState, TierStats};
pub use region::{geometry, layout, names};
pub use region::{Region, SlotId, TableError};

use crate::core::key::KeySecret;
use crate::table::region::listing::Listing;
use gate::local::Local;
use geometry::Geometry;
use region::handover::Handover;
use region::holds::Holds;
use region::key_entries::KeyEntries;
use region::slots::Slots;
use region::tier_section::TierSection;
use region::{ACQ, REL, RLX};

/// A quota table over a region of memory.
pub struct Table {
    region: Region,
    /// What this process keeps beside the region for its own checks.
    local: Local,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("geometry", &self.region.geometry())
            .finish()
    }
}

impl Table {
    fn over(region: Region) -> Table {
        Table {
            region,
            local: Local::new(),
        }
    }

    /// A table on the heap for `capacity` quotas with names averaging
    /// `avg_name_bytes`.
    pub fn new_heap(capacity: u32, avg_name_bytes: usize) -> Table {
        Self::new_heap_with_keys(capacity, avg_name_bytes, 0)
    }

    /// [`crate::table::Table::new_heap`] with room for `keys` keys of per-key quotas
    /// (see `keys.rs`; 0: per-key quotas pass uncounted).
    pub fn new_heap_with_keys(capacity: u32, avg_name_bytes: usize, keys: u64) -> Table {
        Self::new_heap_with(capacity, avg_name_bytes, keys, 0)
    }

    /// [`crate::table::Table::new_heap_with_keys`] with room for `tiers` overrides and
    /// penalties (see `tiers.rs`; 0: none are held).
    pub fn new_heap_with(capacity: u32, avg_name_bytes: usize, keys: u64, tiers: u64) -> Table {
        let geometry = Geometry::new(capacity, avg_name_bytes)
            .with_keys(keys)
            .with_tiers(tiers)
            .with_holds(geometry::HEAP_HOLD_RECORDS);
        Self::over(Region::new_heap(geometry))
    }

    /// [`crate::table::Table::new_heap_with_keys`] with a handover
    /// section of `handover_bytes` (see `region/handover.rs`): a heap
    /// table needs none (no other process takes its sync over), but tests
    /// take a sync thread over in one process, and benchmarks measure what
    /// leaving the records costs.
    pub fn new_heap_handing_over(
        capacity: u32,
        avg_name_bytes: usize,
        keys: u64,
        handover_bytes: u32,
    ) -> Table {
        let geometry = Geometry::new(capacity, avg_name_bytes)
            .with_keys(keys)
            .with_holds(geometry::HEAP_HOLD_RECORDS)
            .with_handover(handover_bytes);
        Self::over(Region::new_heap(geometry))
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
        // SAFETY: the caller's guarantees are `Region::from_raw`'s.
        let region = unsafe {
            Region::from_raw(base, len, avg_name_bytes, key_bytes, tier_bytes, reformat)
        }?;
        Ok(Self::over(region))
    }

    /// This table without the per-quota count of passed checks, for an
    /// owner that never reads it: the C ABI library has no metrics export
    /// (its sync reads rejections, which are still counted), and the count
    /// is an atomic add on a line every check of the quota writes (about
    /// 4 ns of a hot keyed check, `make bench-governor`). Decisions and
    /// counters are the same.
    pub fn without_pass_tally(mut self) -> Self {
        self.local.pass_tally = false;
        self
    }

    /// This table with the fast paths off (tests: the general path alone).
    #[cfg(test)]
    pub(crate) fn without_fast_path(mut self) -> Self {
        self.local.fast_path = false;
        self
    }

    /// The sync face: deltas collected, replies merged, local folds,
    /// quota sets, overrides and penalties applied, held slots.
    #[inline(always)]
    pub fn books(&self) -> Books<'_> {
        Books::of(&self.region)
    }

    /// The region, for the table's own tests that read its sections.
    #[cfg(test)]
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// The request face: checks, grants, charges, in-flight slots.
    #[inline(always)]
    pub fn gate(&self) -> Gate<'_> {
        Gate::of(&self.region, &self.local)
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.region.capacity()
    }

    /// Live quotas.
    pub fn len(&self) -> u32 {
        self.region.len()
    }

    /// True when no quota is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the region the table uses.
    pub fn region_len(&self) -> usize {
        self.region.region_len()
    }

    /// The region's geometry.
    pub fn geometry(&self) -> Geometry {
        self.region.geometry()
    }

    /// Highest quota epoch applied.
    pub fn max_epoch(&self) -> u64 {
        self.region.max_epoch()
    }

    /// Checks of names that have no quota.
    pub fn unknown_checks(&self) -> u64 {
        self.region.header().unknown_checks.load(RLX)
    }

    /// Quotas refused because the table was full.
    pub fn refused_quotas(&self) -> u64 {
        self.region.header().refused_quotas.load(RLX)
    }

    /// True while seed quotas from a file may be in the table.
    pub fn holds_seeds(&self) -> bool {
        self.region.header().seeds.load(ACQ) != 0
    }

    /// Records whether seed quotas may be in the table.
    pub(crate) fn set_holds_seeds(&self, seeds: bool) {
        self.region.header().seeds.store(u32::from(seeds), REL);
    }

    /// Changes whenever slots are added, removed or re-linked.
    pub fn generation(&self) -> u64 {
        self.region.generation()
    }

    /// UTC nanoseconds minus the table's clock, for window quotas (see
    /// [`layout::Header::utc_offset`]).
    pub fn utc_offset(&self) -> i64 {
        self.region.utc_offset()
    }

    /// Sets the UTC offset window quotas use.
    pub fn set_utc_offset(&self, offset: i64) {
        self.region.set_utc_offset(offset)
    }

    /// The windows some live quota counts in.
    pub fn windows_used(&self) -> Vec<crate::core::Window> {
        self.region.windows_used()
    }

    /// Sets how levels are extrapolated between syncs.
    pub fn set_estimator(&self, estimator: crate::core::estimate::Estimator) {
        self.region.set_estimator(estimator)
    }

    /// How levels are extrapolated between syncs.
    pub fn estimator(&self) -> crate::core::estimate::Estimator {
        self.region.estimator()
    }

    /// Reads the status block consistently: `read` runs until it ran while
    /// no write was under way (`None` if that never happened within the
    /// retry bound). `read` must only load from the block.
    pub fn read_status<T>(&self, read: impl Fn(&layout::SyncStatus) -> T) -> Option<T> {
        self.region.read_status(read)
    }

    /// The name of the quota in `slot`, copied into `out` (`None` if the
    /// slot holds no quota, or `out` is too short).
    pub fn name_into<'a>(&self, slot: SlotId, out: &'a mut [u8]) -> Option<&'a [u8]> {
        Slots::of(&self.region).name_into(slot, out)
    }

    /// The limit of the quota in `slot` in its own terms.
    pub fn terms_of(&self, slot: SlotId) -> Option<crate::core::Terms> {
        Slots::of(&self.region).terms_of(slot)
    }
    // ---- the key section's settings and listings ----------------------

    /// Hashes keys with `secret` from now on, or with the built-in one
    /// (`None`); every process sharing the region sees it. Keys already
    /// counted under another secret keep their old hashes until they
    /// drain.
    pub fn set_key_secret(&self, secret: Option<KeySecret>) {
        KeyEntries::of(&self.region).set_key_secret(secret)
    }

    /// The secret keys are hashed with (the built-in one until
    /// [`crate::table::Table::set_key_secret`]).
    pub fn key_secret(&self) -> KeySecret {
        KeyEntries::of(&self.region).key_secret()
    }

    /// True once a configured secret replaced the built-in one.
    pub fn has_key_secret(&self) -> bool {
        KeyEntries::of(&self.region).has_key_secret()
    }

    /// Sets what a check does with a key that finds no entry, for every
    /// process sharing the region.
    pub fn set_key_overflow(&self, mode: KeyOverflow) {
        KeyEntries::of(&self.region).set_key_overflow(mode)
    }

    /// What a check does with a key that finds no entry.
    pub fn key_overflow(&self) -> KeyOverflow {
        KeyEntries::of(&self.region).key_overflow()
    }

    /// Keys the key section holds (0: per-key quotas pass uncounted).
    pub fn key_capacity(&self) -> u64 {
        KeyEntries::of(&self.region).key_capacity()
    }

    /// The key section's counters.
    pub fn key_stats(&self) -> KeyStats {
        KeyEntries::of(&self.region).key_stats()
    }

    /// Every key of the template in `template` (all templates: `None`)
    /// with its state at `now`, as this host sees it. Reads the whole key
    /// section: for metrics and listings, not the request path.
    pub fn keys(&self, template: Option<SlotId>, now: crate::core::Nanos) -> Vec<KeyState> {
        KeyEntries::of(&self.region).keys(template, now)
    }

    // ---- the tier section's listings -----------------------------------

    /// Overrides and penalties the section holds (0: none).
    pub fn tier_capacity(&self) -> u64 {
        TierSection::of(&self.region).tier_capacity()
    }

    /// The hold records' counters: in use, unrecorded slots, slots given
    /// back for dead processes.
    pub fn hold_stats(&self) -> HoldStats {
        Holds::of(&self.region).stats()
    }

    /// The handover section's counters: records left by the sync thread,
    /// those that did not fit, takeovers from a dead sync thread.
    pub fn handover_stats(&self) -> HandoverStats {
        Handover::of(&self.region).stats()
    }

    /// Gives back every in-flight slot recorded for a process that
    /// `alive` says is dead ([`crate::host::process_alive`]; asked once
    /// per process), through the path a release takes: a slot sent to the
    /// roots goes back to them as a return. The sync thread calls it each
    /// cycle. Returns the slots given back.
    pub fn reclaim_abandoned_slots(
        &self,
        now: crate::core::Nanos,
        alive: impl FnMut(u64) -> bool,
    ) -> u64 {
        let gate = self.gate();
        Holds::of(&self.region).reclaim(alive, |slot| {
            gate.release_abandoned(slot, now);
        })
    }

    /// The tier section's counters.
    pub fn tier_stats(&self) -> TierStats {
        TierSection::of(&self.region).tier_stats()
    }

    /// What the section holds for `(quota, key)`.
    pub fn tier(&self, quota: u64, key: crate::core::key::KeyHash) -> Option<TierRead> {
        TierSection::of(&self.region).tier(quota, key)
    }

    /// Every override and penalty held, for listings and metrics (not the
    /// request path).
    pub fn tiers(&self) -> Vec<TierState> {
        TierSection::of(&self.region).tiers()
    }
    /// Every live quota with its state at `now`, for listings and
    /// metrics.
    pub fn quotas(&self, now: crate::core::Nanos) -> Vec<QuotaState> {
        Listing::of(&self.region).quotas(now)
    }

    /// The live quota named `name` with its state at `now`.
    pub fn quota(&self, name: &[u8], now: crate::core::Nanos) -> Option<QuotaState> {
        Listing::of(&self.region).quota(name, now)
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
