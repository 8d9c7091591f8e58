//! The sync protocol's wire types, shared by the root and the limiter.
//!
//! `POST /v1/sync` with a JSON [`SyncRequest`]; the root answers a JSON
//! [`SyncResponse`]. A limiter talks to every root independently and keeps,
//! per root, the quota cursor and counter version that root gave it.
//!
//! Counters travel as `(level, at)` pairs in the root's clock
//! ([`crate::core::Level`]); the response carries the root's clock so the
//! limiter can keep an offset to it (round-trip corrected) and map `at` into
//! its own time.

use serde::{Deserialize, Serialize};

use crate::core::Quota;

/// Path of the sync endpoint.
pub const SYNC_PATH: &str = "/v1/sync";

/// Most deltas one sync request may carry; a root answers 400 above it.
pub const MAX_DELTAS_PER_SYNC: usize = 1_000_000;

/// Position in the root's quota change log: quotas are ordered by
/// `(epoch, id)`, and a limiter asks for everything after its cursor. The id
/// breaks ties because one bulk apply gives many quotas the same epoch, and
/// a page may end in the middle of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QuotaCursor {
    /// Epoch of the last quota received (0: nothing yet).
    pub epoch: u64,
    /// Id of the last quota received at that epoch (0: all of it).
    pub id: u64,
}

/// Weight a limiter admitted on one counter since its last send to a root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterDelta {
    /// Quota id (the counter's name).
    pub id: u64,
    /// Admitted weight, in the quota's units.
    pub delta: u64,
}

/// A cluster counter value as a root holds it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CounterValue {
    /// Quota id.
    pub id: u64,
    /// Bucket level at `at`.
    pub level: f64,
    /// Root clock time of `level`, nanoseconds.
    pub at: u64,
}

/// A limiter's sync request to one root.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    /// Stable id of the limiter (an nginx host, a process using the C ABI).
    pub limiter: String,
    /// Last quota position received from this root.
    #[serde(default)]
    pub quotas_after: QuotaCursor,
    /// Last counter version received from this root (0: send all).
    #[serde(default)]
    pub counter_version: u64,
    /// Root instance the `counter_version` belongs to (0: none yet). A
    /// root that restarted has a new instance and answers as for version 0.
    #[serde(default)]
    pub root_instance: u64,
    /// Changed local deltas; counters with nothing new are left out.
    #[serde(default)]
    pub deltas: Vec<CounterDelta>,
}

/// A root's answer to a [`SyncRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncResponse {
    /// Random id of this root process, new at every start.
    pub root_instance: u64,
    /// Root clock (monotonic nanoseconds) when the reply was built.
    pub root_time: u64,
    /// Quotas after the request's cursor (tombstones included), in
    /// `(epoch, id)` order, at most one page. Within one epoch (a bulk
    /// apply) a quota may come before a parent created in the same epoch,
    /// or in a later page: apply the whole epoch before relying on parents.
    pub quotas: Vec<Quota>,
    /// Cursor after the last quota in `quotas` (the request's own when
    /// nothing changed).
    pub quotas_after: QuotaCursor,
    /// More quota pages follow: sync again without waiting.
    pub more_quotas: bool,
    /// Counters changed since the request's version (all non-empty ones
    /// for version 0 or another instance), after applying its deltas.
    /// Empty while `more_quotas` is set (the limiter may not know their
    /// quotas yet), and at most one page (the root's `sync_page_counters`):
    /// the rest follow in the next syncs.
    pub counters: Vec<CounterValue>,
    /// Version to send next time: the newest one, or, when counters were
    /// held back or cut at a page, the version up to which they were sent.
    pub counter_version: u64,
}
