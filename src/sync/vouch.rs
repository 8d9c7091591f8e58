//! What a complete reply vouches for: the counters a root leaves out of
//! it did not change there up to the root's clock. The engine keeps the
//! counters that changed recently ([`Recent`]) and, at the end of each
//! cycle, tells the table that those no root reported stood still, which
//! ends their extrapolation (see [`Recent`] for why it matters).

use crate::core::{Level, Nanos, Tally};
use crate::table::{SlotId, Table};
use crate::wire::CounterKey;

use super::ids::CounterMap;
use super::routing::shard;

/// Cycles a counter stays in [`Recent`] without changing: by then its fill
/// rate has been halved this many times (to 1/65536 of what it was).
const QUIET_CYCLES: u32 = 16;

/// Counters whose cluster value changed in the last [`QUIET_CYCLES`]
/// cycles, and what this cycle's replies said about them.
///
/// Roots send a counter only when it changed since the limiter's last
/// version. Between syncs the table extrapolates the others' weight at
/// their measured fill rate for up to a horizon after the counter's last
/// known value, and the rate is only measured when a new value is merged.
/// So when the whole fleet stops adding to a counter (the load ended, or
/// every host rejects after a burst), no new value ever arrives: the old
/// rate keeps being extrapolated, the estimate stays up to
/// `fill_rate * horizon` above the truth, and the hosts keep rejecting
/// because of it (scenario `8-bursts-churn`: seconds of rejections after
/// each burst). A complete reply that leaves a counter out is itself a
/// measurement: nothing was added at that root up to its clock. Merging
/// an empty level at that time says exactly that to the table: the level
/// leaks on, the extrapolation restarts from then and the fill rate is
/// measured as zero for the span.
#[derive(Default, Debug)]
pub(super) struct Recent {
    /// Counter to what is tracked of it.
    by_counter: CounterMap<Tracked>,
    /// Number of the current settling round: counters reported since the
    /// last [`Recent::settle`] carry it.
    round: u64,
    /// Per root group, the local time up to which this cycle's complete
    /// replies vouch that unreported counters of its shard did not change
    /// (the earliest of them: the roots answer at different times).
    quiet_until: Vec<Option<Nanos>>,
}

/// A recently changed counter.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    /// Where it lives.
    slot: SlotId,
    /// Settling rounds in a row it did not change.
    quiet: u32,
    /// The round in which a root last reported it.
    reported: u64,
}

impl Recent {
    pub(super) fn changed(&mut self, counter: CounterKey, slot: SlotId) {
        let reported = self.round;
        self.by_counter.insert(
            counter,
            Tracked {
                slot,
                quiet: 0,
                reported,
            },
        );
    }

    /// Notes that a complete reply of `group` vouches for its shard up to
    /// `at`.
    pub(super) fn vouch(&mut self, group: usize, at: Nanos) {
        if self.quiet_until.len() <= group {
            self.quiet_until.resize(group + 1, None);
        }
        let until = &mut self.quiet_until[group];
        *until = Some(until.map_or(at, |u| u.min(at)));
    }

    /// Tells the table that every recent counter no root of its group
    /// reported did not change up to that group's `quiet_until`, and
    /// forgets counters quiet for long.
    pub(super) fn settle(&mut self, table: &Table, groups: usize) {
        let until = std::mem::take(&mut self.quiet_until);
        if until.iter().any(Option::is_some) {
            let round = self.round;
            self.by_counter.retain(|c, t| {
                if t.reported == round {
                    return true;
                }
                let Some(at) = until.get(shard(*c, groups)).copied().flatten() else {
                    // Nobody vouched for its shard: kept as it is.
                    return true;
                };
                t.quiet += 1;
                let nothing = Tally::leaky(Level::empty(at));
                table
                    .books()
                    .merge_counter(t.slot, c.id, c.key, nothing, 0, 0)
                    && t.quiet < QUIET_CYCLES
            });
        }
        self.round += 1;
    }
}
