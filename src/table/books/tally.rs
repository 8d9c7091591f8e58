//! A counter's numbers as the sync side reads and writes them: a slot's
//! tally (level, time, fill rate) and source, what is pending and
//! unacknowledged and how a delta moves between them, folding weight in,
//! measuring the other hosts' fill rate, and the delta a collection
//! hands the sync thread ([`CollectedDelta`]).

use crate::core::estimate::{measure_fill_rate, measure_window_fill_rate, Acked};
use crate::core::key::KeyHash;
use crate::core::window::WindowLevel;
use crate::core::{Counting, Nanos, Tally};
use crate::table::region::layout::{
    pack_rate_prev, unpack_rate_prev, Slot, FLAG_IN_FLIGHT, FLAG_SLIDING,
};
use crate::table::region::layout::{Source, FOLDED};
use crate::table::region::lock::SeqWrite;
use crate::table::region::{SlotId, ACQ, RLX};
use std::sync::atomic::AtomicU64;

/// A collected local delta, ready to send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectedDelta {
    /// Where the counter lives.
    pub slot: SlotId,
    /// Its quota id.
    pub id: u64,
    /// For a key of a per-key template (`slot` and `id` are the
    /// template's), the key's hash; 0 for a quota's own counter.
    pub key: KeyHash,
    /// Weight moved from `pending` to `unacked`: admitted here since the
    /// last collection, net of what was given back meanwhile.
    pub delta: u64,
    /// Weight given back (a negative net change: more given back than
    /// admitted since the last collection), moved out of `unacked` the
    /// same way; at most one of `delta` and `returned` is not 0.
    pub returned: u64,
}

impl CollectedDelta {
    /// The delta of a counter whose `net` change (signed) was collected.
    pub fn of(slot: SlotId, id: u64, key: KeyHash, net: i64) -> Self {
        Self {
            slot,
            id,
            key,
            delta: net.max(0) as u64,
            returned: net.min(0).unsigned_abs(),
        }
    }
}

/// A counter word's signed value.
pub(in crate::table) fn signed(word: &AtomicU64) -> i64 {
    word.load(ACQ) as i64
}

/// Moves `net` of a counter's unsent weight from `pending` to `unacked`:
/// an add reaches unacked before it leaves pending (a check in between
/// sees it twice), a return leaves pending before it reaches unacked (a
/// check in between does not see it yet). Wrapping arithmetic on the
/// two's complement words.
pub(in crate::table) fn send_pending(pending: &AtomicU64, unacked: &AtomicU64, net: i64) {
    if net > 0 {
        unacked.fetch_add(net as u64, RLX);
        pending.fetch_sub(net as u64, RLX);
    } else {
        pending.fetch_sub(net as u64, RLX);
        unacked.fetch_add(net as u64, RLX);
    }
}

/// Takes `acked` (signed) off a counter's unacked around `store`, which
/// writes the cluster value that includes it: an add leaves after the
/// store, a return before it, so a check in between errs strict. A take
/// of the same sign as what is unacked stops at zero (a stale
/// acknowledgement cannot turn in-flight weight around); of the other
/// sign, both an add and a return are unacked, and it is exact.
pub(in crate::table) fn settle_unacked(unacked: &AtomicU64, acked: i64, store: impl FnOnce()) {
    let now = unacked.load(RLX) as i64;
    let take = if acked > 0 && now >= 0 {
        acked.min(now)
    } else if acked < 0 && now <= 0 {
        acked.max(now)
    } else {
        acked
    };
    if take < 0 {
        unacked.fetch_sub(take as u64, RLX);
        store();
    } else {
        store();
        unacked.fetch_sub(take as u64, RLX);
    }
}

/// A counter's tally with `weight` (signed) folded in at `now`: added, or
/// given back.
pub(in crate::table) fn fold_weight(
    counting: &Counting,
    known: Tally,
    weight: i64,
    now: Nanos,
) -> Tally {
    let window = attributed(counting, now);
    if weight >= 0 {
        counting
            .add_in(known, window, now, weight as f64)
            .unwrap_or(known)
    } else {
        counting.give_back_in(known, window, now, weight.unsigned_abs() as f64)
    }
}

/// Hands `amount` (signed) of in-flight weight back to pending, to be sent
/// again: an add reaches pending first, a return leaves unacked first
/// (a check in between errs strict). Stops at zero when `amount` has the
/// sign of what is unacked. Returns what moved.
pub(in crate::table) fn requeue(pending: &AtomicU64, unacked: &AtomicU64, amount: i64) -> i64 {
    let now = unacked.load(RLX) as i64;
    let moved = if amount > 0 && now >= 0 {
        amount.min(now)
    } else if amount < 0 && now <= 0 {
        amount.max(now)
    } else {
        amount
    };
    if moved > 0 {
        pending.fetch_add(moved as u64, RLX);
        unacked.fetch_sub(moved as u64, RLX);
    } else {
        unacked.fetch_sub(moved as u64, RLX);
        pending.fetch_add(moved as u64, RLX);
    }
    moved
}

/// The [`Source`] of a slot's known level.
pub(in crate::table) fn slot_source(s: &Slot) -> Source {
    s.source.load(RLX)
}

/// The [`Source`] a fold of this host's own weight leaves on the level of
/// a counter whose slot has `flags`: [`FOLDED`] for an in-flight counter,
/// none for the others (the next reply is max-merged: they leak, so a
/// level a fold left too high drains by itself).
pub(in crate::table) fn folded_source(flags: u16) -> Source {
    if flags & FLAG_IN_FLIGHT != 0 {
        FOLDED
    } else {
        0
    }
}

/// Sets the [`Source`] of a slot's known level (the writer lock held;
/// checks never read it, so no seqlock is needed).
pub(in crate::table) fn set_slot_source(s: &Slot, source: Source) {
    if s.source.load(RLX) != source {
        s.source.store(source, RLX);
    }
}

/// A slot's counter and the others' fill rate (the writer lock held: no
/// seqlock needed to read).
pub(in crate::table) fn slot_tally(s: &Slot) -> (Tally, f64) {
    let fill = s.fill_rate.load(RLX);
    let (rate, prev) = if s.flags.load(RLX) & FLAG_SLIDING != 0 {
        unpack_rate_prev(fill)
    } else {
        (f64::from_bits(fill), 0.0)
    };
    let tally = Tally {
        level: f64::from_bits(s.known_level.load(RLX)),
        prev,
        at: s.known_at.load(RLX),
    };
    (tally, rate)
}

/// Sets a slot's known level to `level` at `now`, with no fill rate
/// (the writer lock held).
pub(in crate::table) fn store_level(s: &Slot, level: f64, now: Nanos) {
    store_tally(s, Tally::leaky(crate::core::Level { level, at: now }), 0.0);
}

/// Writes a slot's counter and fill rate under its seqlock.
pub(in crate::table) fn store_tally(s: &Slot, t: Tally, rate: f64) {
    // An in-flight level goes down as well as up: a trend measured while
    // it rose would go on being extrapolated after the rise stopped (a
    // level that does not change is not sent again), so its estimate is
    // the known level plus this host's own changes only.
    let rate = if s.flags.load(RLX) & FLAG_IN_FLIGHT != 0 {
        0.0
    } else {
        rate
    };
    let fill = if s.flags.load(RLX) & FLAG_SLIDING != 0 {
        pack_rate_prev(rate, t.prev)
    } else {
        rate.to_bits()
    };
    let w = SeqWrite::begin(s);
    s.known_level.store(t.level.to_bits(), RLX);
    s.known_at.store(t.at, RLX);
    s.fill_rate.store(fill, RLX);
    drop(w);
}

/// The others' fill rate after a merge took the counter from `known` to
/// `merged`, `own` of it this host's (added and given back).
pub(in crate::table) fn measure_rate(
    counting: &Counting,
    known: Tally,
    merged: Tally,
    own: Acked,
    old_rate: f64,
) -> f64 {
    match counting {
        Counting::Leak(limit) => {
            measure_fill_rate(known.level(), merged.level(), *limit, own, old_rate)
        }
        Counting::Window(rule) => {
            let as_window = |t: Tally| WindowLevel {
                count: t.level,
                prev: t.prev,
                at: t.at,
            };
            measure_window_fill_rate(as_window(known), as_window(merged), rule, own, old_rate)
        }
    }
}

/// The window weight found at `now` is counted in (see
/// [`crate::core::WindowRule::attributed_index`]); none for a leaky
/// counter.
pub(in crate::table) fn attributed(counting: &Counting, now: Nanos) -> Option<i64> {
    match counting {
        Counting::Window(rule) => Some(rule.attributed_index(now)),
        Counting::Leak(_) => None,
    }
}
