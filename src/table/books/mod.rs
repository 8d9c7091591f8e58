//! The sync face: what the sync thread (`crate::sync`) may ask of a
//! table, and nothing else. [`Books`] collects what this host admitted
//! since the last collection, merges what the roots answer, folds counts
//! locally when no root is reachable, applies quota sets, overrides and
//! penalties, keeps the in-flight slots this host holds with their local
//! lease, and adopts another table's contents. Every write holds the
//! region's writer lock (and, for keys and tiers, their own locks); none
//! does IO while holding one.
//!
//! # Layout
//!
//! From the bottom up; a file uses only files listed before it.
//!
//! - `tally.rs` — a counter's numbers as the sync side reads and writes
//!   them: tally and source, pending and unacknowledged weight, folding,
//!   fill-rate measurement, the delta a collection hands out.
//! - `held.rs` — what this host holds of its in-flight quotas, and the
//!   local lease that limits by it once every root has been silent.
//! - `merge.rs` — the one merge of a root's value into a counter, named
//!   or a key's, and the "same root" rule.
//! - `key_sync.rs` — keys outside the request path: the dirty ring a
//!   collection drains, collecting, merging and folding keys, the upkeep
//!   sweep, deleted templates, adopting another table's keys.
//! - `counters.rs` — collecting deltas, merging the roots' values,
//!   folding locally, unacknowledged weight released or handed back,
//!   claiming the sync of a dead owner.
//! - `tiers.rs` — overrides applied, penalties merged, sent and swept,
//!   quotas' penalty lengths.
//! - `write.rs` — applying quotas by epoch: slots, names and index
//!   entries allocated and freed, parents re-linked.
//! - `adopt.rs` — adopting another table's contents.
//! - `mod.rs` — [`Books`], the face, which only hands each call to the
//!   file that owns it.

mod adopt;
mod counters;
mod held;
mod key_sync;
mod merge;
pub(in crate::table) mod tally;
mod tiers;
mod write;

use crate::core::estimate::Acked;
use crate::core::key::KeyHash;
use crate::core::tier::{Override, Penalty};
use crate::core::{Counting, Nanos, Quota, Tally};
use crate::table::region::handover::Handover;
pub use crate::table::region::handover::Record as HandoverRecord;
use crate::table::region::layout::Source;
use crate::table::region::tier_section::TierReport;
use crate::table::region::{Region, SlotId};
use crate::wire::CounterKey;
use adopt::Adopt;
use counters::Counters;
use held::Held;
use key_sync::KeySync;
use tiers::TierBooks;
use write::Writer;

pub use tally::CollectedDelta;
pub use write::ApplyReport;

#[cfg(test)]
pub(in crate::table) use held::WALKS as IN_FLIGHT_WALKS;

/// The sync face of a table (see the module doc). Made by
/// `Table::books`; it borrows the table and costs nothing to make.
#[derive(Clone, Copy)]
pub struct Books<'t> {
    region: &'t Region,
}

impl<'t> Books<'t> {
    /// The face of `region`.
    pub(in crate::table) fn of(region: &'t Region) -> Self {
        Books { region }
    }

    /// Moves every live slot's pending weight (and every queued key's) to
    /// in-flight and returns the moved amounts; what a sync sends. A weight
    /// admitted concurrently is either moved now or stays pending for the
    /// next collection, never lost or taken twice.
    pub fn collect_deltas(&self, out: &mut Vec<CollectedDelta>) {
        Counters::of(self.region).collect_deltas(out)
    }

    /// [`Books::collect_deltas`], and in the same pass over the slots
    /// `(quota id, checks rejected)` for every live quota that has rejected
    /// a check since the region was made (the counts the metrics show,
    /// never reset): the sync thread sends the roots what grew.
    pub fn collect_deltas_and_rejections(
        &self,
        out: &mut Vec<CollectedDelta>,
        rejected: &mut Vec<(u64, u64)>,
    ) {
        Counters::of(self.region).collect_deltas_and_rejections(out, rejected)
    }

    /// True when some live quota's weight admitted here and not collected
    /// yet (`pending`) has reached `fraction` of its burst band
    /// (`high_burst - low_burst`; with no band, any weight): the sync
    /// thread's early-sync probe. It reads every used slot's counter, so
    /// its cost grows with the table.
    pub fn unsent_beyond(&self, fraction: f64) -> bool {
        Counters::of(self.region).unsent_beyond(fraction)
    }

    /// Merges a cluster counter value (already in local time) from root
    /// `source` into the slot if it still holds quota `id` (or into its
    /// key `key`, when not 0): it replaces the known level if that is the
    /// same root's earlier value, else the larger counts. Takes `acked`
    /// weight (added and given back; a net number is all one way) off
    /// in-flight (the value includes it), and updates the others' fill
    /// rate. Returns false if the slot holds another quota now (or this
    /// host has no entry for the key).
    pub fn merge_counter(
        &self,
        slot: SlotId,
        id: u64,
        key: KeyHash,
        value: Tally,
        acked: impl Into<Acked>,
        source: Source,
    ) -> bool {
        Counters::of(self.region).merge_counter(slot, id, key, value, acked.into(), source)
    }

    /// Standalone mode (no roots): folds every pending and in-flight weight
    /// into the slot's own level at `now`, acting as this host's root.
    pub fn fold_local(&self, now: Nanos) {
        Counters::of(self.region).fold_local(now)
    }

    /// Folds `amount` of one counter's in-flight weight into its own level
    /// at `now`, as [`Books::fold_local`] does for every counter: the
    /// roots of this counter's group (shard) are all unreachable, so this
    /// host counts it alone while the other shards stay fleet-wide.
    /// Ignored if the slot holds another quota now (or the key has no
    /// entry here).
    pub fn fold_unacked(&self, slot: SlotId, id: u64, key: KeyHash, amount: i64, now: Nanos) {
        Counters::of(self.region).fold_unacked(slot, id, key, amount, now)
    }

    /// Takes `amount` off a slot's in-flight weight without a counter value:
    /// a root acknowledged the delta but sent no value for it (it does not
    /// know the quota). A key a root refused folds it into its level at
    /// `now` instead (no root counted it). Ignored if the slot holds
    /// another quota now.
    pub fn release_unacked(&self, slot: SlotId, id: u64, key: KeyHash, amount: i64, now: Nanos) {
        Counters::of(self.region).release_unacked(slot, id, key, amount, now)
    }

    /// A root made no counter for the key `key` of the template in `slot`
    /// (this limiter holds its share of that root's keys, or the root
    /// holds `max_keys`; see docs/DESIGN.md, "Keys a root will not
    /// hold"): the key keeps its count here. `amount` (signed), the
    /// weight the refusal acknowledged, is folded into the key's level at
    /// `now` (never released, as a key the root held would be), and the
    /// key is marked refused: what no root counts of it from now on is
    /// folded too, a check of it applies the overflow mode besides its
    /// own count, and with mode `shared` what it adds is counted on the
    /// template's own counter as well, which the roots hold. A root's
    /// value of the key ends the mark. False when the key has no entry
    /// here (or the slot holds another quota now).
    pub fn refuse_key(&self, slot: SlotId, id: u64, key: KeyHash, amount: i64, now: Nanos) -> bool {
        Counters::of(self.region).refuse_key(slot, id, key, amount, now)
    }

    /// Puts `amount` of a slot's in-flight weight back into pending: a sync
    /// thread that stops with deltas no root acknowledged hands them to the
    /// next one. Ignored if the slot holds another quota now.
    pub fn requeue_unacked(&self, slot: SlotId, id: u64, key: KeyHash, amount: i64) {
        Counters::of(self.region).requeue_unacked(slot, id, key, amount)
    }

    /// Says whether this host counts locally now (no roots, or every root
    /// down: the sync thread folds weight into the levels itself), for
    /// every process sharing the region: weight given back then lowers the
    /// levels ([`crate::table::Gate::give_back`]).
    pub fn set_counting_locally(&self, local: bool) {
        Counters::of(self.region).set_counting_locally(local)
    }

    /// True while this host counts locally (see
    /// [`Books::set_counting_locally`]).
    pub fn counting_locally(&self) -> bool {
        Counters::of(self.region).counting_locally()
    }

    /// How the quota in `slot` counts, if the slot still holds quota `id`.
    /// The sync thread keeps deltas it still owes a root by it.
    pub fn counter_counting(&self, slot: SlotId, id: u64) -> Option<Counting> {
        Counters::of(self.region).counter_counting(slot, id)
    }

    /// One step of the key section's upkeep (the sync thread calls it
    /// every cycle): looks at `buckets` key buckets, dropping keys of
    /// deleted templates and restamping old levels (see `keys.rs`).
    pub fn maintain_keys(&self, buckets: usize, now: Nanos) {
        Counters::of(self.region).maintain_keys(buckets, now)
    }

    /// Makes this process the table's sync owner (a sync thread starts).
    /// Returns the previous owner's process id when that process is gone:
    /// it died mid-sync (a crashed nginx worker), and what it had sent
    /// and no root acknowledged is the new thread's to send, from its
    /// handover record ([`crate::table::Books::handover_of`]) or, without
    /// one, all of it again ([`crate::table::Books::requeue_unacked_beyond`]).
    pub fn claim_sync(&self) -> Option<u32> {
        Counters::of(self.region).claim_sync()
    }

    /// Hands every counter's unacknowledged weight back to pending, to be
    /// collected and sent again, but what `keep` keeps of it: `keep` is
    /// given the counter, its slot and its unacknowledged net weight, and
    /// says how much of that stays unacknowledged (clamped to it). Returns
    /// the weight handed back (adds and returns alike).
    pub fn requeue_unacked_beyond(&self, keep: impl FnMut(CounterKey, SlotId, i64) -> i64) -> u64 {
        Counters::of(self.region).requeue_unacked_beyond(keep)
    }

    /// Leaves `record` in the handover section for a thread that takes
    /// over should this one die (see `region/handover.rs`); false when
    /// it did not fit, the region has no section, or this process is not
    /// the table's sync owner.
    pub fn write_handover(&self, record: &[u8]) -> bool {
        Handover::of(self.region).write(record)
    }

    /// True when the region has a handover section (a heap table has
    /// none: no other process can take its sync over).
    pub fn has_handover(&self) -> bool {
        self.region.geometry().handover_bytes > 0
    }

    /// The handover record process `writer` left (a dead predecessor).
    pub fn handover_of(&self, writer: u32) -> HandoverRecord {
        Handover::of(self.region).read(writer)
    }

    /// Forgets this process's handover record: its weight was handed
    /// back (the thread stops) and is nobody's to send again from it.
    pub fn clear_handover(&self) {
        Handover::of(self.region).clear(crate::table::region::lock::own_pid())
    }

    /// Forgets the handover record of process `writer` (a dead
    /// predecessor's, once taken over).
    pub fn clear_handover_of(&self, writer: u32) {
        Handover::of(self.region).clear(writer)
    }

    /// Leaves `record` as the retired record of this thread, which stops
    /// cleanly with requests unconfirmed; false when the section holds
    /// one already or it does not fit (see `region/handover.rs`).
    pub fn retire_handover(&self, record: &[u8]) -> bool {
        Handover::of(self.region).retire(record)
    }

    /// True when a thread that stopped left a retired record.
    pub fn has_retired_handover(&self) -> bool {
        Handover::of(self.region).has_retired()
    }

    /// Takes the retired record a thread that stopped left, if any.
    pub fn take_retired_handover(&self) -> Option<Vec<u8>> {
        Handover::of(self.region).take_retired()
    }

    /// Counts a takeover from a dead sync thread: by its handover record
    /// (`continued`), or with its weight sent again as new.
    pub fn count_takeover(&self, continued: bool) {
        Handover::of(self.region).count_takeover(continued)
    }

    /// Makes process `pid` the writer of the current handover record and
    /// the table's sync owner (tests: a predecessor that died, in one
    /// process).
    #[cfg(test)]
    pub(crate) fn pretend_handover_of(&self, pid: u32) {
        Handover::of(self.region).pretend_written_by(pid)
    }

    /// The slots this host holds of the named in-flight quota `name`:
    /// what its requests took and have not given back yet, whatever the
    /// roots know of it. `None` for a name that is not a live in-flight
    /// quota's own counter (a per-key template's slots are its keys').
    pub fn held_here(&self, name: &[u8]) -> Option<i64> {
        Held::of(self.region).held_here(name)
    }

    /// The held word of every live named in-flight quota, by quota id
    /// (what the sync thread sends a root that restarted again).
    pub fn held_counts(&self) -> Vec<(u64, i64)> {
        Held::of(self.region).held_counts()
    }

    /// The slots this host holds of each key of its per-key in-flight
    /// quotas beyond what its next collection sends: each key's held
    /// slots, kept by the sync thread as a named counter's held word is
    /// (see `key_sync.rs`), so exact whatever the requests do meanwhile.
    /// What a restarted root is sent again. Keys holding none are left
    /// out, but those `also` names.
    pub fn held_key_counts(&self, also: impl Fn(CounterKey) -> bool) -> Vec<(CounterKey, i64)> {
        KeySync::of(self.region).held_keys(also)
    }

    /// The held slots of each of `keys` (its template's slot, and the
    /// counter) that is a key of a per-key in-flight quota this table
    /// holds an entry for, as [`Books::held_key_counts`] counts them:
    /// what a numbered request reports of the keys it carries.
    pub fn key_held_of(&self, keys: &[(SlotId, CounterKey)]) -> Vec<(CounterKey, i64)> {
        KeySync::of(self.region).key_held_of(keys)
    }

    /// True when some live named quota counts slots in flight (the sync
    /// thread then asks the roots for all their counters after a fold).
    pub fn holds_in_flight(&self) -> bool {
        Held::of(self.region).holds_in_flight()
    }

    /// A root restarted a while ago and every host has since sent it the
    /// slots it held there (see `SyncEngine::finish`): each named
    /// in-flight level known from its earlier instances (a source for
    /// which `earlier` is true) is marked as the new instance's (`to`),
    /// level unchanged, so that instance's next reply replaces it, lower
    /// or not. Max-merged, a level that never leaks would keep an earlier
    /// instance's value against every lower one. Levels with no source
    /// or [`FOLDED`](crate::table::layout::FOLDED) are left as they are. Returns the counters marked.
    pub fn adopt_source(&self, earlier: impl Fn(Source) -> bool, to: Source) -> u64 {
        Held::of(self.region).adopt_source(earlier, to)
    }

    /// The local lease: every root has been silent for the in-flight
    /// lease, so each of them has dropped this host's slots, and this
    /// host drops the other hosts' in turn. Sets every in-flight
    /// counter's level to this host's own slots (its held word; the
    /// caller has folded what was unacked), so from now on it limits
    /// against its own slots only, per host, as the other kinds do with
    /// every root down. The level is marked [`FOLDED`](crate::table::layout::FOLDED): the next reply of
    /// any root replaces it. Only counters `shard` takes (with root
    /// groups, those of the groups that are silent). Returns the counters
    /// set.
    pub fn lease_locally(&self, now: Nanos, shard: impl Fn(CounterKey) -> bool) -> u64 {
        Held::of(self.region).lease_locally(now, shard)
    }

    /// A root (`source`) answered whole a request for all its counters,
    /// sent after a fold; `omitted` says which counters its reply left
    /// out. A root sends every counter that is not empty, so it holds
    /// nothing of those: not even slots this host folded in (it dropped
    /// them by its lease, and the returns sent since went to them). An
    /// in-flight counter among them whose level is [`FOLDED`](crate::table::layout::FOLDED) or that
    /// root's own takes that root's 0, at `now`: left as it is it would
    /// never come down (an in-flight level does not leak, and only a
    /// reply carrying the counter would replace it). One whose level is
    /// another root's keeps it (a max-merge with 0). Returns the counters
    /// set.
    pub fn settle_omitted(
        &self,
        source: Source,
        now: Nanos,
        omitted: impl Fn(CounterKey) -> bool,
    ) -> u64 {
        Held::of(self.region).settle_omitted(source, now, omitted)
    }

    /// Applies overrides as the roots (or a quota file) give them, in
    /// epoch order: each replaces its key's override, a tombstone removes
    /// it; the templates they name are flagged for checks to look.
    pub fn apply_overrides(&self, overrides: &[Override]) -> TierReport {
        TierBooks::of(self.region).apply_overrides(overrides)
    }

    /// Merges penalties from the roots: each end is kept if later than
    /// the one held. Returns how many moved an end.
    pub fn merge_penalties(&self, penalties: &[Penalty]) -> usize {
        TierBooks::of(self.region).merge_penalties(penalties)
    }

    /// True when a penalty started here waits to be sent (the sync
    /// thread's probe: two loads).
    pub fn has_unsent_penalties(&self) -> bool {
        TierBooks::of(self.region).has_unsent_penalties()
    }

    /// The penalties started here since the last call, to send to the
    /// roots.
    pub fn take_started_penalties(&self) -> Vec<Penalty> {
        TierBooks::of(self.region).take_started_penalties()
    }

    /// Every penalty in force at `now_utc` (for a root that restarted and
    /// knows none).
    pub fn held_penalties(&self, now_utc: i64) -> Vec<Penalty> {
        TierBooks::of(self.region).held_penalties(now_utc)
    }

    /// Upkeep by the sync thread at `now_utc`, a slice a call (the whole
    /// section about once a minute at one call a second): removes entries
    /// with nothing left in them (a penalty ended, an override expired, no
    /// penalty length), and rebuilds the filter once removals left as many
    /// stale bits as there are entries.
    pub fn sweep_tiers(&self, now_utc: i64) {
        TierBooks::of(self.region).sweep_tiers(now_utc)
    }

    /// Applies quota changes from a root or a file: upserts live quotas
    /// whose epoch is newer than the table's copy, removes tombstoned ones,
    /// then re-links parents. Invalid quotas and quotas that do not fit are
    /// refused (listed in the report) and everything else still applies.
    pub fn apply_quotas(&self, quotas: &[Quota]) -> ApplyReport {
        Writer::of(self.region).apply_quotas(quotas)
    }

    /// Takes over everything `old` holds (an nginx zone that changed
    /// size): its quotas with their ids and epochs, each counter's cluster
    /// level, time and fill rate, and the weight admitted but not yet
    /// acknowledged by a root, which becomes pending here so it is sent
    /// again, and what the sync thread remembered of the roots (the
    /// status block's per-root instance words). Quotas that do not fit are refused as in
    /// [`Books::apply_quotas`].
    pub fn adopt(&self, old: Books<'_>, now: Nanos) -> ApplyReport {
        Adopt::of(self.region).adopt(old.region, now)
    }

    /// Changes whenever slots are added, removed or re-linked.
    pub fn generation(&self) -> u64 {
        self.region.generation()
    }

    /// Every live quota id with its slot.
    pub fn slot_ids(&self) -> std::collections::HashMap<u64, crate::table::region::SlotId> {
        crate::table::region::slots::Slots::of(self.region).slot_ids()
    }

    /// Writes the status block: `write` stores into it while readers are
    /// held off by the block's seqlock (and other writers by the writer
    /// lock).
    pub fn write_status(&self, write: impl FnOnce(&crate::table::region::layout::SyncStatus)) {
        self.region.write_status(write)
    }
}
