//! Benchmark of the limiter's sync thread (`cargo bench --bench
//! sync_cycle`).
//!
//! Each part runs at every size of `CHANGED` (changed counters per cycle)
//! and in both encodings of the sync protocol, JSON and binary
//! (`sluice::wire::binary`).
//!
//! 1. **Cycle breakdown** (no network): a table of `QUOTAS` quotas, of
//!    which `CHANGED` got a request since the last cycle, and the real
//!    [`SyncEngine`]. Thread CPU time (`CLOCK_THREAD_CPUTIME_ID`) of each
//!    step of a cycle: collect the deltas and build the request, encode it,
//!    decode the root's reply, apply it (max-merge every counter) and end
//!    the cycle. The reply is built as a root would answer: every changed
//!    counter. Body bytes per changed counter, both ways, and the root's
//!    codec work apart (decode the request, encode the reply). Then the
//!    same with the changed counters keys of one per-key quota. And what
//!    reading the held counts of the named in-flight quotas costs a cycle
//!    (once, when a root takes them) in a table that has none.
//! 2. **The real sync thread** against a `sluice root` child process on
//!    127.0.0.1 (SQLite, `sync_page_counters` raised to 1M so that every
//!    reply carries every changed counter): `CHANGED` counters changed
//!    every cycle, cycles every 200 ms; CPU time of the sync thread (and of
//!    its runtime's helper threads, if any) from
//!    `/proc/self/task/*/schedstat`, and of the whole root process from
//!    `/proc/PID/stat`, per changed counter; body bytes on the wire per
//!    changed counter from the sync metrics. The encoding is chosen with
//!    `SLUICE_SYNC_ENCODING` (`json`; binary otherwise).
//! 3. **Check latency** with and without syncs (at the first size, binary;
//!    skipped with `LATENCY_SECS=0`): one thread checks the `CHANGED`
//!    names round robin for `LATENCY_SECS`, timing every check, first with
//!    no sync thread, then while the sync thread of part 2 syncs what
//!    those checks changed.
//!
//! Sizes come from the environment: `CHANGED` (a comma-separated list,
//! `10000,100000,1000000`), `QUOTAS` (100000, or `CHANGED` if more), `CYCLES`
//! (20), `LATENCY_SECS` (5); `ONLY_BREAKDOWN=1` runs part 1 only,
//! `SKIP_BREAKDOWN=1` parts 2 and 3 only; `ENCODINGS` (`json,binary`)
//! and, for the breakdown, `KINDS` (`named,keyed`) narrow a run. Under
//! `cargo test` (no `--bench` argument) it makes a small smoke run
//! instead.

// The integration tests' harness: root processes and limiters.
#[path = "../tests/sync_support/mod.rs"]
mod sync_support;

mod harness;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::core::{Nanos, Quota};
use sluice::sync::{Page, SyncEngine};
use sluice::table::{CheckItem, CheckOptions, Table};
use sluice::wire::binary::{decode_request, decode_response, encode_request, encode_response};
use sluice::wire::{CounterValue, KeyValue, KeyedValues, SyncRequest, SyncResponse};
use sync_support::{wait_until, Db, Limiter, Root};

/// Bench sizes.
#[derive(Clone, Debug)]
struct Sizes {
    quotas: usize,
    changed: Vec<usize>,
    cycles: usize,
    latency_secs: u64,
}

impl Sizes {
    /// Tiny sizes for the run `cargo test` makes.
    fn smoke() -> Self {
        Self {
            quotas: 2_000,
            changed: vec![500],
            cycles: 3,
            latency_secs: 1,
        }
    }

    fn from_env() -> Self {
        let changed: Vec<usize> = std::env::var("CHANGED")
            .unwrap_or_else(|_| "10000,100000,1000000".into())
            .split(',')
            .map(|n| n.trim().parse().expect("CHANGED: numbers, comma-separated"))
            .collect();
        assert!(!changed.is_empty(), "CHANGED: at least one size");
        Self {
            quotas: harness::env_or("QUOTAS", 100_000) as usize,
            changed,
            cycles: harness::env_or("CYCLES", 20) as usize,
            latency_secs: harness::env_or("LATENCY_SECS", 5),
        }
    }
}

/// One size of one run.
#[derive(Clone, Copy, Debug)]
struct Size {
    quotas: usize,
    changed: usize,
    cycles: usize,
}

/// The sync protocol's two encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Json,
    Binary,
}

impl Encoding {
    const BOTH: [Self; 2] = [Self::Json, Self::Binary];

    /// The encodings `ENCODINGS` names (`json,binary` by default).
    fn chosen() -> Vec<Self> {
        let Ok(list) = std::env::var("ENCODINGS") else {
            return Self::BOTH.to_vec();
        };
        list.split(',')
            .map(|e| match e.trim() {
                "json" => Self::Json,
                "binary" => Self::Binary,
                other => panic!("ENCODINGS: json or binary, not {other:?}"),
            })
            .collect()
    }

    fn name(self) -> &'static str {
        match self {
            Self::Json => "JSON",
            Self::Binary => "binary",
        }
    }

    fn request(self, request: &SyncRequest) -> Vec<u8> {
        match self {
            Self::Json => serde_json::to_vec(request).unwrap(),
            Self::Binary => encode_request(request),
        }
    }

    fn reply(self, reply: &SyncResponse) -> Vec<u8> {
        match self {
            Self::Json => serde_json::to_vec(reply).unwrap(),
            Self::Binary => encode_response(reply).unwrap(),
        }
    }

    fn read_request(self, body: &[u8]) -> SyncRequest {
        match self {
            Self::Json => serde_json::from_slice(body).unwrap(),
            Self::Binary => decode_request(body).unwrap(),
        }
    }

    fn read_reply(self, body: &[u8]) -> SyncResponse {
        match self {
            Self::Json => serde_json::from_slice(body).unwrap(),
            Self::Binary => decode_response(body).unwrap(),
        }
    }
}

fn name(i: usize) -> String {
    format!("bench_{i:07}")
}

/// Quota `i` (ids from 1): a limit no bench load reaches, so every check
/// passes and every counter changes.
fn quota(i: usize) -> Quota {
    Quota::new(i as u64 + 1, name(i), 1e9, 1e9, 2e9)
}

/// CPU time of the calling thread, nanoseconds.
fn thread_cpu() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs `f` and adds its thread CPU time to `total`.
fn timed<T>(total: &mut u64, f: impl FnOnce() -> T) -> T {
    let start = thread_cpu();
    let out = f();
    *total += thread_cpu() - start;
    out
}

/// Part 1: one cycle's steps in this thread, no network; `keyed`: the
/// changed counters are keys of one per-key template instead of quotas.
fn cycle_breakdown(sizes: Size, keyed: bool, encoding: Encoding) {
    // HANDOVER=<bytes>: the table has a handover section that size, and
    // the engine leaves its record there before every exchange, as in a
    // zone (a heap table has none by default).
    let handover = harness::env_or("HANDOVER", 0) as u32;
    let table = if keyed {
        let t = Table::new_heap_handing_over(16, 16, 4 * sizes.changed as u64, handover);
        t.books().apply_quotas(&[quota(0).keyed()]);
        t
    } else {
        let t = Table::new_heap_handing_over(sizes.quotas as u32 + 16, 16, 0, handover);
        let quotas: Vec<Quota> = (0..sizes.quotas).map(quota).collect();
        t.books().apply_quotas(&quotas);
        t
    };
    table.books().claim_sync();
    let names: Vec<String> = (0..sizes.changed).map(name).collect();
    let mut engine = SyncEngine::new(
        &["http://root".into()],
        "bench".into(),
        1_000_000_000,
        1 << 24,
        0,
    );
    let (mut collect, mut encode, mut decode, mut apply) = (0u64, 0u64, 0u64, 0u64);
    let mut root_codec = 0u64;
    let (mut request_bytes, mut reply_bytes) = (0usize, 0usize);
    // Cycle 0 is not counted: its reply is the first, which makes the
    // engine map every quota id to its slot (once per quota change).
    for cycle in 0..=sizes.cycles as u64 {
        if cycle == 1 {
            (collect, encode, decode, apply, root_codec) = (0, 0, 0, 0, 0);
            (request_bytes, reply_bytes) = (0, 0);
        }
        let now: Nanos = (cycle + 1) * 1_000_000_000;
        let template = name(0);
        for n in &names {
            let item = CheckItem {
                name: if keyed { &template } else { n }.as_bytes(),
                key: keyed.then_some(n.as_bytes()),
                weight: 1,
                max_wait: None,
            };
            table
                .gate()
                .check_many(&[item], now, CheckOptions::default(), || 0.5);
        }
        let out = timed(&mut collect, || engine.begin_cycle(&table, now));
        let out = out.into_iter().next().expect("one root");
        let body = timed(&mut encode, || encoding.request(&out.request));
        // What the root's codec does with it: decode the request.
        let back = timed(&mut root_codec, || encoding.read_request(&body));
        assert_eq!(back.entry_count(), out.request.entry_count());
        request_bytes += body.len();
        // The root's answer: every counter this limiter changed.
        let reply = SyncResponse {
            keyed: out
                .request
                .keyed
                .iter()
                .map(|group| KeyedValues {
                    id: group.id,
                    values: group
                        .deltas
                        .iter()
                        .map(|d| KeyValue(d.0, cycle as f64 * 3.0, now))
                        .collect(),
                    prev: Vec::new(),
                })
                .collect(),
            root_instance: 1,
            root_time: now,
            quotas: Vec::new(),
            quotas_after: Default::default(),
            more_quotas: false,
            counters: out
                .request
                .deltas
                .iter()
                .map(|d| CounterValue {
                    id: d.id,
                    level: cycle as f64 * 3.0,
                    at: now,
                    prev: 0.0,
                })
                .collect(),
            counter_version: cycle,
            root_utc: None,
            ..Default::default()
        };
        // ... and encode the reply.
        let reply = timed(&mut root_codec, || encoding.reply(&reply));
        reply_bytes += reply.len();
        let reply: SyncResponse = timed(&mut decode, || encoding.read_reply(&reply));
        let page = Page {
            sent_at: now,
            received_at: now,
            reply,
        };
        timed(&mut apply, || {
            engine.finish(&table, 0, out.owed, &[page], None, now);
            engine.end_cycle(&table, now);
        });
    }
    let n = sizes.cycles as f64;
    let per_counter = (sizes.cycles * sizes.changed) as f64;
    let ms = |ns: u64| ns as f64 / n / 1e6;
    let e = encoding.name();
    if keyed {
        println!(
            "cycle breakdown, {e}, keyed: {} keys of one per-key quota changed per cycle, {} \
             cycles (thread CPU, mean per cycle)",
            sizes.changed, sizes.cycles
        );
    } else {
        println!(
            "cycle breakdown, {e}: {} quotas, {} changed per cycle, {} cycles (thread CPU, mean \
             per cycle)",
            sizes.quotas, sizes.changed, sizes.cycles
        );
    }
    println!("  collect + build request   {:8.2} ms", ms(collect));
    println!("  encode request            {:8.2} ms", ms(encode));
    println!("  decode reply              {:8.2} ms", ms(decode));
    println!("  apply reply + end cycle   {:8.2} ms", ms(apply));
    let total = collect + encode + decode + apply;
    println!(
        "  total                     {:8.2} ms = {:.0} ns per changed counter",
        ms(total),
        total as f64 / per_counter
    );
    println!(
        "  root side, codec only: decode request + encode reply {:8.2} ms = {:.0} ns per \
         changed counter",
        ms(root_codec),
        root_codec as f64 / per_counter
    );
    println!(
        "  body bytes per changed counter: request {:.1}, reply {:.1}",
        request_bytes as f64 / per_counter,
        reply_bytes as f64 / per_counter
    );
    if !keyed {
        // What a cycle pays for the held counts a root takes (none of
        // these quotas is in flight).
        let mut held = 0u64;
        let reads = 20;
        for _ in 0..reads {
            timed(&mut held, || table.books().held_counts());
        }
        println!(
            "  held counts (no quota in flight) {:8.3} ms a read",
            held as f64 / f64::from(reads) / 1e6
        );
    }
}

/// CPU nanoseconds so far of this process's threads whose name starts
/// with one of `prefixes` (`/proc/self/task/*/schedstat`).
fn threads_cpu(prefixes: &[&str]) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !prefixes.iter().any(|p| comm.starts_with(p)) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        total += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// Latency percentiles of checks, from a histogram of whole nanoseconds
/// (the last bucket holds everything slower).
struct Latencies {
    buckets: Vec<u64>,
    max: u64,
    count: u64,
}

impl Latencies {
    const BUCKETS: usize = 1_000_000;

    fn new() -> Self {
        Self {
            buckets: vec![0; Self::BUCKETS],
            max: 0,
            count: 0,
        }
    }

    fn record(&mut self, ns: u64) {
        self.buckets[(ns as usize).min(Self::BUCKETS - 1)] += 1;
        self.max = self.max.max(ns);
        self.count += 1;
    }

    fn quantile(&self, q: f64) -> u64 {
        let rank = (self.count as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (ns, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank.max(1) {
                return ns as u64;
            }
        }
        self.max
    }

    fn line(&self, label: &str) -> String {
        format!(
            "  {label:<16} {:>10} checks  p50 {:>5} ns  p90 {:>5}  p99 {:>6}  p99.9 {:>7}  p99.99 {:>7}  max {:>9}",
            self.count,
            self.quantile(0.5),
            self.quantile(0.9),
            self.quantile(0.99),
            self.quantile(0.999),
            self.quantile(0.9999),
            self.max
        )
    }
}

/// Checks `names` round robin on `table` for `seconds`, timing each.
fn check_latencies(table: &Table, names: &[String], seconds: u64) -> Latencies {
    let mut lat = Latencies::new();
    let until = Instant::now() + Duration::from_secs(seconds);
    'outer: loop {
        for n in names {
            let start = Instant::now();
            table.gate().check(n.as_bytes(), 1, sluice::clock::now());
            lat.record(start.elapsed().as_nanos() as u64);
        }
        if Instant::now() >= until {
            break 'outer;
        }
    }
    lat
}

/// CPU nanoseconds so far of process `pid` (user and system, from
/// `/proc/PID/stat`, in clock ticks).
fn process_cpu(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 12 and 13 here.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    ticks * 1_000_000_000 / hz
}

/// A root process that answers every changed counter in one reply.
fn bench_root(db: &Db) -> Root {
    let config = db.dir().join("bench-root.toml");
    std::fs::write(&config, "sync_page_counters = 1000000\n").unwrap();
    Root::start_with(db, "bench-root", &["--config", config.to_str().unwrap()])
}

/// Makes `root`, which holds the bench quotas below `held`, hold those
/// below `quotas` too: applied 100k at a time (an apply without `prune`
/// keeps the quotas it does not name), each well within the client's
/// patience.
fn hold_quotas(root: &Root, held: usize, quotas: usize) {
    for start in (held..quotas).step_by(100_000) {
        let file: Vec<Value> = (start..quotas.min(start + 100_000))
            .map(|i| json!({"name": name(i), "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9}))
            .collect();
        root.apply(&json!({ "quotas": file }));
    }
}

/// Parts 2 and 3: the real sync thread against a root process, in
/// `encoding`; check latencies too if `latency_secs` is not 0.
fn real_thread(root: &Root, sizes: Size, encoding: Encoding, latency_secs: u64) {
    let names: Vec<String> = (0..sizes.changed).map(name).collect();

    // Without syncs: a table that holds the quotas and has no sync thread.
    let without = (latency_secs > 0).then(|| {
        let quiet = Table::new_heap(sizes.quotas as u32 + 16, 16);
        quiet
            .books()
            .apply_quotas(&(0..sizes.quotas).map(quota).collect::<Vec<_>>());
        check_latencies(&quiet, &names, latency_secs)
    });

    // Read when the sync thread starts.
    match encoding {
        Encoding::Json => std::env::set_var(sluice::sync::ENCODING_ENV, "json"),
        Encoding::Binary => std::env::remove_var(sluice::sync::ENCODING_ENV),
    }
    let capacity = sizes.quotas as u32 + 16;
    let limiter = Limiter::start_sized("bench", &[root.url.as_str()], capacity, |_| {});
    wait_until("every quota arrives", || {
        limiter.table.len() as usize == sizes.quotas
    });

    // The initial sync's last pages are still being counted: let two
    // more syncs go by.
    let synced = limiter.syncs(0);
    wait_until("two more syncs", || limiter.syncs(0) >= synced + 2);

    // The sync thread alone: CHANGED counters changed, then a sync that
    // carries them, CYCLES times.
    let threads = ["sluice-sync", "tokio-runtime-w"];
    let start = limiter.metrics();
    let pid = root.pid().expect("the root runs");
    let root_cpu = process_cpu(pid);
    let cpu = threads_cpu(&threads);
    for _ in 0..sizes.cycles {
        for n in &names {
            limiter.check(n, 1);
        }
        let (cycles, syncs) = (limiter.metrics().cycles, limiter.syncs(0));
        wait_until("a cycle that collects them", || {
            limiter.metrics().cycles > cycles
        });
        wait_until("its sync", || limiter.syncs(0) > syncs);
    }
    let end = limiter.metrics();
    let cpu = threads_cpu(&threads) - cpu;
    let root_cpu = process_cpu(pid) - root_cpu;
    let cycles = (end.cycles - start.cycles) as f64;
    let syncs = (end.roots[0].syncs - start.roots[0].syncs) as f64;
    // Every round's deltas went out once, in one sync or split over two.
    let counters = (sizes.cycles * sizes.changed) as f64;
    println!(
        "sync thread against a root process, {}: {} quotas, {} changed per cycle, 200 ms interval",
        encoding.name(),
        sizes.quotas,
        sizes.changed
    );
    println!(
        "  {cycles:.0} cycles, {syncs:.0} syncs: {:.2} ms sync-thread CPU per cycle, {:.0} ns per changed counter",
        cpu as f64 / cycles / 1e6,
        cpu as f64 / counters
    );
    println!(
        "  root process CPU (all threads, 10 ms ticks): {:.0} ns per changed counter",
        root_cpu as f64 / counters
    );
    println!(
        "  body bytes per changed counter: sent {:.1}, received {:.1}",
        (end.roots[0].bytes_sent - start.roots[0].bytes_sent) as f64 / counters,
        (end.roots[0].bytes_received - start.roots[0].bytes_received) as f64 / counters
    );

    let Some(without) = without else {
        return;
    };
    // With syncs: the same checks while the sync thread syncs what they
    // change.
    let with = check_latencies(&limiter.table, &names, latency_secs);
    let m = limiter.metrics();
    println!(
        "check latency, {} names round robin, one thread (Instant around each check):",
        sizes.changed
    );
    println!("{}", without.line("without syncs"));
    println!("{}", with.line("while syncing"));
    println!(
        "  ({} cycles during the second run, root errors {})",
        m.cycles - end.cycles,
        m.roots[0].errors
    );
}

/// Whether the breakdown runs named counters, keys or both (`KINDS`:
/// `named,keyed` by default), as the `keyed` flags to run.
fn kinds() -> Vec<bool> {
    let list = std::env::var("KINDS").unwrap_or_else(|_| "named,keyed".into());
    list.split(',')
        .map(|k| match k.trim() {
            "named" => false,
            "keyed" => true,
            other => panic!("KINDS: named or keyed, not {other:?}"),
        })
        .collect()
}

fn main() {
    let Some(sizes) = harness::sizes("sync_cycle", Sizes::smoke, Sizes::from_env) else {
        return;
    };
    let size = |changed| Size {
        quotas: sizes.quotas.max(changed),
        changed,
        cycles: sizes.cycles,
    };
    let breakdown = std::env::var("SKIP_BREAKDOWN").is_err();
    for &changed in sizes.changed.iter().filter(|_| breakdown) {
        for keyed in kinds() {
            for encoding in Encoding::chosen() {
                cycle_breakdown(size(changed), keyed, encoding);
            }
        }
    }
    if std::env::var("ONLY_BREAKDOWN").is_ok() {
        return;
    }
    let db = Db::new();
    let root = bench_root(&db);
    let mut held = 0;
    for (i, &changed) in sizes.changed.iter().enumerate() {
        let quotas = size(changed).quotas;
        if quotas > held {
            hold_quotas(&root, held, quotas);
            held = quotas;
        }
        for encoding in Encoding::chosen() {
            let latency = if i == 0 && encoding == Encoding::Binary {
                sizes.latency_secs
            } else {
                0
            };
            let sizes = Size {
                quotas: held,
                ..size(changed)
            };
            real_thread(&root, sizes, encoding, latency);
        }
    }
}
