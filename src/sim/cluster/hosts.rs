//! The simulated limiter hosts: each a real table and sync engine with a
//! clock of its own; joining the fleet, and when each starts its sync
//! cycles (regular ticks, window boundaries, early sync probes).

use super::queue::Event;
use super::{millis, stream, Sim, CLOCK_BASE};
use crate::core::rng::Rng;
use crate::core::{Nanos, Quota};
use crate::sync::engine::SyncEngine;
use crate::sync::{window_spread, window_wake, EarlySync};
use crate::table::Table;

/// One limiter host.
pub(super) struct Host {
    /// The quota table, exactly as nginx or the C ABI hold it.
    pub(super) table: Table,
    /// The sync logic the real sync thread runs.
    pub(super) engine: SyncEngine,
    /// The host's decision draws.
    pub(super) rng: Rng,
    /// Local clock minus true time (plus [`CLOCK_BASE`]).
    pub(super) clock_offset: i64,
    /// This host's sync interval.
    pub(super) interval: Nanos,
    /// False once it left the fleet.
    pub(super) alive: bool,
    /// A sync cycle is open (ended by the next tick).
    pub(super) in_cycle: bool,
    /// Sequence number of the next regular tick.
    pub(super) tick_seq: u64,
}

impl Host {
    pub(super) fn local(&self, now: Nanos) -> Nanos {
        (CLOCK_BASE + now).saturating_add_signed(self.clock_offset)
    }
}

impl Sim<'_> {
    pub(super) fn add_host(&mut self, now: Nanos) {
        let s = &self.checked.scenario;
        let i = self.hosts.len();
        let skew = millis(s.hosts.clock_skew_ms) as f64;
        let clock_offset = ((self.net_rng.next_unit() * 2.0 - 1.0) * skew) as i64;
        let spread = s.sync.interval_spread * (self.net_rng.next_unit() * 2.0 - 1.0);
        let interval = (millis(s.sync.interval_ms) as f64 * (1.0 + spread)).max(1e6) as Nanos;
        let table =
            Table::new_heap_with_keys((self.quotas.len() as u32 * 2).max(16), 16, s.hosts.keys);
        let quotas: Vec<Quota> = if s.local_limits {
            // Plain per-host limits: the cluster limit split evenly over
            // the fleet as configured.
            let n = s.hosts.count as f64;
            self.quotas
                .iter()
                .map(|q| Quota {
                    limit: q.limit / n,
                    low_burst: q.low_burst / n,
                    high_burst: q.high_burst / n,
                    ..q.clone()
                })
                .collect()
        } else {
            self.quotas.clone()
        };
        table.books().apply_quotas(&quotas);
        table.set_estimator(self.estimator);
        // The host's own idea of UTC until a root tells it (exact here).
        table.set_utc_offset(-((CLOCK_BASE as i64) + clock_offset));
        let urls: Vec<String> = (0..self.roots.len())
            .map(|r| format!("sim://root{r}"))
            .collect();
        let local = (CLOCK_BASE + now).saturating_add_signed(clock_offset);
        let mut engine = SyncEngine::new(&urls, format!("host{i}"), interval, 1_000_000, local);
        // Numbered requests' incarnations from the seed, not the system.
        engine.set_incarnation(self.options.seed.wrapping_mul(1_000_003) ^ (i as u64 + 1));
        let host = Host {
            table,
            engine,
            rng: stream(self.options.seed, 1000 + i as u64),
            clock_offset,
            interval,
            alive: true,
            in_cycle: false,
            tick_seq: 0,
        };
        self.hosts.push(host);
        if !self.checked.scenario.root_groups.is_empty() {
            let groups = self.checked.scenario.root_groups.clone();
            self.hosts[i].engine.set_groups(&groups);
        }
        // Hosts start at random points of their cycle, as a real fleet.
        let first = now + (self.net_rng.next_unit() * interval as f64) as Nanos;
        self.queue.push(first, Event::Tick { host: i, seq: 0 });
        if let Some(early) = self.early_sync() {
            self.hosts[i].engine.set_early_sync(Some(early));
            self.queue.push(first, Event::Probe { host: i });
        }
    }

    pub(super) fn live_hosts(&self) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|&h| self.hosts[h].alive)
            .collect()
    }

    pub(super) fn schedule_tick(&mut self, host: usize, now: Nanos) {
        let jitter = self.checked.scenario.sync.jitter;
        let interval = self.hosts[host].interval;
        let mut wait = interval + (interval as f64 * jitter * self.net_rng.next_unit()) as Nanos;
        // As the real loop: a cycle just after each window boundary.
        let h = &self.hosts[host];
        if let Some(ns) = window_wake(
            &h.table,
            h.local(now),
            window_spread(&format!("host{host}")),
        ) {
            wait = wait.min(ns);
        }
        let h = &mut self.hosts[host];
        h.tick_seq += 1;
        let seq = h.tick_seq;
        self.queue.push(now + wait, Event::Tick { host, seq });
    }

    pub(super) fn early_sync(&self) -> Option<EarlySync> {
        self.checked.scenario.sync.early_sync()
    }

    /// Early sync: starts a cycle now if the host's unsent deltas call for
    /// one (the regular tick then comes an interval later).
    pub(super) fn probe(&mut self, host: usize, now: Nanos) {
        let h = &mut self.hosts[host];
        if !h.alive || self.roots.is_empty() {
            return;
        }
        let local = h.local(now);
        if h.engine.early_sync_due(&h.table, local) {
            self.tick(host, now);
        }
        if let Some(every) = self.hosts[host].engine.early_probe_every() {
            self.queue.push(now + every, Event::Probe { host });
        }
    }
}
