//! A cycle's requests to the roots, and the pages that answer them.
//!
//! Each cycle asks every root that is neither backing off nor still busy
//! with an earlier exchange. A request carries what the root is owed as
//! it stands at the time (leaked; returns only to a root that takes
//! them), within what one request may hold: a root refuses a request of
//! more than [`MAX_DELTAS_PER_SYNC`] entries whole, so a larger backlog
//! goes out over several cycles. Beside the weight go the rejections
//! counted since the last cycle, the penalties started here, and the
//! cursors of the quota log and the counters: quota changes come from one
//! group only (the lowest with a root up), the others are asked for none
//! ([`NO_QUOTAS`]).

use std::collections::HashMap;

use super::ids::IdMap;
use super::key_report::{keyed_held, KeyReportCache};
use super::link::{OwedDeltas, RootLink, NO_QUOTAS};
use super::routing::shard;
use crate::core::tier::Penalty;
use crate::core::Nanos;
use crate::table::Table;
use crate::wire::{
    keyed_entries, ClockReport, CounterDelta, CounterKey, Interest, KeyDelta, KeyedDeltas,
    QuotaCursor, Replay, Sequence, SyncRequest, SyncResponse, TierRequest, MAX_DELTAS_PER_SYNC,
};

/// Every key `table` holds at `now`, as counters (its template's quota id
/// and its hash), sorted.
fn held_keys(table: &Table, now: Nanos) -> Vec<CounterKey> {
    let templates: HashMap<_, u64> = table
        .books()
        .slot_ids()
        .into_iter()
        .map(|(id, slot)| (slot, id))
        .collect();
    let mut all: Vec<CounterKey> = table
        .keys(None, now)
        .into_iter()
        .filter_map(|k| {
            let id = *templates.get(&k.template)?;
            Some(CounterKey { id, key: k.hash })
        })
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

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

/// How this limiter's requests are made, and the rejections its last
/// cycle reported.
#[derive(Debug)]
pub(super) struct Requests {
    /// This limiter's id, in every request.
    limiter_id: String,
    /// This sync thread's random id, in every numbered request
    /// ([`Sequence`]).
    incarnation: u64,
    /// Entries one request may carry: a root refuses a request of more
    /// than [`MAX_DELTAS_PER_SYNC`] whole, so a larger backlog goes out
    /// over several cycles instead of never.
    max_entries: usize,
    /// Each quota's rejection count as of the last cycle (`None` before
    /// the first, which only takes the baseline: a new sync thread does
    /// not report what an earlier one already did).
    rejected_seen: Option<IdMap<u64>>,
}

impl Requests {
    /// Requests of limiter `limiter_id`'s sync thread `incarnation` (not
    /// 0), of the most entries a root takes.
    pub(super) fn new(limiter_id: String, incarnation: u64) -> Self {
        Self {
            limiter_id,
            incarnation: incarnation.max(1),
            max_entries: MAX_DELTAS_PER_SYNC,
            rejected_seen: None,
        }
    }

    /// Gives this sync thread another id (the simulator's hosts, tests:
    /// ids that do not depend on the system's randomness).
    /// The limiter id requests carry.
    pub(super) fn limiter_id(&self) -> &str {
        &self.limiter_id
    }

    /// The incarnation numbered requests carry.
    pub(super) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub(super) fn set_incarnation(&mut self, incarnation: u64) {
        self.incarnation = incarnation.max(1);
    }

    /// Lowers the entries one request may carry (tests: a backlog over
    /// the bound without a million counters).
    #[cfg(test)]
    pub(super) fn limit_entries(&mut self, entries: usize) {
        self.max_entries = entries.max(4);
    }

    /// The checks each quota rejected since the last cycle, as
    /// `[id, count]` for the requests of this one, from the table's
    /// running `totals` (statistics: a root not sent to this cycle misses
    /// them).
    pub(super) fn rejected_since_last_cycle(&mut self, totals: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        let first = self.rejected_seen.is_none();
        let seen = self.rejected_seen.get_or_insert_with(IdMap::default);
        let mut grown = Vec::new();
        // Only the quotas whose counts changed are listed (the table's
        // dirty ring): the others keep what was seen of them.
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
            seen.insert(id, total);
        }
        grown
    }

    /// The plan of a cycle over `links` (in `groups` groups) whose
    /// requests report `rejected`.
    pub(super) fn plan(
        &self,
        links: &[RootLink],
        groups: usize,
        rejected: Vec<(u64, u64)>,
    ) -> CyclePlan<'_> {
        // With no root of a group up, backoff only delays finding the
        // first one back.
        let mut group_up = vec![false; groups];
        for l in links.iter().filter(|l| l.metrics.up) {
            group_up[l.group] = true;
        }
        // Quota changes come from the lowest group with a root up; the
        // others' links take the furthest cursor of any other group.
        let quota_group = (groups > 1)
            .then(|| group_up.iter().position(|&up| up))
            .flatten();
        let mut furthest = vec![QuotaCursor::default(); groups];
        for l in links {
            furthest[l.group] = furthest[l.group].max(l.cursor);
        }
        CyclePlan {
            requests: self,
            groups,
            group_up,
            quota_group,
            furthest,
            rejected,
            held: None,
            held_slots: None,
            interest: None,
            key_report: KeyReportCache::default(),
        }
    }
}

/// What the requests of one cycle share.
pub(super) struct CyclePlan<'a> {
    /// How requests are made.
    requests: &'a Requests,
    /// Number of root groups.
    groups: usize,
    /// Per group: a root of it is up.
    group_up: Vec<bool>,
    /// The group quota changes come from (`None` with one group: every
    /// root gives them).
    quota_group: Option<usize>,
    /// Per group: the furthest quota cursor of its roots.
    furthest: Vec<QuotaCursor>,
    /// Rejections since the last cycle.
    rejected: Vec<(u64, u64)>,
    /// Every penalty held, read once for the roots that are sent them all.
    held: Option<Vec<Penalty>>,
    /// The slots held per named in-flight quota, by quota id, sorted: read
    /// once for the roots that take them (after the cycle's collection
    /// nothing moves them until the next one).
    held_slots: Option<Vec<(u64, u64)>>,
    /// Every key the table holds, as counters, sorted: read once for the
    /// roots that are sent a list of them this cycle.
    interest: Option<Vec<CounterKey>>,
    /// What the keys' held slots reported this cycle read of the table.
    key_report: KeyReportCache,
}

impl CyclePlan<'_> {
    /// True when the root of `link` is asked this cycle (it is then busy
    /// until its exchange ends): not while an earlier exchange is under
    /// way, nor while it backs off and another root of its group is up.
    pub(super) fn asks(&self, link: &mut RootLink) -> bool {
        if link.busy {
            return false;
        }
        if link.skip > 0 && self.group_up[link.group] {
            link.skip -= 1;
            return false;
        }
        link.busy = true;
        true
    }

    /// The request to root `root` (`link`) at `now`, with what it pays
    /// off; what does not fit stays owed. To a root that takes sequences
    /// the request is numbered, and the numbered requests whose exchanges
    /// failed go with it, oldest first, each under its number (see
    /// [`RootLink::unconfirmed`]): the root applies each once. When they
    /// fill a request, it carries them only (the oldest that fit, the
    /// last of them as its own weight), and this cycle's weight waits.
    pub(super) fn request(
        &mut self,
        table: &Table,
        root: usize,
        link: &mut RootLink,
        now: Nanos,
    ) -> Outgoing {
        let max_entries = self.requests.max_entries;
        if let Some(incarnation) = link.orphans.first().map(|o| o.incarnation) {
            if link.takes_sequence {
                let mut out = self.orphan_request(root, link, incarnation, now);
                out.request.keyed_held = self.keyed_held(table, link, &out.request);
                return out;
            }
            // The root no longer takes numbered requests: what they paid
            // off is owed as anything else.
            for u in std::mem::take(&mut link.orphans)
                .into_iter()
                .flat_map(|o| o.parts)
            {
                link.owe_again(u.owed);
            }
        }
        if !link.takes_sequence && !link.unconfirmed.is_empty() {
            // The root no longer says it takes sequences: what the
            // failed requests paid off is owed as anything else.
            for u in std::mem::take(&mut link.unconfirmed) {
                link.owe_again(u.owed);
            }
        }
        let (replay, replay_entries) = self.replay(link, now);
        // At most half a request.
        let interest = self.interest(table, link, now);
        let interest_entries = interest.as_ref().map_or(0, Interest::entry_count);
        if !link.unconfirmed.is_empty() {
            // Earlier requests alone fill this one.
            let mut out = self.replay_only(root, link, replay, None);
            out.request.held = self.held(table, link);
            out.request.interest = interest;
            out.request.keyed_held = self.keyed_held(table, link, &out.request);
            return out;
        }
        let mut owed = std::mem::take(&mut link.owed);
        let rejected = self.rejected_of(link.group);
        self.penalties_for(table, link, now);
        // A numbered request keeps one entry free: sent again later as a
        // part of another, it takes one more.
        let numbered = usize::from(link.takes_sequence);
        let room = max_entries.saturating_sub(
            rejected.len()
                + link.penalties_sent.len()
                + replay_entries
                + numbered
                + interest_entries,
        );
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
        let seq = link.takes_sequence.then(|| {
            let seq = link.next_seq;
            link.next_seq += 1;
            seq
        });
        link.sending = seq;
        let penalties = link.penalties_sent.clone();
        let mut request = self.body(link, due, rejected, penalties, seq);
        request.replay = replay;
        request.held = self.held(table, link);
        request.interest = interest;
        request.keyed_held = self.keyed_held(table, link, &request);
        Outgoing {
            root,
            request,
            owed,
            clock: link.clock_report(),
        }
    }

    /// The slots this host holds, absolute, per named in-flight quota of
    /// `link`'s group, for a numbered request to a root that takes them
    /// (see [`SyncRequest::held`]); none otherwise. Its held word: the
    /// slots that left `pending`, sent or still owed, which the root
    /// counts of this host once it has them all.
    fn held(&mut self, table: &Table, link: &RootLink) -> Vec<(u64, u64)> {
        if !(link.takes_held && link.takes_sequence) {
            return Vec::new();
        }
        let groups = self.groups;
        let all = self.held_slots.get_or_insert_with(|| {
            let mut all: Vec<(u64, u64)> = table
                .books()
                .held_counts()
                .into_iter()
                .map(|(id, n)| (id, u64::try_from(n).unwrap_or(0)))
                .collect();
            all.sort_unstable_by_key(|&(id, _)| id);
            all.dedup_by_key(|&mut (id, _)| id);
            all
        });
        all.iter()
            .copied()
            .filter(|&(id, _)| shard(CounterKey::named(id), groups) == link.group)
            .collect()
    }

    /// The held slots of keys `request` to the root of `link` reports
    /// (see `key_report.rs`), in the entries the request leaves free.
    fn keyed_held(
        &mut self,
        table: &Table,
        link: &mut RootLink,
        request: &SyncRequest,
    ) -> Vec<KeyedDeltas> {
        let room = self
            .requests
            .max_entries
            .saturating_sub(request.entry_count());
        let report = (&mut link.key_report, link.group, self.groups);
        keyed_held(table, report, request, &mut self.key_report, room)
    }

    /// The keys this host holds of `link`'s group, for a numbered request
    /// to a root that answers by interest, when a list is due (see
    /// [`super::interest`]); none otherwise. Its keys take at most a
    /// quarter of a request: a table holding more keys than that (far
    /// more than a root's share of a limiter) leaves the rest out, which
    /// the root learns from their deltas.
    fn interest(&mut self, table: &Table, link: &mut RootLink, now: Nanos) -> Option<Interest> {
        if !link.takes_sequence {
            return None;
        }
        let groups = self.groups;
        let cached = &mut self.interest;
        let mine = || {
            let all = cached.get_or_insert_with(|| held_keys(table, now));
            all.iter()
                .copied()
                .filter(|&k| shard(k, groups) == link.group)
                .collect()
        };
        let stamp = super::interest::key_stamp(table);
        let most = self.requests.max_entries / 4;
        link.interest.next(now, stamp, most, mine)
    }

    /// Moves the oldest of `link`'s unconfirmed requests that fit half a
    /// request into `sending_replay`, and returns them as the request
    /// carries them (a part that leaked to nothing is not sent, but stays
    /// with the exchange, which acknowledges it), with the entries they
    /// take.
    fn replay(&self, link: &mut RootLink, now: Nanos) -> (Vec<Replay>, usize) {
        let budget = self.requests.max_entries / 2;
        let (mut parts, mut entries) = (Vec::new(), 0usize);
        while let Some(u) = link.unconfirmed.first() {
            let due = due_deltas(&u.owed, now, link.takes_returns);
            let part = Replay {
                seq: u.seq,
                deltas: due.named,
                keyed: due.keyed,
                returned: due.returned,
                keyed_returned: due.keyed_returned,
            };
            let n = part.entry_count();
            if n > 1 && entries + n > budget && !parts.is_empty() {
                break;
            }
            link.metrics.dropped_returns = link
                .metrics
                .dropped_returns
                .saturating_add(due.dropped_returns);
            link.sending_replay.push(link.unconfirmed.remove(0));
            if n > 1 {
                entries += n;
                parts.push(part);
            }
        }
        (parts, entries)
    }

    /// A request carrying the requests an earlier thread left unconfirmed
    /// ([`RootLink::orphans`]), as many as fit half a request, under that
    /// thread's incarnation and numbers; this thread's own weight waits
    /// for the next cycle.
    /// The first thread's orphans (`incarnation`) are sent.
    fn orphan_request(
        &self,
        root: usize,
        link: &mut RootLink,
        incarnation: u64,
        now: Nanos,
    ) -> Outgoing {
        // The orphans take the place of this thread's unconfirmed
        // requests while their request is made.
        let swap = |link: &mut RootLink| {
            if let Some(first) = link.orphans.first_mut() {
                std::mem::swap(&mut link.unconfirmed, &mut first.parts);
            }
        };
        swap(link);
        let (replay, _) = self.replay(link, now);
        swap(link);
        link.sending_orphans = true;
        self.replay_only(root, link, replay, Some(incarnation))
    }

    /// A request to `link`'s root that carries earlier requests only
    /// (`replay`): the last of them as its own weight, under its number.
    /// Under `incarnation` when it is an earlier thread's (orphans).
    fn replay_only(
        &self,
        root: usize,
        link: &mut RootLink,
        mut replay: Vec<Replay>,
        incarnation: Option<u64>,
    ) -> Outgoing {
        link.sending = None;
        // Under the number of the last part with weight: the root takes
        // every number up to it as applied.
        let own = replay.pop().unwrap_or_else(|| Replay {
            seq: link.sending_replay.last().map_or(0, |u| u.seq),
            ..Replay::default()
        });
        let seq = own.seq;
        let due = Due {
            named: own.deltas,
            keyed: own.keyed,
            returned: own.returned,
            keyed_returned: own.keyed_returned,
            dropped_returns: 0,
        };
        let mut request = self.body(link, due, Vec::new(), Vec::new(), Some(seq));
        request.replay = replay;
        if let (Some(incarnation), Some(s)) = (incarnation, request.sequence.as_mut()) {
            s.incarnation = incarnation;
        }
        Outgoing {
            root,
            request,
            owed: OwedDeltas::default(),
            clock: link.clock_report(),
        }
    }

    /// A request to `link`'s root carrying `due`, `rejected` and
    /// `penalties`, numbered `seq` when it is.
    fn body(
        &self,
        link: &mut RootLink,
        due: Due,
        rejected: Vec<(u64, u64)>,
        penalties: Vec<Penalty>,
        seq: Option<u64>,
    ) -> SyncRequest {
        let quotas_after = self.quota_cursor(link);
        let tiers = TierRequest {
            penalties,
            ..link.tiers.clone()
        };
        SyncRequest {
            tiers,
            limiter: self.requests.limiter_id.clone(),
            quotas_after,
            counter_version: link.counter_version,
            root_instance: link.root_instance,
            deltas: due.named,
            keyed: due.keyed,
            rejected,
            returned: due.returned,
            keyed_returned: due.keyed_returned,
            sequence: seq.map(|seq| Sequence {
                incarnation: self.requests.incarnation,
                seq,
            }),
            replay: Vec::new(),
            held: Vec::new(),
            keyed_held: Vec::new(),
            interest: None,
        }
    }

    /// The rejections a root of group `g` is sent: those of its shard, at
    /// most half a request.
    fn rejected_of(&self, g: usize) -> Vec<(u64, u64)> {
        let mut rejected = if self.groups > 1 {
            self.rejected
                .iter()
                .filter(|(id, _)| shard(CounterKey::named(*id), self.groups) == g)
                .copied()
                .collect()
        } else {
            self.rejected.clone()
        };
        rejected.truncate(self.requests.max_entries / 2);
        rejected
    }

    /// Chooses the penalties `link`'s request carries (into
    /// `penalties_sent`): every penalty held when the root is to be sent
    /// them all, else those it is owed; at most a quarter of a request,
    /// the rest stay owed for the next cycle.
    fn penalties_for(&mut self, table: &Table, link: &mut RootLink, now: Nanos) {
        if link.takes_tiers && std::mem::take(&mut link.resend_penalties) {
            let now_utc = now as i64 + table.utc_offset();
            link.tiers.penalties = self
                .held
                .get_or_insert_with(|| table.books().held_penalties(now_utc))
                .clone();
        }
        let quarter = self.requests.max_entries / 4;
        let mut penalties = std::mem::take(&mut link.tiers.penalties);
        if penalties.len() > quarter {
            link.tiers.penalties = penalties.split_off(quarter);
        }
        link.penalties_sent = penalties;
    }

    /// The quota cursor `link`'s request carries: its own, moved up to the
    /// furthest of any other group, or [`NO_QUOTAS`] when another group
    /// gives quota changes.
    fn quota_cursor(&self, link: &mut RootLink) -> QuotaCursor {
        let g = link.group;
        let others = self
            .furthest
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != g)
            .map(|(_, &c)| c)
            .max()
            .unwrap_or_default();
        link.cursor = link.cursor.max(others);
        match self.quota_group {
            Some(q) if q != g => NO_QUOTAS,
            _ => link.cursor,
        }
    }
}
