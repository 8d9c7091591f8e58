//! `sluice rls`: an Envoy rate limit service (RLS v3,
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) that
//! decides on a sluice table, configured with envoyproxy/ratelimit's YAML.
//!
//! # Layout
//!
//! - `yaml.rs` — a YAML document as a plain tree.
//! - `limit.rs` — one `rate_limit` block as plain data: its unit, numbers
//!   and sluice's extensions.
//! - `quotas.rs` — each limit as a sluice quota: its name, key and way of
//!   counting.
//! - `config.rs` — the configuration: files, domains, descriptor trees
//!   with their limits' quotas, every load error envoyproxy/ratelimit
//!   raises; the quota specs a file gives `sluice quota apply -f`.
//! - `metrics.rs` — decisions by domain, descriptor and code; Prometheus
//!   text.
//! - `decide.rs` — a request answered from the table with
//!   envoyproxy/ratelimit's semantics.
//! - `grpc.rs` — RLS v3 over gRPC (protobuf in and out).
//! - `http.rs` — `/healthcheck`, `POST /json`, `/metrics`.
//! - `state.rs` — what a running server holds and its servers share:
//!   the engine, the sync thread, their Prometheus text.
//! - `server.rs` — the process: flags, table, sync thread, servers,
//!   configuration reloads.

pub mod config;
pub mod decide;
pub mod grpc;
pub mod http;
pub mod limit;
pub mod metrics;
pub mod quotas;
pub mod server;
pub mod state;
pub mod yaml;
