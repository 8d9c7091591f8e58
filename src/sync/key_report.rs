//! The held slots of keys a limiter reports to a root in absolute form
//! ([`crate::wire::SyncRequest::keyed_held`], to a root that takes them;
//! see docs/DESIGN.md, "In-flight quotas", *Held slots, absolute*).
//!
//! A numbered request reports each key of a per-key in-flight quota that
//! it, or a part it carries again, has adds or returns of: the key's
//! held slots now (`books/key_sync.rs`), which the root sets its count
//! of this limiter there to, taking none of those adds and returns. So a
//! copy, a resend or a reply lost moves no key's count twice. Every key
//! this host holds slots of in the root's group is reported, once, when
//! the root may lack them: it was found restarted, it answered after a
//! silence longer than the lease (it dropped this host's slots), or
//! another process behind its URL answered. A report is made whole
//! again until an answer comes back to a request that carried it.

use std::collections::HashMap;

use super::routing::shard;
use crate::core::Nanos;
use crate::table::{SlotId, Table};
use crate::wire::{CounterKey, KeyDelta, KeyedDeltas, SyncRequest};

/// One root link's side of key reports.
#[derive(Debug, Default)]
pub struct KeyReport {
    /// The root's last answer said it takes the held slots of keys.
    pub takes: bool,
    /// Every key held is to be reported with the next numbered request.
    due: bool,
    /// The request under way carries every key held.
    sending: bool,
    /// Keys the next report carries besides those held: keys whose
    /// changes reached the root before it took their held slots, which it
    /// may count wrongly (a return ahead of its add, at a new instance)
    /// though this host holds none there now.
    also: Vec<CounterKey>,
}

impl KeyReport {
    /// An answer came back from a root that `takes` keys' held slots or
    /// not: from another process behind its URL (`switched`), from a new
    /// instance (`restarted`), or after a silence longer than the lease
    /// (`silent`). A report the request carried is done, and one is due
    /// when the root may lack this host's key slots, with the keys `sent`
    /// lists (those the request moved).
    pub fn answered(
        &mut self,
        takes: bool,
        (switched, restarted, silent): (bool, bool, bool),
        sent: impl FnOnce() -> Vec<CounterKey>,
    ) {
        if std::mem::take(&mut self.sending) {
            self.due = false;
            self.also.clear();
        }
        self.takes = takes;
        if takes && (switched || restarted || silent) {
            self.due = true;
            self.also.extend(sent());
        }
    }

    /// The exchange failed: a report it carried is made again.
    pub fn failed(&mut self) {
        self.sending = false;
    }
}

/// What the keys of the requests of one cycle share: read once, for the
/// roots that take reports.
#[derive(Default)]
pub(super) struct KeyReportCache {
    /// Quota ids to slots.
    slots: Option<HashMap<u64, SlotId>>,
    /// Every key held, with its slots.
    held: Option<Vec<(CounterKey, i64)>>,
}

/// The held slots of keys `request` reports to the root of `report`
/// (`group` of `groups`): those it has adds or returns of, in it or a
/// part it carries again, and all held when a report is due, up to
/// `room` entries (keys left out go as adds and returns, counted once by
/// their numbers all the same). None unless the request is numbered and
/// the root takes them.
pub(super) fn keyed_held(
    table: &Table,
    (report, group, groups): (&mut KeyReport, usize, usize),
    request: &SyncRequest,
    cache: &mut KeyReportCache,
    room: usize,
) -> Vec<KeyedDeltas> {
    if !report.takes || request.sequence.is_none() {
        return Vec::new();
    }
    let parts = std::iter::once((&request.keyed, &request.keyed_returned))
        .chain(request.replay.iter().map(|p| (&p.keyed, &p.keyed_returned)));
    let mut keys: Vec<CounterKey> = parts
        .flat_map(|(keyed, returned)| keyed.iter().chain(returned))
        .flat_map(|g| g.deltas.iter().map(|d| CounterKey { id: g.id, key: d.0 }))
        .collect();
    if report.due {
        keys.extend(&report.also);
    }
    let mut out: Vec<(CounterKey, i64)> = Vec::new();
    if !keys.is_empty() {
        keys.sort_unstable();
        keys.dedup();
        let slots = cache
            .slots
            .get_or_insert_with(|| table.books().slot_ids().into_iter().collect());
        let found: Vec<(SlotId, CounterKey)> = keys
            .iter()
            .filter_map(|c| Some((*slots.get(&c.id)?, *c)))
            .collect();
        out = table.books().key_held_of(&found);
    }
    if report.due {
        let all = cache
            .held
            .get_or_insert_with(|| table.books().held_key_counts(|_| false));
        let mine = all.iter().filter(|(c, _)| shard(*c, groups) == group);
        out.extend(mine);
        report.sending = true;
    }
    out.sort_unstable_by_key(|(c, _)| *c);
    out.dedup_by_key(|(c, _)| *c);
    if out.len() > room {
        out.truncate(room);
        report.sending = false;
    }
    let mut groups_out: Vec<KeyedDeltas> = Vec::new();
    for (c, held) in out {
        let d = KeyDelta(c.key, u64::try_from(held).unwrap_or(0));
        match groups_out.last_mut() {
            Some(g) if g.id == c.id => g.deltas.push(d),
            _ => groups_out.push(KeyedDeltas {
                id: c.id,
                deltas: vec![d],
                window: None,
            }),
        }
    }
    groups_out
}

/// Nanoseconds of silence from `last` (0: never answered) to `sent`
/// after which a root has dropped this host's slots.
pub(super) fn silent_past(last: Nanos, sent: Nanos, lease: Nanos) -> bool {
    last != 0 && sent.saturating_sub(last) > lease
}
