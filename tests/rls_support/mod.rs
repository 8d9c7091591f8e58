//! Shared harness of the `rls_*` process tests: a `sluice rls` process on
//! free loopback ports, a gRPC client's one-descriptor question, files
//! written whole.

#![allow(dead_code)]

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

/// Longest a test waits for something that should happen soon.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The `sluice` binary.
pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A port nothing listens on (bound, then let go).
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A `sluice rls` process, killed when dropped.
pub struct Rls {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:PORT` of its gRPC side.
    pub grpc: String,
    /// `127.0.0.1:PORT` of its HTTP side.
    pub http: String,
}

impl Rls {
    /// Starts `sluice rls` on free ports with `args`, and waits until its
    /// gRPC port answers.
    pub async fn start(config: &Path, args: &[&str]) -> Rls {
        let (grpc, http) = (free_port(), free_port());
        let child = Command::new(SLUICE)
            .arg("rls")
            .arg("--listen")
            .arg(format!("127.0.0.1:{grpc}"))
            .arg("--http")
            .arg(format!("127.0.0.1:{http}"))
            .arg("--config")
            .arg(config)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice rls");
        let rls = Rls {
            child,
            grpc: format!("http://127.0.0.1:{grpc}"),
            http: format!("127.0.0.1:{http}"),
        };
        let deadline = Instant::now() + PATIENCE;
        while RateLimitServiceClient::connect(rls.grpc.clone())
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "sluice rls never listened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rls
    }

    /// A client of its gRPC side.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(self.grpc.clone())
            .await
            .expect("connect")
    }

    /// `/metrics`, as text.
    pub async fn metrics(&self) -> String {
        http_get(&self.http, "/metrics").await
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET's body.
pub async fn http_get(host: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// One descriptor `(key, value)` of `domain`, `hits` hits (0: a check
/// that counts nothing).
pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    key: &str,
    value: &str,
    hits: u64,
) -> DescriptorStatus {
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        hits_addend: Some(UInt64Value { value: hits }),
        ..Default::default()
    };
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![descriptor],
            hits_addend: 0,
        })
        .await
        .expect("an answer")
        .into_inner();
    response.statuses[0].clone()
}

/// OK (else OVER_LIMIT).
pub fn ok(status: &DescriptorStatus) -> bool {
    status.code == Code::Ok as i32
}

/// Writes `dir/name` whole at once (a temporary file renamed), so a
/// watcher never reads half of it.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let temporary = dir.join(format!(".{name}.new"));
    std::fs::write(&temporary, text).expect("write");
    std::fs::rename(&temporary, &path).expect("rename");
    path
}

/// Runs `command` to its end off the runtime.
pub async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run sluice"))
        .await
        .unwrap()
}

/// Waits while fewer than `margin` seconds are left in this UTC hour, so
/// that a test's hits fall in one window.
pub async fn away_from_the_hour_end(margin: f64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let left = 3600.0 - now % 3600.0;
    if left < margin {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.1)).await;
    }
}

/// The ```yaml blocks of a Markdown text whose first line starts with
/// `prefix`.
pub fn yaml_blocks<'a>(markdown: &'a str, prefix: &str) -> Vec<&'a str> {
    markdown
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("\n```").map(|(block, _)| block))
        .filter(|block| block.starts_with(prefix))
        .collect()
}

/// A listener of an Envoy bootstrap on 127.0.0.1:`port`: HTTP, with
/// `routes` (the YAML items of its one virtual host's routes, indented
/// for it) and, when `rate_limit` names one `(domain, failure_mode_deny)`,
/// the rate limit filter calling cluster `rls` before the router.
pub fn envoy_listener(
    name: &str,
    port: u16,
    routes: &str,
    rate_limit: Option<(&str, bool)>,
) -> String {
    let filter = match rate_limit {
        None => String::new(),
        Some((domain, deny)) => format!(
            "
          - name: envoy.filters.http.ratelimit
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              failure_mode_deny: {deny}
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: rls}}}}"
        ),
    };
    format!(
        "  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: all
              domains: [\"*\"]
              routes:
{routes}          http_filters:{filter}
          - name: envoy.filters.http.router
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"
    )
}

/// A route of [`envoy_listener`]: `prefix` to cluster `backend`, with one
/// rate limit made of `actions` (YAML flow items), or none.
pub fn envoy_route(prefix: &str, actions: Option<&str>) -> String {
    let limits = actions
        .map(|a| format!("\n                  rate_limits: [{{actions: [{a}]}}]"))
        .unwrap_or_default();
    format!(
        "              - match: {{prefix: {prefix}}}
                route:
                  cluster: backend{limits}
"
    )
}

/// A whole bootstrap: admin on `admin`; `listeners`; the listener
/// `backend` on `backend`, answering 200 itself (the rate limit filter
/// runs only on routes to a cluster), and its cluster; the cluster `rls`
/// (HTTP/2) to `sluice rls` on `rls`.
pub fn envoy_bootstrap(admin: u16, listeners: &[String], backend: u16, rls: u16) -> String {
    let answer = "              - match: {prefix: /}
                direct_response: {status: 200, body: {inline_string: ok}}
";
    let cluster = |name: &str, port: u16, options: &str| {
        format!(
            "  - name: {name}
    type: STATIC
    connect_timeout: 0.25s{options}
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}
"
        )
    };
    let http2 = "
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}";
    format!(
        "admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
{}{}  clusters:
{}{}",
        listeners.concat(),
        envoy_listener("backend", backend, answer, None),
        cluster("backend", backend, ""),
        cluster("rls", rls, http2),
    )
}

/// An Envoy process, killed when dropped.
pub struct Envoy {
    /// The process.
    pub child: Child,
    /// Its log file.
    pub log: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    /// Runs `command` (Envoy's binary, maybe behind `taskset`) with the
    /// bootstrap `config`, one worker and its log in `log`, and waits
    /// until its admin side on `admin` says it is ready.
    pub async fn start(mut command: Command, config: &Path, admin: u16, log: PathBuf) -> Envoy {
        let child = command
            .arg("-c")
            .arg(config)
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .args(["--log-level", "warn", "--log-path"])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy { child, log };
        let ready = format!("http://127.0.0.1:{admin}/ready");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let answer = client.get(&ready).send().await;
            if answer.is_ok_and(|a| a.status().is_success()) {
                return envoy;
            }
            let exited = envoy.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "envoy not ready ({exited:?}); its log: {}",
                std::fs::read_to_string(&envoy.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
