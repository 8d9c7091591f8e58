//! Two nginx with the module and two roots, on 127.0.0.1, in front of one
//! slow upstream: an in-flight quota holds the fleet's requests at once
//! to its limit, plus a bound from the sync interval, measured where it
//! matters, at the upstream.
//!
//! Run by `make test-cluster` (ignored by a plain `cargo test`, which has
//! no nginx built yet).

mod cluster_support;
mod sync_support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use cluster_support::{Client, Nginx};
use sync_support::{Db, Root};

/// The fleet's limit of requests at once.
const LIMIT: usize = 10;
/// How long the upstream takes to answer.
const UPSTREAM_DELAY: Duration = Duration::from_millis(1500);
/// The nginx sync interval.
const INTERVAL: Duration = Duration::from_millis(200);
/// Clients: twice the limit, half on each nginx.
const CLIENTS: usize = 2 * LIMIT;
/// A client starts every this often, so arrivals are spread as a fleet's
/// are (not all in one instant).
const STAGGER: Duration = Duration::from_millis(100);

/// An upstream that answers every request after [`UPSTREAM_DELAY`] and
/// counts the requests it holds at once (and the most it held).
struct SlowUpstream {
    /// Where it listens.
    port: u16,
    /// The most requests it held at once.
    most: Arc<AtomicUsize>,
    /// Set on drop: the accept loop ends.
    stop: Arc<AtomicBool>,
}

impl SlowUpstream {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().unwrap().port();
        let (now, most): (Arc<AtomicUsize>, Arc<AtomicUsize>) = (Arc::default(), Arc::default());
        let stop = Arc::new(AtomicBool::new(false));
        let upstream = SlowUpstream {
            port,
            most: Arc::clone(&most),
            stop: Arc::clone(&stop),
        };
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                std::thread::spawn(move || {
                    s.set_nonblocking(false).ok();
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match s.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let held = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(held, Ordering::SeqCst);
                    std::thread::sleep(UPSTREAM_DELAY);
                    let _ = s.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                    );
                    now.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        upstream
    }
}

impl Drop for SlowUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The stated bound on the fleet's overshoot: the requests that can
/// arrive at the other nginx while one decides on a view of it that is
/// up to two sync intervals old (its last sync, plus the other's), at the
/// clients' arrival rate (each client starts a request as soon as its
/// previous one ends, so at most `CLIENTS / UPSTREAM_DELAY` a second).
fn sync_bound() -> usize {
    let rate = CLIENTS as f64 / UPSTREAM_DELAY.as_secs_f64();
    (rate * 2.0 * INTERVAL.as_secs_f64()).ceil() as usize
}

#[test]
#[ignore = "needs nginx and the module: make test-cluster"]
fn two_nginx_never_hold_more_than_the_limit_plus_the_sync_bound_at_a_slow_upstream() {
    let db = Db::new();
    let roots = [Root::start(&db, "root-a"), Root::start(&db, "root-b")];
    roots[0].put("uploads", json!({"limit": LIMIT, "in_flight": true}));
    let upstream = SlowUpstream::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let http_block = format!(
        "    sluice_zone 1m;\n    sluice_root {} {};\n    sluice_sync_interval {}ms;",
        roots[0].url,
        roots[1].url,
        INTERVAL.as_millis()
    );
    let server_block = format!(
        "        location /slow {{ sluice uploads; proxy_pass http://127.0.0.1:{}/; }}\n        \
         location = /metrics {{ sluice_metrics; }}",
        upstream.port
    );
    // Each nginx its own limiter at the roots (each holds its own slots
    // there, and has its own lease).
    let nginx: Vec<Nginx> = ["nginx-a", "nginx-b"]
        .iter()
        .map(|n| {
            let http_block = format!("{http_block}\n    sluice_host_id {n};");
            Nginx::start(&dir.path().join(n), &http_block, &server_block)
        })
        .collect();
    // Both have the quota before the load starts.
    std::thread::sleep(Duration::from_millis(1500));

    let run_for = Duration::from_secs(10);
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let port = nginx[i % 2].port;
            std::thread::spawn(move || {
                std::thread::sleep(STAGGER * i as u32);
                let mut counts = (0usize, 0usize);
                while start.elapsed() < run_for {
                    let (status, _) = Client::new(port).get("/slow", &[]);
                    match status {
                        200 => counts.0 += 1,
                        429 => {
                            counts.1 += 1;
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        other => panic!("status {other}"),
                    }
                }
                counts
            })
        })
        .collect();
    let (mut passed, mut rejected) = (0, 0);
    for c in clients {
        let (p, r) = c.join().expect("client");
        passed += p;
        rejected += r;
    }
    let most = upstream.most.load(Ordering::SeqCst);
    eprintln!(
        "most at once at the upstream: {most} (limit {LIMIT}, bound {}); {passed} passed, \
         {rejected} rejected",
        sync_bound()
    );
    assert!(
        most <= LIMIT + sync_bound(),
        "the fleet held {most} at once, above {LIMIT} + {}",
        sync_bound()
    );
    assert!(
        rejected > 0,
        "2x the limit was offered: some must be rejected"
    );
    assert!(
        most >= LIMIT * 8 / 10,
        "the fleet used the limit ({most} at most at once)"
    );
    // Every slot comes back once the requests end, on both nginx (the
    // gauge is an estimate: a trend of the others may leave a fraction).
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in &nginx {
        loop {
            let (_, metrics) = Client::new(n.port).get("/metrics", &[]);
            let held = metrics
                .lines()
                .find_map(|l| l.strip_prefix("sluice_in_flight_slots{quota=\"uploads\"} "))
                .and_then(|v| v.parse::<f64>().ok());
            if held.is_some_and(|h| h < 0.5) {
                break;
            }
            let sync: Vec<&str> = metrics
                .lines()
                .filter(|l| {
                    l.starts_with("sluice_sync_root_errors_total")
                        || l.starts_with("sluice_sync_root_dropped")
                })
                .collect();
            if Instant::now() >= deadline {
                let levels: Vec<String> = roots
                    .iter()
                    .map(|r| {
                        let reply = sync_support::http(&r.url, "GET", "/v1/quotas/uploads", None);
                        format!("{reply:?}").chars().take(300).collect()
                    })
                    .collect();
                panic!(
                    "slots still held: {held:?} at {}; {sync:?}; roots: {levels:?}",
                    n.port
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(upstream);
}
