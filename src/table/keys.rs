//! The counters of per-key quotas: one per (template, key hash), created
//! by the check that first sees the key, in the key section of the region.
//!
//! A key lives only in the bucket its hash picks ([`KEY_WAYS`] entries,
//! read at once), so a lookup costs one round of cache misses and the
//! section needs no index. A bucket with no free entry makes room:
//!
//! 1. a drained entry (nothing pending, nothing in flight, its level
//!    leaked to zero) equals no entry and is taken first;
//! 2. then the least recently used key seen only once (a probationary
//!    key: what a scan of one-off keys leaves behind);
//! 3. then the least recently used key that is not busy (used in the last
//!    [`BUSY_TICKS`] ticks, about a second);
//! 4. a key whose bucket holds only busy keys gets no entry: it is checked
//!    uncounted (fail open) and counted in `key_refused`. A flood of new
//!    keys therefore never evicts a key in use now.
//!
//! An eviction of an entry that still held weight is counted in
//! `key_evictions` (its unsent weight is lost to the fleet, as its level
//! is to this host).
//!
//! Entries are claimed and initialised without a lock (a CAS on the hash
//! word); the rare races (two workers inserting one new key at once, a
//! check finishing on an entry evicted under it) cost at most a duplicate
//! entry whose weight is still collected, or a few units counted on the
//! wrong key: never a crash, never weight counted twice at the roots.
//!
//! The dirty ring lists entries with weight not yet collected: a check
//! that adds to an entry not in the ring queues it; the sync thread drains
//! the ring. A full ring sets a flag and the next collection scans every
//! entry instead, so no weight is ever stranded.

use std::sync::atomic::Ordering::{AcqRel, SeqCst};

use super::counters::{attributed, measure_rate, CollectedDelta};
use super::layout::{
    key_tick, pack_known, pack_known_floor, unpack_known, KeyEntry, FLAG_LIVE, FLAG_PER_KEY,
    KEY_CLAIMED, KEY_WAYS,
};
use super::{SlotId, Table, ACQ, REL, RLX};
use crate::core::key::{KeyHash, KeySecret};
use crate::core::{Counting, Level, Nanos, QuotaSnapshot, Tally};

/// Ticks (~67 ms each) since its last use within which a key is busy and
/// never evicted for a newcomer: about a second.
pub const BUSY_TICKS: u32 = 15;

/// Known levels older than this are restamped (or the entry dropped, if
/// drained) by the maintenance sweep, well within the ~26 days a packed
/// time can span.
const RESTAMP_AFTER: Nanos = 24 * 3600 * 1_000_000_000;

/// Collections a reserved but unwritten ring position may hold up the
/// collector before it is skipped (its producer died mid-write) and every
/// entry is scanned instead.
const RING_STUCK_LIMIT: u32 = 16;

/// A dirty-ring cell: the entry (plus one) with the low 32 bits of the
/// ring position it was written for, so that a write arriving after the
/// collector gave up on its position can never pass for the entry of a
/// later lap (whose producer's own write would then land behind the
/// tail and be lost).
fn ring_cell(position: u64, at: KeyAt) -> u64 {
    (position << 32) | (u64::from(at) + 1)
}

/// The entry a ring cell holds for `position`, if it was written for it.
fn ring_entry(cell: u64, position: u64) -> Option<KeyAt> {
    let at = (cell & 0xffff_ffff) as u32;
    (at != 0 && cell >> 32 == position & 0xffff_ffff).then(|| at - 1)
}

/// What a check needs to count a key: where its entry is.
pub(super) type KeyAt = u32;

/// Counters of the key section, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// Keys the section can hold.
    pub capacity: u64,
    /// Entries in use.
    pub live: u64,
    /// Keys that got an entry.
    pub inserts: u64,
    /// Keys evicted while their counters still held weight.
    pub evictions: u64,
    /// Keys checked uncounted: no entry could be had.
    pub refused: u64,
    /// Checks of a per-key quota without a key (not checked, not counted).
    pub keyless: u64,
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
    /// Weight admitted here and not yet collected.
    pub pending: u64,
    /// Weight sent and not yet acknowledged.
    pub inflight: u64,
}

/// A candidate for eviction: lower `class` first, then the older.
#[derive(Clone, Copy)]
struct Victim {
    way: usize,
    hash: u64,
    class: u8,
    age: u32,
    drained: bool,
}

impl Table {
    /// Hashes keys with `secret` from now on, or with the built-in one
    /// (`None`); every process sharing the region sees it. Keys already
    /// counted under another secret keep their old hashes until they
    /// drain.
    pub fn set_key_secret(&self, secret: Option<KeySecret>) {
        let h = self.header();
        let (k0, k1) = secret.unwrap_or_else(KeySecret::built_in).to_words();
        h.key_secret_set.store(0, REL);
        h.key_secret[0].store(k0, RLX);
        h.key_secret[1].store(k1, RLX);
        h.key_secret_set.store(u32::from(secret.is_some()), REL);
    }

    /// The secret keys are hashed with (the built-in one until
    /// [`Table::set_key_secret`]).
    pub fn key_secret(&self) -> KeySecret {
        let h = self.header();
        KeySecret::from_words(h.key_secret[0].load(RLX), h.key_secret[1].load(RLX))
    }

    /// True once a configured secret replaced the built-in one.
    pub fn has_key_secret(&self) -> bool {
        self.header().key_secret_set.load(ACQ) != 0
    }

    /// Keys the key section holds (0: per-key quotas pass uncounted).
    pub fn key_capacity(&self) -> u64 {
        self.geometry.key_capacity()
    }

    /// The key section's counters.
    pub fn key_stats(&self) -> KeyStats {
        let h = self.header();
        KeyStats {
            capacity: self.key_capacity(),
            live: h.key_live.load(RLX),
            inserts: h.key_inserts.load(RLX),
            evictions: h.key_evictions.load(RLX),
            refused: h.key_refused.load(RLX),
            keyless: h.keyless_checks.load(RLX),
        }
    }

    fn key_at(&self, at: KeyAt) -> Option<&KeyEntry> {
        let bucket = self.key_buckets().get(at as usize / KEY_WAYS)?;
        bucket.ways.get(at as usize % KEY_WAYS)
    }

    /// The bucket a key of `template` with `hash` lives in.
    fn bucket_of(&self, template: SlotId, hash: KeyHash) -> usize {
        let mixed = (hash ^ u64::from(template).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xd6e8_feb8_6659_fd93);
        ((u128::from(mixed) * self.geometry.key_buckets as u128) >> 64) as usize
    }

    /// The entry of the key `hash` of the template in slot `template`, if
    /// it has one.
    pub(super) fn find_key(&self, template: SlotId, hash: KeyHash) -> Option<KeyAt> {
        if self.geometry.key_buckets == 0 {
            return None;
        }
        let b = self.bucket_of(template, hash);
        let bucket = &self.key_buckets()[b];
        bucket
            .ways
            .iter()
            .position(|e| e.hash.load(ACQ) == hash && e.template.load(RLX) == template + 1)
            .map(|way| (b * KEY_WAYS + way) as KeyAt)
    }

    /// The entry of a key a check sees at `now`, made if it has none (see
    /// the module doc for whom it replaces); its use is recorded. `None`
    /// when no entry could be had (counted in `key_refused`).
    pub(super) fn use_key(&self, template: SlotId, hash: KeyHash, now: Nanos) -> Option<KeyAt> {
        if self.geometry.key_buckets == 0 {
            self.header().key_refused.fetch_add(1, RLX);
            return None;
        }
        let tick = key_tick(now);
        let b = self.bucket_of(template, hash);
        let bucket = &self.key_buckets()[b];
        for attempt in 0..2 {
            if let Some(way) = bucket
                .ways
                .iter()
                .position(|e| e.hash.load(ACQ) == hash && e.template.load(RLX) == template + 1)
            {
                touch(&bucket.ways[way], tick);
                return Some((b * KEY_WAYS + way) as KeyAt);
            }
            if let Some(way) = self.claim_way(&bucket.ways, tick, now) {
                init_entry(&bucket.ways[way], template, hash, tick, now);
                return Some((b * KEY_WAYS + way) as KeyAt);
            }
            // Lost a race for the victim: someone may have inserted this
            // very key meanwhile; look once more.
            if attempt == 1 {
                break;
            }
        }
        self.header().key_refused.fetch_add(1, RLX);
        None
    }

    /// Claims a free entry of the bucket, or evicts a victim; `None` when
    /// every entry is busy or a race was lost.
    fn claim_way(&self, ways: &[KeyEntry; KEY_WAYS], tick: u32, now: Nanos) -> Option<usize> {
        let h = self.header();
        for (way, e) in ways.iter().enumerate() {
            if e.hash.load(RLX) == 0 && e.hash.compare_exchange(0, KEY_CLAIMED, ACQ, RLX).is_ok() {
                h.key_live.fetch_add(1, RLX);
                h.key_inserts.fetch_add(1, RLX);
                return Some(way);
            }
        }
        let mut best: Option<Victim> = None;
        for (way, e) in ways.iter().enumerate() {
            let Some(v) = self.victim(way, e, tick, now) else {
                continue;
            };
            let better =
                best.is_none_or(|b| (v.class, u32::MAX - v.age) < (b.class, u32::MAX - b.age));
            if better {
                best = Some(v);
            }
        }
        let v = best?;
        ways[v.way]
            .hash
            .compare_exchange(v.hash, KEY_CLAIMED, ACQ, RLX)
            .ok()?;
        h.key_inserts.fetch_add(1, RLX);
        if !v.drained {
            // The evicted key's unsent weight is dropped (and counted).
            ways[v.way].pending.store(0, RLX);
            h.key_evictions.fetch_add(1, RLX);
        }
        Some(v.way)
    }

    /// How evictable the entry is, or `None` if it must stay (busy, or
    /// being initialised).
    fn victim(&self, way: usize, e: &KeyEntry, tick: u32, now: Nanos) -> Option<Victim> {
        let hash = e.hash.load(ACQ);
        if hash == KEY_CLAIMED || hash == 0 {
            return None;
        }
        let used = e.used.load(RLX);
        let age = tick.wrapping_sub(used >> 2) & 0x3fff_ffff;
        let hits = used & 3;
        let drained = self.key_drained(e, now);
        let class = if drained {
            0
        } else if hits < 2 {
            1
        } else if age >= BUSY_TICKS {
            2
        } else {
            return None;
        };
        Some(Victim {
            way,
            hash,
            class,
            age,
            drained,
        })
    }

    /// True when the entry is equal to no entry: nothing pending or in
    /// flight, and its level leaked to zero at `now` (or its template is
    /// gone).
    fn key_drained(&self, e: &KeyEntry, now: Nanos) -> bool {
        if e.pending.load(RLX) != 0 || e.inflight.load(RLX) != 0 {
            return false;
        }
        let Some(counting) = self.template_counting(e.template.load(RLX)) else {
            return true;
        };
        counting.is_empty(key_tally(e, &counting, now), now)
    }

    /// How the keys of the live per-key template in `template` (slot + 1)
    /// count, read without its seqlock (eviction, sweep and writer-side
    /// decisions only).
    fn template_counting(&self, template: u32) -> Option<Counting> {
        let s = self.slot(template.checked_sub(1)?)?;
        let flags = s.flags.load(RLX);
        (flags & FLAG_LIVE != 0 && flags & FLAG_PER_KEY != 0).then(|| self.slot_counting(s))
    }

    /// The key's snapshot for a check: the template's numbers (in
    /// `template`) with the key's own counter.
    pub(super) fn key_snapshot(
        &self,
        at: KeyAt,
        template: &QuotaSnapshot,
        now: Nanos,
    ) -> Option<QuotaSnapshot> {
        Some(key_view(self.key_at(at)?, template, now))
    }

    /// Counts a passed check's weight on a key and queues the key for the
    /// next collection.
    pub(super) fn count_key(&self, at: KeyAt, weight: u64) {
        let Some(e) = self.key_at(at) else { return };
        if weight == 0 {
            return;
        }
        e.pending.fetch_add(weight, SeqCst);
        // After the add: a collector that cleared the flag before reading
        // `pending` either saw this weight or left the flag for us to set.
        if e.dirty.load(SeqCst) == 0 && e.dirty.swap(1, SeqCst) == 0 {
            self.queue_key(at);
        }
    }

    /// Puts an entry on the dirty ring; a full ring makes the next
    /// collection scan every entry.
    fn queue_key(&self, at: KeyAt) {
        let h = self.header();
        let ring = self.key_ring();
        let len = ring.len() as u64;
        loop {
            let head = h.key_ring_head.load(ACQ);
            if head.wrapping_sub(h.key_ring_tail.load(ACQ)) >= len {
                h.key_ring_overflow.store(1, REL);
                return;
            }
            if h.key_ring_head
                .compare_exchange_weak(head, head + 1, AcqRel, RLX)
                .is_ok()
            {
                ring[(head % len) as usize].store(ring_cell(head, at), REL);
                return;
            }
        }
    }

    /// Calls `each` with every entry queued since the last drain (or
    /// every entry, when the ring overflowed). The writer lock is held.
    fn drain_dirty(&self, mut each: impl FnMut(KeyAt, &KeyEntry)) {
        if self.geometry.key_buckets == 0 {
            return;
        }
        let h = self.header();
        let ring = self.key_ring();
        let len = ring.len() as u64;
        let head = h.key_ring_head.load(ACQ);
        let mut tail = h.key_ring_tail.load(RLX);
        let mut stuck = false;
        while tail != head {
            let cell = &ring[(tail % len) as usize];
            let value = cell.load(ACQ);
            if let Some(at) = ring_entry(value, tail) {
                cell.store(0, RLX);
                if let Some(e) = self.key_at(at) {
                    each(at, e);
                }
            } else {
                // Reserved, not written yet (or holding a late write for
                // an earlier lap): wait for the writer, unless it has held
                // the ring up for too long (it died, or was descheduled
                // that long). Its key is then found by the full scan
                // below; its late write carries its own position, so it
                // is never taken for a later lap's entry.
                let waited = h.key_ring_stuck.fetch_add(1, RLX) + 1;
                if waited < RING_STUCK_LIMIT {
                    break;
                }
                stuck = true;
            }
            h.key_ring_stuck.store(0, RLX);
            tail = tail.wrapping_add(1);
        }
        h.key_ring_tail.store(tail, REL);
        if h.key_ring_overflow.swap(0, ACQ) != 0 || stuck {
            for (b, bucket) in self.key_buckets().iter().enumerate() {
                for (way, e) in bucket.ways.iter().enumerate() {
                    if e.pending.load(RLX) != 0 {
                        each((b * KEY_WAYS + way) as KeyAt, e);
                    }
                }
            }
        }
    }

    /// Moves every queued key's pending weight to in flight and appends
    /// what moved to `out` (see [`Table::collect_deltas`]).
    pub(super) fn collect_keys(&self, out: &mut Vec<CollectedDelta>) {
        let slots = self.slots();
        let h = self.header();
        self.drain_dirty(|_, e| {
            e.dirty.store(0, SeqCst);
            let hash = e.hash.load(ACQ);
            if hash == KEY_CLAIMED && e.pending.load(SeqCst) != 0 {
                // A count raced the entry's claim: it belongs to the key
                // being made there. Scan every entry next time.
                h.key_ring_overflow.store(1, REL);
                return;
            }
            if hash == 0 || hash == KEY_CLAIMED {
                return;
            }
            let Some(slot) = e.template.load(RLX).checked_sub(1) else {
                return;
            };
            let Some(id) = slots.get(slot as usize).and_then(|s| s.quota_id()) else {
                return;
            };
            let delta = e.pending.load(SeqCst);
            if delta == 0 {
                return;
            }
            // In-flight first, as for named counters: seen twice for an
            // instant, never zero times.
            e.inflight.fetch_add(delta, RLX);
            e.pending.fetch_sub(delta, RLX);
            out.push(CollectedDelta {
                slot,
                id,
                key: hash,
                delta,
            });
        });
    }

    /// Standalone: folds every queued key's pending weight into its level
    /// at `now` (see [`Table::fold_local`]). The writer lock is held.
    pub(super) fn fold_keys(&self, now: Nanos) {
        self.drain_dirty(|_, e| {
            e.dirty.store(0, SeqCst);
            let Some(counting) = self.template_counting(e.template.load(RLX)) else {
                return;
            };
            let pending = e.pending.load(SeqCst);
            let inflight = e.inflight.load(RLX);
            let known = key_tally(e, &counting, now);
            let weight = (pending + inflight) as f64;
            let folded = counting
                .add_in(known, attributed(&counting, now), now, weight)
                .unwrap_or(known);
            store_key_tally(e, &counting, folded);
            e.pending.fetch_sub(pending, RLX);
            e.inflight.fetch_sub(inflight, RLX);
        });
    }

    /// Merges a cluster value (in local time) into the key `hash` of the
    /// template in `slot` if the slot still holds template `id`, takes
    /// `acked` off in flight and updates the fill rate. False when this
    /// host has no entry for the key (it is not tracked here; nothing to
    /// do).
    pub(super) fn merge_key(
        &self,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
        value: Tally,
        acked: u64,
    ) -> bool {
        let Some(s) = self.slot(slot) else {
            return false;
        };
        if s.quota_id() != Some(id) {
            return false;
        }
        let Some(e) = self.find_key(slot, hash).and_then(|at| self.key_at(at)) else {
            return false;
        };
        let counting = self.slot_counting(s);
        let known = key_tally(e, &counting, value.at);
        let merged = counting.merge(known, value);
        if !keeps_prev(&counting) {
            let old_rate = f64::from(f32::from_bits(e.fill.load(RLX)));
            let span = merged.at.saturating_sub(known.at);
            let rate = if span >= self.estimator().horizon / 4 {
                measure_rate(&counting, known, merged, acked as f64, old_rate)
            } else {
                old_rate
            };
            e.fill.store((rate as f32).to_bits(), RLX);
        }
        store_key_tally(e, &counting, merged);
        let taken = acked.min(e.inflight.load(RLX));
        e.inflight.fetch_sub(taken, RLX);
        true
    }

    /// Folds `amount` of a key's in-flight weight into its level at `now`
    /// (see [`Table::fold_inflight`]), if its entry still holds it.
    pub(super) fn fold_key_inflight(
        &self,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
        amount: u64,
        now: Nanos,
    ) {
        let Some(s) = self.slot(slot) else { return };
        if s.quota_id() != Some(id) {
            return;
        }
        let Some(e) = self.find_key(slot, hash).and_then(|at| self.key_at(at)) else {
            return;
        };
        let counting = self.slot_counting(s);
        let moved = amount.min(e.inflight.load(RLX));
        let known = key_tally(e, &counting, now);
        let folded = counting
            .add_in(known, attributed(&counting, now), now, moved as f64)
            .unwrap_or(known);
        store_key_tally(e, &counting, folded);
        e.inflight.fetch_sub(moved, RLX);
    }

    /// Takes (`requeue`: false) or hands back to pending (true) `amount`
    /// of a key's in-flight weight, if its entry still holds it.
    pub(super) fn settle_key_inflight(
        &self,
        slot: SlotId,
        id: u64,
        hash: KeyHash,
        amount: u64,
        requeue: bool,
    ) {
        if self.slot(slot).and_then(|s| s.quota_id()) != Some(id) {
            return;
        }
        let Some(at) = self.find_key(slot, hash) else {
            return;
        };
        let Some(e) = self.key_at(at) else { return };
        let moved = amount.min(e.inflight.load(RLX));
        if requeue {
            e.pending.fetch_add(moved, RLX);
            e.inflight.fetch_sub(moved, RLX);
            if e.dirty.swap(1, SeqCst) == 0 {
                self.queue_key(at);
            }
        } else {
            e.inflight.fetch_sub(moved, RLX);
        }
    }

    /// Hands every key's in-flight weight back to pending (a dead sync
    /// thread's, see [`Table::claim_sync`]); returns the weight moved.
    pub(super) fn requeue_all_keys(&self) -> u64 {
        let mut moved = 0u64;
        for (b, bucket) in self.key_buckets().iter().enumerate() {
            for (way, e) in bucket.ways.iter().enumerate() {
                let inflight = e.inflight.load(RLX);
                if inflight > 0 {
                    e.pending.fetch_add(inflight, RLX);
                    e.inflight.fetch_sub(inflight, RLX);
                    moved = moved.saturating_add(inflight);
                    if e.dirty.swap(1, SeqCst) == 0 {
                        self.queue_key((b * KEY_WAYS + way) as KeyAt);
                    }
                }
            }
        }
        moved
    }

    /// Frees every key of the template in `slot` (it was deleted). The
    /// writer lock is held.
    pub(super) fn drop_keys_of(&self, slot: SlotId) {
        let h = self.header();
        for bucket in self.key_buckets() {
            for e in &bucket.ways {
                let hash = e.hash.load(ACQ);
                if hash != 0 && hash != KEY_CLAIMED && e.template.load(RLX) == slot + 1 {
                    free_entry(e, hash, h);
                }
            }
        }
    }

    /// One step of the maintenance sweep (the sync thread calls it every
    /// cycle): looks at `buckets` buckets, frees entries whose template is
    /// gone, and restamps (or frees, when drained) entries whose known
    /// level is older than a day, so packed times never wrap. The writer
    /// lock is held.
    pub(super) fn sweep_keys(&self, buckets: usize, now: Nanos) {
        let n = self.geometry.key_buckets as usize;
        if n == 0 {
            return;
        }
        let h = self.header();
        let start = h.key_sweep.load(RLX) as usize % n;
        for i in 0..buckets.min(n) {
            let bucket = &self.key_buckets()[(start + i) % n];
            for e in &bucket.ways {
                let hash = e.hash.load(ACQ);
                if hash == 0 || hash == KEY_CLAIMED {
                    continue;
                }
                let Some(counting) = self.template_counting(e.template.load(RLX)) else {
                    free_entry(e, hash, h);
                    continue;
                };
                let known = key_tally(e, &counting, now);
                if now.saturating_sub(known.at) < RESTAMP_AFTER {
                    continue;
                }
                if self.key_drained(e, now) {
                    free_entry(e, hash, h);
                } else {
                    store_key_tally(e, &counting, counting.aged(known, now));
                }
            }
        }
        h.key_sweep.store(((start + buckets) % n) as u32, RLX);
    }

    /// Every key of the template in `template` (all templates: `None`)
    /// with its state at `now`, as this host sees it. Reads the whole key
    /// section: for metrics and listings, not the request path.
    pub fn keys(&self, template: Option<SlotId>, now: Nanos) -> Vec<KeyState> {
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
                let Some((view, _)) = self.read_view(t - 1) else {
                    continue;
                };
                let snapshot = key_view(e, &view, now);
                out.push(KeyState {
                    hash,
                    template: t - 1,
                    level: crate::core::estimate::estimate_level(&snapshot, now, &estimator),
                    fill_rate: snapshot.fill_rate,
                    pending: e.pending.load(RLX),
                    inflight: e.inflight.load(RLX),
                });
            }
        }
        out
    }

    /// Copies `old`'s keys into this table (an nginx zone that changed
    /// size): each key of a template this table has (`slot_of` maps the
    /// old template slot to the new one) keeps its level, fill rate and
    /// use, and its unacknowledged weight becomes pending here, to be sent
    /// again. Keys that find no entry are left behind.
    pub(super) fn adopt_keys(
        &self,
        old: &Table,
        slot_of: impl Fn(SlotId) -> Option<SlotId>,
        now: Nanos,
    ) {
        for bucket in old.key_buckets() {
            for e in &bucket.ways {
                let hash = e.hash.load(ACQ);
                let Some(t) = e.template.load(RLX).checked_sub(1) else {
                    continue;
                };
                if hash == 0 || hash == KEY_CLAIMED {
                    continue;
                }
                let Some(slot) = slot_of(t) else { continue };
                let Some(at) = self.use_key(slot, hash, now) else {
                    continue;
                };
                let Some(to) = self.key_at(at) else { continue };
                to.known.store(e.known.load(RLX), RLX);
                to.fill.store(e.fill.load(RLX), RLX);
                to.used.store(e.used.load(RLX), RLX);
                let unsent = e.pending.load(RLX) + e.inflight.load(RLX);
                self.count_key(at, unsent);
            }
        }
    }
}

/// Records a use at `tick`: the tick, and one more use up to three.
/// True when the keys of a template counting so keep their previous
/// window's count (a sliding window): an entry's `fill` word holds it, as
/// an `f32`, instead of the other hosts' fill rate. A sliding key's
/// estimate between syncs is then not extrapolated (48 bytes an entry
/// have room for one of the two, and the previous count is what a sliding
/// decision cannot do without).
fn keeps_prev(counting: &Counting) -> bool {
    matches!(counting, Counting::Window(rule) if rule.sliding)
}

/// The check-time view of the key in entry `e` of a per-key template
/// whose own view is `template`: the template's numbers with the key's
/// counter, its fill rate or (sliding) its previous window's count, and
/// its weight not yet in a cluster value.
fn key_view(e: &KeyEntry, template: &QuotaSnapshot, now: Nanos) -> QuotaSnapshot {
    // `known` first, acquiring: a merge writes `fill` before it.
    let (level, known_at) = unpack_known(e.known.load(ACQ), now);
    let fill = f64::from(f32::from_bits(e.fill.load(RLX)));
    let sliding = template.window.is_some_and(|rule| rule.sliding);
    QuotaSnapshot {
        known: Level {
            level,
            at: known_at,
        },
        fill_rate: if sliding { 0.0 } else { fill },
        prev: if sliding { fill } else { 0.0 },
        own_recent: (e.pending.load(RLX) + e.inflight.load(RLX)) as f64,
        ..*template
    }
}

/// A key's counter, its packed time placed near `now` (with the previous
/// window's count when the template slides).
fn key_tally(e: &KeyEntry, counting: &Counting, now: Nanos) -> Tally {
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
fn store_key_tally(e: &KeyEntry, counting: &Counting, t: Tally) {
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

fn touch(e: &KeyEntry, tick: u32) {
    let used = e.used.load(RLX);
    let next = tick << 2 | ((used & 3) + 1).min(3);
    if next != used {
        e.used.store(next, RLX);
    }
}

/// Makes a claimed entry the key `hash` of `template`, seen once now.
///
/// `pending` is left as it is: a claimed entry was free or drained (or
/// its evicted weight was dropped by `claim_way`), so anything there is a
/// count that raced the claim (a check that made or found the entry just
/// before it was taken). It is collected under the new key, not lost.
fn init_entry(e: &KeyEntry, template: SlotId, hash: KeyHash, tick: u32, now: Nanos) {
    e.template.store(template + 1, RLX);
    e.inflight.store(0, RLX);
    e.known.store(pack_known(0.0, now), RLX);
    e.fill.store(0, RLX);
    e.used.store(tick << 2 | 1, RLX);
    // `dirty` stays as it is: if the ring still holds this entry, it is
    // collected from there.
    e.hash.store(hash, REL);
}

/// Frees an entry that held `hash` (unless someone claimed it meanwhile).
fn free_entry(e: &KeyEntry, hash: u64, h: &super::layout::Header) {
    if e.hash.compare_exchange(hash, KEY_CLAIMED, ACQ, RLX).is_ok() {
        e.template.store(0, RLX);
        e.pending.store(0, RLX);
        e.inflight.store(0, RLX);
        e.known.store(0, RLX);
        e.fill.store(0, RLX);
        e.used.store(0, RLX);
        e.hash.store(0, REL);
        h.key_live.fetch_sub(1, RLX);
    }
}

#[cfg(test)]
mod ring_tests {
    use super::*;
    use crate::core::Quota;
    use crate::table::{CheckItem, CheckOptions, Outcome};

    fn count(t: &Table, key: &[u8]) {
        let item = CheckItem {
            name: b"k",
            key: Some(key),
            weight: 1,
            max_wait: None,
        };
        let r = t.check_many(&[item], 0, CheckOptions::default(), || 0.5);
        assert_eq!(r.outcome, Outcome::Pass);
    }

    fn collected(t: &Table) -> u64 {
        let mut out = Vec::new();
        t.collect_deltas(&mut out);
        out.iter().map(|d| d.delta).sum()
    }

    /// What `count_key` does up to the ring write, for a producer that is
    /// then descheduled: returns the position it reserved.
    fn stall_before_ring_write(t: &Table, at: KeyAt) -> u64 {
        let e = t.key_at(at).unwrap();
        e.pending.fetch_add(1, SeqCst);
        assert_eq!(e.dirty.swap(1, SeqCst), 0);
        t.header().key_ring_head.fetch_add(1, AcqRel)
    }

    /// The race CI caught (`concurrent_keyed_checks_and_collection_lose_no_increment`):
    /// a producer descheduled between reserving a ring position and
    /// writing it, skipped by the collector, writes late; a lap later the
    /// collector must not take that write for the entry of the producer
    /// now holding the same cell, or that producer's write lands behind
    /// the tail and its weight is never collected.
    #[test]
    fn a_late_ring_write_is_never_taken_for_a_later_lap() {
        let t = Table::new_heap_with_keys(16, 16, 256);
        t.apply_quotas(&[Quota::new(2, "k", 1e9, 1e12, 1e12).keyed()]);
        let len = t.key_ring().len() as u64;
        assert_eq!(len, 64);
        let slot = t.lookup(b"k").unwrap();
        count(&t, b"late");
        count(&t, b"next");
        assert_eq!(collected(&t), 2);
        let late = t.find_key(slot, t.key_secret().hash(b"late")).unwrap();
        let next = t.find_key(slot, t.key_secret().hash(b"next")).unwrap();

        // The late producer reserves a position and stalls; the collector
        // waits RING_STUCK_LIMIT collections, then skips it and scans.
        let p = stall_before_ring_write(&t, late);
        let mut total = 0;
        for _ in 0..RING_STUCK_LIMIT {
            total += collected(&t);
        }
        assert_eq!(total, 1, "the full scan collects the stalled weight");
        assert_eq!(t.header().key_ring_tail.load(ACQ), p + 1);

        // A lap of other entries through the ring.
        while t.header().key_ring_head.load(ACQ) < p + len {
            count(&t, b"busy");
            assert_eq!(collected(&t), 1);
        }
        // The late write lands; another producer reserves the same cell
        // and stalls before writing; a collection runs in between.
        t.key_ring()[(p % len) as usize].store(ring_cell(p, late), REL);
        let q = stall_before_ring_write(&t, next);
        assert_eq!(q, p + len);
        assert_eq!(collected(&t), 0);
        t.key_ring()[(q % len) as usize].store(ring_cell(q, next), REL);
        assert_eq!(
            collected(&t),
            1,
            "the second producer's weight is collected"
        );
        assert_eq!(t.key_at(next).unwrap().pending.load(SeqCst), 0);
    }

    /// A fresh entry is drained (equal to no entry) until its first count,
    /// so a newcomer to a full bucket may take it between the check that
    /// made it and that check's count. The count must not be lost: it
    /// lands on the key that now holds the entry, and is collected, even
    /// when a collection runs while the entry is being made.
    #[test]
    fn a_count_racing_the_claim_of_its_fresh_entry_is_collected() {
        let t = Table::new_heap_with_keys(16, 16, 1024);
        t.apply_quotas(&[Quota::new(2, "k", 1e9, 1e12, 1e12).keyed()]);
        let slot = t.lookup(b"k").unwrap();
        let secret = t.key_secret();
        // KEY_WAYS + 1 keys of one bucket.
        let target = t.bucket_of(slot, secret.hash(b"key-0"));
        let keys: Vec<Vec<u8>> = (0..)
            .map(|i| format!("key-{i}").into_bytes())
            .filter(|k| t.bucket_of(slot, secret.hash(k)) == target)
            .take(KEY_WAYS + 1)
            .collect();
        // All but one way busy with weight pending: not evictable.
        for k in &keys[..KEY_WAYS - 1] {
            count(&t, k);
            count(&t, k);
        }
        let fresh = t
            .use_key(slot, secret.hash(&keys[KEY_WAYS - 1]), 0)
            .unwrap();
        // A newcomer claims the fresh entry (the only victim) ...
        let ways = &t.key_buckets()[target].ways;
        let way = t
            .claim_way(ways, key_tick(0), 0)
            .expect("the fresh entry is a victim");
        assert_eq!((target * KEY_WAYS + way) as KeyAt, fresh);
        // ... the check that made it counts now ...
        t.count_key(fresh, 5);
        // ... a collection runs before the newcomer's entry is made ...
        assert_eq!(collected(&t), 2 * (KEY_WAYS as u64 - 1));
        init_entry(
            &ways[way],
            slot,
            secret.hash(&keys[KEY_WAYS]),
            key_tick(0),
            0,
        );
        // ... and the raced count is collected, under the newcomer.
        let mut out = Vec::new();
        t.collect_deltas(&mut out);
        let newcomer = secret.hash(&keys[KEY_WAYS]);
        assert_eq!(out.iter().map(|d| d.delta).sum::<u64>(), 5, "{out:?}");
        assert!(out.iter().all(|d| d.key == newcomer));
        assert_eq!(t.key_stats().evictions, 0);
    }

    #[test]
    fn ring_cells_carry_their_position() {
        let cell = ring_cell(5, 7);
        assert_eq!(ring_entry(cell, 5), Some(7));
        assert_eq!(ring_entry(cell, 5 + (1 << 32)), Some(7));
        assert_eq!(ring_entry(cell, 69), None);
        assert_eq!(ring_entry(0, 0), None);
        assert_eq!(
            ring_entry(ring_cell(u64::MAX, u32::MAX - 1), u64::MAX),
            Some(u32::MAX - 1)
        );
    }
}
