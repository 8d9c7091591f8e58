//! What a root is owed: the weight a root has not received yet, per
//! counter, leaked as the root would have leaked it (see [`Owed`]).

use super::ids::CounterMap;
use crate::core::{Counting, Level, Nanos};

/// Weight a root has not received yet for one counter.
///
/// A root adds every delta at the moment it receives it:
/// `C = max(C, F(now)) + delta`. Weight admitted long ago and delivered
/// only now (the root was down, or its reply was lost and the request is
/// repeated) would count as if it had just been admitted, although the
/// floor has risen since: 20 s of a fleet's load sent at once to a root that
/// comes back puts that root far above `high_burst`, and since limiters
/// take the maximum over roots it throttles the whole fleet for as long
/// again.
///
/// So what is owed is kept as this host's own bucket: `level` leaks at the
/// quota's limit from the moment the weight was collected, exactly as the
/// root would have leaked it had the weight been the only weight it got,
/// and only what is left is sent. That is never more than the weight's
/// true share of the cluster level: a bucket's level at `t` is
/// `max over s of (W[s, t] - limit * (t - s))` for the weight `W` it got
/// since `s`, and the sum of that over disjoint parts of the load is at
/// most the same over the whole load (each part pays the leak on its own).
/// A root that missed deltas therefore ends up at or below the true
/// level, never above it; the other roots, which did get the deltas, hold
/// the true level and win the maximum, and a root that was below it
/// catches up as new deltas arrive. Aging deltas out after a fixed time
/// instead would still overcount whatever is younger than that bound.
///
/// A repeat after a short loss (one lost reply) costs at most what has
/// not leaked since, not a full double count.
///
/// A window quota's weight does not leak: it is owed whole, tagged with the
/// window it was admitted in, until the window after that one ends (past
/// that, no decision can depend on it any more, not even a sliding
/// window's); a root counts it in its window however late it arrives.
///
/// Weight given back (a return, see docs/DESIGN.md "Counters that give
/// units back") is owed beside it, without a leak: a root lowers the
/// counter by it and stops at zero, so a late return lowers it no more
/// than an early one would have by then. An add and a return owed in one
/// entry cancel first: a root that never got the add must not get the
/// return of it, or it would lower other hosts' weight; only a return of
/// more than the entry adds (weight the root did get, earlier) is sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Owed {
    /// What the root should still add, as a bucket leaking at `limit`
    /// since the weight was collected (the local clock).
    pub level: Level,
    /// The quota's leak rate when weight was last added, units/s.
    pub limit: f64,
    /// Weight collected from the table that this entry covers, leaked or
    /// not: what a reply from the root acknowledges.
    pub weight: u64,
    /// For a window quota: the window the weight belongs to.
    pub window: Option<OwedWindow>,
    /// Weight given back that this entry covers: what a reply from the
    /// root acknowledges of returns.
    pub returned: u64,
    /// Of it, what the root should still take: the returns of the entry's
    /// window (all of them for a leaky quota).
    pub returned_due: u64,
}

/// The window owed window-quota weight belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwedWindow {
    /// The UTC window's index.
    pub index: i64,
    /// Local time from which the weight no longer matters: the end of the
    /// window after it.
    pub expires: Nanos,
}

impl Owed {
    /// `delta` collected at `now` for a quota leaking at `limit`.
    pub fn new(delta: u64, limit: f64, now: Nanos) -> Self {
        Self {
            level: Level {
                level: delta as f64,
                at: now,
            },
            limit,
            weight: delta,
            window: None,
            returned: 0,
            returned_due: 0,
        }
    }

    /// `units` a restarted root must count again (slots this host held
    /// there before the restart, see `SyncEngine::finish`): sent
    /// as adds, without a leak (only in-flight counters are resent, and
    /// they do not leak), and acknowledging no collected weight (`weight`
    /// 0: they were collected, and acknowledged, long ago).
    pub fn resent(units: u64, now: Nanos) -> Self {
        Self {
            weight: 0,
            ..Self::new(units, 0.0, now)
        }
    }

    /// `units` given back that a restarted root must take (it counts
    /// more of this host's slots than this host holds: see
    /// `restart::owed_again`): sent as a return that acknowledges
    /// nothing collected (`returned` 0).
    pub fn resent_returned(units: u64, now: Nanos) -> Self {
        Self {
            weight: 0,
            returned_due: units,
            ..Self::new(0, 0.0, now)
        }
    }

    /// What a root counts of the entry once it has it, net: its adds
    /// before any leak (units [`Owed::resent`] included) less the
    /// returns it takes. For an in-flight counter (no leak, no window)
    /// that is exactly what the entry moves this host's holding there by.
    pub fn counted_net(&self) -> i128 {
        i128::from(self.added()) - i128::from(self.returned_due)
    }

    /// The same entry, owing `returned` units given back as well.
    pub fn with_returned(self, returned: u64) -> Self {
        Self {
            returned,
            returned_due: returned,
            ..self
        }
    }

    /// `delta` of a window quota collected at `now`, admitted in
    /// `window`.
    pub fn in_window(delta: u64, window: OwedWindow, now: Nanos) -> Self {
        Self {
            window: Some(window),
            ..Self::new(delta, 0.0, now)
        }
    }

    /// What `delta` collected at `now` is owed as, for a counter counting
    /// by `counting`.
    pub fn collected(delta: u64, counting: Counting, now: Nanos) -> Self {
        match counting {
            Counting::Leak(limit) => Self::new(delta, limit, now),
            Counting::Window(rule) => {
                let index = rule.attributed_index(now);
                let start = |i: i64| (rule.window.start(i) - rule.utc_offset).max(0) as Nanos;
                let expires = start(index + 2);
                Self::in_window(delta, OwedWindow { index, expires }, now)
            }
        }
    }

    /// Both owed amounts in one entry: each leaked to the later time, then
    /// added (they are different weights, so they add; the newer limit
    /// applies from then on).
    pub fn combine(self, other: Owed) -> Owed {
        let (older, newer) = if self.level.at <= other.level.at {
            (self, other)
        } else {
            (other, self)
        };
        let at = newer.level.at;
        let weight = older.weight.saturating_add(newer.weight);
        let returned = older.returned.saturating_add(newer.returned);
        if older.window.map(|w| w.index) != newer.window.map(|w| w.index) {
            // Weight of an earlier window (or of the quota before it
            // changed how it counts): one entry carries one window, and
            // the newer one matters more. The older is still acknowledged
            // (a return of an earlier window lowers nothing at a root).
            return Owed {
                weight,
                returned,
                ..newer
            };
        }
        let level = older.level.leaked(older.limit, at).level + newer.level.level;
        Owed {
            level: Level { level, at },
            limit: newer.limit,
            weight,
            window: newer.window,
            returned,
            returned_due: older.returned_due.saturating_add(newer.returned_due),
        }
    }

    /// Whole units to send at `now`: what is left after the leak, less
    /// what was given back of it, rounded down (a root never gets more
    /// than this host's share); for window weight all of it until it
    /// expires.
    pub fn due(&self, now: Nanos) -> u64 {
        if self.window.is_some_and(|w| now >= w.expires) {
            return 0;
        }
        let left = self.level.leaked(self.limit, now).level - self.returned_due as f64;
        left.max(0.0).floor() as u64
    }

    /// Units given back to send at `now`: what returns exceed the entry's
    /// own adds by (those cancel), until a window quota's window expires.
    pub fn due_returned(&self, now: Nanos) -> u64 {
        if self.window.is_some_and(|w| now >= w.expires) {
            return 0;
        }
        self.returned_due.saturating_sub(self.added())
    }

    /// The entry's adds before any leak: its window's weight for a window
    /// quota (held unleaked in `level`), all of its weight for a leaky one,
    /// or its level when that is more (units [`Owed::resent`], which
    /// acknowledge no weight).
    fn added(&self) -> u64 {
        if self.window.is_some() {
            self.level.level.ceil() as u64
        } else {
            self.weight.max(self.level.level.ceil() as u64)
        }
    }

    /// True when nothing is left to send at `now`.
    pub fn spent(&self, now: Nanos) -> bool {
        self.due(now) == 0 && self.due_returned(now) == 0
    }
}

/// What a root is owed, by counter.
pub type OwedDeltas = CounterMap<Owed>;
