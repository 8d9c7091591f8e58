//! `/v1/quotas`: list, get, put and delete single quotas.
//!
//! Reads come from the root's memory (so they work while the database is
//! down and show live counter levels); writes go to the database and are
//! reloaded before the reply, so a client reads its own writes.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::core::quota::validate_name;
use crate::core::spec::QuotaSpec;
use crate::core::{Nanos, Quota, SECS_PER_NANO};

use crate::root::ledger::Ledger;
use crate::root::state::RootState;
use crate::root::store::PutOutcome;

use super::{json_response, ApiError, JsonBody};

/// Default page size of a listing.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// Largest page size of a listing.
pub const MAX_LIST_LIMIT: usize = 10_000;

/// Body of `PUT /v1/quotas/{name}`: the whole quota but its name.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    /// Parent quota's name; absent or null for a top-level quota.
    #[serde(default)]
    pub parent: Option<String>,
    /// Leak rate, units per second.
    pub limit: f64,
    /// Level up to which everything passes (default: `limit`).
    #[serde(default)]
    pub low_burst: Option<f64>,
    /// Level from which everything is rejected (default: `low_burst`).
    #[serde(default)]
    pub high_burst: Option<f64>,
}

/// A quota as the admin API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct QuotaView {
    /// Quota id (also its counter's).
    pub id: u64,
    /// Name.
    pub name: String,
    /// Parent's name.
    pub parent: Option<String>,
    /// Leak rate, units per second.
    pub limit: f64,
    /// Level up to which everything passes.
    pub low_burst: f64,
    /// Level from which everything is rejected.
    pub high_burst: f64,
    /// Epoch of the last change.
    pub epoch: u64,
    /// Cluster level now, as this root sums it.
    pub level: f64,
    /// Units per second arriving at this root, smoothed.
    pub fill_rate: f64,
    /// Limiters that recently sent weight for this quota (single-quota
    /// reads only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limiters: Option<Vec<LimiterSeen>>,
}

/// A limiter that recently sent weight for a quota.
#[derive(Clone, Debug, Serialize)]
pub struct LimiterSeen {
    /// The limiter's id.
    pub limiter: String,
    /// Seconds since its last delta for the quota.
    pub seconds_ago: f64,
}

/// Reply of a put.
#[derive(Serialize)]
struct PutReply {
    /// False when the quota already had these values.
    changed: bool,
    /// Epoch of the quota's last change.
    epoch: u64,
    /// The quota as reloaded (null if the reload after the write failed).
    quota: Option<QuotaView>,
}

/// Reply of a delete.
#[derive(Serialize)]
struct DeleteReply {
    deleted: String,
    id: u64,
    epoch: u64,
}

/// Query of a listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only names starting with this.
    #[serde(default)]
    pub prefix: String,
    /// Only names after this one (the previous page's `next`).
    pub after: Option<String>,
    /// Page size.
    pub limit: Option<usize>,
}

/// A page of a listing.
#[derive(Serialize)]
struct ListReply {
    quotas: Vec<QuotaView>,
    /// Pass as `after` for the next page; null on the last page.
    next: Option<String>,
}

fn view(ledger: &Ledger, quota: &Quota, now: Nanos, with_limiters: bool) -> QuotaView {
    let counter = ledger.counters.view(quota.id, now);
    let limiters = with_limiters.then(|| {
        let seen = counter
            .as_ref()
            .map(|c| c.seen.as_slice())
            .unwrap_or_default();
        seen.iter()
            .filter_map(|s| {
                let limiter = ledger.limiters.get(s.limiter)?;
                let seconds_ago = now.saturating_sub(s.at) as f64 * SECS_PER_NANO;
                Some(LimiterSeen {
                    limiter: limiter.name.to_string(),
                    seconds_ago,
                })
            })
            .collect()
    });
    QuotaView {
        id: quota.id,
        name: quota.name.clone(),
        parent: quota
            .parent
            .and_then(|p| ledger.quotas.name_of(p))
            .map(str::to_string),
        limit: quota.limit,
        low_burst: quota.low_burst,
        high_burst: quota.high_burst,
        epoch: quota.epoch,
        level: counter.as_ref().map_or(0.0, |c| c.level),
        fill_rate: counter.as_ref().map_or(0.0, |c| c.fill_rate),
        limiters,
    }
}

/// The quota name in the path, percent-decoded and valid.
fn quota_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(name) = path.map_err(|e| ApiError::invalid("name", e.body_text()))?;
    validate_name(&name)?;
    Ok(name)
}

fn require_ready(state: &RootState) -> Result<(), ApiError> {
    if state.health.is_ready() {
        return Ok(());
    }
    let reason = state
        .health
        .db_error()
        .unwrap_or_else(|| "not tried yet".into());
    Err(ApiError::unavailable(format!(
        "quotas not loaded yet: the database has not been reached ({reason})"
    )))
}

/// The live view of one quota by name.
fn lookup(state: &RootState, name: &str) -> Option<QuotaView> {
    let now = state.now();
    let ledger = state.ledger();
    let quota = ledger.quotas.by_name(name)?;
    Some(view(&ledger, quota, now, true))
}

/// `GET /v1/quotas/{name}`.
pub async fn get(
    State(state): State<Arc<RootState>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = quota_name(name)?;
    require_ready(&state)?;
    let view = lookup(&state, &name)
        .ok_or_else(|| ApiError::not_found(format!("no quota named {name:?}")))?;
    Ok(json_response(StatusCode::OK, &view))
}

/// `GET /v1/quotas?prefix=&after=&limit=`.
pub async fn list(
    State(state): State<Arc<RootState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::malformed(None, e.body_text()))?;
    let limit = query.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            format!("must be 1 to {MAX_LIST_LIMIT}"),
        ));
    }
    if !query.prefix.is_empty() {
        validate_name(&query.prefix).map_err(|e| ApiError::invalid("prefix", e.message))?;
    }
    require_ready(&state)?;
    let now = state.now();
    let ledger = state.ledger();
    let (quotas, more) = ledger
        .quotas
        .list(&query.prefix, query.after.as_deref(), limit);
    let views: Vec<QuotaView> = quotas
        .iter()
        .map(|q| view(&ledger, q, now, false))
        .collect();
    drop(ledger);
    let next = if more {
        views.last().map(|v| v.name.clone())
    } else {
        None
    };
    Ok(json_response(
        StatusCode::OK,
        &ListReply {
            quotas: views,
            next,
        },
    ))
}

/// `PUT /v1/quotas/{name}`: create or replace.
pub async fn put(
    State(state): State<Arc<RootState>>,
    name: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody<QuotaBody>,
) -> Result<Response, ApiError> {
    let name = quota_name(name)?;
    let spec = QuotaSpec {
        name,
        parent: body.parent,
        limit: body.limit,
        low_burst: body.low_burst,
        high_burst: body.high_burst,
    };
    spec.validate()?;
    let outcome = state.write(state.store.put(&spec)).await?;
    let (status, changed, epoch) = match outcome {
        PutOutcome::Created(w) => (StatusCode::CREATED, true, w.epoch),
        PutOutcome::Updated(w) => (StatusCode::OK, true, w.epoch),
        PutOutcome::Unchanged { epoch, .. } => (StatusCode::OK, false, epoch),
    };
    if changed {
        tracing::info!(
            quota = spec.name,
            epoch,
            created = status == StatusCode::CREATED,
            "quota written"
        );
    }
    let reply = PutReply {
        changed,
        epoch,
        quota: lookup(&state, &spec.name),
    };
    Ok(json_response(status, &reply))
}

/// `DELETE /v1/quotas/{name}`: leaves a tombstone; refuses a quota with
/// children (409).
pub async fn delete(
    State(state): State<Arc<RootState>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = quota_name(name)?;
    let written = state.write(state.store.delete(&name)).await?;
    tracing::info!(quota = name, epoch = written.epoch, "quota deleted");
    let reply = DeleteReply {
        deleted: name,
        id: written.id,
        epoch: written.epoch,
    };
    Ok(json_response(StatusCode::OK, &reply))
}
