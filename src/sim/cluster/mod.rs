//! The simulated fleet: hosts that each own a real
//! [`Table`](crate::table::Table) and a real
//! [`SyncEngine`](crate::sync::SyncEngine), simulated roots, a simulated network, and one event
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
//!
//! # Layout
//!
//! Its files, by concern: the event queue (`queue.rs`), the hosts and
//! their sync cycles' timing (`hosts.rs`), the network between hosts and
//! roots (`network.rs`), the ideal limiter (`ideal.rs`), the load
//! (`load.rs`) and requests charged when they end (`charges.rs`); this
//! file sets a run up, runs it and samples it.

mod charges;
mod hosts;
mod ideal;
mod load;
mod network;
mod queue;

use std::collections::HashMap;

use super::root::SimRoot;
use super::scenario::{Action, Checked, Mode, MAX_TRACKED_KEYS};
use super::series::{KeyedSeries, LevelSample, Series};
use crate::core::estimate::{Estimator, Extrapolation};
use crate::core::rng::Rng;
use crate::core::{Counting, Nanos, Quota, Tally};
use crate::sync::config::horizon;

use hosts::Host;
use load::LoadKeys;
use network::Exchange;
use queue::{Event, EventQueue};

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
            reply_bytes: r.reply_bytes,
            own_bytes: r.own_bytes,
            first_bytes: r.first_bytes,
            steady_requests: r.steady_requests,
            busy_ns: r.busy_ns,
        })
        .collect();
    sim.series
}

struct Sim<'a> {
    checked: &'a Checked,
    options: RunOptions,
    quotas: Vec<Quota>,
    /// Quota indices of each quota's chain, itself first.
    chains: Vec<Vec<usize>>,
    /// Load index to quota index.
    load_quota: Vec<usize>,
    queue: EventQueue,
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
    /// Slots held by requests still running, by (host, quota).
    held: HashMap<(usize, usize), u64>,
    /// Per load: how its requests pick keys (keyed loads only).
    keys: Vec<Option<LoadKeys>>,
    /// The ideal limiter's buckets of keys, by (load, rank).
    ideal_keys: HashMap<(usize, u64), Tally>,
    key_rng: Rng,
    /// Draws the costs and durations of charged requests.
    charge_rng: Rng,
    /// Charged requests in flight, by (load, key rank; 0 unkeyed).
    in_flight: HashMap<(usize, u64), u32>,
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
                root.set_interest(s.interest);
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
                    per_host: spec
                        .per_host
                        .map(|run| (run.clamp(1, count.max(1)), s.hosts.count as u64)),
                })
            })
            .collect();
        let n = quotas.len();
        let counting = quotas.iter().map(|q| q.counting(0)).collect();
        Sim {
            checked,
            options,
            quotas,
            chains,
            load_quota,
            queue: EventQueue::default(),
            hosts: Vec::new(),
            roots,
            root_offsets,
            exchanges: HashMap::new(),
            next_exchange: 0,
            load_rng: stream(options.seed, 1),
            net_rng,
            ideal_rng: stream(options.seed, 3),
            carry: HashMap::new(),
            held: HashMap::new(),
            counting,
            truth: vec![Tally::default(); n],
            ideal: vec![Tally::default(); n],
            keys,
            ideal_keys: HashMap::new(),
            key_rng: stream(options.seed, 4),
            charge_rng: stream(options.seed, 5),
            in_flight: HashMap::new(),
            estimator,
            end: (s.duration * SEC as f64).round() as Nanos,
            series,
        }
    }

    fn run(&mut self) {
        let s = &self.checked.scenario;
        for _ in 0..s.hosts.count {
            self.add_host(0);
        }
        for (i, e) in s.events.iter().enumerate() {
            self.queue
                .push((e.at * SEC as f64).round() as Nanos, Event::Scenario(i));
        }
        for sec in 0..self.series.seconds {
            self.queue.push(sec as Nanos * SEC, Event::Second(sec));
            self.queue
                .push((sec as Nanos + 1) * SEC, Event::Sample(sec));
        }
        while let Some((at, event)) = self.queue.pop() {
            if at > self.end {
                break;
            }
            match event {
                Event::Second(sec) => self.generate(sec, at),
                Event::Arrival { host, load } => self.arrive(host, load, at),
                Event::Done {
                    host,
                    load,
                    rank,
                    estimate,
                    cost,
                    charged_at,
                } => {
                    let done = charges::Done {
                        rank,
                        estimate,
                        cost,
                        charged_at,
                    };
                    self.done(host, load, done, at);
                }
                Event::Tick { host, seq } => {
                    if self.hosts[host].tick_seq == seq {
                        self.tick(host, at);
                    }
                }
                Event::Probe { host } => self.probe(host, at),
                Event::AtRoot { exchange } => self.at_root(exchange, at),
                Event::AtHost { exchange } => self.at_host(exchange, at),
                Event::Timeout { exchange } => self.timeout(exchange, at),
                Event::Release {
                    host,
                    load,
                    rank,
                    held,
                } => self.release(host, load, rank, held, at),
                Event::Scenario(i) => self.scenario_event(i, at),
                Event::Sample(sec) => self.sample(sec, at),
            }
        }
    }

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
                    // Its requests die with it: their slots are no longer
                    // truly held (the roots learn it by the lease).
                    self.drop_held(h, now);
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
            sample.root_max = (0..self.roots.len())
                .filter(|&r| self.roots[r].up)
                .filter_map(|r| self.roots[r].level(quota.id, self.root_time(r, now)))
                .fold(0.0, f64::max);
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
