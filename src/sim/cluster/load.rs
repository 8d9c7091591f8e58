//! The offered load: each second's arrivals of every load (Poisson or
//! uniform, over all hosts or a share of them, skewed or even), the keys
//! of keyed loads, and each arrival checked by its host and by the ideal
//! limiter.

use super::hosts::Host;
use super::queue::Event;
use super::{millis, Sim, SEC};
use crate::core::rng::Rng;
use crate::core::Nanos;
use crate::sim::scenario::{Arrivals, LoadSpec};
use crate::table::{CheckItem, CheckOptions, Outcome};

/// How a keyed load picks each request's key.
pub(super) struct LoadKeys {
    /// Keys to draw from (0: every request a new key).
    pub(super) count: u64,
    /// Cumulative Zipf weights of keys 1..=count (`None`: uniform).
    pub(super) cdf: Option<Vec<f64>>,
    /// The next one-off key.
    pub(super) next_one_off: u64,
    /// Index of the load's per-key record in the series, if tracked.
    pub(super) tracked: Option<usize>,
    /// Each host draws from its own run of this many keys
    /// ([`crate::sim::scenario::KeysSpec::per_host`]), and the hosts.
    pub(super) per_host: Option<(u64, u64)>,
}

impl LoadKeys {
    /// The rank (1..) of the next request's key at `host`.
    pub(super) fn pick(&mut self, rng: &mut Rng, host: usize) -> u64 {
        if self.count == 0 {
            self.next_one_off += 1;
            return self.next_one_off;
        }
        if let Some((run, hosts)) = self.per_host {
            // The host's run of keys, uniform in it.
            let start = host as u64 * self.count / hosts.max(1);
            return 1 + (start + rng.next_u64() % run) % self.count;
        }
        match &self.cdf {
            Some(cdf) => {
                let u = rng.next_unit() * cdf[cdf.len() - 1];
                cdf.partition_point(|&c| c < u) as u64 + 1
            }
            None => 1 + rng.next_u64() % self.count,
        }
    }
}

impl Sim<'_> {
    /// Quota `q`'s allowance per second: its limit, or for a window quota
    /// its limit spread over its window.
    pub(super) fn per_second(&self, q: usize) -> f64 {
        let quota = &self.quotas[q];
        match quota.window {
            Some(w) => quota.limit / (w.length(w.index(0)) as f64 * 1e-9),
            None => quota.limit,
        }
    }

    pub(super) fn rate(&self, load: &LoadSpec, quota: usize, sec: usize) -> f64 {
        let phase = load.phases.iter().rev().find(|p| p.at <= sec as f64);
        match phase {
            Some(p) => match (p.x, p.rate) {
                (Some(x), _) => {
                    let per_request = load.charge.map_or(load.weight as f64, |c| c.mean_cost());
                    x * self.per_second(quota) / per_request
                }
                (None, Some(r)) => r,
                (None, None) => 0.0,
            },
            None => 0.0,
        }
    }

    /// Schedules second `sec`'s arrivals of every load.
    pub(super) fn generate(&mut self, sec: usize, now: Nanos) {
        let live = self.live_hosts();
        if live.is_empty() {
            return;
        }
        for (li, load) in self.checked.scenario.load.iter().enumerate() {
            let rate = self.rate(load, self.load_quota[li], sec);
            if rate <= 0.0 {
                continue;
            }
            // Receiving hosts: all, or a fresh random subset.
            let mut hosts = live.clone();
            if load.active_fraction < 1.0 {
                let k = ((load.active_fraction * hosts.len() as f64).round() as usize).max(1);
                for i in 0..k {
                    let j = i + (self.load_rng.next_u64() % (hosts.len() - i) as u64) as usize;
                    hosts.swap(i, j);
                }
                hosts.truncate(k);
            }
            let n = hosts.len();
            let (hot, hot_share) = match &load.skew {
                Some(skew) => {
                    let hot = ((skew.hosts * n as f64).round() as usize).clamp(1, n);
                    (hot, skew.share)
                }
                None => (n, 1.0),
            };
            for (k, &h) in hosts.iter().enumerate() {
                let share = if k < hot {
                    hot_share / hot as f64
                } else {
                    (1.0 - hot_share) / (n - hot) as f64
                };
                self.arrivals(li, load.arrivals, h, rate * share, now);
            }
        }
    }

    pub(super) fn arrivals(
        &mut self,
        load: usize,
        arrivals: Arrivals,
        host: usize,
        rate: f64,
        start: Nanos,
    ) {
        if rate <= 0.0 {
            return;
        }
        match arrivals {
            Arrivals::Poisson => {
                let mut t = 0.0;
                loop {
                    // Exponential gaps: -ln(U) / rate, U in (0, 1].
                    t += -(1.0 - self.load_rng.next_unit()).ln() / rate;
                    if t >= 1.0 {
                        break;
                    }
                    self.queue.push(
                        start + (t * SEC as f64) as Nanos,
                        Event::Arrival { host, load },
                    );
                }
            }
            Arrivals::Uniform => {
                let carry = self.carry.entry((load, host)).or_insert(0.0);
                let due = *carry + rate;
                let count = due.floor();
                *carry = due - count;
                let phase = self.load_rng.next_unit();
                for i in 0..count as u64 {
                    let t = (i as f64 + phase) / count;
                    self.queue.push(
                        start + (t * SEC as f64) as Nanos,
                        Event::Arrival { host, load },
                    );
                }
            }
        }
    }

    /// A request reaches a host: the host's table decides, and the ideal
    /// limiter decides the same request.
    pub(super) fn arrive(&mut self, host: usize, load: usize, now: Nanos) {
        let h = &mut self.hosts[host];
        if !h.alive {
            return;
        }
        let spec = &self.checked.scenario.load[load];
        if spec.charge.is_some() {
            self.arrive_charged(host, load, now);
            return;
        }
        let weight = spec.weight;
        let q = self.load_quota[load];
        let local = h.local(now);
        let rank = self.keys[load]
            .as_mut()
            .map(|k| k.pick(&mut self.key_rng, host));
        let key = key_bytes(load, rank);
        let item = CheckItem {
            name: self.quotas[q].name.as_bytes(),
            key: rank.map(|_| &key[..]),
            weight,
            max_wait: spec.pace.map(|p| millis(p.max_wait_ms)),
        };
        let Host { table, rng, .. } = h;
        let result = table
            .gate()
            .check_many(&[item], local, CheckOptions::default(), || rng.next_unit());
        let admitted = !matches!(result.outcome, Outcome::Reject(_));
        if let (true, Some([min, max])) = (admitted, spec.hold_seconds) {
            let seconds = min + (max - min) * self.load_rng.next_unit();
            let held = crate::table::HeldSlot {
                at: local,
                overflowed: result.overflow,
            };
            self.queue.push(
                now + (seconds * SEC as f64) as Nanos,
                Event::Release {
                    host,
                    load,
                    rank,
                    held,
                },
            );
            *self.held.entry((host, q)).or_default() += 1;
        }
        if admitted && spec.pace.is_some() {
            // The request acts once its wait is over.
            if let Some(bin) = self.series.bin_index(now + result.wait) {
                for &c in &self.chains[q] {
                    self.series.quotas[c].bins[bin].sent += weight;
                }
            }
        }
        let ideal = match rank {
            Some(rank) => self.ideal_check_key(q, (load, rank), weight as f64, now),
            None => self.ideal_check(q, weight as f64, now),
        };
        if let (Some(rank), Some(t)) = (rank, self.keys[load].as_ref().and_then(|k| k.tracked)) {
            let sec = (now / SEC) as usize;
            let keyed = &mut self.series.keyed[t];
            if let Some(cell) = keyed.offered[rank as usize - 1].get_mut(sec) {
                *cell += weight as u32;
                if admitted {
                    keyed.admitted[rank as usize - 1][sec] += weight as u32;
                }
            }
        }
        self.record(q, weight, admitted, ideal, now);
    }

    /// Records a request of `weight` to quota `q` at `now` in the series
    /// of its chain, and an admitted one in the true level.
    pub(super) fn record(
        &mut self,
        q: usize,
        weight: u64,
        admitted: bool,
        ideal: bool,
        now: Nanos,
    ) {
        let Some(bin) = self.series.bin_index(now) else {
            return;
        };
        for &c in &self.chains[q] {
            let series = &mut self.series.quotas[c];
            let b = &mut series.bins[bin];
            b.offered += weight;
            if admitted {
                b.admitted += weight;
                self.truth[c] = self.counting[c].add(self.truth[c], now, weight as f64);
                series.peak = series
                    .peak
                    .max(self.counting[c].current(self.truth[c], now));
            } else {
                b.rejected += weight;
            }
            if ideal {
                b.ideal += weight;
            }
        }
    }
}

/// The key a keyed load's request of rank `rank` carries: the load and
/// the rank, so that two loads never share keys.
pub(super) fn key_bytes(load: usize, rank: Option<u64>) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&(load as u32).to_le_bytes());
    key[4..].copy_from_slice(&rank.unwrap_or(0).to_le_bytes());
    key
}

impl Sim<'_> {
    /// A request of a holding load ends: its host gives the slot back,
    /// and the true level drops (a host that left gives nothing: its
    /// slots were taken off the truth when it left).
    pub(super) fn release(
        &mut self,
        host: usize,
        load: usize,
        rank: Option<u64>,
        held: crate::table::HeldSlot,
        now: Nanos,
    ) {
        let h = &self.hosts[host];
        if !h.alive {
            return;
        }
        let q = self.load_quota[load];
        let key = key_bytes(load, rank);
        let item = CheckItem {
            name: self.quotas[q].name.as_bytes(),
            key: rank.map(|_| &key[..]),
            weight: 1,
            max_wait: None,
        };
        h.table.gate().release(&item, held, h.local(now));
        if let Some(n) = self.held.get_mut(&(host, q)) {
            *n = n.saturating_sub(1);
        }
        self.give_back_truth(q, 1.0, now);
    }

    /// A host that left: the slots its running requests held are no
    /// longer truly held.
    pub(super) fn drop_held(&mut self, host: usize, now: Nanos) {
        for q in 0..self.quotas.len() {
            if let Some(n) = self.held.remove(&(host, q)) {
                self.give_back_truth(q, n as f64, now);
            }
        }
    }

    fn give_back_truth(&mut self, q: usize, units: f64, now: Nanos) {
        for &c in &self.chains[q] {
            self.truth[c] = self.counting[c].give_back_in(self.truth[c], None, now, units);
        }
    }
}
