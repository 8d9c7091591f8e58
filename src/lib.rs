//! sluice: a distributed rate limiter that decides locally.
//!
//! Every host keeps all quotas and counters in one memory region (an nginx
//! shared zone, or a heap region behind the C ABI) and answers "may this
//! request pass?" from it with no network call. A background thread syncs
//! counters with the quota roots; `docs/DESIGN.md` states the semantics
//! this crate implements.
//!
//! # Layout
//!
//! Dependencies run one way, from the bottom of this list up: a module
//! uses only modules listed before it (`clock`, `host` and `wire` are
//! leaves beside `core`). Nothing below `root` knows a root exists except
//! through `wire`, and nothing below the shells (`ffi`, `nginx`, `root`,
//! `sim`) reads a clock or does IO on the request path. Unsafe code lives
//! at the borders (`table`, `clock`, `host`, `ffi`, `nginx`, and one
//! system call in `root`); `core`, `wire`, `sync`, `sim` and `cli` forbid
//! it.
//!
//! - [`core`] — pure, deterministic limiter logic: no IO, no clock reads, no
//!   unsafe (`#![forbid(unsafe_code)]`). Time is always a parameter.
//!   - `core/quota.rs` — the quota model, its constructors and validation
//!     (names, numbers, parent chains, in-flight quotas' rules); its
//!     in-flight tests in `core/in_flight_tests.rs`.
//!   - `core/counter.rs` — a counter as `(level, at)`: leak, add, max-merge;
//!     `Tally` (level, previous window's count, time) and `Counting` (leak
//!     at a limit, or count in windows), the one counter type of the
//!     table, the roots and the simulator.
//!   - `core/window.rs` — window quotas: UTC-aligned windows (`1s` to
//!     `month`), locating a time in its window, window counts that merge
//!     by window, the sliding weight.
//!   - `core/decision.rs` — the pass/reject rule with its probabilistic band,
//!     the check of a quota chain (all pass, then commit), the room a
//!     quota has left (`Retry-After` when waiting can help, rate-limit
//!     headers), partial grants (`grantable`) and pacing waits
//!     (`reserve_wait`).
//!   - `core/snapshot.rs` — a quota as a check reads it
//!     ([`core::QuotaSnapshot`]), what the decision and the estimate take.
//!   - `core/estimate.rs` — the level estimate between syncs and the two
//!     extrapolation modes (constant ratio, adaptive fill rate), and its
//!     window counterpart.
//!   - `core/key.rs` — keys of per-key quotas as keyed hashes under the
//!     fleet's secret (a key is never kept).
//!   - `core/rng.rs` — the cheap thread-local PRNG the decision draws
//!     from, seeded by its caller.
//!   - `core/terms.rs` — a quota's limit in its own terms (`5 /s`,
//!     `1000 / day`, `10 / min sliding`, `15 /s per key`), the one way
//!     the CLI, the console, `sluice top`, nginx's log lines and the
//!     simulator's plots write it.
//!   - `core/tier.rs` — tiers per key: overrides of a per-key template
//!     for one key (numbers, `allow`, `deny`) and their validation,
//!     penalty lengths and penalties (`[quota, key, until]`), as the
//!     root, the wire and the table share them.
//!   - `core/spec/` — quota files (JSON; TOML through the same serde
//!     visitor, feature `toml`) parsed with errors that name the quota,
//!     field and line, and checked as a whole set; `core/object.rs` —
//!     what people write as an object is read as an object only (a JSON
//!     array or number where an object belongs is an error naming it).
//! - [`clock`] — the monotonic clock the shells (C ABI, nginx, sync) read.
//! - [`host`] — what the shells ask the OS about this host: its name (the
//!   default limiter id), random seeds (the decision's per-thread
//!   generator, a root's instance id) and room for a root's open files.
//! - [`wire`] — the sync protocol's request and response types and their
//!   checks (a request as a root accepts it, a reply as a limiter does),
//!   used by both the root and the limiter's sync thread; `wire/binary.rs`
//!   — their compact binary encoding (content type
//!   `application/x-sluice-sync`, next to JSON), its versions, header and
//!   byte-level writer and reader in `wire/binary/codec.rs`;
//!   `wire/tiers.rs` — the
//!   overrides and penalties a sync carries (cursors, pages, versions);
//!   `wire/interest.rs` — the keys a limiter holds, told to a root that
//!   answers by interest; `wire/sequence.rs` — numbered requests and the
//!   earlier ones a request carries again; `wire/held.rs` — the check of
//!   the held slots of keys a limiter reports absolute.
//! - [`table`] — the fixed-capacity quota + counter table in one contiguous
//!   region, shared by threads and processes (atomics, per-slot seqlock,
//!   offsets instead of pointers), in three floors: the region core
//!   (`table/region/`: memory, format, names, index, keys, tiers, locks,
//!   status), the request face on it (`table/gate/`, [`table::Gate`]:
//!   check, charge, settle, acquire and release, wait and grant) and the
//!   sync face beside it (`table/books/`, [`table::Books`]: collect deltas,
//!   merge replies, write quotas, tiers and penalties, adopt a restarted
//!   root's levels); `table/mod.rs` holds [`table::Table`], which hands
//!   out the two faces. Each folder's module doc lists its files.
//! - [`sync`] — the limiter's sync thread: deltas out to every root, counters
//!   (max-merged) and quota changes back; standalone folding when there are
//!   no roots or all are down. `sync/engine.rs` ([`sync::SyncEngine`], the
//!   sync logic without the network, shared with the simulator) composes
//!   the accounting of owed and acknowledged weight, a cycle's requests,
//!   root and group health, restart adoption and early sync, each in a
//!   file of its own; `sync/networked.rs` is the tokio + reqwest loop.
//!   `sync/mod.rs` lists every file.
//! - [`ffi`] — the C ABI (`include/sluice.h`): a process-wide limiter with
//!   `check_by_name(name, weight)`, keyed checks, partial grants
//!   (`sluice_obtain`), pacing (`sluice_reserve`), charges after the fact
//!   and settled estimates (`sluice_charge`, `sluice_settle`) and a wait
//!   for the roots' quota set (`sluice_wait_ready`).
//! - [`nginx`] — the nginx module: pure argument parsing, header values and
//!   Prometheus text (always compiled and tested), and the `ngx` glue
//!   (feature `nginx`); its files are listed in its module doc.
//! - [`root`] — the quota root server: database, sync endpoint, admin API,
//!   overview and web console, metrics, connection admission and timeouts
//!   (`root/connections.rs`), what a request may hold once its token is
//!   checked (`root/api/admission.rs`: body memory, upload pace, slots,
//!   syncs in flight per limiter), tiers (overrides in the database,
//!   `root/store/overrides.rs`, served by `root/api/overrides.rs`; the
//!   overrides and penalties a root holds, `root/tier_book.rs`), who may
//!   sync as which limiter
//!   (`root/credentials.rs`) and how much of a sync it believes
//!   (`root/trust.rs`: level cap, per-limiter allowances, rejection
//!   counts), and the in-flight slots each limiter holds with their lease
//!   (`root/in_flight.rs`, its tests in `root/in_flight_tests.rs`)
//!   (feature `root`).
//! - `rls/` — `sluice rls`, an Envoy rate limit service (RLS v3 over gRPC)
//!   deciding on a table like nginx's, configured with
//!   envoyproxy/ratelimit's YAML (feature `rls`); its files in its module
//!   doc.
//! - `sim/` — the cluster simulator behind `sluice sim`: simulated hosts
//!   each running a real table and sync engine, simulated roots (the root's
//!   own ledger) and network, root groups, per-second CSV, SVG plots and
//!   accuracy numbers (feature `sim`); `benches/capacity/` holds the root
//!   groups capacity scenario.
//! - `main.rs` and `cli/` — the `sluice` binary: `sluice root`, the admin
//!   CLI `sluice quota ...`, `sluice top`, `sluice sim` and `sluice rls`
//!   (feature `root`).
//!
//! Outside `src/`, `tests/fuzz/` holds the coverage-guided fuzz targets
//! (cargo-fuzz, its own crate): quota files, the sync wire, nginx
//! arguments, names and weights, and the table against a model.

#![warn(missing_docs)]

pub mod clock;
pub mod core;
pub mod ffi;
pub mod host;
pub mod nginx;
pub mod sync;
pub mod table;
pub mod wire;

#[cfg(feature = "root")]
pub mod root;

#[cfg(feature = "sim")]
pub mod sim;

#[cfg(feature = "rls")]
pub mod rls;
