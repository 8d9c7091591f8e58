//! The admin API over real HTTP, on SQLite and on PostgreSQL.

#[macro_use]
mod root_support;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use root_support::{
    config, config_with_tokens, eventually, quota, Db, Limiter, TestRoot, ADMIN_TOKEN, SYNC_TOKEN,
};

on_both_backends!(
    quotas_are_created_read_updated_listed_and_deleted,
    an_identical_put_changes_nothing,
    validation_errors_name_the_field,
    admin_and_sync_need_their_own_tokens,
    a_quota_with_children_cannot_be_deleted,
    deletions_travel_as_tombstones_and_names_can_be_reused,
    reparenting_moves_a_subtree_within_the_depth_limit,
    cycles_and_chains_deeper_than_eight_are_rejected,
    listing_pages_by_name_and_prefix,
    apply_dry_run_reports_the_diff_and_writes_nothing,
    apply_is_all_or_nothing,
    apply_with_prune_deletes_quotas_missing_from_the_set,
    apply_writes_one_epoch_with_parents_first,
    oversized_and_malformed_bodies_get_json_errors,
    per_key_templates_are_stored_and_cannot_be_parents,
    window_quotas_are_stored_changed_and_checked,
    a_patch_changes_only_the_fields_it_names,
    a_put_replaces_the_whole_quota,
    patch_errors_name_the_field_and_change_nothing,
    if_match_refuses_a_write_over_a_change_not_seen,
    concurrent_patches_of_different_fields_through_two_roots_both_stay,
);

fn names(list: &Value) -> Vec<&str> {
    list["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect()
}

fn error_field(reply: &Value) -> Option<&str> {
    reply["error"]["field"].as_str()
}

async fn epoch(root: &TestRoot) -> u64 {
    let (_, health) = root.request(Method::GET, "/healthz", None, None).await;
    health["epoch"].as_u64().unwrap()
}

async fn quotas_are_created_read_updated_listed_and_deleted(db: Db) {
    let root = TestRoot::start(config_with_tokens(&db)).await;
    let (status, created) = root
        .admin(
            Method::PUT,
            "/v1/quotas/s3_photos",
            Some(quota(100.0, 100.0, 200.0, None)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["changed"], true);
    assert_eq!(created["quota"]["high_burst"], 200.0);
    let first_epoch = created["epoch"].as_u64().unwrap();

    // Bursts default to the limit.
    root.put(
        "s3_photos_read",
        json!({"limit": 80, "parent": "s3_photos"}),
    )
    .await;
    let (status, read) = root.get("s3_photos_read").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["parent"], "s3_photos");
    assert_eq!(
        (read["low_burst"].as_f64(), read["high_burst"].as_f64()),
        (Some(80.0), Some(80.0))
    );
    assert_eq!(read["level"], 0.0);
    assert!(read["epoch"].as_u64().unwrap() > first_epoch);

    let (status, updated) = root
        .admin(
            Method::PUT,
            "/v1/quotas/s3_photos_read",
            Some(quota(90.0, 90.0, 180.0, Some("s3_photos"))),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(updated["quota"]["limit"], 90.0);
    assert!(updated["epoch"].as_u64().unwrap() > read["epoch"].as_u64().unwrap());

    let (_, list) = root.admin(Method::GET, "/v1/quotas", None).await;
    assert_eq!(names(&list), ["s3_photos", "s3_photos_read"]);

    let (status, deleted) = root
        .admin(Method::DELETE, "/v1/quotas/s3_photos_read", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(root.get("s3_photos_read").await.0, StatusCode::NOT_FOUND);
    let (_, list) = root.admin(Method::GET, "/v1/quotas", None).await;
    assert_eq!(names(&list), ["s3_photos"]);
    let (status, again) = root
        .admin(Method::DELETE, "/v1/quotas/s3_photos_read", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_field(&again), Some("name"));
    root.stop().await;
}

async fn per_key_templates_are_stored_and_cannot_be_parents(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("api", quota(100.0, 100.0, 100.0, None)).await;
    let (status, created) = root
        .admin(
            Method::PUT,
            "/v1/quotas/api_user",
            Some(json!({"limit": 15, "parent": "api", "per_key": true})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["quota"]["per_key"], true);
    assert_eq!(root.get("api").await.1["per_key"], false);
    // Nothing goes under a template.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/under",
            Some(json!({"limit": 1, "parent": "api_user"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(error_field(&reply), Some("parent"));
    // A parent does not become a template.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/api",
            Some(json!({"limit": 100, "per_key": true})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    assert_eq!(error_field(&reply), Some("per_key"));
    // Switching a template back to a plain quota is a change like any.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/api_user",
            Some(json!({"limit": 15, "parent": "api"})),
        )
        .await;
    assert_eq!(
        (status, reply["changed"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    // A bulk apply reports the flag among the changed fields.
    let (status, reply) = apply_set(
        &root,
        "dry_run=true",
        json!([{"name": "api_user", "parent": "api", "limit": 15, "per_key": true}]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        reply["updated"][0]["changes"][0]["field"], "per_key",
        "{reply}"
    );
    root.stop().await;
}

async fn window_quotas_are_stored_changed_and_checked(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    let (status, created) = root
        .admin(
            Method::PUT,
            "/v1/quotas/daily",
            Some(json!({"limit": 1000, "window": "1d"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["quota"]["window"], "1d");
    assert!(created["quota"].get("sliding").is_none(), "{created}");
    // Sliding, on a monthly template: each key slides.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/monthly",
            Some(json!({"limit": 10, "window": "month", "sliding": true, "per_key": true})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    assert_eq!(
        (&reply["quota"]["sliding"], &reply["quota"]["per_key"]),
        (&json!(true), &json!(true))
    );
    // envoyproxy/ratelimit's week, month and year, fixed and sliding, kept
    // by the database (its CHECK on windows takes them) and read back.
    for (name, window, sliding) in [
        ("epoch_weekly", "epoch_week", false),
        ("thirty_days", "30d", true),
        ("yearly", "365d", false),
    ] {
        let (status, reply) = root
            .admin(
                Method::PUT,
                &format!("/v1/quotas/{name}"),
                Some(json!({"limit": 10, "window": window, "sliding": sliding})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
        let (status, read) = root.get(name).await;
        assert_eq!(status, StatusCode::OK, "{read}");
        assert_eq!(read["window"], window, "{read}");
        assert_eq!(read.get("sliding").is_some(), sliding, "{read}");
    }
    let (status, _) = root
        .admin(
            Method::PUT,
            "/v1/quotas/minute",
            Some(json!({"limit": 10, "window": "1m", "sliding": true, "parent": "daily"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(root.get("minute").await.1["sliding"], true);
    for (body, field) in [
        (json!({"limit": 10, "window": "2m"}), "window"),
        (
            json!({"limit": 10, "high_burst": 20, "window": "1h"}),
            "high_burst",
        ),
        (json!({"limit": 10, "sliding": true}), "sliding"),
    ] {
        let (status, reply) = root
            .admin(Method::PUT, "/v1/quotas/bad", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {reply}");
        assert!(
            error_field(&reply) == Some(field) || reply.to_string().contains(field),
            "{body}: {reply}"
        );
    }
    // Turning a window quota back into a leaky one is a change; a bulk
    // apply reports it.
    let (status, reply) = apply_set(
        &root,
        "dry_run=true",
        json!([{"name": "daily", "limit": 1000}]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        reply["updated"][0]["changes"][0]["field"], "window",
        "{reply}"
    );
    assert_eq!(reply["updated"][0]["changes"][0]["from"], "1d", "{reply}");
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/daily",
            Some(json!({"limit": 1000})),
        )
        .await;
    assert_eq!(
        (status, reply["changed"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    assert!(root.get("daily").await.1.get("window").is_none());
    root.stop().await;
}

async fn an_identical_put_changes_nothing(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    let first = root.put("q", quota(10.0, 10.0, 20.0, None)).await;
    let (status, second) = root
        .admin(
            Method::PUT,
            "/v1/quotas/q",
            Some(quota(10.0, 10.0, 20.0, None)),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(second["changed"], false);
    assert_eq!(second["epoch"], first["epoch"]);
    assert_eq!(epoch(&root).await, first["epoch"].as_u64().unwrap());
    root.stop().await;
}

async fn validation_errors_name_the_field(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("base", quota(1.0, 1.0, 1.0, None)).await;
    let long = "x".repeat(256);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("a%20b", json!({"limit": 1}), "name"),
        ("caf%C3%A9", json!({"limit": 1}), "name"),
        (&long, json!({"limit": 1}), "name"),
        ("q", json!({"limit": -1}), "limit"),
        ("q", json!({"limit": 1e16}), "limit"),
        ("q", json!({"limit": "ten"}), "limit"),
        ("q", json!({}), "limit"),
        ("q", json!({"limit": 1, "low_burst": -1}), "low_burst"),
        (
            "q",
            json!({"limit": 1, "low_burst": 0, "high_burst": -5}),
            "high_burst",
        ),
        (
            "q",
            json!({"limit": 1, "low_burst": 5, "high_burst": 2}),
            "low_burst",
        ),
        ("q", json!({"limit": 1, "parent": "missing"}), "parent"),
        ("q", json!({"limit": 1, "parent": "q"}), "parent"),
        ("q", json!({"limit": 1, "parent": "bad name"}), "parent"),
        ("q", json!({"limit": 1, "limt": 2}), "limt"),
        ("q", json!({"limit": 1, "name": "other"}), "name"),
    ];
    for (name, body, field) in cases {
        let (status, reply) = root
            .admin(
                Method::PUT,
                &format!("/v1/quotas/{name}"),
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name} {body}: {reply}");
        assert_eq!(error_field(&reply), Some(field), "{name} {body}: {reply}");
        assert!(!reply["error"]["message"].as_str().unwrap().is_empty());
    }
    let (_, list) = root.admin(Method::GET, "/v1/quotas", None).await;
    assert_eq!(names(&list), ["base"]);
    // A body may repeat the path's name, as a quota file writes it.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/named",
            Some(json!({"name": "named", "limit": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    root.stop().await;
}

async fn admin_and_sync_need_their_own_tokens(db: Db) {
    let root = TestRoot::start(config_with_tokens(&db)).await;
    for token in [None, Some("wrong"), Some(SYNC_TOKEN)] {
        let (status, reply) = root.request(Method::GET, "/v1/quotas", token, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert!(reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("admin"));
        let body = serde_json::to_vec(&json!({"limit": 1})).unwrap();
        let (status, _) = root
            .request(Method::PUT, "/v1/quotas/q", token, Some(body))
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let sync = serde_json::to_vec(&Limiter::new("h").request(&[])).unwrap();
    for token in [None, Some("wrong"), Some(ADMIN_TOKEN)] {
        let (status, _) = root
            .request(Method::POST, "/v1/sync", token, Some(sync.clone()))
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
    }
    let (status, _) = root
        .request(Method::POST, "/v1/sync", Some(SYNC_TOKEN), Some(sync))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        root.admin(Method::GET, "/v1/quotas", None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        root.request(Method::GET, "/healthz", None, None).await.0,
        StatusCode::OK
    );
    assert_eq!(root.get("nothing").await.0, StatusCode::NOT_FOUND);
    let unauthorized =
        root.metric("sluice_root_rejected_requests_total{api=\"admin\",reason=\"unauthorized\"}");
    assert_eq!(unauthorized.await, Some(6.0));
    assert_eq!(
        root.metric("sluice_root_syncs_total{result=\"unauthorized\"}")
            .await,
        Some(3.0)
    );
    root.stop().await;
}

async fn a_quota_with_children_cannot_be_deleted(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("parent", quota(10.0, 10.0, 10.0, None)).await;
    root.put("child", quota(5.0, 5.0, 5.0, Some("parent")))
        .await;
    let (status, reply) = root.admin(Method::DELETE, "/v1/quotas/parent", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    assert_eq!(error_field(&reply), Some("name"));
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("child"));
    assert_eq!(root.get("parent").await.0, StatusCode::OK);
    root.admin(Method::DELETE, "/v1/quotas/child", None).await;
    assert_eq!(
        root.admin(Method::DELETE, "/v1/quotas/parent", None)
            .await
            .0,
        StatusCode::OK
    );
    root.stop().await;
}

async fn deletions_travel_as_tombstones_and_names_can_be_reused(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(10.0, 10.0, 10.0, None)).await;
    let mut limiter = Limiter::new("host-1");
    limiter.catch_up(&root).await;
    let id = limiter.id_of("q").unwrap();

    root.admin(Method::DELETE, "/v1/quotas/q", None).await;
    let reply = limiter.sync(&root, &[]).await;
    let tombstone = &reply["quotas"][0];
    assert_eq!(
        (tombstone["id"].as_u64(), &tombstone["deleted"]),
        (Some(id), &json!(true))
    );
    assert_eq!(reply["quotas"].as_array().unwrap().len(), 1);
    assert!(limiter.id_of("q").is_none());

    // Setting the name again revives the same id at a newer epoch.
    root.put("q", quota(20.0, 20.0, 20.0, None)).await;
    let reply = limiter.sync(&root, &[]).await;
    let revived = &reply["quotas"][0];
    assert_eq!(
        (revived["id"].as_u64(), &revived["deleted"]),
        (Some(id), &json!(false))
    );
    assert!(revived["epoch"].as_u64() > tombstone["epoch"].as_u64());
    assert_eq!(revived["limit"], 20.0);

    // A fresh limiter gets the current state of every id.
    let mut fresh = Limiter::new("host-2");
    fresh.catch_up(&root).await;
    assert_eq!(fresh.id_of("q"), Some(id));
    root.stop().await;
}

async fn reparenting_moves_a_subtree_within_the_depth_limit(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    // d1 <- d2 <- ... <- d7: d7 is seven deep.
    root.put("d1", quota(1.0, 1.0, 1.0, None)).await;
    for i in 2..=7 {
        root.put(
            &format!("d{i}"),
            quota(1.0, 1.0, 1.0, Some(&format!("d{}", i - 1))),
        )
        .await;
    }
    root.put("sub", quota(1.0, 1.0, 1.0, None)).await;
    root.put("sub_child", quota(1.0, 1.0, 1.0, Some("sub")))
        .await;

    // Under d7, sub would be 8 deep and sub_child 9.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/sub",
            Some(quota(1.0, 1.0, 1.0, Some("d7"))),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(error_field(&reply), Some("parent"));
    assert_eq!(root.get("sub").await.1["parent"], Value::Null);

    // Under d6 the whole subtree fits in eight levels.
    root.put("sub", quota(1.0, 1.0, 1.0, Some("d6"))).await;
    assert_eq!(root.get("sub").await.1["parent"], "d6");
    assert_eq!(root.get("sub_child").await.1["parent"], "sub");

    // Back to the top.
    root.put("sub", quota(1.0, 1.0, 1.0, None)).await;
    assert_eq!(root.get("sub").await.1["parent"], Value::Null);
    root.stop().await;
}

async fn cycles_and_chains_deeper_than_eight_are_rejected(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("a", quota(1.0, 1.0, 1.0, None)).await;
    root.put("b", quota(1.0, 1.0, 1.0, Some("a"))).await;
    root.put("c", quota(1.0, 1.0, 1.0, Some("b"))).await;
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/a",
            Some(quota(1.0, 1.0, 1.0, Some("c"))),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(error_field(&reply), Some("parent"));
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("loops"),
        "{reply}"
    );

    for i in 4..=8 {
        let parent = if i == 4 {
            "c".to_string()
        } else {
            format!("n{}", i - 1)
        };
        root.put(&format!("n{i}"), quota(1.0, 1.0, 1.0, Some(&parent)))
            .await;
    }
    // a b c n4 .. n8 is eight deep; a ninth level is refused.
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/n9",
            Some(quota(1.0, 1.0, 1.0, Some("n8"))),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_field(&reply), Some("parent"));
    root.stop().await;
}

async fn listing_pages_by_name_and_prefix(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    for name in ["s3_e", "s3_a", "t_a", "s3_c", "s3_b", "s3_d", "r_a"] {
        root.put(name, quota(1.0, 1.0, 1.0, None)).await;
    }
    let (_, page) = root
        .admin(Method::GET, "/v1/quotas?prefix=s3_&limit=2", None)
        .await;
    assert_eq!(
        (names(&page), &page["next"]),
        (vec!["s3_a", "s3_b"], &json!("s3_b"))
    );
    let (_, page) = root
        .admin(
            Method::GET,
            "/v1/quotas?prefix=s3_&limit=2&after=s3_b",
            None,
        )
        .await;
    assert_eq!(names(&page), ["s3_c", "s3_d"]);
    let (_, page) = root
        .admin(
            Method::GET,
            "/v1/quotas?prefix=s3_&limit=2&after=s3_d",
            None,
        )
        .await;
    assert_eq!((names(&page), &page["next"]), (vec!["s3_e"], &Value::Null));
    let (_, all) = root.admin(Method::GET, "/v1/quotas", None).await;
    assert_eq!(names(&all).len(), 7);
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("prefix=a%20b", "prefix"),
    ] {
        let (status, reply) = root
            .admin(Method::GET, &format!("/v1/quotas?{query}"), None)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(error_field(&reply), Some(field));
    }
    assert_eq!(
        root.admin(Method::GET, "/v1/quotas?limit=x", None).await.0,
        StatusCode::BAD_REQUEST
    );
    root.stop().await;
}

async fn apply_set(root: &TestRoot, query: &str, set: Value) -> (StatusCode, Value) {
    root.admin(Method::POST, &format!("/v1/apply?{query}"), Some(set))
        .await
}

async fn apply_dry_run_reports_the_diff_and_writes_nothing(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("a", quota(1.0, 1.0, 1.0, None)).await;
    root.put("b", quota(2.0, 2.0, 2.0, None)).await;
    root.put("c", quota(3.0, 3.0, 3.0, None)).await;
    let before = epoch(&root).await;
    let set = json!({"quotas": [
        {"name": "a", "limit": 1},
        {"name": "b", "limit": 5, "parent": "a"},
        {"name": "d", "limit": 4, "parent": "a"},
    ]});
    let (status, diff) = apply_set(&root, "dry_run=true&prune=true", set).await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert_eq!(diff["dry_run"], true);
    assert_eq!(diff["epoch"], Value::Null);
    assert_eq!(
        diff["counts"],
        json!({"created": 1, "updated": 1, "deleted": 1, "unchanged": 1})
    );
    assert_eq!(diff["created"], json!(["d"]));
    assert_eq!(diff["deleted"], json!(["c"]));
    let changes = &diff["updated"][0];
    assert_eq!(changes["name"], "b");
    let fields: Vec<&str> = changes["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["parent", "limit", "low_burst", "high_burst"]);
    assert_eq!(
        changes["changes"][1],
        json!({"field": "limit", "from": 2.0, "to": 5.0})
    );

    assert_eq!(epoch(&root).await, before);
    assert_eq!(root.get("d").await.0, StatusCode::NOT_FOUND);
    assert_eq!(root.get("c").await.0, StatusCode::OK);
    assert_eq!(root.get("b").await.1["limit"], 2.0);
    root.stop().await;
}

async fn apply_is_all_or_nothing(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("p", quota(1.0, 1.0, 1.0, None)).await;
    root.put("q", quota(1.0, 1.0, 1.0, Some("p"))).await;
    let before = epoch(&root).await;
    let bad_sets = [
        (
            json!([{"name": "x", "limit": 1}, {"name": "y", "limit": -1}]),
            "limit",
            Some("y"),
        ),
        (
            json!([{"name": "x", "limit": 1}, {"name": "y", "limit": 1, "parent": "zz"}]),
            "parent",
            Some("y"),
        ),
        // Valid alone, but a cycle with the quotas already there.
        (
            json!([{"name": "x", "limit": 1}, {"name": "p", "limit": 1, "parent": "q"}]),
            "parent",
            None,
        ),
        (
            json!([{"name": "x", "limit": 1}, {"name": "x", "limit": 2}]),
            "name",
            Some("x"),
        ),
        (
            json!({"quotas": [{"name": "x", "limit": 1, "burst": 2}]}),
            "quotas[0].burst",
            None,
        ),
    ];
    for (set, field, quota_name) in bad_sets {
        let (status, reply) = apply_set(&root, "", set.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{set}: {reply}");
        assert_eq!(error_field(&reply), Some(field), "{set}: {reply}");
        if let Some(name) = quota_name {
            assert_eq!(reply["error"]["quota"], name, "{reply}");
        }
    }
    assert_eq!(epoch(&root).await, before);
    assert_eq!(root.get("x").await.0, StatusCode::NOT_FOUND);
    assert_eq!(root.get("p").await.1["parent"], Value::Null);
    root.stop().await;
}

async fn apply_with_prune_deletes_quotas_missing_from_the_set(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    for name in ["a", "b", "c"] {
        root.put(name, quota(1.0, 1.0, 1.0, None)).await;
    }
    let set = json!([{"name": "a", "limit": 1, "low_burst": 1, "high_burst": 1}, {"name": "b", "limit": 7}]);
    let (status, reply) = apply_set(&root, "", set.clone()).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        reply["counts"],
        json!({"created": 0, "updated": 1, "deleted": 0, "unchanged": 1})
    );
    assert_eq!(root.get("c").await.0, StatusCode::OK);

    let (_, reply) = apply_set(&root, "prune=true", set.clone()).await;
    assert_eq!(reply["deleted"], json!(["c"]));
    assert_eq!(root.get("c").await.0, StatusCode::NOT_FOUND);

    // Applying the same set again changes nothing and takes no epoch.
    let (_, reply) = apply_set(&root, "prune=true", set).await;
    assert_eq!(reply["epoch"], Value::Null);
    assert_eq!(reply["counts"]["unchanged"], 2);
    root.stop().await;
}

async fn apply_writes_one_epoch_with_parents_first(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("old", quota(1.0, 1.0, 1.0, None)).await;
    let mut limiter = Limiter::new("h");
    limiter.catch_up(&root).await;
    // Children before parents in the file, and an existing quota moved
    // under a new one.
    let set = json!({"quotas": [
        {"name": "leaf", "parent": "mid", "limit": 1},
        {"name": "mid", "parent": "top", "limit": 2},
        {"name": "top", "limit": 3},
        {"name": "old", "parent": "top", "limit": 1},
    ]});
    let (status, reply) = apply_set(&root, "", set).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["created"], json!(["top", "mid", "leaf"]));
    let epoch = reply["epoch"].as_u64().unwrap();

    let sync = limiter.sync(&root, &[]).await;
    let quotas = sync["quotas"].as_array().unwrap();
    assert_eq!(quotas.len(), 4);
    assert!(quotas.iter().all(|q| q["epoch"] == epoch));
    let id = |name: &str| limiter.id_of(name).unwrap();
    assert!(id("top") < id("mid") && id("mid") < id("leaf"));
    assert_eq!(limiter.quotas[&id("old")]["parent"], id("top"));
    assert_eq!(root.get("leaf").await.1["parent"], "mid");
    root.stop().await;
}

async fn oversized_and_malformed_bodies_get_json_errors(db: Db) {
    let mut config = config(&db);
    config.body_limits.admin = 512;
    config.body_limits.sync = 4096;
    config.body_limits.apply = 4096;
    let root = TestRoot::start(config).await;

    let huge = format!("{{\"limit\": 1, \"parent\": \"{}\"}}", "p".repeat(1000)).into_bytes();
    let (status, reply) = root
        .request(Method::PUT, "/v1/quotas/q", None, Some(huge))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(reply["error"]["message"].is_string(), "{reply}");

    let deltas: Vec<(u64, u64)> = (1..=1000).map(|i| (i, 1)).collect();
    let (status, reply) = root.sync(&Limiter::new("h").request(&deltas)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(reply["error"].is_object());

    let big_set: Vec<Value> = (0..200)
        .map(|i| json!({"name": format!("q{i}"), "limit": 1}))
        .collect();
    assert_eq!(
        apply_set(&root, "", json!(big_set)).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );

    let malformed: [(&str, &[u8]); 4] = [
        ("/v1/quotas/q", b"{\"limit\": "),
        ("/v1/quotas/q", b"not json"),
        ("/v1/sync", b"[1, 2]"),
        ("/v1/apply", b"{\"quotas\": 5}"),
    ];
    for (path, body) in malformed {
        let method = if path == "/v1/quotas/q" {
            Method::PUT
        } else {
            Method::POST
        };
        let (status, reply) = root.request(method, path, None, Some(body.to_vec())).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{path} {}",
            String::from_utf8_lossy(body)
        );
        assert!(reply["error"]["message"].is_string(), "{reply}");
    }
    let too_large =
        root.metric("sluice_root_rejected_requests_total{api=\"sync\",reason=\"too_large\"}");
    assert_eq!(too_large.await, Some(1.0));
    assert_eq!(
        root.request(Method::GET, "/v2/nothing", None, None).await.0,
        StatusCode::NOT_FOUND
    );
    root.stop().await;
}

/// Bodies are JSON objects: an array is refused with a 400 that says an
/// object was expected, never read field by field in order (serde's
/// derived structs would take `["seqq", null, 7]` as a quota), at the
/// top of a body and inside it; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrays_are_never_read_as_objects_by_position() {
    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    root.put("tier", json!({"limit": 5, "per_key": true})).await;
    let before = epoch(&root).await;
    let key = "/v1/quotas/tier/overrides/00000000000000a1";
    let positional = [
        (Method::PUT, "/v1/quotas/seqq", json!(["seqq", null, 7])),
        (Method::PATCH, "/v1/quotas/tier", json!([null, null, 9])),
        (Method::PUT, key, json!([null, 3])),
        (Method::PATCH, key, json!([null, 3])),
        (
            Method::PUT,
            "/v1/quotas/nested",
            json!({"limit": 1, "per_key": true, "overrides": [["00000000000000a1", 3]]}),
        ),
        (
            Method::POST,
            "/v1/apply",
            json!([{"name": "filed", "limit": 1, "per_key": true,
                    "overrides": [["00000000000000a1", 3]]}]),
        ),
        (
            Method::POST,
            "/v1/sync",
            json!(["h", {"epoch": 0, "id": 0}, 0, 0, []]),
        ),
    ];
    for (method, path, body) in positional {
        let (status, reply) = root.admin(method.clone(), path, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("expected a JSON object"),
            "{method} {path}: {reply}"
        );
    }
    assert_eq!(epoch(&root).await, before, "nothing was written");
    for name in ["seqq", "nested", "filed"] {
        assert_eq!(root.get(name).await.0, StatusCode::NOT_FOUND, "{name}");
    }
    root.stop().await;
}

/// With `max_connections = 1`, an idle keep-alive connection gives way to
/// a new client (it is shed); a connection whose request is under way
/// does not, and the newcomer is closed at once instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_limit_idle_connections_give_way_and_busy_ones_do_not() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = Db::sqlite();
    let mut config = config(&db);
    config.max_connections = 1;
    config.max_connections_per_address = 1;
    let mut root = TestRoot::start_unready(config).await;
    // No pooled connection of the test client may hold the slot.
    root.http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(root_support::PATIENCE)
        .build()
        .unwrap();
    root.wait_ready().await;

    let mut first = tokio::net::TcpStream::connect(root.addr).await.unwrap();
    first
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: root\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    first.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    // `first` is idle: the second client is served in its place.
    let reply = root.http.get(format!("{}/healthz", root.url)).send().await;
    assert_eq!(reply.unwrap().status(), StatusCode::OK);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(root_support::PATIENCE, first.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the idle connection was shed");

    // A request whose body is still arriving keeps its connection.
    let mut busy = tokio::net::TcpStream::connect(root.addr).await.unwrap();
    busy.write_all(
        b"PUT /v1/quotas/q HTTP/1.1\r\nhost: root\r\ncontent-type: application/json\r\n\
          content-length: 14\r\n\r\n{\"limit\"",
    )
    .await
    .unwrap();
    // Until the root has the head, the connection is still sheddable.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let refused = root.http.get(format!("{}/healthz", root.url)).send().await;
    assert!(refused.is_err(), "served past the connection limit");
    busy.write_all(b": 10 }").await.unwrap();
    let mut head = [0u8; 12];
    busy.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 201");
    root.stop().await;
}

/// With `max_body_memory` = 4 KiB, a request whose 4000-byte body has
/// 3000 bytes in holds 3 KiB, not the 4000 its `Content-Length`
/// announced: a small body is read and served meanwhile; one that needs
/// more than what is left waits a moment and gets 503 with
/// `Retry-After`; a request with no body is not held up. Once the first
/// body is in and answered, the big one goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_hold_what_arrived_of_one_memory_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = Db::sqlite();
    let mut config = config(&db);
    config.body_limits.total = 4096;
    config.max_in_flight = 2;
    let root = TestRoot::start(config).await;

    // An apply of 4000 bytes (JSON padded with spaces): headers and 3000
    // bytes sent.
    let mut body =
        br#"{"quotas": [{"name": "slow", "limit": 1, "low_burst": 1, "high_burst": 2}]}"#.to_vec();
    body.resize(4000, b' ');
    let mut first = tokio::net::TcpStream::connect(root.addr).await.unwrap();
    first
        .write_all(
            b"POST /v1/apply HTTP/1.1\r\nhost: root\r\ncontent-type: application/json\r\n\
              content-length: 4000\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    first.write_all(&body[..3000]).await.unwrap();
    eventually("the first body's 3000 bytes are held", || async {
        root.metric("sluice_root_body_memory_bytes").await == Some(3072.0)
    })
    .await;

    // 1 KiB is left: a small body fits.
    let small = json!({"limit": 1, "low_burst": 1, "high_burst": 2});
    let (status, reply) = root
        .admin(Method::PUT, "/v1/quotas/fast", Some(small))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    // A 1500-byte body does not, and is refused after a moment.
    let mut padded = serde_json::to_vec(&json!({"limit": 1, "high_burst": 2})).unwrap();
    padded.resize(1500, b' ');
    let put_big = || {
        root.http
            .put(format!("{}/v1/quotas/big", root.url))
            .header("content-type", "application/json")
            .body(padded.clone())
            .send()
    };
    let refused = put_big().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    let reply: Value = serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_body_memory"), "{reply}");
    // Without a body a request needs no memory.
    let (status, _) = root.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK);

    first.write_all(&body[3000..]).await.unwrap();
    let mut reply = Vec::new();
    first.read_to_end(&mut reply).await.unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(put_big().await.unwrap().status(), StatusCode::CREATED);
    for name in ["slow", "fast", "big"] {
        assert_eq!(root.get(name).await.0, StatusCode::OK, "{name}");
    }
    assert_eq!(
        root.metric("sluice_root_rejected_requests_total{api=\"admin\",reason=\"body_memory\"}")
            .await,
        Some(1.0)
    );
    root.stop().await;
}

/// A quota set with a value of the wrong type names the quota (index and
/// name), the field and the position in the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_type_errors_name_the_quota_the_field_and_the_line() {
    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    let body = "{\"quotas\": [\n  {\"name\": \"a\", \"limit\": 1},\n  \
                {\"name\": \"b\", \"limit\": \"ten\"}\n]}";
    let (status, reply) = root
        .request(Method::POST, "/v1/apply", None, Some(body.into()))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(error_field(&reply), Some("quotas[1].limit"), "{reply}");
    assert_eq!(reply["error"]["quota"], json!("b"), "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid rate \"ten\"") && message.contains("at line 3, column"),
        "{reply}"
    );
    assert!(!message.contains("untagged"), "{reply}");
    // The set is refused whole: nothing was written.
    assert_eq!(root.get("a").await.0, StatusCode::NOT_FOUND);
    root.stop().await;
}

/// `.` and `..` are not quota names anywhere: not in a path (even
/// percent-encoded, which a client library would resolve away), not in a
/// set, not as a parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_are_refused_as_quota_names() {
    use root_support::raw::{connect_from, exchange};

    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    for path in [
        "/v1/quotas/..",
        "/v1/quotas/.",
        "/v1/quotas/%2E%2E",
        "/v1/quotas/%2e",
    ] {
        let mut conn = connect_from(root.addr, "127.0.0.1").await;
        let request = format!(
            "PUT {path} HTTP/1.1\r\nHost: root\r\nContent-Type: application/json\r\n\
             Content-Length: 12\r\n\r\n{{\"limit\": 1}}"
        );
        let (status, reply) = exchange(&mut conn, request.as_bytes()).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert_eq!(error_field(&reply), Some("name"), "{path}: {reply}");
    }
    for set in [
        json!([{"name": "..", "limit": 1}]),
        json!([{"name": "ok", "limit": 1, "parent": "."}]),
    ] {
        let (status, reply) = apply_set(&root, "", set.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{set}: {reply}");
    }
    // A prefix is not a name: "." lists the names that start with a dot.
    root.put(".hidden", json!({"limit": 1})).await;
    let (status, list) = root.admin(Method::GET, "/v1/quotas?prefix=.", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(names(&list), [".hidden"]);
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_and_undecodable_names_get_json_errors() {
    let db = Db::sqlite();
    let root = TestRoot::start(config(&db)).await;
    for (method, path) in [
        (Method::DELETE, "/v1/apply"),
        (Method::PATCH, "/v1/quotas"),
        (Method::GET, "/v1/sync"),
        (Method::POST, "/healthz"),
    ] {
        let (status, reply) = root.request(method.clone(), path, None, None).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert!(reply["error"]["message"].is_string(), "{method} {path}");
    }
    // %FF decodes to a byte that is not UTF-8.
    for method in [Method::GET, Method::DELETE, Method::PATCH] {
        let body = (method == Method::PATCH).then(|| b"{}".to_vec());
        let (status, reply) = root.request(method, "/v1/quotas/%FF", None, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
        assert_eq!(error_field(&reply), Some("name"), "{reply}");
    }
    root.stop().await;
}

/// `PATCH /v1/quotas/{name}` with `headers`; the status, the JSON reply
/// and the reply's `ETag`.
async fn patch_with(
    root: &TestRoot,
    name: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    send_with(root, Method::PATCH, name, Some(body), headers).await
}

async fn send_with(
    root: &TestRoot,
    method: Method,
    name: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut request = root
        .http
        .request(method, format!("{}/v1/quotas/{name}", root.url));
    if let Some(token) = &root.admin_token {
        request = request.bearer_auth(token);
    }
    for (header, value) in headers {
        request = request.header(*header, *value);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A quota's definition as the API shows it, without what changes by
/// itself (level, rates, limiters) or with every write (epoch).
fn definition(quota: &Value) -> Value {
    let mut quota = quota.clone();
    for live in ["level", "fill_rate", "rejected_rate", "limiters", "epoch"] {
        quota.as_object_mut().unwrap().remove(live);
    }
    quota
}

async fn a_patch_changes_only_the_fields_it_names(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("s3_photos", quota(100.0, 100.0, 200.0, None))
        .await;
    let body = json!({"limit": 5, "low_burst": 4, "high_burst": 5, "window": "1m",
                      "sliding": true, "per_key": true, "parent": "s3_photos"});
    root.put("per_client", body).await;
    let before = definition(&root.get("per_client").await.1);

    let (status, reply) = patch_with(&root, "per_client", json!({"limit": 6}), &[]).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["changed"], true);
    let after = root.get("per_client").await.1;
    let mut expected = before.clone();
    expected["limit"] = json!(6.0);
    expected["terms"] = json!("6 / min sliding per key");
    assert_eq!(definition(&after), expected, "only the limit changed");
    assert_eq!(after["epoch"], reply["epoch"]);

    // The same patch again changes nothing and takes no epoch.
    let (status, again) = patch_with(&root, "per_client", json!({"limit": 6}), &[]).await;
    assert_eq!((status, &again["changed"]), (StatusCode::OK, &json!(false)));
    assert_eq!(again["epoch"], reply["epoch"]);
    let (status, empty) = patch_with(&root, "per_client", json!({}), &[]).await;
    assert_eq!((status, &empty["changed"]), (StatusCode::OK, &json!(false)));

    // null clears: the window (with sliding, which needs one), the parent,
    // the bursts (back to their defaults, one second of the limit).
    let (status, reply) = patch_with(
        &root,
        "per_client",
        json!({"window": null, "sliding": false, "parent": null,
               "low_burst": null, "high_burst": null}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let q = &reply["quota"];
    assert!(
        q.get("window").is_none() && q.get("sliding").is_none(),
        "{q}"
    );
    assert_eq!(q["parent"], Value::Null);
    assert_eq!(
        (&q["low_burst"], &q["high_burst"]),
        (&json!(6.0), &json!(6.0))
    );
    assert_eq!(q["per_key"], true, "per_key kept");
    // And back under its parent.
    let (status, reply) =
        patch_with(&root, "per_client", json!({"parent": "s3_photos"}), &[]).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["quota"]["parent"], "s3_photos");
    // A limiter sees the patched quota.
    let mut limiter = Limiter::new("h");
    limiter.catch_up(&root).await;
    let id = limiter.id_of("per_client").unwrap();
    assert_eq!(limiter.quotas[&id]["limit"], 6.0);
    root.stop().await;
}

async fn a_put_replaces_the_whole_quota(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("s3_photos", quota(100.0, 100.0, 200.0, None))
        .await;
    root.put(
        "s3_photos_read",
        json!({"limit": 10, "low_burst": 20, "high_burst": 30, "parent": "s3_photos"}),
    )
    .await;
    let (status, reply) = root
        .admin(
            Method::PUT,
            "/v1/quotas/s3_photos_read",
            Some(json!({"limit": 15})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let q = root.get("s3_photos_read").await.1;
    // Every field not given takes its default: no parent, bursts of one
    // second of the limit.
    assert_eq!(q["parent"], Value::Null);
    assert_eq!(
        (&q["limit"], &q["low_burst"], &q["high_burst"]),
        (&json!(15.0), &json!(15.0), &json!(15.0))
    );
    root.stop().await;
}

async fn patch_errors_name_the_field_and_change_nothing(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("top", quota(10.0, 10.0, 20.0, None)).await;
    root.put("template", json!({"limit": 5, "per_key": true}))
        .await;
    root.put(
        "leaky",
        json!({"limit": 10, "high_burst": 20, "parent": "top"}),
    )
    .await;
    let before = root.get("leaky").await.1;
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (json!({"limit": -1}), StatusCode::BAD_REQUEST, "limit"),
        (json!({"limit": null}), StatusCode::BAD_REQUEST, "limit"),
        (json!({"limit": "ten"}), StatusCode::BAD_REQUEST, "limit"),
        (json!({"per_key": null}), StatusCode::BAD_REQUEST, "per_key"),
        (json!({"limits": 5}), StatusCode::BAD_REQUEST, "limits"),
        (json!({"sliding": true}), StatusCode::BAD_REQUEST, "sliding"),
        (json!({"window": "2m"}), StatusCode::BAD_REQUEST, "window"),
        // A window quota's band lies within its limit: high_burst 20 > 10.
        (
            json!({"window": "1m"}),
            StatusCode::BAD_REQUEST,
            "high_burst",
        ),
        (
            json!({"low_burst": 30}),
            StatusCode::BAD_REQUEST,
            "low_burst",
        ),
        (
            json!({"parent": "missing"}),
            StatusCode::BAD_REQUEST,
            "parent",
        ),
        (
            json!({"parent": "leaky"}),
            StatusCode::BAD_REQUEST,
            "parent",
        ),
        (
            json!({"parent": "template"}),
            StatusCode::BAD_REQUEST,
            "parent",
        ),
        (json!({"name": "other"}), StatusCode::BAD_REQUEST, "name"),
    ];
    for (body, code, field) in cases {
        let (status, reply) = patch_with(&root, "leaky", body.clone(), &[]).await;
        assert_eq!(status, code, "{body}: {reply}");
        assert_eq!(error_field(&reply), Some(field), "{body}: {reply}");
    }
    // The parent cannot become a template while it has children.
    let (status, reply) = patch_with(&root, "top", json!({"per_key": true}), &[]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    assert_eq!(error_field(&reply), Some("per_key"));
    let (status, reply) = patch_with(&root, "missing", json!({"limit": 1}), &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{reply}");
    assert_eq!(error_field(&reply), Some("name"));
    let (status, reply) = patch_with(&root, "leaky", json!([1]), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(root.get("leaky").await.1, before, "nothing changed");
    assert_eq!(root.get("missing").await.0, StatusCode::NOT_FOUND);
    root.stop().await;
}

async fn if_match_refuses_a_write_over_a_change_not_seen(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(10.0, 10.0, 20.0, None)).await;
    let response = root
        .http
        .get(format!("{}/v1/quotas/q", root.url))
        .send()
        .await
        .unwrap();
    let etag = response.headers()["etag"].to_str().unwrap().to_string();
    let read: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(etag, format!("\"{}\"", read["epoch"]));

    // A write at the epoch read goes through; one still holding it is
    // refused, and says what the quota is at now.
    let (status, first) =
        patch_with(&root, "q", json!({"limit": 11}), &[("If-Match", &etag)]).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, second) = patch_with(
        &root,
        "q",
        json!({"high_burst": 30}),
        &[("If-Match", &etag)],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{second}");
    assert_eq!(error_field(&second), Some("If-Match"));
    let message = second["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("epoch {}", first["epoch"])),
        "{message}"
    );
    assert_eq!(root.get("q").await.1["high_burst"], 20.0, "not written");
    let now = format!("\"{}\"", first["epoch"]);
    let (status, _) = send_with(
        &root,
        Method::PUT,
        "q",
        Some(json!({"limit": 12})),
        &[("If-Match", &etag)],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED);
    let (status, _) = send_with(&root, Method::DELETE, "q", None, &[("If-Match", &etag)]).await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(root.get("q").await.0, StatusCode::OK);
    // Either of two tags, or any existing quota.
    let (status, _) = patch_with(
        &root,
        "q",
        json!({"limit": 13}),
        &[("If-Match", &format!("{etag}, {now}"))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = patch_with(&root, "q", json!({"limit": 14}), &[("If-Match", "*")]).await;
    assert_eq!(status, StatusCode::OK);
    // If-None-Match: * creates only.
    let create_only = [("If-None-Match", "*")];
    let (status, reply) = send_with(
        &root,
        Method::PUT,
        "q",
        Some(json!({"limit": 1})),
        &create_only,
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{reply}");
    assert_eq!(error_field(&reply), Some("If-None-Match"));
    let (status, _) = send_with(
        &root,
        Method::PUT,
        "fresh",
        Some(json!({"limit": 1})),
        &create_only,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    for bad in ["12", "W/\"12\"", "\"twelve\""] {
        let (status, reply) =
            patch_with(&root, "q", json!({"limit": 1}), &[("If-Match", bad)]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {reply}");
        assert_eq!(error_field(&reply), Some("If-Match"), "{bad}");
    }
    assert_eq!(root.get("q").await.1["limit"], 14.0);
    root.stop().await;
}

async fn concurrent_patches_of_different_fields_through_two_roots_both_stay(db: Db) {
    let one = TestRoot::start(config(&db)).await;
    let two = TestRoot::start(config(&db)).await;
    one.put("q", quota(1000.0, 500.0, 500.0, None)).await;
    two.wait_ready().await;
    for i in 0..20 {
        let low = json!({"low_burst": f64::from(i)});
        let high = json!({"high_burst": f64::from(600 + i)});
        let (a, b) = tokio::join!(
            patch_with(&one, "q", low, &[]),
            patch_with(&two, "q", high, &[]),
        );
        assert_eq!(
            (a.0, b.0),
            (StatusCode::OK, StatusCode::OK),
            "{} {}",
            a.1,
            b.1
        );
        // Each merged into the row as the other left it: both stay.
        let expected = (json!(f64::from(i)), json!(f64::from(600 + i)));
        eventually("both patches visible", || async {
            let q = one.get("q").await.1;
            (q["low_burst"].clone(), q["high_burst"].clone()) == expected
        })
        .await;
    }
    one.stop().await;
    two.stop().await;
}
