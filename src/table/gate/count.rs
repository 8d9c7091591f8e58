//! Counting a decision: a pass's weight into every counter of its chain
//! (a key's in place of its template's) and the pass itself, or a
//! rejection on the chain's first quota. A charge after the fact counts
//! the weight alone (`grants.rs`).

use super::chain::Chain;
use super::local::gate_view;
use crate::core::key::KeyHash;
use crate::table::region::keys::Keys;
use crate::table::region::layout::FLAG_QUEUED;
use crate::table::region::ring::DirtySlots;
use crate::table::region::{SlotId, RLX};
use std::sync::atomic::Ordering::SeqCst;

gate_view!(
    /// What a decided check counts.
    Counter
);

impl Counter<'_> {
    /// Counts a rejection (or a dry-run one) on the chain's first quota;
    /// a rejection queues the quota for the next collection, which sends
    /// the count, unless it is queued already.
    pub(in crate::table) fn count_rejected(&self, chain: &Chain, dry_run: bool) {
        let first = &self.slots()[chain.slots[0] as usize];
        if dry_run {
            first.dry_run.fetch_add(1, RLX);
        } else {
            first.rejected.fetch_add(1, SeqCst);
            if first.flags.load(RLX) & FLAG_QUEUED == 0 {
                DirtySlots::of(self).mark(chain.slots[0]);
            }
        }
    }

    /// Counts a passed check: the weight into every counter of the chain
    /// (the key's instead of its template's, for a keyed check), the pass
    /// on the first quota.
    pub(in crate::table) fn commit(
        &self,
        chain: &[SlotId],
        key: u32,
        key_hash: KeyHash,
        weight: u64,
    ) {
        self.add_weight(chain, key, key_hash, weight);
        self.tally_pass(chain[0]);
    }

    /// Counts a passed check on the quota in `slot` (for `sluice_metrics`),
    /// unless this table keeps no such count ([`crate::table::Table::without_pass_tally`]).
    #[inline(always)]
    pub(in crate::table) fn tally_pass(&self, slot: SlotId) {
        if self.local.pass_tally {
            self.slots()[slot as usize].passed.fetch_add(1, RLX);
        }
    }

    /// Adds the weight into every counter of the chain (the key's instead
    /// of its template's, for a keyed item), counting no pass: what a
    /// passed check and a charge ([`crate::table::Gate::charge`]) both count.
    pub(in crate::table) fn add_weight(
        &self,
        chain: &[SlotId],
        key: u32,
        key_hash: KeyHash,
        weight: u64,
    ) {
        let slots = self.slots();
        let counters = if key != 0 {
            Keys::of(self).count_key(key - 1, chain[0], key_hash, weight);
            &chain[1..]
        } else {
            chain
        };
        if weight > 0 {
            for &s in counters {
                // The first weight since the counter was collected queues
                // it for the next collection.
                if slots[s as usize].pending.fetch_add(weight, RLX) == 0 {
                    DirtySlots::of(self).mark(s);
                }
            }
        }
    }
}
