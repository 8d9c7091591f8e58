//! The sync logic without the network: what to send each root, and what to
//! do with what comes back.
//!
//! The networked loop (`networked.rs`) and the simulator both drive this
//! engine, so the accounting that keeps counts exact lives once:
//!
//! - every collected delta is **owed** to every root until that root
//!   confirms it (resent after a failure, bounded); while owed it leaks at
//!   the quota's limit, so a root that missed it gets only what is left of
//!   it (see [`Owed`] for why);
//! - every collected delta is **unacknowledged** until the first root whose
//!   reply covers it; that reply takes it off the table's `inflight`, later
//!   roots' replies only max-merge their values;
//! - weight given back (a collected counter whose net change is negative)
//!   travels the same way, as a return beside the deltas, owed and
//!   acknowledged alike, and only to roots that take returns (see
//!   docs/DESIGN.md, "Counters that give units back");
//! - a counter a root leaves out of a complete reply did not change there:
//!   the engine tells the table so at the end of the cycle, which resets the
//!   counter's extrapolation and decays its fill rate (see `vouch.rs`);
//! - when no root answered for two intervals the engine folds local weight
//!   into the levels (per-host limiting) and says so once a minute; once
//!   none answered for the in-flight lease, in-flight counters count this
//!   host's own slots only (the lease the roots apply to this host,
//!   applied to the others; [`Table::lease_locally`]), and the first
//!   reply after that replaces their levels;
//! - with root groups (see the `sync` module doc), each counter is owed
//!   only to the roots of its shard ([`shard`]), "unchanged" is
//!   vouched per group, quota changes come from one group, and a group
//!   down folds only its shard's weight locally.

use super::config::{EarlySync, DEFAULT_IN_FLIGHT_LEASE};
use super::early::EarlyCycles;
use super::health::{others_up, Health};
use super::ids::{CounterMap, IdMap};
use super::link::{level_at_offset, Owed, OwedDeltas, RootLink, NO_QUOTAS};
use super::log::{LogLevel, LogLine};
use super::metrics::SyncMetrics;
use super::pressure::KeyPressure;
use super::routing::shard;
use super::schedule::key_sweep_budget;
use super::vouch::Recent;
use crate::core::tier::Penalty;
use crate::core::{Counting, Nanos, Tally};
use crate::table::file::purge_seeds;
use crate::table::{CollectedDelta, SlotId, Table};
use crate::wire::{
    ClockReport, CounterDelta, CounterKey, CounterValue, KeyDelta, KeyedDeltas, QuotaCursor,
    SyncRequest, SyncResponse, TierRequest, MAX_DELTAS_PER_SYNC,
};
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// A request to send to one root, with the deltas it carries.
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// Index of the root in the configured list.
    pub root: usize,
    /// The request body.
    pub request: SyncRequest,
    /// What `request` pays off, by quota id (entries that leaked to less
    /// than a unit are here but not in the request); hand them back with
    /// the outcome.
    pub owed: OwedDeltas,
    /// This limiter's clock offset to the root, reported with the request.
    pub clock: Option<ClockReport>,
}

/// One successful page of an exchange with a root.
#[derive(Clone, Debug)]
pub struct Page {
    /// Local time the request was sent.
    pub sent_at: Nanos,
    /// Local time the reply arrived.
    pub received_at: Nanos,
    /// The root's reply, already validated.
    pub reply: SyncResponse,
}

/// Sync intervals after a root is found restarted before its new
/// instance's in-flight values replace those of its earlier instance:
/// every host has found the restart and resent its slots by then (two
/// intervals), plus one for a host's cycle falling just after.
const RESTART_GRACE: Nanos = 3;

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
    /// every counter of every reply); the net acknowledged, signed.
    fn take(&mut self, counter: CounterKey, sent: u64, returned: u64) -> Option<(SlotId, i64)> {
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
        Some((slot, acked as i64 - acked_back as i64))
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

/// The request for the next quota page after `reply`, if the root has more
/// (no deltas: they went with the first page).
pub fn next_page(previous: &SyncRequest, reply: &SyncResponse) -> Option<SyncRequest> {
    let more_quotas = reply.more_quotas && !reply.quotas.is_empty();
    let more_overrides = reply.tiers.more_overrides && !reply.tiers.overrides.is_empty();
    (more_quotas || more_overrides).then(|| SyncRequest {
        limiter: previous.limiter.clone(),
        quotas_after: reply.quotas_after,
        counter_version: reply.counter_version,
        root_instance: reply.root_instance,
        tiers: TierRequest {
            overrides_after: reply.tiers.overrides_after,
            penalty_version: reply.tiers.penalty_version,
            penalties: Vec::new(),
        },
        ..SyncRequest::default()
    })
}

/// What `owed` comes to at `now`, as a request carries it.
#[derive(Default)]
struct Due {
    /// Named deltas.
    named: Vec<CounterDelta>,
    /// Keys' deltas, grouped by template.
    keyed: Vec<KeyedDeltas>,
    /// Named returns (only for a root that takes them).
    returned: Vec<CounterDelta>,
    /// Keys' returns, grouped by template.
    keyed_returned: Vec<KeyedDeltas>,
    /// Units of returns left out: the root does not take them.
    dropped_returns: u64,
}

impl Due {
    /// Entries a request carrying these takes (as
    /// [`SyncRequest::entry_count`] counts them).
    fn entry_count(&self) -> usize {
        use crate::wire::keyed_entries;
        self.named.len()
            + keyed_entries(&self.keyed)
            + self.returned.len()
            + keyed_entries(&self.keyed_returned)
    }
}

/// Named deltas and keys' deltas grouped by template (and window: a
/// group's deltas share one), from `(counter, window, amount)`.
#[derive(Default)]
struct Grouped {
    named: Vec<CounterDelta>,
    by_template: HashMap<(u64, Option<i64>), Vec<KeyDelta>>,
}

impl Grouped {
    fn push(&mut self, c: CounterKey, window: Option<i64>, amount: u64) {
        if c.key == 0 {
            self.named.push(CounterDelta {
                id: c.id,
                delta: amount,
                window,
            });
        } else {
            self.by_template
                .entry((c.id, window))
                .or_default()
                .push(KeyDelta(c.key, amount));
        }
    }

    fn into_parts(self) -> (Vec<CounterDelta>, Vec<KeyedDeltas>) {
        let keyed = self
            .by_template
            .into_iter()
            .map(|((id, window), deltas)| KeyedDeltas { id, deltas, window })
            .collect();
        (self.named, keyed)
    }
}

/// Leaves at most `budget` counters in `owed` and returns the others,
/// which stay owed for the next cycle (a backlog larger than a root
/// accepts in one request, after an outage or a key spray).
fn split_owed(owed: &mut OwedDeltas, budget: usize) -> OwedDeltas {
    let mut rest = OwedDeltas::default();
    if owed.len() <= budget {
        return rest;
    }
    let later: Vec<CounterKey> = owed.keys().skip(budget).copied().collect();
    rest.reserve(later.len());
    for c in later {
        if let Some(o) = owed.remove(&c) {
            rest.insert(c, o);
        }
    }
    rest
}

/// What `owed` comes to at `now`, as a request carries it: deltas (entries
/// that leaked to less than a unit are left out), and returns when the
/// root takes them.
fn due_deltas(owed: &OwedDeltas, now: Nanos, takes_returns: bool) -> Due {
    let (mut adds, mut returns) = (Grouped::default(), Grouped::default());
    let mut dropped_returns = 0u64;
    for (c, o) in owed {
        let window = o.window.map(|w| w.index);
        let delta = o.due(now);
        if delta > 0 {
            adds.push(*c, window, delta);
        }
        let back = o.due_returned(now);
        if back > 0 {
            if takes_returns {
                returns.push(*c, window, back);
            } else {
                dropped_returns = dropped_returns.saturating_add(back);
            }
        }
    }
    let (named, keyed) = adds.into_parts();
    let (returned, keyed_returned) = returns.into_parts();
    Due {
        named,
        keyed,
        returned,
        keyed_returned,
        dropped_returns,
    }
}

/// The sync state of one limiter.
#[derive(Debug)]
pub struct SyncEngine {
    links: Vec<RootLink>,
    /// Number of root groups (shards), at least 1.
    groups: usize,
    /// Roots and groups up or down, and the in-flight lease.
    health: Health,
    unacked: Unacked,
    recent: Recent,
    slots: IdMap<SlotId>,
    slots_generation: Option<u64>,
    limiter_id: String,
    interval: Nanos,
    max_owed: usize,
    /// Entries one request may carry: a root refuses a request of more
    /// than [`MAX_DELTAS_PER_SYNC`] whole, so a larger backlog goes out
    /// over several cycles instead of never.
    max_request_entries: usize,
    started: Nanos,
    /// Per root: in-flight levels of its group were folded here since its
    /// last answer (or, after it restarted, taken as its new instance's),
    /// so it is asked for all its counters, and its next whole answer
    /// settles the in-flight counters it leaves out
    /// ([`Table::settle_omitted`]).
    ask_all: Vec<bool>,
    cycles: u64,
    /// When a cycle starts early.
    early: EarlyCycles,
    pressure: KeyPressure,
    /// The last cycle's collected deltas, kept for their memory.
    collected: Vec<CollectedDelta>,
    /// The last cycle's new owed entries, kept for their memory.
    fresh: Vec<(CounterKey, Owed)>,
    /// Each quota's rejection count as of the last cycle (`None` before
    /// the first, which only takes the baseline: a new sync thread does
    /// not report what an earlier one already did).
    rejected_seen: Option<IdMap<u64>>,
}

impl SyncEngine {
    /// An engine for `roots`, syncing every `interval` nanoseconds.
    pub fn new(
        roots: &[String],
        limiter_id: String,
        interval: Nanos,
        max_owed: usize,
        now: Nanos,
    ) -> Self {
        Self {
            links: roots
                .iter()
                .map(|u| RootLink::new(u.trim_end_matches('/').into()))
                .collect(),
            groups: 1,
            health: Health::new(now, interval, DEFAULT_IN_FLIGHT_LEASE.as_nanos() as Nanos),
            unacked: Unacked::default(),
            recent: Recent::default(),
            slots: IdMap::default(),
            slots_generation: None,
            limiter_id,
            interval,
            max_owed,
            max_request_entries: MAX_DELTAS_PER_SYNC,
            started: now,
            ask_all: vec![false; roots.len()],
            cycles: 0,
            early: EarlyCycles::new(interval),
            pressure: KeyPressure::default(),
            collected: Vec::new(),
            fresh: Vec::new(),
            rejected_seen: None,
        }
    }

    /// Takes over what an earlier sync thread on `table`'s region (before
    /// an nginx reload) remembered of each root: the instance that last
    /// answered it, the restarts it saw, whether it takes returns (or the
    /// returns of the first request would be dropped). Without it, a root restarted
    /// during the reload is not found restarted (its new instance would
    /// never count the slots held from before, and their returns would
    /// hide later ones), and in-flight levels taken from a root's
    /// instance by the earlier thread would be max-merged with that same
    /// instance's later, lower values for good. Such a root's first whole
    /// answer (of every counter: a new thread asks from version 0) also
    /// settles the in-flight counters it leaves out: they are empty
    /// there, and no later answer would mention them. And after the
    /// grace, levels still carrying an earlier instance's source are taken
    /// as the current one's, as after a restart found here (the earlier
    /// thread may have found one within its grace). Call before the first
    /// cycle.
    pub fn resume(&mut self, table: &Table) {
        for (link, ask_all) in self.links.iter_mut().zip(&mut self.ask_all) {
            if let Some(known) = super::status::remembered_root(table, &link.url) {
                link.resume(known);
                *ask_all = true;
                // The earlier thread may have found a restart it had not
                // adopted the levels of yet: a grace from now covers it.
                link.restart_seen = Some(self.started);
            }
        }
        // Each in its place in this configuration (all read first: a root
        // that moved may have left its record where another goes now).
        for (i, link) in self.links.iter().enumerate() {
            if link.root_instance != 0 {
                super::status::remember_root(table, i, &link.url, link.remembered());
            }
        }
    }

    /// Lowers the entries one request may carry (tests: a backlog over
    /// the bound without a million counters).
    #[cfg(test)]
    pub fn limit_request_entries(&mut self, entries: usize) {
        self.max_request_entries = entries.max(4);
    }

    /// Puts root `i` in group `groups[i]` (see the `sync` module doc on
    /// root groups); without a call every root is in group 0. `groups` has
    /// one entry per root and numbers groups from 0 with no gap (as
    /// [`super::config::validate_groups`] checks).
    pub fn set_groups(&mut self, groups: &[u32]) {
        for (link, &g) in self.links.iter_mut().zip(groups) {
            link.group = g as usize;
            link.metrics.group = g;
        }
        self.groups = self.links.iter().map(|l| l.group + 1).max().unwrap_or(1);
        self.health.set_groups(self.groups);
    }

    /// Number of root groups (shards).
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The group root `i` is in.
    pub fn root_group(&self, i: usize) -> usize {
        self.links[i].group
    }

    /// Sets the in-flight lease (see [`super::config::SyncConfig::in_flight_lease`]).
    pub fn set_in_flight_lease(&mut self, lease: Nanos) {
        self.health.set_in_flight_lease(lease);
    }

    /// Turns early sync on (or off with `None`).
    pub fn set_early_sync(&mut self, early: Option<EarlySync>) {
        self.early.set(early);
    }

    /// Time between early-sync probes, when early sync is on.
    pub fn early_probe_every(&self) -> Option<Nanos> {
        self.early.early_probe_every()
    }

    /// Time between the networked loop's probes: they look for penalties
    /// started here (always) and, with early sync on, for unsent weight.
    pub fn probe_every(&self) -> Nanos {
        self.early.probe_every()
    }

    /// True when an early cycle should start now (see `early.rs`).
    pub fn early_sync_due(&mut self, table: &Table, now: Nanos) -> bool {
        self.early.due(table, now)
    }

    /// The checks each quota rejected since the last cycle, as
    /// `[id, count]` for the requests of this one, from the table's
    /// running `totals` (statistics: a root not sent to this cycle misses
    /// them).
    fn rejected_since_last_cycle(&mut self, totals: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        let first = self.rejected_seen.is_none();
        let seen = self.rejected_seen.get_or_insert_with(IdMap::default);
        let mut grown = Vec::new();
        let mut next = IdMap::default();
        next.reserve(totals.len());
        for (id, total) in totals {
            let before = seen.get(&id).copied().unwrap_or(0);
            // Smaller than before: the quota's slot was made anew.
            let new = if total < before {
                total
            } else {
                total - before
            };
            if !first && new > 0 {
                grown.push((id, new));
            }
            next.insert(id, total);
        }
        *seen = next;
        grown
    }

    /// The base URL of root `i`.
    pub fn root_url(&self, i: usize) -> &str {
        &self.links[i].url
    }

    /// Starts a cycle: collects the table's deltas, owes them to every
    /// root, and returns a request for each root not backing off and not
    /// still busy with an earlier exchange. Every request must be handed
    /// back to [`SyncEngine::finish`], whenever it ends.
    pub fn begin_cycle(&mut self, table: &Table, now: Nanos) -> Vec<Outgoing> {
        self.cycles += 1;
        // The cycle's buffers keep their memory from cycle to cycle.
        let mut collected = std::mem::take(&mut self.collected);
        let mut fresh = std::mem::take(&mut self.fresh);
        collected.clear();
        fresh.clear();
        let mut rejected = Vec::new();
        table.collect_deltas_and_rejections(&mut collected, &mut rejected);
        // Penalties started here go to every root (a penalty merges by
        // max, wherever it lands).
        let started = table.take_started_penalties();
        let mut held: Option<Vec<Penalty>> = None;
        self.unacked.add(&collected);
        let rejected = self.rejected_since_last_cycle(rejected);
        fresh.extend(collected.iter().map(|d| owed_of(table, d, now)));
        // With no root of a group up, backoff only delays finding the
        // first one back.
        let groups = self.groups;
        let mut group_up = vec![false; groups];
        for l in self.links.iter().filter(|l| l.metrics.up) {
            group_up[l.group] = true;
        }
        // Quota changes come from the lowest group with a root up; the
        // others' links take the furthest cursor of any other group.
        let quota_group = (groups > 1)
            .then(|| group_up.iter().position(|&up| up))
            .flatten();
        let mut furthest = vec![QuotaCursor::default(); groups];
        for l in &self.links {
            furthest[l.group] = furthest[l.group].max(l.cursor);
        }
        let fresh_of = |g: usize| of_shard(&fresh, g, groups);
        let rejected_of = |g: usize| -> Vec<(u64, u64)> {
            rejected
                .iter()
                .filter(|(id, _)| shard(CounterKey::named(*id), groups) == g)
                .copied()
                .collect()
        };
        let mut out = Vec::new();
        for (root, link) in self.links.iter_mut().enumerate() {
            let g = link.group;
            link.owe(fresh_of(g), self.max_owed, now);
            link.owe_penalties(&started);
            if link.busy {
                continue;
            }
            if link.skip > 0 && group_up[g] {
                link.skip -= 1;
                continue;
            }
            link.busy = true;
            let mut owed = std::mem::take(&mut link.owed);
            let mut rejected = if groups > 1 {
                rejected_of(g)
            } else {
                rejected.clone()
            };
            rejected.truncate(self.max_request_entries / 2);
            if link.takes_tiers && std::mem::take(&mut link.resend_penalties) {
                let now_utc = now as i64 + table.utc_offset();
                link.tiers.penalties = held
                    .get_or_insert_with(|| table.held_penalties(now_utc))
                    .clone();
            }
            // Penalties take at most a quarter of a request; the rest stay
            // owed for the next cycle.
            let mut penalties = std::mem::take(&mut link.tiers.penalties);
            if penalties.len() > self.max_request_entries / 4 {
                link.tiers.penalties = penalties.split_off(self.max_request_entries / 4);
            }
            link.penalties_sent = penalties;
            let room = self.max_request_entries - rejected.len() - link.penalties_sent.len();
            let mut due = due_deltas(&owed, now, link.takes_returns);
            if due.entry_count() > room {
                // Each owed counter takes at most four entries (an add and
                // a return, each perhaps opening its key template's group).
                link.owed = split_owed(&mut owed, room / 4);
                due = due_deltas(&owed, now, link.takes_returns);
            }
            link.metrics.dropped_returns = link
                .metrics
                .dropped_returns
                .saturating_add(due.dropped_returns);
            let others = furthest
                .iter()
                .enumerate()
                .filter(|&(other, _)| other != g)
                .map(|(_, &c)| c)
                .max()
                .unwrap_or_default();
            link.cursor = link.cursor.max(others);
            let quotas_after = match quota_group {
                Some(q) if q != g => NO_QUOTAS,
                _ => link.cursor,
            };
            let tiers = TierRequest {
                penalties: link.penalties_sent.clone(),
                ..link.tiers.clone()
            };
            let request = SyncRequest {
                tiers,
                limiter: self.limiter_id.clone(),
                quotas_after,
                counter_version: link.counter_version,
                root_instance: link.root_instance,
                deltas: due.named,
                keyed: due.keyed,
                rejected,
                returned: due.returned,
                keyed_returned: due.keyed_returned,
            };
            out.push(Outgoing {
                root,
                request,
                owed,
                clock: link.clock_report(),
            });
        }
        self.collected = collected;
        self.fresh = fresh;
        out
    }

    /// Applies the outcome of one exchange with root `root`: the pages that
    /// succeeded (in order) and, if it stopped early, the error. With no
    /// page at all the root is owed `owed` again and backs off, unless no
    /// other root is up either: then it is tried every cycle, so that the
    /// first root to come back is found within an interval.
    pub fn finish(
        &mut self,
        table: &Table,
        root: usize,
        owed: OwedDeltas,
        pages: &[Page],
        error: Option<String>,
        now: Nanos,
    ) -> Vec<LogLine> {
        let mut log = Vec::new();
        let group = self.links[root].group;
        // Another root of the same group serves the shard meanwhile.
        let others_up = others_up(&self.links, root);
        let link = &mut self.links[root];
        link.busy = false;
        if pages.is_empty() {
            // Log a root's failure when it was up, or the first time for a
            // root that never answered; not at every retry of a dead one.
            let was_up = link.metrics.up || (link.metrics.syncs == 0 && link.metrics.errors == 0);
            let error = error.unwrap_or_else(|| "no reply".into());
            link.owe(owed.into_iter(), self.max_owed, now);
            if was_up {
                log.push((
                    LogLevel::Warn,
                    format!("quota root {} unreachable: {error}", link.url),
                ));
            }
            link.failed(others_up, error);
            self.settle_if_all_in(table);
            return log;
        }
        if !link.metrics.up && link.metrics.errors > 0 {
            log.push((
                LogLevel::Info,
                format!("quota root {} reachable again", link.url),
            ));
        }
        let mut owed = owed;
        let used = owed.len();
        let mut nothing = OwedDeltas::default();
        for (k, page) in pages.iter().enumerate() {
            // Deltas went out with the first page only.
            let sent = if k == 0 { &mut owed } else { &mut nothing };
            let instance = self.links[root].root_instance;
            let resend = (instance != 0 && page.reply.root_instance != instance)
                .then(|| self.held_before(table, root, sent, now));
            let known = self.links[root].remembered();
            self.links[root].succeeded(page.sent_at, page.received_at, &page.reply);
            let link = &self.links[root];
            if link.remembered() != known {
                super::status::remember_root(table, root, &link.url, link.remembered());
            }
            if let Some(resend) = resend {
                let link = &mut self.links[root];
                link.owe(resend.into_iter(), self.max_owed, now);
                link.restart_seen = Some(now);
            }
            self.publish_utc_offset(table);
            self.apply(table, root, &page.reply, sent, &mut log);
        }
        self.links[root].reuse_owed(owed, used);
        self.adopt_after_restart(table, root, now);
        if let Some(last) = pages.last().filter(|p| !p.reply.more_quotas) {
            if std::mem::take(&mut self.ask_all[root]) {
                // Counters the root left out are empty there. (A reply cut
                // at a page of counters leaves some for the next one,
                // which then replaces the 0: one interval's undercount.)
                let groups = self.groups;
                let source = self.links[root].source(root);
                let carried: std::collections::HashSet<u64> = pages
                    .iter()
                    .flat_map(|p| p.reply.counters.iter().map(|c| c.id))
                    .collect();
                table.settle_omitted(source, now, |c| {
                    shard(c, groups) == group && !carried.contains(&c.id)
                });
            }
            // Counters come only once the quota pages are through; then
            // whatever this root left out did not change there.
            let at = self.links[root]
                .to_local(&CounterValue {
                    id: 0,
                    level: 0.0,
                    prev: 0.0,
                    at: last.reply.root_time,
                })
                .at;
            self.recent.vouch(group, at);
        }
        // A reply to a request for no quotas (another group gives them)
        // says nothing about the quota set.
        if pages
            .last()
            .is_some_and(|p| !p.reply.more_quotas && p.reply.quotas_after != NO_QUOTAS)
            && table.holds_seeds()
        {
            // A root's whole quota set is in: from now on the roots' quotas
            // are the set, and seeds from a file no root knows go.
            let report = purge_seeds(table);
            if report.deleted > 0 {
                log.push((
                    LogLevel::Info,
                    format!(
                        "a quota root answered; {} seed quota(s) from the quota file no root \
                         knows were removed",
                        report.deleted
                    ),
                ));
            }
        }
        if let Some(error) = error {
            // A later page failed; the deltas were delivered with the first.
            self.links[root].failed(others_up, error);
        }
        log.extend(self.health.answered(table, group, now));
        self.settle_if_all_in(table);
        log
    }

    /// Gives the table the UTC offset window quotas place their windows
    /// by: the first root's (in configuration order) that is up and said
    /// its UTC time, so every host of a fleet follows the same clock;
    /// the table keeps its last one (at first this machine's) otherwise.
    fn publish_utc_offset(&self, table: &Table) {
        let offset = self
            .links
            .iter()
            .filter(|l| l.metrics.up)
            .find_map(|l| l.utc_offset);
        if let Some(offset) = offset {
            table.set_utc_offset(offset);
        }
    }

    /// Settles unchanged counters once every root asked has answered or
    /// failed, so the table learns of them right away.
    fn settle_if_all_in(&mut self, table: &Table) {
        if !self.links.iter().any(|l| l.busy) {
            self.recent.settle(table, self.groups);
        }
    }

    fn apply(
        &mut self,
        table: &Table,
        root: usize,
        reply: &SyncResponse,
        sent: &mut OwedDeltas,
        log: &mut Vec<LogLine>,
    ) {
        if !reply.quotas.is_empty() {
            let report = table.apply_quotas(&reply.quotas);
            for refused in report.refused.iter().take(5) {
                log.push((LogLevel::Error, refused.to_string()));
            }
        }
        if !reply.tiers.overrides.is_empty() {
            let report = table.apply_overrides(&reply.tiers.overrides);
            if report.refused > 0 {
                log.push((
                    LogLevel::Error,
                    format!(
                        "{} override(s) refused: the tier section is full ({} held; raise \
                         sluice_overrides)",
                        report.refused,
                        table.tier_capacity()
                    ),
                ));
            }
        }
        table.merge_penalties(&reply.tiers.penalties);
        let generation = table.generation();
        if self.slots_generation != Some(generation) {
            self.slots = table.slot_ids().into_iter().collect();
            self.slots_generation = Some(generation);
        }
        // Looked up once: every value of the reply is moved by it.
        let offset = self.links[root].offset();
        let source = self.links[root].source(root);
        let keyed = reply.keyed.iter().flat_map(|group| {
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
        let values = reply
            .counters
            .iter()
            .map(|c| {
                let local = Tally {
                    prev: c.prev,
                    ..Tally::leaky(level_at_offset(offset, c.level, c.at))
                };
                (CounterKey::named(c.id), local)
            })
            .chain(keyed);
        for (counter, value) in values {
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
            self.recent.changed(counter, slot);
            let amount = acked.map_or(0, |a| a.1);
            if !table.merge_counter(slot, counter.id, counter.key, value, amount, source)
                && acked.is_some()
            {
                // Its quota moved to another slot since the delta was
                // collected: merge it where it is now.
                if let Some(&moved) = self.slots.get(&counter.id).filter(|&&s| s != slot) {
                    self.recent.changed(counter, moved);
                    table.merge_counter(moved, counter.id, counter.key, value, amount, source);
                }
            }
        }
        for (counter, owed) in sent.drain() {
            if let Some((slot, acked)) = self.unacked.take(counter, owed.weight, owed.returned) {
                table.release_inflight(slot, counter.id, counter.key, acked);
            }
        }
    }

    /// Once root `root` was found restarted [`RESTART_GRACE`] intervals
    /// ago, its new instance holds every host's resent slots (each host
    /// finds the restart at its first exchange with it, within about an
    /// interval, and resends at its next one): the in-flight levels this
    /// host knew from its earlier instances become the new instance's, so
    /// its next reply replaces them, lower or not. Every earlier
    /// instance's: a level taken from one that came and went within the
    /// grace (restarted twice) would stay as well. Earlier, the new
    /// instance may still lack slots not resent yet, and replacing would
    /// be fail-open; never, the earlier value would stay (it never leaks)
    /// against every lower one: strict for good.
    fn adopt_after_restart(&mut self, table: &Table, root: usize, now: Nanos) {
        let grace = RESTART_GRACE.saturating_mul(self.interval);
        let link = &mut self.links[root];
        let Some(seen) = link.restart_seen else {
            return;
        };
        if now.saturating_sub(seen) < grace {
            return;
        }
        link.restart_seen = None;
        let link = &self.links[root];
        if table.adopt_source(|s| link.is_earlier_source(root, s), link.source(root)) > 0 {
            // The next reply must carry them even if the new instance's
            // count has not changed since (or is empty: left out).
            self.links[root].counter_version = 0;
            self.ask_all[root] = true;
        }
    }

    /// What root `root`, found restarted by the reply to a request that
    /// carried `sent`, must be sent again: for each named in-flight
    /// counter of its group, the slots this host held before what it
    /// sent that root and still owes it. The new instance counts nothing
    /// from before; without these, the returns of those slots would take
    /// this host's holding there below zero and hide as many of its later
    /// slots for as long as it syncs (fail-open). Its held word less what
    /// the new instance counts of `sent` and of what the link still owes
    /// is exactly that: the restarted root then holds what this host
    /// holds. That includes units resent to an earlier restart that the
    /// new instance got (or will): a root restarting again before a
    /// resend was acknowledged is not sent the same slots twice. Per-key
    /// counters keep no held word yet and are not resent.
    fn held_before(
        &self,
        table: &Table,
        root: usize,
        sent: &OwedDeltas,
        now: Nanos,
    ) -> Vec<(CounterKey, Owed)> {
        let link = &self.links[root];
        let net = |owed: &OwedDeltas, c: &CounterKey| owed.get(c).map_or(0, Owed::counted_net);
        table
            .held_counts()
            .into_iter()
            .filter_map(|(id, held)| {
                let c = CounterKey::named(id);
                if shard(c, self.groups) != link.group {
                    return None;
                }
                let before = i128::from(held) - net(sent, &c) - net(&link.owed, &c);
                let before = u64::try_from(before).ok().filter(|&n| n > 0)?;
                Some((c, Owed::resent(before, now)))
            })
            .collect()
    }

    /// Ends a cycle (call it before the next [`SyncEngine::begin_cycle`]).
    /// Settles unchanged counters if a slow root kept that from happening
    /// earlier. When no root answered for two intervals, folds local weight
    /// into the levels (limiting goes on per host) and logs it once a
    /// minute; the first answer after that ends it (and says so).
    pub fn end_cycle(&mut self, table: &Table, now: Nanos) -> Vec<LogLine> {
        let mut log = Vec::new();
        let down = self.health.all_silent(&self.links, now);
        self.recent.settle(table, self.groups);
        if !down && self.groups > 1 {
            self.groups_down(table, now, &mut log);
        }
        table.maintain_keys(key_sweep_budget(table, self.interval), now);
        table.sweep_tiers(now as i64 + table.utc_offset());
        log.extend(self.pressure.check(table));
        if down {
            // Weight admitted since this cycle began is owed to the roots
            // too, or they would never count it (an in-flight slot taken
            // now must reach them, or its release would later cancel
            // another).
            self.collect_late(table, now);
            // Weight in flight that no root will acknowledge goes back to
            // pending, then everything pending is folded in locally.
            self.abandon(table);
            table.fold_local(now);
            if table.holds_in_flight() {
                self.ask_all_after_fold(|_| true);
            }
            log.extend(self.health.all_down_at(table, self.links.len(), now));
        }
        self.health.set_all_down(down);
        table.set_counting_locally(down);
        log
    }

    /// Collects what was admitted since the cycle began and owes it to
    /// every root of its shard, as [`SyncEngine::begin_cycle`] does,
    /// without sending it: the fold that follows takes it locally.
    fn collect_late(&mut self, table: &Table, now: Nanos) {
        let mut late = std::mem::take(&mut self.collected);
        late.clear();
        table.collect_deltas(&mut late);
        self.unacked.add(&late);
        let groups = self.groups;
        let mut owed = std::mem::take(&mut self.fresh);
        owed.clear();
        owed.extend(late.iter().map(|d| owed_of(table, d, now)));
        for link in &mut self.links {
            link.owe(of_shard(&owed, link.group, groups), self.max_owed, now);
        }
        self.collected = late;
        self.fresh = owed;
    }

    /// Own weight was folded into the levels of the groups `folded` says,
    /// in-flight counters among them: their roots are asked for all their
    /// counters at their next exchange. A reply replaces a folded
    /// in-flight level, so it must carry even a counter nobody changed
    /// meanwhile, and one it leaves out is empty there (the other hosts
    /// gave back all its slots while this host could not hear).
    fn ask_all_after_fold(&mut self, folded: impl Fn(usize) -> bool) {
        for (link, after) in self.links.iter_mut().zip(&mut self.ask_all) {
            if folded(link.group) {
                link.counter_version = 0;
                *after = true;
            }
        }
    }

    /// With several groups and not all of them down: folds the in-flight
    /// weight of every shard whose group has not answered for two
    /// intervals into the local levels (per host), and says so once a
    /// minute per group.
    fn groups_down(&mut self, table: &Table, now: Nanos, log: &mut Vec<LogLine>) {
        let groups = self.groups;
        let down = self.health.silent_groups(&self.links, now);
        if down.iter().any(|&d| d) {
            self.unacked.by_counter.retain(|c, entry| {
                if !down[shard(*c, groups)] {
                    return true;
                }
                table.fold_inflight(entry.0, c.id, c.key, Unacked::net(entry), now);
                false
            });
            if table.holds_in_flight() {
                self.ask_all_after_fold(|g| down[g]);
            }
        }
        log.extend(self.health.groups_down_at(table, &down, now));
    }

    /// The sync thread stops: weight sent but acknowledged by no root goes
    /// back to the table's pending, so the next sync thread (after an nginx
    /// reload, the new worker's) sends it instead of it staying in flight
    /// forever. A root that did get it counts it twice, once; that
    /// overcount leaks away like any weight.
    pub fn abandon(&mut self, table: &Table) {
        for (c, entry) in &self.unacked.by_counter {
            table.requeue_inflight(entry.0, c.id, c.key, Unacked::net(entry));
        }
        self.unacked = Unacked::default();
    }

    /// Counts request and reply bytes for root `root`.
    pub fn count_bytes(&mut self, root: usize, sent: u64, received: u64) {
        let m = &mut self.links[root].metrics;
        m.bytes_sent += sent;
        m.bytes_received += received;
    }

    /// True while no root has answered for two intervals.
    pub fn all_down(&self) -> bool {
        self.health.all_down()
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> SyncMetrics {
        SyncMetrics {
            cycles: self.cycles,
            all_roots_down: self.health.all_down(),
            roots: self.links.iter().map(|l| l.metrics.clone()).collect(),
            groups_down: self.health.groups_down(),
        }
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "return_tests.rs"]
mod return_tests;
