//! The sync loop with roots: a tokio current-thread runtime and a reqwest
//! (rustls) client inside the sync thread.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::link::RootLink;
use super::{local_now, run_standalone, LogLevel, Shared, SyncConfig, SyncMetrics};
use crate::core::rng::Rng;
use crate::core::Nanos;
use crate::table::{CollectedDelta, SlotId, Table};
use crate::wire::{CounterDelta, QuotaCursor, SyncRequest, SyncResponse, SYNC_PATH};

/// Largest sync reply accepted (a page of quotas plus counters).
const MAX_REPLY_BYTES: usize = 256 << 20;
/// Quota pages fetched from one root in one cycle at most.
const MAX_PAGES_PER_CYCLE: usize = 1000;
/// How often "all roots down" is repeated in the log.
const DOWN_LOG_EVERY: Nanos = 60_000_000_000;

pub(super) fn run(table: Arc<Table>, config: SyncConfig, shared: Arc<Shared>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let client = reqwest::Client::builder()
        .timeout(config.timeout.unwrap_or(config.interval.mul_f64(0.8)))
        .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
        .build();
    match (runtime, client) {
        (Ok(runtime), Ok(client)) => {
            runtime.block_on(Syncer::new(table, config, shared, client).run())
        }
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

/// Deltas collected and sent, not yet included in a root's answer, by id.
/// The first root whose reply covers them takes them off `inflight`.
#[derive(Default)]
struct Unacked {
    by_id: HashMap<u64, (SlotId, u64)>,
}

impl Unacked {
    fn add(&mut self, collected: &[CollectedDelta]) {
        for d in collected {
            let e = self.by_id.entry(d.id).or_insert((d.slot, 0));
            e.0 = d.slot;
            e.1 += d.delta;
        }
    }

    /// Takes up to `sent` of `id`'s unacknowledged weight.
    fn take(&mut self, id: u64, sent: u64) -> Option<(SlotId, u64)> {
        let e = self.by_id.get_mut(&id)?;
        let acked = e.1.min(sent);
        e.1 -= acked;
        let slot = e.0;
        if e.1 == 0 {
            self.by_id.remove(&id);
        }
        Some((slot, acked))
    }
}

/// One successful page of an exchange with a root.
struct Page {
    sent_at: Nanos,
    received_at: Nanos,
    reply: SyncResponse,
}

/// What one exchange with a root produced: the pages that succeeded and,
/// if the exchange stopped early, why.
struct Exchange {
    pages: Vec<Page>,
    error: Option<String>,
    bytes_sent: u64,
    bytes_received: u64,
}

/// The request state an exchange starts from.
#[derive(Clone)]
struct Ask {
    url: String,
    token: Option<String>,
    limiter: String,
    cursor: QuotaCursor,
    counter_version: u64,
    root_instance: u64,
    skew: i64,
}

struct Syncer {
    table: Arc<Table>,
    config: SyncConfig,
    shared: Arc<Shared>,
    client: reqwest::Client,
    links: Vec<RootLink>,
    unacked: Unacked,
    slots: HashMap<u64, SlotId>,
    slots_generation: Option<u64>,
    started: Nanos,
    last_any_success: Option<Nanos>,
    all_down: bool,
    down_logged_at: Option<Nanos>,
    cycles: u64,
    rng: Rng,
}

impl Syncer {
    fn new(
        table: Arc<Table>,
        config: SyncConfig,
        shared: Arc<Shared>,
        client: reqwest::Client,
    ) -> Self {
        let links = config
            .roots
            .iter()
            .map(|u| RootLink::new(u.trim_end_matches('/').into()))
            .collect();
        let started = local_now(config.clock_skew);
        let seed = started ^ u64::from(std::process::id()).rotate_left(32);
        Self {
            table,
            config,
            shared,
            client,
            links,
            unacked: Unacked::default(),
            slots: HashMap::new(),
            slots_generation: None,
            started,
            last_any_success: None,
            all_down: false,
            down_logged_at: None,
            cycles: 0,
            rng: Rng::new(seed),
        }
    }

    fn now(&self) -> Nanos {
        local_now(self.config.clock_skew)
    }

    fn log(&self, level: LogLevel, message: &str) {
        (self.config.log)(level, message);
    }

    async fn run(mut self) {
        let interval = self.config.interval;
        while !self.shared.stop.load(Ordering::Acquire) {
            self.cycle().await;
            self.publish_metrics();
            let jitter = interval.mul_f64(0.1 * self.rng.next_unit());
            tokio::select! {
                _ = tokio::time::sleep(interval + jitter) => {}
                _ = self.shared.async_wake.notified() => {}
            }
        }
    }

    fn publish_metrics(&self) {
        if let Ok(mut m) = self.shared.metrics.lock() {
            *m = SyncMetrics {
                cycles: self.cycles,
                all_roots_down: self.all_down,
                roots: self.links.iter().map(|l| l.metrics.clone()).collect(),
            };
        }
    }

    async fn cycle(&mut self) {
        self.cycles += 1;
        let mut collected = Vec::new();
        self.table.collect_deltas(&mut collected);
        self.unacked.add(&collected);
        for link in &mut self.links {
            link.owe(
                collected.iter().map(|d| (d.id, d.delta)),
                self.config.max_owed,
            );
        }

        let now = self.now();
        let mut exchanges = JoinSet::new();
        for (i, link) in self.links.iter_mut().enumerate() {
            if link.retry_at > now {
                continue;
            }
            let owed = std::mem::take(&mut link.owed);
            let ask = Ask {
                url: format!("{}{SYNC_PATH}", link.url),
                token: self.config.token.clone(),
                limiter: self.config.limiter_id.clone(),
                cursor: link.cursor,
                counter_version: link.counter_version,
                root_instance: link.root_instance,
                skew: self.config.clock_skew,
            };
            let client = self.client.clone();
            exchanges.spawn(async move {
                let ex = exchange(&client, ask, &owed).await;
                (i, owed, ex)
            });
        }
        // Replies are applied as they arrive; a slow root delays nobody.
        while let Some(joined) = exchanges.join_next().await {
            match joined {
                Ok((i, owed, ex)) => self.finish(i, owed, ex),
                Err(e) => self.log(LogLevel::Error, &format!("sync task failed: {e}")),
            }
        }
        self.check_all_down();
    }

    fn finish(&mut self, i: usize, owed: HashMap<u64, u64>, ex: Exchange) {
        let now = self.now();
        let interval = self.config.interval.as_nanos() as u64;
        let max_owed = self.config.max_owed;
        let link = &mut self.links[i];
        link.metrics.bytes_sent += ex.bytes_sent;
        link.metrics.bytes_received += ex.bytes_received;
        if ex.pages.is_empty() {
            // Nothing reached the root (or its answer was lost): owe again.
            let was_up = link.metrics.up || link.metrics.syncs == 0;
            let error = ex.error.unwrap_or_else(|| "no reply".into());
            link.owe(owed.into_iter(), max_owed);
            link.failed(now, interval, error.clone());
            if was_up {
                let msg = format!("quota root {} unreachable: {error}", link.url);
                self.log(LogLevel::Warn, &msg);
            }
            return;
        }
        if !link.metrics.up && link.metrics.errors > 0 {
            let msg = format!("quota root {} reachable again", link.url);
            self.log(LogLevel::Info, &msg);
        }
        let empty = HashMap::new();
        for (k, page) in ex.pages.iter().enumerate() {
            self.links[i].succeeded(page.sent_at, page.received_at, &page.reply);
            // Deltas went out with the first page only.
            self.apply(i, &page.reply, if k == 0 { &owed } else { &empty });
        }
        if let Some(error) = ex.error {
            // A later page failed; the deltas were delivered with the first.
            let link = &mut self.links[i];
            link.failed(now, interval, error);
        }
        self.last_any_success = Some(now);
    }

    fn apply(&mut self, i: usize, reply: &SyncResponse, sent: &HashMap<u64, u64>) {
        if !reply.quotas.is_empty() {
            let report = self.table.apply_quotas(&reply.quotas);
            for refused in report.refused.iter().take(5) {
                self.log(LogLevel::Error, &refused.to_string());
            }
        }
        let generation = self.table.generation();
        if self.slots_generation != Some(generation) {
            self.slots = self.table.slot_ids();
            self.slots_generation = Some(generation);
        }
        let link = &self.links[i];
        let mut answered = HashSet::with_capacity(reply.counters.len());
        for c in &reply.counters {
            answered.insert(c.id);
            let Some(&slot) = self.slots.get(&c.id) else {
                continue;
            };
            let acked = sent
                .get(&c.id)
                .and_then(|&s| self.unacked.take(c.id, s))
                .map_or(0, |a| a.1);
            self.table
                .merge_counter(slot, c.id, link.to_local(c), acked);
        }
        for (&id, &amount) in sent {
            if !answered.contains(&id) {
                if let Some((slot, acked)) = self.unacked.take(id, amount) {
                    self.table.release_inflight(slot, id, acked);
                }
            }
        }
    }

    /// No root answered for two intervals: count locally (fold the local
    /// weight into the levels) and say so, once a minute.
    fn check_all_down(&mut self) {
        let now = self.now();
        let window = 2 * self.config.interval.as_nanos() as u64;
        let down = match self.last_any_success {
            Some(t) => now.saturating_sub(t) > window,
            None => now.saturating_sub(self.started) > window,
        };
        if down {
            self.table.fold_local(now);
            self.unacked = Unacked::default();
            let due = self
                .down_logged_at
                .is_none_or(|t| now.saturating_sub(t) >= DOWN_LOG_EVERY);
            if due {
                self.down_logged_at = Some(now);
                let msg = format!(
                    "all {} quota roots unreachable; limiting with local counts only (per host)",
                    self.links.len()
                );
                self.log(LogLevel::Warn, &msg);
            }
        } else if self.all_down {
            self.down_logged_at = None;
            self.log(
                LogLevel::Info,
                "a quota root answers again; cluster limiting resumed",
            );
        }
        self.all_down = down;
    }
}

/// One exchange with a root: the request with the owed deltas, then more
/// quota pages while the root says there are more.
async fn exchange(client: &reqwest::Client, ask: Ask, owed: &HashMap<u64, u64>) -> Exchange {
    let mut ex = Exchange {
        pages: Vec::new(),
        error: None,
        bytes_sent: 0,
        bytes_received: 0,
    };
    let mut request = SyncRequest {
        limiter: ask.limiter.clone(),
        quotas_after: ask.cursor,
        counter_version: ask.counter_version,
        root_instance: ask.root_instance,
        deltas: owed
            .iter()
            .map(|(&id, &delta)| CounterDelta { id, delta })
            .collect(),
    };
    for _ in 0..MAX_PAGES_PER_CYCLE {
        let sent_at = crate::clock::now_precise().saturating_add_signed(ask.skew);
        match post(client, &ask, &request, &mut ex).await {
            Ok(reply) => {
                let received_at = crate::clock::now_precise().saturating_add_signed(ask.skew);
                let more = reply.more_quotas && !reply.quotas.is_empty();
                request.quotas_after = reply.quotas_after;
                request.counter_version = reply.counter_version;
                request.root_instance = reply.root_instance;
                request.deltas = Vec::new();
                ex.pages.push(Page {
                    sent_at,
                    received_at,
                    reply,
                });
                if !more {
                    break;
                }
            }
            Err(e) => {
                ex.error = Some(e);
                break;
            }
        }
    }
    ex
}

async fn post(
    client: &reqwest::Client,
    ask: &Ask,
    request: &SyncRequest,
    ex: &mut Exchange,
) -> Result<SyncResponse, String> {
    let body = serde_json::to_vec(request).map_err(|e| format!("cannot encode request: {e}"))?;
    ex.bytes_sent += body.len() as u64;
    let mut builder = client
        .post(&ask.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(token) = &ask.token {
        builder = builder.bearer_auth(token);
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
/// the quotas in log order.
fn validate(reply: &SyncResponse) -> Result<(), String> {
    if let Some(c) = reply
        .counters
        .iter()
        .find(|c| !(c.level.is_finite() && c.level >= 0.0))
    {
        return Err(format!(
            "malformed reply: counter {} has level {}",
            c.id, c.level
        ));
    }
    if let Some((q, e)) = reply
        .quotas
        .iter()
        .find_map(|q| q.validate().err().map(|e| (q, e)))
    {
        return Err(format!("malformed reply: quota {:?}: {e}", q.name));
    }
    let in_order = reply
        .quotas
        .windows(2)
        .all(|w| (w[0].epoch, w[0].id) < (w[1].epoch, w[1].id));
    if !in_order {
        return Err("malformed reply: quotas out of (epoch, id) order".into());
    }
    Ok(())
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
    use crate::wire::CounterValue;

    fn reply(quotas: Vec<Quota>, counters: Vec<CounterValue>) -> SyncResponse {
        SyncResponse {
            root_instance: 1,
            root_time: 0,
            quotas,
            quotas_after: QuotaCursor::default(),
            more_quotas: false,
            counters,
            counter_version: 1,
        }
    }

    #[test]
    fn unacked_weight_is_taken_once() {
        let mut u = Unacked::default();
        u.add(&[CollectedDelta {
            slot: 3,
            id: 7,
            delta: 10,
        }]);
        u.add(&[CollectedDelta {
            slot: 3,
            id: 7,
            delta: 5,
        }]);
        assert_eq!(u.take(7, 12), Some((3, 12)));
        assert_eq!(u.take(7, 12), Some((3, 3)));
        assert_eq!(u.take(7, 12), None);
    }

    #[test]
    fn replies_with_bad_numbers_are_rejected_whole() {
        let bad_level = reply(
            vec![],
            vec![CounterValue {
                id: 1,
                level: -1.0,
                at: 0,
            }],
        );
        assert!(validate(&bad_level).is_err());
        let q = Quota {
            id: 1,
            name: "bad name".into(),
            parent: None,
            limit: 1.0,
            low_burst: 1.0,
            high_burst: 1.0,
            epoch: 1,
            deleted: false,
        };
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
            }],
        );
        assert!(validate(&good).is_ok());
    }
}
