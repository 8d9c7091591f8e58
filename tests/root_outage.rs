//! Database outages: PostgreSQL stopped and started under a running root,
//! and roots started while their database is unreachable.

mod root_support;

use reqwest::{Method, StatusCode};
use serde_json::json;

use root_support::{config, eventually, quota, Db, Limiter, PgCluster, TestRoot};

async fn health(root: &TestRoot) -> (StatusCode, serde_json::Value) {
    root.request(Method::GET, "/healthz", None, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_serves_read_only_while_postgres_is_down_and_recovers_by_itself() {
    let Some(cluster) = PgCluster::private() else {
        return;
    };
    let db = Db::on(&cluster).await;
    let root = TestRoot::start(config(&db)).await;
    root.put("q", quota(0.0, 100.0, 100.0, None)).await;
    let mut limiter = Limiter::new("h");
    limiter.catch_up(&root).await;
    let id = limiter.id_of("q").unwrap();
    limiter.sync(&root, &[(id, 5)]).await;

    cluster.stop().await;
    eventually("the root notices the outage", || async {
        root.metric("sluice_root_db_up").await == Some(0.0)
    })
    .await;
    // Syncs go on with the quotas and counters the root holds.
    limiter.sync(&root, &[(id, 5)]).await;
    assert_eq!(limiter.levels[&id], 10.0);
    assert_eq!(root.get("q").await.0, StatusCode::OK);
    // Writes are refused with the reason.
    let (status, reply) = root
        .admin(Method::PUT, "/v1/quotas/r", Some(json!({"limit": 1})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("database unavailable"),
        "{reply}"
    );
    let (status, apply) = root.admin(Method::POST, "/v1/apply", Some(json!([]))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{apply}");
    let (status, state) = health(&root).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&state["status"], &state["db"]),
        (&json!("degraded"), &json!("down"))
    );
    assert!(state["db_error"].is_string());
    assert!(state["db_down_secs"].as_f64() >= Some(0.0), "{state}");
    assert!(root.metric("sluice_root_db_down_seconds").await >= Some(0.0));
    assert!(
        root.metric("sluice_root_reloads_total{result=\"failed\"}")
            .await
            >= Some(1.0)
    );

    cluster.start().await;
    eventually("the root reconnects", || async {
        health(&root).await.1["db"] == "up"
    })
    .await;
    assert_eq!(root.metric("sluice_root_db_up").await, Some(1.0));
    assert_eq!(root.metric("sluice_root_db_down_seconds").await, None);
    root.put("r", json!({"limit": 1})).await;
    limiter.sync(&root, &[]).await;
    assert!(limiter.id_of("r").is_some());
    assert_eq!(limiter.levels[&id], 10.0);
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_started_while_postgres_is_down_serves_nothing_until_it_has_loaded() {
    let Some(cluster) = PgCluster::private() else {
        return;
    };
    let db = Db::on(&cluster).await;
    let first = TestRoot::start(config(&db)).await;
    first.put("q", quota(1.0, 1.0, 1.0, None)).await;
    first.stop().await;
    cluster.stop().await;

    let root = TestRoot::start_unready(config(&db)).await;
    eventually("a failed connection attempt", || async {
        root.metric("sluice_root_reloads_total{result=\"failed\"}")
            .await
            >= Some(1.0)
    })
    .await;
    let (status, state) = health(&root).await;
    assert_eq!(
        (status, &state["status"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("starting"))
    );
    let (status, reply) = root.sync(&Limiter::new("h").request(&[])).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert_eq!(
        root.admin(Method::GET, "/v1/quotas", None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(root.get("q").await.0, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = root
        .admin(Method::PUT, "/v1/quotas/r", Some(json!({"limit": 1})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(root.metric("sluice_root_ready").await, Some(0.0));
    assert_eq!(
        root.metric("sluice_root_syncs_total{result=\"unavailable\"}")
            .await,
        Some(1.0)
    );

    cluster.start().await;
    root.wait_ready().await;
    let mut limiter = Limiter::new("h");
    limiter.catch_up(&root).await;
    assert!(limiter.id_of("q").is_some());
    root.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_whose_sqlite_file_cannot_be_opened_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-yet");
    let db = Db::at(format!("sqlite://{}/sluice.db", missing.display()));
    let root = TestRoot::start_unready(config(&db)).await;
    eventually("a failed open", || async {
        root.metric("sluice_root_db_up").await == Some(0.0)
    })
    .await;
    assert_eq!(health(&root).await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        root.sync(&Limiter::new("h").request(&[])).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );

    std::fs::create_dir(&missing).unwrap();
    root.wait_ready().await;
    root.put("q", json!({"limit": 1})).await;
    root.stop().await;
}
