//! What a root holds of tiers per key: the overrides loaded from the
//! database, and the penalties limiters started.
//!
//! - **Overrides** are kept like quotas ([`super::quota_book`]): by
//!   `(quota, key)` for the admin API, and by `(epoch, id)` as the change
//!   log limiters page through with their own cursor.
//! - **Penalties** are max-registers, "barred until `t`" per `(quota,
//!   key)`: a limiter that starts one sends it with its next sync, the
//!   root keeps the latest end it heard of, and answers every penalty
//!   changed since a limiter's penalty version, so each limiter learns of
//!   it within one sync interval. They live in memory only, like
//!   counters: a restarted root learns them again from the limiters that
//!   still hold them (every limiter resends the penalties it holds to a
//!   root of a new instance). What a limiter may claim is bounded
//!   ([`PenaltyBook::admit`]): a live quota with a penalty, no longer
//!   than the penalty from now, at most [`MAX_PENALTIES`] at once; when
//!   that many are held, the one ending soonest gives way to one that
//!   ends later (it is evicted), and one that would end no later is
//!   refused. `/metrics` counts both.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::core::key::KeyHash;
use crate::core::tier::{Override, Penalty};
use crate::core::Quota;
use crate::wire::QuotaCursor;

use super::store::OverrideRow;

/// Most penalties a root holds at once: one more takes the place of the
/// one ending soonest, or is refused (see [`PenaltyBook::admit`]).
pub const MAX_PENALTIES: usize = 1_000_000;

/// How far past `now + penalty` a claimed end may lie (clock skew between
/// a limiter and its roots): further is cut to it.
pub const PENALTY_SLACK_NS: i64 = 60_000_000_000;

/// One page of the overrides' change log.
#[derive(Clone, Debug, Default)]
pub struct OverridePage {
    /// Overrides after the requested cursor, in `(epoch, id)` order.
    pub overrides: Vec<Override>,
    /// Cursor after the last one of the page (the requested one when the
    /// page is empty).
    pub after: QuotaCursor,
    /// More follow the page.
    pub more: bool,
}

/// The overrides a root loaded, tombstones included.
#[derive(Debug, Default)]
pub struct OverrideBook {
    /// By `(quota, key)`, live and tombstones.
    by_key: BTreeMap<(u64, KeyHash), Arc<OverrideRow>>,
    /// By `(epoch, id)`: the change log.
    log: BTreeMap<(u64, u64), Arc<OverrideRow>>,
    /// Live overrides per quota.
    live: FxHashMap<u64, usize>,
    /// Live overrides that expire, by `(expiry, quota, key)`.
    expiring: BTreeSet<(i64, u64, KeyHash)>,
    /// Position of the last row loaded.
    cursor: QuotaCursor,
}

impl OverrideBook {
    /// Stores an override read from the database; false when the book
    /// already held this or a newer version.
    pub fn load(&mut self, row: OverrideRow) -> bool {
        let place = (row.ov.quota, row.ov.key);
        let position = QuotaCursor {
            epoch: row.ov.epoch,
            id: row.ov.id,
        };
        self.cursor = self.cursor.max(position);
        if let Some(old) = self.by_key.get(&place) {
            if old.ov.epoch >= row.ov.epoch {
                return false;
            }
            let old = Arc::clone(old);
            self.log.remove(&(old.ov.epoch, old.ov.id));
            self.forget_live(&old);
        }
        let row = Arc::new(row);
        if !row.ov.deleted {
            *self.live.entry(place.0).or_default() += 1;
            if let Some(at) = row.ov.expires_ms {
                self.expiring.insert((at, place.0, place.1));
            }
        }
        self.log.insert((row.ov.epoch, row.ov.id), Arc::clone(&row));
        self.by_key.insert(place, row);
        true
    }

    fn forget_live(&mut self, old: &OverrideRow) {
        if old.ov.deleted {
            return;
        }
        if let Some(n) = self.live.get_mut(&old.ov.quota) {
            *n -= 1;
            if *n == 0 {
                self.live.remove(&old.ov.quota);
            }
        }
        if let Some(at) = old.ov.expires_ms {
            self.expiring.remove(&(at, old.ov.quota, old.ov.key));
        }
    }

    /// Position of the last row loaded: where the next reload starts.
    pub fn cursor(&self) -> QuotaCursor {
        self.cursor
    }

    /// Up to `max` overrides after `after`, in `(epoch, id)` order.
    pub fn page_after(&self, after: QuotaCursor, max: usize) -> OverridePage {
        let range = (Bound::Excluded((after.epoch, after.id)), Bound::Unbounded);
        let mut entries = self.log.range(range);
        let overrides: Vec<Override> = entries
            .by_ref()
            .take(max)
            .map(|(_, row)| row.ov.clone())
            .collect();
        let more = entries.next().is_some();
        let after = overrides.last().map_or(after, |o| QuotaCursor {
            epoch: o.epoch,
            id: o.id,
        });
        OverridePage {
            overrides,
            after,
            more,
        }
    }

    /// The live override of `key` on `quota`.
    pub fn get(&self, quota: u64, key: KeyHash) -> Option<&Arc<OverrideRow>> {
        self.by_key.get(&(quota, key)).filter(|row| !row.ov.deleted)
    }

    /// Live overrides of `quota` after the key `after`, in key order, at
    /// most `max`; the flag says whether more follow.
    pub fn list(&self, quota: u64, after: KeyHash, max: usize) -> (Vec<Arc<OverrideRow>>, bool) {
        let range = (
            Bound::Excluded((quota, after)),
            Bound::Included((quota, u64::MAX)),
        );
        let mut live = self
            .by_key
            .range(range)
            .map(|(_, row)| row)
            .filter(|row| !row.ov.deleted);
        let page: Vec<Arc<OverrideRow>> = live.by_ref().take(max).cloned().collect();
        (page, live.next().is_some())
    }

    /// Live overrides of `quota`.
    pub fn count(&self, quota: u64) -> usize {
        self.live.get(&quota).copied().unwrap_or(0)
    }

    /// Live overrides per quota (quotas without any left out).
    pub fn counts(&self) -> FxHashMap<u64, usize> {
        self.live.clone()
    }

    /// Live overrides in all.
    pub fn total(&self) -> usize {
        self.live.values().sum()
    }

    /// The earliest expiry of a live override, Unix milliseconds.
    pub fn next_expiry(&self) -> Option<i64> {
        self.expiring.first().map(|&(at, _, _)| at)
    }
}

/// Where one penalty stands at the root: its end, and the version that
/// last moved it (a register of the book, not a request's slot of an
/// in-flight quota).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PenaltyEnd {
    /// End, UTC nanoseconds.
    until: i64,
    /// The book's version when it last moved later.
    version: u64,
}

/// Why [`PenaltyBook::admit`] refused a penalty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PenaltyRefusal {
    /// No live quota of that id has a penalty, or the key does not fit
    /// its kind (a key of a plain quota, none of a per-key one).
    NoPenalty,
    /// It ended already.
    Ended,
    /// The book is full of penalties that end no sooner.
    Full,
}

impl PenaltyRefusal {
    /// Every reason, in counting order.
    pub const ALL: [Self; 3] = [Self::NoPenalty, Self::Ended, Self::Full];

    /// Its `reason` label on `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoPenalty => "no_penalty",
            Self::Ended => "ended",
            Self::Full => "full",
        }
    }
}

/// What `/metrics` shows of the penalties a root holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PenaltyStats {
    /// Penalties held (some may have ended since the last sweep).
    pub held: usize,
    /// Penalties started (first heard of) since the root started.
    pub started: u64,
    /// Penalties refused, by [`PenaltyRefusal`].
    pub refused: [u64; 3],
    /// Penalties evicted to make room for one ending later.
    pub evicted: u64,
}

/// The penalties a root holds: max-registers with a version each.
#[derive(Debug)]
pub struct PenaltyBook {
    /// By `(quota, key)`.
    ends: FxHashMap<(u64, KeyHash), PenaltyEnd>,
    /// By `(end, quota, key)`: which ends soonest.
    by_end: BTreeSet<(i64, u64, KeyHash)>,
    /// By version: the change log limiters read after their version.
    log: BTreeMap<u64, (u64, KeyHash)>,
    /// Last version handed out.
    version: u64,
    /// Most penalties held at once.
    max: usize,
    /// Penalties started (first heard of) since the root started.
    pub started: u64,
    /// Penalties refused, by [`PenaltyRefusal`] (no penalty, ended, full).
    pub refused: [u64; 3],
    /// Penalties evicted to make room for one ending later.
    pub evicted: u64,
}

impl Default for PenaltyBook {
    fn default() -> Self {
        Self::with_max(MAX_PENALTIES)
    }
}

impl PenaltyBook {
    /// An empty book holding at most `max` penalties.
    pub fn with_max(max: usize) -> Self {
        Self {
            ends: FxHashMap::default(),
            by_end: BTreeSet::new(),
            log: BTreeMap::new(),
            version: 0,
            max,
            started: 0,
            refused: [0; 3],
            evicted: 0,
        }
    }

    /// What `/metrics` shows.
    pub fn stats(&self) -> PenaltyStats {
        PenaltyStats {
            held: self.ends.len(),
            started: self.started,
            refused: self.refused,
            evicted: self.evicted,
        }
    }

    /// Takes a penalty a limiter sent at root time `now_utc` (UTC
    /// nanoseconds), for `quota` as the root holds it: its end cut to
    /// `now + penalty + slack`; kept if later than the one held. A new
    /// one in a full book takes the place of the one ending soonest if it
    /// ends later, and is refused otherwise. Returns whether it moved the
    /// end later.
    pub fn admit(
        &mut self,
        penalty: Penalty,
        quota: Option<&Quota>,
        now_utc: i64,
    ) -> Result<bool, PenaltyRefusal> {
        let refuse = |book: &mut Self, why: PenaltyRefusal| {
            book.refused[why as usize] += 1;
            Err(why)
        };
        let Some(length) = quota
            .filter(|q| !q.deleted && q.per_key == (penalty.key() != 0))
            .and_then(|q| q.penalty)
        else {
            return refuse(self, PenaltyRefusal::NoPenalty);
        };
        let latest = now_utc.saturating_add(length.nanos() as i64 + PENALTY_SLACK_NS);
        let until = penalty.until().min(latest);
        if until <= now_utc {
            return refuse(self, PenaltyRefusal::Ended);
        }
        let place = (penalty.quota(), penalty.key());
        match self.ends.get(&place) {
            Some(end) if end.until >= until => return Ok(false),
            Some(_) => {}
            None if self.ends.len() >= self.max => {
                match self.by_end.first() {
                    Some(&(soonest, quota, key)) if soonest < until => {
                        self.remove((quota, key));
                        self.evicted += 1;
                    }
                    _ => return refuse(self, PenaltyRefusal::Full),
                }
                self.started += 1;
            }
            None => self.started += 1,
        }
        self.version += 1;
        if let Some(old) = self.ends.insert(
            place,
            PenaltyEnd {
                until,
                version: self.version,
            },
        ) {
            self.log.remove(&old.version);
            self.by_end.remove(&(old.until, place.0, place.1));
        }
        self.log.insert(self.version, place);
        self.by_end.insert((until, place.0, place.1));
        Ok(true)
    }

    /// Drops the penalty at `place` from every index.
    fn remove(&mut self, place: (u64, KeyHash)) {
        if let Some(end) = self.ends.remove(&place) {
            self.log.remove(&end.version);
            self.by_end.remove(&(end.until, place.0, place.1));
        }
    }

    /// The penalties that moved since `version` and have not ended at
    /// `now_utc`, with the version to ask from next time.
    pub fn changed_since(&self, version: u64, now_utc: i64) -> (Vec<Penalty>, u64) {
        let changed = self
            .log
            .range((Bound::Excluded(version), Bound::Unbounded))
            .filter_map(|(_, &place)| {
                let end = self.ends.get(&place)?;
                (end.until > now_utc).then_some(Penalty(place.0, place.1, end.until))
            })
            .collect();
        (changed, self.version)
    }

    /// Last version handed out.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Forgets penalties that ended by `now_utc`, and those of `gone`
    /// quotas (deleted, or without a penalty now).
    pub fn forget_ended(&mut self, now_utc: i64, mut gone: impl FnMut(u64) -> bool) {
        let (log, by_end) = (&mut self.log, &mut self.by_end);
        self.ends.retain(|&(quota, key), end| {
            let keep = end.until > now_utc && !gone(quota);
            if !keep {
                log.remove(&end.version);
                by_end.remove(&(end.until, quota, key));
            }
            keep
        });
    }

    /// Penalties in force at `now_utc`, `(quota, key, until)`, latest end
    /// first, at most `max`.
    pub fn active(&self, now_utc: i64, max: usize) -> Vec<Penalty> {
        let mut all: Vec<Penalty> = self
            .ends
            .iter()
            .filter(|(_, end)| end.until > now_utc)
            .map(|(&(quota, key), end)| Penalty(quota, key, end.until))
            .collect();
        all.sort_by(|a, b| {
            b.until()
                .cmp(&a.until())
                .then(a.0.cmp(&b.0))
                .then(a.1.cmp(&b.1))
        });
        all.truncate(max);
        all
    }

    /// Penalties in force at `now_utc` per quota.
    pub fn counts(&self, now_utc: i64) -> FxHashMap<u64, usize> {
        let mut counts = FxHashMap::default();
        for (&(quota, _), end) in &self.ends {
            if end.until > now_utc {
                *counts.entry(quota).or_default() += 1;
            }
        }
        counts
    }

    /// Penalties held (some may have ended since the last sweep).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tier::{PenaltyTime, Rule};

    const SEC: i64 = 1_000_000_000;

    fn row(id: u64, quota: u64, key: u64, epoch: u64, deleted: bool) -> OverrideRow {
        OverrideRow {
            ov: Override {
                id,
                quota,
                key,
                rule: Rule::Deny,
                expires_ms: (key == 9).then_some(5_000),
                epoch,
                deleted,
            },
            note: None,
            updated_ms: 0,
        }
    }

    #[test]
    fn overrides_page_by_epoch_and_list_by_key() {
        let mut book = OverrideBook::default();
        assert!(book.load(row(1, 7, 3, 1, false)));
        assert!(book.load(row(2, 7, 9, 2, false)));
        assert!(book.load(row(3, 8, 1, 3, false)));
        assert!(!book.load(row(1, 7, 3, 1, false)), "a version seen");
        assert!(book.load(row(1, 7, 3, 4, true)), "removed at epoch 4");
        assert_eq!((book.count(7), book.count(8), book.total()), (1, 1, 2));
        assert_eq!(book.next_expiry(), Some(5_000));
        let page = book.page_after(QuotaCursor { epoch: 1, id: 1 }, 2);
        let ids: Vec<u64> = page.overrides.iter().map(|o| o.id).collect();
        assert_eq!((ids, page.more), (vec![2, 3], true));
        let last = book.page_after(page.after, 2);
        assert!(last.overrides[0].deleted && !last.more);
        let (listed, more) = book.list(7, 0, 10);
        assert_eq!(listed.iter().map(|r| r.ov.key).collect::<Vec<_>>(), [9]);
        assert!(!more);
        assert!(book.get(7, 3).is_none());
        assert_eq!(book.cursor(), QuotaCursor { epoch: 4, id: 1 });
    }

    fn penalized(id: u64, per_key: bool) -> Quota {
        Quota::new(id, "q", 1.0, 1.0, 1.0)
            .keyed_if(per_key)
            .penalized(Some(PenaltyTime::from_secs(60).unwrap()))
    }

    #[test]
    fn a_penalty_keeps_the_latest_end_and_travels_by_version() {
        let mut book = PenaltyBook::default();
        let q = penalized(1, true);
        let now = 1000 * SEC;
        assert_eq!(
            book.admit(Penalty(1, 5, now + 30 * SEC), Some(&q), now),
            Ok(true)
        );
        assert_eq!(
            book.admit(Penalty(1, 5, now + 10 * SEC), Some(&q), now),
            Ok(false)
        );
        let (changed, version) = book.changed_since(0, now);
        assert_eq!(changed, [Penalty(1, 5, now + 30 * SEC)]);
        assert_eq!(book.changed_since(version, now).0, []);
        assert_eq!(
            book.admit(Penalty(1, 5, now + 40 * SEC), Some(&q), now),
            Ok(true)
        );
        assert_eq!(
            book.changed_since(version, now).0,
            [Penalty(1, 5, now + 40 * SEC)]
        );
        assert_eq!(book.started, 1);
        assert_eq!(book.changed_since(0, now + 41 * SEC).0, [], "ended");
        book.forget_ended(now + 41 * SEC, |_| false);
        assert!(book.is_empty());
    }

    #[test]
    fn a_penalty_is_refused_without_a_quota_that_has_one_and_cut_to_its_length() {
        let mut book = PenaltyBook::default();
        let now = 1000 * SEC;
        let plain = Quota::new(2, "p", 1.0, 1.0, 1.0);
        let far = now + 3600 * SEC;
        for (p, q) in [
            (Penalty(2, 0, far), Some(&plain)),
            (Penalty(1, 0, far), Some(&penalized(1, true))),
            (Penalty(1, 7, far), Some(&penalized(1, false))),
            (Penalty(1, 7, far), None),
        ] {
            assert_eq!(
                book.admit(p, q, now),
                Err(PenaltyRefusal::NoPenalty),
                "{p:?}"
            );
        }
        let q = penalized(1, false);
        assert_eq!(
            book.admit(Penalty(1, 0, now - 1), Some(&q), now),
            Err(PenaltyRefusal::Ended)
        );
        assert_eq!(book.admit(Penalty(1, 0, far), Some(&q), now), Ok(true));
        assert_eq!(
            book.active(now, 10),
            [Penalty(1, 0, now + 60 * SEC + PENALTY_SLACK_NS)]
        );
        assert_eq!(book.refused, [4, 1, 0]);
    }

    #[test]
    fn a_full_book_evicts_the_penalty_ending_soonest_for_one_ending_later() {
        let mut book = PenaltyBook::with_max(2);
        let q = penalized(1, true);
        let now = 1000 * SEC;
        for (key, secs) in [(1, 10), (2, 20)] {
            assert_eq!(
                book.admit(Penalty(1, key, now + secs * SEC), Some(&q), now),
                Ok(true)
            );
        }
        // No later than the soonest: refused, nothing moves.
        assert_eq!(
            book.admit(Penalty(1, 3, now + 10 * SEC), Some(&q), now),
            Err(PenaltyRefusal::Full)
        );
        // Later: the one ending soonest (key 1) gives way.
        assert_eq!(
            book.admit(Penalty(1, 3, now + 30 * SEC), Some(&q), now),
            Ok(true)
        );
        let held: Vec<u64> = book.active(now, 10).iter().map(|p| p.key()).collect();
        assert_eq!(held, [3, 2]);
        assert_eq!(
            book.stats(),
            PenaltyStats {
                held: 2,
                started: 3,
                refused: [0, 0, 1],
                evicted: 1
            }
        );
        // A held penalty moving later keeps its place; the soonest is now
        // key 2 (20 s), so a 25 s one evicts it.
        assert_eq!(
            book.admit(Penalty(1, 3, now + 40 * SEC), Some(&q), now),
            Ok(true)
        );
        assert_eq!(
            book.admit(Penalty(1, 4, now + 25 * SEC), Some(&q), now),
            Ok(true)
        );
        let held: Vec<u64> = book.active(now, 10).iter().map(|p| p.key()).collect();
        assert_eq!(held, [3, 4]);
        assert_eq!(book.evicted, 2);
        // An evicted penalty is not in the change log any more.
        let keys: Vec<u64> = book
            .changed_since(0, now)
            .0
            .iter()
            .map(|p| p.key())
            .collect();
        assert_eq!(keys.len(), 2);
        assert!(!keys.contains(&1) && !keys.contains(&2));
        book.forget_ended(now + 41 * SEC, |_| false);
        assert!(book.is_empty() && book.by_end.is_empty() && book.log.is_empty());
    }
}
