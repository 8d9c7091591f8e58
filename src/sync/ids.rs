//! Hash maps keyed by quota id, for the sync cycle's bookkeeping.
//!
//! A cycle looks every changed counter up in several maps (slot, owed,
//! unacknowledged, recently changed). Quota ids are numbers the database
//! hands out, not keys a client chooses, so a keyed hash (std's SipHash,
//! ~20 ns a lookup) protects against nothing here.
//!
//! What costs is memory: at 100k changed counters each map is megabytes,
//! and a hash that scatters consecutive ids makes every lookup a cache
//! miss (measured: half of taking a reply in waited on one map's buckets).
//! So a named counter's hash keeps its id's low bits as the bucket:
//! consecutive ids sit in consecutive buckets, a map iterates in about id
//! order, the request carries deltas in that order, the root answers in
//! the order it counted them, and the next cycle's lookups walk each map
//! front to back. The id's higher bits are folded in so that ids in
//! power-of-two strides still spread, and the top seven bits (hashbrown's
//! tag) come from a multiply so that neighbours are told apart without
//! comparing keys. A keyed counter's key hash is already random: its hash
//! is mixed as before.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use crate::wire::CounterKey;

/// An odd 64-bit constant (2^64 / golden ratio): multiplying by it mixes
/// the low bits of an id into the high bits.
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// Consecutive ids that stay next to each other in a map's buckets.
const RUN_BITS: u32 = 6;
const RUN: u64 = 1 << RUN_BITS;

/// The bits hashbrown takes its tag from (the top seven).
const TAG: u64 = 0xfe00_0000_0000_0000;

/// A hasher for quota ids and counters: one word (an id) or two (a
/// counter: id, then key hash, 0 for a named quota's own counter).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher {
    /// The first word written: the quota id.
    id: u64,
    /// The later words mixed together (0: none, or a named counter).
    key: u64,
    /// Words written so far.
    words: u32,
}

impl IdHasher {
    /// The hash of quota id `id` alone: ids in runs of [`RUN`] keep their
    /// order in the buckets, each run rotated by a random amount and put
    /// at a random place (so that ids in strides spread), the tag from a
    /// multiply.
    fn local(id: u64) -> u64 {
        let run = spread(id >> RUN_BITS);
        let offset = id.wrapping_add(run >> (64 - RUN_BITS)) & (RUN - 1);
        ((run << RUN_BITS | offset) & !TAG) | (id.wrapping_mul(MIX) & TAG)
    }
}

/// A bijective mix of every bit of `x` into every other (splitmix64's
/// finaliser).
fn spread(x: u64) -> u64 {
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        if self.words == 0 {
            self.id = word;
        } else {
            self.key = (self.key.rotate_left(26) ^ word).wrapping_mul(MIX);
        }
        self.words += 1;
    }

    fn finish(&self) -> u64 {
        if self.key == 0 {
            Self::local(self.id)
        } else {
            let h = (self.id.wrapping_mul(MIX).rotate_left(26) ^ self.key).wrapping_mul(MIX);
            // A product's low bits depend only on its factors' low bits:
            // fold the high ones in, for the bucket.
            h ^ (h >> 32)
        }
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

    fn hash_of(words: &[u64]) -> u64 {
        let mut h = IdHasher::default();
        for &w in words {
            h.write_u64(w);
        }
        h.finish()
    }

    #[test]
    fn consecutive_ids_sit_in_consecutive_buckets_with_varied_tags() {
        // hashbrown picks buckets with the low bits and tags with the top
        // seven: within a run buckets follow the ids (wrapping around in
        // the run), tags vary.
        let tags: IdSet = (1..=1000).map(|id| hash_of(&[id]) >> 57).collect();
        assert_eq!(tags.len(), 128);
        for id in (1..1000u64).filter(|id| (id + 1) % RUN != 0) {
            let run = RUN - 1;
            assert_eq!(hash_of(&[id + 1]) & run, (hash_of(&[id]) + 1) & run);
            assert_eq!(
                hash_of(&[id + 1]) & !run & 0xffff,
                hash_of(&[id]) & !run & 0xffff
            );
        }
    }

    #[test]
    fn a_named_counter_hashes_as_its_id() {
        let named = CounterKey::named(77);
        let mut h = IdHasher::default();
        std::hash::Hash::hash(&named, &mut h);
        assert_eq!(h.finish(), hash_of(&[77]));
    }

    #[test]
    fn ids_in_power_of_two_strides_spread_over_the_buckets() {
        for shift in [10, 16, 20, 32, 40] {
            let buckets: IdSet = (1..=1000u64)
                .map(|i| hash_of(&[i << shift]) & 1023)
                .collect();
            // Random places would fill ~640 of 1024.
            assert!(
                buckets.len() > 600,
                "stride 2^{shift}: {} buckets",
                buckets.len()
            );
        }
    }

    #[test]
    fn keys_of_one_template_spread_over_buckets_and_tags() {
        // Key hashes are random; make them so here with a multiply.
        let keyed = |k: u64| hash_of(&[5, k.wrapping_mul(MIX) | 1]);
        let buckets: IdSet = (1..=1000).map(|k| keyed(k) & 1023).collect();
        assert!(buckets.len() > 600, "{} of 1024 buckets", buckets.len());
        let tags: IdSet = (1..=1000).map(|k| keyed(k) >> 57).collect();
        assert_eq!(tags.len(), 128);
    }

    #[test]
    fn a_map_of_consecutive_ids_iterates_in_id_order() {
        let map: IdMap<()> = (1..=5000u64).map(|id| (id, ())).collect();
        let order: Vec<u64> = map.keys().copied().collect();
        // Each run of RUN ids wraps around once and jumps to the next run:
        // about 2 steps in RUN do not ascend (with a scattering hash, all but
        // 1 in RUN would not).
        let ascending = order.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(ascending > 4500, "{ascending} of 4999 steps ascend");
    }
}
