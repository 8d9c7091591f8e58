//! Tiers per key outside the region's own structure: what the sync
//! thread writes (overrides applied, penalties merged and sent, the
//! sweep of what expired, quotas' penalty lengths) and what a check does
//! with them (applied to its chain, a penalty started by a rejection at
//! the high burst). The section itself, its marks and its filter are in
//! `region/tier_section.rs`.

use std::sync::atomic::Ordering::SeqCst;

use crate::core::tier::{Override, Penalty, Rule};
use crate::table::region::layout::{
    TierEntry, FLAG_LIVE, FLAG_TIERS, TIER_ALLOW, TIER_DENY, TIER_LIMIT, TIER_NONE, TIER_OUTBOX,
    TIER_UNSENT,
};
use crate::table::region::slots::Slots;
use crate::table::region::tier_section::{
    read_entry, write_entry, EntryFor, TierReport, TierSection,
};
use crate::table::region::{region_view, SlotId, ACQ, RLX};

region_view!(
    /// Overrides and penalties as the sync thread keeps them.
    TierBooks
);

impl TierBooks<'_> {
    /// Applies overrides as the roots (or a quota file) give them, in
    /// epoch order: each replaces its key's override, a tombstone removes
    /// it; the templates they name are flagged for checks to look.
    pub(in crate::table) fn apply_overrides(&self, overrides: &[Override]) -> TierReport {
        let mut report = TierReport::default();
        if overrides.is_empty() {
            return report;
        }
        let _writer = self.lock();
        let slots = Slots::of(self).slot_ids();
        let lock = TierSection::of(self).tier_lock();
        for o in overrides {
            if o.deleted {
                if let Some(e) = TierSection::of(self).find_tier(o.quota, o.key) {
                    write_entry(e, |e| {
                        let unsent = e.rule.load(RLX) & TIER_UNSENT;
                        e.rule.store(TIER_NONE | unsent, RLX);
                        e.expires.store(0, RLX);
                    });
                    report.removed += 1;
                    if e.until.load(RLX) == 0 {
                        let at = TierSection::of(self).tier_index(e);
                        TierSection::of(self).remove_tier_at(&lock, at);
                    }
                }
                continue;
            }
            let Some(e) =
                TierSection::of(self).tier_entry_for(&lock, o.quota, o.key, EntryFor::Rule)
            else {
                report.refused += 1;
                continue;
            };
            let (kind, limit, low, high) = match o.rule {
                Rule::Limit {
                    limit,
                    low_burst,
                    high_burst,
                } => (TIER_LIMIT, limit, low_burst, high_burst),
                Rule::Allow => (TIER_ALLOW, 0.0, 0.0, 0.0),
                Rule::Deny => (TIER_DENY, 0.0, 0.0, 0.0),
            };
            let expires = o.expires_ms.map_or(0, |ms| {
                ms.div_euclid(1000).clamp(1, i64::from(u32::MAX)) as u32
            });
            write_entry(e, |e| {
                let unsent = e.rule.load(RLX) & TIER_UNSENT;
                e.rule.store(kind | unsent, RLX);
                e.limit.store(limit.to_bits(), RLX);
                e.low_burst.store(low.to_bits(), RLX);
                e.high_burst.store(high.to_bits(), RLX);
                e.expires.store(expires, RLX);
            });
            report.applied += 1;
            if let Some(&slot) = slots.get(&o.quota) {
                self.flag_tiers(slot);
                TierSection::of(self).mark_added(slot, o.key);
            }
        }
        report
    }

    /// Flags slot `slot` for checks to look in the tier section (the
    /// writer lock held).
    fn flag_tiers(&self, slot: SlotId) {
        let Some(s) = self.slot(slot) else { return };
        let flags = s.flags.load(RLX);
        if flags & FLAG_LIVE == 0 || flags & FLAG_TIERS != 0 {
            return;
        }
        let w = crate::table::region::lock::SeqWrite::begin(s);
        s.flags.fetch_or(FLAG_TIERS, RLX);
        drop(w);
    }

    /// Records quota `id`'s penalty length (`None`: it has none), as a
    /// quota write does (the writer lock held).
    pub(in crate::table) fn set_quota_penalty(&self, id: u64, secs: Option<u32>) {
        if self.geometry().tier_entries == 0 {
            return;
        }
        let lock = TierSection::of(self).tier_lock();
        match secs {
            Some(secs) => {
                if let Some(e) = TierSection::of(self).tier_entry_for(&lock, id, 0, EntryFor::Rule)
                {
                    write_entry(e, |e| e.penalty_secs.store(secs, RLX));
                }
            }
            None => {
                if let Some(e) = TierSection::of(self).find_tier(id, 0) {
                    write_entry(e, |e| e.penalty_secs.store(0, RLX));
                }
            }
        }
    }

    /// Merges penalties from the roots: each end is kept if later than
    /// the one held. Returns how many moved an end.
    pub(in crate::table) fn merge_penalties(&self, penalties: &[Penalty]) -> usize {
        if penalties.is_empty() || self.geometry().tier_entries == 0 {
            return 0;
        }
        let lock = TierSection::of(self).tier_lock();
        // Keys' entries are found by their template's slot.
        let slots = penalties
            .iter()
            .any(|p| p.key() != 0)
            .then(|| Slots::of(self).slot_ids());
        let mut moved = 0;
        for p in penalties.iter().filter(|p| p.until() > 0) {
            let made_for = EntryFor::Penalty { until: p.until() };
            let Some(e) = TierSection::of(self).tier_entry_for(&lock, p.quota(), p.key(), made_for)
            else {
                continue;
            };
            if (e.until.fetch_max(p.until() as u64, SeqCst) as i64) < p.until() {
                moved += 1;
            }
            if let Some(&slot) = slots.as_ref().and_then(|s| s.get(&p.quota())) {
                TierSection::of(self).mark_added(slot, p.key());
            }
        }
        moved
    }

    /// True when a penalty started here waits to be sent (the sync
    /// thread's probe: two loads).
    pub(in crate::table) fn has_unsent_penalties(&self) -> bool {
        let t = &self.header().tiers;
        t.outbox_len.load(RLX) != 0 || t.outbox_full.load(RLX) != 0
    }

    /// The penalties started here since the last call, to send to the
    /// roots.
    pub(in crate::table) fn take_started_penalties(&self) -> Vec<Penalty> {
        let t = &self.header().tiers;
        if t.outbox_len.load(RLX) == 0 && t.outbox_full.load(RLX) == 0 {
            return Vec::new();
        }
        let _lock = TierSection::of(self).tier_lock();
        let mut out = Vec::new();
        let mut take = |e: &TierEntry| {
            if e.rule.fetch_and(!TIER_UNSENT, RLX) & TIER_UNSENT != 0 {
                let until = e.until.load(RLX) as i64;
                out.push(Penalty(e.quota.load(RLX), e.key.load(RLX), until));
            }
        };
        let n = (t.outbox_len.swap(0, RLX) as usize).min(TIER_OUTBOX);
        for cell in &t.outbox[..n] {
            if let Some(e) = TierSection::of(self).find_tier(cell[0].load(RLX), cell[1].load(RLX)) {
                take(e);
            }
        }
        if t.outbox_full.swap(0, RLX) != 0 {
            for e in self.tier_entries() {
                if e.quota.load(RLX) != 0 {
                    take(e);
                }
            }
        }
        out
    }

    /// Every penalty in force at `now_utc` (for a root that restarted and
    /// knows none).
    pub(in crate::table) fn held_penalties(&self, now_utc: i64) -> Vec<Penalty> {
        self.tier_entries()
            .iter()
            .filter_map(|e| {
                let quota = e.quota.load(ACQ);
                let until = e.until.load(RLX) as i64;
                (quota != 0 && until > now_utc).then(|| Penalty(quota, e.key.load(RLX), until))
            })
            .collect()
    }

    /// Upkeep by the sync thread at `now_utc`, a slice a call (the whole
    /// section about once a minute at one call a second): removes entries
    /// with nothing left in them (a penalty ended, an override expired, no
    /// penalty length), and rebuilds the filter once removals left as many
    /// stale bits as there are entries.
    pub(in crate::table) fn sweep_tiers(&self, now_utc: i64) {
        let t = &self.header().tiers;
        if t.live.load(RLX) == 0 && t.removed.load(RLX) == 0 {
            return;
        }
        let lock = TierSection::of(self).tier_lock();
        let entries = self.tier_entries();
        let budget = (entries.len() / 60).max(4096).min(entries.len());
        let start = (t.sweep.load(RLX) as usize).min(entries.len());
        let end = (start + budget).min(entries.len());
        t.sweep
            .store(if end == entries.len() { 0 } else { end as u32 }, RLX);
        let mut at = start;
        while at < end {
            let e = &entries[at];
            let empty = e.quota.load(RLX) != 0
                && read_entry(e).is_some_and(|r| {
                    r.kind_at(now_utc) == TIER_NONE
                        && r.penalty_secs == 0
                        && r.until <= now_utc
                        && e.rule.load(RLX) & TIER_UNSENT == 0
                });
            if empty {
                // The entry shifted into `at` is looked at next.
                TierSection::of(self).remove_tier_at(&lock, at);
            } else {
                at += 1;
            }
        }
        let live = t.live.load(RLX);
        if t.removed.load(RLX) > live.max(64) {
            TierSection::of(self).rebuild_tier_filter(&lock);
        }
    }
}
