//! Conditional writes: a quota's or an override's epoch is its version.
//!
//! `GET` sends it as the `ETag` (`"12"`); a write with `If-Match: "12"`
//! (or several tags, or `*`: it must exist) is refused with 412 when the
//! thing changed since, and `If-None-Match: *` writes only a new one. The
//! store compares and writes in one transaction ([`Expect`]), so of
//! writers that read the same version only one gets through.

use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;

use crate::root::store::Expect;

use super::ApiError;

/// What a write expects, from `If-Match` (`*` or epochs as entity tags,
/// `"12"`) and `If-None-Match: *`.
pub(super) fn expectation(headers: &HeaderMap) -> Result<Expect, ApiError> {
    let text = |name: &header::HeaderName| -> Result<Option<&str>, ApiError> {
        headers
            .get(name)
            .map(|v| v.to_str().map(str::trim))
            .transpose()
            .map_err(|_| ApiError::invalid(name.as_str(), "not text"))
    };
    match (text(&header::IF_MATCH)?, text(&header::IF_NONE_MATCH)?) {
        (None, None) => Ok(Expect::Anything),
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "If-None-Match",
            "give If-Match or If-None-Match, not both",
        )),
        (None, Some("*")) => Ok(Expect::Absent),
        (None, Some(_)) => Err(ApiError::invalid(
            "If-None-Match",
            "only * is understood: write only if it does not exist",
        )),
        (Some("*"), None) => Ok(Expect::Exists),
        (Some(tags), None) => {
            let epochs: Option<Vec<u64>> = tags
                .split(',')
                .map(|tag| {
                    let tag = tag.trim();
                    tag.strip_prefix('"')?.strip_suffix('"')?.parse().ok()
                })
                .collect();
            epochs.map(Expect::Epoch).ok_or_else(|| {
                ApiError::invalid(
                    "If-Match",
                    format!(
                        "{tags:?} is not an ETag of the admin API: give the epoch in quotes, \
                         \"12\" (from the ETag of a GET or the epoch of a reply), or *"
                    ),
                )
            })
        }
    }
}

/// `response` with the `ETag` of a thing at `epoch`.
pub(super) fn with_etag(mut response: Response, epoch: u64) -> Response {
    if let Ok(tag) = HeaderValue::from_str(&format!("\"{epoch}\"")) {
        response.headers_mut().insert(header::ETAG, tag);
    }
    response
}
