//! Restart adoption: what follows from a root found restarted.
//!
//! A root's new instance counts from the floor again and knows nothing of
//! the slots this host held there. So when a reply comes from another
//! instance than the one before:
//!
//! - the root is sent again the slots this host held before what it sent
//!   (see [`held_before`]), or their later returns would take its count
//!   below zero and hide as many later slots (fail-open);
//! - after a grace ([`RESTART_GRACE`] intervals, time for every host to
//!   find the restart and resend), the in-flight levels known from its
//!   earlier instances become the new instance's ([`Restarts::adopt`]),
//!   so its next reply replaces them, lower or not;
//! - what is known of the root is remembered in the table's region, so
//!   that a sync thread started after an nginx reload finds a restart that
//!   happened meanwhile, and one found by the earlier thread is still
//!   adopted ([`resume`]).
//!
//! Two root processes behind one URL (a load balancer, a Kubernetes
//! Service) answer in turn. A reply from an instance that answered there
//! lately ([`RootLink::others`], remembered across a reload in the
//! region) is a *switch*, not a restart: no grace, no new source,
//! nothing sent again. The first reply of an instance never seen is a
//! restart, whether it restarted or ran beside the other all along: it
//! holds none of this host's units either way. A root that takes held slots gets
//! this host's, absolute, in every numbered request, whichever process
//! answers it; one that predates them cannot be told apart from its
//! twin, and each process counts the slots sent to it.
//!
//! A root that takes held slots needs no resend after a restart either:
//! the next numbered request carries them.

use super::key_report::silent_past;
use super::link::{Owed, OwedDeltas, RootLink};
use super::request::Page;
use super::routing::shard;
use super::status::{remember_root, remembered_root};
use crate::core::Nanos;
use crate::table::Table;
use crate::wire::CounterKey;

/// Sync intervals after a root is found restarted before its new
/// instance's in-flight values replace those of its earlier instance:
/// every host has found the restart and resent its slots by then (two
/// intervals), plus one for a host's cycle falling just after.
const RESTART_GRACE: Nanos = 3;

/// When a restarted root's new instance is adopted.
#[derive(Debug)]
pub(super) struct Restarts {
    /// [`RESTART_GRACE`] intervals.
    grace: Nanos,
    /// Local time the engine started: a restart an earlier sync thread may
    /// have found gets its grace from then.
    started: Nanos,
}

impl Restarts {
    /// For a thread started at `started`, syncing every `interval`.
    pub(super) fn new(started: Nanos, interval: Nanos) -> Self {
        Self {
            grace: RESTART_GRACE.saturating_mul(interval),
            started,
        }
    }

    /// Takes over what an earlier sync thread on `table`'s region (before
    /// an nginx reload) remembered of each root in `links` (see
    /// `SyncEngine::resume`).
    pub(super) fn resume(&self, table: &Table, links: &mut [RootLink]) {
        for link in links.iter_mut() {
            if let Some(known) = remembered_root(table, &link.url) {
                link.resume(known);
                link.ask_all = true;
                // The earlier thread may have found a restart it had not
                // adopted the levels of yet: a grace from now covers it.
                link.restart_seen = Some(self.started);
            }
        }
        // Each in its place in this configuration (all read first: a root
        // that moved may have left its record where another goes now).
        for (i, link) in links.iter().enumerate() {
            if link.root_instance != 0 {
                remember_root(table, i, &link.url, link.remembered());
            }
        }
    }

    /// Once root `root` (`link`) was found restarted [`RESTART_GRACE`]
    /// intervals ago, its new instance holds every host's resent slots
    /// (each host finds the restart at its first exchange with it, within
    /// about an interval, and resends at its next one): the in-flight
    /// levels this host knew from its earlier instances become the new
    /// instance's, so its next reply replaces them, lower or not. Every
    /// earlier instance's: a level taken from one that came and went
    /// within the grace (restarted twice) would stay as well. Earlier, the
    /// new instance may still lack slots not resent yet, and replacing
    /// would be fail-open; never, the earlier value would stay (it never
    /// leaks) against every lower one: strict for good.
    pub(super) fn adopt(&self, table: &Table, root: usize, link: &mut RootLink, now: Nanos) {
        let Some(seen) = link.restart_seen else {
            return;
        };
        if now.saturating_sub(seen) < self.grace {
            return;
        }
        link.restart_seen = None;
        if table
            .books()
            .adopt_source(|s| link.is_earlier_source(root, s), link.source(root))
            > 0
        {
            // The next reply must carry them even if the new instance's
            // count has not changed since (or is empty: left out).
            link.ask_for_all_counters();
        }
    }
}

/// Takes `page`, answered by root `root` (`link`) to a request that
/// carried `sent`, into the link, and remembers in `table` what changed of
/// the root for a later sync thread. When the page comes from another
/// instance than the last one, and one that did not answer at this URL
/// lately (the root restarted), starts the grace and returns what the
/// root must be sent again ([`held_before`]: only keys' slots to a root
/// that takes held slots, which every numbered request carries); `groups` is the
/// number of root groups. One that did answer lately is another process
/// behind the same URL answering in turn: not a restart.
pub(super) fn take_answer(
    table: &Table,
    root: usize,
    link: &mut RootLink,
    page: &Page,
    sent: &OwedDeltas,
    (groups, lease): (usize, Nanos),
    now: Nanos,
) -> Option<Vec<(CounterKey, Owed)>> {
    let instance = link.root_instance;
    let answered = page.reply.root_instance;
    let mut resend = None;
    let (mut switched, mut restarted) = (false, false);
    // A root that takes keys' held slots is sent every key held instead
    // of its slots again (see `key_report.rs`).
    let keys_absolute = page.reply.takes_keyed_held && page.reply.takes_sequence;
    if instance != 0 && answered != instance {
        if link.switch_to(answered) {
            switched = true;
            link.metrics.switches += 1;
            // Asked with the other process's cursor, it answers with
            // every counter it holds that is not empty: one it leaves
            // out is empty there.
            link.ask_all = true;
        } else {
            restarted = true;
            link.found_restart();
            link.restart_seen = Some(now);
            let absolute = page.reply.takes_held && page.reply.takes_sequence;
            let kinds = (!absolute, !keys_absolute);
            resend = Some(held_before(table, link, sent, groups, now, kinds));
        }
    }
    let silent = silent_past(link.metrics.last_success, page.sent_at, lease);
    let moved = || {
        let replayed = link.sending_replay.iter().flat_map(|u| u.owed.keys());
        let keys = sent.keys().chain(replayed).filter(|c| c.key != 0);
        keys.copied().collect()
    };
    let seen = (switched, restarted, silent);
    let known = link.remembered();
    link.key_report.answered(keys_absolute, seen, moved);
    link.succeeded(page.sent_at, page.received_at, &page.reply);
    if link.remembered() != known {
        remember_root(table, root, &link.url, link.remembered());
    }
    resend
}

/// What the root of `link`, found restarted by the reply to a request
/// that carried `sent`, must be sent again: for each in-flight counter
/// of its group, the slots this host held before what it sent that root
/// and still owes it. The new instance counts nothing from before;
/// without these, the returns of those slots would take this host's
/// holding there below zero and hide as many of its later slots for as
/// long as it syncs (fail-open). What this host holds less what the new
/// instance counts of `sent` and of what the link still owes is exactly
/// that: the restarted root then holds what this host holds. That
/// includes units resent to an earlier restart that the new instance got
/// (or will): a root restarting again before a resend was acknowledged is
/// not sent the same slots twice.
///
/// A named counter's holding is its held word, sent only when `named`
/// (a root that takes held counts absolute gets them with every numbered
/// request). A key's is its held slots, kept as a named counter's held
/// word is ([`crate::table::Books::held_key_counts`]), sent only when
/// `keys` (a root that takes keys' held slots is sent them all instead:
/// `key_report.rs`): the keys' slots go as adds and returns (before, nothing was,
/// and a restarted root read 0 of 6 held slots in the fault suite's
/// `root-restarts`; then they were counted from the hold records, which
/// miss a slot taken or given back while they are read and one that
/// found no record).
fn held_before(
    table: &Table,
    link: &RootLink,
    sent: &OwedDeltas,
    groups: usize,
    now: Nanos,
    (named, keys): (bool, bool),
) -> Vec<(CounterKey, Owed)> {
    let books = table.books();
    let named = if named {
        books.held_counts()
    } else {
        Vec::new()
    };
    // A key holding none now that `sent` or the owed weight moves (given
    // back since: the new instance lacks its slots from before all the
    // same).
    let keys = if keys {
        books.held_key_counts(|c| sent.contains_key(&c) || link.owed.contains_key(&c))
    } else {
        Vec::new()
    };
    let held = named
        .into_iter()
        .map(|(id, held)| (CounterKey::named(id), held))
        .chain(keys);
    owed_again(link, sent, groups, now, held)
}

/// Of `held` (what this host holds of each counter beyond its next
/// collection), what the restarted root of `link` lacks: less what its
/// new instance counts of `sent` and what the link still owes it, for
/// the counters of its group.
fn owed_again(
    link: &RootLink,
    sent: &OwedDeltas,
    groups: usize,
    now: Nanos,
    held: impl IntoIterator<Item = (CounterKey, i64)>,
) -> Vec<(CounterKey, Owed)> {
    let net = |owed: &OwedDeltas, c: &CounterKey| owed.get(c).map_or(0, Owed::counted_net);
    held.into_iter()
        .filter_map(|(c, held)| {
            if shard(c, groups) != link.group {
                return None;
            }
            let before = i128::from(held) - net(sent, &c) - net(&link.owed, &c);
            let units = u64::try_from(before.unsigned_abs())
                .ok()
                .filter(|&n| n > 0)?;
            // Below 0: the new instance counts more than this host
            // holds (units resent to an earlier instance, to make up for
            // returns it took before their adds, reached this one).
            Some((
                c,
                if before > 0 {
                    Owed::resent(units, now)
                } else {
                    Owed::resent_returned(units, now)
                },
            ))
        })
        .collect()
}
