//! `POST /v1/sync`: a limiter's deltas in, quota and counter changes out.
//!
//! The whole request is checked before anything is applied, so an absurd
//! request (a malformed body, too many deltas, an impossible delta, a bad
//! limiter id) changes nothing and gets a 400.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;

use crate::wire::{ClockReport, SyncRequest, CLOCK_HEADER};

use crate::root::ledger::SyncPaging;
use crate::root::metrics::SyncResult;
use crate::root::state::RootState;

use super::{json_bytes, parse_json, read_body, ApiError};

/// Handles one sync.
pub async fn sync(
    State(state): State<Arc<RootState>>,
    body: Request,
) -> Result<Response, ApiError> {
    let clock = body
        .headers()
        .get(CLOCK_HEADER)
        .and_then(|v| ClockReport::parse(v.to_str().ok()?));
    let body = read_body(body, &state).await?;
    // Timed from here: parsing is part of the work, the upload is not.
    let started = Instant::now();
    let request: SyncRequest = parse_json(&body)?;
    if !state.health.is_ready() {
        return Err(ApiError::unavailable(
            "quotas not loaded yet: the root has not reached its database since it started",
        ));
    }
    check_request(&request)?;
    let paging = SyncPaging {
        quotas: state.config.sync_page_quotas,
        counters: state.config.sync_page_counters,
    };
    let now = state.now();
    let (step, utc_offset) = {
        let mut ledger = state.ledger();
        let step = ledger.sync(&request, state.instance, now, paging);
        if let Some(clock) = clock {
            ledger.limiters.report_clock(&request.limiter, clock);
        }
        (step, ledger.utc_offset)
    };
    state.metrics.sync_moved(
        step.applied,
        step.ignored,
        step.quotas.quotas.len(),
        step.counters.counters.len(),
    );
    let ignored = step.ignored;
    let response = step.into_response(state.instance, now, utc_offset);
    let body = serde_json::to_vec(&response).map_err(|e| ApiError::internal(e.to_string()))?;
    state.metrics.sync_seconds.observe(started.elapsed());
    tracing::trace!(
        limiter = %request.limiter,
        deltas = request.delta_count(),
        ignored,
        quotas = response.quotas.len(),
        counters = response.counters.len(),
        "sync"
    );
    Ok(json_bytes(StatusCode::OK, body))
}

/// Checks a sync request as a whole ([`SyncRequest::check`]).
pub fn check_request(request: &SyncRequest) -> Result<(), ApiError> {
    request
        .check()
        .map_err(|e| ApiError::invalid(e.field, e.message))
}

/// How a sync reply's status is counted.
pub fn result_of(status: StatusCode) -> SyncResult {
    match status {
        StatusCode::OK => SyncResult::Ok,
        StatusCode::UNAUTHORIZED => SyncResult::Unauthorized,
        StatusCode::SERVICE_UNAVAILABLE => SyncResult::Unavailable,
        _ => SyncResult::Rejected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CounterDelta, MAX_DELTA, MAX_DELTAS_PER_SYNC};

    fn request(limiter: &str, deltas: Vec<CounterDelta>) -> SyncRequest {
        SyncRequest {
            keyed: Vec::new(),
            rejected: Vec::new(),
            limiter: limiter.into(),
            quotas_after: Default::default(),
            counter_version: 0,
            root_instance: 0,
            deltas,
        }
    }

    #[test]
    fn absurd_requests_name_the_field() {
        let big = CounterDelta {
            id: 1,
            delta: MAX_DELTA + 1,
            window: None,
        };
        let ok = CounterDelta {
            id: 1,
            delta: MAX_DELTA,
            window: None,
        };
        let cases = [
            (request("", vec![]), "limiter"),
            (request("a b", vec![]), "limiter"),
            (request(&"x".repeat(256), vec![]), "limiter"),
            (request("h", vec![ok, big]), "deltas[1].delta"),
        ];
        for (req, field) in cases {
            assert_eq!(
                check_request(&req).unwrap_err().field.as_deref(),
                Some(field)
            );
        }
        assert!(check_request(&request("host-1:4242", vec![ok])).is_ok());
    }

    #[test]
    fn more_deltas_than_the_per_sync_cap_are_refused() {
        let delta = CounterDelta {
            id: 1,
            delta: 1,
            window: None,
        };
        let at_cap = request("h", vec![delta; MAX_DELTAS_PER_SYNC]);
        assert!(check_request(&at_cap).is_ok());
        let over = request("h", vec![delta; MAX_DELTAS_PER_SYNC + 1]);
        let error = check_request(&over).unwrap_err();
        assert_eq!(
            (error.status, error.field.as_deref()),
            (StatusCode::BAD_REQUEST, Some("deltas"))
        );
    }
}
