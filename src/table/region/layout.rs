//! The table region's format: a header, an index, slots, a name arena.
//!
//! ```text
//! +--------+------------+-----------------+-------------------------+-----------------------+-----------+-------+----------+-------------+-------+--------+---------+
//! | Header | SyncStatus | index: [u64; N] | slots: [Slot; capacity] | held: [u64; capacity] | slot ring | arena | key ring | key buckets | tiers | tier   | hold    |
//! |        |            |                 |                         |                       |           |       |          |             |       | filter | records |
//! +--------+------------+-----------------+-------------------------+-----------------------+-----------+-------+----------+-------------+-------+--------+---------+
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
//!
//! The held section has one word per slot, beside it rather than in it (a
//! slot is two full cache lines): for an in-flight quota, this host's own
//! net slots that left `pending` (see `held.rs`). Only the sync thread
//! writes it, so checks never touch it.
//!
//! The slot ring is the named quotas' dirty ring: the slots whose
//! `pending` (or rejection count) changed since the last collection, each
//! once ([`FLAG_QUEUED`]), one cell per eight slots (see `ring.rs`).
//!
//! The key section holds the counters of per-key quotas: [`KeyBucket`]s of
//! [`KEY_WAYS`] 48-byte [`KeyEntry`]s (three cache lines a bucket), a key
//! living in one of two buckets its hash picks (no index: a lookup reads
//! both buckets, their misses issued together; see `keys.rs`), and the
//! dirty ring: entry numbers of keys with weight not yet collected, so a
//! sync costs the keys that changed, not the keys that exist. A key costs
//! 48 bytes of entry and one of ring, divided by the share of entries in
//! use (the section fills past 90%).
//!
//! The tier section holds overrides of per-key templates for single keys
//! and penalties ([`TierEntry`], one cache line each, open addressing by
//! `(quota id, key hash)`), and in front of it a blocked Bloom filter in
//! two copies (one in use, the other rebuilt when removals made it
//! stale). A key entry's [`DIRTY_TIERS`] bit says whether the section
//! may hold anything of the key, so a key of a template with overrides but
//! none of its own costs one bit test in its own entry; the filter answers
//! for keys without an entry and for the sync thread (see `tiers.rs`).
//!
//! The hold records say which process holds which in-flight slots
//! ([`HoldRecord`], 32 bytes each): a request that takes a slot claims
//! one, naming its process (pid and start time) and the counter, and
//! frees it when it gives the slot back. The sync thread gives back the
//! slots of records whose process died (see `holds.rs`), so a worker
//! killed with its requests does not keep their slots for ever.

use crate::core::window::{Window, WindowRule};

pub use super::words::{
    key_tick, pack_key_rate, pack_known, pack_known_floor, pack_rate_prev, unpack_key_rate,
    unpack_known, unpack_rate_prev, MAX_KEY_RATE,
};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Marks a formatted region: "SLUICE" + layout version 1.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SLUICE\x00\x01");
/// Bumped whenever the layout changes, so an old zone is never misread.
pub const LAYOUT_VERSION: u32 = 21;
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
/// Slot flag: the quota is a per-key template (its keys' counters live in
/// the key section; the slot's own counter stays empty).
pub const FLAG_PER_KEY: u16 = 2;
/// Slot flags: a window quota's [`Window::code`] (1..=10) in four bits
/// from this one; 0 for a leaky bucket. A window quota's `known_level` is
/// the count of the window holding `known_at`.
pub const FLAG_WINDOW_SHIFT: u16 = 2;
/// The bits of [`FLAG_WINDOW_SHIFT`].
pub const FLAG_WINDOW_MASK: u16 = 0b1111 << FLAG_WINDOW_SHIFT;
/// Slot flag: the window slides; `fill_rate` then packs the others' rate
/// and the previous window's count as two `f32`s ([`pack_rate_prev`]).
pub const FLAG_SLIDING: u16 = 1 << 6;
/// Slot flag: the quota has a penalty, or (a per-key template) some of
/// its keys have overrides: a check looks in the tier section. Never set
/// for other quotas, so their checks pay one bit test.
pub const FLAG_TIERS: u16 = 1 << 7;
/// Slot flag: an in-flight quota (slots held, no leak: the slot's `limit`
/// word is its leak, 0, and its bursts are its limit; see
/// [`crate::core::Quota::leak`]).
pub const FLAG_IN_FLIGHT: u16 = 1 << 8;
/// Slot flag: the slot sits in the named quotas' dirty ring (see
/// `ring.rs`): set by whoever queues it, cleared only by the collector.
/// Writers of the other flags keep it as it is.
pub const FLAG_QUEUED: u16 = 1 << 9;
/// The flag bits saying how a quota counts: a change of any of them
/// starts its counter over.
pub const COUNTING_MASK: u16 = FLAG_WINDOW_MASK | FLAG_SLIDING | FLAG_IN_FLIGHT;

const _: () = assert!(FLAG_WINDOW_MASK >> FLAG_WINDOW_SHIFT >= 10);

/// Key entry `dirty` bit: the entry sits in the dirty ring.
pub const DIRTY_QUEUED: u32 = 1;
/// Key entry `dirty` bit: the tier section may hold an override or a
/// penalty of this key, so a check of a template flagged for tiers looks
/// there; without it the check skips the filter and the table (the answer
/// lives in the key's own cache line). Set whenever the tier section
/// gains an entry for the key, before that change is done; cleared only
/// by the key upkeep sweep, once the section holds nothing of the key
/// (see `tiers.rs`, "The hot path").
pub const DIRTY_TIERS: u32 = 2;
/// Key entry `dirty` bit: the entry is new and its maker has not looked
/// in the tier section again since it published it, so its
/// [`DIRTY_TIERS`] may still be missing an override added meanwhile: a
/// check treats the key as unmarked-unknown (filter and table). Cleared
/// by the maker after that look, or by the sweep or a clear.
pub const DIRTY_TIERS_UNSURE: u32 = 4;
/// Key entry `dirty` bit: a root refused to hold the key (this limiter
/// holds its share of the root's keys, or the root holds `max_keys`), so
/// the key keeps its count here: weight no root counted is folded into
/// `known`, never released or replaced by the lack of a reply, and a
/// check of it applies the overflow mode besides its own count (see
/// docs/DESIGN.md, "Keys a root will not hold"). Set by the sync thread
/// from a reply that refused it; cleared by a reply holding a value of
/// the key, and with the entry. Moves carry it.
pub const DIRTY_REFUSED: u32 = 8;
/// Key entry `dirty`: the [`crate::table::Source`] of `known` in bits
/// 8..16 (beside [`DIRTY_QUEUED`]: one word, so an entry stays 48 bytes).
pub const DIRTY_SOURCE_SHIFT: u32 = 8;
/// The bits of [`DIRTY_SOURCE_SHIFT`].
pub const DIRTY_SOURCE_MASK: u32 = 0xff << DIRTY_SOURCE_SHIFT;
/// Key entry `dirty`: a sliding window key's other hosts' fill rate in
/// bits 16..32 ([`pack_key_rate`]), its `fill` word holding the previous
/// window's count. Written by the sync thread only, before `known`.
pub const DIRTY_RATE_SHIFT: u32 = super::words::RATE_SHIFT;
/// The bits of [`DIRTY_RATE_SHIFT`].
pub const DIRTY_RATE_MASK: u32 = 0xffff << DIRTY_RATE_SHIFT;

/// The flag bits saying how `q` counts ([`COUNTING_MASK`]).
pub fn counting_flags(q: &crate::core::Quota) -> u16 {
    let code = q.window.map_or(0, Window::code) << FLAG_WINDOW_SHIFT;
    let sliding = if q.sliding && q.window.is_some() {
        FLAG_SLIDING
    } else {
        0
    };
    let in_flight = if q.in_flight { FLAG_IN_FLIGHT } else { 0 };
    code | sliding | in_flight
}

/// How a quota with `flags` counts (its window rule, if any), with
/// `utc_offset` turning the table's clock into UTC.
pub fn counting_rule(flags: u16, utc_offset: i64) -> Option<WindowRule> {
    let window = Window::from_code((flags & FLAG_WINDOW_MASK) >> FLAG_WINDOW_SHIFT)?;
    Some(WindowRule {
        window,
        sliding: flags & FLAG_SLIDING != 0,
        utc_offset,
    })
}

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
    /// 1 while the sync thread counts locally (no roots, or every root
    /// down): see [`crate::table::Books::set_counting_locally`].
    pub counting_locally: AtomicU32,
    /// 1 while seed quotas from a file may be in the table (see
    /// `file.rs`): the sync thread purges them once a root has answered.
    pub seeds: AtomicU32,
    /// The key section's shared words (see [`KeyHeader`]).
    pub keys: KeyHeader,
    /// UTC nanoseconds minus the table's clock (i64 bits), for window
    /// quotas: the sync thread sets it from the roots' clocks (so every
    /// host agrees on window boundaries with the roots), or from this
    /// machine's clock when no root answers.
    pub utc_offset: AtomicU64,
    /// Bit `code - 1` set once some quota has counted in windows of
    /// [`Window::code`] `code`: the sync thread wakes at those windows'
    /// boundaries (never cleared: a spare wake-up costs little).
    pub windows_used: AtomicU32,
    /// The live named in-flight quotas (see [`InFlightList`]).
    pub in_flight: InFlightList,
    /// The tier section's shared words (see [`TierHeader`]).
    pub tiers: TierHeader,
    /// The hold records' shared words (see [`HoldHeader`]).
    pub holds: HoldHeader,
    /// The named quotas' dirty ring's positions (see `ring.rs`).
    pub slot_ring: RingHead,
    /// The handover section's shared words (see `handover.rs`).
    pub handover: super::handover_header::HandoverHeader,
}

/// Named in-flight quotas [`InFlightList`] lists by slot; with more, the
/// sync side walks every slot for them.
pub const IN_FLIGHT_LISTED: usize = 12;

/// The live named in-flight quotas, so that what the sync thread does
/// with them each cycle (the held counts a root takes) costs those
/// quotas, not every slot, and nothing in a table without any. Written
/// by quota writes only (the writer lock held); read without it, each
/// listed slot checked for what it holds.
#[repr(C)]
#[derive(Default)]
pub struct InFlightList {
    /// How many live named in-flight quotas there are.
    pub count: AtomicU32,
    /// While `count` is at most [`IN_FLIGHT_LISTED`], the first `count`
    /// words are their slots + 1, in no order.
    pub slots: [AtomicU32; IN_FLIGHT_LISTED],
}

// In the bytes the header's tier words left free after the window words:
// the header keeps its size.
const _: () =
    assert!(std::mem::offset_of!(Header, tiers) - std::mem::offset_of!(Header, utc_offset) == 64);

/// The hold records' shared words.
#[repr(C, align(64))]
#[derive(Default)]
pub struct HoldHeader {
    /// Hold records in the region (0: none; slots are then not recorded).
    pub records: AtomicU32,
    /// Records claimed and not freed (the sweep skips an empty section).
    pub live: AtomicU64,
    /// Slots taken that found no free record (the section was full): not
    /// recorded, so not given back should their process die.
    pub unrecorded: AtomicU64,
    /// Slots given back because the process holding them died.
    pub reclaimed: AtomicU64,
}

/// [`HoldRecord::owner`] of a record being given back by a sweep: no
/// process is its owner (a process identity never has all bits set), and
/// no other sweep or claim takes it.
pub const HOLD_RECLAIMING: u64 = u64::MAX;

/// [`HoldRecord::state`] bit: the fields are written (a record whose
/// owner died before it set this holds no slot that was recorded).
pub const HOLD_READY: u32 = 1;
/// [`HoldRecord::state`] bit: the slot was taken on a per-key template's
/// own counter (its key found no entry), not the key's.
pub const HOLD_OVERFLOWED: u32 = 2;

/// One in-flight slot held by a live process: 32 bytes.
#[repr(C)]
#[derive(Default)]
pub struct HoldRecord {
    /// The holding process's identity (pid in the low 32 bits, the low
    /// 31 bits of its start time above), 0 when free, or
    /// [`HOLD_RECLAIMING`].
    pub owner: AtomicU64,
    /// The id of the quota whose slot it is (a slot reused by another
    /// quota is not given back to).
    pub quota: AtomicU64,
    /// The key's hash, for a per-key quota's key (0: none).
    pub key: AtomicU64,
    /// The quota's slot.
    pub slot: AtomicU32,
    /// [`HOLD_READY`] and [`HOLD_OVERFLOWED`].
    pub state: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<HoldRecord>() == 32);

/// Penalties a check can queue for the sync thread before it must scan
/// the tier section for them.
pub const TIER_OUTBOX: usize = 32;

/// The tier section's shared words.
#[repr(C, align(64))]
#[derive(Default)]
pub struct TierHeader {
    /// Entries of the tier table (0: no tier section).
    pub entries: AtomicU32,
    /// 64-byte blocks of one copy of the filter.
    pub filter_blocks: AtomicU32,
    /// Which copy of the filter checks read (0 or 1).
    pub filter_active: AtomicU32,
    /// The tier lock: 0 when free, else the holder's process id. Held by
    /// whoever writes entries: the sync thread, and a check starting a
    /// penalty.
    pub lock: AtomicU32,
    /// Odd while entries move (a removal shifts the ones after it): a
    /// lookup that missed while it changed looks again.
    pub moves: AtomicU64,
    /// Next entry the upkeep sweep looks at.
    pub sweep: AtomicU32,
    /// Entries in use.
    pub live: AtomicU64,
    /// Entries removed since the filter in use was built (its stale bits).
    pub removed: AtomicU64,
    /// Overrides and quotas' penalty lengths refused: the table was full
    /// of them.
    pub refused: AtomicU64,
    /// Penalties refused: their share was full of penalties ending later.
    pub penalties_refused: AtomicU64,
    /// Penalties that gave way to a later penalty or an override.
    pub penalties_evicted: AtomicU64,
    /// Penalties this host started.
    pub started: AtomicU64,
    /// Checks rejected by a `deny` override.
    pub denied: AtomicU64,
    /// Checks rejected by a penalty in force.
    pub penalized: AtomicU64,
    /// Penalties queued in `outbox`.
    pub outbox_len: AtomicU32,
    /// Set when a penalty found the outbox full: the sync thread scans
    /// the section for unsent ones.
    pub outbox_full: AtomicU32,
    /// Penalties started here and not yet taken by the sync thread, as
    /// `(quota, key)`.
    pub outbox: [[AtomicU64; 2]; TIER_OUTBOX],
}

/// [`TierEntry::rule`]: no override (a penalty or a quota's penalty
/// length only).
pub const TIER_NONE: u32 = 0;
/// [`TierEntry::rule`]: the key counts with the entry's numbers.
pub const TIER_LIMIT: u32 = 1;
/// [`TierEntry::rule`]: the key is never limited by its template.
pub const TIER_ALLOW: u32 = 2;
/// [`TierEntry::rule`]: every request of the key is rejected.
pub const TIER_DENY: u32 = 3;
/// The bits of [`TierEntry::rule`] holding one of the four above.
pub const TIER_KIND: u32 = 3;
/// [`TierEntry::rule`] bit: a penalty started here and not yet sent.
pub const TIER_UNSENT: u32 = 4;

/// One override, penalty or quota penalty length: a cache line. An entry
/// of `(quota, 0)` is about the quota itself (its penalty length and, for
/// a named quota, its penalty); `(quota, key)` about one key of a per-key
/// template (its override and its penalty).
#[repr(C, align(64))]
#[derive(Default)]
pub struct TierEntry {
    /// The quota id; 0: free.
    pub quota: AtomicU64,
    /// The key's hash; 0 for the quota itself.
    pub key: AtomicU64,
    /// Seqlock: odd while the fields below change.
    pub seq: AtomicU32,
    /// [`TIER_NONE`], [`TIER_LIMIT`], [`TIER_ALLOW`] or [`TIER_DENY`],
    /// and [`TIER_UNSENT`].
    pub rule: AtomicU32,
    /// For `(quota, 0)`: the quota's penalty, seconds (0: none).
    pub penalty_secs: AtomicU32,
    /// When the override stops applying, UTC seconds (0: never).
    pub expires: AtomicU32,
    /// The override's limit (f64 bits).
    pub limit: AtomicU64,
    /// The override's low burst (f64 bits).
    pub low_burst: AtomicU64,
    /// The override's high burst (f64 bits).
    pub high_burst: AtomicU64,
    /// End of the penalty, UTC nanoseconds (0: none): a max-register.
    pub until: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<TierEntry>() == 64);

/// Bytes one override costs in the tier section: its entry at the most
/// load a section takes (4/5), and its 16 bits in each filter copy per
/// entry.
pub const TIER_BYTES: u64 = 64 * 5 / 4 + 5;

/// The key section's shared words, grouped by who writes them so that a
/// keyed check's reads never share a line with other checks' writes: the
/// first line is written only when the table is formatted or the secret
/// or a setting changes; the second by checks queueing a key for the next
/// collection; the third by inserts, moves and the sync thread.
#[repr(C, align(64))]
#[derive(Default)]
pub struct KeyHeader {
    /// Read by every keyed check.
    pub config: KeyConfig,
    /// The dirty ring's positions.
    pub ring: RingHead,
    /// Placement: the mover lock, the move sequence, counters.
    pub place: KeyPlacement,
}

/// The key section's settings (line 1 of [`KeyHeader`]).
#[repr(C, align(64))]
#[derive(Default)]
pub struct KeyConfig {
    /// Key buckets in the key section (0: no keyed quotas).
    pub buckets: AtomicU32,
    /// Entries of the dirty ring.
    pub ring_len: AtomicU32,
    /// Set once the key secret below holds a configured secret.
    pub secret_set: AtomicU32,
    /// What a check does with a key that finds no entry (a
    /// `KeyOverflow` code: 0 shared, 1 reject, 2 pass).
    pub overflow_mode: AtomicU32,
    /// The key secret's two hash keys (see [`crate::core::key`]).
    pub secret: [AtomicU64; 2],
}

/// A dirty ring's positions (line 2 of [`KeyHeader`] for keys; a line of
/// the [`Header`] for named quotas).
#[repr(C, align(64))]
#[derive(Default)]
pub struct RingHead {
    /// Next position producers (checks) write.
    pub head: AtomicU64,
    /// Next position the collector reads.
    pub tail: AtomicU64,
    /// Set when a counter could not be queued (ring full): the next
    /// collection scans every counter instead.
    pub overflow: AtomicU32,
    /// Collections the ring's next position has stayed reserved but
    /// unwritten.
    pub stuck: AtomicU32,
}

/// Placement state and counters (line 3 of [`KeyHeader`]).
#[repr(C, align(64))]
#[derive(Default)]
pub struct KeyPlacement {
    /// The key lock: 0 when free, else the holder's process id. Held by
    /// whoever moves an entry to its other bucket, and by the sync thread
    /// while it reads or writes entries' counters (see `table/keys.rs`).
    pub lock: AtomicU32,
    /// Checks waiting for the key lock: the sync thread, between batches,
    /// hands the lock over when some are.
    pub lock_wanted: AtomicU32,
    /// Next bucket the maintenance sweep looks at.
    pub sweep: AtomicU32,
    /// Odd while an entry is being moved between its two buckets: a
    /// lookup that missed while it changed looks again.
    pub moves: AtomicU64,
    /// Key entries in use.
    pub live: AtomicU64,
    /// Keys that got an entry.
    pub inserts: AtomicU64,
    /// Entries moved to their other bucket to make room for a key.
    pub relocations: AtomicU64,
    /// Drained entries (equal to no entry) reused for another key.
    pub reclaimed: AtomicU64,
    /// Checks of a key that found no entry (every entry of the section
    /// that it could have had holds a live count, or no key section):
    /// decided as the overflow mode says.
    pub overflows: AtomicU64,
    /// Checks of a per-key quota without a key (or with an empty one):
    /// not checked, not counted.
    pub keyless: AtomicU64,
    /// Of `overflows`: new keys whose buckets were full and that could not
    /// have the key lock in time to move entries (its holder, the sync
    /// thread, was descheduled): the section may have had room. In what
    /// was padding up to the line's end, so zero in a region an older
    /// version made.
    pub busy: AtomicU64,
    /// Keys a root refused to hold, counted once per reply that refused
    /// each ([`DIRTY_REFUSED`]). In what was padding, as `busy`.
    pub refused: AtomicU64,
}

/// Roots whose sync state the region can publish and remember across an
/// nginx reload: every root a limiter may have (a [`Source`] names one of
/// 63). 63 x 192 bytes.
pub const STATUS_ROOTS: usize = 63;

/// Instances of one root remembered besides the one that last answered
/// ([`RootStatus::others`]): processes behind one URL answering in turn.
pub const REMEMBERED_INSTANCES: usize = 4;

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
    /// Units given back and not sent (the root does not take returns).
    pub dropped_returns: AtomicU64,
    /// A hash of the URL of the root the three words below are of (0:
    /// none), so that a later sync thread (an nginx reload) finds
    /// them whatever the roots' order in its configuration.
    pub url_hash: AtomicU64,
    /// The root instance that last answered (0: none yet).
    pub instance: AtomicU64,
    /// The restarts of the root seen by sync threads so far.
    pub restarts: AtomicU64,
    /// What the root's last answer said it takes, as bits the sync side
    /// defines (`crate::sync::status`): returns, sequences.
    pub takes: AtomicU64,
    /// Numbered requests to the root whose exchanges failed, now. In what
    /// was padding up to the line's end, so zero in a region an older
    /// version made.
    pub unconfirmed: AtomicU64,
    /// Times two unconfirmed requests were carried as one (ditto).
    pub unconfirmed_merged: AtomicU64,
    /// Other instances that answered at the root's URL lately, oldest
    /// first (0: none), remembered with `instance` for the next sync
    /// thread: a reply from one of them after a reload is a switch
    /// between processes behind the URL, not a restart.
    pub others: [AtomicU64; REMEMBERED_INSTANCES],
}

/// What the sync thread publishes for every process sharing the region
/// (nginx workers other than the one running sync serve the metrics too).
#[repr(C, align(64))]
pub struct SyncStatus {
    /// Seqlock over the whole block.
    pub seq: AtomicU32,
    /// Roots published.
    pub roots: AtomicU32,
    /// Completed sync cycles.
    pub cycles: AtomicU64,
    /// What is down: bit 0 while every root has been unreachable for
    /// two intervals; bit `1 + g` while every root of root group `g` has
    /// (its shard limited per host).
    pub down: AtomicU64,
    /// Per-root state, in configuration order.
    pub root: [RootStatus; STATUS_ROOTS],
}

impl Default for SyncStatus {
    fn default() -> Self {
        Self {
            seq: AtomicU32::new(0),
            roots: AtomicU32::new(0),
            cycles: AtomicU64::new(0),
            down: AtomicU64::new(0),
            root: std::array::from_fn(|_| RootStatus::default()),
        }
    }
}

/// One quota and its counter: 128 bytes, two cache lines.
#[repr(C, align(64))]
#[derive(Default)]
pub struct Slot {
    // ---- line A: read by every check, written under `seq` ----
    /// Seqlock: odd while a writer changes line A (or the name).
    pub seq: AtomicU32,
    /// [`FLAG_LIVE`], [`FLAG_PER_KEY`], the window code,
    /// [`FLAG_SLIDING`], [`FLAG_TIERS`] and [`FLAG_IN_FLIGHT`] (0 when
    /// free), and [`FLAG_QUEUED`].
    pub flags: AtomicU16,
    /// Name length in bytes (at most 255).
    pub name_len: AtomicU8,
    /// The [`Source`] of `known_level` (which root's reply it is). Only
    /// the sync thread and the writer change it, the writer lock held;
    /// checks never read it.
    pub source: AtomicU8,
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
    /// Other hosts' measured fill rate, units/s (f64 bits; for a sliding
    /// window, see [`pack_rate_prev`]).
    pub fill_rate: AtomicU64,

    // ---- line B: written by checks and the sync thread ----
    /// Weight admitted here and not yet collected for a sync.
    pub pending: AtomicU64,
    /// Weight collected and sent, not yet included in `known_level`.
    pub unacked: AtomicU64,
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

/// Entries per key bucket.
pub const KEY_WAYS: usize = 4;

/// [`KeyEntry::hash`] of an entry being (re)initialised: lookups skip it.
pub const KEY_CLAIMED: u64 = u64::MAX;

/// One key's counter: 48 bytes. A per-key template's numbers stay in its
/// slot; the entry holds only the key's own state.
#[repr(C)]
#[derive(Default)]
pub struct KeyEntry {
    /// The key's hash (never 0 or [`KEY_CLAIMED`] for a key); 0: free.
    pub hash: AtomicU64,
    /// The template's slot + 1 (0: none).
    pub template: AtomicU32,
    /// Last use in [`key_tick`]s, shifted left by 2, plus uses so far
    /// (0..=3): how recently and how often checks used the key.
    pub used: AtomicU32,
    /// Weight admitted here and not yet collected for a sync.
    pub pending: AtomicU64,
    /// Weight collected and sent, not yet included in `known`.
    pub unacked: AtomicU64,
    /// The cluster level at the last merge: see [`pack_known`].
    pub known: AtomicU64,
    /// Other hosts' measured fill rate, units/s (f32 bits); a sliding
    /// window key's previous window's count instead, its rate then in
    /// [`DIRTY_RATE_MASK`].
    pub fill: AtomicU32,
    /// [`DIRTY_QUEUED`] while the entry sits in the dirty ring,
    /// [`DIRTY_TIERS`] while the tier section may hold something of the
    /// key; the known level's source in [`DIRTY_SOURCE_MASK`], a sliding
    /// key's fill rate in [`DIRTY_RATE_MASK`] (a key of an in-flight
    /// quota, never sliding, keeps this host's held slots there instead:
    /// `books/key_sync.rs`).
    pub dirty: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<KeyEntry>() == 48);

/// A bucket of key entries: three cache lines.
#[repr(C, align(64))]
#[derive(Default)]
pub struct KeyBucket {
    /// The entries; a key lives in the first one holding it.
    pub ways: [KeyEntry; KEY_WAYS],
}

const _: () = assert!(std::mem::size_of::<KeyBucket>() == 192);

/// Which root's reply a counter's known level is, so that the same root's
/// later reply replaces it (lower, after returns) where another root's is
/// max-merged: 0 for none (a local fold, a new counter); otherwise the
/// sync thread's name for one root process (its place in the list plus
/// one in the low six bits, a count of its restarts in the top two; see
/// `sync::link`).
pub type Source = u8;

/// The [`Source`] of an in-flight counter's level that this host folded
/// its own weight into (every root, or the counter's group, silent): the
/// next reply of any root replaces it. That root's value holds what this
/// host owed it (sent with the same request), and the other hosts'
/// releases meanwhile, which a max-merge would never let down (an
/// in-flight level does not leak). No root's source: a root's has its
/// place in the list in the low six bits, never 0.
pub const FOLDED: Source = 0x40;

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
    fn a_key_rate_in_16_bits_is_within_half_a_percent_and_never_below_itself() {
        let mut rate = 1e-6;
        while rate < 1e29 {
            let word = pack_key_rate(rate);
            assert_eq!(word & !DIRTY_RATE_MASK, 0, "{rate}");
            let back = unpack_key_rate(word | DIRTY_SOURCE_MASK | DIRTY_REFUSED);
            assert!(back >= rate * (1.0 - 1e-7), "{rate} read back {back}");
            assert!(back <= rate * 1.004, "{rate} read back {back}");
            rate *= 1.37;
        }
        // Whole numbers up to 256 are exact.
        for n in 0..=256 {
            assert_eq!(unpack_key_rate(pack_key_rate(f64::from(n))), f64::from(n));
        }
        for none in [0.0, -3.0, f64::NAN, f64::NEG_INFINITY] {
            assert_eq!(pack_key_rate(none), 0, "{none}");
        }
        for huge in [1e31, f64::MAX, f64::INFINITY] {
            let back = unpack_key_rate(pack_key_rate(huge));
            assert!(
                back.is_finite() && back >= MAX_KEY_RATE * 0.999,
                "{huge}: {back}"
            );
        }
    }
}
