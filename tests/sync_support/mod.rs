//! Harness of the `sync_*` integration tests: real `sluice root`
//! processes on 127.0.0.1 over SQLite, limiters (a table and its sync
//! thread each, in this process), paced load, and a fake root that
//! misbehaves on purpose.

#![allow(dead_code)]

pub mod fake_root;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::core::estimate::{Estimator, Extrapolation};
use sluice::core::Nanos;
use sluice::sync::{local_now, LogLevel, SyncConfig, SyncHandle, SyncMetrics};
use sluice::table::{Outcome, QuotaState, Table};

/// The `sluice` binary under test.
pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Sync interval of every test limiter.
pub const INTERVAL: Duration = Duration::from_millis(200);

/// Longest a test waits for something that should happen much sooner
/// (a loaded CI machine is slow, never this slow).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Polls `done` every 10 ms until it holds; panics naming `what` after
/// [`PATIENCE`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// One plain HTTP/1.1 exchange (the admin API and health checks); `None`
/// when nothing answers.
pub fn http(url: &str, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).ok()?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).ok()?;
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.split_whitespace().nth(1)?.parse().ok()?;
    let json = reply
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    Some((status, json))
}

/// A quota body for `PUT /v1/quotas/{name}`.
pub fn quota(limit: f64, low_burst: f64, high_burst: f64, parent: Option<&str>) -> Value {
    json!({"limit": limit, "low_burst": low_burst, "high_burst": high_burst, "parent": parent})
}

/// A quota database shared by the roots of one test (an SQLite file in a
/// temp dir, removed at the end).
pub struct Db {
    dir: tempfile::TempDir,
}

impl Db {
    /// A new, empty database.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// Its `--db` URL.
    pub fn url(&self) -> String {
        format!("sqlite://{}/quotas.db", self.dir.path().display())
    }

    /// The directory, for root logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A `sluice root` child process; killed when dropped.
pub struct Root {
    /// Base URL, `http://127.0.0.1:port`.
    pub url: String,
    port: u16,
    db: String,
    log: std::path::PathBuf,
    /// More `sluice root` flags.
    args: Vec<String>,
    child: Option<Child>,
}

impl Root {
    /// Starts a root on a free port over `db` and waits until it serves.
    pub fn start(db: &Db, name: &str) -> Self {
        Self::start_with(db, name, &[])
    }

    /// [`Root::start`] with more flags for `sluice root`.
    pub fn start_with(db: &Db, name: &str, args: &[&str]) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let mut root = Self {
                url: format!("http://127.0.0.1:{port}"),
                port,
                db: db.url(),
                log: db.dir().join(format!("{name}.log")),
                args: args.iter().map(|a| a.to_string()).collect(),
                child: None,
            };
            // Another test may have taken the port in between: try another.
            if root.spawn_and_wait() {
                return root;
            }
        }
        panic!("cannot start a root");
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Its log (stdout and stderr) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process (SIGKILL: no goodbye, as a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port: a new instance with no counters.
    pub fn restart(&mut self) {
        self.kill();
        // The port was ours a moment ago; retry briefly if the kernel is
        // slow to release it.
        let started = Instant::now();
        while !self.spawn_and_wait() {
            assert!(started.elapsed() < PATIENCE, "cannot restart {}", self.url);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `PUT /v1/quotas/{name}`, which must succeed.
    pub fn put(&self, name: &str, body: Value) {
        let reply = http(&self.url, "PUT", &format!("/v1/quotas/{name}"), Some(&body));
        assert!(
            matches!(reply, Some((200..=201, _))),
            "PUT {name}: {reply:?}"
        );
    }

    /// `POST /v1/apply` of a whole quota file, which must succeed.
    pub fn apply(&self, file: &Value) {
        let reply = http(&self.url, "POST", "/v1/apply", Some(file));
        assert!(matches!(reply, Some((200, _))), "apply: {reply:?}");
    }

    /// `DELETE /v1/quotas/{name}`, which must succeed.
    pub fn delete(&self, name: &str) {
        let reply = http(&self.url, "DELETE", &format!("/v1/quotas/{name}"), None);
        assert!(matches!(reply, Some((200, _))), "DELETE {name}: {reply:?}");
    }

    /// The quota as this root shows it (with its cluster level).
    pub fn get(&self, name: &str) -> Value {
        match http(&self.url, "GET", &format!("/v1/quotas/{name}"), None) {
            Some((200, quota)) => quota,
            other => panic!("GET {name}: {other:?}"),
        }
    }

    /// Spawns the process and waits for `/healthz`; false if it exited
    /// first (port taken).
    fn spawn_and_wait(&mut self) -> bool {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("root log file");
        let child = Command::new(SLUICE)
            .args(["root", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--db", &self.db, "--reload-interval", "100ms"])
            .args(&self.args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sluice root");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Some((200, _)) = http(&self.url, "GET", "/healthz", None) {
                return true;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .is_some();
            if exited {
                self.child = None;
                return false;
            }
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            assert!(
                started.elapsed() < PATIENCE,
                "root {} not ready: {log}",
                self.url
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A limiter: a quota table and its sync thread, as the C ABI runs them.
pub struct Limiter {
    /// The table requests are checked against.
    pub table: Arc<Table>,
    /// Its sync thread.
    pub sync: SyncHandle,
    /// What the sync thread logged.
    pub log: Arc<Mutex<Vec<(LogLevel, String)>>>,
    /// Offset of this limiter's clock, nanoseconds.
    pub skew: i64,
}

impl Limiter {
    /// A limiter syncing with `roots` every [`INTERVAL`], its clock off by
    /// `skew` nanoseconds. Requests time out after 1 s (the default, 80%
    /// of the interval, is tight for a loaded CI machine).
    pub fn start(id: &str, roots: &[&str], skew: i64) -> Self {
        Self::start_with(id, roots, |c| c.clock_skew = skew)
    }

    /// [`Limiter::start`] with the sync configuration changed by `adjust`.
    pub fn start_with(id: &str, roots: &[&str], adjust: impl FnOnce(&mut SyncConfig)) -> Self {
        Self::start_sized(id, roots, 64, adjust)
    }

    /// [`Limiter::start_with`] with room for `capacity` quotas (and 1024
    /// keys, 1024 overrides and penalties).
    pub fn start_sized(
        id: &str,
        roots: &[&str],
        capacity: u32,
        adjust: impl FnOnce(&mut SyncConfig),
    ) -> Self {
        // Room for a few keys, for the tests of per-key quotas.
        let table = Arc::new(Table::new_heap_with(capacity, 16, 1024, 1024));
        Self::start_on(id, roots, table, adjust)
    }

    /// [`Limiter::start_with`] over `table`.
    pub fn start_on(
        id: &str,
        roots: &[&str],
        table: Arc<Table>,
        adjust: impl FnOnce(&mut SyncConfig),
    ) -> Self {
        table.set_estimator(Estimator {
            mode: Extrapolation::Adaptive,
            horizon: 2 * INTERVAL.as_nanos() as u64,
        });
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        let mut config = SyncConfig {
            roots: roots.iter().map(|r| r.to_string()).collect(),
            interval: INTERVAL,
            timeout: Some(Duration::from_secs(1)),
            limiter_id: id.to_string(),
            log: Arc::new(move |level, line: &str| {
                sink.lock().unwrap().push((level, line.to_string()));
            }),
            ..SyncConfig::default()
        };
        adjust(&mut config);
        let skew = config.clock_skew;
        let sync = SyncHandle::start(Arc::clone(&table), config).expect("sync thread");
        Self {
            table,
            sync,
            log,
            skew,
        }
    }

    /// This limiter's clock.
    pub fn now(&self) -> Nanos {
        local_now(self.skew)
    }

    /// Checks one request of `weight` on `name`; true if it may pass.
    pub fn check(&self, name: &str, weight: u64) -> bool {
        !matches!(
            self.table.gate().check(name.as_bytes(), weight, self.now()),
            Outcome::Reject(_)
        )
    }

    /// Checks one request of weight 1 on key `key` of the per-key quota
    /// `name`; true if it passed.
    pub fn check_key(&self, name: &str, key: &str) -> bool {
        let item = sluice::table::CheckItem {
            name: name.as_bytes(),
            key: Some(key.as_bytes()),
            weight: 1,
            max_wait: None,
        };
        let options = sluice::table::CheckOptions::default();
        let r = self
            .table
            .gate()
            .check_many(&[item], self.now(), options, || 0.5);
        r.outcome == Outcome::Pass
    }

    /// The quota `name` as this limiter holds it, if it does.
    pub fn quota(&self, name: &str) -> Option<QuotaState> {
        self.table.quota(name.as_bytes(), self.now())
    }

    /// The sync thread's metrics.
    pub fn metrics(&self) -> SyncMetrics {
        self.sync.metrics()
    }

    /// Successful syncs with root `i` so far.
    pub fn syncs(&self, i: usize) -> u64 {
        self.metrics().roots.get(i).map_or(0, |r| r.syncs)
    }

    /// Log lines containing `text`.
    pub fn logged(&self, text: &str) -> usize {
        let log = self.log.lock().unwrap();
        log.iter().filter(|(_, line)| line.contains(text)).count()
    }
}

/// What one limiter was offered and admitted during a load phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests checked.
    pub offered: u64,
    /// Requests that passed.
    pub admitted: u64,
}

/// Offers every limiter its rate (checks of weight 1 per second on
/// `name`) for `duration`, paced by elapsed time so that a stalled
/// machine offers the same total. Requests a stall delayed are caught up
/// in the order they were due, interleaved across limiters, so that no
/// limiter gets its share of a backlog before the others.
pub fn offer(name: &str, load: &[(&Limiter, f64)], duration: Duration) -> Vec<Counts> {
    let started = Instant::now();
    let mut counts = vec![Counts::default(); load.len()];
    // When each limiter's next request is due, in seconds from the start.
    let due = |c: &Counts, rate: f64| (c.offered + 1) as f64 / rate;
    loop {
        let elapsed = started.elapsed().min(duration).as_secs_f64();
        loop {
            let next = load
                .iter()
                .zip(&counts)
                .enumerate()
                .filter(|(_, ((_, rate), _))| *rate > 0.0)
                .map(|(i, ((_, rate), c))| (due(c, *rate), i))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let Some((_, i)) = next.filter(|(at, _)| *at <= elapsed) else {
                break;
            };
            counts[i].offered += 1;
            counts[i].admitted += u64::from(load[i].0.check(name, 1));
        }
        if elapsed >= duration.as_secs_f64() {
            return counts;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Admitted requests over all limiters.
pub fn admitted(counts: &[Counts]) -> u64 {
    counts.iter().map(|c| c.admitted).sum()
}
