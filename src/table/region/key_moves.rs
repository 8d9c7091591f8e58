//! Making room for a key whose two buckets are full: moving entries to
//! their other bucket (cuckoo moves), under the key lock.
//!
//! The search is breadth first from the key's two buckets: each entry of
//! a bucket could move to its own other bucket, which becomes a node one
//! step further. The first bucket found with a free or drained entry ends
//! the search; the chain of moves back to the key's bucket is then made
//! from its far end, each move freeing the entry the next one fills, and
//! the key takes the entry the last move freed. The shortest chain moves
//! the fewest entries, and each move is short: copy, publish, retire.
//!
//! Who holds the key lock: a check making room (a bounded wait: it spins,
//! then yields its CPU so that a holder preempted mid-batch can finish,
//! about a millisecond at worst; one that cannot have the lock in time is
//! an overflow for this once), and the sync thread around the work it does
//! on entries (see `key_sync.rs`), in batches between which it hands the
//! lock to a waiting check. A lock left by a dead process is taken over,
//! as the writer lock's is.

use crate::core::Nanos;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use super::key_entries::{clear_entry, key_source, set_key_source, KeyAt, KeyEntries, NoMove};
use super::layout::{
    KeyEntry, DIRTY_RATE_MASK, DIRTY_REFUSED, DIRTY_TIERS, DIRTY_TIERS_UNSURE, KEY_CLAIMED,
    KEY_WAYS,
};
use super::lock::{own_pid, process_alive};
use super::sections::{region_view, ACQ, REL, RLX};
use std::sync::atomic::Ordering::AcqRel;

/// Longest chain of moves a new key may cause.
pub const MAX_MOVE_DEPTH: usize = 5;

/// Buckets one search may look at (the two roots, then four children a
/// bucket): a search costs at most this many bucket reads.
const MAX_NODES: usize = 512;

/// Spins a check waits for the key lock before it starts yielding its CPU
/// (a few microseconds: the sync thread holds it for short batches and
/// hands it over between them when a check is waiting).
const CHECK_SPINS: u32 = 2_000;

/// Times a check then yields its CPU: a holder preempted mid-batch gets
/// the CPU back (if it waits on this one).
const CHECK_YIELDS: u32 = 200;

/// Then naps of [`CHECK_NAP`] before it gives up (the key is then an
/// overflow for this one check): a holder preempted on a busy machine
/// waits for a time slice, which yielding does not give it when it waits
/// on another CPU. All told a bound of about two milliseconds, met only
/// when a move is needed while the holder was preempted.
const CHECK_NAPS: u32 = 20;

/// One nap of a check waiting for the key lock.
const CHECK_NAP: std::time::Duration = std::time::Duration::from_micros(50);

/// Entries the sync thread handles under one hold of the key lock before
/// it lets a waiting check in.
pub(in crate::table) const SYNC_BATCH: usize = 64;

/// The key lock, held for the guard's life.
pub(in crate::table) struct KeyLock<'a> {
    lock: &'a AtomicU32,
    /// Checks waiting for it.
    wanted: &'a AtomicU32,
}

impl<'a> KeyLock<'a> {
    /// Takes the lock, however long it takes (the sync thread); a lock
    /// whose holder died is taken over.
    pub(in crate::table) fn acquire(lock: &'a AtomicU32, wanted: &'a AtomicU32) -> Self {
        let me = own_pid();
        let mut spins = 0u32;
        loop {
            if let Some(guard) = Self::attempt(lock, wanted, me, spins) {
                return guard;
            }
            spins = spins.saturating_add(1);
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Takes the lock within `spins` tries, [`CHECK_YIELDS`] yields and
    /// [`CHECK_NAPS`] naps, or not at all (a check: it says it is waiting, so that the
    /// sync thread hands the lock over between its batches).
    fn try_acquire(lock: &'a AtomicU32, wanted: &'a AtomicU32, spins: u32) -> Option<Self> {
        let me = own_pid();
        if let Some(guard) = Self::attempt(lock, wanted, me, 0) {
            return Some(guard);
        }
        wanted.fetch_add(1, AcqRel);
        let mut got = None;
        for n in 1..spins.saturating_add(CHECK_YIELDS + CHECK_NAPS) {
            if n < spins {
                std::hint::spin_loop();
            } else if n < spins + CHECK_YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(CHECK_NAP);
            }
            if let Some(guard) = Self::attempt(lock, wanted, me, n) {
                got = Some(guard);
                break;
            }
        }
        wanted.fetch_sub(1, AcqRel);
        got
    }

    fn attempt(lock: &'a AtomicU32, wanted: &'a AtomicU32, me: u32, spins: u32) -> Option<Self> {
        let holder = lock.load(RLX);
        if holder == 0 {
            return lock
                .compare_exchange_weak(0, me, ACQ, RLX)
                .ok()
                .map(|_| KeyLock { lock, wanted });
        }
        // Asking the kernel costs a system call: only after a while.
        if spins > 1_000 && spins % 1_000 == 1 && holder != me && !process_alive(holder) {
            return lock
                .compare_exchange(holder, me, ACQ, RLX)
                .ok()
                .map(|_| KeyLock { lock, wanted });
        }
        None
    }

    /// Between two batches of the sync thread: when a check is waiting,
    /// lets it have the lock (until it took it, or a short while), then
    /// takes it back.
    pub(in crate::table) fn relax(&mut self) {
        if self.wanted.load(ACQ) == 0 {
            return;
        }
        self.lock.store(0, REL);
        for _ in 0..10_000 {
            if self.lock.load(RLX) != 0 || self.wanted.load(RLX) == 0 {
                break;
            }
            std::hint::spin_loop();
        }
        *self = Self::acquire(self.lock, self.wanted);
    }
}

impl Drop for KeyLock<'_> {
    fn drop(&mut self) {
        self.lock.store(0, REL);
    }
}

/// One bucket reached by the search.
#[derive(Clone, Copy)]
struct Node {
    bucket: u32,
    /// The node whose entry moves here (`u16::MAX` for the key's own two
    /// buckets).
    parent: u16,
    /// That entry's way in the parent's bucket.
    way: u8,
    /// Moves from the key's bucket to here.
    depth: u8,
    /// That entry's hash when the search saw it.
    hash: u64,
}

region_view!(
    /// The key lock, and the moves that make room for a new key.
    KeyMoves
);

impl<'r> KeyMoves<'r> {
    /// The key lock of this region.
    pub(in crate::table) fn key_lock(&self) -> KeyLock<'r> {
        let place = &self.region().header().keys.place;
        KeyLock::acquire(&place.lock, &place.lock_wanted)
    }

    /// Frees an entry of bucket `b1` or `b2` by moving entries to their
    /// other buckets, and claims it. [`NoMove::Busy`] when the key lock
    /// was busy for too long; [`NoMove::NoChain`] when no chain of at most
    /// [`MAX_MOVE_DEPTH`] moves reaches a free entry, or a race broke it.
    pub(in crate::table) fn make_room(
        &self,
        b1: usize,
        b2: usize,
        now: Nanos,
    ) -> Result<KeyAt, NoMove> {
        let place = &self.header().keys.place;
        let Some(_lock) = KeyLock::try_acquire(&place.lock, &place.lock_wanted, CHECK_SPINS) else {
            return Err(NoMove::Busy);
        };
        if place.moves.load(SeqCst) & 1 == 1 {
            // Odd with the lock free: a mover died mid-move. Even again.
            place.moves.fetch_add(1, SeqCst);
        }
        let mut nodes = [Node {
            bucket: 0,
            parent: u16::MAX,
            way: 0,
            depth: 0,
            hash: 0,
        }; MAX_NODES];
        nodes[0].bucket = b1 as u32;
        nodes[1].bucket = b2 as u32;
        let mut len = if b1 == b2 { 1 } else { 2 };
        let mut next = 0;
        while next < len {
            let node = nodes[next];
            let bucket = &self.key_buckets()[node.bucket as usize];
            for (way, e) in bucket.ways.iter().enumerate() {
                let hash = e.hash.load(ACQ);
                if hash == KEY_CLAIMED {
                    continue;
                }
                let at = node.bucket as usize * KEY_WAYS + way;
                if hash == 0 || KeyEntries::of(self).key_drained(e, now) {
                    return self
                        .move_along(&nodes, next, at as KeyAt, now)
                        .ok_or(NoMove::NoChain);
                }
                if node.depth as usize >= MAX_MOVE_DEPTH || len == MAX_NODES {
                    continue;
                }
                let Some(template) = e.template.load(RLX).checked_sub(1) else {
                    continue;
                };
                let (c1, c2) = KeyEntries::of(self).buckets_of(template, hash);
                let other = if c1 == node.bucket as usize { c2 } else { c1 };
                if other == node.bucket as usize {
                    continue;
                }
                nodes[len] = Node {
                    bucket: other as u32,
                    parent: next as u16,
                    way: way as u8,
                    depth: node.depth + 1,
                    hash,
                };
                len += 1;
            }
            next += 1;
        }
        Err(NoMove::NoChain)
    }

    /// Claims the free (or drained) entry `free`, in the bucket of node
    /// `end`, then moves into it the entry that leads there from the
    /// node's parent, and so on back to one of the key's own buckets,
    /// whose freed entry is returned, claimed.
    fn move_along(&self, nodes: &[Node], end: usize, free: KeyAt, now: Nanos) -> Option<KeyAt> {
        let e = KeyEntries::of(self).key_at(free)?;
        let claimed = match e.hash.load(ACQ) {
            0 => {
                let ok = e.hash.compare_exchange(0, KEY_CLAIMED, ACQ, RLX).is_ok();
                if ok {
                    self.header().keys.place.live.fetch_add(1, RLX);
                }
                ok
            }
            _ => KeyEntries::of(self).claim_drained(e, now),
        };
        if !claimed {
            return None;
        }
        let mut dest = free;
        let mut at = end;
        while nodes[at].parent != u16::MAX {
            let node = nodes[at];
            let parent = nodes[node.parent as usize];
            let src = (parent.bucket as usize * KEY_WAYS + node.way as usize) as KeyAt;
            if !self.move_entry(src, dest, node.hash) {
                return None;
            }
            dest = src;
            at = node.parent as usize;
        }
        Some(dest)
    }

    /// Moves the key `hash` from entry `src` to the claimed entry `dest`;
    /// `src` is left claimed (empty, for the next move or the new key).
    /// False when `src` no longer holds the key (it drained and a new key
    /// took it): the chain is broken, and `dest` keeps a copy of a drained
    /// key, which equals no entry.
    fn move_entry(&self, src: KeyAt, dest: KeyAt, hash: u64) -> bool {
        let (Some(s), Some(d)) = (
            KeyEntries::of(self).key_at(src),
            KeyEntries::of(self).key_at(dest),
        ) else {
            return false;
        };
        if s.hash.load(ACQ) != hash {
            self.release_claim(d);
            return false;
        }
        let p = &self.header().keys.place;
        // Odd from the copy on, while both entries hold the key, or
        // neither is certain to: a lookup that missed in this time looks
        // again, and a tier mark set on the original after the copy is
        // set again where the key goes (`mark_key_tiers`).
        p.moves.fetch_add(1, SeqCst);
        copy_state(s, d);
        d.hash.store(hash, REL);
        let retired = s
            .hash
            .compare_exchange(hash, KEY_CLAIMED, SeqCst, RLX)
            .is_ok();
        p.moves.fetch_add(1, SeqCst);
        if !retired {
            return false;
        }
        // A tier mark set on the original after the copy (the sync
        // thread marks where it found the key, then looks again only if
        // the key left: see `mark_key_tiers`) follows the key.
        let carried = s.dirty.load(SeqCst) & (DIRTY_TIERS | DIRTY_TIERS_UNSURE);
        if carried != 0 {
            d.dirty.fetch_or(carried, SeqCst);
        }
        // Whatever checks added to the old entry up to now follows the
        // key; a check adding later takes its own weight back (count_key).
        let moved = s.pending.swap(0, SeqCst);
        if moved > 0 {
            d.pending.fetch_add(moved, SeqCst);
            KeyEntries::of(self).mark_dirty(dest, d);
        }
        clear_entry(s);
        p.relocations.fetch_add(1, RLX);
        true
    }

    /// Gives back a claimed entry nobody will fill.
    fn release_claim(&self, e: &KeyEntry) {
        clear_entry(e);
        e.hash.store(0, REL);
        self.header().keys.place.live.fetch_sub(1, RLX);
    }
}

/// Copies everything of an entry but its hash, `pending` (handed on after
/// the move) and whether it is queued in the dirty ring.
fn copy_state(s: &KeyEntry, d: &KeyEntry) {
    set_key_source(d, key_source(s));
    // Exactly: `d` may be a drained entry still marked for its old key
    // (or holding its rate).
    let marks = DIRTY_TIERS | DIRTY_TIERS_UNSURE | DIRTY_REFUSED | DIRTY_RATE_MASK;
    let carried = s.dirty.load(SeqCst) & marks;
    d.dirty.fetch_or(carried, RLX);
    d.dirty.fetch_and(!(marks & !carried), RLX);
    d.template.store(s.template.load(RLX), RLX);
    d.used.store(s.used.load(RLX), RLX);
    d.known.store(s.known.load(ACQ), RLX);
    d.fill.store(s.fill.load(RLX), RLX);
    d.unacked.store(s.unacked.load(RLX), RLX);
}
