//! `/v1/quotas`: list, get, put, patch and delete single quotas.
//!
//! Reads come from the root's memory (so they work while the database is
//! down and show live counter levels); writes go to the database and are
//! reloaded before the reply, so a client reads its own writes.
//!
//! `PUT` replaces a quota whole (a field left out takes its default);
//! `PATCH` changes the fields it names and keeps the others. A quota's
//! epoch is its version: `GET` sends it as the `ETag`, and a write with
//! `If-Match: "<epoch>"` is refused with 412 when the quota changed since
//! (`If-None-Match: *` puts only a new quota), so two editors never
//! overwrite each other unseen.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::core::quota::{validate_name, validate_name_prefix};
use crate::core::spec::{QuotaPatch, QuotaSpec};
use crate::root::state::RootState;
use crate::root::store::PutOutcome;

use super::preconditions::{expectation, with_etag};
use super::view::{view, QuotaView};
use super::{json_response, ApiError, JsonBody};

/// Default page size of a listing.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// Largest page size of a listing.
pub const MAX_LIST_LIMIT: usize = 10_000;

/// Reply of a put or a patch.
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
    let ledger = state.ledger().read();
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
    Ok(with_etag(json_response(StatusCode::OK, &view), view.epoch))
}

/// The reply of a put or patch that did `outcome` to `name`.
fn written(state: &RootState, name: &str, outcome: PutOutcome) -> Response {
    let (status, changed, epoch) = match outcome {
        PutOutcome::Created(w) => (StatusCode::CREATED, true, w.epoch),
        PutOutcome::Updated(w) => (StatusCode::OK, true, w.epoch),
        PutOutcome::Unchanged { epoch, .. } => (StatusCode::OK, false, epoch),
    };
    if changed {
        tracing::info!(
            quota = name,
            epoch,
            created = status == StatusCode::CREATED,
            "quota written"
        );
    }
    let reply = PutReply {
        changed,
        epoch,
        quota: lookup(state, name),
    };
    json_response(status, &reply)
}

/// Refuses a body naming another quota than the path: a body may repeat
/// the name, not change it.
fn same_name(body: &str, path: &str) -> Result<(), ApiError> {
    if body.is_empty() || body == path {
        return Ok(());
    }
    Err(ApiError::invalid(
        "name",
        format!("the body names {body:?} but the path {path:?}"),
    ))
}

/// `GET /v1/quotas?prefix=&after=&limit=`.
pub async fn list(
    State(state): State<Arc<RootState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::malformed(None, e.body_text()))?;
    let limit = super::page_size(query.limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
    validate_name_prefix(&query.prefix).map_err(|e| ApiError::invalid("prefix", e.message))?;
    require_ready(&state)?;
    let now = state.now();
    let ledger = state.ledger().read();
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

/// `PUT /v1/quotas/{name}`: create or replace whole. The body is a quota
/// as a quota file writes it ([`QuotaSpec`]), its name taken from the
/// path; a field left out takes its default.
pub async fn put(
    State(state): State<Arc<RootState>>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    JsonBody(mut spec): JsonBody<QuotaSpec>,
) -> Result<Response, ApiError> {
    let name = quota_name(name)?;
    same_name(&spec.name, &name)?;
    spec.name = name;
    let expect = expectation(&headers)?;
    let outcome = state.write(state.store.put_if(&spec, &expect)).await?;
    Ok(written(&state, &spec.name, outcome))
}

/// `PATCH /v1/quotas/{name}`: change the fields the body names
/// ([`QuotaPatch`]) of an existing quota, keep the others.
pub async fn patch(
    State(state): State<Arc<RootState>>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    JsonBody(patch): JsonBody<QuotaPatch>,
) -> Result<Response, ApiError> {
    let name = quota_name(name)?;
    same_name(patch.name.as_deref().unwrap_or_default(), &name)?;
    let expect = expectation(&headers)?;
    let outcome = state
        .write(state.store.patch(&name, &patch, &expect))
        .await?;
    Ok(written(&state, &name, outcome))
}

/// `DELETE /v1/quotas/{name}`: leaves a tombstone; refuses a quota with
/// children (409).
pub async fn delete(
    State(state): State<Arc<RootState>>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let name = quota_name(name)?;
    let expect = expectation(&headers)?;
    let written = state.write(state.store.delete(&name, &expect)).await?;
    tracing::info!(quota = name, epoch = written.epoch, "quota deleted");
    let reply = DeleteReply {
        deleted: name,
        id: written.id,
        epoch: written.epoch,
    };
    Ok(json_response(StatusCode::OK, &reply))
}
