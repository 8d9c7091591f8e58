//! Reading the table whole: every quota with its live state (listings,
//! metrics, the sync thread's id map), names and terms by slot, and adopting the
//! contents of another table (an nginx zone that changed size).

use std::collections::HashMap;

use super::counters::{set_slot_source, slot_source};
use super::layout::{Slot, FLAG_IN_FLIGHT, FLAG_PER_KEY};
use super::lock::SeqWrite;
use super::names;
use super::write::ApplyReport;
use super::{SlotId, Table, ACQ, RLX};
use crate::core::estimate::Estimator;
use crate::core::{Nanos, Quota};
use crate::table::region::index::NameIndex;
use crate::table::region::slots::Slots;

/// A quota as the table holds it, with its live state (for listings and
/// metrics; not used on the request path).
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaState {
    /// The quota as applied.
    pub quota: Quota,
    /// Slot it lives in.
    pub slot: SlotId,
    /// Estimated level now.
    pub level: f64,
    /// Other hosts' measured fill rate, units/s.
    pub fill_rate: f64,
    /// Weight admitted locally not yet collected.
    pub pending: i64,
    /// Weight sent and not yet acknowledged.
    pub inflight: i64,
    /// Checks passed.
    pub passed: u64,
    /// Checks rejected.
    pub rejected: u64,
    /// Checks that would have been rejected, let through by a dry run.
    pub dry_run: u64,
}

impl Table {
    // ---- listing ------------------------------------------------------------

    /// Takes over everything `old` holds (an nginx zone that changed
    /// size): its quotas with their ids and epochs, each counter's cluster
    /// level, time and fill rate, and the weight admitted but not yet
    /// acknowledged by a root, which becomes pending here so it is sent
    /// again, and what the sync thread remembered of the roots (the
    /// status block's per-root instance words). Quotas that do not fit are refused as in
    /// [`Table::apply_quotas`].
    pub fn adopt(&self, old: &Table, now: Nanos) -> ApplyReport {
        self.set_estimator(old.estimator());
        let states = old.quotas(0);
        let quotas: Vec<Quota> = states.iter().map(|s| s.quota.clone()).collect();
        let report = self.apply_quotas(&quotas);
        let slots = Slots::of(self).slot_ids();
        let guard = self.lock();
        for state in &states {
            let (Some(&slot), Some(from)) = (slots.get(&state.quota.id), old.slot(state.slot))
            else {
                continue;
            };
            let to = &self.slots()[slot as usize];
            let w = SeqWrite::begin(to);
            to.known_level.store(from.known_level.load(RLX), RLX);
            to.known_at.store(from.known_at.load(RLX), RLX);
            to.fill_rate.store(from.fill_rate.load(RLX), RLX);
            // The level is still that root's: its replies replace it as
            // before (max-merged, an in-flight level would never come
            // down).
            set_slot_source(to, slot_source(from));
            drop(w);
            to.pending
                .store(state.pending.wrapping_add(state.inflight) as u64, RLX);
            // What was in flight is pending again here: held no longer
            // counts it (see `held.rs`).
            Slots::of(self).set_held(
                slot,
                Slots::of(old)
                    .held_word(state.slot)
                    .wrapping_sub(state.inflight),
            );
            to.passed.store(state.passed, RLX);
            to.rejected.store(state.rejected, RLX);
            to.dry_run.store(state.dry_run, RLX);
        }
        let old_ids: HashMap<SlotId, u64> = states.iter().map(|s| (s.slot, s.quota.id)).collect();
        self.adopt_keys(
            old,
            |old_slot| slots.get(old_ids.get(&old_slot)?).copied(),
            now,
        );
        // The status block takes the writer lock itself.
        drop(guard);
        self.adopt_remembered_roots(old);
        report
    }

    /// Every live quota with its live state, in slot order.
    pub fn quotas(&self, now: Nanos) -> Vec<QuotaState> {
        let estimator = self.estimator();
        let used = self.header().next_unused.load(ACQ) as usize;
        let mut out = Vec::new();
        for (i, s) in self.slots()[..used].iter().enumerate() {
            if let Some(state) = self.quota_state(i as SlotId, s, now, &estimator) {
                out.push(state);
            }
        }
        out
    }

    /// The live state of one quota by name.
    pub fn quota(&self, name: &[u8], now: Nanos) -> Option<QuotaState> {
        let slot = NameIndex::of(self).lookup(name)?;
        self.quota_state(slot, &self.slots()[slot as usize], now, &self.estimator())
    }

    fn quota_state(
        &self,
        slot: SlotId,
        s: &Slot,
        now: Nanos,
        estimator: &Estimator,
    ) -> Option<QuotaState> {
        let (view, _) = Slots::of(self).read_view(slot)?;
        let len = s.name_len.load(RLX) as usize;
        let name = names::name_words(self.arena(), s.name_at.load(RLX), len)
            .map(|w| names::load(w, len))?;
        let parent = s.parent_id.load(RLX);
        let id = s.quota_id()?; // None: freed while this ran
        let in_flight = s.flags.load(RLX) & FLAG_IN_FLIGHT != 0;
        // An in-flight slot holds its leak (0) where the limit goes.
        let limit = if in_flight {
            view.high_burst
        } else {
            view.limit
        };
        Some(QuotaState {
            quota: Quota::new(
                id,
                String::from_utf8_lossy(&name),
                limit,
                view.low_burst,
                view.high_burst,
            )
            .with_parent((parent != 0).then_some(parent))
            .at_epoch(s.epoch.load(RLX))
            .keyed_if(s.flags.load(RLX) & FLAG_PER_KEY != 0)
            .windowed_if(view.window.map(|rule| (rule.window, rule.sliding)))
            .in_flight_if(in_flight),
            slot,
            level: crate::core::estimate::estimate_level(&view, now, estimator),
            fill_rate: view.fill_rate,
            pending: s.pending.load(RLX) as i64,
            inflight: s.inflight.load(RLX) as i64,
            passed: s.passed.load(RLX),
            rejected: s.rejected.load(RLX),
            dry_run: s.dry_run.load(RLX),
        })
    }
}
