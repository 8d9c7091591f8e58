//! Pressure on the table's key section, as the sync thread reports it:
//! once an interval at most, never per request (the checks only count).

use super::log::{LogLevel, LogLine};
use crate::table::{KeyOverflow, KeyStats, Table};

/// Watches the key section for pressure: keys that found no entry because
/// every entry they could have had holds a live count. Says so at most
/// once per call (the callers call once per interval), never per request.
#[derive(Debug, Default)]
pub struct KeyPressure {
    last: KeyStats,
}

impl KeyPressure {
    /// A warning when keys found no entry, or a root refused keys, since
    /// the last call.
    pub fn check(&mut self, table: &Table) -> Option<LogLine> {
        let now = table.key_stats();
        let overflows = now.overflows.saturating_sub(self.last.overflows);
        let busy = now.busy.saturating_sub(self.last.busy).min(overflows);
        let refused = now.refused.saturating_sub(self.last.refused);
        self.last = now;
        (overflows > 0 || refused > 0).then(|| {
            let mode = table.key_overflow();
            let decided = match mode {
                KeyOverflow::Shared => "checked on their template's shared overflow counter",
                KeyOverflow::Reject => "rejected",
                KeyOverflow::Pass => "passed uncounted",
            };
            // A check that could not have the key lock in time says
            // nothing about room: the lock's holder was descheduled.
            let full = overflows - busy;
            let mut parts = Vec::new();
            if full > 0 {
                parts.push(format!(
                    "key section full: {full} check(s) of keys that found no entry \
                     since the last report were {decided} ({} of {} entries hold keys, \
                     drained ones included); give keys more memory",
                    now.live, now.capacity
                ));
            }
            if busy > 0 {
                parts.push(format!(
                    "key lock busy: {busy} check(s) of new keys whose buckets were full \
                     could not have the key lock in time to move entries (its holder, \
                     the sync thread or a check making room, was descheduled: the machine \
                     is overloaded) and were {decided} ({} of {} entries hold keys)",
                    now.live, now.capacity
                ));
            }
            if refused > 0 {
                let checked = match mode {
                    KeyOverflow::Shared => {
                        "checked on their own counts here and on their template's shared \
                         overflow counter"
                    }
                    KeyOverflow::Reject => "rejected (their counts kept here)",
                    KeyOverflow::Pass => "checked on their own counts here only",
                };
                parts.push(format!(
                    "keys refused: a quota root refused to hold {refused} key(s) since the \
                     last report (this limiter holds its max_keys_per_limiter share of that \
                     root's keys, or the root holds max_keys); they are {checked}"
                ));
            }
            (LogLevel::Warn, parts.join("; "))
        })
    }
}
