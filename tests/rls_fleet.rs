//! `sluice rls` as a fleet runs it: the `sluice` binary's `rls` command
//! beside a real root. `sluice quota apply -f ratelimit.yaml` loads the
//! YAML's limits into the root; two `sluice rls` processes with the same
//! YAML and that root hold one limit; with the root gone they keep
//! limiting per host and say so. Also the process's own rules: a bad
//! configuration stops it before it serves, and a bad reload keeps the
//! last good configuration.

mod root_support;

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

use root_support::{
    config_with_tokens, eventually, Db, TestRoot, ADMIN_TOKEN, PATIENCE, SYNC_TOKEN,
};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A `sluice rls` process, killed when dropped.
struct Rls {
    child: Child,
    grpc: String,
    http: String,
}

impl Rls {
    /// Starts `sluice rls` on free ports with `args`, and waits until its
    /// gRPC port answers.
    async fn start(config: &Path, args: &[&str]) -> Rls {
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

    async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(self.grpc.clone())
            .await
            .expect("connect")
    }

    /// `/metrics`, as text.
    async fn metrics(&self) -> String {
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
async fn http_get(host: &str, path: &str) -> String {
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

/// One descriptor `(key, value)` of domain `fleet`, `hits` hits (0: a
/// check that counts nothing).
async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
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
            domain: "fleet".into(),
            descriptors: vec![descriptor],
            hits_addend: 0,
        })
        .await
        .expect("an answer")
        .into_inner();
    response.statuses[0].clone()
}

fn ok(status: &DescriptorStatus) -> bool {
    status.code == Code::Ok as i32
}

/// The YAML of these tests: 10 an hour for `generic_key: shared`, 3 an
/// hour per user.
const FLEET_YAML: &str = "domain: fleet
descriptors:
  - key: generic_key
    value: shared
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// Writes `dir/name` whole at once (a temporary file renamed), so a
/// watcher never reads half of it.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let temporary = dir.join(format!(".{name}.new"));
    std::fs::write(&temporary, text).expect("write");
    std::fs::rename(&temporary, &path).expect("rename");
    path
}

async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run sluice"))
        .await
        .unwrap()
}

async fn apply(root: &TestRoot, file: &Path) -> Output {
    let mut command = Command::new(SLUICE);
    command
        .args(["quota", "--root", &root.url, "apply", "-f"])
        .arg(file)
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("SLUICE_ADMIN_TOKEN_FILE");
    run(command).await
}

/// Waits while fewer than `margin` seconds are left in this UTC hour, so
/// that a test's hits fall in one window.
async fn away_from_the_hour_end(margin: f64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let left = 3600.0 - now % 3600.0;
    if left < margin {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_apply_loads_a_ratelimit_yaml_into_the_root() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "ratelimit.yaml", FLEET_YAML);
    let output = apply(&root, &file).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("+ rls.fleet.generic_key:shared\n"),
        "{stdout}"
    );
    assert!(stdout.contains("+ rls.fleet.user\n"), "{stdout}");
    let (_, shared) = root.get("rls.fleet.generic_key:shared").await;
    assert_eq!(
        (&shared["limit"], &shared["window"], &shared["per_key"]),
        (&10.0.into(), &"1h".into(), &false.into()),
        "{shared}"
    );
    let (_, user) = root.get("rls.fleet.user").await;
    assert_eq!(
        (&user["limit"], &user["per_key"]),
        (&3.0.into(), &true.into()),
        "{user}"
    );
    // A file envoyproxy/ratelimit would refuse is refused, naming it.
    let bad = write(
        dir.path(),
        "bad.yaml",
        "domain: fleet\ndescriptors:\n  - key: k\n    rate_limitt: {}\n",
    );
    let output = apply(&root, &bad).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains("bad.yaml: config error, unknown key 'rate_limitt'"),
        "{stderr}"
    );
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rls_behind_one_root_hold_one_limit_and_limit_per_host_without_it() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "ratelimit.yaml", FLEET_YAML);
    assert!(apply(&root, &file).await.status.success());
    let token = write(dir.path(), "sync.token", SYNC_TOKEN);
    let token = token.to_str().unwrap();
    let flags = [
        "--root",
        &root.url,
        "--sync-token-file",
        token,
        "--sync-interval-ms",
        "100",
    ];
    let a = Rls::start(&file, &flags).await;
    let b = Rls::start(&file, &flags).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    away_from_the_hour_end(60.0).await;

    for _ in 0..6 {
        assert!(ok(&ask(&mut ca, "generic_key", "shared", 1).await));
    }
    // B learns A's 6 through the root.
    eventually("B sees A's hits", || {
        let mut cb = cb.clone();
        async move {
            ask(&mut cb, "generic_key", "shared", 0)
                .await
                .limit_remaining
                == 4
        }
    })
    .await;
    let mut passed = 0;
    for _ in 0..6 {
        passed += u32::from(ok(&ask(&mut cb, "generic_key", "shared", 1).await));
    }
    assert_eq!(passed, 4, "one limit of 10 across both");
    eventually("A sees B's hits: 12 counted, over", || {
        let mut ca = ca.clone();
        async move { !ok(&ask(&mut ca, "generic_key", "shared", 0).await) }
    })
    .await;
    assert!(a.metrics().await.contains("sluice_rls_limiting_per_host 0"));

    // Every root gone: each host limits on its own and says so.
    root.stop().await;
    eventually("A says it limits per host", || async {
        a.metrics().await.contains("sluice_rls_limiting_per_host 1")
    })
    .await;
    assert!(!ok(&ask(&mut ca, "generic_key", "shared", 1).await));
    for _ in 0..3 {
        assert!(ok(&ask(&mut ca, "user", "ann", 1).await));
    }
    assert!(
        !ok(&ask(&mut ca, "user", "ann", 1).await),
        "per host, still 3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_configuration_stops_startup_with_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "limits.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let mut command = Command::new(SLUICE);
    command
        .args([
            "rls",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "off",
            "--config",
        ])
        .arg(&bad);
    let output = run(command).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("limits.yaml: invalid rate limit unit 'fortnight'"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_takes_a_good_file_and_keeps_the_last_good_one_over_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    std::fs::create_dir(&config).unwrap();
    let one = "domain: fleet\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    write(&config, "fleet.yaml", one);
    let rls = Rls::start(&config, &["--reload-interval-ms", "50"]).await;
    let mut client = rls.client().await;
    away_from_the_hour_end(30.0).await;
    let limit = |s: &DescriptorStatus| s.current_limit.as_ref().map(|l| l.requests_per_unit);
    assert_eq!(limit(&ask(&mut client, "user", "a", 0).await), Some(1));

    // A bad file: the last good configuration stays, and /metrics counts
    // the failed load.
    write(
        &config,
        "fleet.yaml",
        "domain: fleet\ndescriptors:\n  - key: user\n    bogus: 1\n",
    );
    eventually("the bad load is counted", || async {
        rls.metrics()
            .await
            .contains("sluice_rls_config_loads_total{result=\"error\"} 1")
    })
    .await;
    assert_eq!(limit(&ask(&mut client, "user", "a", 0).await), Some(1));

    // A good one is taken.
    let five = "domain: fleet\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    write(&config, "fleet.yaml", five);
    eventually("the new limit applies", || {
        let mut client = client.clone();
        async move { limit(&ask(&mut client, "user", "a", 0).await) == Some(5) }
    })
    .await;

    // SIGHUP reloads at once, whatever the files' times say.
    let status = Command::new("kill")
        .args(["-HUP", &rls.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    eventually("SIGHUP reloads", || async {
        rls.metrics()
            .await
            .contains("sluice_rls_config_loads_total{result=\"ok\"} 2")
    })
    .await;
}
