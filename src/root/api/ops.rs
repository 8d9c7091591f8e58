//! `GET /healthz` and `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::root::state::RootState;

use super::json_response;
use super::overview::{self, Access};

#[derive(Serialize)]
struct HealthReply {
    /// `ok`; `degraded` while the database is down or takes no writes
    /// (serving what is loaded, read-only); `starting` until the first
    /// load.
    status: &'static str,
    /// Quotas loaded: syncs are served (also while degraded).
    ready: bool,
    /// `up`, `down` (unreachable) or `read_only` (reachable, but takes no
    /// writes: read-only, or not the database loaded).
    db: &'static str,
    /// Admin writes are accepted.
    writable: bool,
    /// Why the status is not `ok`, naming no path, host or database
    /// error: what a probe without the token may read.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    /// The database's own error while it is down, or why it takes no
    /// writes (it may name a file or a host): with the admin token only
    /// (or on a root without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    db_error: Option<String>,
    /// Seconds since the database went down, while it is.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::root::api::round::seconds_opt"
    )]
    db_down_secs: Option<f64>,
    backend: &'static str,
    instance: String,
    epoch: u64,
    quotas: usize,
    counters: usize,
}

/// `GET /healthz`: 200 when everything works; 503 before quotas are
/// loaded, and while the database is down or takes no writes (syncs are
/// still served then: `ready` says so). Without the admin token the reply
/// says why in general words (`reason`); the database's own error, which
/// may name a file or a host, needs the token (a wrong one is a 401, as
/// on `/metrics`).
pub async fn healthz(State(state): State<Arc<RootState>>, headers: HeaderMap) -> Response {
    let Some(access) = overview::access(&state, &headers) else {
        return super::unauthorized("admin");
    };
    let health = state.health.snapshot();
    let stats = state.ledger().stats();
    let status = health.status();
    let reply = HealthReply {
        status,
        ready: health.ready,
        db: health.db_state(),
        writable: status == "ok",
        reason: health.reason(),
        db_error: health.db_error.filter(|_| access == Access::Admin),
        db_down_secs: health.down_for,
        backend: state.store.backend().name(),
        instance: format!("{:016x}", state.instance),
        epoch: stats.epoch,
        quotas: stats.quotas,
        counters: stats.sizes.counters,
    };
    let code = if status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(code, &reply)
}

/// `GET /metrics`: Prometheus text format 0.0.4. Series that name
/// limiters are there only with the admin token (or on a root without
/// one), as in the overview; a wrong token is a 401.
pub async fn metrics(State(state): State<Arc<RootState>>, headers: HeaderMap) -> Response {
    let Some(access) = overview::access(&state, &headers) else {
        return super::unauthorized("admin");
    };
    let mut scrape = state.scrape();
    if access == Access::Public {
        scrape.clipped.clear();
    }
    let text = state.metrics.render(&scrape);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
