//! How large the shared zone is: the defaults of `sluice_zone`,
//! `sluice_keys` and `sluice_overrides`, their bounds, and the check `nginx -t` runs on a
//! `sluice_zone` size. Pure: `cargo test` covers it without nginx.

use crate::table::geometry::Geometry;
use crate::table::layout::MAX_CAPACITY;

/// Zone size when `sluice_zone` is not given: about 168,000 quotas with
/// 32-byte names.
pub const DEFAULT_ZONE_SIZE: usize = 32 << 20;

/// Smallest zone accepted.
pub const MIN_ZONE_SIZE: usize = 256 << 10;

/// Bytes of the zone given to keys when `sluice_keys` is not set (about
/// 340,000 keys).
pub const DEFAULT_KEYS_SIZE: usize = 16 << 20;

/// Largest `sluice_keys`: the key section of the most keys a region holds
/// ([`crate::table::geometry::MAX_KEYS`]).
pub const MAX_KEYS_SIZE: usize =
    crate::table::geometry::MAX_KEY_BUCKETS as usize * crate::table::geometry::BYTES_PER_KEY_BUCKET;

/// Bytes of the zone given to overrides and penalties when
/// `sluice_overrides` is not set (about 50,000 of them).
pub const DEFAULT_OVERRIDES_SIZE: usize = 4 << 20;

/// Largest `sluice_overrides`: the tier section of the most overrides a
/// region holds ([`crate::table::geometry::MAX_TIERS`]).
pub const MAX_OVERRIDES_SIZE: usize =
    (crate::table::geometry::MAX_TIERS * crate::table::layout::TIER_BYTES) as usize;

/// The average quota name length the zone's name arena is sized for.
pub const AVG_NAME_BYTES: usize = 32;

/// The largest zone size that is of any use: the largest table with the
/// slab allocator's page bookkeeping (under 1%) and some slack on top.
pub fn largest_useful_size() -> usize {
    let region = Geometry::new(MAX_CAPACITY, AVG_NAME_BYTES).region_len();
    region + region / 64 + (1 << 20)
}

/// Checks a `sluice_zone` size, so that `nginx -t` refuses what nginx
/// would only fail to map later (without a file and line): at least
/// `min`, at most `largest` (what the largest quota table fills; more is
/// never used) rounded up to a whole megabyte, and at most the machine's
/// `memory`, when known. The megabytes a message names are the bound
/// itself: the size it names passes, one more megabyte does not.
pub fn check_zone_size(
    size: usize,
    min: usize,
    largest: usize,
    memory: Option<usize>,
) -> Result<(), String> {
    const MIB: usize = 1 << 20;
    if size < min {
        return Err(format!(
            "is too small: sluice needs at least {}k",
            min >> 10
        ));
    }
    let largest_mib = largest.div_ceil(MIB);
    if size > largest_mib.saturating_mul(MIB) {
        return Err(format!(
            "is larger than sluice can use: the largest quota table fits in {largest_mib}m"
        ));
    }
    if let Some(memory) = memory.filter(|&m| size > m) {
        return Err(format!(
            "is larger than this machine's memory ({}m)",
            memory / MIB
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nginx::args::parse_size;

    #[test]
    fn zone_sizes_must_fit_the_table_and_the_machine() {
        let (min, largest) = (256 << 10, 3 << 30);
        assert!(check_zone_size(32 << 20, min, largest, Some(8 << 30)).is_ok());
        assert!(check_zone_size(32 << 20, min, largest, None).is_ok());
        assert!(check_zone_size(100 << 10, min, largest, None)
            .unwrap_err()
            .contains("too small"));
        let huge = parse_size(b"100g").unwrap();
        assert!(check_zone_size(huge, min, largest, None)
            .unwrap_err()
            .contains("largest quota table fits in 3072m"));
        assert!(check_zone_size(2 << 30, min, largest, Some(1 << 30))
            .unwrap_err()
            .contains("machine's memory (1024m)"));
    }

    /// The case: the largest table needs 2796.3m; 2797m was
    /// refused with "fits in 2797m". The size a message names passes.
    #[test]
    fn the_megabytes_a_message_names_are_accepted() {
        let min = 256 << 10;
        let largest = (2796 << 20) + (300 << 10);
        assert_eq!(check_zone_size(2797 << 20, min, largest, None), Ok(()));
        let e = check_zone_size(2798 << 20, min, largest, None).unwrap_err();
        assert!(e.ends_with("fits in 2797m"), "{e}");
        let memory = Some((1000 << 20) + (512 << 10));
        assert_eq!(check_zone_size(1000 << 20, min, largest, memory), Ok(()));
        let e = check_zone_size(1001 << 20, min, largest, memory).unwrap_err();
        assert!(e.ends_with("memory (1000m)"), "{e}");
    }
}
