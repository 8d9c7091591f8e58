//! Error replies: `{"error": {"field": ..., "message": ...}}` with a 4xx or
//! 5xx status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::core::ValidationError;
use crate::root::metrics::Rejection;
use crate::root::store::StoreError;

use super::json_response;

/// An error reply.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// The request field at fault, when one is.
    pub field: Option<String>,
    /// The quota at fault, when the request names several.
    pub quota: Option<String>,
    /// What is wrong, for a human.
    pub message: String,
    /// How the rejection is counted in metrics, when it is a rejection.
    pub rejection: Option<Rejection>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    field: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quota: Option<&'a str>,
    message: &'a str,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            field: None,
            quota: None,
            message: message.into(),
            rejection: None,
        }
    }

    /// 400 for an invalid value of `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            rejection: Some(Rejection::Invalid),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }

    /// 400 for a body that is not JSON of the expected shape; `field` is the
    /// path to the offending value when known.
    pub fn malformed(field: Option<String>, message: impl Into<String>) -> Self {
        Self {
            field,
            rejection: Some(Rejection::Malformed),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }

    /// 413 for a body over the limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self {
            rejection: Some(Rejection::TooLarge),
            ..Self::new(StatusCode::PAYLOAD_TOO_LARGE, message)
        }
    }

    /// 401 for a missing or wrong token.
    pub fn unauthorized(which: &str) -> Self {
        Self {
            rejection: Some(Rejection::Unauthorized),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                format!("missing or wrong {which} token"),
            )
        }
    }

    /// 403 for a sync whose token may not write as the limiter it names.
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            rejection: Some(Rejection::Forbidden),
            ..Self::new(StatusCode::FORBIDDEN, message)
        }
    }

    /// 408 for a body that did not arrive within `body_timeout`; the
    /// connection is closed after the reply (the rest of the body is
    /// never read).
    pub fn body_timeout(deadline: std::time::Duration) -> Self {
        Self {
            rejection: Some(Rejection::BodyTimeout),
            ..Self::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within body_timeout ({} ms)",
                    deadline.as_millis()
                ),
            )
        }
    }

    /// 408 for a body that fell behind `min_body_rate` for longer than
    /// `body_grace`; the connection is closed after the reply.
    pub fn body_too_slow(min_rate: u64, grace: std::time::Duration) -> Self {
        Self {
            rejection: Some(Rejection::BodyTimeout),
            ..Self::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body arrived slower than min_body_rate ({min_rate} bytes/s) \
                     for longer than body_grace ({} ms)",
                    grace.as_millis()
                ),
            )
        }
    }

    /// 429 for a sync of a limiter that has its most syncs in flight.
    pub fn busy(message: impl Into<String>) -> Self {
        Self {
            field: Some("limiter".into()),
            rejection: Some(Rejection::Busy),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// 503 for a request whose body (or what it decodes to) does not fit
    /// in the body memory budget now.
    pub fn no_memory() -> Self {
        Self {
            rejection: Some(Rejection::NoMemory),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the root's request memory (max_body_memory) is in use by other requests: \
                 retry shortly",
            )
        }
    }

    /// 503: the root cannot do this now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 412 for a write whose `If-Match` or `If-None-Match` does not hold.
    pub fn precondition_failed(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            rejection: Some(Rejection::Invalid),
            ..Self::new(StatusCode::PRECONDITION_FAILED, message)
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            field: Some("name".into()),
            ..Self::new(StatusCode::NOT_FOUND, message)
        }
    }

    /// 404 for a path the root does not serve.
    pub fn no_route() -> Self {
        Self::new(StatusCode::NOT_FOUND, "no such route")
    }

    /// 405 for a method the path does not serve.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed on this path",
        )
    }

    /// 415 for a sync body in an encoding this root does not read (a
    /// binary format version newer than this build): the limiter falls
    /// back to JSON.
    pub fn unsupported_media_type(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            rejection: Some(Rejection::Malformed),
            ..Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message)
        }
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    fn validation(status: StatusCode, quota: Option<String>, error: ValidationError) -> Self {
        Self {
            field: Some(error.field.to_string()),
            quota,
            rejection: Some(Rejection::Invalid),
            ..Self::new(status, error.message)
        }
    }
}

impl From<ValidationError> for ApiError {
    fn from(error: ValidationError) -> Self {
        Self::validation(StatusCode::BAD_REQUEST, None, error)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Invalid { quota, error } => {
                Self::validation(StatusCode::BAD_REQUEST, quota, error)
            }
            StoreError::Conflict(error) => Self::validation(StatusCode::CONFLICT, None, error),
            StoreError::Precondition(error) => {
                Self::precondition_failed(error.field.to_string(), error.message)
            }
            StoreError::NotFound(name) => Self::not_found(format!("no quota named {name:?}")),
            StoreError::NoOverride(..) => Self::not_found(error.to_string()),
            StoreError::Unavailable(_) => Self::unavailable(format!(
                "{error}; the root is read-only until the database is back"
            )),
            StoreError::ReadOnly(_) => Self::unavailable(format!(
                "{error}; the root serves the quotas it has loaded, read-only"
            )),
            StoreError::Config(_) | StoreError::Internal(_) => Self::internal(error.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Detail {
                field: self.field.as_deref(),
                quota: self.quota.as_deref(),
                message: &self.message,
            },
        };
        let mut response = json_response(self.status, &body);
        if self.status == StatusCode::REQUEST_TIMEOUT {
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        if matches!(self.rejection, Some(Rejection::Busy | Rejection::NoMemory)) {
            // Both pass within a sync interval.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        if let Some(rejection) = self.rejection {
            // Counted by the `observe` middleware, which knows the API.
            response.extensions_mut().insert(rejection);
        }
        response
    }
}
