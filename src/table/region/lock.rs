//! The region's writer lock (a spin lock naming its holder's process, so
//! a lock left by a dead process is taken over), the per-slot seqlock
//! write, and the process-id helpers both need.

use std::sync::atomic::{fence, AtomicU32};

use super::layout::Slot;
use super::sections::{Region, ACQ, REL, RLX};

impl Region {
    /// Takes the region's writer lock, held until the guard drops.
    pub(in crate::table) fn lock(&self) -> WriterGuard<'_> {
        WriterGuard::acquire(&self.header().writer)
    }
}

/// An open seqlock write on a slot: `seq` is odd until dropped.
pub(in crate::table) struct SeqWrite<'a> {
    seq: &'a AtomicU32,
}

impl<'a> SeqWrite<'a> {
    pub(in crate::table) fn begin(slot: &'a Slot) -> Self {
        let seq = &slot.seq;
        let s = seq.load(RLX);
        // A crashed writer may have left it odd; always move to odd.
        seq.store((s | 1).wrapping_add(if s & 1 == 1 { 2 } else { 0 }), RLX);
        fence(REL);
        SeqWrite { seq }
    }
}

impl Drop for SeqWrite<'_> {
    fn drop(&mut self) {
        let s = self.seq.load(RLX);
        self.seq.store(s.wrapping_add(1), REL);
    }
}

/// The region's writer lock, held for the guard's life.
pub(in crate::table) struct WriterGuard<'a> {
    lock: &'a AtomicU32,
}

impl<'a> WriterGuard<'a> {
    fn acquire(lock: &'a AtomicU32) -> Self {
        let me = own_pid();
        let mut spins = 0u32;
        loop {
            let holder = lock.load(RLX);
            if holder == 0 {
                if lock.compare_exchange_weak(0, me, ACQ, RLX).is_ok() {
                    return WriterGuard { lock };
                }
            } else if spins > 10_000 && holder != me && !process_alive(holder) {
                // The holder died mid-write: take the lock over.
                if lock.compare_exchange(holder, me, ACQ, RLX).is_ok() {
                    return WriterGuard { lock };
                }
            }
            spins = spins.saturating_add(1);
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.lock.store(0, REL);
    }
}

/// This process's id, cached: `getpid` is a system call, and the writer
/// lock asks once per merged counter (a fifth of a sync cycle's CPU when
/// uncached). A fork clears the cache in the child (nginx forks its
/// workers from the master, which may have used a table already).
pub(in crate::table) fn own_pid() -> u32 {
    static PID: AtomicU32 = AtomicU32::new(0);
    static ATFORK: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget_pid() {
        PID.store(0, RLX);
    }
    let pid = PID.load(RLX);
    if pid != 0 {
        return pid;
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic, which
        // is async-signal-safe as a fork child handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(forget_pid)) };
    });
    let pid = std::process::id().max(1);
    PID.store(pid, RLX);
    pid
}

pub(in crate::table) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for the process's existence.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}
