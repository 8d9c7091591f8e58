//! The sync thread's metrics: what it reports of itself and of each root.
//! The engine fills them, the thread hands them to its owner, and
//! `status.rs` publishes them in the table for every process sharing it.

use serde::Serialize;

use crate::core::Nanos;

/// A snapshot of the sync thread's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SyncMetrics {
    /// Completed cycles.
    pub cycles: u64,
    /// True while no root has answered for two intervals (or there are
    /// roots and none ever answered): limiting is per host.
    pub all_roots_down: bool,
    /// Per-root metrics, in configuration order.
    pub roots: Vec<RootMetrics>,
    /// Root groups none of whose roots answered for two intervals: their
    /// shards are limited per host (empty with one group, where
    /// `all_roots_down` says it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups_down: Vec<u32>,
}

/// Sync metrics of one root.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RootMetrics {
    /// The root's URL.
    pub url: String,
    /// The root's group (shard).
    pub group: u32,
    /// True when the last attempt succeeded.
    pub up: bool,
    /// Local monotonic time of the last success (ns; 0: never).
    pub last_success: Nanos,
    /// Successful syncs.
    pub syncs: u64,
    /// Failed syncs (connection, timeout, HTTP status, malformed reply).
    pub errors: u64,
    /// Last error, for humans.
    pub last_error: String,
    /// Last round trip, nanoseconds.
    pub round_trip: u64,
    /// Clock offset in use: root time minus local time, nanoseconds.
    pub clock_offset: i64,
    /// Request bytes sent.
    pub bytes_sent: u64,
    /// Response bytes received.
    pub bytes_received: u64,
    /// Owed delta entries dropped because the root stayed away too long
    /// (only when `max_owed` distinct counters are owed, none of them
    /// leaked to nothing yet).
    pub dropped_deltas: u64,
    /// Units given back that were not sent because the root does not take
    /// returns (it predates them): it keeps those units, erring strict.
    pub dropped_returns: u64,
    /// Numbered requests whose exchanges failed, now: each goes again
    /// with the next request, and the root applies it once.
    pub unconfirmed: u64,
    /// Times the two oldest unconfirmed requests were carried as one
    /// (past `MOST_UNCONFIRMED`): a root that had applied exactly the
    /// older counts its weight twice.
    pub unconfirmed_merged: u64,
    /// Times a reply came from an instance of the root not seen at its
    /// URL lately (a restart, or the first reply of another process
    /// behind the URL): this host's slots are sent to it again.
    pub restarts: u64,
    /// Times a reply came from an instance seen at the URL lately, after
    /// one of another (two processes behind one URL): not a restart.
    pub switches: u64,
}
