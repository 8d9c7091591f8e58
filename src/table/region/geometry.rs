//! Where each section of a region starts for a given size: the
//! [`Geometry`] a table is built with, the bytes it takes, the largest one
//! that fits a zone, and the ceilings of the key and tier sections.

use super::layout::{
    Header, HoldRecord, KeyBucket, KeyEntry, Slot, SyncStatus, TierEntry, GRANULE, KEY_WAYS,
    MAX_CAPACITY, TIER_BYTES,
};

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
    /// Number of key buckets ([`KEY_WAYS`] keys each; 0: no keys).
    pub key_buckets: u32,
    /// Entries of the dirty ring.
    pub key_ring: u32,
    /// Entries of the tier table (0: no tier section).
    pub tier_entries: u32,
    /// 64-byte blocks of one copy of the tier filter.
    pub tier_filter_blocks: u32,
    /// Hold records: in-flight slots recorded with the process holding
    /// them (see `holds.rs`).
    pub hold_records: u32,
    /// Bytes of the handover section (see `handover.rs`; 0: none).
    pub handover_bytes: u32,
}

/// Most hold records a region has: in-flight slots held at once on one
/// host and recorded with their process (1 MiB of records).
pub const MAX_HOLD_RECORDS: u32 = 32768;

/// Hold records of a table on the heap (the C ABI's, tests').
pub const HEAP_HOLD_RECORDS: u32 = 256;

/// Hold records for a quota table of `bytes` (a region's bytes besides
/// its key and tier sections: `sluice_zone`'s size): one per KiB (3% of
/// them), at most [`MAX_HOLD_RECORDS`] (a 1 MiB table records 1,024 slots
/// held at once; one of 32 MiB or more, 32,768).
pub fn hold_records_for(bytes: usize) -> u32 {
    (bytes >> 10).min(MAX_HOLD_RECORDS as usize) as u32
}

/// Bytes of a region's handover section for a quota table of `bytes`
/// (`sluice_zone`'s size besides keys and tiers): a sixteenth, at most
/// 16 MiB, in whole cache lines (a 1 MiB zone's holds 21 KiB a part). A
/// record costs about 80 bytes per counter sent and not confirmed yet,
/// per root, and 40 per counter unacknowledged.
pub fn handover_bytes_for(bytes: usize) -> u32 {
    ((bytes / 16).min(16 << 20) & !63) as u32
}

/// Most keys a region holds: 2^30 (48 GiB of entries), the one ceiling
/// nginx's `sluice_keys` and the C ABI's `key_capacity` are checked
/// against ([`check_key_capacity`]). Entry numbers plus one then stay well
/// below 2^32, as a dirty-ring cell (shared with a position tag) needs.
pub const MAX_KEYS: u64 = 1 << 30;

/// Most key buckets a region holds.
pub const MAX_KEY_BUCKETS: u32 = (MAX_KEYS / KEY_WAYS as u64) as u32;

/// Bytes a key costs in the key section when full: its entry and its
/// share of the dirty ring.
pub const KEY_BYTES: u64 = std::mem::size_of::<KeyEntry>() as u64 + 1;

/// `Err` with the reason when a key section for `keys` keys is more than
/// a region can hold ([`MAX_KEYS`]).
pub fn check_key_capacity(keys: u64) -> Result<(), String> {
    if keys > MAX_KEYS {
        return Err(format!(
            "{keys} keys is more than the {MAX_KEYS} a key section holds ({} GiB)",
            (MAX_KEYS * KEY_BYTES) >> 30
        ));
    }
    Ok(())
}

/// Most overrides and penalties a region holds: 2^28.
pub const MAX_TIERS: u64 = 1 << 28;

/// `Err` with the reason when a tier section for `overrides` is more than
/// a region can hold ([`MAX_TIERS`]).
pub fn check_tier_capacity(overrides: u64) -> Result<(), String> {
    if overrides > MAX_TIERS {
        return Err(format!(
            "{overrides} overrides is more than the {MAX_TIERS} a tier section holds"
        ));
    }
    Ok(())
}

/// Bytes one key bucket takes with its share of the dirty ring.
pub const BYTES_PER_KEY_BUCKET: usize = std::mem::size_of::<KeyBucket>() + 4;

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
            key_buckets: 0,
            key_ring: 0,
            tier_entries: 0,
            tier_filter_blocks: 0,
            hold_records: 0,
            handover_bytes: 0,
        }
    }

    /// The same geometry with `records` hold records.
    pub fn with_holds(self, records: u32) -> Self {
        Self {
            hold_records: records.min(MAX_HOLD_RECORDS),
            ..self
        }
    }

    /// The same geometry with a handover section of `bytes` (rounded
    /// down to whole cache lines).
    pub fn with_handover(self, bytes: u32) -> Self {
        Self {
            handover_bytes: bytes & !63,
            ..self
        }
    }

    /// Offset of the handover section.
    pub fn handover_offset(&self) -> usize {
        line_up(
            self.holds_offset() + self.hold_records as usize * std::mem::size_of::<HoldRecord>(),
        )
    }

    /// Offset of hold record 0.
    pub fn holds_offset(&self) -> usize {
        line_up(self.tier_filter_offset() + self.tier_filter_blocks as usize * 64 * 2)
    }

    /// The same geometry with room for `overrides` overrides and
    /// penalties (at most [`MAX_TIERS`]): entries for a load of 4/5, and
    /// a filter of 16 bits an entry in each copy.
    pub fn with_tiers(self, overrides: u64) -> Self {
        let overrides = overrides.min(MAX_TIERS);
        let (entries, blocks) = if overrides == 0 {
            (0, 0)
        } else {
            let entries = (overrides * 5).div_ceil(4).max(64);
            (entries as u32, entries.div_ceil(32) as u32)
        };
        Self {
            tier_entries: entries,
            tier_filter_blocks: blocks,
            ..self
        }
    }

    /// Overrides and penalties the tier section holds.
    pub fn tier_capacity(&self) -> u64 {
        u64::from(self.tier_entries) * 4 / 5
    }

    /// Offset of tier entry 0.
    pub fn tier_entries_offset(&self) -> usize {
        line_up(
            self.key_buckets_offset()
                + self.key_buckets as usize * std::mem::size_of::<KeyBucket>(),
        )
    }

    /// Offset of the tier filter's first copy (the second follows it).
    pub fn tier_filter_offset(&self) -> usize {
        self.tier_entries_offset() + self.tier_entries as usize * std::mem::size_of::<TierEntry>()
    }

    /// The same geometry with room for `keys` keys (rounded up to whole
    /// buckets, at most [`MAX_KEYS`]: callers check
    /// [`check_key_capacity`] first); a dirty ring of one entry per eight
    /// keys, at least 64.
    pub fn with_keys(self, keys: u64) -> Self {
        let buckets = keys
            .div_ceil(KEY_WAYS as u64)
            .min(u64::from(MAX_KEY_BUCKETS)) as u32;
        let ring = if buckets == 0 {
            0
        } else {
            // Any length: positions are taken modulo it. A power of two
            // would nearly double the ring for some sizes, past the bytes
            // `sluice_keys` gave.
            (buckets as u64 * KEY_WAYS as u64 / 8).max(64) as u32
        };
        Self {
            key_buckets: buckets,
            key_ring: ring,
            ..self
        }
    }

    /// Keys the key section holds.
    pub fn key_capacity(&self) -> u64 {
        u64::from(self.key_buckets) * KEY_WAYS as u64
    }

    /// The largest geometry that fits `bytes` for the given average name.
    pub fn fitting(bytes: usize, avg_name_bytes: usize) -> Option<Self> {
        let per_name = avg_name_bytes.div_ceil(GRANULE).max(1) * GRANULE;
        let per_quota = std::mem::size_of::<Slot>() + 8 + 1 + 12 + per_name;
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

    /// Offset of the held section (one word per slot).
    pub fn held_offset(&self) -> usize {
        line_up(self.slots_offset() + self.capacity as usize * std::mem::size_of::<Slot>())
    }

    /// Cells of the named quotas' dirty ring: one per eight slots, at
    /// least 64 (more changed quotas than that in one cycle, and a scan
    /// of every slot costs little more than the ring would).
    pub fn slot_ring(&self) -> u32 {
        (self.capacity / 8).max(64)
    }

    /// Offset of the named quotas' dirty ring.
    pub fn slot_ring_offset(&self) -> usize {
        line_up(self.held_offset() + self.capacity as usize * 8)
    }

    /// Offset of the arena.
    pub fn arena_offset(&self) -> usize {
        line_up(self.slot_ring_offset() + self.slot_ring() as usize * 8)
    }

    /// Offset of the dirty ring.
    pub fn key_ring_offset(&self) -> usize {
        line_up(self.arena_offset() + self.arena_granules as usize * GRANULE)
    }

    /// Offset of key bucket 0.
    pub fn key_buckets_offset(&self) -> usize {
        line_up(self.key_ring_offset() + self.key_ring as usize * 8)
    }

    /// Total bytes of a region with this geometry.
    pub fn region_len(&self) -> usize {
        self.handover_offset() + self.handover_bytes as usize
    }

    /// The largest geometry that fits `bytes` with `key_bytes` of them
    /// (at most) given to keys.
    pub fn fitting_with_keys(
        bytes: usize,
        avg_name_bytes: usize,
        key_bytes: usize,
    ) -> Option<Self> {
        Self::fitting_with(bytes, avg_name_bytes, key_bytes, 0)
    }

    /// The largest geometry that fits `bytes` with `key_bytes` of them
    /// (at most) given to keys and `tier_bytes` to overrides and
    /// penalties.
    pub fn fitting_with(
        bytes: usize,
        avg_name_bytes: usize,
        key_bytes: usize,
        tier_bytes: usize,
    ) -> Option<Self> {
        let buckets = key_bytes / BYTES_PER_KEY_BUCKET;
        let keys = buckets as u64 * KEY_WAYS as u64;
        let tiers = tier_bytes as u64 / TIER_BYTES;
        let quota_bytes = bytes.saturating_sub(key_bytes + tier_bytes);
        let holds = hold_records_for(quota_bytes);
        let handover = handover_bytes_for(quota_bytes);
        let sections = Self::new(1, avg_name_bytes)
            .with_keys(keys)
            .with_tiers(tiers)
            .with_holds(holds)
            .with_handover(handover);
        let sections_len = sections.region_len() - sections.key_ring_offset();
        let g = Self::fitting(bytes.checked_sub(sections_len)?, avg_name_bytes)?
            .with_keys(keys)
            .with_tiers(tiers)
            .with_holds(holds)
            .with_handover(handover);
        (g.region_len() <= bytes).then_some(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::region::layout::{GRANULE, TIER_BYTES};

    #[test]
    fn sections_are_line_aligned_and_do_not_overlap() {
        let g = Geometry::new(1000, 24);
        assert_eq!(g.index_len, 1504);
        assert_eq!(Geometry::index_offset() % 64, 0);
        assert_eq!(g.slots_offset() % 64, 0);
        assert!(g.slots_offset() >= Geometry::index_offset() + 1504 * 8);
        assert!(g.held_offset() >= g.slots_offset() + 1000 * 128);
        assert!(g.slot_ring_offset() >= g.held_offset() + 1000 * 8);
        assert_eq!(g.slot_ring_offset() % 64, 0);
        assert!(g.arena_offset() >= g.slot_ring_offset() + 125 * 8);
        assert!(g.region_len() >= g.arena_offset() + 2000 * GRANULE);
    }

    #[test]
    fn a_key_section_fits_the_bytes_given_to_it_whatever_its_size() {
        // A 1 MiB quota table beside key sections of every size from 1 MiB
        // to 256 MiB: the region holds both (a dirty ring rounded to a
        // power of two once overran `sluice_keys 128m` by 1.4 MB).
        for mib in [1usize, 3, 7, 16, 100, 128, 200, 256] {
            let keys = mib << 20;
            let total = (1 << 20) + keys;
            let g = Geometry::fitting_with_keys(total, 32, keys)
                .unwrap_or_else(|| panic!("{mib} MiB of keys do not fit"));
            assert!(g.region_len() <= total);
            let section = g.holds_offset() - g.key_ring_offset();
            assert!(section <= keys + 128, "{mib} MiB: section {section}");
            assert!(g.capacity > 1000, "{mib} MiB: {g:?}");
        }
    }

    #[test]
    fn a_tier_section_fits_the_bytes_given_to_it() {
        for mib in [1usize, 4, 85, 100] {
            let tiers = mib << 20;
            let total = (1 << 20) + (16 << 20) + tiers;
            let g = Geometry::fitting_with(total, 32, 16 << 20, tiers).unwrap();
            assert!(g.region_len() <= total);
            let section = g.holds_offset() - g.tier_entries_offset();
            assert!(section <= tiers + 128, "{mib} MiB: section {section}");
            assert!(
                g.tier_capacity() * TIER_BYTES >= (tiers as u64) * 9 / 10,
                "{g:?}"
            );
            assert_eq!(g.tier_filter_offset() % 64, 0);
        }
        // A million overrides in 85 MiB.
        let g = Geometry::new(1000, 32).with_tiers(1_000_000);
        let bytes = g.region_len() - g.tier_entries_offset();
        assert!(bytes <= 85 << 20, "{bytes}");
    }

    #[test]
    fn fitting_uses_the_space_it_is_given() {
        for bytes in [64 << 10, 1 << 20, 10 << 20, 100 << 20] {
            let g = Geometry::fitting(bytes, 32).unwrap();
            assert!(g.region_len() <= bytes);
            // At least 80% of what an ideal packing would hold.
            let ideal = bytes / (128 + 8 + 1 + 12 + 32);
            assert!(g.capacity as usize * 10 >= ideal * 7, "{bytes}: {g:?}");
        }
        assert!(Geometry::fitting(100, 32).is_none());
    }

    #[test]
    fn a_zone_has_a_hold_record_per_kib_up_to_the_most() {
        let g = Geometry::fitting_with(1 << 20, 32, 0, 0).unwrap();
        assert_eq!(g.hold_records, 1024);
        assert!(g.region_len() <= 1 << 20);
        let g = Geometry::fitting_with((32 << 20) + (20 << 20), 32, 16 << 20, 4 << 20).unwrap();
        assert_eq!(g.hold_records, MAX_HOLD_RECORDS);
        assert_eq!(g.holds_offset() % 64, 0);
        assert!(g.region_len() <= 52 << 20);
    }
}
