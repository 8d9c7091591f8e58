//! Conditional writes under a race, over real HTTP, on SQLite and on
//! PostgreSQL: writers that read the same version (`ETag`) and write at
//! once with `If-Match` get exactly one 200 between them, the others 412,
//! and the stored value is the winner's, for PUT, PATCH and DELETE of
//! quotas and of overrides. The writers go through two roots sharing the
//! database (one root queues its own writes): only the comparison and
//! the write in one database transaction keep an update from being lost
//! to a writer that compared before another wrote.

#[macro_use]
mod root_support;

use std::time::{Duration, Instant};

use reqwest::{header, Method, StatusCode};
use serde_json::{json, Value};

use sluice::root::RootConfig;

use root_support::{config, Db, TestRoot, PATIENCE};

on_both_backends!(
    racing_quota_writes_with_one_etag_have_one_winner,
    racing_override_writes_with_one_etag_have_one_winner,
    an_etag_names_the_version_of_an_override,
);

/// Rounds of each race.
const ROUNDS: usize = 100;
/// Writers in each round.
const RACERS: usize = 4;

const KEY: &str = "00000000000000aa";

/// What a writer sends: its method, and its body (its `limit`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Write {
    Put,
    Patch,
    Delete,
}

impl Write {
    fn method(self) -> Method {
        match self {
            Self::Put => Method::PUT,
            Self::Patch => Method::PATCH,
            Self::Delete => Method::DELETE,
        }
    }
}

/// `GET path`: the status, the `ETag` and the body.
async fn read(root: &TestRoot, path: &str) -> (StatusCode, Option<String>, Value) {
    let response = root
        .http
        .get(format!("{}{path}", root.url))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let etag = response
        .headers()
        .get(header::ETAG)
        .map(|v| v.to_str().unwrap().to_string());
    let body = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(Value::Null);
    (status, etag, body)
}

/// Sends `write` to `path` with `If-Match: etag` and the `limit` given.
async fn send(
    http: reqwest::Client,
    url: String,
    write: Write,
    etag: String,
    limit: u64,
) -> StatusCode {
    let mut request = http
        .request(write.method(), url)
        .header(header::IF_MATCH, etag);
    if write != Write::Delete {
        request = request
            .header(header::CONTENT_TYPE, "application/json")
            .body(json!({ "limit": limit }).to_string());
    }
    request.send().await.unwrap().status()
}

/// Two roots on one database, rereading it often (each round waits
/// for both to have read the last write).
async fn two_roots(db: &Db) -> [TestRoot; 2] {
    let config = || RootConfig {
        reload_interval: Duration::from_millis(25),
        ..config(db)
    };
    let one = TestRoot::start(config()).await;
    let two = TestRoot::start(config()).await;
    [one, two]
}

/// Waits until both roots have read the same epoch: the last write's
/// (its root reloaded before it answered), so each reads what is stored.
async fn caught_up(roots: &[TestRoot; 2]) {
    let deadline = Instant::now() + PATIENCE;
    while epoch(&roots[0]).await != epoch(&roots[1]).await {
        assert!(Instant::now() < deadline, "both roots read the last write");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The epoch a root has read, as `/healthz` says.
async fn epoch(root: &TestRoot) -> Option<u64> {
    let (_, health) = root.request(Method::GET, "/healthz", None, None).await;
    health["epoch"].as_u64()
}

/// Runs [`ROUNDS`] rounds of [`RACERS`] writers of `write` at `path`,
/// taking turns at the two roots, each round from one read through the
/// first; `reset` puts the thing back before a round (after a delete).
/// Returns the rounds that did not have exactly one 200 and 412s for the
/// rest, or whose stored limit (as the winner's root reads it) is not
/// the winner's.
async fn race<F, Fut>(roots: &[TestRoot; 2], path: &str, write: Write, reset: F) -> Vec<String>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let root = &roots[0];
    let mut wrong = Vec::new();
    for round in 0..ROUNDS as u64 {
        caught_up(roots).await;
        reset(round).await;
        caught_up(roots).await;
        // The version as a reply shows it (a GET's ETag says the same:
        // see `an_etag_names_the_version_of_an_override`).
        let (status, _, before) = read(root, path).await;
        assert_eq!(status, StatusCode::OK, "round {round}: {path} is there");
        let etag = format!("\"{}\"", before["epoch"]);
        let racers: Vec<_> = (0..RACERS as u64)
            .map(|i| {
                let limit = 1000 + round * 10 + i;
                let at = &roots[i as usize % 2];
                let call = send(
                    at.http.clone(),
                    format!("{}{path}", at.url),
                    write,
                    etag.clone(),
                    limit,
                );
                (limit, at, tokio::spawn(call))
            })
            .collect();
        let mut won = Vec::new();
        let mut others = Vec::new();
        for (limit, at, racer) in racers {
            match racer.await.unwrap() {
                StatusCode::OK => won.push((limit, at)),
                StatusCode::PRECONDITION_FAILED => {}
                status => others.push(status),
            }
        }
        let limits: Vec<u64> = won.iter().map(|w| w.0).collect();
        let ([(limit, at)], true) = (&won[..], others.is_empty()) else {
            wrong.push(format!(
                "round {round}: 200 for {limits:?}, also {others:?}"
            ));
            continue;
        };
        // The winner's root reloaded before it answered.
        let (status, _, now) = read(at, path).await;
        let stored = match write {
            Write::Delete => status == StatusCode::NOT_FOUND,
            Write::Put | Write::Patch => now["limit"].as_f64() == Some(*limit as f64),
        };
        if !stored {
            wrong.push(format!(
                "round {round}: {limit} won, but it reads {status} {now}"
            ));
        }
    }
    wrong
}

async fn racing_quota_writes_with_one_etag_have_one_winner(db: Db) {
    let roots = two_roots(&db).await;
    let root = &roots[0];
    let path = "/v1/quotas/raced";
    let create = |_| async {
        let (status, _) = root.get("raced").await;
        if status == StatusCode::NOT_FOUND {
            root.put("raced", json!({"limit": 10})).await;
        }
    };
    for write in [Write::Patch, Write::Put, Write::Delete] {
        let wrong = race(&roots, path, write, create).await;
        assert!(wrong.is_empty(), "{write:?}: {wrong:#?}");
    }
    for root in roots {
        root.stop().await;
    }
}

async fn racing_override_writes_with_one_etag_have_one_winner(db: Db) {
    let roots = two_roots(&db).await;
    let root = &roots[0];
    root.put("tier", json!({"limit": 10, "per_key": true}))
        .await;
    let path = format!("/v1/quotas/tier/overrides/{KEY}");
    let create = |_| async {
        let (status, _, _) = read(root, &path).await;
        if status == StatusCode::NOT_FOUND {
            let (status, reply) = root
                .admin(Method::PUT, &path, Some(json!({"limit": 5})))
                .await;
            assert_eq!(status, StatusCode::CREATED, "{reply}");
        }
    };
    for write in [Write::Patch, Write::Put, Write::Delete] {
        let wrong = race(&roots, &path, write, create).await;
        assert!(wrong.is_empty(), "{write:?}: {wrong:#?}");
    }
    for root in roots {
        root.stop().await;
    }
}

/// An override's `ETag` is its epoch; `If-Match` with another is refused
/// (412) and writes nothing, `If-None-Match: *` creates only, and a
/// write to a removed override that expects a version is a 412 (not a
/// 404), as for quotas.
async fn an_etag_names_the_version_of_an_override(db: Db) {
    let root = TestRoot::start(config(&db)).await;
    root.put("tier", json!({"limit": 10, "per_key": true}))
        .await;
    let path = format!("/v1/quotas/tier/overrides/{KEY}");
    let write = |method: Method, body: Option<Value>, headers: Vec<(&'static str, String)>| {
        let mut request = root.http.request(method, format!("{}{path}", root.url));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(body) = body {
            request = request
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            let body: Value =
                serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(Value::Null);
            (status, body)
        }
    };
    let create_only = || vec![("If-None-Match", "*".to_string())];
    let (status, created) = write(Method::PUT, Some(json!({"limit": 5})), create_only()).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, again) = write(Method::PUT, Some(json!({"limit": 6})), create_only()).await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{again}");
    assert_eq!(again["error"]["field"], "If-None-Match");

    let (_, etag, view) = read(&root, &path).await;
    let etag = etag.expect("an ETag");
    assert_eq!(etag, format!("\"{}\"", view["epoch"]));
    assert_eq!(etag, format!("\"{}\"", created["override"]["epoch"]));
    let (status, patched) = write(
        Method::PATCH,
        Some(json!({"limit": 7})),
        vec![("If-Match", etag.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    let (status, stale) = write(
        Method::PUT,
        Some(json!({"limit": 8})),
        vec![("If-Match", etag.clone())],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{stale}");
    assert_eq!(stale["error"]["field"], "If-Match");
    let message = stale["error"]["message"].as_str().unwrap();
    let now = patched["override"]["epoch"].as_u64().unwrap();
    assert!(message.contains(&format!("epoch {now}")), "{message}");
    assert_eq!(read(&root, &path).await.2["limit"], 7.0, "not written");

    let (status, bad) = write(Method::DELETE, None, vec![("If-Match", "7".into())]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    let (status, _) = write(
        Method::DELETE,
        None,
        vec![("If-Match", format!("\"{now}\""))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, gone) = write(
        Method::DELETE,
        None,
        vec![("If-Match", format!("\"{now}\""))],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{gone}");
    let (status, gone) = write(Method::DELETE, None, vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{gone}");
    root.stop().await;
}
