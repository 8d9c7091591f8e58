//! Early sync: when a cycle starts before its interval is up.
//!
//! Two things bring one on, both probed by the caller every
//! [`EARLY_PROBES_PER_INTERVAL`]th of an interval: a penalty started here
//! (always: it should reach the roots at once, and every other host within
//! its next sync), and, with early sync on ([`EarlySync`]), some quota's
//! unsent local weight passing its share of the burst band. Each has a
//! budget of cycles a second, so probing often never syncs often.

use super::config::EarlySync;
use crate::core::Nanos;
use crate::table::Table;

/// How often per interval early sync probes the table.
pub const EARLY_PROBES_PER_INTERVAL: u64 = 20;

/// Most early cycles a second that penalties started here may bring on
/// (with early sync off too): a penalty reaches the roots at once, and
/// every other host within its next sync.
pub const PENALTY_SYNCS_PER_SECOND: f64 = 4.0;

/// Whether the next cycle should start early, and when one last did.
#[derive(Debug)]
pub(super) struct EarlyCycles {
    /// The sync interval, which the probes divide.
    interval: Nanos,
    /// Early sync's settings; `None` while it is off.
    early: Option<EarlySync>,
    /// Local time the last early cycle was found due.
    last: Option<Nanos>,
}

impl EarlyCycles {
    /// Early sync off, for a thread syncing every `interval`.
    pub(super) fn new(interval: Nanos) -> Self {
        Self {
            interval,
            early: None,
            last: None,
        }
    }

    /// Turns early sync on (or off with `None`).
    pub(super) fn set(&mut self, early: Option<EarlySync>) {
        self.early = early;
    }

    /// Time between early-sync probes, when early sync is on.
    pub(super) fn early_probe_every(&self) -> Option<Nanos> {
        self.early.map(|_| self.probe_every())
    }

    /// Time between the networked loop's probes: they look for penalties
    /// started here (always) and, with early sync on, for unsent weight.
    pub(super) fn probe_every(&self) -> Nanos {
        (self.interval / EARLY_PROBES_PER_INTERVAL).max(1)
    }

    /// True when an early cycle should start now: its budget allows one
    /// (early sync's, or [`PENALTY_SYNCS_PER_SECOND`] without it), and a
    /// penalty started here waits to be sent, or early sync is on and
    /// some quota's unsent local delta passed its share of the burst band.
    pub(super) fn due(&mut self, table: &Table, now: Nanos) -> bool {
        let per_second = self
            .early
            .map_or(PENALTY_SYNCS_PER_SECOND, |e| e.max_per_second);
        let spacing = (1e9 / per_second.max(1e-9)) as Nanos;
        if self.last.is_some_and(|t| now.saturating_sub(t) < spacing) {
            return false;
        }
        let due = table.books().has_unsent_penalties()
            || self
                .early
                .is_some_and(|early| table.books().unsent_beyond(early.fraction));
        if due {
            self.last = Some(now);
        }
        due
    }
}
