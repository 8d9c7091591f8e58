//! Hold records: which process holds which in-flight slots (see
//! docs/DESIGN.md, "In-flight quotas", and [`HoldRecord`]).
//!
//! A request keeps its slots in its own process's memory (an nginx
//! request's pool) until it gives them back. A process killed with its
//! requests (`kill -9` of a worker) never does: without a record of them
//! in the region, its slots would stay counted for good, at this host and
//! at every root (the host keeps syncing, so its lease never lapses).
//!
//! So a process that takes a slot claims a record naming itself (its pid
//! and start time: a pid reused by a later process is another owner) and
//! the slot's counter, and frees it when it gives the slot back. Records
//! are claimed with one compare-and-swap from a probe start, so requests
//! never wait for each other; a section full along the probe counts the
//! slot as unrecorded and the request goes on (it only loses the
//! reclaim). The sync thread sweeps the records each cycle: one whose
//! owner is dead is taken over (another compare-and-swap, so two sweeps
//! of overlapping sync threads give it back once) and its slot given back
//! through the same path a release takes.

use super::layout::{HOLD_OVERFLOWED, HOLD_READY, HOLD_RECLAIMING};
use super::sections::{region_view, SlotId, ACQ, REL, RLX};
use crate::core::key::KeyHash;
use crate::core::Nanos;
use std::collections::HashMap;

region_view!(
    /// The hold records: slots claimed, freed and reclaimed.
    Holds
);

/// Records a claim looks at before it gives up (the section is then
/// about full).
const PROBES: usize = 64;

/// A slot a dead process held, as its record names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::table) struct Abandoned {
    /// The quota's slot.
    pub slot: SlotId,
    /// The quota's id (the slot may hold another quota by now).
    pub quota: u64,
    /// The key's hash for a per-key quota's key (0: none).
    pub key: KeyHash,
    /// Taken on a per-key template's own counter (its key overflowed).
    pub overflowed: bool,
}

impl Holds<'_> {
    /// Claims a record saying `owner` holds a slot of `held`'s counter.
    /// Returns its number + 1, or 0 when none was free along the probe
    /// (counted in `unrecorded`) or there is no section.
    pub(in crate::table) fn claim(&self, owner: u64, at: Nanos, held: Abandoned) -> u32 {
        let records = self.hold_records();
        if records.is_empty() || owner == 0 || owner == HOLD_RECLAIMING {
            return 0;
        }
        let start = (owner ^ at).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        let start = (start as usize) % records.len();
        for i in (0..PROBES.min(records.len())).map(|p| (start + p) % records.len()) {
            let r = &records[i];
            if r.owner.load(RLX) != 0 || r.owner.compare_exchange(0, owner, ACQ, RLX).is_err() {
                continue;
            }
            r.quota.store(held.quota, RLX);
            r.key.store(held.key, RLX);
            r.slot.store(held.slot, RLX);
            let overflowed = if held.overflowed { HOLD_OVERFLOWED } else { 0 };
            r.state.store(HOLD_READY | overflowed, REL);
            self.header().holds.live.fetch_add(1, RLX);
            return i as u32 + 1;
        }
        self.header().holds.unrecorded.fetch_add(1, RLX);
        0
    }

    /// Frees record `record` (a number [`Holds::claim`] returned) of
    /// `owner`: its slot is being given back. False when it is not
    /// `owner`'s (0, or already taken over).
    pub(in crate::table) fn free(&self, record: u32, owner: u64) -> bool {
        let Some(r) = record
            .checked_sub(1)
            .and_then(|i| self.hold_records().get(i as usize))
        else {
            return false;
        };
        if r.owner.load(RLX) != owner {
            return false;
        }
        r.state.store(0, RLX);
        if r.owner.compare_exchange(owner, 0, REL, RLX).is_err() {
            return false;
        }
        self.header().holds.live.fetch_sub(1, RLX);
        true
    }

    /// Takes over every record whose owner `alive` says is dead (asked
    /// once per owner) and hands its slot to `give_back`; frees them.
    /// Returns the slots handed over. A record claimed but not written
    /// yet when its owner died is freed without a slot.
    pub(in crate::table) fn reclaim(
        &self,
        mut alive: impl FnMut(u64) -> bool,
        mut give_back: impl FnMut(Abandoned),
    ) -> u64 {
        if self.header().holds.live.load(RLX) == 0 {
            return 0;
        }
        let mut owners: HashMap<u64, bool> = HashMap::new();
        let mut given = 0;
        for r in self.hold_records() {
            let owner = r.owner.load(ACQ);
            if owner == 0 || owner == HOLD_RECLAIMING {
                continue;
            }
            if *owners.entry(owner).or_insert_with(|| alive(owner)) {
                continue;
            }
            if r.owner
                .compare_exchange(owner, HOLD_RECLAIMING, ACQ, RLX)
                .is_err()
            {
                continue;
            }
            let state = r.state.load(ACQ);
            if state & HOLD_READY != 0 {
                give_back(Abandoned {
                    slot: r.slot.load(RLX),
                    quota: r.quota.load(RLX),
                    key: r.key.load(RLX),
                    overflowed: state & HOLD_OVERFLOWED != 0,
                });
                given += 1;
            }
            r.state.store(0, RLX);
            r.owner.store(0, REL);
            self.header().holds.live.fetch_sub(1, RLX);
        }
        self.header().holds.reclaimed.fetch_add(given, RLX);
        given
    }

    /// Records in use, slots that found none, and slots given back for a
    /// dead process, so far.
    pub(in crate::table) fn stats(&self) -> HoldStats {
        let h = &self.header().holds;
        HoldStats {
            records: self.hold_records().len() as u64,
            live: h.live.load(RLX),
            unrecorded: h.unrecorded.load(RLX),
            reclaimed: h.reclaimed.load(RLX),
        }
    }
}

/// The hold records' numbers (metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldStats {
    /// Records in the region.
    pub records: u64,
    /// Records in use: slots held by processes that recorded them.
    pub live: u64,
    /// Slots taken that found no free record.
    pub unrecorded: u64,
    /// Slots given back because the process holding them died.
    pub reclaimed: u64,
}
