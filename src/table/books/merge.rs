//! The one merge of a root's value into a counter, a named quota's or a
//! key's: which value wins, which root's the counter's level is from then
//! on, and the other hosts' fill rate measured across the merge. The
//! callers only read the counter they hold and store what this returns.
//!
//! The "same root" rule (docs/DESIGN.md, "Counters that give units
//! back"): a reply replaces the known level, lower or not, when the known
//! level is that root's own earlier value ([`Source`] equal), or when it
//! is a level this host folded its own weight into while the counter's
//! roots were silent and the counter does not leak ([`FOLDED`], an
//! in-flight counter's, named or a key's): the first reply after the
//! fold holds what this host sent with the same request. Any other reply
//! is max-merged.

use super::tally::measure_rate;
use crate::core::estimate::Acked;
use crate::core::{Counting, Nanos, Tally};
use crate::table::region::layout::{Source, FOLDED};

/// What a merge makes of a counter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::table) struct Merged {
    /// The counter's tally after the merge.
    pub(in crate::table) tally: Tally,
    /// The root's value was taken: the counter's source is that root's now.
    pub(in crate::table) taken: bool,
    /// The other hosts' fill rate to keep (the old one over too short a
    /// span).
    pub(in crate::table) rate: f64,
}

/// A counter as a merge finds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::table) struct Known {
    /// Its tally.
    pub(in crate::table) tally: Tally,
    /// Which root's value it is ([`Source`]).
    pub(in crate::table) source: Source,
    /// The other hosts' fill rate measured so far.
    pub(in crate::table) rate: f64,
}

/// True when a reply of `source` replaces a level known from `known`
/// rather than being max-merged with it (see the module doc).
pub(in crate::table) fn replaces(known: Source, source: Source) -> bool {
    source != 0 && (known == source || known == FOLDED)
}

/// Merges `value`, a reply of root `source` that acknowledges `acked` of
/// this host's weight (added and given back), into a counter counting so
/// and found as `known`.
///
/// The rate is measured over a span of at least a quarter of the
/// extrapolation `horizon` (half an interval): several roots answering
/// one cycle milliseconds apart must not turn a few units into a huge
/// rate. The host's own weight in the merged level is what the reply
/// acknowledges when its value is taken; when the known level wins the
/// max, none of it (that level is another root's older value), so a
/// return the reply acknowledges is not read as the others' fill.
pub(in crate::table) fn merge(
    counting: &Counting,
    known: Known,
    (value, source): (Tally, Source),
    acked: Acked,
    horizon: Nanos,
) -> Merged {
    let (tally, taken) = counting.merge_reply(known.tally, value, replaces(known.source, source));
    let span = tally.at.saturating_sub(known.tally.at);
    let rate = if span >= horizon / 4 {
        let own = if taken { acked } else { Acked::default() };
        measure_rate(counting, known.tally, tally, own, known.rate)
    } else {
        known.rate
    };
    Merged { tally, taken, rate }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Level;

    fn at(level: f64, at: Nanos) -> Tally {
        Tally::leaky(Level { level, at })
    }

    #[test]
    fn the_same_root_or_a_fold_is_replaced_and_another_root_is_max_merged() {
        assert!(replaces(3, 3));
        assert!(replaces(FOLDED, 3));
        assert!(!replaces(2, 3));
        assert!(!replaces(0, 3));
        assert!(!replaces(3, 0), "a local fold never replaces");
    }

    #[test]
    fn a_lower_reply_wins_only_where_it_replaces() {
        let counting = Counting::Leak(0.0);
        let known = Known {
            tally: at(5.0, 1_000),
            source: 1,
            rate: 0.0,
        };
        let none = Acked::default();
        let m = merge(&counting, known, (at(2.0, 2_000), 1), none, 0);
        assert_eq!((m.tally.level, m.taken), (2.0, true));
        let m = merge(&counting, known, (at(2.0, 2_000), 2), none, 0);
        assert_eq!(m.tally.level, 5.0);
    }

    /// Issue 34, case 3, with two roots: the first to answer after a
    /// return acknowledges it, but its value loses the max to the other
    /// root's earlier, higher one. That level does not hold the return,
    /// so the return is not read as the others' fill (it was: a fill
    /// rate of 0.5/s from 1 unit given back).
    #[test]
    fn a_return_acknowledged_with_a_value_that_loses_the_max_is_no_fill() {
        let counting = Counting::Leak(2.0);
        // 4 from root 2 at 3 s; root 1 answers 1 at 4 s (4 leaked to 2,
        // less the 1 given back).
        let known = Known {
            tally: at(4.0, 3_000_000_000),
            source: 2,
            rate: 0.0,
        };
        let back = Acked {
            added: 0,
            returned: 1,
        };
        let m = merge(
            &counting,
            known,
            (at(1.0, 4_000_000_000), 1),
            back,
            2_000_000_000,
        );
        assert_eq!((m.tally.level, m.taken, m.rate), (2.0, false, 0.0));
    }
}
