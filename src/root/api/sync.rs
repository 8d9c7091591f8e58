//! `POST /v1/sync`: a limiter's deltas in, quota and counter changes out.
//!
//! The whole request is checked before anything is applied, so an absurd
//! request (a malformed body, too many deltas, an impossible delta, a
//! counter named twice, a bad limiter id) changes nothing and gets a 400;
//! a token that may not write as the limiter the body names gets a 403
//! ([`crate::root::credentials`]). What is applied is cut to the
//! limiter's allowances and the counters' caps ([`crate::root::trust`]).
//!
//! Before a body is decoded, the root reserves the memory its entries
//! can take (see [`super::admission`]); a limiter that did not name
//! itself in its headers is counted among its syncs in flight once its
//! body is decoded and checked.
//!
//! The body is JSON, or binary ([`crate::wire::binary`]) when its
//! `Content-Type` is [`BINARY_CONTENT_TYPE`]; the reply is binary when the
//! request's `Accept` names that type, JSON otherwise. Errors are always
//! JSON. A binary body of a format version this root does not read is a
//! 415, so that a newer limiter falls back to JSON; a malformed one is a
//! 400 naming the field where it broke.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::wire::binary::{self, BinaryError};
use crate::wire::{
    check_json_size, ClockReport, CounterKey, SyncRequest, SyncResponse, BINARY_CONTENT_TYPE,
    CLOCK_HEADER, MAX_DELTAS_PER_SYNC,
};

use crate::root::credentials::{Caller, Forbidden};
use crate::root::ledger::SyncPaging;
use crate::root::metrics::SyncResult;
use crate::root::state::RootState;

use super::admission::{BodyMemory, SyncTicket, DECODED_BYTES_PER_ENTRY};
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
    let caller = body.extensions().get::<Caller>().cloned();
    let ticket = body.extensions().get::<Arc<SyncTicket>>().cloned();
    let memory = body.extensions().get::<Arc<BodyMemory>>().cloned();
    let format = Formats::of(body.headers());
    let body = read_body(body, &state).await?;
    // The middleware always sets them; a route without them admits nobody.
    let (Some(caller), Some(ticket), Some(memory)) = (caller, ticket, memory) else {
        return Err(ApiError::internal("sync without credentials or admission"));
    };
    memory
        .grow(format.entries_at_most(&body)? * DECODED_BYTES_PER_ENTRY)
        .await?;
    // Timed from here: parsing is part of the work, the upload is not.
    let started = Instant::now();
    let request = format.decode(&body)?;
    drop(body);
    check_caller(&state, &caller, &request.limiter)?;
    if !state.health.is_ready() {
        return Err(ApiError::unavailable(
            "quotas not loaded yet: the root has not reached its database since it started",
        ));
    }
    check_request(&request)?;
    ticket.claim(&request.limiter)?;
    let paging = SyncPaging {
        quotas: state.config.sync_page_quotas,
        counters: state.config.sync_page_counters,
    };
    let now = state.now();
    let (step, utc_offset) = {
        let ledger = state.ledger();
        let step = ledger.sync(&request, state.instance, now, paging);
        if let Some(clock) = clock {
            ledger.limiters().report_clock(&request.limiter, clock);
        }
        (step, ledger.utc_offset)
    };
    state.metrics.sync_moved(
        step.applied,
        step.ignored,
        step.quotas.quotas.len(),
        step.counters.counters.len(),
    );
    if step.clipped > 0 {
        state.metrics.clipped(step.clipped, step.clipped_weight);
        if let Some(held_back) = state.clipped_log.pass(&request.limiter) {
            tracing::warn!(
                limiter = %request.limiter,
                deltas = step.clipped,
                weight = step.clipped_weight,
                syncs_not_logged = held_back,
                "clipped deltas (or returns) larger than the limiter could have admitted \
                 (its allowance: 2 x (high_burst + limit x level_cap_seconds), refilling at 2 x limit)"
            );
        }
    }
    if step.rejections_clipped > 0 {
        state.metrics.rejections_clipped(step.rejections_clipped);
    }
    if step.duplicates > 0 {
        state.metrics.duplicates(step.duplicates);
    }
    if step.returned_weight > 0.0 {
        state.metrics.returned(step.returned_weight);
    }
    let ignored = step.ignored;
    let response = step.into_response(state.instance, now, utc_offset);
    let reply = format.encode(&response)?;
    state.metrics.sync_seconds.observe(started.elapsed());
    tracing::trace!(
        limiter = %request.limiter,
        entries = request.entry_count(),
        ignored,
        quotas = response.quotas.len(),
        counters = response.counters.len(),
        "sync"
    );
    Ok(reply)
}

/// The encodings of one sync: the request's (`Content-Type`) and the
/// reply's (`Accept`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Formats {
    binary_request: bool,
    /// The binary reply format the limiter reads (`None`: JSON): 1, or
    /// the `version=` its `Accept` names for the binary type.
    binary_reply: Option<u8>,
}

impl Formats {
    fn of(headers: &HeaderMap) -> Self {
        // Case does not matter; parameters other than `version` are ignored.
        let binary_version = |value: &HeaderValue| -> Option<u8> {
            let value = value.to_str().ok()?;
            value.split(',').find_map(|range| {
                let mut parts = range.split(';');
                let kind = parts.next()?.trim();
                if !kind.eq_ignore_ascii_case(BINARY_CONTENT_TYPE) {
                    return None;
                }
                let version = parts
                    .filter_map(|p| p.split_once('='))
                    .find(|(k, _)| k.trim().eq_ignore_ascii_case("version"))
                    .and_then(|(_, v)| v.trim().parse::<u8>().ok())
                    .unwrap_or(binary::BINARY_VERSION);
                Some(version.clamp(binary::BINARY_VERSION, binary::BINARY_REPLY_VERSION))
            })
        };
        Self {
            binary_request: headers
                .get(header::CONTENT_TYPE)
                .and_then(binary_version)
                .is_some(),
            binary_reply: headers
                .get_all(header::ACCEPT)
                .iter()
                .find_map(binary_version),
        }
    }

    /// The most entries ([`SyncRequest::entry_count`]) `body` can
    /// decode to, found without decoding it: a binary entry takes at
    /// least 2 bytes and the decoder stops at [`MAX_DELTAS_PER_SYNC`]; a
    /// JSON one is an object or array of its own
    /// ([`crate::wire::json_entries_at_most`]). 400 for a JSON body that
    /// holds more than any acceptable request.
    fn entries_at_most(self, body: &[u8]) -> Result<usize, ApiError> {
        if self.binary_request {
            return Ok((body.len() / 2).min(MAX_DELTAS_PER_SYNC));
        }
        check_json_size(body).map_err(|e| ApiError::invalid(e.field, e.message))
    }

    fn decode(self, body: &[u8]) -> Result<SyncRequest, ApiError> {
        if !self.binary_request {
            return parse_json(body);
        }
        binary::decode_request(body).map_err(|e| match e {
            BinaryError::Version(_) => ApiError::unsupported_media_type("body", e.to_string()),
            BinaryError::Malformed(e) => ApiError::malformed(Some(e.field), e.message),
        })
    }

    fn encode(self, response: &SyncResponse) -> Result<Response, ApiError> {
        let Some(version) = self.binary_reply else {
            let body =
                serde_json::to_vec(response).map_err(|e| ApiError::internal(e.to_string()))?;
            return Ok(json_bytes(StatusCode::OK, body));
        };
        let body = binary::encode_response_as(response, version)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let mut reply = (StatusCode::OK, body).into_response();
        reply.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(BINARY_CONTENT_TYPE),
        );
        Ok(reply)
    }
}

/// Refuses (403) a sync whose token may not write as `limiter`, and logs
/// it at most once a minute per limiter id.
fn check_caller(state: &RootState, caller: &Caller, limiter: &str) -> Result<(), ApiError> {
    let Err(why) = state.credentials.permits(caller, limiter) else {
        return Ok(());
    };
    let message = match &why {
        Forbidden::OtherLimiter { token_of } => {
            format!("this token is limiter {token_of:?}'s: it cannot sync as {limiter:?}")
        }
        Forbidden::SharedForListed => format!(
            "limiter {limiter:?} has its own token in the root's limiter_tokens_file: \
             the shared sync token cannot sync as it"
        ),
    };
    if let Some(held_back) = state.forbidden_log.pass(limiter) {
        tracing::warn!(
            limiter,
            refused_not_logged = held_back,
            "sync refused: {message}"
        );
    }
    Err(ApiError::forbidden("limiter", message))
}

/// Checks a sync request as a whole ([`SyncRequest::check`]), and that
/// it names each counter once.
pub fn check_request(request: &SyncRequest) -> Result<(), ApiError> {
    request
        .check()
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    check_unique(request)
}

/// Refuses a request that names one counter twice: a limiter owes each
/// counter one delta per sync, so a repeat is a bug or a forgery, and
/// summing repeats would let one sync add without bound. Named counters by
/// quota id; keys by template and hash, across groups (a template may
/// have one group per window, but a key is in one of them). Rejection
/// counts likewise name each quota once.
///
/// Sorted, not hashed: each entry with its place takes 24 bytes, where a
/// hash map of a million took about 80 an entry.
fn check_unique(request: &SyncRequest) -> Result<(), ApiError> {
    let named = request.deltas.iter().map(|d| CounterKey::named(d.id));
    let keyed = request.keyed.iter().flat_map(|group| {
        group.deltas.iter().map(move |d| CounterKey {
            id: group.id,
            key: d.0,
        })
    });
    if let Some((at, first)) = first_repeat(named.chain(keyed)) {
        let key = |place: usize| -> (CounterKey, String) {
            if let Some(d) = request.deltas.get(place) {
                return (CounterKey::named(d.id), format!("deltas[{place}].id"));
            }
            let mut left = place - request.deltas.len();
            for (g, group) in request.keyed.iter().enumerate() {
                if let Some(d) = group.deltas.get(left) {
                    let counter = CounterKey {
                        id: group.id,
                        key: d.0,
                    };
                    return (counter, format!("keyed[{g}].deltas[{left}]"));
                }
                left -= group.deltas.len();
            }
            unreachable!("a place inside the request")
        };
        let (counter, field) = key(at);
        let what = if at < request.deltas.len() {
            format!("quota {}", counter.id)
        } else {
            format!("key {:016x} of template {}", counter.key, counter.id)
        };
        return Err(ApiError::invalid(
            field,
            format!(
                "{what} appears twice in one sync (also at {}): send one delta per counter",
                key(first).1
            ),
        ));
    }
    let rejected = request
        .rejected
        .iter()
        .map(|&(id, _)| CounterKey::named(id));
    if let Some((at, first)) = first_repeat(rejected) {
        return Err(ApiError::invalid(
            format!("rejected[{at}]"),
            format!(
                "quota {} appears twice in one sync's rejection counts (also at \
                 rejected[{first}]): send one count per quota",
                request.rejected[at].0
            ),
        ));
    }
    Ok(())
}

/// The earliest place in `counters` that repeats an earlier one, with
/// the place of that earlier one. (A key of hash 0 would repeat its
/// template's own counter: [`SyncRequest::check`] refuses it first, with
/// its reason.)
fn first_repeat(counters: impl Iterator<Item = CounterKey>) -> Option<(usize, usize)> {
    let mut places: Vec<(CounterKey, u32)> = counters
        .enumerate()
        .map(|(place, counter)| (counter, place as u32))
        .collect();
    places.sort_unstable();
    // Sorted by counter, then place: a counter's first place comes first
    // and its second next to it.
    places
        .windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| (w[1].1 as usize, w[0].1 as usize))
        .min()
}

/// How a sync reply's status is counted.
pub fn result_of(status: StatusCode) -> SyncResult {
    match status {
        StatusCode::OK => SyncResult::Ok,
        StatusCode::UNAUTHORIZED => SyncResult::Unauthorized,
        StatusCode::SERVICE_UNAVAILABLE => SyncResult::Unavailable,
        StatusCode::FORBIDDEN => SyncResult::Forbidden,
        StatusCode::TOO_MANY_REQUESTS => SyncResult::Busy,
        _ => SyncResult::Rejected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formats(content_type: Option<&str>, accept: &[&str]) -> Formats {
        let mut headers = HeaderMap::new();
        if let Some(t) = content_type {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(t).unwrap());
        }
        for a in accept {
            headers.append(header::ACCEPT, HeaderValue::from_str(a).unwrap());
        }
        Formats::of(&headers)
    }

    #[test]
    fn the_reply_format_is_the_one_accept_names() {
        let limiter = "application/x-sluice-sync;version=2, application/json;q=0.5";
        let f = formats(Some("application/x-sluice-sync"), &[limiter]);
        assert!(f.binary_request);
        assert_eq!(f.binary_reply, Some(2));
        // A limiter that predates format 2: format 1.
        let old = "application/x-sluice-sync, application/json;q=0.5";
        assert_eq!(formats(None, &[old]).binary_reply, Some(1));
        // A newer format than this root writes: its newest; case and
        // spaces do not matter; JSON when binary is not named.
        let f = formats(None, &["Application/X-Sluice-Sync ; Version = 9"]);
        assert_eq!(f.binary_reply, Some(binary::BINARY_REPLY_VERSION));
        assert_eq!(
            formats(None, &["application/x-sluice-sync;version=x"]).binary_reply,
            Some(1)
        );
        assert_eq!(
            formats(Some("application/json"), &["application/json"]),
            Formats {
                binary_request: false,
                binary_reply: None,
            }
        );
    }
    use crate::wire::{CounterDelta, KeyDelta, KeyedDeltas, MAX_DELTA, MAX_DELTAS_PER_SYNC};

    fn request(limiter: &str, deltas: Vec<CounterDelta>) -> SyncRequest {
        SyncRequest {
            keyed: Vec::new(),
            rejected: Vec::new(),
            limiter: limiter.into(),
            quotas_after: Default::default(),
            counter_version: 0,
            root_instance: 0,
            deltas,
            ..Default::default()
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
    fn a_counter_named_twice_is_refused_with_both_places() {
        let d = |id| CounterDelta {
            id,
            delta: 1,
            window: None,
        };
        let error = check_request(&request("h", vec![d(1), d(2), d(1)])).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("deltas[2].id"));
        assert!(
            error.message.contains("quota 1 appears twice"),
            "{}",
            error.message
        );
        assert!(error.message.contains("deltas[0].id"), "{}", error.message);
        // Keys: the same hash under one template twice, even in two
        // groups (windows), is refused; under two templates it is fine.
        let group = |id, keys: &[u64], window| KeyedDeltas {
            id,
            deltas: keys.iter().map(|&k| KeyDelta(k, 1)).collect(),
            window,
        };
        let mut keyed = request("h", vec![d(7)]);
        keyed.keyed = vec![group(7, &[5, 6], Some(1)), group(8, &[5], None)];
        assert!(check_request(&keyed).is_ok());
        keyed.keyed.push(group(7, &[9, 6], Some(2)));
        let error = check_request(&keyed).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("keyed[2].deltas[1]"));
        assert!(
            error.message.contains("key 0000000000000006 of template 7")
                && error.message.contains("keyed[0].deltas[1]"),
            "{}",
            error.message
        );
    }

    #[test]
    fn more_deltas_than_the_per_sync_cap_are_refused() {
        let deltas = |n: usize| {
            (1..=n as u64)
                .map(|id| CounterDelta {
                    id,
                    delta: 1,
                    window: None,
                })
                .collect()
        };
        let at_cap = request("h", deltas(MAX_DELTAS_PER_SYNC));
        assert!(check_request(&at_cap).is_ok());
        let over = request("h", deltas(MAX_DELTAS_PER_SYNC + 1));
        let error = check_request(&over).unwrap_err();
        assert_eq!(
            (error.status, error.field.as_deref()),
            (StatusCode::BAD_REQUEST, Some("deltas"))
        );
    }
}
