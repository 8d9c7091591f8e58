//! Database outages: PostgreSQL stopped and started under a running root,
//! PostgreSQL that stops answering mid-query, and roots started while
//! their database is unreachable.

mod root_support;

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use root_support::{config, eventually, quota, Db, Limiter, PgCluster, TestRoot};

async fn health(root: &TestRoot) -> (StatusCode, serde_json::Value) {
    root.request(Method::GET, "/healthz", None, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_serves_read_only_while_postgres_is_down_and_recovers_by_itself() {
    let Some(cluster) = PgCluster::private() else {
        return;
    };
    let db = Db::on(&cluster).await;
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(0.0, 100.0, 100.0, None)).await;
    let mut limiter = Limiter::new("h");
    limiter.catch_up(&root).await;
    let id = limiter.id_of("q").unwrap();
    limiter.sync(&root, &[(id, 5)]).await;

    cluster.stop().await;
    eventually("the root notices the outage", || async {
        root.metric("sluice_root_db_up").await == Some(0.0)
    })
    .await;
    // Syncs go on with the quotas and counters the root holds.
    limiter.sync(&root, &[(id, 5)]).await;
    assert_eq!(limiter.levels[&id], 10.0);
    assert_eq!(root.get("q").await.0, StatusCode::OK);
    // Writes are refused with the reason.
    let (status, reply) = root
        .admin(Method::PUT, "/v1/quotas/r", Some(json!({"limit": 1})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("database unavailable"),
        "{reply}"
    );
    let (status, apply) = root.admin(Method::POST, "/v1/apply", Some(json!([]))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{apply}");
    let (status, state) = health(&root).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&state["status"], &state["db"]),
        (&json!("degraded"), &json!("down"))
    );
    assert!(state["db_error"].is_string());
    assert!(state["db_down_secs"].as_f64() >= Some(0.0), "{state}");
    assert!(root.metric("sluice_root_db_down_seconds").await >= Some(0.0));
    assert!(
        root.metric("sluice_root_reloads_total{result=\"failed\"}")
            .await
            >= Some(1.0)
    );

    cluster.start().await;
    eventually("the root reconnects", || async {
        health(&root).await.1["db"] == "up"
    })
    .await;
    assert_eq!(root.metric("sluice_root_db_up").await, Some(1.0));
    assert_eq!(root.metric("sluice_root_db_down_seconds").await, None);
    root.put("r", json!({"limit": 1})).await;
    limiter.sync(&root, &[]).await;
    assert!(limiter.id_of("r").is_some());
    assert_eq!(limiter.levels[&id], 10.0);
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_started_while_postgres_is_down_serves_nothing_until_it_has_loaded() {
    let Some(cluster) = PgCluster::private() else {
        return;
    };
    let db = Db::on(&cluster).await;
    let first = TestRoot::start(config(&db)).await;
    first.put("q", quota(1.0, 1.0, 1.0, None)).await;
    first.stop().await;
    cluster.stop().await;

    let root = TestRoot::start_unready(config(&db)).await;
    eventually("a failed connection attempt", || async {
        root.metric("sluice_root_reloads_total{result=\"failed\"}")
            .await
            >= Some(1.0)
    })
    .await;
    let (status, state) = health(&root).await;
    assert_eq!(
        (status, &state["status"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("starting"))
    );
    let (status, reply) = root.sync(&Limiter::new("h").request(&[])).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert_eq!(
        root.admin(Method::GET, "/v1/quotas", None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(root.get("q").await.0, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = root
        .admin(Method::PUT, "/v1/quotas/r", Some(json!({"limit": 1})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(root.metric("sluice_root_ready").await, Some(0.0));
    assert_eq!(
        root.metric("sluice_root_syncs_total{result=\"unavailable\"}")
            .await,
        Some(1.0)
    );

    cluster.start().await;
    root.wait_ready().await;
    let mut limiter = Limiter::new("h");
    limiter.catch_up(&root).await;
    assert!(limiter.id_of("q").is_some());
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_whose_sqlite_file_cannot_be_opened_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-yet");
    let db = Db::at(format!("sqlite://{}/sluice.db", missing.display()));
    let root = TestRoot::start_unready(config(&db)).await;
    eventually("a failed open", || async {
        root.metric("sluice_root_db_up").await == Some(0.0)
    })
    .await;
    assert_eq!(health(&root).await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        root.sync(&Limiter::new("h").request(&[])).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );

    std::fs::create_dir(&missing).unwrap();
    root.wait_ready().await;
    root.put("q", json!({"limit": 1})).await;
    root.stop().await;
}

/// A file that is not a database: `/healthz` and the metrics name SQLite's
/// own error, not only that the pool gave up waiting for a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_shows_the_databases_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.db");
    std::fs::write(&file, "not a database, just some text ".repeat(64)).unwrap();
    let db = Db::at(format!("sqlite://{}", file.display()));
    let root = TestRoot::start_unready(config(&db)).await;
    eventually("the root notices", || async {
        root.metric("sluice_root_db_up").await == Some(0.0)
    })
    .await;
    let (status, state) = health(&root).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(state["db"], json!("down"));
    let error = state["db_error"].as_str().unwrap();
    assert!(error.contains("file is not a database"), "{state}");
    root.stop().await;
}

/// A TCP relay to a database that stops moving bytes, in both directions
/// and on every connection, when a client sends a given marker (and until
/// told to resume), while keeping its connections open: a database host
/// that stops answering in the middle of a query.
struct StallRelay {
    port: u16,
    flowing: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl StallRelay {
    async fn start(upstream: u16, marker: &'static [u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let flowing = Arc::new(watch::Sender::new(true));
        let gate = flowing.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, &gate, Some(marker)),
                        pump(server_read, client_write, &gate, None),
                    );
                });
            }
        });
        Self {
            port,
            flowing,
            task,
        }
    }

    fn stalled(&self) -> bool {
        !*self.flowing.borrow()
    }

    fn resume(&self) {
        self.flowing.send_replace(true);
    }
}

impl Drop for StallRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` while the gate is open and holds the bytes while
/// it is shut; shuts it on reading `marker`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    gate: &watch::Sender<bool>,
    marker: Option<&[u8]>,
) {
    let mut open = gate.subscribe();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if open.wait_for(|open| *open).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if marker.is_some_and(|m| buf[..n].windows(m.len()).any(|w| w == m)) {
            gate.send_replace(false);
        }
        if open.wait_for(|open| *open).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_gives_up_on_a_database_that_stops_answering_mid_query() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    let upstream: u16 = db
        .url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next()?.parse().ok())
        .expect("a port in the database URL");
    let relay = StallRelay::start(upstream, b"stall_here").await;
    let relayed = Db::at(db.url.replacen(
        &format!(":{upstream}/"),
        &format!(":{}/", relay.port),
        1,
    ));
    let mut config = config(&relayed);
    config.db_query_timeout = Duration::from_secs(1);
    let root = TestRoot::start(config).await;
    root.put("q", quota(10.0, 100.0, 100.0, None)).await;

    // The write's connection passed its health check and its transaction
    // began; the statement naming the quota never gets an answer. The
    // write gives up after db_query_timeout (the test client would wait
    // 30 s) and says why.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/stall_here",
            Some(json!({"limit": 1})),
        )
        .await;
    assert!(relay.stalled(), "the write reached the database");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("db_query_timeout"), "{reply}");
    eventually("reloads fail too and mark the database down", || async {
        root.metric("sluice_root_db_up").await == Some(0.0)
    })
    .await;
    // What the root holds is still served.
    assert_eq!(root.get("q").await.0, StatusCode::OK);

    relay.resume();
    eventually("the root uses the database again", || async {
        health(&root).await.1["db"] == "up"
    })
    .await;
    root.put("r", json!({"limit": 1})).await;
    assert_eq!(root.get("r").await.0, StatusCode::OK);
    // The abandoned write was rolled back, not half applied.
    assert_eq!(root.get("stall_here").await.0, StatusCode::NOT_FOUND);
    root.stop().await;
}
