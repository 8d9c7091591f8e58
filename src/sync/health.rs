//! Root and group health, with the in-flight lease.
//!
//! A root group is down when none of its roots answered for two
//! intervals, each asked in vain since its last answer (a host that was
//! paused, or whose clock stepped forward, has not asked yet): its shard
//! is limited per host, fail-open, while the other shards stay
//! fleet-wide. Every root down is the same thing for every
//! shard ("all roots down"): the engine folds local weight into the
//! levels and the table counts locally. Each is said in the log once a
//! minute, and its end once.
//!
//! Past the in-flight lease of silence (the time after which the roots
//! drop this host's slots from their counts), in-flight counters of the
//! silent shards count this host's own slots only: the roots' lease,
//! applied to the other hosts in turn ([`Table::lease_locally`]).
//!
//! This part decides and says; the engine does the folding, and asks
//! the roots of the folded shards for every counter.

use super::link::RootLink;
use super::log::{LogLevel, LogLine};
use super::routing::shard;
use crate::core::Nanos;
use crate::table::Table;

/// How often "all roots down" is repeated in the log.
const DOWN_LOG_EVERY: Nanos = 60_000_000_000;

/// What is known of the roots' health, as a whole and per group.
#[derive(Debug)]
pub(super) struct Health {
    /// Local time the engine started: silence counts from then until a
    /// first answer.
    started: Nanos,
    /// The sync interval: two of them without an answer is down.
    interval: Nanos,
    /// Local time of the last answer from any root.
    last_any_success: Option<Nanos>,
    /// No root answered for two intervals (limiting is per host).
    all_down: bool,
    /// When all roots being down was last logged.
    down_logged_at: Option<Nanos>,
    /// How long every root may be silent before in-flight counters count
    /// this host's own slots only.
    in_flight_lease: Nanos,
    /// The local lease was applied since the last answer of any root.
    leased: bool,
    /// Per group, in group order (one group without a call to
    /// [`Health::set_groups`]).
    groups: Vec<GroupHealth>,
}

/// The health of one root group.
#[derive(Clone, Debug, Default)]
struct GroupHealth {
    /// Local time of the last answer from any of its roots.
    success: Option<Nanos>,
    /// No root of it answered for two intervals (its shard is limited per
    /// host).
    down: bool,
    /// When its being down was last logged.
    down_logged: Option<Nanos>,
    /// The local lease was applied to its shard since the last answer of
    /// any of its roots.
    leased: bool,
}

impl Health {
    /// Nothing heard yet from roots in one group, from `started` on.
    /// The in-flight lease (a root drops the slots of a limiter silent
    /// for it).
    pub(super) fn in_flight_lease(&self) -> Nanos {
        self.in_flight_lease
    }

    pub(super) fn new(started: Nanos, interval: Nanos, in_flight_lease: Nanos) -> Self {
        Self {
            started,
            interval,
            last_any_success: None,
            all_down: false,
            down_logged_at: None,
            in_flight_lease,
            leased: false,
            groups: vec![GroupHealth::default()],
        }
    }

    /// Tracks `groups` root groups (nothing heard from any).
    pub(super) fn set_groups(&mut self, groups: usize) {
        self.groups = vec![GroupHealth::default(); groups];
    }

    /// Sets the in-flight lease.
    pub(super) fn set_in_flight_lease(&mut self, lease: Nanos) {
        self.in_flight_lease = lease;
    }

    /// True while no root has answered for two intervals.
    pub(super) fn all_down(&self) -> bool {
        self.all_down
    }

    /// The groups down, as the metrics list them.
    pub(super) fn groups_down(&self) -> Vec<u32> {
        (0..self.groups.len())
            .filter(|&g| self.groups[g].down)
            .map(|g| g as u32)
            .collect()
    }

    /// A root of `group` answered at `now`: the group and the roots are up
    /// (limiting is fleet-wide again, said once) and their leases over.
    pub(super) fn answered(&mut self, table: &Table, group: usize, now: Nanos) -> Vec<LogLine> {
        let mut log = Vec::new();
        self.last_any_success = Some(now);
        self.leased = false;
        let g = &mut self.groups[group];
        g.leased = false;
        g.success = Some(now);
        if g.down && !self.all_down {
            g.down_logged = None;
            log.push((
                LogLevel::Info,
                format!("a quota root of group {group} answers again; its shard is limited fleet-wide again"),
            ));
        }
        g.down = false;
        if self.all_down {
            // Limiting is cluster-wide again from this reply on.
            self.all_down = false;
            table.books().set_counting_locally(false);
            self.down_logged_at = None;
            log.push((
                LogLevel::Info,
                "a quota root answers again; cluster limiting resumed".into(),
            ));
        }
        log
    }

    /// True when at `now` no root of `links` answered for two intervals
    /// (none configured: never) and each failed since it last answered.
    /// An exchange still under way (a long initial sync paging through
    /// quotas) has not failed yet; and two intervals without an answer,
    /// by this host's clock, say nothing of roots it has not asked since:
    /// a host paused, or whose clock stepped forward, has no news of them
    /// (it asks them at once, and their answers count).
    pub(super) fn all_silent(&self, links: &[RootLink], now: Nanos) -> bool {
        let since = self.last_any_success.unwrap_or(self.started);
        silent(links.iter(), since, now, self.interval)
    }

    /// Every root down at `now` (`roots` of them), local weight folded:
    /// the lease once every root was silent for it, and the log line once
    /// a minute.
    pub(super) fn all_down_at(&mut self, table: &Table, roots: usize, now: Nanos) -> Vec<LogLine> {
        let mut log = Vec::new();
        let since = self.last_any_success.unwrap_or(self.started);
        if !self.leased && now.saturating_sub(since) >= self.in_flight_lease {
            self.lease_locally(table, now, &mut log);
        }
        if self
            .down_logged_at
            .is_none_or(|t| now.saturating_sub(t) >= DOWN_LOG_EVERY)
        {
            self.down_logged_at = Some(now);
            let msg = format!(
                "all {roots} quota roots unreachable; limiting with local counts only (per host)"
            );
            log.push((LogLevel::Warn, msg));
        }
        log
    }

    /// Ends a cycle's look at all roots: `down` is what
    /// [`Health::all_silent`] found.
    pub(super) fn set_all_down(&mut self, down: bool) {
        self.all_down = down;
    }

    /// Per group, true when at `now` none of its roots in `links` answered
    /// for two intervals (and none is still under way).
    pub(super) fn silent_groups(&self, links: &[RootLink], now: Nanos) -> Vec<bool> {
        let mut down = vec![false; self.groups.len()];
        for (g, is_down) in down.iter_mut().enumerate() {
            let roots = links.iter().filter(|l| l.group == g);
            let since = self.groups[g].success.unwrap_or(self.started);
            *is_down = silent(roots, since, now, self.interval);
        }
        down
    }

    /// The groups `down` says ([`Health::silent_groups`]) are down, their
    /// weight folded: the lease for the shard of each one silent for it,
    /// and a log line once a minute per group.
    pub(super) fn groups_down_at(
        &mut self,
        table: &Table,
        down: &[bool],
        now: Nanos,
    ) -> Vec<LogLine> {
        let mut log = Vec::new();
        for (g, &is_down) in down.iter().enumerate() {
            let since = self.groups[g].success.unwrap_or(self.started);
            if is_down
                && !self.groups[g].leased
                && now.saturating_sub(since) >= self.in_flight_lease
            {
                self.lease_group_locally(table, g, now, &mut log);
            }
            let group = &mut self.groups[g];
            if is_down
                && group
                    .down_logged
                    .is_none_or(|t| now.saturating_sub(t) >= DOWN_LOG_EVERY)
            {
                group.down_logged = Some(now);
                log.push((
                    LogLevel::Warn,
                    format!(
                        "every quota root of group {g} unreachable; its shard of the counters \
                         is limited with local counts only (per host), the others fleet-wide"
                    ),
                ));
            }
            group.down = is_down;
        }
        log
    }

    /// Every root silent for the in-flight lease: in-flight counters count
    /// this host's own slots only (the roots have dropped them from their
    /// counts; this host drops the other hosts' in turn).
    fn lease_locally(&mut self, table: &Table, now: Nanos, log: &mut Vec<LogLine>) {
        self.leased = true;
        let set = table.books().lease_locally(now, |_| true);
        if set > 0 {
            log.push((
                LogLevel::Warn,
                format!(
                    "every quota root silent for the in-flight lease ({} ms): {set} in-flight \
                     counter(s) now count this host's own slots only (per host)",
                    self.in_flight_lease / 1_000_000
                ),
            ));
        }
    }

    /// Every root of group `g` silent for the in-flight lease (others
    /// answering): the local lease for its shard only.
    fn lease_group_locally(&mut self, table: &Table, g: usize, now: Nanos, log: &mut Vec<LogLine>) {
        self.groups[g].leased = true;
        let groups = self.groups.len();
        let set = table.books().lease_locally(now, |c| shard(c, groups) == g);
        if set > 0 {
            log.push((
                LogLevel::Warn,
                format!(
                    "every quota root of group {g} silent for the in-flight lease ({} ms): {set} \
                     in-flight counter(s) of its shard now count this host's own slots only",
                    self.in_flight_lease / 1_000_000
                ),
            ));
        }
    }
}

/// True when `roots` (some) said nothing for two intervals since `since`
/// by `now`, none is still under way and each failed since it last
/// answered (see [`Health::all_silent`]).
fn silent<'a>(
    roots: impl Iterator<Item = &'a RootLink> + Clone,
    since: Nanos,
    now: Nanos,
    interval: Nanos,
) -> bool {
    let mut roots = roots;
    let asked_in_vain = roots.clone().all(|l| !l.busy && l.failures > 0);
    roots.next().is_some() && asked_in_vain && now.saturating_sub(since) > 2 * interval
}

/// True when a root of the same group as root `root` is up: it serves the
/// shard meanwhile, so `root` may back off after a failure.
pub(super) fn others_up(links: &[RootLink], root: usize) -> bool {
    let group = links[root].group;
    links
        .iter()
        .enumerate()
        .any(|(i, l)| i != root && l.group == group && l.metrics.up)
}
