//! The sync logic without the network: what to send each root, and what to
//! do with what comes back.
//!
//! The networked loop (`networked.rs`) and the simulator both drive this
//! engine, so the logic that keeps counts exact lives once. The engine
//! composes its parts, each in a file of its own:
//!
//! - what each root is owed and what a reply acknowledges
//!   (`accounting.rs`);
//! - the requests a cycle sends and the pages that answer them
//!   (`request.rs`);
//! - the health of roots and root groups, with the in-flight lease
//!   (`health.rs`): when no root answered for two intervals the engine
//!   folds local weight into the levels (per-host limiting), and once
//!   none answered for the lease, in-flight counters count this host's
//!   own slots only ([`crate::table::Books::lease_locally`]);
//! - what follows from a root found restarted (`restart.rs`);
//! - early cycles (`early.rs`);
//! - a counter a root leaves out of a complete reply did not change
//!   there: the engine tells the table so at the end of the cycle, which
//!   resets the counter's extrapolation and decays its fill rate
//!   (`vouch.rs`).
//!
//! With root groups (see the `sync` module doc), each counter is owed
//! only to the roots of its shard ([`shard`]), "unchanged" is vouched per
//! group, quota changes come from one group, and a group down folds only
//! its shard's weight locally.

use std::collections::HashSet;

use super::accounting::Accounts;
use super::config::{EarlySync, DEFAULT_IN_FLIGHT_LEASE};
use super::early::EarlyCycles;
use super::health::{others_up, Health};
use super::link::{OwedDeltas, RootLink, NO_QUOTAS};
use super::log::{LogLevel, LogLine};
use super::metrics::SyncMetrics;
use super::pressure::KeyPressure;
use super::request::{Outgoing, Page, Requests};
use super::restart::{self, Restarts};
use super::routing::shard;
use super::schedule::key_sweep_budget;
use super::takeover;
use super::vouch::Recent;
use crate::core::Nanos;
use crate::table::file::purge_seeds;
use crate::table::Table;
use crate::wire::SyncResponse;

/// The sync state of one limiter.
#[derive(Debug)]
pub struct SyncEngine {
    /// Per root, in configuration order.
    links: Vec<RootLink>,
    /// Number of root groups (shards), at least 1.
    groups: usize,
    /// Time between cycles.
    interval: Nanos,
    /// What each root is owed, and what no root acknowledged yet.
    accounts: Accounts,
    /// How requests are made.
    requests: Requests,
    /// Roots and groups up or down, and the in-flight lease.
    health: Health,
    /// Adoption of a restarted root's new instance.
    restarts: Restarts,
    /// When a cycle starts early.
    early: EarlyCycles,
    /// Counters that changed recently, for what complete replies vouch.
    recent: Recent,
    /// The key section's pressure, said once a cycle at most.
    pressure: KeyPressure,
    /// Cycles begun.
    cycles: u64,
    /// The last handover record left had nothing in it.
    handover_empty: bool,
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
            interval,
            accounts: Accounts::new(max_owed),
            requests: Requests::new(limiter_id, crate::host::random_seed()),
            health: Health::new(now, interval, DEFAULT_IN_FLIGHT_LEASE.as_nanos() as Nanos),
            restarts: Restarts::new(now, interval),
            early: EarlyCycles::new(interval),
            recent: Recent::default(),
            pressure: KeyPressure::default(),
            cycles: 0,
            handover_empty: false,
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
        self.restarts.resume(table, &mut self.links);
    }

    /// Root `root` refused this exchange's numbered request as malformed in
    /// every encoding: it predates numbered requests, held slots or
    /// interest lists (a rollback), so it took nothing in. It is sent
    /// unnumbered requests, the unconfirmed ones' weight among them, until
    /// a reply says it takes sequences (and, for the rest, them).
    pub fn refused_numbered(&mut self, root: usize) {
        self.links[root].takes_sequence = false;
        self.links[root].takes_held = false;
        self.links[root].key_report.takes = false;
        self.links[root].interest.takes = false;
    }

    /// Gives this sync thread the id `incarnation` in its numbered
    /// requests instead of a random one (the simulator's hosts, tests).
    pub fn set_incarnation(&mut self, incarnation: u64) {
        self.requests.set_incarnation(incarnation);
    }

    /// Lowers the entries one request may carry (tests: a backlog over
    /// the bound without a million counters).
    #[cfg(test)]
    pub fn limit_request_entries(&mut self, entries: usize) {
        self.requests.limit_entries(entries);
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

    /// Sets the in-flight lease (see
    /// [`super::config::SyncConfig::in_flight_lease`]).
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
        if table.books().has_retired_handover() {
            takeover::adopt_retired(table, &self.requests, &mut self.accounts, &mut self.links);
        }
        let rejected = self.accounts.collect(table, now);
        // Penalties started here go to every root (a penalty merges by
        // max, wherever it lands).
        let started = table.books().take_started_penalties();
        let rejected = self.requests.rejected_since_last_cycle(rejected);
        self.accounts
            .owe_collected(&mut self.links, self.groups, now);
        let mut plan = self.requests.plan(&self.links, self.groups, rejected);
        let mut out = Vec::new();
        // What an exchange pays off is kept for the handover record only
        // where there is one (not in a heap table: the simulator's).
        let handing_over = table.books().has_handover();
        for (root, link) in self.links.iter_mut().enumerate() {
            link.owe_penalties(&started);
            if plan.asks(link) {
                let request = plan.request(table, root, link, now);
                if handing_over {
                    link.in_way = request.owed.clone();
                }
                out.push(request);
            }
        }
        // Before any of it is sent: a thread that takes over should this
        // one die sends it again under the same numbers.
        self.leave_handover(table);
        out
    }

    /// Leaves in the region what a thread taking over from this one
    /// (should it die) needs (see `takeover.rs`).
    fn leave_handover(&mut self, table: &Table) {
        let was_empty = self.handover_empty;
        self.handover_empty = takeover::leave(
            table,
            &self.requests,
            &self.accounts,
            &self.links,
            was_empty,
        );
    }

    /// Takes over from the table's previous sync thread, which died
    /// (`predecessor`, its process, from [`crate::table::Books::claim_sync`]):
    /// from its handover record, this thread continues its incarnation
    /// (each request it sent goes again under its number, counted once by
    /// a root that applied it) and keeps its unacknowledged weight as its
    /// own; what the record does not cover, or all of it without a record
    /// this build can read, goes back to pending to be sent as new (a root
    /// that had applied it counts it twice). Call after
    /// [`SyncEngine::resume`], before the first cycle.
    pub fn take_over(&mut self, table: &Table, predecessor: u32) -> Vec<LogLine> {
        let line = takeover::take_over(
            table,
            predecessor,
            &mut self.requests,
            &mut self.accounts,
            &mut self.links,
        );
        self.handover_empty = false;
        self.leave_handover(table);
        vec![(LogLevel::Info, line)]
    }

    /// Takes in the outcome of one exchange with root `root`: the pages that
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
        // Another root of the same group serves the shard meanwhile.
        let others_up = others_up(&self.links, root);
        self.links[root].busy = false;
        self.links[root].in_way = OwedDeltas::default();
        if pages.is_empty() {
            return self.failed(table, root, owed, others_up, error, now);
        }
        let mut log = Vec::new();
        // Its first page answered the request: numbered, it and the
        // earlier ones it carried are applied, each once.
        let mut owed = owed;
        self.links[root].confirmed(&mut owed, pages[0].reply.applied_through);
        let link = &self.links[root];
        if !link.metrics.up && link.metrics.errors > 0 {
            log.push((
                LogLevel::Info,
                format!("quota root {} reachable again", link.url),
            ));
        }
        self.take_pages(table, root, owed, pages, now, &mut log);
        let last = pages.last().filter(|p| !p.reply.more_quotas);
        if last.is_some() {
            self.whole_answer(table, root, pages, now);
        }
        // A reply to a request for no quotas (another group gives them)
        // says nothing about the quota set.
        if last.is_some_and(|p| p.reply.quotas_after != NO_QUOTAS) && table.holds_seeds() {
            log.extend(purge_unknown_seeds(table));
        }
        if let Some(error) = error {
            // A later page failed; the deltas were delivered with the first.
            self.links[root].failed(others_up, error);
        }
        log.extend(self.health.answered(table, self.links[root].group, now));
        self.settle_if_all_in(table);
        log
    }

    /// An exchange with root `root` that brought no page: the root is owed
    /// `owed` again and backs off when `others_up`; its failure is logged
    /// when it was up, or the first time for a root that never answered,
    /// not at every retry of a dead one.
    fn failed(
        &mut self,
        table: &Table,
        root: usize,
        owed: OwedDeltas,
        others_up: bool,
        error: Option<String>,
        now: Nanos,
    ) -> Vec<LogLine> {
        let mut log = Vec::new();
        let link = &mut self.links[root];
        let was_up = link.metrics.up || (link.metrics.syncs == 0 && link.metrics.errors == 0);
        let error = error.unwrap_or_else(|| "no reply".into());
        if link.numbered_exchange() {
            // The root may have applied it (a reply lost): it goes again
            // under its number, and the root applies it once.
            link.unconfirmed_after_failure(owed);
        } else {
            self.accounts.owe(link, owed, now);
        }
        if was_up {
            log.push((
                LogLevel::Warn,
                format!("quota root {} unreachable: {error}", link.url),
            ));
        }
        link.failed(others_up, error);
        self.settle_if_all_in(table);
        log
    }

    /// Takes the `pages` root `root` answered in, in order, the first for
    /// the request that carried `owed`: what each says of the root (a
    /// restart found: slots to resend), its clock, its quota and tier
    /// changes, its counters. Then the request's map is kept for the next
    /// cycle's debts, and a restarted root's instance adopted once its
    /// grace is over.
    fn take_pages(
        &mut self,
        table: &Table,
        root: usize,
        mut owed: OwedDeltas,
        pages: &[Page],
        now: Nanos,
        log: &mut Vec<LogLine>,
    ) {
        let used = owed.len();
        let mut nothing = OwedDeltas::default();
        let lease = self.health.in_flight_lease();
        for (k, page) in pages.iter().enumerate() {
            // Deltas went out with the first page only.
            let sent = if k == 0 { &mut owed } else { &mut nothing };
            let link = &mut self.links[root];
            if let Some(resend) =
                restart::take_answer(table, root, link, page, sent, (self.groups, lease), now)
            {
                self.accounts.owe(link, resend, now);
            }
            self.publish_utc_offset(table);
            self.take_reply(table, root, &page.reply, sent, now, log);
        }
        self.links[root].reuse_owed(owed, used);
        self.restarts.adopt(table, root, &mut self.links[root], now);
    }

    /// Takes one reply of root `root` in: its quota and tier changes, then
    /// its counters, merged; what it covers of `sent` is acknowledged,
    /// what it refused is kept by the keys themselves (at `now`), and
    /// what it leaves out is acknowledged too (the root has it).
    fn take_reply(
        &mut self,
        table: &Table,
        root: usize,
        reply: &SyncResponse,
        sent: &mut OwedDeltas,
        now: Nanos,
        log: &mut Vec<LogLine>,
    ) {
        log.extend(take_changes(table, reply));
        // Looked up once: every value of the reply is moved by it.
        let offset = self.links[root].offset();
        let source = self.links[root].source(root);
        self.accounts
            .take_counters(table, reply, offset, source, sent, &mut self.recent);
        self.accounts.take_refused(table, reply, sent, now);
        self.accounts.release_unanswered(table, sent, now);
    }

    /// Root `root` answered whole (`pages`, its quota pages through):
    /// when it was asked for all its counters, those it left out are
    /// settled as empty there; and whatever it left out did not change
    /// there up to its clock.
    fn whole_answer(&mut self, table: &Table, root: usize, pages: &[Page], now: Nanos) {
        let link = &mut self.links[root];
        let group = link.group;
        if std::mem::take(&mut link.ask_all) {
            // Counters the root left out are empty there. (A reply cut
            // at a page of counters leaves some for the next one,
            // which then replaces the 0: one interval's undercount.)
            let groups = self.groups;
            let source = link.source(root);
            let carried: HashSet<u64> = pages
                .iter()
                .flat_map(|p| p.reply.counters.iter().map(|c| c.id))
                .collect();
            table.books().settle_omitted(source, now, |c| {
                shard(c, groups) == group && !carried.contains(&c.id)
            });
        }
        // Counters come only once the quota pages are through; then
        // whatever this root left out did not change there.
        if let Some(last) = pages.last() {
            let at = link.level_to_local(0.0, last.reply.root_time).at;
            self.recent.vouch(group, at);
        }
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
            log.extend(self.fold_groups_down(table, now));
        }
        table
            .books()
            .maintain_keys(key_sweep_budget(table, self.interval), now);
        table.books().sweep_tiers(now as i64 + table.utc_offset());
        log.extend(self.pressure.check(table));
        if down {
            log.extend(self.fold_all(table, now));
        }
        self.health.set_all_down(down);
        table.books().set_counting_locally(down);
        log
    }

    /// With several groups and not all of them down: folds the unacked
    /// weight of every shard whose group has not answered for two
    /// intervals into the local levels (per host), and says so once a
    /// minute per group.
    fn fold_groups_down(&mut self, table: &Table, now: Nanos) -> Vec<LogLine> {
        let down = self.health.silent_groups(&self.links, now);
        if down.iter().any(|&d| d) {
            let groups = self.groups;
            self.accounts.fold(table, |c| down[shard(c, groups)], now);
            if table.books().holds_in_flight() {
                self.ask_all_after_fold(|g| down[g]);
            }
        }
        self.health.groups_down_at(table, &down, now)
    }

    /// Every root down: what was collected and what is pending is folded
    /// into the local levels, and the roots are owed it.
    fn fold_all(&mut self, table: &Table, now: Nanos) -> Vec<LogLine> {
        // Weight admitted since this cycle began is owed to the roots
        // too, or they would never count it (an in-flight slot taken
        // now must reach them, or its release would later cancel
        // another).
        self.accounts
            .collect_late(table, &mut self.links, self.groups, now);
        // Unacked weight, which no root will acknowledge, goes back to
        // pending, then everything pending is folded in locally.
        self.abandon(table);
        table.books().fold_local(now);
        if table.books().holds_in_flight() {
            self.ask_all_after_fold(|_| true);
        }
        self.health.all_down_at(table, self.links.len(), now)
    }

    /// Own weight was folded into the levels of the groups `folded` says,
    /// in-flight counters among them: their roots are asked for all their
    /// counters at their next exchange ([`RootLink::ask_for_all_counters`]).
    fn ask_all_after_fold(&mut self, folded: impl Fn(usize) -> bool) {
        for link in &mut self.links {
            if folded(link.group) {
                link.ask_for_all_counters();
            }
        }
    }

    /// The sync thread stops cleanly (every exchange under way finished):
    /// the requests still unconfirmed (a root down, or its replies lost)
    /// are left in the region as a retired record, with the weight they
    /// pay off, for whichever thread syncs the table next to send again
    /// under this thread's numbers (see `takeover.rs`); the rest of the
    /// unacknowledged weight is handed back ([`SyncEngine::abandon`]).
    pub fn stop(&mut self, table: &Table) -> Vec<LogLine> {
        let line = takeover::retire(table, &self.requests, &mut self.accounts, &self.links);
        self.hand_back(table);
        line.map(|l| vec![(LogLevel::Info, l)]).unwrap_or_default()
    }

    /// This engine is done with the table: what no root acknowledged goes
    /// back to pending ([`SyncEngine::abandon`]), and its handover record
    /// is cleared, so no thread sends that weight again from it.
    pub fn hand_back(&mut self, table: &Table) {
        self.abandon(table);
        table.books().clear_handover();
        self.handover_empty = true;
    }

    /// The sync thread stops: weight sent but acknowledged by no root goes
    /// back to the table's pending, so the next sync thread (after an nginx
    /// reload, the new worker's) sends it instead of it staying unacked
    /// forever. A root that did get it counts it twice, once; that
    /// overcount leaks away like any weight.
    pub fn abandon(&mut self, table: &Table) {
        self.accounts.abandon(table);
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

/// Takes the quota and tier changes of `reply` into `table`: quotas by
/// epoch, overrides, penalties by max. What the table refuses is logged.
fn take_changes(table: &Table, reply: &SyncResponse) -> Vec<LogLine> {
    let mut log = Vec::new();
    if !reply.quotas.is_empty() {
        let report = table.books().apply_quotas(&reply.quotas);
        for refused in report.refused.iter().take(5) {
            log.push((LogLevel::Error, refused.to_string()));
        }
    }
    if !reply.tiers.overrides.is_empty() {
        let report = table.books().apply_overrides(&reply.tiers.overrides);
        if report.refused > 0 {
            log.push((
                LogLevel::Error,
                format!(
                    "{} override(s) refused: the tier section is full ({} held; give it \
                     room: sluice_overrides in nginx, override_capacity in sluice_init's \
                     JSON and the bindings' options)",
                    report.refused,
                    table.tier_capacity()
                ),
            ));
        }
    }
    table.books().merge_penalties(&reply.tiers.penalties);
    log
}

/// A root's whole quota set is in: from now on the roots' quotas are the
/// set, and seeds from a file no root knows go.
fn purge_unknown_seeds(table: &Table) -> Option<LogLine> {
    let report = purge_seeds(table);
    (report.deleted > 0).then(|| {
        (
            LogLevel::Info,
            format!(
                "a quota root answered; {} seed quota(s) from the quota file no root \
                 knows were removed",
                report.deleted
            ),
        )
    })
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "return_tests.rs"]
mod return_tests;

#[cfg(test)]
#[path = "in_flight_tests.rs"]
mod in_flight_tests;

#[cfg(test)]
#[path = "exact_tests.rs"]
mod exact_tests;

#[cfg(test)]
#[path = "key_share_tests.rs"]
mod key_share_tests;

#[cfg(test)]
#[path = "clock_tests.rs"]
mod clock_tests;
