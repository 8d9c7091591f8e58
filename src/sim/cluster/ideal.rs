//! The ideal limiter the fleet is measured against: one central counter
//! per quota (and per key), known exactly, deciding every request with
//! the same rule and no sync delay.

use super::Sim;
use crate::core::decision::{check_chain, ChainVerdict};
use crate::core::estimate::Estimator;
use crate::core::{Nanos, QuotaSnapshot, Tally};

impl Sim<'_> {
    /// The ideal limiter's view of quota `c` (with the counter `tally`)
    /// at `now`.
    pub(super) fn ideal_view(&self, c: usize, tally: Tally, now: Nanos) -> QuotaSnapshot {
        let quota = &self.quotas[c];
        let aged = self.counting[c].aged(tally, now);
        QuotaSnapshot {
            limit: quota.limit,
            low_burst: quota.low_burst,
            high_burst: quota.high_burst,
            known: aged.level(),
            window: quota.window_rule(0),
            prev: aged.prev,
            ..QuotaSnapshot::default()
        }
    }

    /// The ideal limiter's decision on a chain of views (the caller counts
    /// a pass).
    pub(super) fn ideal_decide(
        &mut self,
        views: &[QuotaSnapshot],
        weight: f64,
        now: Nanos,
    ) -> bool {
        let rng = &mut self.ideal_rng;
        check_chain(views, weight, now, &Estimator::default(), || {
            rng.next_unit()
        }) == ChainVerdict::Pass
    }

    /// The ideal limiter for a key of the per-key quota `q`: one central
    /// counter per key with the template's numbers, under the template's
    /// parents' central counters.
    pub(super) fn ideal_check_key(
        &mut self,
        q: usize,
        key: (usize, u64),
        weight: f64,
        now: Nanos,
    ) -> bool {
        let tally = self.ideal_keys.get(&key).copied().unwrap_or(Tally {
            at: now,
            ..Tally::default()
        });
        let mut views = vec![self.ideal_view(q, tally, now)];
        for &c in &self.chains[q][1..] {
            views.push(self.ideal_view(c, self.ideal[c], now));
        }
        if !self.ideal_decide(&views, weight, now) {
            return false;
        }
        self.ideal_keys
            .insert(key, self.counting[q].add(tally, now, weight));
        for &c in &self.chains[q][1..] {
            self.ideal[c] = self.counting[c].add(self.ideal[c], now, weight);
        }
        true
    }

    /// The ideal limiter: one central counter per quota, known exactly.
    pub(super) fn ideal_check(&mut self, q: usize, weight: f64, now: Nanos) -> bool {
        let views: Vec<QuotaSnapshot> = self.chains[q]
            .iter()
            .map(|&c| self.ideal_view(c, self.ideal[c], now))
            .collect();
        if !self.ideal_decide(&views, weight, now) {
            return false;
        }
        for &c in &self.chains[q] {
            self.ideal[c] = self.counting[c].add(self.ideal[c], now, weight);
        }
        true
    }
}
