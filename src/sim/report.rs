//! The numbers a scenario asks for, measured on a run's record, checked
//! against their targets, and printed as a table.

use std::fmt::Write as _;

use super::scenario::{Aggregate, Checked, Metric, ReportSpec};
use super::series::{Bin, QuotaSeries, Series, BINS_PER_SEC};

/// One measured number.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// What was measured, for humans.
    pub label: String,
    /// The metric.
    pub metric: Metric,
    /// The simulated fleet's value (`None`: never happened, e.g. never
    /// settled).
    pub value: Option<f64>,
    /// The ideal limiter's value on the same requests, where it has one.
    pub ideal: Option<f64>,
    /// Target: at least.
    pub min: Option<f64>,
    /// Target: at most.
    pub max: Option<f64>,
    /// Lowest and highest value over several seeds, when `value` is their
    /// mean.
    pub range: Option<(f64, f64)>,
}

impl Row {
    /// Whether the value meets the target (`None` without a target).
    pub fn met(&self) -> Option<bool> {
        if self.min.is_none() && self.max.is_none() {
            return None;
        }
        let Some(v) = self.value else {
            return Some(false);
        };
        Some(self.min.is_none_or(|m| v >= m) && self.max.is_none_or(|m| v <= m))
    }

    /// The target as text (`0.95–1.05`, `≤ 1 s`, `—`).
    pub fn target(&self) -> String {
        match (self.min, self.max) {
            (Some(a), Some(b)) => format!("{}–{}", fmt(self.metric, a), fmt(self.metric, b)),
            (Some(a), None) => format!("≥ {}", fmt(self.metric, a)),
            (None, Some(b)) => format!("≤ {}", fmt(self.metric, b)),
            (None, None) => "—".into(),
        }
    }

    /// The value as text, with the range over seeds if there is one.
    pub fn value_text(&self) -> String {
        match (self.value, self.range) {
            (Some(v), Some((lo, hi))) if lo < hi => format!(
                "{} ({}–{})",
                fmt(self.metric, v),
                fmt_bare(self.metric, lo),
                fmt_bare(self.metric, hi)
            ),
            _ => opt(self.metric, self.value),
        }
    }

    /// The ideal limiter's value as text.
    pub fn ideal_text(&self) -> String {
        match (self.metric, self.ideal) {
            (Metric::LevelError, _) => "—".into(),
            (m, v) => opt(m, v),
        }
    }
}

fn opt(metric: Metric, v: Option<f64>) -> String {
    match (metric, v) {
        (_, Some(v)) => fmt(metric, v),
        (Metric::Settle, None) => "never".into(),
        (_, None) => "—".into(),
    }
}

/// A value without its unit (for ranges): a share in percent, times
/// in seconds.
fn fmt_bare(metric: Metric, v: f64) -> String {
    match metric {
        Metric::AdmittedRatio
        | Metric::ServedRatio
        | Metric::KeyAdmittedRatio
        | Metric::WindowRatio => format!("{v:.3}"),
        Metric::KeyOverflows => format!("{v:.0}"),
        Metric::Cv | Metric::LevelError => format!("{:.1}", v * 100.0),
        Metric::Settle | Metric::ResidualRejections => format!("{v:.2}"),
    }
}

/// The unit written after a value of `metric`.
fn unit(metric: Metric) -> &'static str {
    match metric {
        Metric::Cv | Metric::LevelError => "%",
        Metric::Settle | Metric::ResidualRejections => " s",
        Metric::AdmittedRatio
        | Metric::ServedRatio
        | Metric::KeyAdmittedRatio
        | Metric::WindowRatio
        | Metric::KeyOverflows => "",
    }
}

/// Rows of several runs of one scenario (one per seed) as one: the mean
/// of each value, with its range. A value missing in any run (e.g. never
/// settled) is missing in the result.
pub fn aggregate(runs: &[Vec<Row>]) -> Vec<Row> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let mean = |xs: Vec<Option<f64>>| -> Option<(f64, f64, f64)> {
        let xs: Option<Vec<f64>> = xs.into_iter().collect();
        let xs = xs.filter(|xs| !xs.is_empty())?;
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((xs.iter().sum::<f64>() / xs.len() as f64, lo, hi))
    };
    first
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let value = mean(runs.iter().map(|r| r[i].value).collect());
            let ideal = mean(runs.iter().map(|r| r[i].ideal).collect());
            Row {
                value: value.map(|v| v.0),
                range: value.filter(|_| runs.len() > 1).map(|v| (v.1, v.2)),
                ideal: ideal.map(|v| v.0),
                ..row.clone()
            }
        })
        .collect()
}

/// A value in the metric's unit.
pub fn fmt(metric: Metric, v: f64) -> String {
    format!("{}{}", fmt_bare(metric, v), unit(metric))
}

fn default_label(spec: &ReportSpec, from: f64, to: f64) -> String {
    let what = match spec.metric {
        Metric::AdmittedRatio => "admitted/limit".to_string(),
        Metric::ServedRatio => "admitted/offered".to_string(),
        Metric::Cv => format!("CV of admitted per {} s", spec.window.unwrap_or(1.0)),
        Metric::Settle => format!(
            "settle within {}% of limit",
            (spec.tolerance.unwrap_or(0.1) * 100.0).round()
        ),
        Metric::ResidualRejections => "residual rejections".to_string(),
        Metric::LevelError => "level estimate error / high_burst".to_string(),
        Metric::KeyAdmittedRatio => format!(
            "admitted/limit of the key furthest from it, keys offered ≥ {}x",
            spec.over.unwrap_or(1.0)
        ),
        Metric::KeyOverflows => "checks of keys without an entry (all hosts)".to_string(),
        Metric::WindowRatio => format!(
            "{} {}/allowed per {}",
            match spec.aggregate {
                Aggregate::Mean => "mean",
                Aggregate::Min => "lowest",
                Aggregate::Max => "highest",
            },
            if spec.sent { "sent" } else { "admitted" },
            spec.window
                .map_or("window".to_string(), |w| format!("{w} s"))
        ),
    };
    format!("{what} `{}` {from}–{to} s", spec.quota)
}

/// Measures every report row of the scenario on `series`.
pub fn measure(checked: &Checked, series: &Series) -> Vec<Row> {
    let end = checked.scenario.duration;
    checked
        .scenario
        .report
        .iter()
        .map(|spec| {
            let q = &series.quotas[checked.quota_index(&spec.quota).unwrap_or(0)];
            let from = spec.from.unwrap_or(0.0).clamp(0.0, end);
            let to = spec.to.unwrap_or(end).clamp(from, end);
            let measured = match spec.metric {
                Metric::KeyAdmittedRatio => (key_admitted(checked, series, spec, from, to), None),
                Metric::KeyOverflows => (Some(series.key_overflows as f64), None),
                _ => measure_one(spec, q, from, to),
            };
            let (value, ideal) = match measured {
                (Some(v), Some(i)) if spec.beyond_ideal => (Some(v - i), Some(0.0)),
                (_, _) if spec.beyond_ideal => (None, None),
                measured => measured,
            };
            Row {
                label: spec
                    .label
                    .clone()
                    .unwrap_or_else(|| default_label(spec, from, to)),
                metric: spec.metric,
                value,
                ideal,
                min: spec.min,
                max: spec.max,
                range: None,
            }
        })
        .collect()
}

fn measure_one(
    spec: &ReportSpec,
    q: &QuotaSeries,
    from: f64,
    to: f64,
) -> (Option<f64>, Option<f64>) {
    let span = to - from;
    let admitted = |b: &Bin| b.admitted as f64;
    let ideal = |b: &Bin| b.ideal as f64;
    match spec.metric {
        Metric::AdmittedRatio => {
            let t = q.total(from, to);
            let per = |x: u64| (span > 0.0).then(|| x as f64 / (q.limit * span));
            (per(t.admitted), per(t.ideal))
        }
        Metric::ServedRatio => {
            let t = q.total(from, to);
            let per = |x: u64| (t.offered > 0).then(|| x as f64 / t.offered as f64);
            (per(t.admitted), per(t.ideal))
        }
        Metric::Cv => {
            let w = spec.window.unwrap_or(1.0);
            (cv(q, from, to, w, admitted), cv(q, from, to, w, ideal))
        }
        Metric::Settle => {
            let tol = spec.tolerance.unwrap_or(0.1);
            (
                settle(q, from, to, tol, admitted),
                settle(q, from, to, tol, ideal),
            )
        }
        Metric::ResidualRejections => {
            let ideal_rejected = |b: &Bin| (b.offered - b.ideal) as f64;
            (
                Some(last_after(q, from, to, |b| b.rejected as f64)),
                Some(last_after(q, from, to, ideal_rejected)),
            )
        }
        Metric::KeyAdmittedRatio | Metric::KeyOverflows => (None, None),
        Metric::WindowRatio => {
            let sent = |b: &Bin| b.sent as f64;
            let measured: &dyn Fn(&Bin) -> f64 = if spec.sent { &sent } else { &admitted };
            (
                window_ratio(spec, q, from, to, measured),
                (!spec.sent)
                    .then(|| window_ratio(spec, q, from, to, &ideal))
                    .flatten(),
            )
        }
        Metric::LevelError => {
            let (a, b) = (
                from.floor() as usize,
                (to.ceil() as usize).min(q.levels.len()),
            );
            let n = b.saturating_sub(a);
            let value = (n > 0 && q.high_burst > 0.0).then(|| {
                q.levels[a..b].iter().map(|l| l.est_error).sum::<f64>() / n as f64 / q.high_burst
            });
            (value, None)
        }
    }
}

/// The admitted ratio of the tracked key of `spec.quota` furthest from 1
/// among the keys offered at least `over` times their limit in the span.
fn key_admitted(
    checked: &Checked,
    series: &Series,
    spec: &ReportSpec,
    from: f64,
    to: f64,
) -> Option<f64> {
    let quota = checked.quota_index(&spec.quota)?;
    let limit = series.quotas[quota].limit;
    let (a, b) = (from.floor() as usize, to.ceil() as usize);
    let span = (b - a) as f64;
    let over = spec.over.unwrap_or(1.0);
    series
        .keyed
        .iter()
        .filter(|k| k.quota == quota)
        .flat_map(|k| (0..k.offered.len()).map(move |i| k.total(i, a, b)))
        .filter(|&(offered, _)| offered as f64 >= over * limit * span)
        .map(|(_, admitted)| admitted as f64 / (limit * span))
        .max_by(|x, y| (x - 1.0).abs().total_cmp(&(y - 1.0).abs()))
}

/// `value` per window over what the quota allows in a window, for the
/// whole windows of `[from, to)`, summed up by `spec.aggregate`. Windows
/// are the quota's own (aligned to 0) for a window quota, else `window`
/// seconds from `from`.
fn window_ratio(
    spec: &ReportSpec,
    q: &QuotaSeries,
    from: f64,
    to: f64,
    value: &dyn Fn(&Bin) -> f64,
) -> Option<f64> {
    let (length, allowed, start) = match q.window {
        Some(w) => (w, q.limit, (from / w).ceil() * w),
        None => {
            let w = spec.window.unwrap_or(1.0);
            (w, q.limit * w, from)
        }
    };
    let mut ratios = Vec::new();
    let mut t = start;
    while t + length <= to + 1e-9 {
        let (a, b) = q.bin_range(t, t + length);
        ratios.push(q.bins[a..b].iter().map(value).sum::<f64>() / allowed);
        t += length;
    }
    if ratios.is_empty() || allowed <= 0.0 {
        return None;
    }
    Some(match spec.aggregate {
        Aggregate::Mean => ratios.iter().sum::<f64>() / ratios.len() as f64,
        Aggregate::Min => ratios.iter().copied().fold(f64::INFINITY, f64::min),
        Aggregate::Max => ratios.iter().copied().fold(0.0, f64::max),
    })
}

/// Coefficient of variation (population standard deviation over mean) of
/// `value` summed over consecutive windows of `window` seconds.
fn cv(
    q: &QuotaSeries,
    from: f64,
    to: f64,
    window: f64,
    value: impl Fn(&Bin) -> f64,
) -> Option<f64> {
    let mut sums = Vec::new();
    let mut t = from;
    while t + window <= to + 1e-9 {
        let (a, b) = q.bin_range(t, t + window);
        sums.push(q.bins[a..b].iter().map(&value).sum::<f64>());
        t += window;
    }
    if sums.len() < 2 {
        return None;
    }
    let n = sums.len() as f64;
    let mean = sums.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return None;
    }
    let var = sums.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n;
    Some(var.sqrt() / mean)
}

/// Seconds from `from` to the start of the first one-second window (sliding
/// in bin steps, ending by `to`) whose rate of `value` is within
/// `tol * limit` of the limit.
///
/// First entry, not "stays within": admitted traffic has Poisson noise of
/// a few percent per second, so a stricter rule would measure the noise.
/// Whether it then stays near the limit is what the CV rows show.
fn settle(
    q: &QuotaSeries,
    from: f64,
    to: f64,
    tol: f64,
    value: impl Fn(&Bin) -> f64,
) -> Option<f64> {
    let (a, b) = q.bin_range(from, to);
    if b < a + BINS_PER_SEC {
        return None;
    }
    let mut window: f64 = q.bins[a..a + BINS_PER_SEC].iter().map(&value).sum();
    for start in a..=b - BINS_PER_SEC {
        if start > a {
            window += value(&q.bins[start + BINS_PER_SEC - 1]) - value(&q.bins[start - 1]);
        }
        if (window - q.limit).abs() <= tol * q.limit {
            return Some((start - a) as f64 / BINS_PER_SEC as f64);
        }
    }
    None
}

/// Seconds from `from` to the end of the last bin in `[from, to)` where
/// `value` is positive (0 if there is none).
fn last_after(q: &QuotaSeries, from: f64, to: f64, value: impl Fn(&Bin) -> f64) -> f64 {
    let (a, b) = q.bin_range(from, to);
    (a..b)
        .rev()
        .find(|&i| value(&q.bins[i]) > 0.0)
        .map_or(0.0, |i| (i + 1 - a) as f64 / BINS_PER_SEC as f64)
}

/// The rows as a plain-text table for a terminal.
pub fn text_table(rows: &[Row]) -> String {
    let label_w = rows
        .iter()
        .map(|r| r.label.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<label_w$}  {:>14}  {:>22}  {:>10}  ok",
        "metric", "target", "value", "ideal"
    );
    for r in rows {
        let ok = match r.met() {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        let _ = writeln!(
            out,
            "{:<label_w$}  {:>14}  {:>22}  {:>10}  {ok}",
            r.label,
            r.target(),
            r.value_text(),
            r.ideal_text(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::series::Series;

    fn series(per_bin: impl Fn(usize) -> Bin, seconds: usize) -> Series {
        let mut quotas = crate::sim::series::tests::quotas(&["q"]);
        quotas[0].limit = 100.0;
        quotas[0].high_burst = 200.0;
        let mut s = Series::new(seconds, &quotas);
        for (i, b) in s.quotas[0].bins.iter_mut().enumerate() {
            *b = per_bin(i);
        }
        s
    }

    #[test]
    fn cv_of_a_constant_rate_is_zero_and_of_an_alternating_one_is_not() {
        let flat = series(
            |_| Bin {
                admitted: 1,
                ..Bin::default()
            },
            10,
        );
        assert_eq!(
            cv(&flat.quotas[0], 0.0, 10.0, 1.0, |b| b.admitted as f64),
            Some(0.0)
        );
        // 2 per bin in even seconds, 0 in odd ones: mean 100, sd 100.
        let saw = series(
            |i| Bin {
                admitted: if (i / BINS_PER_SEC) % 2 == 0 { 2 } else { 0 },
                ..Bin::default()
            },
            10,
        );
        let c = cv(&saw.quotas[0], 0.0, 10.0, 1.0, |b| b.admitted as f64).unwrap();
        assert!((c - 1.0).abs() < 1e-9);
    }

    #[test]
    fn settle_is_when_the_rate_first_comes_near_the_limit() {
        // 300/s for the first 2 s, then exactly the limit (100/s = 1/bin).
        let s = series(
            |i| Bin {
                admitted: if i < 2 * BINS_PER_SEC { 3 } else { 1 },
                ..Bin::default()
            },
            10,
        );
        let t = settle(&s.quotas[0], 0.0, 10.0, 0.1, |b| b.admitted as f64).unwrap();
        // The one-second window is within 10% once at most 5 of its 100
        // bins are from the fast part: from 1.95 s.
        assert!((t - 1.95).abs() < 1e-9, "{t}");
    }

    #[test]
    fn beyond_ideal_rows_report_the_difference_to_the_ideal_limiter() {
        let checked = crate::sim::scenario::parse(&format!(
            "{}\n[[report]]\nmetric = \"settle\"\nquota = \"q\"\n\
             [[report]]\nmetric = \"settle\"\nquota = \"q\"\nbeyond_ideal = true\nmax = 1.5\n",
            crate::sim::scenario::tests::MINIMAL
        ))
        .unwrap();
        // The fleet admits 3/bin for 2 s, the ideal limiter for 1 s; then
        // both admit the limit.
        let s = series(
            |i| Bin {
                admitted: if i < 2 * BINS_PER_SEC { 3 } else { 1 },
                ideal: if i < BINS_PER_SEC { 3 } else { 1 },
                ..Bin::default()
            },
            10,
        );
        let rows = measure(&checked, &s);
        let (plain, beyond) = (&rows[0], &rows[1]);
        assert!((plain.value.unwrap() - 1.95).abs() < 1e-9);
        assert!((plain.ideal.unwrap() - 0.95).abs() < 1e-9);
        assert!((beyond.value.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(beyond.ideal, Some(0.0));
        assert_eq!(beyond.met(), Some(true));
    }

    #[test]
    fn residual_rejections_end_at_the_last_rejecting_bin() {
        let s = series(
            |i| Bin {
                rejected: u64::from(i < 250),
                ..Bin::default()
            },
            10,
        );
        assert!((last_after(&s.quotas[0], 2.0, 10.0, |b| b.rejected as f64) - 0.5).abs() < 1e-9);
        assert_eq!(
            last_after(&s.quotas[0], 3.0, 10.0, |b| b.rejected as f64),
            0.0
        );
    }

    #[test]
    fn targets_are_checked_inclusively() {
        let row = Row {
            label: "x".into(),
            metric: Metric::AdmittedRatio,
            value: Some(1.05),
            ideal: None,
            min: Some(0.95),
            max: Some(1.05),
            range: None,
        };
        assert_eq!(row.met(), Some(true));
        assert_eq!(row.target(), "0.950–1.050");
        let never = Row {
            value: None,
            metric: Metric::Settle,
            ..row.clone()
        };
        assert_eq!(
            (never.met(), never.value_text()),
            (Some(false), "never".to_string())
        );
    }

    #[test]
    fn several_seeds_aggregate_to_the_mean_and_range() {
        let row = |v: Option<f64>| Row {
            label: "x".into(),
            metric: Metric::AdmittedRatio,
            value: v,
            ideal: Some(1.0),
            min: None,
            max: None,
            range: None,
        };
        let agg = aggregate(&[
            vec![row(Some(0.9)), row(Some(1.0))],
            vec![row(Some(1.1)), row(None)],
        ]);
        assert!((agg[0].value.unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(agg[0].range, Some((0.9, 1.1)));
        assert_eq!(agg[0].value_text(), "1.000 (0.900–1.100)");
        assert_eq!(agg[1].value, None);
    }
}
