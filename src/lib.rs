//! sluice: a distributed rate limiter that decides locally.
//!
//! Every host keeps all quotas and counters in one memory region (an nginx
//! shared zone, or a heap region behind the C ABI) and answers "may this
//! request pass?" from it with no network call. A background thread syncs
//! counters with the quota roots; `../shared/DESIGN.md` in the project states
//! the semantics this crate implements.
//!
//! # Layout
//!
//! - [`core`] — pure, deterministic limiter logic: no IO, no clock reads, no
//!   unsafe. Time is always a parameter.
//!   - `core/quota.rs` — the quota model and its validation (names, numbers,
//!     parent chains).
//!   - `core/counter.rs` — a counter as `(level, at)`: leak, add, max-merge.
//!   - `core/decision.rs` — the pass/reject rule with its probabilistic band,
//!     and the check of a quota chain (all pass, then commit).
//!   - `core/estimate.rs` — the level estimate between syncs and the two
//!     extrapolation modes (constant ratio, adaptive fill rate).
//!   - `core/rng.rs` — the cheap thread-local PRNG the decision draws from.
//!   - `core/spec.rs` — quota files (JSON) parsed and checked as a whole set.
//! - [`table`] — the fixed-capacity quota + counter table in one contiguous
//!   region, shared by threads and processes (atomics, per-slot seqlock,
//!   offsets instead of pointers).
//!   - `table/layout.rs` — the region's header, slot and index formats.
//!   - `table/names.rs` — the name hash and the name arena.
//!   - `table/mod.rs` — lookup, check, upsert/delete by epoch, delta
//!     collection and counter merge, adopting another table.
//!   - `table/file.rs` — quota files applied to a table, as the whole set
//!     (standalone) or as seeds until a root answers.
//! - [`sync`] — the limiter's sync thread: deltas out to every root, counters
//!   (max-merged) and quota changes back; standalone folding when there are
//!   no roots or all are down.
//!   - `sync/engine.rs` — the sync logic without the network, shared with
//!     the simulator: what each root is owed, acknowledgements, merging
//!     replies, unchanged counters, all-roots-down folding, early sync.
//!   - `sync/link.rs` — per-root state: cursor, versions, clock offset, owed
//!     deltas (leaking while owed), backoff, metrics.
//!   - `sync/ids.rs` — hash maps keyed by quota id (a multiply, not SipHash).
//!   - `sync/networked.rs` — the tokio + reqwest loop (feature `sync`).
//! - [`ffi`] — the C ABI (`include/sluice.h`): a process-wide limiter with
//!   `check_by_name(name, weight)`.
//! - [`wire`] — the sync protocol's request and response types, used by both
//!   the root and the limiter's sync thread.
//! - [`metrics`] — Prometheus text for a limiter (table totals, busiest
//!   quotas, sync state per root).
//! - [`clock`] — the monotonic clock the shells (C ABI, nginx) read.
//! - `sim` — the cluster simulator behind `sluice sim`: simulated hosts
//!   each running a real table and sync engine, simulated roots and
//!   network, per-second CSV, SVG plots and accuracy numbers (cargo feature
//!   `sim`).
//! - `nginx/` — the nginx module (cargo feature `nginx`): directives and
//!   configuration (`conf.rs`), the shared zone (`zone.rs`), the
//!   access-phase check and `$sluice_status` (`handler.rs`), the metrics
//!   location (`metrics.rs`), the sync thread in worker 0 (`worker.rs`).
//! - [`directive`] — the module's pure parts, tested without nginx:
//!   directive arguments, request weights, rate-limit header values.
//! - [`root`] — the quota root server: database, sync endpoint, admin API,
//!   metrics (cargo feature `root`).
//! - `main.rs` and `cli/` — the `sluice` binary: `sluice root`, the admin
//!   CLI `sluice quota ...` and `sluice sim` (cargo feature `root`).

#![warn(missing_docs)]

pub mod clock;
pub mod core;
pub mod directive;
pub mod ffi;
pub mod metrics;
pub mod sync;
pub mod table;
pub mod wire;

#[cfg(feature = "root")]
pub mod root;

#[cfg(feature = "sim")]
pub mod sim;

#[cfg(feature = "nginx")]
mod nginx;
