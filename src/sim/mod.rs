//! The cluster simulator behind `sluice sim`: a deterministic, seeded,
//! simulated-time model of a fleet of limiter hosts and its quota roots,
//! built from the real code.
//!
//! Each simulated host owns a real [`crate::table::Table`] (the decision,
//! the counters, the estimate, exactly what nginx runs) and a real
//! [`crate::sync::engine::SyncEngine`] (the sync thread's logic); each
//! simulated root is the real root's in-memory [`crate::root::ledger::Ledger`]
//! answering sync requests.
//! Only the network, the clocks and the load are simulated. A scenario file
//! (TOML) describes the fleet, the failures and what to measure; a run
//! writes a per-second CSV, an SVG plot and a summary table.
//!
//! # Layout
//!
//! - `scenario/` — scenario files: parsing and checks; the load a
//!   scenario offers in `scenario/load.rs`.
//! - `cluster/` — the event loop (`mod.rs`: a run, the true level and the
//!   samples) and its concerns, a file each: the event queue, the hosts,
//!   the network, the ideal limiter and the load (with requests that hold
//!   an in-flight slot for a while: `hold_seconds`).
//! - `root.rs` — the simulated root: the real root's ledger, without the
//!   network and the database.
//! - `series.rs` — what a run records, and its CSV.
//! - `report.rs` — the measured numbers against their targets.
//! - `plot.rs` — the SVG plots.
//! - `tests.rs`, `in_flight_tests.rs` — the simulator's tests, and the
//!   fleet's in-flight quotas (50 hosts at 2x; hosts crashing with slots).
//!
//! The standard scenarios live in `benches/scenarios/`; `make
//! bench-accuracy` runs them in both extrapolation modes and writes the
//! table into `BENCHMARKS.md` and the plots into `benches/accuracy/`.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod plot;
pub mod report;
pub mod root;
pub mod scenario;
pub mod series;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::core::Extrapolation;

pub use cluster::{simulate, RunOptions};
pub use report::Row;
pub use scenario::{Checked, Mode};
pub use series::Series;

/// Marks the start of the generated section in the benchmarks file.
pub const MARK_BEGIN: &str = "<!-- accuracy:begin -->";
/// Marks its end.
pub const MARK_END: &str = "<!-- accuracy:end -->";

/// `sluice sim`: run scenarios of the cluster simulator.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Scenario files (TOML), e.g. benches/scenarios/*.toml.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Seed of every random choice (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run each scenario with this many seeds (`seed`, `seed + 1`, ...)
    /// and report the mean and range of every number; plots and CSV are
    /// of the first seed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub seeds: u64,
    /// Extrapolation mode of the hosts (default: the scenario's).
    #[arg(long, value_enum, conflicts_with = "both_modes")]
    pub mode: Option<Mode>,
    /// `correction_ratio` of the constant-ratio mode (default: the
    /// scenario's, else 1.0).
    #[arg(long)]
    pub ratio: Option<f64>,
    /// Run every scenario in both extrapolation modes.
    #[arg(long)]
    pub both_modes: bool,
    /// Write the per-second CSV here (one scenario, one mode).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write the SVG plot here (one scenario, one mode).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write one plot per scenario and mode into this directory, named
    /// `<scenario>-<mode>.svg`.
    #[arg(long)]
    pub svg_dir: Option<PathBuf>,
    /// Write the results table into this markdown file, between
    /// `<!-- accuracy:begin -->` and `<!-- accuracy:end -->` (the rest of
    /// the file is kept; the section is appended if missing).
    #[arg(long)]
    pub markdown: Option<PathBuf>,
}

/// One finished run.
#[derive(Debug)]
pub struct RunResult {
    /// Scenario name.
    pub name: String,
    /// Mode it ran in.
    pub mode: Mode,
    /// Seed it ran with.
    pub seed: u64,
    /// What it recorded.
    pub series: Series,
    /// The scenario's report rows.
    pub rows: Vec<Row>,
}

/// Runs one scenario in one mode (`seed` and `mode` default to the
/// scenario's own).
pub fn run_scenario(checked: &Checked, seed: Option<u64>, mode: Option<Mode>) -> RunResult {
    let s = &checked.scenario;
    let options = RunOptions {
        seed: seed.unwrap_or(s.seed),
        mode: mode.unwrap_or(s.mode),
    };
    let series = simulate(checked, options);
    let rows = report::measure(checked, &series);
    RunResult {
        name: s.name.clone(),
        mode: options.mode,
        seed: options.seed,
        series,
        rows,
    }
}

/// Reads and checks a scenario file.
pub fn load(path: &Path) -> Result<Checked, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    scenario::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn write(path: &Path, contents: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("{}: cannot create: {e}", dir.display()))?;
    }
    std::fs::write(path, contents).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// The runs of one scenario in one mode, over one or more seeds.
#[derive(Debug)]
pub struct Runs {
    /// Scenario name.
    pub name: String,
    /// The mode.
    pub mode: Mode,
    /// Seeds, in run order.
    pub seeds: Vec<u64>,
    /// The report rows, aggregated over the seeds.
    pub rows: Vec<Row>,
}

/// `sluice sim`: runs the scenarios, prints a summary per run, and writes
/// what was asked for.
pub fn run(args: &SimArgs) -> Result<(), String> {
    let modes: Vec<Option<Mode>> = match (args.both_modes, args.mode) {
        (true, _) => Mode::ALL.iter().copied().map(Some).collect(),
        (false, mode) => vec![mode],
    };
    let single = args.scenarios.len() == 1 && modes.len() == 1;
    if !single && (args.csv.is_some() || args.svg.is_some()) {
        return Err("--csv and --svg take one scenario in one mode; use --svg-dir".into());
    }
    let mut all = Vec::new();
    let mut descriptions = Vec::new();
    for path in &args.scenarios {
        let mut checked = load(path)?;
        if let Some(ratio) = args.ratio {
            Extrapolation::ConstantRatio { ratio }
                .validate()
                .map_err(|e| format!("--ratio: {}", e.message))?;
            checked.scenario.ratio = ratio;
        }
        descriptions.push((
            checked.scenario.name.clone(),
            checked.scenario.description.clone(),
        ));
        let first_seed = args.seed.unwrap_or(checked.scenario.seed);
        for &mode in &modes {
            let mut rows = Vec::new();
            let mut seeds = Vec::new();
            for k in 0..args.seeds {
                let r = run_scenario(&checked, Some(first_seed.wrapping_add(k)), mode);
                if args.seeds == 1 {
                    println!("{}", summary(&checked, &r));
                }
                if k == 0 {
                    write_outputs(args, &r)?;
                }
                seeds.push(r.seed);
                rows.push(r.rows);
            }
            let runs = Runs {
                name: checked.scenario.name.clone(),
                mode: mode.unwrap_or(checked.scenario.mode),
                seeds,
                rows: report::aggregate(&rows),
            };
            if args.seeds > 1 {
                println!(
                    "== {} — {} (mean of seeds {}..={})\n{}",
                    runs.name,
                    runs.mode.name(),
                    runs.seeds[0],
                    runs.seeds[runs.seeds.len() - 1],
                    report::text_table(&runs.rows)
                );
            }
            all.push(runs);
        }
    }
    if let Some(md) = &args.markdown {
        let old = match std::fs::read_to_string(md) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".into(),
            Err(e) => return Err(format!("{}: cannot read: {e}", md.display())),
        };
        let links = args.svg_dir.as_deref().map(|dir| relative_to(dir, md));
        let section = markdown(&all, &descriptions, links.as_deref());
        write(md, &replace_section(&old, &section))?;
        eprintln!("sim: wrote the accuracy table into {}", md.display());
    }
    Ok(())
}

/// Writes the CSV and plots `args` asks for, of run `r`.
fn write_outputs(args: &SimArgs, r: &RunResult) -> Result<(), String> {
    if let Some(csv) = &args.csv {
        write(csv, &r.series.to_csv())?;
    }
    let title = format!("{} — {} (seed {})", r.name, r.mode.name(), r.seed);
    if let Some(svg) = &args.svg {
        write(svg, &plot::svg(&r.series, &title)?)?;
    }
    if let Some(dir) = &args.svg_dir {
        write(
            &dir.join(svg_name(&r.name, r.mode)),
            &plot::svg(&r.series, &title)?,
        )?;
    }
    Ok(())
}

/// File name of the plot of scenario `name` in `mode`.
pub fn svg_name(name: &str, mode: Mode) -> String {
    format!("{name}-{}.svg", mode.name())
}

/// `dir` as a link from the directory of `file`, when `dir` is under it.
fn relative_to(dir: &Path, file: &Path) -> PathBuf {
    let base = file.parent().unwrap_or(Path::new(""));
    dir.strip_prefix(base)
        .map_or_else(|_| dir.to_path_buf(), Path::to_path_buf)
}

/// The summary of one run for the terminal.
pub fn summary(checked: &Checked, r: &RunResult) -> String {
    let s = &checked.scenario;
    let mut out = String::new();
    let mode = match r.mode {
        Mode::ConstantRatio => format!("constant_ratio {}", s.ratio),
        Mode::Adaptive => "adaptive".to_string(),
    };
    let _ = writeln!(
        out,
        "== {} — {mode} (seed {}): {} hosts, {} roots, {} s",
        r.name,
        r.seed,
        s.hosts.count,
        if s.local_limits { 0 } else { s.roots },
        s.duration
    );
    if !s.description.is_empty() {
        let _ = writeln!(out, "   {}", s.description);
    }
    // Of many copies, the first copy's quotas stand for the rest.
    let shown = r.series.quotas.len() / s.copies.max(1);
    for q in &r.series.quotas[..shown] {
        let t = q.total(0.0, r.series.seconds as f64);
        let _ = writeln!(
            out,
            "   {}: offered {}, admitted {}, rejected {} (limit {})",
            q.name, t.offered, t.admitted, t.rejected, q.terms
        );
    }
    if !s.local_limits {
        // Roots clip what a host could not have admitted: an honest fleet
        // never sees it.
        let _ = writeln!(
            out,
            "   deltas the roots clipped as implausible: {}",
            r.series.deltas_clipped
        );
    }
    if s.copies > 1 || !s.root_groups.is_empty() {
        out.push_str(&groups_summary(r));
    }
    out.push_str(&report::text_table(&r.rows));
    out
}

/// What a run with many quotas or root groups adds to the summary:
/// admitted over the limit per quota (from second 10, min/mean/max over
/// quotas), and each root's work per sync interval.
pub fn groups_summary(r: &RunResult) -> String {
    let mut out = String::new();
    let ratios = r
        .series
        .admitted_ratios(10.0_f64.min(r.series.seconds as f64 / 2.0));
    if !ratios.is_empty() {
        let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let _ = writeln!(
            out,
            "   admitted/limit per quota from 10 s, over {} quotas: min {min:.3}, mean \
             {mean:.3}, max {max:.3}",
            ratios.len()
        );
    }
    let sum = |f: fn(&series::RootWork) -> u64| -> u64 { r.series.root_work.iter().map(f).sum() };
    let (requests, steady) = (sum(|w| w.requests), sum(|w| w.steady_requests));
    if requests > 0 {
        let (bytes, own, first) = (
            sum(|w| w.reply_bytes),
            sum(|w| w.own_bytes),
            sum(|w| w.first_bytes),
        );
        let _ = writeln!(
            out,
            "   reply bytes per sync (binary) from a host's sync {} on: {:.0}, of the host's own \
             counters {:.0}: {:.2}x; the syncs before, {:.0} each; root time per sync {:.1} us",
            root::STEADY_SYNC,
            bytes as f64 / steady.max(1) as f64,
            own as f64 / steady.max(1) as f64,
            bytes as f64 / own.max(1) as f64,
            first as f64 / (requests - steady).max(1) as f64,
            sum(|w| w.busy_ns) as f64 / requests as f64 / 1e3
        );
    }
    for (i, w) in r.series.root_work.iter().enumerate() {
        let per_request = w.received as f64 / w.requests.max(1) as f64;
        let _ = writeln!(
            out,
            "   root {i} (group {}): {} sync requests, {} counter deltas in ({per_request:.0} \
             per request), {} of another group's shard; {} counter values out ({:.0} per reply)",
            w.group,
            w.requests,
            w.received,
            w.foreign,
            w.replied,
            w.replied as f64 / w.requests.max(1) as f64
        );
    }
    out
}

/// The generated markdown section: one table row per report row, one
/// column per mode, then the scenarios with links to their plots.
pub fn markdown(
    runs: &[Runs],
    descriptions: &[(String, String)],
    svg_dir: Option<&Path>,
) -> String {
    let mut modes: Vec<Mode> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        if !modes.contains(&r.mode) {
            modes.push(r.mode);
        }
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
    }
    let seeds = match runs.first().map(|r| r.seeds.as_slice()) {
        Some([one]) => format!("seed {one}"),
        Some([first, .., last]) => format!("mean of seeds {first}–{last}, range in parentheses"),
        _ => "no runs".into(),
    };
    let mut out = String::new();
    let _ = writeln!(out, "{MARK_BEGIN}");
    let _ = writeln!(out, "## Accuracy: the cluster simulator\n");
    let _ = writeln!(
        out,
        "Generated by `make bench-accuracy` (`sluice sim`); do not edit by hand.\n\
         Every simulated host runs the real quota table, decision, estimator and\n\
         sync engine; the roots add deltas with the real counter math; the\n\
         network, the clocks and the load are simulated (`src/sim/`). **ideal**\n\
         is one central bucket deciding the same requests by the same rule with\n\
         no sync delay: what no distributed limiter can beat. ✓/✗: target met or\n\
         not. Values: {seeds}.\n"
    );
    let _ = write!(out, "| scenario | metric | target |");
    for m in &modes {
        let _ = write!(out, " {} |", m.name().replace('_', " "));
    }
    let _ = writeln!(out, " ideal |");
    let _ = writeln!(out, "|---|---|---|{}---|", "---|".repeat(modes.len()));
    for name in &names {
        let of_name: Vec<&Runs> = modes
            .iter()
            .filter_map(|m| runs.iter().find(|r| &r.name == name && r.mode == *m))
            .collect();
        let Some(first) = of_name.first() else {
            continue;
        };
        for (i, row) in first.rows.iter().enumerate() {
            let _ = write!(out, "| `{name}` | {} | {} |", row.label, row.target());
            for r in &of_name {
                let cell = &r.rows[i];
                let mark = match cell.met() {
                    Some(true) => " ✓",
                    Some(false) => " ✗",
                    None => "",
                };
                let _ = write!(out, " {}{mark} |", cell.value_text());
            }
            let _ = writeln!(out, " {} |", row.ideal_text());
        }
    }
    out.push('\n');
    for (name, description) in descriptions {
        let _ = write!(out, "- `{name}`: {description}");
        if let Some(dir) = svg_dir {
            let links: Vec<String> = modes
                .iter()
                .map(|&m| {
                    let path = dir.join(svg_name(name, m));
                    format!("[{}]({})", m.name().replace('_', " "), path.display())
                })
                .collect();
            let _ = write!(out, " Plots: {}.", links.join(", "));
        }
        out.push('\n');
    }
    let _ = writeln!(out, "{MARK_END}");
    out
}

/// `old` with the generated section replaced by `section` (appended when
/// the markers are missing); everything else is kept.
pub fn replace_section(old: &str, section: &str) -> String {
    match (old.find(MARK_BEGIN), old.find(MARK_END)) {
        (Some(a), Some(b)) if a < b => {
            let tail = &old[b + MARK_END.len()..];
            let tail = tail.strip_prefix('\n').unwrap_or(tail);
            format!("{}{section}{tail}", &old[..a])
        }
        _ => {
            let sep = if old.is_empty() || old.ends_with("\n\n") {
                ""
            } else if old.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{old}{sep}{section}")
        }
    }
}

#[cfg(test)]
mod in_flight_tests;
#[cfg(test)]
mod tests;
