//! Tiers on the request path: the overrides and penalties a check's
//! chain finds in the tier section applied to it, and a penalty started
//! by a rejection at the high burst of a quota that has a penalty length
//! (see `region/tier_section.rs` for the section, its marks and filter).

use super::chain::Chain;
use crate::core::estimate::estimate_level;
use crate::core::key::KeyHash;
use crate::core::quota::MAX_BURST;
use crate::core::Nanos;
use crate::core::{Estimator, Wait};
use crate::table::gate::outcome::{Cause, Rejection};
use crate::table::region::key_entries::KeyTiers;
use crate::table::region::layout::{
    FLAG_TIERS, TIER_ALLOW, TIER_DENY, TIER_LIMIT, TIER_OUTBOX, TIER_UNSENT,
};
use crate::table::region::tier_section::{EntryFor, TierLock, TierSection, CHECK_LOCK_SPINS};
use crate::table::region::{region_view, SlotId, RLX};
use std::sync::atomic::Ordering::SeqCst;

region_view!(
    /// Overrides and penalties as checks meet them.
    Penalties
);

impl Penalties<'_> {
    /// A check's chain of a flagged quota (or with one flagged among its
    /// ancestors): applies the key's override to its view, and says the
    /// rejection when the key is denied or the key or a quota of the
    /// chain is under a penalty. `key` is the key's hash (0: none); what
    /// its entry said of it is in `chain.key_tiers`.
    #[cold]
    #[inline(never)]
    pub(in crate::table) fn apply_tiers(
        &self,
        chain: &mut Chain,
        key: KeyHash,
        now: Nanos,
    ) -> Option<Rejection> {
        let now_utc = now as i64 + self.utc_offset();
        for depth in 0..chain.len {
            let slot = chain.slots[depth];
            let Some(s) = self.slot(slot) else { continue };
            if s.flags.load(RLX) & FLAG_TIERS == 0 {
                continue;
            }
            let Some(id) = s.quota_id() else { continue };
            let keyed = depth == 0 && key != 0;
            if keyed {
                let look = match chain.key_tiers {
                    KeyTiers::Clear => false,
                    KeyTiers::Marked => true,
                    KeyTiers::Unknown => TierSection::of(self).tier_filter_holds(id, key),
                };
                if !look {
                    continue;
                }
            }
            let Some(read) = TierSection::of(self).tier(id, if keyed { key } else { 0 }) else {
                continue;
            };
            let view = &chain.views()[depth];
            let barred = |cause, wait| Rejection {
                depth,
                slot,
                limit: view.limit,
                wait,
                key: if keyed { key } else { 0 },
                cause,
            };
            if read.until > now_utc {
                self.header().tiers.penalized.fetch_add(1, RLX);
                let seconds = (read.until - now_utc) as f64 * 1e-9;
                return Some(barred(Cause::Penalty, Wait::Seconds(seconds)));
            }
            if !keyed {
                continue;
            }
            match read.kind_at(now_utc) {
                TIER_DENY => {
                    self.header().tiers.denied.fetch_add(1, RLX);
                    return Some(barred(
                        Cause::Denied,
                        Wait::Never(crate::core::Never::Denied),
                    ));
                }
                TIER_ALLOW => {
                    let v = chain.view_mut(depth);
                    v.low_burst = MAX_BURST;
                    v.high_burst = MAX_BURST;
                }
                TIER_LIMIT => {
                    let v = chain.view_mut(depth);
                    v.limit = read.limit;
                    v.low_burst = read.low_burst;
                    v.high_burst = read.high_burst;
                }
                _ => {}
            }
        }
        None
    }

    /// After a check of a flagged chain was rejected: when the quota that
    /// rejected has a penalty and the request went past its high burst
    /// (not a draw in the band), starts the penalty and makes the
    /// rejection say so.
    #[cold]
    #[inline(never)]
    pub(in crate::table) fn maybe_penalize(
        &self,
        chain: &Chain,
        key: KeyHash,
        rejection: &mut Rejection,
        weight: u64,
        now: Nanos,
        estimator: &Estimator,
    ) {
        let depth = rejection.depth;
        if depth == 0 && chain.overflow {
            // Decided on the template's own counter, which stands for
            // every key that found no entry: nothing this key did.
            return;
        }
        let Some(s) = self.slot(chain.slots[depth]) else {
            return;
        };
        if s.flags.load(RLX) & FLAG_TIERS == 0 {
            return;
        }
        let Some(id) = s.quota_id() else { return };
        let Some(secs) = TierSection::of(self)
            .tier(id, 0)
            .map(|r| r.penalty_secs)
            .filter(|&secs| secs > 0)
        else {
            return;
        };
        let view = &chain.views()[depth];
        let level = estimate_level(view, now, estimator);
        let over = if weight == 0 {
            level >= view.high_burst
        } else {
            level + weight as f64 > view.high_burst
        };
        if !over {
            return;
        }
        let key = if depth == 0 { key } else { 0 };
        let until = now as i64 + self.utc_offset() + i64::from(secs) * 1_000_000_000;
        if self.start_penalty(chain.slots[depth], id, key, until) {
            rejection.cause = Cause::Penalty;
            rejection.wait = Wait::Seconds(f64::from(secs));
            rejection.key = key;
        }
    }

    /// Starts (or lengthens) the penalty of `(quota, key)`, the quota in
    /// slot `slot`, until `until` (UTC nanoseconds) from the request
    /// path, and queues it for the roots. False when the tier lock was
    /// busy or the section full.
    fn start_penalty(&self, slot: SlotId, quota: u64, key: KeyHash, until: i64) -> bool {
        let t = &self.header().tiers;
        let Some(lock) = TierLock::acquire(&t.lock, Some(CHECK_LOCK_SPINS)) else {
            return false;
        };
        let made_for = EntryFor::Penalty { until };
        let Some(e) = TierSection::of(self).tier_entry_for(&lock, quota, key, made_for) else {
            return false;
        };
        TierSection::of(self).mark_added(slot, key);
        if (e.until.fetch_max(until as u64, SeqCst) as i64) >= until {
            return true;
        }
        t.started.fetch_add(1, RLX);
        if e.rule.fetch_or(TIER_UNSENT, RLX) & TIER_UNSENT == 0 {
            let n = t.outbox_len.load(RLX) as usize;
            if n < TIER_OUTBOX {
                t.outbox[n][0].store(quota, RLX);
                t.outbox[n][1].store(key, RLX);
                t.outbox_len.store(n as u32 + 1, RLX);
            } else {
                t.outbox_full.store(1, RLX);
            }
        }
        true
    }
}
