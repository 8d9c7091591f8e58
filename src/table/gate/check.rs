//! The request path's checks: one or several quotas a request asks for,
//! decided and counted together.
//!
//! Every plain or paced check, whatever its entry point (nginx's several
//! checks per request, the C ABI's one, the simulator's, a benchmark's by
//! slot), goes through one path, `decide_and_count`: read each
//! item's chain (`chain.rs`), decide it with [`crate::core::check_chain`]
//! (or pace it with [`crate::core::reserve_wait`]), and only when every
//! item passed count each one (check all, then commit). The entry points
//! differ only in how they find a chain; a single plain item takes
//! `check_one`, the same steps without the bookkeeping of
//! several. Partial grants, one-item reservations and weight given back
//! are in `grants.rs`. Nothing here takes the writer lock.

use super::local::gate_view;
use crate::core::estimate::Estimator;
use crate::core::key::KeyHash;
use crate::core::quota::MAX_WEIGHT;
use crate::core::Nanos;
use crate::table::region::{SlotId, RLX};
use std::mem::MaybeUninit;

use super::chain::{Chain, Resolved};
use super::count::Counter;
use super::fast::Fast;
use super::fast::FastPath;
use super::outcome::{
    CheckItem, CheckOptions, Commit, Headroom, ManyOutcome, Outcome, Rejection, MAX_CHECKS,
};
use super::penalties::Penalties;
use super::read::Reader;

gate_view!(
    /// The request path's checks.
    Checker
);

impl Checker<'_> {
    /// The fast path is tried (always, but in tests that turn it off).
    #[inline(always)]
    fn fast_path_on(&self) -> bool {
        #[cfg(test)]
        return self.local.fast_path;
        #[cfg(not(test))]
        true
    }

    /// Checks `name` for a request of `weight` at `now`, drawing from this
    /// thread's PRNG; on pass the weight is counted in the whole chain.
    pub(in crate::table) fn check(&self, name: &[u8], weight: u64, now: Nanos) -> Outcome {
        self.check_with(name, weight, now, crate::core::rng::thread_unit)
    }

    /// [`crate::table::Gate::check`] with the random draws supplied (for tests and the
    /// simulator).
    pub(in crate::table) fn check_with(
        &self,
        name: &[u8],
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        let item = CheckItem {
            name,
            key: None,
            weight,
            max_wait: None,
        };
        self.check_many(&[item], now, CheckOptions::default(), draw)
            .outcome
    }

    /// Checks the quota in slot `first`, found without a name lookup (a
    /// caller that kept the slot; the benchmarks measure the lookup apart
    /// with it). A slot that holds no quota passes as an unknown name.
    pub(in crate::table) fn check_slot(
        &self,
        first: SlotId,
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        let read = |_, chain: &mut Chain| {
            if !self.view(Reader::of).read_chain(first, chain) {
                return Resolved::Unknown;
            }
            if chain.tiers {
                if let Some(barred) = Penalties::of(self).apply_tiers(chain, 0, now) {
                    return Resolved::Barred(barred);
                }
            }
            Resolved::Counted(weight, None)
        };
        self.decide_and_count(1, read, now, CheckOptions::default(), draw)
            .outcome
    }

    /// Checks several quotas for one request (several `sluice` directives
    /// in one nginx location): the request passes only if every known quota
    /// and all their ancestors pass, and only then is each weight counted
    /// (check all, then commit). Unknown names are skipped. At most
    /// [`MAX_CHECKS`] items are checked; later ones are ignored.
    ///
    /// Inlined, with the fast paths of a single item (`check_one`), into
    /// each caller (through [`crate::table::Gate::check_many`]); all else
    /// is out of line (`check_several`, `check_one_general`). So a single
    /// check passed on a fast path runs in its caller's body, with a
    /// small stack frame, rather than inside the general path's large one
    /// (its spills, the arguments and its answer passed through memory):
    /// a hot keyed check through the C ABI runs 505 instructions instead
    /// of 587 and takes 27.0 ns instead of 29.8, a named one 309 instead
    /// of 335 (BENCHMARKS.md, "Hot path before and after issue 33's two
    /// faces").
    #[inline(always)]
    pub(in crate::table) fn check_many(
        &self,
        items: &[CheckItem],
        now: Nanos,
        options: CheckOptions,
        draw: impl FnMut() -> f64,
    ) -> ManyOutcome {
        if let [item] = items {
            if item.max_wait.is_none() && !options.headroom {
                return self.check_one(item, now, options.dry_run, draw);
            }
        }
        self.check_several(items, now, options, draw)
    }

    /// [`Checker::check_many`] of several items, or of one with a wait
    /// or headroom asked for.
    #[inline(never)]
    fn check_several(
        &self,
        items: &[CheckItem],
        now: Nanos,
        options: CheckOptions,
        draw: impl FnMut() -> f64,
    ) -> ManyOutcome {
        let read =
            |i: usize, chain: &mut Chain| self.view(Reader::of).resolve(&items[i], chain, now);
        self.decide_and_count(items.len(), read, now, options, draw)
    }

    /// [`crate::table::Gate::check_many`] of one plain item without headroom (the C
    /// ABI's checks, nginx's single `sluice` directive without headers):
    /// the same reading, decision and counting, without the bookkeeping
    /// of several items (a fifth of a hot keyed check's instructions). An
    /// item tries a fast path first (`fast.rs`: the keyed one, or the
    /// named one without a key); what it declines is decided here from
    /// the start, with the key's hash it computed.
    #[inline(always)]
    fn check_one(
        &self,
        item: &CheckItem,
        now: Nanos,
        dry_run: bool,
        draw: impl FnMut() -> f64,
    ) -> ManyOutcome {
        let mut key_hash = None;
        if self.fast_path_on() {
            let fast = self.view(FastPath::of);
            let tried = match item.key.filter(|k| !k.is_empty()) {
                Some(key) => fast.check_key_fast(item.name, key, item.weight, now),
                None => fast.check_named_fast(item.name, item.weight),
            };
            match tried {
                Fast::Passed => return one_outcome(Outcome::Pass, None),
                Fast::Declined(hash) => key_hash = hash,
            }
        }
        self.check_one_general(item, now, dry_run, draw, key_hash)
    }

    /// `check_one` of what its fast path declined (or of every item, in
    /// tests that turn the fast paths off), given the key's hash the fast
    /// path computed.
    #[inline(never)]
    fn check_one_general(
        &self,
        item: &CheckItem,
        now: Nanos,
        dry_run: bool,
        draw: impl FnMut() -> f64,
        key_hash: Option<KeyHash>,
    ) -> ManyOutcome {
        let outcome = one_outcome;
        let mut chain = Chain::new();
        let weight = match self.resolve_counted(item, &mut chain, now, dry_run, key_hash) {
            Ok(weight) => weight,
            Err(Outcome::Reject(rejection)) => {
                return ManyOutcome {
                    overflow: chain.overflow,
                    ..outcome(Outcome::Reject(rejection), Some(0))
                }
            }
            Err(other) => {
                return ManyOutcome {
                    overflow: chain.overflow,
                    ..outcome(other, None)
                }
            }
        };
        let estimator = self.estimator();
        let decided = chain.check(weight, now, &estimator, draw);
        let overflow = chain.overflow;
        match decided {
            Ok(()) => {
                self.view(Counter::of).commit(
                    &chain.slots[..chain.len],
                    chain.key,
                    chain.key_hash,
                    weight,
                );
                ManyOutcome {
                    overflow,
                    ..outcome(Outcome::Pass, None)
                }
            }
            Err(mut rejection) => {
                if !dry_run {
                    self.penalize(&chain, &mut rejection, weight, now, &estimator);
                }
                self.view(Counter::of).count_rejected(&chain, dry_run);
                ManyOutcome {
                    overflow,
                    ..outcome(Outcome::Reject(rejection), Some(0))
                }
            }
        }
    }

    /// The one decide-and-count path: `read(i, chain)` fills `chain` with
    /// item `i`'s quota (or key) and ancestors and says what to count, or
    /// that the item is skipped (an unknown quota, counted in
    /// `unknown_checks`; a per-key quota without a key; a key with no
    /// entry). Items are decided in order; the first rejection ends the
    /// check with nothing counted; when every item passed, each is
    /// counted.
    #[inline]
    fn decide_and_count(
        &self,
        items: usize,
        mut read: impl FnMut(usize, &mut Chain) -> Resolved,
        now: Nanos,
        options: CheckOptions,
        mut draw: impl FnMut() -> f64,
    ) -> ManyOutcome {
        let estimator = self.estimator();
        // Passed items but the last are kept as commits; the last one is
        // still in `chain` (`last`), so a request of one check copies
        // nothing.
        let mut commits = [MaybeUninit::<Commit>::uninit(); MAX_CHECKS];
        let mut known = 0;
        let mut last: Option<u64> = None;
        let mut keyless = false;
        let mut overflow = false;
        let mut headroom: Option<Headroom> = None;
        let mut wait: Nanos = 0;
        let mut wait_item: Option<usize> = None;
        let mut chain = Chain::new();
        // A rejection of item `i` (its chain read): counted, nothing else.
        let rejected = |chain: &Chain, i: usize, rejection: Rejection, overflow: bool| {
            self.view(Counter::of)
                .count_rejected(chain, options.dry_run);
            let headroom = options
                .headroom
                .then(|| chain.headroom(i, rejection.depth, 0.0, now, &estimator));
            ManyOutcome {
                outcome: Outcome::Reject(rejection),
                item: Some(i),
                headroom,
                wait: 0,
                overflow,
            }
        };
        for i in 0..items.min(MAX_CHECKS) {
            if let Some(weight) = last.take() {
                commits[known].write(chain.commit(weight));
                known += 1;
            }
            let (weight, max_wait) = match read(i, &mut chain) {
                Resolved::Counted(weight, max_wait) => (weight, max_wait),
                Resolved::Unknown => {
                    self.header().unknown_checks.fetch_add(1, RLX);
                    continue;
                }
                Resolved::NoKey => {
                    self.header().keys.place.keyless.fetch_add(1, RLX);
                    keyless = true;
                    continue;
                }
                Resolved::OverflowPass => {
                    overflow = true;
                    continue;
                }
                Resolved::OverflowReject(rejection) => {
                    return rejected(&chain, i, rejection, true);
                }
                Resolved::Barred(rejection) => {
                    return rejected(&chain, i, rejection, overflow || chain.overflow);
                }
            };
            overflow |= chain.overflow;
            let weight = weight.min(MAX_WEIGHT);
            let decided = match max_wait {
                None => chain.check(weight, now, &estimator, &mut draw),
                Some(max_wait) => chain.pace(weight, max_wait, now, &estimator).map(|ns| {
                    if ns > wait {
                        wait = ns;
                        wait_item = Some(i);
                    }
                }),
            };
            if let Err(mut rejection) = decided {
                if max_wait.is_none() && !options.dry_run {
                    self.penalize(&chain, &mut rejection, weight, now, &estimator);
                }
                return rejected(&chain, i, rejection, overflow);
            }
            if options.headroom {
                let h = chain.tightest(i, weight as f64, now, &estimator);
                if headroom.is_none_or(|best| h.room.slack() < best.room.slack()) {
                    headroom = Some(h);
                }
            }
            last = Some(weight);
        }
        for c in &commits[..known] {
            // SAFETY: the loop above wrote the first `known` commits.
            let c = unsafe { c.assume_init_ref() };
            let counted = &c.slots[..c.len];
            self.view(Counter::of)
                .commit(counted, c.key, c.key_hash, c.weight);
        }
        let outcome = match last {
            Some(weight) => {
                self.view(Counter::of).commit(
                    &chain.slots[..chain.len],
                    chain.key,
                    chain.key_hash,
                    weight,
                );
                Outcome::Pass
            }
            None if known > 0 => Outcome::Pass,
            None if overflow => Outcome::KeyOverflow,
            None if keyless => Outcome::NoKey,
            None => Outcome::Unknown,
        };
        let passed = outcome == Outcome::Pass;
        ManyOutcome {
            outcome,
            item: if passed { wait_item } else { None },
            headroom,
            wait: if passed { wait } else { 0 },
            overflow,
        }
    }

    /// A check rejected on `chain` may start a penalty (a template with
    /// tiers: see `penalties.rs`).
    fn penalize(
        &self,
        chain: &Chain,
        rejection: &mut Rejection,
        weight: u64,
        now: Nanos,
        estimator: &Estimator,
    ) {
        if chain.tiers {
            Penalties::of(self).maybe_penalize(
                chain,
                chain.tier_key,
                rejection,
                weight,
                now,
                estimator,
            );
        }
    }

    /// Resolves a single item for [`crate::table::Gate::obtain`] and
    /// [`crate::table::Gate::reserve`]: its weight (capped at [`MAX_WEIGHT`]) with its
    /// chain read, or the outcome of an item that is not checked or is
    /// rejected before any decision (counted as [`crate::table::Gate::check_many`]
    /// counts it; `chain.overflow` set for a key that found no entry).
    pub(in crate::table) fn resolve_counted(
        &self,
        item: &CheckItem,
        chain: &mut Chain,
        now: Nanos,
        dry_run: bool,
        key_hash: Option<KeyHash>,
    ) -> Result<u64, Outcome> {
        match self
            .view(Reader::of)
            .resolve_hashed(item, chain, now, key_hash)
        {
            Resolved::Counted(weight, _) => Ok(weight.min(MAX_WEIGHT)),
            Resolved::Unknown => {
                self.header().unknown_checks.fetch_add(1, RLX);
                Err(Outcome::Unknown)
            }
            Resolved::NoKey => {
                self.header().keys.place.keyless.fetch_add(1, RLX);
                Err(Outcome::NoKey)
            }
            Resolved::OverflowPass => Err(Outcome::KeyOverflow),
            Resolved::OverflowReject(rejection) | Resolved::Barred(rejection) => {
                self.view(Counter::of).count_rejected(chain, dry_run);
                Err(Outcome::Reject(rejection))
            }
        }
    }
}

/// The answer to a check of one item.
fn one_outcome(outcome: Outcome, item: Option<usize>) -> ManyOutcome {
    ManyOutcome {
        outcome,
        item,
        headroom: None,
        wait: 0,
        overflow: false,
    }
}
