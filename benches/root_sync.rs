//! Benchmark of the quota root (`cargo bench --bench root_sync`).
//!
//! Runs the real `sluice root` binary as a child process on an SQLite file
//! and drives it over loopback HTTP:
//!
//! 1. **Setup**: one `POST /v1/apply` of `QUOTAS` quotas, then a fresh root
//!    process on the same database (load time from the database).
//! 2. **Initial sync**: a fresh limiter pages through every quota, parsing
//!    each reply into the real wire types; then the root's RSS.
//! 3. **Paced sync**: `LIMITERS` limiters each send `DELTAS` changed
//!    counters once a second for `ROUNDS` seconds (the production shape:
//!    offered load `LIMITERS * DELTAS` updates/s). Counters come from a hot
//!    set of `2 * DELTAS` quotas that the limiters' windows overlap on, so
//!    every reply carries the counters the others changed.
//! 4. **Saturated sync**: the same limiters sync back to back for `SECONDS`.
//!
//! Throughput per core is counter updates divided by the root process's CPU
//! seconds (user + system, from `/proc`), so the client's own JSON work on
//! the same machine does not count against it. Latency is measured at the
//! client (request sent to reply parsed) and, from the root's histogram, on
//! the server.
//!
//! Sizes come from the environment: `QUOTAS` (1000000), `LIMITERS` (100),
//! `DELTAS` (10000), `ROUNDS` (10), `SECONDS` (10), `PAGE` (quotas per sync
//! page, 20000). Under `cargo test` (no `--bench` argument) it makes a
//! small smoke run instead.

use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
mod harness;

use std::time::{Duration, Instant};

use serde::Deserialize;
use sluice::wire::{QuotaCursor, SyncResponse};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Bench sizes.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    quotas: usize,
    limiters: usize,
    deltas: usize,
    rounds: usize,
    seconds: u64,
    page: usize,
}

impl Sizes {
    /// Tiny sizes for the run `cargo test` makes.
    fn smoke() -> Self {
        Self {
            quotas: 2_000,
            limiters: 4,
            deltas: 500,
            rounds: 1,
            seconds: 1,
            page: 500,
        }
    }

    fn from_env() -> Self {
        Self {
            quotas: harness::env_or("QUOTAS", 1_000_000) as usize,
            limiters: harness::env_or("LIMITERS", 100) as usize,
            deltas: harness::env_or("DELTAS", 10_000) as usize,
            rounds: harness::env_or("ROUNDS", 10) as usize,
            seconds: harness::env_or("SECONDS", 10),
            page: harness::env_or("PAGE", 20_000) as usize,
        }
    }
}

/// A `sluice root` child process.
struct RootProcess {
    child: Child,
    url: String,
}

impl RootProcess {
    fn start(dir: &std::path::Path, page: usize) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("root.toml");
        let mut text = String::new();
        writeln!(text, "listen = \"127.0.0.1:{port}\"").unwrap();
        writeln!(text, "db = \"sqlite://{}/bench.db\"", dir.display()).unwrap();
        writeln!(text, "max_apply_body = {}", 1usize << 30).unwrap();
        writeln!(text, "sync_page_quotas = {page}").unwrap();
        writeln!(text, "max_in_flight = 512").unwrap();
        std::fs::write(&config, text).unwrap();
        let child = Command::new(SLUICE)
            .arg("root")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sluice root");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn wait_ready(&self, http: &reqwest::Client) -> Duration {
        let started = Instant::now();
        loop {
            let reply = http.get(format!("{}/healthz", self.url)).send().await;
            if reply.is_ok_and(|r| r.status().is_success()) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "root not ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// User + system CPU seconds of the root so far.
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the parenthesised command name; utime and stime are
        // the 14th and 15th fields of the whole line.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        ticks / per_second
    }

    /// (VmRSS, VmHWM) in MiB.
    fn memory_mib(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| -> f64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<f64>()
                .unwrap()
                / 1024.0
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    fn stop(mut self) {
        // SAFETY: kill(2) on our own child with a valid signal.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "root exited with {status}");
    }
}

/// The parts of a sync reply a benchmark limiter keeps; counters are only
/// counted (their JSON is still scanned).
#[derive(Deserialize)]
struct Reply {
    root_instance: u64,
    quotas_after: QuotaCursor,
    counter_version: u64,
    counters: Vec<serde::de::IgnoredAny>,
}

/// A limiter with a fixed set of changed counters.
struct BenchLimiter {
    id: String,
    /// `"deltas":[...]` pre-serialised: the same counters every sync.
    deltas: String,
    after: QuotaCursor,
    version: u64,
    instance: u64,
}

impl BenchLimiter {
    fn new(index: usize, ids: impl Iterator<Item = u64>, after: QuotaCursor) -> Self {
        let mut deltas = String::from("\"deltas\":[");
        for (i, id) in ids.enumerate() {
            if i > 0 {
                deltas.push(',');
            }
            write!(deltas, "{{\"id\":{id},\"delta\":1}}").unwrap();
        }
        deltas.push(']');
        Self {
            id: format!("bench-{index}"),
            deltas,
            after,
            version: 0,
            instance: 0,
        }
    }

    fn body(&self) -> String {
        format!(
            "{{\"limiter\":\"{}\",\"quotas_after\":{{\"epoch\":{},\"id\":{}}},\"counter_version\":{},\"root_instance\":{},{}}}",
            self.id, self.after.epoch, self.after.id, self.version, self.instance, self.deltas
        )
    }

    /// One sync; returns the round trip and the number of counters received.
    async fn sync(&mut self, http: &reqwest::Client, url: &str) -> (Duration, usize) {
        let started = Instant::now();
        let response = http
            .post(format!("{url}/v1/sync"))
            .header("content-type", "application/json")
            .body(self.body())
            .send()
            .await
            .expect("sync sent");
        assert!(
            response.status().is_success(),
            "sync: {}",
            response.status()
        );
        let bytes = response.bytes().await.expect("sync reply");
        let reply: Reply = serde_json::from_slice(&bytes).expect("sync reply parses");
        let elapsed = started.elapsed();
        self.after = reply.quotas_after;
        self.version = reply.counter_version;
        self.instance = reply.root_instance;
        (elapsed, reply.counters.len())
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `(upper bound, cumulative count)` of the root's sync latency buckets.
async fn server_histogram(http: &reqwest::Client, url: &str) -> Vec<(f64, f64)> {
    let text = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("sluice_root_sync_duration_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.parse().ok()?))
        })
        .collect()
}

/// Upper bound of the bucket holding the p-th quantile of the syncs
/// between two histogram snapshots.
fn server_quantile(before: &[(f64, f64)], after: &[(f64, f64)], p: f64) -> f64 {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .zip(before)
        .map(|(&(le, a), &(_, b))| (le, a - b))
        .collect();
    let total = counts.last().map_or(0.0, |c| c.1);
    counts
        .iter()
        .find(|c| c.1 >= total * p)
        .map_or(f64::NAN, |c| c.0)
}

async fn populate(http: &reqwest::Client, url: &str, n: usize) -> Duration {
    let mut body = String::with_capacity(n * 40);
    body.push('[');
    for i in 0..n {
        if i > 0 {
            body.push(',');
        }
        write!(
            body,
            "{{\"name\":\"bench_{i:07}\",\"limit\":1000,\"low_burst\":1000,\"high_burst\":2000}}"
        )
        .unwrap();
    }
    body.push(']');
    let started = Instant::now();
    let response = http
        .post(format!("{url}/v1/apply"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("apply sent");
    let status = response.status();
    let text = response.text().await.unwrap();
    assert!(status.is_success(), "apply: {status} {text}");
    started.elapsed()
}

/// Pages through every quota as a fresh limiter, parsing each page.
async fn initial_sync(http: &reqwest::Client, url: &str) -> (Duration, usize, usize, QuotaCursor) {
    let started = Instant::now();
    let mut after = QuotaCursor::default();
    let (mut quotas, mut pages) = (0, 0);
    loop {
        let request = sluice::wire::SyncRequest {
            limiter: "fresh".into(),
            quotas_after: after,
            counter_version: 0,
            root_instance: 0,
            deltas: Vec::new(),
        };
        let response = http
            .post(format!("{url}/v1/sync"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&request).unwrap())
            .send()
            .await
            .unwrap();
        let bytes = response.bytes().await.unwrap();
        let reply: SyncResponse = serde_json::from_slice(&bytes).expect("sync reply parses");
        quotas += reply.quotas.len();
        pages += 1;
        after = reply.quotas_after;
        if !reply.more_quotas {
            return (started.elapsed(), quotas, pages, after);
        }
    }
}

/// The limiters, each with a window of `deltas` ids in a hot set of
/// `2 * deltas` quotas (ids 1..).
fn limiters(sizes: &Sizes, after: QuotaCursor) -> Vec<BenchLimiter> {
    let hot = (2 * sizes.deltas).min(sizes.quotas) as u64;
    (0..sizes.limiters)
        .map(|i| {
            let start = (i as u64 * hot / sizes.limiters as u64) % hot;
            let ids = (0..sizes.deltas as u64).map(move |k| 1 + (start + k) % hot);
            BenchLimiter::new(i, ids, after)
        })
        .collect()
}

struct PhaseResult {
    updates: u64,
    wall: Duration,
    cpu: f64,
    latencies: Vec<Duration>,
    counters_received: usize,
    server_p50: f64,
    server_p99: f64,
}

/// Runs the limiters for `rounds` rounds (paced one sync per second each,
/// start times spread over the second) or back to back for `seconds`.
async fn drive(
    root: &RootProcess,
    http: &reqwest::Client,
    limiters: Vec<BenchLimiter>,
    paced_rounds: Option<usize>,
    seconds: u64,
    deltas: usize,
) -> (PhaseResult, Vec<BenchLimiter>) {
    let before = server_histogram(http, &root.url).await;
    let cpu_before = root.cpu_seconds();
    let started = Instant::now();
    let n = limiters.len();
    let tasks: Vec<_> = limiters
        .into_iter()
        .enumerate()
        .map(|(i, mut limiter)| {
            let (http, url) = (http.clone(), root.url.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut counters = 0;
                match paced_rounds {
                    Some(rounds) => {
                        let offset = Duration::from_secs(1) * i as u32 / n as u32;
                        let start = tokio::time::Instant::now() + offset;
                        let mut ticks = tokio::time::interval_at(start, Duration::from_secs(1));
                        for _ in 0..rounds {
                            ticks.tick().await;
                            let (rtt, got) = limiter.sync(&http, &url).await;
                            latencies.push(rtt);
                            counters += got;
                        }
                    }
                    None => {
                        let end = Instant::now() + Duration::from_secs(seconds);
                        while Instant::now() < end {
                            let (rtt, got) = limiter.sync(&http, &url).await;
                            latencies.push(rtt);
                            counters += got;
                        }
                    }
                }
                (limiter, latencies, counters)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut back = Vec::new();
    let mut counters_received = 0;
    for task in tasks {
        let (limiter, latencies, counters) = task.await.unwrap();
        back.push(limiter);
        all.extend(latencies);
        counters_received += counters;
    }
    let wall = started.elapsed();
    let cpu = root.cpu_seconds() - cpu_before;
    let after = server_histogram(http, &root.url).await;
    all.sort();
    let result = PhaseResult {
        updates: (all.len() * deltas) as u64,
        wall,
        cpu,
        counters_received,
        server_p50: server_quantile(&before, &after, 0.5),
        server_p99: server_quantile(&before, &after, 0.99),
        latencies: all,
    };
    (result, back)
}

fn report(name: &str, r: &PhaseResult) {
    let syncs = r.latencies.len();
    println!("{name}:");
    println!(
        "  {syncs} syncs, {} counter updates in {:.2} s wall: {:.0} updates/s",
        r.updates,
        r.wall.as_secs_f64(),
        r.updates as f64 / r.wall.as_secs_f64()
    );
    println!(
        "  root CPU {:.2} s ({:.2} cores busy): {:.0} updates per CPU-second",
        r.cpu,
        r.cpu / r.wall.as_secs_f64(),
        r.updates as f64 / r.cpu
    );
    println!(
        "  client round trip p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(percentile(&r.latencies, 0.5)),
        ms(percentile(&r.latencies, 0.99)),
        ms(percentile(&r.latencies, 1.0))
    );
    println!(
        "  root handling time (histogram bucket bound) p50 <= {} s, p99 <= {} s",
        r.server_p50, r.server_p99
    );
    println!(
        "  counters received per sync: {:.0}",
        r.counters_received as f64 / syncs as f64
    );
}

async fn bench(sizes: Sizes) {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1200))
        .pool_max_idle_per_host(sizes.limiters + 8)
        .build()
        .unwrap();
    println!("root_sync benchmark: {sizes:?}");
    println!(
        "machine: {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let setup = RootProcess::start(dir.path(), sizes.page);
    setup.wait_ready(&http).await;
    let applied = populate(&http, &setup.url, sizes.quotas).await;
    println!(
        "setup: apply of {} quotas in one transaction: {:.1} s",
        sizes.quotas,
        applied.as_secs_f64()
    );
    setup.stop();

    let root = RootProcess::start(dir.path(), sizes.page);
    let loaded = root.wait_ready(&http).await;
    println!(
        "fresh root loaded {} quotas from SQLite in {:.2} s",
        sizes.quotas,
        loaded.as_secs_f64()
    );
    let (elapsed, quotas, pages, after) = initial_sync(&http, &root.url).await;
    assert_eq!(quotas, sizes.quotas);
    println!(
        "initial sync: {quotas} quotas in {pages} pages of <= {} in {:.2} s (client parses every page)",
        sizes.page,
        elapsed.as_secs_f64()
    );
    let (rss, peak) = root.memory_mib();
    println!(
        "root memory with {} quotas: RSS {rss:.0} MiB, peak {peak:.0} MiB",
        sizes.quotas
    );

    let bench_limiters = limiters(&sizes, after);
    // Warm-up round: connections, counters created.
    let (_, bench_limiters) = drive(&root, &http, bench_limiters, Some(1), 0, sizes.deltas).await;
    let (paced, bench_limiters) = drive(
        &root,
        &http,
        bench_limiters,
        Some(sizes.rounds),
        0,
        sizes.deltas,
    )
    .await;
    report(
        &format!(
            "paced: {} limiters x {} changed counters, one sync per second each",
            sizes.limiters, sizes.deltas
        ),
        &paced,
    );
    let (saturated, _) = drive(
        &root,
        &http,
        bench_limiters,
        None,
        sizes.seconds,
        sizes.deltas,
    )
    .await;
    report(
        &format!(
            "saturated: {} limiters syncing back to back",
            sizes.limiters
        ),
        &saturated,
    );
    let (rss, peak) = root.memory_mib();
    println!("root memory at the end: RSS {rss:.0} MiB, peak {peak:.0} MiB");
    root.stop();
}

fn main() {
    let Some(full) = harness::full_run("root_sync") else {
        return;
    };
    let sizes = if full {
        Sizes::from_env()
    } else {
        Sizes::smoke()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(sizes));
}
