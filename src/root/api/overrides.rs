//! `/v1/quotas/{name}/overrides`: the overrides of a per-key template's
//! keys, by hash (see [`crate::core::tier`]).
//!
//! - `GET /v1/quotas/{name}/overrides?after=&limit=`: the live overrides
//!   in key order, a page at a time, and the penalties in force on the
//!   template's keys;
//! - `GET/PUT/PATCH/DELETE /v1/quotas/{name}/overrides/{key_hash}`: one
//!   override: read, create or replace whole ([`OverrideSpec`]: `limit`
//!   with optional bursts, `"allow": true` or `"deny": true`, and an
//!   optional `note` and `expires`), change the fields given, remove.
//!   An override's epoch is its version, as a quota's is: `GET` sends it
//!   as the `ETag`, and writes take `If-Match` and `If-None-Match: *`
//!   (`preconditions.rs`).
//!
//! Writes go to the database like quota writes (an epoch each) and reach
//! limiters through the sync.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::core::key::{format_hash, KeyHash};
use crate::core::quota::validate_name;
use crate::core::tier::{format_utc_ms, parse_key_hash, OverrideSpec};
use crate::root::state::RootState;
use crate::root::store::{OverrideOutcome, OverrideRow};

use super::keys::template_id;
use super::preconditions::{expectation, with_etag};
use super::{json_response, ApiError, JsonBody};

/// Overrides listed when `limit` is not given.
pub const DEFAULT_LIST_LIMIT: usize = 1000;
/// Most overrides one page lists.
pub const MAX_LIST_LIMIT: usize = 10_000;

/// Query of a listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only keys after this hash (the previous page's `next`).
    pub after: Option<String>,
    /// Page size.
    pub limit: Option<usize>,
}

/// One override as the admin API shows it: the body that would write it,
/// with its key, epoch and last change.
#[derive(Debug, Serialize)]
pub struct OverrideView {
    /// The key's hash.
    pub key_hash: String,
    /// What it does, as written.
    #[serde(flatten)]
    pub spec: OverrideSpec,
    /// `limit`, `allow` or `deny`.
    pub kind: &'static str,
    /// Epoch of its last change.
    pub epoch: u64,
    /// When it last changed (RFC 3339, UTC).
    pub updated: String,
}

impl OverrideView {
    /// The view of a stored override.
    pub fn of(row: &OverrideRow) -> Self {
        Self {
            key_hash: format_hash(row.ov.key),
            spec: OverrideSpec::of(row.ov.rule, row.note.clone(), row.ov.expires_ms),
            kind: row.ov.rule.kind(),
            epoch: row.ov.epoch,
            updated: format_utc_ms(row.updated_ms),
        }
    }
}

/// A page of a listing.
#[derive(Serialize)]
struct ListReply {
    quota: String,
    /// Live overrides of the template in all.
    count: usize,
    overrides: Vec<OverrideView>,
    /// Pass as `after` for the next page; null on the last page.
    next: Option<String>,
    /// Keys of the template under a penalty now, latest end first (at
    /// most 100), with its end (RFC 3339).
    penalties: Vec<PenaltyView>,
}

/// A penalty in force, as listings show it.
#[derive(Debug, Serialize)]
pub struct PenaltyView {
    /// The key's hash; absent for a penalty on a named quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_hash: Option<String>,
    /// When it ends (RFC 3339, UTC).
    pub until: String,
    /// Seconds left.
    pub seconds_left: f64,
}

/// Reply of a write.
#[derive(Serialize)]
struct WriteReply {
    /// False when the override already was so (no epoch taken).
    changed: bool,
    quota: String,
    #[serde(rename = "override")]
    written: OverrideView,
}

/// Reply of a removal.
#[derive(Serialize)]
struct DeleteReply {
    quota: String,
    deleted: String,
    epoch: u64,
}

/// The template's name and the key hash in the path, checked.
fn place(
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(String, KeyHash), ApiError> {
    let Path((name, hash)) = path.map_err(|e| ApiError::invalid("name", e.body_text()))?;
    validate_name(&name)?;
    let key = parse_key_hash(&hash)?;
    Ok((name, key))
}

/// `GET /v1/quotas/{name}/overrides?after=&limit=`.
pub async fn list(
    State(state): State<Arc<RootState>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(name) = path.map_err(|e| ApiError::invalid("name", e.body_text()))?;
    validate_name(&name)?;
    let Query(query) = query.map_err(|e| ApiError::malformed(None, e.body_text()))?;
    let limit = super::page_size(query.limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
    let after = match query.after.as_deref() {
        Some(text) => parse_key_hash(text).map_err(|e| ApiError::invalid("after", e.message))?,
        None => 0,
    };
    let id = template_id(&state, &name)?;
    let (page, more, count) = {
        let book = state.ledger().overrides();
        let (page, more) = book.list(id, after, limit);
        (page, more, book.count(id))
    };
    let overrides: Vec<OverrideView> = page.iter().map(|row| OverrideView::of(row)).collect();
    let next = more
        .then(|| overrides.last().map(|o| o.key_hash.clone()))
        .flatten();
    let reply = ListReply {
        penalties: penalties_of(&state, id, 100),
        quota: name,
        count,
        overrides,
        next,
    };
    Ok(json_response(StatusCode::OK, &reply))
}

/// The penalties in force on quota `id` (its keys, or itself), latest
/// end first, at most `max`.
pub fn penalties_of(state: &RootState, id: u64, max: usize) -> Vec<PenaltyView> {
    let now_utc = state.now() as i64 + state.ledger().utc_offset;
    let all = state.ledger().penalties().active(now_utc, usize::MAX);
    all.into_iter()
        .filter(|p| p.quota() == id)
        .take(max)
        .map(|p| PenaltyView {
            key_hash: (p.key() != 0).then(|| format_hash(p.key())),
            until: format_utc_ms(p.until().div_euclid(1_000_000)),
            seconds_left: (p.until() - now_utc) as f64 * 1e-9,
        })
        .collect()
}

/// `GET /v1/quotas/{name}/overrides/{key_hash}`.
pub async fn get(
    State(state): State<Arc<RootState>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (name, key) = place(path)?;
    let id = template_id(&state, &name)?;
    let row = state.ledger().overrides().get(id, key).cloned();
    let row = row.ok_or_else(|| {
        ApiError::not_found(format!(
            "{name:?} has no override for key {}",
            format_hash(key)
        ))
    })?;
    let view = OverrideView::of(&row);
    Ok(with_etag(json_response(StatusCode::OK, &view), view.epoch))
}

/// `PUT /v1/quotas/{name}/overrides/{key_hash}`: create or replace whole.
pub async fn put(
    State(state): State<Arc<RootState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<OverrideSpec>,
) -> Result<Response, ApiError> {
    let (name, key) = place(path)?;
    let expect = expectation(&headers)?;
    let now_ms = state.utc_ms();
    let outcome = state
        .write(state.store.put_override(&name, key, &spec, now_ms, &expect))
        .await?;
    Ok(written(name, outcome))
}

/// `PATCH /v1/quotas/{name}/overrides/{key_hash}`: change the fields the
/// body gives (`"expires": "never"` and `"note": ""` clear theirs).
pub async fn patch(
    State(state): State<Arc<RootState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<OverrideSpec>,
) -> Result<Response, ApiError> {
    let (name, key) = place(path)?;
    let expect = expectation(&headers)?;
    let now_ms = state.utc_ms();
    let outcome = state
        .write(
            state
                .store
                .patch_override(&name, key, &spec, now_ms, &expect),
        )
        .await?;
    Ok(written(name, outcome))
}

/// `DELETE /v1/quotas/{name}/overrides/{key_hash}`.
pub async fn delete(
    State(state): State<Arc<RootState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (name, key) = place(path)?;
    let expect = expectation(&headers)?;
    let epoch = state
        .write(state.store.delete_override(&name, key, &expect))
        .await?;
    tracing::info!(
        quota = name,
        key = format_hash(key),
        epoch,
        "override removed"
    );
    let reply = DeleteReply {
        quota: name,
        deleted: format_hash(key),
        epoch,
    };
    Ok(json_response(StatusCode::OK, &reply))
}

/// The reply of a put or patch.
fn written(name: String, outcome: OverrideOutcome) -> Response {
    let (status, changed) = match &outcome {
        OverrideOutcome::Created(_) => (StatusCode::CREATED, true),
        OverrideOutcome::Updated(_) => (StatusCode::OK, true),
        OverrideOutcome::Unchanged(_) => (StatusCode::OK, false),
    };
    let row = outcome.row();
    if changed {
        tracing::info!(
            quota = name,
            key = format_hash(row.ov.key),
            kind = row.ov.rule.kind(),
            epoch = row.ov.epoch,
            "override written"
        );
    }
    let reply = WriteReply {
        changed,
        quota: name,
        written: OverrideView::of(row),
    };
    json_response(status, &reply)
}
