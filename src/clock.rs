//! The monotonic clock the shells read and hand to the core.
//!
//! `CLOCK_MONOTONIC_COARSE` is read from the vDSO in a few nanoseconds
//! (the fine clock costs ~20 ns, as much as a whole check) and ticks every
//! 1–4 ms, finer than anything a 1 s sync interval can resolve. Every process
//! on a host reads the same clock, so nginx workers agree on `at` times in
//! the shared table.

use crate::core::Nanos;

/// Nanoseconds on the system-wide coarse monotonic clock.
pub fn now() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Nanoseconds on the fine monotonic clock (same origin as [`now`]), for
/// measuring round trips where the coarse clock's ticks are too large.
pub fn now_precise() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return now();
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// UTC nanoseconds (since the Unix epoch) minus the monotonic clock
/// ([`now`] and [`now_precise`] share its origin): turns it into this
/// machine's idea of UTC, for window quotas.
pub fn utc_offset() -> i64 {
    let utc = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    utc - now_precise() as i64
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_does_not_go_back() {
        let a = super::now();
        std::thread::sleep(std::time::Duration::from_millis(10));
        let b = super::now();
        assert!(a > 0 && b > a);
    }

    #[test]
    fn the_utc_offset_turns_the_clock_into_utc() {
        let utc = super::now() as i64 + super::utc_offset();
        // 2020-01-01 and 2200-01-01: a UTC time, not an uptime.
        assert!(utc > 1_577_836_800_000_000_000 && utc < 7_258_118_400_000_000_000);
    }
}
