//! The C ABI: one process-wide limiter behind `check_by_name`.
//!
//! `include/sluice.h` is generated from this folder by cbindgen (see
//! `tests/header.rs`); the doc comments of `exports.rs` are the header's.
//! Every export is a panic boundary: a bug inside sluice returns
//! `SLUICE_ERROR` with a message, it never unwinds into C. Every pointer
//! argument may be NULL.
//!
//! # Layout
//!
//! - `exports.rs` — the exported functions;
//! - `in_flight.rs` — the exports of in-flight quotas: a slot acquired
//!   and released;
//! - `codes.rs` — their result codes;
//! - `boundary.rs` — the panic boundary, the last error, and reading
//!   pointer arguments;
//! - `config.rs` — `sluice_init`'s JSON, checked by the rules nginx's
//!   directives follow;
//! - `limiter.rs` — the process-wide limiter: init, readiness,
//!   shutdown, and what each export does;
//! - `status.rs` — the sync state `sluice_sync_metrics_json` reports, in
//!   seconds ago and milliseconds.

mod boundary;
mod codes;
mod config;
mod exports;
mod in_flight;
mod limiter;
mod status;

pub use codes::*;
pub use exports::*;
pub use in_flight::*;
