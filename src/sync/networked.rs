//! The sync loop with roots: a tokio current-thread runtime and a reqwest
//! (rustls) client inside the sync thread, driving a [`SyncEngine`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::engine::{next_page, Outgoing, Page, SyncEngine};
use super::link::OwedDeltas;
use super::{local_now, run_standalone, window_spread, window_wake, LogLevel, Shared, SyncConfig};
use crate::core::rng::Rng;
use crate::table::Table;
use crate::wire::{ClockReport, SyncRequest, SyncResponse, CLOCK_HEADER, SYNC_PATH};

/// Largest sync reply accepted (a page of quotas plus counters).
const MAX_REPLY_BYTES: usize = 256 << 20;
/// Quota pages fetched from one root in one cycle at most.
const MAX_PAGES_PER_CYCLE: usize = 1000;

pub(super) fn run(table: Arc<Table>, config: SyncConfig, shared: Arc<Shared>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let client = reqwest::Client::builder()
        .timeout(config.request_timeout())
        .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
        .build();
    match (runtime, client) {
        (Ok(runtime), Ok(client)) => runtime.block_on(run_loop(&table, &config, &shared, client)),
        (Err(e), _) => {
            (config.log)(
                LogLevel::Error,
                &format!("cannot start the sync runtime: {e}; standalone"),
            );
            run_standalone(&table, &config, &shared);
        }
        (_, Err(e)) => {
            (config.log)(
                LogLevel::Error,
                &format!("cannot build the HTTP client: {e}; standalone"),
            );
            run_standalone(&table, &config, &shared);
        }
    }
}

async fn run_loop(table: &Table, config: &SyncConfig, shared: &Shared, client: reqwest::Client) {
    let now = || local_now(config.clock_skew);
    let interval = config.interval;
    let mut engine = SyncEngine::new(
        &config.roots,
        config.limiter_id.clone(),
        interval.as_nanos() as u64,
        config.max_owed,
        now(),
    );
    engine.set_groups(&config.groups());
    engine.set_early_sync(config.early_sync);
    // How often early sync looks at the table (never, when it is off).
    let early = engine.early_probe_every().map(Duration::from_nanos);
    let mut probe = tokio::time::interval(early.unwrap_or(interval));
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rng = Rng::new(now() ^ u64::from(std::process::id()).rotate_left(32));
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
    // ends its root's exchange.
    let mut task_roots = HashMap::new();
    // Applies the outcome of one finished exchange task.
    let finish_exchange =
        |joined: Result<(tokio::task::Id, Exchange), tokio::task::JoinError>,
         engine: &mut SyncEngine,
         task_roots: &mut HashMap<tokio::task::Id, usize>| {
            match joined {
                Ok((task, ex)) => {
                    task_roots.remove(&task);
                    engine.count_bytes(ex.root, ex.bytes_sent, ex.bytes_received);
                    log(engine.finish(table, ex.root, ex.owed, &ex.pages, ex.error, now()));
                }
                Err(e) => {
                    (config.log)(LogLevel::Error, &format!("sync task failed: {e}"));
                    if let Some(root) = task_roots.remove(&e.id()) {
                        let error = Some(format!("sync task failed: {e}"));
                        let owed = OwedDeltas::default();
                        log(engine.finish(table, root, owed, &[], error, now()));
                    }
                }
            }
            publish(engine, table, shared);
        };
    while !shared.stop.load(Ordering::Acquire) {
        for out in engine.begin_cycle(table, now()) {
            let root = out.root;
            let url = format!("{}{SYNC_PATH}", engine.root_url(root));
            let client = client.clone();
            let token = config.token.clone();
            let skew = config.clock_skew;
            let task = exchanges
                .spawn(async move { exchange(&client, url, token.as_deref(), out, skew).await });
            task_roots.insert(task.id(), root);
        }
        publish(&engine, table, shared);
        let jitter = interval.mul_f64(0.1 * rng.next_unit());
        let mut wait = interval + jitter;
        // A cycle just after each window boundary: the weight collected
        // then is sent tagged with the window it was admitted in.
        if let Some(ns) = window_wake(table, now(), spread) {
            wait = wait.min(Duration::from_nanos(ns));
        }
        let next_cycle = tokio::time::Instant::now() + wait;
        // Replies are applied as they arrive.
        loop {
            tokio::select! {
                Some(joined) = exchanges.join_next_with_id(), if !exchanges.is_empty() => {
                    finish_exchange(joined, &mut engine, &mut task_roots);
                }
                _ = tokio::time::sleep_until(next_cycle) => break,
                _ = probe.tick(), if early.is_some() => {
                    if engine.early_sync_due(table, now()) {
                        break;
                    }
                }
                _ = shared.async_wake.notified() => break,
            }
        }
        log(engine.end_cycle(table, now()));
        publish(&engine, table, shared);
    }
    // Exchanges under way finish first (each within the request timeout),
    // so what they carried is acknowledged, not handed on and sent twice.
    while let Some(joined) = exchanges.join_next_with_id().await {
        finish_exchange(joined, &mut engine, &mut task_roots);
    }
    engine.abandon(table);
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
    owed: OwedDeltas,
    pages: Vec<Page>,
    error: Option<String>,
    bytes_sent: u64,
    bytes_received: u64,
}

/// One exchange with a root: the request with the owed deltas, then more
/// quota pages while the root says there are more.
async fn exchange(
    client: &reqwest::Client,
    url: String,
    token: Option<&str>,
    out: Outgoing,
    skew: i64,
) -> Exchange {
    let Outgoing {
        root,
        request,
        owed,
        clock,
    } = out;
    let mut ex = Exchange {
        root,
        owed,
        pages: Vec::new(),
        error: None,
        bytes_sent: 0,
        bytes_received: 0,
    };
    let mut request = Some(request);
    let mut pages = 0;
    while let Some(req) = request.take() {
        let sent_at = crate::clock::now_precise().saturating_add_signed(skew);
        match post(client, &url, token, clock, &req, &mut ex).await {
            Ok(reply) => {
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
            Err(e) => ex.error = Some(e),
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
) -> Result<SyncResponse, String> {
    let body = serde_json::to_vec(request).map_err(|e| format!("cannot encode request: {e}"))?;
    ex.bytes_sent += body.len() as u64;
    let mut builder = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(token) = token {
        builder = builder.bearer_auth(token);
    }
    if let Some(clock) = clock {
        builder = builder.header(CLOCK_HEADER, clock.header_value());
    }
    let mut response = builder.send().await.map_err(|e| describe(&e))?;
    let status = response.status();
    if response
        .content_length()
        .is_some_and(|n| n > MAX_REPLY_BYTES as u64)
    {
        return Err(format!("reply larger than {MAX_REPLY_BYTES} bytes"));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e))? {
        if bytes.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err(format!("reply larger than {MAX_REPLY_BYTES} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    ex.bytes_received += bytes.len() as u64;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        return Err(format!("HTTP {status}: {text}"));
    }
    let reply: SyncResponse =
        serde_json::from_slice(&bytes).map_err(|e| format!("malformed reply: {e}"))?;
    validate(&reply)?;
    Ok(reply)
}

/// A reply is applied whole or not at all: every number must be sane and
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
