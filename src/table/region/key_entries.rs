//! The key section's entries: where a key may live (its two buckets),
//! finding its entry, claiming a free or drained one, what an entry holds
//! (its counter, fill, source, tier mark, dirty state), the section-wide
//! settings (secret, overflow mode) and counts, and the dirty ring a
//! check queues an entry on. `keys.rs` places keys and counts on them;
//! `key_moves.rs` makes room.

use crate::core::key::{KeyHash, KeySecret};
use crate::core::{Counting, Level, Nanos, QuotaSnapshot, Tally};
use crate::table::region::slots::Slots;
use std::sync::atomic::{fence, Ordering::SeqCst};

use super::layout::Source;
use super::layout::{
    pack_key_rate, pack_known, pack_known_floor, unpack_key_rate, unpack_known, KeyEntry,
    DIRTY_QUEUED, DIRTY_RATE_MASK, DIRTY_REFUSED, DIRTY_SOURCE_MASK, DIRTY_SOURCE_SHIFT,
    DIRTY_TIERS, DIRTY_TIERS_UNSURE, FLAG_LIVE, FLAG_PER_KEY, KEY_CLAIMED, KEY_WAYS,
};
use super::ring::Ring;
use super::sections::{region_view, SlotId, ACQ, REL, RLX};

/// Why `make_room` made no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::table) enum NoMove {
    /// The key lock was held past a check's bounded wait: whether a chain
    /// existed is unknown (the section may have had plenty of room).
    Busy,
    /// No chain of moves reached a free entry (or a race broke the one
    /// found).
    NoChain,
}

/// What a keyed check knows of its key's tiers before it looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::table) enum KeyTiers {
    /// The key has no entry (or the check has no key): the filter
    /// answers.
    Unknown,
    /// Its entry is unmarked: the section holds nothing of it.
    Clear,
    /// Its entry is marked: the section may hold something of it.
    Marked,
}

/// Where a key's entry is: bucket × [`KEY_WAYS`] + way.
pub(in crate::table) type KeyAt = u32;

/// What a check does with a key that finds no entry (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyOverflow {
    /// Checked against and counted on the template's own counter, which
    /// every key without an entry shares (fleet-wide).
    #[default]
    Shared,
    /// Rejected.
    Reject,
    /// Passed uncounted.
    Pass,
}

impl KeyOverflow {
    /// The mode a setting's word names (`shared`, `reject`, `pass`).
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "shared" => Some(Self::Shared),
            "reject" => Some(Self::Reject),
            "pass" => Some(Self::Pass),
            _ => None,
        }
    }

    /// The setting's word for the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Reject => "reject",
            Self::Pass => "pass",
        }
    }

    fn code(self) -> u32 {
        match self {
            Self::Shared => 0,
            Self::Reject => 1,
            Self::Pass => 2,
        }
    }

    fn from_code(code: u32) -> Self {
        match code {
            1 => Self::Reject,
            2 => Self::Pass,
            _ => Self::Shared,
        }
    }
}

/// Counters of the key section, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// Keys the section can hold.
    pub capacity: u64,
    /// Entries holding a key (drained ones included, until reused).
    pub live: u64,
    /// Keys that got an entry.
    pub inserts: u64,
    /// Entries moved to their other bucket to make room.
    pub relocations: u64,
    /// Drained entries reused for another key.
    pub reclaimed: u64,
    /// Checks of a key that found no entry (decided by the overflow mode).
    pub overflows: u64,
    /// Of `overflows`: new keys that needed entries moved and could not
    /// have the key lock in time (the section may have had room).
    pub busy: u64,
    /// Checks of a per-key quota without a key (not checked, not counted).
    pub keyless: u64,
    /// Keys a root refused to hold, once per reply that refused each:
    /// they keep their counts here and are checked as the overflow mode
    /// says besides.
    pub refused: u64,
}

/// One key's counter as listings and metrics show it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeyState {
    /// The key's hash.
    pub hash: KeyHash,
    /// The template's slot.
    pub template: SlotId,
    /// Estimated level now (this host's view: cluster level, extrapolated,
    /// plus its own unsent weight).
    pub level: f64,
    /// Other hosts' measured fill rate, units/s.
    pub fill_rate: f64,
    /// Weight admitted here and not yet collected (net of weight given
    /// back: below zero for a return not sent yet).
    pub pending: i64,
    /// Weight sent and not yet acknowledged (below zero for a return).
    pub unacked: i64,
}

/// A key found no entry: every entry it could have had holds a live count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::table) struct NoRoom;

/// Lookups that missed while entries moved retry at most this often, then
/// take the miss (a mover that died mid-move left the sequence odd).
const MISS_RETRIES: u32 = 64;

region_view!(
    /// The key section's entries.
    KeyEntries
);

impl<'r> KeyEntries<'r> {
    /// Hashes keys with `secret` from now on, or with the built-in one
    /// (`None`); every process sharing the region sees it. Keys already
    /// counted under another secret keep their old hashes until they
    /// drain.
    pub(in crate::table) fn set_key_secret(&self, secret: Option<KeySecret>) {
        let c = &self.header().keys.config;
        let (k0, k1) = secret.unwrap_or_else(KeySecret::built_in).to_words();
        c.secret_set.store(0, REL);
        c.secret[0].store(k0, RLX);
        c.secret[1].store(k1, RLX);
        c.secret_set.store(u32::from(secret.is_some()), REL);
    }

    /// The secret keys are hashed with (the built-in one until
    /// [`crate::table::Table::set_key_secret`]).
    pub(in crate::table) fn key_secret(&self) -> KeySecret {
        let c = &self.header().keys.config;
        KeySecret::from_words(c.secret[0].load(RLX), c.secret[1].load(RLX))
    }

    /// True once a configured secret replaced the built-in one.
    pub(in crate::table) fn has_key_secret(&self) -> bool {
        self.header().keys.config.secret_set.load(ACQ) != 0
    }

    /// Sets what a check does with a key that finds no entry, for every
    /// process sharing the region.
    pub(in crate::table) fn set_key_overflow(&self, mode: KeyOverflow) {
        self.header()
            .keys
            .config
            .overflow_mode
            .store(mode.code(), REL);
    }

    /// What a check does with a key that finds no entry.
    pub(in crate::table) fn key_overflow(&self) -> KeyOverflow {
        KeyOverflow::from_code(self.header().keys.config.overflow_mode.load(RLX))
    }

    /// Keys the key section holds (0: per-key quotas pass uncounted).
    pub(in crate::table) fn key_capacity(&self) -> u64 {
        self.geometry().key_capacity()
    }

    /// The key section's counters.
    pub(in crate::table) fn key_stats(&self) -> KeyStats {
        let p = &self.header().keys.place;
        KeyStats {
            capacity: self.key_capacity(),
            live: p.live.load(RLX),
            inserts: p.inserts.load(RLX),
            relocations: p.relocations.load(RLX),
            reclaimed: p.reclaimed.load(RLX),
            overflows: p.overflows.load(RLX),
            busy: p.busy.load(RLX),
            keyless: p.keyless.load(RLX),
            refused: p.refused.load(RLX),
        }
    }

    pub(in crate::table) fn key_at(&self, at: KeyAt) -> Option<&'r KeyEntry> {
        let bucket = self.region().key_buckets().get(at as usize / KEY_WAYS)?;
        bucket.ways.get(at as usize % KEY_WAYS)
    }

    /// The two buckets a key of `template` with `hash` may live in
    /// (distinct whenever the section has two buckets).
    pub(in crate::table) fn buckets_of(&self, template: SlotId, hash: KeyHash) -> (usize, usize) {
        let n = u64::from(self.geometry().key_buckets);
        let mixed = hash ^ u64::from(template + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let first = mixed.wrapping_mul(0xd6e8_feb8_6659_fd93);
        let second = mixed.rotate_left(29).wrapping_mul(0xa076_1d64_78bd_642f);
        let b1 = ((u128::from(first) * u128::from(n)) >> 64) as u64;
        let mut b2 = ((u128::from(second) * u128::from(n)) >> 64) as u64;
        if b2 == b1 && n > 1 {
            b2 = (b1 + 1) % n;
        }
        (b1 as usize, b2 as usize)
    }

    /// The way of bucket `b` holding the key, if one does.
    #[inline(always)]
    pub(in crate::table) fn scan_bucket(
        &self,
        b: usize,
        template: SlotId,
        hash: KeyHash,
    ) -> Option<KeyAt> {
        let bucket = &self.key_buckets()[b];
        bucket
            .ways
            .iter()
            .position(|e| e.hash.load(ACQ) == hash && e.template.load(RLX) == template + 1)
            .map(|way| (b * KEY_WAYS + way) as KeyAt)
    }

    /// The entry of the key `hash` of the template in slot `template`, if
    /// it has one. A miss while an entry was moving looks again.
    pub(in crate::table) fn find_key(&self, template: SlotId, hash: KeyHash) -> Option<KeyAt> {
        if self.geometry().key_buckets == 0 {
            return None;
        }
        let (b1, b2) = self.buckets_of(template, hash);
        prefetch(&self.key_buckets()[b2]);
        let moves = &self.header().keys.place.moves;
        for _ in 0..MISS_RETRIES {
            let seq = moves.load(ACQ);
            if let Some(at) = self
                .scan_bucket(b1, template, hash)
                .or_else(|| self.scan_bucket(b2, template, hash))
            {
                return Some(at);
            }
            fence(ACQ);
            if seq & 1 == 0 && moves.load(RLX) == seq {
                return None;
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Claims a free or drained entry of bucket `b` (its hash word set to
    /// [`KEY_CLAIMED`]), if it has one.
    pub(in crate::table) fn claim_in(&self, b: usize, now: Nanos) -> Option<KeyAt> {
        let bucket = &self.key_buckets()[b];
        for (way, e) in bucket.ways.iter().enumerate() {
            if e.hash.load(RLX) == 0 && e.hash.compare_exchange(0, KEY_CLAIMED, ACQ, RLX).is_ok() {
                self.header().keys.place.live.fetch_add(1, RLX);
                return Some((b * KEY_WAYS + way) as KeyAt);
            }
        }
        for (way, e) in bucket.ways.iter().enumerate() {
            if self.claim_drained(e, now) {
                return Some((b * KEY_WAYS + way) as KeyAt);
            }
        }
        None
    }

    /// Claims `e` if it holds a key equal to no entry (see
    /// `key_drained`); counted as reclaimed.
    pub(in crate::table) fn claim_drained(&self, e: &KeyEntry, now: Nanos) -> bool {
        let hash = e.hash.load(ACQ);
        if hash == 0 || hash == KEY_CLAIMED || !self.key_drained(e, now) {
            return false;
        }
        if e.hash
            .compare_exchange(hash, KEY_CLAIMED, ACQ, RLX)
            .is_err()
        {
            return false;
        }
        self.header().keys.place.reclaimed.fetch_add(1, RLX);
        true
    }

    /// True when the entry is equal to no entry: nothing pending or in
    /// flight, and its level leaked to zero at `now` (or its windows over,
    /// or its template gone).
    pub(in crate::table) fn key_drained(&self, e: &KeyEntry, now: Nanos) -> bool {
        if e.pending.load(SeqCst) != 0 || e.unacked.load(RLX) != 0 {
            return false;
        }
        let Some(counting) = self.template_counting(e.template.load(RLX)) else {
            return true;
        };
        counting.is_empty(key_tally(e, &counting, now), now)
    }

    /// True when slot `slot` holds a live per-key template.
    pub(in crate::table) fn is_per_key(&self, slot: SlotId) -> bool {
        self.template_counting(slot + 1).is_some()
    }

    /// How the keys of the live per-key template in `template` (slot + 1)
    /// count, read without its seqlock (placement, sweep and writer-side
    /// decisions only).
    pub(in crate::table) fn template_counting(&self, template: u32) -> Option<Counting> {
        let s = self.slot(template.checked_sub(1)?)?;
        let flags = s.flags.load(RLX);
        (flags & FLAG_LIVE != 0 && flags & FLAG_PER_KEY != 0)
            .then(|| Slots::of(self).slot_counting(s))
    }

    /// Turns a per-key template's view (`view`, as a check read it) into
    /// the view of its key at `at`: the template's numbers with the key's
    /// own counter. False when `at` is no entry.
    #[inline]
    pub(in crate::table) fn key_into(
        &self,
        at: KeyAt,
        view: &mut QuotaSnapshot,
        now: Nanos,
    ) -> bool {
        match self.key_at(at) {
            Some(e) => {
                apply_key(e, view, now);
                true
            }
            None => false,
        }
    }

    /// What the entry at `at` of the key `hash` says of the key's tiers
    /// ([`DIRTY_TIERS`]): two loads of lines the check has read anyway.
    /// [`KeyTiers::Unknown`] when the entry no longer holds the key (moved,
    /// freed or retaken since the check found it: its mark may be another
    /// key's, or cleared with it).
    #[inline]
    pub(in crate::table) fn key_tiers(&self, at: KeyAt, hash: KeyHash) -> KeyTiers {
        let Some(e) = self.key_at(at) else {
            return KeyTiers::Unknown;
        };
        // Acquiring: a mark is set after the tier entry it stands for, and
        // cleared (with release) after the entry was claimed away from
        // the key, which the hash read after it then shows.
        let dirty = e.dirty.load(ACQ);
        let marked = dirty & DIRTY_TIERS != 0;
        if e.hash.load(ACQ) != hash || dirty & DIRTY_TIERS_UNSURE != 0 {
            KeyTiers::Unknown
        } else if marked {
            KeyTiers::Marked
        } else {
            KeyTiers::Clear
        }
    }

    /// True when a root refused to hold the key of the entry at `at`
    /// ([`DIRTY_REFUSED`]): one load in the entry a check reads anyway.
    #[inline]
    pub(in crate::table) fn key_refused(&self, at: KeyAt) -> bool {
        self.key_at(at)
            .is_some_and(|e| e.dirty.load(RLX) & DIRTY_REFUSED != 0)
    }

    /// True when the key's entry at `at` carries the tier mark (tests).
    #[cfg(test)]
    pub(in crate::table) fn key_marked_for_tiers(&self, at: KeyAt) -> bool {
        self.key_at(at)
            .is_some_and(|e| e.dirty.load(ACQ) & DIRTY_TIERS != 0)
    }

    /// Marks the entry of the key `hash` of the template in slot
    /// `template`, if it has one, as one the tier section may hold
    /// something of (the caller added that something first). When
    /// entries moved meanwhile (the move sequence is odd from a move's
    /// copy on) or the entry no longer holds the key, the key is looked up
    /// and marked again, so a mark is never left behind on an original
    /// whose copy is already in use; a mark that lands on an entry retaken
    /// by another key only costs that key a look in the table.
    pub(in crate::table) fn mark_key_tiers(&self, template: SlotId, hash: KeyHash) {
        let moves = &self.header().keys.place.moves;
        for _ in 0..MISS_RETRIES {
            let seq = moves.load(SeqCst);
            let Some(e) = self.find_key(template, hash).and_then(|at| self.key_at(at)) else {
                return;
            };
            e.dirty.fetch_or(DIRTY_TIERS, SeqCst);
            if seq & 1 == 0
                && moves.load(SeqCst) == seq
                && e.hash.load(SeqCst) == hash
                && e.template.load(RLX) == template + 1
            {
                return;
            }
            std::hint::spin_loop();
        }
    }

    /// Queues an entry that holds pending weight for the next collection,
    /// unless it is queued already.
    pub(in crate::table) fn mark_dirty(&self, at: KeyAt, e: &KeyEntry) {
        // After the add: a collector that cleared the flag before reading
        // `pending` either saw the weight or left the flag for us to set.
        if e.dirty.load(SeqCst) & DIRTY_QUEUED == 0
            && e.dirty.fetch_or(DIRTY_QUEUED, SeqCst) & DIRTY_QUEUED == 0
        {
            self.queue_key(at);
        }
    }

    /// Every key of the template in `template` (all templates: `None`)
    /// with its state at `now`, as this host sees it. Reads the whole key
    /// section: for metrics and listings, not the request path.
    pub(in crate::table) fn keys(&self, template: Option<SlotId>, now: Nanos) -> Vec<KeyState> {
        let estimator = self.estimator();
        let mut out = Vec::new();
        for bucket in self.key_buckets() {
            for e in &bucket.ways {
                let hash = e.hash.load(ACQ);
                let t = e.template.load(RLX);
                if hash == 0 || hash == KEY_CLAIMED || t == 0 {
                    continue;
                }
                if template.is_some_and(|want| want + 1 != t) {
                    continue;
                }
                let Some((view, _)) = Slots::of(self).read_view(t - 1) else {
                    continue;
                };
                let snapshot = key_view(e, &view, now);
                out.push(KeyState {
                    hash,
                    template: t - 1,
                    level: crate::core::estimate::estimate_level(&snapshot, now, &estimator),
                    fill_rate: snapshot.fill_rate,
                    pending: e.pending.load(RLX) as i64,
                    unacked: e.unacked.load(RLX) as i64,
                });
            }
        }
        out
    }

    /// The key section's dirty ring.
    pub(in crate::table) fn ring(&self) -> Ring<'r> {
        let region = self.region();
        Ring {
            head: &region.header().keys.ring,
            cells: region.key_ring(),
        }
    }

    /// Puts an entry on the dirty ring; a full ring makes the next
    /// collection scan every entry.
    fn queue_key(&self, at: KeyAt) {
        self.ring().push(at);
    }
}

/// Hints the CPU to fetch a bucket's three lines.
#[inline(always)]
pub(in crate::table) fn prefetch<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = (at as *const T).cast::<i8>();
        for line in 0..std::mem::size_of::<T>().div_ceil(64) {
            // SAFETY: a prefetch is only a hint; it never faults and reads
            // nothing visible to the program, even past the object. SSE
            // is baseline on x86_64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p.wrapping_add(line * 64),
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// True when the keys of a template counting so keep their previous
/// window's count (a sliding window): an entry's `fill` word holds it, as
/// an `f32`, and the other hosts' fill rate moves to the top 16 bits of
/// its `dirty` word ([`DIRTY_RATE_MASK`]), so a sliding key is
/// extrapolated between syncs as a named sliding quota is, in 48 bytes.
pub(in crate::table) fn keeps_prev(counting: &Counting) -> bool {
    matches!(counting, Counting::Window(rule) if rule.sliding)
}

/// The other hosts' fill rate of the key in entry `e` of a template
/// counting so (the sync thread's side: its `fill` word, or a sliding
/// key's [`DIRTY_RATE_MASK`]).
pub(in crate::table) fn key_rate(e: &KeyEntry, counting: &Counting) -> f64 {
    if keeps_prev(counting) {
        unpack_key_rate(e.dirty.load(RLX))
    } else {
        f64::from(f32::from_bits(e.fill.load(RLX)))
    }
}

/// Stores the other hosts' fill rate of the key in entry `e` of a
/// template counting so (see [`key_rate`]); before the counter it was
/// measured with ([`store_key_tally`], releasing), so a check that sees
/// the new count sees its rate. The sync thread only.
pub(in crate::table) fn store_key_rate(e: &KeyEntry, counting: &Counting, rate: f64) {
    if keeps_prev(counting) {
        set_key_rate_bits(e, pack_key_rate(rate));
    } else {
        e.fill.store((rate as f32).to_bits(), RLX);
    }
}

/// Sets the [`DIRTY_RATE_MASK`] bits of `e` to `bits`, leaving the other
/// bits of `dirty` (which checks set concurrently) as they are.
pub(in crate::table) fn set_key_rate_bits(e: &KeyEntry, bits: u32) {
    let bits = bits & DIRTY_RATE_MASK;
    let _ = e.dirty.fetch_update(RLX, RLX, |d| {
        (d & DIRTY_RATE_MASK != bits).then_some(d & !DIRTY_RATE_MASK | bits)
    });
}

/// The check-time view of the key in entry `e` of a per-key template
/// whose own view is `template`: the template's numbers with the key's
/// counter, its fill rate, (sliding) its previous window's count, and
/// its weight not yet in a cluster value.
pub(in crate::table) fn key_view(
    e: &KeyEntry,
    template: &QuotaSnapshot,
    now: Nanos,
) -> QuotaSnapshot {
    let mut view = *template;
    apply_key(e, &mut view, now);
    view
}

/// Makes a per-key template's view the view of its key in entry `e` (see
/// [`key_view`]), in place.
#[inline(always)]
pub(in crate::table) fn apply_key(e: &KeyEntry, view: &mut QuotaSnapshot, now: Nanos) {
    // `known` first, acquiring: a merge writes `fill` before it.
    let (level, known_at) = unpack_known(e.known.load(ACQ), now);
    let fill = f64::from(f32::from_bits(e.fill.load(RLX)));
    let sliding = view.window.is_some_and(|rule| rule.sliding);
    view.known = Level {
        level,
        at: known_at,
    };
    if sliding {
        view.fill_rate = unpack_key_rate(e.dirty.load(RLX));
        view.prev = fill;
    } else {
        view.fill_rate = fill;
        view.prev = 0.0;
    }
    view.own_recent = e.pending.load(RLX).wrapping_add(e.unacked.load(RLX)) as i64 as f64;
}

/// A key's counter, its packed time placed near `now` (with the previous
/// window's count when the template slides).
pub(in crate::table) fn key_tally(e: &KeyEntry, counting: &Counting, now: Nanos) -> Tally {
    let (level, at) = unpack_known(e.known.load(ACQ), now);
    let prev = if keeps_prev(counting) {
        f64::from(f32::from_bits(e.fill.load(RLX)))
    } else {
        0.0
    };
    Tally { level, prev, at }
}

/// Stores a key's counter. A window count keeps its time inside its own
/// window: packing rounds the time up by up to a millisecond, which just
/// before a boundary would move the count into the next window. A sliding
/// window's previous count goes first, and the count after it with
/// release: a check that sees the new count sees the previous one that
/// goes with it (one that sees the old count in an earlier window takes
/// that count as the previous one, whatever `fill` says).
pub(in crate::table) fn store_key_tally(e: &KeyEntry, counting: &Counting, t: Tally) {
    let mut word = pack_known(t.level, t.at);
    if let Counting::Window(rule) = counting {
        let (_, stored) = unpack_known(word, t.at);
        if rule.index_at(stored) != rule.index_at(t.at) {
            word = pack_known_floor(t.level, t.at);
        }
    }
    if keeps_prev(counting) {
        e.fill.store((t.prev as f32).to_bits(), RLX);
    }
    e.known.store(word, REL);
}

/// Records a use at `tick`: the tick, and one more use up to three.
pub(in crate::table) fn touch(e: &KeyEntry, tick: u32) {
    let used = e.used.load(RLX);
    let next = tick << 2 | ((used & 3) + 1).min(3);
    if next != used {
        e.used.store(next, RLX);
    }
}

/// Makes a claimed entry the key `hash` of `template`, seen once now,
/// marked ([`DIRTY_TIERS`]) when the tier section holds something of the
/// key (`tiers`).
///
/// `pending` is left as it is: a claimed entry was free or drained, so
/// anything there is a count that raced the claim (a check that made or
/// found the entry just before it was taken). It is collected under the
/// new key, not lost.
pub(in crate::table) fn init_entry(
    e: &KeyEntry,
    template: SlotId,
    hash: KeyHash,
    tick: u32,
    now: Nanos,
    tiers: bool,
) {
    if tiers {
        e.dirty.fetch_or(DIRTY_TIERS, REL);
        e.dirty.fetch_and(!DIRTY_TIERS_UNSURE, REL);
    } else {
        // Unsure until the maker looked again (see `insert_key`).
        e.dirty.fetch_or(DIRTY_TIERS_UNSURE, REL);
        e.dirty.fetch_and(!DIRTY_TIERS, REL);
    }
    // A new key: no root refused it yet, and no rate is measured (a
    // reclaimed entry may carry its old key's).
    e.dirty.fetch_and(!(DIRTY_REFUSED | DIRTY_RATE_MASK), REL);
    e.template.store(template + 1, RLX);
    e.unacked.store(0, RLX);
    e.known.store(pack_known(0.0, now), RLX);
    e.fill.store(0, RLX);
    e.used.store(tick << 2 | 1, RLX);
    // `dirty` stays as it is: if the ring still holds this entry, it is
    // collected from there.
    e.hash.store(hash, REL);
}

/// Clears an entry's state but `pending` (a count racing the clear is
/// collected under whichever key holds the entry next) and whether it is
/// queued in the dirty ring.
pub(in crate::table) fn clear_entry(e: &KeyEntry) {
    // Releasing: a check that reads the mark cleared then sees the
    // entry's hash no longer the key's (see `key_tiers`).
    e.dirty.fetch_and(
        !(DIRTY_SOURCE_MASK | DIRTY_TIERS | DIRTY_TIERS_UNSURE | DIRTY_REFUSED | DIRTY_RATE_MASK),
        REL,
    );
    e.template.store(0, RLX);
    e.unacked.store(0, RLX);
    e.known.store(0, RLX);
    e.fill.store(0, RLX);
    e.used.store(0, RLX);
}

/// The [`Source`] of a key entry's known level.
pub(in crate::table) fn key_source(e: &KeyEntry) -> Source {
    ((e.dirty.load(RLX) & DIRTY_SOURCE_MASK) >> DIRTY_SOURCE_SHIFT) as Source
}

/// Sets the [`Source`] of a key entry's known level, leaving its
/// [`DIRTY_QUEUED`] and [`DIRTY_TIERS`] bits (which checks set
/// concurrently) as they are.
pub(in crate::table) fn set_key_source(e: &KeyEntry, source: Source) {
    let bits = u32::from(source) << DIRTY_SOURCE_SHIFT;
    let _ = e.dirty.fetch_update(RLX, RLX, |d| {
        (d & DIRTY_SOURCE_MASK != bits).then_some(d & !DIRTY_SOURCE_MASK | bits)
    });
}
