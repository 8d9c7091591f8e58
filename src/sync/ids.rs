//! Hash maps keyed by quota id, for the sync cycle's bookkeeping.
//!
//! A cycle looks every changed counter up in several maps (slot, owed,
//! unacknowledged, recently changed). Quota ids are numbers the database
//! hands out, not keys a client chooses, so a keyed hash (std's SipHash,
//! ~20 ns a lookup) protects against nothing here; one multiply spreads
//! consecutive ids over the table's buckets as well.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use crate::wire::CounterKey;

/// An odd 64-bit constant (2^64 / golden ratio): multiplying by it mixes
/// the low bits of an id into the high bits the table looks at.
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// A hasher for `u64` quota ids: one rotate, xor and multiply per word.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(MIX);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by quota id.
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A map keyed by counter (a quota id, and a key hash for keyed
/// counters: the hash is already random, the id needs the mixing).
pub type CounterMap<V> = HashMap<CounterKey, V, BuildHasherDefault<IdHasher>>;

/// A set of counters.
pub type CounterSet = HashSet<CounterKey, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A set of quota ids.
    type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

    #[test]
    fn consecutive_ids_spread_over_the_high_bits() {
        // hashbrown picks buckets with the low bits and tags with the top
        // seven: both must vary across consecutive ids.
        let hash = |id: u64| {
            let mut h = IdHasher::default();
            h.write_u64(id);
            h.finish()
        };
        let tags: IdSet = (1..=1000).map(|id| hash(id) >> 57).collect();
        assert_eq!(tags.len(), 128);
        let buckets: IdSet = (1..=1000).map(|id| hash(id) & 1023).collect();
        assert!(buckets.len() > 600, "{} of 1024 buckets", buckets.len());
    }
}
