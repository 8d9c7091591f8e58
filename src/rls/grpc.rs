//! RLS v3 over gRPC: `ShouldRateLimit` requests turned into the engine's
//! and its answers back into protobuf.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ResponseUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{self as pbuf, value::Kind};

use super::decide::{Engine, Entry, Request, RequestDescriptor, Response};
use super::limit::Unit;

/// The unit of a request-supplied limit (`envoy.type.v3.RateLimitUnit`,
/// which has no week; `UNKNOWN`: not a limit).
fn unit_of(unit: i32) -> Option<Unit> {
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
        RateLimitUnit::Unknown => return None,
    })
}

fn response_unit(unit: Unit) -> ResponseUnit {
    match unit {
        Unit::Second => ResponseUnit::Second,
        Unit::Minute => ResponseUnit::Minute,
        Unit::Hour => ResponseUnit::Hour,
        Unit::Day => ResponseUnit::Day,
        Unit::Week => ResponseUnit::Week,
        Unit::Month => ResponseUnit::Month,
        Unit::Year => ResponseUnit::Year,
    }
}

/// A protobuf request as the engine's.
pub fn request_of(request: &RateLimitRequest) -> Request {
    Request {
        domain: request.domain.clone(),
        descriptors: request.descriptors.iter().map(descriptor_of).collect(),
        hits_addend: request.hits_addend,
    }
}

fn descriptor_of(d: &RateLimitDescriptor) -> RequestDescriptor {
    RequestDescriptor {
        entries: d
            .entries
            .iter()
            .map(|e| Entry {
                key: e.key.clone(),
                value: e.value.clone(),
            })
            .collect(),
        limit: d
            .limit
            .and_then(|l| Some((l.requests_per_unit, unit_of(l.unit)?))),
        hits_addend: d.hits_addend.map(|h| h.value),
    }
}

/// The engine's answer as protobuf.
pub fn response_of(response: Response) -> RateLimitResponse {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    RateLimitResponse {
        overall_code: code(response.over),
        statuses: response
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.over),
                current_limit: s.current_limit.map(|l| RateLimit {
                    name: l.name,
                    requests_per_unit: l.requests_per_unit,
                    unit: response_unit(l.unit) as i32,
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(|secs| pbuf::Duration {
                    seconds: i64::try_from(secs).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                quota: None,
            })
            .collect(),
        response_headers_to_add: response
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key,
                value,
                raw_value: Vec::new(),
            })
            .collect(),
        dynamic_metadata: response.metadata.map(struct_of),
        ..Default::default()
    }
}

fn struct_of(map: serde_json::Map<String, serde_json::Value>) -> pbuf::Struct {
    pbuf::Struct {
        fields: map.into_iter().map(|(k, v)| (k, value_of(v))).collect(),
    }
}

fn value_of(value: serde_json::Value) -> pbuf::Value {
    use serde_json::Value as J;
    let kind = match value {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s),
        J::Array(items) => Kind::ListValue(pbuf::ListValue {
            values: items.into_iter().map(value_of).collect(),
        }),
        J::Object(map) => Kind::StructValue(struct_of(map)),
    };
    pbuf::Value { kind: Some(kind) }
}

/// The gRPC service over an engine.
pub struct Service {
    /// The engine.
    pub engine: Arc<Engine>,
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request_of(request.get_ref());
        match self.engine.should_rate_limit(&request, crate::clock::now()) {
            Ok(response) => Ok(tonic::Response::new(response_of(response))),
            Err(error) => Err(tonic::Status::invalid_argument(error.to_string())),
        }
    }
}
