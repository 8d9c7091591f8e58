//! The HTTP side, as envoyproxy/ratelimit serves it: `/healthcheck`,
//! `POST /json` (a `RateLimitRequest` in protobuf's JSON mapping, answered
//! with the `RateLimitResponse` the same way: 200 when OK, 429 when over
//! the limit, 400 for a request that is not one), and `/metrics` for
//! Prometheus.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::decide::{Entry, Request, RequestDescriptor, Response};
use super::limit::Unit;
use super::state::Server;

/// The routes.
pub fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/json", post(json))
        .route("/metrics", get(metrics))
        .with_state(server)
}

async fn healthcheck() -> &'static str {
    "OK"
}

async fn metrics(State(server): State<Arc<Server>>) -> HttpResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        server.prometheus(),
    )
        .into_response()
}

async fn json(State(server): State<Arc<Server>>, body: Bytes) -> HttpResponse {
    let bad =
        |message: String| (StatusCode::BAD_REQUEST, format!("error: {message}\n")).into_response();
    let request: JsonRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => return bad(error.to_string()),
    };
    let request = match request.into_request() {
        Ok(request) => request,
        Err(message) => return bad(message),
    };
    match server
        .engine
        .should_rate_limit(&request, crate::clock::now())
    {
        Ok(response) => {
            let status = if response.over {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(json_response(response))).into_response()
        }
        Err(error) => bad(error.to_string()),
    }
}

/// A request in protobuf's JSON mapping (both the lowerCamelCase and the
/// original field names, as protobuf's parsers take them).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct JsonRequest {
    domain: String,
    descriptors: Vec<JsonDescriptor>,
    #[serde(alias = "hitsAddend")]
    hits_addend: Option<Json>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct JsonDescriptor {
    entries: Vec<JsonEntry>,
    limit: Option<JsonLimit>,
    #[serde(alias = "hitsAddend")]
    hits_addend: Option<Json>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct JsonEntry {
    key: String,
    value: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct JsonLimit {
    #[serde(alias = "requestsPerUnit")]
    requests_per_unit: Option<Json>,
    unit: Option<Json>,
}

/// An integer field: a JSON number, or a string of digits (protobuf's JSON
/// for 64-bit integers).
fn integer(field: &str, value: &Option<Json>) -> Result<Option<u64>, String> {
    match value {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{field}: {n} is not an unsigned integer")),
        Some(Json::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| format!("{field}: {s:?} is not an unsigned integer")),
        Some(other) => Err(format!("{field}: {other} is not an unsigned integer")),
    }
}

impl JsonRequest {
    fn into_request(self) -> Result<Request, String> {
        let hits = integer("hits_addend", &self.hits_addend)?.unwrap_or(0);
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for d in self.descriptors {
            let limit = match d.limit {
                None => None,
                Some(l) => {
                    let rpu = integer("requests_per_unit", &l.requests_per_unit)?.unwrap_or(0);
                    let unit = match &l.unit {
                        Some(Json::String(s)) => Unit::parse(s),
                        Some(Json::Number(n)) => n.as_u64().and_then(unit_number),
                        _ => None,
                    };
                    unit.map(|u| (u32::try_from(rpu).unwrap_or(u32::MAX), u))
                }
            };
            descriptors.push(RequestDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend: integer("hits_addend", &d.hits_addend)?,
            });
        }
        Ok(Request {
            domain: self.domain,
            descriptors,
            hits_addend: u32::try_from(hits)
                .map_err(|_| "hits_addend: above 2^32-1".to_string())?,
        })
    }
}

/// `envoy.type.v3.RateLimitUnit`'s numbers.
fn unit_number(n: u64) -> Option<Unit> {
    Some(match n {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        _ => return None,
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse {
    overall_code: &'static str,
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_metadata: Option<serde_json::Map<String, Json>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonCurrentLimit>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonCurrentLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Serialize)]
struct JsonHeader {
    key: String,
    value: String,
}

fn code(over: bool) -> &'static str {
    if over {
        "OVER_LIMIT"
    } else {
        "OK"
    }
}

fn json_response(response: Response) -> JsonResponse {
    JsonResponse {
        overall_code: code(response.over),
        statuses: response
            .statuses
            .into_iter()
            .map(|s| JsonStatus {
                code: code(s.over),
                current_limit: s.current_limit.map(|l| JsonCurrentLimit {
                    name: l.name,
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit.name(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(|secs| format!("{secs}s")),
            })
            .collect(),
        response_headers_to_add: response
            .headers
            .into_iter()
            .map(|(key, value)| JsonHeader { key, value })
            .collect(),
        dynamic_metadata: response.metadata,
    }
}
