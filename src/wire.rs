//! The sync protocol's wire types, shared by the root and the limiter.
//!
//! `POST /v1/sync` with a [`SyncRequest`]; the root answers a
//! [`SyncResponse`]. Both travel as JSON (`application/json`) or in a
//! compact binary encoding ([`binary`], `application/x-sluice-sync`),
//! chosen by `Content-Type` (the request's) and `Accept` (the reply's): a
//! root reads and writes both, a limiter sends binary and falls back to
//! JSON for a root that refuses it (415, or 400 from a root that predates
//! it). A limiter talks to every root independently and keeps,
//! per root, the quota cursor and counter version that root gave it.
//!
//! Counters travel as `(level, at)` pairs in the root's clock
//! ([`crate::core::Level`]); the response carries the root's clock so the
//! limiter can keep an offset to it (round-trip corrected) and map `at` into
//! its own time. A window quota's counter is the count of the window holding
//! `at` (and, sliding, the previous window's in `prev`); its deltas name the
//! UTC window they were admitted in.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

pub mod binary;
pub mod held;
pub mod interest;
pub mod sequence;
pub mod tiers;

pub use sequence::{Replay, Sequence};

pub use binary::{BinaryError, BINARY_CONTENT_TYPE, BINARY_VERSION};
pub use interest::Interest;
pub use tiers::{TierReply, TierRequest};

use crate::core::quota::MAX_BURST;
use crate::core::{Quota, ValidationError};

/// Path of the sync endpoint.
pub const SYNC_PATH: &str = "/v1/sync";

/// Content type of a JSON sync body.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// Most entries one sync request may carry: deltas (named and keyed),
/// keyed groups, rejection counts and penalties ([`SyncRequest::entry_count`]); a
/// root answers 400 above it, and the binary decoder stops at it before
/// allocating more.
pub const MAX_DELTAS_PER_SYNC: usize = 1_000_000;

/// Header in which a limiter names itself on its sync requests (the same
/// id as the body's `limiter`), so that a root can count its syncs in
/// flight before reading the body. A root that predates it ignores it.
pub const LIMITER_HEADER: &str = "sluice-limiter";

/// Largest delta one sync may carry for one counter: 2^53, the largest
/// integer a level holds exactly (a limiter sends at least every few
/// seconds, so anything near it is a bug, not traffic).
pub const MAX_DELTA: u64 = MAX_BURST as u64;

/// Longest limiter id, in bytes.
pub const MAX_LIMITER_ID_LEN: usize = 255;

/// Checks a limiter id: 1 to [`MAX_LIMITER_ID_LEN`] printable ASCII bytes
/// (no spaces). The root's sync endpoint refuses anything else.
pub fn validate_limiter_id(id: &str) -> Result<(), ValidationError> {
    if id.is_empty() || id.len() > MAX_LIMITER_ID_LEN {
        return Err(ValidationError::new(
            "limiter",
            format!("must be 1 to {MAX_LIMITER_ID_LEN} bytes long"),
        ));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ValidationError::new(
            "limiter",
            "must be printable ASCII without spaces",
        ));
    }
    Ok(())
}

/// Why a sync request or reply is refused: the offending field as a path
/// (`deltas[3].delta`) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct WireError {
    /// Path of the offending value.
    pub field: String,
    /// What is wrong, for a human.
    pub message: String,
}

impl WireError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

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

/// A counter's name: a quota's id, and for a key of a per-key template the
/// key's hash (0 for the quota's own counter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    /// The quota (for a key: its template).
    pub id: u64,
    /// The key's hash; 0 for a named quota's counter.
    pub key: u64,
}

impl CounterKey {
    /// The counter of the quota `id` itself.
    pub const fn named(id: u64) -> Self {
        Self { id, key: 0 }
    }
}

/// Weight a limiter admitted on one counter since its last send to a root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterDelta {
    /// Quota id (the counter's name).
    pub id: u64,
    /// Admitted weight, in the quota's units.
    pub delta: u64,
    /// For a window quota, the index of the UTC window the weight was
    /// admitted in ([`crate::core::WindowRule::attributed_index`]): a root
    /// counts it there, not in whatever window it arrives in. Absent for
    /// a leaky quota (and from limiters that predate windows: counted in
    /// the root's current window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<i64>,
}

/// Weight a limiter admitted on keys of one per-key template since its
/// last send to a root. Grouped by template so that a key costs about what
/// a named counter does on the wire: `[hash, delta]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyedDeltas {
    /// The template's quota id.
    pub id: u64,
    /// The keys' deltas.
    pub deltas: Vec<KeyDelta>,
    /// For a window template, the window the deltas were admitted in (as
    /// [`CounterDelta::window`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<i64>,
}

/// One key's delta, sent as `[hash, delta]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDelta(
    /// The key's hash ([`crate::core::key::KeyHash`]).
    pub u64,
    /// Admitted weight.
    pub u64,
);

/// Cluster values of keys of one per-key template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyedValues {
    /// The template's quota id.
    pub id: u64,
    /// The keys' values.
    pub values: Vec<KeyValue>,
    /// A sliding window template's keys: the previous window's count of
    /// `values[i]`, for the first `prev.len()` values (the rest 0).
    /// Beside `values` rather than in them: a limiter that predates it
    /// reads a reply with it (JSON ignores an unknown field; the binary
    /// encoding carries it only to a limiter that asks for format 2).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prev: Vec<f64>,
}

impl KeyedValues {
    /// The previous window's count of the `i`-th value (0 when none was
    /// sent).
    pub fn prev_of(&self, i: usize) -> f64 {
        self.prev.get(i).copied().unwrap_or(0.0)
    }
}

/// Keys of one per-key template whose deltas a root made no counter for
/// (see [`SyncResponse::refused`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedKeys {
    /// The template's quota id.
    pub id: u64,
    /// The keys' hashes.
    pub keys: Vec<u64>,
}

impl RefusedKeys {
    /// `keys` (none of them named: `key` is never 0) grouped by template,
    /// in template order.
    pub fn by_template(mut keys: Vec<CounterKey>) -> Vec<RefusedKeys> {
        keys.sort_unstable();
        let mut groups: Vec<RefusedKeys> = Vec::new();
        for k in keys {
            match groups.last_mut() {
                Some(g) if g.id == k.id => g.keys.push(k.key),
                _ => groups.push(RefusedKeys {
                    id: k.id,
                    keys: vec![k.key],
                }),
            }
        }
        groups
    }

    /// The keys of every group, as counters.
    pub fn counters(groups: &[RefusedKeys]) -> impl Iterator<Item = CounterKey> + '_ {
        groups
            .iter()
            .flat_map(|g| g.keys.iter().map(move |&key| CounterKey { id: g.id, key }))
    }
}

/// One key's cluster value, sent as `[hash, level, at]` (`at` in the
/// root's clock, as for [`CounterValue`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyValue(
    /// The key's hash.
    pub u64,
    /// Bucket level at the time.
    pub f64,
    /// Root clock time of the level, nanoseconds.
    pub u64,
);

/// A cluster counter value as a root holds it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CounterValue {
    /// Quota id.
    pub id: u64,
    /// Bucket level at `at` (a window quota: the count of the window
    /// holding `at`).
    pub level: f64,
    /// Root clock time of `level`, nanoseconds.
    pub at: u64,
    /// A sliding window quota's previous window's count (0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prev: f64,
}

/// For `skip_serializing_if`: a zero is left out of the JSON.
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

/// A limiter's sync request to one root.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Changed deltas of keys of per-key templates, by template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyed: Vec<KeyedDeltas>,
    /// Checks this limiter rejected since its last cycle, as `[quota id,
    /// count]` (a per-key quota's under its template, which a root has no
    /// named counter for and so does not show yet). Statistics for the
    /// roots' overview and console only: no decision reads them, so a
    /// root that misses a cycle (down, backing off) only misses its share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<(u64, u64)>,
    /// Weight this limiter gives back, by quota: units it sent in earlier
    /// syncs and returns (a held request whose client left before its
    /// turn, an estimate settled lower; see docs/DESIGN.md, "Counters that
    /// give units back"). A root lowers the counter by them, never below
    /// zero, a window counter only in the window named if it is still the
    /// current one. Sent only to a root whose replies say it takes them
    /// ([`SyncResponse::takes_returns`]): an older root refuses the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub returned: Vec<CounterDelta>,
    /// Weight given back on keys of per-key templates, by template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyed_returned: Vec<KeyedDeltas>,
    /// Overrides and penalties: the limiter's cursors with this root and
    /// the penalties it started (see [`tiers`]); left out when empty, and
    /// sent only to a root whose replies say it takes them
    /// ([`SyncResponse::takes_tiers`]): an older root refuses the field.
    #[serde(default, skip_serializing_if = "TierRequest::is_empty")]
    pub tiers: TierRequest,
    /// The request's place in its limiter's stream to this root, sent only
    /// to a root whose replies say it takes sequences
    /// ([`SyncResponse::takes_sequence`]): an older root refuses the field.
    /// Without it a root applies the request's weight whatever came before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<Sequence>,
    /// Earlier numbered requests of the same incarnation whose exchanges
    /// failed, in increasing order of their numbers, all below the
    /// request's own: applied first, each once (see [`Replay`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replay: Vec<Replay>,
    /// The slots this limiter holds, absolute, as `[quota id, slots]` for
    /// every named in-flight quota of the root's group it knows, in
    /// increasing order of id: the root sets what it counts of this
    /// limiter there to it (at most its allowance) and takes none of the
    /// request's adds and returns of those counters, so a lost reply, a
    /// resend or a restart can neither double nor drop a slot (see
    /// docs/DESIGN.md, "In-flight quotas"). Only in a numbered request,
    /// applied only when its number is new; sent only to a root whose
    /// replies say it takes them ([`SyncResponse::takes_held`]): an older
    /// root refuses the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<(u64, u64)>,
    /// The slots this limiter holds of keys of per-key in-flight quotas,
    /// absolute, by template (each group's `deltas` are `[hash, slots]`,
    /// in increasing order of hash; groups in increasing order of id, no
    /// window): for every such key the request or a part it carries
    /// again has adds or returns of, and for the keys the limiter is told
    /// to report whole (a root found restarted, one silent past the
    /// lease, the other process behind its URL). The root sets what it
    /// counts of this limiter on each key to it, as for [`Self::held`],
    /// and takes none of the request's adds and returns of those keys.
    /// Only in a numbered request, applied only when its number is new;
    /// sent only to a root whose replies say it takes them
    /// ([`SyncResponse::takes_keyed_held`]): an older root refuses the
    /// field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyed_held: Vec<KeyedDeltas>,
    /// The keys this limiter holds of the root's group, or keys to add to
    /// what the root knows it holds (see [`interest`]). Only in a
    /// numbered request; sent only to a root whose replies say it answers
    /// by interest ([`SyncResponse::takes_interest`]): an older root
    /// refuses the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interest: Option<Interest>,
}

impl SyncRequest {
    /// Entries the request carries: deltas, named and keyed, keyed groups
    /// and rejection counts (what [`MAX_DELTAS_PER_SYNC`] bounds). Each
    /// costs a root memory when decoded, so each is counted.
    pub fn entry_count(&self) -> usize {
        self.deltas.len()
            + keyed_entries(&self.keyed)
            + self.rejected.len()
            + self.returned.len()
            + keyed_entries(&self.keyed_returned)
            + self.tiers.penalties.len()
            + self.replay.iter().map(Replay::entry_count).sum::<usize>()
            + self.held.len()
            + keyed_entries(&self.keyed_held)
            + self.interest.as_ref().map_or(0, Interest::entry_count)
    }

    /// Checks a decoded request as a whole, as a root does before applying
    /// any of it: the limiter id, at most [`MAX_DELTAS_PER_SYNC`] entries,
    /// no delta above [`MAX_DELTA`], no key hash 0.
    pub fn check(&self) -> Result<(), WireError> {
        validate_limiter_id(&self.limiter).map_err(|e| WireError::new(e.field, e.message))?;
        let count = self.entry_count();
        if count > MAX_DELTAS_PER_SYNC {
            return Err(too_many_entries(count));
        }
        check_named("deltas", &self.deltas)?;
        check_keyed("keyed", &self.keyed)?;
        check_named("returned", &self.returned)?;
        check_keyed("keyed_returned", &self.keyed_returned)?;
        let mut below = self.sequence.map(|s| s.seq);
        for (i, part) in self.replay.iter().enumerate().rev() {
            // Increasing numbers, all below the request's own: a root
            // takes each number up to the last it applied as applied.
            match below {
                Some(next) if part.seq < next && part.seq > 0 => below = Some(part.seq),
                Some(_) => {
                    return Err(WireError::new(
                        format!("replay[{i}].seq"),
                        "earlier requests go in increasing order, from 1, below the request's own number",
                    ))
                }
                None => {
                    return Err(WireError::new(
                        "replay",
                        "earlier requests go only with a numbered request (sequence)",
                    ))
                }
            }
            check_named(&format!("replay[{i}].deltas"), &part.deltas)?;
            check_keyed(&format!("replay[{i}].keyed"), &part.keyed)?;
            check_named(&format!("replay[{i}].returned"), &part.returned)?;
            check_keyed(&format!("replay[{i}].keyed_returned"), &part.keyed_returned)?;
        }
        if !self.held.is_empty() && self.sequence.is_none() {
            return Err(WireError::new(
                "held",
                "held slots go only with a numbered request (sequence)",
            ));
        }
        held::check_keyed_held(&self.keyed_held, self.sequence.is_some())?;
        if self.interest.is_some() && self.sequence.is_none() {
            return Err(WireError::new(
                "interest",
                "an interest list goes only with a numbered request (sequence)",
            ));
        }
        if let Some(interest) = &self.interest {
            interest.check()?;
        }
        if let Some(i) = (1..self.held.len()).find(|&i| self.held[i - 1].0 >= self.held[i].0) {
            return Err(WireError::new(
                format!("held[{i}]"),
                "held slots go in increasing order of quota id, each once",
            ));
        }
        if let Some(i) = self.held.iter().position(|&(_, n)| n > MAX_DELTA) {
            return Err(WireError::new(
                format!("held[{i}]"),
                format!("{} is larger than {MAX_DELTA}", self.held[i].1),
            ));
        }
        if let Some(s) = self.sequence {
            if s.incarnation == 0 {
                return Err(WireError::new(
                    "sequence.incarnation",
                    "0 names no incarnation",
                ));
            }
            if s.seq == 0 {
                return Err(WireError::new(
                    "sequence.seq",
                    "requests are numbered from 1",
                ));
            }
        }
        self.tiers.check()
    }
}

/// Entries keyed groups take of [`MAX_DELTAS_PER_SYNC`]: one a group and
/// one a key.
pub fn keyed_entries(groups: &[KeyedDeltas]) -> usize {
    groups.len() + groups.iter().map(|k| k.deltas.len()).sum::<usize>()
}

/// Checks a list of named deltas (or returns) called `what`: none above
/// [`MAX_DELTA`].
fn check_named(what: &str, deltas: &[CounterDelta]) -> Result<(), WireError> {
    if let Some(i) = deltas.iter().position(|d| d.delta > MAX_DELTA) {
        return Err(WireError::new(
            format!("{what}[{i}].delta"),
            format!("{} is larger than {MAX_DELTA}", deltas[i].delta),
        ));
    }
    Ok(())
}

/// Checks keys' deltas (or returns) grouped by template, called `what`:
/// no key hash 0, none above [`MAX_DELTA`].
pub(crate) fn check_keyed(what: &str, groups: &[KeyedDeltas]) -> Result<(), WireError> {
    for (g, group) in groups.iter().enumerate() {
        for (i, d) in group.deltas.iter().enumerate() {
            if d.0 == 0 {
                return Err(WireError::new(
                    format!("{what}[{g}].deltas[{i}]"),
                    "key hash 0 names no key",
                ));
            }
            if d.1 > MAX_DELTA {
                return Err(WireError::new(
                    format!("{what}[{g}].deltas[{i}]"),
                    format!("{} is larger than {MAX_DELTA}", d.1),
                ));
            }
        }
    }
    Ok(())
}

impl SyncRequest {
    /// True when the request gives weight back (it must go to a root that
    /// takes returns, in binary request format 2).
    pub fn has_returns(&self) -> bool {
        !self.returned.is_empty() || !self.keyed_returned.is_empty()
    }
}

/// The error of a request over [`MAX_DELTAS_PER_SYNC`] entries (`count`
/// of them, or at least that many when decoding stopped there).
pub(crate) fn too_many_entries(count: usize) -> WireError {
    WireError::new(
        "deltas",
        format!(
            "{count} entries (deltas, keyed groups and rejection counts), at most \
             {MAX_DELTAS_PER_SYNC} per sync"
        ),
    )
}

/// An upper bound on the entries ([`SyncRequest::entry_count`]) a JSON
/// request body can decode to, found without decoding it: every entry
/// is a JSON object or array of its own, so this counts the `{` and `[`
/// outside strings. A root refuses a body whose bound is beyond any
/// request it accepts (see [`check_json_size`]) and reserves memory for
/// the rest by it before decoding.
pub fn json_entries_at_most(body: &[u8]) -> usize {
    let mut open = 0;
    let mut in_string = false;
    let mut escaped = false;
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => open += 1,
                _ => {}
            }
        }
    }
    open
}

/// Refuses a JSON request body that cannot hold at most
/// [`MAX_DELTAS_PER_SYNC`] entries: more objects and arrays than such a
/// request has (its entries, a second one per keyed group, and five of
/// its own). Returns the body's [`json_entries_at_most`].
pub fn check_json_size(body: &[u8]) -> Result<usize, WireError> {
    let open = json_entries_at_most(body);
    if open > 2 * MAX_DELTAS_PER_SYNC + 5 {
        return Err(WireError::new(
            "deltas",
            format!(
                "the body holds {open} JSON objects and arrays, more than a request of at \
                 most {MAX_DELTAS_PER_SYNC} entries (deltas, keyed groups and rejection \
                 counts) can"
            ),
        ));
    }
    Ok(open)
}

/// A root's answer to a [`SyncRequest`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncResponse {
    /// Random id of this root process, new at every start.
    pub root_instance: u64,
    /// Root clock (monotonic nanoseconds) when the reply was built.
    pub root_time: u64,
    /// UTC nanoseconds at `root_time`, by the root's system clock: limiters
    /// place window quotas' boundaries by it, so a fleet agrees with its
    /// roots on windows whatever each host's own clock says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_utc: Option<i64>,
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
    /// Keys of per-key templates changed since the request's version, by
    /// template (paged with `counters`, by the same rule).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyed: Vec<KeyedValues>,
    /// Version to send next time: the newest one, or, when counters were
    /// held back or cut at a page, the version up to which they were sent.
    pub counter_version: u64,
    /// The root takes returns ([`SyncRequest::returned`]): a limiter
    /// gives weight back only to a root that says so (one that predates
    /// returns leaves it out and keeps the weight, erring strict).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takes_returns: bool,
    /// The root takes tiers ([`SyncRequest::tiers`]): a limiter sends its
    /// cursors and the penalties it started only to a root that says so
    /// (one that predates tiers refuses the field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takes_tiers: bool,
    /// The root takes sequences ([`SyncRequest::sequence`]): it applies
    /// the weight of each numbered request of a limiter once, however
    /// often it is sent. A limiter numbers its requests only to a root
    /// that says so (one that predates sequences refuses the field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takes_sequence: bool,
    /// To a numbered request: the highest number of its sync thread the
    /// root has applied, the request's parts included. A limiter takes
    /// every request it still holds unconfirmed up to it as applied (the
    /// root's counts in this reply include them). 0 otherwise.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub applied_through: u64,
    /// The root takes held slots in absolute form ([`SyncRequest::held`]):
    /// a limiter reports them only to a root that says so (one that
    /// predates them refuses the field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takes_held: bool,
    /// The root takes the held slots of keys in absolute form
    /// ([`SyncRequest::keyed_held`]): a limiter reports them only to a
    /// root that says so (one that predates them refuses the field). A
    /// limiter that predates it ignores it in JSON, and the binary
    /// encoding carries it only to one that asks for format 9.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takes_keyed_held: bool,
    /// The root answers by interest: of the keys' counters, it sends only
    /// those the limiter holds (it learns them from the deltas and from
    /// [`SyncRequest::interest`], which a limiter sends only to a root
    /// that says so). A limiter that predates it ignores it in JSON, and
    /// the binary encoding carries it only to one that asks for format 8.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takes_interest: bool,
    /// The root knows nothing of what the limiter holds (it restarted, or
    /// forgot the limiter) and sends it every changed counter until the
    /// limiter sends its whole list ([`interest::Interest::full`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wants_interest: bool,
    /// Overrides after the request's cursor and penalties changed since
    /// its version (see [`tiers`]); left out when empty.
    #[serde(default, skip_serializing_if = "TierReply::is_empty")]
    pub tiers: TierReply,
    /// Keys of the request whose deltas the root made no counter for: the
    /// limiter holds its share of the root's keys (`max_keys_per_limiter`),
    /// or the root holds `max_keys`. Nothing of them was counted there;
    /// the limiter keeps their counts itself (see docs/DESIGN.md, "Keys a
    /// root will not hold"). Left out when empty: a limiter that predates
    /// it ignores it in JSON, and the binary encoding carries it only to
    /// a limiter that asks for format 6.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedKeys>,
}

impl SyncResponse {
    /// Checks a decoded reply, as a limiter does before applying any of
    /// it (a reply is applied whole or not at all): every counter's
    /// numbers finite and non-negative, every quota valid, the quotas in
    /// `(epoch, id)` order.
    pub fn validate(&self) -> Result<(), WireError> {
        let sane = |x: f64| x.is_finite() && x >= 0.0;
        if let Some(i) = self
            .counters
            .iter()
            .position(|c| !(sane(c.level) && sane(c.prev)))
        {
            let c = &self.counters[i];
            return Err(WireError::new(
                format!("counters[{i}]"),
                format!("counter {} has level {} (prev {})", c.id, c.level, c.prev),
            ));
        }
        for (g, group) in self.keyed.iter().enumerate() {
            if group.prev.len() > group.values.len() {
                return Err(WireError::new(
                    format!("keyed[{g}].prev"),
                    format!(
                        "{} previous counts for {} keys",
                        group.prev.len(),
                        group.values.len()
                    ),
                ));
            }
            if let Some(i) = group.values.iter().position(|v| !sane(v.1)) {
                return Err(WireError::new(
                    format!("keyed[{g}].values[{i}]"),
                    format!(
                        "a key of quota {} has level {}",
                        group.id, group.values[i].1
                    ),
                ));
            }
            if let Some(i) = group.prev.iter().position(|&p| !sane(p)) {
                return Err(WireError::new(
                    format!("keyed[{g}].prev[{i}]"),
                    format!(
                        "a key of quota {} has previous count {}",
                        group.id, group.prev[i]
                    ),
                ));
            }
        }
        for (g, group) in self.refused.iter().enumerate() {
            if let Some(i) = group.keys.iter().position(|&k| k == 0) {
                return Err(WireError::new(
                    format!("refused[{g}].keys[{i}]"),
                    "0 is no key hash",
                ));
            }
        }
        if let Some((i, e)) = self
            .quotas
            .iter()
            .enumerate()
            .find_map(|(i, q)| q.validate().err().map(|e| (i, e)))
        {
            let q = &self.quotas[i];
            return Err(WireError::new(
                format!("quotas[{i}].{}", e.field),
                format!("quota {:?}: {}", q.name, e.message),
            ));
        }
        if let Some(i) = self
            .quotas
            .windows(2)
            .position(|w| (w[0].epoch, w[0].id) >= (w[1].epoch, w[1].id))
        {
            return Err(WireError::new(
                format!("quotas[{}]", i + 1),
                "quotas out of (epoch, id) order",
            ));
        }
        self.tiers.validate()
    }
}

/// Header a limiter adds to its sync requests once it has an estimate of
/// its clock offset to the root: `offset=<ns>;rtt=<ns>` ([`ClockReport`]).
/// The root shows it in its overview; nothing depends on it.
///
/// A header and not a field of [`SyncRequest`]: a root that predates it
/// ignores a header, but refuses a body with an unknown field.
pub const CLOCK_HEADER: &str = "sluice-clock";

/// A limiter's estimate of its clock offset to one root, as it reports it
/// in [`CLOCK_HEADER`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockReport {
    /// Root clock minus the limiter's clock, nanoseconds, from the
    /// quickest recent round trip. Both are monotonic clocks, so between
    /// hosts this is mostly the difference of their boot times: what
    /// matters is that it stays steady.
    pub offset: i64,
    /// The round trip the estimate comes from, nanoseconds: the estimate
    /// is off by at most half of it.
    pub round_trip: u64,
}

impl ClockReport {
    /// The header value.
    pub fn header_value(&self) -> String {
        format!("offset={};rtt={}", self.offset, self.round_trip)
    }

    /// Reads a header value; `None` unless both numbers are there and
    /// valid (unknown keys are skipped, for later additions).
    pub fn parse(value: &str) -> Option<Self> {
        let (mut offset, mut round_trip) = (None, None);
        // A header is at most a few dozen bytes; anything longer is not ours.
        if value.len() > 256 {
            return None;
        }
        for part in value.split(';') {
            match part.trim().split_once('=') {
                Some(("offset", v)) => offset = Some(v.parse().ok()?),
                Some(("rtt", v)) => round_trip = Some(v.parse().ok()?),
                _ => {}
            }
        }
        Some(Self {
            offset: offset?,
            round_trip: round_trip?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_report_reads_back_what_it_writes() {
        let report = ClockReport {
            offset: -5_000_000_123,
            round_trip: 420_000,
        };
        assert_eq!(ClockReport::parse(&report.header_value()), Some(report));
        assert_eq!(
            ClockReport::parse("rtt=7; offset=3; later=x"),
            Some(ClockReport {
                offset: 3,
                round_trip: 7
            })
        );
    }

    fn keyed_reply(values: Vec<KeyValue>, prev: Vec<f64>) -> SyncResponse {
        SyncResponse {
            root_instance: 1,
            root_time: 10,
            root_utc: None,
            quotas: Vec::new(),
            quotas_after: QuotaCursor::default(),
            more_quotas: false,
            counters: Vec::new(),
            keyed: vec![KeyedValues {
                id: 4,
                values,
                prev,
            }],
            counter_version: 3,
            ..Default::default()
        }
    }

    #[test]
    fn keys_previous_counts_go_beside_their_values_in_json() {
        let reply = keyed_reply(vec![KeyValue(9, 2.0, 5), KeyValue(8, 1.0, 6)], vec![4.5]);
        let json = serde_json::to_value(&reply).unwrap();
        // The values keep their three-element shape a limiter that
        // predates `prev` reads; `prev` is a field it ignores.
        assert_eq!(
            json["keyed"][0]["values"][0],
            serde_json::json!([9, 2.0, 5])
        );
        assert_eq!(json["keyed"][0]["prev"], serde_json::json!([4.5]));
        let back: SyncResponse = serde_json::from_value(json).unwrap();
        assert_eq!(
            (back.keyed[0].prev_of(0), back.keyed[0].prev_of(1)),
            (4.5, 0.0)
        );
        // Without previous counts the field is left out.
        let plain = serde_json::to_value(keyed_reply(vec![KeyValue(9, 2.0, 5)], vec![])).unwrap();
        assert!(plain["keyed"][0].get("prev").is_none());
    }

    #[test]
    fn a_reply_with_a_bad_key_value_or_previous_count_is_refused_whole() {
        let ok = keyed_reply(vec![KeyValue(9, 2.0, 5)], vec![1.0]);
        assert!(ok.validate().is_ok());
        let e = keyed_reply(vec![KeyValue(9, f64::NAN, 5)], vec![])
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "keyed[0].values[0]");
        let e = keyed_reply(vec![KeyValue(9, 2.0, 5)], vec![-1.0])
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "keyed[0].prev[0]");
        let e = keyed_reply(vec![KeyValue(9, 2.0, 5)], vec![1.0, 2.0])
            .validate()
            .unwrap_err();
        assert_eq!(e.field, "keyed[0].prev");
    }

    #[test]
    fn refused_keys_are_grouped_by_template_checked_and_left_out_of_json_when_none() {
        let key = |id, key| CounterKey { id, key };
        let groups = RefusedKeys::by_template(vec![key(9, 3), key(2, 5), key(9, 1)]);
        assert_eq!(
            groups,
            vec![
                RefusedKeys {
                    id: 2,
                    keys: vec![5]
                },
                RefusedKeys {
                    id: 9,
                    keys: vec![1, 3]
                },
            ]
        );
        let back: Vec<CounterKey> = RefusedKeys::counters(&groups).collect();
        assert_eq!(back, vec![key(2, 5), key(9, 1), key(9, 3)]);
        // A reply that refused nothing reads as before: no field.
        let mut reply = keyed_reply(vec![KeyValue(9, 2.0, 5)], vec![1.0]);
        let json = serde_json::to_value(&reply).unwrap();
        assert!(json.get("refused").is_none(), "{json}");
        reply.refused = groups;
        let json = serde_json::to_string(&reply).unwrap();
        assert_eq!(serde_json::from_str::<SyncResponse>(&json).unwrap(), reply);
        // A key hash of 0 is no key.
        reply.refused[1].keys.push(0);
        assert_eq!(reply.validate().unwrap_err().field, "refused[1].keys[2]");
    }

    #[test]
    fn a_json_body_is_bounded_by_its_objects_and_arrays_outside_strings() {
        let body = br#"{"limiter":"a[{\"[","deltas":[{"id":1,"delta":2}],"rejected":[[1,2]]}"#;
        // The request, the deltas list and its entry, the rejected list
        // and its entry: not the brackets in the limiter's id.
        assert_eq!(json_entries_at_most(body), 5);
        let request: SyncRequest = serde_json::from_slice(body).unwrap();
        assert!(request.entry_count() <= json_entries_at_most(body));
        assert_eq!(check_json_size(body), Ok(5));
        // Two million and seven objects and arrays cannot be a request of a
        // million entries.
        let mut many = b"{\"rejected\":[".to_vec();
        many.extend(b"[],".repeat(2 * MAX_DELTAS_PER_SYNC + 4));
        many.extend(b"[]]}");
        let e = check_json_size(&many).unwrap_err();
        assert_eq!(e.field, "deltas");
        assert!(e.message.contains("2000007 JSON objects and arrays"), "{e}");
    }

    #[test]
    fn a_partial_or_bad_clock_report_is_ignored() {
        for value in ["", "offset=3", "rtt=1", "offset=x;rtt=1", "offset=1;rtt=-1"] {
            assert_eq!(ClockReport::parse(value), None, "{value:?}");
        }
        assert_eq!(ClockReport::parse(&"x".repeat(300)), None);
    }
}
