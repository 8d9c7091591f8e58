//! What a request may hold while its body arrives and while it is
//! handled.
//!
//! Every bound here is applied after the request's token was checked from
//! its headers (a wrong token is answered 401 holding nothing), and none
//! lets one request, or one limiter, hold what the others need:
//!
//! 1. **Body memory** (`max_body_memory`): request bodies, and what a
//!    sync decodes to, share one budget. A body is charged as its bytes
//!    arrive (its buffer, which doubles as it fills: at most twice what
//!    arrived), not by what its `Content-Length` announces, so a body
//!    that trickles holds what it sent, not what it promised. Before decoding,
//!    a sync is charged [`DECODED_BYTES_PER_ENTRY`] for each entry its
//!    body can hold (counted without decoding: see `sync.rs`). A share
//!    that does not fit waits at most [`MEMORY_WAIT`] for others to
//!    finish, then the request gets 503: nobody waits long while holding
//!    memory, so partly read bodies cannot block each other for good.
//! 2. **Upload rate** (`min_body_rate`, `body_grace`, `body_timeout`): a
//!    body's deadline starts `body_grace` after its head and moves later
//!    by `1 / min_body_rate` seconds for each byte that arrives, but never
//!    to more than `body_grace` from now, and never past `body_timeout`
//!    from its head. A body that stalls for `body_grace`, or keeps below
//!    the rate, is cut with 408 and its connection closed.
//! 3. **Slots** (`max_in_flight`): a request takes one once its body is in
//!    (an upload holds none), and keeps it while it is handled.
//!    `/healthz` and `/metrics` have [`OPS_SLOTS`] of their own and read
//!    no body, so nothing the other requests do can keep them waiting.
//! 4. **Syncs per limiter** (`max_syncs_per_limiter`): a limiter, named
//!    by its own token or by its [`LIMITER_HEADER`], has at most that many
//!    syncs in flight (from its head to its reply); one more is refused
//!    at once with 429. A limiter that does not send the header is
//!    counted once its body is decoded.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::Body as _;
use rustc_hash::FxHashMap;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::root::config::{BodyLimits, RootConfig};
use crate::root::credentials::Caller;
use crate::wire::{validate_limiter_id, LIMITER_HEADER, SYNC_PATH};

use super::{ApiError, APPLY_PATH};

/// Bytes of memory a sync is charged for each entry its body can hold
/// before it is decoded: a decoded entry takes at most 48 bytes (twice
/// that while a JSON list grows), and applying it 40 more (its counter
/// and weight, grouped by counter shard).
pub const DECODED_BYTES_PER_ENTRY: usize = 160;

/// Longest a request waits for its share of the body memory before it
/// is refused with 503.
pub const MEMORY_WAIT: Duration = Duration::from_secs(1);

/// Slots of `/healthz` and `/metrics`, apart from `max_in_flight`.
pub const OPS_SLOTS: usize = 16;

/// How fast a body must arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyPace {
    /// Bytes per second a body must keep up (0: no rate, only
    /// `timeout`).
    pub min_rate: u64,
    /// How far a body may fall behind `min_rate`, and how long it may
    /// stall.
    pub grace: Duration,
    /// Longest a whole body may take.
    pub timeout: Duration,
}

impl BodyPace {
    /// The deadline after a body that began at `started` received
    /// `bytes` more at `now`, when its deadline was `deadline`.
    fn extend(&self, deadline: Instant, bytes: usize, now: Instant, started: Instant) -> Instant {
        let cap = started + self.timeout;
        if self.min_rate == 0 {
            return cap;
        }
        let bought = Duration::from_secs_f64(bytes as f64 / self.min_rate as f64);
        (deadline + bought).min(now + self.grace).min(cap)
    }

    /// The first deadline of a body that begins at `started`.
    fn first(&self, started: Instant) -> Instant {
        let cap = started + self.timeout;
        if self.min_rate == 0 {
            cap
        } else {
            (started + self.grace).min(cap)
        }
    }

    /// Why a body was cut at `at` (its deadline), begun at `started`.
    fn cut(&self, at: Instant, started: Instant) -> ApiError {
        if self.min_rate == 0 || at >= started + self.timeout {
            ApiError::body_timeout(self.timeout)
        } else {
            ApiError::body_too_slow(self.min_rate, self.grace)
        }
    }
}

/// What requests hold: slots, body memory, syncs per limiter.
#[derive(Debug)]
pub struct Admission {
    slots: Semaphore,
    ops_slots: Semaphore,
    /// The body memory budget, in KiB permits.
    memory: Arc<Semaphore>,
    limits: BodyLimits,
    pace: BodyPace,
    syncs: Arc<SyncsInFlight>,
}

/// `bytes` in KiB, rounded up, saturating at what a semaphore can count.
fn kib(bytes: usize) -> u32 {
    bytes
        .div_ceil(1024)
        .min(Semaphore::MAX_PERMITS)
        .min(u32::MAX as usize) as u32
}

impl Admission {
    /// The bounds `config` sets.
    pub fn new(config: &RootConfig) -> Self {
        let limits = config.body_limits;
        Self {
            slots: Semaphore::new(config.max_in_flight),
            ops_slots: Semaphore::new(OPS_SLOTS),
            memory: Arc::new(Semaphore::new(kib(limits.total) as usize)),
            limits,
            pace: BodyPace {
                min_rate: config.min_body_rate,
                grace: config.body_grace,
                timeout: config.body_timeout,
            },
            syncs: Arc::new(SyncsInFlight {
                max: config.max_syncs_per_limiter,
                held: Mutex::default(),
            }),
        }
    }

    /// Bytes of the body memory budget held now (in whole KiB).
    pub fn memory_held(&self) -> usize {
        let free = self.memory.available_permits();
        (kib(self.limits.total) as usize).saturating_sub(free) * 1024
    }

    /// The largest body the request's route takes.
    fn route_limit(&self, request: &Request) -> usize {
        match request.uri().path() {
            SYNC_PATH => self.limits.sync,
            APPLY_PATH => self.limits.apply,
            _ => self.limits.admin,
        }
    }

    /// A new, empty share of the body memory budget.
    fn body_memory(&self) -> Arc<BodyMemory> {
        Arc::new(BodyMemory {
            memory: Arc::clone(&self.memory),
            total_kib: kib(self.limits.total),
            kib: AtomicU32::new(0),
        })
    }

    /// Reads the body of `request` under the budget and the pace, and
    /// puts it back whole, its buffer held by `memory`.
    async fn read_body(&self, request: Request, memory: &BodyMemory) -> Result<Request, ApiError> {
        let limit = self.route_limit(&request);
        let declared = declared_length(request.headers());
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large(limit));
        }
        let (parts, mut body) = request.into_parts();
        if declared == Some(0) {
            return Ok(Request::from_parts(parts, body));
        }
        let mut bytes = Vec::new();
        let started = Instant::now();
        let mut deadline = self.pace.first(started);
        loop {
            let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
            let frame = match tokio::time::timeout_at(deadline, frame).await {
                Err(_) => return Err(self.pace.cut(deadline, started)),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(ApiError::malformed(None, e.to_string())),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let needed = bytes.len() + data.len();
            if needed > limit {
                return Err(too_large(limit));
            }
            if needed > bytes.capacity() {
                // The buffer doubles, up to the declared length: it is at
                // most twice what arrived, and it is what is charged.
                let grown = (2 * bytes.capacity())
                    .min(declared.unwrap_or(usize::MAX))
                    .max(needed);
                let owed = grown.saturating_sub(memory.bytes());
                if owed > 0 {
                    let waited = Instant::now();
                    memory.grow(owed).await?;
                    // Waiting for memory is not the sender's fault.
                    deadline += waited.elapsed();
                }
                bytes.reserve_exact(grown - bytes.len());
            }
            bytes.extend_from_slice(&data);
            deadline = self
                .pace
                .extend(deadline, data.len(), Instant::now(), started);
        }
        let body = Body::from(Bytes::from(bytes));
        Ok(Request::from_parts(parts, body))
    }
}

/// The `Content-Length` a request declares, if any.
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn too_large(limit: usize) -> ApiError {
    ApiError::too_large(format!(
        "request body is larger than this endpoint accepts ({limit} bytes)"
    ))
}

/// Memory a request's body (and what a sync decodes it to) holds from
/// the root's body memory budget; all of it is given back when the last
/// handle is dropped. Bytes of the root's memory, not a request's weight
/// on a quota (the table's charges).
#[derive(Debug)]
pub struct BodyMemory {
    memory: Arc<Semaphore>,
    /// The whole budget, KiB: no request's share grows beyond it, so
    /// every share can be met once the others are done.
    total_kib: u32,
    /// KiB held.
    kib: AtomicU32,
}

impl BodyMemory {
    /// Bytes held (in whole KiB).
    pub fn bytes(&self) -> usize {
        self.kib.load(Ordering::Relaxed) as usize * 1024
    }

    /// Takes `bytes` more from the budget, waiting at most
    /// [`MEMORY_WAIT`]; 503 when they do not come.
    pub async fn grow(&self, bytes: usize) -> Result<(), ApiError> {
        let held = self.kib.load(Ordering::Relaxed);
        let want = kib(bytes).min(self.total_kib.saturating_sub(held));
        if want == 0 {
            return Ok(());
        }
        let permits = tokio::time::timeout(MEMORY_WAIT, self.memory.acquire_many(want)).await;
        match permits {
            Ok(Ok(permits)) => {
                // Given back in `drop`, all at once.
                permits.forget();
                self.kib.fetch_add(want, Ordering::Relaxed);
                Ok(())
            }
            Ok(Err(_)) => Err(ApiError::unavailable("shutting down")),
            Err(_) => Err(ApiError::no_memory()),
        }
    }
}

impl Drop for BodyMemory {
    fn drop(&mut self) {
        let kib = *self.kib.get_mut();
        if kib > 0 {
            self.memory.add_permits(kib as usize);
        }
    }
}

/// Syncs in flight per limiter id.
#[derive(Debug)]
pub struct SyncsInFlight {
    max: usize,
    /// Limiter id to its syncs in flight (only ids with one or more).
    held: Mutex<FxHashMap<Box<str>, usize>>,
}

impl SyncsInFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<Box<str>, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one more sync of `limiter`; 429 when it has its most.
    fn enter(&self, limiter: &str) -> Result<(), ApiError> {
        let mut held = self.lock();
        let n = held.get(limiter).copied().unwrap_or(0);
        if n >= self.max {
            return Err(ApiError::busy(format!(
                "limiter {limiter:?} already has {n} syncs in flight at this root \
                 (max_syncs_per_limiter): retry when one is answered"
            )));
        }
        held.insert(limiter.into(), n + 1);
        Ok(())
    }

    fn leave(&self, limiter: &str) {
        let mut held = self.lock();
        match held.get_mut(limiter) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                held.remove(limiter);
            }
            None => {}
        }
    }

    /// Syncs in flight of `limiter`.
    pub fn of(&self, limiter: &str) -> usize {
        self.lock().get(limiter).copied().unwrap_or(0)
    }
}

/// A sync's place among its limiter's syncs in flight: taken from its
/// headers when they name the limiter, else from its body once decoded
/// ([`SyncTicket::claim`]); given back when the sync is done.
#[derive(Debug)]
pub struct SyncTicket {
    syncs: Arc<SyncsInFlight>,
    /// The limiter counted, once one is.
    limiter: Mutex<Option<Box<str>>>,
}

impl SyncTicket {
    /// Checks that the body's `limiter` is the one counted, or counts it
    /// now: 400 when the header named another, 429 when it has its most.
    pub fn claim(&self, limiter: &str) -> Result<(), ApiError> {
        let mut counted = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
        match counted.as_deref() {
            Some(id) if id == limiter => Ok(()),
            Some(id) => Err(ApiError::invalid(
                "limiter",
                format!(
                    "the body names limiter {limiter:?} but the {LIMITER_HEADER} header \
                     {id:?}: send the same id in both"
                ),
            )),
            None => {
                self.syncs.enter(limiter)?;
                *counted = Some(limiter.into());
                Ok(())
            }
        }
    }
}

impl Drop for SyncTicket {
    fn drop(&mut self) {
        let counted = self.limiter.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = counted.take() {
            self.syncs.leave(&id);
        }
    }
}

/// The limiter a sync's headers name: its token's own, or its
/// [`LIMITER_HEADER`] (which must then agree with the token).
fn limiter_of(caller: Option<&Caller>, headers: &HeaderMap) -> Result<Option<Box<str>>, ApiError> {
    let claimed = match headers.get(LIMITER_HEADER) {
        None => None,
        Some(value) => {
            let id = value
                .to_str()
                .ok()
                .filter(|v| validate_limiter_id(v).is_ok());
            let Some(id) = id else {
                return Err(ApiError::invalid(
                    LIMITER_HEADER,
                    "not a limiter id: 1 to 255 printable ASCII bytes without spaces",
                ));
            };
            Some(id)
        }
    };
    match (caller, claimed) {
        (Some(Caller::Limiter(own)), Some(id)) if **own != *id => Err(ApiError::forbidden(
            "limiter",
            format!("this token is limiter {own:?}'s: it cannot sync as {id:?}"),
        )),
        (Some(Caller::Limiter(own)), _) => Ok(Some((**own).into())),
        (_, claimed) => Ok(claimed.map(Into::into)),
    }
}

/// Counts a sync among its limiter's syncs in flight (see the module
/// doc); the handler finds its [`SyncTicket`] in the request's
/// extensions. Runs after the token check, before [`admit`].
pub async fn count_sync(
    State(admission): State<Arc<Admission>>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = request.extensions().get::<Caller>();
    let limiter = match limiter_of(caller, request.headers()) {
        Ok(limiter) => limiter,
        Err(e) => return e.into_response(),
    };
    let ticket = SyncTicket {
        syncs: Arc::clone(&admission.syncs),
        limiter: Mutex::new(None),
    };
    if let Some(id) = limiter {
        if let Err(e) = ticket.claim(&id) {
            return closing(e);
        }
    }
    request.extensions_mut().insert(Arc::new(ticket));
    next.run(request).await
}

/// Reads the request's body under the memory budget and the pace, then
/// takes a slot and runs the handler. The handler finds the request's
/// [`BodyMemory`] in its extensions (a sync grows it before decoding).
pub async fn admit(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    let memory = admission.body_memory();
    let mut request = match admission.read_body(request, &memory).await {
        Ok(request) => request,
        Err(e) => return closing(e),
    };
    request.extensions_mut().insert(Arc::clone(&memory));
    in_slot(&admission.slots, request, next).await
}

/// Runs `/healthz` and `/metrics` in their own slots.
pub async fn admit_ops(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    in_slot(&admission.ops_slots, request, next).await
}

/// Runs the handler once one of `slots` is free, holding it meanwhile.
async fn in_slot(slots: &Semaphore, request: Request, next: Next) -> Response {
    let Ok(_slot) = slots.acquire().await else {
        return ApiError::unavailable("shutting down").into_response();
    };
    next.run(request).await
}

/// An error reply that closes the connection: the rest of the request's
/// body, if any, is never read.
fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(min_rate: u64) -> BodyPace {
        BodyPace {
            min_rate,
            grace: Duration::from_secs(2),
            timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_body_buys_time_by_the_byte_but_never_more_than_the_grace() {
        let p = pace(1000);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(p.first(t0), t0 + s(2));
        // 500 bytes a second in buy half a second.
        let d = p.extend(p.first(t0), 500, t0 + s(1), t0);
        assert_eq!(d, t0 + Duration::from_millis(2500));
        // A megabyte buys no more than the grace from now: a fast start
        // cannot bank time for a stall.
        let d = p.extend(d, 1 << 20, t0 + s(1), t0);
        assert_eq!(d, t0 + s(3));
        // Nothing lasts past the timeout.
        let late = t0 + s(59);
        assert_eq!(p.extend(late, 1 << 20, late, t0), t0 + s(60));
        // Without a rate, the timeout alone.
        assert_eq!(pace(0).first(t0), t0 + s(60));
        assert_eq!(pace(0).extend(t0, 1, t0, t0), t0 + s(60));
    }

    #[test]
    fn a_cut_body_is_told_which_rule_cut_it() {
        let p = pace(1000);
        let t0 = Instant::now();
        let slow = p.cut(t0 + Duration::from_secs(2), t0);
        assert!(slow.message.contains("min_body_rate"), "{}", slow.message);
        let late = p.cut(t0 + Duration::from_secs(60), t0);
        assert!(late.message.contains("body_timeout"), "{}", late.message);
        assert_eq!(slow.status, axum::http::StatusCode::REQUEST_TIMEOUT);
    }

    #[test]
    fn a_limiter_has_at_most_its_syncs_in_flight() {
        let syncs = Arc::new(SyncsInFlight {
            max: 2,
            held: Mutex::default(),
        });
        let ticket = || SyncTicket {
            syncs: Arc::clone(&syncs),
            limiter: Mutex::new(None),
        };
        let (a, b, c) = (ticket(), ticket(), ticket());
        a.claim("web-1").unwrap();
        b.claim("web-1").unwrap();
        let busy = c.claim("web-1").unwrap_err();
        assert_eq!(busy.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.field.as_deref(), Some("limiter"));
        // Another limiter is not held up; a claimed ticket checks its id.
        c.claim("web-2").unwrap();
        assert!(c.claim("web-2").is_ok());
        assert_eq!(
            c.claim("web-3").unwrap_err().field.as_deref(),
            Some("limiter")
        );
        assert_eq!(syncs.of("web-1"), 2);
        drop(a);
        assert_eq!(syncs.of("web-1"), 1);
        drop((b, c));
        assert!(syncs.lock().is_empty(), "nothing left behind");
    }

    #[test]
    fn a_header_names_the_limiter_and_a_limiters_token_its_own() {
        let mut headers = HeaderMap::new();
        assert_eq!(limiter_of(Some(&Caller::Shared), &headers).unwrap(), None);
        let own = Caller::Limiter("web-1".into());
        assert_eq!(
            limiter_of(Some(&own), &headers).unwrap().as_deref(),
            Some("web-1")
        );
        headers.insert(LIMITER_HEADER, HeaderValue::from_static("web-2"));
        assert_eq!(
            limiter_of(Some(&Caller::Shared), &headers)
                .unwrap()
                .as_deref(),
            Some("web-2")
        );
        let other = limiter_of(Some(&own), &headers).unwrap_err();
        assert_eq!(other.status, axum::http::StatusCode::FORBIDDEN);
        headers.insert(LIMITER_HEADER, HeaderValue::from_static("a b"));
        let bad = limiter_of(None, &headers).unwrap_err();
        assert_eq!(bad.field.as_deref(), Some(LIMITER_HEADER));
    }

    #[tokio::test]
    async fn body_memory_waits_for_the_budget_then_gives_up_and_gives_back_on_drop() {
        let config = RootConfig {
            body_limits: BodyLimits {
                total: 8 << 10,
                ..BodyLimits::default()
            },
            ..RootConfig::default()
        };
        let admission = Admission::new(&config);
        let first = admission.body_memory();
        first.grow(6 << 10).await.unwrap();
        assert_eq!((first.bytes(), admission.memory_held()), (6 << 10, 6 << 10));
        let second = admission.body_memory();
        second.grow(2 << 10).await.unwrap();
        // Full: a third waits MEMORY_WAIT, then 503.
        let third = admission.body_memory();
        let refused = third.grow(1).await.unwrap_err();
        assert_eq!(refused.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        // Memory given back while it waits is taken.
        let waiting = tokio::spawn(async move { third.grow(4 << 10).await.map(|_| third) });
        tokio::task::yield_now().await;
        drop(first);
        let third = waiting.await.unwrap().unwrap();
        assert_eq!(admission.memory_held(), 6 << 10);
        // No share grows past the whole budget, so one alone always can.
        drop((second, third));
        let alone = admission.body_memory();
        alone.grow(1 << 30).await.unwrap();
        assert_eq!(alone.bytes(), 8 << 10);
        drop(alone);
        assert_eq!(admission.memory_held(), 0);
    }
}
