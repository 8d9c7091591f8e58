//! The request path: finding a quota by name, reading it and its
//! ancestors under their seqlocks, deciding, and counting a pass. Nothing
//! here takes the writer lock.
//!
//! Every plain or paced check, whatever its entry point (nginx's several
//! checks per request, the C ABI's one, the simulator's, a benchmark's by
//! slot), goes through one path, [`Table::decide_and_count`]: read each
//! item's chain, decide it with [`crate::core::check_chain`] (or pace it
//! with [`crate::core::reserve_wait`]), and only when every item passed
//! count each one (check all, then commit). The entry points differ only
//! in how they find a chain. A partial grant ([`Table::obtain`]) and a
//! one-item reservation ([`Table::reserve`]) have their own short paths
//! over the same chain reading ([`Table::resolve`]) and counting
//! ([`Table::commit`]).

use std::mem::MaybeUninit;
use std::sync::atomic::fence;

use super::keys::KeyOverflow;
use super::layout::{
    counting_rule, entry_matches, entry_parts, index_home, unpack_rate_prev, Slot, FLAG_LIVE,
    FLAG_PER_KEY, FLAG_SLIDING, FLAG_WINDOW_MASK, INDEX_EMPTY,
};
use super::names;
use super::{SlotId, Table, ACQ, READ_RETRIES, RLX};
use crate::core::counter::ceil_nanos;
use crate::core::estimate::Estimator;
use crate::core::key::KeyHash;
use crate::core::quota::{MAX_DEPTH, MAX_WEIGHT};
use crate::core::{
    check_chain, grantable, reserve_wait, tightest, ChainVerdict, Level, Nanos, QuotaSnapshot,
    Room, Wait,
};

/// Outcome of a check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// Every quota in the chain passed; the weight was counted.
    Pass,
    /// A quota of the chain rejected; nothing was counted.
    Reject(Rejection),
    /// No quota has this name: the request passes uncounted.
    Unknown,
    /// The quota is per-key and the check had no key (or an empty one):
    /// not checked, not counted.
    NoKey,
    /// The quota is per-key, its key found no entry in a full key section
    /// and the overflow mode is `pass`: not checked, not counted (see
    /// [`crate::table::KeyOverflow`]). Under the other modes an overflow
    /// passes or rejects like any check, with [`ManyOutcome::overflow`]
    /// set.
    KeyOverflow,
}

/// Details of a rejection, for status headers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rejection {
    /// Index in the chain of the quota that rejected (0: the named one).
    pub depth: usize,
    /// Slot of the quota that rejected (see [`Table::name_into`]).
    pub slot: SlotId,
    /// That quota's limit, units per second.
    pub limit: f64,
    /// When the request could pass, or why waiting cannot help.
    pub wait: Wait,
    /// The key's hash when the quota that rejected is a key's counter of a
    /// per-key template (`slot` is the template's); 0 otherwise.
    pub key: KeyHash,
}

/// What [`Table::obtain`] granted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grant {
    /// `Pass` when something was granted (and counted), `Reject` when
    /// nothing could be, `Unknown`/`NoKey` when the item was not checked.
    pub outcome: Outcome,
    /// Units granted and counted.
    pub granted: u64,
    /// The key found no entry: decided by the overflow mode.
    pub overflow: bool,
}

/// What [`Table::reserve`] decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reservation {
    /// `Pass` when the weight was counted (the caller waits `wait`, then
    /// acts), `Reject` when it was not, `Unknown`/`NoKey` when the item was
    /// not checked.
    pub outcome: Outcome,
    /// Nanoseconds to wait: on a pass before acting; on a rejection what
    /// the wait would have been ([`Nanos::MAX`]: waiting cannot help).
    pub wait: Nanos,
    /// The key found no entry: decided by the overflow mode.
    pub overflow: bool,
}

/// Most quotas one [`Table::check_many`] call checks.
pub const MAX_CHECKS: usize = 8;

/// One quota check of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckItem<'a> {
    /// The quota's name.
    pub name: &'a [u8],
    /// The key, for a per-key quota: its counter is the key's own (made on
    /// first use). `None` or an empty key checks a per-key quota not at
    /// all ([`Outcome::NoKey`]); a key given for a plain quota is ignored.
    pub key: Option<&'a [u8]>,
    /// Units counted if the request passes (0: check without counting;
    /// above [`MAX_WEIGHT`] counts as [`MAX_WEIGHT`]).
    pub weight: u64,
    /// Pace instead of checking: the item is counted now if the wait
    /// until its quotas have room for it ([`crate::core::reserve_wait`])
    /// is at most this many nanoseconds, and the request then waits that
    /// long ([`ManyOutcome::wait`]); otherwise it is rejected. `None`: a
    /// plain check (the burst band's draw decides).
    pub max_wait: Option<Nanos>,
}

/// How [`Table::check_many`] checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// A rejection is counted as a dry-run rejection (the caller lets the
    /// request through) instead of a rejection. Nothing is counted either
    /// way, as for a real rejection.
    pub dry_run: bool,
    /// Report the [`Headroom`] of the tightest quota (costs one more level
    /// estimate per quota in the chains; for rate-limit headers).
    pub headroom: bool,
}

/// How much room the tightest quota of a request has left, for the
/// `RateLimit` response headers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Headroom {
    /// Index of the item whose chain holds the quota.
    pub item: usize,
    /// Index of the quota in that chain (0: the named quota).
    pub depth: usize,
    /// Slot of the quota (see [`Table::name_into`]).
    pub slot: SlotId,
    /// Its room: the estimated level after this request (its weight
    /// included if it passed) against its limit and low burst.
    pub room: Room,
}

/// Outcome of [`Table::check_many`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ManyOutcome {
    /// `Pass` if every known quota passed (and was counted), `Reject` with
    /// the first rejection, `Unknown` if no name had a quota.
    pub outcome: Outcome,
    /// Index of the item that rejected; on a pass that must wait, the
    /// item whose wait is the longest (the first of equals).
    pub item: Option<usize>,
    /// With [`CheckOptions::headroom`]: on a pass the quota with the least
    /// room left, on a rejection the quota that rejected.
    pub headroom: Option<Headroom>,
    /// On a pass, nanoseconds the request must wait before it acts: the
    /// longest wait of its paced items (0 without any).
    pub wait: Nanos,
    /// Some item's key found no entry in a full key section: it was
    /// decided by the overflow mode (see [`crate::table::KeyOverflow`]).
    pub overflow: bool,
}

/// A quota and its ancestors as read for one check.
///
/// Only the first `len` views are initialised: a check reads one to three
/// of the eight, and the ~450 bytes of the array are never zeroed, copied
/// or returned (either showed as a third of a check's time).
struct Chain {
    views: [MaybeUninit<QuotaSnapshot>; MAX_DEPTH],
    slots: [SlotId; MAX_DEPTH],
    len: usize,
    /// The key entry + 1 whose counter stands first in the chain (the
    /// first view is the key's, the first slot its template's); 0: none.
    key: u32,
    /// That key's hash.
    key_hash: KeyHash,
    /// The chain's first quota is a per-key template read for a key that
    /// found no entry: its own counter stands for the key (overflow
    /// mode `shared`).
    overflow: bool,
}

/// What a passed check of [`Table::check_many`] will count: a chain's
/// slots and the weight.
#[derive(Clone, Copy)]
struct Charge {
    slots: [SlotId; MAX_DEPTH],
    len: usize,
    key: u32,
    key_hash: KeyHash,
    weight: u64,
}

/// What a check item's quota turned out to be.
enum Resolved {
    /// Read into the chain; count this weight if everything passes (paced
    /// with this longest wait, if any).
    Counted(u64, Option<Nanos>),
    /// No quota has the name.
    Unknown,
    /// A per-key quota checked without a key.
    NoKey,
    /// A key that found no entry, let through uncounted (overflow mode
    /// `pass`).
    OverflowPass,
    /// A key that found no entry, rejected (overflow mode `reject`).
    OverflowReject(Rejection),
}

/// What a check reads of a slot besides its view.
#[derive(Clone, Copy)]
pub(super) struct SlotRead {
    /// Its parent's slot.
    pub parent: Option<SlotId>,
    /// It is a per-key template.
    pub per_key: bool,
}

impl Chain {
    fn new() -> Self {
        Chain {
            views: [const { MaybeUninit::uninit() }; MAX_DEPTH],
            slots: [0; MAX_DEPTH],
            len: 0,
            key: 0,
            key_hash: 0,
            overflow: false,
        }
    }

    fn views(&self) -> &[QuotaSnapshot] {
        // SAFETY: `push` initialised the first `len` views, and
        // MaybeUninit<QuotaSnapshot> has QuotaSnapshot's layout.
        unsafe { std::slice::from_raw_parts(self.views.as_ptr().cast::<QuotaSnapshot>(), self.len) }
    }

    fn charge(&self, weight: u64) -> Charge {
        Charge {
            slots: self.slots,
            len: self.len,
            key: self.key,
            key_hash: self.key_hash,
            weight,
        }
    }

    /// The headroom of the quota at `depth`, `added` units on its level.
    fn headroom(
        &self,
        item: usize,
        depth: usize,
        added: f64,
        now: Nanos,
        e: &Estimator,
    ) -> Headroom {
        Headroom {
            item,
            depth,
            slot: self.slots[depth],
            room: Room::of(&self.views()[depth], added, now, e),
        }
    }

    /// The quota of this chain with the least room below its low burst
    /// once `added` units are counted.
    fn tightest(&self, item: usize, added: f64, now: Nanos, e: &Estimator) -> Headroom {
        let (depth, room) = tightest(self.views(), added, now, e);
        Headroom {
            item,
            depth,
            slot: self.slots[depth],
            room,
        }
    }

    #[inline]
    fn check(
        &self,
        weight: u64,
        now: Nanos,
        estimator: &Estimator,
        draw: impl FnMut() -> f64,
    ) -> Result<(), Rejection> {
        match check_chain(self.views(), weight as f64, now, estimator, draw) {
            ChainVerdict::Pass => Ok(()),
            ChainVerdict::Reject { at } => Err(self.rejection(at, weight, now, estimator)),
        }
    }

    /// Paces a request of `weight`: its wait in nanoseconds when that is at
    /// most `max_wait`, else the rejection (its `wait` what the wait would
    /// have been, or why there is none).
    fn pace(
        &self,
        weight: u64,
        max_wait: Nanos,
        now: Nanos,
        estimator: &Estimator,
    ) -> Result<Nanos, Rejection> {
        let views = self.views();
        let (depth, wait) = match reserve_wait(views, weight as f64, now, estimator) {
            Ok(seconds) => {
                let ns = ceil_nanos(seconds);
                if ns <= max_wait {
                    return Ok(ns);
                }
                let depth = tightest(views, weight as f64, now, estimator).0;
                (depth, Wait::Seconds(seconds))
            }
            Err(refused) => refused,
        };
        let mut rejection = self.rejection(depth, weight, now, estimator);
        rejection.wait = wait;
        Err(rejection)
    }

    /// The rejection of a request of `weight` by the quota at `depth`.
    fn rejection(&self, depth: usize, weight: u64, now: Nanos, estimator: &Estimator) -> Rejection {
        let room = Room::of(&self.views()[depth], 0.0, now, estimator);
        Rejection {
            depth,
            slot: self.slots[depth],
            limit: room.limit,
            wait: room.wait(weight as f64),
            key: if depth == 0 { self.key_hash } else { 0 },
        }
    }
}

impl Table {
    // ---- the request path ------------------------------------------------

    /// Finds the live slot named `name`.
    pub fn lookup(&self, name: &[u8]) -> Option<SlotId> {
        self.probe(name, |slot, name_at| {
            self.slot_is_named(slot, name_at, name).then_some(slot)
        })
    }

    /// Walks the index for `name`, calling `at_match` with the slot and
    /// name place of every entry whose tag matches, until it returns
    /// something.
    fn probe<T>(
        &self,
        name: &[u8],
        mut at_match: impl FnMut(SlotId, u32) -> Option<T>,
    ) -> Option<T> {
        let h = self.header();
        let index = self.index();
        let hash = names::hash(name);
        for _ in 0..READ_RETRIES {
            let seq = h.index_seq.load(ACQ);
            let mut pos = index_home(hash, index.len());
            for _ in 0..index.len() {
                let entry = index[pos].load(ACQ);
                if entry == INDEX_EMPTY {
                    break;
                }
                if entry_matches(entry, hash) {
                    let (slot, name_at) = entry_parts(entry);
                    if let Some(found) = at_match(slot, name_at) {
                        return Some(found);
                    }
                }
                pos = if pos + 1 == index.len() { 0 } else { pos + 1 };
            }
            // A miss is final unless the index was being rebuilt meanwhile.
            if seq & 1 == 0 && h.index_seq.load(ACQ) == seq {
                return None;
            }
            std::hint::spin_loop();
        }
        None
    }

    /// True when `slot` is live and named `name`, stored at `name_at`.
    /// The name's words and the slot are independent loads, so their cache
    /// misses overlap.
    fn slot_is_named(&self, slot: SlotId, name_at: u32, name: &[u8]) -> bool {
        let Some(s) = self.slot(slot) else {
            return false;
        };
        let Some(words) = names::name_words(self.arena(), name_at, name.len()) else {
            return false;
        };
        // The check will add to line B next: start fetching it now, beside
        // line A and the name, instead of after them.
        prefetch_for_write(&s.pending);
        for _ in 0..READ_RETRIES {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let same = names::equals(words, name)
                    && s.flags.load(RLX) & FLAG_LIVE != 0
                    && s.name_len.load(RLX) as usize == name.len()
                    && s.name_at.load(RLX) == name_at;
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    return same;
                }
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Reads one slot's quota numbers and cluster state consistently,
    /// plus its parent; `None` if it is not live or never stabilised.
    pub(super) fn read_view(&self, slot: SlotId) -> Option<(QuotaSnapshot, Option<SlotId>)> {
        let mut view = MaybeUninit::uninit();
        let read = self.read_view_into(slot, |_| true, &mut view)?;
        // SAFETY: `read_view_into` wrote the view when it returned `Some`.
        Some((unsafe { view.assume_init() }, read.parent))
    }

    /// [`Table::read_view`] of the slot named `name` (stored at
    /// `name_at`) into `out`, comparing the name in the same seqlock read:
    /// the check path's first quota costs one read of the slot, not two.
    fn read_named_into(
        &self,
        slot: SlotId,
        name_at: u32,
        name: &[u8],
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<SlotRead> {
        let words = names::name_words(self.arena(), name_at, name.len())?;
        // The check will add to line B next: start fetching it now, beside
        // line A and the name, instead of after them.
        prefetch_for_write(&self.slot(slot)?.pending);
        self.read_view_into(
            slot,
            |s| {
                names::equals(words, name)
                    && s.name_len.load(RLX) as usize == name.len()
                    && s.name_at.load(RLX) == name_at
            },
            out,
        )
    }

    /// Reads a slot's view under its seqlock into `out` (where a check's
    /// chain keeps it: no copy) if `matches` holds in the same read; `out`
    /// is written when `Some` is returned.
    #[inline(always)]
    fn read_view_into(
        &self,
        slot: SlotId,
        matches: impl Fn(&Slot) -> bool,
        out: &mut MaybeUninit<QuotaSnapshot>,
    ) -> Option<SlotRead> {
        let s = self.slot(slot)?;
        for _ in 0..READ_RETRIES {
            let seq = s.seq.load(ACQ);
            if seq & 1 == 0 {
                let flags = s.flags.load(RLX);
                let live = flags & FLAG_LIVE != 0 && matches(s);
                let parent = s.parent.load(RLX);
                let fill = s.fill_rate.load(RLX);
                let mut view = QuotaSnapshot {
                    limit: f64::from_bits(s.limit.load(RLX)),
                    low_burst: f64::from_bits(s.low_burst.load(RLX)),
                    high_burst: f64::from_bits(s.high_burst.load(RLX)),
                    known: Level {
                        level: f64::from_bits(s.known_level.load(RLX)),
                        at: s.known_at.load(RLX),
                    },
                    fill_rate: f64::from_bits(fill),
                    own_recent: 0.0,
                    window: None,
                    prev: 0.0,
                };
                if flags & (FLAG_WINDOW_MASK | FLAG_SLIDING) != 0 {
                    self.window_view(&mut view, flags, fill);
                }
                fence(ACQ);
                if s.seq.load(RLX) == seq {
                    if !live {
                        return None;
                    }
                    // Deltas are plain counters outside the seqlock: a
                    // check reads them after the quota, and the collector
                    // moves weight so that it is never absent from both.
                    view.own_recent = (s.pending.load(RLX) + s.inflight.load(RLX)) as f64;
                    out.write(view);
                    return Some(SlotRead {
                        parent: parent.checked_sub(1),
                        per_key: flags & FLAG_PER_KEY != 0,
                    });
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Completes the view of a window quota's slot: its rule, and for a
    /// sliding window the rate and previous count packed in `fill`.
    #[cold]
    fn window_view(&self, view: &mut QuotaSnapshot, flags: u16, fill: u64) {
        view.window = counting_rule(flags, self.utc_offset());
        if flags & FLAG_SLIDING != 0 {
            (view.fill_rate, view.prev) = unpack_rate_prev(fill);
        }
    }

    /// Checks `name` for a request of `weight` at `now`, drawing from this
    /// thread's PRNG; on pass the weight is counted in the whole chain.
    pub fn check(&self, name: &[u8], weight: u64, now: Nanos) -> Outcome {
        self.check_with(name, weight, now, crate::core::rng::thread_unit)
    }

    /// [`Table::check`] with the random draws supplied (for tests and the
    /// simulator).
    pub fn check_with(
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
    pub fn check_slot(
        &self,
        first: SlotId,
        weight: u64,
        now: Nanos,
        draw: impl FnMut() -> f64,
    ) -> Outcome {
        let read = |_, chain: &mut Chain| {
            if self.read_chain(first, chain) {
                Resolved::Counted(weight, None)
            } else {
                Resolved::Unknown
            }
        };
        self.decide_and_count(1, read, now, CheckOptions::default(), draw)
            .outcome
    }

    /// Checks several quotas for one request (several `sluice` directives
    /// in one nginx location): the request passes only if every known quota
    /// and all their ancestors pass, and only then is each weight counted
    /// (check all, then commit). Unknown names are skipped. At most
    /// [`MAX_CHECKS`] items are checked; later ones are ignored.
    pub fn check_many(
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
        let read = |i: usize, chain: &mut Chain| self.resolve(&items[i], chain, now);
        self.decide_and_count(items.len(), read, now, options, draw)
    }

    /// [`Table::check_many`] of one plain item without headroom (the C
    /// ABI's checks, nginx's single `sluice` directive without headers):
    /// the same reading, decision and counting, without the bookkeeping
    /// of several items (a fifth of a hot keyed check's instructions).
    fn check_one(
        &self,
        item: &CheckItem,
        now: Nanos,
        dry_run: bool,
        draw: impl FnMut() -> f64,
    ) -> ManyOutcome {
        let mut chain = Chain::new();
        let outcome = |outcome, item| ManyOutcome {
            outcome,
            item,
            headroom: None,
            wait: 0,
            overflow: false,
        };
        let weight = match self.resolve_counted(item, &mut chain, now, dry_run) {
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
                self.commit(&chain.slots[..chain.len], chain.key, chain.key_hash, weight);
                ManyOutcome {
                    overflow,
                    ..outcome(Outcome::Pass, None)
                }
            }
            Err(rejection) => {
                self.count_rejected(&chain, dry_run);
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
        // Passed items but the last are kept as charges; the last one is
        // still in `chain` (`last`), so a request of one check copies
        // nothing.
        let mut charges = [MaybeUninit::<Charge>::uninit(); MAX_CHECKS];
        let mut known = 0;
        let mut last: Option<u64> = None;
        let mut keyless = false;
        let mut overflow = false;
        let mut headroom: Option<Headroom> = None;
        let mut wait: Nanos = 0;
        let mut wait_item: Option<usize> = None;
        let mut chain = Chain::new();
        for i in 0..items.min(MAX_CHECKS) {
            if let Some(weight) = last.take() {
                charges[known].write(chain.charge(weight));
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
                    self.count_rejected(&chain, options.dry_run);
                    let headroom = options
                        .headroom
                        .then(|| chain.headroom(i, 0, 0.0, now, &estimator));
                    return ManyOutcome {
                        outcome: Outcome::Reject(rejection),
                        item: Some(i),
                        headroom,
                        wait: 0,
                        overflow: true,
                    };
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
            if let Err(rejection) = decided {
                self.count_rejected(&chain, options.dry_run);
                let headroom = options
                    .headroom
                    .then(|| chain.headroom(i, rejection.depth, 0.0, now, &estimator));
                return ManyOutcome {
                    outcome: Outcome::Reject(rejection),
                    item: Some(i),
                    headroom,
                    wait: 0,
                    overflow,
                };
            }
            if options.headroom {
                let h = chain.tightest(i, weight as f64, now, &estimator);
                if headroom.is_none_or(|best| h.room.slack() < best.room.slack()) {
                    headroom = Some(h);
                }
            }
            last = Some(weight);
        }
        for charge in &charges[..known] {
            // SAFETY: the loop above wrote the first `known` charges.
            let charge = unsafe { charge.assume_init_ref() };
            let counted = &charge.slots[..charge.len];
            self.commit(counted, charge.key, charge.key_hash, charge.weight);
        }
        let outcome = match last {
            Some(weight) => {
                self.commit(&chain.slots[..chain.len], chain.key, chain.key_hash, weight);
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

    /// A partial grant: counts and returns the most units, up to
    /// `item.weight`, that the quota (or key) and all its ancestors allow
    /// with certainty now ([`crate::core::grantable`]). Granting nothing
    /// (asking for nothing, too) is a rejection (counted as one, with
    /// nothing added); an unknown
    /// name or a keyless check of a per-key quota grant nothing and say
    /// so.
    pub fn obtain(&self, item: &CheckItem, now: Nanos) -> Grant {
        let estimator = self.estimator();
        let mut chain = Chain::new();
        let want = match self.resolve_counted(item, &mut chain, now, false) {
            Ok(want) => want,
            Err(outcome) => {
                return Grant {
                    outcome,
                    granted: 0,
                    overflow: chain.overflow,
                }
            }
        };
        let (granted, depth) = grantable(chain.views(), want as f64, now, &estimator);
        if granted >= 1.0 {
            let granted = granted as u64;
            self.commit(
                &chain.slots[..chain.len],
                chain.key,
                chain.key_hash,
                granted,
            );
            return Grant {
                outcome: Outcome::Pass,
                granted,
                overflow: chain.overflow,
            };
        }
        let rejection = chain.rejection(depth, 1, now, &estimator);
        self.count_rejected(&chain, false);
        Grant {
            outcome: Outcome::Reject(rejection),
            granted: 0,
            overflow: chain.overflow,
        }
    }

    /// Pacing: counts `item.weight` now and says how long the caller must
    /// wait before acting so that the quota (or key) and its ancestors
    /// stay at their rates fleet-wide ([`crate::core::reserve_wait`]):
    /// GCRA's theoretical arrival time on the estimated cluster level.
    /// When the wait would exceed `max_wait` nanoseconds, or cannot end
    /// (a weight above a `high_burst`; a full window quota, whose next
    /// window cannot be taken in advance), nothing is counted and the
    /// rejection says how long it would have been.
    /// (The one-item case of [`Table::check_many`] with `max_wait`, on its
    /// own path as [`Table::obtain`] is: the general path's bookkeeping
    /// for several items cost a reservation a fifth of its time.)
    pub fn reserve(&self, item: &CheckItem, max_wait: Nanos, now: Nanos) -> Reservation {
        let estimator = self.estimator();
        let mut chain = Chain::new();
        let weight = match self.resolve_counted(item, &mut chain, now, false) {
            Ok(weight) => weight,
            Err(outcome) => {
                return Reservation {
                    outcome,
                    wait: rejection_wait(outcome),
                    overflow: chain.overflow,
                }
            }
        };
        match chain.pace(weight, max_wait, now, &estimator) {
            Ok(wait) => {
                self.commit(&chain.slots[..chain.len], chain.key, chain.key_hash, weight);
                Reservation {
                    outcome: Outcome::Pass,
                    wait,
                    overflow: chain.overflow,
                }
            }
            Err(rejection) => {
                self.count_rejected(&chain, false);
                let outcome = Outcome::Reject(rejection);
                Reservation {
                    outcome,
                    wait: rejection_wait(outcome),
                    overflow: chain.overflow,
                }
            }
        }
    }

    /// Resolves a single item for [`Table::obtain`] and
    /// [`Table::reserve`]: its weight (capped at [`MAX_WEIGHT`]) with its
    /// chain read, or the outcome of an item that is not checked or is
    /// rejected before any decision (counted as [`Table::check_many`]
    /// counts it; `chain.overflow` set for a key that found no entry).
    fn resolve_counted(
        &self,
        item: &CheckItem,
        chain: &mut Chain,
        now: Nanos,
        dry_run: bool,
    ) -> Result<u64, Outcome> {
        match self.resolve(item, chain, now) {
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
            Resolved::OverflowReject(rejection) => {
                self.count_rejected(chain, dry_run);
                Err(Outcome::Reject(rejection))
            }
        }
    }

    /// Counts a rejection (or a dry-run one) on the chain's first quota.
    fn count_rejected(&self, chain: &Chain, dry_run: bool) {
        let first = &self.slots()[chain.slots[0] as usize];
        if dry_run {
            first.dry_run.fetch_add(1, RLX);
        } else {
            first.rejected.fetch_add(1, RLX);
        }
    }

    /// Reads the quota `item` names (or, for a per-key quota, the key's
    /// counter under the template's numbers) and its ancestors into
    /// `chain`.
    fn resolve(&self, item: &CheckItem, chain: &mut Chain, now: Nanos) -> Resolved {
        // The quota is read straight into the chain's first view.
        let first = &mut chain.views[0];
        let found = self.probe(item.name, |slot, name_at| {
            self.read_named_into(slot, name_at, item.name, first)
                .map(|read| (slot, read))
        });
        let Some((slot, read)) = found else {
            return Resolved::Unknown;
        };
        chain.slots[0] = slot;
        chain.len = 1;
        chain.key = 0;
        chain.key_hash = 0;
        chain.overflow = false;
        if read.per_key {
            let Some(key) = item.key.filter(|k| !k.is_empty()) else {
                return Resolved::NoKey;
            };
            let hash = self.key_secret().hash(key);
            // SAFETY: the probe above wrote the first view.
            let view = unsafe { chain.views[0].assume_init_mut() };
            match self.use_key(slot, hash, now) {
                Ok(at) if self.key_into(at, view, now) => {
                    chain.key = at + 1;
                    chain.key_hash = hash;
                }
                _ => {
                    chain.overflow = true;
                    match self.key_overflow() {
                        KeyOverflow::Shared => {}
                        KeyOverflow::Pass => return Resolved::OverflowPass,
                        KeyOverflow::Reject => {
                            chain.key_hash = hash;
                            return Resolved::OverflowReject(Rejection {
                                depth: 0,
                                slot,
                                limit: view.limit,
                                wait: Wait::Seconds(KEY_OVERFLOW_RETRY_SECS),
                                key: hash,
                            });
                        }
                    }
                }
            }
        }
        self.read_ancestors(read.parent, chain);
        Resolved::Counted(item.weight, item.max_wait)
    }

    /// Reads a quota and its ancestors into `chain`; false if the quota
    /// itself is gone.
    fn read_chain(&self, first: SlotId, chain: &mut Chain) -> bool {
        chain.len = 0;
        self.read_ancestors(Some(first), chain);
        chain.len > 0
    }

    /// Appends `next` and its ancestors to `chain`, up to [`MAX_DEPTH`]
    /// quotas; an ancestor that vanished ends it.
    // Inlined into `resolve`, as before the table was split: a call here
    // cost a hot check ~1 ns (criterion A/B).
    #[inline(always)]
    fn read_ancestors(&self, next: Option<SlotId>, chain: &mut Chain) {
        let mut cur = next;
        while let Some(slot) = cur {
            if chain.len == MAX_DEPTH {
                break;
            }
            let Some(read) = self.read_view_into(slot, |_| true, &mut chain.views[chain.len])
            else {
                break;
            };
            chain.slots[chain.len] = slot;
            chain.len += 1;
            cur = read.parent;
        }
    }

    /// Counts a passed check: the weight into every counter of the chain
    /// (the key's instead of its template's, for a keyed check), the pass
    /// on the first quota.
    fn commit(&self, chain: &[SlotId], key: u32, key_hash: KeyHash, weight: u64) {
        let slots = self.slots();
        let counters = if key != 0 {
            self.count_key(key - 1, chain[0], key_hash, weight);
            &chain[1..]
        } else {
            chain
        };
        if weight > 0 {
            for &s in counters {
                slots[s as usize].pending.fetch_add(weight, RLX);
            }
        }
        slots[chain[0] as usize].passed.fetch_add(1, RLX);
    }
}

/// Seconds a check rejected for lack of room in the key section (overflow
/// mode `reject`) is told to wait: entries free as keys drain, and a
/// sync cycle is about this long.
const KEY_OVERFLOW_RETRY_SECS: f64 = 1.0;

/// The wait [`Reservation::wait`] reports for an outcome that is not a
/// pass: the rejection's, or none.
fn rejection_wait(outcome: Outcome) -> Nanos {
    match outcome {
        Outcome::Reject(Rejection {
            wait: Wait::Seconds(seconds),
            ..
        }) => ceil_nanos(seconds),
        Outcome::Reject(_) => Nanos::MAX,
        _ => 0,
    }
}

/// Hints the CPU to fetch the cache line holding `at` for writing.
#[inline(always)]
fn prefetch_for_write<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults and reads nothing
    // visible to the program. SSE is baseline on x86_64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(
            (at as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
