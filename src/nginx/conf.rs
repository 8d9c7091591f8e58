//! The module's configuration: the `http`-level [`MainConf`] (zone, roots,
//! sync), the per-location [`LocConf`] (checks, charges, status, dry run,
//! headers, metrics) and how a location inherits from the levels above it. The
//! directive handlers that fill them are in `directives.rs`.

use std::sync::Arc;
use std::time::Duration;

use ngx::ffi::{ngx_http_complex_value_t, ngx_shm_zone_t, ngx_uint_t, NGX_LOG_ERR, NGX_LOG_WARN};
use ngx::http::{Merge, MergeConfigError};

use super::args::{EmptyWeight, NoKey};
use super::headers::PolicyNames;
use super::request_counters::{RequestCounters, WAIT_MAX_SLOTS};
use super::unknown_names::UnknownNames;
use super::util::ConfPosition;
use super::zone_size::{DEFAULT_KEYS_SIZE, DEFAULT_OVERRIDES_SIZE};
use crate::core::key::KeySecret;
use crate::core::spec::QuotaSet;
use crate::sync::config::SyncConfig;
use crate::table::Table;

/// `sluice_sync_interval` when not given, milliseconds.
const DEFAULT_INTERVAL_MS: u64 = 1000;
/// Per-quota series in `sluice_metrics` output unless `top=` says otherwise.
pub(crate) const DEFAULT_METRICS_TOP: usize = 100;

/// A quota file named by `sluice_quotas`, read and checked at
/// configuration time.
#[derive(Debug)]
pub(crate) struct QuotaFile {
    /// The path as resolved against the configuration prefix.
    pub path: String,
    /// Its quotas.
    pub set: QuotaSet,
    /// Where `sluice_quotas` named it (for an error only the zone shows).
    pub at: ConfPosition,
}

/// The `http`-level configuration.
#[derive(Debug, Default)]
pub(crate) struct MainConf {
    /// `sluice_zone` size in bytes.
    pub zone_size: Option<usize>,
    /// Where `sluice_zone` was given (for an error only the zone shows).
    pub zone_at: Option<ConfPosition>,
    /// `sluice_root` URLs, in order.
    pub roots: Vec<String>,
    /// The group (`group=<n>`, default 0) of each of `roots`.
    pub root_groups: Vec<u32>,
    /// Where each group was named last, by group: a gap in the numbers
    /// shows only once the `http` block is read, and is reported at the
    /// line that names the highest group.
    pub group_lines: Vec<(u32, ConfPosition)>,
    /// `sluice_quotas`.
    pub quotas: Option<QuotaFile>,
    /// The quota names `sluice` and `sluice_charge` directives give as
    /// literals, and where: checked against `sluice_quotas` once the
    /// `http` block is read.
    pub literal_names: Vec<(String, ConfPosition)>,
    /// `sluice_sync_interval`, milliseconds.
    pub sync_interval_ms: Option<u64>,
    /// `sluice_sync_timeout`, milliseconds.
    pub sync_timeout_ms: Option<u64>,
    /// `sluice_in_flight_lease`, milliseconds.
    pub in_flight_lease_ms: Option<u64>,
    /// The token read from `sluice_sync_token_file`.
    pub sync_token: Option<String>,
    /// `sluice_host_id`.
    pub host_id: Option<String>,
    /// `sluice_sync_early`.
    pub early_sync: Option<crate::sync::EarlySync>,
    /// `sluice_keys`: bytes of the zone given to keys of per-key quotas.
    pub keys_size: Option<usize>,
    /// `sluice_overrides`: bytes of the zone given to overrides of
    /// per-key templates and penalties.
    pub overrides_size: Option<usize>,
    /// The secret read from `sluice_key_secret_file`.
    pub key_secret: Option<KeySecret>,
    /// `sluice_key_overflow`.
    pub key_overflow: Option<crate::table::KeyOverflow>,
    /// Some directive needs the zone (a check, the metrics, a root or a
    /// quota file).
    pub used: bool,
    /// `sluice_wait_max` directives read so far (each takes the next slot).
    pub wait_max_slots: usize,
    /// The location configurations that have the default cap on holds
    /// (no `sluice_wait_max` at any level): its number comes from
    /// `worker_connections`, which nginx has read only once the whole
    /// configuration is (the `events` block may follow `http`), so
    /// `init_module` sets it in each ([`WaitMax::default_for`]).
    pub default_caps: Vec<*mut LocConf>,
    /// The shared zone this cycle uses (null until `init_main_conf`).
    pub zone: *mut ngx_shm_zone_t,
    /// The table in the zone, once the zone is initialised.
    pub table: Option<Arc<Table>>,
    /// The request counters in the zone (null until it is initialised).
    pub counters: *const RequestCounters,
    /// When each unknown name was last logged, in the zone (null until it
    /// is initialised).
    pub unknown_names: *const UnknownNames,
}

// SAFETY: the raw zone pointer is only dereferenced by nginx's own thread.
unsafe impl Send for MainConf {}

impl MainConf {
    /// The zone's request counters, once the zone is initialised.
    pub fn counters(&self) -> Option<&RequestCounters> {
        // SAFETY: set by the zone's init to memory of the zone, which
        // outlives the configuration that points at it.
        unsafe { self.counters.as_ref() }
    }

    /// The zone's record of unknown names logged, once the zone is
    /// initialised.
    pub fn unknown_names(&self) -> Option<&UnknownNames> {
        // SAFETY: as for `counters`.
        unsafe { self.unknown_names.as_ref() }
    }

    /// The sync interval in effect.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.sync_interval_ms.unwrap_or(DEFAULT_INTERVAL_MS))
    }

    /// Bytes of the zone given to keys of per-key quotas.
    pub fn keys_size(&self) -> usize {
        self.keys_size.unwrap_or(DEFAULT_KEYS_SIZE)
    }

    /// Bytes of the zone given to overrides and penalties.
    pub fn overrides_size(&self) -> usize {
        self.overrides_size.unwrap_or(DEFAULT_OVERRIDES_SIZE)
    }

    /// The sync configuration these directives make (logging to stderr
    /// until the worker sets its own sink).
    pub fn sync_config(&self) -> SyncConfig {
        SyncConfig {
            roots: self.roots.clone(),
            root_groups: self.root_groups.clone(),
            interval: self.interval(),
            timeout: self.sync_timeout_ms.map(Duration::from_millis),
            token: self.sync_token.clone(),
            limiter_id: self
                .host_id
                .clone()
                .unwrap_or_else(crate::sync::default_limiter_id),
            early_sync: self.early_sync,
            in_flight_lease: self.in_flight_lease_ms.map_or(
                crate::sync::config::DEFAULT_IN_FLIGHT_LEASE,
                Duration::from_millis,
            ),
            ..SyncConfig::default()
        }
    }
}

/// How a check's weight is given.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Weight {
    /// `weight=<n>` (1 when absent).
    Fixed(u64),
    /// `weight=$variable` (or any complex value), read per request.
    Value {
        /// The compiled value.
        value: *const ngx_http_complex_value_t,
        /// What an empty value means (`empty=`; rejected by default).
        empty: EmptyWeight,
    },
}

/// One `sluice <name> [key=...] [weight=...] [wait=...]` directive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Check {
    /// The quota name, a complex value (variables allowed).
    pub name: *const ngx_http_complex_value_t,
    /// `key=`: the key of a per-key quota, read per request.
    pub key: Option<*const ngx_http_complex_value_t>,
    /// The weight.
    pub weight: Weight,
    /// `wait=`: pace instead of rejecting a request whose turn comes
    /// within this many nanoseconds (`None`: a plain check).
    pub max_wait: Option<u64>,
    /// `no_key=`: what an empty key does (`pass` unless given).
    pub no_key: NoKey,
}

/// One `sluice_charge <name> [key=...] weight=... [if=...] [settle]`
/// directive: a weight counted after the response (see `charge.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChargeConf {
    /// The quota name, a complex value (variables allowed).
    pub name: *const ngx_http_complex_value_t,
    /// `key=`: the key of a per-key quota.
    pub key: Option<*const ngx_http_complex_value_t>,
    /// `weight=`: the units to count (an empty value counts nothing).
    pub weight: Weight,
    /// `if=`: charge only when this is neither empty nor "0".
    pub condition: Option<*const ngx_http_complex_value_t>,
    /// `settle`: count only the difference from the weight the
    /// request's `sluice` check of the same quota (and key) counted.
    pub settle: bool,
}

/// `sluice_metrics` in a location.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MetricsConf {
    /// Quotas that get their own series (the busiest ones).
    pub top: usize,
}

/// The per-location configuration (also at `http` and `server` level,
/// merged down like `limit_req`).
#[derive(Debug, Default)]
pub(crate) struct LocConf {
    /// The checks; `None` inherits the enclosing level's, `Some(empty)` is
    /// `sluice off`.
    pub checks: Option<Vec<Check>>,
    /// `sluice_charge` directives; `None` inherits the enclosing level's.
    pub charges: Option<Vec<ChargeConf>>,
    /// `sluice_status`.
    pub status: Option<ngx_uint_t>,
    /// `sluice_deny_status`: the status of a request whose key an
    /// override denies.
    pub deny_status: Option<ngx_uint_t>,
    /// `sluice_dry_run`.
    pub dry_run: Option<bool>,
    /// `sluice_log_level` (an nginx log level).
    pub log_level: Option<ngx_uint_t>,
    /// `sluice_unknown_log`: the level a check of a name no quota has is
    /// logged at (`Some(None)`: `off`).
    pub unknown_log: Option<Option<ngx_uint_t>>,
    /// `sluice_headers`.
    pub headers: Option<bool>,
    /// `sluice_headers ... names=`: how the RateLimit fields name quotas
    /// (given with `headers`, inherited with it).
    pub header_names: PolicyNames,
    /// `sluice_wait_coalesce`, in milliseconds (0: off).
    pub wait_coalesce: Option<u64>,
    /// `sluice_wait_max`: at most this many requests held under the
    /// directive, and its slot in the zone's counts; after the merge, the
    /// default cap where no level gave one.
    pub wait_max: Option<WaitMax>,
    /// `sluice_metrics` (this location only, not inherited).
    pub metrics: Option<MetricsConf>,
    /// `sluice off` was given at this level.
    pub off: bool,
}

/// A `sluice_wait_max` directive: its cap, and the slot of the zone's
/// counts ([`super::request_counters::RequestCounters::held_by_cap`]) the
/// requests held under it share (the locations that inherit it too).
/// Locations with none of their own share the default cap
/// ([`WaitMax::default_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaitMax {
    /// Most requests held at once.
    pub max: u32,
    /// Its slot.
    pub slot: usize,
}

/// The slot of the zone's hold counts the default cap uses: the last, so
/// `sluice_wait_max` directives take the others.
pub(crate) const DEFAULT_WAIT_MAX_SLOT: usize = WAIT_MAX_SLOTS - 1;

/// Largest cap `sluice_wait_max` takes, and the default cap's too.
pub(crate) const MAX_WAIT_MAX: u32 = 1_000_000;

impl WaitMax {
    /// The cap of the locations that set none: half of one worker's
    /// `worker_connections`, every worker's holds together, so held
    /// requests never take more than half of the connections of even a
    /// worker that holds them all, and the others (other locations,
    /// requests that are not held) keep the rest. At least 1.
    pub fn default_for(worker_connections: usize) -> Self {
        let half = (worker_connections / 2).clamp(1, MAX_WAIT_MAX as usize);
        Self {
            max: half as u32,
            slot: DEFAULT_WAIT_MAX_SLOT,
        }
    }
}

impl LocConf {
    /// The status code rejected requests get.
    pub fn status(&self) -> ngx_uint_t {
        self.status.unwrap_or(429)
    }

    /// The status code requests of a denied key get.
    pub fn deny_status(&self) -> ngx_uint_t {
        self.deny_status.unwrap_or(403)
    }

    /// The level rejections are logged at.
    pub fn log_level(&self) -> ngx_uint_t {
        self.log_level.unwrap_or(NGX_LOG_ERR as ngx_uint_t)
    }

    /// The level checks of unknown names are logged at; `None`: not
    /// logged.
    pub fn unknown_log_level(&self) -> Option<ngx_uint_t> {
        self.unknown_log.unwrap_or(Some(NGX_LOG_WARN as ngx_uint_t))
    }

    /// How much earlier than its turn a held request may be let go, in
    /// milliseconds, to share a wakeup the worker has anyway (0: never).
    pub fn wait_coalesce_ms(&self) -> u64 {
        self.wait_coalesce.unwrap_or(0)
    }
}

impl Merge for LocConf {
    fn merge(&mut self, prev: &Self) -> Result<(), MergeConfigError> {
        if self.checks.is_none() {
            self.checks.clone_from(&prev.checks);
        }
        if self.charges.is_none() {
            self.charges.clone_from(&prev.charges);
        }
        self.status = self.status.or(prev.status);
        self.deny_status = self.deny_status.or(prev.deny_status);
        self.dry_run = self.dry_run.or(prev.dry_run);
        self.log_level = self.log_level.or(prev.log_level);
        self.unknown_log = self.unknown_log.or(prev.unknown_log);
        if self.headers.is_none() {
            self.headers = prev.headers;
            self.header_names = prev.header_names;
        }
        self.wait_coalesce = self.wait_coalesce.or(prev.wait_coalesce);
        self.wait_max = self.wait_max.or(prev.wait_max);
        Ok(())
    }
}
