//! The limiter's sync thread: local deltas out to every root, cluster
//! counters and quota changes back into the table.
//!
//! One thread per table owner (the C ABI's limiter, one nginx worker). It
//! touches the request path only through the table's atomics. Each cycle
//! (every interval, plus up to 10% random jitter so hosts do not sync in
//! lockstep):
//!
//! 1. collect the changed local deltas (pending → unacked, atomically:
//!    unacked is weight sent to the roots that no reply acknowledged yet);
//! 2. send every root that is neither backing off nor still busy with an
//!    earlier exchange what it is owed, all at once, each request with a
//!    timeout below the interval;
//! 3. take each reply in as it arrives: quotas by epoch, counters by max
//!    (in local time, through the root's clock offset); the first reply
//!    that includes a delta takes it off the unacked weight;
//! 4. roots that failed keep what they are owed (bounded, leaking at the
//!    quota's limit) and are retried with capped backoff, or every cycle
//!    while no root is up. The next cycle starts on time whatever is still
//!    under way: a slow root delays nobody.
//!
//! With no roots configured, or when every root has been unreachable for
//! two intervals, the thread folds local weight into the levels itself:
//! limiting goes on with local counts only, per host, and the log says so
//! once a minute.
//!
//! # Root groups (shards)
//!
//! One group of masterless roots adds every host's deltas for every
//! counter; past what one group can add, the counter space is split into
//! shards, each served by its own group (`sluice_root <url> group=<n>`,
//! [`SyncConfig::root_groups`]). The design:
//!
//! - **Shard of a counter**: [`shard`], a stable hash of the quota id
//!   (named counters) or of the quota id and key hash (keys of per-key
//!   quotas, so one template's keys spread over every group), modulo the
//!   number of groups. Every host of a fleet configured with the same
//!   number of groups routes a counter to the same group; the key hash is
//!   the fleet's keyed hash, the same on every host.
//! - **Quotas**: every root reads every quota from the same database, so
//!   every group knows every quota and its epochs are the database's. A
//!   limiter takes quota changes from one group only: the lowest group with
//!   a root up (group 0 while it answers). Roots of the other groups are
//!   asked with a cursor past every epoch ([`link::NO_QUOTAS`]) and send
//!   none; their links keep the furthest cursor any group gave, so the
//!   next group in line takes over from there if the first goes down.
//! - **Deltas and counters**: each cycle's deltas are owed only to the
//!   roots of their shard, and the first of those roots to answer
//!   acknowledges them; replies are merged as before (a root only ever
//!   reports counters of its shard). "Unchanged" (a counter a complete
//!   reply leaves out) is vouched per group: only a reply of the counter's
//!   own group says so.
//! - **A group down**: when no root of a group answered for two
//!   intervals, the unacked weight of that group's shard is folded into
//!   the local levels each cycle (per host, fail-open, as with every root
//!   down) while the other shards stay fleet-wide; what the group is owed
//!   still leaks and is resent when it is back. Once it has been silent
//!   for the in-flight lease, that shard's in-flight counters count this
//!   host's own slots only, as with every root down. Every group down is
//!   the old all-roots-down case.
//! - **One group** (no `group=`, or all 0): every counter's shard is 0,
//!   and nothing differs from a limiter without groups.
//! - **Reshaping** (a group added: config change, then reload or restart):
//!   the new sync thread starts with the new number of groups, so most
//!   counters move to another shard. The old thread's unacknowledged
//!   weight is handed back to pending when it stops
//!   ([`engine::SyncEngine::abandon`]) and goes out with the first cycle of
//!   the new one, to the counter's new group; what the old thread still
//!   owed the old group is dropped with it (that group already has the
//!   weight from its first answer, or will get it from the others: it
//!   leaks away there). The new group knows nothing of a moved counter at
//!   first: each host's first cycle gives it that host's delta only, and
//!   the fleet-wide level builds up as every host sends its deltas (within
//!   an interval); meanwhile hosts keep the level they had (max-merge
//!   never lowers it) and it leaks at the limit. So counters converge
//!   within two intervals of the last host's reload.
//!
//! # Layout
//!
//! - `thread.rs` — [`SyncHandle`]: starts the sync thread for a table,
//!   picks its loop, stops it.
//! - `networked.rs` — the loop with roots: a tokio runtime and an HTTP
//!   client driving the engine (feature `sync`).
//! - `standalone.rs` — the loop without roots: local folding only.
//! - `shared.rs` — what the thread and its owner share: stop flag,
//!   wake-ups, latest metrics.
//! - `engine.rs` — [`SyncEngine`], the sync logic without the network,
//!   driven by both the networked loop and the simulator, composing the
//!   parts below; its tests beside it: `engine_tests.rs` (replies built
//!   by hand), and through real root ledgers `return_tests.rs` (weight
//!   given back), `in_flight_tests.rs` (slot quotas: the lease,
//!   restarts, a sync thread started anew), `exact_tests.rs` (lost
//!   replies, copies and late copies counted once), `key_share_tests.rs`
//!   (keys a root refused to hold keep their count) and `clock_tests.rs`
//!   (the monotonic clock stepped back or forward).
//! - `accounting.rs` — what each root is owed, and what a reply
//!   acknowledges of the weight sent.
//! - `request.rs` — a cycle's request to each root ([`Outgoing`]), numbered
//!   with the unconfirmed earlier ones it carries again, and the
//!   pages that answer it ([`Page`]).
//! - `takeover.rs` — numbered requests outliving their thread: the
//!   handover record a thread leaves in the region before each
//!   exchange, which a thread taking over after it died continues from,
//!   and the retired record of a thread that stopped with requests
//!   unconfirmed, which the next thread sends again under its numbers;
//!   `handover.rs` — the records' encoding.
//! - `restart.rs` — a root found restarted: what it is sent again, when
//!   its new instance's levels are adopted, what a later thread resumes.
//! - `health.rs` — root and group health: down after two silent
//!   intervals (per-host limiting for their shards), the in-flight lease.
//! - `early.rs` — when a cycle starts before its interval is up.
//! - `vouch.rs` — what a complete reply vouches for: the recently changed
//!   counters no root reported stood still.
//! - `link.rs` — what a limiter knows of one root: cursor, versions,
//!   clock offset, what it is owed, health.
//! - `owed.rs` — [`link::Owed`]: the weight a root has not received
//!   yet, per counter, leaked as the root would have leaked it.
//! - `interest.rs` — the keys a limiter tells a root that answers by
//!   interest it holds: the whole list when asked and every 30 s, new
//!   keys in between.
//! - `key_report.rs` — the held slots of keys reported absolute to a
//!   root that takes them: those a request moves, and every key held
//!   when the root may lack them.
//! - `status.rs` — the metrics published in the table's status block for
//!   every process, and what a later sync thread should know of each root.
//! - `config.rs` — [`SyncConfig`] and the rules every front end checks it
//!   by.
//! - `schedule.rs` — when the thread wakes (window boundaries, spread per
//!   host), its clock, the key sweep's share per run.
//! - `clock_watch.rs` — a thread that says when the monotonic clock went
//!   back, so that the networked loop starts over on it.
//! - `pressure.rs` — [`KeyPressure`]: the key section's pressure, said
//!   once an interval.
//! - `metrics.rs` — [`SyncMetrics`] and [`RootMetrics`].
//! - `routing.rs` — [`shard`]: the root group of a counter.
//! - `log.rs` — [`LogLevel`] and the log line the engine hands back.
//! - `ids.rs` — hash maps keyed by quota id (a multiply, not SipHash).

#![forbid(unsafe_code)]

mod accounting;
#[cfg(feature = "sync")]
mod clock_watch;
pub mod config;
mod early;
pub mod engine;
mod handover;
mod health;
pub mod ids;
pub mod interest;
mod key_report;
pub mod link;
mod log;
mod metrics;
#[cfg(feature = "sync")]
mod networked;
mod owed;
mod pressure;
mod request;
mod restart;
mod routing;
mod schedule;
mod shared;
mod standalone;
pub mod status;
mod takeover;
mod thread;
mod vouch;

pub use config::{default_limiter_id, EarlySync, LogSink, SyncConfig};
pub use engine::SyncEngine;
pub use log::LogLevel;
pub use metrics::{RootMetrics, SyncMetrics};
#[cfg(feature = "sync")]
pub use networked::ENCODING_ENV;
pub use pressure::KeyPressure;
pub use request::{next_page, Outgoing, Page};
pub use routing::shard;
pub use schedule::{key_sweep_budget, local_now, window_spread, window_wake};
pub use thread::SyncHandle;
