//! `GET /healthz` and `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::root::state::RootState;

use super::json_response;

#[derive(Serialize)]
struct HealthReply {
    /// `ok`; `degraded` while the database is down (serving what is
    /// loaded); `starting` until the first load.
    status: &'static str,
    ready: bool,
    db: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    db_error: Option<String>,
    /// Seconds since the database went down, while it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    db_down_secs: Option<f64>,
    backend: &'static str,
    instance: String,
    epoch: u64,
    quotas: usize,
    counters: usize,
}

/// `GET /healthz`: 200 once quotas are loaded (even while the database is
/// down: syncs are still served), 503 before.
pub async fn healthz(State(state): State<Arc<RootState>>) -> Response {
    let health = state.health.snapshot();
    let stats = state.ledger().stats();
    let status = match (health.ready, health.db_up) {
        (false, _) => "starting",
        (true, false) => "degraded",
        (true, true) => "ok",
    };
    let reply = HealthReply {
        status,
        ready: health.ready,
        db: if health.db_up { "up" } else { "down" },
        db_error: health.db_error,
        db_down_secs: health.down_for,
        backend: state.store.backend().name(),
        instance: format!("{:016x}", state.instance),
        epoch: stats.epoch,
        quotas: stats.quotas,
        counters: stats.counters,
    };
    let code = if health.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(code, &reply)
}

/// `GET /metrics`: Prometheus text format 0.0.4.
pub async fn metrics(State(state): State<Arc<RootState>>) -> Response {
    let text = state.metrics.render(&state.scrape());
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
