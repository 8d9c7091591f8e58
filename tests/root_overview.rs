//! `GET /v1/overview` (what the web console and `sluice top` show) against
//! a root in this process with both tokens, fed by a real limiter (a table
//! and its sync thread) whose clock is off by a known amount; and `sluice
//! top` run as a process: `--once`, `--once --json`, a dead root, and the
//! refreshing screen under tmux.

mod root_support;
mod sync_support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::Value;

use root_support::{config_with_tokens, quota, Db, TestRoot, ADMIN_TOKEN, PATIENCE, SYNC_TOKEN};
use sync_support::Limiter;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// The limiter's clock runs this far ahead of the root's.
const SKEW: i64 = 3_000_000_000;

/// A root with the S3 demo's two top quotas and a child, and a limiter
/// syncing with it that has admitted some weight on `photos_read`.
async fn root_with_traffic() -> (Db, TestRoot, Limiter) {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    root.put("photos", quota(20.0, 20.0, 40.0, None)).await;
    // Limit 0: its level does not leak while the test looks at it.
    root.put("photos_read", quota(0.0, 15.0, 30.0, Some("photos")))
        .await;
    root.put("logs", quota(50.0, 50.0, 100.0, None)).await;
    let url = root.url.clone();
    let limiter = tokio::task::spawn_blocking(move || {
        let limiter = Limiter::start_with("edge-1", &[url.as_str()], |c| {
            c.clock_skew = SKEW;
            c.token = Some(SYNC_TOKEN.to_string());
        });
        sync_support::wait_until("the limiter holds the quotas", || {
            limiter.quota("photos_read").is_some()
        });
        // 60 checks: at least the 15 below the low burst pass, at most 30.
        for _ in 0..60 {
            limiter.check("photos_read", 1);
        }
        limiter
    })
    .await
    .unwrap();
    (db, root, limiter)
}

async fn overview(root: &TestRoot, query: &str, token: Option<&str>) -> (StatusCode, Value) {
    root.request(Method::GET, &format!("/v1/overview{query}"), token, None)
        .await
}

/// Polls the admin overview until `done` holds; returns that overview.
async fn overview_until(root: &TestRoot, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, ov) = overview(root, "", Some(ADMIN_TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{ov}");
        if done(&ov) {
            return ov;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for: {what}\n{ov:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn limiter<'a>(ov: &'a Value, id: &str) -> Option<&'a Value> {
    ov["limiters"].as_array()?.iter().find(|l| l["id"] == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_overview_has_totals_and_no_names() {
    let (_db, root, _limiter) = root_with_traffic().await;
    let (status, ov) = overview(&root, "", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ov["access"], "public");
    assert_eq!(ov["token_required"], true);
    assert_eq!(ov["totals"]["quotas"], 3);
    assert_eq!(ov["root"]["status"], "ok");
    assert_eq!(ov["db"]["backend"], "sqlite");
    let text = ov.to_string();
    for name in ["photos", "edge-1", "quotas\":[", "limiters\":["] {
        assert!(
            !text.contains(name),
            "{name} in the public overview: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_with_401() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let response = root
        .http
        .get(format!("{}/v1/overview", root.url))
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["message"], "missing or wrong admin token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_must_be_1_to_100_and_nothing_else_is_accepted() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    for query in ["?top=0", "?top=101"] {
        let (status, body) = overview(&root, query, Some(ADMIN_TOKEN)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(body["error"]["field"], "top");
    }
    let (status, _) = overview(&root, "?limit=5", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = overview(&root, "?top=100", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_overview_ranks_the_full_quota_first_and_shows_the_limiter_clock() {
    let (_db, root, _limiter) = root_with_traffic().await;
    let ov = overview_until(&root, "the limiter's clock report and its weight", |ov| {
        limiter(ov, "edge-1").is_some_and(|l| !l["clock_offset_seconds"].is_null())
            && ov["quotas"][0]["name"] == "photos_read"
    })
    .await;
    assert_eq!(ov["access"], "admin");
    let busiest = &ov["quotas"][0];
    assert_eq!(busiest["parent"], "photos");
    assert_eq!(busiest["limit"], 0.0);
    assert!(busiest["level"].as_f64().unwrap() >= 15.0, "{busiest}");
    assert!(busiest["rejecting"].as_f64().unwrap() > 0.0, "{busiest}");
    // Quotas rejecting and rejected checks are the same reports: both 0 or
    // neither.
    assert_eq!(
        ov["totals"]["quotas_rejecting"] == 0,
        ov["totals"]["rejected_per_second"] == 0.0,
        "{ov}"
    );
    let edge = limiter(&ov, "edge-1").unwrap();
    // Root clock minus a clock running SKEW ahead: -SKEW, give or take the
    // round trip the estimate came from.
    let offset = edge["clock_offset_seconds"].as_f64().unwrap();
    let round_trip = edge["round_trip_seconds"].as_f64().unwrap();
    assert!(
        (offset + SKEW as f64 * 1e-9).abs() <= round_trip / 2.0 + 1e-3,
        "offset {offset} s, round trip {round_trip} s"
    );
    assert!(edge["syncs"].as_u64().unwrap() >= 1);
    // Syncs every 200 ms: the rate shows once two samples a second apart
    // exist.
    let ov = overview_until(&root, "a sync rate", |ov| {
        ov["totals"]["syncs_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0)
    })
    .await;
    assert!(ov["sampled"]["rate_window_seconds"].as_f64().unwrap() >= 1.0);
}

/// The numbers of `value` that carry float noise: neither a whole number
/// of microseconds (a duration) nor six significant digits (a level, a
/// rate, a share), with where they are.
fn noisy(value: &Value, at: &str, out: &mut Vec<String>) {
    match value {
        Value::Number(n) => {
            let x = n.as_f64().unwrap();
            if x != sluice::core::round_to(x, 6) && x != sluice::core::round_significant(x, 6) {
                out.push(format!("{at}: {n}"));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                noisy(item, &format!("{at}[{i}]"), out);
            }
        }
        Value::Object(fields) => {
            for (key, item) in fields {
                noisy(item, &format!("{at}.{key}"), out);
            }
        }
        _ => {}
    }
}

/// The case: `"seconds_ago":3.1559234220000003`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_and_a_quota_read_carry_no_float_noise() {
    let (_db, root, _limiter) = root_with_traffic().await;
    let ov = overview_until(&root, "the limiter's clock report and a sync rate", |ov| {
        limiter(ov, "edge-1").is_some_and(|l| !l["clock_offset_seconds"].is_null())
            && ov["totals"]["syncs_per_second"].is_number()
    })
    .await;
    let (status, quota) = root.get("photos_read").await;
    assert_eq!(status, StatusCode::OK);
    assert!(quota["limiters"][0]["seconds_ago"].is_number(), "{quota}");
    let (_, health) = root.request(Method::GET, "/healthz", None, None).await;
    let mut found = Vec::new();
    noisy(&ov, "overview", &mut found);
    noisy(&quota, "quota", &mut found);
    noisy(&health, "healthz", &mut found);
    assert!(found.is_empty(), "{found:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiters_rejections_reach_the_overview_as_rates() {
    let (_db, root, _limiter) = root_with_traffic().await;
    let quota_in = |ov: &Value, name: &str| -> Option<Value> {
        ov["quotas"]
            .as_array()?
            .iter()
            .find(|q| q["name"] == name)
            .cloned()
    };
    // At least 30 of the 60 checks were rejected, on photos_read.
    let ov = overview_until(&root, "photos_read's rejections", |ov| {
        quota_in(ov, "photos_read")
            .is_some_and(|q| q["rejected_rate"].as_f64().is_some_and(|r| r > 0.0))
    })
    .await;
    let total = ov["totals"]["rejected_per_second"].as_f64().unwrap();
    let read = quota_in(&ov, "photos_read").unwrap()["rejected_rate"]
        .as_f64()
        .unwrap();
    assert!(total >= read, "totals {total}, photos_read {read}");
    assert!(
        ov["totals"]["quotas_rejecting"].as_u64().unwrap() >= 1,
        "{ov}"
    );
    // A rejection counts on the quota the check named, not its parent.
    if let Some(photos) = quota_in(&ov, "photos") {
        assert_eq!(photos["rejected_rate"], 0.0, "{photos}");
    }
    let (status, quota) = root
        .request(
            Method::GET,
            "/v1/quotas/photos_read",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{quota}");
    assert!(quota["rejected_rate"].as_f64().unwrap() > 0.0, "{quota}");
}

/// Runs `sluice top <args>` against `root` with the admin token.
async fn top(url: &str, args: &[&str]) -> Output {
    let mut command = Command::new(SLUICE);
    command
        .arg("top")
        .arg("--root")
        .arg(url)
        .args(args)
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("SLUICE_ADMIN_TOKEN_FILE");
    tokio::task::spawn_blocking(move || command.output().expect("run sluice top"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_top_once_prints_one_frame_or_the_root_json() {
    let (_db, root, _limiter) = root_with_traffic().await;
    overview_until(&root, "the limiter's weight at the root", |ov| {
        ov["quotas"][0]["name"] == "photos_read"
    })
    .await;
    let output = top(&root.url, &["--once"]).await;
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.starts_with(&format!("sluice root {}/  ok  v", root.url)),
        "{text}"
    );
    let quota_row = text
        .lines()
        .find(|l| l.starts_with("photos_read "))
        .unwrap_or_else(|| panic!("no photos_read row in\n{text}"));
    assert!(quota_row.contains(" photos "), "{quota_row}");
    assert!(text.contains("\nLIMITER "), "{text}");
    assert!(text.lines().any(|l| l.starts_with("edge-1 ")), "{text}");

    let output = top(&root.url, &["--once", "--json", "--top", "1"]).await;
    assert!(output.status.success(), "{output:?}");
    let ov: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(ov["access"], "admin");
    assert_eq!(ov["quotas"].as_array().unwrap().len(), 1);

    let output = top(&root.url, &["--once", "--top", "0"]).await;
    assert_eq!(output.status.code(), Some(2), "clap refuses --top 0");
}

/// The console's busiest keys, in `sluice top` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_top_shows_the_busiest_keys_by_hash() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    root.put(
        "api_user",
        serde_json::json!({"limit": 0, "low_burst": 5, "high_burst": 10, "per_key": true}),
    )
    .await;
    let mut limiter = root_support::Limiter::new("edge-1");
    limiter.catch_up(&root).await;
    let id = limiter.id_of("api_user").unwrap();
    let request = limiter.keyed_request(id, &[(0xab, 12), (0xcd, 2)]);
    let (status, reply) = root.sync(&request).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    overview_until(&root, "the keys in the overview", |ov| {
        ov["keys"].as_array().is_some_and(|k| k.len() == 2)
    })
    .await;
    let output = top(&root.url, &["--once"]).await;
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("\nPER-KEY QUOTA "), "{text}");
    let row = |hash: &str| {
        text.lines()
            .find(|l| l.starts_with("api_user ") && l.contains(hash))
            .unwrap_or_else(|| panic!("no row of key {hash} in\n{text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // The fuller key first: level 12 of a high burst of 10 (full, all
    // rejected), then level 2.
    let full = row("00000000000000ab");
    assert_eq!(
        (full[2].as_str(), full[3].as_str()),
        ("12", "120"),
        "{full:?}"
    );
    assert_eq!(full[5], "100", "{full:?}");
    assert_eq!(row("00000000000000cd")[2], "2");
    let first = text.find("00000000000000ab").unwrap();
    assert!(first < text.find("00000000000000cd").unwrap(), "{text}");
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_top_once_fails_with_one_line_when_the_root_is_down() {
    let port = sync_support::free_port();
    let output = top(
        &format!("http://127.0.0.1:{port}"),
        &["--once", "--timeout", "2s"],
    )
    .await;
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("sluice: GET http://127.0.0.1:"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}

/// True when tmux runs here; without it the screen test is skipped, saying
/// so, except in CI, where it fails.
fn tmux_available() -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"));
        assert!(!ci, "tmux is required in CI (make deps installs it)");
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "warning: skipping the tmux test: no tmux"
        );
    }
    ok
}

/// A tmux server of its own (`-L`), so the test touches no one's sessions.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let output = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux");
        assert!(output.status.success(), "tmux {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_top_redraws_the_screen_until_ctrl_c() {
    if !tmux_available() {
        return;
    }
    let (_db, root, limiter) = root_with_traffic().await;
    let tmux = Tmux {
        socket: format!("sluice-top-test-{}", std::process::id()),
    };
    let token = format!("SLUICE_ADMIN_TOKEN={ADMIN_TOKEN}");
    // The command as separate words: tmux runs it without a shell, so
    // Ctrl-C reaches `sluice top` alone. The pane stays after it exits (set
    // in the same command list, before tmux can notice an exit).
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        "-e",
        &token,
        SLUICE,
        "top",
        "--root",
        &root.url,
        "--interval",
        "300ms",
        ";",
        "set-option",
        "-t",
        "top",
        "remain-on-exit",
        "on",
    ]);
    let wait_for = |what: &str, done: &dyn Fn(&str) -> bool| {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let screen = tmux.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let first = tokio::task::block_in_place(|| {
        wait_for("the first frame", &|s| {
            s.contains("photos_read") && s.contains("edge-1")
        })
    });
    assert!(
        first.starts_with("sluice root http://"),
        "one frame from the top:\n{first}"
    );
    // The limiter's sync count grows every 200 ms: the frame changes.
    let row = |screen: &str| {
        screen
            .lines()
            .find(|l| l.starts_with("edge-1 "))
            .map(str::to_string)
    };
    let first_row = row(&first);
    tokio::task::block_in_place(|| {
        wait_for("a redraw", &|s| row(s).is_some() && row(s) != first_row)
    });
    let pid = tmux.run(&["display-message", "-p", "-t", "top", "#{pane_pid}"]);
    let proc_dir = format!("/proc/{}", pid.trim());
    // Gone, or a zombie its parent (the tmux server) has not reaped yet.
    let exited = || {
        std::fs::read_to_string(format!("{proc_dir}/stat"))
            .map(|stat| {
                stat.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    };
    tmux.run(&["send-keys", "-t", "top", "C-c"]);
    let status = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + PATIENCE;
        let mut exited_since = None;
        loop {
            let dead = tmux.run(&[
                "display-message",
                "-p",
                "-t",
                "top",
                "#{pane_dead} #{pane_dead_status} #{pane_dead_signal}",
            ]);
            // tmux marks the pane dead when the terminal closes and adds
            // the status when it reaps the process; under load tmux 3.3a
            // sometimes never shows the status of a pane already marked
            // dead. Then the process being gone is the proof it stopped.
            if dead.starts_with('1') && dead.split_whitespace().count() > 1 {
                return Some(dead);
            }
            if exited() {
                let since = *exited_since.get_or_insert_with(Instant::now);
                if dead.starts_with('1') && since.elapsed() > Duration::from_secs(2) {
                    return None;
                }
            }
            assert!(
                Instant::now() < deadline,
                "sluice top did not stop on Ctrl-C (pane: {dead:?}):\n{}",
                tmux.screen()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    if let Some(status) = status {
        assert_eq!(
            status.split_whitespace().collect::<Vec<_>>(),
            ["1", "0"],
            "sluice top exits 0 on Ctrl-C, not by the signal"
        );
    }
    // It left the alternate screen on its way out (a process killed by
    // the signal leaves its last frame on the pane).
    let last = tmux.screen();
    assert!(
        !last.contains("sluice root http://"),
        "the frame is still on the screen:\n{last}"
    );
    drop(limiter);
}
