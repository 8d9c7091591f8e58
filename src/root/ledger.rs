//! A root's in-memory state: quotas, counters and limiters, and the sync
//! step that ties them together.
//!
//! Pure state with time passed in; the HTTP layer holds it behind one mutex
//! and does parsing and serialisation outside the lock.

use crate::core::{Nanos, Quota};
use crate::wire::SyncRequest;

use super::counter_book::{ChangedCounters, CounterBook};
use super::limiters::Limiters;
use super::quota_book::{QuotaBook, QuotaChange, QuotaPage};

/// Page sizes of a sync reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPaging {
    /// Most quotas per reply.
    pub quotas: usize,
    /// Most counters per reply.
    pub counters: usize,
}

/// What one sync did and what goes back to the limiter.
#[derive(Clone, Debug, Default)]
pub struct SyncStep {
    /// Quotas after the limiter's cursor.
    pub quotas: QuotaPage,
    /// Counters changed since the limiter's version.
    pub counters: ChangedCounters,
    /// Deltas added to counters.
    pub applied: usize,
    /// Deltas for unknown or deleted quotas, dropped.
    pub ignored: usize,
}

/// Sizes for metrics and health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerStats {
    /// Live quotas.
    pub quotas: usize,
    /// Tombstones held.
    pub tombstones: usize,
    /// Counters in memory.
    pub counters: usize,
    /// Epoch of the last quota loaded.
    pub epoch: u64,
    /// Last counter version handed out.
    pub counter_version: u64,
    /// Limiters ever seen.
    pub limiters: usize,
}

/// Quotas, counters and limiters of one root.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The quota set loaded from the database.
    pub quotas: QuotaBook,
    /// The cluster counters.
    pub counters: CounterBook,
    /// The limiters that synced.
    pub limiters: Limiters,
}

impl Ledger {
    /// Stores quotas read from the database, in `(epoch, id)` order, and
    /// adjusts counters: a deleted quota drops its counter, a changed limit
    /// applies from `now`. Returns how many quotas changed.
    pub fn load(&mut self, quotas: Vec<Quota>, now: Nanos) -> usize {
        let mut changed = 0;
        for quota in quotas {
            match self.quotas.load(quota) {
                QuotaChange::Live { id, limit } => self.counters.set_limit(id, limit, now),
                QuotaChange::Deleted { id } => self.counters.remove(id),
                QuotaChange::Stale => continue,
            }
            changed += 1;
        }
        changed
    }

    /// One sync: applies the request's deltas at `now`, then collects the
    /// quotas and counters the limiter has not seen.
    ///
    /// The request must have been checked (see `api::sync`); nothing here
    /// fails. The counter version the limiter sent counts only when it
    /// belongs to `instance` (this root process); otherwise it gets every
    /// counter above the floor. While quota pages remain, no counters are
    /// sent and the limiter keeps its version: it could not place counters
    /// of quotas it has not received yet.
    pub fn sync(
        &mut self,
        request: &SyncRequest,
        instance: u64,
        now: Nanos,
        paging: SyncPaging,
    ) -> SyncStep {
        let limiter = self.limiters.touch(&request.limiter, now);
        let mut step = SyncStep::default();
        for delta in &request.deltas {
            let quotas = &self.quotas;
            let weight = delta.delta as f64;
            if self.counters.add(delta.id, weight, now, limiter, || {
                quotas.live_limit(delta.id)
            }) {
                step.applied += 1;
            } else {
                step.ignored += 1;
            }
        }
        let since = self.counters_since(request, instance);
        step.quotas = self.quotas.page_after(request.quotas_after, paging.quotas);
        step.counters = if step.quotas.more {
            ChangedCounters {
                counters: Vec::new(),
                version: since,
            }
        } else {
            self.counters.changed_since(since, paging.counters, now)
        };
        step
    }

    fn counters_since(&self, request: &SyncRequest, instance: u64) -> u64 {
        let known =
            request.root_instance == instance && request.counter_version <= self.counters.version();
        if known {
            request.counter_version
        } else {
            0
        }
    }

    /// Sizes for metrics and health.
    pub fn stats(&self) -> LedgerStats {
        LedgerStats {
            quotas: self.quotas.live(),
            tombstones: self.quotas.tombstones(),
            counters: self.counters.len(),
            epoch: self.quotas.cursor().epoch,
            counter_version: self.counters.version(),
            limiters: self.limiters.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CounterDelta, QuotaCursor};

    const SEC: Nanos = 1_000_000_000;
    const INSTANCE: u64 = 77;
    const PAGING: SyncPaging = SyncPaging {
        quotas: 100,
        counters: 100,
    };

    fn quota(id: u64, limit: f64, epoch: u64) -> Quota {
        Quota {
            id,
            name: format!("q{id}"),
            parent: None,
            limit,
            low_burst: 100.0,
            high_burst: 200.0,
            epoch,
            deleted: false,
        }
    }

    fn request(limiter: &str, version: u64, deltas: &[(u64, u64)]) -> SyncRequest {
        SyncRequest {
            limiter: limiter.into(),
            quotas_after: QuotaCursor::default(),
            counter_version: version,
            root_instance: if version == 0 { 0 } else { INSTANCE },
            deltas: deltas
                .iter()
                .map(|&(id, delta)| CounterDelta { id, delta })
                .collect(),
        }
    }

    fn level_of(step: &SyncStep, id: u64) -> Option<f64> {
        step.counters
            .counters
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.level)
    }

    #[test]
    fn two_limiters_sum_into_one_counter() {
        let mut ledger = Ledger::default();
        ledger.load(vec![quota(1, 0.0, 1)], 0);
        let a = ledger.sync(&request("a", 0, &[(1, 50)]), INSTANCE, SEC, PAGING);
        assert_eq!(level_of(&a, 1), Some(50.0));
        let b = ledger.sync(&request("b", 0, &[(1, 30)]), INSTANCE, SEC, PAGING);
        assert_eq!(level_of(&b, 1), Some(80.0));
        let a2 = ledger.sync(
            &request("a", a.counters.version, &[]),
            INSTANCE,
            SEC,
            PAGING,
        );
        assert_eq!(level_of(&a2, 1), Some(80.0));
        let a3 = ledger.sync(
            &request("a", a2.counters.version, &[]),
            INSTANCE,
            SEC,
            PAGING,
        );
        assert!(a3.counters.counters.is_empty());
    }

    #[test]
    fn the_floor_rises_between_syncs() {
        let mut ledger = Ledger::default();
        ledger.load(vec![quota(1, 10.0, 1)], 0);
        ledger.sync(&request("a", 0, &[(1, 100)]), INSTANCE, 0, PAGING);
        // Three seconds at 10/s leak 30; then +5.
        let b = ledger.sync(&request("b", 0, &[(1, 5)]), INSTANCE, 3 * SEC, PAGING);
        assert_eq!(level_of(&b, 1), Some(75.0));
    }

    #[test]
    fn deltas_for_unknown_and_deleted_quotas_are_ignored() {
        let mut ledger = Ledger::default();
        ledger.load(vec![quota(1, 0.0, 1), quota(2, 0.0, 2)], 0);
        ledger.sync(&request("a", 0, &[(2, 4)]), INSTANCE, 0, PAGING);
        ledger.load(
            vec![Quota {
                deleted: true,
                epoch: 3,
                ..quota(2, 0.0, 3)
            }],
            0,
        );
        let step = ledger.sync(
            &request("a", 0, &[(1, 1), (2, 9), (99, 3)]),
            INSTANCE,
            0,
            PAGING,
        );
        assert_eq!((step.applied, step.ignored), (1, 2));
        assert_eq!(ledger.counters.len(), 1);
        assert_eq!(level_of(&step, 2), None);
    }

    #[test]
    fn another_instance_or_version_zero_gets_all_counters() {
        let mut ledger = Ledger::default();
        ledger.load(vec![quota(1, 0.0, 1), quota(2, 0.0, 1)], 0);
        let first = ledger.sync(&request("a", 0, &[(1, 1), (2, 1)]), INSTANCE, 0, PAGING);
        let mut stale = request("a", first.counters.version, &[]);
        stale.root_instance = INSTANCE + 1;
        assert_eq!(
            ledger
                .sync(&stale, INSTANCE, 0, PAGING)
                .counters
                .counters
                .len(),
            2
        );
        // A version from the future (another process) is treated the same.
        let future = request("a", 1_000, &[]);
        assert_eq!(
            ledger
                .sync(&future, INSTANCE, 0, PAGING)
                .counters
                .counters
                .len(),
            2
        );
    }

    #[test]
    fn counters_wait_until_the_quota_pages_are_through() {
        let mut ledger = Ledger::default();
        ledger.load((1..=5).map(|id| quota(id, 0.0, 1)).collect(), 0);
        ledger.sync(&request("a", 0, &[(5, 1)]), INSTANCE, 0, PAGING);
        let paging = SyncPaging {
            quotas: 2,
            counters: 100,
        };
        let mut req = request("b", 0, &[]);
        let mut pages = 0;
        loop {
            let step = ledger.sync(&req, INSTANCE, 0, paging);
            pages += 1;
            if step.quotas.more {
                assert!(step.counters.counters.is_empty());
                assert_eq!(step.counters.version, 0);
            } else {
                assert_eq!(level_of(&step, 5), Some(1.0));
                break;
            }
            req.quotas_after = step.quotas.after;
            req.root_instance = INSTANCE;
        }
        assert_eq!(pages, 3);
    }

    #[test]
    fn a_restarted_root_starts_from_the_floor() {
        let mut before = Ledger::default();
        before.load(vec![quota(1, 0.0, 1)], 0);
        before.sync(&request("a", 0, &[(1, 40)]), INSTANCE, 0, PAGING);
        let mut after = Ledger::default();
        after.load(vec![quota(1, 0.0, 1)], 0);
        let step = after.sync(&request("a", 5, &[(1, 2)]), INSTANCE + 1, 0, PAGING);
        assert_eq!(level_of(&step, 1), Some(2.0));
    }
}
