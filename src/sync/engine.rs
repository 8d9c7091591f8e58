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
//! - a counter a root leaves out of a complete reply did not change there:
//!   the engine tells the table so at the end of the cycle, which resets the
//!   counter's extrapolation and decays its fill rate (see `Recent`);
//! - when no root answered for two intervals the engine folds local weight
//!   into the levels (per-host limiting) and says so once a minute;
//! - with root groups (see the `sync` module doc), each counter is owed
//!   only to the roots of its shard ([`super::shard`]), "unchanged" is
//!   vouched per group, quota changes come from one group, and a group
//!   down folds only its shard's weight locally.

use super::ids::{CounterMap, IdMap};
use super::link::{level_at_offset, Owed, OwedDeltas, RootLink, NO_QUOTAS};
use super::{EarlySync, LogLevel, SyncMetrics};
use crate::core::{Counting, Level, Nanos, Tally};
use crate::table::file::purge_seeds;
use crate::table::{CollectedDelta, SlotId, Table};
use crate::wire::{
    ClockReport, CounterDelta, CounterKey, CounterValue, KeyDelta, KeyedDeltas, QuotaCursor,
    SyncRequest, SyncResponse,
};
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// How often "all roots down" is repeated in the log.
const DOWN_LOG_EVERY: Nanos = 60_000_000_000;

/// Cycles a counter stays in [`Recent`] without changing: by then its fill
/// rate has been halved this many times (to 1/65536 of what it was).
const QUIET_CYCLES: u32 = 16;

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

/// How often per interval early sync probes the table.
pub const EARLY_PROBES_PER_INTERVAL: u64 = 20;

/// A log line the engine wants written.
pub type LogLine = (LogLevel, String);

/// Deltas collected and sent, not yet included in any root's answer.
#[derive(Default, Debug)]
struct Unacked {
    by_counter: CounterMap<(SlotId, u64)>,
}

impl Unacked {
    fn add(&mut self, collected: &[CollectedDelta]) {
        for d in collected {
            let e = self.by_counter.entry(counter_of(d)).or_insert((d.slot, 0));
            e.0 = d.slot;
            e.1 += d.delta;
        }
    }

    /// Takes up to `sent` of the counter's unacknowledged weight (one
    /// lookup: this runs for every counter of every reply).
    fn take(&mut self, counter: CounterKey, sent: u64) -> Option<(SlotId, u64)> {
        let Entry::Occupied(mut e) = self.by_counter.entry(counter) else {
            return None;
        };
        let (slot, weight) = e.get_mut();
        let acked = (*weight).min(sent);
        *weight -= acked;
        let slot = *slot;
        if *weight == 0 {
            e.remove();
        }
        Some((slot, acked))
    }
}

/// The counter a collected delta belongs to.
fn counter_of(d: &CollectedDelta) -> CounterKey {
    CounterKey {
        id: d.id,
        key: d.key,
    }
}

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
struct Recent {
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
    fn changed(&mut self, counter: CounterKey, slot: SlotId) {
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
    fn vouch(&mut self, group: usize, at: Nanos) {
        if self.quiet_until.len() <= group {
            self.quiet_until.resize(group + 1, None);
        }
        let until = &mut self.quiet_until[group];
        *until = Some(until.map_or(at, |u| u.min(at)));
    }

    /// Tells the table that every recent counter no root of its group
    /// reported did not change up to that group's `quiet_until`, and
    /// forgets counters quiet for long.
    fn settle(&mut self, table: &Table, groups: usize) {
        let until = std::mem::take(&mut self.quiet_until);
        if until.iter().any(Option::is_some) {
            let round = self.round;
            self.by_counter.retain(|c, t| {
                if t.reported == round {
                    return true;
                }
                let Some(at) = until.get(super::shard(*c, groups)).copied().flatten() else {
                    // Nobody vouched for its shard: kept as it is.
                    return true;
                };
                t.quiet += 1;
                let nothing = Tally::leaky(Level::empty(at));
                table.merge_counter(t.slot, c.id, c.key, nothing, 0) && t.quiet < QUIET_CYCLES
            });
        }
        self.round += 1;
    }
}

/// The request for the next quota page after `reply`, if the root has more
/// (no deltas: they went with the first page).
pub fn next_page(previous: &SyncRequest, reply: &SyncResponse) -> Option<SyncRequest> {
    (reply.more_quotas && !reply.quotas.is_empty()).then(|| SyncRequest {
        limiter: previous.limiter.clone(),
        quotas_after: reply.quotas_after,
        counter_version: reply.counter_version,
        root_instance: reply.root_instance,
        deltas: Vec::new(),
        keyed: Vec::new(),
        rejected: Vec::new(),
    })
}

/// What `owed` comes to at `now`, as a request carries it: named deltas,
/// and keyed ones grouped by template (entries that leaked to less than a
/// unit are left out).
fn due_deltas(owed: &OwedDeltas, now: Nanos) -> (Vec<CounterDelta>, Vec<KeyedDeltas>) {
    let mut named = Vec::new();
    // By template and window: a group's deltas share one window.
    let mut by_template: HashMap<(u64, Option<i64>), Vec<KeyDelta>> = HashMap::new();
    for (c, o) in owed {
        let delta = o.due(now);
        if delta == 0 {
            continue;
        }
        let window = o.window.map(|w| w.index);
        if c.key == 0 {
            named.push(CounterDelta {
                id: c.id,
                delta,
                window,
            });
        } else {
            by_template
                .entry((c.id, window))
                .or_default()
                .push(KeyDelta(c.key, delta));
        }
    }
    let keyed = by_template
        .into_iter()
        .map(|((id, window), deltas)| KeyedDeltas { id, deltas, window })
        .collect();
    (named, keyed)
}

/// The sync state of one limiter.
#[derive(Debug)]
pub struct SyncEngine {
    links: Vec<RootLink>,
    /// Number of root groups (shards), at least 1.
    groups: usize,
    /// Per group: local time of the last answer from any of its roots.
    group_success: Vec<Option<Nanos>>,
    /// Per group: no root of it answered for two intervals (its shard is
    /// limited per host).
    group_down: Vec<bool>,
    /// Per group: when its being down was last logged.
    group_down_logged: Vec<Option<Nanos>>,
    unacked: Unacked,
    recent: Recent,
    slots: IdMap<SlotId>,
    slots_generation: Option<u64>,
    limiter_id: String,
    interval: Nanos,
    max_owed: usize,
    started: Nanos,
    last_any_success: Option<Nanos>,
    all_down: bool,
    down_logged_at: Option<Nanos>,
    cycles: u64,
    early: Option<EarlySync>,
    last_early: Option<Nanos>,
    pressure: super::KeyPressure,
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
            group_success: vec![None],
            group_down: vec![false],
            group_down_logged: vec![None],
            unacked: Unacked::default(),
            recent: Recent::default(),
            slots: IdMap::default(),
            slots_generation: None,
            limiter_id,
            interval,
            max_owed,
            started: now,
            last_any_success: None,
            all_down: false,
            down_logged_at: None,
            cycles: 0,
            early: None,
            last_early: None,
            pressure: super::KeyPressure::default(),
            collected: Vec::new(),
            fresh: Vec::new(),
            rejected_seen: None,
        }
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
        self.group_success = vec![None; self.groups];
        self.group_down = vec![false; self.groups];
        self.group_down_logged = vec![None; self.groups];
    }

    /// Number of root groups (shards).
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The group root `i` is in.
    pub fn root_group(&self, i: usize) -> usize {
        self.links[i].group
    }

    /// Turns early sync on (or off with `None`).
    pub fn set_early_sync(&mut self, early: Option<EarlySync>) {
        self.early = early;
    }

    /// Time between early-sync probes, when early sync is on.
    pub fn early_probe_every(&self) -> Option<Nanos> {
        self.early
            .map(|_| (self.interval / EARLY_PROBES_PER_INTERVAL).max(1))
    }

    /// True when an early cycle should start now: early sync is on, its
    /// budget allows one, and some quota's unsent local delta passed its
    /// share of the burst band.
    pub fn early_sync_due(&mut self, table: &Table, now: Nanos) -> bool {
        let Some(early) = self.early else {
            return false;
        };
        let spacing = (1e9 / early.max_per_second.max(1e-9)) as Nanos;
        if self
            .last_early
            .is_some_and(|t| now.saturating_sub(t) < spacing)
        {
            return false;
        }
        let due = table.unsent_beyond(early.fraction);
        if due {
            self.last_early = Some(now);
        }
        due
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
        self.unacked.add(&collected);
        let rejected = self.rejected_since_last_cycle(rejected);
        fresh.extend(collected.iter().map(|d| {
            // A slot that no longer holds the quota: the root ignores the
            // delta anyway. A key counts as its template does.
            let counting = table
                .counter_counting(d.slot, d.id)
                .unwrap_or(Counting::Leak(0.0));
            (counter_of(d), Owed::collected(d.delta, counting, now))
        }));
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
        let fresh_of = |g: usize| {
            fresh
                .iter()
                .filter(move |(c, _)| super::shard(*c, groups) == g)
                .copied()
        };
        let rejected_of = |g: usize| -> Vec<(u64, u64)> {
            rejected
                .iter()
                .filter(|(id, _)| super::shard(CounterKey::named(*id), groups) == g)
                .copied()
                .collect()
        };
        let mut out = Vec::new();
        for (root, link) in self.links.iter_mut().enumerate() {
            let g = link.group;
            link.owe(fresh_of(g), self.max_owed, now);
            if link.busy {
                continue;
            }
            if link.skip > 0 && group_up[g] {
                link.skip -= 1;
                continue;
            }
            link.busy = true;
            let owed = std::mem::take(&mut link.owed);
            let (deltas, keyed) = due_deltas(&owed, now);
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
            let request = SyncRequest {
                limiter: self.limiter_id.clone(),
                quotas_after,
                counter_version: link.counter_version,
                root_instance: link.root_instance,
                deltas,
                keyed,
                rejected: if groups > 1 {
                    rejected_of(g)
                } else {
                    rejected.clone()
                },
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
        let others_up = self
            .links
            .iter()
            .enumerate()
            .any(|(i, l)| i != root && l.group == group && l.metrics.up);
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
            self.links[root].succeeded(page.sent_at, page.received_at, &page.reply);
            self.publish_utc_offset(table);
            // Deltas went out with the first page only.
            let sent = if k == 0 { &mut owed } else { &mut nothing };
            self.apply(table, root, &page.reply, sent, &mut log);
        }
        self.links[root].reuse_owed(owed, used);
        if let Some(last) = pages.last().filter(|p| !p.reply.more_quotas) {
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
        self.last_any_success = Some(now);
        self.group_success[group] = Some(now);
        if self.group_down[group] && !self.all_down {
            self.group_down[group] = false;
            self.group_down_logged[group] = None;
            log.push((
                LogLevel::Info,
                format!("a quota root of group {group} answers again; its shard is limited fleet-wide again"),
            ));
        }
        self.group_down[group] = false;
        if self.all_down {
            // Limiting is cluster-wide again from this reply on.
            self.all_down = false;
            self.down_logged_at = None;
            log.push((
                LogLevel::Info,
                "a quota root answers again; cluster limiting resumed".into(),
            ));
        }
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
        let generation = table.generation();
        if self.slots_generation != Some(generation) {
            self.slots = table.slot_ids().into_iter().collect();
            self.slots_generation = Some(generation);
        }
        // Looked up once: every value of the reply is moved by it.
        let offset = self.links[root].offset();
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
                .and_then(|s| self.unacked.take(counter, s.weight));
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
            if !table.merge_counter(slot, counter.id, counter.key, value, amount) && acked.is_some()
            {
                // Its quota moved to another slot since the delta was
                // collected: merge it where it is now.
                if let Some(&moved) = self.slots.get(&counter.id).filter(|&&s| s != slot) {
                    self.recent.changed(counter, moved);
                    table.merge_counter(moved, counter.id, counter.key, value, amount);
                }
            }
        }
        for (counter, owed) in sent.drain() {
            if let Some((slot, acked)) = self.unacked.take(counter, owed.weight) {
                table.release_inflight(slot, counter.id, counter.key, acked);
            }
        }
    }

    /// Ends a cycle (call it before the next [`SyncEngine::begin_cycle`]).
    /// Settles unchanged counters if a slow root kept that from happening
    /// earlier. When no root answered for two intervals, folds local weight
    /// into the levels (limiting goes on per host) and logs it once a
    /// minute; the first answer after that ends it (and says so).
    pub fn end_cycle(&mut self, table: &Table, now: Nanos) -> Vec<LogLine> {
        let mut log = Vec::new();
        let since = self.last_any_success.unwrap_or(self.started);
        // An exchange still under way (a long initial sync paging through
        // quotas) has not failed yet.
        let waiting = self.links.iter().any(|l| l.busy);
        let down =
            !self.links.is_empty() && !waiting && now.saturating_sub(since) > 2 * self.interval;
        self.recent.settle(table, self.groups);
        if !down && self.groups > 1 {
            self.groups_down(table, now, &mut log);
        }
        table.maintain_keys(super::key_sweep_budget(table, self.interval), now);
        log.extend(self.pressure.check(table));
        if down {
            // Weight in flight that no root will acknowledge goes back to
            // pending, then everything pending is folded in locally.
            self.abandon(table);
            table.fold_local(now);
            if self
                .down_logged_at
                .is_none_or(|t| now.saturating_sub(t) >= DOWN_LOG_EVERY)
            {
                self.down_logged_at = Some(now);
                let msg = format!(
                    "all {} quota roots unreachable; limiting with local counts only (per host)",
                    self.links.len()
                );
                log.push((LogLevel::Warn, msg));
            }
        }
        self.all_down = down;
        log
    }

    /// With several groups and not all of them down: folds the in-flight
    /// weight of every shard whose group has not answered for two
    /// intervals into the local levels (per host), and says so once a
    /// minute per group.
    fn groups_down(&mut self, table: &Table, now: Nanos, log: &mut Vec<LogLine>) {
        let groups = self.groups;
        let mut down = vec![false; groups];
        for (g, is_down) in down.iter_mut().enumerate() {
            let mut roots = self.links.iter().filter(|l| l.group == g);
            let waiting = roots.clone().any(|l| l.busy);
            let since = self.group_success[g].unwrap_or(self.started);
            *is_down =
                roots.next().is_some() && !waiting && now.saturating_sub(since) > 2 * self.interval;
        }
        if down.iter().any(|&d| d) {
            self.unacked.by_counter.retain(|c, &mut (slot, amount)| {
                if !down[super::shard(*c, groups)] {
                    return true;
                }
                table.fold_inflight(slot, c.id, c.key, amount, now);
                false
            });
        }
        for (g, &is_down) in down.iter().enumerate() {
            if is_down
                && self.group_down_logged[g].is_none_or(|t| now.saturating_sub(t) >= DOWN_LOG_EVERY)
            {
                self.group_down_logged[g] = Some(now);
                log.push((
                    LogLevel::Warn,
                    format!(
                        "every quota root of group {g} unreachable; its shard of the counters \
                         is limited with local counts only (per host), the others fleet-wide"
                    ),
                ));
            }
            self.group_down[g] = is_down;
        }
    }

    /// The sync thread stops: weight sent but acknowledged by no root goes
    /// back to the table's pending, so the next sync thread (after an nginx
    /// reload, the new worker's) sends it instead of it staying in flight
    /// forever. A root that did get it counts it twice, once; that
    /// overcount leaks away like any weight.
    pub fn abandon(&mut self, table: &Table) {
        for (c, &(slot, amount)) in &self.unacked.by_counter {
            table.requeue_inflight(slot, c.id, c.key, amount);
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
        self.all_down
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> SyncMetrics {
        SyncMetrics {
            cycles: self.cycles,
            all_roots_down: self.all_down,
            roots: self.links.iter().map(|l| l.metrics.clone()).collect(),
            groups_down: (0..self.groups)
                .filter(|&g| self.group_down[g])
                .map(|g| g as u32)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Quota;
    use crate::table::Outcome;
    use crate::wire::{CounterValue, QuotaCursor};

    const SEC: Nanos = 1_000_000_000;

    fn table() -> Table {
        table_with(10.0)
    }

    /// A table with quota `q` (id 1) leaking at `limit`.
    fn table_with(limit: f64) -> Table {
        let t = Table::new_heap(8, 16);
        t.apply_quotas(&[Quota::new(1, "q", limit, 100.0, 100.0)]);
        t
    }

    fn reply(level: f64, at: Nanos) -> SyncResponse {
        SyncResponse {
            keyed: Vec::new(),
            root_instance: 7,
            root_time: at,
            quotas: vec![],
            quotas_after: QuotaCursor { epoch: 1, id: 1 },
            more_quotas: false,
            counters: vec![CounterValue {
                id: 1,
                level,
                at,
                prev: 0.0,
            }],
            counter_version: 1,
            root_utc: None,
        }
    }

    fn page(level: f64, at: Nanos) -> Page {
        Page {
            sent_at: at,
            received_at: at,
            reply: reply(level, at),
        }
    }

    /// A reply at `at` that reports no counter (none changed).
    fn quiet_page(at: Nanos) -> Page {
        let mut page = page(0.0, at);
        page.reply.counters.clear();
        page
    }

    /// One cycle at `now` in which every root answers `pages(root)`
    /// (no page: the root failed).
    fn cycle(
        e: &mut SyncEngine,
        t: &Table,
        now: Nanos,
        pages: impl Fn(usize) -> Vec<Page>,
    ) -> Vec<Outgoing> {
        let out = e.begin_cycle(t, now);
        for o in &out {
            let pages = pages(o.root);
            let error = pages.is_empty().then(|| "down".to_string());
            e.finish(t, o.root, o.owed.clone(), &pages, error, now);
        }
        e.end_cycle(t, now);
        out
    }

    fn deltas_to(out: &[Outgoing], root: usize) -> Vec<CounterDelta> {
        let o = out.iter().find(|o| o.root == root).expect("a request");
        o.request.deltas.clone()
    }

    #[test]
    fn the_first_answer_acknowledges_and_the_second_only_merges() {
        let t = table();
        let roots = ["http://a".to_string(), "http://b".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        for _ in 0..5 {
            assert_eq!(t.check(b"q", 2, 0), Outcome::Pass);
        }
        let out = e.begin_cycle(&t, SEC);
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].request.deltas,
            vec![CounterDelta {
                id: 1,
                delta: 10,
                window: None
            }]
        );
        let st = t.quota(b"q", SEC).unwrap();
        assert_eq!((st.pending, st.inflight), (0, 10));
        e.finish(&t, 0, out[0].owed.clone(), &[page(30.0, SEC)], None, SEC);
        assert_eq!(t.quota(b"q", SEC).unwrap().inflight, 0);
        assert_eq!(t.quota(b"q", SEC).unwrap().level, 30.0);
        e.finish(&t, 1, out[1].owed.clone(), &[page(25.0, SEC)], None, SEC);
        let st = t.quota(b"q", SEC).unwrap();
        assert_eq!((st.inflight, st.level), (0, 30.0));
    }

    #[test]
    fn a_counter_whose_quota_moved_slots_since_collection_is_merged_where_it_is_now() {
        let t = table();
        let mut e = SyncEngine::new(&["http://a".to_string()], "h".into(), SEC, 100, 0);
        assert_eq!(t.check(b"q", 4, 0), Outcome::Pass);
        let out = e.begin_cycle(&t, SEC);
        // The reply renames quota 1: its old slot goes, a new one holds it.
        let mut page = page(30.0, SEC);
        let mut renamed = Quota::new(1, "q2", 10.0, 100.0, 100.0);
        renamed.epoch = 3;
        page.reply.quotas = vec![Quota::tombstone(1, "q", 2), renamed];
        e.finish(&t, 0, out[0].owed.clone(), &[page], None, SEC);
        assert!(t.quota(b"q", SEC).is_none());
        assert_eq!(t.quota(b"q2", SEC).unwrap().level, 30.0);
    }

    #[test]
    fn rejections_since_the_last_cycle_go_to_every_root() {
        // Limit 0, burst 100: the table rejects everything above 100.
        let t = table_with(0.0);
        let roots = ["http://a".to_string(), "http://b".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        assert_eq!(t.check(b"q", 100, 0), Outcome::Pass);
        assert_ne!(t.check(b"q", 1, 0), Outcome::Pass);
        // The first cycle takes the baseline: an earlier sync thread (of a
        // worker that died) already reported what the zone holds.
        let out = e.begin_cycle(&t, SEC);
        assert!(out.iter().all(|o| o.request.rejected.is_empty()));
        for o in out {
            e.finish(&t, o.root, o.owed, &[page(100.0, SEC)], None, SEC);
        }
        for _ in 0..3 {
            assert_ne!(t.check(b"q", 1, SEC), Outcome::Pass);
        }
        let out = e.begin_cycle(&t, 2 * SEC);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|o| o.request.rejected == [(1, 3)]));
        for o in out {
            e.finish(&t, o.root, o.owed, &[page(100.0, 2 * SEC)], None, 2 * SEC);
        }
        // Nothing new: nothing sent.
        let out = e.begin_cycle(&t, 3 * SEC);
        assert!(out.iter().all(|o| o.request.rejected.is_empty()));
    }

    #[test]
    fn a_failed_root_is_owed_its_deltas_and_gets_them_next_time() {
        // Nothing leaks at a limit of 0: the whole delta is still owed.
        let t = table_with(0.0);
        let roots = ["http://a".to_string(), "http://b".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 4, 0);
        let out = e.begin_cycle(&t, SEC);
        e.finish(&t, 0, out[0].owed.clone(), &[page(4.0, SEC)], None, SEC);
        let logs = e.finish(&t, 1, out[1].owed.clone(), &[], Some("refused".into()), SEC);
        assert_eq!(logs.len(), 1);
        t.check(b"q", 3, 0);
        // b backs off one interval; at 2 s it is due again with 4 + 3.
        let out = e.begin_cycle(&t, 2 * SEC);
        let to_b = out.iter().find(|o| o.root == 1).unwrap();
        assert_eq!(
            to_b.request.deltas,
            vec![CounterDelta {
                id: 1,
                delta: 7,
                window: None
            }]
        );
        let to_a = out.iter().find(|o| o.root == 0).unwrap();
        assert_eq!(
            to_a.request.deltas,
            vec![CounterDelta {
                id: 1,
                delta: 3,
                window: None
            }]
        );
        let m = e.metrics();
        assert!(m.roots[0].up && !m.roots[1].up);
    }

    #[test]
    fn a_stopping_engine_hands_unacknowledged_weight_back_to_pending() {
        let t = table_with(0.0);
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 4, 0);
        // Sent, never answered.
        let _out = e.begin_cycle(&t, SEC);
        assert_eq!(t.quota(b"q", SEC).unwrap().inflight, 4);
        e.abandon(&t);
        let s = t.quota(b"q", SEC).unwrap();
        assert_eq!((s.pending, s.inflight), (4, 0));
        // The next engine sends it.
        let mut next = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        let out = next.begin_cycle(&t, 2 * SEC);
        assert_eq!(
            out[0].request.deltas,
            vec![CounterDelta {
                id: 1,
                delta: 4,
                window: None
            }]
        );
    }

    #[test]
    fn a_root_that_never_answered_is_reported_unreachable_once() {
        let t = table();
        let roots = ["http://a".to_string(), "http://b".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        let mut about_b = 0;
        for s in 1..=10 {
            let now = s * SEC;
            for o in e.begin_cycle(&t, now) {
                let logs = if o.root == 0 {
                    e.finish(&t, 0, o.owed, &[page(0.0, now)], None, now)
                } else {
                    e.finish(&t, 1, o.owed, &[], Some("refused".into()), now)
                };
                about_b += logs.iter().filter(|l| l.1.contains("http://b")).count();
            }
            e.end_cycle(&t, now);
        }
        assert_eq!(about_b, 1);
        // When it comes back (once its backoff lets it be tried), that is
        // said once too.
        let mut back = Vec::new();
        for s in 11..=40 {
            let now = s * SEC;
            for o in e.begin_cycle(&t, now) {
                let logs = e.finish(&t, o.root, o.owed, &[page(0.0, now)], None, now);
                back.extend(logs.into_iter().filter(|l| l.1.contains("http://b")));
            }
            e.end_cycle(&t, now);
        }
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!(back[0].0, LogLevel::Info);
    }

    #[test]
    fn with_every_root_down_the_engine_counts_locally_and_says_so_once() {
        let t = table();
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 50, 0);
        let mut warnings = 0;
        for s in 1..=10 {
            let now = s * SEC;
            for o in e.begin_cycle(&t, now) {
                e.finish(&t, o.root, o.owed, &[], Some("down".into()), now);
            }
            warnings += e
                .end_cycle(&t, now)
                .iter()
                .filter(|l| l.0 == LogLevel::Warn)
                .count();
        }
        assert!(e.all_down());
        assert_eq!(warnings, 1);
        // Folded and leaked locally: 50 units at 10/s are gone after 10 s.
        let st = t.quota(b"q", 10 * SEC).unwrap();
        assert_eq!((st.pending, st.inflight, st.level), (0, 0, 0.0));
        // The root comes back: merged by max, and the log says so.
        let out = e.begin_cycle(&t, 20 * SEC);
        let logs = e.finish(
            &t,
            0,
            out[0].owed.clone(),
            &[page(60.0, 20 * SEC)],
            None,
            20 * SEC,
        );
        assert!(logs.iter().any(|l| l.1.contains("reachable again")));
        assert!(logs
            .iter()
            .any(|l| l.1.contains("cluster limiting resumed")));
        assert!(!e.all_down());
        assert!(e.end_cycle(&t, 20 * SEC).is_empty());
        assert_eq!(t.quota(b"q", 20 * SEC).unwrap().level, 60.0);
    }

    #[test]
    fn keys_go_out_grouped_by_template_and_come_back_merged() {
        use crate::table::{CheckItem, CheckOptions};
        use crate::wire::{KeyValue, KeyedValues};
        let t = Table::new_heap_with_keys(8, 16, 64);
        t.apply_quotas(&[Quota::new(3, "per_user", 10.0, 100.0, 100.0).keyed()]);
        for (key, weight) in [(&b"alice"[..], 4), (b"bob", 1)] {
            let item = CheckItem {
                name: b"per_user",
                key: Some(key),
                weight,
                max_wait: None,
            };
            t.check_many(&[item], 0, CheckOptions::default(), || 0.5);
        }
        let (alice, bob) = (t.key_secret().hash(b"alice"), t.key_secret().hash(b"bob"));
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        let out = e.begin_cycle(&t, SEC);
        let request = &out[0].request;
        assert!(request.deltas.is_empty());
        assert_eq!(request.keyed.len(), 1);
        assert_eq!(request.keyed[0].id, 3);
        let mut sent = request.keyed[0].deltas.clone();
        sent.sort_by_key(|d| d.1);
        assert_eq!(sent, vec![KeyDelta(bob, 1), KeyDelta(alice, 4)]);
        // The root sums alice with another host's 6; bob is not reported.
        let mut reply = quiet_page(SEC);
        reply.reply.keyed = vec![KeyedValues {
            id: 3,
            values: vec![KeyValue(alice, 10.0, SEC)],
            prev: Vec::new(),
        }];
        e.finish(&t, 0, out[0].owed.clone(), &[reply], None, SEC);
        let keys = t.keys(None, SEC);
        let state = |h: u64| *keys.iter().find(|k| k.hash == h).unwrap();
        assert_eq!((state(alice).level, state(alice).inflight), (10.0, 0));
        // Bob's unit was acknowledged without a value: released.
        assert_eq!((state(bob).inflight, state(bob).pending), (0, 0));
    }

    /// A table with quotas `a` (id 1..) and `b` whose counters are in
    /// different shards of two, leaking at 10/s; their ids.
    fn two_shard_table() -> (Table, u64, u64) {
        let ids: Vec<u64> = (1..100).collect();
        let a = *ids
            .iter()
            .find(|&&i| crate::sync::shard(CounterKey::named(i), 2) == 0)
            .unwrap();
        let b = *ids
            .iter()
            .find(|&&i| crate::sync::shard(CounterKey::named(i), 2) == 1)
            .unwrap();
        let t = Table::new_heap(8, 16);
        t.apply_quotas(&[
            Quota::new(a, "a", 10.0, 100.0, 100.0),
            Quota::new(b, "b", 10.0, 100.0, 100.0),
        ]);
        (t, a, b)
    }

    fn page_of(counters: &[(u64, f64)], at: Nanos) -> Page {
        let mut page = quiet_page(at);
        page.reply.counters = counters
            .iter()
            .map(|&(id, level)| CounterValue {
                id,
                level,
                at,
                prev: 0.0,
            })
            .collect();
        page
    }

    #[test]
    fn shards_spread_counters_and_one_group_is_shard_zero() {
        let mut per = [0usize; 4];
        for id in 1..=4000u64 {
            assert_eq!(crate::sync::shard(CounterKey::named(id), 1), 0);
            per[crate::sync::shard(CounterKey::named(id), 4)] += 1;
            // Keys of one template spread too.
            let key = CounterKey {
                id: 7,
                key: id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            };
            assert!(crate::sync::shard(key, 4) < 4);
        }
        assert!(per.iter().all(|&n| (900..1100).contains(&n)), "{per:?}");
    }

    #[test]
    fn each_counter_goes_only_to_the_roots_of_its_shard() {
        let (t, a, b) = two_shard_table();
        let roots = ["http://g0a".into(), "http://g0b".into(), "http://g1".into()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        e.set_groups(&[0, 0, 1]);
        assert_eq!(e.groups(), 2);
        t.check(b"a", 3, 0);
        t.check(b"b", 5, 0);
        let out = cycle(&mut e, &t, SEC, |r| {
            vec![if r == 2 {
                page_of(&[(b, 5.0)], SEC)
            } else {
                page_of(&[(a, 3.0)], SEC)
            }]
        });
        let only = |id, delta| {
            vec![CounterDelta {
                id,
                delta,
                window: None,
            }]
        };
        assert_eq!(deltas_to(&out, 0), only(a, 3));
        assert_eq!(deltas_to(&out, 1), only(a, 3));
        assert_eq!(deltas_to(&out, 2), only(b, 5));
        // Every root was asked for quotas while none was known up; now
        // only group 0 is, and group 1 is asked for none.
        assert!(out.iter().all(|o| o.request.quotas_after != NO_QUOTAS));
        let out = cycle(&mut e, &t, 2 * SEC, |_| vec![quiet_page(2 * SEC)]);
        let cursor = |r: usize| {
            out.iter()
                .find(|o| o.root == r)
                .unwrap()
                .request
                .quotas_after
        };
        assert_ne!(cursor(0), NO_QUOTAS);
        assert_eq!(cursor(2), NO_QUOTAS);
        let st = |name: &[u8]| t.quota(name, 2 * SEC).unwrap();
        assert_eq!((st(b"a").inflight, st(b"b").inflight), (0, 0));
        assert_eq!(e.metrics().roots[2].group, 1);
    }

    #[test]
    fn a_group_down_leaves_its_shard_per_host_and_the_other_fleet_wide() {
        let (t, a, b) = two_shard_table();
        let roots = ["http://g0".into(), "http://g1".into()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        e.set_groups(&[0, 1]);
        let mut warned = 0;
        for s in 1..=4 {
            let now = s * SEC;
            t.check(b"a", 2, now);
            t.check(b"b", 2, now);
            let out = e.begin_cycle(&t, now);
            for o in out {
                if o.root == 0 {
                    // Group 0 holds the others' 50 on top of this host's.
                    let page = page_of(&[(a, 50.0 + 2.0 * s as f64)], now);
                    e.finish(&t, 0, o.owed, &[page], None, now);
                } else {
                    e.finish(&t, 1, o.owed, &[], Some("down".into()), now);
                }
            }
            let logs = e.end_cycle(&t, now);
            warned += logs.iter().filter(|l| l.1.contains("group 1")).count();
        }
        assert_eq!(warned, 1);
        assert!(!e.all_down());
        assert_eq!(e.metrics().groups_down, vec![1]);
        let st = |name: &[u8]| t.quota(name, 4 * SEC).unwrap();
        // Shard 0: the fleet's level. Shard 1: this host's weight folded
        // locally, nothing left in flight.
        assert_eq!(st(b"a").level, 58.0);
        assert_eq!(st(b"b").inflight, 0);
        assert!(st(b"b").level > 0.0 && st(b"b").level <= 8.0);
        // Group 1 comes back: its shard is fleet-wide again.
        let now = 5 * SEC;
        let out = e.begin_cycle(&t, now);
        let mut logs = Vec::new();
        for o in out {
            let page = page_of(&[if o.root == 0 { (a, 60.0) } else { (b, 70.0) }], now);
            logs.extend(e.finish(&t, o.root, o.owed, &[page], None, now));
        }
        e.end_cycle(&t, now);
        assert!(logs.iter().any(|l| l.1.contains("group 1 answers again")));
        assert!(e.metrics().groups_down.is_empty());
        assert_eq!(t.quota(b"b", now).unwrap().level, 70.0);
    }

    #[test]
    fn later_pages_carry_no_deltas() {
        let first = SyncRequest {
            keyed: Vec::new(),
            rejected: Vec::new(),
            limiter: "h".into(),
            quotas_after: QuotaCursor::default(),
            counter_version: 0,
            root_instance: 0,
            deltas: vec![CounterDelta {
                id: 1,
                delta: 1,
                window: None,
            }],
        };
        let mut r = reply(1.0, 0);
        assert!(next_page(&first, &r).is_none());
        r.more_quotas = true;
        r.quotas = vec![Quota::new(2, "x", 1.0, 1.0, 1.0)];
        let next = next_page(&first, &r).unwrap();
        assert!(next.deltas.is_empty());
        assert_eq!(next.quotas_after, r.quotas_after);
    }

    #[test]
    fn deltas_owed_to_a_failed_root_leak_at_the_limit_until_resent() {
        let t = table();
        let roots = ["http://a".to_string(), "http://b".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 40, 0);
        // a takes the 40; b fails and backs off one interval.
        cycle(&mut e, &t, SEC, |r| {
            if r == 0 {
                vec![page(40.0, SEC)]
            } else {
                vec![]
            }
        });
        t.check(b"q", 5, 0);
        let out = cycle(&mut e, &t, 3 * SEC, |_| vec![page(45.0, 3 * SEC)]);
        // Two seconds at 10/s took 20 off the 40 owed to b; the fresh 5
        // goes to both in full.
        assert_eq!(
            deltas_to(&out, 1),
            vec![CounterDelta {
                id: 1,
                delta: 25,
                window: None
            }]
        );
        assert_eq!(
            deltas_to(&out, 0),
            vec![CounterDelta {
                id: 1,
                delta: 5,
                window: None
            }]
        );
    }

    #[test]
    fn a_root_back_after_a_long_outage_gets_fresh_deltas_but_no_backlog() {
        let t = table();
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 50, 0);
        for s in 1..24 {
            cycle(&mut e, &t, s * SEC, |_| vec![]);
        }
        assert!(e.all_down());
        t.check(b"q", 3, 24 * SEC);
        let out = cycle(&mut e, &t, 24 * SEC, |_| vec![page(3.0, 24 * SEC)]);
        // The 50 collected at 1 s leaked away long ago (10/s).
        assert_eq!(
            out[0].request.deltas,
            vec![CounterDelta {
                id: 1,
                delta: 3,
                window: None
            }]
        );
        assert!(!e.all_down());
    }

    #[test]
    fn a_dead_root_backs_off_while_another_is_up_and_not_when_none_is() {
        let t = table();
        let roots = ["http://a".to_string(), "http://b".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        let asked = |out: &[Outgoing]| out.iter().map(|o| o.root).collect::<Vec<_>>();
        let mut b_asked = Vec::new();
        for s in 1..=16 {
            let out = cycle(&mut e, &t, s * SEC, |r| {
                if r == 0 {
                    vec![quiet_page(s * SEC)]
                } else {
                    vec![]
                }
            });
            if asked(&out).contains(&1) {
                b_asked.push(s);
            }
        }
        // Every cycle, then every 2nd, 4th and 8th.
        assert_eq!(b_asked, vec![1, 2, 4, 8, 16]);
        // a goes down too: from then on both are tried every cycle.
        for s in 17..=20 {
            let out = cycle(&mut e, &t, s * SEC, |_| vec![]);
            if s > 17 {
                assert_eq!(asked(&out), vec![0, 1], "at {s} s");
            }
        }
    }

    #[test]
    fn a_root_still_answering_is_left_out_of_later_cycles() {
        let t = table_with(0.0);
        let roots = ["http://a".to_string(), "http://b".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 4, 0);
        let first = e.begin_cycle(&t, SEC);
        e.finish(&t, 0, first[0].owed.clone(), &[page(4.0, SEC)], None, SEC);
        e.end_cycle(&t, SEC);
        // b has not answered; the next cycles ask only a, and owe b more.
        t.check(b"q", 3, 0);
        for s in 2..=4 {
            let out = e.begin_cycle(&t, s * SEC);
            assert_eq!(out.iter().map(|o| o.root).collect::<Vec<_>>(), vec![0]);
            e.finish(
                &t,
                0,
                out[0].owed.clone(),
                &[page(7.0, s * SEC)],
                None,
                s * SEC,
            );
            e.end_cycle(&t, s * SEC);
        }
        // b's answer finally arrives; the next cycle asks it again, with
        // the 3 it has not had yet.
        e.finish(
            &t,
            1,
            first[1].owed.clone(),
            &[page(4.0, SEC)],
            None,
            4 * SEC,
        );
        let out = e.begin_cycle(&t, 5 * SEC);
        assert_eq!(
            deltas_to(&out, 1),
            vec![CounterDelta {
                id: 1,
                delta: 3,
                window: None
            }]
        );
    }

    #[test]
    fn early_sync_is_due_when_unsent_weight_passes_its_share_of_the_band() {
        // Band 100..300: a tenth of it is 20 units.
        let t = Table::new_heap(8, 16);
        t.apply_quotas(&[Quota::new(1, "q", 10.0, 100.0, 300.0)]);
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 25, 0);
        assert!(!e.early_sync_due(&t, SEC), "off by default");
        assert_eq!(e.early_probe_every(), None);
        e.set_early_sync(Some(EarlySync {
            fraction: 0.1,
            max_per_second: 2.0,
        }));
        assert_eq!(e.early_probe_every(), Some(SEC / EARLY_PROBES_PER_INTERVAL));
        assert!(e.early_sync_due(&t, SEC));
        // At most two a second: not again within half a second, even
        // with more weight waiting.
        e.begin_cycle(&t, SEC);
        t.check(b"q", 25, 0);
        assert!(!e.early_sync_due(&t, SEC + SEC / 4));
        assert!(e.early_sync_due(&t, SEC + SEC / 2));
        // Once sent, the weight no longer calls for one.
        e.begin_cycle(&t, SEC + SEC / 2);
        t.check(b"q", 19, 0);
        assert!(!e.early_sync_due(&t, 3 * SEC));
    }

    #[test]
    fn a_resend_that_leaked_to_nothing_still_clears_in_flight_weight() {
        let t = table_with(1000.0);
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 40, 0);
        cycle(&mut e, &t, SEC, |_| vec![]);
        assert_eq!(t.quota(b"q", SEC).unwrap().inflight, 40);
        // One interval later the 40 (1000/s) are long gone: nothing to
        // send, but the root's answer covers them.
        let out = cycle(&mut e, &t, 2 * SEC, |_| vec![quiet_page(2 * SEC)]);
        assert!(out[0].request.deltas.is_empty());
        assert_eq!(out[0].owed[&CounterKey::named(1)].weight, 40);
        let st = t.quota(b"q", 2 * SEC).unwrap();
        assert_eq!((st.pending, st.inflight), (0, 0));
    }

    #[test]
    fn a_repeated_request_after_a_lost_reply_counts_only_what_has_not_leaked() {
        // The root got the request but its reply was lost: the 100 are
        // owed again. Resent after 1 s at 60/s, only 40 count twice.
        let t = table_with(60.0);
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        t.check(b"q", 100, 0);
        cycle(&mut e, &t, SEC, |_| vec![]);
        let out = cycle(&mut e, &t, 2 * SEC, |_| vec![page(100.0, 2 * SEC)]);
        assert_eq!(
            out[0].request.deltas,
            vec![CounterDelta {
                id: 1,
                delta: 40,
                window: None
            }]
        );
    }

    #[test]
    fn a_counter_no_root_reports_is_known_unchanged_and_not_extrapolated() {
        let t = table();
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        cycle(&mut e, &t, SEC, |_| vec![page(50.0, SEC)]);
        cycle(&mut e, &t, 2 * SEC, |_| vec![page(100.0, 2 * SEC)]);
        // The others filled 50/s, then 60/s: smoothed 42.5/s.
        let st = t.quota(b"q", 2 * SEC).unwrap();
        assert_eq!((st.level, st.fill_rate), (100.0, 42.5));
        // The root says nothing changed up to 3 s: 100 leaked 1 s at 10/s,
        // no extrapolated fill on top, and the fill rate halves.
        cycle(&mut e, &t, 3 * SEC, |_| vec![quiet_page(3 * SEC)]);
        let st = t.quota(b"q", 3 * SEC).unwrap();
        assert_eq!((st.level, st.fill_rate), (90.0, 21.25));
    }

    #[test]
    fn a_reply_still_paging_quotas_says_nothing_about_counters() {
        let t = table();
        let roots = ["http://a".to_string()];
        let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
        cycle(&mut e, &t, SEC, |_| vec![page(50.0, SEC)]);
        cycle(&mut e, &t, 2 * SEC, |_| vec![page(100.0, 2 * SEC)]);
        let mut paging = quiet_page(3 * SEC);
        paging.reply.more_quotas = true;
        cycle(&mut e, &t, 3 * SEC, |_| vec![paging.clone()]);
        assert_eq!(t.quota(b"q", 2 * SEC).unwrap().fill_rate, 42.5);
    }
}
