//! Which root group (shard) a counter belongs to: the one rule every host
//! and the simulator route by, so that a fleet configured with the same
//! number of groups sends each counter to the same group (see the `sync`
//! module doc, "Root groups").

use crate::wire::CounterKey;

/// The shard (root group) of `counter` when there are `groups` groups:
/// a stable hash of the quota id and key hash, modulo `groups` (always 0
/// for one group). Every host and the simulator route by it.
pub fn shard(counter: CounterKey, groups: usize) -> usize {
    if groups <= 1 {
        return 0;
    }
    // splitmix64's finalizer: consecutive ids spread evenly.
    let mut x = counter.id ^ counter.key.rotate_left(32);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x % groups as u64) as usize
}
