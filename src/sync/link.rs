//! What a limiter knows about one root: where it is in that root's quota
//! log and counter versions, its clock offset, the deltas it still owes the
//! root, its health and its metrics.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;

use super::metrics::RootMetrics;
pub use super::owed::{Owed, OwedDeltas, OwedWindow};
use super::status::RememberedRoot;
use crate::core::tier::Penalty;
use crate::core::{Level, Nanos};
use crate::table::Source;
use crate::wire::{ClockReport, CounterKey, CounterValue, QuotaCursor, SyncResponse, TierRequest};

/// Most penalties a root is owed before the list gives way to sending it
/// every penalty held.
pub const MAX_OWED_PENALTIES: usize = 65_536;

/// Round-trip samples kept for the clock offset.
const OFFSET_SAMPLES: usize = 8;

/// How far two clock samples may disagree beyond their round trips before
/// one of the clocks is taken to have stepped (see
/// [`RootLink::clock_stepped`]): the coarse clocks' ticks and their drift
/// over the samples kept.
const OFFSET_SLACK: u64 = 20_000_000;

/// The quota cursor a limiter sends a root it does not take quota changes
/// from (a root of another group than the one it follows): past every
/// epoch, so the root sends no quotas. Never kept as a link's cursor.
pub const NO_QUOTAS: QuotaCursor = QuotaCursor {
    epoch: u64::MAX,
    id: u64::MAX,
};

/// Per-root state kept by the sync thread.
#[derive(Debug)]
pub struct RootLink {
    /// The root's base URL, e.g. `http://10.0.0.1:7070`.
    pub url: String,
    /// The root's group (shard), 0 with one group.
    pub group: usize,
    /// Last quota position received from this root.
    pub cursor: QuotaCursor,
    /// Last counter version received from this root.
    pub counter_version: u64,
    /// Instance the version belongs to.
    pub root_instance: u64,
    /// Deltas this root has not received yet (it failed or was not asked),
    /// by quota id; resent, leaked, with the next request.
    pub owed: OwedDeltas,
    /// Recent `(round trip, offset)` samples; the offset of the quickest
    /// round trip is the best estimate (NTP's rule).
    samples: VecDeque<(u64, i64)>,
    /// Consecutive failures, for backoff.
    pub failures: u32,
    /// Cycles still to skip before this root is tried again.
    pub skip: u32,
    /// An exchange with this root is under way; later cycles leave the
    /// root out until it ends, so a slow root delays no one.
    pub busy: bool,
    /// UTC minus local time by this root's clock (from its last reply
    /// that said its UTC time).
    pub utc_offset: Option<i64>,
    /// The root's last reply said it takes returns: weight given back is
    /// sent to it (to a root that predates returns it is dropped).
    pub takes_returns: bool,
    /// How often the root's instance changed (it restarted), wrapping:
    /// part of the [`Source`] its values are merged as.
    restarts: u8,
    /// Tiers with this root: the override cursor and penalty version it
    /// gave, and the penalties it is owed (started here, not delivered
    /// yet; sent again until a reply comes, which is harmless: a penalty
    /// merges by `max`).
    pub tiers: TierRequest,
    /// Penalties sent in the exchange under way: owed again if it fails.
    pub penalties_sent: Vec<Penalty>,
    /// The root is of another instance than before (or the first): it
    /// is sent every penalty this host holds.
    pub resend_penalties: bool,
    /// The root's last reply said it takes tiers: the request carries
    /// them (to a root that predates tiers, nothing is sent or owed).
    pub takes_tiers: bool,
    /// Instances of the root that answered at its URL lately, other than
    /// the current one, oldest first (at most [`KNOWN_INSTANCES`]): two
    /// processes behind one URL (a load balancer) answer in turn, and a
    /// reply from one of these is a switch back, not a restart.
    pub others: Vec<u64>,
    /// The root was last found restarted at this local time: once every
    /// host has had time to resend its slots there, the current
    /// instance's values replace the in-flight levels known from its
    /// earlier ones (see `SyncEngine::finish`).
    pub restart_seen: Option<Nanos>,
    /// In-flight levels of the root's group were folded here since its
    /// last answer (or, after it restarted, taken as its new instance's),
    /// so it is asked for all its counters, and its next whole answer
    /// settles the in-flight counters it leaves out
    /// ([`crate::table::Books::settle_omitted`]).
    pub ask_all: bool,
    /// The root's last answer said it takes sequences: requests to it are
    /// numbered ([`crate::wire::Sequence`]), and one whose exchange failed
    /// is sent again under its number, which the root applies once.
    pub takes_sequence: bool,
    /// The root's last answer said it takes held slots in absolute form:
    /// numbered requests to it carry them ([`crate::wire::SyncRequest::held`]),
    /// and it needs no slots sent again when another instance answers.
    pub takes_held: bool,
    /// Whether the root takes the held slots of keys, and when they are
    /// reported whole.
    pub key_report: super::key_report::KeyReport,
    /// What the root knows of the keys this host holds, and what it is
    /// told next (to a root that answers by interest; numbered requests
    /// only).
    pub interest: super::interest::LinkInterest,
    /// The number the next new request to this root takes.
    pub next_seq: u64,
    /// The number of the request under way, when it is numbered.
    pub sending: Option<u64>,
    /// The earlier requests the one under way carries again (taken from
    /// `unconfirmed` while it is under way).
    pub sending_replay: Vec<Unconfirmed>,
    /// Numbered requests whose exchanges failed, oldest first: the root
    /// may have applied each (a reply lost) or not. Every request to the
    /// root carries them again, each under its number, before its own
    /// weight; the root applies each once.
    pub unconfirmed: Vec<Unconfirmed>,
    /// What the exchange under way pays off (a copy: the exchange hands
    /// its own back with its outcome), for the handover record.
    pub in_way: OwedDeltas,
    /// Requests of earlier sync threads that stopped or died with them
    /// unconfirmed (see `takeover.rs`), per thread: sent again under its
    /// incarnation and numbers, the first thread's first, before this
    /// thread's own.
    pub orphans: Vec<Orphans>,
    /// The exchange under way carries the first thread's orphans, not
    /// this thread's own requests.
    pub sending_orphans: bool,
    /// Counters exposed to metrics.
    pub metrics: RootMetrics,
}

/// Most instances of a root remembered besides the current one
/// ([`RootLink::others`]): processes behind one URL answering in turn.
/// The region remembers as many for the next sync thread.
pub const KNOWN_INSTANCES: usize = crate::table::layout::REMEMBERED_INSTANCES;

/// Most earlier requests a request carries again: past it (a root that
/// took no reply home for this many exchanges in a row) the two oldest
/// are carried as one, under the later number, which a root that applied
/// exactly the older of the two counts twice.
pub const MOST_UNCONFIRMED: usize = 64;

/// A numbered request whose exchange failed (see
/// [`RootLink::unconfirmed`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Unconfirmed {
    /// Its number.
    pub seq: u64,
    /// What it paid off: sent again, leaked to the time it goes.
    pub owed: OwedDeltas,
}

/// An earlier sync thread's unconfirmed requests to one root (see
/// [`RootLink::orphans`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Orphans {
    /// That thread's incarnation.
    pub incarnation: u64,
    /// Its requests not confirmed yet, in increasing order of number
    /// (those of the exchange under way are in `sending_replay`).
    pub parts: Vec<Unconfirmed>,
}

/// Adds `from` to `into`, counter by counter.
fn merge_owed(into: &mut OwedDeltas, from: OwedDeltas) {
    for (c, o) in from {
        into.entry(c).and_modify(|e| *e = e.combine(o)).or_insert(o);
    }
}

impl RootLink {
    /// The request under way is numbered, or carries numbered earlier
    /// ones: if its exchange fails, they stay unconfirmed rather than
    /// owed.
    pub fn numbered_exchange(&self) -> bool {
        self.sending.is_some() || !self.sending_replay.is_empty()
    }

    /// The numbered exchange under way failed: its request's own weight
    /// (`owed`, under `sending`) and the earlier requests it carried
    /// again stay unconfirmed, before those it left for later. Past
    /// [`MOST_UNCONFIRMED`] the two oldest are carried as one.
    pub fn unconfirmed_after_failure(&mut self, owed: OwedDeltas) {
        if std::mem::take(&mut self.sending_orphans) {
            // The orphans go again, all of them, in order.
            if let Some(o) = self.orphans.first_mut() {
                let mut parts = std::mem::take(&mut self.sending_replay);
                parts.append(&mut o.parts);
                o.parts = parts;
            }
            self.owe_again(owed);
            return;
        }
        let mut parts = std::mem::take(&mut self.sending_replay);
        parts.append(&mut self.unconfirmed);
        if let Some(seq) = self.sending.take() {
            parts.push(Unconfirmed { seq, owed });
        } else {
            self.owe_again(owed);
        }
        while parts.len() > MOST_UNCONFIRMED {
            let older = parts.remove(0);
            merge_owed(&mut parts[0].owed, older.owed);
            self.metrics.unconfirmed_merged += 1;
        }
        self.unconfirmed = parts;
        self.metrics.unconfirmed = self.unconfirmed.len() as u64;
    }

    /// The exchange under way was answered: what it paid off is `owed`
    /// and what the earlier requests it carried again paid off, together
    /// (what the reply acknowledges). The root has applied every request
    /// numbered up to `applied_through` (its reply says so, and its counts
    /// include them): those still unconfirmed are acknowledged too.
    pub fn confirmed(&mut self, owed: &mut OwedDeltas, applied_through: u64) {
        self.sending = None;
        for part in std::mem::take(&mut self.sending_replay) {
            merge_owed(owed, part.owed);
        }
        if std::mem::take(&mut self.sending_orphans) {
            // The reply speaks of the orphans' incarnation.
            if let Some(o) = self.orphans.first_mut() {
                while o.parts.first().is_some_and(|u| u.seq <= applied_through) {
                    merge_owed(owed, o.parts.remove(0).owed);
                }
                if o.parts.is_empty() {
                    self.orphans.remove(0);
                }
            }
            return;
        }
        while self
            .unconfirmed
            .first()
            .is_some_and(|u| u.seq <= applied_through)
        {
            merge_owed(owed, self.unconfirmed.remove(0).owed);
        }
        self.metrics.unconfirmed = self.unconfirmed.len() as u64;
    }

    /// Owes `owed` to the root again, whatever the bound on what it is
    /// owed (weight that was sent once, and fitted then).
    pub fn owe_again(&mut self, owed: OwedDeltas) {
        merge_owed(&mut self.owed, owed);
    }

    /// A link to a root never synced with.
    pub fn new(url: String) -> Self {
        let metrics = RootMetrics {
            url: url.clone(),
            ..RootMetrics::default()
        };
        Self {
            url,
            group: 0,
            cursor: QuotaCursor::default(),
            counter_version: 0,
            root_instance: 0,
            owed: OwedDeltas::default(),
            samples: VecDeque::new(),
            failures: 0,
            skip: 0,
            busy: false,
            utc_offset: None,
            takes_returns: false,
            restarts: 0,
            tiers: TierRequest::default(),
            penalties_sent: Vec::new(),
            resend_penalties: false,
            takes_tiers: false,
            others: Vec::new(),
            restart_seen: None,
            ask_all: false,
            takes_sequence: false,
            takes_held: false,
            key_report: Default::default(),
            interest: Default::default(),
            next_seq: 1,
            sending: None,
            sending_replay: Vec::new(),
            unconfirmed: Vec::new(),
            in_way: OwedDeltas::default(),
            orphans: Vec::new(),
            sending_orphans: false,
            metrics,
        }
    }

    /// The [`Source`] this root's values are merged as, for the root at
    /// `index` in the list: the index (plus one, below 64: every root a
    /// limiter may have) and the count of its restarts (two bits), so that
    /// a restarted root's values, which start again from the floor, are
    /// max-merged like another root's. 0 (max-merged always) past the
    /// 63rd root.
    pub fn source(&self, index: usize) -> Source {
        match u8::try_from(index + 1) {
            Ok(n) if n < 64 => n | (self.restarts & 0b11) << 6,
            _ => 0,
        }
    }

    /// The root was found restarted (a reply of an instance not seen
    /// lately): its values, which start again from the floor, take a new
    /// [`Source`].
    pub fn found_restart(&mut self) {
        self.restarts = self.restarts.wrapping_add(1);
        self.metrics.restarts += 1;
    }

    /// A reply came from `instance`, another than the current one: true
    /// when it answered at this URL lately (a switch between processes
    /// behind it, not a restart). The current one is remembered among the
    /// others; past [`KNOWN_INSTANCES`] the oldest is forgotten (a reply
    /// from it would be a restart).
    pub fn switch_to(&mut self, instance: u64) -> bool {
        let known = self.others.contains(&instance);
        let current = self.root_instance;
        self.others.retain(|&o| o != instance && o != current);
        if self.others.len() == KNOWN_INSTANCES {
            self.others.remove(0);
        }
        self.others.push(current);
        known
    }

    /// What a later sync thread should know of this root (see
    /// [`RootLink::resume`]).
    pub fn remembered(&self) -> RememberedRoot {
        RememberedRoot {
            instance: self.root_instance,
            restarts: self.restarts,
            takes_returns: self.takes_returns,
            takes_sequence: self.takes_sequence,
            takes_held: self.takes_held,
            takes_keyed_held: self.key_report.takes,
            others: std::array::from_fn(|i| self.others.get(i).copied().unwrap_or(0)),
        }
    }

    /// Takes over what an earlier sync thread knew of this root: the
    /// instance that last answered and the others that answered at its
    /// URL lately, the restarts it saw, whether it takes returns. A reply
    /// of an instance among neither is then a restart, the levels taken
    /// from the same one keep their source, and returns are sent from the
    /// first request on.
    pub fn resume(&mut self, known: RememberedRoot) {
        self.root_instance = known.instance;
        self.others = known.others.into_iter().filter(|&o| o != 0).collect();
        self.restarts = known.restarts;
        self.takes_returns = known.takes_returns;
        self.takes_sequence = known.takes_sequence;
        self.takes_held = known.takes_held;
        self.key_report.takes = known.takes_keyed_held;
    }

    /// True when `source` is one of an earlier instance of the root at
    /// `index`: its index, another count of restarts.
    pub fn is_earlier_source(&self, index: usize, source: Source) -> bool {
        let current = self.source(index);
        current != 0 && source != current && source & 0b11_1111 == current & 0b11_1111
    }

    /// Asks the root for all its counters at the next exchange (from
    /// counter version 0), and has its next whole answer settle the
    /// in-flight counters it leaves out (see [`RootLink::ask_all`]): a
    /// reply then replaces in-flight levels taken here, so it must carry
    /// even a counter nobody changed meanwhile, and one it leaves out is
    /// empty there.
    pub fn ask_for_all_counters(&mut self) {
        self.counter_version = 0;
        self.ask_all = true;
    }

    /// Owes the root penalties started here, if it takes tiers (one that
    /// does not yet is sent every penalty held once it says it does).
    /// Past [`MAX_OWED_PENALTIES`] the list is dropped and the root is
    /// sent every penalty held instead.
    pub fn owe_penalties(&mut self, started: &[Penalty]) {
        if !self.takes_tiers || started.is_empty() {
            return;
        }
        if self.tiers.penalties.len() + started.len() > MAX_OWED_PENALTIES {
            self.tiers.penalties.clear();
            self.resend_penalties = true;
            return;
        }
        self.tiers.penalties.extend_from_slice(started);
    }

    /// Adds deltas to what the root is owed. Past `max_entries` distinct
    /// counters, entries that have leaked to nothing by `now` are dropped
    /// first, then new counters are (with a metric), so a root that stays
    /// dead does not grow memory without bound.
    pub fn owe(
        &mut self,
        deltas: impl Iterator<Item = (CounterKey, Owed)>,
        max_entries: usize,
        now: Nanos,
    ) {
        let mut pruned = false;
        for (id, owed) in deltas {
            // One lookup for the usual case: a map with room.
            let full = self.owed.len() >= max_entries;
            match self.owed.entry(id) {
                Entry::Occupied(mut e) => {
                    let combined = e.get().combine(owed);
                    e.insert(combined);
                    continue;
                }
                Entry::Vacant(e) if !full => {
                    e.insert(owed);
                    continue;
                }
                Entry::Vacant(_) => {}
            }
            if !pruned {
                // Once per call: a full map of live entries is not rescanned
                // for every new counter.
                self.owed.retain(|_, o| !o.spent(now));
                pruned = true;
            }
            if self.owed.len() >= max_entries {
                self.metrics.dropped_deltas += 1;
                continue;
            }
            self.owed.insert(id, owed);
        }
    }

    /// Takes back `spent`, the map of what a request carried (`used`
    /// entries), emptied by the reply, as the map the next cycle's deltas
    /// are owed in, when nothing was owed meanwhile: a cycle of 100k
    /// counters then fills a map of the right size instead of growing one
    /// from nothing. A map far larger than its last use is shrunk, so that
    /// one burst does not hold its memory forever.
    pub fn reuse_owed(&mut self, mut spent: OwedDeltas, used: usize) {
        if !self.owed.is_empty() || !spent.is_empty() || spent.capacity() <= self.owed.capacity() {
            return;
        }
        if spent.capacity() > 4 * used.max(1024) {
            spent.shrink_to(used);
        }
        self.owed = spent;
    }

    /// Records a successful exchange sent at `sent` and answered at
    /// `received` (local time) and takes the root's state from `reply`.
    pub fn succeeded(&mut self, sent: Nanos, received: Nanos, reply: &SyncResponse) {
        let rtt = received.saturating_sub(sent);
        let mid = sent + rtt / 2;
        let offset = reply.root_time as i64 - mid as i64;
        if reply.root_instance != self.root_instance {
            // Another instance (restarted, or another process behind the
            // URL) has another clock.
            self.samples.clear();
        } else if self.clock_stepped(rtt, offset) {
            // One of the two clocks stepped: the samples before tell of
            // clocks that are no more.
            self.samples.clear();
        }
        if self.samples.len() == OFFSET_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((rtt, offset));
        if reply.quotas_after != NO_QUOTAS {
            self.cursor = reply.quotas_after;
        }
        if reply.takes_tiers {
            // A root that restarted, or starts to take tiers, is sent
            // every penalty held: it may have lost some, or never had any.
            if reply.root_instance != self.root_instance || !self.takes_tiers {
                self.resend_penalties = true;
            }
            self.tiers.overrides_after = reply.tiers.overrides_after;
            self.tiers.penalty_version = reply.tiers.penalty_version;
        } else {
            self.tiers = TierRequest::default();
        }
        self.takes_tiers = reply.takes_tiers;
        self.penalties_sent.clear();
        self.counter_version = reply.counter_version;
        self.root_instance = reply.root_instance;
        self.takes_returns = reply.takes_returns;
        self.takes_sequence = reply.takes_sequence;
        self.takes_held = reply.takes_held;
        self.interest.succeeded(reply, received);
        self.failures = 0;
        self.skip = 0;
        self.metrics.up = true;
        self.metrics.last_success = received;
        self.metrics.syncs += 1;
        self.metrics.round_trip = rtt;
        self.metrics.clock_offset = self.offset();
        if let Some(utc) = reply.root_utc {
            // The root's UTC at its `root_time`, moved to local time.
            self.utc_offset = Some(utc - reply.root_time as i64 + self.offset());
        }
    }

    /// Records a failure. With `back_off` the root is next tried after
    /// capped exponential backoff (the next cycle, then every 2nd, 4th, up
    /// to every 8th); without, in the next cycle.
    pub fn failed(&mut self, back_off: bool, error: String) {
        let unsent = std::mem::take(&mut self.penalties_sent);
        self.tiers.penalties.extend(unsent);
        self.interest.failed();
        self.key_report.failed();
        self.failures = self.failures.saturating_add(1);
        self.skip = if back_off {
            (1u32 << self.failures.saturating_sub(1).min(3)) - 1
        } else {
            0
        };
        self.metrics.up = false;
        self.metrics.errors += 1;
        self.metrics.last_error = error;
    }

    /// True when a sample (`rtt`, `offset`) cannot be of the clocks the
    /// kept samples are of: the root read its clock within each round
    /// trip, so the true offset lies within half a round trip of each
    /// sample's, and two samples of the same clocks differ by at most half
    /// their round trips together ([`OFFSET_SLACK`] more for the coarse
    /// clock's ticks and drift). One that differs by more tells of a step
    /// (this host's monotonic clock, or the root's), which would otherwise
    /// stand until every sample before it had gone: up to
    /// [`OFFSET_SAMPLES`] syncs with every root value moved by the step.
    fn clock_stepped(&self, rtt: u64, offset: i64) -> bool {
        self.samples
            .iter()
            .min_by_key(|(rtt, _)| *rtt)
            .is_some_and(|&(best_rtt, best)| {
                let bound = (rtt.saturating_add(best_rtt) / 2).saturating_add(OFFSET_SLACK);
                offset.abs_diff(best) > bound
            })
    }

    /// Root time minus local time, from the quickest recent round trip.
    pub fn offset(&self) -> i64 {
        self.samples
            .iter()
            .min_by_key(|(rtt, _)| *rtt)
            .map_or(0, |&(_, off)| off)
    }

    /// The offset estimate with the round trip it comes from, for the
    /// root's overview; `None` before the first reply.
    pub fn clock_report(&self) -> Option<ClockReport> {
        self.samples
            .iter()
            .min_by_key(|(rtt, _)| *rtt)
            .map(|&(round_trip, offset)| ClockReport { offset, round_trip })
    }

    /// A root counter value in local time.
    pub fn to_local(&self, value: &CounterValue) -> Level {
        self.level_to_local(value.level, value.at)
    }

    /// A level at root time `at`, in local time.
    pub fn level_to_local(&self, level: f64, at: u64) -> Level {
        level_at_offset(self.offset(), level, at)
    }
}

/// A level at root time `at`, in local time, for the clock offset
/// `offset` ([`RootLink::offset`], which a reply's many counters look up
/// once).
pub fn level_at_offset(offset: i64, level: f64, at: u64) -> Level {
    let at = (at as i128 - i128::from(offset)).clamp(0, i128::from(u64::MAX));
    Level {
        level,
        at: at as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Counting;

    fn k(id: u64) -> CounterKey {
        CounterKey::named(id)
    }

    fn reply(root_time: u64, instance: u64) -> SyncResponse {
        SyncResponse {
            keyed: Vec::new(),
            root_instance: instance,
            root_time,
            quotas: vec![],
            quotas_after: QuotaCursor { epoch: 3, id: 0 },
            more_quotas: false,
            counters: vec![],
            counter_version: 9,
            root_utc: None,
            ..Default::default()
        }
    }

    #[test]
    fn the_offset_comes_from_the_quickest_round_trip() {
        let mut l = RootLink::new("r".into());
        // Sent at 1000, answered at 1100: midpoint 1050, root said 5050.
        l.succeeded(1000, 1100, &reply(5050, 1));
        assert_eq!(l.offset(), 4000);
        // A slow exchange with an asymmetric delay is ignored.
        l.succeeded(2000, 3000, &reply(6900, 1));
        assert_eq!(l.offset(), 4000);
        assert_eq!((l.cursor.epoch, l.counter_version), (3, 9));
        let v = CounterValue {
            id: 1,
            level: 2.0,
            at: 10_000,
            prev: 0.0,
        };
        assert_eq!(
            l.to_local(&v),
            Level {
                level: 2.0,
                at: 6000
            }
        );
    }

    #[test]
    fn a_new_root_instance_forgets_old_clock_samples() {
        let mut l = RootLink::new("r".into());
        l.succeeded(1000, 1010, &reply(5005, 1));
        l.succeeded(2000, 2100, &reply(102_050, 2));
        assert_eq!(l.offset(), 100_000);
    }

    #[test]
    fn a_clock_step_forgets_the_samples_taken_before_it() {
        const SEC: u64 = 1_000_000_000;
        const MS: u64 = 1_000_000;
        // The root's clock is 4 s ahead of real time: its reply of real
        // time `t` s and `us` microseconds.
        let root = |t: u64, us: u64| reply((t + 4) * SEC + us * 1000, 1);
        let mut l = RootLink::new("r".into());
        // A quick exchange, then a slower one of the same clocks: kept.
        l.succeeded(100 * SEC, 100 * SEC + MS, &root(100, 500));
        l.succeeded(101 * SEC, 101 * SEC + 40 * MS, &root(101, 30_000));
        assert_eq!(l.offset(), 4 * SEC as i64);
        // This host's clock stepped back 30 s: its next reply says the
        // root is 34 s ahead, and that is the offset at once (the quicker
        // sample before the step would have stood for 8 syncs).
        l.succeeded(72 * SEC, 72 * SEC + 10 * MS, &root(102, 5000));
        assert_eq!(l.offset(), 34 * SEC as i64);
        // Then forward 60 s: the root is 26 s behind.
        l.succeeded(133 * SEC, 133 * SEC + 10 * MS, &root(103, 5000));
        assert_eq!(l.offset(), -26 * SEC as i64);
        assert_eq!(l.restarts, 0, "no restart of the root");
    }

    #[test]
    fn failures_back_off_up_to_eight_intervals() {
        let mut l = RootLink::new("r".into());
        let skips: Vec<u32> = (0..6)
            .map(|_| {
                l.failed(true, "down".into());
                l.skip
            })
            .collect();
        assert_eq!(skips, vec![0, 1, 3, 7, 7, 7]);
        assert!(!l.metrics.up);
        l.failed(false, "down".into());
        assert_eq!(l.skip, 0);
        l.succeeded(0, 1, &reply(1, 1));
        assert_eq!((l.failures, l.skip), (0, 0));
    }

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn owed_deltas_accumulate_and_are_bounded() {
        let mut l = RootLink::new("r".into());
        let owe = |d| Owed::new(d, 0.0, 0);
        l.owe([(k(1), owe(5)), (k(2), owe(1))].into_iter(), 2, 0);
        l.owe([(k(1), owe(5)), (k(3), owe(7))].into_iter(), 2, 0);
        assert_eq!(l.owed[&k(1)].due(0), 10);
        assert_eq!(l.owed[&k(1)].weight, 10);
        assert!(!l.owed.contains_key(&k(3)));
        assert_eq!(l.metrics.dropped_deltas, 1);
    }

    #[test]
    fn slots_resent_to_a_restarted_root_net_against_returns_owed_beside_them() {
        // 4 slots resent, 2 given back since (slots it now counts): 2 to
        // add, nothing to give back, and no collected weight acknowledged.
        let back = |n| Owed::new(0, 0.0, 0).with_returned(n);
        let owed = Owed::resent(4, 0).combine(back(2));
        assert_eq!((owed.due(0), owed.due_returned(0)), (2, 0));
        assert_eq!((owed.weight, owed.counted_net()), (0, 2));
        // 1 resent, 3 given back: the root gets 2 returns, once.
        let owed = Owed::resent(1, 0).combine(back(3));
        assert_eq!((owed.due(0), owed.due_returned(0)), (0, 2));
        // A resend never leaks: slots are held until given back.
        assert_eq!(Owed::resent(4, 0).due(100 * SEC), 4);
    }

    #[test]
    fn owed_weight_leaks_at_the_limit_from_when_it_was_collected() {
        // 40 units at 10/s collected at 0, 5 more at 2 s: 20 + 5 left.
        let owed = Owed::new(40, 10.0, 0).combine(Owed::new(5, 10.0, 2 * SEC));
        assert_eq!(owed.due(2 * SEC), 25);
        assert_eq!(owed.weight, 45);
        // The order of combining does not matter.
        assert_eq!(
            Owed::new(5, 10.0, 2 * SEC).combine(Owed::new(40, 10.0, 0)),
            owed
        );
        // Fractions are rounded down and an old entry leaks to nothing.
        assert_eq!(Owed::new(3, 2.0, 0).due(SEC / 4), 2);
        assert_eq!(owed.due(10 * SEC), 0);
    }

    #[test]
    fn a_full_owed_map_drops_entries_that_leaked_away_before_new_ones() {
        let mut l = RootLink::new("r".into());
        l.owe([(k(1), Owed::new(5, 10.0, 0))].into_iter(), 1, 0);
        // At 1 s entry 1 is gone, so entry 2 fits.
        l.owe([(k(2), Owed::new(5, 10.0, SEC))].into_iter(), 1, SEC);
        assert_eq!(l.owed.keys().collect::<Vec<_>>(), vec![&k(2)]);
        assert_eq!(l.metrics.dropped_deltas, 0);
    }

    #[test]
    fn window_weight_is_owed_whole_until_the_window_after_its_own_ends() {
        use crate::core::{Window, WindowRule};
        let rule = WindowRule {
            window: Window::TenSeconds,
            sliding: false,
            utc_offset: 0,
        };
        let counting = Counting::Window(rule);
        let owed = Owed::collected(7, counting, 3 * SEC);
        assert_eq!(
            owed.window.map(|w| (w.index, w.expires)),
            Some((0, 20 * SEC))
        );
        assert_eq!(owed.due(19 * SEC), 7);
        assert_eq!(owed.due(20 * SEC), 0);
        // Found just after a boundary: the window before.
        assert_eq!(
            Owed::collected(1, counting, 10 * SEC + 1)
                .window
                .unwrap()
                .index,
            0
        );
        // Same window: added; another window: the newer one, all acknowledged.
        let more = owed.combine(Owed::collected(2, counting, 5 * SEC));
        assert_eq!((more.due(6 * SEC), more.weight), (9, 9));
        let next = owed.combine(Owed::collected(2, counting, 12 * SEC));
        assert_eq!(
            (next.due(12 * SEC), next.weight, next.window.unwrap().index),
            (2, 9, 1)
        );
    }

    #[test]
    fn a_reply_with_the_roots_utc_gives_the_utc_offset() {
        let mut l = RootLink::new("r".into());
        let mut r = reply(5050, 1);
        r.root_utc = Some(1_000_000);
        l.succeeded(1000, 1100, &r);
        // Root time 5050 is UTC 1e6 and local 1050: UTC = local + 994_000.
        assert_eq!(l.utc_offset, Some(1_000_000 - 5050 + 4000));
    }
}
