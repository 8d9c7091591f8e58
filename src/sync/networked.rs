//! The sync loop with roots: a tokio current-thread runtime and a reqwest
//! (rustls) client inside the sync thread, driving a [`SyncEngine`].
//!
//! Syncs go in the binary encoding ([`crate::wire::binary`]) to every root
//! that takes it. A root that answers a binary request 415 or 400 (one
//! that predates it refuses the body as malformed JSON: nothing was
//! taken in either way) is asked again in JSON at once, and in JSON from
//! then on, until it restarts (a new instance may have been upgraded).
//! `SLUICE_SYNC_ENCODING=json` in the environment makes every sync JSON.
//!
//! When the monotonic clock goes back, the loop starts over on a new
//! runtime and client, the engine kept (see `clock_watch.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::clock_watch::ClockWatch;
use super::config::SyncConfig;
use super::engine::SyncEngine;
use super::link::OwedDeltas;
use super::log::LogLevel;
use super::request::{next_page, Outgoing, Page};
use super::schedule::{local_now, window_spread, window_wake};
use super::shared::Shared;
use super::standalone::run_standalone;
use crate::core::rng::Rng;
use crate::table::Table;
use crate::wire::binary;
use crate::wire::{
    ClockReport, SyncRequest, SyncResponse, BINARY_CONTENT_TYPE, CLOCK_HEADER, JSON_CONTENT_TYPE,
    LIMITER_HEADER, SYNC_PATH,
};

/// Largest sync reply accepted (a page of quotas plus counters).
const MAX_REPLY_BYTES: usize = 256 << 20;
/// Quota pages fetched from one root in one cycle at most.
const MAX_PAGES_PER_CYCLE: usize = 1000;

/// Environment variable that, set to `json`, makes the sync thread send
/// and ask for JSON only.
pub const ENCODING_ENV: &str = "SLUICE_SYNC_ENCODING";

/// How the sync thread talks to one root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// Binary requests and replies.
    Binary,
    /// JSON, because the root refused binary; `instance` is the root
    /// instance that answered JSON (0: not known yet). Another instance
    /// is tried in binary again.
    Json { instance: u64 },
    /// JSON always ([`ENCODING_ENV`]).
    JsonOnly,
}

impl Encoding {
    /// The encoding to start with, from the environment.
    fn initial() -> Self {
        match std::env::var(ENCODING_ENV) {
            Ok(v) if v.eq_ignore_ascii_case("json") => Encoding::JsonOnly,
            _ => Encoding::Binary,
        }
    }

    fn binary(self) -> bool {
        self == Encoding::Binary
    }

    /// What to use after a successful reply from root instance `instance`.
    fn after_reply(self, instance: u64) -> Self {
        match self {
            Encoding::Json { instance: 0 } => Encoding::Json { instance },
            // Restarted, perhaps upgraded: binary again.
            Encoding::Json { instance: old } if old != instance => Encoding::Binary,
            other => other,
        }
    }
}

pub(super) fn run(
    table: Arc<Table>,
    config: SyncConfig,
    shared: Arc<Shared>,
    predecessor: Option<u32>,
) {
    let skew = config.clock_skew;
    let mut engine = SyncEngine::new(
        &config.roots,
        config.limiter_id.clone(),
        config.interval.as_nanos() as u64,
        config.max_owed,
        local_now(skew),
    );
    engine.set_groups(&config.groups());
    engine.resume(&table);
    if let Some(pid) = predecessor {
        for (level, line) in engine.take_over(&table, pid) {
            (config.log)(level, &line);
        }
    }
    engine.set_early_sync(config.early_sync);
    engine
        .set_in_flight_lease(u64::try_from(config.in_flight_lease.as_nanos()).unwrap_or(u64::MAX));
    let watch = match ClockWatch::start(move || local_now(skew)) {
        Ok(watch) => Some(watch),
        Err(e) => {
            (config.log)(
                LogLevel::Warn,
                &format!(
                    "cannot start the clock watch: {e}; a step back of the monotonic clock \
                     stops the syncs until the clock is back where it was"
                ),
            );
            None
        }
    };
    loop {
        // A runtime (and a client on it) per run of the loop: one that
        // starts over after the clock went back counts its timers from
        // the clock as it is now (see `clock_watch.rs`).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let client = reqwest::Client::builder()
            .timeout(config.request_timeout())
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .build();
        let error = match (runtime, client) {
            (Ok(runtime), Ok(client)) => {
                let run = run_loop(
                    &table,
                    &config,
                    &shared,
                    client,
                    &mut engine,
                    watch.as_ref(),
                );
                match runtime.block_on(run) {
                    Ended::Stopped => break,
                    Ended::ClockBack(by) => {
                        (config.log)(
                            LogLevel::Warn,
                            &format!(
                                "the monotonic clock went back {} ms: the sync loop starts \
                                 over on it (exchanges under way are sent again)",
                                by / 1_000_000
                            ),
                        );
                        continue;
                    }
                }
            }
            (Err(e), _) => format!("cannot start the sync runtime: {e}; standalone"),
            (_, Err(e)) => format!("cannot build the HTTP client: {e}; standalone"),
        };
        (config.log)(LogLevel::Error, &error);
        engine.hand_back(&table);
        run_standalone(&table, &config, &shared);
        return;
    }
    // Requests still unconfirmed go to the next thread under their
    // numbers; the rest of what no root acknowledged is handed back.
    for (level, line) in engine.stop(&table) {
        (config.log)(level, &line);
    }
}

/// Why [`run_loop`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// The thread was asked to stop; every exchange under way finished.
    Stopped,
    /// The monotonic clock went back by this many nanoseconds: the loop
    /// is to start over on a new runtime. Exchanges under way were cut
    /// short and count as failed (their weight goes again).
    ClockBack(u64),
}

async fn run_loop(
    table: &Table,
    config: &SyncConfig,
    shared: &Shared,
    client: reqwest::Client,
    engine: &mut SyncEngine,
    watch: Option<&ClockWatch>,
) -> Ended {
    let now = || local_now(config.clock_skew);
    let interval = config.interval;
    // How often the loop looks at the table for an early cycle (penalties
    // started here; unsent weight with early sync on).
    let mut probe = tokio::time::interval(Duration::from_nanos(engine.probe_every()));
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rng = Rng::new(crate::host::random_seed());
    let spread = window_spread(&config.limiter_id);
    let log = |lines: Vec<(LogLevel, String)>| {
        for (level, line) in lines {
            (config.log)(level, &line);
        }
    };
    // Exchanges outlive the cycle that started them: a root that has not
    // answered yet is left out of the next cycles (the engine marks it
    // busy) until its exchange ends, and delays no one.
    let mut exchanges = JoinSet::new();
    // Which root each task talks to, so that even a task that panicked
    // or was cut short ends its root's exchange.
    let mut task_roots = HashMap::new();
    // What each root's exchange under way pays off (one at a time per
    // root), handed back to the engine with its outcome, whatever it is.
    let mut owed_of: HashMap<usize, OwedDeltas> = HashMap::new();
    // How each root is talked to (absent: the initial encoding).
    let initial = Encoding::initial();
    let mut encodings: HashMap<usize, Encoding> = HashMap::new();
    // Takes in the outcome of one finished exchange task.
    let finish_exchange = |joined: Result<(tokio::task::Id, Exchange), tokio::task::JoinError>,
                           engine: &mut SyncEngine,
                           task_roots: &mut HashMap<tokio::task::Id, usize>,
                           owed_of: &mut HashMap<usize, OwedDeltas>,
                           encodings: &mut HashMap<usize, Encoding>| {
        match joined {
            Ok((task, ex)) => {
                task_roots.remove(&task);
                if ex.encoding == Encoding::Binary {
                    encodings.remove(&ex.root);
                } else {
                    encodings.insert(ex.root, ex.encoding);
                }
                engine.count_bytes(ex.root, ex.bytes_sent, ex.bytes_received);
                if ex.refused_numbered {
                    engine.refused_numbered(ex.root);
                }
                let owed = owed_of.remove(&ex.root).unwrap_or_default();
                log(engine.finish(table, ex.root, owed, &ex.pages, ex.error, now()));
            }
            Err(e) => {
                let error = if e.is_cancelled() {
                    "cut short: the clock went back".to_string()
                } else {
                    (config.log)(LogLevel::Error, &format!("sync task failed: {e}"));
                    format!("sync task failed: {e}")
                };
                if let Some(root) = task_roots.remove(&e.id()) {
                    let owed = owed_of.remove(&root).unwrap_or_default();
                    log(engine.finish(table, root, owed, &[], Some(error), now()));
                }
            }
        }
        publish(engine, table, shared);
    };
    let mut ended = Ended::Stopped;
    while !shared.stop.load(Ordering::Acquire) {
        super::standalone::reclaim_abandoned(table, now(), config);
        for mut out in engine.begin_cycle(table, now()) {
            let root = out.root;
            owed_of.insert(root, std::mem::take(&mut out.owed));
            let url = format!("{}{SYNC_PATH}", engine.root_url(root));
            let client = client.clone();
            let token = config.token.clone();
            let skew = config.clock_skew;
            let encoding = encodings.get(&root).copied().unwrap_or(initial);
            let task = exchanges.spawn(async move {
                exchange(&client, url, token.as_deref(), out, skew, encoding).await
            });
            task_roots.insert(task.id(), root);
        }
        publish(engine, table, shared);
        let jitter = interval.mul_f64(0.1 * rng.next_unit());
        let mut wait = interval + jitter;
        // A cycle just after each window boundary: the weight collected
        // then is sent tagged with the window it was admitted in.
        if let Some(ns) = window_wake(table, now(), spread) {
            wait = wait.min(Duration::from_nanos(ns));
        }
        let next_cycle = tokio::time::Instant::now() + wait;
        // Replies are taken in as they arrive.
        loop {
            tokio::select! {
                Some(joined) = exchanges.join_next_with_id(), if !exchanges.is_empty() => {
                    finish_exchange(joined, engine, &mut task_roots, &mut owed_of, &mut encodings);
                }
                _ = tokio::time::sleep_until(next_cycle) => break,
                _ = probe.tick() => {
                    if engine.early_sync_due(table, now()) {
                        break;
                    }
                }
                _ = shared.async_wake.notified() => break,
                by = stepped_back(watch) => {
                    ended = Ended::ClockBack(by);
                    break;
                }
            }
        }
        if ended != Ended::Stopped {
            // Every timer of this runtime is off by the step: what is
            // under way is cut short (sent again, each numbered request
            // applied once), and the loop starts over on a new runtime.
            exchanges.abort_all();
        }
        log(engine.end_cycle(table, now()));
        publish(engine, table, shared);
        if ended != Ended::Stopped {
            break;
        }
    }
    // Exchanges under way when the thread stops finish first (each within
    // the request timeout), so what they carried is acknowledged, not
    // handed on and sent twice; those cut short go again.
    while let Some(joined) = exchanges.join_next_with_id().await {
        finish_exchange(
            joined,
            engine,
            &mut task_roots,
            &mut owed_of,
            &mut encodings,
        );
    }
    ended
}

/// Waits until `watch` says the clock went back (never without one).
async fn stepped_back(watch: Option<&ClockWatch>) -> u64 {
    match watch {
        Some(watch) => watch.stepped_back().await,
        None => std::future::pending().await,
    }
}

/// Makes the engine's metrics visible to the owner and, through the
/// table, to every process sharing it: whenever a cycle starts, an
/// exchange ends and a cycle ends.
fn publish(engine: &SyncEngine, table: &Table, shared: &Shared) {
    let metrics = engine.metrics();
    super::status::publish(table, &metrics);
    if let Ok(mut m) = shared.metrics.lock() {
        *m = metrics;
    }
}

/// What one exchange with a root produced.
struct Exchange {
    root: usize,
    pages: Vec<Page>,
    error: Option<String>,
    bytes_sent: u64,
    bytes_received: u64,
    /// How to talk to the root next time.
    encoding: Encoding,
    /// The root refused the numbered request as malformed in every
    /// encoding (400 or 415): it predates numbered requests (rolled back),
    /// and took nothing in.
    refused_numbered: bool,
}

/// Why a post failed.
enum PostError {
    /// The root refused a binary body (415, or 400 from a root that
    /// predates the binary encoding): nothing was taken in, ask again in
    /// JSON.
    Binary(String),
    /// A JSON body refused as malformed (400 or 415).
    Refused(String),
    /// Anything else.
    Other(String),
}

/// One exchange with a root: the request with the owed deltas, then more
/// quota pages while the root says there are more.
async fn exchange(
    client: &reqwest::Client,
    url: String,
    token: Option<&str>,
    out: Outgoing,
    skew: i64,
    encoding: Encoding,
) -> Exchange {
    let Outgoing {
        root,
        request,
        clock,
        ..
    } = out;
    let mut ex = Exchange {
        root,
        pages: Vec::new(),
        error: None,
        bytes_sent: 0,
        bytes_received: 0,
        encoding,
        refused_numbered: false,
    };
    let mut request = Some(request);
    let mut pages = 0;
    while let Some(req) = request.take() {
        let mut sent_at = crate::clock::now_precise().saturating_add_signed(skew);
        let mut result = post(client, &url, token, clock, &req, &mut ex).await;
        if let Err(PostError::Binary(_)) = result {
            // Asked again at once, in JSON; kept in JSON if that works (a
            // request the root refuses in both is just refused).
            let before = ex.encoding;
            ex.encoding = Encoding::Json { instance: 0 };
            sent_at = crate::clock::now_precise().saturating_add_signed(skew);
            result = post(client, &url, token, clock, &req, &mut ex).await;
            if result.is_err() {
                ex.encoding = before;
            }
        }
        match result {
            Ok(reply) => {
                ex.encoding = ex.encoding.after_reply(reply.root_instance);
                let received_at = crate::clock::now_precise().saturating_add_signed(skew);
                pages += 1;
                if pages < MAX_PAGES_PER_CYCLE {
                    request = next_page(&req, &reply);
                }
                ex.pages.push(Page {
                    sent_at,
                    received_at,
                    reply,
                });
            }
            Err(PostError::Refused(e)) => {
                ex.refused_numbered = pages == 0 && req.sequence.is_some();
                ex.error = Some(e);
            }
            Err(PostError::Binary(e) | PostError::Other(e)) => ex.error = Some(e),
        }
    }
    ex
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    clock: Option<ClockReport>,
    request: &SyncRequest,
    ex: &mut Exchange,
) -> Result<SyncResponse, PostError> {
    let binary = ex.encoding.binary();
    let (body, content_type, accept) = if binary {
        let body = binary::encode_request(request);
        (body, BINARY_CONTENT_TYPE, BINARY_ACCEPT)
    } else {
        let body = serde_json::to_vec(request)
            .map_err(|e| PostError::Other(format!("cannot encode request: {e}")))?;
        (body, JSON_CONTENT_TYPE, JSON_CONTENT_TYPE)
    };
    ex.bytes_sent += body.len() as u64;
    let mut builder = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .header(reqwest::header::ACCEPT, accept)
        .body(body);
    if let Some(token) = token {
        builder = builder.bearer_auth(token);
    }
    if let Some(clock) = clock {
        builder = builder.header(CLOCK_HEADER, clock.header_value());
    }
    // Lets the root count this limiter's syncs before reading the body
    // (the id is printable ASCII: a valid header value).
    builder = builder.header(LIMITER_HEADER, &request.limiter);
    let other = |e: String| PostError::Other(e);
    let mut response = builder.send().await.map_err(|e| other(describe(&e)))?;
    let status = response.status();
    if response
        .content_length()
        .is_some_and(|n| n > MAX_REPLY_BYTES as u64)
    {
        return Err(other(format!("reply larger than {MAX_REPLY_BYTES} bytes")));
    }
    let binary_reply = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(BINARY_CONTENT_TYPE));
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| other(describe(&e)))? {
        if bytes.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err(other(format!("reply larger than {MAX_REPLY_BYTES} bytes")));
        }
        bytes.extend_from_slice(&chunk);
    }
    ex.bytes_received += bytes.len() as u64;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        let error = format!("HTTP {status}: {text}");
        let refused = status == reqwest::StatusCode::UNSUPPORTED_MEDIA_TYPE
            || status == reqwest::StatusCode::BAD_REQUEST;
        return Err(match (binary, refused) {
            (true, true) => PostError::Binary(error),
            (false, true) => PostError::Refused(error),
            _ => other(error),
        });
    }
    decode_reply(&bytes, binary_reply).map_err(other)
}

/// What a binary request accepts: binary in reply format 6 (keys'
/// previous-window counts, the flags that say the root takes returns,
/// tiers and sequences, the tiers section, how far the root applied the
/// sync thread's requests, the keys the root refused; a root that
/// predates it answers an older format), or JSON from a root that cannot
/// write binary.
const BINARY_ACCEPT: &str = "application/x-sluice-sync;version=9, application/json;q=0.5";

/// Decodes and validates a reply body, binary or JSON by its content
/// type: a reply that fails either is dropped whole (the limiter keeps
/// its last good state).
fn decode_reply(bytes: &[u8], binary_reply: bool) -> Result<SyncResponse, String> {
    let reply = if binary_reply {
        binary::decode_response(bytes).map_err(|e| format!("malformed binary reply: {e}"))?
    } else {
        serde_json::from_slice(bytes).map_err(|e| format!("malformed reply: {e}"))?
    };
    validate(&reply)?;
    Ok(reply)
}

/// A reply is taken in whole or not at all: every number must be sane and
/// the quotas in log order ([`SyncResponse::validate`]).
fn validate(reply: &SyncResponse) -> Result<(), String> {
    reply
        .validate()
        .map_err(|e| format!("malformed reply: {e}"))
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        format!("cannot connect: {e}")
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Quota;
    use crate::wire::{CounterValue, QuotaCursor};

    fn reply(quotas: Vec<Quota>, counters: Vec<CounterValue>) -> SyncResponse {
        SyncResponse {
            keyed: Vec::new(),
            root_instance: 1,
            root_time: 0,
            quotas,
            quotas_after: QuotaCursor::default(),
            more_quotas: false,
            counters,
            counter_version: 1,
            root_utc: None,
            ..Default::default()
        }
    }

    #[test]
    fn a_binary_request_accepts_the_newest_binary_reply_first() {
        let newest = format!(
            "{BINARY_CONTENT_TYPE};version={}",
            binary::BINARY_REPLY_VERSION
        );
        assert!(BINARY_ACCEPT.starts_with(&newest), "{BINARY_ACCEPT}");
    }

    #[test]
    fn a_json_fallback_lasts_as_long_as_the_root_instance() {
        let json = Encoding::Json { instance: 0 };
        let pinned = json.after_reply(7);
        assert_eq!(pinned, Encoding::Json { instance: 7 });
        assert_eq!(pinned.after_reply(7), pinned);
        assert_eq!(pinned.after_reply(8), Encoding::Binary);
        assert_eq!(Encoding::JsonOnly.after_reply(8), Encoding::JsonOnly);
        assert!(!pinned.binary() && Encoding::Binary.binary());
    }

    #[test]
    fn a_garbled_binary_reply_is_dropped_with_the_reason() {
        let good = binary::encode_response(&reply(vec![], vec![])).unwrap();
        assert!(decode_reply(&good, true).is_ok());
        let e = decode_reply(&good[..good.len() - 1], true).unwrap_err();
        assert!(e.starts_with("malformed binary reply: "), "{e}");
        // A JSON body labelled binary, and the other way round.
        let json = serde_json::to_vec(&reply(vec![], vec![])).unwrap();
        assert!(decode_reply(&json, true).unwrap_err().contains("magic"));
        assert!(decode_reply(&good, false).is_err());
        // Well formed but invalid: refused like JSON.
        let bad = reply(
            vec![],
            vec![CounterValue {
                id: 1,
                level: f64::NAN,
                at: 0,
                prev: 0.0,
            }],
        );
        let bad = binary::encode_response(&bad).unwrap();
        assert!(decode_reply(&bad, true)
            .unwrap_err()
            .contains("counters[0]"));
    }

    /// The epoch-aligned windows travel by name, in either encoding; a
    /// window this build does not know (as `30d` is to a limiter that
    /// predates it) drops the reply whole, the name in the reason: the
    /// limiter keeps its last good state and counts as if that root were
    /// down, and never panics.
    #[test]
    fn a_reply_with_a_window_this_build_does_not_know_is_dropped_whole() {
        let quota = Quota::new(1, "monthly", 5.0, 5.0, 5.0)
            .windowed(crate::core::Window::Days30, true)
            .at_epoch(1);
        let good = reply(vec![quota], vec![]);
        let binary = binary::encode_response(&good).unwrap();
        let json = serde_json::to_vec(&good).unwrap();
        for (bytes, is_binary) in [(&binary, true), (&json, false)] {
            let decoded = decode_reply(bytes, is_binary).unwrap();
            assert_eq!(decoded.quotas[0].window, Some(crate::core::Window::Days30));
            // Same length, so the binary frame stays whole.
            let at = bytes
                .windows(5)
                .position(|w| w == b"\"30d\"")
                .expect("the window by name");
            let mut unknown = bytes.to_vec();
            unknown[at..at + 5].copy_from_slice(b"\"14d\"");
            let e = decode_reply(&unknown, is_binary).unwrap_err();
            assert!(e.contains("14d"), "{e}");
        }
    }

    #[test]
    fn replies_with_bad_numbers_are_rejected_whole() {
        let bad_level = reply(
            vec![],
            vec![CounterValue {
                id: 1,
                level: -1.0,
                at: 0,
                prev: 0.0,
            }],
        );
        assert!(validate(&bad_level).is_err());
        let q = Quota::new(1, "bad name", 1.0, 1.0, 1.0);
        assert!(validate(&reply(vec![q.clone()], vec![])).is_err());
        let ok = Quota {
            name: "ok".into(),
            ..q
        };
        let twice = reply(vec![ok.clone(), ok.clone()], vec![]);
        assert!(validate(&twice).unwrap_err().contains("order"));
        let good = reply(
            vec![ok],
            vec![CounterValue {
                id: 1,
                level: 2.0,
                at: 5,
                prev: 0.0,
            }],
        );
        assert!(validate(&good).is_ok());
    }
}
