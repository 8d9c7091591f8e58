//! A simulated quota root: the root's counter math and sync answers, in
//! memory, with no IO.
//!
//! It does what the real root does with a sync request: every delta is
//! added with [`Level::add`] (`C = max(C, F(now)) + delta`, in the root's
//! own clock), and the reply carries the quotas after the limiter's cursor,
//! the counters changed since its version (all non-empty ones for version 0
//! or another instance), the new version and the root's clock. A killed
//! root answers nothing; a restarted one is a new instance with no
//! counters.

use std::collections::BTreeMap;

use crate::core::{Level, Nanos, Quota};
use crate::wire::{CounterValue, SyncRequest, SyncResponse};

/// One counter and the version of its last update.
#[derive(Clone, Copy, Debug)]
struct Counter {
    level: Level,
    version: u64,
}

/// A simulated root.
#[derive(Debug)]
pub struct SimRoot {
    /// Every quota, in `(epoch, id)` order (the scenario's quotas all have
    /// epoch 1, so id order).
    quotas: Vec<Quota>,
    /// Counters by quota id (ordered, so replies are deterministic).
    counters: BTreeMap<u64, Counter>,
    /// Last version handed out.
    version: u64,
    /// This process's id; new at every restart.
    pub instance: u64,
    /// False while killed.
    pub up: bool,
}

impl SimRoot {
    /// A running root serving `quotas`.
    pub fn new(quotas: &[Quota], instance: u64) -> Self {
        let mut quotas = quotas.to_vec();
        quotas.sort_by_key(|q| (q.epoch, q.id));
        Self {
            quotas,
            counters: BTreeMap::new(),
            version: 0,
            instance,
            up: true,
        }
    }

    /// Stops answering; the counters are gone (roots keep them in memory
    /// only).
    pub fn kill(&mut self) {
        self.up = false;
        self.counters.clear();
        self.version = 0;
    }

    /// Starts again as a new instance.
    pub fn restart(&mut self, instance: u64) {
        self.up = true;
        self.instance = instance;
    }

    /// The cluster level of quota `id` at `now` (root time), as this root
    /// knows it.
    pub fn level(&self, id: u64, now: Nanos) -> Option<Level> {
        let limit = self.quotas.iter().find(|q| q.id == id)?.limit;
        Some(self.counters.get(&id)?.level.leaked(limit, now))
    }

    /// Applies a sync request at root time `now` and builds the answer.
    pub fn sync(&mut self, request: &SyncRequest, now: Nanos) -> SyncResponse {
        for d in &request.deltas {
            let Some(q) = self.quotas.iter().find(|q| q.id == d.id && !q.deleted) else {
                continue;
            };
            self.version += 1;
            let c = self.counters.entry(d.id).or_insert(Counter {
                level: Level::empty(now),
                version: 0,
            });
            c.level = c.level.add(q.limit, now, d.delta as f64);
            c.version = self.version;
        }
        let since = if request.root_instance == self.instance {
            request.counter_version
        } else {
            0
        };
        let counters = self
            .counters
            .iter()
            .filter(|(_, c)| c.version > since)
            .filter(|(&id, c)| since > 0 || self.is_above_floor(id, c.level, now))
            .map(|(&id, c)| CounterValue {
                id,
                level: c.level.level,
                at: c.level.at,
            })
            .collect();
        let quotas: Vec<Quota> = self
            .quotas
            .iter()
            .filter(|q| (q.epoch, q.id) > (request.quotas_after.epoch, request.quotas_after.id))
            .cloned()
            .collect();
        let quotas_after =
            quotas
                .last()
                .map_or(request.quotas_after, |q| crate::wire::QuotaCursor {
                    epoch: q.epoch,
                    id: q.id,
                });
        SyncResponse {
            root_instance: self.instance,
            root_time: now,
            quotas,
            quotas_after,
            more_quotas: false,
            counters,
            counter_version: self.version,
        }
    }

    /// A fresh limiter is sent only counters above the floor: an empty
    /// bucket is what it assumes anyway.
    fn is_above_floor(&self, id: u64, level: Level, now: Nanos) -> bool {
        let limit = self
            .quotas
            .iter()
            .find(|q| q.id == id)
            .map_or(0.0, |q| q.limit);
        level.leaked(limit, now).level > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CounterDelta, QuotaCursor};

    const SEC: Nanos = 1_000_000_000;

    fn quotas() -> Vec<Quota> {
        vec![Quota {
            id: 1,
            name: "q".into(),
            parent: None,
            limit: 10.0,
            low_burst: 100.0,
            high_burst: 100.0,
            epoch: 1,
            deleted: false,
        }]
    }

    fn request(instance: u64, version: u64, delta: u64) -> SyncRequest {
        SyncRequest {
            limiter: "h".into(),
            quotas_after: QuotaCursor::default(),
            counter_version: version,
            root_instance: instance,
            deltas: if delta > 0 {
                vec![CounterDelta { id: 1, delta }]
            } else {
                vec![]
            },
        }
    }

    #[test]
    fn deltas_add_with_the_leak_and_come_back_as_changed_counters() {
        let mut r = SimRoot::new(&quotas(), 7);
        let a = r.sync(&request(0, 0, 50), SEC);
        assert_eq!(a.quotas.len(), 1);
        assert_eq!(a.counters[0].level, 50.0);
        // One second later 10 leaked: 40 + 30.
        let b = r.sync(&request(7, a.counter_version, 30), 2 * SEC);
        assert_eq!((b.counters[0].level, b.counters[0].at), (70.0, 2 * SEC));
        // Nothing changed since: nothing sent.
        let c = r.sync(&request(7, b.counter_version, 0), 3 * SEC);
        assert!(c.counters.is_empty());
    }

    #[test]
    fn a_restarted_root_is_empty_and_answers_old_versions_in_full() {
        let mut r = SimRoot::new(&quotas(), 7);
        let a = r.sync(&request(0, 0, 50), SEC);
        r.kill();
        r.restart(8);
        assert!(r.level(1, SEC).is_none());
        let b = r.sync(&request(7, a.counter_version, 5), 2 * SEC);
        assert_eq!(b.root_instance, 8);
        assert_eq!(b.counters[0].level, 5.0);
    }
}
