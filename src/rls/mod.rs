//! `sluice rls`: an Envoy rate limit service (RLS v3,
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) that
//! decides on a sluice table, configured with envoyproxy/ratelimit's YAML.
//!
//! # Layout
//!
//! - `yaml.rs` — a YAML document as a plain tree.
//! - `config.rs` — the configuration: files, domains, descriptor trees,
//!   every load error envoyproxy/ratelimit raises.
//! - `quotas.rs` — each limit as a sluice quota: its name, key and way of
//!   counting.

pub mod config;
pub mod quotas;
pub mod yaml;
