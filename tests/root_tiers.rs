//! Tiers per key at the root over real HTTP, on SQLite and on
//! PostgreSQL: overrides written, read, listed, changed, removed and
//! expired; their validation; quotas' penalties; quota files with
//! overrides.

#[macro_use]
mod root_support;

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use root_support::{config, eventually, Db, TestRoot};

on_both_backends!(
    overrides_are_written_read_listed_changed_and_removed,
    override_errors_name_the_field_and_write_nothing,
    an_override_expires_by_itself,
    a_deleted_template_takes_its_overrides_along,
    a_penalty_is_a_quota_field,
    a_quota_file_carries_overrides,
    overrides_and_penalties_travel_in_the_sync,
    an_override_follows_the_number_rules_of_its_templates_kind,
    a_template_changes_kind_only_when_its_overrides_fit_the_new_one,
);

const KEY: &str = "00000000000000aa";
const OTHER: &str = "00000000000000bb";

fn field(reply: &Value) -> Option<&str> {
    reply["error"]["field"].as_str()
}

async fn template(root: &TestRoot) {
    root.put("api_user", json!({"limit": 15, "per_key": true}))
        .await;
}

async fn put_override(root: &TestRoot, key: &str, body: Value) -> (StatusCode, Value) {
    root.admin(
        Method::PUT,
        &format!("/v1/quotas/api_user/overrides/{key}"),
        Some(body),
    )
    .await
}

async fn overrides_are_written_read_listed_changed_and_removed(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    template(&root).await;
    let (status, reply) = put_override(
        &root,
        KEY,
        json!({"limit": 100, "high_burst": 200, "note": "paid plan, ticket 42"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let written = &reply["override"];
    assert_eq!(
        (
            &written["kind"],
            &written["limit"],
            &written["low_burst"],
            &written["high_burst"]
        ),
        (&json!("limit"), &json!(100.0), &json!(100.0), &json!(200.0))
    );
    let (status, again) = put_override(
        &root,
        KEY,
        json!({"limit": 100, "high_burst": 200, "note": "paid plan, ticket 42"}),
    )
    .await;
    assert_eq!((status, &again["changed"]), (StatusCode::OK, &json!(false)));
    let (status, denied) = put_override(&root, OTHER, json!({"deny": true})).await;
    assert_eq!(status, StatusCode::CREATED, "{denied}");
    let (_, list) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides", None)
        .await;
    assert_eq!(list["count"], 2, "{list}");
    let keys: Vec<&str> = list["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key_hash"].as_str().unwrap())
        .collect();
    assert_eq!(keys, [KEY, OTHER]);
    assert_eq!(list["overrides"][1]["deny"], true);
    assert_eq!(list["overrides"][0]["note"], "paid plan, ticket 42");
    // Pages of one.
    let (_, page) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides?limit=1", None)
        .await;
    assert_eq!(page["next"], KEY, "{page}");
    let (_, page) = root
        .admin(
            Method::GET,
            &format!("/v1/quotas/api_user/overrides?limit=1&after={KEY}"),
            None,
        )
        .await;
    assert_eq!(page["overrides"][0]["key_hash"], OTHER);
    assert!(page["next"].is_null());
    // A patch keeps what it does not name.
    let (status, patched) = root
        .admin(
            Method::PATCH,
            &format!("/v1/quotas/api_user/overrides/{KEY}"),
            Some(json!({"high_burst": 300})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["override"]["limit"], 100.0);
    assert_eq!(patched["override"]["high_burst"], 300.0);
    assert_eq!(patched["override"]["note"], "paid plan, ticket 42");
    let (status, one) = root
        .admin(
            Method::GET,
            &format!("/v1/quotas/api_user/overrides/{KEY}"),
            None,
        )
        .await;
    assert_eq!(
        (status, &one["high_burst"]),
        (StatusCode::OK, &json!(300.0))
    );
    // Allow replaces the numbers.
    let (_, allowed) = root
        .admin(
            Method::PATCH,
            &format!("/v1/quotas/api_user/overrides/{KEY}"),
            Some(json!({"allow": true})),
        )
        .await;
    assert_eq!(allowed["override"]["kind"], "allow", "{allowed}");
    assert!(allowed["override"]["limit"].is_null());
    let (status, removed) = root
        .admin(
            Method::DELETE,
            &format!("/v1/quotas/api_user/overrides/{KEY}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    let (status, gone) = root
        .admin(
            Method::GET,
            &format!("/v1/quotas/api_user/overrides/{KEY}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{gone}");
    let (status, _) = root
        .admin(
            Method::DELETE,
            &format!("/v1/quotas/api_user/overrides/{KEY}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Back again after a removal.
    let (status, reply) = put_override(&root, KEY, json!({"limit": 5})).await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    root.stop().await;
}

async fn override_errors_name_the_field_and_write_nothing(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    template(&root).await;
    root.put("plain", json!({"limit": 15})).await;
    let cases = [
        (
            "zz",
            json!({"limit": 1}),
            StatusCode::BAD_REQUEST,
            "key_hash",
        ),
        (
            "0000000000000000",
            json!({"limit": 1}),
            StatusCode::BAD_REQUEST,
            "key_hash",
        ),
        (KEY, json!({"limit": -1}), StatusCode::BAD_REQUEST, "limit"),
        (
            KEY,
            json!({"allow": true, "deny": true}),
            StatusCode::BAD_REQUEST,
            "allow",
        ),
        (
            KEY,
            json!({"deny": true, "limit": 4}),
            StatusCode::BAD_REQUEST,
            "deny",
        ),
        (KEY, json!({}), StatusCode::BAD_REQUEST, "limit"),
        (
            KEY,
            json!({"limit": 5, "low_burst": 9, "high_burst": 1}),
            StatusCode::BAD_REQUEST,
            "low_burst",
        ),
        (
            KEY,
            json!({"limit": 5, "expires": "2001-01-01T00:00:00Z"}),
            StatusCode::BAD_REQUEST,
            "expires",
        ),
        (
            KEY,
            json!({"limit": 5, "expires": "soon"}),
            StatusCode::BAD_REQUEST,
            "expires",
        ),
        (
            KEY,
            json!({"limit": 5, "lmit": 3}),
            StatusCode::BAD_REQUEST,
            "lmit",
        ),
        (
            KEY,
            json!({"key_hash": OTHER, "limit": 5}),
            StatusCode::BAD_REQUEST,
            "key_hash",
        ),
    ];
    for (key, body, status, expected) in cases {
        let (got, reply) = put_override(&root, key, body.clone()).await;
        assert_eq!(
            (got, field(&reply)),
            (status, Some(expected)),
            "{body}: {reply}"
        );
    }
    let (status, reply) = root
        .admin(
            Method::PUT,
            &format!("/v1/quotas/plain/overrides/{KEY}"),
            Some(json!({"limit": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    let (status, _) = root
        .admin(
            Method::PUT,
            &format!("/v1/quotas/nothing/overrides/{KEY}"),
            Some(json!({"limit": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A quota's own body does not carry overrides.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/api_user",
            Some(json!({"limit": 15, "per_key": true,
                        "overrides": [{"key_hash": KEY, "limit": 3}]})),
        )
        .await;
    assert_eq!(
        (status, field(&reply)),
        (StatusCode::BAD_REQUEST, Some("overrides"))
    );
    let (_, list) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides", None)
        .await;
    assert_eq!(list["count"], 0, "{list}");
    root.stop().await;
}

async fn an_override_expires_by_itself(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    template(&root).await;
    let (status, reply) = put_override(&root, KEY, json!({"deny": true, "expires": "1s"})).await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    assert!(reply["override"]["expires"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let (_, kept) = put_override(&root, OTHER, json!({"deny": true})).await;
    let epoch = kept["override"]["epoch"].as_u64().unwrap();
    eventually("the override expires", || async {
        let (status, _) = root
            .admin(
                Method::GET,
                &format!("/v1/quotas/api_user/overrides/{KEY}"),
                None,
            )
            .await;
        status == StatusCode::NOT_FOUND
    })
    .await;
    let (_, list) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides", None)
        .await;
    assert_eq!(list["count"], 1, "{list}");
    // The expiry took an epoch of its own: limiters learn of it.
    let (_, health) = root.request(Method::GET, "/healthz", None, None).await;
    assert!(health["epoch"].as_u64().unwrap() > epoch, "{health}");
    // An expiry can be cleared.
    put_override(&root, KEY, json!({"limit": 3, "expires": "1h"})).await;
    let (_, never) = root
        .admin(
            Method::PATCH,
            &format!("/v1/quotas/api_user/overrides/{KEY}"),
            Some(json!({"expires": "never"})),
        )
        .await;
    assert!(never["override"]["expires"].is_null(), "{never}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    root.stop().await;
}

async fn a_deleted_template_takes_its_overrides_along(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    template(&root).await;
    put_override(&root, KEY, json!({"limit": 100})).await;
    let (status, _) = root
        .admin(Method::DELETE, "/v1/quotas/api_user", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    template(&root).await;
    let (_, list) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides", None)
        .await;
    assert_eq!(
        list["count"], 0,
        "a revived template starts without: {list}"
    );
    // A template that becomes a plain quota loses them too.
    put_override(&root, KEY, json!({"limit": 100})).await;
    root.put("api_user", json!({"limit": 15})).await;
    root.put("api_user", json!({"limit": 15, "per_key": true}))
        .await;
    let (_, list) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides", None)
        .await;
    assert_eq!(list["count"], 0, "{list}");
    root.stop().await;
}

async fn a_penalty_is_a_quota_field(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    let reply = root
        .put("login", json!({"limit": 5, "penalty": "15m"}))
        .await;
    assert_eq!(reply["quota"]["penalty"], "15m", "{reply}");
    let (status, reply) = root
        .admin(
            Method::PATCH,
            "/v1/quotas/login",
            Some(json!({"penalty": 90})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["quota"]["penalty"], "90s");
    let (_, reply) = root
        .admin(
            Method::PATCH,
            "/v1/quotas/login",
            Some(json!({"penalty": null})),
        )
        .await;
    assert!(reply["quota"]["penalty"].is_null(), "{reply}");
    let (status, reply) = root
        .admin(
            Method::PATCH,
            "/v1/quotas/login",
            Some(json!({"penalty": "40d"})),
        )
        .await;
    assert_eq!(
        (status, field(&reply)),
        (StatusCode::BAD_REQUEST, Some("penalty")),
        "{reply}"
    );
    root.stop().await;
}

async fn a_quota_file_carries_overrides(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    let set = json!({"quotas": [
        {"name": "api", "limit": 10000},
        {"name": "api_user", "parent": "api", "limit": 15, "per_key": true, "penalty": "15m",
         "overrides": [
            {"key_hash": KEY, "limit": 100, "high_burst": 200},
            {"key_hash": OTHER, "deny": true}
         ]}
    ]});
    let (status, reply) = root
        .admin(Method::POST, "/v1/apply?dry_run=true", Some(set.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        reply["overrides"].as_array().map(Vec::len),
        Some(2),
        "{reply}"
    );
    let (status, reply) = root
        .admin(Method::POST, "/v1/apply", Some(set.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let (_, list) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides", None)
        .await;
    assert_eq!(list["count"], 2, "{list}");
    assert_eq!(list["overrides"][0]["high_burst"], 200.0);
    // The same file again changes nothing.
    let (_, reply) = root
        .admin(Method::POST, "/v1/apply?dry_run=true", Some(set.clone()))
        .await;
    assert!(reply["overrides"].is_null(), "{reply}");
    // A file's override replaces the rule and keeps the operator's note;
    // a removed one comes back from the file.
    let path = |key: &str| format!("/v1/quotas/api_user/overrides/{key}");
    let (status, reply) = root
        .admin(Method::PATCH, &path(KEY), Some(json!({"note": "ticket 7"})))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let (status, reply) = root.admin(Method::DELETE, &path(OTHER), None).await;
    assert!(status.is_success(), "{status} {reply}");
    let mut changed = set.clone();
    changed["quotas"][1]["overrides"][0]["limit"] = json!(50);
    let (status, reply) = root.admin(Method::POST, "/v1/apply", Some(changed)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let (_, list) = root
        .admin(Method::GET, "/v1/quotas/api_user/overrides", None)
        .await;
    assert_eq!(list["count"], 2, "{list}");
    let by_hash = |hash: &str| {
        list["overrides"]
            .as_array()
            .and_then(|all| all.iter().find(|o| o["key_hash"] == hash))
            .cloned()
            .unwrap_or_else(|| panic!("no override of {hash} in {list}"))
    };
    assert_eq!(by_hash(KEY)["limit"], 50.0, "{list}");
    assert_eq!(by_hash(KEY)["note"], "ticket 7", "{list}");
    assert_eq!(by_hash(OTHER)["deny"], true, "{list}");
    // An override of a plain quota is refused with its place.
    let (status, reply) = root
        .admin(
            Method::POST,
            "/v1/apply",
            Some(json!([{"name": "api", "limit": 1,
                         "overrides": [{"key_hash": KEY, "deny": true}]}])),
        )
        .await;
    assert_eq!(
        (status, field(&reply)),
        (StatusCode::BAD_REQUEST, Some("overrides")),
        "{reply}"
    );
    root.stop().await;
}

/// One raw sync of limiter `id` carrying `tiers` (a penalty version
/// counts only with the root instance it came from, as
/// `tiers.root_instance`); the reply.
async fn tier_sync(root: &TestRoot, id: &str, after: &Value, mut tiers: Value) -> Value {
    let instance = tiers
        .as_object_mut()
        .and_then(|t| t.remove("root_instance"))
        .unwrap_or(json!(0));
    let (status, reply) = root
        .sync(
            &json!({"limiter": id, "quotas_after": after, "counter_version": 0,
                      "root_instance": instance, "tiers": tiers}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    reply
}

/// Overrides travel in the sync reply after the quota pages, paged like
/// quotas and then incrementally by epoch (an edit, a removal as a
/// tombstone); a penalty a limiter sends reaches another limiter once,
/// then not again until something changed.
async fn overrides_and_penalties_travel_in_the_sync(db: Db) {
    let mut config = config(&db);
    config.sync_page_quotas = 3;
    let root = TestRoot::start(config).await;
    let set = json!({"quotas": [
        {"name": "api_user", "limit": 15, "per_key": true, "penalty": "15m",
         "overrides": (1..=7u64)
            .map(|k| json!({"key_hash": format!("{k:016x}"), "limit": 100}))
            .collect::<Vec<_>>()}
    ]});
    let (status, reply) = root.admin(Method::POST, "/v1/apply", Some(set)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");

    // A fresh limiter: overrides with the last quota page, 3 a reply.
    let mut after = json!({"epoch": 0, "id": 0});
    let mut tiers = json!({});
    let mut pages = Vec::new();
    let mut held = std::collections::BTreeMap::new();
    loop {
        let reply = tier_sync(&root, "x", &after, tiers.clone()).await;
        assert_eq!(reply["takes_tiers"], true, "{reply}");
        after = reply["quotas_after"].clone();
        let got = reply["tiers"]["overrides"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for o in &got {
            held.insert(o["key"].as_u64().unwrap(), o.clone());
        }
        pages.push(got.len());
        tiers = json!({"overrides_after": reply["tiers"]["overrides_after"]});
        let more = reply["more_quotas"] == true || reply["tiers"]["more_overrides"] == true;
        if !more {
            break;
        }
    }
    assert_eq!(pages, [3, 3, 1]);
    assert_eq!(held.len(), 7);
    assert_eq!(held[&1]["limit"], 100.0);

    // Up to date: nothing more.
    let reply = tier_sync(&root, "x", &after, tiers.clone()).await;
    assert!(reply["tiers"]["overrides"].is_null(), "{reply}");
    // An edit and a removal: exactly those two, the removal a tombstone.
    put_override(&root, &format!("{:016x}", 2), json!({"deny": true})).await;
    let (status, _) = root
        .admin(
            Method::DELETE,
            &format!("/v1/quotas/api_user/overrides/{:016x}", 3),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let reply = tier_sync(&root, "x", &after, tiers.clone()).await;
    let got = reply["tiers"]["overrides"].as_array().unwrap();
    assert_eq!(got.len(), 2, "{reply}");
    assert_eq!(
        (got[0]["key"].as_u64(), got[0]["kind"].as_str()),
        (Some(2), Some("deny"))
    );
    assert_eq!(
        (got[1]["key"].as_u64(), got[1]["deleted"].as_bool()),
        (Some(3), Some(true))
    );

    // A penalty limiter x started reaches limiter y, once.
    let template = held[&1]["quota"].as_u64().unwrap();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let until = now_ns + 60_000_000_000;
    tier_sync(
        &root,
        "x",
        &after,
        json!({"overrides_after": tiers["overrides_after"], "penalties": [[template, 0xaa, until]]}),
    )
    .await;
    let reply = tier_sync(&root, "y", &after, json!({})).await;
    assert_eq!(
        reply["tiers"]["penalties"],
        json!([[template, 0xaa, until]]),
        "{until} {reply}"
    );
    let version = reply["tiers"]["penalty_version"].clone();
    let since = json!({"penalty_version": version, "root_instance": reply["root_instance"]});
    let reply = tier_sync(&root, "y", &after, since.clone()).await;
    assert!(reply["tiers"]["penalties"].is_null(), "{reply}");
    // A penalty longer than the quota's is cut to it (15 minutes and a
    // minute of slack for clocks).
    let far = now_ns + 86_400_000_000_000;
    tier_sync(
        &root,
        "x",
        &after,
        json!({"penalties": [[template, 0xbb, far]]}),
    )
    .await;
    let reply = tier_sync(&root, "y", &after, since).await;
    assert_eq!(
        reply["tiers"]["penalties"].as_array().map(Vec::len),
        Some(1),
        "{reply}"
    );
    let cut = reply["tiers"]["penalties"][0][2].as_i64().unwrap();
    assert!(cut < now_ns + 17 * 60_000_000_000, "{reply}");
    // /metrics counts them, and one on a quota without a penalty.
    tier_sync(
        &root,
        "x",
        &after,
        json!({"penalties": [[template + 100, 0xcc, until]]}),
    )
    .await;
    for (series, value) in [
        ("sluice_root_penalties", 2.0),
        ("sluice_root_penalties_started_total", 2.0),
        ("sluice_root_penalties_evicted_total", 0.0),
        (
            "sluice_root_penalties_refused_total{reason=\"no_penalty\"}",
            1.0,
        ),
    ] {
        assert_eq!(root.metric(series).await, Some(value), "{series}");
    }
    // A penalty naming no quota is refused with its place.
    let (status, reply) = root
        .sync(
            &json!({"limiter": "x", "quotas_after": after, "counter_version": 0,
                      "root_instance": 0, "tiers": {"penalties": [[0, 0, until]]}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(field(&reply), Some("tiers.penalties[0]"), "{reply}");
    root.stop().await;
}

/// An override's numbers follow the rules of its template's kind, with
/// the quota API's own error: an in-flight template's key gets a whole
/// number of slots and no band, a window template's key a band within
/// its limit.
async fn an_override_follows_the_number_rules_of_its_templates_kind(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put(
        "kslots",
        json!({"limit": 2, "per_key": true, "in_flight": true}),
    )
    .await;
    root.put(
        "kdaily",
        json!({"limit": 100, "per_key": true, "window": "1d"}),
    )
    .await;
    let write = |method: Method, template: &'static str, body: Value| {
        let root = &root;
        async move {
            let path = format!("/v1/quotas/{template}/overrides/{KEY}");
            root.admin(method, &path, Some(body)).await
        }
    };
    let cases = [
        (
            "kslots",
            json!({"limit": 2, "low_burst": 2, "high_burst": 9}),
            "high_burst",
        ),
        ("kslots", json!({"limit": 2.5}), "limit"),
        ("kslots", json!({"limit": 0}), "limit"),
        (
            "kdaily",
            json!({"limit": 100, "high_burst": 150}),
            "high_burst",
        ),
    ];
    for (template, body, wrong) in cases {
        let (status, reply) = write(Method::PUT, template, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{template} {body}: {reply}"
        );
        assert_eq!(field(&reply), Some(wrong), "{template} {body}: {reply}");
        // The quota API refuses the same numbers with the same words.
        let mut quota = body.clone();
        quota["per_key"] = json!(true);
        if template == "kslots" {
            quota["in_flight"] = json!(true);
        } else {
            quota["window"] = json!("1d");
        }
        let (status, same) = root
            .admin(Method::PUT, "/v1/quotas/twin", Some(quota))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{same}");
        assert_eq!(reply["error"], same["error"], "{template} {body}");
    }
    assert_eq!(
        root.get("kslots/overrides").await.1["count"],
        0,
        "nothing was written"
    );

    // Numbers that fit are taken; a patch that leaves them is refused.
    let (status, reply) = write(Method::PUT, "kslots", json!({"limit": 5})).await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    assert_eq!(
        (
            &reply["override"]["low_burst"],
            &reply["override"]["high_burst"]
        ),
        (&json!(5.0), &json!(5.0))
    );
    let (status, reply) = write(Method::PATCH, "kslots", json!({"high_burst": 9})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(field(&reply), Some("high_burst"));
    let (_, kept) = root
        .admin(
            Method::GET,
            &format!("/v1/quotas/kslots/overrides/{KEY}"),
            None,
        )
        .await;
    assert_eq!(kept["high_burst"], 5.0, "{kept}");
    let (status, reply) = write(
        Method::PUT,
        "kdaily",
        json!({"limit": 500, "low_burst": 400}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    root.stop().await;
}

/// A template that would become another kind is refused (409) while one
/// of its overrides has numbers the new kind cannot have, through a
/// single write and through a quota file; once the override fits, or the
/// file replaces it, the change goes through.
async fn a_template_changes_kind_only_when_its_overrides_fit_the_new_one(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    template(&root).await;
    let (status, reply) = put_override(&root, KEY, json!({"limit": 2, "high_burst": 9})).await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let (status, reply) = put_override(&root, OTHER, json!({"deny": true})).await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let (status, reply) = root
        .admin(
            Method::PATCH,
            "/v1/quotas/api_user",
            Some(json!({"in_flight": true})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    assert_eq!(field(&reply), Some("overrides"));
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(KEY) && message.contains("high_burst"),
        "{message}"
    );
    let file = |overrides: Value| {
        json!([{"name": "api_user", "limit": 15, "per_key": true, "window": "1m",
                "overrides": overrides}])
    };
    let (status, reply) = root
        .admin(Method::POST, "/v1/apply", Some(file(json!([]))))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    assert_eq!(root.get("api_user").await.1["kind"], "leaky", "unchanged");

    // The file replaces the override with numbers that fit: it applies.
    let fitting = json!([{"key_hash": KEY, "limit": 10}]);
    let (status, reply) = root
        .admin(Method::POST, "/v1/apply", Some(file(fitting)))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(root.get("api_user").await.1["kind"], "window");
    // A fitting override lets a single write through too.
    let (status, reply) = root
        .admin(
            Method::PATCH,
            "/v1/quotas/api_user",
            Some(json!({"window": null, "in_flight": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    root.stop().await;
}
