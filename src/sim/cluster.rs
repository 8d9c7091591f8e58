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
use super::scenario::{Action, Arrivals, Checked, LoadSpec, Mode};
use super::series::{LevelSample, Series};
use crate::core::decision::{check_chain, ChainVerdict, QuotaView};
use crate::core::estimate::{Estimator, Extrapolation};
use crate::core::rng::Rng;
use crate::core::{Level, Nanos, Quota};
use crate::sync::engine::{EarlySync, Page, SyncEngine};
use crate::sync::link::OwedDeltas;
use crate::table::{Outcome, Table};
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
    sim.series
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
    truth: Vec<Level>,
    ideal: Vec<Level>,
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
        let roots = (0..if s.local_limits { 0 } else { s.roots })
            .map(|r| {
                let started = CLOCK_BASE.saturating_add_signed(root_offsets[r]);
                SimRoot::new(&quotas, net_rng.next_u64() | 1, started)
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
            horizon: 2 * interval,
        };
        let seconds = s.duration.ceil() as usize;
        let series = Series::new(seconds, &quotas);
        let n = quotas.len();
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
            truth: vec![Level::empty(0); n],
            ideal: vec![Level::empty(0); n],
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
        let table = Table::new_heap((self.quotas.len() as u32 * 2).max(16), 16);
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

    fn rate(&self, load: &LoadSpec, quota: usize, sec: usize) -> f64 {
        let phase = load.phases.iter().rev().find(|p| p.at <= sec as f64);
        match phase {
            Some(p) => match (p.x, p.rate) {
                (Some(x), _) => x * self.quotas[quota].limit / load.weight as f64,
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
        let Host { table, rng, .. } = h;
        let outcome = table.check_with(self.quotas[q].name.as_bytes(), weight, local, || {
            rng.next_unit()
        });
        let admitted = !matches!(outcome, Outcome::Reject(_));
        let ideal = self.ideal_check(q, weight as f64, now);
        let Some(bin) = self.series.bin_index(now) else {
            return;
        };
        for &c in &self.chains[q] {
            let b = &mut self.series.quotas[c].bins[bin];
            b.offered += weight;
            if admitted {
                b.admitted += weight;
                self.truth[c] = self.truth[c].add(self.quotas[c].limit, now, weight as f64);
            } else {
                b.rejected += weight;
            }
            if ideal {
                b.ideal += weight;
            }
        }
    }

    /// The ideal limiter: one central bucket per quota, known exactly.
    fn ideal_check(&mut self, q: usize, weight: f64, now: Nanos) -> bool {
        let views: Vec<QuotaView> = self.chains[q]
            .iter()
            .map(|&c| {
                let quota = &self.quotas[c];
                QuotaView {
                    limit: quota.limit,
                    low_burst: quota.low_burst,
                    high_burst: quota.high_burst,
                    known: self.ideal[c].leaked(quota.limit, now),
                    fill_rate: 0.0,
                    own_recent: 0.0,
                }
            })
            .collect();
        let rng = &mut self.ideal_rng;
        let verdict = check_chain(&views, weight, now, &Estimator::default(), || {
            rng.next_unit()
        });
        if verdict != ChainVerdict::Pass {
            return false;
        }
        for &c in &self.chains[q] {
            self.ideal[c] = self.ideal[c].add(self.quotas[c].limit, now, weight);
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
            None => self.hosts[host].interval * 4 / 5,
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
        let wait = interval + (interval as f64 * jitter * self.net_rng.next_unit()) as Nanos;
        let h = &mut self.hosts[host];
        h.tick_seq += 1;
        let seq = h.tick_seq;
        self.push(now + wait, Event::Tick { host, seq });
    }

    fn early_sync(&self) -> Option<EarlySync> {
        let sync = &self.checked.scenario.sync;
        sync.early_fraction.map(|fraction| EarlySync {
            fraction,
            max_per_second: sync.early_max_per_sec,
        })
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
            let truth = self.truth[q].leaked(quota.limit, now).level;
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
