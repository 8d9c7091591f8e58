//! The root's configuration: a TOML file and command-line flags.
//!
//! Flags override the file and the file overrides the defaults, key by key.
//! Every key of the file has a flag of the same name (with `-` for `_`)
//! except the tuning knobs, which only the file sets:
//!
//! ```toml
//! listen = "127.0.0.1:7070"
//! db = "sqlite://./sluice.db"         # or "postgres://user:pass@host/db"
//! admin_token_file = "/etc/sluice/admin.token"
//! sync_token_file = "/etc/sluice/sync.token"
//! reload_interval = "1s"
//! db_timeout = "3s"                  # waiting for a database connection
//! db_query_timeout = "120s"          # one read, write or bulk apply
//! max_connections = 1024
//! max_connections_per_address = 256  # untrusted connections of one client address
//! header_timeout = "10s"             # accept (or a request's first byte) to its last header
//! idle_timeout = "60s"               # between requests on a kept-alive connection
//! body_timeout = "60s"               # a request body's upload, a response body's download
//! min_body_rate = 65536              # bytes/s a request body must keep up (0: off)
//! body_grace = "5s"                  # how long a body may stall or lag behind min_body_rate
//! max_in_flight = 256
//! max_syncs_per_limiter = 2          # syncs of one limiter id in flight at once
//! max_sync_body = 67108864
//! max_admin_body = 1048576
//! max_apply_body = 268435456
//! max_body_memory = 536870912        # request bodies held at once, all requests
//! sync_page_quotas = 20000
//! sync_page_counters = 100000
//! max_keys = 2000000                 # key counters of per-key quotas held at once
//! max_keys_per_limiter = 500000      # key counters one limiter may make (default max_keys / 4)
//! sync_interest_per_limiter = 1048576  # keys a root records one limiter holds (replies by interest)
//! sync_interest_total = 50000000     # keys it records every limiter holds, together
//! level_cap_seconds = 5.0            # a leaky counter's cap: 2 high_bursts + limit * this
//! max_limiters = 100000              # limiter ids the registry holds (console, quota views)
//! limiter_expiry = "1h"              # a limiter id not heard from this long is forgotten
//! in_flight_lease = "10s"            # a limiter silent this long loses its in-flight slots
//! limiter_tokens_file = "/etc/sluice/limiters.tokens"  # per-limiter sync tokens
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::auth::Token;
use super::connections::ConnectionLimits;

/// Default listen address: loopback, so a root started without tokens is
/// not reachable from other hosts.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// Default database: an SQLite file in the working directory, created if
/// missing.
pub const DEFAULT_DB: &str = "sqlite://./sluice.db";

/// Flags of `sluice root`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct RootArgs {
    /// TOML config file; flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to serve HTTP on [default: 127.0.0.1:7070].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Quota database: `sqlite://PATH` (created if missing) or
    /// `postgres://...` [default: sqlite://./sluice.db].
    #[arg(long, value_name = "URL")]
    pub db: Option<String>,
    /// File holding the bearer token of the admin API.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// File holding the bearer token limiters must send to `/v1/sync`.
    #[arg(long, value_name = "FILE")]
    pub sync_token_file: Option<PathBuf>,
    /// File of per-limiter sync tokens, one `limiter_id token` a line: a
    /// limiter listed there may sync only with its own token.
    #[arg(long, value_name = "FILE")]
    pub limiter_tokens_file: Option<PathBuf>,
    /// How often to reread changed quotas from the database [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub reload_interval: Option<Duration>,
}

/// The TOML file: every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RootFile {
    listen: Option<SocketAddr>,
    db: Option<String>,
    admin_token_file: Option<PathBuf>,
    sync_token_file: Option<PathBuf>,
    reload_interval: Option<String>,
    db_timeout: Option<String>,
    db_query_timeout: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_address: Option<usize>,
    header_timeout: Option<String>,
    idle_timeout: Option<String>,
    body_timeout: Option<String>,
    min_body_rate: Option<u64>,
    body_grace: Option<String>,
    max_in_flight: Option<usize>,
    max_syncs_per_limiter: Option<usize>,
    max_sync_body: Option<usize>,
    max_admin_body: Option<usize>,
    max_apply_body: Option<usize>,
    max_body_memory: Option<usize>,
    sync_page_quotas: Option<usize>,
    sync_page_counters: Option<usize>,
    max_keys: Option<usize>,
    max_keys_per_limiter: Option<usize>,
    sync_interest_per_limiter: Option<usize>,
    sync_interest_total: Option<usize>,
    level_cap_seconds: Option<f64>,
    max_limiters: Option<usize>,
    limiter_expiry: Option<String>,
    in_flight_lease: Option<String>,
    limiter_tokens_file: Option<PathBuf>,
}

/// A configuration that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Largest request bodies accepted, per kind of endpoint, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    /// `POST /v1/sync` (a million deltas is about 40 MB of JSON).
    pub sync: usize,
    /// `PUT /v1/quotas/{name}`.
    pub admin: usize,
    /// `POST /v1/apply` (a whole quota set).
    pub apply: usize,
    /// Request body bytes held at once by all requests together, and
    /// what syncs decode them to: a body is charged as it arrives, a sync
    /// before it is decoded (see [`super::api::admission`]).
    pub total: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            sync: 64 << 20,
            admin: 1 << 20,
            apply: 256 << 20,
            total: 512 << 20,
        }
    }
}

/// Everything a root needs to run, resolved and checked.
#[derive(Clone, Debug)]
pub struct RootConfig {
    /// Address to serve on.
    pub listen: SocketAddr,
    /// Database URL (`sqlite://...` or `postgres://...`).
    pub db: String,
    /// Token the admin API requires; `None` leaves it open (loopback only).
    pub admin_token: Option<Token>,
    /// Token `/v1/sync` requires; `None` leaves it open.
    pub sync_token: Option<Token>,
    /// File of per-limiter sync tokens ([`super::credentials`]); read at
    /// start (an error fails the start) and reread when it changes.
    pub limiter_tokens_file: Option<PathBuf>,
    /// Period of the quota reload from the database.
    pub reload_interval: Duration,
    /// How long a database operation may wait for a connection before the
    /// root calls the database unavailable.
    pub db_timeout: Duration,
    /// How long one database operation (a reload page, a write, a bulk
    /// apply) may take before the root abandons it and calls the database
    /// unavailable.
    pub db_query_timeout: Duration,
    /// Most TCP connections served at once; at the limit a new connection
    /// sheds the least recently active unauthenticated idle one, or is
    /// closed if there is none (see [`super::connections`]).
    pub max_connections: usize,
    /// Most unauthenticated connections one client address holds; beyond
    /// it a new one sheds that address's least recently active idle one.
    pub max_connections_per_address: usize,
    /// Longest wait for a request's head (request line and headers), from
    /// accept or from the request's first byte.
    pub header_timeout: Duration,
    /// Longest idle spell of a kept-alive connection between requests.
    pub idle_timeout: Duration,
    /// Longest a request body may take to arrive, and a response body to
    /// be taken.
    pub body_timeout: Duration,
    /// Bytes a second a request body must keep arriving at (0: no rate,
    /// only `body_timeout`).
    pub min_body_rate: u64,
    /// How long a request body may stall, or lag behind `min_body_rate`,
    /// before it is cut.
    pub body_grace: Duration,
    /// Most requests handled at once (their bodies in); the rest wait for
    /// a slot. `/healthz` and `/metrics` have slots of their own.
    pub max_in_flight: usize,
    /// Most syncs of one limiter id in flight at once; one more is
    /// refused with 429.
    pub max_syncs_per_limiter: usize,
    /// Request body limits.
    pub body_limits: BodyLimits,
    /// Most quotas in one sync reply; a fresh limiter pages through the rest.
    pub sync_page_quotas: usize,
    /// Most counters in one sync reply; the rest follow in the next syncs.
    pub sync_page_counters: usize,
    /// Most key counters (keys of per-key quotas) held at once; deltas of
    /// further keys are ignored and counted until drained keys are
    /// forgotten.
    pub max_keys: usize,
    /// Most key counters one limiter may make (the one whose delta made a
    /// key counter holds it against its share): one sync token's junk
    /// keys hold at most this many places. `None`: a quarter of
    /// `max_keys`.
    pub max_keys_per_limiter: Option<usize>,
    /// Most keys the root records that one limiter holds, and all
    /// limiters together, to answer each with its own keys' counters
    /// only (see [`super::interest`]); past them a limiter is sent every
    /// changed counter.
    pub interest: super::interest::InterestLimits,
    /// A leaky counter is kept at most at `2 * high_burst + limit *` this
    /// many seconds (see [`super::trust`]).
    pub level_cap_seconds: f64,
    /// Most limiter ids the registry holds; past it the one heard from
    /// least recently is forgotten (see [`super::limiters`]).
    pub max_limiters: usize,
    /// A limiter id not heard from for this long is forgotten.
    pub limiter_expiry: Duration,
    /// A limiter not heard from for this long loses the in-flight slots
    /// it holds (see [`super::in_flight`]); a few of the fleet's sync
    /// intervals (at least three), and shorter than `limiter_expiry`.
    pub in_flight_lease: Duration,
}

impl Default for RootConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN
                .parse()
                .expect("the default listen address parses"),
            db: DEFAULT_DB.to_string(),
            admin_token: None,
            sync_token: None,
            limiter_tokens_file: None,
            reload_interval: Duration::from_secs(1),
            db_timeout: Duration::from_secs(3),
            db_query_timeout: crate::root::store::DEFAULT_QUERY_TIMEOUT,
            max_connections: 1024,
            max_connections_per_address: 256,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            min_body_rate: 64 << 10,
            body_grace: Duration::from_secs(5),
            max_in_flight: 256,
            max_syncs_per_limiter: 2,
            body_limits: BodyLimits::default(),
            sync_page_quotas: 20_000,
            sync_page_counters: 100_000,
            max_keys: 2_000_000,
            max_keys_per_limiter: None,
            interest: super::interest::InterestLimits::default(),
            level_cap_seconds: super::trust::DEFAULT_CAP_SECONDS,
            max_limiters: super::limiters::DEFAULT_MAX_LIMITERS,
            limiter_expiry: super::limiters::DEFAULT_EXPIRY,
            in_flight_lease: super::in_flight::DEFAULT_LEASE,
        }
    }
}

impl RootConfig {
    /// Resolves flags over the config file (if any) over the defaults,
    /// reads the token files and checks the result.
    pub fn load(args: &RootArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => RootFile::default(),
        };
        let mut config = Self::default();
        config.apply_file(file)?;
        config.apply_args(args)?;
        config.check()?;
        // Read again when the root starts; here it fails before binding.
        if let Some(path) = &config.limiter_tokens_file {
            super::credentials::LimiterTokens::read(path)
                .map_err(|e| ConfigError(e.to_string()))?;
        }
        Ok(config)
    }

    fn apply_file(&mut self, file: RootFile) -> Result<(), ConfigError> {
        let RootFile {
            listen,
            db,
            admin_token_file,
            sync_token_file,
            reload_interval,
            db_timeout,
            db_query_timeout,
            max_connections,
            max_connections_per_address,
            header_timeout,
            idle_timeout,
            body_timeout,
            min_body_rate,
            body_grace,
            max_in_flight,
            max_syncs_per_limiter,
            max_sync_body,
            max_admin_body,
            max_apply_body,
            max_body_memory,
            sync_page_quotas,
            sync_page_counters,
            max_keys,
            max_keys_per_limiter,
            sync_interest_per_limiter,
            sync_interest_total,
            level_cap_seconds,
            max_limiters,
            limiter_expiry,
            in_flight_lease,
            limiter_tokens_file,
        } = file;
        set(&mut self.listen, listen);
        set(&mut self.db, db);
        if let Some(path) = admin_token_file {
            self.admin_token = Some(read_token(&path)?);
        }
        if let Some(path) = sync_token_file {
            self.sync_token = Some(read_token(&path)?);
        }
        if let Some(text) = reload_interval {
            self.reload_interval = duration_key("reload_interval", &text)?;
        }
        if let Some(text) = db_timeout {
            self.db_timeout = duration_key("db_timeout", &text)?;
        }
        if let Some(text) = db_query_timeout {
            self.db_query_timeout = duration_key("db_query_timeout", &text)?;
        }
        set(&mut self.max_connections, max_connections);
        set(
            &mut self.max_connections_per_address,
            max_connections_per_address,
        );
        for (key, text, slot) in [
            ("header_timeout", header_timeout, &mut self.header_timeout),
            ("idle_timeout", idle_timeout, &mut self.idle_timeout),
            ("body_timeout", body_timeout, &mut self.body_timeout),
            ("body_grace", body_grace, &mut self.body_grace),
            ("limiter_expiry", limiter_expiry, &mut self.limiter_expiry),
            (
                "in_flight_lease",
                in_flight_lease,
                &mut self.in_flight_lease,
            ),
        ] {
            if let Some(text) = text {
                *slot = duration_key(key, &text)?;
            }
        }
        set(&mut self.min_body_rate, min_body_rate);
        set(&mut self.max_in_flight, max_in_flight);
        set(&mut self.max_syncs_per_limiter, max_syncs_per_limiter);
        set(&mut self.body_limits.sync, max_sync_body);
        set(&mut self.body_limits.admin, max_admin_body);
        set(&mut self.body_limits.apply, max_apply_body);
        set(&mut self.body_limits.total, max_body_memory);
        set(&mut self.sync_page_quotas, sync_page_quotas);
        set(&mut self.sync_page_counters, sync_page_counters);
        set(&mut self.max_keys, max_keys);
        if max_keys_per_limiter.is_some() {
            self.max_keys_per_limiter = max_keys_per_limiter;
        }
        set(&mut self.interest.per_limiter, sync_interest_per_limiter);
        set(&mut self.interest.total, sync_interest_total);
        set(&mut self.level_cap_seconds, level_cap_seconds);
        set(&mut self.max_limiters, max_limiters);
        if limiter_tokens_file.is_some() {
            self.limiter_tokens_file = limiter_tokens_file;
        }
        Ok(())
    }

    fn apply_args(&mut self, args: &RootArgs) -> Result<(), ConfigError> {
        set(&mut self.listen, args.listen);
        set(&mut self.db, args.db.clone());
        if let Some(path) = &args.admin_token_file {
            self.admin_token = Some(read_token(path)?);
        }
        if let Some(path) = &args.sync_token_file {
            self.sync_token = Some(read_token(path)?);
        }
        if args.limiter_tokens_file.is_some() {
            self.limiter_tokens_file = args.limiter_tokens_file.clone();
        }
        set(&mut self.reload_interval, args.reload_interval);
        Ok(())
    }

    /// Checks the values that flags and files cannot rule out by type.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.admin_token.is_none() && !self.listen.ip().is_loopback() {
            return Err(ConfigError(format!(
                "listening on {} without an admin token would open the admin API to the \
                 network; set admin_token_file or listen on a loopback address",
                self.listen
            )));
        }
        positive("reload_interval", self.reload_interval.as_nanos() as usize)?;
        positive("db_timeout", self.db_timeout.as_nanos() as usize)?;
        positive(
            "db_query_timeout",
            self.db_query_timeout.as_nanos() as usize,
        )?;
        positive("max_connections", self.max_connections)?;
        positive(
            "max_connections_per_address",
            self.max_connections_per_address,
        )?;
        if self.max_connections_per_address > self.max_connections {
            return Err(ConfigError(format!(
                "max_connections_per_address ({}) must not exceed max_connections ({})",
                self.max_connections_per_address, self.max_connections
            )));
        }
        for (key, value) in [
            ("header_timeout", self.header_timeout),
            ("idle_timeout", self.idle_timeout),
            ("body_timeout", self.body_timeout),
            ("body_grace", self.body_grace),
            ("limiter_expiry", self.limiter_expiry),
            ("in_flight_lease", self.in_flight_lease),
        ] {
            positive(key, value.as_nanos() as usize)?;
        }
        if self.in_flight_lease >= self.limiter_expiry {
            // A forgotten limiter's slots go at once: the lease must end
            // first for it to mean anything.
            return Err(ConfigError(format!(
                "in_flight_lease ({:?}) must be shorter than limiter_expiry ({:?})",
                self.in_flight_lease, self.limiter_expiry
            )));
        }
        positive("max_in_flight", self.max_in_flight)?;
        positive("max_syncs_per_limiter", self.max_syncs_per_limiter)?;
        positive("max_limiters", self.max_limiters)?;
        if self.max_limiters > super::limiters::MOST_LIMITERS {
            return Err(ConfigError(format!(
                "max_limiters must be at most {}, not {}",
                super::limiters::MOST_LIMITERS,
                self.max_limiters
            )));
        }
        positive("max_sync_body", self.body_limits.sync)?;
        positive("max_admin_body", self.body_limits.admin)?;
        positive("max_apply_body", self.body_limits.apply)?;
        positive("max_body_memory", self.body_limits.total)?;
        positive("sync_page_quotas", self.sync_page_quotas)?;
        positive("sync_page_counters", self.sync_page_counters)?;
        positive("max_keys", self.max_keys)?;
        positive("sync_interest_per_limiter", self.interest.per_limiter)?;
        positive("sync_interest_total", self.interest.total)?;
        if let Some(share) = self.max_keys_per_limiter {
            positive("max_keys_per_limiter", share)?;
            if share > self.max_keys {
                return Err(ConfigError(format!(
                    "max_keys_per_limiter must be at most max_keys ({}), not {share}",
                    self.max_keys
                )));
            }
        }
        if !(self.level_cap_seconds.is_finite() && (0.0..=1e6).contains(&self.level_cap_seconds)) {
            return Err(ConfigError(format!(
                "level_cap_seconds must be between 0 and 1000000, not {}",
                self.level_cap_seconds
            )));
        }
        Ok(())
    }
}

impl RootConfig {
    /// The limits the listener admits and times connections by.
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections,
            max_per_address: self.max_connections_per_address,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            send_timeout: self.body_timeout,
        }
    }
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

fn positive(key: &str, value: usize) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError(format!("{key} must be greater than zero")));
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<RootFile, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| {
        let at = toml_position(&text, &e)
            .map(|(line, column)| format!(" at line {line}, column {column}"))
            .unwrap_or_default();
        // toml's own Display spans several lines with a snippet.
        let message = e.message().trim().replace('\n', " ");
        ConfigError(format!("config {}: {message}{at}", path.display()))
    })
}

pub use crate::core::spec::toml_position;

fn read_token(path: &Path) -> Result<Token, ConfigError> {
    Token::from_file(path).map_err(|e| ConfigError(format!("token file {}: {e}", path.display())))
}

fn duration_key(key: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|e| ConfigError(format!("{key}: {e}")))
}

/// Parses a duration such as `250ms`, `1s`, `1.5s` or `2m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 1s"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "s" | "" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m or h)"
            ))
        }
    };
    let seconds = value * scale;
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("1 fortnight").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root.toml");
        std::fs::write(
            &path,
            "db = \"sqlite://file.db\"\nreload_interval = \"5s\"\nsync_page_quotas = 7\n\
             db_query_timeout = \"90s\"\n",
        )
        .unwrap();
        let args = RootArgs {
            config: Some(path),
            reload_interval: Some(Duration::from_millis(100)),
            ..RootArgs::default()
        };
        let config = RootConfig::load(&args).unwrap();
        assert_eq!(config.db, "sqlite://file.db");
        assert_eq!(config.reload_interval, Duration::from_millis(100));
        assert_eq!(config.sync_page_quotas, 7);
        assert_eq!(config.db_query_timeout, Duration::from_secs(90));
        assert_eq!(config.db_timeout, Duration::from_secs(3));
        assert_eq!(config.listen, DEFAULT_LISTEN.parse().unwrap());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root.toml");
        std::fs::write(&path, "lisen = \"127.0.0.1:1\"\n").unwrap();
        let args = RootArgs {
            config: Some(path.clone()),
            ..RootArgs::default()
        };
        assert!(RootConfig::load(&args).unwrap_err().0.contains("lisen"));
        // A syntax error: one line, with the position.
        std::fs::write(&path, "db = \"x\"\nmax_in_flight = = 3\n").unwrap();
        let error = RootConfig::load(&args).unwrap_err().0;
        assert!(!error.contains('\n'), "{error}");
        assert!(error.contains("at line 2, column"), "{error}");
        std::fs::write(&path, "max_in_flight = 0\n").unwrap();
        assert!(RootConfig::load(&args)
            .unwrap_err()
            .0
            .contains("max_in_flight"));
        std::fs::write(&path, "db_query_timeout = \"0s\"\n").unwrap();
        assert!(RootConfig::load(&args)
            .unwrap_err()
            .0
            .contains("db_query_timeout"));
    }

    #[test]
    fn a_public_listen_address_needs_an_admin_token() {
        let args = RootArgs {
            listen: Some("0.0.0.0:7070".parse().unwrap()),
            ..RootArgs::default()
        };
        assert!(RootConfig::load(&args)
            .unwrap_err()
            .0
            .contains("admin token"));
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("admin.token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let args = RootArgs {
            admin_token_file: Some(token),
            ..args
        };
        assert!(RootConfig::load(&args).is_ok());
    }
}
