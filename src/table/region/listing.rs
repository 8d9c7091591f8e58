//! Reading the table whole: every quota with its live state (listings,
//! metrics, the sync thread's id map), names and terms by slot, and adopting the
//! contents of another table (an nginx zone that changed size).

use super::layout::{Slot, FLAG_IN_FLIGHT, FLAG_PER_KEY};
use super::names;

use super::sections::{region_view, SlotId, ACQ, RLX};
use crate::core::estimate::Estimator;
use crate::core::{Nanos, Quota};
use crate::table::region::index::NameIndex;
use crate::table::region::slots::Slots;

region_view!(
    /// Whole-table reads, for listings and metrics.
    Listing
);

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
    pub unacked: i64,
    /// Checks passed.
    pub passed: u64,
    /// Checks rejected.
    pub rejected: u64,
    /// Checks that would have been rejected, let through by a dry run.
    pub dry_run: u64,
}

impl Listing<'_> {
    // ---- listing ------------------------------------------------------------

    /// Every live quota with its live state, in slot order.
    pub(in crate::table) fn quotas(&self, now: Nanos) -> Vec<QuotaState> {
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
    pub(in crate::table) fn quota(&self, name: &[u8], now: Nanos) -> Option<QuotaState> {
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
            unacked: s.unacked.load(RLX) as i64,
            passed: s.passed.load(RLX),
            rejected: s.rejected.load(RLX),
            dry_run: s.dry_run.load(RLX),
        })
    }
}
