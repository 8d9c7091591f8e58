//! What one holder of a valid sync token can make a real root hold, over
//! HTTP on loopback (issue 22): trickling bodies hold no slot and only the
//! memory of what they sent, and are cut when they lag behind the upload
//! rate; a limiter has at most `max_syncs_per_limiter` syncs in flight;
//! a binary body that announces more entries than a sync may carry is
//! refused before it is decoded; invented limiter ids do not hide a new
//! limiter; rejection counts are checked; limiter ids stay off the
//! public `/metrics`.
//!
//! Timeouts are configured short; time bounds in the tests are generous
//! and only tell "cut" from "never cut".

mod root_support;
mod wire_support;

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sluice::root::RootConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use root_support::raw::{connect_from, exchange};
use root_support::{
    config_with_tokens, eventually, Db, Limiter, TestRoot, ADMIN_TOKEN, PATIENCE, SYNC_TOKEN,
};
use wire_support::tiny_deltas;

/// A sync request's head with the sync token (or `token`), declaring a
/// body of `length` bytes, and with `limiter` in the `sluice-limiter`
/// header when given.
fn sync_head(length: usize, limiter: Option<&str>, token: &str) -> Vec<u8> {
    let named = limiter
        .map(|id| format!("sluice-limiter: {id}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /v1/sync HTTP/1.1\r\nHost: root\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\n{named}Content-Length: {length}\r\n\r\n"
    )
    .into_bytes()
}

/// A whole sync request of `limiter` with the sync token.
fn sync_bytes(limiter: &Limiter, header: Option<&str>) -> Vec<u8> {
    let body = serde_json::to_vec(&limiter.request(&[])).unwrap();
    let mut request = sync_head(body.len(), header, SYNC_TOKEN);
    request.extend_from_slice(&body);
    request
}

/// Reads one response from `stream`: its status and JSON body.
async fn response(stream: &mut TcpStream) -> (u16, Value) {
    exchange(stream, b"").await
}

/// A sync declaring `length` body bytes that sends one byte every
/// `every` until the root answers; returns the answer.
fn trickle(root: &TestRoot, length: usize, every: Duration) -> JoinHandle<(u16, Value)> {
    let addr = root.addr;
    tokio::spawn(async move {
        let mut stream = connect_from(addr, "127.0.0.1").await;
        stream
            .write_all(&sync_head(length, None, SYNC_TOKEN))
            .await
            .unwrap();
        let (mut stream, mut write) = stream.into_split();
        let writer = tokio::spawn(async move {
            while write.write_all(b" ").await.is_ok() {
                tokio::time::sleep(every).await;
            }
        });
        let mut buf = Vec::new();
        let answer = tokio::time::timeout(PATIENCE, async {
            let mut chunk = [0u8; 4096];
            loop {
                let n = stream.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        })
        .await;
        writer.abort();
        assert!(answer.is_ok(), "the root answered the trickle in time");
        let text = String::from_utf8_lossy(&buf).to_string();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str(b).ok())
            .unwrap_or(Value::Null);
        (status, body)
    })
}

async fn metric(root: &TestRoot, series: &str) -> f64 {
    root.metric(series).await.unwrap_or(-1.0)
}

/// The two slow-body attacks of the issue at once, by one token holder:
/// 12 syncs declaring 67,000,000 bytes and 10 (more than the root's 4
/// slots) declaring 1,000, all trickling. Honest syncs, `/healthz` and
/// `/metrics` are answered meanwhile, and the trickles hold a kilobyte
/// of memory each, not what they declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_sync_bodies_hold_no_slot_and_only_what_they_sent() {
    let db = Db::sqlite();
    let root = TestRoot::start(RootConfig {
        max_in_flight: 4,
        // Held for the whole test: only the timeouts would cut them.
        min_body_rate: 0,
        body_timeout: Duration::from_secs(120),
        ..config_with_tokens(&db)
    })
    .await;
    let every = Duration::from_millis(200);
    let mut attack: Vec<_> = (0..12).map(|_| trickle(&root, 67_000_000, every)).collect();
    attack.extend((0..10).map(|_| trickle(&root, 1000, every)));
    eventually("every trickle has sent a byte", || async {
        metric(&root, "sluice_root_body_memory_bytes").await >= 22.0 * 1024.0
    })
    .await;
    let held = metric(&root, "sluice_root_body_memory_bytes").await;
    assert!(held < 64.0 * 1024.0, "{held} bytes held by 22 trickles");
    let mut limiter = Limiter::new("honest");
    for _ in 0..5 {
        limiter.sync(&root, &[]).await;
    }
    for path in ["/healthz", "/metrics"] {
        let (status, _) = root.request(Method::GET, path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    // Still under way: none was answered.
    assert!(attack.iter().all(|t| !t.is_finished()));
    // Theirs, and the honest limiter's.
    assert!(metric(&root, "sluice_root_connections_trusted").await >= 22.0);
    for task in &attack {
        task.abort();
    }
    root.stop().await;
}

/// A body that falls behind `min_body_rate` for `body_grace` is cut with
/// 408 naming the rule; one that keeps up is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_below_the_minimum_upload_rate_is_cut_after_the_grace() {
    let db = Db::sqlite();
    let root = TestRoot::start(RootConfig {
        min_body_rate: 100,
        body_grace: Duration::from_millis(800),
        ..config_with_tokens(&db)
    })
    .await;
    let slow = trickle(&root, 67_000_000, Duration::from_millis(100));
    let small = trickle(&root, 1000, Duration::from_millis(100));
    for task in [slow, small] {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 408, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("min_body_rate"), "{message}");
    }
    assert_eq!(
        metric(
            &root,
            "sluice_root_rejected_requests_total{api=\"sync\",reason=\"body_timeout\"}"
        )
        .await,
        2.0
    );
    // A body sent at 400 bytes a second in 40-byte pieces keeps up.
    let limiter = Limiter::new("steady");
    let mut body = serde_json::to_vec(&limiter.request(&[])).unwrap();
    body.resize(1200, b' ');
    let mut stream = connect_from(root.addr, "127.0.0.1").await;
    stream
        .write_all(&sync_head(body.len(), None, SYNC_TOKEN))
        .await
        .unwrap();
    for piece in body.chunks(40) {
        stream.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, reply) = response(&mut stream).await;
    assert_eq!(status, 200, "{reply}");
    root.stop().await;
}

/// Writes a sync's head and half its body, naming `header` in the
/// `sluice-limiter` header, with `token`: a sync in flight until the rest
/// is sent.
async fn half_sent(
    root: &TestRoot,
    limiter: &Limiter,
    header: Option<&str>,
    token: &str,
) -> (TcpStream, Vec<u8>) {
    let body = serde_json::to_vec(&limiter.request(&[])).unwrap();
    let mut stream = connect_from(root.addr, "127.0.0.1").await;
    stream
        .write_all(&sync_head(body.len(), header, token))
        .await
        .unwrap();
    let (first, rest) = body.split_at(body.len() / 2);
    stream.write_all(first).await.unwrap();
    (stream, rest.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_has_at_most_max_syncs_per_limiter_in_flight() {
    let db = Db::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("limiters.tokens");
    std::fs::write(&tokens, "web-own own-token\n").unwrap();
    let root = TestRoot::start(RootConfig {
        max_syncs_per_limiter: 2,
        limiter_tokens_file: Some(tokens),
        ..config_with_tokens(&db)
    })
    .await;
    let web1 = Limiter::new("web-1");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(half_sent(&root, &web1, Some("web-1"), SYNC_TOKEN).await);
    }
    eventually("two syncs of web-1 in flight", || async {
        metric(&root, "sluice_root_body_memory_bytes").await >= 2048.0
    })
    .await;
    // A third, named in its header: refused at once, its body unread.
    let mut third = connect_from(root.addr, "127.0.0.1").await;
    let (status, reply) = exchange(&mut third, &sync_bytes(&web1, Some("web-1"))).await;
    assert_eq!(status, 429, "{reply}");
    assert_eq!(reply["error"]["field"], "limiter");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_syncs_per_limiter"), "{message}");
    // Named only in its body: counted once decoded, refused the same.
    let mut fourth = connect_from(root.addr, "127.0.0.1").await;
    let (status, _) = exchange(&mut fourth, &sync_bytes(&web1, None)).await;
    assert_eq!(status, 429);
    // Another limiter is not held up.
    let mut other = connect_from(root.addr, "127.0.0.1").await;
    let web2 = Limiter::new("web-2");
    let (status, _) = exchange(&mut other, &sync_bytes(&web2, Some("web-2"))).await;
    assert_eq!(status, 200);
    // A header that names another limiter than the body: 400.
    let (status, reply) = exchange(&mut other, &sync_bytes(&web2, Some("web-3"))).await;
    assert_eq!(
        (status, reply["error"]["field"].as_str()),
        (400, Some("limiter"))
    );
    // The two in flight finish; then web-1 syncs again.
    for (mut stream, rest) in held {
        stream.write_all(&rest).await.unwrap();
        assert_eq!(response(&mut stream).await.0, 200);
    }
    let mut again = connect_from(root.addr, "127.0.0.1").await;
    let (status, _) = exchange(&mut again, &sync_bytes(&web1, Some("web-1"))).await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&root, "sluice_root_syncs_total{result=\"busy\"}").await,
        2.0
    );
    // A limiter's own token names it without the header.
    let own = Limiter::new("web-own");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(half_sent(&root, &own, None, "own-token").await);
    }
    eventually("two syncs of web-own in flight", || async {
        metric(&root, "sluice_root_body_memory_bytes").await >= 2048.0
    })
    .await;
    let body = serde_json::to_vec(&own.request(&[])).unwrap();
    let mut request = sync_head(body.len(), None, "own-token");
    request.extend_from_slice(&body);
    let mut third = connect_from(root.addr, "127.0.0.1").await;
    assert_eq!(exchange(&mut third, &request).await.0, 429);
    drop(held);
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_bodies_past_the_entry_cap_are_refused_before_decoding_and_free_their_memory() {
    let db = Db::sqlite();
    let root = TestRoot::start(config_with_tokens(&db)).await;
    for n in [1_000_001, 20_000_000] {
        let reply = root
            .http
            .post(format!("{}/v1/sync", root.url))
            .bearer_auth(SYNC_TOKEN)
            .header("content-type", "application/x-sluice-sync")
            .body(tiny_deltas(n))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::BAD_REQUEST);
        let error: Value = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
        assert_eq!(error["error"]["field"], "deltas[0..] (run 0)", "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("at most 1000000 per sync"), "{message}");
    }
    // A JSON body of more objects and arrays than any request has.
    let mut json = b"{\"limiter\":\"h\",\"rejected\":[".to_vec();
    json.extend(b"[],".repeat(2_000_010));
    json.extend(b"[]]}");
    let (status, error) = root
        .request(Method::POST, "/v1/sync", Some(SYNC_TOKEN), Some(json))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["field"], "deltas", "{error}");
    assert_eq!(metric(&root, "sluice_root_body_memory_bytes").await, 0.0);
    root.stop().await;
}

/// A root with one quota `q` of `quota`, and a limiter `limiter` that
/// knows it; returns them and `q`'s id.
async fn root_with_quota(
    config: RootConfig,
    quota: Value,
    limiter: &str,
) -> (TestRoot, Limiter, u64) {
    let root = TestRoot::start(config).await;
    root.put("q", quota).await;
    let mut limiter = Limiter::new(limiter);
    limiter.catch_up(&root).await;
    let q = limiter.id_of("q").unwrap();
    (root, limiter, q)
}

/// Syncs once as `id` with `body`, with the shared token.
async fn sync_as(root: &TestRoot, id: &str, body: Value) -> (StatusCode, Value) {
    let mut body = body;
    body["limiter"] = json!(id);
    root.sync(&body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_limiter_ids_do_not_hide_a_new_limiter() {
    let db = Db::sqlite();
    let config = RootConfig {
        max_limiters: 20,
        ..config_with_tokens(&db)
    };
    let quota = json!({"limit": 1e6, "high_burst": 1e9});
    let (root, probe, q) = root_with_quota(config, quota, "probe").await;
    for i in 0..100 {
        let (status, _) = sync_as(&root, &format!("junk-{i}"), probe.request(&[(q, 1)])).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _) = sync_as(&root, "web-new", probe.request(&[(q, 1)])).await;
    assert_eq!(status, StatusCode::OK);
    let (_, quota) = root.get("q").await;
    let limiters: Vec<&str> = quota["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["limiter"].as_str().unwrap())
        .collect();
    assert_eq!(limiters.first(), Some(&"web-new"), "{quota}");
    let (_, overview) = root
        .request(Method::GET, "/v1/overview", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(overview["limiters"][0]["id"], "web-new", "{overview}");
    assert_eq!(metric(&root, "sluice_root_limiters_seen").await, 20.0);
    // 102 ids (the probe too) in a registry of 20.
    assert_eq!(
        metric(&root, "sluice_root_limiters_dropped_total{reason=\"full\"}").await,
        82.0
    );
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_not_heard_from_within_the_expiry_is_forgotten() {
    let db = Db::sqlite();
    let root = TestRoot::start(RootConfig {
        limiter_expiry: Duration::from_millis(500),
        ..config_with_tokens(&db)
    })
    .await;
    Limiter::new("gone").sync(&root, &[]).await;
    assert_eq!(metric(&root, "sluice_root_limiters_seen").await, 1.0);
    eventually("the idle limiter is forgotten", || async {
        metric(&root, "sluice_root_limiters_seen").await == 0.0
    })
    .await;
    assert_eq!(
        metric(
            &root,
            "sluice_root_limiters_dropped_total{reason=\"expired\"}"
        )
        .await,
        1.0
    );
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_counts_are_refused_twice_and_cut_to_a_plausible_rate() {
    let db = Db::sqlite();
    let quota = json!({"limit": 10, "high_burst": 20});
    let (root, mut limiter, q) = root_with_quota(config_with_tokens(&db), quota, "web-1").await;
    limiter.sync(&root, &[(q, 1)]).await;
    let mut twice = limiter.request(&[]);
    twice["rejected"] = json!([[q, 1], [q, 2]]);
    let (status, error) = root.sync(&twice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["field"], "rejected[1]");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("rejected[0]"), "{message}");
    // The forged counts: accepted, cut to ten million for the
    // second since this limiter's previous sync.
    let mut forged = limiter.request(&[]);
    forged["rejected"] = json!([[q, u64::MAX]]);
    let (status, reply) = root.sync(&forged).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(metric(&root, "sluice_root_sync_rejections_clipped_total").await > 1e18);
    let rate = || async { root.get("q").await.1["rejected_rate"].as_f64().unwrap() };
    eventually("the rejection rate shows", || async { rate().await > 0.0 }).await;
    let rate = rate().await;
    assert!(rate <= 1e7, "{rate} rejections a second");
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_ids_are_on_metrics_only_with_the_admin_token() {
    let db = Db::sqlite();
    let quota = json!({"limit": 1, "high_burst": 2});
    let (root, mut limiter, q) =
        root_with_quota(config_with_tokens(&db), quota, "secret-host").await;
    // A delta far beyond the allowance is clipped, and counted by limiter.
    limiter.sync(&root, &[(q, 1 << 40)]).await;
    let scrape = |token: Option<&'static str>| {
        let root = &root;
        async move {
            let mut request = root.http.get(format!("{}/metrics", root.url));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let reply = request.send().await.unwrap();
            (reply.status(), reply.text().await.unwrap())
        }
    };
    let (status, public) = scrape(None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!public.contains("secret-host"), "{public}");
    assert!(public.contains("sluice_root_sync_deltas_clipped_total 1"));
    let (status, admin) = scrape(Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        admin.contains("sluice_root_limiter_deltas_clipped_total{limiter=\"secret-host\"} 1"),
        "{admin}"
    );
    assert_eq!(scrape(Some("wrong")).await.0, StatusCode::UNAUTHORIZED);
    root.stop().await;
}

/// The new settings are read from the config file and checked.
#[test]
fn bound_settings_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("root.toml");
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        RootConfig::load(&sluice::root::RootArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
    };
    let config = load(
        "min_body_rate = 1000\nbody_grace = \"2s\"\nmax_syncs_per_limiter = 3\n\
         max_limiters = 500\nlimiter_expiry = \"10m\"\n",
    )
    .unwrap();
    assert_eq!(config.min_body_rate, 1000);
    assert_eq!(config.body_grace, Duration::from_secs(2));
    assert_eq!(config.max_syncs_per_limiter, 3);
    assert_eq!(config.max_limiters, 500);
    assert_eq!(config.limiter_expiry, Duration::from_secs(600));
    let defaults = RootConfig::default();
    assert_eq!(defaults.min_body_rate, 65536);
    assert_eq!(defaults.max_syncs_per_limiter, 2);
    for (text, key) in [
        ("body_grace = \"0s\"\n", "body_grace"),
        ("max_syncs_per_limiter = 0\n", "max_syncs_per_limiter"),
        ("max_limiters = 0\n", "max_limiters"),
        ("max_limiters = 100000000\n", "max_limiters"),
        ("limiter_expiry = \"never\"\n", "limiter_expiry"),
    ] {
        let error = load(text).unwrap_err();
        assert!(error.0.contains(key), "{text}: {error}");
    }
}
