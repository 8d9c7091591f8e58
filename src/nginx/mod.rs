//! The nginx module `ngx_http_sluice_module`.
//!
//! Built as a dynamic module against the nginx tree the Makefile configures
//! (`make module`, cargo feature `nginx`) and loaded with
//!
//! ```nginx
//! load_module modules/ngx_http_sluice_module.so;
//! ```
//!
//! The folder is always compiled: its pure files have no nginx types and
//! `cargo test` covers them; only the glue that talks to nginx through the
//! `ngx` crate is behind the `nginx` feature.
//!
//! Pure:
//!
//! - `args.rs` — directive arguments (sizes, times and `wait=`, flags,
//!   weights and `empty=`, early sync), weights from variables (a value
//!   that is no number is an error, never a free pass), `$sluice_status`
//!   values, and the access handler's answer to a check's outcome.
//! - `zone_size.rs` — the zone's default and largest sizes, and the check
//!   of `sluice_zone`.
//! - `request_counters.rs` — what the access handler counts in the zone
//!   beside the table (weight errors, unpassable rejections, holds).
//! - `unknown_names.rs` — when a check of a name no quota has is logged:
//!   the first time, then once a minute per name, from a fixed table in
//!   the zone.
//! - `charge_args.rs` — `sluice_charge`'s rules: `if=`, its weight from a
//!   variable (empty charges nothing), `$sluice_charge_status`.
//! - `headers.rs` — `Retry-After` (only when waiting can help) and the
//!   `RateLimit` header values.
//! - `rejection_line.rs` — a rejection's log line: the quota, the limit
//!   that applied (a key's override's), and what decided (an override, a
//!   penalty, every in-flight slot held).
//! - `prometheus.rs` — the Prometheus text of a limiter (table totals,
//!   busiest quotas, weight errors, unpassable rejections, sync state per
//!   root).
//!
//! Glue (feature `nginx`):
//!
//! - `module.rs` — what nginx sees: the module context, the directive
//!   table, `init_process` / `exit_process`, the `ngx_module_t` and the
//!   `ngx_modules` export.
//! - `conf.rs` — `http`-level and location configuration and the merge.
//! - `directives.rs` — the directive handlers that fill it.
//! - `zone.rs` — the shared memory zone holding the table and the request
//!   counters: creation, reuse across reloads, adoption on a size change,
//!   quota files.
//! - `handler.rs` — the access-phase check: the checks' arguments, the
//!   decision, what outlives the access phase.
//! - `answer.rs` — the answer to a decided check: log lines, request
//!   counts, `RateLimit` headers, the status or the hold.
//! - `request_state.rs` — the main request's state in its pool, `wait=`
//!   holds (an nginx timer per held request) and `$sluice_status`.
//! - `charge.rs` — `sluice_charge`: the log-phase handler that charges
//!   (and settles) after the response, once per main request, and
//!   `$sluice_charge_status`.
//! - `held_item.rs` — a check kept past the access phase (a hold's, a
//!   slot's), to give its weight back from.
//! - `in_flight.rs` — in-flight quotas: the slots a request took, given
//!   back by a log-phase handler when it ends.
//! - `metrics.rs` — the `sluice_metrics` content handler.
//! - `worker.rs` — the one sync thread per nginx (worker 0) and its log.
//! - `util.rs` — strings, directive arguments, panic boundaries, logging.

pub mod args;
pub mod charge_args;
pub mod headers;
pub mod prometheus;
pub mod rejection_line;
pub mod request_counters;
pub mod unknown_names;
pub mod zone_size;

#[cfg(feature = "nginx")]
mod answer;
#[cfg(feature = "nginx")]
mod charge;
#[cfg(feature = "nginx")]
mod conf;
#[cfg(feature = "nginx")]
mod directives;
#[cfg(feature = "nginx")]
mod handler;
#[cfg(feature = "nginx")]
mod held_item;
#[cfg(feature = "nginx")]
mod in_flight;
#[cfg(feature = "nginx")]
mod metrics;
#[cfg(feature = "nginx")]
mod module;
#[cfg(feature = "nginx")]
mod request_state;
#[cfg(feature = "nginx")]
mod util;
#[cfg(feature = "nginx")]
mod worker;
#[cfg(feature = "nginx")]
mod zone;

#[cfg(feature = "nginx")]
use module::Module;
