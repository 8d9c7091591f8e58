//! The quota root: the fleet's single source of quota truth and the place
//! where counters are summed (`sluice root`).
//!
//! A root loads quotas from a database (SQLite or PostgreSQL) and rereads
//! the changes every interval by epoch; keeps one counter per quota in
//! memory only, in its own monotonic clock; answers limiters' syncs
//! (`POST /v1/sync`, [`crate::wire`]); and serves the admin API, `/healthz`
//! and `/metrics`.
//!
//! # Layout
//!
//! - `config.rs` — [`RootConfig`] from a TOML file and flags.
//! - `auth.rs` — bearer tokens, compared in constant time.
//! - `health.rs` — readiness, database state, rate-limited outage logs.
//! - `ledger.rs` — the in-memory state and the sync step, pure, time passed
//!   in:
//!   - `quota_book.rs` — quotas by id, by `(epoch, id)` and by name;
//!   - `counter_book.rs` — counters with their version-ordered list;
//!   - `limiters.rs` — the limiters that synced.
//! - `store/` — the database: schema migrations (`migrations/`), epochs,
//!   single writes, bulk apply.
//! - `metrics.rs` — event counts and the Prometheus text.

pub mod auth;
pub mod config;
pub mod counter_book;
pub mod health;
pub mod ledger;
pub mod limiters;
pub mod metrics;
pub mod quota_book;
pub mod store;

pub use config::{RootArgs, RootConfig};
