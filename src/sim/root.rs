//! A simulated quota root: the real root's in-memory state and sync step
//! ([`Ledger`]), with the network and the database taken away.
//!
//! A sync request is answered exactly as `POST /v1/sync` answers it: the
//! deltas are added with the root's counter math (`C = max(C, F(now)) +
//! delta`, in the root's own clock), and the reply carries the quotas after
//! the limiter's cursor, the counters changed since its version (all
//! non-empty ones for version 0 or another instance), the new version and
//! the root's clock. A killed root answers nothing; a restarted one is a
//! new instance whose counters start empty.

use crate::core::{Nanos, Quota};
use crate::root::config::RootConfig;
use crate::root::ledger::{Ledger, SyncPaging};
use crate::wire::{SyncRequest, SyncResponse};

/// A simulated root.
#[derive(Debug)]
pub struct SimRoot {
    /// Quotas, counters and limiters, as a real root holds them.
    ledger: Ledger,
    /// The quotas, loaded again at every start (from "the database").
    quotas: Vec<Quota>,
    /// Reply page sizes: the real root's defaults.
    paging: SyncPaging,
    /// This process's id; new at every restart.
    pub instance: u64,
    /// False while killed.
    pub up: bool,
    /// UTC minus this root's clock (the simulation's UTC is its own time).
    pub utc_offset: i64,
    /// Deltas this root cut to their limiter's allowance, over every
    /// start: an honest fleet never has any.
    pub clipped: u64,
    /// Root time of the last sweep of full allowances.
    swept_at: Nanos,
    /// The root's `level_cap_seconds`.
    level_cap_seconds: f64,
    /// Its root group, and the number of groups.
    pub group: (usize, usize),
    /// Counter deltas received (named and keyed), over every start: its
    /// work.
    pub received: u64,
    /// Of those, deltas of counters of another group's shard: a limiter
    /// routed them wrong (zero when sharding works).
    pub foreign: u64,
    /// Sync requests answered.
    pub requests: u64,
    /// Counter values sent back in replies (named and keyed).
    pub replied: u64,
    /// Bytes of those replies from each host's [`STEADY_SYNC`]th sync on,
    /// encoded by the real binary encoder.
    pub reply_bytes: u64,
    /// Bytes of replies of the same named counters and, once each, every
    /// key the asking host holds of the root's group (see `count_bytes`),
    /// from each host's [`STEADY_SYNC`]th sync on.
    pub own_bytes: u64,
    /// Bytes of the replies before (a host's first list not yet taken).
    pub first_bytes: u64,
    /// Replies from each host's [`STEADY_SYNC`]th sync on.
    pub steady_requests: u64,
    /// Time spent in the ledger's sync step and building replies (the
    /// root's work per sync; the simulator is one thread, so about its
    /// CPU), nanoseconds.
    pub busy_ns: u64,
    /// Each host's syncs and the keys it sent deltas for, by limiter id.
    held: rustc_hash::FxHashMap<String, (u32, rustc_hash::FxHashSet<crate::wire::CounterKey>)>,
}

/// Replies are measured from a host's this many-th sync with a root on:
/// the first tells it the root answers by interest, the second carries
/// its list, the third is answered by it.
pub const STEADY_SYNC: u32 = 3;

impl SimRoot {
    /// A running root serving `quotas`, started at root time `now`, whose
    /// clock is `utc_offset` behind UTC.
    pub fn new(quotas: &[Quota], instance: u64, now: Nanos, utc_offset: i64) -> Self {
        let defaults = RootConfig::default();
        let mut root = Self {
            ledger: Ledger::default(),
            quotas: quotas.to_vec(),
            paging: SyncPaging {
                quotas: defaults.sync_page_quotas,
                counters: defaults.sync_page_counters,
            },
            instance,
            up: true,
            utc_offset,
            clipped: 0,
            swept_at: now,
            level_cap_seconds: crate::root::trust::DEFAULT_CAP_SECONDS,
            group: (0, 1),
            received: 0,
            foreign: 0,
            requests: 0,
            replied: 0,
            reply_bytes: 0,
            own_bytes: 0,
            first_bytes: 0,
            steady_requests: 0,
            busy_ns: 0,
            held: Default::default(),
        };
        root.ledger.utc_offset = utc_offset;
        root.ledger.load(root.quotas.clone(), now);
        root
    }

    /// Sets the root's `level_cap_seconds` (as its operator would, to the
    /// fleet's longest reservation wait).
    pub fn with_level_cap_seconds(mut self, seconds: f64) -> Self {
        // Before any counter exists: each gets its cap when created.
        self.level_cap_seconds = seconds;
        self.ledger.level_cap_seconds = seconds;
        self
    }

    /// Answers by interest (the real root's way) or with every changed
    /// counter (a root before interest).
    pub fn set_interest(&mut self, on: bool) {
        self.ledger.by_interest = on;
    }

    /// Stops answering; the counters are gone (roots keep them in memory
    /// only).
    pub fn kill(&mut self) {
        self.up = false;
        self.ledger = self.empty_ledger();
    }

    /// Starts again at root time `now` as a new instance, loading the
    /// quotas afresh.
    pub fn restart(&mut self, instance: u64, now: Nanos) {
        self.up = true;
        self.instance = instance;
        self.ledger = self.empty_ledger();
        self.ledger.load(self.quotas.clone(), now);
    }

    /// Counts what `request` gives this root to add, and what of it is
    /// not of its shard.
    fn count_work(&mut self, request: &SyncRequest) {
        use crate::sync::shard;
        use crate::wire::CounterKey;
        let (group, groups) = self.group;
        self.requests += 1;
        let named = request.deltas.iter().map(|d| CounterKey::named(d.id));
        let keyed = request.keyed.iter().flat_map(|k| {
            k.deltas
                .iter()
                .map(move |d| CounterKey { id: k.id, key: d.0 })
        });
        for counter in named.chain(keyed) {
            self.received += 1;
            if shard(counter, groups) != group {
                self.foreign += 1;
            }
        }
    }

    fn empty_ledger(&self) -> Ledger {
        Ledger {
            utc_offset: self.utc_offset,
            level_cap_seconds: self.level_cap_seconds,
            by_interest: self.ledger.by_interest,
            ..Ledger::default()
        }
    }

    /// The level of `counter` (a key's too) at root time `now`, as this
    /// root knows it.
    pub fn counter_level(&self, counter: crate::wire::CounterKey, now: Nanos) -> Option<f64> {
        Some(self.ledger.counters.view_counter(counter, now)?.level)
    }

    /// Counts the bytes of `response` to `request` in the binary
    /// encoding, and of a reply of the same named counters carrying each
    /// key the asking host holds of this root's group (every key it sent
    /// deltas for so far) once: its own counters, as if each changed.
    fn count_bytes(&mut self, request: &SyncRequest, response: &SyncResponse) {
        use crate::wire::binary::encode_response;
        use crate::wire::{CounterKey, KeyValue, KeyedValues, RefusedKeys};
        let size = |r: &SyncResponse| encode_response(r).map_or(0, |b| b.len() as u64);
        let (syncs, held) = self.held.entry(request.limiter.clone()).or_default();
        *syncs += 1;
        for group in &request.keyed {
            held.extend(group.deltas.iter().map(|d| CounterKey {
                id: group.id,
                key: d.0,
            }));
        }
        if *syncs < STEADY_SYNC {
            self.first_bytes += size(response);
            return;
        }
        self.steady_requests += 1;
        self.reply_bytes += size(response);
        // Values half a second old, as a changed key's typically is.
        let at = response.root_time.saturating_sub(500_000_000);
        let keyed = RefusedKeys::by_template(held.iter().copied().collect())
            .into_iter()
            .map(|g| KeyedValues {
                id: g.id,
                values: g.keys.iter().map(|&k| KeyValue(k, 1.0, at)).collect(),
                prev: Vec::new(),
            })
            .collect();
        let own = SyncResponse {
            keyed,
            ..response.clone()
        };
        self.own_bytes += size(&own);
    }

    /// The level of quota `id` at root time `now`, as this root knows it.
    pub fn level(&self, id: u64, now: Nanos) -> Option<f64> {
        Some(self.ledger.counters.view(id, now)?.level)
    }

    /// Applies a sync request at root time `now` and builds the answer, as
    /// the sync endpoint does.
    pub fn sync(&mut self, request: &SyncRequest, now: Nanos) -> SyncResponse {
        self.count_work(request);
        let started = std::time::Instant::now();
        let step = self.ledger.sync(request, self.instance, now, self.paging);
        self.clipped += step.clipped as u64;
        let response = step.into_response(self.instance, now, self.ledger.utc_offset);
        self.busy_ns += started.elapsed().as_nanos() as u64;
        let keyed: usize = response.keyed.iter().map(|k| k.values.len()).sum();
        self.replied += (response.counters.len() + keyed) as u64;
        self.count_bytes(request, &response);
        // As the real root's reload task does every second, a slice at a
        // time: drained keys are forgotten; and full allowances.
        self.ledger.counters.forget_drained(1000, now);
        // As the real root's lease task: in-flight slots of limiters not
        // heard from for the lease go (nothing to do without any).
        self.ledger.expire_leases(now);
        if now.saturating_sub(self.swept_at) >= 1_000_000_000 {
            self.ledger.counters.forget_refilled(now);
            self.ledger.counters.forget_idle_interest(now);
            self.swept_at = now;
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CounterDelta, QuotaCursor};

    const SEC: Nanos = 1_000_000_000;

    fn quotas() -> Vec<Quota> {
        vec![Quota::new(1, "q", 10.0, 100.0, 100.0)]
    }

    fn request(instance: u64, version: u64, delta: u64) -> SyncRequest {
        SyncRequest {
            keyed: Vec::new(),
            rejected: Vec::new(),
            limiter: "h".into(),
            quotas_after: QuotaCursor::default(),
            counter_version: version,
            root_instance: instance,
            deltas: if delta > 0 {
                vec![CounterDelta {
                    id: 1,
                    delta,
                    window: None,
                }]
            } else {
                vec![]
            },
            ..Default::default()
        }
    }

    #[test]
    fn deltas_add_with_the_leak_and_come_back_as_changed_counters() {
        let mut r = SimRoot::new(&quotas(), 7, 0, 0);
        let a = r.sync(&request(0, 0, 50), SEC);
        assert_eq!(a.quotas.len(), 1);
        assert_eq!(a.counters[0].level, 50.0);
        // One second later 10 leaked: 40 + 30.
        let b = r.sync(&request(7, a.counter_version, 30), 2 * SEC);
        assert_eq!((b.counters[0].level, b.counters[0].at), (70.0, 2 * SEC));
        // Nothing changed since: nothing sent.
        let c = r.sync(&request(7, b.counter_version, 0), 3 * SEC);
        assert!(c.counters.is_empty());
        assert_eq!(r.level(1, 3 * SEC), Some(60.0));
    }

    #[test]
    fn a_restarted_root_is_empty_and_answers_old_versions_in_full() {
        let mut r = SimRoot::new(&quotas(), 7, 0, 0);
        let a = r.sync(&request(0, 0, 50), SEC);
        r.kill();
        r.restart(8, SEC);
        assert_eq!(r.level(1, SEC), None);
        let b = r.sync(&request(7, a.counter_version, 5), 2 * SEC);
        assert_eq!(b.root_instance, 8);
        assert_eq!(b.counters[0].level, 5.0);
    }
}
