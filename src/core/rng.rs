//! The PRNG the decision draws from: wyrand, one `u64` of state.
//!
//! A draw is an add, a 128-bit multiply and an xor: a few nanoseconds, no
//! syscall. Each thread has its own generator, seeded on its first draw
//! with a seed its caller gives ([`thread_unit_seeded`]): the shells pass
//! one from the OS (`crate::host::thread_unit`), so nginx workers and
//! threads draw apart, while the core itself reads nothing from outside
//! and is deterministic given its seeds. [`thread_unit`] seeds with a
//! fixed number (tests, the table's convenience check); tests seed a
//! [`Rng`] of their own, or the thread's with [`seed_thread_rng`].

use std::cell::Cell;

/// The seed [`thread_unit`] gives a thread's generator.
const FIXED_SEED: u64 = 0x5eed_5eed_5eed_5eed;

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

thread_local! {
    static THREAD_RNG: Cell<u64> = const { Cell::new(0) };
}

/// A uniform draw in `[0, 1)` from this thread's generator. The thread's
/// first draw seeds it with `seed()` (a shell passes randomness from the
/// OS, see `crate::host`); later draws never call `seed`.
#[inline]
pub fn thread_unit_seeded(seed: impl FnOnce() -> u64) -> f64 {
    THREAD_RNG.with(|cell| {
        let mut state = cell.get();
        if state == 0 {
            state = seed() | 1;
        }
        let mut rng = Rng::new(state);
        let x = rng.next_unit();
        // Zero marks "unseeded"; wyrand's state walks an odd-step cycle
        // through every u64, so skip the single zero it can reach.
        cell.set(if rng.state == 0 { 1 } else { rng.state });
        x
    })
}

/// [`thread_unit_seeded`] with a fixed seed: a thread's draws are the
/// same in every run (tests, the table's convenience check).
pub fn thread_unit() -> f64 {
    thread_unit_seeded(|| FIXED_SEED)
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
    fn a_thread_is_seeded_once_by_its_first_draw() {
        std::thread::spawn(|| {
            let mut seeds = 0;
            let first = thread_unit_seeded(|| {
                seeds += 1;
                42
            });
            let second = thread_unit_seeded(|| unreachable!("seeded already"));
            let mut expected = Rng::new(42 | 1);
            assert_eq!(
                (first, second),
                (expected.next_unit(), expected.next_unit())
            );
            assert_eq!(seeds, 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_fixed_seed_gives_every_thread_the_same_draws() {
        let draws = || (0..5).map(|_| thread_unit()).collect::<Vec<f64>>();
        let a = std::thread::spawn(draws).join().unwrap();
        let b = std::thread::spawn(draws).join().unwrap();
        assert_eq!(a, b);
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
