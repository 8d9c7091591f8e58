//! Database outages: PostgreSQL stopped and started under a running root,
//! PostgreSQL that stops answering mid-query, and roots started while
//! their database is unreachable. And a database that answers but must
//! not be written (`src/root/store/watch.rs`): an SQLite file deleted,
//! moved away, replaced or made read-only under a running root,
//! PostgreSQL refusing writes, an epoch gone back; in each case no write
//! is acknowledged that is not in the database the root reads again, syncs
//! are still served from memory, and the root recovers when the database
//! does.

mod root_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::{Connection, Executor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use root_support::{
    config, config_with_tokens, eventually, quota, Db, Limiter, PgCluster, TestRoot, ADMIN_TOKEN,
};

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
    // Degraded: 503 with the reason, though syncs are served (ready).
    let (status, state) = health(&root).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        (
            &state["status"],
            &state["db"],
            &state["ready"],
            &state["writable"]
        ),
        (
            &json!("degraded"),
            &json!("down"),
            &json!(true),
            &json!(false)
        )
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

// ------------------------------------------------------------------
// A database that answers but must not be written.

/// An SQLite database in a temp dir, with its path.
fn sqlite_db() -> (tempfile::TempDir, PathBuf, Db) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let db = Db::at(format!("sqlite://{}", path.display()));
    (dir, path, db)
}

/// `path` with `suffix` appended (`-wal`, `-shm`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Renames an SQLite database and its `-wal` and `-shm` files.
fn move_database(from: &Path, to: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let source = with_suffix(from, suffix);
        if source.exists() {
            std::fs::rename(&source, with_suffix(to, suffix)).unwrap();
        }
    }
}

/// Waits until `/healthz` says the root takes no writes because of
/// something the reason contains; returns the reply.
async fn refusing_writes(root: &TestRoot, because: &str) -> Value {
    eventually(&format!("the root refuses writes: {because}"), || async {
        let (status, state) = health(root).await;
        status == StatusCode::SERVICE_UNAVAILABLE
            && state["status"] == "degraded"
            && state["ready"] == true
            && state["writable"] == false
            && state["db_error"]
                .as_str()
                .is_some_and(|e| e.contains(because))
    })
    .await;
    assert_eq!(root.metric("sluice_root_db_writable").await, Some(0.0));
    health(root).await.1
}

/// Waits until the root takes writes again.
async fn taking_writes(root: &TestRoot) {
    eventually("the root takes writes again", || async {
        let (status, state) = health(root).await;
        status == StatusCode::OK && state["writable"] == true
    })
    .await;
    assert_eq!(root.metric("sluice_root_db_writable").await, Some(1.0));
}

/// Every kind of write is answered 503 naming `because`.
async fn writes_are_refused(root: &TestRoot, because: &str) {
    let writes = [
        (Method::PUT, "/v1/quotas/lost_write", json!({"limit": 1})),
        (Method::PATCH, "/v1/quotas/q", json!({"limit": 7})),
        (Method::DELETE, "/v1/quotas/q", Value::Null),
        (
            Method::POST,
            "/v1/apply",
            json!([{"name": "lost_apply", "limit": 1}]),
        ),
    ];
    for (method, path, body) in writes {
        let body = (!body.is_null()).then_some(body);
        let (status, reply) = root.admin(method.clone(), path, body).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {path}: {reply}"
        );
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(because), "{method} {path}: {reply}");
        assert!(message.contains("read-only"), "{method} {path}: {reply}");
    }
}

/// Syncs still work, and a limiter that starts now gets every quota the
/// root holds (not an empty or older set).
async fn syncs_are_served_from_memory(root: &TestRoot, names: &[&str]) {
    let mut fresh = Limiter::new(&format!("fresh-{}", names.len()));
    fresh.catch_up(root).await;
    for name in names {
        let id = fresh
            .id_of(name)
            .unwrap_or_else(|| panic!("{name} is served"));
        fresh.sync(root, &[(id, 1)]).await;
        assert!(fresh.levels.contains_key(&id), "{name} counts");
    }
    for gone in ["lost_write", "lost_apply"] {
        assert!(fresh.id_of(gone).is_none(), "{gone} was never written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_sqlite_file_is_noticed_and_no_write_is_acknowledged_into_it() {
    let (_dir, path, db) = sqlite_db();
    let root = TestRoot::start(config(&db)).await;
    root.put("q", json!({"limit": 5, "window": "1m", "sliding": true}))
        .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(&path, suffix));
    }
    let state = refusing_writes(&root, "was deleted").await;
    assert_eq!(state["db"], "read_only", "{state}");
    writes_are_refused(&root, "was deleted").await;
    syncs_are_served_from_memory(&root, &["q"]).await;
    // The root reads nothing from the path, and creates nothing there.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!path.exists(), "no empty database appears in its place");
    assert_eq!(root.get("q").await.0, StatusCode::OK);
    root.stop().await;
}

/// `/healthz` is public: without the token it says the root is degraded
/// and why in general words, never the database's own error, which names
/// the file; the admin token shows that too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_without_the_token_says_why_without_naming_the_file() {
    let (dir, path, db) = sqlite_db();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    root.put("q", json!({"limit": 5})).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(&path, suffix));
    }
    let admin = || root.request(Method::GET, "/healthz", Some(ADMIN_TOKEN), None);
    eventually("the root refuses writes", || async {
        admin().await.1["db_error"]
            .as_str()
            .is_some_and(|e| e.contains("was deleted"))
    })
    .await;
    let (status, detail) = admin().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let where_it_was = dir.path().display().to_string();
    assert!(
        detail["db_error"].as_str().unwrap().contains(&where_it_was),
        "the admin sees the file: {detail}"
    );

    let (status, public) = health(&root).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        (&public["status"], &public["db"], &public["writable"]),
        (&json!("degraded"), &json!("read_only"), &json!(false))
    );
    let reason = public["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("takes no writes"), "{public}");
    assert!(public.get("db_error").is_none(), "{public}");
    assert!(!public.to_string().contains(&where_it_was), "{public}");
    assert_eq!(detail["reason"], public["reason"]);

    let (status, _) = root
        .request(Method::GET, "/healthz", Some("wrong"), None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    root.stop().await;
}

/// Only the write-ahead log deleted: the root's connections write on into
/// a file no restart would read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_write_ahead_log_is_noticed() {
    let (_dir, path, db) = sqlite_db();
    let root = TestRoot::start(config(&db)).await;
    root.put("q", json!({"limit": 5})).await;
    let wal = with_suffix(&path, "-wal");
    assert!(wal.exists(), "the database is in WAL mode");
    std::fs::remove_file(&wal).unwrap();
    refusing_writes(&root, "-wal was deleted").await;
    writes_are_refused(&root, "-wal was deleted").await;
    syncs_are_served_from_memory(&root, &["q"]).await;
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_moved_away_and_back_is_noticed_both_ways() {
    let (dir, path, db) = sqlite_db();
    let root = TestRoot::start(config(&db)).await;
    root.put("q", json!({"limit": 5})).await;
    let aside = dir.path().join("aside.db");
    move_database(&path, &aside);
    refusing_writes(&root, "was deleted").await;
    writes_are_refused(&root, "was deleted").await;
    move_database(&aside, &path);
    taking_writes(&root).await;
    root.put("after", json!({"limit": 1})).await;
    root.stop().await;
    // Everything acknowledged is in the file, read by a new root.
    let again = TestRoot::start(config(&db)).await;
    for name in ["q", "after"] {
        assert_eq!(again.get(name).await.0, StatusCode::OK, "{name}");
    }
    assert_eq!(again.get("lost_write").await.0, StatusCode::NOT_FOUND);
    again.stop().await;
}

/// Writes race the file leaving its path: every acknowledged write is in
/// the file that was there when it was acknowledged, and writes after it
/// left are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_when_the_file_leaves_under_writes() {
    let (dir, path, db) = sqlite_db();
    let root = Arc::new(TestRoot::start(config(&db)).await);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (root, stop) = (Arc::clone(&root), Arc::clone(&stop));
        async move {
            let mut outcomes = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Acquire) {
                let name = format!("w{i}");
                let (status, _) = root
                    .admin(
                        Method::PUT,
                        &format!("/v1/quotas/{name}"),
                        Some(json!({"limit": 1})),
                    )
                    .await;
                outcomes.push((name, status));
                i += 1;
            }
            outcomes
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let aside = dir.path().join("aside.db");
    move_database(&path, &aside);
    refusing_writes(&root, "was deleted").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Release);
    let outcomes = writer.await.unwrap();
    let acknowledged: Vec<&str> = outcomes
        .iter()
        .filter(|(_, status)| status.is_success())
        .map(|(name, _)| name.as_str())
        .collect();
    let refused = outcomes
        .iter()
        .filter(|(_, status)| *status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!(!acknowledged.is_empty() && refused > 0, "{outcomes:?}");
    assert_eq!(acknowledged.len() + refused, outcomes.len(), "{outcomes:?}");
    Arc::into_inner(root).unwrap().stop().await;

    let moved = Db::at(format!("sqlite://{}", aside.display()));
    let reader = TestRoot::start(config(&moved)).await;
    for name in &acknowledged {
        assert_eq!(
            reader.get(name).await.0,
            StatusCode::OK,
            "acknowledged {name}"
        );
    }
    reader.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_sqlite_file_even_an_empty_one_is_never_served() {
    let (dir, path, db) = sqlite_db();
    let root = TestRoot::start(config(&db)).await;
    root.put("q", json!({"limit": 5})).await;
    let mut limiter = Limiter::new("h");
    limiter.catch_up(&root).await;
    let original = dir.path().join("original.db");
    std::fs::rename(&path, &original).unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    std::fs::rename(&empty, &path).unwrap();
    refusing_writes(&root, "was replaced").await;
    writes_are_refused(&root, "was replaced").await;
    // A limiter that knew the quotas keeps them; a new one gets them all.
    limiter.sync(&root, &[]).await;
    assert!(limiter.id_of("q").is_some());
    syncs_are_served_from_memory(&root, &["q"]).await;
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        0,
        "the replacement is not written to"
    );
    // The file the root opened comes back: all is well again.
    std::fs::rename(&original, &path).unwrap();
    taking_writes(&root).await;
    root.put("after", json!({"limit": 1})).await;
    root.stop().await;
}

/// Makes a file read-only to this process: immutable when running as
/// root (who may write any mode), mode 0444 otherwise; undone on drop.
struct ReadOnlyFile {
    path: PathBuf,
    immutable: bool,
}

impl ReadOnlyFile {
    /// `None` (after saying why) when this system does not let the test
    /// do it; under CI that fails the test instead.
    fn set(path: &Path) -> Option<Self> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let immutable = unsafe { libc::geteuid() } == 0;
        let done = if immutable {
            Command::new("chattr")
                .arg("+i")
                .arg(path)
                .status()
                .is_ok_and(|s| s.success())
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).is_ok()
        };
        if done {
            return Some(Self {
                path: path.to_path_buf(),
                immutable,
            });
        }
        let reason = "cannot make a file read-only here (chattr +i needs CAP_LINUX_IMMUTABLE)";
        if std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false")) {
            panic!("{reason}");
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "warning: skipping a test: {reason}");
        None
    }

    fn undo(&self) {
        if self.immutable {
            let _ = Command::new("chattr").arg("-i").arg(&self.path).status();
        } else {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o644));
        }
    }
}

impl Drop for ReadOnlyFile {
    fn drop(&mut self) {
        self.undo();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_sqlite_file_refuses_writes_until_it_is_writable() {
    let (_dir, path, db) = sqlite_db();
    let root = TestRoot::start(config(&db)).await;
    root.put("q", json!({"limit": 5})).await;
    let Some(read_only) = ReadOnlyFile::set(&path) else {
        return;
    };
    let state = refusing_writes(&root, "is read-only").await;
    assert_eq!(state["db"], "read_only", "{state}");
    writes_are_refused(&root, "is read-only").await;
    syncs_are_served_from_memory(&root, &["q"]).await;
    // Still read: reloads go on.
    assert!(
        root.metric("sluice_root_reload_age_seconds").await < Some(5.0),
        "reloads go on"
    );
    read_only.undo();
    taking_writes(&root).await;
    root.put("after", json!({"limit": 1})).await;
    root.stop().await;
}

/// A superuser connection to the database of `url` (on the test cluster).
async fn superuser(url: &str) -> sqlx::PgConnection {
    let (_, rest) = url.split_once('@').unwrap();
    sqlx::PgConnection::connect(&format!("postgres://postgres@{rest}"))
        .await
        .expect("superuser connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_that_turns_read_only_refuses_writes_until_it_takes_them() {
    let Some(cluster) = PgCluster::private() else {
        return;
    };
    let db = Db::on(&cluster).await;
    let root = TestRoot::start(config(&db)).await;
    root.put("q", json!({"limit": 5})).await;
    let mut admin = superuser(&db.url).await;
    // What an operator does to put a server in read-only maintenance; it
    // reaches open sessions too.
    admin
        .execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .await
        .unwrap();
    admin.execute("SELECT pg_reload_conf()").await.unwrap();
    let state = refusing_writes(&root, "read-only transaction").await;
    assert_eq!(state["db"], "read_only", "{state}");
    writes_are_refused(&root, "read-only transaction").await;
    syncs_are_served_from_memory(&root, &["q"]).await;
    // A root started now cannot migrate, but reads the schema there and
    // serves it, read-only.
    root.stop().await;
    let root = TestRoot::start_unready(config(&db)).await;
    refusing_writes(&root, "read-only transaction").await;
    syncs_are_served_from_memory(&root, &["q"]).await;
    admin
        .execute("ALTER SYSTEM RESET default_transaction_read_only")
        .await
        .unwrap();
    admin.execute("SELECT pg_reload_conf()").await.unwrap();
    taking_writes(&root).await;
    root.put("after", json!({"limit": 1})).await;
    root.stop().await;
}

/// A root pointed at a hot standby (a replica the database failed over
/// from, or to before its promotion): it reads and serves the quotas
/// replicated there, refuses writes, and takes them once the standby is
/// promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_on_a_standby_serves_read_only_until_it_is_promoted() {
    let Some(primary) = PgCluster::private() else {
        return;
    };
    let db = Db::on(&primary).await;
    let writer = TestRoot::start(config(&db)).await;
    writer.put("q", json!({"limit": 5})).await;
    let Some(standby) = primary.standby() else {
        return;
    };
    let replica = Db::at(db.url.replacen(
        &format!(":{}/", primary.port),
        &format!(":{}/", standby.port),
        1,
    ));
    let root = TestRoot::start_unready(config(&replica)).await;
    let state = refusing_writes(&root, "read-only transaction").await;
    assert_eq!(state["db"], "read_only", "{state}");
    writes_are_refused(&root, "read-only transaction").await;
    syncs_are_served_from_memory(&root, &["q"]).await;
    // Writes on the primary reach the standby, and the root reading it.
    writer.put("later", json!({"limit": 1})).await;
    eventually(
        "the standby's root loads what the primary wrote",
        || async { root.get("later").await.0 == StatusCode::OK },
    )
    .await;
    writer.stop().await;
    standby.promote().await;
    taking_writes(&root).await;
    root.put("after", json!({"limit": 1})).await;
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_privilege_is_noticed_and_a_grant_restores_writes() {
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    // A root that is not a superuser, owning its database.
    let url = cluster.create_database().await;
    let name = url.rsplit('/').next().unwrap().to_string();
    let role = format!("{name}_owner");
    let mut admin = superuser(&url).await;
    for statement in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("ALTER DATABASE {name} OWNER TO {role}"),
        format!("GRANT ALL ON SCHEMA public TO {role}"),
    ] {
        admin.execute(statement.as_str()).await.unwrap();
    }
    let db = Db::at(url.replacen("postgres@", &format!("{role}@"), 1));
    let root = TestRoot::start(config(&db)).await;
    root.put("q", json!({"limit": 5})).await;
    admin
        .execute(format!("REVOKE UPDATE ON meta FROM {role}").as_str())
        .await
        .unwrap();
    refusing_writes(&root, "permission denied").await;
    writes_are_refused(&root, "permission denied").await;
    syncs_are_served_from_memory(&root, &["q"]).await;
    admin
        .execute(format!("GRANT UPDATE ON meta TO {role}").as_str())
        .await
        .unwrap();
    taking_writes(&root).await;
    root.put("after", json!({"limit": 1})).await;
    root.stop().await;
}

/// A database whose epoch goes back (restored from an older copy, a new
/// one at the same URL): noticed by the reload, and by a write before any
/// reload looked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_whose_epoch_went_back_is_not_written_until_it_caught_up() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    let mut slow = config(&db);
    slow.reload_interval = Duration::from_secs(3600);
    let root = TestRoot::start(slow).await;
    root.put("a", json!({"limit": 1})).await;
    let reply = root.put("b", json!({"limit": 1})).await;
    let epoch = reply["epoch"].as_u64().unwrap();
    let mut admin = superuser(&db.url).await;
    admin
        .execute("UPDATE meta SET epoch = 1 WHERE id = 1")
        .await
        .unwrap();
    // No reload has looked: the write's own transaction notices.
    let (status, reply) = root
        .admin(Method::PUT, "/v1/quotas/c", Some(json!({"limit": 1})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("behind the {epoch}")),
        "{message}"
    );
    refusing_writes(&root, "behind").await;
    writes_are_refused(&root, "behind").await;
    syncs_are_served_from_memory(&root, &["a", "b"]).await;
    root.stop().await;

    // A root checking every 100 ms notices the epoch going back, and
    // writes again once it has caught up.
    let at = |epoch: u64| format!("UPDATE meta SET epoch = {epoch} WHERE id = 1");
    admin.execute(at(epoch).as_str()).await.unwrap();
    let root = TestRoot::start(config(&db)).await;
    admin.execute(at(epoch - 1).as_str()).await.unwrap();
    refusing_writes(&root, "behind").await;
    admin.execute(at(epoch).as_str()).await.unwrap();
    taking_writes(&root).await;
    let reply = root.put("c", json!({"limit": 1})).await;
    assert!(reply["epoch"].as_u64() > Some(epoch), "{reply}");
    root.stop().await;
}
