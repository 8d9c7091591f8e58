//! The simulated fleet: hosts that each own a real [`Table`] and a real
//! [`SyncEngine`], simulated roots, a simulated network, and one event
//! queue in simulated time.
//!
//! Everything is driven by a single queue of timed events, ordered by time
//! and then by insertion, and every random number comes from generators
//! seeded from the scenario seed, so a run is a pure function of the
//! scenario, the seed and the mode. Nothing sleeps and no clock is read.
//!
//! Each host's clock is off by its own offset, and each root's by another;
//! the table and the engine only ever see the host's local time, and the
//! engine maps the roots' times through its measured offsets, as in
//! production.
//!
//! Beside the fleet the simulation keeps two references per quota:
//! the **true level** (every weight the fleet admitted, in one bucket, in
//! true time) and an **ideal limiter** (one central bucket deciding every
//! request with the same rule and no sync delay), which tells what part of
//! an error is the sync's and what part is the burst band's own.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::root::SimRoot;
use super::scenario::{Action, Arrivals, Checked, LoadSpec, Mode, MAX_TRACKED_KEYS};
use super::series::{KeyedSeries, LevelSample, Series};
use crate::core::decision::{check_chain, ChainVerdict};
use crate::core::estimate::{Estimator, Extrapolation};
use crate::core::rng::Rng;
use crate::core::QuotaSnapshot;
use crate::core::{Counting, Nanos, Quota, Tally};
use crate::sync::config::{default_timeout, horizon};
use crate::sync::engine::{Page, SyncEngine};
use crate::sync::link::OwedDeltas;
use crate::sync::{window_spread, window_wake, EarlySync};
use crate::table::{CheckItem, CheckOptions, Outcome, Table};
use crate::wire::{SyncRequest, SyncResponse};

const SEC: Nanos = 1_000_000_000;

/// Added to every simulated clock so that negative offsets stay positive.
const CLOCK_BASE: Nanos = 10_000 * SEC;

/// Largest root clock offset from true time (roots are separate machines
/// with their own monotonic clocks).
const ROOT_CLOCK_SPREAD: Nanos = 600 * SEC;

/// How a run is set up beyond the scenario.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Seed of every random choice.
    pub seed: u64,
    /// Extrapolation mode of every host.
    pub mode: Mode,
}

/// Runs a scenario and returns what it recorded.
pub fn simulate(checked: &Checked, options: RunOptions) -> Series {
    let mut sim = Sim::new(checked, options);
    sim.run();
    for h in &sim.hosts {
        let stats = h.table.key_stats();
        sim.series.key_overflows += stats.overflows;
        sim.series.key_inserts += stats.inserts;
    }
    sim.series.deltas_clipped = sim.roots.iter().map(|r| r.clipped).sum();
    sim.series.root_work = sim
        .roots
        .iter()
        .map(|r| super::series::RootWork {
            group: r.group.0,
            received: r.received,
            foreign: r.foreign,
            requests: r.requests,
            replied: r.replied,
        })
        .collect();
    sim.series
}

/// How a keyed load picks each request's key.
struct LoadKeys {
    /// Keys to draw from (0: every request a new key).
    count: u64,
    /// Cumulative Zipf weights of keys 1..=count (`None`: uniform).
    cdf: Option<Vec<f64>>,
    /// The next one-off key.
    next_one_off: u64,
    /// Index of the load's per-key record in the series, if tracked.
    tracked: Option<usize>,
}

impl LoadKeys {
    /// The rank (1..) of the next request's key.
    fn pick(&mut self, rng: &mut Rng) -> u64 {
        if self.count == 0 {
            self.next_one_off += 1;
            return self.next_one_off;
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

/// An event in the queue.
#[derive(Debug)]
enum Event {
    /// Generate second `s`'s arrivals.
    Second(usize),
    /// A request reaches a host.
    Arrival { host: usize, load: usize },
    /// A host starts a sync cycle (or, without roots, folds locally);
    /// ignored unless `seq` is the host's latest (an early cycle moved it).
    Tick { host: usize, seq: u64 },
    /// A host with early sync looks at its unsent deltas.
    Probe { host: usize },
    /// A sync request reaches its root.
    AtRoot { exchange: u64 },
    /// A root's reply (or its host's refusal) reaches the limiter host.
    AtHost { exchange: u64 },
    /// A host gives up waiting for a reply.
    Timeout { exchange: u64 },
    /// A scenario event (index into the scenario's list).
    Scenario(usize),
    /// Sample levels at the end of second `s`.
    Sample(usize),
}

struct Entry {
    at: Nanos,
    seq: u64,
    event: Event,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed, so the max-heap pops the earliest (then oldest) entry.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// One limiter host.
struct Host {
    /// The quota table, exactly as nginx or the C ABI hold it.
    table: Table,
    /// The sync logic the real sync thread runs.
    engine: SyncEngine,
    /// The host's decision draws.
    rng: Rng,
    /// Local clock minus true time (plus [`CLOCK_BASE`]).
    clock_offset: i64,
    /// This host's sync interval.
    interval: Nanos,
    /// False once it left the fleet.
    alive: bool,
    /// A sync cycle is open (ended by the next tick).
    in_cycle: bool,
    /// Sequence number of the next regular tick.
    tick_seq: u64,
}

impl Host {
    fn local(&self, now: Nanos) -> Nanos {
        (CLOCK_BASE + now).saturating_add_signed(self.clock_offset)
    }
}

/// A sync exchange between a host and a root.
struct Exchange {
    host: usize,
    root: usize,
    request: SyncRequest,
    owed: OwedDeltas,
    /// Host local time the request left.
    sent_at: Nanos,
    /// The root's reply, once it answered (`None` at the host: refused).
    reply: Option<SyncResponse>,
}

struct Sim<'a> {
    checked: &'a Checked,
    options: RunOptions,
    quotas: Vec<Quota>,
    /// Quota indices of each quota's chain, itself first.
    chains: Vec<Vec<usize>>,
    /// Load index to quota index.
    load_quota: Vec<usize>,
    queue: BinaryHeap<Entry>,
    seq: u64,
    hosts: Vec<Host>,
    roots: Vec<SimRoot>,
    root_offsets: Vec<i64>,
    exchanges: HashMap<u64, Exchange>,
    next_exchange: u64,
    /// Generators, one per concern, so that one concern's draws do not
    /// shift another's.
    load_rng: Rng,
    net_rng: Rng,
    ideal_rng: Rng,
    /// Carry of fractional requests per (load, host), uniform arrivals.
    carry: HashMap<(usize, usize), f64>,
    /// How each quota counts, in simulation time (which is UTC).
    counting: Vec<Counting>,
    truth: Vec<Tally>,
    ideal: Vec<Tally>,
    /// Per load: how its requests pick keys (keyed loads only).
    keys: Vec<Option<LoadKeys>>,
    /// The ideal limiter's buckets of keys, by (load, rank).
    ideal_keys: HashMap<(usize, u64), Tally>,
    key_rng: Rng,
    estimator: Estimator,
    end: Nanos,
    series: Series,
}

/// A generator seeded from the run seed and a stream number.
fn stream(seed: u64, n: u64) -> Rng {
    let mut r = Rng::new(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    r.next_u64();
    Rng::new(r.next_u64())
}

fn millis(ms: f64) -> Nanos {
    (ms * 1e6).round() as Nanos
}

impl<'a> Sim<'a> {
    fn new(checked: &'a Checked, options: RunOptions) -> Self {
        let s = &checked.scenario;
        let quotas = checked.quotas.clone();
        let index_of = |id: u64| quotas.iter().position(|q| q.id == id);
        let chains = (0..quotas.len())
            .map(|i| {
                let (mut chain, mut cur) = (vec![i], i);
                while let Some(p) = quotas[cur].parent.and_then(index_of) {
                    chain.push(p);
                    cur = p;
                }
                chain
            })
            .collect();
        let load_quota = s
            .load
            .iter()
            .map(|l| checked.quota_index(&l.quota).unwrap_or(0))
            .collect();
        let mut net_rng = stream(options.seed, 2);
        let root_offsets: Vec<i64> = (0..s.roots)
            .map(|_| (net_rng.next_unit() * 2.0 - 1.0) * ROOT_CLOCK_SPREAD as f64)
            .map(|o| o as i64)
            .collect();
        // The roots' level cap covers the longest reservation wait, as an
        // operator sets `level_cap_seconds` for a fleet that paces.
        let longest_wait = s
            .load
            .iter()
            .filter_map(|l| l.pace.map(|p| p.max_wait_ms / 1e3))
            .fold(crate::root::trust::DEFAULT_CAP_SECONDS, f64::max);
        let groups = s
            .root_groups
            .iter()
            .map(|&g| g as usize + 1)
            .max()
            .unwrap_or(1);
        let roots = (0..if s.local_limits { 0 } else { s.roots })
            .map(|r| {
                let started = CLOCK_BASE.saturating_add_signed(root_offsets[r]);
                // Root time 0 is the simulation's (UTC) time 0.
                let utc_offset = -(started as i64);
                let mut root = SimRoot::new(&quotas, net_rng.next_u64() | 1, started, utc_offset)
                    .with_level_cap_seconds(longest_wait);
                root.group = (s.root_groups.get(r).map_or(0, |&g| g as usize), groups);
                root
            })
            .collect();
        let interval = millis(s.sync.interval_ms);
        let estimator = Estimator {
            mode: match (s.local_limits, options.mode) {
                // Alone, a host has no others to extrapolate: its fill
                // rate is never measured and stays 0 in adaptive mode.
                (true, _) | (false, Mode::Adaptive) => Extrapolation::Adaptive,
                (false, Mode::ConstantRatio) => Extrapolation::ConstantRatio { ratio: s.ratio },
            },
            horizon: horizon(std::time::Duration::from_nanos(interval)),
        };
        let seconds = s.duration.ceil() as usize;
        let mut series = Series::new(seconds, &quotas);
        let keys = s
            .load
            .iter()
            .enumerate()
            .map(|(li, load)| {
                let spec = load.keys.as_ref()?;
                let count = spec.count.unwrap_or(0);
                let cdf = (count > 0 && spec.zipf > 0.0).then(|| {
                    let mut sum = 0.0;
                    (1..=count)
                        .map(|k| {
                            sum += (k as f64).powf(-spec.zipf);
                            sum
                        })
                        .collect()
                });
                let tracked = (count > 0 && count <= MAX_TRACKED_KEYS).then(|| {
                    series.keyed.push(KeyedSeries {
                        load: li,
                        quota: checked.quota_index(&load.quota).unwrap_or(0),
                        offered: vec![vec![0; seconds]; count as usize],
                        admitted: vec![vec![0; seconds]; count as usize],
                    });
                    series.keyed.len() - 1
                });
                Some(LoadKeys {
                    count,
                    cdf,
                    next_one_off: 0,
                    tracked,
                })
            })
            .collect();
        let n = quotas.len();
        let counting = quotas
            .iter()
            .map(|q| Counting::of(q.limit, q.window_rule(0)))
            .collect();
        Sim {
            checked,
            options,
            quotas,
            chains,
            load_quota,
            queue: BinaryHeap::new(),
            seq: 0,
            hosts: Vec::new(),
            roots,
            root_offsets,
            exchanges: HashMap::new(),
            next_exchange: 0,
            load_rng: stream(options.seed, 1),
            net_rng,
            ideal_rng: stream(options.seed, 3),
            carry: HashMap::new(),
            counting,
            truth: vec![Tally::default(); n],
            ideal: vec![Tally::default(); n],
            keys,
            ideal_keys: HashMap::new(),
            key_rng: stream(options.seed, 4),
            estimator,
            end: (s.duration * SEC as f64).round() as Nanos,
            series,
        }
    }

    fn push(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.queue.push(Entry {
            at,
            seq: self.seq,
            event,
        });
    }

    fn run(&mut self) {
        let s = &self.checked.scenario;
        for _ in 0..s.hosts.count {
            self.add_host(0);
        }
        for (i, e) in s.events.iter().enumerate() {
            self.push((e.at * SEC as f64).round() as Nanos, Event::Scenario(i));
        }
        for sec in 0..self.series.seconds {
            self.push(sec as Nanos * SEC, Event::Second(sec));
            self.push((sec as Nanos + 1) * SEC, Event::Sample(sec));
        }
        while let Some(Entry { at, event, .. }) = self.queue.pop() {
            if at > self.end {
                break;
            }
            match event {
                Event::Second(sec) => self.generate(sec, at),
                Event::Arrival { host, load } => self.arrive(host, load, at),
                Event::Tick { host, seq } => {
                    if self.hosts[host].tick_seq == seq {
                        self.tick(host, at);
                    }
                }
                Event::Probe { host } => self.probe(host, at),
                Event::AtRoot { exchange } => self.at_root(exchange, at),
                Event::AtHost { exchange } => self.at_host(exchange, at),
                Event::Timeout { exchange } => self.timeout(exchange, at),
                Event::Scenario(i) => self.scenario_event(i, at),
                Event::Sample(sec) => self.sample(sec, at),
            }
        }
    }

    // ---- hosts ------------------------------------------------------------

    fn add_host(&mut self, now: Nanos) {
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
        table.apply_quotas(&quotas);
        table.set_estimator(self.estimator);
        // The host's own idea of UTC until a root tells it (exact here).
        table.set_utc_offset(-((CLOCK_BASE as i64) + clock_offset));
        let urls: Vec<String> = (0..self.roots.len())
            .map(|r| format!("sim://root{r}"))
            .collect();
        let local = (CLOCK_BASE + now).saturating_add_signed(clock_offset);
        let host = Host {
            table,
            engine: SyncEngine::new(&urls, format!("host{i}"), interval, 1_000_000, local),
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
        self.push(first, Event::Tick { host: i, seq: 0 });
        if let Some(early) = self.early_sync() {
            self.hosts[i].engine.set_early_sync(Some(early));
            self.push(first, Event::Probe { host: i });
        }
    }

    fn live_hosts(&self) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|&h| self.hosts[h].alive)
            .collect()
    }

    // ---- load -------------------------------------------------------------

    /// Quota `q`'s allowance per second: its limit, or for a window quota
    /// its limit spread over its window.
    fn per_second(&self, q: usize) -> f64 {
        let quota = &self.quotas[q];
        match quota.window {
            Some(w) => quota.limit / (w.length(w.index(0)) as f64 * 1e-9),
            None => quota.limit,
        }
    }

    fn rate(&self, load: &LoadSpec, quota: usize, sec: usize) -> f64 {
        let phase = load.phases.iter().rev().find(|p| p.at <= sec as f64);
        match phase {
            Some(p) => match (p.x, p.rate) {
                (Some(x), _) => x * self.per_second(quota) / load.weight as f64,
                (None, Some(r)) => r,
                (None, None) => 0.0,
            },
            None => 0.0,
        }
    }

    /// Schedules second `sec`'s arrivals of every load.
    fn generate(&mut self, sec: usize, now: Nanos) {
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

    fn arrivals(&mut self, load: usize, arrivals: Arrivals, host: usize, rate: f64, start: Nanos) {
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
                    self.push(
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
                    self.push(
                        start + (t * SEC as f64) as Nanos,
                        Event::Arrival { host, load },
                    );
                }
            }
        }
    }

    /// A request reaches a host: the host's table decides, and the ideal
    /// limiter decides the same request.
    fn arrive(&mut self, host: usize, load: usize, now: Nanos) {
        let h = &mut self.hosts[host];
        if !h.alive {
            return;
        }
        let spec = &self.checked.scenario.load[load];
        let weight = spec.weight;
        let q = self.load_quota[load];
        let local = h.local(now);
        let rank = self.keys[load].as_mut().map(|k| k.pick(&mut self.key_rng));
        let mut key = [0u8; 12];
        key[..4].copy_from_slice(&(load as u32).to_le_bytes());
        key[4..].copy_from_slice(&rank.unwrap_or(0).to_le_bytes());
        let item = CheckItem {
            name: self.quotas[q].name.as_bytes(),
            key: rank.map(|_| &key[..]),
            weight,
            max_wait: spec.pace.map(|p| millis(p.max_wait_ms)),
        };
        let Host { table, rng, .. } = h;
        let result = table.check_many(&[item], local, CheckOptions::default(), || rng.next_unit());
        let admitted = !matches!(result.outcome, Outcome::Reject(_));
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
        let Some(bin) = self.series.bin_index(now) else {
            return;
        };
        for &c in &self.chains[q] {
            let b = &mut self.series.quotas[c].bins[bin];
            b.offered += weight;
            if admitted {
                b.admitted += weight;
                self.truth[c] = self.counting[c].add(self.truth[c], now, weight as f64);
            } else {
                b.rejected += weight;
            }
            if ideal {
                b.ideal += weight;
            }
        }
    }

    /// The ideal limiter's view of quota `c` (with the counter `tally`)
    /// at `now`.
    fn ideal_view(&self, c: usize, tally: Tally, now: Nanos) -> QuotaSnapshot {
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
    fn ideal_decide(&mut self, views: &[QuotaSnapshot], weight: f64, now: Nanos) -> bool {
        let rng = &mut self.ideal_rng;
        check_chain(views, weight, now, &Estimator::default(), || {
            rng.next_unit()
        }) == ChainVerdict::Pass
    }

    /// The ideal limiter for a key of the per-key quota `q`: one central
    /// counter per key with the template's numbers, under the template's
    /// parents' central counters.
    fn ideal_check_key(&mut self, q: usize, key: (usize, u64), weight: f64, now: Nanos) -> bool {
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
    fn ideal_check(&mut self, q: usize, weight: f64, now: Nanos) -> bool {
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

    // ---- sync -------------------------------------------------------------

    fn delay(&mut self) -> Nanos {
        let n = &self.checked.scenario.network;
        millis(n.latency_ms + n.jitter_ms * self.net_rng.next_unit())
    }

    fn lost(&mut self) -> bool {
        let loss = self.checked.scenario.network.loss;
        loss > 0.0 && self.net_rng.next_unit() < loss
    }

    fn root_time(&self, root: usize, now: Nanos) -> Nanos {
        (CLOCK_BASE + now).saturating_add_signed(self.root_offsets[root])
    }

    fn tick(&mut self, host: usize, now: Nanos) {
        if !self.hosts[host].alive {
            return;
        }
        if self.roots.is_empty() {
            // Standalone: the host is its own root.
            let h = &self.hosts[host];
            h.table.fold_local(h.local(now));
            self.schedule_tick(host, now);
            return;
        }
        // As the real loop: a cycle every interval (plus jitter), whatever
        // is still under way; the engine leaves out roots still busy.
        let h = &mut self.hosts[host];
        let local = h.local(now);
        if h.in_cycle {
            h.engine.end_cycle(&h.table, local);
        }
        h.in_cycle = true;
        let outgoing = h.engine.begin_cycle(&h.table, local);
        self.schedule_tick(host, now);
        let timeout = match self.checked.scenario.sync.timeout_ms {
            Some(ms) => millis(ms),
            None => default_timeout(std::time::Duration::from_nanos(self.hosts[host].interval))
                .as_nanos() as Nanos,
        };
        for out in outgoing {
            let id = self.next_exchange;
            self.next_exchange += 1;
            self.exchanges.insert(
                id,
                Exchange {
                    host,
                    root: out.root,
                    request: out.request,
                    owed: out.owed,
                    sent_at: local,
                    reply: None,
                },
            );
            if !self.lost() {
                let delay = self.delay();
                self.push(now + delay, Event::AtRoot { exchange: id });
            }
            self.push(now + timeout, Event::Timeout { exchange: id });
        }
    }

    fn at_root(&mut self, exchange: u64, now: Nanos) {
        let Some(ex) = self.exchanges.get(&exchange) else {
            return;
        };
        let root = ex.root;
        let root_now = self.root_time(root, now);
        // A killed root's host refuses the connection: the error comes
        // back after one round trip. (Silent drops are `network.loss`.)
        let reply = if self.roots[root].up {
            Some(self.roots[root].sync(&ex.request, root_now))
        } else {
            None
        };
        let refused = reply.is_none();
        if let Some(ex) = self.exchanges.get_mut(&exchange) {
            ex.reply = reply;
        }
        if refused || !self.lost() {
            let delay = self.delay();
            self.push(now + delay, Event::AtHost { exchange });
        }
    }

    /// The reply (or the refusal) reaches the host.
    fn at_host(&mut self, exchange: u64, now: Nanos) {
        // After the timeout the exchange is gone, as reqwest would have
        // dropped it.
        let Some(ex) = self.exchanges.remove(&exchange) else {
            return;
        };
        let h = &mut self.hosts[ex.host];
        if h.alive {
            let local = h.local(now);
            match ex.reply {
                Some(reply) => {
                    let page = Page {
                        sent_at: ex.sent_at,
                        received_at: local,
                        reply,
                    };
                    h.engine
                        .finish(&h.table, ex.root, ex.owed, &[page], None, local);
                }
                None => {
                    let error = Some("connection refused".to_string());
                    h.engine
                        .finish(&h.table, ex.root, ex.owed, &[], error, local);
                }
            }
        }
    }

    /// No reply in time: the request or the reply was lost.
    fn timeout(&mut self, exchange: u64, now: Nanos) {
        let Some(ex) = self.exchanges.remove(&exchange) else {
            return;
        };
        let h = &mut self.hosts[ex.host];
        if h.alive {
            let local = h.local(now);
            let error = Some("timed out".to_string());
            h.engine
                .finish(&h.table, ex.root, ex.owed, &[], error, local);
        }
    }

    fn schedule_tick(&mut self, host: usize, now: Nanos) {
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
        self.push(now + wait, Event::Tick { host, seq });
    }

    fn early_sync(&self) -> Option<EarlySync> {
        self.checked.scenario.sync.early_sync()
    }

    /// Early sync: starts a cycle now if the host's unsent deltas call for
    /// one (the regular tick then comes an interval later).
    fn probe(&mut self, host: usize, now: Nanos) {
        let h = &mut self.hosts[host];
        if !h.alive || self.roots.is_empty() {
            return;
        }
        let local = h.local(now);
        if h.engine.early_sync_due(&h.table, local) {
            self.tick(host, now);
        }
        if let Some(every) = self.hosts[host].engine.early_probe_every() {
            self.push(now + every, Event::Probe { host });
        }
    }

    // ---- scenario events and sampling --------------------------------------

    fn scenario_event(&mut self, i: usize, now: Nanos) {
        match self.checked.scenario.events[i].action {
            Action::KillRoot { root } => {
                if let Some(r) = self.roots.get_mut(root) {
                    r.kill();
                }
            }
            Action::RestartRoot { root } => {
                let instance = self.net_rng.next_u64() | 1;
                let root_now = self.root_time(root, now);
                if let Some(r) = self.roots.get_mut(root) {
                    if !r.up {
                        r.restart(instance, root_now);
                    }
                }
            }
            Action::HostsLeave { count } => {
                for h in self.live_hosts().into_iter().rev().take(count) {
                    self.hosts[h].alive = false;
                }
            }
            Action::HostsJoin { count } => {
                for _ in 0..count {
                    self.add_host(now);
                }
            }
        }
    }

    fn sample(&mut self, sec: usize, now: Nanos) {
        let live = self.live_hosts();
        self.series.hosts[sec] = live.len();
        self.series.roots_up[sec] = self.roots.iter().filter(|r| r.up).count();
        for (q, quota) in self.quotas.iter().enumerate() {
            let truth = self.counting[q].current(self.truth[q], now);
            let mut sample = LevelSample {
                truth,
                est_min: f64::INFINITY,
                est_max: 0.0,
                ..LevelSample::default()
            };
            for &h in &live {
                let host = &self.hosts[h];
                let Some(state) = host.table.quota(quota.name.as_bytes(), host.local(now)) else {
                    continue;
                };
                sample.est_mean += state.level;
                sample.est_min = sample.est_min.min(state.level);
                sample.est_max = sample.est_max.max(state.level);
                sample.est_error += (state.level - truth).abs();
            }
            if live.is_empty() {
                sample.est_min = 0.0;
            } else {
                sample.est_mean /= live.len() as f64;
                sample.est_error /= live.len() as f64;
            }
            self.series.quotas[q].levels[sec] = sample;
        }
    }
}
