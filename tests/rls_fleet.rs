//! `sluice rls` as a fleet runs it: the `sluice` binary's `rls` command
//! beside a real root. `sluice quota apply -f ratelimit.yaml` loads the
//! YAML's limits into the root; two `sluice rls` processes with the same
//! YAML and that root hold one limit; with the root gone they keep
//! limiting per host and say so. Also the process's own rules: a bad
//! configuration stops it before it serves, and a bad reload keeps the
//! last good configuration.

mod rls_support;
mod root_support;

use std::path::Path;
use std::process::{Command, Output};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;

use rls_support::{ask, away_from_the_hour_end, ok, run, write, Rls, SLUICE};
use root_support::{config_with_tokens, eventually, Db, TestRoot, ADMIN_TOKEN, SYNC_TOKEN};

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

/// `sluice quota apply -f FILE` against `root`.
async fn apply(root: &TestRoot, file: &Path) -> Output {
    let mut command = Command::new(SLUICE);
    command
        .args(["quota", "--root", &root.url, "apply", "-f"])
        .arg(file)
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("SLUICE_ADMIN_TOKEN_FILE");
    run(command).await
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
        assert!(ok(&ask(&mut ca, "fleet", "generic_key", "shared", 1).await));
    }
    // B learns A's 6 through the root.
    eventually("B sees A's hits", || {
        let mut cb = cb.clone();
        async move {
            ask(&mut cb, "fleet", "generic_key", "shared", 0)
                .await
                .limit_remaining
                == 4
        }
    })
    .await;
    let mut passed = 0;
    for _ in 0..6 {
        passed += u32::from(ok(&ask(&mut cb, "fleet", "generic_key", "shared", 1).await));
    }
    assert_eq!(passed, 4, "one limit of 10 across both");
    eventually("A sees B's hits: 12 counted, over", || {
        let mut ca = ca.clone();
        async move { !ok(&ask(&mut ca, "fleet", "generic_key", "shared", 0).await) }
    })
    .await;
    assert!(a.metrics().await.contains("sluice_rls_limiting_per_host 0"));

    // Every root gone: each host limits on its own and says so.
    root.stop().await;
    eventually("A says it limits per host", || async {
        a.metrics().await.contains("sluice_rls_limiting_per_host 1")
    })
    .await;
    assert!(!ok(&ask(&mut ca, "fleet", "generic_key", "shared", 1).await));
    for _ in 0..3 {
        assert!(ok(&ask(&mut ca, "fleet", "user", "ann", 1).await));
    }
    assert!(
        !ok(&ask(&mut ca, "fleet", "user", "ann", 1).await),
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
async fn reloads_take_a_good_file_keep_the_last_good_one_over_a_bad_one_and_sigterm_stops() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    std::fs::create_dir(&config).unwrap();
    let one = "domain: fleet\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    write(&config, "fleet.yaml", one);
    let rls = Rls::start(&config, &["--reload-interval-ms", "50"]).await;
    let mut client = rls.client().await;
    away_from_the_hour_end(30.0).await;
    let limit = |s: &DescriptorStatus| s.current_limit.as_ref().map(|l| l.requests_per_unit);
    assert_eq!(
        limit(&ask(&mut client, "fleet", "user", "a", 0).await),
        Some(1)
    );

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
    assert_eq!(
        limit(&ask(&mut client, "fleet", "user", "a", 0).await),
        Some(1)
    );

    // A good one is taken.
    let five = "domain: fleet\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    write(&config, "fleet.yaml", five);
    eventually("the new limit applies", || {
        let mut client = client.clone();
        async move { limit(&ask(&mut client, "fleet", "user", "a", 0).await) == Some(5) }
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

    // SIGTERM stops it cleanly.
    let mut rls = rls;
    let status = Command::new("kill")
        .args(["-TERM", &rls.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = tokio::task::spawn_blocking(move || {
        let status = rls.child.wait();
        (rls, status)
    })
    .await
    .unwrap()
    .1
    .unwrap();
    assert!(exited.success(), "{exited:?}");
}
