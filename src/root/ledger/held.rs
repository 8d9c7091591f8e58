//! Held slots a limiter reports absolute ([`crate::wire::SyncRequest::held`]
//! for named in-flight quotas, [`crate::wire::SyncRequest::keyed_held`]
//! for keys of per-key ones; docs/DESIGN.md, "In-flight quotas", *Held
//! slots, absolute*): the root sets what it counts of that limiter there,
//! and passes over the adds and returns of those counters the request
//! carries.

use super::super::counter_book::{Delta, Uncounted};
use super::super::in_flight::HELD_BURSTS;
use super::super::quota_book::QuotaBook;
use super::{Ledger, SyncStep, Weight};
use crate::core::Nanos;
use crate::wire::CounterKey;

/// The limit of the in-flight quota `counter` counts on, or `None` when
/// it is not one (a plain or unknown quota).
pub(super) fn in_flight_limit(quotas: &QuotaBook, counter: CounterKey) -> Option<f64> {
    quotas
        .counting_quota(counter.id, counter.key != 0)
        .filter(|q| q.in_flight)
        .map(|q| q.high_burst)
}

/// True when the request reports the slots of `counter` absolute: a
/// named one in `held`, a key in `keyed_held` (both sorted, as
/// [`SyncRequest::check`] requires).
pub(super) fn reported(weight: &Weight<'_>, counter: CounterKey) -> bool {
    if counter.key == 0 {
        return weight
            .held
            .binary_search_by_key(&counter.id, |&(id, _)| id)
            .is_ok();
    }
    weight
        .keyed_held
        .binary_search_by_key(&counter.id, |g| g.id)
        .is_ok_and(|g| {
            weight.keyed_held[g]
                .deltas
                .binary_search_by_key(&counter.key, |d| d.0)
                .is_ok()
        })
}

impl Ledger {
    /// Sets what limiter `number` holds of each in-flight counter in
    /// `held` (named, or a key of a per-key one) to the slots it reports
    /// there (at most [`HELD_BURSTS`] of the quota's `high_burst`, as an
    /// add is clipped), moving the counter by the difference. A quota
    /// that is not an in-flight one here is passed over; a key the root
    /// will not hold for the limiter is refused, as its add would be.
    pub(super) fn apply_held(
        &self,
        number: u32,
        held: impl Iterator<Item = (CounterKey, u64)>,
        now: Nanos,
        step: &mut SyncStep,
    ) {
        let mut held = held.peekable();
        if held.peek().is_none() {
            return;
        }
        let quotas = self.quotas_read();
        let overrides = self.overrides();
        for (counter, slots) in held {
            let Some(limit) = in_flight_limit(&quotas, counter) else {
                continue;
            };
            let target = (slots as f64).min(HELD_BURSTS * limit);
            if target < slots as f64 {
                step.clipped += 1;
                step.clipped_weight += slots as f64 - target;
            }
            let mut guard = self.counters.lock(self.counters.shard_of(counter));
            let shard = &mut *guard;
            let change = target - shard.held.of(number, counter);
            let delta = |weight: f64| Delta {
                weight,
                window: None,
            };
            if change > 0.0 {
                let rule_of = || self.rule_of((&quotas, &overrides), counter, now);
                let added = shard.book.add_allowed(
                    counter,
                    delta(change),
                    now,
                    Some(number),
                    rule_of,
                    |_| change,
                );
                if let Err(why) = added {
                    step.ignored += 1;
                    if why == Uncounted::KeyRefused {
                        step.refused.push(counter);
                    }
                    continue;
                }
                step.applied += 1;
            } else if change < 0.0 {
                step.returned_weight += shard
                    .book
                    .give_back(counter, delta(-change), now, |_| -change)
                    .unwrap_or(0.0);
            }
            shard.held.set(number, counter, target);
        }
    }
}
