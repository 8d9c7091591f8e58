//! What a root believes of a sync, over real HTTP: per-limiter tokens,
//! counters named twice, the level cap and per-limiter allowances.

#[macro_use]
mod root_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use root_support::{config, config_with_tokens, eventually, Db, Limiter, TestRoot, SYNC_TOKEN};
use sluice::root::RootConfig;

on_both_backends!(
    a_forged_huge_delta_is_capped_and_the_quota_passes_again,
    a_forged_window_count_is_capped_and_clears_with_its_window,
);

/// Largest delta a sync may carry (`api::sync::MAX_DELTA`).
const MAX_DELTA: u64 = 1 << 53;

/// A sync request of `limiter` carrying `deltas` (key hash, weight) for
/// the keys of template `id`, in window `window` if given.
fn keyed_request(limiter: &Limiter, id: u64, deltas: &[(u64, u64)], window: Option<i64>) -> Value {
    let mut request = limiter.request(&[]);
    let deltas: Vec<Value> = deltas.iter().map(|&(k, d)| json!([k, d])).collect();
    request["keyed"] = json!([{"id": id, "deltas": deltas}]);
    if let Some(window) = window {
        request["keyed"][0]["window"] = json!(window);
    }
    request
}

/// A sync of `request` with `token` (or none).
async fn sync_with(root: &TestRoot, token: Option<&str>, request: &Value) -> (StatusCode, Value) {
    let body = serde_json::to_vec(request).unwrap();
    root.request(Method::POST, "/v1/sync", token, Some(body))
        .await
}

/// The live level of quota `name` at the root (admin API).
async fn level(root: &TestRoot, name: &str) -> f64 {
    let (status, quota) = root.get(name).await;
    assert_eq!(status, StatusCode::OK, "{quota}");
    quota["level"].as_f64().unwrap_or(0.0)
}

/// The live level of key `hash` of template `name`.
async fn key_level(root: &TestRoot, name: &str, hash: u64) -> Option<f64> {
    let (status, key) = root
        .admin(
            Method::GET,
            &format!("/v1/quotas/{name}/keys/{hash:016x}"),
            None,
        )
        .await;
    (status == StatusCode::OK).then(|| key["level"].as_f64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_named_twice_is_refused_whole() {
    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    root.put(
        "q",
        json!({"limit": 0, "low_burst": 100, "high_burst": 200}),
    )
    .await;
    root.put(
        "per_user",
        json!({"limit": 0, "low_burst": 100, "high_burst": 200, "per_key": true}),
    )
    .await;
    let mut a = Limiter::new("host-a");
    a.catch_up(&root).await;
    let (q, per_user) = (a.id_of("q").unwrap(), a.id_of("per_user").unwrap());

    let (status, error) = root.sync(&a.request(&[(q, 5), (q, 7)])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["field"], "deltas[1].id");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("quota {q} appears twice")),
        "{message}"
    );

    // A key twice, in two groups of one template (two windows): refused,
    // and the named delta that came with it is not applied either.
    let mut twice = keyed_request(&a, per_user, &[(0xaa, 1), (0xbb, 1)], None);
    twice["deltas"] = json!([{"id": q, "delta": 9}]);
    twice["keyed"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": per_user, "deltas": [[0xcc, 1], [0xbb, 4]], "window": 3}));
    let (status, error) = root.sync(&twice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["field"], "keyed[1].deltas[1]");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("key 00000000000000bb of template {per_user}")),
        "{message}"
    );
    assert_eq!(level(&root, "q").await, 0.0);
    for key in [0xaa, 0xbb, 0xcc] {
        assert_eq!(key_level(&root, "per_user", key).await, None);
    }
    assert_eq!(
        root.metric("sluice_root_rejected_requests_total{api=\"sync\",reason=\"invalid\"}")
            .await,
        Some(2.0)
    );
    // The same deltas once each are fine.
    a.sync(&root, &[(q, 5)]).await;
    assert_eq!(level(&root, "q").await, 5.0);
    root.stop().await;
}

/// Seconds from one root time (ns) to another.
fn seconds(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1e9
}

async fn a_forged_huge_delta_is_capped_and_the_quota_passes_again(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    // Cap: 2 * high_burst + limit * 5 s = 200 + 500 = 700; back under
    // high_burst within high_burst / limit + 5 s = 6 s.
    root.put(
        "api",
        json!({"limit": 100, "low_burst": 50, "high_burst": 100}),
    )
    .await;
    let mut honest = Limiter::new("honest");
    honest.catch_up(&root).await;
    let id = honest.id_of("api").unwrap();

    // Forged syncs under many ids (one shared token, or none: anyone can
    // name any limiter), each the largest delta a sync may carry. Each id
    // gets its allowance (2 * (100 + 100 * 5 s) = 1200); the level stops
    // at 700.
    let mut forged_at = 0;
    for n in 0..3 {
        let mut forger = Limiter::new(&format!("forged-{n}"));
        forger.catch_up(&root).await;
        let reply = forger.sync(&root, &[(id, MAX_DELTA)]).await;
        let counter = reply["counters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .cloned()
            .expect("the forged counter in the reply");
        forged_at = counter["at"].as_u64().unwrap();
        assert_eq!(counter["level"].as_f64(), Some(700.0), "{counter}");
    }
    assert_eq!(
        root.metric("sluice_root_levels_capped_total").await,
        Some(3.0)
    );
    assert_eq!(
        root.metric("sluice_root_sync_deltas_clipped_total").await,
        Some(3.0)
    );
    // Still shut right after.
    assert!(level(&root, "api").await > 100.0);

    // Within the documented 6 s it is back under high_burst, and traffic
    // passes again as it leaks below: here 6.5 s, at most 50 = low_burst.
    let deadline = std::time::Instant::now() + root_support::PATIENCE;
    let last = loop {
        let reply = honest.sync(&root, &[]).await;
        if seconds(forged_at, reply["root_time"].as_u64().unwrap()) >= 6.5 {
            break reply;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the root's clock stands still"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let now = last["root_time"].as_u64().unwrap();
    let after = seconds(forged_at, now);
    let level_now = level(&root, "api").await;
    assert!(
        level_now <= (700.0 - 100.0 * after).max(0.0) + 1e-6 && level_now <= 50.0,
        "{level_now} after {after} s"
    );
    // An honest delta counts in full again.
    let reply = honest.sync(&root, &[(id, 10)]).await;
    let counter = &reply["counters"][0];
    assert!(counter["level"].as_f64().unwrap() <= 60.0, "{reply}");
    root.stop().await;
}

async fn a_forged_window_count_is_capped_and_clears_with_its_window(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    // A 1 s fixed window of 100: counts are capped at 2 * 100.
    root.put(
        "per_second",
        json!({"limit": 100, "low_burst": 80, "high_burst": 100, "window": "1s"}),
    )
    .await;
    let mut limiter = Limiter::new("honest");
    limiter.catch_up(&root).await;
    let id = limiter.id_of("per_second").unwrap();
    let mut top = 0.0_f64;
    for n in 0..3 {
        let mut forger = Limiter::new(&format!("forged-{n}"));
        forger.catch_up(&root).await;
        let reply = forger.sync(&root, &[(id, MAX_DELTA)]).await;
        for c in reply["counters"].as_array().unwrap() {
            if c["id"] == id {
                top = top.max(c["level"].as_f64().unwrap());
                assert!(c["level"].as_f64().unwrap() <= 200.0, "{c}");
                assert!(c["prev"].as_f64().unwrap_or(0.0) <= 200.0, "{c}");
            }
        }
    }
    assert!(top > 100.0, "the forged syncs shut the window: {top}");
    // The next window starts from nothing: within a second or two of root
    // time the count is back to what honest traffic puts in it.
    eventually("the forged window to end", || async {
        level(&root, "per_second").await == 0.0
    })
    .await;
    limiter.sync(&root, &[(id, 10)]).await;
    assert!(level(&root, "per_second").await <= 10.0);
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_limiter_is_clipped_and_honest_ones_are_not() {
    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    // Allowance per limiter: 2 * (20 + 10 * 5 s) = 140, refilling at
    // 20/s; the level cap is 2 * 20 + 10 * 5 s = 90.
    root.put(
        "api",
        json!({"limit": 10, "low_burst": 10, "high_burst": 20}),
    )
    .await;
    root.put(
        "per_user",
        json!({"limit": 10, "low_burst": 10, "high_burst": 20, "per_key": true}),
    )
    .await;
    let (mut honest, mut runaway) = (Limiter::new("honest"), Limiter::new("runaway"));
    honest.catch_up(&root).await;
    runaway.catch_up(&root).await;
    let (api, per_user) = (
        honest.id_of("api").unwrap(),
        honest.id_of("per_user").unwrap(),
    );

    // The honest limiter sends what it can admit: a burst, then the rate.
    honest.sync(&root, &[(api, 20)]).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        honest.sync(&root, &[(api, 5)]).await;
    }
    let honest_level = level(&root, "api").await;
    assert!(honest_level > 10.0, "{honest_level}");
    // The runaway one sends a thousand at once: 140 of it counts, and
    // the level stops at the cap.
    // Both levels leak at 10/s from the sync on: the lower bounds allow
    // for the time the test took (a loaded machine), not a fixed margin.
    let leaked_since = |start: Instant| 10.0 * start.elapsed().as_secs_f64() + 1.0;
    let start = Instant::now();
    runaway.sync(&root, &[(api, 1000)]).await;
    let after = level(&root, "api").await;
    let floor = 90.0 - leaked_since(start);
    assert!(
        after <= 90.0 && after > floor,
        "{honest_level} then {after} (floor {floor})"
    );
    // Keys too: each key of the runaway limiter's has its allowance.
    let start = Instant::now();
    let (status, reply) = root
        .sync(&keyed_request(
            &runaway,
            per_user,
            &[(0xaa, 1000), (0xbb, 3)],
            None,
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let aa = key_level(&root, "per_user", 0xaa).await.unwrap();
    let floor = 90.0 - leaked_since(start);
    assert!(aa <= 90.0 && aa > floor, "{aa} (floor {floor})");
    assert!(key_level(&root, "per_user", 0xbb).await.unwrap() > 2.9);

    for (series, value) in [
        ("sluice_root_sync_deltas_clipped_total", 2.0),
        (
            "sluice_root_limiter_deltas_clipped_total{limiter=\"runaway\"}",
            2.0,
        ),
        (
            "sluice_root_limiter_weight_clipped_total{limiter=\"runaway\"}",
            1720.0,
        ),
    ] {
        assert_eq!(root.metric(series).await, Some(value), "{series}");
    }
    let metrics = root.metrics().await;
    assert!(!metrics.contains("limiter=\"honest\""), "{metrics}");
    // The overview's limiters say who was clipped.
    let (status, overview) = root.admin(Method::GET, "/v1/overview", None).await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    let clipped = |id: &str| {
        overview["limiters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["id"] == id)
            .map(|l| l["clipped_deltas"].clone())
    };
    assert_eq!(clipped("runaway"), Some(json!(2)));
    assert_eq!(clipped("honest"), Some(json!(0)));
    root.stop().await;
}

/// A root with the shared token and a limiter tokens file; the file's
/// directory lives as long as the returned guard.
async fn root_with_limiter_tokens(
    db: &Db,
    tokens: &str,
    shared: bool,
) -> (TestRoot, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiters.tokens");
    std::fs::write(&path, tokens).unwrap();
    let mut config = config_with_tokens(db);
    if !shared {
        config.sync_token = None;
    }
    config.limiter_tokens_file = Some(path.clone());
    (TestRoot::start(config).await, path, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_token_syncs_only_as_its_limiter() {
    let db = Db::sqlite();
    let (root, _, _dir) =
        root_with_limiter_tokens(&db, "# fleet\nweb-1 tok-1\nweb-2 tok-2\n", true).await;
    root.put(
        "q",
        json!({"limit": 0, "low_burst": 1000, "high_burst": 1000}),
    )
    .await;
    root.put(
        "per_user",
        json!({"limit": 0, "low_burst": 1000, "high_burst": 1000, "per_key": true}),
    )
    .await;
    root.put(
        "per_day",
        json!({"limit": 1000, "low_burst": 1000, "high_burst": 1000, "window": "1d"}),
    )
    .await;
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400;
    let (mut web1, mut web3) = (Limiter::new("web-1"), Limiter::new("web-3"));
    // Its own token as itself; the shared token as an unlisted limiter.
    let (status, reply) = sync_with(&root, Some("tok-1"), &web1.request(&[])).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    web1.absorb(&reply);
    let (status, reply) = sync_with(&root, Some(SYNC_TOKEN), &web3.request(&[])).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    web3.absorb(&reply);
    let (q, per_user, per_day) = (
        web1.id_of("q").unwrap(),
        web1.id_of("per_user").unwrap(),
        web1.id_of("per_day").unwrap(),
    );

    // web-1's token writing as web-2, with named, keyed and window
    // deltas: refused whole, 403 naming the limiter.
    let mut as_web2 = keyed_request(&Limiter::new("web-2"), per_user, &[(0xaa, 3)], None);
    as_web2["deltas"] = json!([
        {"id": q, "delta": 7},
        {"id": per_day, "delta": 4, "window": today},
    ]);
    let (status, error) = sync_with(&root, Some("tok-1"), &as_web2).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
    assert_eq!(error["error"]["field"], "limiter");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"web-1\"") && message.contains("\"web-2\""),
        "{message}"
    );
    // The shared token writing as a listed limiter: refused too.
    let (status, error) = sync_with(&root, Some(SYNC_TOKEN), &as_web2).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limiter_tokens_file"),
        "{error}"
    );
    // Nothing of either was applied.
    assert_eq!(level(&root, "q").await, 0.0);
    assert_eq!(level(&root, "per_day").await, 0.0);
    assert_eq!(key_level(&root, "per_user", 0xaa).await, None);
    // A token nobody has: 401.
    let (status, _) = sync_with(&root, Some("tok-9"), &web1.request(&[])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = sync_with(&root, None, &web3.request(&[])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // web-2's own token as web-2 works.
    let (status, reply) = sync_with(&root, Some("tok-2"), &as_web2).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(level(&root, "q").await, 7.0);
    assert_eq!(level(&root, "per_day").await, 4.0);
    assert_eq!(key_level(&root, "per_user", 0xaa).await, Some(3.0));

    for (series, value) in [
        ("sluice_root_syncs_total{result=\"forbidden\"}", 2.0),
        (
            "sluice_root_rejected_requests_total{api=\"sync\",reason=\"forbidden\"}",
            2.0,
        ),
        ("sluice_root_syncs_total{result=\"unauthorized\"}", 2.0),
        ("sluice_root_limiter_tokens", 2.0),
    ] {
        assert_eq!(root.metric(series).await, Some(value), "{series}");
    }
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_shared_token_only_listed_limiters_sync_and_the_file_is_reread() {
    let db = Db::sqlite();
    let (root, path, _dir) = root_with_limiter_tokens(&db, "web-1 tok-1\n", false).await;
    let web1 = Limiter::new("web-1");
    let (status, _) = sync_with(&root, Some("tok-1"), &web1.request(&[])).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = sync_with(&root, Some(SYNC_TOKEN), &web1.request(&[])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A new token for web-1 and a new limiter: taken at the next tick.
    std::fs::write(&path, "web-1 tok-1b\nweb-2 tok-2\n").unwrap();
    eventually("the new tokens to be in force", || async {
        sync_with(&root, Some("tok-1b"), &web1.request(&[])).await.0 == StatusCode::OK
    })
    .await;
    let (status, _) = sync_with(&root, Some("tok-1"), &web1.request(&[])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = sync_with(&root, Some("tok-2"), &Limiter::new("web-2").request(&[])).await;
    assert_eq!(status, StatusCode::OK);

    // A broken file is logged and the tokens in force are kept.
    std::fs::write(&path, "web-1 tok-1b\nweb-2\n").unwrap();
    eventually("the broken reread to be counted", || async {
        root.metric("sluice_root_limiter_tokens_reloads_total{result=\"failed\"}")
            .await
            == Some(1.0)
    })
    .await;
    let (status, _) = sync_with(&root, Some("tok-2"), &Limiter::new("web-2").request(&[])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(root.metric("sluice_root_limiter_tokens").await, Some(2.0));
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_malformed_tokens_file_fails_the_start_with_file_and_line() {
    let db = Db::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiters.tokens");
    std::fs::write(&path, "web-1 tok-1\n\nweb-1 tok-2\n").unwrap();
    for (file, says) in [
        (
            path.clone(),
            format!("{}:3: limiter \"web-1\" is listed twice", path.display()),
        ),
        (
            dir.path().join("missing"),
            format!("{}: No such file", dir.path().join("missing").display()),
        ),
    ] {
        let config = sluice::root::RootConfig {
            limiter_tokens_file: Some(file),
            ..config(&db)
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let error = sluice::root::run(listener, config, std::future::pending())
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(&says), "{error}");
    }
}

/// Issue 21's flood: with `max_keys = 1000`, one limiter sends five syncs
/// of 1,000 invented key hashes each. It holds at most its share (a
/// quarter, the default) of the key counters, and another limiter's key
/// still gets its counter, and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_limiters_flood_of_keys_leaves_room_for_another_limiters_key() {
    let db = Db::sqlite();
    let root = TestRoot::start(RootConfig {
        max_keys: 1000,
        ..config(&db)
    })
    .await;
    root.put(
        "per_user",
        json!({"limit": 1, "window": "1d", "per_key": true}),
    )
    .await;
    let (mut junk, mut honest) = (Limiter::new("junk"), Limiter::new("honest"));
    junk.catch_up(&root).await;
    honest.catch_up(&root).await;
    let per_user = junk.id_of("per_user").unwrap();
    let mut next = 0x1000_0000_u64;
    for _ in 0..5 {
        let deltas: Vec<(u64, u64)> = (0..1000)
            .map(|_| {
                next += 0x9e37_79b9;
                (next, 1)
            })
            .collect();
        let (status, reply) = root
            .sync(&keyed_request(&junk, per_user, &deltas, None))
            .await;
        assert_eq!(status, StatusCode::OK, "{reply}");
    }
    let keys = root.metric("sluice_root_keys").await.unwrap_or(0.0);
    assert!(
        (200.0..=300.0).contains(&keys),
        "the flood holds about its share of 250 (and an eighth): {keys}"
    );
    let refused = root
        .metric("sluice_root_keys_refused_total")
        .await
        .unwrap_or(0.0);
    assert!(refused >= 4500.0, "{refused}");
    // The honest limiter's key gets a counter, and it counts.
    let (status, reply) = root
        .sync(&keyed_request(&honest, per_user, &[(0xabc, 1)], None))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(key_level(&root, "per_user", 0xabc).await, Some(1.0));
    root.stop().await;
}
