//! How a limiter syncs, and the rules every front end checks it by.
//!
//! nginx (its `sluice_*` directives), the C ABI (`sluice_init`'s JSON) and
//! the simulator (a scenario's `sync` table) all build a [`SyncConfig`] and
//! check it with [`SyncConfig::validate`]; nginx also checks each directive
//! alone with the same pieces ([`parse_root_url`], [`validate_limiter_id`],
//! [`validate_token`], [`EarlySync::validate`],
//! [`MIN_INTERVAL`]..[`MAX_INTERVAL`]) so that
//! `nginx -t` points at the line. The root's sync endpoint checks a
//! limiter's id with [`validate_limiter_id`] too, so no front end can
//! configure an id every root refuses.

use std::sync::Arc;
use std::time::Duration;

use crate::core::estimate::{Estimator, Extrapolation};
use crate::core::{Nanos, ValidationError};
use crate::table::layout::STATUS_ROOTS;

use super::log::LogLevel;

/// Shortest sync interval.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Longest sync interval.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Most quota roots one limiter syncs with (the table publishes, and
/// remembers across an nginx reload, the state of this many, and a
/// counter's source names one of them). Root groups are numbered below
/// it too.
pub const MAX_ROOTS: usize = STATUS_ROOTS;
pub use crate::wire::{validate_limiter_id, MAX_LIMITER_ID_LEN};
/// Most early syncs a second.
pub const MAX_EARLY_PER_SECOND: f64 = 100.0;
/// How many sync intervals past the last known level the estimate keeps
/// extrapolating the others' fill (see [`crate::core::estimate`]).
pub const HORIZON_INTERVALS: u32 = 2;

/// Where the sync thread's log lines go (stderr, nginx's error log...).
pub type LogSink = Arc<dyn Fn(LogLevel, &str) + Send + Sync>;

/// Early sync: a cycle before the interval is up when some quota's local
/// delta since the last send passes `fraction` of its burst band
/// (`high_burst - low_burst`), at most `max_per_second` extra cycles a
/// second.
///
/// The sync thread looks every twentieth of an interval
/// (`EARLY_PROBES_PER_INTERVAL` in `early.rs`), reading every quota's
/// unsent weight ([`crate::table::Books::unsent_beyond`]), so the probes
/// cost CPU in proportion to the table. A host's delta is its share of the
/// load: with `n` hosts sharing a quota evenly, `fraction` around `1 / n`
/// makes hosts sync early when the load climbs well above what the band
/// absorbs in an interval. Measured in the simulator (BENCHMARKS.md,
/// "Sync").
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlySync {
    /// Share of the burst band a quota's unsent local delta must reach.
    pub fraction: f64,
    /// Most early cycles per second.
    pub max_per_second: f64,
}

impl EarlySync {
    /// `fraction` in (0, 1], `max_per_second` from 1 to
    /// [`MAX_EARLY_PER_SECOND`].
    pub fn validate(&self) -> Result<(), ValidationError> {
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(ValidationError::new(
                "early_sync.fraction",
                format!("{} is not a number above 0 and at most 1", self.fraction),
            ));
        }
        if !(1.0..=MAX_EARLY_PER_SECOND).contains(&self.max_per_second) {
            return Err(ValidationError::new(
                "early_sync.max_per_second",
                format!(
                    "{} is not 1 to {MAX_EARLY_PER_SECOND} per second",
                    self.max_per_second
                ),
            ));
        }
        Ok(())
    }
}

/// How the sync thread runs.
#[derive(Clone)]
pub struct SyncConfig {
    /// Root base URLs (`http://host:port` or `https://...`, as
    /// [`parse_root_url`] returns them); empty for standalone.
    pub roots: Vec<String>,
    /// The root group (shard) of each root, in the order of `roots`; empty
    /// when every root is in group 0 (one group, the default). Groups are
    /// numbered `0..n` with no gap (see [`super::routing::shard`]).
    pub root_groups: Vec<u32>,
    /// Time between syncs (jitter adds up to 10%).
    pub interval: Duration,
    /// Time one request may take; defaults to 80% of the interval.
    pub timeout: Option<Duration>,
    /// Bearer token for `/v1/sync`, if the roots require one.
    pub token: Option<String>,
    /// This limiter's id (host name, by default).
    pub limiter_id: String,
    /// Most distinct counters owed to one unreachable root before new ones
    /// are dropped (with a metric).
    pub max_owed: usize,
    /// Added to the local clock (tests: a host whose clock is off).
    pub clock_skew: i64,
    /// Sync before the interval is up when a quota's unsent local weight
    /// passes a share of its burst band (off by default: it costs extra
    /// syncs at the roots and probes of the table; see [`EarlySync`]).
    pub early_sync: Option<EarlySync>,
    /// How long every root may be silent before in-flight quotas count
    /// this host's own slots only: the roots' `in_flight_lease` (they
    /// drop this host's slots after it), applied locally. Set it to the
    /// roots' value.
    pub in_flight_lease: Duration,
    /// Log destination.
    pub log: LogSink,
}

/// Default of [`SyncConfig::in_flight_lease`] and of the roots'
/// `in_flight_lease`: ten default sync intervals.
pub const DEFAULT_IN_FLIGHT_LEASE: Duration = Duration::from_secs(10);

impl std::fmt::Debug for SyncConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncConfig")
            .field("roots", &self.roots)
            .field("root_groups", &self.root_groups)
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("limiter_id", &self.limiter_id)
            .field("early_sync", &self.early_sync)
            .field("in_flight_lease", &self.in_flight_lease)
            .finish_non_exhaustive()
    }
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            roots: Vec::new(),
            root_groups: Vec::new(),
            interval: Duration::from_secs(1),
            timeout: None,
            token: None,
            limiter_id: default_limiter_id(),
            max_owed: 1_000_000,
            clock_skew: 0,
            early_sync: None,
            in_flight_lease: DEFAULT_IN_FLIGHT_LEASE,
            log: Arc::new(|level, msg| eprintln!("sluice sync [{level:?}]: {msg}")),
        }
    }
}

impl SyncConfig {
    /// Checks the whole configuration: at most [`MAX_ROOTS`] distinct
    /// root URLs of the accepted form, an interval from [`MIN_INTERVAL`]
    /// to [`MAX_INTERVAL`], a timeout above 0 and below the interval, a
    /// valid limiter id and early-sync bounds. The error names the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.roots.len() > MAX_ROOTS {
            return Err(ValidationError::new(
                "roots",
                format!("{} quota roots, at most {MAX_ROOTS}", self.roots.len()),
            ));
        }
        for (i, root) in self.roots.iter().enumerate() {
            let url = parse_root_url(root.as_bytes()).map_err(|why| {
                ValidationError::new("roots", format!("quota root {root:?} {why}"))
            })?;
            if self.roots[..i].contains(&url) {
                return Err(ValidationError::new(
                    "roots",
                    format!("quota root {url:?} is duplicate"),
                ));
            }
        }
        if !self.root_groups.is_empty() {
            if self.root_groups.len() != self.roots.len() {
                return Err(ValidationError::new(
                    "root_groups",
                    format!(
                        "{} groups for {} quota roots: give every root its group",
                        self.root_groups.len(),
                        self.roots.len()
                    ),
                ));
            }
            validate_groups(&self.root_groups)?;
        }
        validate_interval(self.interval)?;
        if let Some(timeout) = self.timeout {
            if timeout.is_zero() || timeout >= self.interval {
                return Err(ValidationError::new(
                    "timeout",
                    format!(
                        "{} ms must be above 0 and shorter than the interval ({} ms)",
                        timeout.as_millis(),
                        self.interval.as_millis()
                    ),
                ));
            }
        }
        validate_limiter_id(&self.limiter_id)?;
        if let Some(token) = &self.token {
            validate_token(token)?;
        }
        if let Some(early) = &self.early_sync {
            early.validate()?;
        }
        Ok(())
    }

    /// The group of each root, in the order of `roots` (all 0 when
    /// `root_groups` is empty).
    pub fn groups(&self) -> Vec<u32> {
        if self.root_groups.is_empty() {
            vec![0; self.roots.len()]
        } else {
            self.root_groups.clone()
        }
    }

    /// One request's timeout: the configured one, or
    /// [`default_timeout`] of the interval.
    pub fn request_timeout(&self) -> Duration {
        self.timeout.unwrap_or(default_timeout(self.interval))
    }

    /// How the table estimates levels between syncs for this interval:
    /// extrapolating by `mode` for [`HORIZON_INTERVALS`] intervals.
    pub fn estimator(&self, mode: Extrapolation) -> Estimator {
        Estimator {
            mode,
            horizon: horizon(self.interval),
        }
    }
}

/// Checks a sync token: one token of printable ASCII characters, no
/// spaces (it travels in an `Authorization: Bearer` header; a line break
/// there would end the header).
pub fn validate_token(token: &str) -> Result<(), ValidationError> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ValidationError::new(
            "token",
            "must be one token of printable ASCII characters without spaces",
        ));
    }
    Ok(())
}

/// A request's timeout when none is configured: 80% of the `interval`,
/// so an exchange ends before the next cycle starts.
pub fn default_timeout(interval: Duration) -> Duration {
    interval.mul_f64(0.8)
}

/// The extrapolation horizon for a sync `interval`:
/// [`HORIZON_INTERVALS`] intervals.
pub fn horizon(interval: Duration) -> Nanos {
    (interval * HORIZON_INTERVALS)
        .as_nanos()
        .min(u128::from(u64::MAX)) as Nanos
}

/// Checks root groups as given to roots in order: every group from 0 to
/// the highest has at least one root (no gap), so that every shard is
/// served. The error names `root_groups` and the missing group.
pub fn validate_groups(groups: &[u32]) -> Result<(), ValidationError> {
    let Some(&highest) = groups.iter().max() else {
        return Ok(());
    };
    if highest as usize >= MAX_ROOTS {
        return Err(ValidationError::new(
            "root_groups",
            format!("group {highest} is out of range (0 to {})", MAX_ROOTS - 1),
        ));
    }
    if let Some(missing) = (0..highest).find(|g| !groups.contains(g)) {
        return Err(ValidationError::new(
            "root_groups",
            format!(
                "group {missing} has no quota root (groups are numbered 0 to {highest} \
                 with no gap)"
            ),
        ));
    }
    Ok(())
}

/// Reads a `group=<n>` argument of `sluice_root` (`n` from 0 to
/// [`MAX_ROOTS`] - 1); `None` when `arg` is not a group argument.
pub fn parse_group_arg(arg: &[u8]) -> Option<Result<u32, String>> {
    let value = arg.strip_prefix(b"group=")?;
    let parsed = std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&g| (g as usize) < MAX_ROOTS);
    Some(parsed.ok_or_else(|| {
        format!(
            "invalid group \"{}\" (0 to {})",
            String::from_utf8_lossy(value),
            MAX_ROOTS - 1
        )
    }))
}

/// Checks a sync interval against [`MIN_INTERVAL`] and [`MAX_INTERVAL`].
pub fn validate_interval(interval: Duration) -> Result<(), ValidationError> {
    if (MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        return Ok(());
    }
    Err(ValidationError::new(
        "interval",
        format!("{} ms is out of range (100ms to 1h)", interval.as_millis()),
    ))
}

/// Checks a quota root URL: `http://` or `https://`, a host, and nothing
/// after the authority but an optional `/`. Returns it without that `/`;
/// the error says what is wrong with it.
pub fn parse_root_url(arg: &[u8]) -> Result<String, String> {
    let url = std::str::from_utf8(arg).map_err(|_| "is not UTF-8".to_string())?;
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("must start with \"http://\" or \"https://\"")?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err("has no host".into());
    }
    if authority.contains(['/', '?', '#', ' ', '@']) {
        return Err("must be a base URL (scheme, host and port only)".into());
    }
    if let Some((_, port)) = authority.rsplit_once(':') {
        if !authority.ends_with(']') && port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("has an invalid port \"{port}\""));
        }
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// This host's name, or "limiter" if it has none (or one that is not a
/// valid limiter id).
pub fn default_limiter_id() -> String {
    crate::host::name()
        .filter(|name| validate_limiter_id(name).is_ok())
        .unwrap_or_else(|| "limiter".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SyncConfig {
        SyncConfig {
            roots: vec!["http://127.0.0.1:7070".into()],
            limiter_id: "web-1".into(),
            ..SyncConfig::default()
        }
    }

    #[test]
    fn root_urls_are_base_urls() {
        assert_eq!(
            parse_root_url(b"http://127.0.0.1:7070/").unwrap(),
            "http://127.0.0.1:7070"
        );
        assert!(parse_root_url(b"https://root.example").is_ok());
        assert!(parse_root_url(b"http://[::1]:7070").is_ok());
        for bad in [
            &b"ftp://x"[..],
            b"127.0.0.1:7070",
            b"http://",
            b"http://x/v1/sync",
            b"http://x:0",
            b"http://x:99999",
        ] {
            assert!(
                parse_root_url(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn limiter_ids_are_printable() {
        assert!(validate_limiter_id("web-01.dc1:4242").is_ok());
        assert!(validate_limiter_id("").is_err());
        assert!(validate_limiter_id("a b").is_err());
        assert!(validate_limiter_id("é").is_err());
        assert!(validate_limiter_id(&"x".repeat(256)).is_err());
        assert!(validate_limiter_id(&default_limiter_id()).is_ok());
    }

    #[test]
    fn a_config_is_checked_whole_and_errors_name_the_field() {
        assert!(config().validate().is_ok());
        let cases: Vec<(SyncConfig, &str)> = vec![
            (
                SyncConfig {
                    roots: vec!["ftp://x".into()],
                    ..config()
                },
                "roots",
            ),
            (
                SyncConfig {
                    roots: vec!["http://a".into(), "http://a/".into()],
                    ..config()
                },
                "roots",
            ),
            (
                SyncConfig {
                    roots: (0..=MAX_ROOTS).map(|i| format!("http://r{i}")).collect(),
                    ..config()
                },
                "roots",
            ),
            (
                SyncConfig {
                    roots: vec!["http://a".into(), "http://b".into()],
                    root_groups: vec![0, 2],
                    ..config()
                },
                "root_groups",
            ),
            (
                SyncConfig {
                    roots: vec!["http://a".into(), "http://b".into()],
                    root_groups: vec![0],
                    ..config()
                },
                "root_groups",
            ),
            (
                SyncConfig {
                    interval: Duration::from_millis(10),
                    ..config()
                },
                "interval",
            ),
            (
                SyncConfig {
                    interval: Duration::from_secs(3601),
                    ..config()
                },
                "interval",
            ),
            (
                SyncConfig {
                    timeout: Some(Duration::from_secs(1)),
                    ..config()
                },
                "timeout",
            ),
            (
                SyncConfig {
                    timeout: Some(Duration::ZERO),
                    ..config()
                },
                "timeout",
            ),
            (
                SyncConfig {
                    limiter_id: "a b".into(),
                    ..config()
                },
                "limiter",
            ),
            (
                SyncConfig {
                    early_sync: Some(EarlySync {
                        fraction: 0.0,
                        max_per_second: 4.0,
                    }),
                    ..config()
                },
                "early_sync.fraction",
            ),
            (
                SyncConfig {
                    early_sync: Some(EarlySync {
                        fraction: 0.5,
                        max_per_second: 1000.0,
                    }),
                    ..config()
                },
                "early_sync.max_per_second",
            ),
        ];
        for (c, field) in cases {
            assert_eq!(c.validate().unwrap_err().field, field, "{c:?}");
        }
    }

    #[test]
    fn a_limiter_takes_up_to_63_roots() {
        let roots = |n: usize| SyncConfig {
            roots: (0..n).map(|i| format!("http://10.0.0.{i}:7070")).collect(),
            ..config()
        };
        assert!(roots(MAX_ROOTS).validate().is_ok());
        let err = roots(MAX_ROOTS + 1).validate().unwrap_err();
        assert!(err.to_string().contains("at most 63"), "{err}");
    }

    #[test]
    fn groups_are_numbered_from_zero_with_no_gap() {
        assert!(validate_groups(&[0, 1, 1, 0, 2]).is_ok());
        assert!(validate_groups(&[]).is_ok());
        let err = validate_groups(&[1, 1]).unwrap_err();
        assert!(
            err.to_string().contains("group 0 has no quota root"),
            "{err}"
        );
        assert!(validate_groups(&[0, 16]).is_err());
        let every: Vec<u32> = (0..MAX_ROOTS as u32).collect();
        assert!(validate_groups(&every).is_ok());
        let past: Vec<u32> = (0..=MAX_ROOTS as u32).collect();
        assert!(validate_groups(&past).is_err());
        let c = SyncConfig {
            roots: vec!["http://a".into(), "http://b".into()],
            root_groups: vec![1, 0],
            ..config()
        };
        assert!(c.validate().is_ok());
        assert_eq!(c.groups(), vec![1, 0]);
        assert_eq!(config().groups(), vec![0]);
        assert_eq!(parse_group_arg(b"group=3"), Some(Ok(3)));
        assert!(parse_group_arg(b"group=x").unwrap().is_err());
        assert_eq!(parse_group_arg(b"group=62"), Some(Ok(62)));
        assert!(parse_group_arg(b"group=63").unwrap().is_err());
        assert_eq!(parse_group_arg(b"http://a"), None);
    }

    #[test]
    fn the_horizon_and_timeout_follow_the_interval() {
        let c = SyncConfig {
            interval: Duration::from_millis(250),
            ..config()
        };
        assert_eq!(horizon(c.interval), 500_000_000);
        assert_eq!(c.estimator(Extrapolation::Adaptive).horizon, 500_000_000);
        assert_eq!(c.request_timeout(), Duration::from_millis(200));
    }
}
