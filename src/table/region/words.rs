//! How numbers are packed into the region's words: a key's level and
//! time in one word ([`pack_known`]), a sliding key's fill rate in 16
//! bits of its `dirty` word ([`pack_key_rate`]) or an in-flight key's
//! held slots there ([`pack_key_held`]), a sliding slot's rate
//! and previous count in one word ([`pack_rate_prev`]), and the keys'
//! coarse clock ([`key_tick`]).

/// Where [`pack_key_rate`] puts a rate in a key entry's `dirty` word
/// (bits 16..32; the layout's `RATE_SHIFT`).
pub const RATE_SHIFT: u32 = 16;

/// The largest fill rate [`pack_key_rate`] keeps (units/s); a larger
/// one is kept as this, whose 16 bits stay finite.
pub const MAX_KEY_RATE: f64 = 1e30;

/// A sliding key's fill rate (units/s) in 16 bits, for the layout's `DIRTY_RATE_MASK`:
/// the `f32`'s exponent and its top 8 bits of mantissa (its sign is
/// always 0), rounded up, so a rate is kept within 0.4% and never below
/// itself (an estimate errs high). Not a number, or below 0: 0.
pub fn pack_key_rate(rate: f64) -> u32 {
    let rate = if rate > 0.0 {
        rate.min(MAX_KEY_RATE)
    } else {
        0.0
    };
    let bits = (rate as f32).to_bits();
    // Below 0x7f80_0000 (finite, not negative): no carry into bit 31.
    (bits + (1 << 15) - 1) >> 15 << RATE_SHIFT
}

/// The fill rate [`pack_key_rate`] put in a `dirty` word.
#[inline(always)]
pub fn unpack_key_rate(dirty: u32) -> f64 {
    f64::from(f32::from_bits((dirty >> RATE_SHIFT) << 15))
}

/// The most slots [`pack_key_held`] keeps of one key: a key of a
/// per-key in-flight quota keeps this host's held slots in the 16 bits
/// a sliding key keeps its rate in (an in-flight quota has no window).
pub const MAX_KEY_HELD: i64 = 0xffff;

/// A key's held slots (see `books/key_sync.rs`, `count_key_held`) in 16
/// bits, for the layout's `DIRTY_RATE_MASK`: clamped to
/// `0..=`[`MAX_KEY_HELD`].
pub fn pack_key_held(held: i64) -> u32 {
    (held.clamp(0, MAX_KEY_HELD) as u32) << RATE_SHIFT
}

/// The held slots [`pack_key_held`] put in a `dirty` word.
pub fn unpack_key_held(dirty: u32) -> i64 {
    i64::from(dirty >> RATE_SHIFT)
}

/// A sliding window slot's `fill_rate` word: the others' fill rate and
/// the previous window's count, each an `f32` (a count is exact below
/// 2^24 and within 6e-8 of itself above; plenty for an estimate).
pub fn pack_rate_prev(rate: f64, prev: f64) -> u64 {
    u64::from((rate as f32).to_bits()) << 32 | u64::from((prev as f32).to_bits())
}

/// The rate and previous count [`pack_rate_prev`] stored.
pub fn unpack_rate_prev(word: u64) -> (f64, f64) {
    (
        f64::from(f32::from_bits((word >> 32) as u32)),
        f64::from(f32::from_bits(word as u32)),
    )
}

/// Nanoseconds in one unit of a packed `known` time (about a millisecond).
const KNOWN_UNIT_SHIFT: u32 = 20;

/// Packs a key's cluster level and its time into one word, so a check
/// reads both with one load and no seqlock: the level as an `f32` (exact
/// below 2^24, relative error 6e-8 above), the time as 32 bits of
/// ~1.05 ms units (rounded up), read back relative to the reader's `now`
/// ([`unpack_known`]) and valid within 2^31 units (~26 days) of it; the
/// maintenance sweep restamps older entries.
pub fn pack_known(level: f64, at: u64) -> u64 {
    let level = (level as f32).to_bits();
    // Rounded up: a level read back a little later than it was taken leaks
    // a little less, never more (an estimate errs high, by at most a
    // unit's worth of leak).
    let units = at.div_ceil(1 << KNOWN_UNIT_SHIFT);
    u64::from(level) << 32 | units & 0xffff_ffff
}

/// [`pack_known`] with the time rounded down instead of up.
pub fn pack_known_floor(level: f64, at: u64) -> u64 {
    let level = (level as f32).to_bits();
    u64::from(level) << 32 | (at >> KNOWN_UNIT_SHIFT) & 0xffff_ffff
}

/// The level and time [`pack_known`] stored, the time placed as near
/// `now` as the 32 bits allow.
pub fn unpack_known(word: u64, now: u64) -> (f64, u64) {
    let level = f64::from(f32::from_bits((word >> 32) as u32));
    let stored = word as u32;
    let now_units = now >> KNOWN_UNIT_SHIFT;
    let age = (now_units as u32).wrapping_sub(stored) as i32;
    let units = (now_units as i64 - i64::from(age)).max(0) as u64;
    (level, units << KNOWN_UNIT_SHIFT)
}

/// The coarse clock of a key entry's `used` word: ~67 ms ticks, 30 bits.
pub fn key_tick(now: u64) -> u32 {
    ((now >> 26) as u32) & 0x3fff_ffff
}
