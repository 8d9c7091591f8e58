//! The decision: a `ShouldRateLimit` request answered from the table with
//! envoyproxy/ratelimit's semantics, whatever carried it (gRPC or `/json`).
//!
//! Per request descriptor, in request order:
//!
//! - **Matching** walks the domain's tree entry by entry: the exact value
//!   first, then the patterns in file order, then the key alone; a limit
//!   applies only when the descriptor that holds it matched the request's
//!   last entry. An unknown domain or descriptor is OK with no limit.
//! - **Hits**: the descriptor's own `hits_addend` when it has one (0
//!   checks without counting), else the request's (0 counts as 1).
//! - **Over the limit** is a count after the hit above
//!   `requests_per_unit`; a hit over the limit is still counted. sluice's
//!   check rejects without counting, so a rejected hit is then charged
//!   (the request face's `charge`, which counts whatever the level).
//! - `limit_remaining` is the limit less the count after the hit (0 when
//!   over), `duration_until_reset` the time to the window's end (for a
//!   leaky limit, until the bucket is empty), `current_limit` the limit.
//! - `unlimited` answers OK with 2^32-1 remaining, uncounted; `replaces`
//!   drops every matched limit named by another matched limit;
//!   `shadow_mode` answers OK when over (still counted); `quota_mode`
//!   answers OK when over unless every quota-mode descriptor of the
//!   request is over, and says which were in the dynamic metadata
//!   (`quotaModeEnabled`, `quotaModeViolations`).
//! - The overall code is OVER_LIMIT when any descriptor's is.
//!
//! Nothing here takes a lock but for labels made from request values
//! (`detailed_metric`, `value_to_metric`) and the first request that
//! supplies a limit of its own (its quota is made then).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::core::spec::{QuotaSet, QuotaSpec};
use crate::core::{Nanos, Room};
use crate::table::file::{load_set, FileRole};
use crate::table::{CheckItem, CheckOptions, Outcome, Table};

use super::config::{Config, Descriptor, Value};
use super::limit::{Extension, Limit, Unit};
use super::metrics::{DetailedStats, RequestStats, Stats};
use super::quotas::{counting_of, quota_name, spec_of, Counting, LimitQuota};

/// One entry of a request descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
}

/// One descriptor of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDescriptor {
    /// Its entries.
    pub entries: Vec<Entry>,
    /// A limit the request supplies, replacing the configuration's.
    pub limit: Option<(u32, Unit)>,
    /// Hits for this descriptor only (0: check without counting).
    pub hits_addend: Option<u64>,
}

/// A `ShouldRateLimit` request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The domain.
    pub domain: String,
    /// Its descriptors.
    pub descriptors: Vec<RequestDescriptor>,
    /// Hits of every descriptor without its own (0 counts as 1).
    pub hits_addend: u32,
}

/// A limit as the answer states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The limit's `name`.
    pub name: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// OVER_LIMIT (else OK).
    pub over: bool,
    /// The limit that applied, if any.
    pub current_limit: Option<CurrentLimit>,
    /// Requests left in the window.
    pub limit_remaining: u32,
    /// Seconds until the window resets.
    pub duration_until_reset: Option<u64>,
}

impl Status {
    fn no_limit() -> Status {
        Status {
            over: false,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: None,
        }
    }
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// OVER_LIMIT overall (else OK).
    pub over: bool,
    /// One per request descriptor, in order.
    pub statuses: Vec<Status>,
    /// `RateLimit-Policy` and `RateLimit` of the tightest descriptor, when
    /// the server sends response headers.
    pub headers: Vec<(String, String)>,
    /// Dynamic metadata (quota mode, descriptors' `metadata`).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Why a request was refused outright.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No domain.
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// No descriptors.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
}

/// The configuration in force and what was made from it.
struct Loaded {
    config: Config,
}

/// The decision engine: the table, the configuration in force, counters.
pub struct Engine {
    table: Arc<Table>,
    loaded: ArcSwap<Loaded>,
    /// Roots are configured: quota loads are seeds.
    has_roots: bool,
    /// Send `RateLimit-Policy` and `RateLimit` with every answer.
    response_headers: bool,
    /// Quotas made for limits requests supplied, by name.
    supplied: Mutex<Vec<QuotaSpec>>,
    /// Serialises quota loads.
    loads: Mutex<()>,
    /// Counters of labels made from request values.
    pub detailed: DetailedStats,
    /// Counters of whole requests and loads.
    pub requests: RequestStats,
}

/// A matched limit of one descriptor.
struct Matched<'c> {
    limit: Cow<'c, Limit>,
    quota: LimitQuota,
    /// The counter's key, for a per-key quota.
    key: Option<Vec<u8>>,
}

/// What matching a request descriptor found.
struct Match<'c> {
    /// The configured descriptor holding the limits (none for a supplied
    /// limit).
    descriptor: Option<&'c Descriptor>,
    limits: Vec<Matched<'c>>,
    /// The counters its decisions go to.
    stats: Option<Arc<Stats>>,
}

impl Engine {
    /// An engine over `table` with `config` loaded into it (as seeds when
    /// `has_roots`).
    pub fn new(
        table: Arc<Table>,
        config: Config,
        has_roots: bool,
        response_headers: bool,
    ) -> Result<Engine, String> {
        let engine = Engine {
            table,
            loaded: ArcSwap::from_pointee(Loaded {
                config: Config::default(),
            }),
            has_roots,
            response_headers,
            supplied: Mutex::new(Vec::new()),
            loads: Mutex::new(()),
            detailed: DetailedStats::default(),
            requests: RequestStats::default(),
        };
        engine.install(config)?;
        Ok(engine)
    }

    /// The table.
    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// Every configured descriptor's counters.
    pub fn configured_stats(&self) -> Vec<((String, String), Arc<Stats>)> {
        self.loaded.load().config.stats()
    }

    /// Puts `config` in force: its quotas loaded into the table (with the
    /// supplied limits' quotas), then the configuration swapped in.
    pub fn install(&self, mut config: Config) -> Result<(), String> {
        let _guard = self.loads.lock().map_err(|_| "quota load lock poisoned")?;
        config.adopt_stats(&self.loaded.load().config);
        let mut specs = config.quota_specs();
        if let Ok(supplied) = self.supplied.lock() {
            specs.extend(supplied.iter().cloned());
        }
        self.load_specs(specs)?;
        self.loaded.store(Arc::new(Loaded { config }));
        Ok(())
    }

    fn load_specs(&self, specs: Vec<QuotaSpec>) -> Result<(), String> {
        let set = QuotaSet::new(specs).map_err(|e| e.to_string())?;
        let role = if self.has_roots {
            FileRole::Seed
        } else {
            FileRole::Authoritative
        };
        let report = load_set(&self.table, &set, role);
        match report.refused.first() {
            Some(first) => Err(format!(
                "{} quota(s) refused by the table, first: {first}",
                report.refused.len()
            )),
            None => Ok(()),
        }
    }

    /// Answers `request` at `now` (the table's clock).
    pub fn should_rate_limit(
        &self,
        request: &Request,
        now: Nanos,
    ) -> Result<Response, RequestError> {
        if request.domain.is_empty() {
            Stats::bump(&self.requests.invalid);
            return Err(RequestError::EmptyDomain);
        }
        if request.descriptors.is_empty() {
            Stats::bump(&self.requests.invalid);
            return Err(RequestError::NoDescriptors);
        }
        let loaded = self.loaded.load();
        let config = &loaded.config;
        let mut matches: Vec<Option<Match<'_>>> = request
            .descriptors
            .iter()
            .map(|d| self.find(config, &request.domain, d))
            .collect();
        // `replaces`: a limit named by another matched limit is dropped.
        let replaced: HashSet<String> = matches
            .iter()
            .flatten()
            .flat_map(|m| m.limits.iter())
            .flat_map(|l| l.limit.replaces.iter().cloned())
            .collect();
        if !replaced.is_empty() {
            for m in matches.iter_mut().flatten() {
                m.limits
                    .retain(|l| l.limit.name.is_empty() || !replaced.contains(&l.limit.name));
            }
        }
        let default_hits = u64::from(request.hits_addend.max(1));
        let mut statuses = Vec::with_capacity(matches.len());
        let mut rooms: Vec<Option<(String, Room)>> = Vec::with_capacity(matches.len());
        let mut over_rate = false;
        let mut quota_mode = Vec::new();
        let mut quota_over = Vec::new();
        let mut metadata = serde_json::Map::new();
        for (i, (found, asked)) in matches.iter().zip(&request.descriptors).enumerate() {
            let hits = asked.hits_addend.unwrap_or(default_hits);
            let Some(found) = found else {
                statuses.push(Status::no_limit());
                rooms.push(None);
                continue;
            };
            let (mut status, room) = self.decide(found, hits, now);
            let descriptor = found.descriptor;
            let shadow = descriptor.is_some_and(|d| d.shadow_mode);
            let in_quota_mode =
                descriptor.is_some_and(|d| d.quota_mode) && !found.limits.is_empty();
            if let Some(stats) = &found.stats {
                if !found.limits.is_empty()
                    && found
                        .limits
                        .iter()
                        .any(|l| l.quota.counting != Counting::Unlimited)
                {
                    stats.hits.fetch_add(hits, Ordering::Relaxed);
                }
                if status.over && shadow {
                    Stats::bump(&stats.shadow_mode);
                } else if status.over && in_quota_mode {
                    Stats::bump(&stats.quota_mode);
                }
            }
            if status.over && shadow {
                status.over = false;
            }
            if in_quota_mode {
                quota_mode.push(i);
                if status.over {
                    quota_over.push(i);
                }
            } else if status.over {
                over_rate = true;
            }
            if !status.over {
                if let Some(meta) = descriptor.and_then(|d| d.metadata.as_ref()) {
                    metadata
                        .entry("descriptorMetadata")
                        .or_insert_with(|| serde_json::Value::Object(Default::default()))
                        .as_object_mut()
                        .map(|m| m.insert(i.to_string(), meta.clone()));
                }
            }
            statuses.push(status);
            rooms.push(room);
        }
        // Quota mode: the request passes while some quota-mode descriptor
        // has room; when none has, they are over like any limit.
        let quota_exhausted = !quota_mode.is_empty() && quota_over.len() == quota_mode.len();
        for &i in &quota_over {
            statuses[i].over = quota_exhausted;
        }
        if !quota_mode.is_empty() {
            metadata.insert("quotaModeEnabled".into(), true.into());
            metadata.insert(
                "quotaModeViolations".into(),
                serde_json::Value::Array(quota_over.iter().map(|&i| (i as u64).into()).collect()),
            );
        }
        let over = over_rate || quota_exhausted;
        for (status, found) in statuses.iter().zip(&matches) {
            if let Some(stats) = found.as_ref().and_then(|m| m.stats.as_ref()) {
                if found.as_ref().is_some_and(|m| !m.limits.is_empty()) {
                    Stats::bump(if status.over {
                        &stats.over_limit
                    } else {
                        &stats.ok
                    });
                }
            }
        }
        Stats::bump(if over {
            &self.requests.over_limit
        } else {
            &self.requests.ok
        });
        let headers = if self.response_headers {
            tightest_headers(&statuses, &rooms)
        } else {
            Vec::new()
        };
        Ok(Response {
            over,
            statuses,
            headers,
            metadata: (!metadata.is_empty()).then_some(metadata),
        })
    }

    /// The limits a request descriptor matches (`None`: none).
    fn find<'c>(
        &self,
        config: &'c Config,
        domain: &str,
        asked: &RequestDescriptor,
    ) -> Option<Match<'c>> {
        let tree = config.domains.get(domain)?;
        if let Some((rpu, unit)) = asked.limit {
            return self.supplied_limit(domain, asked, rpu, unit);
        }
        let mut level = &tree.root;
        let mut path: Vec<(&Descriptor, &Entry)> = Vec::with_capacity(asked.entries.len());
        let mut found = None;
        for (i, entry) in asked.entries.iter().enumerate() {
            let Some(d) = level.find(&entry.key, &entry.value) else {
                break;
            };
            path.push((d, entry));
            if i + 1 == asked.entries.len() && !d.limits.is_empty() {
                found = Some(d);
            }
            if d.children.descriptors.is_empty() {
                break;
            }
            level = &d.children;
        }
        let descriptor = found?;
        let key = per_key_key(&path);
        let limits = descriptor
            .limits
            .iter()
            .zip(&descriptor.quotas)
            .map(|(limit, quota)| Matched {
                limit: Cow::Borrowed(limit),
                quota: quota.clone(),
                key: quota.per_key.then(|| key.clone()),
            })
            .collect();
        let stats = match metric_label(&path) {
            None => Some(Arc::clone(&descriptor.stats)),
            Some(label) => self
                .detailed
                .get(domain, &label)
                .or_else(|| Some(Arc::clone(&descriptor.stats))),
        };
        Some(Match {
            descriptor: Some(descriptor),
            limits,
            stats,
        })
    }

    /// A limit the request supplies: a per-key quota of its numbers, keyed
    /// by the whole descriptor, made on first use.
    fn supplied_limit<'c>(
        &self,
        domain: &str,
        asked: &RequestDescriptor,
        rpu: u32,
        unit: Unit,
    ) -> Option<Match<'c>> {
        let limit = Limit {
            requests_per_unit: rpu,
            unit: Some(unit),
            unlimited: false,
            name: String::new(),
            replaces: Vec::new(),
            extension: Extension {
                units: 1,
                ..Default::default()
            },
        };
        let counting = counting_of(&limit).ok()?;
        let quota = LimitQuota {
            name: quota_name(domain, &[("limit", &format!("{}-{rpu}", unit.name()))], 0),
            per_key: true,
            counting,
        };
        if self.table.gate().lookup(quota.name.as_bytes()).is_none() {
            self.make_supplied(&quota, &limit);
        }
        let mut key = Vec::new();
        for (i, entry) in asked.entries.iter().enumerate() {
            if i > 0 {
                key.push(b'.');
            }
            key.extend_from_slice(entry.key.as_bytes());
            if !entry.value.is_empty() {
                key.push(b'_');
                key.extend_from_slice(entry.value.as_bytes());
            }
        }
        Some(Match {
            descriptor: None,
            limits: vec![Matched {
                limit: Cow::Owned(limit),
                quota,
                key: Some(key),
            }],
            stats: None,
        })
    }

    /// Makes the quota of a supplied limit (once per name).
    fn make_supplied(&self, quota: &LimitQuota, limit: &Limit) {
        let Some(spec) = spec_of(quota, limit) else {
            return;
        };
        let Ok(mut supplied) = self.supplied.lock() else {
            return;
        };
        if supplied.iter().any(|s| s.name == spec.name) || supplied.len() >= MAX_SUPPLIED {
            return;
        }
        supplied.push(spec);
        let extra = supplied.clone();
        drop(supplied);
        let _guard = self.loads.lock();
        let mut specs = self.loaded.load().config.quota_specs();
        specs.extend(extra);
        if let Err(error) = self.load_specs(specs) {
            tracing::warn!(%error, "cannot make the quota of a limit a request supplied");
        }
    }

    /// Decides and counts every limit of a match; the status is the
    /// tightest limit's.
    fn decide(&self, found: &Match<'_>, hits: u64, now: Nanos) -> (Status, Option<(String, Room)>) {
        let mut best: Option<(Status, Option<(String, Room)>)> = None;
        for m in &found.limits {
            let verdict = self.decide_one(m, hits, now);
            let tighter = match &best {
                None => true,
                Some((b, _)) => {
                    (verdict.0.over && !b.over)
                        || (verdict.0.over == b.over
                            && verdict.0.limit_remaining < b.limit_remaining)
                }
            };
            if tighter {
                best = Some(verdict);
            }
        }
        best.unwrap_or((Status::no_limit(), None))
    }

    fn decide_one(
        &self,
        m: &Matched<'_>,
        hits: u64,
        now: Nanos,
    ) -> (Status, Option<(String, Room)>) {
        let current_limit = m.limit.unit.map(|unit| CurrentLimit {
            name: m.limit.name.clone(),
            requests_per_unit: m.limit.requests_per_unit,
            unit,
        });
        if m.quota.counting == Counting::Unlimited {
            return (
                Status {
                    over: false,
                    current_limit: None,
                    limit_remaining: u32::MAX,
                    duration_until_reset: None,
                },
                None,
            );
        }
        let item = CheckItem {
            name: m.quota.name.as_bytes(),
            key: m.key.as_deref(),
            weight: hits,
            max_wait: None,
        };
        let gate = self.table.gate();
        let options = CheckOptions {
            dry_run: false,
            headroom: true,
        };
        let outcome = gate.check_many(&[item], now, options, crate::host::thread_unit);
        let room = outcome.headroom.map(|h| h.room);
        let rpu = f64::from(m.limit.requests_per_unit);
        let over = match outcome.outcome {
            Outcome::Pass => false,
            // A check of 0 hits is rejected at the limit; the count is
            // over only above it.
            Outcome::Reject(_) if hits == 0 => room.is_some_and(|r| r.level > rpu),
            Outcome::Reject(_) => {
                // Hits over the limit still count.
                gate.charge(&item, now);
                true
            }
            // No such quota (the roots do not hold it), no key, or a full
            // key section under `pass`: not limited.
            Outcome::Unknown | Outcome::NoKey | Outcome::KeyOverflow => {
                return (
                    Status {
                        current_limit,
                        ..Status::no_limit()
                    },
                    None,
                )
            }
        };
        let remaining = match (over, room) {
            (true, _) | (_, None) => 0,
            (false, Some(r)) => r.remaining().floor().min(f64::from(u32::MAX)) as u32,
        };
        let reset = room.map(|r| reset_seconds(&r));
        (
            Status {
                over,
                current_limit,
                limit_remaining: remaining,
                duration_until_reset: reset,
            },
            room.map(|r| (m.quota.name.clone(), r)),
        )
    }
}

/// Most distinct limits requests may supply (each a quota).
const MAX_SUPPLIED: usize = 1024;

/// Whole seconds until `room`'s window ends (a leaky bucket: until it is
/// empty), as envoyproxy/ratelimit counts them: at least 1.
fn reset_seconds(room: &Room) -> u64 {
    let seconds = match &room.window {
        Some(w) => w.to_end,
        None => room.seconds_to_empty(),
    };
    if seconds.is_finite() {
        (seconds.ceil() as u64).max(1)
    } else {
        u64::from(u32::MAX)
    }
}

/// The key of a per-key limit: the request's values of the descriptors
/// that pick the counter, joined by U+001F.
fn per_key_key(path: &[(&Descriptor, &Entry)]) -> Vec<u8> {
    let mut key = Vec::new();
    for (_, entry) in path.iter().filter(|(d, _)| d.value_varies()) {
        if !key.is_empty() {
            key.push(0x1f);
        }
        key.extend_from_slice(entry.value.as_bytes());
    }
    key
}

/// The metric label made from request values (`None`: the configured
/// descriptor's own full key).
fn metric_label(path: &[(&Descriptor, &Entry)]) -> Option<String> {
    let (last, last_entry) = path.last()?;
    let detailed = last.detailed_metric && last.value == Value::Any;
    if !detailed && !path.iter().any(|(d, _)| d.value_to_metric) {
        return None;
    }
    let mut label = last.full_key.split('.').next().unwrap_or("").to_string();
    for (d, entry) in path {
        label.push('.');
        label.push_str(&d.key);
        let value = if d.value_to_metric {
            entry.value.as_str()
        } else {
            d.value.text()
        };
        if !value.is_empty() {
            label.push('_');
            label.push_str(value);
        }
    }
    if detailed && !last.value_to_metric {
        label.push('_');
        label.push_str(&last_entry.value);
    }
    Some(label)
}

/// `RateLimit-Policy` and `RateLimit` of the descriptor with the least
/// room (the IETF draft's fields, as nginx's `sluice_headers` writes
/// them).
fn tightest_headers(
    statuses: &[Status],
    rooms: &[Option<(String, Room)>],
) -> Vec<(String, String)> {
    let tightest = statuses
        .iter()
        .zip(rooms)
        .filter_map(|(s, r)| r.as_ref().map(|r| (s, r)))
        .min_by_key(|(s, _)| (!s.over, s.limit_remaining));
    let Some((_, (name, room))) = tightest else {
        return Vec::new();
    };
    use crate::nginx::headers::{rate_limit_fields, Reset};
    match rate_limit_fields(name, room, Reset::Estimated) {
        Some((policy, state)) => vec![
            ("RateLimit-Policy".into(), policy.as_str().to_string()),
            ("RateLimit".into(), state.as_str().to_string()),
        ],
        None => Vec::new(),
    }
}
