//! The quota root: the fleet's single source of quota truth and the place
//! where counters are summed (`sluice root`).
//!
//! A root loads quotas from a database (SQLite or PostgreSQL) and rereads
//! the changes every interval by epoch; keeps one counter per quota in
//! memory only, in its own monotonic clock; answers limiters' syncs
//! (`POST /v1/sync`, [`crate::wire`]); and serves the admin API, a web
//! console, `/healthz` and `/metrics`. Several roots may share one database; they never talk to
//! each other. If the database goes away, or stops being the one it loaded,
//! a root keeps serving what it has, read-only, and recovers by itself
//! when it is back.
//!
//! # Layout
//!
//! - `server.rs` — [`run`]: bind, serve, reload task, graceful shutdown.
//! - `shutdown.rs` — the signal background tasks stop on.
//! - `listener.rs` — the accept loop and each connection's HTTP/1.1
//!   server.
//! - `connections.rs` — which connections are kept: admission, shedding,
//!   trust, header/idle/send timeouts.
//! - `config.rs` — [`RootConfig`] from a TOML file and flags.
//! - `auth.rs` — bearer tokens, compared in constant time.
//! - `credentials.rs` — who may sync as which limiter: the shared sync
//!   token and per-limiter tokens (`limiter_tokens_file`), reloaded when
//!   the file changes.
//! - `state.rs` — what handlers and tasks share; reload and write rules.
//! - `reload.rs` — the periodic reload from the database.
//! - `health.rs` — readiness, database state, rate-limited outage logs.
//! - `in_flight.rs` — the slots each limiter holds of the in-flight counters
//!   and their lease (docs/DESIGN.md, "In-flight quotas"); its tests
//!   through the ledger in `in_flight_tests.rs`.
//! - `ledger/` — the in-memory state and the sync step, pure, time passed
//!   in:
//!   - `quota_book.rs` — quotas by id, by `(epoch, id)` and by name;
//!   - `counter_book/` — counters with their version-ordered list
//!     (`versions.rs`), their rules: caps, allowances, fill meter
//!     (`rules.rs`), the lifecycle of key counters (`keys.rs`), and the
//!     rejection rates of per-key quotas, which have no counter of their
//!     own (`templates.rs`);
//!   - `counter_shards.rs` — the counter books in shards, each under its
//!     own lock, sharing one version clock: syncs from different limiters
//!     add in parallel, "changed since" stays exact;
//!   - `interest.rs` — the keys each limiter holds, per shard, bounded:
//!     a reply carries only those keys' counters (and every named one);
//!   - `limiters.rs` — the limiters that synced, the ones heard from
//!     last (bounded, idle ones forgotten);
//!   - `tier_book.rs` — overrides by key and by `(epoch, id)`, and the
//!     penalties limiters started (max-registers with versions);
//!   - `trust.rs` — the level cap, per-limiter allowances and plausible
//!     rejection counts: how much of a limiter's sync a root believes.
//! - `store/` — the database: schema migrations (`migrations/`), epochs,
//!   single writes (put, patch, delete), bulk apply, and the watch on the
//!   database (`watch.rs`: deleted, replaced, behind, read-only).
//! - `api/` — the HTTP handlers and error replies, what a request may
//!   hold once its token is checked (`api/admission.rs`: body memory,
//!   upload pace, slots, syncs per limiter), the overview and the web
//!   console (`/ui`, its files in `ui/`).
//! - `metrics.rs` — event counts and the Prometheus text.

pub mod api;
pub mod auth;
pub mod config;
pub mod connections;
pub mod counter_book;
pub mod counter_shards;
pub mod credentials;
pub mod health;
pub mod in_flight;
#[cfg(test)]
mod in_flight_tests;
pub mod interest;
pub mod ledger;
pub mod limiters;
pub mod listener;
pub mod metrics;
pub mod quota_book;
pub mod reload;
pub mod server;
pub mod shutdown;
pub mod state;
pub mod store;
pub mod tier_book;
pub mod trust;

pub use config::{RootArgs, RootConfig};
pub use server::{bind_and_run, run, RootError};
