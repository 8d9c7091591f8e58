//! The limiters that have synced with this root.
//!
//! Each limiter id is interned to a number, so counters can remember
//! which limiters fed them without storing names. The registry is bounded,
//! and so that ids invented by a holder of the shared sync token cannot
//! hide real limiters (from the console, the overview and a quota's
//! `limiters`), it keeps the ones heard from last:
//!
//! - an id not heard from for `limiter_expiry` is forgotten;
//! - at `max_limiters` ids, a new one takes the place of the one heard
//!   from least recently.
//!
//! A limiter that syncs every second is forgotten only if more than
//! `max_limiters` other ids synced since its last sync; a newcomer is
//! always recorded. Both ways of forgetting are counted
//! ([`Limiters::dropped`]). A forgotten limiter that syncs again is
//! recorded anew (its sync count starts over).
//!
//! Numbers are handed out in increasing order (wrapping after 2^32, and
//! skipping numbers held), so a number is not reused while a counter's
//! record of the limiter it named is recent; [`Limiters::seen`] also
//! refuses a record older than the limiter now holding the number.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::core::Nanos;
use crate::wire::ClockReport;

/// Default of `max_limiters`.
pub const DEFAULT_MAX_LIMITERS: usize = 100_000;

/// Largest `max_limiters` a root accepts (a registered limiter takes a
/// few hundred bytes).
pub const MOST_LIMITERS: usize = 10_000_000;

/// Default of `limiter_expiry`.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(3600);

/// Why a limiter was forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Not heard from for `limiter_expiry`.
    Expired,
    /// The registry was full and it was heard from least recently.
    Full,
}

impl Dropped {
    /// Every reason, in metric order.
    pub const ALL: [Self; 2] = [Self::Expired, Self::Full];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::Full => "full",
        }
    }
}

/// What the root knows about one limiter.
#[derive(Clone, Debug, PartialEq)]
pub struct LimiterInfo {
    /// The limiter's id as it sends it.
    pub name: Box<str>,
    /// Root time of its first sync since it was recorded.
    pub first_sync: Nanos,
    /// Root time of its last sync.
    pub last_sync: Nanos,
    /// Syncs received from it since it was recorded.
    pub syncs: u64,
    /// Its latest report of its clock offset to this root.
    pub clock: Option<ClockReport>,
    /// Its deltas cut to its allowance (more than it could have admitted).
    pub clipped: u64,
    /// The weight cut from them.
    pub clipped_weight: f64,
    /// Root time of its last clipped delta.
    pub last_clipped: Option<Nanos>,
    /// The numbered requests of its sync threads this root applied.
    pub applied: Applied,
    /// Requests it sent again that this root had applied already: their
    /// weight was not counted a second time.
    pub duplicates: u64,
}

/// Sync threads (incarnations) of one limiter whose numbered requests a
/// root remembers: the current one and those before it, for an nginx
/// reload whose old thread still syncs beside the new one.
pub const INCARNATIONS_KEPT: usize = 4;

/// The numbered requests ([`crate::wire::Sequence`]) of one limiter this
/// root applied: for each of its last [`INCARNATIONS_KEPT`] sync threads,
/// the highest number applied, most recently used first. A thread sends
/// its requests to a root one at a time and a request sent again keeps
/// its number, so a number at or below the highest applied was applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// `(incarnation, highest seq applied)`; incarnation 0: free.
    threads: [(u64, u64); INCARNATIONS_KEPT],
}

impl Applied {
    /// True when the request numbered `s` has not been applied yet, and
    /// records it as applied: the caller applies it now. A thread not
    /// among the kept ones takes the place of the least recently used.
    pub fn admit(&mut self, s: crate::wire::Sequence) -> bool {
        let at = self
            .threads
            .iter()
            .position(|&(inc, _)| inc == s.incarnation)
            .unwrap_or(INCARNATIONS_KEPT - 1);
        let (inc, applied) = self.threads[at];
        let fresh = inc != s.incarnation || s.seq > applied;
        let highest = if inc == s.incarnation {
            applied.max(s.seq)
        } else {
            s.seq
        };
        // Most recently used first.
        self.threads.copy_within(0..at, 1);
        self.threads[0] = (s.incarnation, highest);
        fresh
    }

    /// The highest number applied of `incarnation`'s requests (0: none,
    /// or a thread no longer kept).
    pub fn highest(&self, incarnation: u64) -> u64 {
        self.threads
            .iter()
            .find(|&&(inc, _)| inc == incarnation && inc != 0)
            .map_or(0, |&(_, seq)| seq)
    }
}

/// Registry of limiters by id.
#[derive(Debug)]
pub struct Limiters {
    /// Limiter id to number.
    numbers: FxHashMap<Box<str>, u32>,
    /// Limiters by number.
    list: BTreeMap<u32, LimiterInfo>,
    /// `(last sync, number)`: the least recently heard from first.
    by_last_sync: BTreeSet<(Nanos, u32)>,
    /// The next number to try.
    next: u32,
    /// Most limiters held.
    max: usize,
    /// Nanoseconds after its last sync a limiter is forgotten.
    expiry: Nanos,
    /// Limiters forgotten, by [`Dropped`].
    dropped: [u64; 2],
}

impl Default for Limiters {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LIMITERS, DEFAULT_EXPIRY)
    }
}

impl Limiters {
    /// A registry of at most `max` limiters (at least one), each
    /// forgotten `expiry` after its last sync.
    pub fn new(max: usize, expiry: Duration) -> Self {
        Self {
            numbers: FxHashMap::default(),
            list: BTreeMap::new(),
            by_last_sync: BTreeSet::new(),
            next: 0,
            max: max.max(1),
            expiry: expiry.as_nanos().min(u128::from(Nanos::MAX)) as Nanos,
            dropped: [0; 2],
        }
    }

    /// Records a sync from `name` at `now`; returns the limiter's number.
    pub fn touch(&mut self, name: &str, now: Nanos) -> u32 {
        self.touch_since(name, now, 0.0).0
    }

    /// As [`Self::touch`], with the seconds since the limiter's previous
    /// sync (`first` for its first).
    pub fn touch_since(&mut self, name: &str, now: Nanos, first: f64) -> (u32, f64) {
        self.expire(now);
        let number = match self.numbers.get(name) {
            Some(&number) => number,
            None => {
                if self.list.len() >= self.max {
                    if let Some(&(_, oldest)) = self.by_last_sync.first() {
                        self.forget(oldest, Dropped::Full);
                    }
                }
                let number = self.free_number();
                self.numbers.insert(name.into(), number);
                self.list.insert(
                    number,
                    LimiterInfo {
                        name: name.into(),
                        first_sync: now,
                        last_sync: now,
                        syncs: 0,
                        clock: None,
                        clipped: 0,
                        clipped_weight: 0.0,
                        last_clipped: None,
                        applied: Applied::default(),
                        duplicates: 0,
                    },
                );
                self.by_last_sync.insert((now, number));
                number
            }
        };
        let info = self
            .list
            .get_mut(&number)
            .expect("a numbered limiter is listed");
        let since = if info.syncs == 0 {
            first
        } else {
            crate::core::counter::seconds_between(info.last_sync, now)
        };
        // A clock step back is not a reason to reorder.
        let last = info.last_sync.max(now);
        self.by_last_sync.remove(&(info.last_sync, number));
        self.by_last_sync.insert((last, number));
        info.last_sync = last;
        info.syncs += 1;
        (number, since)
    }

    /// The lowest number from `next` on that no limiter holds.
    fn free_number(&mut self) -> u32 {
        // Fewer limiters are held than numbers exist: this ends.
        while self.list.contains_key(&self.next) {
            self.next = self.next.wrapping_add(1);
        }
        let number = self.next;
        self.next = self.next.wrapping_add(1);
        number
    }

    fn forget(&mut self, number: u32, why: Dropped) {
        if let Some(info) = self.list.remove(&number) {
            self.by_last_sync.remove(&(info.last_sync, number));
            self.numbers.remove(&info.name);
            self.dropped[why as usize] += 1;
        }
    }

    /// Forgets every limiter not heard from within the expiry before
    /// `now`; returns how many.
    pub fn expire(&mut self, now: Nanos) -> usize {
        let Some(cutoff) = now.checked_sub(self.expiry) else {
            return 0;
        };
        let mut forgotten = 0;
        while let Some(&(last, number)) = self.by_last_sync.first() {
            if last >= cutoff {
                break;
            }
            self.forget(number, Dropped::Expired);
            forgotten += 1;
        }
        forgotten
    }

    /// A limiter by number.
    pub fn get(&self, number: u32) -> Option<&LimiterInfo> {
        self.list.get(&number)
    }

    /// The limiter a counter's record names: number `number`, which sent
    /// weight at `at`; `None` when the limiter holding that number now
    /// was recorded after it (the one that sent it was forgotten).
    pub fn seen(&self, number: u32, at: Nanos) -> Option<&LimiterInfo> {
        self.get(number).filter(|info| info.first_sync <= at)
    }

    /// Counts `deltas` of limiter `number` clipped at `now`, `weight` cut.
    pub fn clipped(&mut self, number: u32, deltas: u64, weight: f64, now: Nanos) {
        if let Some(info) = self.list.get_mut(&number) {
            info.clipped += deltas;
            info.clipped_weight += weight;
            info.last_clipped = Some(now);
        }
    }

    /// True when limiter `number`'s request numbered `sequence` is to be
    /// applied (not applied before; see [`Applied::admit`]); a request
    /// sent again is counted in its `duplicates`. A request without a
    /// number (a limiter that predates them, or a root it does not know
    /// takes them) is always applied.
    pub fn admit(&mut self, number: u32, sequence: Option<crate::wire::Sequence>) -> bool {
        let (Some(s), Some(info)) = (sequence, self.list.get_mut(&number)) else {
            return true;
        };
        let fresh = info.applied.admit(s);
        if !fresh {
            info.duplicates += 1;
        }
        fresh
    }

    /// The highest number limiter `number` applied of the requests of its
    /// sync thread `incarnation` (0: none known).
    pub fn applied_through(&self, number: u32, incarnation: u64) -> u64 {
        self.list
            .get(&number)
            .map_or(0, |info| info.applied.highest(incarnation))
    }

    /// Keeps the clock offset `name` reported with its sync.
    pub fn report_clock(&mut self, name: &str, clock: ClockReport) {
        if let Some(number) = self.numbers.get(name) {
            if let Some(info) = self.list.get_mut(number) {
                info.clock = Some(clock);
            }
        }
    }

    /// Every recorded limiter with its number, by number.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &LimiterInfo)> {
        self.list.iter().map(|(&number, info)| (number, info))
    }

    /// Number of limiters recorded.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when no limiter is recorded.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Number of limiters whose last sync was at or after `since`.
    pub fn active_since(&self, since: Nanos) -> usize {
        self.by_last_sync.range((since, 0)..).count()
    }

    /// Limiters forgotten so far, by [`Dropped`].
    pub fn dropped(&self) -> [u64; 2] {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn limiters_are_interned_and_counted() {
        let mut limiters = Limiters::default();
        assert_eq!(limiters.touch("a", 1), 0);
        assert_eq!(limiters.touch("b", 2), 1);
        assert_eq!(limiters.touch("a", 3), 0);
        let a = limiters.get(0).unwrap();
        assert_eq!((a.first_sync, a.last_sync, a.syncs), (1, 3, 2));
        assert_eq!(limiters.active_since(3), 1);
        assert_eq!(limiters.len(), 2);
    }

    #[test]
    fn at_the_cap_a_newcomer_replaces_the_one_heard_from_least_recently() {
        let mut limiters = Limiters::new(3, DEFAULT_EXPIRY);
        limiters.touch("honest", 0);
        for (i, junk) in ["j1", "j2"].iter().enumerate() {
            limiters.touch(junk, (i as Nanos + 1) * SEC);
        }
        // The honest limiter syncs again: it is no longer the oldest.
        limiters.touch("honest", 3 * SEC);
        for i in 0..100 {
            limiters.touch(&format!("junk-{i}"), 4 * SEC);
            // The newcomer is always recorded.
            assert!(limiters
                .iter()
                .any(|(_, l)| *l.name == *format!("junk-{i}")));
        }
        // Junk ids flooding within one second push out older junk only
        // until they are the oldest; the newest are held.
        assert_eq!(limiters.len(), 3);
        assert_eq!(limiters.dropped(), [0, 100]);
        let names: Vec<_> = limiters.iter().map(|(_, l)| l.name.to_string()).collect();
        assert!(names.contains(&"junk-99".to_string()), "{names:?}");
    }

    #[test]
    fn a_limiter_that_keeps_syncing_outlives_a_flood_smaller_than_the_cap() {
        let mut limiters = Limiters::new(1000, DEFAULT_EXPIRY);
        let mut now = 0;
        for round in 0..5 {
            limiters.touch("web-1", now);
            for i in 0..900 {
                limiters.touch(&format!("junk-{round}-{i}"), now + 1);
            }
            now += SEC;
        }
        let (_, web) = limiters
            .iter()
            .find(|(_, l)| &*l.name == "web-1")
            .expect("web-1 held");
        assert_eq!(web.syncs, 5);
        assert_eq!(limiters.len(), 1000);
    }

    #[test]
    fn idle_limiters_expire_and_are_counted() {
        let mut limiters = Limiters::new(100, Duration::from_secs(60));
        limiters.touch("old", 0);
        limiters.touch("recent", 50 * SEC);
        assert_eq!(limiters.expire(59 * SEC), 0);
        assert_eq!(limiters.expire(61 * SEC), 1);
        assert_eq!(limiters.len(), 1);
        assert_eq!(limiters.dropped(), [1, 0]);
        // Expired on the next sync of anyone too.
        limiters.touch("new", 200 * SEC);
        assert_eq!(limiters.len(), 1);
        assert_eq!(limiters.dropped(), [2, 0]);
        // A forgotten limiter comes back as new.
        let number = limiters.touch("old", 201 * SEC);
        assert_eq!(limiters.get(number).unwrap().syncs, 1);
    }

    #[test]
    fn a_number_is_not_handed_out_twice_and_old_records_are_not_shown_as_its_new_holder() {
        let mut limiters = Limiters::new(2, DEFAULT_EXPIRY);
        let a = limiters.touch("a", SEC);
        limiters.touch("b", 2 * SEC);
        limiters.touch("c", 3 * SEC); // "a" is forgotten
        let d = limiters.touch("d", 4 * SEC);
        assert!(a < d && limiters.get(a).is_none());
        // Numbers wrap after the last, skipping the ones held.
        limiters.next = u32::MAX;
        let e = limiters.touch("e", 5 * SEC);
        assert_eq!(e, u32::MAX);
        limiters.next = e;
        let f = limiters.touch("f", 6 * SEC);
        assert_eq!(f, a, "wrapped past the held {e} to the free {a}");
        // A counter's record of weight `a` sent is not shown as `f`'s.
        assert!(limiters.seen(f, SEC).is_none());
        assert_eq!(&*limiters.seen(f, 6 * SEC).unwrap().name, "f");
    }

    #[test]
    fn a_numbered_request_is_applied_once_per_incarnation_whatever_arrives_twice() {
        use crate::wire::Sequence;
        let s = |incarnation, seq| Some(Sequence { incarnation, seq });
        let mut l = Limiters::default();
        let n = l.touch("h", 0);
        assert!(l.admit(n, s(7, 1)) && l.admit(n, s(7, 2)));
        // Sent again, or a late copy of an earlier one: not again.
        assert!(!l.admit(n, s(7, 2)) && !l.admit(n, s(7, 1)));
        assert_eq!(l.get(n).unwrap().duplicates, 2);
        // A new thread numbers from 1 of its own; the old one still counts
        // its own numbers beside it.
        assert!(l.admit(n, s(8, 1)) && !l.admit(n, s(8, 1)));
        assert!(l.admit(n, s(7, 3)) && !l.admit(n, s(7, 3)));
        // Unnumbered (an older limiter): applied every time.
        assert!(l.admit(n, None) && l.admit(n, None));
        // Four threads are remembered; a fifth takes the place of the one
        // heard from least recently.
        for inc in 9..=11 {
            assert!(l.admit(n, s(inc, 1)));
        }
        assert!(!l.admit(n, s(11, 1)) && !l.admit(n, s(10, 1)) && !l.admit(n, s(9, 1)));
        assert!(l.admit(n, s(8, 2)));
        assert!(
            l.admit(n, s(7, 1)),
            "7 was forgotten: its numbers apply again"
        );
    }
}
