//! What a simulation records: traffic in 10 ms bins, levels once a second,
//! and the per-second CSV made from them.

use std::fmt::Write as _;

use crate::core::{Nanos, Quota, Terms};

/// Length of one traffic bin.
pub const BIN: Nanos = 10_000_000;

/// Bins per second.
pub const BINS_PER_SEC: usize = (1_000_000_000 / BIN) as usize;

/// Traffic on one quota during one bin, in weight units. Traffic counts for
/// the quota a request names and for every ancestor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bin {
    /// Weight offered.
    pub offered: u64,
    /// Weight admitted by the simulated fleet.
    pub admitted: u64,
    /// Weight rejected by the simulated fleet.
    pub rejected: u64,
    /// Weight the ideal limiter (one central bucket, no sync) admitted.
    pub ideal: u64,
    /// Weight of paced requests that acted in this bin (admitted, then
    /// waited as told).
    pub sent: u64,
}

/// Levels of one quota at the end of one second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LevelSample {
    /// The true cluster level: every admitted weight, leaked at the limit.
    pub truth: f64,
    /// Mean of the live hosts' estimates.
    pub est_mean: f64,
    /// Lowest estimate.
    pub est_min: f64,
    /// Highest estimate.
    pub est_max: f64,
    /// Mean absolute error of the estimates.
    pub est_error: f64,
    /// The highest level a running root holds for the quota's own
    /// counter (0 without roots).
    pub root_max: f64,
}

/// One quota's record.
#[derive(Clone, Debug, Default)]
pub struct QuotaSeries {
    /// Quota name.
    pub name: String,
    /// Its limit, units per second (per window for a window quota).
    pub limit: f64,
    /// A window quota's window length, seconds.
    pub window: Option<f64>,
    /// Its limit in its own terms (`6000 / min`), for plots.
    pub terms: Terms,
    /// Its low burst.
    pub low_burst: f64,
    /// Its high burst (levels are compared with it).
    pub high_burst: f64,
    /// Traffic bins from time 0.
    pub bins: Vec<Bin>,
    /// Level samples, one per second.
    pub levels: Vec<LevelSample>,
    /// The highest true level reached, at any moment (an in-flight
    /// quota's peak of slots held).
    pub peak: f64,
}

impl QuotaSeries {
    /// Sum of the bins in `[from, to)` seconds, clamped to the record.
    pub fn total(&self, from: f64, to: f64) -> Bin {
        let (a, b) = self.bin_range(from, to);
        self.bins[a..b].iter().fold(Bin::default(), |acc, x| Bin {
            offered: acc.offered + x.offered,
            admitted: acc.admitted + x.admitted,
            rejected: acc.rejected + x.rejected,
            ideal: acc.ideal + x.ideal,
            sent: acc.sent + x.sent,
        })
    }

    /// Bin indices of `[from, to)` seconds.
    pub fn bin_range(&self, from: f64, to: f64) -> (usize, usize) {
        let idx =
            |t: f64| ((t.max(0.0) * BINS_PER_SEC as f64).round() as usize).min(self.bins.len());
        let (a, b) = (idx(from), idx(to));
        (a.min(b), b)
    }

    /// Traffic of second `s`.
    pub fn second(&self, s: usize) -> Bin {
        self.total(s as f64, (s + 1) as f64)
    }
}

/// Everything one run recorded.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Whole simulated seconds.
    pub seconds: usize,
    /// One record per quota, in scenario order.
    pub quotas: Vec<QuotaSeries>,
    /// Live hosts at the end of each second.
    pub hosts: Vec<usize>,
    /// Roots up at the end of each second.
    pub roots_up: Vec<usize>,
    /// Keyed loads tracked key by key.
    pub keyed: Vec<KeyedSeries>,
    /// Checks of keys that found no entry (over the run, all hosts).
    pub key_overflows: u64,
    /// Keys the hosts gave an entry (over the run).
    pub key_inserts: u64,
    /// Deltas the roots cut to their limiter's allowance (over the run):
    /// zero unless a host sent more than it could have admitted.
    pub deltas_clipped: u64,
    /// Per root: its group, counter deltas received, deltas of another
    /// group's shard among them, and sync requests answered (over the
    /// run).
    pub root_work: Vec<RootWork>,
}

/// What one simulated root did over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RootWork {
    /// Its root group.
    pub group: usize,
    /// Counter deltas received.
    pub received: u64,
    /// Deltas of counters of another group's shard.
    pub foreign: u64,
    /// Sync requests answered.
    pub requests: u64,
    /// Counter values sent back in replies.
    pub replied: u64,
    /// Bytes of those replies in the binary encoding, from each host's
    /// third sync with the root on ([`super::root::STEADY_SYNC`]).
    pub reply_bytes: u64,
    /// Bytes of the replies before.
    pub first_bytes: u64,
    /// Replies from each host's third sync with the root on.
    pub steady_requests: u64,
    /// Bytes of replies of the same named counters carrying, once each,
    /// every key the asking host holds of the root's group (its own
    /// counters).
    pub own_bytes: u64,
    /// Time its sync steps took (about CPU: the simulator is one thread),
    /// nanoseconds.
    pub busy_ns: u64,
}

/// Traffic of each key of one keyed load, per second.
#[derive(Clone, Debug, Default)]
pub struct KeyedSeries {
    /// Index of the load in the scenario.
    pub load: usize,
    /// Index of its (per-key) quota.
    pub quota: usize,
    /// Offered weight per key (rank - 1) and second.
    pub offered: Vec<Vec<u32>>,
    /// Admitted weight per key and second.
    pub admitted: Vec<Vec<u32>>,
}

impl KeyedSeries {
    /// Offered and admitted weight of key `k` over seconds `[from, to)`.
    pub fn total(&self, k: usize, from: usize, to: usize) -> (u64, u64) {
        let sum = |v: &Vec<u32>| v[from..to].iter().map(|&x| u64::from(x)).sum::<u64>();
        (sum(&self.offered[k]), sum(&self.admitted[k]))
    }
}

/// Header of the per-second CSV.
pub const CSV_HEADER: &str = "second,quota,offered,admitted,rejected,ideal_admitted,\
true_level,est_level_mean,est_level_min,est_level_max,est_abs_error,hosts,roots_up,sent";

impl Series {
    /// An empty record of `seconds` for `quotas`.
    pub fn new(seconds: usize, quotas: &[Quota]) -> Self {
        let quotas = quotas
            .iter()
            .map(|q| QuotaSeries {
                name: q.name.clone(),
                limit: q.limit,
                // The simulation's time is UTC from the epoch on.
                window: q.window.map(|w| w.length(w.index(0)) as f64 * 1e-9),
                terms: Terms::of(q),
                low_burst: q.low_burst,
                high_burst: q.high_burst,
                bins: vec![Bin::default(); seconds * BINS_PER_SEC],
                levels: vec![LevelSample::default(); seconds],
                peak: 0.0,
            })
            .collect();
        Self {
            seconds,
            quotas,
            hosts: vec![0; seconds],
            roots_up: vec![0; seconds],
            keyed: Vec::new(),
            key_overflows: 0,
            key_inserts: 0,
            deltas_clipped: 0,
            root_work: Vec::new(),
        }
    }

    /// Each leaky quota's admitted weight from second `from` to the end,
    /// over what its limit allows in that span (window quotas left out).
    pub fn admitted_ratios(&self, from: f64) -> Vec<f64> {
        let to = self.seconds as f64;
        self.quotas
            .iter()
            .filter(|q| q.window.is_none() && q.limit > 0.0 && to > from)
            .map(|q| q.total(from, to).admitted as f64 / (q.limit * (to - from)))
            .collect()
    }

    /// The bin for simulated time `now`, if inside the record.
    pub fn bin_index(&self, now: Nanos) -> Option<usize> {
        let i = (now / BIN) as usize;
        (i < self.seconds * BINS_PER_SEC).then_some(i)
    }

    /// The per-second CSV: one row per second and quota.
    pub fn to_csv(&self) -> String {
        let mut out = String::with_capacity(self.seconds * self.quotas.len() * 96);
        out.push_str(CSV_HEADER);
        out.push('\n');
        for s in 0..self.seconds {
            for q in &self.quotas {
                let b = q.second(s);
                let l = q.levels[s];
                let _ = writeln!(
                    out,
                    "{s},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{}",
                    q.name,
                    b.offered,
                    b.admitted,
                    b.rejected,
                    b.ideal,
                    l.truth,
                    l.est_mean,
                    l.est_min,
                    l.est_max,
                    l.est_error,
                    self.hosts[s],
                    self.roots_up[s],
                    b.sent,
                );
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Quotas named `names`, limit 1.
    pub(crate) fn quotas(names: &[&str]) -> Vec<Quota> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| Quota::new(i as u64 + 1, *n, 1.0, 1.0, 2.0))
            .collect()
    }

    #[test]
    fn totals_sum_whole_bins_of_the_span() {
        let mut s = Series::new(2, &quotas(&["q"]));
        s.quotas[0].bins[0].offered = 1;
        s.quotas[0].bins[BINS_PER_SEC - 1].offered = 2;
        s.quotas[0].bins[BINS_PER_SEC].offered = 4;
        assert_eq!(s.quotas[0].second(0).offered, 3);
        assert_eq!(s.quotas[0].total(0.0, 2.0).offered, 7);
        assert_eq!(s.quotas[0].total(0.5, 99.0).offered, 6);
        assert_eq!(s.bin_index(2_000_000_000), None);
    }

    #[test]
    fn the_csv_has_a_row_per_second_and_quota() {
        let s = Series::new(3, &quotas(&["a", "b"]));
        let csv = s.to_csv();
        assert_eq!(csv.lines().count(), 1 + 3 * 2);
        assert!(csv.lines().nth(2).unwrap().starts_with("0,b,"));
    }
}
