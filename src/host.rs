//! What the shells ask the operating system about this host: its name,
//! fresh random seeds, and (for a root) room for open files. Like
//! [`crate::clock`], a border of small `unsafe` calls that the folders
//! above keep out of their own code (they forbid `unsafe`); the pure core
//! takes seeds and names as parameters.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// This host's name, when the system gives one that is UTF-8.
pub fn name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end]).ok().map(str::to_string)
}

/// A fresh, non-zero random seed: std's random hash keys (read from the
/// OS once per thread, then stepped at each call) mixed with the process
/// id and the clock, so nginx workers forked from one master, and two
/// calls of one thread, draw apart.
pub fn random_seed() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(crate::clock::now_precise());
    h.finish().max(1)
}

/// Raises this process's soft limit on open files to its hard limit (a
/// root holds one per connection); returns the limit now in force, or
/// `None` if it cannot be read.
pub fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Some(limit.rlim_cur)
}

/// A uniform draw in `[0, 1)` from this thread's generator
/// ([`crate::core::rng`]), seeded on the thread's first draw with
/// [`random_seed`]: what the shells (nginx, the C ABI) pass to a check.
#[inline]
pub fn thread_unit() -> f64 {
    crate::core::rng::thread_unit_seeded(random_seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_call_to_call_and_are_never_zero() {
        let seeds: Vec<u64> = (0..64).map(|_| random_seed()).collect();
        assert!(seeds.iter().all(|&s| s != 0));
        let mut distinct = seeds.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), seeds.len());
    }

    #[test]
    fn a_host_has_a_name() {
        assert!(name().is_some_and(|n| !n.is_empty()));
    }
}
