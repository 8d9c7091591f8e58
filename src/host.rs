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

/// The start time of process `pid`, in clock ticks since boot (field 22
/// of `/proc/<pid>/stat`), and whether it is a zombie (dead, not reaped
/// yet); `None` when it cannot be read (no such process, or no /proc).
fn process_start(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces:
    // the fields after it start at the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let zombie = fields.next()? == "Z";
    // Field 3 (the state) was the first after ')'; field 22 is 19 later.
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, zombie))
}

/// An identity of process `pid` started at `start` ticks: the pid in the
/// low 32 bits, the start time's low 31 bits above (a pid the system
/// reuses for a later process is another identity). Never 0 (no process
/// has pid 0) nor all ones.
pub fn identity_of(pid: u32, start: u64) -> u64 {
    (start & 0x7fff_ffff) << 32 | u64::from(pid)
}

/// This process's identity ([`identity_of`]), or 0 when its start time
/// cannot be read (then it records nothing it holds).
pub fn process_identity() -> u64 {
    let pid = std::process::id();
    process_start(pid).map_or(0, |(start, _)| identity_of(pid, start))
}

/// False when the process `identity` names ([`identity_of`]) is dead: no
/// process has its pid, that process is a zombie, or it started at
/// another time (the pid was reused). True when it runs, or when this
/// cannot tell (a process of another user whose /proc entry is hidden).
pub fn process_alive(identity: u64) -> bool {
    let pid = identity as u32;
    let Ok(signed) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if signed <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks that `pid` exists.
    let rc = unsafe { libc::kill(signed, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match process_start(pid) {
        Some((start, zombie)) => !zombie && identity_of(pid, start) == identity,
        // It exists (kill found it) but its start time is hidden, or it
        // ended meanwhile: the next sweep tells.
        None => true,
    }
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

    #[test]
    fn this_process_is_alive_under_its_identity_and_not_under_another_start_time() {
        let me = process_identity();
        assert_ne!(me, 0);
        assert_eq!(me as u32, std::process::id());
        assert!(process_alive(me));
        // The same pid with another start time: the pid was reused.
        let reused = me ^ (1 << 32);
        assert!(!process_alive(reused));
    }

    #[test]
    fn a_process_that_exited_is_dead_whether_reaped_or_a_zombie() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let (start, _) = process_start(pid).expect("the child's start time");
        let identity = identity_of(pid, start);
        // Not reaped yet: a zombie once it has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while process_alive(identity) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!process_alive(identity), "an exited child is dead");
        child.wait().unwrap();
        assert!(!process_alive(identity), "and so once reaped");
    }
}
