//! `/v1/quotas/{name}/keys`: the keys of a per-key template as this root
//! sums them, by hash (the root never sees a key itself).
//!
//! - `GET /v1/quotas/{name}/keys?top=N`: the busiest keys (highest fill
//!   rate, then level), at most `top` (default 20, at most 1000), and how
//!   many keys the root holds for the template;
//! - `GET /v1/quotas/{name}/keys/{hash}`: one key, by the 16 hex digits
//!   `sluice quota key` prints (it hashes a key with the fleet's secret).

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::core::key::{format_hash, parse_hash};
use crate::core::quota::validate_name;
use crate::root::counter_book::CounterView;
use crate::root::state::RootState;
use crate::wire::CounterKey;

use super::{json_response, ApiError};

/// Keys listed when `top` is not given.
pub const DEFAULT_TOP_KEYS: usize = 20;
/// Most keys one listing returns.
pub const MAX_TOP_KEYS: usize = 1000;

/// Query of a key listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopQuery {
    /// How many keys.
    pub top: Option<usize>,
}

/// One key as the admin API shows it.
#[derive(Debug, Serialize)]
pub struct KeyView {
    /// The key's hash: 16 hex digits.
    pub key: String,
    /// Cluster level now, as this root sums it.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub level: f64,
    /// Units per second arriving at this root for the key, smoothed.
    #[serde(serialize_with = "crate::root::api::round::significant")]
    pub fill_rate: f64,
}

impl KeyView {
    fn new(key: u64, view: &CounterView) -> Self {
        Self {
            key: format_hash(key),
            level: view.level,
            fill_rate: view.fill_rate,
        }
    }
}

/// Reply of a listing.
#[derive(Serialize)]
struct TopReply {
    quota: String,
    /// Keys of the template this root holds.
    keys_held: usize,
    keys: Vec<KeyView>,
}

/// The id of the per-key template `name`, or a 404/400 naming why not
/// (its keys and its overrides are read through it).
pub(super) fn template_id(state: &RootState, name: &str) -> Result<u64, ApiError> {
    let ledger = state.ledger().read();
    let quota = ledger
        .quotas
        .by_name(name)
        .ok_or_else(|| ApiError::not_found(format!("no quota named {name:?}")))?;
    if !quota.per_key {
        return Err(ApiError::invalid(
            "name",
            format!("{name:?} is not a per-key quota"),
        ));
    }
    Ok(quota.id)
}

/// `GET /v1/quotas/{name}/keys?top=N`.
pub async fn top(
    State(state): State<Arc<RootState>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<TopQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(name) = path.map_err(|e| ApiError::invalid("name", e.body_text()))?;
    validate_name(&name)?;
    let Query(query) = query.map_err(|e| ApiError::malformed(None, e.body_text()))?;
    let top = query.top.unwrap_or(DEFAULT_TOP_KEYS);
    if !(1..=MAX_TOP_KEYS).contains(&top) {
        return Err(ApiError::invalid(
            "top",
            format!("must be 1 to {MAX_TOP_KEYS}"),
        ));
    }
    let id = template_id(&state, &name)?;
    let now = state.now();
    let ledger = state.ledger().read();
    let keys = ledger.counters.top_keys(id, usize::MAX, now);
    let keys_held = keys.len();
    let keys = keys
        .iter()
        .take(top)
        .map(|(key, view)| KeyView::new(*key, view))
        .collect();
    drop(ledger);
    let reply = TopReply {
        quota: name,
        keys_held,
        keys,
    };
    Ok(json_response(StatusCode::OK, &reply))
}

/// `GET /v1/quotas/{name}/keys/{hash}`.
pub async fn get(
    State(state): State<Arc<RootState>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((name, hash)) = path.map_err(|e| ApiError::invalid("name", e.body_text()))?;
    validate_name(&name)?;
    let key = parse_hash(&hash)
        .ok_or_else(|| ApiError::invalid("key", "must be 16 hex digits, not all zero"))?;
    let id = template_id(&state, &name)?;
    let now = state.now();
    let view = state
        .ledger()
        .counters
        .view_counter(CounterKey { id, key }, now)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no counter for key {hash} of {name:?} at this root (never seen, or drained)"
            ))
        })?;
    Ok(json_response(StatusCode::OK, &KeyView::new(key, &view)))
}
