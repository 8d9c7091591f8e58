//! Quota names: the hash the index uses and the arena that stores them.
//!
//! Names are stored as little-endian 8-byte words, zero padded, in chunks
//! of 16-byte granules; a chunk of `k` granules comes from free list `k-1`
//! or from the never-used end of the arena. Comparing a name reads the
//! words with atomic loads, so a concurrent writer is never a data race;
//! the slot's seqlock tells the reader whether what it read was stable.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::layout::GRANULE;

/// 64-bit hash of a name: word-at-a-time multiply-rotate, finished with
/// a full avalanche so both the low bits (index position) and the top byte
/// (index tag) are well mixed. Names come from the quota database, not
/// from requests, so the table holds no attacker-chosen collisions.
pub fn hash(name: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (name.len() as u64).wrapping_mul(K);
    let mut chunks = name.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap_or_default());
        h = (h.rotate_left(23) ^ w).wrapping_mul(K);
    }
    if !chunks.remainder().is_empty() {
        h = (h.rotate_left(23) ^ word_at(name, name.len() / 8)).wrapping_mul(K);
    }
    // murmur3's finaliser.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The `i`-th little-endian word of `name`, zero padded past its end.
///
/// Every lookup hashes and compares a name word by word, so this is on
/// the request path: whole words are one load, and a partial last word is
/// cut from an overlapping load of the name's last 8 bytes (or, for names
/// under 8 bytes, from a 4-, 2- and 1-byte load) rather than copied byte
/// by byte into a buffer (a copy and a store-forwarding stall that cost a
/// check ~15 ns).
pub fn word_at(name: &[u8], i: usize) -> u64 {
    let start = i.saturating_mul(8);
    if let Some(whole) = name.get(start..start.saturating_add(8)) {
        return u64::from_le_bytes(whole.try_into().unwrap_or_default());
    }
    let len = name.len();
    let rem = len.saturating_sub(start);
    if rem == 0 {
        return 0;
    }
    if len >= 8 {
        return last_word(name) >> (8 * (8 - rem));
    }
    // The whole name is this partial word (start is 0): two loads that
    // may overlap (an overlapping byte lands in the same place from both).
    if len >= 4 {
        let first = u32::from_le_bytes(name[..4].try_into().unwrap_or_default());
        let last = u32::from_le_bytes(name[len - 4..].try_into().unwrap_or_default());
        return u64::from(first) | u64::from(last) << (8 * (len - 4));
    }
    // One to three bytes: the first, the middle and the last.
    u64::from(name[0])
        | u64::from(name[len / 2]) << (8 * (len / 2))
        | u64::from(name[len - 1]) << (8 * (len - 1))
}

/// The last 8 bytes of `name` as a little-endian word (one load); 0 for
/// names under 8 bytes, whose first word already holds all of them.
#[inline(always)]
fn last_word(name: &[u8]) -> u64 {
    let tail = name.get(name.len().saturating_sub(8)..).unwrap_or_default();
    tail.try_into().map_or(0, u64::from_le_bytes)
}

/// A 64-bit fingerprint of a name from its length and its first and last
/// 8 bytes (two loads, two multiplies): equal names have equal
/// fingerprints, and names that differ there almost never do. Cheaper
/// than [`hash`] for a long name, but names differing only in their
/// middle bytes collide: a fingerprint is a guess to confirm, never a
/// name's identity.
#[inline(always)]
pub fn fingerprint(name: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let first = (word_at(name, 0) ^ name.len() as u64).wrapping_mul(K);
    (first ^ last_word(name)).wrapping_mul(K)
}

/// Granules needed for a name of `len` bytes (at least one).
pub fn granules_for(len: usize) -> usize {
    len.div_ceil(GRANULE).max(1)
}

/// Words of the arena holding a name that starts at granule `at`.
pub fn name_words(arena: &[AtomicU64], at: u32, len: usize) -> Option<&[AtomicU64]> {
    let start = at as usize * 2;
    arena.get(start..start + len.div_ceil(8))
}

/// True when the stored words equal `name` (length already matched).
pub fn equals(words: &[AtomicU64], name: &[u8]) -> bool {
    words
        .iter()
        .enumerate()
        .all(|(i, w)| w.load(Relaxed) == word_at(name, i))
}

/// Writes `name` into the words (the caller holds the writer lock and the
/// slot's seqlock is odd).
pub fn store(words: &[AtomicU64], name: &[u8]) {
    for (i, w) in words.iter().enumerate() {
        w.store(word_at(name, i), Relaxed);
    }
}

/// Copies a stored name into `out`, returning its length (`None` if `out`
/// is too short): for callers that must not allocate.
pub fn load_into(words: &[AtomicU64], len: usize, out: &mut [u8]) -> Option<usize> {
    let dst = out.get_mut(..len)?;
    for (chunk, w) in dst.chunks_mut(8).zip(words) {
        chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes()[..chunk.len()]);
    }
    Some(len)
}

/// Reads a stored name back.
pub fn load(words: &[AtomicU64], len: usize) -> Vec<u8> {
    let mut out: Vec<u8> = words
        .iter()
        .flat_map(|w| w.load(Relaxed).to_le_bytes())
        .collect();
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The obvious definition `word_at` must match.
    fn padded_word(name: &[u8], i: usize) -> u64 {
        let mut buf = [0u8; 8];
        for (k, b) in buf.iter_mut().enumerate() {
            *b = name.get(i * 8 + k).copied().unwrap_or(0);
        }
        u64::from_le_bytes(buf)
    }

    #[test]
    fn words_match_the_zero_padded_definition_for_every_length() {
        let bytes: Vec<u8> = (1..=40).collect();
        for len in 0..=bytes.len() {
            let name = &bytes[..len];
            for i in 0..7 {
                assert_eq!(word_at(name, i), padded_word(name, i), "len {len} word {i}");
            }
        }
    }

    #[test]
    fn words_pad_with_zeros() {
        assert_eq!(word_at(b"abc", 0), u64::from_le_bytes(*b"abc\0\0\0\0\0"));
        assert_eq!(
            word_at(b"abcdefghij", 1),
            u64::from_le_bytes(*b"ij\0\0\0\0\0\0")
        );
        assert_eq!(word_at(b"abcdefgh", 1), 0);
    }

    #[test]
    fn hashes_differ_for_names_differing_in_any_byte_or_length() {
        let base = b"s3_photos_read".to_vec();
        let h = hash(&base);
        for i in 0..base.len() {
            let mut other = base.clone();
            other[i] ^= 1;
            assert_ne!(hash(&other), h);
        }
        assert_ne!(hash(b"a"), hash(b"a\0"));
        assert_ne!(hash(b""), hash(b"\0"));
    }

    #[test]
    fn fingerprints_see_the_length_and_both_ends_only() {
        let base = b"s3_photos_of_2026_read".to_vec();
        let f = fingerprint(&base);
        for i in (0..8).chain(base.len() - 8..base.len()) {
            let mut other = base.clone();
            other[i] ^= 1;
            assert_ne!(fingerprint(&other), f, "byte {i}");
        }
        // The middle is not read: a guess, confirmed by a compare.
        let mut middle = base.clone();
        middle[10] ^= 1;
        assert_eq!(fingerprint(&middle), f);
        assert_ne!(fingerprint(b"q1"), fingerprint(b"q1\0"));
        assert_ne!(fingerprint(b"q1"), fingerprint(b"q2"));
        assert_ne!(fingerprint(b""), fingerprint(b"\0"));
        assert_eq!(fingerprint(b"abc"), fingerprint(&b"abcd"[..3]));
    }

    #[test]
    fn top_byte_and_low_bits_spread_over_sequential_names() {
        let mut tags = [0u32; 256];
        let mut lows = [0u32; 256];
        for i in 0..256 * 100 {
            let h = hash(format!("q{i}").as_bytes());
            tags[(h >> 56) as usize] += 1;
            lows[(h & 255) as usize] += 1;
        }
        assert!(tags
            .iter()
            .chain(lows.iter())
            .all(|&c| (50..160).contains(&c)));
    }

    #[test]
    fn names_round_trip_through_words() {
        let words: Vec<AtomicU64> = (0..6).map(|_| AtomicU64::new(0)).collect();
        let name = b"a_name_of_twenty_two_b";
        let w = name_words(&words, 1, name.len()).unwrap();
        store(w, name);
        assert!(equals(w, name));
        assert!(!equals(w, b"a_name_of_twenty_two_c"));
        assert_eq!(load(w, name.len()), name);
        assert!(name_words(&words, 2, 40).is_none());
    }
}
