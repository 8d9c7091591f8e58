//! Two nginx with the module and two roots, on 127.0.0.1: what per-key
//! quotas and charges after the response do across a fleet, seen from
//! outside.
//!
//! Run by `make test-cluster` (the tests are ignored by a plain `cargo
//! test`, which has no nginx built yet).

mod cluster_support;
mod sync_support;

use std::time::{Duration, Instant};

use serde_json::json;
use sluice::core::key::KeySecret;

use cluster_support::{contains, memory_holds, Client, Nginx, Relay};
use sync_support::{http, Db, Root};

/// The key under test: what must never leave nginx as itself.
const KEY: &str = "tok-3c1f9e7a-secret-alpha";
/// The fleet's key secret.
const SECRET: &str = "cluster-test-secret-0123456789";
/// The per-key limit, units per second.
const LIMIT: f64 = 50.0;

/// Sends `rate` requests a second for `secs` seconds to nginx on `port`
/// with the key `KEY`; returns, per second, how many passed.
fn offer(port: u16, rate: f64, secs: u64) -> Vec<u64> {
    let mut client = Client::new(port);
    let header = format!("X-Token: {KEY}");
    let start = Instant::now();
    let mut passed = vec![0u64; secs as usize];
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        let due = Duration::from_secs_f64(sent as f64 / rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let second = start.elapsed().as_secs() as usize;
        let (status, _) = client.get("/k/index.html", &[&header]);
        assert!(status == 200 || status == 429, "status {status}");
        if status == 200 && second < passed.len() {
            passed[second] += 1;
        }
        sent += 1;
    }
    passed
}

#[test]
#[ignore = "needs nginx and the module: make test-cluster"]
fn a_key_split_70_30_over_two_nginx_gets_its_limit_and_never_leaves_as_itself() {
    let db = Db::new();
    let roots = [Root::start(&db, "root-a"), Root::start(&db, "root-b")];
    roots[0].put(
        "per_token",
        json!({"limit": LIMIT, "low_burst": LIMIT, "high_burst": 2.0 * LIMIT, "per_key": true}),
    );
    let relays: Vec<Relay> = roots
        .iter()
        .map(|r| Relay::start(r.url.trim_start_matches("http://")))
        .collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let secret_file = dir.path().join("key.secret");
    std::fs::write(&secret_file, SECRET).expect("secret file");
    let http_block = format!(
        "    sluice_zone 1m;\n    sluice_keys 1m;\n    sluice_root {} {};\n    \
         sluice_sync_interval 200ms;\n    sluice_key_secret_file {};",
        relays[0].url,
        relays[1].url,
        secret_file.display()
    );
    let server_block =
        "        location /k/ { alias html/; sluice per_token key=$http_x_token; }\n        \
         location = /metrics { sluice_metrics; }";
    let nginx: Vec<Nginx> = ["nginx-a", "nginx-b"]
        .iter()
        .map(|n| Nginx::start(&dir.path().join(n), &http_block, server_block))
        .collect();
    // Both have the template before the load starts.
    std::thread::sleep(Duration::from_millis(1500));

    // 2x the limit for one key: 70% through one nginx, 30% the other.
    let secs = 12;
    let (a, b) = (nginx[0].port, nginx[1].port);
    let heavy = std::thread::spawn(move || offer(a, 1.4 * LIMIT, secs));
    let light = std::thread::spawn(move || offer(b, 0.6 * LIMIT, secs));
    let (heavy, light) = (heavy.join().unwrap(), light.join().unwrap());
    // After the first burst, the fleet admits about the limit.
    let steady = 4..secs as usize;
    let admitted: u64 = steady.clone().map(|s| heavy[s] + light[s]).sum();
    let ratio = admitted as f64 / (LIMIT * steady.len() as f64);
    assert!(
        (0.85..=1.2).contains(&ratio),
        "admitted/limit {ratio:.3} (per second: {heavy:?} + {light:?})"
    );
    // Each nginx alone would have admitted its whole share under a
    // per-host limit of LIMIT: the heavy one got less than it offered.
    let heavy_steady: u64 = steady.map(|s| heavy[s]).sum();
    assert!((heavy_steady as f64) < 1.4 * LIMIT * 8.0 * 0.9, "{heavy:?}");

    // The key went to the roots only as its hash.
    let hash = KeySecret::from_file_contents(SECRET.as_bytes())
        .unwrap()
        .hash(KEY.as_bytes());
    for relay in &relays {
        let sent = relay.sent();
        // In the binary encoding (the module's default) a key's delta
        // carries its hash as 8 little-endian bytes; in JSON as
        // `"keyed": [... [hash, delta]]`.
        let binary = contains(&sent, b"application/x-sluice-sync");
        if binary {
            assert!(
                contains(&sent, &hash.to_le_bytes()),
                "no keyed delta with the key's hash reached a root"
            );
        } else {
            assert!(
                contains(&sent, b"\"keyed\""),
                "no keyed deltas reached a root"
            );
            assert!(
                contains(&sent, hash.to_string().as_bytes()),
                "the key's hash was not sent"
            );
        }
        assert!(
            !contains(&sent, KEY.as_bytes()),
            "the raw key crossed the wire"
        );
    }
    for root in &roots {
        let pid = root.pid().expect("root runs");
        assert_eq!(
            memory_holds(pid, KEY.as_bytes()),
            Ok(false),
            "raw key in a root's memory"
        );
        // The scan does find what is there: the hash, as the root keeps it.
        assert_eq!(
            memory_holds(pid, &hash.to_le_bytes()),
            Ok(true),
            "the scan found no hash"
        );
        let (status, _) = http(&root.url, "GET", "/healthz", None).expect("healthz");
        assert_eq!(status, 200);
        let metrics = raw_get(&root.url, "/metrics");
        assert!(!metrics.contains(KEY), "raw key in a root's metrics");
        assert!(!root.log().contains(KEY), "raw key in a root's log");
    }
    for n in &nginx {
        let (_, metrics) = Client::new(n.port).get("/metrics", &[]);
        assert!(metrics.contains(&format!("{hash:016x}")), "{metrics}");
        assert!(!metrics.contains(KEY), "raw key in nginx's metrics");
        assert!(!n.error_log().contains(KEY), "raw key in nginx's error log");
    }
}

/// Bytes of the file each download of the charge test sends.
const OBJECT: usize = 10_000;

#[test]
#[ignore = "needs nginx and the module: make test-cluster"]
fn bytes_charged_after_the_response_on_two_nginx_reach_both_roots_and_limit_both() {
    let db = Db::new();
    let roots = [Root::start(&db, "root-a"), Root::start(&db, "root-b")];
    // 100 KB of burst leaking 1 byte a second: the level is what was
    // charged, give or take a few bytes.
    roots[0].put(
        "dl_bytes",
        json!({"limit": 1.0, "low_burst": 100_000.0, "high_burst": 100_000.0}),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let http_block = format!(
        "    sluice_zone 1m;\n    sluice_root {} {};\n    sluice_sync_interval 200ms;",
        roots[0].url, roots[1].url
    );
    let server_block = "        location /d/ { alias html/; sluice dl_bytes weight=0; \
         sluice_charge dl_bytes weight=$body_bytes_sent; }";
    let nginx: Vec<Nginx> = ["nginx-a", "nginx-b"]
        .iter()
        .map(|n| {
            let prefix = dir.path().join(n);
            std::fs::create_dir_all(prefix.join("html")).expect("html");
            std::fs::write(prefix.join("html/object.bin"), vec![b'x'; OBJECT]).expect("object");
            Nginx::start(&prefix, &http_block, server_block)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));

    // Six downloads on each: 60 KB each, under the burst alone, 120 KB
    // together.
    for n in &nginx {
        let mut client = Client::new(n.port);
        for _ in 0..6 {
            let (status, body) = client.get("/d/object.bin", &[]);
            assert_eq!((status, body.len()), (200, OBJECT));
        }
    }
    // Both roots get every host's charges.
    let fleet = 12.0 * OBJECT as f64;
    sync_support::wait_until("both roots hold the bytes charged on both nginx", || {
        roots.iter().all(|r| {
            let level = r.get("dl_bytes")["level"].as_f64().unwrap_or(0.0);
            (fleet - 30.0..=fleet).contains(&level)
        })
    });
    // And each nginx sees the fleet's debt: its own 60 KB would pass, the
    // fleet's 120 KB does not.
    for n in &nginx {
        let mut passed = true;
        for _ in 0..50 {
            let (status, _) = Client::new(n.port).get("/d/object.bin", &[]);
            if status == 429 {
                passed = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!passed, "nginx on {} never saw the fleet's debt", n.port);
    }
}

/// The body of `GET path` from a root (text, not JSON).
fn raw_get(url: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

/// One sample of `series` in the metrics of nginx on `port`.
fn nginx_metric(port: u16, series: &str) -> f64 {
    let (_, metrics) = Client::new(port).get("/metrics", &[]);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {metrics}"))
}

#[test]
#[ignore = "needs nginx and the module: make test-cluster"]
fn a_penalty_started_on_one_nginx_bars_the_key_on_the_other_within_two_sync_intervals() {
    let db = Db::new();
    let roots = [Root::start(&db, "root-a"), Root::start(&db, "root-b")];
    // 1/s with a burst of 2: a third request at once starts the penalty;
    // by level alone the key would pass again within two seconds.
    roots[0].put(
        "login",
        json!({"limit": 1, "low_burst": 2, "high_burst": 2, "per_key": true, "penalty": "15m"}),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let http_block = format!(
        "    sluice_zone 1m;\n    sluice_keys 1m;\n    sluice_root {} {};\n    \
         sluice_sync_interval 200ms;",
        roots[0].url, roots[1].url
    );
    let server_block =
        "        location /login { alias html/index.html; sluice login key=$http_x_token; }\n        \
         location = /metrics { sluice_metrics; }";
    let nginx: Vec<Nginx> = ["nginx-a", "nginx-b"]
        .iter()
        .map(|n| Nginx::start(&dir.path().join(n), &http_block, server_block))
        .collect();
    let (a, b) = (nginx[0].port, nginx[1].port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while nginx_metric(a, "sluice_quotas") < 1.0 || nginx_metric(b, "sluice_quotas") < 1.0 {
        assert!(Instant::now() < deadline, "nginx never got the template");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mallory = ["X-Token: mallory"];
    let mut on_a = Client::new(a);
    let statuses: Vec<u16> = (0..3).map(|_| on_a.get("/login", &mallory).0).collect();
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(nginx_metric(a, "sluice_penalties_started_total"), 1.0);
    let cycles = nginx_metric(b, "sluice_sync_cycles_total");
    while nginx_metric(b, "sluice_penalties") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the penalty never reached nginx-b"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // nginx-a sends it in its next cycle, nginx-b receives it in its next
    // one after that: two intervals (a cycle under way counts as one).
    let took = nginx_metric(b, "sluice_sync_cycles_total") - cycles;
    assert!(took <= 3.0, "{took} cycles of nginx-b");
    // Long after the level alone would let it pass, the key is barred on
    // both, and counted as penalized there; another key passes.
    std::thread::sleep(Duration::from_millis(2500));
    let mut on_b = Client::new(b);
    assert_eq!(on_b.get("/login", &mallory).0, 429);
    assert_eq!(on_a.get("/login", &mallory).0, 429);
    assert!(nginx_metric(b, "sluice_penalized_checks_total") >= 1.0);
    assert_eq!(on_b.get("/login", &["X-Token: alice"]).0, 200);
}
