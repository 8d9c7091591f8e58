//! `sluice rls` through a real gRPC client (tonic, RLS v3): every
//! semantic envoyproxy/ratelimit defines, one test each, and sluice's own
//! keys (several limits, sliding and N-unit windows, the leaky bucket),
//! against a server on a loopback port deciding on a real table with its
//! sync thread.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, UInt64Value};
use sluice::rls::config::Config;
use sluice::rls::decide::Engine;
use sluice::rls::server::{serve, Server};
use sluice::sync::{SyncConfig, SyncHandle};
use sluice::table::Table;
use tokio::net::TcpListener;
use tonic::transport::Channel;

/// A running server and a client of it.
struct Rls {
    client: RateLimitServiceClient<Channel>,
    http: String,
    grpc: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start_with(yaml: &str, response_headers: bool) -> Rls {
    let config = Config::from_texts([("test.yaml", yaml)]).expect("config loads");
    let table = Arc::new(Table::new_heap_with(1024, 64, 10_000, 0));
    let engine =
        Arc::new(Engine::new(Arc::clone(&table), config, false, response_headers).unwrap());
    let sync = SyncHandle::start(Arc::clone(&table), SyncConfig::default()).unwrap();
    let server = Arc::new(Server::new(engine, Some(sync), false));
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = format!("http://{}", grpc.local_addr().unwrap());
    let http_addr = format!("http://{}", http.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(server, grpc, Some(http), async move {
        let _ = stopped.await;
    }));
    let client = RateLimitServiceClient::connect(grpc_addr.clone())
        .await
        .expect("client connects");
    Rls {
        client,
        http: http_addr,
        grpc: grpc_addr,
        _stop: stop,
    }
}

async fn start(yaml: &str) -> Rls {
    start_with(yaml, false).await
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

impl Rls {
    async fn ask(
        &mut self,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
        hits: u32,
    ) -> RateLimitResponse {
        self.client
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors,
                hits_addend: hits,
            })
            .await
            .expect("an answer")
            .into_inner()
    }

    /// One descriptor, one hit: its status.
    async fn one(&mut self, domain: &str, entries: &[(&str, &str)]) -> DescriptorStatus {
        let response = self.ask(domain, vec![descriptor(entries)], 0).await;
        assert_eq!(response.statuses.len(), 1);
        response.statuses[0].clone()
    }

    async fn metrics(&self) -> String {
        http_get(&format!("{}/metrics", self.http)).await
    }
}

/// A plain HTTP/1.1 GET over a TCP stream (no HTTP client dependency).
async fn http_get(url: &str) -> String {
    http_request(url, "GET", "").await.1
}

async fn http_request(url: &str, method: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let status: u16 = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn ok(status: &DescriptorStatus) -> bool {
    status.code == Code::Ok as i32
}

fn over(status: &DescriptorStatus) -> bool {
    status.code == Code::OverLimit as i32
}

fn utc_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Waits while fewer than `margin` seconds are left in the current window
/// of `length` seconds, so that a test's requests fall in one window.
async fn away_from_window_end(length: f64, margin: f64) {
    let left = length - utc_secs() % length;
    if left < margin {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.05)).await;
    }
}

const HOUR: f64 = 3600.0;

#[tokio::test]
async fn over_the_limit_is_a_count_after_the_hit_above_requests_per_unit() {
    let mut rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let first = rls.one("d", &[("k", "v")]).await;
    assert!(ok(&first));
    assert_eq!(first.limit_remaining, 1);
    let second = rls.one("d", &[("k", "v")]).await;
    assert!(ok(&second), "a count of 2 is not above 2");
    assert_eq!(second.limit_remaining, 0);
    let third = rls.one("d", &[("k", "v")]).await;
    assert!(over(&third));
    assert_eq!(third.limit_remaining, 0);
}

#[tokio::test]
async fn hits_over_the_limit_still_count() {
    let mut rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    for _ in 0..3 {
        rls.one("d", &[("k", "v")]).await;
    }
    // A check without a hit: the count is 3 if the rejected hit counted
    // (over), 2 if not (OK).
    let mut check = descriptor(&[("k", "v")]);
    check.hits_addend = Some(UInt64Value { value: 0 });
    let response = rls.ask("d", vec![check], 0).await;
    assert!(over(&response.statuses[0]), "the third hit was counted");
}

#[tokio::test]
async fn a_check_of_zero_hits_at_the_limit_is_ok_and_counts_nothing() {
    let mut rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let mut check = descriptor(&[("k", "v")]);
    check.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..3 {
        let response = rls.ask("d", vec![check.clone()], 0).await;
        assert!(ok(&response.statuses[0]));
        assert_eq!(response.statuses[0].limit_remaining, 1);
    }
    assert!(ok(&rls.one("d", &[("k", "v")]).await));
    let response = rls.ask("d", vec![check], 0).await;
    assert!(ok(&response.statuses[0]), "a count of 1 is not above 1");
    assert_eq!(response.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn request_hits_addend_counts_that_many_and_descriptor_hits_override_it() {
    let mut rls = start(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let mut b = descriptor(&[("b", "x")]);
    b.hits_addend = Some(UInt64Value { value: 2 });
    let response = rls.ask("d", vec![descriptor(&[("a", "x")]), b], 4).await;
    assert_eq!(response.statuses[0].limit_remaining, 6);
    assert_eq!(response.statuses[1].limit_remaining, 8);
    let response = rls.ask("d", vec![descriptor(&[("a", "x")])], 7).await;
    assert!(over(&response.statuses[0]), "4 + 7 is above 10");
}

#[tokio::test]
async fn statuses_carry_limit_remaining_current_limit_and_reset_in_request_order() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_minute}
  - key: h
    rate_limit: {unit: HOUR, requests_per_unit: 7}
  - key: s
    rate_limit: {unit: Second, requests_per_unit: 9}
",
    )
    .await;
    away_from_window_end(60.0, 3.0).await;
    let response = rls
        .ask(
            "d",
            vec![
                descriptor(&[("h", "1")]),
                descriptor(&[("nothing", "1")]),
                descriptor(&[("m", "1")]),
                descriptor(&[("s", "1")]),
            ],
            0,
        )
        .await;
    let now = utc_secs();
    assert_eq!(response.overall_code, Code::Ok as i32);
    let [h, none, m, s] = &response.statuses[..] else {
        panic!("four statuses: {response:?}");
    };
    let h_limit = h.current_limit.as_ref().unwrap();
    assert_eq!(
        (h_limit.requests_per_unit, h_limit.unit),
        (7, Unit::Hour as i32)
    );
    assert_eq!(h.limit_remaining, 6);
    let m_limit = m.current_limit.as_ref().unwrap();
    assert_eq!(
        (m_limit.name.as_str(), m_limit.unit),
        ("per_minute", Unit::Minute as i32)
    );
    assert_eq!(m.limit_remaining, 4);
    assert_eq!(s.limit_remaining, 8);
    assert!(ok(none) && none.current_limit.is_none() && none.limit_remaining == 0);
    // Windows aligned to the Unix epoch: the reset is the time to the
    // window's end, in whole seconds rounded up.
    for (status, length) in [(h, 3600.0), (m, 60.0), (s, 1.0)] {
        let reset = status.duration_until_reset.as_ref().unwrap().seconds as f64;
        let expected = (length - now % length).ceil();
        assert!(
            (reset - expected).abs() <= 1.0,
            "reset {reset}, expected {expected} of {length}"
        );
    }
}

#[tokio::test]
async fn matching_prefers_the_exact_value_then_patterns_in_file_order_then_the_key() {
    let mut rls = start(
        r#"domain: d
descriptors:
  - key: path
    value: "/api/*/admin"
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: "/api/v1/admin"
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 4}
"#,
    )
    .await;
    let limit = |s: &DescriptorStatus| s.current_limit.as_ref().unwrap().requests_per_unit;
    assert_eq!(limit(&rls.one("d", &[("path", "/api/v1/admin")]).await), 3);
    assert_eq!(limit(&rls.one("d", &[("path", "/api/v2/admin")]).await), 1);
    assert_eq!(limit(&rls.one("d", &[("path", "/api/v2/users")]).await), 2);
    assert_eq!(limit(&rls.one("d", &[("path", "/health")]).await), 4);
}

#[tokio::test]
async fn a_limit_applies_only_at_the_last_entry_of_a_descriptor() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: a
    value: x
    rate_limit: {unit: hour, requests_per_unit: 1}
    descriptors:
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 1}
",
    )
    .await;
    // (a, x), (b, y): the nested limit, not (a, x)'s.
    let nested = rls.one("d", &[("a", "x"), ("b", "y")]).await;
    assert_eq!(nested.current_limit.unwrap().requests_per_unit, 5);
    // (c, 1), (z, 2): c's limit is not at the last entry, and c has no
    // children: no limit.
    let deeper = rls.one("d", &[("c", "1"), ("z", "2")]).await;
    assert!(ok(&deeper) && deeper.current_limit.is_none());
}

#[tokio::test]
async fn a_key_without_value_counts_each_value_on_its_own() {
    let mut rls = start(
        "domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 1}
",
    )
    .await;
    away_from_window_end(86_400.0, 5.0).await;
    let a = [("message_type", "marketing"), ("to_number", "2061111111")];
    let b = [("message_type", "marketing"), ("to_number", "2062222222")];
    assert!(ok(&rls.one("messaging", &a).await));
    assert!(ok(&rls.one("messaging", &b).await));
    assert!(over(&rls.one("messaging", &a).await));
}

#[tokio::test]
async fn share_threshold_makes_every_match_of_a_pattern_share_one_counter() {
    let mut rls = start(
        r#"domain: d
descriptors:
  - key: shared
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: apart
    value: "files/*"
    rate_limit: {unit: hour, requests_per_unit: 2}
"#,
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    assert!(ok(&rls.one("d", &[("shared", "files/a.pdf")]).await));
    assert!(ok(&rls.one("d", &[("shared", "files/b.csv")]).await));
    assert!(over(&rls.one("d", &[("shared", "files/c.txt")]).await));
    for v in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        assert!(
            ok(&rls.one("d", &[("apart", v)]).await),
            "{v} has its own counter"
        );
    }
}

#[tokio::test]
async fn a_request_supplied_limit_overrides_the_configuration() {
    let mut rls = start("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n").await;
    away_from_window_end(86_400.0, 5.0).await;
    let mut asked = descriptor(&[("k", "v")]);
    asked.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 4, // DAY in envoy.type.v3.RateLimitUnit
    });
    let first = rls.ask("d", vec![asked.clone()], 0).await;
    let limit = first.statuses[0].current_limit.clone().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (1, Unit::Day as i32));
    assert!(ok(&first.statuses[0]));
    assert!(over(&rls.ask("d", vec![asked], 0).await.statuses[0]));
    // The configured limit is untouched.
    assert_eq!(rls.one("d", &[("k", "v")]).await.limit_remaining, 99);
}

#[tokio::test]
async fn unlimited_answers_ok_with_all_remaining() {
    let mut rls =
        start("domain: d\ndescriptors:\n  - key: internal\n    rate_limit: {unlimited: true}\n")
            .await;
    for _ in 0..3 {
        let status = rls.one("d", &[("internal", "x")]).await;
        assert!(ok(&status));
        assert_eq!(status.limit_remaining, u32::MAX);
        assert!(status.current_limit.is_none());
    }
}

#[tokio::test]
async fn replaces_drops_the_limit_it_names_when_both_match() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bob
        rate_limit: {name: specific, unit: hour, requests_per_unit: 1}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bob
        rate_limit:
          unit: hour
          requests_per_unit: 10
          replaces: [{name: specific}]
",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let both = || {
        vec![
            descriptor(&[("key_1", "value_1"), ("user", "bob")]),
            descriptor(&[("key_2", "value_2"), ("user", "bob")]),
        ]
    };
    for _ in 0..3 {
        let response = rls.ask("d", both(), 0).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert!(response.statuses[0].current_limit.is_none(), "replaced");
    }
    // Alone, the specific limit applies and was not counted meanwhile.
    assert!(ok(&rls
        .one("d", &[("key_1", "value_1"), ("user", "bob")])
        .await));
    assert!(over(
        &rls.one("d", &[("key_1", "value_1"), ("user", "bob")]).await
    ));
}

#[tokio::test]
async fn shadow_mode_answers_ok_when_over_and_still_counts() {
    let mut rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    for _ in 0..3 {
        let response = rls.ask("d", vec![descriptor(&[("k", "v")])], 0).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert!(ok(&response.statuses[0]));
    }
    let metrics = rls.metrics().await;
    assert!(
        metrics.contains("sluice_rls_shadow_mode_total{domain=\"d\",descriptor=\"d.k\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("sluice_rls_hits_total{domain=\"d\",descriptor=\"d.k\"} 3"));
}

#[tokio::test]
async fn quota_mode_passes_while_some_quota_has_room_and_says_which_are_over() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: backend
    value: a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: backend
    value: b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let both = || {
        vec![
            descriptor(&[("backend", "a")]),
            descriptor(&[("backend", "b")]),
        ]
    };
    let first = rls.ask("d", both(), 0).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let second = rls.ask("d", both(), 0).await;
    assert_eq!(second.overall_code, Code::Ok as i32, "b still has room");
    assert!(ok(&second.statuses[0]));
    let meta = second.dynamic_metadata.unwrap().fields;
    assert_eq!(meta["quotaModeEnabled"].kind, Some(Kind::BoolValue(true)));
    let Some(Kind::ListValue(list)) = &meta["quotaModeViolations"].kind else {
        panic!("violations listed");
    };
    assert_eq!(list.values.len(), 1);
    assert_eq!(list.values[0].kind, Some(Kind::NumberValue(0.0)));
    let third = rls.ask("d", both(), 0).await;
    assert_eq!(
        third.overall_code,
        Code::OverLimit as i32,
        "every quota is spent"
    );
}

#[tokio::test]
async fn metadata_is_sent_while_the_descriptor_is_under_its_limit() {
    let mut rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {backend: primary}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let first = rls.ask("d", vec![descriptor(&[("k", "v")])], 0).await;
    let meta = first.dynamic_metadata.expect("metadata").fields;
    let Some(Kind::StructValue(by_index)) = &meta["descriptorMetadata"].kind else {
        panic!("descriptorMetadata: {meta:?}");
    };
    let Some(Kind::StructValue(zero)) = &by_index.fields["0"].kind else {
        panic!("descriptor 0");
    };
    assert_eq!(
        zero.fields["backend"].kind,
        Some(Kind::StringValue("primary".into()))
    );
    let second = rls.ask("d", vec![descriptor(&[("k", "v")])], 0).await;
    assert!(second.dynamic_metadata.is_none(), "over: no metadata");
}

#[tokio::test]
async fn an_unknown_domain_or_descriptor_is_ok_and_any_over_makes_the_request_over() {
    let mut rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 0}\n",
    )
    .await;
    let unknown = rls.ask("nowhere", vec![descriptor(&[("k", "v")])], 0).await;
    assert_eq!(unknown.overall_code, Code::Ok as i32);
    assert!(unknown.statuses[0].current_limit.is_none());
    let mixed = rls
        .ask(
            "d",
            vec![descriptor(&[("other", "v")]), descriptor(&[("k", "v")])],
            0,
        )
        .await;
    assert_eq!(mixed.overall_code, Code::OverLimit as i32);
    assert!(ok(&mixed.statuses[0]) && over(&mixed.statuses[1]));
}

#[tokio::test]
async fn a_request_without_domain_or_descriptors_is_an_error() {
    let mut rls = start("domain: d\n").await;
    let status = rls
        .client
        .should_rate_limit(RateLimitRequest {
            domain: String::new(),
            descriptors: vec![descriptor(&[("k", "v")])],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = rls
        .client
        .should_rate_limit(RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn response_headers_name_the_tightest_descriptor() {
    let mut rls = start_with(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        true,
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let response = rls
        .ask(
            "d",
            vec![descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
            0,
        )
        .await;
    let headers: Vec<(String, String)> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(
        headers[0],
        ("RateLimit-Policy".into(), "\"rls.d.b\";q=3;w=3600".into())
    );
    assert_eq!(headers[1].0, "RateLimit");
    assert!(
        headers[1].1.starts_with("\"rls.d.b\";r=2;t="),
        "{headers:?}"
    );
}

/// envoyproxy/ratelimit's week, month and year: 604,800 s, 30 days and
/// 365 days, each starting when the Unix time divides by its length.
const EPOCH_UNITS: [(&str, f64); 3] = [
    ("week", 604_800.0),
    ("month", 2_592_000.0),
    ("year", 31_536_000.0),
];

#[tokio::test]
async fn week_month_and_year_reset_when_the_epoch_time_divides_by_their_length() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: week
    rate_limit: {unit: week, requests_per_unit: 1}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 1}
  - key: year
    rate_limit: {unit: YEAR, requests_per_unit: 2}
",
    )
    .await;
    away_from_window_end(86_400.0, 5.0).await;
    for (unit, length) in EPOCH_UNITS {
        let now = utc_secs();
        let status = rls.one("d", &[(unit, "1")]).await;
        assert!(ok(&status), "{unit}");
        let expected = (length - now % length).ceil();
        let reset = status.duration_until_reset.unwrap().seconds as f64;
        assert!(
            (reset - expected).abs() <= 1.0,
            "{unit}: reset in {reset} s, expected {expected}"
        );
    }
    // Fixed windows counted as envoyproxy/ratelimit counts them: over
    // once the count after the hit passes requests_per_unit.
    assert!(over(&rls.one("d", &[("week", "1")]).await));
    assert!(over(&rls.one("d", &[("month", "1")]).await));
    assert!(ok(&rls.one("d", &[("year", "1")]).await));
    let third = rls.one("d", &[("year", "1")]).await;
    assert!(over(&third));
    assert_eq!(third.current_limit.unwrap().unit, Unit::Year as i32);
}

/// The same at known times, on the engine with the table's clock set to
/// UTC: at epoch second `length × k + 1,000` each resets in `length −
/// 1,000` seconds, and a count made there is gone at `length × (k + 1)`.
#[test]
fn at_a_known_time_each_epoch_unit_resets_at_its_next_multiple() {
    use sluice::rls::decide::{Entry as DecideEntry, Request, RequestDescriptor};
    for (unit, length) in EPOCH_UNITS {
        let yaml =
            format!("domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {{unit: {unit}, requests_per_unit: 1}}\n");
        let config = Config::from_texts([("test.yaml", yaml.as_str())]).unwrap();
        // The table's clock is UTC, and moves only forward (a fresh
        // table per unit). An exact value: one named quota, whose counter
        // keeps its time whole (a key's packed time spans ~26 days, kept
        // fresh by the sync thread's sweep, which this test has not).
        let table = Arc::new(Table::new_heap_with(1024, 64, 10_000, 0));
        table.set_utc_offset(0);
        let engine = Engine::new(Arc::clone(&table), config, false, false).unwrap();
        let ask = |secs: i64| {
            let request = Request {
                domain: "d".into(),
                descriptors: vec![RequestDescriptor {
                    entries: vec![DecideEntry {
                        key: "k".into(),
                        value: "v".into(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 1,
            };
            let now = secs as u64 * 1_000_000_000;
            let status = engine.should_rate_limit(&request, now).unwrap().statuses[0].clone();
            // What the sync thread does after each check when counting
            // alone.
            table.books().fold_local(now);
            status
        };
        let length = length as i64;
        let k = 2_000_000_000 / length + 3;
        let first = ask(length * k + 1_000);
        assert!(!first.over, "{unit}");
        assert_eq!(
            first.duration_until_reset,
            Some(length as u64 - 1_000),
            "{unit}"
        );
        let second = ask(length * (k + 1) - 1);
        assert!(second.over, "{unit}: the same window");
        assert_eq!(second.duration_until_reset, Some(1), "{unit}");
        let next = ask(length * (k + 1) + 20);
        assert!(!next.over, "{unit}: a new window");
        assert_eq!(
            next.duration_until_reset,
            Some(length as u64 - 20),
            "{unit}"
        );
    }
}

#[tokio::test]
async fn the_json_endpoint_answers_200_or_429_in_protobuf_json() {
    let rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .await;
    away_from_window_end(HOUR, 5.0).await;
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let url = format!("{}/json", rls.http);
    let (status, text) = http_request(&url, "POST", body).await;
    assert_eq!(status, 200, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "HOUR");
    let (status, text) = http_request(&url, "POST", body).await;
    assert_eq!(status, 429);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["statuses"][0]["code"], "OVER_LIMIT");
    let (status, _) = http_request(&url, "POST", "{not json").await;
    assert_eq!(status, 400);
    let (status, text) = http_request(&format!("{}/healthcheck", rls.http), "GET", "").await;
    assert_eq!((status, text.trim()), (200, "OK"));
}

#[tokio::test]
async fn the_grpc_health_service_says_serving() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let rls = start("domain: d\n").await;
    let channel = Channel::from_shared(rls.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let answer = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

// sluice's own keys (docs/envoy.md, "sluice's own keys").

#[tokio::test]
async fn rate_limits_hold_a_burst_and_a_sustained_limit_on_one_key_the_tighter_answering() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: burst
    rate_limits:
      - {unit: hour, requests_per_unit: 3, name: hourly}
      - {unit: day, requests_per_unit: 5, name: daily}
  - key: sustained
    rate_limits:
      - {unit: hour, requests_per_unit: 5, name: hourly}
      - {unit: day, requests_per_unit: 2, name: daily}
",
    )
    .await;
    away_from_window_end(86_400.0, 5.0).await;
    let name = |s: &DescriptorStatus| s.current_limit.as_ref().unwrap().name.clone();
    for expected_remaining in [2, 1, 0] {
        let status = rls.one("d", &[("burst", "k")]).await;
        assert!(ok(&status));
        assert_eq!(
            (status.limit_remaining, name(&status)),
            (expected_remaining, "hourly".to_string())
        );
    }
    let fourth = rls.one("d", &[("burst", "k")]).await;
    assert!(over(&fourth) && name(&fourth) == "hourly", "{fourth:?}");
    assert!(ok(&rls.one("d", &[("sustained", "k")]).await));
    assert!(ok(&rls.one("d", &[("sustained", "k")]).await));
    let third = rls.one("d", &[("sustained", "k")]).await;
    assert!(over(&third) && name(&third) == "daily", "{third:?}");
}

#[tokio::test]
async fn a_sliding_window_counts_the_last_window_across_its_edge_where_a_fixed_one_resets() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: sliding
    rate_limit: {unit: second, units: 10, requests_per_unit: 2, sliding: true}
  - key: fixed
    rate_limit: {unit: second, units: 10, requests_per_unit: 2}
",
    )
    .await;
    // Two hits in the last part of a 10 s window, then one just after
    // its end: the sliding count is at least 2 x 0.7 + 1 > 2 there. The
    // wait aims 0.2 s past the 6th second: a timer may wake a little
    // before the wall clock says it is due, and 4 s left then reads as
    // 5 whole seconds.
    let into = utc_secs() % 10.0;
    if into < 6.0 {
        tokio::time::sleep(Duration::from_secs_f64(6.2 - into)).await;
    } else if into > 8.0 {
        tokio::time::sleep(Duration::from_secs_f64(16.2 - into)).await;
    }
    let both = || {
        vec![
            descriptor(&[("sliding", "k")]),
            descriptor(&[("fixed", "k")]),
        ]
    };
    for _ in 0..2 {
        let response = rls.ask("d", both(), 0).await;
        assert!(ok(&response.statuses[0]) && ok(&response.statuses[1]));
    }
    let fixed = rls.one("d", &[("fixed", "k")]).await;
    assert!(over(&fixed));
    assert!(fixed.duration_until_reset.unwrap().seconds <= 4);
    let left = 10.0 - utc_secs() % 10.0;
    tokio::time::sleep(Duration::from_secs_f64(left + 0.05)).await;
    let response = rls.ask("d", both(), 0).await;
    assert!(
        over(&response.statuses[0]),
        "sliding: the last window still counts"
    );
    assert!(ok(&response.statuses[1]), "fixed: a new window");
}

#[tokio::test]
async fn a_leaky_limit_refuses_from_its_burst_and_resets_when_empty() {
    let mut rls = start(
        "domain: d
descriptors:
  - key: login
    rate_limit: {unit: second, requests_per_unit: 1, leaky: true, low_burst: 3, high_burst: 3}
",
    )
    .await;
    for _ in 0..3 {
        assert!(ok(&rls.one("d", &[("login", "ann")]).await));
    }
    let fourth = rls.one("d", &[("login", "ann")]).await;
    assert!(over(&fourth));
    let limit = fourth.current_limit.unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Second as i32)
    );
    // Four counted at one a second: empty in about four seconds.
    let reset = fourth.duration_until_reset.unwrap().seconds;
    assert!((3..=5).contains(&reset), "{reset}");
    assert!(ok(&rls.one("d", &[("login", "bob")]).await), "per key");
}
