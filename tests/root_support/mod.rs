//! Shared harness of the `root_*` integration tests: in-process roots on
//! `127.0.0.1:0`, an HTTP client, and throwaway databases (an SQLite file
//! in a temp dir, or a fresh database in a throwaway PostgreSQL cluster).

#![allow(dead_code)]

pub mod postgres;
pub mod raw;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sluice::root::auth::Token;
use sluice::root::RootConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use postgres::PgCluster;

/// Admin token of test roots that use one.
pub const ADMIN_TOKEN: &str = "admin-secret";
/// Sync token of test roots that use one.
pub const SYNC_TOKEN: &str = "sync-secret";

/// Longest a test waits for something that should happen soon.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A database for one test; dropping it removes it.
pub struct Db {
    /// URL for `--db`.
    pub url: String,
    /// Keeps the SQLite directory alive.
    _dir: Option<tempfile::TempDir>,
}

impl Db {
    /// A new SQLite file in a temp dir.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/sluice.db", dir.path().display());
        Self {
            url,
            _dir: Some(dir),
        }
    }

    /// A new database in the shared PostgreSQL cluster of this test
    /// binary, or `None` (after saying why) when PostgreSQL is not
    /// installed and `CI` is not set.
    pub async fn postgres() -> Option<Self> {
        let cluster = PgCluster::shared()?;
        Some(Self {
            url: cluster.create_database().await,
            _dir: None,
        })
    }

    /// A database at `url` that the test manages itself.
    pub fn at(url: String) -> Self {
        Self { url, _dir: None }
    }

    /// A database on a given cluster (one the test may stop and start).
    pub async fn on(cluster: &PgCluster) -> Self {
        Self {
            url: cluster.create_database().await,
            _dir: None,
        }
    }
}

/// Runs `$test(db)` once on SQLite and once on PostgreSQL, as two tests
/// in modules `sqlite` and `postgres`.
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::root_support::Db::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    if let Some(db) = $crate::root_support::Db::postgres().await {
                        super::$test(db).await;
                    }
                }
            )*
        }
    };
}

/// A test configuration: fast reloads, short database timeouts, tokens
/// off.
pub fn config(db: &Db) -> RootConfig {
    RootConfig {
        db: db.url.clone(),
        reload_interval: Duration::from_millis(100),
        db_timeout: Duration::from_secs(2),
        ..RootConfig::default()
    }
}

/// `config` with both tokens set.
pub fn config_with_tokens(db: &Db) -> RootConfig {
    RootConfig {
        admin_token: Some(Token::new(ADMIN_TOKEN).unwrap()),
        sync_token: Some(Token::new(SYNC_TOKEN).unwrap()),
        ..config(db)
    }
}

/// A root served by this process.
pub struct TestRoot {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// Token sent on admin requests.
    pub admin_token: Option<String>,
    /// Token sent on sync requests.
    pub sync_token: Option<String>,
    /// HTTP client.
    pub http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), sluice::root::RootError>>>,
}

impl TestRoot {
    /// Starts a root and waits until it has loaded its quotas.
    pub async fn start(config: RootConfig) -> Self {
        let root = Self::start_unready(config).await;
        root.wait_ready().await;
        root
    }

    /// Starts a root without waiting for its database.
    pub async fn start_unready(config: RootConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let admin_token = config.admin_token.as_ref().map(|t| t.as_str().to_string());
        let sync_token = config.sync_token.as_ref().map(|t| t.as_str().to_string());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sluice::root::run(listener, config, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            url: format!("http://{addr}"),
            admin_token,
            sync_token,
            http: reqwest::Client::builder()
                .timeout(PATIENCE)
                .build()
                .unwrap(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A client of a root started elsewhere (no control over its life).
    pub fn attach(url: &str) -> Self {
        Self {
            addr: url
                .trim_start_matches("http://")
                .parse()
                .expect("http://ip:port"),
            url: url.to_string(),
            admin_token: None,
            sync_token: None,
            http: reqwest::Client::builder()
                .timeout(PATIENCE)
                .build()
                .unwrap(),
            stop: None,
            task: None,
        }
    }

    /// Shuts the root down gracefully and waits for it.
    pub async fn stop(mut self) {
        self.shutdown().await;
    }

    async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(PATIENCE, task).await;
            let result = result
                .expect("root stops within the patience")
                .expect("root task");
            result.expect("root ran without error");
        }
    }

    /// Waits until `/healthz` says ready.
    pub async fn wait_ready(&self) {
        eventually("root ready", || async {
            self.request(Method::GET, "/healthz", None, None).await.0 == StatusCode::OK
        })
        .await;
    }

    /// Sends a request; returns the status and the JSON body (`Null` when
    /// the body is not JSON).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.expect("request reaches the root");
        let status = response.status();
        let bytes = response.bytes().await.expect("reply body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// An admin request with the root's admin token.
    pub async fn admin(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.request(method, path, self.admin_token.as_deref(), body)
            .await
    }

    /// `PUT /v1/quotas/{name}` that must succeed; returns the reply.
    pub async fn put(&self, name: &str, body: Value) -> Value {
        let (status, reply) = self
            .admin(Method::PUT, &format!("/v1/quotas/{name}"), Some(body))
            .await;
        assert!(status.is_success(), "PUT {name}: {status} {reply}");
        reply
    }

    /// `GET /v1/quotas/{name}`.
    pub async fn get(&self, name: &str) -> (StatusCode, Value) {
        self.admin(Method::GET, &format!("/v1/quotas/{name}"), None)
            .await
    }

    /// A sync request with the root's sync token.
    pub async fn sync(&self, request: &Value) -> (StatusCode, Value) {
        let body = serde_json::to_vec(request).unwrap();
        self.request(
            Method::POST,
            "/v1/sync",
            self.sync_token.as_deref(),
            Some(body),
        )
        .await
    }

    /// `/metrics` as text.
    pub async fn metrics(&self) -> String {
        let response = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap();
        response.text().await.unwrap()
    }

    /// One sample of `/metrics` (the line starting with `series `).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A simulated limiter: keeps its cursor, counter version and the root
/// instance between syncs, and the quotas and counters it received.
#[derive(Debug, Default)]
pub struct Limiter {
    /// Its id.
    pub id: String,
    /// Quota cursor.
    pub after: Value,
    /// Counter version.
    pub version: u64,
    /// Root instance of `version`.
    pub instance: u64,
    /// Latest quota received per id.
    pub quotas: std::collections::BTreeMap<u64, Value>,
    /// Latest counter level received per id.
    pub levels: std::collections::BTreeMap<u64, f64>,
}

impl Limiter {
    /// A limiter that knows nothing yet.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.into(),
            after: json!({"epoch": 0, "id": 0}),
            ..Self::default()
        }
    }

    /// The next request, carrying `deltas` as `(quota id, weight)`.
    pub fn request(&self, deltas: &[(u64, u64)]) -> Value {
        let deltas: Vec<Value> = deltas
            .iter()
            .map(|&(id, delta)| json!({"id": id, "delta": delta}))
            .collect();
        json!({
            "limiter": self.id,
            "quotas_after": self.after,
            "counter_version": self.version,
            "root_instance": self.instance,
            "deltas": deltas,
        })
    }

    /// The next request, carrying `deltas` as `(key hash, weight)` for the
    /// keys of the per-key quota `id`.
    pub fn keyed_request(&self, id: u64, deltas: &[(u64, u64)]) -> Value {
        let mut request = self.request(&[]);
        let deltas: Vec<Value> = deltas.iter().map(|&(k, d)| json!([k, d])).collect();
        request["keyed"] = json!([{"id": id, "deltas": deltas}]);
        request
    }

    /// Takes in a sync reply.
    pub fn absorb(&mut self, reply: &Value) {
        for quota in reply["quotas"].as_array().expect("quotas in the reply") {
            self.quotas
                .insert(quota["id"].as_u64().unwrap(), quota.clone());
        }
        for counter in reply["counters"].as_array().expect("counters in the reply") {
            self.levels.insert(
                counter["id"].as_u64().unwrap(),
                counter["level"].as_f64().unwrap(),
            );
        }
        self.after = reply["quotas_after"].clone();
        self.version = reply["counter_version"].as_u64().unwrap();
        self.instance = reply["root_instance"].as_u64().unwrap();
    }

    /// Syncs once with `deltas`; panics on an error reply.
    pub async fn sync(&mut self, root: &TestRoot, deltas: &[(u64, u64)]) -> Value {
        let (status, reply) = root.sync(&self.request(deltas)).await;
        assert_eq!(status, StatusCode::OK, "sync: {reply}");
        self.absorb(&reply);
        reply
    }

    /// Syncs without deltas until no quota pages remain.
    pub async fn catch_up(&mut self, root: &TestRoot) {
        while self.sync(root, &[]).await["more_quotas"] == json!(true) {}
    }

    /// Id of a live quota by name.
    pub fn id_of(&self, name: &str) -> Option<u64> {
        self.quotas
            .values()
            .find(|q| q["name"] == name && q["deleted"] == json!(false))
            .and_then(|q| q["id"].as_u64())
    }
}

/// Polls `condition` until it holds; fails the test after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A quota body for PUT.
pub fn quota(limit: f64, low: f64, high: f64, parent: Option<&str>) -> Value {
    json!({"limit": limit, "low_burst": low, "high_burst": high, "parent": parent})
}
