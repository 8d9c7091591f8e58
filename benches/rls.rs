//! `make bench-rls`: `sluice rls` under load, as Markdown on stdout.
//!
//! - **gRPC latency**: a tonic client on one HTTP/2 connection keeps 1, 16
//!   and 64 `ShouldRateLimit` calls in flight (closed loop) for
//!   `RLS_SECONDS` each: p50, p99 and calls a second.
//! - **At 10,000 decisions a second** (open loop: a call issued every
//!   100 µs whatever the answers, on a timerfd the client's one runtime
//!   thread waits on, each call timed from when it was due):
//!   `RLS_ROUNDS` rounds, p50 and p99 each, the median p99.
//! - **The floor**: every latency measurement is repeated, in the same
//!   run, against a tonic RLS server that answers OK at once (no table,
//!   no matching) on the same runtime and CPU, so what gRPC and the
//!   machine cost is measured beside what `sluice rls` costs.
//! - **The machine's stalls**: a thread spinning on the client's CPU for
//!   2 s counts the gaps of over 200 µs between its clock reads (time the
//!   hypervisor or other work took from that CPU).
//! - **Decisions per core**: the server is pinned to CPU 0
//!   (`taskset`), the client to the other CPUs; the 64-stream run's calls
//!   are divided by the CPU seconds the server spent (`/proc/PID/stat`),
//!   which a shared machine disturbs less than wall-clock rates.
//! - **The decision alone**: the same calls on the engine in this
//!   process, one thread, no gRPC: what the table and the matching cost.
//! - **Through Envoy** (when `SLUICE_ENVOY` names Envoy's binary): wrk on
//!   one Envoy (`--concurrency 1`) with two listeners to one backend, one
//!   with the rate limit filter calling `sluice rls`, one without;
//!   `RLS_ROUNDS` interleaved rounds, medians.
//!
//! The client is one current-thread runtime: issuing, pacing and answers
//! take turns on one thread, so no handoff between client threads is
//! counted as the server's latency.
//!
//! Each call is one descriptor, `remote_address` over 10,000 addresses: a
//! per-key limit (4 billion a second, so nothing is refused and every
//! call takes the same path). No assertion: numbers only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

#[path = "../tests/rls_support/mod.rs"]
mod rls_support;

use rls_support::{envoy_bootstrap, envoy_listener, envoy_route, free_port, Envoy, SLUICE};

const LIMITS: &str = "domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: generic_key
    value: bench
    rate_limit: {unit: second, requests_per_unit: 4000000000}
";

/// Addresses the calls cycle through.
const ADDRESSES: u32 = 10_000;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds `pid` has spent (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the line, 12th and 13th after it.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // sysconf(_SC_CLK_TCK) is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

fn request(i: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// The `q`-quantile of sorted `values`, microseconds.
fn quantile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at].as_secs_f64() * 1e6
}

/// `streams` calls kept in flight for `seconds`: latencies and calls.
async fn closed_loop(channel: &Channel, streams: usize, seconds: u64) -> Vec<Duration> {
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let mut client = RateLimitServiceClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = s as u32;
            while Instant::now() < end {
                let started = Instant::now();
                let answer = client.should_rate_limit(request(i % ADDRESSES)).await;
                latencies.push(started.elapsed());
                assert!(answer.is_ok(), "{answer:?}");
                i = i.wrapping_add(streams as u32);
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("stream"));
    }
    all.sort();
    all
}

/// A periodic timer (Linux timerfd) the client's runtime waits on like a
/// socket: calls are issued on the thread that takes their answers, with
/// no handoff from a pacing thread and no busy loop.
struct Ticker {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    /// Just before the timer was armed: its expiries are never earlier
    /// than `start` plus whole periods.
    start: Instant,
}

impl Ticker {
    fn every(gap: Duration) -> Ticker {
        use std::os::fd::FromRawFd;
        let start = Instant::now();
        // SAFETY: plain system calls on a descriptor this function owns;
        // `spec` outlives the call that reads it.
        let fd = unsafe {
            // Wake at the due time, not up to 50 µs after it.
            libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
            let fd = libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            );
            assert!(fd >= 0, "timerfd_create");
            let every = libc::timespec {
                tv_sec: gap.as_secs() as libc::time_t,
                tv_nsec: gap.subsec_nanos() as libc::c_long,
            };
            let spec = libc::itimerspec {
                it_interval: every,
                it_value: every,
            };
            assert_eq!(libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()), 0);
            std::os::fd::OwnedFd::from_raw_fd(fd)
        };
        // SAFETY: `fd` is open and owned by what is registered, which
        // keeps it until dropped.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        Ticker {
            fd: fd.map_err(|e| e.to_string()).expect("register the timer"),
            start,
        }
    }

    /// Waits for the next expiry: how many periods passed.
    async fn tick(&self) -> u64 {
        use std::os::fd::AsRawFd;
        loop {
            let mut ready = self.fd.readable().await.expect("timer");
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into `count`, which has 8.
            let read = unsafe {
                libc::read(
                    self.fd.get_ref().as_raw_fd(),
                    (&raw mut count).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
            if read == 8 {
                return count;
            }
            ready.clear_ready();
        }
    }
}

/// `per_second` calls issued evenly for `seconds`, each timed from the
/// moment it was due, so a client that falls behind shows it as latency.
async fn open_loop(channel: &Channel, per_second: u32, seconds: u64) -> Vec<Duration> {
    let total = u64::from(per_second) * seconds;
    let gap = Duration::from_secs(1) / per_second;
    let ticker = Ticker::every(gap);
    let start = ticker.start;
    let mut calls = Vec::with_capacity(total as usize);
    let mut issued = 0u64;
    while issued < total {
        let due_now = issued + ticker.tick().await;
        while issued < due_now.min(total) {
            issued += 1;
            let due = start + gap * issued as u32;
            let mut client = RateLimitServiceClient::new(channel.clone());
            let call = request(issued as u32 % ADDRESSES);
            calls.push(tokio::spawn(async move {
                let answer = client.should_rate_limit(call).await;
                assert!(answer.is_ok(), "{answer:?}");
                due.elapsed()
            }));
        }
    }
    let mut all = Vec::with_capacity(calls.len());
    for call in calls {
        all.push(call.await.expect("call"));
    }
    all.sort();
    all
}

/// The decision alone, in this process on one thread (no gRPC): calls a
/// second and each call's time.
fn engine_alone(config: &Path, seconds: u64) -> (f64, Vec<Duration>) {
    use sluice::rls::config::Config;
    use sluice::rls::decide::{Engine, Entry, Request, RequestDescriptor};
    let table = Arc::new(sluice::table::Table::new_heap_with(1024, 64, 1_000_000, 0));
    let config = Config::load(config).expect("limits load");
    let engine = Engine::new(table, config, false, false).expect("engine");
    let requests: Vec<Request> = (0..ADDRESSES)
        .map(|i| {
            let call = request(i);
            Request {
                domain: call.domain,
                descriptors: vec![RequestDescriptor {
                    entries: vec![Entry {
                        key: "remote_address".into(),
                        value: call.descriptors[0].entries[0].value.clone(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            }
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut latencies = Vec::new();
    let mut i = 0;
    let began = Instant::now();
    while Instant::now() < end {
        let started = Instant::now();
        let answer = engine.should_rate_limit(&requests[i % requests.len()], sluice::clock::now());
        latencies.push(started.elapsed());
        assert!(answer.is_ok_and(|a| !a.over));
        i += 1;
    }
    let rate = latencies.len() as f64 / began.elapsed().as_secs_f64();
    latencies.sort();
    (rate, latencies)
}

/// Starts `sluice rls` on CPU 0 with `config`: the process and its gRPC
/// URL, once it answers.
async fn start_rls(config: &Path) -> (Process, String) {
    let port = free_port();
    let mut command = Command::new("taskset");
    command
        .args(["-c", "0", SLUICE, "rls", "--http", "off", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(config);
    start_on(command, port, "sluice rls (taskset from util-linux)").await
}

/// Starts `command` (a server on CPU 0 that will listen on `port`): the
/// process and its URL, once it answers `ShouldRateLimit`.
async fn start_on(mut command: Command, port: u16, what: &str) -> (Process, String) {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while RateLimitServiceClient::connect(url.clone()).await.is_err() {
        assert!(Instant::now() < deadline, "{what} did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (Process(child), url)
}

/// wrk's requests a second and p99 (milliseconds) against `url`.
fn wrk(url: &str, seconds: u64, connections: u64) -> (f64, f64) {
    let output = Command::new("taskset")
        .args(["-c", "1", "wrk", "-t1", "--latency"])
        .arg(format!("-c{connections}"))
        .arg(format!("-d{seconds}s"))
        .arg(url)
        .output()
        .expect("wrk (make deps)");
    let text = String::from_utf8_lossy(&output.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let p99 = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("99%"))
        .map(|v| milliseconds(v.trim()))
        .unwrap_or(f64::NAN);
    let non_2xx = text.lines().any(|l| l.contains("Non-2xx"));
    assert!(!non_2xx, "refused or failed requests: {text}");
    (rps, p99)
}

/// wrk's `1.23ms`, `456.00us` or `1.2s` as milliseconds.
fn milliseconds(text: &str) -> f64 {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => number / 1000.0,
        "ms" => number,
        "s" => number * 1000.0,
        _ => f64::NAN,
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn through_envoy(envoy: &Path, rls_port: u16, dir: &Path, seconds: u64, rounds: u64) {
    let (limited, plain, backend, admin) = (free_port(), free_port(), free_port(), free_port());
    let route = |limit: bool| {
        let action = "{generic_key: {descriptor_value: bench}}";
        envoy_route("/", limit.then_some(action))
    };
    let listeners = [
        envoy_listener("limited", limited, &route(true), Some(("bench", true))),
        envoy_listener("plain", plain, &route(false), None),
    ];
    let config: PathBuf = dir.join("envoy.yaml");
    std::fs::write(
        &config,
        envoy_bootstrap(admin, &listeners, backend, rls_port),
    )
    .unwrap();
    let mut command = Command::new("taskset");
    command.args(["-c", "0"]).arg(envoy);
    let _envoy = Envoy::start(command, &config, admin, dir.join("envoy.log")).await;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        with.push(wrk(&format!("http://127.0.0.1:{limited}/"), seconds, 16));
        without.push(wrk(&format!("http://127.0.0.1:{plain}/"), seconds, 16));
    }
    let mut rps_with: Vec<f64> = with.iter().map(|r| r.0).collect();
    let mut p99_with: Vec<f64> = with.iter().map(|r| r.1).collect();
    let mut rps_without: Vec<f64> = without.iter().map(|r| r.0).collect();
    let mut p99_without: Vec<f64> = without.iter().map(|r| r.1).collect();
    let (rw, rwo) = (median(&mut rps_with), median(&mut rps_without));
    println!("\n| Envoy 1 worker, wrk 16 connections | requests/s | p99 ms |\n|---|---:|---:|");
    println!(
        "| no rate limit filter | {rwo:.0} | {:.2} |",
        median(&mut p99_without)
    );
    println!(
        "| rate limit filter → sluice rls | {rw:.0} | {:.2} |",
        median(&mut p99_with)
    );
    println!(
        "\nWith the filter: {:.0}% of the requests/s without.",
        100.0 * rw / rwo
    );
}

/// Gaps of over 200 µs between two clock reads of a thread that does
/// nothing else for `length`: how often, in all and the longest. Time the
/// machine (its hypervisor, its other work) took from this CPU, which any
/// server and client lose too.
fn stalls(length: Duration) -> (usize, Duration, Duration) {
    let end = Instant::now() + length;
    let (mut count, mut total, mut longest) = (0, Duration::ZERO, Duration::ZERO);
    let mut last = Instant::now();
    while last < end {
        let now = Instant::now();
        let gap = now - last;
        if gap > Duration::from_micros(200) {
            count += 1;
            total += gap;
            longest = longest.max(gap);
        }
        last = now;
    }
    (count, total, longest)
}

/// The floor: an RLS service that answers OK at once, with no table and
/// no matching, on one thread. What gRPC and the machine cost alone.
struct Floor;

#[tonic::async_trait]
impl envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService
    for Floor
{
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<
        tonic::Response<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(Default::default()))
    }
}

/// `rls --floor PORT`: serves [`Floor`] until killed, on the runtime
/// `sluice rls` has (tokio's multi-thread one, a worker per CPU it may
/// use: one under `taskset -c 0`).
fn serve_floor(port: u16) {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        // On a worker, as `sluice rls` serves.
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(Floor))
                .serve_with_incoming(incoming),
        )
        .await
        .expect("floor server")
        .expect("floor server");
    });
}

/// Starts the floor server on CPU 0: the process and its URL.
async fn start_floor() -> (Process, String) {
    let port = free_port();
    let mut command = Command::new("taskset");
    command
        .args(["-c", "0"])
        .arg(std::env::current_exe().expect("this bench"))
        .args(["--floor", &port.to_string()]);
    start_on(command, port, "the floor server").await
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--floor") {
        let port = args
            .get(at + 1)
            .and_then(|p| p.parse().ok())
            .expect("--floor PORT");
        serve_floor(port);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --all-targets` (make
    // test-cargo) runs this without it, where a minute of load has no
    // place.
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/rls.rs: run with `make bench-rls` (cargo bench --bench rls)");
        return;
    }
    let seconds = env_number("RLS_SECONDS", 3);
    let rounds = env_number("RLS_ROUNDS", 3);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The client off CPU 0, where the server runs.
    if cpus > 1 {
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", &format!("1-{}", cpus - 1)])
            .arg(std::process::id().to_string())
            .stdout(Stdio::null())
            .status();
    }
    // One client thread: calls, answers and pacing take turns on it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("limits.yaml");
        std::fs::write(&config, LIMITS).unwrap();
        let (server, url) = start_rls(&config).await;
        let pid = server.0.id();
        let channel = Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        // Warm up: every address's key made.
        closed_loop(&channel, 16, 1).await;
        let (_floor, floor_url) = start_floor().await;
        let floor = Channel::from_shared(floor_url)
            .unwrap()
            .connect()
            .await
            .expect("connect");
        closed_loop(&floor, 16, 1).await;
        println!(
            "| ShouldRateLimit, tonic client, 1 connection | sluice rls calls/s | p50 µs | p99 µs | floor calls/s | p50 µs | p99 µs |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let row = |what: &str, ours: &[Duration], theirs: &[Duration], seconds: u64| {
            println!(
                "| {what} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                ours.len() as f64 / seconds as f64,
                quantile(ours, 0.5),
                quantile(ours, 0.99),
                theirs.len() as f64 / seconds as f64,
                quantile(theirs, 0.5),
                quantile(theirs, 0.99)
            );
        };
        let mut per_core = f64::NAN;
        for streams in [1usize, 16, 64] {
            let cpu_before = cpu_seconds(pid);
            let latencies = closed_loop(&channel, streams, seconds).await;
            let cpu = cpu_seconds(pid) - cpu_before;
            if streams == 64 && cpu > 0.0 {
                per_core = latencies.len() as f64 / cpu;
            }
            let floor_latencies = closed_loop(&floor, streams, seconds).await;
            row(&format!("{streams} in flight"), &latencies, &floor_latencies, seconds);
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let latencies = open_loop(&channel, 10_000, seconds).await;
            let floor_latencies = open_loop(&floor, 10_000, seconds).await;
            row(
                &format!("10,000 a second, paced, round {round}"),
                &latencies,
                &floor_latencies,
                seconds,
            );
            ours.push(quantile(&latencies, 0.99));
            theirs.push(quantile(&floor_latencies, 0.99));
        }
        println!(
            "\nAt 10,000 a second, median p99 of {rounds} rounds: sluice rls {:.0} µs, the floor {:.0} µs.",
            median(&mut ours),
            median(&mut theirs)
        );
        println!("\nDecisions per CPU second of the server (64 in flight): {per_core:.0}");
        let (count, total, longest) = stalls(Duration::from_secs(2));
        println!(
            "\nThe machine's own stalls: a busy thread on the client's CPU saw {count} gaps over 200 µs in 2 s, {:.1} ms in all, the longest {:.2} ms.",
            total.as_secs_f64() * 1e3,
            longest.as_secs_f64() * 1e3
        );
        let (rate, alone) = engine_alone(&config, seconds);
        println!(
            "\nThe decision alone (no gRPC), one thread: {rate:.0} a second, p50 {:.2} µs, p99 {:.2} µs",
            quantile(&alone, 0.5),
            quantile(&alone, 0.99)
        );
        match std::env::var("SLUICE_ENVOY") {
            Ok(envoy) => {
                let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
                through_envoy(Path::new(&envoy), port, dir.path(), seconds, rounds).await;
            }
            Err(_) => println!("\n(SLUICE_ENVOY not set: no Envoy rows)"),
        }
        drop(server);
    });
}
