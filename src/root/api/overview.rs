//! `GET /v1/overview?top=N`: what the web console (`/ui`) and `sluice top`
//! show, in one bounded reply.
//!
//! Two levels of access, because names are what an attacker wants (a
//! quota's name and limit say how fast to go, a limiter's id names a host):
//!
//! - **public** (no `Authorization` header while the root has an admin
//!   token): the root's state, the database's state and fleet totals —
//!   numbers without names, what `/healthz` and `/metrics` already show;
//! - **admin** (the admin token, or a root without one): also the busiest
//!   quotas, the limiters that synced recently with their clock offsets,
//!   and the database's last error.
//!
//! A wrong token is a 401, so a client can tell "no token" from "bad
//! token".
//!
//! Cost is bounded whatever the number of clients: the root samples its
//! ledger at most once per [`SAMPLE_EVERY`] and every request in between
//! gets that sample; a sample looks at the [`MAX_SCAN`] most recently
//! updated counters and every recorded limiter (at most `max_limiters`,
//! [`crate::root::limiters`]) under the ledger lock, and a
//! reply carries at most [`MAX_TOP`] quotas and [`RECENT_LIMITERS`]
//! limiters.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde::{Deserialize, Serialize};

use crate::core::key::format_hash;
use crate::core::{Nanos, Terms, SECS_PER_NANO};
use crate::root::ledger::Ledger;
use crate::root::state::{RootState, ACTIVE_WINDOW};

use super::view::{shown_rejected_rate, view, QuotaView};
use super::{json_response, ApiError};

/// Where the overview is served.
pub const OVERVIEW_PATH: &str = "/v1/overview";

/// Shortest time between two samples of the ledger.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Most counters one sample ranks, the most recently updated first.
pub const MAX_SCAN: usize = 20_000;

/// Quotas in a reply unless `top` says otherwise.
pub const DEFAULT_TOP: usize = 20;

/// Most quotas a reply carries.
pub const MAX_TOP: usize = 100;

/// Most limiters a reply carries, the most recent syncs first.
pub const RECENT_LIMITERS: usize = 50;

/// A counter below both is idle: it is not ranked.
const IDLE_LEVEL: f64 = 1e-9;
const IDLE_RATE: f64 = 1e-3;

/// Busiest keys a per-key quota in the busiest quotas names.
pub const TEMPLATE_TOP_KEYS: usize = 3;

/// The overview's route, with the sample cache it shares between requests.
pub fn routes() -> Router<Arc<RootState>> {
    Router::new()
        .route(OVERVIEW_PATH, get(overview))
        .layer(Extension(Arc::new(SampleCache::default())))
}

/// Query of `GET /v1/overview`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    /// Busiest quotas wanted, 1 to [`MAX_TOP`].
    pub top: Option<usize>,
}

/// Who is asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// No token: numbers without names.
    Public,
    /// The admin token (or a root without one): everything.
    Admin,
}

/// The reply.
#[derive(Debug, Serialize)]
pub struct Overview<'a> {
    /// What this reply includes.
    pub access: Access,
    /// The root has an admin token: without it, quotas, limiters and edits
    /// are not available.
    pub token_required: bool,
    /// This root process.
    pub root: RootPart,
    /// Its database.
    pub db: DbPart,
    /// Fleet totals as this root sees them.
    pub totals: Totals,
    /// How old and how complete the sample is.
    pub sampled: Sampled,
    /// The busiest quotas, busiest first (admin only): the ones rejecting
    /// most, then the fullest, then the fastest filling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quotas: Option<&'a [BusyQuota]>,
    /// The limiters that synced last, most recent first (admin only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limiters: Option<&'a [RecentLimiter]>,
    /// The busiest keys of per-key quotas, ranked like `quotas` (admin
    /// only; absent when no key's counter was ranked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<&'a [BusyKey]>,
    /// Penalties in force, latest end first (admin only; absent when
    /// none is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub penalties: Option<&'a [ActivePenalty]>,
}

/// The root process.
#[derive(Debug, Serialize)]
pub struct RootPart {
    /// `sluice` version.
    pub version: &'static str,
    /// Instance id (hex), new at every start.
    pub instance: String,
    /// `ok`; `degraded` while the database is down or takes no writes;
    /// `starting` until the first load (as `/healthz`).
    pub status: &'static str,
    /// Quotas have been loaded.
    pub ready: bool,
}

/// The database.
#[derive(Debug, Serialize)]
pub struct DbPart {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The last operation succeeded.
    pub up: bool,
    /// It takes this root's writes (false: read-only, or not the database
    /// the root loaded; `error` says why).
    pub writable: bool,
    /// Seconds it has been down, while it is.
    #[serde(serialize_with = "crate::root::api::round::seconds_opt")]
    pub down_seconds: Option<f64>,
    /// Seconds since the last successful reload.
    #[serde(serialize_with = "crate::root::api::round::seconds_opt")]
    pub reload_age_seconds: Option<f64>,
    /// Failed operations since start.
    pub failures: u64,
    /// Epoch of the last quota loaded.
    pub epoch: u64,
    /// The last error, while down (admin only: it may name hosts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Fleet totals. Each figure has one definition, the one its doc gives;
/// the console states them beside the figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Live quotas.
    pub quotas: usize,
    /// Quotas with a counter in memory (they received weight since the
    /// root started); keys of per-key quotas are in `keys`.
    pub counters: usize,
    /// Keys of per-key quotas with a counter in memory.
    pub keys: usize,
    /// Limiters the root holds: heard from within `limiter_expiry`, at
    /// most `max_limiters` ([`crate::root::limiters`]).
    pub limiters_seen: usize,
    /// Limiters that synced in the last five minutes.
    pub limiters_active: usize,
    /// Syncs per second between the last two samples (null for the first).
    #[serde(serialize_with = "crate::root::api::round::significant_opt")]
    pub syncs_per_second: Option<f64>,
    /// Checks rejected per second as the limiters report them, summed over
    /// the ranked quotas' `rejected_rate` (a rejection counts on the quota
    /// the request named, a per-key quota's on the quota, so each counts
    /// once).
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub rejected_per_second: f64,
    /// Ranked quotas (per-key ones included) whose `rejected_rate` is not
    /// 0 (at least `LEAST_REJECTED_RATE`, 0.01): 0 exactly when
    /// `rejected_per_second` is.
    pub quotas_rejecting: usize,
    /// Ranked quotas whose level now rejects every check (a per-key
    /// quota: one of its keys).
    pub quotas_full: usize,
    /// Overrides of per-key templates' keys held (tombstones not counted).
    pub overrides: usize,
    /// Penalties in force (on quotas and on keys).
    pub penalties: usize,
}

/// About the sample a reply comes from.
#[derive(Debug, Serialize)]
pub struct Sampled {
    /// Seconds since the sample was taken.
    #[serde(serialize_with = "crate::root::api::round::seconds")]
    pub age_seconds: f64,
    /// Seconds between this sample and the one before (what
    /// `syncs_per_second` is averaged over).
    #[serde(serialize_with = "crate::root::api::round::seconds_opt")]
    pub rate_window_seconds: Option<f64>,
    /// Counters ranked.
    pub counters_scanned: usize,
    /// Every counter was ranked (false past [`MAX_SCAN`]).
    pub counters_complete: bool,
}

/// One of the busiest quotas: the quota as the admin API shows it, and
/// how close it is to rejecting.
///
/// A per-key quota (a template) has no counter of its own: its `level`,
/// `fullness` and `rejecting` are its fullest key's, its `fill_rate` the
/// sum over its keys, its `rejected_rate` every key's rejections, and
/// `keys` says how many keys it has and which are busiest.
#[derive(Clone, Debug, Serialize)]
pub struct BusyQuota {
    /// The quota with its level and fill rate.
    #[serde(flatten)]
    pub quota: QuotaView,
    /// `level / high_burst`: 1 is full.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub fullness: f64,
    /// Share of checks of weight 1 the decision rejects at this level
    /// (0 below `low_burst`, rising across the band, 1 from `high_burst`).
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub rejecting: f64,
    /// A per-key quota's keys (absent for other quotas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<TemplateKeys>,
    /// A per-key quota's overrides for single keys (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub overrides: usize,
    /// Penalties in force on the quota or its keys (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub penalties: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A penalty in force: the quota or one of its keys barred until it
/// ends.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ActivePenalty {
    /// The quota (a per-key quota's template for a key).
    pub quota: String,
    /// The key's hash, 16 hex digits; absent for the quota itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Seconds until it ends.
    #[serde(serialize_with = "crate::root::api::round::seconds")]
    pub seconds_left: f64,
}

/// The keys of a per-key quota in the busiest quotas.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TemplateKeys {
    /// Its keys with a counter at this root, among the counters ranked.
    pub count: usize,
    /// Its busiest keys by hash, busiest first (at most
    /// [`TEMPLATE_TOP_KEYS`]), ranked as `keys` is.
    pub busiest: Vec<String>,
}

/// One of the busiest keys: a key's counter of a per-key quota, by hash
/// (the root never sees a key itself).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BusyKey {
    /// The per-key quota (the template).
    pub quota: String,
    /// The key's hash, 16 hex digits.
    pub key: String,
    /// The key's level.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub level: f64,
    /// The key's fill rate, units per second.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub fill_rate: f64,
    /// The template's limit.
    pub limit: f64,
    /// The template's limit in its own terms (`15 /s per key`).
    pub terms: String,
    /// `level / high_burst`: 1 is full.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub fullness: f64,
    /// Share of checks of weight 1 the decision rejects at this level.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub rejecting: f64,
}

/// A limiter that synced recently.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecentLimiter {
    /// Its id.
    pub id: String,
    /// Seconds since its last sync.
    #[serde(serialize_with = "crate::root::api::round::seconds")]
    pub last_sync_seconds_ago: f64,
    /// Syncs since the root started.
    pub syncs: u64,
    /// Root clock minus its clock, as it last reported (null until it
    /// does; limiters older than this root's console do not).
    #[serde(serialize_with = "crate::root::api::round::seconds_opt")]
    pub clock_offset_seconds: Option<f64>,
    /// The round trip that offset comes from: its error is at most half.
    #[serde(serialize_with = "crate::root::api::round::seconds_opt")]
    pub round_trip_seconds: Option<f64>,
    /// Its deltas the root clipped as more than it could have admitted
    /// (see [`crate::root::trust`]); 0 for an honest limiter.
    pub clipped_deltas: u64,
}

/// What one look at the ledger found.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Totals (all but the sync rate).
    pub totals: Totals,
    /// Up to [`MAX_TOP`] busiest quotas, busiest first.
    pub quotas: Vec<BusyQuota>,
    /// Up to [`MAX_TOP`] busiest keys, busiest first.
    pub keys: Vec<BusyKey>,
    /// Up to [`RECENT_LIMITERS`] limiters, most recent first.
    pub limiters: Vec<RecentLimiter>,
    /// Up to [`MAX_TOP`] penalties in force, latest end first.
    pub penalties: Vec<ActivePenalty>,
    /// Syncs of every recorded limiter, for the sync rate.
    pub syncs: u64,
    /// Counters ranked.
    pub scanned: usize,
    /// Every counter was ranked.
    pub complete: bool,
}

/// Share of checks of weight 1 that [`crate::core::decision::decide`]
/// rejects at `level`.
pub fn rejecting(level: f64, low_burst: f64, high_burst: f64) -> f64 {
    let after = level + 1.0;
    if after > high_burst {
        1.0
    } else if after <= low_burst {
        0.0
    } else {
        (after - low_burst) / (high_burst - low_burst)
    }
}

/// A quota as the sample ranks it.
#[derive(Clone, Copy, Debug, Default)]
struct Rank {
    /// Checks the limiters report rejecting per second.
    rejected_rate: f64,
    /// Share of checks of weight 1 its level rejects.
    share: f64,
    /// `level / high_burst`.
    fullness: f64,
    /// Units per second arriving.
    fill_rate: f64,
    /// Its level (a per-key quota: its fullest key's).
    level: f64,
    /// Its id.
    id: u64,
}

impl Rank {
    /// The busiest first: rejecting most checks, then the share its level
    /// rejects, then the fullest, then the fastest filling.
    fn order(a: &Self, b: &Self) -> Ordering {
        b.rejected_rate
            .total_cmp(&a.rejected_rate)
            .then(b.share.total_cmp(&a.share))
            .then(b.fullness.total_cmp(&a.fullness))
            .then(b.fill_rate.total_cmp(&a.fill_rate))
            .then(a.id.cmp(&b.id))
    }

    /// Takes in a key of this per-key quota: the fullest key speaks for
    /// it, the keys' fill rates add up.
    fn add_key(&mut self, share: f64, fullness: f64, level: f64, fill_rate: f64) {
        self.share = self.share.max(share);
        self.fullness = self.fullness.max(fullness);
        self.level = self.level.max(level);
        self.fill_rate += fill_rate;
    }
}

/// Share of checks of weight 1 that `quota` rejects at `level`, and
/// `level / high_burst`.
fn closeness(quota: &crate::core::Quota, level: f64) -> (f64, f64) {
    let share = rejecting(level, quota.low_burst, quota.high_burst);
    let fullness = if quota.high_burst > 0.0 {
        level / quota.high_burst
    } else {
        share
    };
    (share, fullness)
}

/// Looks at `ledger` at `now`.
pub fn sample(ledger: &Ledger, now: Nanos) -> Sample {
    // Tiers first, each book's lock alone: the overrides per template,
    // the penalties in force (per quota, and the latest to end).
    let now_utc = now as i64 + ledger.utc_offset;
    let (penalty_counts, active) = {
        let book = ledger.penalties();
        (book.counts(now_utc), book.active(now_utc, MAX_TOP))
    };
    let (override_counts, overrides) = {
        let book = ledger.overrides();
        (book.counts(), book.total())
    };
    let ledger = &ledger.read();
    let mut out = Sample::default();
    out.totals.overrides = overrides;
    out.totals.penalties = penalty_counts.values().sum();
    out.penalties = active
        .iter()
        .filter_map(|p| {
            let quota = ledger.quotas.get(p.quota())?;
            Some(ActivePenalty {
                quota: quota.name.to_string(),
                key: (p.key() != 0).then(|| format_hash(p.key())),
                seconds_left: (p.until() - now_utc) as f64 * SECS_PER_NANO,
            })
        })
        .collect();
    let mut ranked = Vec::new();
    let mut keys = Vec::new();
    // Per-key quotas by id: their keys' figures gathered.
    let mut templates: HashMap<u64, (Rank, usize)> = HashMap::new();
    for (counter, level, fill_rate, rejected_rate) in
        ledger.counters.newest_first(now).take(MAX_SCAN)
    {
        out.scanned += 1;
        let rejected_rate = shown_rejected_rate(rejected_rate);
        let Some(quota) = ledger.quotas.get(counter.id).filter(|q| !q.deleted) else {
            continue;
        };
        let idle = level < IDLE_LEVEL && fill_rate < IDLE_RATE && rejected_rate < IDLE_RATE;
        let (share, fullness) = closeness(quota, level);
        if quota.per_key {
            // A key's counter, or the counter its keys without room share.
            let (rank, count) = templates.entry(quota.id).or_default();
            *count += usize::from(counter.key != 0);
            if !idle {
                rank.add_key(share, fullness, level, fill_rate);
            }
            if counter.key != 0 && !idle {
                keys.push(BusyKey {
                    quota: quota.name.to_string(),
                    key: format_hash(counter.key),
                    level,
                    fill_rate,
                    limit: quota.limit,
                    terms: Terms::of(quota).to_string(),
                    fullness,
                    rejecting: share,
                });
            }
            continue;
        }
        if idle {
            continue;
        }
        ranked.push(Rank {
            rejected_rate,
            share,
            fullness,
            fill_rate,
            level,
            id: counter.id,
        });
    }
    out.complete = out.scanned == ledger.counters.len();
    for (id, rejected_rate) in ledger.counters.template_rejected_rates(now) {
        if ledger
            .quotas
            .get(id)
            .is_some_and(|q| q.per_key && !q.deleted)
        {
            templates.entry(id).or_default().0.rejected_rate = shown_rejected_rate(rejected_rate);
        }
    }
    for (&id, (rank, _)) in &mut templates {
        if ledger.quotas.get(id).is_none() {
            continue;
        }
        rank.id = id;
        if rank.level >= IDLE_LEVEL
            || rank.fill_rate >= IDLE_RATE
            || rank.rejected_rate >= IDLE_RATE
        {
            ranked.push(*rank);
        }
    }
    for rank in &ranked {
        if rank.rejected_rate > 0.0 {
            out.totals.quotas_rejecting += 1;
            out.totals.rejected_per_second += rank.rejected_rate;
        }
        out.totals.quotas_full += usize::from(rank.share >= 1.0);
    }
    // Every key in order, so each per-key quota names its own busiest
    // even when others' fill the list.
    let key_order = |a: &BusyKey, b: &BusyKey| {
        b.rejecting
            .total_cmp(&a.rejecting)
            .then(b.fullness.total_cmp(&a.fullness))
            .then(b.fill_rate.total_cmp(&a.fill_rate))
            .then_with(|| (&a.quota, &a.key).cmp(&(&b.quota, &b.key)))
    };
    keys.sort_unstable_by(key_order);
    let mut busiest: HashMap<&str, Vec<String>> = HashMap::new();
    for key in &keys {
        let names = busiest.entry(key.quota.as_str()).or_default();
        if names.len() < TEMPLATE_TOP_KEYS {
            names.push(key.key.clone());
        }
    }
    keep_first(&mut ranked, MAX_TOP, Rank::order);
    out.quotas = ranked
        .into_iter()
        .filter_map(|rank| {
            let quota = ledger.quotas.get(rank.id)?;
            let mut view = view(ledger, quota, now, false);
            let keys = quota.per_key.then(|| {
                view.level = rank.level;
                view.fill_rate = rank.fill_rate;
                TemplateKeys {
                    count: templates.get(&rank.id).map_or(0, |t| t.1),
                    busiest: busiest.remove(quota.name.as_str()).unwrap_or_default(),
                }
            });
            Some(BusyQuota {
                quota: view,
                fullness: rank.fullness,
                rejecting: rank.share,
                keys,
                overrides: override_counts.get(&rank.id).copied().unwrap_or(0),
                penalties: penalty_counts.get(&rank.id).copied().unwrap_or(0),
            })
        })
        .collect();
    keys.truncate(MAX_TOP);
    out.keys = keys;
    let stats = ledger.stats();
    out.totals.quotas = stats.quotas;
    out.totals.counters = stats.sizes.counters.saturating_sub(stats.sizes.keys);
    out.totals.keys = stats.sizes.keys;
    out.totals.limiters_seen = stats.limiters;
    let active_since = now.saturating_sub(ACTIVE_WINDOW);
    // Ranked as (last sync, index): comparing names would chase a pointer
    // per comparison through up to 100k scattered allocations.
    let mut recent = Vec::new();
    for (number, limiter) in ledger.limiters.iter() {
        out.syncs = out.syncs.saturating_add(limiter.syncs);
        if limiter.last_sync >= active_since {
            out.totals.limiters_active += 1;
            recent.push((limiter.last_sync, number));
        }
    }
    keep_first(&mut recent, RECENT_LIMITERS, |a, b| {
        b.0.cmp(&a.0).then(a.1.cmp(&b.1))
    });
    out.limiters = recent
        .into_iter()
        .filter_map(|(_, number)| ledger.limiters.get(number))
        .map(|l| RecentLimiter {
            id: l.name.to_string(),
            last_sync_seconds_ago: now.saturating_sub(l.last_sync) as f64 * SECS_PER_NANO,
            syncs: l.syncs,
            clock_offset_seconds: l.clock.map(|c| c.offset as f64 * SECS_PER_NANO),
            round_trip_seconds: l.clock.map(|c| c.round_trip as f64 * SECS_PER_NANO),
            clipped_deltas: l.clipped,
        })
        .collect();
    out
}

/// Keeps the first `n` of `items` in `order`, sorted; linear in the
/// number of items, not `n log n` of all of them.
fn keep_first<T>(items: &mut Vec<T>, n: usize, order: impl Fn(&T, &T) -> Ordering) {
    if items.len() > n {
        items.select_nth_unstable_by(n, &order);
        items.truncate(n);
    }
    items.sort_unstable_by(order);
}

/// The last sample and the sync rate since the one before.
#[derive(Debug, Default)]
struct SampleCache {
    last: tokio::sync::Mutex<Option<Cached>>,
}

/// A sample with the sync rate since the one before it.
#[derive(Clone, Debug)]
struct Cached {
    /// When the sample was taken.
    taken: Instant,
    sample: Arc<Sample>,
    syncs_per_second: Option<f64>,
    /// Seconds since the sample before.
    window: Option<f64>,
}

impl SampleCache {
    /// The current sample: the cached one while it is younger than
    /// [`SAMPLE_EVERY`], else a new one (one request takes it; the others
    /// wait for it and share it).
    async fn current(&self, state: &RootState) -> Cached {
        let mut last = self.last.lock().await;
        if let Some(c) = last.as_ref().filter(|c| c.taken.elapsed() < SAMPLE_EVERY) {
            return c.clone();
        }
        let now = state.now();
        let taken = Instant::now();
        let sample = Arc::new(sample(state.ledger(), now));
        let (syncs_per_second, window) = match last.as_ref() {
            Some(previous) => {
                let window = taken.duration_since(previous.taken).as_secs_f64();
                // A sum over limiters shrinks only if the registry was
                // replaced; there is no rate then.
                let rate = sample
                    .syncs
                    .checked_sub(previous.sample.syncs)
                    .map(|n| n as f64 / window);
                (rate, Some(window))
            }
            None => (None, None),
        };
        let cached = Cached {
            taken,
            sample,
            syncs_per_second,
            window,
        };
        *last = Some(cached.clone());
        cached
    }
}

/// What a request may see; `None` for a wrong token. `/metrics` goes by
/// the same rule.
pub(crate) fn access(state: &RootState, headers: &HeaderMap) -> Option<Access> {
    let Some(token) = &state.config.admin_token else {
        return Some(Access::Admin);
    };
    let Some(presented) = headers.get(header::AUTHORIZATION) else {
        return Some(Access::Public);
    };
    token
        .admits(Some(presented.as_bytes()))
        .then_some(Access::Admin)
}

/// `GET /v1/overview?top=N`.
async fn overview(
    State(state): State<Arc<RootState>>,
    Extension(cache): Extension<Arc<SampleCache>>,
    headers: HeaderMap,
    query: Result<Query<OverviewQuery>, QueryRejection>,
) -> Response {
    let Some(access) = access(&state, &headers) else {
        let mut response = ApiError::unauthorized("admin").into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    };
    let top = match query {
        Ok(Query(q)) => q.top.unwrap_or(DEFAULT_TOP),
        Err(e) => return ApiError::malformed(None, e.body_text()).into_response(),
    };
    if !(1..=MAX_TOP).contains(&top) {
        return ApiError::invalid("top", format!("must be 1 to {MAX_TOP}")).into_response();
    }
    let Cached {
        taken,
        sample,
        syncs_per_second,
        window,
    } = cache.current(&state).await;
    let health = state.health.snapshot();
    let admin = access == Access::Admin;
    let reply = Overview {
        access,
        token_required: state.config.admin_token.is_some(),
        root: RootPart {
            version: env!("CARGO_PKG_VERSION"),
            instance: format!("{:016x}", state.instance),
            status: health.status(),
            ready: health.ready,
        },
        db: DbPart {
            backend: state.store.backend().name(),
            up: health.db_up,
            writable: health.db_writable,
            down_seconds: health.down_for,
            reload_age_seconds: health.since_reload,
            failures: health.db_failures,
            epoch: state.ledger().stats().epoch,
            error: health.db_error.filter(|_| admin),
        },
        totals: Totals {
            syncs_per_second,
            ..sample.totals.clone()
        },
        sampled: Sampled {
            age_seconds: taken.elapsed().as_secs_f64(),
            rate_window_seconds: window,
            counters_scanned: sample.scanned,
            counters_complete: sample.complete,
        },
        quotas: admin.then(|| &sample.quotas[..top.min(sample.quotas.len())]),
        limiters: admin.then_some(&sample.limiters[..]),
        keys: (admin && !sample.keys.is_empty())
            .then(|| &sample.keys[..top.min(sample.keys.len())]),
        penalties: (admin && !sample.penalties.is_empty())
            .then(|| &sample.penalties[..top.min(sample.penalties.len())]),
    };
    let mut response = json_response(StatusCode::OK, &reply);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decision::{decide, Verdict};
    use crate::core::Quota;
    use crate::wire::ClockReport;

    const SEC: Nanos = 1_000_000_000;

    /// `(id, name, parent id, limit, low burst, high burst)`.
    type QuotaRow<'a> = (u64, &'a str, Option<u64>, f64, f64, f64);

    fn ledger_with(quotas: &[QuotaRow]) -> Ledger {
        let ledger = Ledger::default();
        let quotas = quotas
            .iter()
            .map(|&(id, name, parent, limit, low, high)| {
                let mut q = Quota::new(id, name, limit, low, high).at_epoch(id);
                q.parent = parent;
                q
            })
            .collect();
        ledger.load(quotas, 0);
        ledger
    }

    fn send(ledger: &mut Ledger, limiter: &str, deltas: &[(u64, u64)], now: Nanos) {
        send_keyed(ledger, limiter, deltas, &[], now);
    }

    fn send_keyed(
        ledger: &mut Ledger,
        limiter: &str,
        deltas: &[(u64, u64)],
        keyed: &[(u64, u64, u64)],
        now: Nanos,
    ) {
        let request = crate::root::ledger::test_request(limiter, 0, 0, deltas, keyed);
        let paging = crate::root::ledger::SyncPaging {
            quotas: 10,
            counters: 10,
        };
        ledger.sync(&request, 1, now, paging);
    }

    #[test]
    fn rejecting_is_the_share_of_draws_the_decision_rejects() {
        for (level, low, high) in [
            (0.0, 10.0, 20.0),
            (12.0, 10.0, 20.0),
            (15.5, 10.0, 20.0),
            (19.0, 10.0, 20.0),
            (25.0, 10.0, 20.0),
            (9.0, 10.0, 10.0),
            (10.0, 10.0, 10.0),
        ] {
            let draws = 10_000;
            let rejected = (0..draws)
                .filter(|i| {
                    let draw = f64::from(*i) / f64::from(draws);
                    decide(level, 1.0, low, high, draw) == Verdict::Reject
                })
                .count();
            let share = rejected as f64 / f64::from(draws);
            let expected = rejecting(level, low, high);
            assert!(
                (share - expected).abs() <= 1e-3,
                "level {level} band {low}..{high}: decide rejects {share}, overview says {expected}"
            );
        }
    }

    /// The case: "admitted units per second" added bytes to
    /// requests, and counted a request once per tree it was checked in.
    /// Each quota's fill rate is in its own units, on its own row; no total
    /// adds them.
    #[test]
    fn no_total_adds_one_quotas_units_to_anothers() {
        let mut ledger = ledger_with(&[
            (1, "requests", None, 100.0, 100.0, 100.0),
            (2, "bytes", None, 1e6, 1e6, 1e6),
        ]);
        // Each request counts 1 on "requests" and its 385 bytes on "bytes".
        for s in 0..5 {
            send(&mut ledger, "a", &[(1, 10), (2, 3850)], s * SEC);
        }
        let sample = sample(&ledger, 5 * SEC);
        let fill = |name: &str| {
            sample
                .quotas
                .iter()
                .find(|q| q.quota.name == name)
                .map_or(0.0, |q| q.quota.fill_rate)
        };
        let (requests, bytes) = (fill("requests"), fill("bytes"));
        assert!(
            requests > 0.0 && bytes > 100.0 * requests,
            "{requests} {bytes}"
        );
        let totals = serde_json::to_value(&sample.totals).unwrap();
        for (field, value) in totals.as_object().unwrap() {
            let v = value.as_f64().unwrap_or(0.0);
            assert!(
                (v - (requests + bytes)).abs() > 0.01 * bytes,
                "{field} = {v} adds requests ({requests}/s) to bytes ({bytes}/s)"
            );
        }
    }

    #[test]
    fn the_busiest_come_first_rejecting_then_full_then_fast() {
        let mut ledger = ledger_with(&[
            (1, "parent", None, 1000.0, 1000.0, 1000.0),
            (2, "full", Some(1), 1.0, 10.0, 20.0),
            (3, "half", Some(1), 1.0, 100.0, 200.0),
            (4, "fast", Some(1), 1000.0, 1000.0, 1000.0),
            (5, "idle", None, 1.0, 1.0, 1.0),
        ]);
        send(&mut ledger, "a", &[(2, 50), (3, 100)], 0);
        for s in 0..5 {
            send(&mut ledger, "b", &[(4, 900), (1, 1)], s * SEC);
        }
        let sample = sample(&ledger, 5 * SEC);
        let names: Vec<&str> = sample
            .quotas
            .iter()
            .map(|q| q.quota.name.as_str())
            .collect();
        assert_eq!(names, ["full", "half", "fast", "parent"]);
        let full = &sample.quotas[0];
        assert_eq!(full.quota.parent.as_deref(), Some("parent"));
        // 50 sent, kept at its cap 45 (2 x 20 + 1/s x 5 s), 5 leaked.
        assert_eq!((full.quota.level, full.rejecting), (40.0, 1.0));
        assert_eq!(sample.totals.quotas_full, 1);
        // Full, but no limiter reported a rejection.
        assert_eq!(sample.totals.quotas_rejecting, 0);
        assert_eq!(sample.totals.rejected_per_second, 0.0);
        assert!(
            sample.quotas[2].quota.fill_rate > 100.0,
            "{:?}",
            sample.quotas[2]
        );
        assert_eq!((sample.scanned, sample.complete), (4, true));
        assert_eq!(sample.totals.quotas, 5);
    }

    #[test]
    fn recent_limiters_come_with_their_clock_reports_newest_first() {
        let mut ledger = ledger_with(&[(1, "q", None, 1.0, 1.0, 1.0)]);
        send(&mut ledger, "old", &[], 0);
        send(&mut ledger, "new", &[], 400 * SEC);
        send(&mut ledger, "new", &[], 401 * SEC);
        ledger.limiters().report_clock(
            "new",
            ClockReport {
                offset: -2 * SEC as i64,
                round_trip: SEC / 1000,
            },
        );
        let sample = sample(&ledger, 402 * SEC);
        assert_eq!(sample.syncs, 3);
        assert_eq!(sample.totals.limiters_seen, 2);
        assert_eq!(sample.totals.limiters_active, 1, "old synced 402 s ago");
        assert_eq!(
            sample.limiters,
            [RecentLimiter {
                id: "new".into(),
                last_sync_seconds_ago: 1.0,
                syncs: 2,
                clock_offset_seconds: Some(-2.0),
                round_trip_seconds: Some(0.001),
                clipped_deltas: 0,
            }]
        );
    }

    #[test]
    fn a_sample_is_bounded() {
        let quotas: Vec<(u64, String)> = (1..=(MAX_TOP as u64 + 20))
            .map(|id| (id, format!("q{id}")))
            .collect();
        let spec: Vec<QuotaRow> = quotas
            .iter()
            .map(|(id, name)| (*id, name.as_str(), None, 1.0, 10.0, 200.0))
            .collect();
        let mut ledger = ledger_with(&spec);
        let deltas: Vec<(u64, u64)> = quotas.iter().map(|(id, _)| (*id, *id)).collect();
        send(&mut ledger, "a", &deltas, 0);
        for i in 0..(RECENT_LIMITERS + 5) {
            send(&mut ledger, &format!("l{i}"), &[], i as Nanos);
        }
        let sample = sample(&ledger, SEC);
        assert_eq!(sample.quotas.len(), MAX_TOP);
        assert_eq!(sample.limiters.len(), RECENT_LIMITERS);
        assert_eq!(sample.limiters[0].id, format!("l{}", RECENT_LIMITERS + 4));
        // The fullest first: q120 has level 120 - 1 in a band of 10..200.
        assert_eq!(sample.quotas[0].quota.name, format!("q{}", MAX_TOP + 20));
    }

    #[test]
    fn tiers_are_shown_beside_their_quota_and_penalties_in_force_listed() {
        use crate::core::tier::{Override, Penalty, PenaltyTime, Rule};
        use crate::root::store::OverrideRow;
        let ledger = Ledger::default();
        let fifteen = Some(PenaltyTime::parse("15m").unwrap());
        ledger.load(
            vec![
                Quota::new(1, "login", 1.0, 2.0, 2.0)
                    .keyed()
                    .penalized(fifteen)
                    .at_epoch(1),
                Quota::new(2, "plain", 1.0, 2.0, 2.0).at_epoch(2),
            ],
            0,
        );
        let row = |id, key, rule, deleted| OverrideRow {
            ov: Override {
                id,
                quota: 1,
                key,
                rule,
                expires_ms: None,
                epoch: 3 + id,
                deleted,
            },
            note: None,
            updated_ms: 0,
        };
        ledger.load_overrides(
            vec![
                row(1, 0xa1, Rule::Deny, false),
                row(2, 0xa2, Rule::Allow, false),
                row(3, 0xa3, Rule::Allow, true),
            ],
            0,
        );
        // A limiter rejected a key at the high burst and started its
        // penalty, ending in 10 minutes.
        let mut request = crate::root::ledger::test_request("a", 0, 0, &[], &[(1, 0xbad, 3)]);
        request.rejected = vec![(1, 1)];
        request.tiers.penalties = vec![Penalty(1, 0xbad, 600 * SEC as i64)];
        let paging = crate::root::ledger::SyncPaging {
            quotas: 10,
            counters: 10,
        };
        ledger.sync(&request, 1, 0, paging);
        let sample = sample(&ledger, 30 * SEC);
        let login = &sample.quotas[0];
        assert_eq!(login.quota.name, "login");
        assert_eq!((login.overrides, login.penalties), (2, 1));
        assert_eq!((sample.totals.overrides, sample.totals.penalties), (2, 1));
        assert_eq!(
            sample.penalties,
            [ActivePenalty {
                quota: "login".into(),
                key: Some("0000000000000bad".into()),
                seconds_left: 570.0,
            }]
        );
        let json = serde_json::to_value(login).unwrap();
        assert_eq!(
            (json["overrides"].as_u64(), json["penalty"].as_str()),
            (Some(2), Some("15m"))
        );
    }

    #[test]
    fn a_per_key_quota_is_ranked_with_its_keys_and_its_rejections() {
        let ledger = Ledger::default();
        ledger.load(
            vec![
                Quota::new(1, "api", 100.0, 100.0, 100.0).at_epoch(1),
                Quota::new(2, "per_user", 1.0, 10.0, 20.0)
                    .keyed()
                    .with_parent(Some(1))
                    .at_epoch(2),
                Quota::new(3, "solo", 5.0, 5.0, 5.0).keyed().at_epoch(3),
            ],
            0,
        );
        // Key 0xab is past its high burst, 0xcd below its low burst; both
        // also count on the parent. The limiter rejected 40 checks of
        // per_user (its keys') and 5 of api.
        let keyed = [(2, 0xab, 25), (2, 0xcd, 3), (3, 0x01, 3)];
        let mut request = crate::root::ledger::test_request("a", 0, 0, &[(1, 28)], &keyed);
        request.rejected = vec![(2, 40), (1, 5)];
        let paging = crate::root::ledger::SyncPaging {
            quotas: 10,
            counters: 10,
        };
        ledger.sync(&request, 1, 0, paging);
        let sample = sample(&ledger, SEC);
        let names: Vec<&str> = sample
            .quotas
            .iter()
            .map(|q| q.quota.name.as_str())
            .collect();
        assert_eq!(names, ["per_user", "api", "solo"], "most rejected first");
        let per_user = &sample.quotas[0];
        assert_eq!(per_user.quota.terms, "1 /s per key");
        assert_eq!(
            per_user.keys,
            Some(TemplateKeys {
                count: 2,
                busiest: vec!["00000000000000ab".into(), "00000000000000cd".into()],
            })
        );
        // Its fullest key speaks for it (25 leaked 1 s at 1/s); its keys'
        // fill rates add up; its rejections are its keys'.
        assert_eq!((per_user.quota.level, per_user.rejecting), (24.0, 1.0));
        let key_fill: f64 = sample
            .keys
            .iter()
            .filter(|k| k.quota == "per_user")
            .map(|k| k.fill_rate)
            .sum();
        assert!(key_fill > 0.0 && per_user.quota.fill_rate == key_fill);
        let api = &sample.quotas[1];
        assert!(per_user.quota.rejected_rate > api.quota.rejected_rate);
        assert!(api.quota.rejected_rate > 0.0 && api.keys.is_none());
        // The totals add up: two quotas rejecting, their rates summed.
        let t = &sample.totals;
        assert_eq!(t.quotas_rejecting, 2);
        assert_eq!(
            t.rejected_per_second,
            per_user.quota.rejected_rate + api.quota.rejected_rate
        );
        assert_eq!((t.counters, t.keys), (1, 3));
        // The keys, by hash, with their template's terms.
        let keys: Vec<_> = sample.keys.iter().map(|k| (&*k.key, k.rejecting)).collect();
        assert_eq!(
            keys,
            [
                ("00000000000000ab", 1.0),
                ("00000000000000cd", 0.0),
                ("0000000000000001", 0.0)
            ]
        );
        assert_eq!(
            (&*sample.keys[0].quota, &*sample.keys[0].terms),
            ("per_user", "1 /s per key")
        );
    }
}
