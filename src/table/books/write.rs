//! Quota writes: applying quotas by epoch (insert, update, delete),
//! re-linking parents, and the slot, name and index allocation they use.
//! Everything here runs under the writer lock.

use crate::core::Quota;
use crate::table::books::held::Held;
use crate::table::books::key_sync::KeySync;
use crate::table::books::tiers::TierBooks;
use crate::table::region::index::NameIndex;
use crate::table::region::layout::{
    counting_flags, COUNTING_MASK, FLAG_LIVE, FLAG_PER_KEY, FLAG_TIERS, FREE_LINK,
};
use crate::table::region::lock::SeqWrite;
use crate::table::region::slots::Slots;
use crate::table::region::{names, region_view, SlotId, TableError, REL, RLX};

region_view!(
    /// Quota writes.
    Writer
);

/// What [`crate::table::Books::apply_quotas`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApplyReport {
    /// New quotas.
    pub inserted: usize,
    /// Existing quotas changed.
    pub updated: usize,
    /// Quotas removed by tombstones.
    pub deleted: usize,
    /// Changes ignored because the table already had that epoch or newer.
    pub stale: usize,
    /// Quotas refused, with why.
    pub refused: Vec<TableError>,
}

impl Writer<'_> {
    /// Applies quota changes from a root or a file: upserts live quotas
    /// whose epoch is newer than the table's copy, removes tombstoned ones,
    /// then re-links parents. Invalid quotas and quotas that do not fit are
    /// refused (listed in the report) and everything else still applies.
    pub(in crate::table) fn apply_quotas(&self, quotas: &[Quota]) -> ApplyReport {
        let _guard = self.lock();
        let mut report = ApplyReport::default();
        let mut freed = Vec::new();
        let mut relink = false;
        for q in quotas {
            match self.apply_one(q, &mut freed) {
                Ok(Applied::Inserted) => {
                    report.inserted += 1;
                    relink = true;
                }
                Ok(Applied::Updated { parent_changed }) => {
                    report.updated += 1;
                    relink |= parent_changed;
                }
                Ok(Applied::Deleted) => {
                    report.deleted += 1;
                    relink = true;
                }
                Ok(Applied::Stale) => report.stale += 1,
                Err(e) => {
                    if matches!(e, TableError::Full { .. } | TableError::NamesFull { .. }) {
                        self.header().refused_quotas.fetch_add(1, RLX);
                    }
                    report.refused.push(e);
                }
            }
            self.header().max_epoch.fetch_max(q.epoch, REL);
        }
        if relink {
            self.relink();
        }
        // Freed slots become reusable only now, after no live slot links to
        // them any more.
        for slot in freed {
            self.free_slot(slot);
        }
        if relink || report.deleted > 0 {
            NameIndex::of(self).maybe_rebuild_index();
            self.header().generation.fetch_add(1, REL);
        }
        report
    }

    fn apply_one(&self, q: &Quota, freed: &mut Vec<SlotId>) -> Result<Applied, TableError> {
        q.validate().map_err(|error| TableError::Invalid {
            name: q.name.clone(),
            error,
        })?;
        let existing = NameIndex::of(self).lookup(q.name.as_bytes());
        if let Some(slot) = existing {
            let s = &self.slots()[slot as usize];
            if s.epoch.load(RLX) >= q.epoch {
                return Ok(Applied::Stale);
            }
            let flags = s.flags.load(RLX);
            let was_template = flags & FLAG_PER_KEY != 0;
            let recounted = flags & COUNTING_MASK != counting_flags(q);
            // A template deleted, or turned into a plain quota (or a new
            // quota under its name, or one counting another way): its
            // keys go with it.
            if was_template && (q.deleted || !q.per_key || recounted || s.quota_id() != Some(q.id))
            {
                KeySync::of(self).drop_keys_of(slot);
            }
            if q.deleted {
                self.remove(slot);
                freed.push(slot);
                return Ok(Applied::Deleted);
            }
            // A new id starts over (`write_quota` clears the parent link
            // with the counter) and may be the parent other quotas name:
            // the links are made again, as for a new parent.
            let parent_changed =
                s.parent_id.load(RLX) != q.parent.unwrap_or(0) || s.quota_id() != Some(q.id);
            self.write_quota(slot, q);
            return Ok(Applied::Updated { parent_changed });
        }
        if q.deleted {
            return Ok(Applied::Stale);
        }
        let slot = self.alloc_slot().ok_or_else(|| TableError::Full {
            capacity: self.capacity(),
            name: q.name.clone(),
        })?;
        let Some(name_at) = self.alloc_name(q.name.len()) else {
            self.free_slot(slot);
            return Err(TableError::NamesFull {
                name: q.name.clone(),
            });
        };
        let s = &self.slots()[slot as usize];
        s.name_at.store(name_at, RLX);
        self.write_quota(slot, q);
        NameIndex::of(self).index_insert(q.name.as_bytes(), slot, name_at);
        self.header().live.fetch_add(1, RLX);
        Ok(Applied::Inserted)
    }

    /// Writes a quota into a slot under its seqlock. A new id (a new quota,
    /// or a name deleted and created again) starts a fresh counter.
    fn write_quota(&self, slot: SlotId, q: &Quota) {
        let s = &self.slots()[slot as usize];
        let counting = counting_flags(q);
        let old_flags = s.flags.load(RLX);
        // A new quota, or one that now counts another way: its counter's
        // numbers mean something else, so it starts over.
        let fresh = s.quota_id() != Some(q.id) || old_flags & COUNTING_MASK != counting;
        // A template's keys keep their overrides across edits of its
        // numbers: once flagged, a quota stays flagged while its id lasts.
        let tiers = if q.penalty.is_some() || (!fresh && old_flags & FLAG_TIERS != 0) {
            FLAG_TIERS
        } else {
            0
        };
        TierBooks::of(self).set_quota_penalty(q.id, q.penalty.map(|p| p.secs()));
        let w = SeqWrite::begin(s);
        let per_key = if q.per_key { FLAG_PER_KEY } else { 0 };
        let flags = FLAG_LIVE | per_key | counting | tiers;
        Slots::of(self).set_flags(s, flags);
        Held::of(self).note_flags(slot, old_flags, flags);
        if let Some(window) = q.window {
            self.header()
                .windows_used
                .fetch_or(1 << (window.code() - 1), RLX);
        }
        // The leak, not the limit: 0 for an in-flight quota, whose limit
        // its bursts carry (`snapshot.rs` gives it back).
        s.limit.store(q.leak().to_bits(), RLX);
        s.low_burst.store(q.low_burst.to_bits(), RLX);
        s.high_burst.store(q.high_burst.to_bits(), RLX);
        // An edit keeps the counter, and with it whose value it is.
        if fresh {
            s.source.store(0, RLX);
            s.name_len.store(q.name.len() as u8, RLX);
            if let Some(words) = names::name_words(self.arena(), s.name_at.load(RLX), q.name.len())
            {
                names::store(words, q.name.as_bytes());
            }
            s.known_level.store(0f64.to_bits(), RLX);
            s.known_at.store(0, RLX);
            s.fill_rate.store(0f64.to_bits(), RLX);
            s.parent.store(0, RLX);
            s.pending.store(0, RLX);
            s.unacked.store(0, RLX);
            Slots::of(self).set_held(slot, 0);
            s.passed.store(0, RLX);
            s.rejected.store(0, RLX);
            s.dry_run.store(0, RLX);
        }
        s.id.store(q.id, RLX);
        s.epoch.store(q.epoch, RLX);
        s.parent_id.store(q.parent.unwrap_or(0), RLX);
        drop(w);
    }

    pub(in crate::table) fn remove(&self, slot: SlotId) {
        let s = &self.slots()[slot as usize];
        let len = s.name_len.load(RLX) as usize;
        let name = names::name_words(self.arena(), s.name_at.load(RLX), len)
            .map(|w| names::load(w, len))
            .unwrap_or_default();
        NameIndex::of(self).index_remove(&name, slot, s.name_at.load(RLX));
        if let Some(id) = s.quota_id() {
            TierBooks::of(self).set_quota_penalty(id, None);
        }
        let w = SeqWrite::begin(s);
        let old_flags = s.flags.load(RLX);
        Slots::of(self).set_flags(s, 0);
        Held::of(self).note_flags(slot, old_flags, 0);
        drop(w);
        self.free_name(s.name_at.load(RLX), len);
        self.header().live.fetch_sub(1, RLX);
    }

    /// Points every live slot's `parent` at its parent id's slot.
    fn relink(&self) {
        let slots = self.slots();
        let used = self.header().next_unused.load(RLX) as usize;
        let by_id = Slots::of(self).slot_ids();
        for s in slots[..used]
            .iter()
            .filter(|s| s.flags.load(RLX) & FLAG_LIVE != 0)
        {
            let pid = s.parent_id.load(RLX);
            let want = if pid == 0 {
                0
            } else {
                by_id.get(&pid).map_or(0, |&p| p + 1)
            };
            if s.parent.load(RLX) != want {
                let w = SeqWrite::begin(s);
                s.parent.store(want, RLX);
                drop(w);
            }
        }
    }

    // ---- slot, name and index allocation (writer lock held) -------------

    fn alloc_slot(&self) -> Option<SlotId> {
        let h = self.header();
        let head = h.free_slots.load(RLX);
        if head != 0 {
            let slot = head - 1;
            let link = self.slots()[slot as usize].id.load(RLX);
            debug_assert_ne!(link & FREE_LINK, 0, "slot {slot} on the free list");
            h.free_slots.store((link & !FREE_LINK) as u32, RLX);
            return Some(slot);
        }
        let next = h.next_unused.load(RLX);
        if next < self.capacity() {
            h.next_unused.store(next + 1, RLX);
            return Some(next);
        }
        None
    }

    fn free_slot(&self, slot: SlotId) {
        let h = self.header();
        self.slots()[slot as usize]
            .id
            .store(FREE_LINK | u64::from(h.free_slots.load(RLX)), RLX);
        h.free_slots.store(slot + 1, RLX);
    }

    fn alloc_name(&self, len: usize) -> Option<u32> {
        let h = self.header();
        let k = names::granules_for(len);
        let head = &h.arena_free[k - 1];
        let first = head.load(RLX);
        if first != 0 {
            let at = first - 1;
            // A free chunk's first word links to the next free chunk.
            let next = self.arena()[at as usize * 2].load(RLX) as u32;
            head.store(next, RLX);
            return Some(at);
        }
        let next = h.arena_next.load(RLX);
        if next as usize + k <= self.geometry().arena_granules as usize {
            h.arena_next.store(next + k as u32, RLX);
            return Some(next);
        }
        None
    }

    fn free_name(&self, at: u32, len: usize) {
        let k = names::granules_for(len);
        let head = &self.header().arena_free[k - 1];
        self.arena()[at as usize * 2].store(u64::from(head.load(RLX)), RLX);
        head.store(at + 1, RLX);
    }
}

enum Applied {
    Inserted,
    Updated { parent_changed: bool },
    Deleted,
    Stale,
}
