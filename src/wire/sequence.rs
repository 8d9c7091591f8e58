//! Numbered requests (docs/DESIGN.md, "Exactly once"): where a request
//! stands in its limiter's stream of requests to one root, and the
//! earlier requests a later one carries again.

use serde::{Deserialize, Serialize};

use super::{keyed_entries, CounterDelta, KeyedDeltas};

/// Where a request stands in its limiter's stream of requests to one root
/// process: the limiter's incarnation (a random id each sync thread
/// draws when it starts) and the request's number in it. A root that
/// takes sequences (`SyncResponse::takes_sequence`) applies the weight
/// of each `(incarnation, seq)` once: a request it already applied (its
/// reply was lost, and the limiter sent it again) is answered without its
/// weight counted a second time (docs/DESIGN.md, "Exactly once").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sequence {
    /// The sending sync thread's random id (never 0).
    pub incarnation: u64,
    /// The request's number from that thread to this root, from 1 up; a
    /// request sent again keeps its number.
    pub seq: u64,
}

/// The weight of an earlier numbered request, carried again inside a
/// later one: that request's exchange failed, so the root may have
/// applied it (its reply lost) or not. A root applies the parts of a
/// request in order, each only if it has not applied its number yet, then
/// the request's own weight under `SyncRequest::sequence`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    /// The earlier request's number (same incarnation as the request's).
    pub seq: u64,
    /// Its named deltas, leaked to the time they go again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<CounterDelta>,
    /// Its keys' deltas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyed: Vec<KeyedDeltas>,
    /// Its named returns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub returned: Vec<CounterDelta>,
    /// Its keys' returns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyed_returned: Vec<KeyedDeltas>,
}

impl Replay {
    /// Entries it takes of `MAX_DELTAS_PER_SYNC`: one for the part,
    /// and its deltas and returns as a request's count.
    pub fn entry_count(&self) -> usize {
        1 + self.deltas.len()
            + keyed_entries(&self.keyed)
            + self.returned.len()
            + keyed_entries(&self.keyed_returned)
    }
}
