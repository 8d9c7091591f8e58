//! The load a scenario offers on a quota: its phases, arrivals, keys and
//! their skew, pacing, and charges after the fact.

use serde::Deserialize;

/// Most keys a keyed load tracks one by one for its report.
pub const MAX_TRACKED_KEYS: u64 = 100_000;

/// The keys of a load on a per-key quota.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysSpec {
    /// Draw each request's key from this many keys (tracked one by one
    /// for the report when at most [`MAX_TRACKED_KEYS`]).
    #[serde(default)]
    pub count: Option<u64>,
    /// Zipf exponent of the draw (0: uniform); key 1 is the hottest.
    #[serde(default)]
    pub zipf: f64,
    /// Every request a key never seen before (a scan).
    #[serde(default)]
    pub one_off: bool,
    /// Each host draws from its own run of this many of the `count` keys
    /// (host `h`'s starts at `h * count / hosts`, so neighbouring hosts
    /// share keys): each host touches only its part of the key space.
    #[serde(default)]
    pub per_host: Option<u64>,
}

/// Load offered on one quota.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// Name of the quota the requests name.
    pub quota: String,
    /// Weight of every request.
    #[serde(default = "default_weight")]
    pub weight: u64,
    /// How requests are spread in time.
    #[serde(default)]
    pub arrivals: Arrivals,
    /// Offered rate over time; each phase lasts until the next one's `at`.
    pub phases: Vec<PhaseSpec>,
    /// Each second, a fresh random subset of this fraction of the live
    /// hosts receives the load.
    #[serde(default = "default_fraction")]
    pub active_fraction: f64,
    /// Uneven split across the receiving hosts.
    #[serde(default)]
    pub skew: Option<SkewSpec>,
    /// For a per-key quota: which keys the requests carry.
    #[serde(default)]
    pub keys: Option<KeysSpec>,
    /// Pace the requests instead of checking them: each is counted when it
    /// arrives and acts after the wait the limiter says (`Table::reserve`),
    /// or is rejected when that wait would exceed `max_wait_ms`.
    #[serde(default)]
    pub pace: Option<PaceSpec>,
    /// Requests whose cost is known only once they are done (an LLM
    /// completion's tokens, a download's bytes): each draws its cost and
    /// its duration, is checked when it arrives and charged (or its
    /// estimate settled) when it ends (`Table::charge`, `Table::settle`).
    /// `x` phases then count in cost units (the mean cost a request).
    #[serde(default)]
    pub charge: Option<ChargeSpec>,
    /// Requests of an in-flight quota that last: each admitted one holds
    /// its slot for a time drawn uniformly from `[min, max]` seconds, then
    /// its host gives it back (a host that left never does: the roots'
    /// lease drops its slots).
    #[serde(default)]
    pub hold_seconds: Option<[f64; 2]>,
}

/// How a load's requests cost what they cost, known only after them.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeSpec {
    /// The least and the most a request costs, units.
    pub cost: [u64; 2],
    /// Costs spread evenly over the decades between the two (log-uniform:
    /// a heavy tail, most units in the few big ones) instead of evenly
    /// over the range.
    #[serde(default)]
    pub log_uniform: bool,
    /// The shortest and the longest a request lasts, seconds (uniform).
    pub duration_s: [f64; 2],
    /// Check with the most a request can cost (`cost[1]`, e.g.
    /// `max_tokens`) and settle it at the actual cost when it ends;
    /// otherwise check with weight 0 ("in debt already?") and charge the
    /// whole cost when it ends.
    #[serde(default)]
    pub estimate: bool,
    /// Most requests in flight per key (per load when unkeyed), fleet-wide:
    /// a client's concurrency. An arrival over it is not sent.
    #[serde(default)]
    pub in_flight: Option<u32>,
}

impl ChargeSpec {
    /// The mean cost of a request.
    pub fn mean_cost(&self) -> f64 {
        let [lo, hi] = [self.cost[0] as f64, self.cost[1] as f64];
        if self.log_uniform && hi > lo {
            (hi - lo) / (hi / lo).ln()
        } else {
            (lo + hi) / 2.0
        }
    }

    /// A request's cost for a draw `u` in [0, 1).
    pub fn cost_at(&self, u: f64) -> u64 {
        let [lo, hi] = [self.cost[0] as f64, self.cost[1] as f64];
        let cost = if self.log_uniform {
            lo * (hi / lo).powf(u)
        } else {
            lo + (hi - lo) * u
        };
        (cost.round() as u64).clamp(self.cost[0], self.cost[1])
    }
}

/// How a paced load waits.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaceSpec {
    /// Longest wait a sender accepts, milliseconds.
    pub max_wait_ms: f64,
}

fn default_weight() -> u64 {
    1
}

fn default_fraction() -> f64 {
    1.0
}

/// How requests are spread in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrivals {
    /// A Poisson process per host (random gaps).
    #[default]
    Poisson,
    /// Evenly spaced per host, at a random phase each second.
    Uniform,
}

/// One piece of a load's rate over time.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSpec {
    /// Start, in whole seconds.
    pub at: f64,
    /// Offered rate as a multiple of the quota's limit (for a window
    /// quota, of its limit spread over its window).
    #[serde(default)]
    pub x: Option<f64>,
    /// Offered rate in requests per second.
    #[serde(default)]
    pub rate: Option<f64>,
}

/// `hosts` of the receiving hosts get `share` of the load.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkewSpec {
    /// Fraction of the receiving hosts that are hot.
    pub hosts: f64,
    /// Fraction of the load they receive.
    pub share: f64,
}
