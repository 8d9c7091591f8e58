//! The `sluice` binary: the quota CLI against a root, and `sluice root`
//! itself (flags, config file, token files, graceful shutdown on SIGTERM
//! and SIGINT).

mod root_support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use root_support::{config_with_tokens, Db, Limiter, TestRoot, ADMIN_TOKEN, PATIENCE, SYNC_TOKEN};
use sluice::core::key::{format_hash, KeySecret};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Runs `sluice quota <args>` against `root` with the admin token in the
/// environment.
async fn quota(root: &TestRoot, args: &[&str]) -> Output {
    let mut command = Command::new(SLUICE);
    command.arg("quota").arg("--root").arg(&root.url).args(args);
    command
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("SLUICE_ADMIN_TOKEN_FILE");
    output(command).await
}

async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run sluice"))
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The single stderr line of a failed command.
fn failure(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("sluice: "), "{stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_list_and_delete_print_tables_or_json() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    assert_eq!(
        stdout(&quota(&root, &["set", "a", "--create", "--limit", "10"]).await),
        "created a (epoch 1)\n"
    );
    let b = [
        "set",
        "b",
        "--create",
        "--limit",
        "5",
        "--parent",
        "a",
        "--high-burst",
        "20",
    ];
    assert_eq!(stdout(&quota(&root, &b).await), "created b (epoch 2)\n");

    let list = stdout(&quota(&root, &["list"]).await);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "PARENT", "LIMIT", "WINDOW", "PER", "KEY", "LOW", "HIGH", "LEVEL", "EPOCH"]
    );
    assert_eq!(
        lines[2].split_whitespace().collect::<Vec<_>>(),
        ["b", "a", "5", "/s", "-", "-", "5", "20", "0", "2"]
    );

    // Options not given keep their values.
    assert_eq!(
        stdout(&quota(&root, &["set", "b", "--limit", "6"]).await),
        "updated b (epoch 3)\n"
    );
    let json: Value =
        serde_json::from_str(&stdout(&quota(&root, &["--json", "get", "b"]).await)).unwrap();
    assert_eq!(
        (&json["parent"], &json["limit"], &json["high_burst"]),
        (&"a".into(), &6.0.into(), &20.0.into())
    );
    assert_eq!(
        stdout(&quota(&root, &["set", "b", "--limit", "6"]).await),
        "unchanged b (epoch 3)\n"
    );
    let shown = stdout(&quota(&root, &["get", "b"]).await);
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().eq(["parent", "a"])),
        "{shown}"
    );

    let page = stdout(&quota(&root, &["list", "--limit", "1"]).await);
    assert!(page.contains("(more: --after a, or --all)"), "{page}");
    let all = stdout(&quota(&root, &["list", "--limit", "1", "--all", "--json"]).await);
    let all: Value = serde_json::from_str(&all).unwrap();
    assert_eq!(all["quotas"].as_array().unwrap().len(), 2);

    assert!(failure(&quota(&root, &["delete", "a"]).await).contains("409"));
    assert_eq!(
        stdout(&quota(&root, &["delete", "b"]).await),
        "deleted b (epoch 4)\n"
    );
    assert!(failure(&quota(&root, &["get", "b"]).await).contains("404"));
    root.stop().await;
}

/// `list` and `get` show each quota's limit in its own terms, with its
/// window and whether it is per key: a day's quota is not a rate per
/// second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_get_show_windows_and_per_key_quotas_in_their_own_terms() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plans.json");
    std::fs::write(
        &file,
        r#"{"quotas": [
            {"name": "api", "limit": 100},
            {"name": "api_user", "parent": "api", "limit": 15, "high_burst": 30, "per_key": true},
            {"name": "plan_day", "limit": 1000, "window": "1d"},
            {"name": "plan_minute", "parent": "plan_day", "limit": 10, "window": "1m", "sliding": true},
            {"name": "tick", "limit": 5, "window": "1s"},
            {"name": "token_month", "limit": 50000, "window": "month", "per_key": true}
        ]}"#,
    )
    .unwrap();
    // One apply, one epoch for all.
    stdout(&quota(&root, &["apply", "-f", file.to_str().unwrap()]).await);
    let list = stdout(&quota(&root, &["list"]).await);
    let expected = "\
NAME         PARENT    LIMIT                  WINDOW      PER KEY    LOW   HIGH  LEVEL  EPOCH
api          -         100 /s                 -           -          100    100      0      1
api_user     api       15 /s per key          -           yes         15     30      0      1
plan_day     -         1000 / day             1d          -         1000   1000      0      1
plan_minute  plan_day  10 / min sliding       1m sliding  -           10     10      0      1
tick         -         5 / 1s window          1s          -            5      5      0      1
token_month  -         50000 / month per key  month       yes      50000  50000      0      1
";
    assert_eq!(list, expected);

    let shown = stdout(&quota(&root, &["get", "plan_minute"]).await);
    for row in [
        ["limit", "10 / min sliding"],
        ["window", "1m sliding"],
        ["per_key", "false"],
    ] {
        assert!(
            shown.lines().any(|l| l
                .split("  ")
                .filter(|c| !c.is_empty())
                .map(str::trim)
                .eq(row)),
            "{row:?} missing from:\n{shown}"
        );
    }
    let shown = stdout(&quota(&root, &["get", "api_user"]).await);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("limit") && l.ends_with("15 /s per key")),
        "{shown}"
    );

    // --json keeps the numbers and adds the terms and the kind.
    let json: Value =
        serde_json::from_str(&stdout(&quota(&root, &["--json", "list"]).await)).unwrap();
    let day = &json["quotas"][2];
    assert_eq!(
        (
            &day["name"],
            &day["limit"],
            &day["window"],
            &day["terms"],
            &day["kind"]
        ),
        (
            &json!("plan_day"),
            &json!(1000.0),
            &json!("1d"),
            &json!("1000 / day"),
            &json!("window")
        )
    );
    assert_eq!(json["quotas"][3]["kind"], "sliding");
    assert_eq!(json["quotas"][0]["kind"], "leaky");
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_reads_json_and_toml_and_dry_runs_change_nothing() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let dir = tempfile::tempdir().unwrap();
    let json_file = dir.path().join("quotas.json");
    std::fs::write(
        &json_file,
        r#"{"quotas": [{"name": "s3", "limit": 100}, {"name": "s3_read", "parent": "s3", "limit": 80}]}"#,
    )
    .unwrap();
    let file = json_file.to_str().unwrap();
    let dry = stdout(&quota(&root, &["apply", "-f", file, "--dry-run"]).await);
    assert_eq!(
        dry,
        "+ s3\n+ s3_read\ndry run: would have 2 created, 0 updated, 0 deleted, 0 unchanged\n"
    );
    assert!(failure(&quota(&root, &["get", "s3"]).await).contains("404"));
    let applied = stdout(&quota(&root, &["apply", "-f", file]).await);
    assert!(
        applied.ends_with("applied at epoch 1: 2 created, 0 updated, 0 deleted, 0 unchanged\n"),
        "{applied}"
    );

    let toml_file = dir.path().join("quotas.toml");
    std::fs::write(&toml_file, "[[quotas]]\nname = \"s3\"\nlimit = 200\n").unwrap();
    let toml = toml_file.to_str().unwrap();
    let pruned = stdout(&quota(&root, &["apply", "-f", toml, "--prune"]).await);
    assert!(
        pruned.contains("~ s3: limit 100 -> 200, low_burst 100 -> 200, high_burst 100 -> 200\n"),
        "{pruned}"
    );
    assert!(pruned.contains("- s3_read\n"), "{pruned}");
    let again = stdout(&quota(&root, &["apply", "-f", toml, "--prune"]).await);
    assert_eq!(
        again,
        "nothing to change: 0 created, 0 updated, 0 deleted, 1 unchanged\n"
    );

    std::fs::write(&json_file, r#"[{"name": "bad name", "limit": 1}]"#).unwrap();
    let error = failure(&quota(&root, &["apply", "-f", file]).await);
    assert!(error.contains("400") && error.contains("name"), "{error}");
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_exit_non_zero_with_one_line() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let wrong = failure(&quota(&root, &["--token", "wrong", "list"]).await);
    assert!(wrong.contains("401"), "{wrong}");
    assert!(
        failure(&quota(&root, &["set", "new", "--create"]).await).contains("--limit is required")
    );
    assert!(failure(&quota(&root, &["set", "x", "--limit", "-1"]).await).contains("limit"));

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{ADMIN_TOKEN}\n")).unwrap();
    let mut command = Command::new(SLUICE);
    command
        .args(["quota", "--root", &root.url, "list"])
        .arg("--token-file")
        .arg(&token_file);
    command.env_remove("SLUICE_ADMIN_TOKEN");
    assert!(output(command).await.status.success());

    let mut command = Command::new(SLUICE);
    command.args([
        "quota",
        "--root",
        "http://127.0.0.1:1",
        "--timeout",
        "5s",
        "list",
    ]);
    let unreachable = failure(&output(command).await);
    assert!(unreachable.contains("127.0.0.1:1"), "{unreachable}");
    root.stop().await;
}

/// `quota set` patches: the flags given change, nothing else, on a
/// sliding per-key window quota under a parent; and it creates a quota of
/// every kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_changes_only_the_flags_given() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    stdout(&quota(&root, &["set", "s3_photos", "--create", "--limit", "100"]).await);
    let create = [
        "set",
        "per_client",
        "--create",
        "--limit",
        "5",
        "--low-burst",
        "4",
        "--high-burst",
        "5",
        "--window",
        "1m",
        "--sliding",
        "--per-key",
        "--parent",
        "s3_photos",
    ];
    assert!(stdout(&quota(&root, &create).await).starts_with("created per_client"));
    let definition = |q: &Value| {
        let fields = [
            "parent",
            "limit",
            "low_burst",
            "high_burst",
            "per_key",
            "window",
            "sliding",
        ];
        fields.map(|f| q[f].clone())
    };
    let before = definition(&root.get("per_client").await.1);
    assert_eq!(
        before,
        [
            json!("s3_photos"),
            json!(5.0),
            json!(4.0),
            json!(5.0),
            json!(true),
            json!("1m"),
            json!(true)
        ]
    );
    assert!(
        stdout(&quota(&root, &["set", "per_client", "--limit", "6"]).await)
            .starts_with("updated per_client")
    );
    let mut expected = before.clone();
    expected[1] = json!(6.0);
    assert_eq!(definition(&root.get("per_client").await.1), expected);
    // --window none makes it a leaky bucket, fixed (nothing slides).
    stdout(&quota(&root, &["set", "per_client", "--window", "none"]).await);
    let q = root.get("per_client").await.1;
    assert!(
        q.get("window").is_none() && q.get("sliding").is_none(),
        "{q}"
    );
    assert_eq!(
        (&q["per_key"], &q["parent"]),
        (&true.into(), &"s3_photos".into())
    );
    // The root checks the merged quota: --sliding on a leaky one.
    let error = failure(&quota(&root, &["set", "per_client", "--sliding"]).await);
    assert!(
        error.contains("400") && error.contains("sliding"),
        "{error}"
    );
    root.stop().await;
}

/// What the CLI used to misread or pass on: non-finite numbers (which
/// became "use the default"), dot-segment names (which went into the URL
/// path), quota files with a wrong type (which said only "did not match
/// any variant") and TOML syntax errors (two lines, no position).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_numbers_names_and_files_fail_with_one_clear_line() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    stdout(&quota(&root, &["set", "q", "--create", "--limit", "10"]).await);
    for (flag, value) in [
        ("--high-burst", "inf"),
        ("--high-burst", "NaN"),
        ("--low-burst", "-inf"),
        ("--limit", "1e999"),
        ("--limit", "-2"),
    ] {
        let arg = format!("{flag}={value}");
        let error = failure(&quota(&root, &["set", "q", &arg]).await);
        assert!(
            error.contains(flag) && error.contains("must be a finite number"),
            "{flag} {value}: {error}"
        );
    }
    // Nothing changed.
    let shown = stdout(&quota(&root, &["--json", "get", "q"]).await);
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["high_burst"], 10.0);

    // Every command that puts a name in a path checks it first: `..`
    // would otherwise resolve to another API path (`keys ..` listed the
    // quotas).
    let named: [&[&str]; 6] = [
        &["get", ".."],
        &["delete", "."],
        &["set", "..", "--limit", "1"],
        &["keys", ".."],
        &["keys", "."],
        &["key", "..", "--hash", "00000000000000a1"],
    ];
    for args in named {
        let error = failure(&quota(&root, args).await);
        assert!(error.contains("invalid quota name"), "{args:?}: {error}");
    }
    for hash in ["..", ".", "zz", "00000000000000a1/x"] {
        let error = failure(&quota(&root, &["key", "q", "--hash", hash]).await);
        assert!(error.contains("invalid --hash"), "{hash}: {error}");
    }

    let dir = tempfile::tempdir().unwrap();
    let json_file = dir.path().join("bad.json");
    std::fs::write(
        &json_file,
        "{\"quotas\": [\n  {\"name\": \"a\", \"limit\": 1},\n  {\"name\": \"b\", \"limit\": \"ten\"}\n]}\n",
    )
    .unwrap();
    let error = failure(&quota(&root, &["apply", "-f", json_file.to_str().unwrap()]).await);
    assert!(
        error.contains("bad.json: quotas[1].limit (quota \"b\"): invalid rate \"ten\"")
            && error.contains("at line 3, column"),
        "{error}"
    );
    // YAML: refused by the name, and by the look under a .json name.
    let yaml_file = dir.path().join("quotas.yaml");
    std::fs::write(&yaml_file, "quotas:\n  - name: a\n    limit: 1\n").unwrap();
    let error = failure(&quota(&root, &["apply", "-f", yaml_file.to_str().unwrap()]).await);
    assert!(
        error.contains("quotas.yaml: YAML quota files are not read") && error.contains("TOML"),
        "{error}"
    );
    std::fs::write(&json_file, "quotas:\n  - name: a\n    limit: 1\n").unwrap();
    let error = failure(&quota(&root, &["apply", "-f", json_file.to_str().unwrap()]).await);
    assert!(error.contains("it looks like YAML"), "{error}");
    let toml_file = dir.path().join("bad.toml");
    for (text, expected) in [
        (
            "[[quotas]]\nname = \"a\"\nlimit = true\n",
            "quotas[0].limit (quota \"a\")",
        ),
        (
            "[[quotas]]\nname = \"a\"\nlimit = = 1\n",
            "at line 3, column",
        ),
    ] {
        std::fs::write(&toml_file, text).unwrap();
        let error = failure(&quota(&root, &["apply", "-f", toml_file.to_str().unwrap()]).await);
        assert!(
            error.contains("bad.toml: ") && error.contains(expected),
            "{error}"
        );
    }
    root.stop().await;
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `sluice root` child process.
struct RootChild {
    child: std::process::Child,
    client: TestRoot,
}

impl RootChild {
    /// Starts `sluice root <args>` listening on `listen` and waits until
    /// it answers `/healthz`.
    async fn start(listen: &str, args: &[&str]) -> Self {
        let child = Command::new(SLUICE)
            .arg("root")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let client = TestRoot::attach(&format!("http://{listen}"));
        let deadline = Instant::now() + PATIENCE;
        loop {
            let up = client
                .http
                .get(format!("{}/healthz", client.url))
                .send()
                .await;
            if up.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(Instant::now() < deadline, "sluice root did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, client }
    }

    /// Sends `signal` and returns the exit status and everything the root
    /// logged.
    async fn stop_with(mut self, signal: libc::c_int) -> (std::process::ExitStatus, String) {
        // SAFETY: kill(2) with a child's pid and a valid signal number.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        let waited = tokio::task::spawn_blocking(move || {
            let status = self.child.wait().unwrap();
            let mut stderr = String::new();
            std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut stderr)
                .unwrap();
            (status, stderr)
        });
        tokio::time::timeout(PATIENCE, waited)
            .await
            .expect("the root exits after the signal")
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_root_serves_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let db = format!("sqlite://{}/root.db", dir.path().display());
    let args = [
        "--listen",
        &listen,
        "--db",
        &db,
        "--reload-interval",
        "100ms",
    ];
    let root = RootChild::start(&listen, &args).await;
    root.client.put("q", serde_json::json!({"limit": 1})).await;

    let (status, stderr) = root.stop_with(libc::SIGTERM).await;
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("SIGTERM received") && stderr.contains("quota root stopped"),
        "{stderr}"
    );
    // Its stderr is a pipe, as `make run`'s log file is not a terminal:
    // plain text, no colour codes.
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_root_reads_its_config_file_and_token_files_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let (admin_file, sync_file) = (
        dir.path().join("admin.token"),
        dir.path().join("sync.token"),
    );
    std::fs::write(&admin_file, format!("{ADMIN_TOKEN}\n")).unwrap();
    std::fs::write(&sync_file, format!("{SYNC_TOKEN}\n")).unwrap();
    let config = dir.path().join("root.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\ndb = \"sqlite://{dir}/root.db\"\n\
             admin_token_file = \"{admin}\"\nsync_token_file = \"{sync}\"\n\
             reload_interval = \"250ms\"\n",
            dir = dir.path().display(),
            admin = admin_file.display(),
            sync = sync_file.display(),
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let mut root = RootChild::start(&listen, &["--config", config]).await;

    // Both tokens come from the files the config names.
    let body = serde_json::to_vec(&serde_json::json!({"limit": 1})).unwrap();
    let (status, _) = root
        .client
        .request(Method::PUT, "/v1/quotas/q", None, Some(body.clone()))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = root
        .client
        .request(Method::PUT, "/v1/quotas/q", Some(ADMIN_TOKEN), Some(body))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    root.client.sync_token = Some(SYNC_TOKEN.into());
    let sync = Limiter::new("h").request(&[]);
    assert_eq!(root.client.sync(&sync).await.0, StatusCode::OK);
    root.client.sync_token = None;
    assert_eq!(root.client.sync(&sync).await.0, StatusCode::UNAUTHORIZED);

    let (status, stderr) = root.stop_with(libc::SIGINT).await;
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("SIGINT received") && stderr.contains("quota root stopped"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_root_refuses_an_open_admin_api_on_a_public_address() {
    let mut command = Command::new(SLUICE);
    command.args([
        "root",
        "--listen",
        "0.0.0.0:7070",
        "--db",
        "sqlite:///nonexistent/x.db",
    ]);
    let out = output(command).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_root_refuses_a_malformed_limiter_tokens_file_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("limiters.tokens");
    std::fs::write(&tokens, "# fleet\nweb-1 tok-1\nweb-2 tok-1\n").unwrap();
    let mut command = Command::new(SLUICE);
    command.args([
        "root",
        "--db",
        "sqlite:///nonexistent/x.db",
        "--limiter-tokens-file",
    ]);
    command.arg(&tokens);
    let out = output(command).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:3: limiter \"web-2\" has the same token as \"web-1\" (line 2)",
            tokens.display()
        )),
        "{stderr}"
    );
}

/// `quota key --key` hashes the key here: with the built-in secret unless
/// `--secret-file` is given. It says so, and a 404 then hints that the
/// fleet may have a secret file (it used to say 404 and nothing else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_key_says_which_secret_hashed_the_key() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    root.put(
        "per_token",
        json!({"limit": 0, "low_burst": 10, "high_burst": 10, "per_key": true}),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("key.secret");
    std::fs::write(&secret_file, "the fleet's own secret, 32 bytes\n").unwrap();
    let secret = secret_file.to_str().unwrap();
    // The fleet hashes with its secret file: a limiter counted the key so.
    let fleet = KeySecret::from_file_contents(b"the fleet's own secret, 32 bytes").unwrap();
    let mut limiter = Limiter::new("edge-1");
    limiter.catch_up(&root).await;
    let id = limiter.id_of("per_token").unwrap();
    let request = limiter.keyed_request(id, &[(fleet.hash(b"tok-123"), 3)]);
    let (status, reply) = root.sync(&request).await;
    assert_eq!(status, StatusCode::OK, "{reply}");

    // Without --secret-file: a 404, on one line, with the hint.
    let error = failure(&quota(&root, &["key", "per_token", "--key", "tok-123"]).await);
    assert!(
        error.contains("404")
            && error.contains("built-in secret")
            && error.contains("--secret-file"),
        "{error}"
    );
    // With the fleet's file: found, and no word about the built-in secret.
    let args = [
        "key",
        "per_token",
        "--key",
        "tok-123",
        "--secret-file",
        secret,
    ];
    let found = quota(&root, &args).await;
    let shown = stdout(&found);
    assert!(
        shown.contains(&format_hash(fleet.hash(b"tok-123"))),
        "{shown}"
    );
    assert!(found.stderr.is_empty(), "{found:?}");
    // A key counted under the built-in secret is found without the file,
    // with a note on stderr saying which secret hashed it.
    let built_in = KeySecret::built_in().hash(b"tok-456");
    let request = limiter.keyed_request(id, &[(built_in, 1)]);
    let (status, reply) = root.sync(&request).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let found = quota(&root, &["key", "per_token", "--key", "tok-456"]).await;
    assert!(stdout(&found).contains(&format_hash(built_in)));
    let note = String::from_utf8(found.stderr.clone()).unwrap();
    assert!(note.contains("built-in secret"), "{note}");
    // A 404 for a hash given as such has no hint (no secret was used).
    let error = failure(&quota(&root, &["key", "per_token", "--hash", "00000000000000a1"]).await);
    assert!(
        error.contains("404") && !error.contains("secret"),
        "{error}"
    );
}

/// `quota override` hashes the key here, as `quota key` does, and sends
/// only the hash; `quota overrides` lists them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_hashes_the_key_locally_and_overrides_lists() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    stdout(
        &quota(
            &root,
            &[
                "set",
                "api_user",
                "--create",
                "--limit",
                "15",
                "--per-key",
                "--penalty",
                "15m",
            ],
        )
        .await,
    );
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("key.secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    let secret = secret.to_str().unwrap();
    let hash = sluice::core::key::format_hash(
        sluice::core::key::KeySecret::from_file_contents(b"0123456789abcdef0123456789abcdef")
            .unwrap()
            .hash(b"token-paid"),
    );
    let args = [
        "override",
        "api_user",
        "--key",
        "token-paid",
        "--secret-file",
        secret,
        "--limit",
        "100",
        "--high-burst",
        "200",
        "--note",
        "paid plan",
    ];
    // `quota hash` prints the hash the override is made under.
    let printed = stdout(
        &quota(
            &root,
            &["hash", "--key", "token-paid", "--secret-file", secret],
        )
        .await,
    );
    assert_eq!(printed, format!("{hash}\n"));
    let created = stdout(&quota(&root, &args).await);
    assert_eq!(
        created,
        format!(
            "created the override of {hash} on api_user: limit 100 (bursts 100..200) (epoch 2)\n"
        )
    );
    let deny = [
        "override",
        "api_user",
        "--hash",
        "00000000000000bb",
        "--deny",
        "--expires",
        "24h",
    ];
    let denied = stdout(&quota(&root, &deny).await);
    assert!(denied.contains("deny, until 20"), "{denied}");
    let listed = stdout(&quota(&root, &["overrides", "api_user"]).await);
    assert!(
        listed.contains(&hash) && listed.contains("paid plan"),
        "{listed}"
    );
    assert!(
        listed.contains("00000000000000bb") && listed.contains("(2 overrides of api_user)"),
        "{listed}"
    );
    let json: Value = serde_json::from_str(&stdout(
        &quota(&root, &["--json", "overrides", "api_user"]).await,
    ))
    .unwrap();
    assert_eq!(json["count"], 2);
    let shown = stdout(&quota(&root, &["get", "api_user", "--json"]).await);
    assert!(shown.contains("\"penalty\": \"15m\""), "{shown}");
    let remove = [
        "override",
        "api_user",
        "--hash",
        "00000000000000bb",
        "--remove",
    ];
    assert!(stdout(&quota(&root, &remove).await).starts_with("removed the override"));
    // Bad input fails with one line, before anything is sent.
    let none = failure(
        &quota(
            &root,
            &["override", "api_user", "--hash", "00000000000000bb"],
        )
        .await,
    );
    assert!(
        none.contains("--limit N, --allow, --deny or --remove"),
        "{none}"
    );
    let bad = failure(&quota(&root, &["override", "api_user", "--hash", "xyz", "--deny"]).await);
    assert!(bad.contains("--hash"), "{bad}");
    let negative = [
        "override",
        "api_user",
        "--hash",
        "00000000000000bb",
        "--limit",
        "-3",
    ];
    assert!(failure(&quota(&root, &negative).await).contains("--limit"));
    let plain = failure(
        &quota(
            &root,
            &[
                "override",
                "nothing",
                "--hash",
                "00000000000000bb",
                "--deny",
            ],
        )
        .await,
    );
    assert!(plain.contains("404"), "{plain}");
    root.stop().await;
}

/// The first hour's traps: a misspelled name made a new quota, a new
/// limit was refused for the bursts the old one had given the quota, a
/// root without its scheme said "relative URL without a base", a missing
/// token a bare 401, and "10 a minute" had to be written 0.16667.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_refuses_a_typo_follows_the_limit_with_its_bursts_and_takes_rates_with_units() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let window = [
        "set",
        "api_key_minute",
        "--create",
        "--limit",
        "10",
        "--window",
        "1m",
    ];
    assert!(stdout(&quota(&root, &window).await).starts_with("created api_key_minute"));

    // A typo is not a new quota.
    let typo = failure(&quota(&root, &["set", "api_key_mnute", "--limit", "5"]).await);
    assert!(
        typo.contains("no quota is named \"api_key_mnute\"") && typo.contains("--create"),
        "{typo}"
    );
    assert_eq!(root.get("api_key_mnute").await.0, StatusCode::NOT_FOUND);

    // The bursts the old limit gave it follow the new one (a window
    // quota's bursts must lie within its limit).
    assert!(
        stdout(&quota(&root, &["set", "api_key_minute", "--limit", "5"]).await)
            .starts_with("updated api_key_minute")
    );
    let q = root.get("api_key_minute").await.1;
    assert_eq!(
        (&q["limit"], &q["low_burst"], &q["high_burst"]),
        (&json!(5.0), &json!(5.0), &json!(5.0)),
        "{q}"
    );

    // Rates with units, shown in their unit.
    let per_minute = ["set", "slow", "--create", "--limit", "10/m", "--per-key"];
    stdout(&quota(&root, &per_minute).await);
    let hourly = ["set", "hourly", "--create", "--limit", "100r/h"];
    stdout(&quota(&root, &hourly).await);
    let shown = stdout(&quota(&root, &["get", "slow"]).await);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("limit") && l.ends_with("10 /m per key")),
        "{shown}"
    );
    let list = stdout(&quota(&root, &["list", "--prefix", "hourly"]).await);
    assert!(list.contains("100 /h"), "{list}");
    let q = root.get("slow").await.1;
    assert!(
        (q["limit"].as_f64().unwrap() - 10.0 / 60.0).abs() < 1e-12,
        "{q}"
    );
    let bad = failure(&quota(&root, &["set", "slow", "--limit", "10/d"]).await);
    assert!(bad.contains("invalid rate \"10/d\""), "{bad}");
    let windowed = ["set", "api_key_minute", "--limit", "10/m", "--window", "1m"];
    let error = failure(&quota(&root, &windowed).await);
    assert!(error.contains("leaky bucket's"), "{error}");

    // A root without its scheme, and a root without the token.
    let mut command = Command::new(SLUICE);
    command.args(["quota", "--root", "127.0.0.1:7070", "list"]);
    let no_scheme = failure(&output(command).await);
    assert!(
        no_scheme.contains("--root http://127.0.0.1:7070"),
        "{no_scheme}"
    );
    let mut command = Command::new(SLUICE);
    command.args(["quota", "--root", &root.url, "list"]);
    command
        .env_remove("SLUICE_ADMIN_TOKEN")
        .env_remove("SLUICE_ADMIN_TOKEN_FILE");
    let unauthorized = failure(&output(command).await);
    assert!(
        unauthorized.contains("401")
            && unauthorized.contains("--token")
            && unauthorized.contains("SLUICE_ADMIN_TOKEN"),
        "{unauthorized}"
    );
}

/// The CLI names only keys a check counts: an empty key (nginx and the C
/// ABI pass it uncounted, so an override of it could never apply) and
/// one longer than the C ABI takes are refused with the message the C ABI
/// gives, by every command that hashes a key, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_no_check_can_count_are_refused_before_anything_is_sent() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    stdout(
        &quota(
            &root,
            &["set", "tier", "--create", "--limit", "5", "--per-key"],
        )
        .await,
    );
    let long = "k".repeat(70_000);
    for (key, why) in [
        ("", "key is empty"),
        (
            long.as_str(),
            "key is 70000 bytes long, at most 65536 allowed",
        ),
    ] {
        let commands: [&[&str]; 3] = [
            &["override", "tier", "--key", key, "--deny"],
            &["hash", "--key", key],
            &["key", "tier", "--key", key],
        ];
        let mut messages = Vec::new();
        for args in commands {
            let error = failure(&quota(&root, args).await);
            let expected = format!("sluice: invalid --key: {why}");
            assert!(error.starts_with(&expected), "{}: {error}", args[0]);
            messages.push(error);
        }
        messages.dedup();
        assert_eq!(messages.len(), 1, "one message: {messages:?}");
    }
    let listed = stdout(&quota(&root, &["overrides", "tier", "--json"]).await);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["count"], 0, "{listed}");
    root.stop().await;
}
