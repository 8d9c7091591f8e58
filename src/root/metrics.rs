//! Counters of what the root did, rendered as Prometheus text.
//!
//! Event counts are atomics bumped by the handlers; sizes (quotas,
//! counters, limiters, epoch) and health are read at scrape time. Every
//! metric is prefixed `sluice_root_`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::connections::{CloseReason, ConnectionStats, Refusal};
use super::health::HealthSnapshot;
use super::ledger::LedgerStats;
use super::limiters::Dropped;
use super::tier_book::{PenaltyRefusal, PenaltyStats};

/// Outcome of a sync request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncResult {
    /// Answered.
    Ok,
    /// Refused as invalid (400, 413).
    Rejected,
    /// Missing or wrong sync token (401).
    Unauthorized,
    /// Not ready yet (503).
    Unavailable,
    /// A token that may not write as the limiter named (403).
    Forbidden,
    /// Its limiter had its most syncs in flight (429).
    Busy,
}

impl SyncResult {
    const ALL: [Self; 6] = [
        Self::Ok,
        Self::Rejected,
        Self::Unauthorized,
        Self::Unavailable,
        Self::Forbidden,
        Self::Busy,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::Unauthorized => "unauthorized",
            Self::Unavailable => "unavailable",
            Self::Forbidden => "forbidden",
            Self::Busy => "busy",
        }
    }
}

/// Which API a rejected request was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/sync`.
    Sync,
    /// The admin API.
    Admin,
}

impl Api {
    const ALL: [Self; 2] = [Self::Sync, Self::Admin];

    fn label(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Admin => "admin",
        }
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Not JSON of the expected shape.
    Malformed,
    /// Body over the limit.
    TooLarge,
    /// Well-formed but invalid values.
    Invalid,
    /// Missing or wrong token.
    Unauthorized,
    /// The body did not arrive within `body_timeout`, or fell behind
    /// `min_body_rate`.
    BodyTimeout,
    /// A valid token that may not do this (a sync as another limiter).
    Forbidden,
    /// A sync of a limiter with its most syncs in flight.
    Busy,
    /// The body memory budget was in use.
    NoMemory,
}

impl Rejection {
    const ALL: [Self; 8] = [
        Self::Malformed,
        Self::TooLarge,
        Self::Invalid,
        Self::Unauthorized,
        Self::BodyTimeout,
        Self::Forbidden,
        Self::Busy,
        Self::NoMemory,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::TooLarge => "too_large",
            Self::Invalid => "invalid",
            Self::Unauthorized => "unauthorized",
            Self::BodyTimeout => "body_timeout",
            Self::Forbidden => "forbidden",
            Self::Busy => "syncs_in_flight",
            Self::NoMemory => "body_memory",
        }
    }
}

/// Upper bounds of the sync latency buckets, in seconds.
const LATENCY_BOUNDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    /// Sum of observations, nanoseconds.
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BOUNDS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = LATENCY_BOUNDS
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

/// Event counts of one root.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Sync requests by [`SyncResult`].
    syncs: [AtomicU64; SyncResult::ALL.len()],
    /// Time to handle a sync (parse to serialised reply).
    pub sync_seconds: Histogram,
    /// Deltas added to counters.
    deltas_applied: AtomicU64,
    /// Deltas dropped: unknown or deleted quota.
    deltas_ignored: AtomicU64,
    /// Deltas cut to the limiter's allowance.
    deltas_clipped: AtomicU64,
    /// Weight cut from them (whole units, rounded down per sync).
    weight_clipped: AtomicU64,
    /// Weight limiters gave back to counters (whole units, rounded down
    /// per sync).
    weight_returned: AtomicU64,
    /// Rejections cut from syncs' counts.
    rejections_clipped: AtomicU64,
    /// Numbered sync parts sent again that this root had applied (their
    /// weight not counted twice).
    sync_duplicates: AtomicU64,
    /// Quotas sent in sync replies.
    quotas_sent: AtomicU64,
    /// Counters sent in sync replies.
    counters_sent: AtomicU64,
    /// Refused requests by [`Api`] and [`Rejection`].
    rejected: [[AtomicU64; Rejection::ALL.len()]; 2],
    /// Admin writes committed.
    admin_writes: AtomicU64,
    /// Quota reloads that succeeded / failed.
    reloads: [AtomicU64; 2],
    /// Quotas read by reloads.
    quotas_loaded: AtomicU64,
    /// Quota rows skipped by reloads because they are invalid.
    quotas_invalid: AtomicU64,
}

/// What a scrape reads besides the event counts.
#[derive(Clone, Debug)]
pub struct Scrape {
    /// Sizes of the in-memory state.
    pub stats: LedgerStats,
    /// Limiters that synced in the last five minutes.
    pub active_limiters: usize,
    /// Readiness and database state.
    pub health: HealthSnapshot,
    /// This root process's instance id.
    pub instance: u64,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Open connections and what admission did.
    pub connections: ConnectionStats,
    /// Bytes of the body memory budget held by requests.
    pub body_memory: usize,
    /// Limiters whose deltas were clipped, most clipped first (at most
    /// [`CLIPPED_SERIES`]): id, deltas clipped, weight clipped.
    pub clipped: Vec<(Box<str>, u64, f64)>,
    /// Limiters with a token of their own (`None`: no tokens file).
    pub limiter_tokens: Option<usize>,
    /// Rereads of the tokens file that took and that failed.
    pub token_reloads: (u64, u64),
    /// The penalties limiters started, as the root holds them.
    pub penalties: PenaltyStats,
}

/// Most per-limiter series of clipped deltas on `/metrics`.
pub const CLIPPED_SERIES: usize = 100;

/// A Prometheus label value: `\` and `"` escaped (limiter ids may hold
/// any printable ASCII).
fn label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

impl Metrics {
    /// Counts a sync by outcome.
    pub fn sync(&self, result: SyncResult) {
        self.syncs[result as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts what a successful sync moved.
    pub fn sync_moved(&self, applied: usize, ignored: usize, quotas: usize, counters: usize) {
        self.deltas_applied
            .fetch_add(applied as u64, Ordering::Relaxed);
        self.deltas_ignored
            .fetch_add(ignored as u64, Ordering::Relaxed);
        self.quotas_sent.fetch_add(quotas as u64, Ordering::Relaxed);
        self.counters_sent
            .fetch_add(counters as u64, Ordering::Relaxed);
    }

    /// Counts deltas clipped to their limiter's allowance.
    pub fn clipped(&self, deltas: usize, weight: f64) {
        self.deltas_clipped
            .fetch_add(deltas as u64, Ordering::Relaxed);
        self.weight_clipped
            .fetch_add(weight.min(u64::MAX as f64) as u64, Ordering::Relaxed);
    }

    /// Counts weight given back to counters.
    pub fn returned(&self, weight: f64) {
        self.weight_returned
            .fetch_add(weight.min(u64::MAX as f64) as u64, Ordering::Relaxed);
    }

    /// Counts numbered parts of a sync (a request's own weight, or an
    /// earlier request's sent again) this root had applied already.
    pub fn duplicates(&self, parts: u32) {
        self.sync_duplicates
            .fetch_add(u64::from(parts), Ordering::Relaxed);
    }

    /// Counts rejections cut from a sync's counts.
    pub fn rejections_clipped(&self, rejections: u64) {
        self.rejections_clipped
            .fetch_add(rejections, Ordering::Relaxed);
    }

    /// Counts a refused request.
    pub fn rejected(&self, api: Api, why: Rejection) {
        self.rejected[api as usize][why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a committed admin write.
    pub fn admin_write(&self) {
        self.admin_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reload.
    pub fn reload(&self, ok: bool, loaded: usize, invalid: usize) {
        self.reloads[usize::from(!ok)].fetch_add(1, Ordering::Relaxed);
        self.quotas_loaded
            .fetch_add(loaded as u64, Ordering::Relaxed);
        self.quotas_invalid
            .fetch_add(invalid as u64, Ordering::Relaxed);
    }

    /// Deltas applied so far (for tests and benchmarks).
    pub fn deltas_applied(&self) -> u64 {
        self.deltas_applied.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self, scrape: &Scrape) -> String {
        let mut out = String::with_capacity(4096);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        family(
            &mut out,
            "syncs_total",
            "counter",
            "Sync requests by result.",
        );
        for result in SyncResult::ALL {
            let value = get(&self.syncs[result as usize]);
            sample(
                &mut out,
                "syncs_total",
                &format!("result=\"{}\"", result.label()),
                value,
            );
        }
        self.sync_seconds.render(
            "sluice_root_sync_duration_seconds",
            "Time to handle a sync request.",
            &mut out,
        );
        let totals = [
            (
                "sync_deltas_applied_total",
                "Deltas added to counters.",
                &self.deltas_applied,
            ),
            (
                "sync_deltas_ignored_total",
                "Deltas for unknown or deleted quotas.",
                &self.deltas_ignored,
            ),
            (
                "sync_deltas_clipped_total",
                "Deltas cut to what their limiter could have admitted.",
                &self.deltas_clipped,
            ),
            (
                "sync_weight_clipped_total",
                "Weight cut from deltas larger than their limiter could have admitted.",
                &self.weight_clipped,
            ),
            (
                "sync_weight_returned_total",
                "Weight limiters gave back to counters (returns granted).",
                &self.weight_returned,
            ),
            (
                "sync_rejections_clipped_total",
                "Rejection counts cut to what their limiter could have rejected.",
                &self.rejections_clipped,
            ),
            (
                "sync_duplicates_total",
                "Numbered sync parts sent again (a reply lost) that this root had applied: \
                 their weight was not counted twice.",
                &self.sync_duplicates,
            ),
            (
                "sync_quotas_sent_total",
                "Quotas sent in sync replies.",
                &self.quotas_sent,
            ),
            (
                "sync_counters_sent_total",
                "Counters sent in sync replies.",
                &self.counters_sent,
            ),
            (
                "admin_writes_total",
                "Admin writes committed.",
                &self.admin_writes,
            ),
            (
                "quotas_loaded_total",
                "Quota rows read by reloads.",
                &self.quotas_loaded,
            ),
            (
                "quotas_invalid_total",
                "Invalid quota rows skipped by reloads.",
                &self.quotas_invalid,
            ),
        ];
        for (name, help, value) in totals {
            family(&mut out, name, "counter", help);
            sample(&mut out, name, "", get(value));
        }
        family(
            &mut out,
            "rejected_requests_total",
            "counter",
            "Refused requests by API and reason.",
        );
        for api in Api::ALL {
            for why in Rejection::ALL {
                let labels = format!("api=\"{}\",reason=\"{}\"", api.label(), why.label());
                let value = get(&self.rejected[api as usize][why as usize]);
                sample(&mut out, "rejected_requests_total", &labels, value);
            }
        }
        family(
            &mut out,
            "reloads_total",
            "counter",
            "Quota reloads from the database by result.",
        );
        sample(
            &mut out,
            "reloads_total",
            "result=\"ok\"",
            get(&self.reloads[0]),
        );
        sample(
            &mut out,
            "reloads_total",
            "result=\"failed\"",
            get(&self.reloads[1]),
        );
        render_state(scrape, &mut out);
        render_trust(scrape, &mut out);
        render_connections(&scrape.connections, &mut out);
        render_penalties(&scrape.penalties, &mut out);
        out
    }
}

/// The penalties a root holds, and those it refused or evicted (at most
/// [`super::tier_book::MAX_PENALTIES`] are held).
fn render_penalties(p: &PenaltyStats, out: &mut String) {
    family(
        out,
        "penalties",
        "gauge",
        "Penalties held (some may have ended since the last sweep).",
    );
    let _ = writeln!(out, "sluice_root_penalties {}", p.held);
    counters(
        out,
        [
            (
                "penalties_started_total",
                "Penalties limiters started that this root first heard of.",
                p.started,
            ),
            (
                "penalties_evicted_total",
                "Penalties dropped, the one ending soonest, to make room for one ending later.",
                p.evicted,
            ),
        ],
    );
    by_reason(
        out,
        "penalties_refused_total",
        "Penalties refused: no live quota with a penalty, ended already, or full of penalties ending no sooner.",
        PenaltyRefusal::ALL.map(|r| (r.label(), p.refused[r as usize])),
    );
}

fn render_trust(scrape: &Scrape, out: &mut String) {
    let s = &scrape.stats;
    family(
        out,
        "levels_capped_total",
        "counter",
        "Counter updates cut to the quota's level cap.",
    );
    sample(out, "levels_capped_total", "", s.sizes.levels_capped);
    family(
        out,
        "allowances",
        "gauge",
        "Limiter allowances held (limiter and counter pairs not back at full).",
    );
    sample(out, "allowances", "", s.sizes.allowances as u64);
    family(
        out,
        "limiter_deltas_clipped_total",
        "counter",
        "Deltas cut to their limiter's allowance, by limiter (the most clipped 100; \
         with the admin token only).",
    );
    for (limiter, deltas, _) in &scrape.clipped {
        let labels = format!("limiter=\"{}\"", label_value(limiter));
        sample(out, "limiter_deltas_clipped_total", &labels, *deltas);
    }
    family(
        out,
        "limiter_weight_clipped_total",
        "counter",
        "Weight cut from deltas, by limiter (the most clipped 100; with the admin token only).",
    );
    for (limiter, _, weight) in &scrape.clipped {
        let labels = format!("limiter=\"{}\"", label_value(limiter));
        let _ = writeln!(
            out,
            "sluice_root_limiter_weight_clipped_total{{{labels}}} {weight}"
        );
    }
    if let Some(n) = scrape.limiter_tokens {
        family(
            out,
            "limiter_tokens",
            "gauge",
            "Limiters with a sync token of their own (limiter_tokens_file).",
        );
        sample(out, "limiter_tokens", "", n as u64);
        family(
            out,
            "limiter_tokens_reloads_total",
            "counter",
            "Rereads of the limiter tokens file after it changed, by result.",
        );
        let (ok, failed) = scrape.token_reloads;
        sample(out, "limiter_tokens_reloads_total", "result=\"ok\"", ok);
        sample(
            out,
            "limiter_tokens_reloads_total",
            "result=\"failed\"",
            failed,
        );
    }
}

fn render_connections(c: &ConnectionStats, out: &mut String) {
    let gauges = [
        ("connections", "Open connections.", c.open),
        (
            "connections_trusted",
            "Open connections that presented a valid token (never shed).",
            c.trusted,
        ),
    ];
    for (name, help, value) in gauges {
        family(out, name, "gauge", help);
        sample(out, name, "", value as u64);
    }
    family(
        out,
        "connections_accepted_total",
        "counter",
        "Connections admitted.",
    );
    sample(out, "connections_accepted_total", "", c.accepted);
    by_reason(
        out,
        "connections_closed_total",
        "Connections the root closed: timed out, or shed for newer ones.",
        CloseReason::ALL.map(|r| (r.label(), c.closed[r as usize])),
    );
    by_reason(
        out,
        "connections_refused_total",
        "New connections closed at once: at a limit with nothing to shed.",
        Refusal::ALL.map(|r| (r.label(), c.refused[r as usize])),
    );
}

fn render_state(scrape: &Scrape, out: &mut String) {
    let s = &scrape.stats;
    let h = &scrape.health;
    let gauges: [(&str, &str, f64); 14] = [
        ("quotas", "Live quotas held.", s.quotas as f64),
        (
            "quota_tombstones",
            "Deleted quotas held as tombstones.",
            s.tombstones as f64,
        ),
        ("counters", "Counters in memory.", s.sizes.counters as f64),
        (
            "keys",
            "Counters of keys of per-key quotas in memory (part of counters).",
            s.sizes.keys as f64,
        ),
        (
            "quota_epoch",
            "Epoch of the last quota loaded.",
            s.epoch as f64,
        ),
        (
            // Not `counter_version`: a name must not read as a type.
            "counters_version",
            "Last counter version handed out.",
            s.counter_version as f64,
        ),
        (
            "limiters_seen",
            "Limiters held in the registry (heard from within limiter_expiry).",
            s.limiters as f64,
        ),
        (
            "interest_keys",
            "Keys the limiters hold, as the root records them to answer each only with its own keys' counters (sync_interest_total bounds them).",
            s.sizes.interest.keys as f64,
        ),
        (
            "interest_overflowed",
            "Limiters' interest records (one per limiter and counter shard) past sync_interest_per_limiter or sync_interest_total: those limiters are sent every changed counter until their next whole list.",
            s.sizes.interest.overflowed as f64,
        ),
        (
            "limiters_active",
            "Limiters that synced in the last 5 minutes.",
            scrape.active_limiters as f64,
        ),
        (
            "body_memory_bytes",
            "Request memory held: bodies as they arrive, and what syncs decode to \
             (max_body_memory bounds it).",
            scrape.body_memory as f64,
        ),
        (
            "ready",
            "1 once quotas have been loaded.",
            f64::from(u8::from(h.ready)),
        ),
        (
            "db_up",
            "1 when the last database operation succeeded.",
            f64::from(u8::from(h.db_up)),
        ),
        (
            "db_writable",
            "1 when the database takes writes: 0 while it is read-only, or not the database loaded (deleted, replaced, its epoch gone back).",
            f64::from(u8::from(h.db_writable)),
        ),
    ];
    for (name, help, value) in gauges {
        family(out, name, "gauge", help);
        let _ = writeln!(out, "sluice_root_{name} {value}");
    }
    counters(
        out,
        [
        (
            "keys_refused_total",
            "Key deltas ignored: max_keys keys were held, or their limiter held its max_keys_per_limiter share.",
            s.sizes.keys_refused,
        ),
        (
            "keys_displaced_total",
            "Key counters forgotten to make room for a limiter within its share, from the limiter holding the most.",
            s.sizes.keys_displaced,
        ),
        (
            "keys_forgotten_total",
            "Key counters forgotten after leaking to nothing.",
            s.sizes.keys_forgotten,
        ),
        (
            "interest_overflows_total",
            "Limiters' interest records that went past a bound (their keys let go, every changed counter sent).",
            s.sizes.interest.overflows,
        ),
    ],
    );
    by_reason(
        out,
        "limiters_dropped_total",
        "Limiters forgotten: not heard from within limiter_expiry, or pushed out at max_limiters.",
        Dropped::ALL.map(|r| (r.label(), s.limiters_dropped[r as usize])),
    );
    family(
        out,
        "db_failures_total",
        "counter",
        "Failed database operations.",
    );
    let _ = writeln!(out, "sluice_root_db_failures_total {}", h.db_failures);
    if let Some(down) = h.down_for {
        family(
            out,
            "db_down_seconds",
            "gauge",
            "Seconds the database has been unreachable (only while it is).",
        );
        let _ = writeln!(out, "sluice_root_db_down_seconds {down}");
    }
    if let Some(age) = h.since_reload {
        family(
            out,
            "reload_age_seconds",
            "gauge",
            "Seconds since the last successful reload.",
        );
        let _ = writeln!(out, "sluice_root_reload_age_seconds {age}");
    }
    family(out, "info", "gauge", "This root process.");
    let _ = writeln!(
        out,
        "sluice_root_info{{instance=\"{:016x}\",backend=\"{}\",version=\"{}\"}} 1",
        scrape.instance,
        scrape.backend,
        env!("CARGO_PKG_VERSION")
    );
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP sluice_root_{name} {help}\n# TYPE sluice_root_{name} {kind}"
    );
}

/// A counter family with one sample per reason: `(label, value)`.
/// Counter families of one sample each: `(name, help, value)`.
fn counters<const N: usize>(out: &mut String, families: [(&str, &str, u64); N]) {
    for (name, help, value) in families {
        family(out, name, "counter", help);
        let _ = writeln!(out, "sluice_root_{name} {value}");
    }
}

fn by_reason<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (&'a str, u64)>,
) {
    family(out, name, "counter", help);
    for (reason, value) in samples {
        sample(out, name, &format!("reason=\"{reason}\""), value);
    }
}

fn sample(out: &mut String, name: &str, labels: &str, value: u64) {
    if labels.is_empty() {
        let _ = writeln!(out, "sluice_root_{name} {value}");
    } else {
        let _ = writeln!(out, "sluice_root_{name}{{{labels}}} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape() -> Scrape {
        Scrape {
            stats: LedgerStats {
                quotas: 3,
                epoch: 9,
                ..LedgerStats::default()
            },
            active_limiters: 2,
            health: HealthSnapshot {
                ready: true,
                db_up: false,
                db_writable: true,
                db_error: Some("refused".into()),
                down_for: Some(1.0),
                since_reload: Some(2.0),
                db_failures: 4,
            },
            instance: 0xabc,
            backend: "sqlite",
            connections: ConnectionStats {
                open: 7,
                closed: [0, 0, 0, 3, 0],
                ..ConnectionStats::default()
            },
            body_memory: 3072,
            clipped: vec![("web\"1".into(), 4, 1e6)],
            limiter_tokens: Some(2),
            token_reloads: (1, 0),
            penalties: PenaltyStats {
                held: 5,
                started: 6,
                refused: [0, 0, 2],
                evicted: 1,
            },
        }
    }

    #[test]
    fn the_text_carries_counts_gauges_and_a_cumulative_histogram() {
        let m = Metrics::default();
        m.sync(SyncResult::Ok);
        m.sync(SyncResult::Ok);
        m.sync(SyncResult::Rejected);
        m.rejected(Api::Sync, Rejection::TooLarge);
        m.sync_seconds.observe(Duration::from_micros(300));
        m.sync_seconds.observe(Duration::from_secs(10));
        let text = m.render(&scrape());
        for line in [
            "sluice_root_syncs_total{result=\"ok\"} 2",
            "sluice_root_syncs_total{result=\"rejected\"} 1",
            "sluice_root_rejected_requests_total{api=\"sync\",reason=\"too_large\"} 1",
            "sluice_root_sync_duration_seconds_bucket{le=\"0.0005\"} 1",
            "sluice_root_sync_duration_seconds_bucket{le=\"+Inf\"} 2",
            "sluice_root_sync_duration_seconds_count 2",
            "sluice_root_quotas 3",
            "sluice_root_quota_epoch 9",
            "sluice_root_db_up 0",
            "sluice_root_db_writable 1",
            "sluice_root_db_down_seconds 1",
            "sluice_root_limiters_active 2",
            "sluice_root_connections 7",
            "sluice_root_connections_closed_total{reason=\"shed_per_address\"} 3",
            "sluice_root_rejected_requests_total{api=\"admin\",reason=\"body_timeout\"} 0",
            "sluice_root_info{instance=\"0000000000000abc\",backend=\"sqlite\"",
            "sluice_root_limiter_deltas_clipped_total{limiter=\"web\\\"1\"} 4",
            "sluice_root_limiter_weight_clipped_total{limiter=\"web\\\"1\"} 1000000",
            "sluice_root_limiter_tokens 2",
            "sluice_root_body_memory_bytes 3072",
            "sluice_root_limiters_dropped_total{reason=\"full\"} 0",
            "sluice_root_limiter_tokens_reloads_total{result=\"ok\"} 1",
            "sluice_root_syncs_total{result=\"forbidden\"} 0",
            "sluice_root_penalties 5",
            "sluice_root_penalties_started_total 6",
            "sluice_root_penalties_evicted_total 1",
            "sluice_root_penalties_refused_total{reason=\"full\"} 2",
            "sluice_root_penalties_refused_total{reason=\"no_penalty\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
