//! Connection exhaustion and slow or large bodies against a real `sluice
//! root` (`cargo bench --bench root_admission`): do `/healthz`,
//! `/metrics` and `/v1/sync` stay fast while one address holds thousands
//! of connections open, or one sync token holder trickles bodies; and how
//! much memory does the root take while 8 of the largest sync bodies
//! arrive?
//!
//! Runs the `sluice root` binary as a child process (SQLite, admin and
//! sync tokens, the default connection settings) and, from this process,
//! on loopback:
//!
//! - an **attacker** on 127.0.0.1 that keeps its connections open: it
//!   reopens every connection the root closes, at most `RECONNECT_RATE`
//!   connects a second in all (the bound on the load this tool makes).
//!   In phase *idle* its `CONNECTIONS` connections send nothing; in phase
//!   *trickle* (slowloris) each sends the start of a request head and then
//!   one byte a second. The *slow body* phases are issue 22's attacks by
//!   one holder of the sync token: `SLOW_LARGE` (12) connections send
//!   `POST /v1/sync` with the token and `Content-Length: 67000000`,
//!   `SLOW_SMALL` (260) the same with `Content-Length: 1000`, each then one
//!   body byte a second; one phase each, then both at once;
//! - **probes**, also from 127.0.0.1 (the attacker's own address, the
//!   hardest case), `PROBE_RATE` a second each for `SECONDS`: `GET
//!   /healthz` and `GET /metrics` on a new connection each time (as a load
//!   balancer and Prometheus do), `POST /v1/sync` with the sync token on
//!   one kept-alive connection (as a limiter syncs), and `POST /v1/sync` on
//!   a new connection each time (a limiter that just (re)started).
//!
//! Each phase first opens the attacker's connections (at the reconnect
//! rate), then probes; it reports client-side latency percentiles and
//! errors, the connects the attacker made, what the root closed and why
//! (from its `/metrics`), the body memory it held, its CPU use and
//! memory. A phase *none* without an attacker is the baseline.
//!
//! Then the **memory** phases, each on a fresh root (its peak RSS,
//! `VmHWM`, is the phase's): 8 clients send a 64 MiB sync body (the
//! largest a root takes) at once, `MEMORY_ROUNDS` (3) times each: the
//! issue's binary body (33 million 2-byte deltas, which used to make the
//! root reserve a gigabyte per body), and a JSON body of 2 million delta
//! objects (the most a JSON body may hold before the root refuses it
//! unread) padded to 64 MiB. The target: peak RSS under twice
//! `max_body_memory` (512 MiB).
//!
//! The process needs more than `CONNECTIONS` open files: it raises its
//! soft `RLIMIT_NOFILE` to the hard limit itself (and so does the root).
//! Sizes come from the environment: `CONNECTIONS` (10000), `SECONDS` (20),
//! `RECONNECT_RATE` (1000), `PROBE_RATE` (20), `SLOW_LARGE` (12),
//! `SLOW_SMALL` (260), `MEMORY_ROUNDS` (3); `ROOT_MAX_CONNECTIONS` and
//! `ROOT_PER_ADDRESS` set the root's `max_connections` and
//! `max_connections_per_address` (its defaults, 1024 and 256, when unset),
//! so a run can also make the root hold every attacking connection;
//! `PHASES` (`connections,slow,memory`) picks the groups of phases. Under
//! `cargo test` it makes a small smoke run.

mod harness;
#[path = "../tests/wire_support/mod.rs"]
mod wire_support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::measure::{ms, percentile};
use harness::root::RootProcess;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use wire_support::tiny_deltas;

const ADMIN_TOKEN: &str = "bench-admin";
const SYNC_TOKEN: &str = "bench-sync";

/// Bench sizes.
#[derive(Clone, Debug)]
struct Sizes {
    connections: usize,
    seconds: u64,
    reconnect_rate: u64,
    probe_rate: u64,
    slow_large: usize,
    slow_small: usize,
    memory_rounds: usize,
    /// Size of the memory phases' bodies.
    memory_body: usize,
    phases: String,
}

impl Sizes {
    fn smoke() -> Self {
        Self {
            connections: 300,
            seconds: 1,
            reconnect_rate: 1000,
            probe_rate: 20,
            slow_large: 2,
            slow_small: 20,
            memory_rounds: 1,
            memory_body: 1 << 20,
            phases: "connections,slow,memory".into(),
        }
    }

    fn from_env() -> Self {
        Self {
            connections: harness::env_or("CONNECTIONS", 10_000) as usize,
            seconds: harness::env_or("SECONDS", 20),
            reconnect_rate: harness::env_or("RECONNECT_RATE", 1000).max(1),
            probe_rate: harness::env_or("PROBE_RATE", 20).max(1),
            slow_large: harness::env_or("SLOW_LARGE", 12) as usize,
            slow_small: harness::env_or("SLOW_SMALL", 260) as usize,
            memory_rounds: harness::env_or("MEMORY_ROUNDS", 3) as usize,
            memory_body: MAX_SYNC_BODY,
            phases: std::env::var("PHASES").unwrap_or_else(|_| "connections,slow,memory".into()),
        }
    }

    fn runs(&self, group: &str) -> bool {
        self.phases.split(',').any(|p| p.trim() == group)
    }
}

/// The root's default `max_sync_body`: 64 MiB.
const MAX_SYNC_BODY: usize = 64 << 20;

/// The `Content-Length` of issue 22's large slow bodies.
const SLOW_LARGE_LENGTH: usize = 67_000_000;
/// ... and of its small ones.
const SLOW_SMALL_LENGTH: usize = 1000;

/// What the attacker's connections do once open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attack {
    None,
    Idle,
    Trickle,
    /// Syncs with the token, `large` of them declaring 67,000,000 bytes and
    /// `small` 1,000, each body trickling one byte a second.
    SlowBodies {
        large: usize,
        small: usize,
    },
}

impl Attack {
    fn label(self) -> String {
        match self {
            Attack::None => "none".into(),
            Attack::Idle => "idle".into(),
            Attack::Trickle => "trickle (1 byte/s)".into(),
            Attack::SlowBodies { large, small } => {
                let mut parts = Vec::new();
                if large > 0 {
                    parts.push(format!("{large} x 67,000,000 B"));
                }
                if small > 0 {
                    parts.push(format!("{small} x 1,000 B"));
                }
                format!("slow sync bodies ({}, 1 byte/s)", parts.join(" + "))
            }
        }
    }

    /// The attacker's connections.
    fn connections(self, sizes: &Sizes) -> usize {
        match self {
            Attack::None => 0,
            Attack::Idle | Attack::Trickle => sizes.connections,
            Attack::SlowBodies { large, small } => large + small,
        }
    }
}

/// Raises the soft open-file limit to the hard one; returns it.
fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write only `limit`.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    limit.rlim_cur
}

/// The `sluice root` child process with its tokens.
struct Root {
    process: RootProcess,
    url: String,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Root {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let admin = dir.path().join("admin.token");
        let sync = dir.path().join("sync.token");
        std::fs::write(&admin, ADMIN_TOKEN).unwrap();
        std::fs::write(&sync, SYNC_TOKEN).unwrap();
        let mut settings = String::new();
        writeln!(settings, "admin_token_file = \"{}\"", admin.display()).unwrap();
        writeln!(settings, "sync_token_file = \"{}\"", sync.display()).unwrap();
        for (key, var) in [
            ("max_connections", "ROOT_MAX_CONNECTIONS"),
            ("max_connections_per_address", "ROOT_PER_ADDRESS"),
        ] {
            if let Ok(value) = std::env::var(var) {
                writeln!(settings, "{key} = {value}").unwrap();
            }
        }
        let process = RootProcess::start(dir.path(), &settings);
        process.wait_ready(&fresh_client()).await;
        Self {
            url: process.url.clone(),
            addr: format!("127.0.0.1:{}", process.port).parse().unwrap(),
            process,
            _dir: dir,
        }
    }

    /// One sample of the root's `/metrics` (0 when absent).
    async fn metric(&self, series: &str) -> f64 {
        metric_at(&self.url, series).await
    }

    fn stop(self) {
        self.process.stop();
    }
}

/// A client that opens a new connection for every request.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A client that keeps its connection between requests.
fn kept_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// What the attacker did.
#[derive(Debug, Default)]
struct AttackStats {
    connects: AtomicU64,
    connect_errors: AtomicU64,
    open: AtomicU64,
}

/// One attacker connection slot (the `slot`-th): connect (when the shared
/// rate allows), hold the connection as `attack` says until the root
/// closes it, repeat.
async fn attacker(
    addr: SocketAddr,
    attack: Attack,
    slot: usize,
    permits: Arc<Semaphore>,
    stats: Arc<AttackStats>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        tokio::select! {
            permit = permits.acquire() => permit.unwrap().forget(),
            _ = stop.changed() => return,
        }
        let connect = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr));
        let mut stream = match connect.await {
            Ok(Ok(stream)) => stream,
            _ => {
                stats.connect_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        stats.connects.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        tokio::select! {
            _ = hold(&mut stream, attack, slot) => {}
            _ = stop.changed() => {}
        }
        stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Holds an attacker connection until the root closes it.
async fn hold(stream: &mut TcpStream, attack: Attack, slot: usize) {
    let mut buf = [0u8; 256];
    let start = match attack {
        Attack::None | Attack::Idle => None,
        Attack::Trickle => Some(b"POST /v1/sync HTTP/1.1\r\nHost: root\r\nX-Pad: ".to_vec()),
        Attack::SlowBodies { large, .. } => {
            let length = if slot < large {
                SLOW_LARGE_LENGTH
            } else {
                SLOW_SMALL_LENGTH
            };
            Some(
                format!(
                    "POST /v1/sync HTTP/1.1\r\nHost: root\r\nAuthorization: Bearer {SYNC_TOKEN}\r\n\
                     Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
                )
                .into_bytes(),
            )
        }
    };
    let trickles = start.is_some();
    if let Some(start) = start {
        if stream.write_all(&start).await.is_err() {
            return;
        }
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            read = stream.read(&mut buf) => {
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
            }
            _ = tick.tick(), if trickles => {
                if stream.write_all(b" ").await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Hands out `rate` connect permits a second, in 10 ms steps, holding at
/// most one second's worth.
async fn refill(permits: Arc<Semaphore>, rate: u64, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let per_tick = rate as f64 / 100.0;
    let mut owed = 0.0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        owed += per_tick;
        let whole = owed.floor();
        owed -= whole;
        let room = (rate as usize).saturating_sub(permits.available_permits());
        permits.add_permits((whole as usize).min(room));
    }
}

/// Latencies and errors of one kind of probe.
#[derive(Debug, Default)]
struct Samples {
    latencies: Vec<Duration>,
    errors: usize,
}

impl Samples {
    fn record(&mut self, started: Instant, ok: bool) {
        if ok {
            self.latencies.push(started.elapsed());
        } else {
            self.errors += 1;
        }
    }
}

/// The sync request of a limiter that knows the root's state.
fn sync_body(limiter: &str, cursor: &Value) -> Value {
    json!({
        "limiter": limiter,
        "quotas_after": cursor["quotas_after"],
        "counter_version": cursor["counter_version"],
        "root_instance": cursor["root_instance"],
        "deltas": [{"id": 1, "delta": 1}],
    })
}

/// Sends one sync; returns the reply's cursor fields on success.
async fn sync_once(http: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let reply = http
        .post(format!("{url}/v1/sync"))
        .bearer_auth(SYNC_TOKEN)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .ok()?;
    if !reply.status().is_success() {
        return None;
    }
    serde_json::from_slice(&reply.bytes().await.ok()?).ok()
}

/// Runs the four probes for `seconds`, each `rate` times a second.
async fn probe(root: &Root, seconds: u64, rate: u64) -> [Samples; 4] {
    let every = Duration::from_secs_f64(1.0 / rate as f64);
    let rounds = seconds * rate;
    let url = root.url.clone();
    let get = |path: &'static str| {
        let url = url.clone();
        tokio::spawn(async move {
            let http = fresh_client();
            let mut samples = Samples::default();
            let mut tick = tokio::time::interval(every);
            for _ in 0..rounds {
                tick.tick().await;
                let started = Instant::now();
                let reply = match http.get(format!("{url}{path}")).send().await {
                    Ok(reply) if reply.status().is_success() => reply.bytes().await.ok(),
                    _ => None,
                };
                samples.record(started, reply.is_some());
            }
            samples
        })
    };
    let health = get("/healthz");
    let metrics = get("/metrics");
    let sync = |http: reqwest::Client, limiter: &'static str| {
        let url = url.clone();
        tokio::spawn(async move {
            let mut cursor = json!({
                "quotas_after": {"epoch": 0, "id": 0},
                "counter_version": 0,
                "root_instance": 0,
            });
            let mut samples = Samples::default();
            let mut tick = tokio::time::interval(every);
            for _ in 0..rounds {
                tick.tick().await;
                let started = Instant::now();
                let reply = sync_once(&http, &url, &sync_body(limiter, &cursor)).await;
                samples.record(started, reply.is_some());
                if let Some(reply) = reply {
                    cursor = reply;
                }
            }
            samples
        })
    };
    let kept = sync(kept_client(), "bench-kept");
    let fresh = sync(fresh_client(), "bench-fresh");
    [
        health.await.unwrap(),
        metrics.await.unwrap(),
        kept.await.unwrap(),
        fresh.await.unwrap(),
    ]
}

/// Closed-connection counters of the root, by reason.
const CLOSED: [&str; 5] = [
    "header_timeout",
    "idle_timeout",
    "send_timeout",
    "shed_per_address",
    "shed_full",
];

async fn closed_counts(root: &Root) -> Vec<f64> {
    let mut counts = Vec::new();
    for reason in CLOSED {
        let series = format!("sluice_root_connections_closed_total{{reason=\"{reason}\"}}");
        counts.push(root.metric(&series).await);
    }
    counts.push(
        root.metric("sluice_root_connections_refused_total{reason=\"per_address\"}")
            .await
            + root
                .metric("sluice_root_connections_refused_total{reason=\"full\"}")
                .await,
    );
    counts
}

/// One phase: ramp the attack up, probe, report.
async fn phase(root: &Root, attack: Attack, sizes: &Sizes, out: &mut String) {
    let (stop_tx, stop) = watch::channel(false);
    let stats = Arc::new(AttackStats::default());
    let permits = Arc::new(Semaphore::new(0));
    let mut tasks = Vec::new();
    if attack != Attack::None {
        tasks.push(tokio::spawn(refill(
            Arc::clone(&permits),
            sizes.reconnect_rate,
            stop.clone(),
        )));
        for slot in 0..attack.connections(sizes) {
            tasks.push(tokio::spawn(attacker(
                root.addr,
                attack,
                slot,
                Arc::clone(&permits),
                Arc::clone(&stats),
                stop.clone(),
            )));
        }
        // Ramp: every slot has connected once.
        let ramp = Instant::now();
        while (stats.connects.load(Ordering::Relaxed) as usize) < attack.connections(sizes) {
            assert!(ramp.elapsed() < Duration::from_secs(600), "ramp stuck");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let closed_before = closed_counts(root).await;
    let cut_before = root.metric(BODY_CUT).await;
    let connects_before = stats.connects.load(Ordering::Relaxed);
    let cpu_before = root.process.cpu_seconds();
    let started = Instant::now();
    // The body memory held, sampled while the probes run.
    let memory = {
        let url = root.url.clone();
        let seconds = sizes.seconds;
        tokio::spawn(async move {
            let mut most: f64 = 0.0;
            for _ in 0..seconds.max(1) {
                most = most.max(metric_at(&url, "sluice_root_body_memory_bytes").await);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            most
        })
    };
    let samples = probe(root, sizes.seconds, sizes.probe_rate).await;
    let body_memory = memory.await.unwrap();
    let cut = root.metric(BODY_CUT).await - cut_before;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (root.process.cpu_seconds() - cpu_before) / elapsed;
    let connects = (stats.connects.load(Ordering::Relaxed) - connects_before) as f64 / elapsed;
    let held = root.metric("sluice_root_connections").await;
    let closed_after = closed_counts(root).await;
    let (rss, _) = root.process.memory_mib();
    let open_at_client = stats.open.load(Ordering::Relaxed);
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    let names = [
        "`GET /healthz`, new connection",
        "`GET /metrics`, new connection",
        "`POST /v1/sync`, kept-alive",
        "`POST /v1/sync`, new connection",
    ];
    for (name, s) in names.iter().zip(samples) {
        let mut sorted = s.latencies;
        sorted.sort();
        writeln!(
            out,
            "| {} | {name} | {} | {:.2} | {:.2} | {:.2} | {} |",
            attack.label(),
            sorted.len(),
            ms(percentile(&sorted, 0.5)),
            ms(percentile(&sorted, 0.99)),
            ms(sorted.last().copied().unwrap_or_default()),
            s.errors
        )
        .unwrap();
    }
    let closed: Vec<String> = CLOSED
        .iter()
        .chain(std::iter::once(&"refused"))
        .zip(closed_after.iter().zip(&closed_before))
        .filter(|(_, (a, b))| *a > *b)
        .map(|(name, (a, b))| format!("{name} {:.0}/s", (a - b) / elapsed))
        .collect();
    let cut = if cut > 0.0 {
        format!(", bodies cut (408) {:.1}/s", cut / elapsed)
    } else {
        String::new()
    };
    writeln!(
        out,
        "|  | attacker: {connects:.0} connects/s, {} open at the client; root: {held:.0} \
         connections held, closed {}{cut}; body memory at most {:.0} KiB; CPU {:.0}%, \
         RSS {rss:.1} MiB | | | | | |",
        open_at_client,
        if closed.is_empty() {
            "none".to_string()
        } else {
            closed.join(", ")
        },
        body_memory / 1024.0,
        cpu * 100.0
    )
    .unwrap();
}

/// Sync bodies cut for arriving too slowly.
const BODY_CUT: &str = "sluice_root_rejected_requests_total{api=\"sync\",reason=\"body_timeout\"}";

/// One sample of the `/metrics` of the root at `url` (0 when absent).
async fn metric_at(url: &str, series: &str) -> f64 {
    let Ok(reply) = fresh_client().get(format!("{url}/metrics")).send().await else {
        return 0.0;
    };
    let text = reply.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

async fn bench(sizes: Sizes) {
    let files = raise_open_files();
    assert!(
        files as usize > sizes.connections + 256,
        "{} connections need a higher open-file limit than {files}",
        sizes.connections
    );
    let mut out = String::new();
    let mut attacks = Vec::new();
    if sizes.runs("connections") {
        attacks.extend([Attack::None, Attack::Idle, Attack::Trickle]);
    }
    if sizes.runs("slow") {
        if attacks.is_empty() {
            attacks.push(Attack::None);
        }
        let (large, small) = (sizes.slow_large, sizes.slow_small);
        attacks.extend([
            Attack::SlowBodies { large, small: 0 },
            Attack::SlowBodies { large: 0, small },
            Attack::SlowBodies { large, small },
        ]);
    }
    if !attacks.is_empty() {
        let root = Root::start().await;
        // A few quotas, so syncs carry some.
        let http = fresh_client();
        for i in 0..20 {
            let reply = http
                .put(format!("{}/v1/quotas/bench_{i}", root.url))
                .bearer_auth(ADMIN_TOKEN)
                .header("content-type", "application/json")
                .body(json!({"limit": 100, "high_burst": 200}).to_string())
                .send()
                .await
                .unwrap();
            assert!(reply.status().is_success());
        }
        writeln!(
            out,
            "# connections={} seconds={} reconnect_rate={}/s probe_rate={}/s (each probe) \
             root max_connections={} max_connections_per_address={}",
            sizes.connections,
            sizes.seconds,
            sizes.reconnect_rate,
            sizes.probe_rate,
            std::env::var("ROOT_MAX_CONNECTIONS").unwrap_or_else(|_| "1024".into()),
            std::env::var("ROOT_PER_ADDRESS").unwrap_or_else(|_| "256".into()),
        )
        .unwrap();
        out.push_str("| attack | probe | n | p50 ms | p99 ms | max ms | errors |\n");
        out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
        for attack in attacks {
            phase(&root, attack, &sizes, &mut out).await;
        }
        root.stop();
    }
    if sizes.runs("memory") {
        writeln!(
            out,
            "\n# 8 clients at once, {} rounds each, {} MiB bodies; max_body_memory 512 MiB",
            sizes.memory_rounds,
            sizes.memory_body >> 20
        )
        .unwrap();
        out.push_str(
            "| body | replies | root RSS before | peak RSS (VmHWM) | peak / max_body_memory |\n",
        );
        out.push_str("|---|---|---:|---:|---:|\n");
        for body in [MemoryBody::TinyDeltas, MemoryBody::JsonObjects] {
            memory_phase(body, &sizes, &mut out).await;
        }
    }
    print!("{out}");
}

/// The bodies of the memory phases.
#[derive(Clone, Copy, Debug)]
enum MemoryBody {
    /// Binary: one run announcing as many 2-byte deltas as fill the body
    /// (the issue's: 32 bytes reserved for every 2 before it was bounded).
    TinyDeltas,
    /// JSON: 2,000,000 delta objects (the most objects a JSON sync body may
    /// hold before the root refuses it unread: twice the entry cap), padded
    /// with spaces.
    JsonObjects,
}

impl MemoryBody {
    fn label(self) -> &'static str {
        match self {
            Self::TinyDeltas => "binary, one run of 2-byte deltas filling the body",
            Self::JsonObjects => "JSON, 2,000,000 delta objects, padded",
        }
    }

    /// The body (`size` bytes) and its content type.
    fn build(self, size: usize) -> (Vec<u8>, &'static str) {
        match self {
            Self::TinyDeltas => {
                // 16 bytes around the deltas, with a count of 4 bytes or
                // fewer: padded to the size with spaces the root never
                // reads (it stops at the count).
                let mut body = tiny_deltas(((size - 18) / 2) as u64);
                body.resize(size, b' ');
                (body, "application/x-sluice-sync")
            }
            Self::JsonObjects => {
                let objects = (2_000_000).min(size / 24);
                let mut body = b"{\"limiter\":\"h\",\"deltas\":[".to_vec();
                for i in 0..objects {
                    if i > 0 {
                        body.push(b',');
                    }
                    body.extend_from_slice(b"{\"id\":1,\"delta\":1}");
                }
                body.extend_from_slice(b"]}");
                body.resize(size, b' ');
                (body, "application/json")
            }
        }
    }
}

/// 8 clients send `body` at once, `sizes.memory_rounds` times each, to a
/// fresh root; reports the replies and the root's peak RSS.
async fn memory_phase(kind: MemoryBody, sizes: &Sizes, out: &mut String) {
    let root = Root::start().await;
    let (before, _) = root.process.memory_mib();
    let (body, content_type) = kind.build(sizes.memory_body);
    // Shared by the clients without a copy each.
    let body = axum::body::Bytes::from(body);
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (url, body) = (root.url.clone(), body.clone());
        let rounds = sizes.memory_rounds;
        clients.push(tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap();
            let mut statuses = Vec::new();
            for _ in 0..rounds {
                let reply = http
                    .post(format!("{url}/v1/sync"))
                    .bearer_auth(SYNC_TOKEN)
                    .header("content-type", content_type)
                    .body(body.clone())
                    .send()
                    .await;
                statuses.push(reply.map_or(0, |r| r.status().as_u16()));
            }
            statuses
        }));
    }
    let mut counts = std::collections::BTreeMap::new();
    for client in clients {
        for status in client.await.unwrap() {
            *counts.entry(status).or_insert(0) += 1;
        }
    }
    let (_, peak) = root.process.memory_mib();
    root.stop();
    let replies: Vec<String> = counts.iter().map(|(s, n)| format!("{n} x {s}")).collect();
    writeln!(
        out,
        "| {} | {} | {before:.1} MiB | {peak:.1} MiB | {:.2} |",
        kind.label(),
        replies.join(", "),
        peak / 512.0
    )
    .unwrap();
}

fn main() {
    if let Some(sizes) = harness::sizes("root_admission", Sizes::smoke, Sizes::from_env) {
        harness::block_on(bench(sizes));
    }
}
