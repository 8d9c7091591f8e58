//! What a check is given and what it answers: the items of a request,
//! the options, the outcome with its rejection and headroom, and the
//! charge a passed check will count. Shared by the chain reader
//! (`chain.rs`), the check path (`check.rs`), grants and tiers, so none
//! of them imports another for its types.

use crate::core::key::KeyHash;
use crate::core::quota::MAX_DEPTH;
use crate::core::{Nanos, Room, Wait};
use crate::table::region::SlotId;

/// Outcome of a check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// Every quota in the chain passed; the weight was counted.
    Pass,
    /// A quota of the chain rejected; nothing was counted.
    Reject(Rejection),
    /// No quota has this name: the request passes uncounted.
    Unknown,
    /// The quota is per-key and the check had no key (or an empty one):
    /// not checked, not counted.
    NoKey,
    /// The quota is per-key, its key found no entry in a full key section
    /// and the overflow mode is `pass`: not checked, not counted (see
    /// [`crate::table::KeyOverflow`]). Under the other modes an overflow
    /// passes or rejects like any check, with [`ManyOutcome::overflow`]
    /// set.
    KeyOverflow,
}

/// Why a check was rejected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cause {
    /// The quota had no room (its level, the draw in the band, a full key
    /// section).
    #[default]
    Limit,
    /// The quota, or the key, is under a penalty (`wait` says until
    /// when); a rejection that started one says so too.
    Penalty,
    /// An override denies the key.
    Denied,
}

/// Details of a rejection, for status headers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rejection {
    /// Index in the chain of the quota that rejected (0: the named one).
    pub depth: usize,
    /// Slot of the quota that rejected (see [`crate::table::Table::name_into`]).
    pub slot: SlotId,
    /// That quota's limit, units per second.
    pub limit: f64,
    /// When the request could pass, or why waiting cannot help.
    pub wait: Wait,
    /// The key's hash when the quota that rejected is a key's counter of a
    /// per-key template (`slot` is the template's); 0 otherwise.
    pub key: KeyHash,
    /// Why.
    pub cause: Cause,
}

/// Most quotas one [`crate::table::Gate::check_many`] call checks.
pub const MAX_CHECKS: usize = 8;

/// One quota check of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckItem<'a> {
    /// The quota's name.
    pub name: &'a [u8],
    /// The key, for a per-key quota: its counter is the key's own (made on
    /// first use). `None` or an empty key checks a per-key quota not at
    /// all ([`Outcome::NoKey`]); a key given for a plain quota is ignored.
    pub key: Option<&'a [u8]>,
    /// Units counted if the request passes (0: check without counting;
    /// above [`MAX_WEIGHT`](crate::core::quota::MAX_WEIGHT) counts as [`MAX_WEIGHT`](crate::core::quota::MAX_WEIGHT)).
    pub weight: u64,
    /// Pace instead of checking: the item is counted now if the wait
    /// until its quotas have room for it ([`crate::core::reserve_wait`])
    /// is at most this many nanoseconds, and the request then waits that
    /// long ([`ManyOutcome::wait`]); otherwise it is rejected. `None`: a
    /// plain check (the burst band's draw decides).
    pub max_wait: Option<Nanos>,
}

/// How [`crate::table::Gate::check_many`] checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// A rejection is counted as a dry-run rejection (the caller lets the
    /// request through) instead of a rejection. Nothing is counted either
    /// way, as for a real rejection.
    pub dry_run: bool,
    /// Report the [`Headroom`] of the tightest quota (costs one more level
    /// estimate per quota in the chains; for rate-limit headers).
    pub headroom: bool,
}

/// How much room the tightest quota of a request has left, for the
/// `RateLimit` response headers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Headroom {
    /// Index of the item whose chain holds the quota.
    pub item: usize,
    /// Index of the quota in that chain (0: the named quota).
    pub depth: usize,
    /// Slot of the quota (see [`crate::table::Table::name_into`]).
    pub slot: SlotId,
    /// Its room: the estimated level after this request (its weight
    /// included if it passed) against its limit and low burst.
    pub room: Room,
}

/// Outcome of [`crate::table::Gate::check_many`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ManyOutcome {
    /// `Pass` if every known quota passed (and was counted), `Reject` with
    /// the first rejection, `Unknown` if no name had a quota.
    pub outcome: Outcome,
    /// Index of the item that rejected; on a pass that must wait, the
    /// item whose wait is the longest (the first of equals).
    pub item: Option<usize>,
    /// With [`CheckOptions::headroom`]: on a pass the quota with the least
    /// room left, on a rejection the quota that rejected.
    pub headroom: Option<Headroom>,
    /// On a pass, nanoseconds the request must wait before it acts: the
    /// longest wait of its paced items (0 without any).
    pub wait: Nanos,
    /// Some item's key found no entry in a full key section: it was
    /// decided by the overflow mode (see [`crate::table::KeyOverflow`]).
    pub overflow: bool,
}

/// What a passed item of [`super::Gate::check_many`] will count: a chain's
/// slots and the weight.
#[derive(Clone, Copy)]
pub(in crate::table) struct Commit {
    pub(super) slots: [SlotId; MAX_DEPTH],
    pub(super) len: usize,
    pub(super) key: u32,
    pub(super) key_hash: KeyHash,
    pub(super) weight: u64,
}
