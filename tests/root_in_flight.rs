//! In-flight quotas at a real root over HTTP: the admin API refuses a bad
//! one naming the field, and a limiter that stops syncing loses its slots
//! after the lease without its late reports counting twice.

#[macro_use]
mod root_support;

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use root_support::{config, Db, Limiter, TestRoot};

on_both_backends!(
    the_admin_api_refuses_a_bad_in_flight_quota_naming_the_field,
    a_silent_limiter_loses_its_slots_after_the_lease,
);

async fn put_status(root: &TestRoot, name: &str, body: Value) -> (StatusCode, Value) {
    root.admin(Method::PUT, &format!("/v1/quotas/{name}"), Some(body))
        .await
}

async fn the_admin_api_refuses_a_bad_in_flight_quota_naming_the_field(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    for (body, field) in [
        (json!({"limit": 2.5, "in_flight": true}), "limit"),
        (json!({"limit": 0, "in_flight": true}), "limit"),
        (
            json!({"limit": 5, "high_burst": 9, "in_flight": true}),
            "high_burst",
        ),
        (
            json!({"limit": 5, "window": "1m", "in_flight": true}),
            "in_flight",
        ),
        (json!({"limit": 5, "in_flight": "yes"}), "in_flight"),
    ] {
        let (status, reply) = put_status(&root, "uploads", body.clone()).await;
        assert!(status.is_client_error(), "{body}: {status} {reply}");
        let named = reply["error"]["field"] == field
            || reply["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field));
        assert!(named, "{body}: {reply}");
    }
    let reply = root
        .put("uploads", json!({"limit": 3, "in_flight": true}))
        .await;
    assert_eq!(reply["quota"]["in_flight"], json!(true), "{reply}");
    let (_, quota) = root.get("uploads").await;
    assert_eq!(
        (&quota["terms"], &quota["kind"], &quota["high_burst"]),
        (&json!("3 at once"), &json!("in_flight"), &json!(3.0)),
        "{quota}"
    );
    // Nothing goes under it, and it goes under nothing.
    let (status, reply) =
        put_status(&root, "child", json!({"limit": 1, "parent": "uploads"})).await;
    assert!(status.is_client_error(), "{reply}");
    assert_eq!(reply["error"]["field"], "parent", "{reply}");
    root.put("plain", json!({"limit": 1})).await;
    root.put("under", json!({"limit": 1, "parent": "plain"}))
        .await;
    let (status, reply) = put_status(&root, "plain", json!({"limit": 1, "in_flight": true})).await;
    assert!(status.is_client_error(), "{reply}");
    assert_eq!(reply["error"]["field"], "in_flight", "{reply}");
    // A PATCH turns a leaky quota into an in-flight one when its bursts
    // fit, and says which one does not.
    root.put("rate", json!({"limit": 4, "high_burst": 8})).await;
    let (status, reply) = root
        .admin(
            Method::PATCH,
            "/v1/quotas/rate",
            Some(json!({"in_flight": true})),
        )
        .await;
    assert!(status.is_client_error(), "{reply}");
    assert_eq!(reply["error"]["field"], "high_burst", "{reply}");
    let (status, reply) = root
        .admin(
            Method::PATCH,
            "/v1/quotas/rate",
            Some(json!({"in_flight": true, "high_burst": null, "low_burst": null})),
        )
        .await;
    assert!(status.is_success(), "{reply}");
    assert_eq!(reply["quota"]["in_flight"], json!(true), "{reply}");
    root.stop().await;
}

async fn a_silent_limiter_loses_its_slots_after_the_lease(db: Db) {
    let root = TestRoot::start(sluice::root::config::RootConfig {
        in_flight_lease: Duration::from_millis(600),
        ..config(&db)
    })
    .await;
    root.put("uploads", json!({"limit": 10, "in_flight": true}))
        .await;
    let (mut a, mut b) = (Limiter::new("host-a"), Limiter::new("host-b"));
    a.catch_up(&root).await;
    b.catch_up(&root).await;
    let id = a.id_of("uploads").unwrap();
    a.sync(&root, &[(id, 4)]).await;
    b.sync(&root, &[(id, 3)]).await;
    assert_eq!(b.levels[&id], 7.0);
    // b keeps syncing; a is silent past its lease and its 4 slots go.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.levels[&id] != 3.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a's slots never dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        b.sync(&root, &[]).await;
    }
    // a comes back: its returns of the dropped slots find nothing (b's
    // slots stay counted), and its new slot counts once.
    let mut late = a.request(&[(id, 1)]);
    late["returned"] = json!([{"id": id, "delta": 4}]);
    let (status, reply) = root.sync(&late).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    a.absorb(&reply);
    assert_eq!(a.levels[&id], 4.0, "{reply}");
    b.sync(&root, &[]).await;
    assert_eq!(b.levels[&id], 4.0);
    root.stop().await;
}
