//! The sync endpoint over real HTTP: counter math, paging, restarts, and
//! refusing absurd input whole.

#[macro_use]
mod root_support;

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use root_support::{config, quota, Db, Limiter, TestRoot};

on_both_backends!(
    two_limiters_share_a_counter_and_a_restarted_root_starts_from_the_floor,
    the_floor_rises_between_syncs,
    deltas_for_unknown_and_deleted_quotas_are_ignored,
    an_absurd_sync_is_rejected_whole,
    a_fresh_limiter_pages_through_every_quota,
    an_incremental_sync_carries_only_what_changed,
    metrics_count_syncs_deltas_and_limiters,
    keys_of_a_template_are_summed_per_key_and_listed_by_hash,
    returns_lower_the_counter_every_limiter_reads,
);

fn counter_ids(reply: &Value) -> Vec<u64> {
    reply["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect()
}

/// A sync request of `limiter` carrying `deltas` (key hash, weight) for
/// the keys of template `id`.
fn keyed_request(limiter: &Limiter, id: u64, deltas: &[(u64, u64)]) -> Value {
    let mut request = limiter.request(&[]);
    let deltas: Vec<Value> = deltas.iter().map(|&(k, d)| json!([k, d])).collect();
    request["keyed"] = json!([{"id": id, "deltas": deltas}]);
    request
}

async fn keys_of_a_template_are_summed_per_key_and_listed_by_hash(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put(
        "per_user",
        json!({"limit": 0, "low_burst": 100, "high_burst": 100, "per_key": true}),
    )
    .await;
    let (mut a, mut b) = (Limiter::new("host-a"), Limiter::new("host-b"));
    a.catch_up(&root).await;
    b.catch_up(&root).await;
    let id = a.id_of("per_user").unwrap();
    let (status, _) = root
        .sync(&keyed_request(&a, id, &[(0xaa, 5), (0xbb, 1)]))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, reply) = root.sync(&keyed_request(&b, id, &[(0xaa, 2)])).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let values = &reply["keyed"][0];
    assert_eq!(values["id"], id);
    let aa = values["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v[0] == 0xaa)
        .unwrap();
    assert_eq!(aa[1], 7.0);
    // The admin API lists keys by hash, busiest first, and shows one.
    let (status, top) = root
        .admin(Method::GET, "/v1/quotas/per_user/keys?top=1", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{top}");
    assert_eq!(top["keys_held"], 2);
    assert_eq!(top["keys"].as_array().unwrap().len(), 1);
    let (status, one) = root
        .admin(
            Method::GET,
            "/v1/quotas/per_user/keys/00000000000000aa",
            None,
        )
        .await;
    assert_eq!((status, one["level"].as_f64()), (StatusCode::OK, Some(7.0)));
    let (status, bad) = root
        .admin(Method::GET, "/v1/quotas/per_user/keys/xyz", None)
        .await;
    assert_eq!(
        (status, bad["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("key"))
    );
    // A key hash of 0 names no key: the whole sync is refused.
    let (status, bad) = root.sync(&keyed_request(&a, id, &[(0, 1)])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    root.stop().await;
}

async fn two_limiters_share_a_counter_and_a_restarted_root_starts_from_the_floor(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    // Limit 0 leaks nothing, so every level is exact.
    root.put("q", quota(0.0, 100.0, 200.0, None)).await;
    let (mut a, mut b) = (Limiter::new("host-a"), Limiter::new("host-b"));
    a.catch_up(&root).await;
    b.catch_up(&root).await;
    let id = a.id_of("q").unwrap();

    a.sync(&root, &[(id, 50)]).await;
    assert_eq!(a.levels[&id], 50.0);
    b.sync(&root, &[(id, 30)]).await;
    assert_eq!(b.levels[&id], 80.0);
    a.sync(&root, &[]).await;
    assert_eq!(a.levels[&id], 80.0);
    let quiet = a.sync(&root, &[]).await;
    assert!(counter_ids(&quiet).is_empty(), "{quiet}");
    let old_instance = a.instance;
    root.stop().await;

    // The new root has forgotten the counters; the limiters' cursors stay
    // valid (same database), their counter versions do not.
    let root = TestRoot::start(config(&db)).await;
    let reply = a.sync(&root, &[(id, 5)]).await;
    assert_ne!(a.instance, old_instance);
    assert!(reply["quotas"].as_array().unwrap().is_empty());
    assert_eq!(a.levels[&id], 5.0);
    b.sync(&root, &[(id, 7)]).await;
    assert_eq!(b.levels[&id], 12.0);
    a.sync(&root, &[]).await;
    assert_eq!(a.levels[&id], 12.0);
    root.stop().await;
}

async fn returns_lower_the_counter_every_limiter_reads(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    // Limit 0 leaks nothing, so every level is exact.
    root.put("q", quota(0.0, 100.0, 200.0, None)).await;
    let (mut a, mut b) = (Limiter::new("host-a"), Limiter::new("host-b"));
    a.catch_up(&root).await;
    b.catch_up(&root).await;
    let id = a.id_of("q").unwrap();
    let reply = a.sync(&root, &[(id, 50)]).await;
    assert_eq!(reply["takes_returns"], json!(true), "{reply}");
    b.sync(&root, &[(id, 30)]).await;
    assert_eq!(b.levels[&id], 80.0);
    // a gives 20 back: the root's counter drops, and b's next sync is
    // told the lower value.
    let mut request = a.request(&[]);
    request["returned"] = json!([{"id": id, "delta": 20}]);
    let (status, reply) = root.sync(&request).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    a.absorb(&reply);
    assert_eq!(a.levels[&id], 60.0);
    b.sync(&root, &[]).await;
    assert_eq!(b.levels[&id], 60.0);
    assert_eq!(
        root.metric("sluice_root_sync_weight_returned_total").await,
        Some(20.0)
    );
    // Returns in binary (request format 2) lower it the same way.
    let binary = sluice::wire::SyncRequest {
        limiter: "host-b".into(),
        returned: vec![sluice::wire::CounterDelta {
            id,
            delta: 10,
            window: None,
        }],
        ..Default::default()
    };
    let body = sluice::wire::binary::encode_request(&binary);
    assert_eq!(body[3], sluice::wire::binary::BINARY_RETURNS_VERSION);
    let (status, _, _) = post_sync(
        &root,
        sluice::wire::binary::BINARY_CONTENT_TYPE,
        "application/json",
        body,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    a.sync(&root, &[]).await;
    assert_eq!(a.levels[&id], 50.0);
    // A malformed return is refused whole, naming it, and nothing of the
    // sync is applied.
    let mut bad = a.request(&[(id, 5)]);
    bad["returned"] = json!([{"id": id, "delta": 1u64 << 62}]);
    let (status, reply) = root.sync(&bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(reply["error"]["field"], "returned[0].delta", "{reply}");
    let mut zero_key = a.request(&[]);
    zero_key["keyed_returned"] = json!([{"id": id, "deltas": [[0, 1]]}]);
    let (status, reply) = root.sync(&zero_key).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(
        reply["error"]["field"], "keyed_returned[0].deltas[0]",
        "{reply}"
    );
    a.sync(&root, &[]).await;
    assert_eq!(a.levels[&id], 50.0);
    root.stop().await;
}

async fn the_floor_rises_between_syncs(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(1000.0, 1e6, 1e6, None)).await;
    let mut a = Limiter::new("a");
    a.catch_up(&root).await;
    let id = a.id_of("q").unwrap();
    a.sync(&root, &[(id, 500)]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // At least 0.1 s at 1000/s has leaked: at most 500 - 100 + 1 remain
    // (give or take float rounding); without the leak it would be 501.
    let reply = a.sync(&root, &[(id, 1)]).await;
    let level = reply["counters"][0]["level"].as_f64().unwrap();
    assert!((1.0..=401.01).contains(&level), "{level}");
    root.stop().await;
}

async fn deltas_for_unknown_and_deleted_quotas_are_ignored(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("kept", quota(0.0, 10.0, 10.0, None)).await;
    root.put("gone", quota(0.0, 10.0, 10.0, None)).await;
    let mut a = Limiter::new("a");
    a.catch_up(&root).await;
    let (kept, gone) = (a.id_of("kept").unwrap(), a.id_of("gone").unwrap());
    root.admin(Method::DELETE, "/v1/quotas/gone", None).await;

    let reply = a.sync(&root, &[(kept, 3), (gone, 4), (999_999, 5)]).await;
    assert_eq!(counter_ids(&reply), [kept]);
    assert_eq!(a.levels[&kept], 3.0);
    assert_eq!(
        root.metric("sluice_root_sync_deltas_ignored_total").await,
        Some(2.0)
    );
    assert_eq!(
        root.metric("sluice_root_sync_deltas_applied_total").await,
        Some(1.0)
    );
    root.stop().await;
}

async fn an_absurd_sync_is_rejected_whole(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(0.0, 10.0, 10.0, None)).await;
    let mut a = Limiter::new("a");
    a.catch_up(&root).await;
    let id = a.id_of("q").unwrap();
    let too_big = (1u64 << 53) + 1;
    let mut bad_id = a.request(&[(id, 1)]);
    bad_id["limiter"] = json!("");
    let invalid: Vec<(Value, &str)> = vec![
        (bad_id, "limiter"),
        (a.request(&[(id, 1), (id, too_big)]), "deltas[1].delta"),
    ];
    for (request, field) in invalid {
        let (status, reply) = root.sync(&request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}");
        assert_eq!(reply["error"]["field"], field, "{reply}");
    }
    let malformed = [
        r#"{"limiter": "a", "deltas": [{"id": 1, "delta": -1}]}"#,
        r#"{"limiter": "a", "deltas": [{"id": 1, "delta": 1.5}]}"#,
        r#"{"limiter": "a", "deltas": [{"id": 1, "delta": "NaN"}]}"#,
        r#"{"limiter": "a", "deltas": [{"id": 1}]}"#,
        r#"{"limiter": "a", "quotas_after": {"epoch": -1, "id": 0}}"#,
        r#"{"limiter": "a", "extra": true}"#,
        r#"{"deltas": []}"#,
    ];
    for body in malformed {
        let (status, reply) = root
            .request(
                Method::POST,
                "/v1/sync",
                None,
                Some(body.as_bytes().to_vec()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(reply["error"]["message"].is_string(), "{body}: {reply}");
    }
    // Nothing of the rejected requests was applied.
    let fresh = Limiter::new("b").sync(&root, &[]).await;
    assert!(counter_ids(&fresh).is_empty(), "{fresh}");
    let rejected = root
        .metric("sluice_root_syncs_total{result=\"rejected\"}")
        .await;
    assert_eq!(rejected, Some(9.0));
    root.stop().await;
}

async fn a_fresh_limiter_pages_through_every_quota(db: Db) {
    let mut config = config(&db);
    config.sync_page_quotas = 3;
    let root = TestRoot::start(config).await;
    // A burst, so that a limiter may have admitted the 4 it sends.
    let set: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("q{i}"), "limit": 0, "low_burst": 10, "high_burst": 10}))
        .collect();
    let (status, _) = root
        .admin(Method::POST, "/v1/apply", Some(json!(set)))
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut early = Limiter::new("early");
    early.catch_up(&root).await;
    early.sync(&root, &[(early.id_of("q9").unwrap(), 4)]).await;

    let mut fresh = Limiter::new("fresh");
    let mut pages = Vec::new();
    loop {
        let reply = fresh.sync(&root, &[]).await;
        pages.push((
            reply["quotas"].as_array().unwrap().len(),
            counter_ids(&reply).len(),
        ));
        if reply["more_quotas"] == json!(false) {
            break;
        }
    }
    // Counters wait for the last page, where every quota is known.
    assert_eq!(pages, [(3, 0), (3, 0), (3, 0), (1, 1)]);
    assert_eq!(fresh.quotas.len(), 10);
    assert_eq!(fresh.levels[&fresh.id_of("q9").unwrap()], 4.0);
    root.stop().await;
}

async fn an_incremental_sync_carries_only_what_changed(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    for name in ["a", "b", "c"] {
        root.put(name, quota(0.0, 10.0, 10.0, None)).await;
    }
    let (mut x, mut y) = (Limiter::new("x"), Limiter::new("y"));
    x.catch_up(&root).await;
    y.catch_up(&root).await;
    let (a, b) = (x.id_of("a").unwrap(), x.id_of("b").unwrap());
    x.sync(&root, &[(a, 1), (b, 1)]).await;
    y.sync(&root, &[]).await;

    root.put("c", quota(5.0, 10.0, 10.0, None)).await;
    x.sync(&root, &[(b, 2)]).await;
    let reply = y.sync(&root, &[]).await;
    let quotas: Vec<&str> = reply["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(quotas, ["c"]);
    assert_eq!(counter_ids(&reply), [b]);
    assert_eq!(y.levels[&b], 3.0);
    root.stop().await;
}

async fn metrics_count_syncs_deltas_and_limiters(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(0.0, 10.0, 10.0, None)).await;
    let mut limiters: Vec<Limiter> = (0..3).map(|i| Limiter::new(&format!("h{i}"))).collect();
    for limiter in &mut limiters {
        limiter.catch_up(&root).await;
        let id = limiter.id_of("q").unwrap();
        limiter.sync(&root, &[(id, 2)]).await;
    }
    assert_eq!(
        root.metric("sluice_root_syncs_total{result=\"ok\"}").await,
        Some(6.0)
    );
    assert_eq!(
        root.metric("sluice_root_sync_duration_seconds_count").await,
        Some(6.0)
    );
    assert_eq!(root.metric("sluice_root_limiters_seen").await, Some(3.0));
    assert_eq!(root.metric("sluice_root_limiters_active").await, Some(3.0));
    assert_eq!(root.metric("sluice_root_counters").await, Some(1.0));
    assert_eq!(root.metric("sluice_root_quotas").await, Some(1.0));
    assert_eq!(root.metric("sluice_root_db_up").await, Some(1.0));
    let (_, view) = root.get("q").await;
    assert_eq!(view["level"], 6.0);
    let mut seen: Vec<&str> = view["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["limiter"].as_str().unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, ["h0", "h1", "h2"]);
    root.stop().await;
}

/// The admin view of a quota shows the rate weight arrives at, measured
/// over whole seconds of the root's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_read_shows_the_fill_rate_of_incoming_weight() {
    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(0.0, 1e6, 1e6, None)).await;
    let mut a = Limiter::new("a");
    a.catch_up(&root).await;
    let id = a.id_of("q").unwrap();
    a.sync(&root, &[(id, 500)]).await;
    // Past the first one-second window the 500 units count.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    a.sync(&root, &[(id, 1)]).await;
    let (_, view) = root.get("q").await;
    let rate = view["fill_rate"].as_f64().unwrap();
    assert!(rate > 0.0 && rate <= 500.0, "{view}");
    root.stop().await;
}

/// Posts `body` to the sync endpoint with these `content-type` and
/// `accept` headers; returns the status, the reply's content type and
/// its bytes.
async fn post_sync(
    root: &TestRoot,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> (StatusCode, String, Vec<u8>) {
    let response = root
        .http
        .post(format!("{}/v1/sync", root.url))
        .header("content-type", content_type)
        .header("accept", accept)
        .body(body)
        .send()
        .await
        .expect("request reaches the root");
    let status = response.status();
    let kind = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, kind, response.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_and_json_syncs_agree_and_a_bad_binary_body_is_refused_by_name() {
    use sluice::wire::binary::{decode_response, encode_request};
    use sluice::wire::{CounterDelta, SyncRequest, BINARY_CONTENT_TYPE};

    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(0.0, 100.0, 100.0, None)).await;
    let mut json_client = Limiter::new("json-host");
    json_client.catch_up(&root).await;
    let id = json_client.id_of("q").unwrap();
    let binary_request = |delta: u64| SyncRequest {
        limiter: "binary-host".into(),
        quotas_after: Default::default(),
        counter_version: 0,
        root_instance: 0,
        deltas: vec![CounterDelta {
            id,
            delta,
            window: None,
        }],
        keyed: Vec::new(),
        rejected: Vec::new(),
        ..Default::default()
    };

    // Binary in, binary out: the whole quota set and the counter.
    let (status, kind, body) = post_sync(
        &root,
        BINARY_CONTENT_TYPE,
        BINARY_CONTENT_TYPE,
        encode_request(&binary_request(3)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(kind, BINARY_CONTENT_TYPE);
    let reply = decode_response(&body).expect("a binary reply");
    assert_eq!(reply.quotas.len(), 1);
    assert_eq!(reply.quotas[0].name, "q");
    assert_eq!(
        reply
            .counters
            .iter()
            .map(|c| (c.id, c.level))
            .collect::<Vec<_>>(),
        vec![(id, 3.0)]
    );

    // A JSON-only client (no accept header for binary) sees the same
    // counter, in JSON.
    let reply = json_client.sync(&root, &[(id, 2)]).await;
    assert_eq!(reply["counters"][0]["level"], 5.0, "{reply}");
    // Binary in, JSON out when JSON is what the client accepts.
    let (status, kind, body) = post_sync(
        &root,
        BINARY_CONTENT_TYPE,
        "application/json",
        encode_request(&binary_request(1)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(kind, "application/json");
    let reply: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(reply["counters"][0]["level"], 6.0, "{reply}");

    // Refused whole, in JSON, naming where the body broke.
    let good = encode_request(&binary_request(300));
    let mut version_9 = good.clone();
    version_9[3] = 9;
    let mut trailing = good.clone();
    trailing.push(7);
    let refused: Vec<(Vec<u8>, StatusCode, &str, &str)> = vec![
        // Without its last 3 bytes: the rejections' and keys' counts
        // (0 each) and the delta's second byte (300 takes two).
        (
            good[..good.len() - 3].to_vec(),
            StatusCode::BAD_REQUEST,
            "deltas[0].delta",
            "truncated",
        ),
        (
            b"{\"limiter\": \"x\"}".to_vec(),
            StatusCode::BAD_REQUEST,
            "header",
            "magic",
        ),
        (trailing, StatusCode::BAD_REQUEST, "body", "after the end"),
        (
            version_9,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "body",
            "version 9",
        ),
    ];
    for (body, status, field, words) in refused {
        let (got, kind, reply) = post_sync(&root, BINARY_CONTENT_TYPE, "*/*", body).await;
        let reply: Value = serde_json::from_slice(&reply).expect("a JSON error");
        assert_eq!(got, status, "{reply}");
        assert_eq!(kind, "application/json");
        assert_eq!(reply["error"]["field"], field, "{reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
    }
    // Nothing of them was applied.
    let reply = json_client.sync(&root, &[]).await;
    assert_eq!(reply["counters"][0]["level"], 6.0, "{reply}");
    root.stop().await;
}
