//! The PRNG the decision draws from: wyrand, one `u64` of state.
//!
//! A draw is an add, a 128-bit multiply and an xor: a few nanoseconds, no
//! syscall. Each thread has its own generator, seeded once from std's
//! per-thread random hash keys mixed with the process id (nginx workers fork
//! from one master, so the process id keeps their sequences apart). Tests
//! seed a [`Rng`] of their own, or the thread's with [`seed_thread_rng`].

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};

/// A small, fast, seedable generator (wyrand).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator with the given seed; equal seeds give equal sequences.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.state) * u128::from(self.state ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// A uniform draw in `[0, 1)` with 53 bits of precision.
    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

fn fresh_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() | 1
}

thread_local! {
    static THREAD_RNG: Cell<u64> = const { Cell::new(0) };
}

/// A uniform draw in `[0, 1)` from this thread's generator.
pub fn thread_unit() -> f64 {
    THREAD_RNG.with(|cell| {
        let mut state = cell.get();
        if state == 0 {
            state = fresh_seed();
        }
        let mut rng = Rng::new(state);
        let x = rng.next_unit();
        // Zero marks "unseeded"; wyrand's state walks an odd-step cycle
        // through every u64, so skip the single zero it can reach.
        cell.set(if rng.state == 0 { 1 } else { rng.state });
        x
    })
}

/// Seeds this thread's generator, for reproducible tests.
pub fn seed_thread_rng(seed: u64) {
    THREAD_RNG.with(|cell| cell.set(seed | 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_seeds_give_equal_sequences() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn unit_draws_are_in_range_and_roughly_uniform() {
        let mut r = Rng::new(7);
        let n = 100_000;
        let mut buckets = [0u32; 10];
        for _ in 0..n {
            let x = r.next_unit();
            assert!((0.0..1.0).contains(&x));
            buckets[(x * 10.0) as usize] += 1;
        }
        for b in buckets {
            assert!((9_000..11_000).contains(&b), "bucket count {b}");
        }
    }

    #[test]
    fn seeded_thread_rng_is_reproducible() {
        seed_thread_rng(99);
        let a: Vec<f64> = (0..5).map(|_| thread_unit()).collect();
        seed_thread_rng(99);
        let b: Vec<f64> = (0..5).map(|_| thread_unit()).collect();
        assert_eq!(a, b);
    }
}
