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
//! 5. **Keyed**: the same, with keys of one per-key template instead of
//!    quotas (each limiter `DELTAS` key hashes in a hot set of `2 *
//!    DELTAS`), back to back for `SECONDS`; then `KEYS` (1000000) distinct
//!    keys sent once, and the root's RSS growth per key.
//!
//! 6. **Cores**: the saturated run again with the root pinned to 1 CPU and
//!    then to 2 CPUs (`taskset -a -p` on the running root, every thread),
//!    reporting updates per wall second for both and their ratio. The
//!    load generator shares the machine, so here it is light: the request
//!    bodies are encoded once per limiter (only the version numbers are
//!    spliced in), connections are reused, and the reply is not parsed
//!    (its `counter_version`, the last field, is read from the end of the
//!    bytes). The client's own CPU seconds are reported beside the root's.
//!    Skipped when `taskset` is missing or fewer than 2 CPUs are online.
//!
//! Throughput per core is counter updates divided by the root process's CPU
//! seconds (user + system, from `/proc`), so the client's own JSON work on
//! the same machine does not count against it. Latency is measured at the
//! client (request sent to reply parsed) and, from the root's histogram, on
//! the server.
//!
//! Sizes come from the environment: `QUOTAS` (1000000), `LIMITERS` (100),
//! `DELTAS` (10000), `ROUNDS` (10), `SECONDS` (10), `KEYS` (1000000), `PAGE` (quotas per sync
//! page, 20000). Under `cargo test` (no `--bench` argument) it makes a
//! small smoke run instead.

use std::fmt::Write as _;
mod harness;

use std::time::{Duration, Instant};

use serde::Deserialize;
use sluice::wire::{QuotaCursor, SyncResponse};

/// Bench sizes.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    quotas: usize,
    limiters: usize,
    deltas: usize,
    rounds: usize,
    seconds: u64,
    page: usize,
    keys: u64,
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
            keys: 20_000,
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
            keys: harness::env_or("KEYS", 1_000_000),
        }
    }
}

/// A root for this bench: large apply bodies, `page` quotas per sync page.
fn start_root(dir: &std::path::Path, page: usize) -> RootProcess {
    let settings = format!(
        "max_apply_body = {}\nsync_page_quotas = {page}\nmax_in_flight = 512\n",
        1usize << 30
    );
    RootProcess::start(dir, &settings)
}

/// The parts of a sync reply a benchmark limiter keeps; counters are only
/// counted (their JSON is still scanned).
#[derive(Deserialize)]
struct Reply {
    root_instance: u64,
    quotas_after: QuotaCursor,
    counter_version: u64,
    counters: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    keyed: Vec<KeyedReply>,
}

#[derive(Deserialize)]
struct KeyedReply {
    values: Vec<serde::de::IgnoredAny>,
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
    /// A limiter sending `keys` (hashes) of per-key template `template`.
    fn keyed(
        index: usize,
        template: u64,
        keys: impl Iterator<Item = u64>,
        after: QuotaCursor,
    ) -> Self {
        let mut deltas = format!("\"deltas\":[],\"keyed\":[{{\"id\":{template},\"deltas\":[");
        for (i, key) in keys.enumerate() {
            if i > 0 {
                deltas.push(',');
            }
            write!(deltas, "[{key},1]").unwrap();
        }
        deltas.push_str("]}]");
        Self {
            id: format!("keyed-{index}"),
            deltas,
            after,
            version: 0,
            instance: 0,
        }
    }

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

    /// The reply's `counter_version` and `root_instance` without parsing
    /// the rest: the version is the reply's last field and the instance
    /// its first (the order of [`SyncResponse`]'s fields).
    fn skim(&mut self, bytes: &[u8]) {
        let number_after = |key: &[u8], from_end: bool| -> u64 {
            let at = if from_end {
                bytes.windows(key.len()).rposition(|w| w == key)
            } else {
                bytes.windows(key.len()).position(|w| w == key)
            }
            .expect("field in the reply");
            bytes[at + key.len()..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0, |n, &b| n * 10 + u64::from(b - b'0'))
        };
        self.instance = number_after(b"\"root_instance\":", false);
        self.version = number_after(b"\"counter_version\":", true);
    }

    /// One sync with a light client: the body built by copying, the reply
    /// skimmed (see [`Self::skim`]); returns the round trip.
    async fn sync_light(&mut self, http: &reqwest::Client, url: &str) -> (Duration, usize) {
        let started = Instant::now();
        let bytes = self.post(http, url).await;
        self.skim(bytes.as_ref());
        (started.elapsed(), 0)
    }

    /// Posts this limiter's sync body to `url` (the sync endpoint) and
    /// returns the reply's bytes; a failed sync ends the bench.
    async fn post(&self, http: &reqwest::Client, url: &str) -> impl AsRef<[u8]> {
        let response = http
            .post(url)
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
        response.bytes().await.expect("sync reply")
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
        let bytes = self.post(http, &format!("{url}/v1/sync")).await;
        let reply: Reply = serde_json::from_slice(bytes.as_ref()).expect("sync reply parses");
        let elapsed = started.elapsed();
        self.after = reply.quotas_after;
        self.version = reply.counter_version;
        self.instance = reply.root_instance;
        let keyed: usize = reply.keyed.iter().map(|k| k.values.len()).sum();
        (elapsed, reply.counters.len() + keyed)
    }
}

use harness::measure::{ms, percentile};
use harness::root::RootProcess;

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
    body.push_str(
        ",{\"name\":\"bench_keyed\",\"limit\":1000,\"low_burst\":1000,\"high_burst\":2000,\
         \"per_key\":true}]",
    );
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
            keyed: Vec::new(),
            rejected: Vec::new(),
            limiter: "fresh".into(),
            quotas_after: after,
            counter_version: 0,
            root_instance: 0,
            deltas: Vec::new(),
            ..Default::default()
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
    drive_with(root, http, limiters, paced_rounds, seconds, deltas, false).await
}

/// [`drive`], with the light client ([`BenchLimiter::sync_light`]) when
/// `light`.
async fn drive_with(
    root: &RootProcess,
    http: &reqwest::Client,
    limiters: Vec<BenchLimiter>,
    paced_rounds: Option<usize>,
    seconds: u64,
    deltas: usize,
    light: bool,
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
                    None if light => {
                        let end = Instant::now() + Duration::from_secs(seconds);
                        let sync_url = format!("{url}/v1/sync");
                        while Instant::now() < end {
                            let (rtt, _) = limiter.sync_light(&http, &sync_url).await;
                            latencies.push(rtt);
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

    let setup = start_root(dir.path(), sizes.page);
    setup.wait_ready(&http).await;
    let applied = populate(&http, &setup.url, sizes.quotas).await;
    println!(
        "setup: apply of {} quotas in one transaction: {:.1} s",
        sizes.quotas,
        applied.as_secs_f64()
    );
    setup.stop();

    let root = start_root(dir.path(), sizes.page);
    let loaded = root.wait_ready(&http).await;
    println!(
        "fresh root loaded {} quotas from SQLite in {:.2} s",
        sizes.quotas,
        loaded.as_secs_f64()
    );
    let (elapsed, quotas, pages, after) = initial_sync(&http, &root.url).await;
    assert_eq!(quotas, sizes.quotas + 1);
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
    let (saturated, bench_limiters) = drive(
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
    let bench_limiters = scaling(&root, &http, &sizes, bench_limiters).await;
    drop(bench_limiters);
    let template = template_id(&http, &root.url).await;
    let hot = 2 * sizes.deltas as u64;
    let keyed: Vec<BenchLimiter> = (0..sizes.limiters)
        .map(|i| {
            let start = i as u64 * hot / sizes.limiters as u64;
            // Key hashes: any non-zero numbers, spread like real hashes.
            let keys = (0..sizes.deltas as u64)
                .map(move |k| (1 + (start + k) % hot).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            BenchLimiter::keyed(i, template, keys, after)
        })
        .collect();
    let (_, keyed) = drive(&root, &http, keyed, Some(1), 0, sizes.deltas).await;
    let (saturated, _) = drive(&root, &http, keyed, None, sizes.seconds, sizes.deltas).await;
    report(
        &format!(
            "saturated keyed: {} limiters x {} changed keys of one per-key quota, back to back",
            sizes.limiters, sizes.deltas
        ),
        &saturated,
    );
    let (rss_before, _) = root.memory_mib();
    let batch = 10_000u64;
    let batches = sizes.keys.div_ceil(batch);
    let fresh: Vec<BenchLimiter> = (0..batches)
        .map(|b| {
            let keys = (0..batch.min(sizes.keys - b * batch)).map(move |k| {
                (1_000_000_007 + b * batch + k).wrapping_mul(0xd6e8_feb8_6659_fd93) | 1
            });
            BenchLimiter::keyed(1000 + b as usize, template, keys, after)
        })
        .collect();
    for mut limiter in fresh {
        limiter.sync(&http, &root.url).await;
    }
    let (rss_after, _) = root.memory_mib();
    println!(
        "root memory for {} more keys: RSS {rss_before:.0} -> {rss_after:.0} MiB = {:.0} bytes per key",
        sizes.keys,
        (rss_after - rss_before) * (1 << 20) as f64 / sizes.keys as f64
    );
    let (rss, peak) = root.memory_mib();
    println!("root memory at the end: RSS {rss:.0} MiB, peak {peak:.0} MiB");
    root.stop();
}

/// Pins every thread of `pid` to CPUs `0..cpus`; false when `taskset`
/// failed (missing, or CPUs not allowed).
fn pin(pid: u32, cpus: usize) -> bool {
    let list = (0..cpus)
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    std::process::Command::new("taskset")
        .args(["-a", "-c", "-p", &list, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The saturated run with the root pinned to 1 CPU, then to 2 CPUs, with
/// the light client (phase 6 above).
async fn scaling(
    root: &RootProcess,
    http: &reqwest::Client,
    sizes: &Sizes,
    mut limiters: Vec<BenchLimiter>,
) -> Vec<BenchLimiter> {
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pid = root.child.id();
    if online < 2 || !pin(pid, 1) {
        println!("cores: skipped (needs taskset and 2 CPUs)");
        return limiters;
    }
    let mut rates = Vec::new();
    for cpus in [1, 2] {
        assert!(pin(pid, cpus), "taskset to {cpus} CPUs");
        // One warm-up second on the new CPU set.
        let (_, back) = drive_with(root, http, limiters, None, 1, sizes.deltas, true).await;
        let client_before = harness::measure::cpu_seconds(std::process::id());
        let (run, back) =
            drive_with(root, http, back, None, sizes.seconds, sizes.deltas, true).await;
        let client = harness::measure::cpu_seconds(std::process::id()) - client_before;
        limiters = back;
        let wall = run.wall.as_secs_f64();
        let rate = run.updates as f64 / wall;
        println!(
            "cores: root pinned to {cpus} CPU(s), {} limiters back to back, light client:",
            sizes.limiters
        );
        println!(
            "  {} syncs, {} updates in {wall:.2} s wall: {rate:.0} updates/s; root CPU {:.2} s ({:.2} cores): {:.0} updates per root CPU-second; client CPU {:.2} s ({:.2} cores)",
            run.latencies.len(),
            run.updates,
            run.cpu,
            run.cpu / wall,
            run.updates as f64 / run.cpu,
            client,
            client / wall,
        );
        rates.push(rate);
    }
    println!(
        "cores: 2 CPUs / 1 CPU = {:.2}x updates per wall second",
        rates[1] / rates[0]
    );
    pin(pid, online);
    limiters
}

/// The id of the per-key template `bench_keyed`.
async fn template_id(http: &reqwest::Client, url: &str) -> u64 {
    let bytes = http
        .get(format!("{url}/v1/quotas/bench_keyed"))
        .send()
        .await
        .expect("get the template")
        .bytes()
        .await
        .expect("its body");
    let reply: serde_json::Value = serde_json::from_slice(&bytes).expect("its JSON");
    reply["id"].as_u64().expect("the template's id")
}

fn main() {
    if let Some(sizes) = harness::sizes("root_sync", Sizes::smoke, Sizes::from_env) {
        harness::block_on(bench(sizes));
    }
}
