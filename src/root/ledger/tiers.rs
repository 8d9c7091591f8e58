//! The tiers part of a root's ledger: the overrides loaded from the
//! database, the penalties limiters start, and what a sync answers of
//! both; a key's counting rule under its override.

use crate::core::tier::{Override, Rule};
use crate::core::{Nanos, Quota};
use crate::wire::{CounterKey, SyncRequest, TierReply};
use std::sync::{MutexGuard, RwLockReadGuard};

use super::super::counter_book::CounterRule;
use super::super::quota_book::QuotaBook;
use super::super::store::OverrideRow;
use super::super::tier_book::{OverrideBook, OverridePage, PenaltyBook};
use super::super::trust::counter_rule;
use super::{Ledger, SyncPaging};

impl Ledger {
    /// The tiers part of a sync: takes the penalties the limiter started
    /// (as [`PenaltyBook::admit`] allows), and answers the overrides after
    /// its cursor (none while quota pages remain: their templates come
    /// first) and the penalties changed since its version.
    pub(super) fn tiers_step(
        &self,
        request: &SyncRequest,
        quotas: &QuotaBook,
        instance: u64,
        now: Nanos,
        quotas_pending: bool,
        paging: SyncPaging,
    ) -> TierReply {
        let now_utc = now as i64 + self.utc_offset;
        let asked = &request.tiers;
        let mut penalties = self.penalties();
        for &p in &asked.penalties {
            let _ = penalties.admit(p, quotas.get(p.quota()).map(|q| q.as_ref()), now_utc);
        }
        let since =
            if request.root_instance == instance && asked.penalty_version <= penalties.version() {
                asked.penalty_version
            } else {
                0
            };
        let (changed, penalty_version) = penalties.changed_since(since, now_utc);
        drop(penalties);
        let page = if quotas_pending {
            OverridePage {
                after: asked.overrides_after,
                ..OverridePage::default()
            }
        } else {
            self.overrides()
                .page_after(asked.overrides_after, paging.quotas)
        };
        TierReply {
            overrides: page.overrides,
            overrides_after: page.after,
            more_overrides: page.more,
            penalties: changed,
            penalty_version,
        }
    }

    /// Stores overrides read from the database, in `(epoch, id)` order;
    /// returns how many changed.
    pub fn load_overrides(&self, rows: Vec<OverrideRow>, now: Nanos) -> usize {
        let changed: Vec<OverrideRow> = {
            let mut book = self.overrides_write();
            rows.into_iter()
                .filter(|row| book.load(row.clone()))
                .collect()
        };
        // The keys' counters take the new numbers (a removal: the
        // template's again), the quotas read after the overrides were let
        // go, as everywhere else.
        let quotas = self.quotas_read();
        for row in &changed {
            let Some(template) = quotas.counting_quota(row.ov.quota, true) else {
                continue;
            };
            let live = (!row.ov.deleted).then_some(&row.ov);
            let rule = self.key_rule(template, live, now);
            let counter = CounterKey {
                id: row.ov.quota,
                key: row.ov.key,
            };
            self.counters.set_key_counting(counter, rule, now);
        }
        changed.len()
    }

    /// How a key of per-key template `template` counts at the root: with
    /// the template's numbers, or its override's. Its cap and the
    /// allowance each limiter has on it follow the same numbers, so a key
    /// moved from 15/s to 100/s is not clipped to 15/s; an allowed key's
    /// are unbounded (what a limiter admits for it is never limited),
    /// a denied key's the template's (its checks are not counted).
    /// How `counter` counts at `now`: a named counter by its quota, a
    /// key by its template under its override (`overrides`, read after
    /// `quotas`, as everywhere); `None` for a quota `quotas` lacks.
    pub(super) fn rule_of(
        &self,
        (quotas, overrides): (&QuotaBook, &OverrideBook),
        counter: CounterKey,
        now: Nanos,
    ) -> Option<CounterRule> {
        let quota = quotas.counting_quota(counter.id, counter.key != 0)?;
        Some(if counter.key == 0 {
            counter_rule(quota, self.utc_offset, self.level_cap_seconds, now)
        } else {
            let row = overrides.get(counter.id, counter.key);
            self.key_rule(quota, row.map(|r| &r.ov), now)
        })
    }

    pub(super) fn key_rule(
        &self,
        template: &Quota,
        over: Option<&Override>,
        now: Nanos,
    ) -> CounterRule {
        let (utc_offset, cap_seconds) = (self.utc_offset, self.level_cap_seconds);
        match over.map(|o| (o.rule, o.epoch)) {
            Some((
                Rule::Limit {
                    limit,
                    low_burst,
                    high_burst,
                },
                epoch,
            )) => {
                let mut quota = template.clone();
                quota.limit = limit;
                quota.low_burst = low_burst;
                quota.high_burst = high_burst;
                // An edit of either starts the allowances over.
                quota.epoch = quota.epoch.max(epoch);
                counter_rule(&quota, utc_offset, cap_seconds, now)
            }
            Some((Rule::Allow, _)) => {
                let counting = counter_rule(template, utc_offset, cap_seconds, now).counting;
                CounterRule::from(counting)
            }
            Some((Rule::Deny, _)) | None => counter_rule(template, utc_offset, cap_seconds, now),
        }
    }

    /// Reads the overrides.
    pub fn overrides(&self) -> RwLockReadGuard<'_, OverrideBook> {
        self.overrides
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn overrides_write(&self) -> std::sync::RwLockWriteGuard<'_, OverrideBook> {
        self.overrides
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Locks the penalties.
    pub fn penalties(&self) -> MutexGuard<'_, PenaltyBook> {
        self.penalties
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets penalties that ended by `now_utc` (UTC nanoseconds), and
    /// those of quotas deleted or without a penalty now.
    pub fn forget_ended_penalties(&self, now_utc: i64) {
        let quotas = self.quotas_read();
        self.penalties().forget_ended(now_utc, |id| {
            quotas
                .get(id)
                .is_none_or(|q| q.deleted || q.penalty.is_none())
        });
    }
}
