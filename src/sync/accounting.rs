//! Accounting of owed and acknowledged weight: what each root is owed,
//! and what a reply acknowledges.
//!
//! - every collected delta is **owed** to every root of its shard until
//!   that root confirms it (resent after a failure, bounded); while owed
//!   it leaks at the quota's limit, so a root that missed it gets only
//!   what is left of it (see [`Owed`] for why);
//! - every collected delta is **unacked** (sent, acknowledged by no
//!   root yet) until the first root whose reply covers it; that reply
//!   takes it off the table's unacked weight, later roots' replies only
//!   max-merge their values;
//! - weight given back (a collected counter whose net change is negative)
//!   travels the same way, as a return beside the deltas, owed and
//!   acknowledged alike (see docs/DESIGN.md, "Counters that give units
//!   back");
//! - when no root can take it (every root down, or a group down for its
//!   shard), the weight is folded into the local levels, or handed back
//!   to pending when the thread stops.

use super::ids::{CounterMap, IdMap};
use super::link::{level_at_offset, Owed, OwedDeltas, RootLink};
use super::routing::shard;
use super::vouch::Recent;
use crate::core::estimate::Acked;
use crate::core::{Counting, Nanos, Tally};
use crate::table::{CollectedDelta, SlotId, Source, Table};
use crate::wire::{CounterKey, RefusedKeys, SyncResponse};
use std::collections::hash_map::Entry;

/// Deltas collected and sent, not yet included in any root's answer.
#[derive(Default, Debug)]
struct Unacked {
    /// By counter: where it lives, weight added and weight given back
    /// that no root acknowledged yet.
    by_counter: CounterMap<(SlotId, u64, u64)>,
}

impl Unacked {
    fn add(&mut self, collected: &[CollectedDelta]) {
        for d in collected {
            let e = self
                .by_counter
                .entry(counter_of(d))
                .or_insert((d.slot, 0, 0));
            e.0 = d.slot;
            e.1 += d.delta;
            e.2 += d.returned;
        }
    }

    /// Takes up to `sent` of the counter's unacknowledged weight and up to
    /// `returned` of its unacknowledged returns (one lookup: this runs for
    /// every counter of every reply); what that acknowledges of each.
    fn take(&mut self, counter: CounterKey, sent: u64, returned: u64) -> Option<(SlotId, Acked)> {
        let Entry::Occupied(mut e) = self.by_counter.entry(counter) else {
            return None;
        };
        let (slot, weight, back) = e.get_mut();
        let acked = (*weight).min(sent);
        let acked_back = (*back).min(returned);
        *weight -= acked;
        *back -= acked_back;
        let slot = *slot;
        if *weight == 0 && *back == 0 {
            e.remove();
        }
        Some((
            slot,
            Acked {
                added: acked,
                returned: acked_back,
            },
        ))
    }

    /// A counter's unacknowledged net weight.
    fn net(&(_, added, returned): &(SlotId, u64, u64)) -> i64 {
        added as i64 - returned as i64
    }
}

/// What a collected delta is owed to each root as, from `now` on.
fn owed_of(table: &Table, d: &CollectedDelta, now: Nanos) -> (CounterKey, Owed) {
    // A slot that no longer holds the quota: the root ignores the delta
    // anyway. A key counts as its template does.
    let counting = table
        .books()
        .counter_counting(d.slot, d.id)
        .unwrap_or(Counting::Leak(0.0));
    let owed = Owed::collected(d.delta, counting, now).with_returned(d.returned);
    (counter_of(d), owed)
}

/// The entries of `owed` whose counters belong to group `g`'s shard.
fn of_shard(
    owed: &[(CounterKey, Owed)],
    g: usize,
    groups: usize,
) -> impl Iterator<Item = (CounterKey, Owed)> + Clone + '_ {
    owed.iter()
        .filter(move |(c, _)| shard(*c, groups) == g)
        .copied()
}

/// The counter a collected delta belongs to.
fn counter_of(d: &CollectedDelta) -> CounterKey {
    CounterKey {
        id: d.id,
        key: d.key,
    }
}

/// Weight collected from the table: what the roots are owed of it, and
/// what no root acknowledged yet.
#[derive(Debug)]
pub(super) struct Accounts {
    /// Weight sent and acknowledged by no root yet.
    unacked: Unacked,
    /// Most distinct counters owed to one root.
    max_owed: usize,
    /// The last cycle's collected deltas, kept for their memory.
    collected: Vec<CollectedDelta>,
    /// The last cycle's new owed entries, kept for their memory.
    fresh: Vec<(CounterKey, Owed)>,
    /// Each quota's slot, for counters of a reply this host did not send.
    slots: IdMap<SlotId>,
    /// The table generation `slots` was read at.
    slots_generation: Option<u64>,
}

impl Accounts {
    /// Nothing collected yet; each root is owed at most `max_owed`
    /// distinct counters.
    pub(super) fn new(max_owed: usize) -> Self {
        Self {
            unacked: Unacked::default(),
            max_owed,
            collected: Vec::new(),
            fresh: Vec::new(),
            slots: IdMap::default(),
            slots_generation: None,
        }
    }

    /// Collects the table's deltas at `now` (unacknowledged from now on,
    /// owed to the roots by [`Accounts::owe_collected`]); returns each
    /// quota's rejection count, collected with them.
    pub(super) fn collect(&mut self, table: &Table, now: Nanos) -> Vec<(u64, u64)> {
        // The cycle's buffers keep their memory from cycle to cycle.
        self.collected.clear();
        self.fresh.clear();
        let mut rejected = Vec::new();
        table
            .books()
            .collect_deltas_and_rejections(&mut self.collected, &mut rejected);
        self.unacked.add(&self.collected);
        self.fresh
            .extend(self.collected.iter().map(|d| owed_of(table, d, now)));
        rejected
    }

    /// Owes what the last collection found to the roots of `links`, each
    /// the counters of its shard (`groups` groups).
    pub(super) fn owe_collected(&self, links: &mut [RootLink], groups: usize, now: Nanos) {
        for link in links {
            link.owe(
                of_shard(&self.fresh, link.group, groups),
                self.max_owed,
                now,
            );
        }
    }

    /// Owes `link`'s root `owed` (again: a request that failed, slots to
    /// resend to a restarted root).
    pub(super) fn owe(
        &self,
        link: &mut RootLink,
        owed: impl IntoIterator<Item = (CounterKey, Owed)>,
        now: Nanos,
    ) {
        link.owe(owed.into_iter(), self.max_owed, now);
    }

    /// Collects what was admitted since the cycle began and owes it to
    /// every root of its shard, as a cycle's start does, without sending
    /// it: the fold that follows takes it locally.
    pub(super) fn collect_late(
        &mut self,
        table: &Table,
        links: &mut [RootLink],
        groups: usize,
        now: Nanos,
    ) {
        self.collected.clear();
        table.books().collect_deltas(&mut self.collected);
        self.unacked.add(&self.collected);
        self.fresh.clear();
        self.fresh
            .extend(self.collected.iter().map(|d| owed_of(table, d, now)));
        self.owe_collected(links, groups, now);
    }

    /// Merges the counters of `reply` (from the root whose values are
    /// merged as `source`, with clock offset `offset`) into the table,
    /// noting each in `recent`. What the reply covers of the weight sent
    /// leaves `sent` and is acknowledged: off the unacknowledged weight,
    /// and taken into the merge of the first root to answer for it.
    pub(super) fn take_counters(
        &mut self,
        table: &Table,
        reply: &SyncResponse,
        offset: i64,
        source: Source,
        sent: &mut OwedDeltas,
        recent: &mut Recent,
    ) {
        let generation = table.generation();
        if self.slots_generation != Some(generation) {
            self.slots = table.books().slot_ids().into_iter().collect();
            self.slots_generation = Some(generation);
        }
        for (counter, value) in reply_values(reply, offset) {
            // What this reply covers of the weight sent leaves `sent`;
            // what is left there afterwards the root did not answer for.
            // The whole collected weight is acknowledged, leaked or not:
            // what leaked away is no longer part of any level.
            let acked = sent
                .remove(&counter)
                .and_then(|s| self.unacked.take(counter, s.weight, s.returned));
            // A counter this host sent says where it lives (one lookup
            // less per counter).
            let slot = match acked {
                Some((slot, _)) => slot,
                None => match self.slots.get(&counter.id) {
                    Some(&slot) => slot,
                    None => continue,
                },
            };
            recent.changed(counter, slot);
            let amount = acked.map_or(Acked::default(), |a| a.1);
            if !table
                .books()
                .merge_counter(slot, counter.id, counter.key, value, amount, source)
                && acked.is_some()
            {
                // Its quota moved to another slot since the delta was
                // collected: merge it where it is now.
                if let Some(&moved) = self.slots.get(&counter.id).filter(|&&s| s != slot) {
                    recent.changed(counter, moved);
                    table.books().merge_counter(
                        moved,
                        counter.id,
                        counter.key,
                        value,
                        amount,
                        source,
                    );
                }
            }
        }
    }

    /// The keys `reply` says its root refused to hold (see
    /// [`SyncResponse::refused`]): what it acknowledges of the weight sent
    /// for them leaves `sent` and is kept by the keys themselves, folded
    /// into their levels at `now` ([`crate::table::Books::refuse_key`]),
    /// since no root counted it. A key whose weight another root already
    /// acknowledged is held there and stays as it is.
    pub(super) fn take_refused(
        &mut self,
        table: &Table,
        reply: &SyncResponse,
        sent: &mut OwedDeltas,
        now: Nanos,
    ) {
        for counter in RefusedKeys::counters(&reply.refused) {
            let acked = sent
                .remove(&counter)
                .and_then(|s| self.unacked.take(counter, s.weight, s.returned));
            if let Some((slot, amount)) = acked {
                table
                    .books()
                    .refuse_key(slot, counter.id, counter.key, amount.net(), now);
            }
        }
    }

    /// What a reply left of `sent` (counters it did not answer for) is
    /// acknowledged all the same: the root has it, and the table's
    /// unacknowledged weight is released (a key a root refused before
    /// folds it at `now`: no root has it).
    pub(super) fn release_unanswered(&mut self, table: &Table, sent: &mut OwedDeltas, now: Nanos) {
        for (counter, owed) in sent.drain() {
            if let Some((slot, acked)) = self.unacked.take(counter, owed.weight, owed.returned) {
                table
                    .books()
                    .release_unacked(slot, counter.id, counter.key, acked.net(), now);
            }
        }
    }

    /// Folds the unacknowledged weight of every counter `down` says into
    /// the local levels at `now` (its group is down: no root of it will
    /// acknowledge it soon).
    pub(super) fn fold(&mut self, table: &Table, down: impl Fn(CounterKey) -> bool, now: Nanos) {
        self.unacked.by_counter.retain(|c, entry| {
            if !down(*c) {
                return true;
            }
            table
                .books()
                .fold_unacked(entry.0, c.id, c.key, Unacked::net(entry), now);
            false
        });
    }

    /// Weight sent and acknowledged by no root, per counter: its slot,
    /// weight added, weight given back (for the handover record).
    pub(super) fn unacked(&self) -> Vec<(CounterKey, SlotId, u64, u64)> {
        self.unacked
            .by_counter
            .iter()
            .map(|(&c, &(slot, added, returned))| (c, slot, added, returned))
            .collect()
    }

    /// Takes a dead predecessor's unacknowledged weight over as this
    /// thread's own (it is in the table's unacked weight already).
    pub(super) fn adopt_unacked(
        &mut self,
        entries: impl IntoIterator<Item = (CounterKey, SlotId, u64, u64)>,
    ) {
        for (c, slot, added, returned) in entries {
            let e = self.unacked.by_counter.entry(c).or_insert((slot, 0, 0));
            e.1 += added;
            e.2 += returned;
        }
    }

    /// Drops `left` (per counter: weight added, weight given back) from
    /// this thread's unacknowledged weight; it stays unacknowledged in the
    /// table (a retired record hands it to the next thread).
    pub(super) fn forget_unacked(
        &mut self,
        left: &std::collections::HashMap<CounterKey, (u64, u64)>,
    ) {
        self.unacked.by_counter.retain(|c, (_, added, returned)| {
            if let Some(&(a, r)) = left.get(c) {
                *added -= a.min(*added);
                *returned -= r.min(*returned);
            }
            *added > 0 || *returned > 0
        });
    }

    /// The sync thread stops: weight sent but acknowledged by no root goes
    /// back to the table's pending (see `SyncEngine::abandon`).
    pub(super) fn abandon(&mut self, table: &Table) {
        for (c, entry) in &self.unacked.by_counter {
            table
                .books()
                .requeue_unacked(entry.0, c.id, c.key, Unacked::net(entry));
        }
        self.unacked = Unacked::default();
    }
}

/// The values of `reply`, named counters then keys, as local tallies for
/// the clock offset `offset` (looked up once: every value of the reply is
/// moved by it).
fn reply_values(
    reply: &SyncResponse,
    offset: i64,
) -> impl Iterator<Item = (CounterKey, Tally)> + '_ {
    let keyed = reply.keyed.iter().flat_map(move |group| {
        group.values.iter().enumerate().map(move |(i, v)| {
            let counter = CounterKey {
                id: group.id,
                key: v.0,
            };
            let local = Tally {
                prev: group.prev_of(i),
                ..Tally::leaky(level_at_offset(offset, v.1, v.2))
            };
            (counter, local)
        })
    });
    reply
        .counters
        .iter()
        .map(move |c| {
            let local = Tally {
                prev: c.prev,
                ..Tally::leaky(level_at_offset(offset, c.level, c.at))
            };
            (CounterKey::named(c.id), local)
        })
        .chain(keyed)
}
