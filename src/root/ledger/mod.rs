//! A root's in-memory state: quotas, counters and limiters, and the sync
//! step that ties them together.
//!
//! Pure state with time passed in, shared by the HTTP handlers without an
//! outer lock: quotas behind a read-write lock, limiters behind a mutex
//! held briefly, counters in shards each under its own lock (see
//! [`super::counter_shards`]). Parsing and serialisation happen outside
//! every lock.
//!
//! # Layout
//!
//! - `mod.rs` — the ledger, its quotas, limiters and counters, and the
//!   sync step: weight applied once per numbered request, held slots,
//!   leases, the counters and quota pages a reply carries;
//! - `held.rs` — held slots reported absolute (named and keys'): set,
//!   not added, and the adds and returns they cover passed over;
//! - `tiers.rs` — overrides and penalties: loaded, started by limiters,
//!   answered to a sync; a key's rule under its override.

use crate::core::{Nanos, Quota};
use crate::wire::{CounterKey, RefusedKeys, Sequence, SyncRequest, SyncResponse, TierReply};

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

#[cfg(test)]
pub(crate) use tests::test_request;

use super::counter_book::{AllowanceShape, ChangedCounters, Delta, KeyLimits, Uncounted};
use super::counter_shards::{Asker, CounterSizes, Counters, CountersView};
use super::in_flight::lease_expired;
use super::limiters::Limiters;
use super::quota_book::{QuotaBook, QuotaChange, QuotaPage};
use super::tier_book::{OverrideBook, PenaltyBook};
use super::trust::{counter_rule, plausible_rejections, DEFAULT_CAP_SECONDS, FREE_SECONDS};

mod held;
mod tiers;

use held::{in_flight_limit, reported};

/// Page sizes of a sync reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPaging {
    /// Most quotas per reply.
    pub quotas: usize,
    /// Most counters per reply.
    pub counters: usize,
}

/// A request's `(counter, delta)` pairs: named ones, then keys' by
/// template (its deltas, or its returns).
fn counter_deltas<'a>(
    named: &'a [crate::wire::CounterDelta],
    keyed: &'a [crate::wire::KeyedDeltas],
) -> impl Iterator<Item = (CounterKey, Delta)> + Clone + 'a {
    let delta = |weight: u64, window| Delta {
        weight: weight as f64,
        window,
    };
    let named = named
        .iter()
        .map(move |d| (CounterKey::named(d.id), delta(d.delta, d.window)));
    let keyed = keyed.iter().flat_map(move |group| {
        group.deltas.iter().map(move |d| {
            let counter = CounterKey {
                id: group.id,
                key: d.0,
            };
            (counter, delta(d.1, group.window))
        })
    });
    named.chain(keyed)
}

/// One part of a sync's weight: its deltas, returns and rejection counts.
#[derive(Clone, Copy)]
struct Weight<'a> {
    /// The request's held slots ([`SyncRequest::held`]): the adds and
    /// returns of those counters are not taken, the held count covers
    /// them.
    held: &'a [(u64, u64)],
    /// The request's held slots of keys ([`SyncRequest::keyed_held`]),
    /// likewise.
    keyed_held: &'a [crate::wire::KeyedDeltas],
    deltas: &'a [crate::wire::CounterDelta],
    keyed: &'a [crate::wire::KeyedDeltas],
    returned: &'a [crate::wire::CounterDelta],
    keyed_returned: &'a [crate::wire::KeyedDeltas],
    rejected: &'a [(u64, u64)],
}

/// What one sync did and what goes back to the limiter.
#[derive(Clone, Debug, Default)]
pub struct SyncStep {
    /// Quotas after the limiter's cursor.
    pub quotas: QuotaPage,
    /// Counters changed since the limiter's version.
    pub counters: ChangedCounters,
    /// Deltas added to counters.
    pub applied: usize,
    /// Deltas for unknown or deleted quotas, dropped.
    pub ignored: usize,
    /// Deltas and returns cut to the limiter's allowance (in part or
    /// whole).
    pub clipped: usize,
    /// Weight cut from them.
    pub clipped_weight: f64,
    /// Units given back to counters (returns granted).
    pub returned_weight: f64,
    /// Rejections cut from the request's counts, more than its limiter
    /// could have made ([`super::trust::plausible_rejections`]).
    pub rejections_clipped: u64,
    /// Overrides after the limiter's cursor, penalties changed since its
    /// version.
    pub tiers: TierReply,
    /// Numbered parts of the request (replayed ones, or its own) applied
    /// before: their weight, returns and rejections were not counted
    /// again.
    pub duplicates: u32,
    /// The highest number of the request's sync thread applied here, this
    /// request's parts included (0 for an unnumbered request).
    pub applied_through: u64,
    /// Keys whose deltas made no counter: the limiter holds its share of
    /// the root's keys, or the root holds `max_keys` (see
    /// [`SyncResponse::refused`]).
    pub refused: Vec<CounterKey>,
    /// The root answers by interest ([`Ledger::by_interest`]).
    pub takes_interest: bool,
    /// Some shard holds no record of the limiter's keys: the reply asks
    /// for its whole list.
    pub wants_interest: bool,
}

impl SyncStep {
    /// The reply to the limiter: what `POST /v1/sync` sends and the
    /// simulated root answers, from root `instance` at root time `now`.
    pub fn into_response(self, instance: u64, now: Nanos, utc_offset: i64) -> SyncResponse {
        SyncResponse {
            root_instance: instance,
            root_time: now,
            root_utc: Some(now as i64 + utc_offset),
            quotas: self
                .quotas
                .quotas
                .iter()
                .map(|q| q.as_ref().clone())
                .collect(),
            quotas_after: self.quotas.after,
            more_quotas: self.quotas.more,
            counters: self.counters.counters,
            keyed: self.counters.keyed,
            counter_version: self.counters.version,
            takes_returns: true,
            takes_tiers: true,
            takes_sequence: true,
            takes_held: true,
            takes_keyed_held: true,
            takes_interest: self.takes_interest,
            wants_interest: self.wants_interest,
            applied_through: self.applied_through,
            tiers: self.tiers,
            refused: RefusedKeys::by_template(self.refused),
        }
    }
}

/// Sizes for metrics and health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerStats {
    /// Live quotas.
    pub quotas: usize,
    /// Tombstones held.
    pub tombstones: usize,
    /// The counters' sizes and what they refused, summed over the shards.
    pub sizes: CounterSizes,
    /// Epoch of the last quota or override loaded.
    pub epoch: u64,
    /// Last counter version handed out.
    pub counter_version: u64,
    /// Limiters held in the registry.
    pub limiters: usize,
    /// Limiters forgotten, by [`super::limiters::Dropped`].
    pub limiters_dropped: [u64; 2],
}

/// Quotas, counters and limiters of one root, shared by every sync.
///
/// Locks, always taken in this order and never the other way round:
/// `quotas` (read by syncs, written by a reload), `limiters` (briefly, at a
/// sync's start and end), the counter shards one at a time in ascending
/// order (see [`super::counter_shards`]). Only [`Ledger::read`] holds them
/// all at once, for the admin API.
#[derive(Debug)]
pub struct Ledger {
    /// The quota set loaded from the database.
    pub quotas: RwLock<QuotaBook>,
    /// The cluster counters and the limiters' allowances on them, in
    /// shards.
    pub counters: Counters,
    /// The limiters that synced.
    pub limiters: Mutex<Limiters>,
    /// UTC nanoseconds minus the root's clock: where window quotas' windows
    /// fall (0 in a simulation, whose clock is its own).
    pub utc_offset: i64,
    /// Seconds of `limit` above two `high_burst`s at which a leaky
    /// counter is capped (see [`super::trust`]).
    pub level_cap_seconds: f64,
    /// The overrides loaded from the database (taken after `quotas`
    /// when both are held).
    pub overrides: RwLock<OverrideBook>,
    /// The penalties limiters started (taken after `quotas`, never
    /// with the counter shards).
    pub penalties: Mutex<PenaltyBook>,
    /// How long a limiter keeps the in-flight slots it holds without
    /// syncing (see [`super::in_flight`]), nanoseconds.
    pub in_flight_lease: Nanos,
    /// Replies carry only the keys' counters each limiter holds (see
    /// [`super::interest`]); false: every changed counter, as a root
    /// that predates interest (the simulator's comparison).
    pub by_interest: bool,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            overrides: RwLock::default(),
            penalties: Mutex::default(),
            quotas: RwLock::default(),
            counters: Counters::default(),
            limiters: Mutex::default(),
            utc_offset: 0,
            level_cap_seconds: DEFAULT_CAP_SECONDS,
            in_flight_lease: super::in_flight::DEFAULT_LEASE.as_nanos() as Nanos,
            by_interest: true,
        }
    }
}

/// Everything of a [`Ledger`] held at once, for reads that must see one
/// state (the admin API): syncs wait while it is held.
pub struct LedgerView<'a> {
    /// The quota set.
    pub quotas: RwLockReadGuard<'a, QuotaBook>,
    /// The limiters.
    pub limiters: MutexGuard<'a, Limiters>,
    /// Every counter shard.
    pub counters: CountersView<'a>,
    /// As [`Ledger::utc_offset`].
    pub utc_offset: i64,
    /// Epoch of the last override loaded.
    pub override_epoch: u64,
}

impl LedgerView<'_> {
    /// Sizes for metrics and health.
    pub fn stats(&self) -> LedgerStats {
        LedgerStats {
            quotas: self.quotas.live(),
            tombstones: self.quotas.tombstones(),
            sizes: self.counters.sizes(),
            epoch: self.quotas.cursor().epoch.max(self.override_epoch),
            counter_version: self.counters.version(),
            limiters: self.limiters.len(),
            limiters_dropped: self.limiters.dropped(),
        }
    }
}

impl Ledger {
    /// An empty ledger holding at most `max_keys` key counters (a
    /// limiter's share by [`KeyLimits::new`]).
    pub fn with_max_keys(max_keys: usize) -> Self {
        Self::with_key_limits(KeyLimits::new(max_keys, None))
    }

    /// An empty ledger holding key counters within `limits`.
    pub fn with_key_limits(limits: KeyLimits) -> Self {
        Self {
            counters: Counters::with_key_limits(limits),
            ..Self::default()
        }
    }

    /// Locks the limiters.
    pub fn limiters(&self) -> MutexGuard<'_, Limiters> {
        self.limiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn quotas_read(&self) -> RwLockReadGuard<'_, QuotaBook> {
        self.quotas
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Holds everything at once (see [`LedgerView`]).
    pub fn read(&self) -> LedgerView<'_> {
        let quotas = self.quotas_read();
        let override_epoch = self.overrides().cursor().epoch;
        let limiters = self.limiters();
        LedgerView {
            quotas,
            limiters,
            counters: self.counters.read(),
            utc_offset: self.utc_offset,
            override_epoch,
        }
    }

    /// Stores quotas read from the database, in `(epoch, id)` order, and
    /// adjusts counters: a deleted quota drops its counter, a changed limit
    /// applies from `now`. Returns how many quotas changed. Syncs wait
    /// until all are applied, so none sees half of a bulk change.
    pub fn load(&self, quotas: Vec<Quota>, now: Nanos) -> usize {
        let mut book = self
            .quotas
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut changed = 0;
        for quota in quotas {
            match book.load(quota) {
                QuotaChange::Live { id, per_key } => {
                    if let Some(quota) = book.counting_quota(id, per_key) {
                        let rule =
                            counter_rule(quota, self.utc_offset, self.level_cap_seconds, now);
                        self.counters.set_counting(id, per_key, rule, now);
                        if per_key {
                            // Its overridden keys keep their own numbers.
                            let overrides = self.overrides();
                            let (rows, _) = overrides.list(id, 0, usize::MAX);
                            for row in rows {
                                let rule = self.key_rule(quota, Some(&row.ov), now);
                                self.counters.set_key_counting(
                                    CounterKey {
                                        id,
                                        key: row.ov.key,
                                    },
                                    rule,
                                    now,
                                );
                            }
                        }
                    }
                }
                QuotaChange::Deleted { id } => self.counters.remove(id),
                QuotaChange::Stale => continue,
            }
            changed += 1;
        }
        changed
    }

    /// One sync: applies the request's deltas at `now`, each cut to what
    /// the limiter may still add ([`super::trust::Allowances`]) and the
    /// counter to its cap, then collects the quotas and counters the
    /// limiter has not seen.
    ///
    /// Deltas are grouped by counter shard and each shard is taken once,
    /// in ascending order, so syncs of different limiters run in parallel
    /// and only meet on a shard they both touch.
    ///
    /// The request must have been checked (see `api::sync`); nothing here
    /// fails. The counter version the limiter sent counts only when it
    /// belongs to `instance` (this root process); otherwise it gets every
    /// counter above the floor. While quota pages remain, no counters are
    /// sent and the limiter keeps its version: it could not place counters
    /// of quotas it has not received yet.
    pub fn sync(
        &self,
        request: &SyncRequest,
        instance: u64,
        now: Nanos,
        paging: SyncPaging,
    ) -> SyncStep {
        // A limiter's first sync carries what it admitted before: as much
        // refill as any sync may claim without state.
        let (number, since) = self
            .limiters()
            .touch_since(&request.limiter, now, FREE_SECONDS);
        let caller = (number, since);
        // Numbered parts applied before (a reply lost, and the limiter
        // sent them again) are answered, their weight not counted again
        // (docs/DESIGN.md, "Exactly once"). Each number is recorded
        // before its part is applied, so that two copies arriving
        // together count once. The parts go in order: an earlier
        // request's add before a later one's return of it.
        let mut step = SyncStep::default();
        let numbered = |seq| {
            request.sequence.map(|s| Sequence {
                incarnation: s.incarnation,
                seq,
            })
        };
        for part in &request.replay {
            if self.limiters().admit(number, numbered(part.seq)) {
                let weight = Weight {
                    held: &request.held,
                    keyed_held: &request.keyed_held,
                    deltas: &part.deltas,
                    keyed: &part.keyed,
                    returned: &part.returned,
                    keyed_returned: &part.keyed_returned,
                    rejected: &[],
                };
                self.apply_weight(caller, weight, now, &mut step);
            } else {
                step.duplicates += 1;
            }
        }
        if self.limiters().admit(number, request.sequence) {
            // The slots the limiter holds, absolute, as of this request:
            // set, not added, so a copy of a request, a resent one, or
            // one that reaches another process behind the same URL or a
            // restarted root counts each slot once. Only from a request
            // whose number is new: an older one's count may be stale.
            let named = request
                .held
                .iter()
                .map(|&(id, n)| (CounterKey::named(id), n));
            let keyed = request.keyed_held.iter().flat_map(|g| {
                g.deltas
                    .iter()
                    .map(move |d| (CounterKey { id: g.id, key: d.0 }, d.1))
            });
            self.apply_held(number, named.chain(keyed), now, &mut step);
            let weight = Weight {
                held: &request.held,
                keyed_held: &request.keyed_held,
                deltas: &request.deltas,
                keyed: &request.keyed,
                returned: &request.returned,
                keyed_returned: &request.keyed_returned,
                rejected: &request.rejected,
            };
            self.apply_weight(caller, weight, now, &mut step);
        } else {
            step.duplicates += 1;
        }
        if let Some(s) = request.sequence {
            step.applied_through = self.limiters().applied_through(number, s.incarnation);
        }
        if step.clipped > 0 {
            self.limiters()
                .clipped(number, step.clipped as u64, step.clipped_weight, now);
        }
        let quotas = self.quotas_read();
        step.quotas = quotas.page_after(request.quotas_after, paging.quotas);
        step.tiers = self.tiers_step(request, &quotas, instance, now, step.quotas.more, paging);
        drop(quotas);
        let since = self.counters_since(request, instance);
        let (listed, sent) = self.interest_told(request);
        let asker = self.by_interest.then_some(Asker {
            limiter: number,
            full: request.interest.as_ref().is_some_and(|i| i.full),
            listed: &listed,
            sent: &sent,
        });
        let known = if step.quotas.more {
            step.counters = ChangedCounters {
                counters: Vec::new(),
                keyed: Vec::new(),
                version: since,
            };
            asker.is_none_or(|asker| self.counters.learn_interest(asker, now))
        } else {
            let (changed, known) = self
                .counters
                .changed_for(since, paging.counters, now, asker);
            step.counters = changed;
            known
        };
        step.takes_interest = self.by_interest;
        step.wants_interest = !known;
        step
    }

    /// The keys `request` lists as held and the keys it sent deltas for
    /// (its own and its earlier parts'), by counter shard; none when the
    /// root does not answer by interest.
    fn interest_told(&self, request: &SyncRequest) -> (Vec<Vec<CounterKey>>, Vec<Vec<CounterKey>>) {
        if !self.by_interest {
            return (Vec::new(), Vec::new());
        }
        let shards = self.counters.shard_count();
        let by_shard = |keys: &mut dyn Iterator<Item = CounterKey>| {
            let mut out = vec![Vec::new(); shards];
            for k in keys {
                out[self.counters.shard_of(k)].push(k);
            }
            out
        };
        let listed = request.interest.iter().flat_map(|i| i.counters());
        let keyed = std::iter::once(&request.keyed)
            .chain(request.replay.iter().map(|p| &p.keyed))
            .flatten();
        let sent = keyed.flat_map(|g| g.deltas.iter().map(|d| CounterKey { id: g.id, key: d.0 }));
        (by_shard(&mut { listed }), by_shard(&mut { sent }))
    }

    /// Applies one part of a sync's weight (a replayed earlier request's,
    /// or the request's own) from limiter `caller` (its number and the
    /// seconds since its previous sync), counting what it did in `step`.
    fn apply_weight(
        &self,
        (number, since): (u32, f64),
        weight: Weight<'_>,
        now: Nanos,
        step: &mut SyncStep,
    ) {
        let caller = (number, since);
        let limiter = Some(number);
        let parts = self.by_shard(counter_deltas(weight.deltas, weight.keyed));
        let returns = self.by_shard(counter_deltas(weight.returned, weight.keyed_returned));
        let (rejections, cut) = plausible_rejections(weight.rejected, since);
        step.rejections_clipped = cut;
        let mut rejected: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.counters.shard_count()];
        for &(id, count) in &rejections {
            rejected[self.counters.shard_of(CounterKey::named(id))].push((id, count));
        }
        let quotas = self.quotas_read();
        // Taken after the quotas, as everywhere: a key with an override
        // counts with its numbers.
        let overrides = self.overrides();
        for (index, ((part, rejected), returns)) in
            parts.iter().zip(&rejected).zip(&returns).enumerate()
        {
            if part.is_empty() && rejected.is_empty() && returns.is_empty() {
                continue;
            }
            let mut guard = self.counters.lock(index);
            let shard = &mut *guard;
            shard.book.reserve((part.len() + returns.len()) as u64);
            // Returns first: one taken before an add of the same sync stops
            // at zero, so the order can only leave the level higher. A
            // return draws on the limiter's allowance for returns, which
            // its adds refill, and gives the allowance its adds draw on
            // back: one limiter moves a counter down by no more than it
            // added and one allowance, and an honest return never costs
            // the room of the adds that follow (see `trust.rs`).
            for &(counter, delta) in returns {
                let in_flight = in_flight_limit(&quotas, counter);
                if in_flight.is_some() && reported(&weight, counter) {
                    continue;
                }
                let (allowances, held) = (&mut shard.allowances, &shard.held);
                let allow = |shape: &AllowanceShape| match in_flight {
                    // A limiter gives back only the slots it holds here.
                    Some(_) => held.return_effect(number, counter, delta.weight),
                    None => allowances.give_back(caller, counter, shape, delta.weight, now),
                };
                let given = shard.book.give_back(counter, delta, now, allow);
                if in_flight.is_some() {
                    // Recorded whole, whatever it moved: a return that
                    // overtook its add cancels that add when it comes.
                    shard.held.give_back(number, counter, delta.weight);
                    step.returned_weight += given.unwrap_or(0.0);
                    continue;
                }
                if let Some(granted) = given {
                    step.returned_weight += granted;
                    if granted < delta.weight {
                        step.clipped += 1;
                        step.clipped_weight += delta.weight - granted;
                    }
                }
            }
            for &(counter, delta) in part {
                // A named delta counts on a plain quota, a key's on a
                // template. Looked up only for a counter the root does not
                // hold yet.
                let rule_of = || self.rule_of((&quotas, &overrides), counter, now);
                let in_flight = in_flight_limit(&quotas, counter);
                if in_flight.is_some() && reported(&weight, counter) {
                    continue;
                }
                // An in-flight add beyond a limiter's room is clipped; the
                // rest raises the counter by what it adds to the slots
                // the limiter holds (less, while returns that overtook it
                // are outstanding).
                let taken =
                    in_flight.map(|limit| shard.held.room(number, counter, limit, delta.weight));
                let (allowances, held) = (&mut shard.allowances, &shard.held);
                let allow = |shape: &AllowanceShape| match taken {
                    Some(taken) => held.add_effect(number, counter, taken),
                    None => allowances.admit(caller, counter, shape, delta.weight, now),
                };
                match shard
                    .book
                    .add_allowed(counter, delta, now, limiter, rule_of, allow)
                {
                    Err(why) => {
                        step.ignored += 1;
                        if why == Uncounted::KeyRefused {
                            step.refused.push(counter);
                        }
                    }
                    Ok(added) => {
                        let added = match taken {
                            Some(taken) => {
                                shard.held.add(number, counter, taken);
                                taken
                            }
                            None => added,
                        };
                        if added < delta.weight {
                            step.clipped += 1;
                            step.clipped_weight += delta.weight - added;
                        }
                        if added > 0.0 {
                            step.applied += 1;
                        }
                    }
                }
            }
            shard.book.release();
            for &(id, count) in rejected {
                // A per-key template has no counter of its own: its keys do.
                if quotas.get(id).is_some_and(|q| q.per_key && !q.deleted) {
                    shard.templates.note(id, count, now);
                } else {
                    shard.book.note_rejected(id, count, now);
                }
            }
        }
        drop(overrides);
    }

    /// Takes the in-flight slots of every limiter past its lease (not
    /// heard from for [`Self::in_flight_lease`], or forgotten) off their
    /// counters; returns the slots dropped. The root calls it a few times
    /// per lease; it costs a look at each shard's holders.
    pub fn expire_leases(&self, now: Nanos) -> f64 {
        self.expire_leases_awake(now, 0)
    }

    /// [`Self::expire_leases`] with leases run from `awake_since` at the
    /// earliest: the end of the root's own last stall
    /// ([`crate::root::in_flight::Wakefulness`]).
    pub fn expire_leases_awake(&self, now: Nanos, awake_since: Nanos) -> f64 {
        let mut holders: Vec<u32> = Vec::new();
        for index in 0..self.counters.shard_count() {
            holders.extend(self.counters.lock(index).held.holders());
        }
        if holders.is_empty() {
            return 0.0;
        }
        holders.sort_unstable();
        holders.dedup();
        // Past the lease: its slots go. Forgotten by the registry: what
        // it held or was forgiven goes too (its number may be reused).
        let (mut expired, mut gone) = (Vec::new(), Vec::new());
        {
            let limiters = self.limiters();
            for l in holders {
                let last = limiters.get(l).map(|info| info.last_sync);
                if last.is_none() {
                    gone.push(l);
                }
                if lease_expired(last, self.in_flight_lease, now, awake_since) {
                    expired.push(l);
                }
            }
        }
        if expired.is_empty() {
            return 0.0;
        }
        let mut dropped = 0.0;
        for index in 0..self.counters.shard_count() {
            let mut guard = self.counters.lock(index);
            let shard = &mut *guard;
            for (counter, slots) in shard.held.expire(|l| expired.binary_search(&l).is_ok()) {
                let delta = Delta {
                    weight: slots,
                    window: None,
                };
                let taken = shard.book.give_back(counter, delta, now, |_| slots);
                dropped += taken.unwrap_or(0.0);
            }
            shard.held.forget(|l| gone.binary_search(&l).is_ok());
            shard.book.release();
        }
        dropped
    }

    /// `(counter, delta)` pairs sorted into lists by shard.
    fn by_shard(
        &self,
        deltas: impl Iterator<Item = (CounterKey, Delta)> + Clone,
    ) -> Vec<Vec<(CounterKey, Delta)>> {
        // Sized first: a million deltas would otherwise take up to twice
        // their room while the lists grow.
        let mut sizes = vec![0; self.counters.shard_count()];
        for (counter, _) in deltas.clone() {
            sizes[self.counters.shard_of(counter)] += 1;
        }
        let mut parts: Vec<Vec<(CounterKey, Delta)>> =
            sizes.into_iter().map(Vec::with_capacity).collect();
        for (counter, delta) in deltas {
            parts[self.counters.shard_of(counter)].push((counter, delta));
        }
        parts
    }

    fn counters_since(&self, request: &SyncRequest, instance: u64) -> u64 {
        let known =
            request.root_instance == instance && request.counter_version <= self.counters.version();
        if known {
            request.counter_version
        } else {
            0
        }
    }

    /// Sizes for metrics and health.
    pub fn stats(&self) -> LedgerStats {
        self.read().stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sync request as a limiter sends it: from `limiter`, asking for
    /// counters after `counter_version` of `root_instance`, with named
    /// `deltas` (`(quota id, delta)`) and keyed ones (`(template id, key
    /// hash, delta)`). For the tests of the ledger and of what is built on it.
    pub(crate) fn test_request(
        limiter: &str,
        counter_version: u64,
        root_instance: u64,
        deltas: &[(u64, u64)],
        keyed: &[(u64, u64, u64)],
    ) -> SyncRequest {
        use crate::wire::{CounterDelta, KeyDelta, KeyedDeltas, QuotaCursor};
        SyncRequest {
            limiter: limiter.into(),
            quotas_after: QuotaCursor::default(),
            counter_version,
            root_instance,
            deltas: deltas
                .iter()
                .map(|&(id, delta)| CounterDelta {
                    id,
                    delta,
                    window: None,
                })
                .collect(),
            keyed: keyed
                .iter()
                .map(|&(id, hash, delta)| KeyedDeltas {
                    id,
                    deltas: vec![KeyDelta(hash, delta)],
                    window: None,
                })
                .collect(),
            rejected: Vec::new(),
            ..Default::default()
        }
    }
    use crate::core::tier::{Override, Rule};
    use crate::wire::CounterDelta;

    const SEC: Nanos = 1_000_000_000;
    const INSTANCE: u64 = 77;
    const PAGING: SyncPaging = SyncPaging {
        quotas: 100,
        counters: 100,
    };

    fn quota(id: u64, limit: f64, epoch: u64) -> Quota {
        Quota::new(id, format!("q{id}"), limit, 100.0, 200.0).at_epoch(epoch)
    }

    fn request(limiter: &str, version: u64, deltas: &[(u64, u64)]) -> SyncRequest {
        let instance = if version == 0 { 0 } else { INSTANCE };
        test_request(limiter, version, instance, deltas, &[])
    }

    fn level_of(step: &SyncStep, id: u64) -> Option<f64> {
        step.counters
            .counters
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.level)
    }

    #[test]
    fn keys_of_a_sliding_template_come_back_with_their_previous_counts() {
        use crate::core::Window;
        use crate::wire::{KeyDelta, KeyedDeltas};
        let ledger = Ledger::default();
        let q = Quota::new(1, "per_token", 100.0, 100.0, 100.0)
            .keyed()
            .windowed(Window::TenSeconds, true);
        ledger.load(vec![q], 0);
        let keyed = |limiter: &str, deltas: Vec<KeyDelta>, window| {
            let mut r = request(limiter, 0, &[]);
            r.keyed = vec![KeyedDeltas {
                id: 1,
                deltas,
                window: Some(window),
            }];
            r
        };
        ledger.sync(
            &keyed("a", vec![KeyDelta(7, 30), KeyDelta(8, 2)], 0),
            INSTANCE,
            5 * SEC,
            PAGING,
        );
        let step = ledger.sync(
            &keyed("b", vec![KeyDelta(7, 4)], 1),
            INSTANCE,
            11 * SEC,
            PAGING,
        );
        let group = &step.counters.keyed[0];
        let of = |hash: u64| {
            let i = group.values.iter().position(|v| v.0 == hash).unwrap();
            (group.values[i].1, group.prev_of(i))
        };
        // Key 7: 4 in window 1, its 30 of window 0 as the previous count;
        // key 8 is reported as it was (2 in window 0, nothing before).
        assert_eq!(of(7), (4.0, 30.0));
        assert_eq!(of(8), (2.0, 0.0));
    }

    #[test]
    fn window_deltas_count_in_the_window_they_name() {
        use crate::core::Window;
        let ledger = Ledger::default();
        let q = Quota::new(1, "day", 100.0, 100.0, 100.0).windowed(Window::TenSeconds, true);
        ledger.load(vec![q], 0);
        let windowed = |limiter: &str, delta, window| {
            let mut r = request(limiter, 0, &[(1, delta)]);
            r.deltas[0].window = Some(window);
            r
        };
        ledger.sync(&windowed("a", 30, 0), INSTANCE, 5 * SEC, PAGING);
        // b's weight of window 0 arrives in window 1: it counts in 0.
        let step = ledger.sync(&windowed("b", 20, 0), INSTANCE, 10 * SEC + SEC / 2, PAGING);
        let c = step.counters.counters[0];
        assert_eq!((c.level, c.prev, c.at), (50.0, 0.0, 5 * SEC));
        let step = ledger.sync(&windowed("a", 7, 1), INSTANCE, 11 * SEC, PAGING);
        let c = step.counters.counters[0];
        assert_eq!((c.level, c.prev), (7.0, 50.0));
        // Late weight of window 0 goes to the previous count; of window
        // -1 nowhere (ignored), and it is said.
        let step = ledger.sync(&windowed("b", 3, 0), INSTANCE, 12 * SEC, PAGING);
        assert_eq!(step.counters.counters[0].prev, 53.0);
        let step = ledger.sync(&windowed("b", 3, -1), INSTANCE, 12 * SEC, PAGING);
        assert_eq!((step.applied, step.ignored), (0, 1));
        // The admin view: 7 + 53 * (1 - 0.5) at 15 s.
        let view = ledger.counters.view(1, 15 * SEC).unwrap();
        assert!((view.level - (7.0 + 26.5)).abs() < 1e-9, "{}", view.level);
    }

    #[test]
    fn rejections_become_a_rate_on_counters_that_exist() {
        let ledger = Ledger::default();
        ledger.load(vec![quota(1, 10.0, 1), quota(2, 10.0, 1)], 0);
        let request = SyncRequest {
            rejected: vec![(1, 10), (2, 4), (99, 7)],
            ..request("a", 0, &[(1, 1)])
        };
        ledger.sync(&request, 1, 0, PAGING);
        // Over the one-second window: 10/s measured, smoothed by half.
        let view = ledger.counters.view(1, SEC).unwrap();
        assert_eq!(view.rejected_rate, 5.0);
        assert_eq!(view.fill_rate, 0.5);
        // Quota 2 has no counter (nothing admitted yet) and 99 no quota:
        // neither gets one from rejections alone.
        assert!(ledger.counters.view(2, SEC).is_none());
        assert!(ledger.counters.view(99, SEC).is_none());
    }

    #[test]
    fn two_limiters_sum_into_one_counter() {
        let ledger = Ledger::default();
        ledger.load(vec![quota(1, 0.0, 1)], 0);
        let a = ledger.sync(&request("a", 0, &[(1, 50)]), INSTANCE, SEC, PAGING);
        assert_eq!(level_of(&a, 1), Some(50.0));
        let b = ledger.sync(&request("b", 0, &[(1, 30)]), INSTANCE, SEC, PAGING);
        assert_eq!(level_of(&b, 1), Some(80.0));
        let a2 = ledger.sync(
            &request("a", a.counters.version, &[]),
            INSTANCE,
            SEC,
            PAGING,
        );
        assert_eq!(level_of(&a2, 1), Some(80.0));
        let a3 = ledger.sync(
            &request("a", a2.counters.version, &[]),
            INSTANCE,
            SEC,
            PAGING,
        );
        assert!(a3.counters.counters.is_empty());
    }

    #[test]
    fn the_floor_rises_between_syncs() {
        let ledger = Ledger::default();
        ledger.load(vec![quota(1, 10.0, 1)], 0);
        ledger.sync(&request("a", 0, &[(1, 100)]), INSTANCE, 0, PAGING);
        // Three seconds at 10/s leak 30; then +5.
        let b = ledger.sync(&request("b", 0, &[(1, 5)]), INSTANCE, 3 * SEC, PAGING);
        assert_eq!(level_of(&b, 1), Some(75.0));
    }

    #[test]
    fn deltas_for_unknown_and_deleted_quotas_are_ignored() {
        let ledger = Ledger::default();
        ledger.load(vec![quota(1, 0.0, 1), quota(2, 0.0, 2)], 0);
        ledger.sync(&request("a", 0, &[(2, 4)]), INSTANCE, 0, PAGING);
        ledger.load(vec![Quota::tombstone(2, "q2", 3)], 0);
        let step = ledger.sync(
            &request("a", 0, &[(1, 1), (2, 9), (99, 3)]),
            INSTANCE,
            0,
            PAGING,
        );
        assert_eq!((step.applied, step.ignored), (1, 2));
        assert_eq!(ledger.counters.len(), 1);
        assert_eq!(level_of(&step, 2), None);
    }

    #[test]
    fn another_instance_or_version_zero_gets_all_counters() {
        let ledger = Ledger::default();
        ledger.load(vec![quota(1, 0.0, 1), quota(2, 0.0, 1)], 0);
        let first = ledger.sync(&request("a", 0, &[(1, 1), (2, 1)]), INSTANCE, 0, PAGING);
        let mut stale = request("a", first.counters.version, &[]);
        stale.root_instance = INSTANCE + 1;
        assert_eq!(
            ledger
                .sync(&stale, INSTANCE, 0, PAGING)
                .counters
                .counters
                .len(),
            2
        );
        // A version from the future (another process) is treated the same.
        let future = request("a", 1_000, &[]);
        assert_eq!(
            ledger
                .sync(&future, INSTANCE, 0, PAGING)
                .counters
                .counters
                .len(),
            2
        );
    }

    #[test]
    fn counters_wait_until_the_quota_pages_are_through() {
        let ledger = Ledger::default();
        ledger.load((1..=5).map(|id| quota(id, 0.0, 1)).collect(), 0);
        ledger.sync(&request("a", 0, &[(5, 1)]), INSTANCE, 0, PAGING);
        let paging = SyncPaging {
            quotas: 2,
            counters: 100,
        };
        let mut req = request("b", 0, &[]);
        let mut pages = 0;
        loop {
            let step = ledger.sync(&req, INSTANCE, 0, paging);
            pages += 1;
            if step.quotas.more {
                assert!(step.counters.counters.is_empty());
                assert_eq!(step.counters.version, 0);
            } else {
                assert_eq!(level_of(&step, 5), Some(1.0));
                break;
            }
            req.quotas_after = step.quotas.after;
            req.root_instance = INSTANCE;
        }
        assert_eq!(pages, 3);
    }

    fn keyed_request(limiter: &str, id: u64, keys: &[(u64, u64)]) -> SyncRequest {
        SyncRequest {
            keyed: vec![crate::wire::KeyedDeltas {
                id,
                deltas: keys
                    .iter()
                    .map(|&(k, d)| crate::wire::KeyDelta(k, d))
                    .collect(),
                window: None,
            }],
            ..request(limiter, 0, &[])
        }
    }

    fn key_level(step: &SyncStep, id: u64, key: u64) -> Option<f64> {
        let group = step.counters.keyed.iter().find(|g| g.id == id)?;
        group.values.iter().find(|v| v.0 == key).map(|v| v.1)
    }

    #[test]
    fn keys_of_a_template_sum_per_key_across_limiters() {
        let ledger = Ledger::default();
        ledger.load(
            vec![
                quota(1, 10.0, 1),
                quota(2, 10.0, 1).keyed().with_parent(Some(1)),
            ],
            0,
        );
        ledger.sync(
            &keyed_request("a", 2, &[(7, 3), (8, 1)]),
            INSTANCE,
            0,
            PAGING,
        );
        let b = ledger.sync(&keyed_request("b", 2, &[(7, 2)]), INSTANCE, 0, PAGING);
        assert_eq!(key_level(&b, 2, 7), Some(5.0));
        assert_eq!(key_level(&b, 2, 8), Some(1.0));
        assert_eq!(ledger.counters.keys(), 2);
        // A key's delta on a plain quota counts nowhere.
        let step = ledger.sync(&keyed_request("c", 1, &[(9, 1)]), INSTANCE, 0, PAGING);
        assert_eq!((step.applied, step.ignored), (0, 1));
        // The reply carries keys grouped by template, named counters apart.
        let response = b.into_response(INSTANCE, 0, 0);
        assert_eq!(response.keyed.len(), 1);
        assert!(response.counters.is_empty());
    }

    /// A key with an override counts at the root with the override's
    /// numbers: its deltas are not cut to the template's allowance and
    /// cap, before or after the override arrives, and a removal gives it
    /// the template's back.
    #[test]
    fn an_overridden_key_counts_with_its_own_numbers_at_the_root() {
        use crate::root::store::OverrideRow;
        let ledger = Ledger::default();
        // 1/s with a burst of 3: a limiter may add about 3 at once.
        ledger.load(
            vec![Quota::new(2, "per_key", 1.0, 3.0, 3.0).keyed().at_epoch(1)],
            0,
        );
        let row = |key, rule, epoch, deleted| OverrideRow {
            ov: Override {
                id: key,
                quota: 2,
                key,
                rule,
                expires_ms: None,
                epoch,
                deleted,
            },
            note: None,
            updated_ms: 0,
        };
        let paid = Rule::Limit {
            limit: 100.0,
            low_burst: 100.0,
            high_burst: 100.0,
        };
        // Key 7 before its counter exists, key 8 after; 9 is allowed.
        ledger.load_overrides(
            vec![row(7, paid, 2, false), row(9, Rule::Allow, 2, false)],
            0,
        );
        ledger.sync(&keyed_request("a", 2, &[(8, 1)]), INSTANCE, 0, PAGING);
        ledger.load_overrides(vec![row(8, paid, 3, false)], 0);
        let step = ledger.sync(
            &keyed_request("a", 2, &[(7, 50), (8, 50), (9, 500), (10, 50)]),
            INSTANCE,
            0,
            PAGING,
        );
        assert_eq!(key_level(&step, 2, 7), Some(50.0));
        assert_eq!(key_level(&step, 2, 8), Some(51.0));
        assert_eq!(key_level(&step, 2, 9), Some(500.0));
        let plain = key_level(&step, 2, 10).unwrap();
        assert!(plain < 20.0, "the template's numbers bound key 10: {plain}");
        // Removed: key 8 is bound by the template's numbers again.
        ledger.load_overrides(vec![row(8, paid, 4, true)], 0);
        let step = ledger.sync(&keyed_request("a", 2, &[(8, 50)]), INSTANCE, SEC, PAGING);
        let level = key_level(&step, 2, 8).unwrap();
        assert!(level < 20.0, "{level}");
        // A template edit keeps key 7's numbers (its 50 leaked away at
        // 100/s: the 40 count whole).
        ledger.load(
            vec![Quota::new(2, "per_key", 2.0, 3.0, 3.0).keyed().at_epoch(5)],
            SEC,
        );
        let step = ledger.sync(&keyed_request("b", 2, &[(7, 40)]), INSTANCE, SEC, PAGING);
        assert_eq!(key_level(&step, 2, 7), Some(40.0));
    }

    #[test]
    fn a_templates_own_counter_sums_the_keys_limiters_had_no_room_for() {
        let ledger = Ledger::default();
        ledger.load(vec![quota(2, 10.0, 1).keyed()], 0);
        let overflow = |limiter: &str, delta: u64| SyncRequest {
            deltas: vec![CounterDelta {
                id: 2,
                delta,
                window: None,
            }],
            ..request(limiter, 0, &[])
        };
        ledger.sync(&overflow("a", 3), INSTANCE, 0, PAGING);
        let step = ledger.sync(&overflow("b", 4), INSTANCE, 0, PAGING);
        assert_eq!(step.applied, 1);
        assert_eq!(level_of(&step, 2), Some(7.0));
        // An edit of the template reaches its own counter too: leaked at
        // 10/s for half a second, then not at all.
        ledger.load(vec![quota(2, 0.0, 2).keyed()], SEC / 2);
        let own = CounterKey::named(2);
        let level = ledger.counters.view_counter(own, 100 * SEC).unwrap().level;
        assert_eq!(level, 2.0);
    }

    #[test]
    fn drained_keys_are_forgotten_and_a_template_edit_reaches_every_key() {
        let ledger = Ledger::default();
        ledger.load(vec![quota(2, 10.0, 1).keyed()], 0);
        ledger.sync(
            &keyed_request("a", 2, &[(7, 50), (8, 5)]),
            INSTANCE,
            0,
            PAGING,
        );
        // One second at 10/s: key 8 drained, key 7 at 40.
        assert_eq!(ledger.counters.forget_drained(100, SEC), 1);
        assert_eq!(ledger.counters.keys(), 1);
        // The template's new limit applies to its keys from now on.
        ledger.load(vec![quota(2, 0.0, 2).keyed()], SEC);
        let key = CounterKey { id: 2, key: 7 };
        assert_eq!(
            ledger.counters.view_counter(key, 100 * SEC).unwrap().level,
            40.0
        );
        // Deleting the template drops its keys.
        ledger.load(vec![Quota::tombstone(2, "q2", 3)], SEC);
        assert_eq!(ledger.counters.keys(), 0);
    }

    #[test]
    fn at_most_max_keys_key_counters_exist() {
        let ledger = Ledger::with_max_keys(2);
        ledger.load(vec![quota(2, 10.0, 1).keyed()], 0);
        let step = ledger.sync(
            &keyed_request("a", 2, &[(1, 1), (2, 1), (3, 1)]),
            INSTANCE,
            0,
            PAGING,
        );
        assert_eq!((step.applied, step.ignored), (2, 1));
        assert_eq!(ledger.counters.keys_refused(), 1);
    }

    #[test]
    fn deltas_are_cut_to_the_limiters_allowance_and_levels_to_the_cap() {
        let ledger = Ledger::default();
        // limit 10, high_burst 200, level_cap_seconds 5: allowance
        // 2 * (200 + 10 * 5) = 500 per limiter; cap 2 * 200 + 10 * 5 = 450.
        ledger.load(vec![quota(1, 10.0, 1)], 0);
        let a = ledger.sync(&request("a", 0, &[(1, 1 << 50)]), INSTANCE, 0, PAGING);
        assert_eq!((a.applied, a.clipped), (1, 1));
        assert_eq!(a.clipped_weight, (1u64 << 50) as f64 - 500.0);
        assert_eq!(level_of(&a, 1), Some(450.0));
        let b = ledger.sync(&request("b", 0, &[(1, 100)]), INSTANCE, 0, PAGING);
        assert_eq!((b.clipped, level_of(&b, 1)), (0, Some(450.0)));
        assert_eq!(ledger.stats().sizes.levels_capped, 2);
        {
            let limiters = ledger.limiters();
            let info = limiters.get(0).unwrap();
            assert_eq!((info.name.as_ref(), info.clipped), ("a", 1));
        }
        // Drained at 10/s from the cap: under high_burst after 25 s.
        let view = ledger.counters.view(1, 26 * SEC).unwrap();
        assert!(view.level < 200.0, "{}", view.level);
        // a's allowance refilled at 20/s meanwhile: 40 in 2 s, the rest
        // cut.
        let a = ledger.sync(&request("a", 0, &[(1, 1000)]), INSTANCE, 2 * SEC, PAGING);
        assert_eq!(a.clipped_weight, 960.0);
    }

    #[test]
    fn returns_lower_a_counter_by_what_the_limiter_added_and_an_allowance_never_below_zero() {
        let ledger = Ledger::default();
        // limit 10, high_burst 200: allowance 500 per limiter, refilling
        // at 20/s.
        ledger.load(vec![quota(1, 10.0, 1), quota(2, 10.0, 1)], 0);
        ledger.sync(&request("a", 0, &[(1, 150)]), INSTANCE, 0, PAGING);
        ledger.sync(&request("b", 0, &[(1, 100)]), INSTANCE, 0, PAGING);
        let give_back = |limiter: &str, id: u64, units: u64, now: Nanos| {
            let request = SyncRequest {
                returned: vec![CounterDelta {
                    id,
                    delta: units,
                    window: None,
                }],
                ..test_request(limiter, 0, 0, &[], &[])
            };
            ledger.sync(&request, INSTANCE, now, PAGING)
        };
        // a gives 100 back a second later: 250 - 10 - 100.
        let step = give_back("a", 1, 100, SEC);
        assert_eq!((step.returned_weight, step.clipped), (100.0, 0));
        assert_eq!(level_of(&step, 1), Some(140.0));
        let reply = step.into_response(INSTANCE, SEC, 0);
        assert!(reply.takes_returns);
        // A liar returning far more than it added gives back what it
        // added and one allowance at most: its net on the counter (150
        // added, 20 refilled in the second, 100 back) and 500. The
        // counter stops at zero; the cut is counted for it.
        let step = give_back("a", 1, 1 << 40, SEC);
        assert_eq!(step.clipped, 1);
        assert_eq!(ledger.counters.view(1, SEC).unwrap().level, 0.0);
        assert_eq!(step.returned_weight, 30.0 + 500.0);
        assert_eq!(ledger.limiters().get(0).unwrap().clipped, 1);
        // A return to a counter the root does not hold lowers nothing.
        let step = give_back("b", 2, 10, SEC);
        assert_eq!((step.returned_weight, step.clipped), (0.0, 0));
        assert!(ledger.counters.view(2, SEC).is_none());
        // Returns come before adds of the same sync: the add is whole.
        let both = SyncRequest {
            returned: vec![CounterDelta {
                id: 1,
                delta: 30,
                window: None,
            }],
            ..test_request("b", 0, 0, &[(1, 40)], &[])
        };
        let step = ledger.sync(&both, INSTANCE, SEC, PAGING);
        assert_eq!(level_of(&step, 1), Some(40.0));
    }

    /// Issue 34, case 2, at the ledger: nine units that came back leave
    /// the limiter room for the ten a burst of 10 holds, cycle after
    /// cycle, with nothing clipped.
    #[test]
    fn an_honest_return_leaves_the_next_adds_whole() {
        let ledger = Ledger::default();
        // Burst 10, no leak: an allowance of 20 that never refills.
        ledger.load(
            vec![Quota::new(1, "burst10", 0.0, 10.0, 10.0).at_epoch(1)],
            0,
        );
        for round in 0..5 {
            let now = round * 2 * SEC;
            ledger.sync(&request("a", 0, &[(1, 9)]), INSTANCE, now, PAGING);
            let back = SyncRequest {
                returned: vec![CounterDelta {
                    id: 1,
                    delta: 9,
                    window: None,
                }],
                ..request("a", 0, &[])
            };
            let step = ledger.sync(&back, INSTANCE, now + SEC / 2, PAGING);
            assert_eq!((step.returned_weight, step.clipped), (9.0, 0), "{round}");
            let level = ledger.counters.view(1, now + SEC / 2).unwrap().level;
            assert_eq!(level, 0.0);
            let step = ledger.sync(&request("a", 0, &[(1, 10)]), INSTANCE, now + SEC, PAGING);
            assert_eq!(
                (step.clipped, level_of(&step, 1)),
                (0, Some(10.0)),
                "{round}"
            );
            // The ten settle at nothing: the quota is empty again.
            let back = SyncRequest {
                returned: vec![CounterDelta {
                    id: 1,
                    delta: 10,
                    window: None,
                }],
                ..request("a", 0, &[])
            };
            ledger.sync(&back, INSTANCE, now + SEC, PAGING);
        }
        assert_eq!(ledger.limiters().get(0).unwrap().clipped, 0);
    }

    #[test]
    fn a_restarted_root_starts_from_the_floor() {
        let before = Ledger::default();
        before.load(vec![quota(1, 0.0, 1)], 0);
        before.sync(&request("a", 0, &[(1, 40)]), INSTANCE, 0, PAGING);
        let after = Ledger::default();
        after.load(vec![quota(1, 0.0, 1)], 0);
        let step = after.sync(&request("a", 5, &[(1, 2)]), INSTANCE + 1, 0, PAGING);
        assert_eq!(level_of(&step, 1), Some(2.0));
    }
}
