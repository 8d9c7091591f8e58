//! The HTTP API: sync, admin, health and metrics.
//!
//! | route | auth | |
//! |---|---|---|
//! | `POST /v1/sync` | sync token or the limiter's own | limiter sync ([`crate::wire`]) |
//! | `GET /v1/quotas?prefix=&after=&limit=` | admin token | list quotas |
//! | `GET/PUT/PATCH/DELETE /v1/quotas/{name}` | admin token | one quota: read, replace, change some fields, delete |
//! | `GET /v1/quotas/{name}/keys?top=` | admin token | busiest keys of a per-key quota |
//! | `GET /v1/quotas/{name}/keys/{hash}` | admin token | one key, by hash |
//! | `GET /v1/quotas/{name}/overrides?after=&limit=` | admin token | a per-key quota's overrides, and its keys' penalties |
//! | `GET/PUT/PATCH/DELETE /v1/quotas/{name}/overrides/{key_hash}` | admin token | one override: read, replace, change some fields, remove (`If-Match` as for quotas) |
//! | `POST /v1/apply?dry_run=&prune=` | admin token | a whole quota set |
//! | `GET /v1/overview?top=` | none / admin token | the console's data: public totals, names with the token |
//! | `GET /ui` | none | the web console (static; its data needs the token) |
//! | `GET /healthz` | none / admin token | readiness and database state; the database's own error with the token |
//! | `GET /metrics` | none | Prometheus text |
//!
//! Every error is `{"error": {"field": ..., "message": ...}}`.
//!
//! A request's token is checked from its headers first; only then does
//! it read its body and take a slot (`admission.rs`).
//!
//! # Layout
//!
//! - `admission.rs` — what a request may hold: body memory, upload
//!   pace, slots, syncs in flight per limiter.
//! - `error.rs` — the error reply.
//! - `sync.rs`, `quotas.rs`, `apply.rs`, `ops.rs` — the handlers.
//! - `view.rs` — a quota as the admin API shows it; `round.rs` — its
//!   computed numbers (and the overview's, `/healthz`'s) written without
//!   float noise.
//! - `keys.rs` — the keys of a per-key quota, by hash.
//! - `overrides.rs` — the overrides of a per-key quota's keys.
//! - `preconditions.rs` — `If-Match` / `If-None-Match` and the `ETag`:
//!   a quota's or an override's epoch is its version.
//! - `overview.rs` — `GET /v1/overview`, shared by the console and
//!   `sluice top`; `ui.rs` — the console's static files (`../ui/`).

pub mod admission;
mod apply;
mod error;
mod keys;
mod ops;
pub mod overrides;
pub mod overview;
mod preconditions;
mod quotas;
mod round;
mod sync;
mod ui;
mod view;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::core::object::Object;
use crate::wire::SYNC_PATH;

use super::connections::Connection;
use super::metrics::{Api, Rejection};
use super::state::RootState;

pub use error::ApiError;

/// Where a whole quota set is applied.
const APPLY_PATH: &str = "/v1/apply";

/// The root's routes over `state`.
pub fn router(state: Arc<RootState>) -> Router {
    let limits = state.config.body_limits;
    let admission = Arc::clone(&state.admission);
    let admit = || middleware::from_fn_with_state(Arc::clone(&admission), admission::admit);
    // Route layers run last-added first: the token, then the rest.
    let sync = Router::new()
        .route(
            SYNC_PATH,
            post(sync::sync).layer(DefaultBodyLimit::max(limits.sync)),
        )
        .route_layer(admit())
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&admission),
            admission::count_sync,
        ))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_sync_token,
        ));
    let admin = Router::new()
        .route("/v1/quotas", get(quotas::list))
        .route(
            "/v1/quotas/{name}",
            get(quotas::get)
                .put(quotas::put)
                .patch(quotas::patch)
                .delete(quotas::delete)
                .layer(DefaultBodyLimit::max(limits.admin)),
        )
        .route("/v1/quotas/{name}/keys", get(keys::top))
        .route("/v1/quotas/{name}/keys/{hash}", get(keys::get))
        .route("/v1/quotas/{name}/overrides", get(overrides::list))
        .route(
            "/v1/quotas/{name}/overrides/{key_hash}",
            get(overrides::get)
                .put(overrides::put)
                .patch(overrides::patch)
                .delete(overrides::delete)
                .layer(DefaultBodyLimit::max(limits.admin)),
        )
        .route(
            APPLY_PATH,
            post(apply::apply).layer(DefaultBodyLimit::max(limits.apply)),
        )
        .route_layer(admit())
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_admin_token,
        ));
    let ops = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/metrics", get(ops::metrics))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&admission),
            admission::admit_ops,
        ));
    let public = Router::new()
        .merge(overview::routes())
        .merge(ui::routes())
        .route_layer(admit());
    Router::new()
        .merge(sync)
        .merge(admin)
        .merge(ops)
        .merge(public)
        // After every route: it is set on the routes registered so far.
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed().into_response() })
        .fallback(|| async { ApiError::no_route().into_response() })
        .layer(middleware::from_fn_with_state(Arc::clone(&state), observe))
        .with_state(state)
}

/// A JSON reply.
pub(crate) fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => json_bytes(status, bytes),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A reply of already serialised JSON.
fn json_bytes(status: StatusCode, bytes: Vec<u8>) -> Response {
    let mut response = (status, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A request body parsed as JSON, with errors as [`ApiError`]s: 413 over
/// the route's limit, 400 naming the path to the bad value otherwise.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<RootState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<RootState>) -> Result<Self, ApiError> {
        let bytes = read_body(request, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The whole body, which [`admission::admit`] has read (within the
/// route's limit, the memory budget and the upload pace).
async fn read_body(request: Request, state: &Arc<RootState>) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large("request body is larger than this endpoint accepts")
            } else {
                ApiError::malformed(None, rejection.body_text())
            }
        })
}

/// Parses a JSON object (a body of the admin or the sync API: an array
/// is refused, never read by position, see [`Object`]); on failure parses
/// again with path tracking, so the common case pays nothing for a good
/// error message.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map(Object::into_inner)
        .map_err(|_| {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            match serde_path_to_error::deserialize::<_, Object<T>>(&mut de) {
                Ok(_) => ApiError::malformed(None, "trailing characters after the JSON value"),
                Err(e) => {
                    let path = e.path().to_string();
                    let message = e.into_inner().to_string();
                    let field = match named_field(&message) {
                        Some(name) if path == "." => Some(name.to_string()),
                        Some(name) if !path.ends_with(name) => Some(format!("{path}.{name}")),
                        _ => (path != ".").then_some(path),
                    };
                    ApiError::malformed(field, message)
                }
            }
        })
}

/// A listing's page size: `given`, or `default` when none; 1 to `max`,
/// or a 400 naming `limit`.
pub(crate) fn page_size(
    given: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let limit = given.unwrap_or(default);
    if !(1..=max).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("must be 1 to {max}")));
    }
    Ok(limit)
}

/// The field serde names in "missing field `x`" (reported at the path of
/// the enclosing object) and "unknown field `x`".
pub(crate) fn named_field(message: &str) -> Option<&str> {
    let rest = message
        .strip_prefix("missing field `")
        .or_else(|| message.strip_prefix("unknown field `"))?;
    rest.split('`').next()
}

/// Admits a sync with the shared token or a limiter's own; the handler
/// learns which ([`super::credentials::Caller`]) and checks the limiter id
/// the body names against it.
async fn require_sync_token(
    State(state): State<Arc<RootState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let Some(caller) = state.credentials.identify(presented) else {
        return unauthorized("sync");
    };
    if state.credentials.required() {
        // Its connection is a known client's: never shed it.
        if let Some(connection) = request.extensions().get::<Arc<Connection>>() {
            connection.trust();
        }
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

fn unauthorized(which: &str) -> Response {
    let mut response = ApiError::unauthorized(which).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

async fn require_admin_token(
    State(state): State<Arc<RootState>>,
    request: Request,
    next: Next,
) -> Response {
    check_token(state.config.admin_token.as_ref(), "admin", request, next).await
}

async fn check_token(
    token: Option<&super::auth::Token>,
    which: &str,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = token {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        if token.admits(presented) {
            // Its connection is a known client's: never shed it.
            if let Some(connection) = request.extensions().get::<Arc<Connection>>() {
                connection.trust();
            }
        } else {
            return unauthorized(which);
        }
    }
    next.run(request).await
}

/// Logs each request at debug level and counts rejections.
async fn observe(State(state): State<Arc<RootState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let api = if path == SYNC_PATH {
        Api::Sync
    } else {
        Api::Admin
    };
    if let Some(&why) = response.extensions().get::<Rejection>() {
        state.metrics.rejected(api, why);
    }
    if api == Api::Sync {
        state.metrics.sync(sync::result_of(response.status()));
    }
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(%method, path, status, elapsed_ms, "request");
    response
}
