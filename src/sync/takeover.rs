//! A sync thread's numbered requests outliving the thread (see
//! docs/DESIGN.md, "Exactly once"): the handover record a thread leaves
//! in the region before every exchange, which the thread that starts
//! after it died continues from ([`take_over`]); and the retired record a
//! thread that stops cleanly leaves of the requests still unconfirmed
//! ([`retire`]), which whichever thread syncs the table next sends again
//! under the stopped thread's numbers ([`adopt_retired`]). The record's
//! encoding is `handover.rs`.
//!
//! Weight a record hands on stays unacknowledged in the table; the thread
//! taking it keeps, per counter, what both the table and the record's
//! requests still have (a reply may have acknowledged some after the
//! record was left, and weight owed to a root outside any request is not
//! in a retired record), and hands the rest back to pending, to be sent
//! as new.

use std::collections::{HashMap, HashSet};

use super::accounting::Accounts;
use super::handover::{self, LinkRecord, LinkView, Record};
use super::link::{Orphans, OwedDeltas, RootLink, Unconfirmed};
use super::request::Requests;
use crate::core::counter::kept_of;
use crate::table::{HandoverRecord, SlotId, Table};
use crate::wire::CounterKey;

/// Leaves this thread's handover record in `table`'s region (in a region
/// with a handover section; a record with nothing in it only when the
/// last one, `was_empty`, had something). Returns whether it was empty.
pub(super) fn leave(
    table: &Table,
    requests: &Requests,
    accounts: &Accounts,
    links: &[RootLink],
    was_empty: bool,
) -> bool {
    if !table.books().has_handover() {
        return true;
    }
    let unacked = accounts.unacked();
    let views: Vec<_> = links
        .iter()
        .flat_map(|l| views(l, requests.incarnation()))
        .collect();
    let empty = unacked.is_empty() && views.iter().all(|v| v.is_empty());
    if !(empty && was_empty) {
        let record = handover::encode_parts(
            requests.limiter_id(),
            requests.incarnation(),
            &unacked,
            &views,
        );
        table.books().write_handover(&record);
    }
    empty
}

/// Takes over from process `predecessor`'s sync thread, which died:
/// continues from its handover record (see
/// [`super::SyncEngine::take_over`]); returns the line to log.
pub(super) fn take_over(
    table: &Table,
    predecessor: u32,
    requests: &mut Requests,
    accounts: &mut Accounts,
    links: &mut [RootLink],
) -> String {
    let found = match table.books().handover_of(predecessor) {
        HandoverRecord::Found(bytes) => handover::decode(&bytes).and_then(|r| {
            if r.limiter == requests.limiter_id() {
                Ok(r)
            } else {
                Err(format!("it synced as \"{}\"", r.limiter))
            }
        }),
        HandoverRecord::Overflowed => {
            Err("its last record did not fit the zone's handover section".into())
        }
        HandoverRecord::Missing => Err("it left no record".into()),
    };
    table.books().clear_handover_of(predecessor);
    table.books().count_takeover(found.is_ok());
    match found {
        Ok(record) => {
            requests.set_incarnation(record.incarnation);
            let (parts, roots, requeued) = continue_from(table, record, accounts, links);
            format!(
                "the previous sync thread of this table (process {predecessor}) died; \
                 {parts} of its requests to {roots} root(s) go again under their numbers \
                 (counted once), {requeued} units are sent again as new"
            )
        }
        Err(why) => {
            let requeued = table.books().requeue_unacked_beyond(|_, _, _| 0);
            format!(
                "the previous sync thread of this table (process {predecessor}) died with \
                 {requeued} units unacked; they are sent again as new ({why}: a root that \
                 had applied them counts them twice)"
            )
        }
    }
}

/// Continues a dead thread's `record`: per root (by URL) its numbers,
/// unconfirmed requests and owed weight, and the unacknowledged weight
/// those cover; the table's other unacknowledged weight goes back to
/// pending. Returns the requests taken over, the roots they go to, and
/// the units handed back.
fn continue_from(
    table: &Table,
    record: Record,
    accounts: &mut Accounts,
    links: &mut [RootLink],
) -> (usize, usize, u64) {
    let taken = place(record.links, record.incarnation, links);
    let with_parts: Vec<&LinkRecord> = taken.iter().filter(|l| !l.parts.is_empty()).collect();
    let (parts, roots) = parts_and_roots(&with_parts);
    let mut wanted = covered(&record.unacked, &taken);
    let mut kept = Vec::new();
    let requeued = table.books().requeue_unacked_beyond(|c, slot, unacked| {
        let Some((added, returned)) = wanted.remove(&c) else {
            return 0;
        };
        // A reply acknowledged some of it after the record was left, or
        // weight collected since is not in it: what both have stays.
        let net = added as i64 - returned as i64;
        let keep = kept_of(net, unacked);
        if keep == net {
            kept.push((c, slot, added, returned));
        } else {
            kept.push((c, slot, keep.max(0) as u64, (-keep).max(0) as u64));
        }
        keep
    });
    accounts.adopt_unacked(kept);
    (parts, roots, requeued)
}

/// The requests `links` hold and the distinct roots they go to.
fn parts_and_roots(links: &[&LinkRecord]) -> (usize, usize) {
    let parts = links.iter().map(|l| l.parts.len()).sum();
    let roots: HashSet<&str> = links.iter().map(|l| l.url.as_str()).collect();
    (parts, roots.len())
}

/// Gives each of `records` to the link of its root (by URL): what it
/// owes, and its requests: those of thread `own` (this thread continues
/// it) as the link's own unconfirmed requests and numbering, those of
/// another thread as orphans, sent under that thread's numbers. Returns
/// what was placed; requests that cannot go again under their numbers (a
/// root that takes none) are left out of it.
fn place(records: Vec<LinkRecord>, own: u64, links: &mut [RootLink]) -> Vec<LinkRecord> {
    let mut placed = Vec::new();
    for mut l in records {
        let Some(link) = links.iter_mut().find(|k| k.url == l.url) else {
            continue;
        };
        // Owed weight was never applied: it is owed here as any other.
        link.owe_again(l.owed.clone());
        if l.incarnation == own {
            link.next_seq = link.next_seq.max(l.next_seq);
            link.unconfirmed = l.parts.clone();
        } else if link.takes_sequence && !l.parts.is_empty() {
            link.orphans.push(Orphans {
                incarnation: l.incarnation,
                parts: l.parts.clone(),
            });
        } else {
            l.parts.clear();
        }
        placed.push(l);
    }
    placed
}

/// Of the unacknowledged weight `unacked` (per counter: slot, added,
/// given back), what the requests and owed weight of `links` pay off at
/// some root: per counter, at most the most any one root's records carry
/// of it, since the first root to confirm them acknowledges it.
fn covered(
    unacked: &[(CounterKey, SlotId, u64, u64)],
    links: &[LinkRecord],
) -> HashMap<CounterKey, (u64, u64)> {
    let mut per_root: HashMap<(&str, CounterKey), (u64, u64)> = HashMap::new();
    for l in links {
        for entries in l.parts.iter().map(|p| &p.owed).chain([&l.owed]) {
            for (&c, o) in entries {
                let e = per_root.entry((l.url.as_str(), c)).or_default();
                e.0 = e.0.saturating_add(o.weight);
                e.1 = e.1.saturating_add(o.returned);
            }
        }
    }
    let mut most: HashMap<CounterKey, (u64, u64)> = HashMap::new();
    for ((_, c), (w, r)) in per_root {
        let e = most.entry(c).or_default();
        e.0 = e.0.max(w);
        e.1 = e.1.max(r);
    }
    unacked
        .iter()
        .filter_map(|&(c, _, added, returned)| {
            let (w, r) = most.get(&c)?;
            Some((c, (added.min(*w), returned.min(*r))))
        })
        .filter(|(_, (a, r))| *a > 0 || *r > 0)
        .collect()
}

/// The thread stops cleanly: leaves its requests still unconfirmed (and
/// the orphans it holds) and what it owes each root as the region's
/// retired record, with the unacknowledged weight they pay off, which it
/// drops from its own books (the rest it hands back itself). Returns the
/// line to log, if there was any. Before retired records, weight owed to
/// a root (one down or backing off, or every root down: folded here and
/// owed to them) was dropped with the thread.
pub(super) fn retire(
    table: &Table,
    requests: &Requests,
    accounts: &mut Accounts,
    links: &[RootLink],
) -> Option<String> {
    let taken: Vec<LinkRecord> = links
        .iter()
        .flat_map(|l| views(l, requests.incarnation()))
        .filter(|v| !v.is_empty())
        .map(|v| v.to_record())
        .collect();
    if taken.is_empty() || !table.books().has_handover() {
        return None;
    }
    let unacked = accounts.unacked();
    let wanted = covered(&unacked, &taken);
    let record = Record {
        limiter: requests.limiter_id().to_string(),
        incarnation: requests.incarnation(),
        unacked: unacked
            .iter()
            .filter_map(|&(c, slot, ..)| wanted.get(&c).map(|&(a, r)| (c, slot, a, r)))
            .collect(),
        links: taken,
    };
    let (parts, roots) = parts_and_roots(&record.links.iter().collect::<Vec<_>>());
    if table.books().retire_handover(&handover::encode(&record)) {
        accounts.forget_unacked(&wanted);
        Some(format!(
            "stopping with {parts} request(s) unconfirmed and weight owed to {roots} \
             root(s): left for the next sync thread, which sends the requests again under \
             their numbers"
        ))
    } else {
        Some(format!(
            "stopping with {parts} request(s) unconfirmed and weight owed to {roots} \
             root(s), and no room to leave them (another stopped thread's record waits, or \
             it is too large): what is unacknowledged is sent again as new (a root that had \
             applied it counts it twice), what was owed and not is dropped"
        ))
    }
}

/// Takes the retired record a thread that stopped left (see [`retire`]):
/// its requests go to their roots again under their threads'
/// incarnations and numbers, before this thread's own
/// ([`RootLink::orphans`]), what it owed them is owed here, and the
/// weight they pay off becomes this thread's; what goes to no root of
/// this thread (one no longer configured, one that no longer takes
/// numbered requests) is handed back.
pub(super) fn adopt_retired(
    table: &Table,
    requests: &Requests,
    accounts: &mut Accounts,
    links: &mut [RootLink],
) {
    let Some(record) = take_retired(table) else {
        return;
    };
    let adopted = if record.limiter == requests.limiter_id() {
        // Never this thread's own incarnation: all of it goes as orphans.
        place(record.links, 0, links)
    } else {
        Vec::new()
    };
    let wanted = covered(&record.unacked, &adopted);
    accounts.adopt_unacked(hand_back_beyond(table, &record.unacked, &wanted));
}

/// Hands each counter's weight of `unacked` back to pending but what
/// `wanted` keeps of it; returns what is kept.
fn hand_back_beyond(
    table: &Table,
    unacked: &[(CounterKey, SlotId, u64, u64)],
    wanted: &HashMap<CounterKey, (u64, u64)>,
) -> Vec<(CounterKey, SlotId, u64, u64)> {
    let mut kept = Vec::new();
    for &(c, slot, added, returned) in unacked {
        let (a, r) = wanted.get(&c).copied().unwrap_or_default();
        if a > 0 || r > 0 {
            kept.push((c, slot, a, r));
        }
        let back = (added - a) as i64 - (returned - r) as i64;
        if back != 0 {
            table.books().requeue_unacked(slot, c.id, c.key, back);
        }
    }
    kept
}

/// The retired record a thread that stopped left, taken from the region.
fn take_retired(table: &Table) -> Option<Record> {
    let bytes = table.books().take_retired_handover()?;
    // Written by this build's encoding (a region's layout is checked
    // across reloads); one that does not parse is lost with its weight,
    // which then stays unacknowledged here.
    handover::decode(&bytes).ok()
}

/// A thread without roots takes the retired record and hands all its
/// weight back to pending, to be counted here.
pub(super) fn hand_back_retired(table: &Table) {
    if let Some(record) = take_retired(table) {
        hand_back_beyond(table, &record.unacked, &HashMap::new());
    }
}

/// What a thread taking over should this one die or stop sends `link`'s
/// root, as thread `incarnation` (this one): every
/// numbered request not confirmed yet, the one under way among them,
/// and what it is owed unnumbered (an unnumbered request under way
/// included); then the orphans it holds, each under its own thread's
/// incarnation. Borrowed from the link: nothing is copied.
fn views(link: &RootLink, incarnation: u64) -> Vec<LinkView<'_>> {
    fn seq_of(u: &Unconfirmed) -> (u64, &OwedDeltas) {
        (u.seq, &u.owed)
    }
    let (mut parts, in_orphans): (Vec<_>, Vec<_>) = if link.sending_orphans {
        (
            link.unconfirmed.iter().map(seq_of).collect(),
            link.sending_replay.iter().map(seq_of).collect(),
        )
    } else {
        let all = link.sending_replay.iter().chain(&link.unconfirmed);
        (all.map(seq_of).collect(), Vec::new())
    };
    let mut owed = vec![&link.owed];
    match link.sending {
        Some(seq) => parts.push((seq, &link.in_way)),
        None => owed.push(&link.in_way),
    }
    parts.sort_by_key(|p| p.0);
    let mut views = vec![LinkView {
        url: &link.url,
        incarnation,
        next_seq: link.next_seq,
        parts,
        owed,
    }];
    for (i, o) in link.orphans.iter().enumerate() {
        let mut parts = if i == 0 {
            in_orphans.clone()
        } else {
            Vec::new()
        };
        parts.extend(o.parts.iter().map(seq_of));
        parts.sort_by_key(|p| p.0);
        views.push(LinkView {
            url: &link.url,
            incarnation: o.incarnation,
            next_seq: 0,
            parts,
            owed: Vec::new(),
        });
    }
    views
}
