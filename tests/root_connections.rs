//! Connection hardening of the root, against a real root on loopback:
//! a slowloris request is cut at the header timeout, an idle connection
//! at the idle timeout, a trickling body at the body timeout; idle
//! connections are shed (per address, and at the global limit) while
//! `/healthz` and an authenticated `/v1/sync` still answer, and the
//! connection that showed a token is kept.
//!
//! Clients here speak HTTP/1.1 over raw sockets so that each test knows
//! exactly which connection a request used. Time bounds are generous: they
//! only separate "closed by the root" from "never closed".

mod root_support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use root_support::raw::{connect_from, exchange, exchange_raw};
use root_support::{config_with_tokens, eventually, Db, Limiter, TestRoot, SYNC_TOKEN};

/// Longest a test waits for the root to close a connection it should.
const CLOSE_PATIENCE: Duration = Duration::from_secs(20);

fn healthz() -> Vec<u8> {
    b"GET /healthz HTTP/1.1\r\nHost: root\r\n\r\n".to_vec()
}

fn sync_request(limiter: &Limiter) -> Vec<u8> {
    let body = serde_json::to_vec(&limiter.request(&[])).unwrap();
    let mut request = format!(
        "POST /v1/sync HTTP/1.1\r\nHost: root\r\nAuthorization: Bearer {SYNC_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    request
}

/// Waits until the root closes `stream` (EOF or reset); returns how long
/// that took. Fails the test after [`CLOSE_PATIENCE`].
async fn closed_by_root(stream: &mut TcpStream) -> Duration {
    let started = Instant::now();
    let mut chunk = [0u8; 1024];
    loop {
        let read = tokio::time::timeout(CLOSE_PATIENCE, stream.read(&mut chunk))
            .await
            .expect("the root closes the connection");
        match read {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => {}
        }
    }
}

/// True if the root has closed `stream` (checked without waiting long).
async fn is_closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(Duration::from_millis(50), stream.read(&mut byte)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => panic!("unexpected bytes from the root"),
        Err(_) => false,
    }
}

/// One sample of `/metrics`, fetched on a new connection (a pooled one
/// may have been shed), or -1 when absent.
async fn metric(root: &TestRoot, series: &str) -> f64 {
    let mut conn = connect_from(root.addr, "127.0.0.1").await;
    let request = b"GET /metrics HTTP/1.1\r\nHost: root\r\nConnection: close\r\n\r\n";
    let (status, body) = exchange_raw(&mut conn, request).await;
    assert_eq!(status, 200);
    String::from_utf8(body)
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_request_is_cut_at_the_header_timeout() {
    let db = Db::sqlite();
    let config = root_support::config(&db);
    let root = TestRoot::start(sluice::root::RootConfig {
        header_timeout: Duration::from_millis(800),
        ..config
    })
    .await;
    let mut slow = connect_from(root.addr, "127.0.0.1").await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    // One byte every 100 ms, never finishing the head.
    let started = Instant::now();
    let trickle = async {
        for _ in 0..200 {
            if slow.write_all(b"X").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the root never cut the trickling request");
    };
    tokio::time::timeout(CLOSE_PATIENCE, trickle)
        .await
        .expect("cut in time");
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(
        metric(
            &root,
            "sluice_root_connections_closed_total{reason=\"header_timeout\"}"
        )
        .await,
        1.0
    );
    // A connection that says nothing at all is cut the same way.
    let mut silent = connect_from(root.addr, "127.0.0.1").await;
    closed_by_root(&mut silent).await;
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let db = Db::sqlite();
    let root = TestRoot::start(sluice::root::RootConfig {
        idle_timeout: Duration::from_millis(800),
        ..root_support::config(&db)
    })
    .await;
    let mut client = connect_from(root.addr, "127.0.0.1").await;
    let (status, _) = exchange(&mut client, &healthz()).await;
    assert_eq!(status, 200);
    let idle = closed_by_root(&mut client).await;
    assert!(idle >= Duration::from_millis(700), "{idle:?}");
    // This one and the harness's pooled client from `wait_ready`.
    let idled = metric(
        &root,
        "sluice_root_connections_closed_total{reason=\"idle_timeout\"}",
    )
    .await;
    assert!(idled >= 1.0, "{idled}");
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes() {
    let db = Db::sqlite();
    let root = TestRoot::start(sluice::root::RootConfig {
        body_timeout: Duration::from_millis(800),
        ..config_with_tokens(&db)
    })
    .await;
    let mut client = connect_from(root.addr, "127.0.0.1").await;
    let head = format!(
        "POST /v1/sync HTTP/1.1\r\nHost: root\r\nAuthorization: Bearer {SYNC_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"limiter\":"
    );
    let started = Instant::now();
    let (status, body) = exchange(&mut client, head.as_bytes()).await;
    assert_eq!(status, 408, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("body_timeout"),
        "{body}"
    );
    closed_by_root(&mut client).await;
    assert_eq!(
        metric(
            &root,
            "sluice_root_rejected_requests_total{api=\"sync\",reason=\"body_timeout\"}"
        )
        .await,
        1.0
    );
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_over_its_limit_loses_its_oldest_idle_connection_and_no_other() {
    let db = Db::sqlite();
    let root = TestRoot::start(sluice::root::RootConfig {
        max_connections_per_address: 5,
        ..root_support::config(&db)
    })
    .await;
    // Another client address, already connected: not this address's flood.
    let mut neighbour = connect_from(root.addr, "127.0.0.2").await;
    let mut flood = Vec::new();
    for _ in 0..5 {
        flood.push(connect_from(root.addr, "127.0.0.3").await);
    }
    // Give the root time to admit all of them, in order.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for c in &mut flood {
        assert!(!is_closed(c).await);
    }
    let mut sixth = connect_from(root.addr, "127.0.0.3").await;
    closed_by_root(&mut flood[0]).await;
    for c in &mut flood[1..] {
        assert!(!is_closed(c).await);
    }
    assert!(!is_closed(&mut neighbour).await);
    // The newcomer is served.
    let (status, _) = exchange(&mut sixth, &healthz()).await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(
            &root,
            "sluice_root_connections_closed_total{reason=\"shed_per_address\"}"
        )
        .await,
        1.0
    );
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_floods_are_shed_while_healthz_and_an_authenticated_sync_answer() {
    let db = Db::sqlite();
    let root = TestRoot::start(sluice::root::RootConfig {
        max_connections: 40,
        max_connections_per_address: 30,
        ..config_with_tokens(&db)
    })
    .await;
    // A limiter syncs once with its token: its connection is trusted.
    let mut limiter = Limiter::new("limiter-1");
    let mut limiter_conn = connect_from(root.addr, "127.0.0.1").await;
    let (status, reply) = exchange(&mut limiter_conn, &sync_request(&limiter)).await;
    assert_eq!(status, 200, "{reply}");
    limiter.absorb(&reply);
    eventually("the limiter's connection is trusted", || async {
        metric(&root, "sluice_root_connections_trusted").await == 1.0
    })
    .await;
    // 300 idle connections from five addresses: far more than the root
    // keeps; the oldest are shed as new ones come.
    let mut flood = Vec::new();
    for i in 0..300 {
        let source = format!("127.0.1.{}", i % 5 + 1);
        flood.push(connect_from(root.addr, &source).await);
    }
    eventually("the root sheds down to its limit", || async {
        metric(&root, "sluice_root_connections").await <= 40.0
    })
    .await;
    // A probe on a new connection is answered.
    let mut probe = connect_from(root.addr, "127.0.0.1").await;
    let (status, health) = exchange(&mut probe, &healthz()).await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    // The limiter syncs again on the same connection.
    let (status, reply) = exchange(&mut limiter_conn, &sync_request(&limiter)).await;
    assert_eq!(status, 200, "{reply}");
    // And a new limiter connection is answered too.
    let mut fresh = connect_from(root.addr, "127.0.0.4").await;
    let (status, _) = exchange(&mut fresh, &sync_request(&Limiter::new("limiter-2"))).await;
    assert_eq!(status, 200);
    let shed = metric(
        &root,
        "sluice_root_connections_closed_total{reason=\"shed_full\"}",
    )
    .await
        + metric(
            &root,
            "sluice_root_connections_closed_total{reason=\"shed_per_address\"}",
        )
        .await;
    assert!(shed >= 260.0, "shed {shed}");
    let mut closed = 0;
    for c in &mut flood {
        if is_closed(c).await {
            closed += 1;
        }
    }
    assert!(closed >= 260, "{closed} of the flood closed");
    drop(flood);
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_settings_are_checked() {
    let db = Db::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("root.toml");
    let load = |text: &str| {
        std::fs::write(&path, format!("db = \"{}\"\n{text}", db.url)).unwrap();
        sluice::root::RootConfig::load(&sluice::root::RootArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
    };
    let config = load(
        "header_timeout = \"2s\"\nidle_timeout = \"30s\"\nbody_timeout = \"5s\"\n\
         max_connections_per_address = 16\n",
    )
    .unwrap();
    assert_eq!(config.header_timeout, Duration::from_secs(2));
    assert_eq!(config.idle_timeout, Duration::from_secs(30));
    assert_eq!(config.body_timeout, Duration::from_secs(5));
    assert_eq!(config.max_connections_per_address, 16);
    for (text, key) in [
        ("header_timeout = \"0s\"\n", "header_timeout"),
        ("idle_timeout = \"soon\"\n", "idle_timeout"),
        (
            "max_connections_per_address = 0\n",
            "max_connections_per_address",
        ),
        (
            "max_connections = 10\nmax_connections_per_address = 11\n",
            "max_connections_per_address",
        ),
    ] {
        let error = load(text).unwrap_err();
        assert!(error.0.contains(key), "{text}: {error}");
    }
}
