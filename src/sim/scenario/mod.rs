//! Scenario files: the fleet, the network, the quotas, the load, the
//! failures, and what to measure, in TOML.
//!
//! ```toml
//! name = "steady"
//! duration = 60                  # simulated seconds
//! hosts = { count = 50, clock_skew_ms = 20 }
//! sync = { interval_ms = 1000, jitter = 0.1 }  # early_fraction = 0.02,
//!                                # early_max_per_sec = 4: early sync
//! network = { latency_ms = 1.0, jitter_ms = 0.5, loss = 0.0 }
//! roots = 1
//!
//! [[quotas]]                     # the same shape as a quota file
//! name = "q"
//! limit = 1000
//! low_burst = 500
//! high_burst = 1500
//!
//! [[load]]
//! quota = "q"
//! phases = [{ at = 0, x = 2.0 }] # offered rate: 2x the quota's limit
//!
//! [[events]]
//! at = 20
//! action = "kill_root"
//! root = 0
//!
//! [[report]]
//! metric = "admitted_ratio"
//! quota = "q"
//! from = 10
//! to = 60
//! min = 0.95
//! max = 1.05
//! ```

use std::time::Duration;

use serde::Deserialize;

use crate::core::spec::{QuotaSet, QuotaSpec};
use crate::core::{Extrapolation, Quota};
use crate::sync::{EarlySync, SyncConfig};

mod load;

pub use load::{
    Arrivals, ChargeSpec, KeysSpec, LoadSpec, PaceSpec, PhaseSpec, SkewSpec, MAX_TRACKED_KEYS,
};

/// A whole simulation, as read from a scenario file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in tables and file names.
    pub name: String,
    /// One line for humans: what the scenario shows.
    #[serde(default)]
    pub description: String,
    /// Simulated seconds (whole).
    pub duration: f64,
    /// Default seed (the command line may override it).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Default extrapolation mode (the command line may override it).
    #[serde(default)]
    pub mode: Mode,
    /// `correction_ratio` of the constant-ratio mode.
    #[serde(default = "default_ratio")]
    pub ratio: f64,
    /// The limiter hosts.
    pub hosts: HostsSpec,
    /// How the hosts sync.
    #[serde(default)]
    pub sync: SyncSpec,
    /// The links between hosts and roots.
    #[serde(default)]
    pub network: NetworkSpec,
    /// Number of quota roots.
    #[serde(default = "default_roots")]
    pub roots: usize,
    /// The root group (shard) of each root, as `SyncConfig::root_groups`
    /// (empty: one group).
    #[serde(default)]
    pub root_groups: Vec<u32>,
    /// The roots answer by interest (default): each host gets only the
    /// keys' counters it holds. False: every changed counter, as roots
    /// before interest (to measure what interest saves in one run).
    #[serde(default = "default_true")]
    pub interest: bool,
    /// Every quota and load is repeated this many times (default 1): copy
    /// `i` of quota `name` is `name-i` (copy 0 keeps the name, so reports
    /// measure it), its load and its parent renamed alike. Many quotas
    /// under one load shape without a file of thousands of entries.
    #[serde(default = "default_copies")]
    pub copies: usize,
    /// No roots: every host limits alone with `limit / hosts.count` (and
    /// bursts scaled the same way), as plain nginx `limit_req` does.
    #[serde(default)]
    pub local_limits: bool,
    /// The quotas, as in a quota file.
    pub quotas: Vec<QuotaSpec>,
    /// Offered load, one entry per quota under load.
    pub load: Vec<LoadSpec>,
    /// Failures and fleet changes.
    #[serde(default)]
    pub events: Vec<EventSpec>,
    /// What to measure, with targets.
    #[serde(default)]
    pub report: Vec<ReportSpec>,
}

fn default_seed() -> u64 {
    1
}

fn default_ratio() -> f64 {
    1.0
}

fn default_roots() -> usize {
    1
}

fn default_copies() -> usize {
    1
}

/// The name of copy `i` of `name` (see [`Scenario::copies`]).
pub fn copy_name(name: &str, i: usize) -> String {
    if i == 0 {
        name.to_string()
    } else {
        format!("{name}-{i}")
    }
}

/// Repeats the quotas and loads `copies` times.
fn expand_copies(mut s: Scenario) -> Scenario {
    if s.copies <= 1 {
        return s;
    }
    let copies = s.copies;
    s.quotas = (0..copies)
        .flat_map(|i| {
            s.quotas.iter().map(move |q| QuotaSpec {
                name: copy_name(&q.name, i),
                parent: q.parent.as_ref().map(|p| copy_name(p, i)),
                ..q.clone()
            })
        })
        .collect();
    s.load = (0..copies)
        .flat_map(|i| {
            s.load.iter().map(move |l| LoadSpec {
                quota: copy_name(&l.quota, i),
                ..l.clone()
            })
        })
        .collect();
    s
}

/// How the hosts extrapolate the others' fill between syncs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[derive(clap::ValueEnum)]
pub enum Mode {
    /// The measured fill rate of the others.
    #[default]
    Adaptive,
    /// A constant share of the limit (YARL's `correction_ratio`).
    #[value(name = "constant_ratio", alias = "constant-ratio")]
    ConstantRatio,
}

impl Mode {
    /// Both modes, in the order tables list them.
    pub const ALL: [Mode; 2] = [Mode::Adaptive, Mode::ConstantRatio];

    /// The name used in files and tables.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Adaptive => "adaptive",
            Mode::ConstantRatio => "constant_ratio",
        }
    }
}

/// The limiter hosts.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostsSpec {
    /// Hosts at the start.
    pub count: usize,
    /// Each host's clock is off by a uniform amount in `±clock_skew_ms`.
    #[serde(default)]
    pub clock_skew_ms: f64,
    /// Keys of per-key quotas each host's table holds.
    #[serde(default = "default_host_keys")]
    pub keys: u64,
}

fn default_true() -> bool {
    true
}

fn default_host_keys() -> u64 {
    100_000
}

/// How the hosts sync.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncSpec {
    /// Nominal time between syncs.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: f64,
    /// Each host's own interval is uniform in `interval * (1 ± spread)`.
    #[serde(default)]
    pub interval_spread: f64,
    /// Each cycle waits up to `jitter * interval` more (the real loop: 0.1).
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// Request timeout (default: 80% of the interval, as the real loop).
    #[serde(default)]
    pub timeout_ms: Option<f64>,
    /// Early sync: share of a quota's burst band its unsent local delta
    /// must reach (off when absent).
    #[serde(default)]
    pub early_fraction: Option<f64>,
    /// Early sync: most early cycles per host and second.
    #[serde(default = "default_early_max")]
    pub early_max_per_sec: f64,
}

fn default_early_max() -> f64 {
    4.0
}

fn default_interval_ms() -> f64 {
    1000.0
}

fn default_jitter() -> f64 {
    0.1
}

impl SyncSpec {
    /// Early sync as the hosts run it, if on.
    pub fn early_sync(&self) -> Option<EarlySync> {
        self.early_fraction.map(|fraction| EarlySync {
            fraction,
            max_per_second: self.early_max_per_sec,
        })
    }

    /// The nominal sync configuration: what a real limiter would be given
    /// (each host's own interval spreads around it), checked by the same
    /// rules as nginx's and the C ABI's.
    pub fn config(&self) -> Result<SyncConfig, String> {
        let ms = |v: f64| Duration::try_from_secs_f64(v / 1000.0).map_err(|e| e.to_string());
        let config = SyncConfig {
            interval: ms(self.interval_ms).map_err(|e| format!("sync.interval_ms: {e}"))?,
            timeout: self
                .timeout_ms
                .map(ms)
                .transpose()
                .map_err(|e| format!("sync.timeout_ms: {e}"))?,
            early_sync: self.early_sync(),
            limiter_id: "host0".into(),
            ..SyncConfig::default()
        };
        config.validate().map_err(|e| format!("sync.{e}"))?;
        Ok(config)
    }
}

impl Default for SyncSpec {
    fn default() -> Self {
        Self {
            interval_ms: default_interval_ms(),
            interval_spread: 0.0,
            jitter: default_jitter(),
            timeout_ms: None,
            early_fraction: None,
            early_max_per_sec: default_early_max(),
        }
    }
}

/// One-way delays and loss on every host–root link.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Base one-way latency.
    #[serde(default = "default_latency_ms")]
    pub latency_ms: f64,
    /// Extra one-way delay, uniform in `[0, jitter_ms]`.
    #[serde(default = "default_net_jitter_ms")]
    pub jitter_ms: f64,
    /// Probability that a request or a reply is lost.
    #[serde(default)]
    pub loss: f64,
}

fn default_latency_ms() -> f64 {
    1.0
}

fn default_net_jitter_ms() -> f64 {
    0.5
}

impl Default for NetworkSpec {
    fn default() -> Self {
        Self {
            latency_ms: default_latency_ms(),
            jitter_ms: default_net_jitter_ms(),
            loss: 0.0,
        }
    }
}

/// Something that happens at a time.
#[derive(Clone, Debug, Deserialize)]
pub struct EventSpec {
    /// When, in seconds.
    pub at: f64,
    /// What.
    #[serde(flatten)]
    pub action: Action,
}

/// Failures and fleet changes.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// A root process stops: connections to it are refused, and its
    /// counters are gone.
    KillRoot {
        /// Root index.
        root: usize,
    },
    /// A killed root starts again, empty, as a new instance.
    RestartRoot {
        /// Root index.
        root: usize,
    },
    /// The newest `count` live hosts leave (weight they did not send yet
    /// is lost with them).
    HostsLeave {
        /// How many.
        count: usize,
    },
    /// `count` new hosts join with empty tables.
    HostsJoin {
        /// How many.
        count: usize,
    },
}

/// One number to report, with an optional target.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// What to measure.
    pub metric: Metric,
    /// Row label (default: derived from the metric).
    #[serde(default)]
    pub label: Option<String>,
    /// The quota measured (traffic naming it or any descendant).
    pub quota: String,
    /// Start of the measured span, seconds (default 0).
    #[serde(default)]
    pub from: Option<f64>,
    /// End of the measured span, seconds (default: the end).
    #[serde(default)]
    pub to: Option<f64>,
    /// Window length of `cv`, seconds.
    #[serde(default)]
    pub window: Option<f64>,
    /// Tolerance of `settle`, as a fraction of the limit (default 0.1).
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// Target: at least this.
    #[serde(default)]
    pub min: Option<f64>,
    /// Target: at most this.
    #[serde(default)]
    pub max: Option<f64>,
    /// Report the value minus the ideal limiter's (what distribution adds
    /// on the same requests); the ideal column then reads 0.
    #[serde(default)]
    pub beyond_ideal: bool,
    /// `key_admitted_ratio`: only keys offered at least this multiple of
    /// their limit (default 1: the keys over their limit).
    #[serde(default)]
    pub over: Option<f64>,
    /// `window_ratio`: how the windows' ratios are summed up (default
    /// the mean).
    #[serde(default)]
    pub aggregate: Aggregate,
    /// `window_ratio`: of the weight paced requests sent, instead of the
    /// weight admitted.
    #[serde(default)]
    pub sent: bool,
}

/// How `window_ratio` sums up its windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    /// Their mean.
    #[default]
    Mean,
    /// The lowest.
    Min,
    /// The highest.
    Max,
}

/// The measurements a report row can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Admitted weight over `limit * span`.
    AdmittedRatio,
    /// Admitted over offered weight.
    ServedRatio,
    /// Coefficient of variation of admitted weight per `window`.
    Cv,
    /// Seconds from `from` until the admitted rate over a one-second
    /// window first comes within `tolerance` of the limit.
    Settle,
    /// Seconds from `from` to the last rejection before `to`.
    ResidualRejections,
    /// Mean absolute error of the hosts' level estimates against the true
    /// cluster level, sampled once a second, over `high_burst`.
    LevelError,
    /// The tracked keys of a per-key quota offered at least `over` times
    /// their limit: admitted weight over `limit * span` of the key furthest
    /// from 1 (the targets then hold for every such key).
    KeyAdmittedRatio,
    /// Checks of keys that found no entry in their host's key section
    /// (the section full of live keys), summed over the hosts, over the
    /// whole run.
    KeyOverflows,
    /// Admitted (or, with `sent`, sent) weight per window over what the
    /// quota allows per window, for each window of `window` seconds (a
    /// window quota: its own windows, aligned to 0) in the span, summed up
    /// by `aggregate`.
    WindowRatio,
}

/// A scenario that parsed and makes sense.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The scenario as written.
    pub scenario: Scenario,
    /// The quotas as table quotas (ids `1..=n`, epoch 1).
    pub quotas: Vec<Quota>,
}

impl Checked {
    /// Index of the quota named `name`.
    pub fn quota_index(&self, name: &str) -> Option<usize> {
        self.quotas.iter().position(|q| q.name == name)
    }
}

/// Parses and checks a scenario.
pub fn parse(text: &str) -> Result<Checked, String> {
    let scenario: Scenario = toml::from_str(text).map_err(|e| e.to_string())?;
    check(scenario)
}

fn check(s: Scenario) -> Result<Checked, String> {
    if !(1..=100_000).contains(&s.copies) {
        return Err(format!("copies must be 1 to 100000, not {}", s.copies));
    }
    if !s.root_groups.is_empty() {
        if s.root_groups.len() != s.roots {
            return Err(format!(
                "root_groups: {} groups for {} roots",
                s.root_groups.len(),
                s.roots
            ));
        }
        crate::sync::config::validate_groups(&s.root_groups).map_err(|e| e.to_string())?;
    }
    let s = expand_copies(s);
    let set = QuotaSet::new(s.quotas.clone()).map_err(|e| e.to_string())?;
    let quotas = set.to_quotas(1);
    let checked = Checked {
        scenario: s,
        quotas,
    };
    let s = &checked.scenario;
    let positive = |what: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(format!("{what} must be a positive number, not {v}"))
        }
    };
    let fraction = |what: &str, v: f64| {
        if (0.0..=1.0).contains(&v) {
            Ok(())
        } else {
            Err(format!("{what} must be in [0, 1], not {v}"))
        }
    };
    positive("duration", s.duration)?;
    if s.duration.fract() != 0.0 {
        return Err("duration: whole seconds".into());
    }
    if s.duration > 24.0 * 3600.0 {
        return Err("duration: at most a day".into());
    }
    if s.hosts.count == 0 {
        return Err("hosts.count must be at least 1".into());
    }
    s.sync.config()?;
    fraction("sync.interval_spread", s.sync.interval_spread)?;
    fraction("sync.jitter", s.sync.jitter)?;
    if !(s.network.latency_ms >= 0.0 && s.network.jitter_ms >= 0.0) {
        return Err("network: latency_ms and jitter_ms must not be negative".into());
    }
    fraction("network.loss", s.network.loss)?;
    if !(s.hosts.clock_skew_ms >= 0.0 && s.hosts.clock_skew_ms <= 3_600_000.0) {
        return Err("hosts.clock_skew_ms must be in [0, 1 hour]".into());
    }
    Extrapolation::ConstantRatio { ratio: s.ratio }
        .validate()
        .map_err(|e| e.to_string())?;
    if s.roots == 0 && !s.local_limits {
        return Err("roots must be at least 1 (or set local_limits)".into());
    }
    for (i, l) in s.load.iter().enumerate() {
        let at = |m: String| format!("load[{i}] ({}): {m}", l.quota);
        if checked.quota_index(&l.quota).is_none() {
            return Err(at("no such quota".into()));
        }
        if l.weight == 0 {
            return Err(at("weight must be at least 1".into()));
        }
        fraction("active_fraction", l.active_fraction).map_err(at)?;
        if l.phases.is_empty() {
            return Err(at("needs at least one phase".into()));
        }
        for (k, p) in l.phases.iter().enumerate() {
            if p.x.is_some() == p.rate.is_some() {
                return Err(at(format!("phase {k}: give exactly one of x and rate")));
            }
            let r = p.x.or(p.rate).unwrap_or(0.0);
            if !(r.is_finite() && r >= 0.0 && p.at.is_finite() && p.at >= 0.0) {
                return Err(at(format!(
                    "phase {k}: at and the rate must not be negative"
                )));
            }
            if p.at.fract() != 0.0 {
                return Err(at(format!("phase {k}: phases start at whole seconds")));
            }
            if k > 0 && p.at <= l.phases[k - 1].at {
                return Err(at(format!("phase {k}: phases must be in time order")));
            }
        }
        if let Some(c) = &l.charge {
            if !(1..=c.cost[1]).contains(&c.cost[0]) {
                return Err(at("charge.cost: [least, most], 1 <= least <= most".into()));
            }
            let [short, long] = c.duration_s;
            if !(short.is_finite() && short >= 0.0 && long >= short && long <= 3600.0) {
                return Err(at(
                    "charge.duration_s: [shortest, longest] in seconds, 0 to 3600".into(),
                ));
            }
            if c.in_flight == Some(0) {
                return Err(at("charge.in_flight must be at least 1".into()));
            }
            if l.pace.is_some() {
                return Err(at("a load is charged or paced, not both".into()));
            }
        }
        if let Some([min, max]) = l.hold_seconds {
            let in_flight = checked
                .quota_index(&l.quota)
                .is_some_and(|q| checked.quotas[q].in_flight);
            if !in_flight {
                return Err(at("hold_seconds is for an in-flight quota's load".into()));
            }
            if l.charge.is_some() {
                return Err(at("a load is charged or holds slots, not both".into()));
            }
            if !(min.is_finite() && max.is_finite() && min > 0.0 && max >= min) {
                return Err(at(format!(
                    "hold_seconds must be [min, max] with 0 < min <= max, not [{min}, {max}]"
                )));
            }
        }
        if let Some(skew) = &l.skew {
            fraction("skew.hosts", skew.hosts).map_err(at)?;
            fraction("skew.share", skew.share).map_err(at)?;
        }
        let per_key = checked
            .quota_index(&l.quota)
            .is_some_and(|q| checked.quotas[q].per_key);
        match &l.keys {
            Some(k) => {
                if !per_key {
                    return Err(at("keys given for a quota that is not per-key".into()));
                }
                if k.one_off == k.count.is_some() {
                    return Err(at("keys: give exactly one of count and one_off".into()));
                }
                if k.count == Some(0) || !(k.zipf.is_finite() && k.zipf >= 0.0) {
                    return Err(at("keys: count at least 1, zipf not negative".into()));
                }
            }
            None if per_key => return Err(at("a per-key quota's load needs keys".into())),
            None => {}
        }
    }
    for e in &s.events {
        if !(e.at.is_finite() && e.at >= 0.0) {
            return Err(format!("event at {}: time must not be negative", e.at));
        }
        match e.action {
            Action::KillRoot { root } | Action::RestartRoot { root } if root >= s.roots => {
                return Err(format!("event at {}: no root {root}", e.at));
            }
            _ => {}
        }
    }
    for r in &s.report {
        if checked.quota_index(&r.quota).is_none() {
            return Err(format!("report {:?}: no quota {:?}", r.metric, r.quota));
        }
        if r.metric == Metric::Cv && !r.window.is_some_and(|w| w > 0.0) {
            return Err("report cv: needs a positive window".into());
        }
        if r.beyond_ideal && r.metric == Metric::LevelError {
            return Err(
                "report level_error: the ideal limiter has no estimate, so no \
                        beyond_ideal"
                    .into(),
            );
        }
    }
    Ok(checked)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The smallest valid scenario: one quota "q" (limit 100), 3 hosts.
    pub(crate) const MINIMAL: &str = r#"
        name = "t"
        duration = 10
        hosts = { count = 3 }
        [[quotas]]
        name = "q"
        limit = 100
        [[load]]
        quota = "q"
        phases = [{ at = 0, x = 2 }]
    "#;

    #[test]
    fn a_minimal_scenario_gets_the_real_loop_defaults() {
        let c = parse(MINIMAL).unwrap();
        let s = &c.scenario;
        assert_eq!((s.roots, s.seed, s.mode), (1, 1, Mode::Adaptive));
        assert_eq!((s.sync.interval_ms, s.sync.jitter), (1000.0, 0.1));
        assert_eq!(c.quotas[0].high_burst, 100.0);
    }

    #[test]
    fn events_read_as_tagged_actions() {
        let text = format!(
            "{MINIMAL}\n[[events]]\nat = 5\naction = \"kill_root\"\nroot = 0\n\
             [[events]]\nat = 6\naction = \"hosts_join\"\ncount = 2\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.scenario.events[0].action, Action::KillRoot { root: 0 });
        assert_eq!(c.scenario.events[1].action, Action::HostsJoin { count: 2 });
    }

    #[test]
    fn mistakes_are_named() {
        let bad_quota = MINIMAL.replace("quota = \"q\"", "quota = \"nope\"");
        assert!(parse(&bad_quota).unwrap_err().contains("no such quota"));
        let both = MINIMAL.replace("x = 2", "x = 2, rate = 5");
        assert!(parse(&both)
            .unwrap_err()
            .contains("exactly one of x and rate"));
        let unknown = format!("{MINIMAL}\nbogus = 1\n");
        assert!(parse(&unknown).unwrap_err().contains("bogus"));
        let dead_root =
            format!("{MINIMAL}\n[[events]]\nat = 1\naction = \"kill_root\"\nroot = 3\n");
        assert!(parse(&dead_root).unwrap_err().contains("no root 3"));
        let no_ideal = format!(
            "{MINIMAL}\n[[report]]\nmetric = \"level_error\"\nquota = \"q\"\nbeyond_ideal = true\n"
        );
        assert!(parse(&no_ideal).unwrap_err().contains("beyond_ideal"));
    }
}
