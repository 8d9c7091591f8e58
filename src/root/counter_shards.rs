//! A root's counters split into shards, each under its own lock, so syncs
//! from different limiters add their deltas in parallel.
//!
//! A counter lives in the shard its [`CounterKey`] hashes to (a quota's
//! named counter by its id, a key's by id and key hash), next to the
//! limiters' allowances on it. A sync groups its deltas by shard and takes
//! each shard once, in ascending order, so two syncs never wait on each
//! other in a cycle.
//!
//! **Versions stay one sequence.** Every shard takes versions from one
//! shared atomic clock ([`BookClock`]), while it holds its lock (a block
//! per shard and sync, see [`CounterBook::reserve`]). A reader first reads
//! the clock (`upto`), then takes the shards one at a time: any version up
//! to `upto` was taken by a writer that held its shard at that moment, so
//! the reader, taking the shard after, finds it in place. "Changed since
//! `v`" is the shards' lists in `(v, upto]` merged by version, and the
//! reply's version is `upto` (or, when the page is full, the last version
//! it considered): exact, as with one book, and still one `u64` on the
//! wire.

use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::core::Nanos;
use crate::wire::CounterKey;

use super::counter_book::{
    busiest_first, BookClock, ChangedCounters, ChangedEntry, CounterBook, CounterRule, CounterView,
    KeyLimits, TemplateRejections,
};
use super::interest::{Interest, InterestLimits, InterestSizes, Told};
use super::trust::{Allowances, MAX_ALLOWANCES};

/// One shard: its counters and the allowances limiters hold on them.
#[derive(Debug)]
pub struct Shard {
    /// The counters.
    pub book: CounterBook,
    /// What each limiter may still add to them.
    pub allowances: Allowances,
    /// The slots each limiter holds of the in-flight counters.
    pub held: super::in_flight::Held,
    /// Rejection rates of the per-key templates whose named counter would
    /// live in this shard.
    pub templates: TemplateRejections,
    /// The keys of this shard each limiter holds.
    pub interest: Interest,
}

/// A limiter asking for a reply by interest: its number, and what its
/// request tells of its keys, by shard (see [`Counters::changed_for`]).
#[derive(Clone, Copy, Debug)]
pub struct Asker<'a> {
    /// The limiter's number.
    pub limiter: u32,
    /// The request carried its whole list.
    pub full: bool,
    /// Keys it listed, by shard.
    pub listed: &'a [Vec<CounterKey>],
    /// Keys it sent deltas for, by shard.
    pub sent: &'a [Vec<CounterKey>],
}

impl Asker<'_> {
    fn told(&self, shard: usize) -> Told<'_> {
        fn of(lists: &[Vec<CounterKey>], shard: usize) -> &[CounterKey] {
            lists.get(shard).map_or(&[], |l| l.as_slice())
        }
        Told {
            full: self.full,
            listed: of(self.listed, shard),
            sent: of(self.sent, shard),
        }
    }
}

/// Shards for this machine: four per core the process may run on (so two
/// syncs rarely meet on one), a power of two between 4 and 256.
pub fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * 4).next_power_of_two().clamp(4, 256)
}

/// What a root's counters hold and did, summed over the shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSizes {
    /// Counters in memory.
    pub counters: usize,
    /// Of them, keys of per-key templates.
    pub keys: usize,
    /// Key deltas ignored: `max_keys` keys held, or their limiter held its
    /// share.
    pub keys_refused: u64,
    /// Key counters forgotten to make room for a limiter within its share.
    pub keys_displaced: u64,
    /// Key counters forgotten after draining.
    pub keys_forgotten: u64,
    /// Counter updates cut to the level cap.
    pub levels_capped: u64,
    /// Limiter allowances held.
    pub allowances: usize,
    /// The limiters' interest records.
    pub interest: InterestSizes,
}

/// Every counter of one root, in shards.
#[derive(Debug)]
pub struct Counters {
    shards: Box<[Mutex<Shard>]>,
    clock: Arc<BookClock>,
}

impl Default for Counters {
    fn default() -> Self {
        Self::new(default_shards(), KeyLimits::unbounded())
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard cannot leave it half updated in a way
    // later syncs cannot live with; keep serving.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Counters {
    /// `shards` shards (at least one) holding at most `limits.max_keys`
    /// key counters together, each limiter's share split over them.
    pub fn new(shards: usize, limits: KeyLimits) -> Self {
        Self::with_interest(shards, limits, InterestLimits::default())
    }

    /// As [`Self::new`], the limiters' interest records within
    /// `interest`.
    pub fn with_interest(shards: usize, limits: KeyLimits, interest: InterestLimits) -> Self {
        let shards = shards.max(1);
        let clock = Arc::new(BookClock::default());
        let interest_count = Arc::default();
        let per_shard_allowances = (MAX_ALLOWANCES / shards).max(1024);
        let per_shard = limits.per_shard(shards);
        Self {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        book: CounterBook::shard(clock.clone(), per_shard),
                        allowances: Allowances::with_max(per_shard_allowances),
                        held: Default::default(),
                        templates: TemplateRejections::default(),
                        interest: Interest::shard(interest, shards, Arc::clone(&interest_count)),
                    })
                })
                .collect(),
            clock,
        }
    }

    /// [`default_shards`] shards holding at most `limits.max_keys` key
    /// counters.
    pub fn with_key_limits(limits: KeyLimits) -> Self {
        Self::new(default_shards(), limits)
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard `counter` lives in.
    pub fn shard_of(&self, counter: CounterKey) -> usize {
        let mixed = (counter.id ^ counter.key.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((mixed >> 32) as usize) % self.shards.len()
    }

    /// Locks shard `index`.
    pub fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        locked(&self.shards[index])
    }

    fn lock_of(&self, counter: CounterKey) -> MutexGuard<'_, Shard> {
        self.lock(self.shard_of(counter))
    }

    fn each<T>(&self, mut f: impl FnMut(&mut Shard) -> T) -> impl Iterator<Item = T> {
        let mut out = Vec::with_capacity(self.shards.len());
        for shard in self.shards.iter() {
            out.push(f(&mut locked(shard)));
        }
        out.into_iter()
    }

    /// The last version handed out.
    pub fn version(&self) -> u64 {
        self.clock.version()
    }

    /// [`CounterBook::set_counting`] in the shards holding the counters.
    pub fn set_counting(&self, id: u64, keyed: bool, rule: CounterRule, now: Nanos) {
        if keyed {
            self.each(|s| s.book.set_counting(id, true, rule, now))
                .for_each(drop);
        } else {
            self.lock_of(CounterKey::named(id))
                .book
                .set_counting(id, false, rule, now);
        }
    }

    /// [`CounterBook::set_key_counting`] in the counter's shard.
    pub fn set_key_counting(&self, counter: CounterKey, rule: CounterRule, now: Nanos) {
        self.lock_of(counter)
            .book
            .set_key_counting(counter, rule, now);
    }

    /// [`CounterBook::remove`] in every shard.
    pub fn remove(&self, id: u64) {
        {
            let mut shard = self.lock_of(CounterKey::named(id));
            shard.book.remove(id);
            shard.templates.remove(id);
        }
        self.each(|s| {
            if s.book.keys() > 0 {
                s.book.remove(id)
            }
        })
        .for_each(drop);
    }

    /// A named counter's live view at `now`.
    pub fn view(&self, id: u64, now: Nanos) -> Option<CounterView> {
        self.view_counter(CounterKey::named(id), now)
    }

    /// A counter's live view at `now`.
    pub fn view_counter(&self, counter: CounterKey, now: Nanos) -> Option<CounterView> {
        self.lock_of(counter).book.view_counter(counter, now)
    }

    /// Number of counters.
    pub fn len(&self) -> usize {
        self.each(|s| s.book.len()).sum()
    }

    /// True when no counter exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of key counters.
    pub fn keys(&self) -> usize {
        self.each(|s| s.book.keys()).sum()
    }

    /// Key deltas ignored because `max_keys` keys were held.
    pub fn keys_refused(&self) -> u64 {
        self.each(|s| s.book.keys_refused()).sum()
    }

    /// Forgets drained key counters, looking at about `budget` slots in
    /// all (see [`CounterBook::forget_drained`]); returns how many.
    pub fn forget_drained(&self, budget: usize, now: Nanos) -> usize {
        let per_shard = budget.div_ceil(self.shards.len()).max(1);
        self.each(|s| s.book.forget_drained(per_shard, now)).sum()
    }

    /// Forgets the limiter allowances back at full at `now`; returns how
    /// many.
    pub fn forget_refilled(&self, now: Nanos) -> usize {
        self.each(|s| s.allowances.forget_refilled(now)).sum()
    }

    /// Counters updated after version `since`, at most `max`, the oldest
    /// changes first when more changed (see [`CounterBook::changed_since`]):
    /// the same counters and version one book gives, taking one shard at a
    /// time, in counter order (see `merge_changed`).
    pub fn changed_since(&self, since: u64, max: usize, now: Nanos) -> ChangedCounters {
        self.changed_for(since, max, now, None).0
    }

    /// As [`Self::changed_since`], for `asker` when given: each shard
    /// first takes in what its request tells of its keys there, then
    /// lists only the changed counters the limiter wants (every named
    /// counter and the keys it holds; everything in a shard that has no
    /// record of it or whose record overflowed), plus the keys it listed
    /// anew whatever their version. Also returns true when every shard
    /// holds a record of the limiter (false: the reply asks for its whole
    /// list).
    pub fn changed_for(
        &self,
        since: u64,
        max: usize,
        now: Nanos,
        asker: Option<Asker<'_>>,
    ) -> (ChangedCounters, bool) {
        let upto = self.clock.version();
        let mut entries = Vec::new();
        let mut fresh = Vec::new();
        let mut known = true;
        for (index, shard) in self.shards.iter().enumerate() {
            let mut guard = locked(shard);
            let shard = &mut *guard;
            let wanted = match &asker {
                Some(asker) => {
                    let listed = shard.interest.learn(asker.limiter, asker.told(index), now);
                    // Keys listed anew that no walk from `since` finds.
                    fresh.extend(
                        listed
                            .into_iter()
                            .filter_map(|k| shard.book.entry(k))
                            .filter(|e| e.version <= since),
                    );
                    known &= shard.interest.knows(asker.limiter);
                    shard.interest.wanted(asker.limiter)
                }
                None => super::interest::Wanted::All,
            };
            if shard.book.newest_version() > since {
                shard.book.changed_between(
                    (since, upto),
                    max,
                    now,
                    |c| wanted.wants(c),
                    &mut entries,
                );
            }
        }
        (merge_changed(entries, fresh, since, upto, max), known)
    }

    /// Takes in what `asker`'s request tells of its keys, sending
    /// nothing (a reply that carries no counters); returns true when
    /// every shard holds a record of it.
    pub fn learn_interest(&self, asker: Asker<'_>, now: Nanos) -> bool {
        let mut known = true;
        for (index, shard) in self.shards.iter().enumerate() {
            let mut shard = locked(shard);
            shard.interest.learn(asker.limiter, asker.told(index), now);
            known &= shard.interest.knows(asker.limiter);
        }
        known
    }

    /// Forgets the interest records of limiters no sync touched for
    /// [`super::interest::IDLE_NANOS`]; returns how many.
    pub fn forget_idle_interest(&self, now: Nanos) -> usize {
        self.each(|s| s.interest.forget_idle(now)).sum()
    }

    /// Every shard held at once, for the admin API's reads: syncs wait
    /// while it is held.
    pub fn read(&self) -> CountersView<'_> {
        CountersView {
            shards: self.shards.iter().map(|s| locked(s)).collect(),
            clock: &self.clock,
        }
    }
}

/// Builds a reply's counters from the shards' entries in `(since, upto]`
/// (and `fresh` ones, listed anew by the limiter, sent whatever their
/// version and beside the page):
/// at most `max` sent, the oldest changes first when they do not all fit.
/// When the page is full, its version is the last one considered (each
/// shard listed up to `max` sent counters, so every version up to that one
/// is among the entries).
///
/// The page goes out in counter order (id, then key hash), not in version
/// order: a limiter applies a reply counter by counter to maps and a table
/// that keep neighbouring ids together, and 100k counters in version order
/// (the shards' changes one shard after another) would make each of its
/// lookups a cache miss. Sorting by counter instead of by version costs
/// nothing when the page fits; when not, the oldest `max` are selected
/// (linear) before the page is sorted, which costs less than the sort by
/// version of every entry it replaces. A reply by interest sorts only
/// what the limiter receives.
fn merge_changed(
    mut entries: Vec<ChangedEntry>,
    fresh: Vec<ChangedEntry>,
    since: u64,
    upto: u64,
    max: usize,
) -> ChangedCounters {
    let mut changed = ChangedCounters {
        counters: Vec::new(),
        keyed: Vec::new(),
        version: upto,
    };
    // Skipped entries are considered, never sent: the page's version is
    // set by the ones sent alone.
    entries.retain(|e| !e.skipped);
    if entries.len() > max {
        // The `max` oldest, found without sorting them all.
        if max == 0 {
            entries.clear();
            changed.version = since;
        } else {
            entries.select_nth_unstable_by_key(max - 1, |e| e.version);
            entries.truncate(max);
            changed.version = entries[max - 1].version;
        }
    }
    entries.extend(fresh);
    entries.sort_unstable_by_key(|e| e.counter);
    let mut groups: FxHashMap<u64, usize> = FxHashMap::default();
    for entry in entries {
        changed.push(entry.counter, entry.tally, &mut groups);
    }
    changed
}

/// Every shard of a [`Counters`], held.
pub struct CountersView<'a> {
    shards: Vec<MutexGuard<'a, Shard>>,
    clock: &'a BookClock,
}

impl CountersView<'_> {
    /// The last version handed out.
    pub fn version(&self) -> u64 {
        self.clock.version()
    }

    fn shard(&self, counter: CounterKey) -> &Shard {
        let n = self.shards.len();
        let mixed = (counter.id ^ counter.key.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.shards[((mixed >> 32) as usize) % n]
    }

    fn of(&self, counter: CounterKey) -> &CounterBook {
        &self.shard(counter).book
    }

    /// A named counter's live view at `now`.
    pub fn view(&self, id: u64, now: Nanos) -> Option<CounterView> {
        self.view_counter(CounterKey::named(id), now)
    }

    /// A counter's live view at `now`.
    pub fn view_counter(&self, counter: CounterKey, now: Nanos) -> Option<CounterView> {
        self.of(counter).view_counter(counter, now)
    }

    /// Checks of per-key template `id` rejected per second (see
    /// [`TemplateRejections`]).
    pub fn template_rejected_rate(&self, id: u64, now: Nanos) -> f64 {
        self.shard(CounterKey::named(id)).templates.rate(id, now)
    }

    /// Every per-key template with a rejection rate, and the rate at `now`.
    pub fn template_rejected_rates(&self, now: Nanos) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.shards.iter().flat_map(move |s| s.templates.rates(now))
    }

    /// The keys of template `id`, busiest first, at most `max` (see
    /// [`CounterBook::top_keys`]).
    pub fn top_keys(&self, id: u64, max: usize, now: Nanos) -> Vec<(u64, CounterView)> {
        let mut keys: Vec<(u64, CounterView)> = self
            .shards
            .iter()
            .flat_map(|s| s.book.top_keys(id, max, now))
            .collect();
        busiest_first(&mut keys, max);
        keys
    }

    /// Counters from the most recently updated back, across shards (see
    /// [`CounterBook::newest_first`]).
    pub fn newest_first(
        &self,
        now: Nanos,
    ) -> impl Iterator<Item = (CounterKey, f64, f64, f64)> + '_ {
        let mut lists: Vec<_> = self
            .shards
            .iter()
            .map(|s| s.book.newest_first_versioned(now).peekable())
            .collect();
        std::iter::from_fn(move || {
            let newest = lists
                .iter_mut()
                .enumerate()
                .filter_map(|(i, l)| Some((l.peek()?.0, i)))
                .max()?
                .1;
            lists[newest].next().map(|(_, counter)| counter)
        })
    }

    /// Number of counters.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.book.len()).sum()
    }

    /// True when no counter exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sums over the shards.
    pub fn sizes(&self) -> CounterSizes {
        let mut sizes = CounterSizes::default();
        for s in &self.shards {
            sizes.counters += s.book.len();
            sizes.keys += s.book.keys();
            sizes.keys_refused += s.book.keys_refused();
            sizes.keys_displaced += s.book.keys_displaced();
            sizes.keys_forgotten += s.book.keys_forgotten();
            sizes.levels_capped += s.book.capped();
            sizes.allowances += s.allowances.len();
            s.interest.add_sizes(&mut sizes.interest);
        }
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Counting;
    use std::sync::Barrier;

    fn add(counters: &Counters, id: u64, weight: f64) {
        let counter = CounterKey::named(id);
        let mut shard = counters.lock(counters.shard_of(counter));
        shard
            .book
            .add(id, weight, 0, None, || Some(Counting::Leak(0.0).into()));
    }

    fn ids(changed: &ChangedCounters) -> Vec<u64> {
        changed.counters.iter().map(|c| c.id).collect()
    }

    #[test]
    fn changes_are_paged_in_version_order_across_shards_and_each_page_in_counter_order() {
        let counters = Counters::new(8, KeyLimits::unbounded());
        for id in 1..=20 {
            add(&counters, id, 1.0);
        }
        let all = counters.changed_since(0, 100, 0);
        assert_eq!(ids(&all), (1..=20).collect::<Vec<_>>());
        assert_eq!(all.version, 20);
        add(&counters, 7, 1.0);
        add(&counters, 3, 1.0);
        let since = counters.changed_since(all.version, 100, 0);
        assert_eq!(ids(&since), [3, 7]);
        // Pages of 6 resume where they stopped, whatever shard.
        let mut version = 0;
        let mut seen = Vec::new();
        loop {
            let page = counters.changed_since(version, 6, 0);
            if page.counters.is_empty() {
                break;
            }
            seen.extend(ids(&page));
            version = page.version;
        }
        // Pages are cut by version, each in counter order.
        let mut expected: Vec<u64> = (1..=20).filter(|&id| id != 3 && id != 7).collect();
        expected.extend([3, 7]);
        assert_eq!(seen, expected);
    }

    #[test]
    fn concurrent_writers_lose_no_change_to_a_concurrent_reader() {
        // Writers on every shard and a reader paging "changed since" at the
        // same time: every counter's last update reaches the reader.
        let counters = Arc::new(Counters::new(4, KeyLimits::unbounded()));
        let writers = 4;
        let per_writer = 2_000u64;
        let barrier = Arc::new(Barrier::new(writers + 1));
        let handles: Vec<_> = (0..writers as u64)
            .map(|w| {
                let (counters, barrier) = (counters.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for i in 0..per_writer {
                        add(&counters, w * per_writer + i % 500, 1.0);
                    }
                })
            })
            .collect();
        barrier.wait();
        let mut version = 0;
        let mut levels: FxHashMap<u64, f64> = FxHashMap::default();
        let mut read = |version: &mut u64| {
            let page = counters.changed_since(*version, 97, 0);
            for c in &page.counters {
                levels.insert(c.id, c.level);
            }
            *version = page.version;
        };
        for _ in 0..200 {
            read(&mut version);
        }
        for h in handles {
            h.join().unwrap();
        }
        while counters.changed_since(version, 97, 0).version != version
            || !counters.changed_since(version, 97, 0).counters.is_empty()
        {
            read(&mut version);
        }
        for (&id, &level) in &levels {
            assert_eq!(Some(level), counters.view(id, 0).map(|v| v.level), "{id}");
        }
        assert_eq!(levels.len(), writers * 500);
    }

    #[test]
    fn a_reply_by_interest_carries_named_counters_and_the_askers_keys_and_a_key_listed_anew() {
        let counters = Counters::new(4, KeyLimits::unbounded());
        let key = |k| CounterKey { id: 9, key: k };
        let add_key = |k| {
            let counter = key(k);
            let mut shard = counters.lock(counters.shard_of(counter));
            let delta = super::super::counter_book::Delta {
                weight: 1.0,
                window: None,
            };
            shard
                .book
                .add_counter(counter, delta, 0, None, || Some(Counting::Leak(0.0).into()));
        };
        let by_shard = |keys: &[CounterKey]| {
            let mut out = vec![Vec::new(); counters.shard_count()];
            for &k in keys {
                out[counters.shard_of(k)].push(k);
            }
            out
        };
        let keys_of = |c: &ChangedCounters| -> Vec<u64> {
            c.keyed
                .iter()
                .flat_map(|g| g.values.iter().map(|v| v.0))
                .collect()
        };
        for k in 1..=6 {
            add_key(k);
        }
        add(&counters, 1, 1.0);
        let (none, sent) = (by_shard(&[]), by_shard(&[]));
        let asker = |full, listed| Asker {
            limiter: 5,
            full,
            listed,
            sent: &sent,
        };
        // No record: everything, and the reply asks for the list.
        let (all, known) = counters.changed_for(0, 100, 0, Some(asker(false, &none)));
        assert_eq!((keys_of(&all).len(), known), (6, false));
        // The whole list (keys 2 and 4): only they and the named counter,
        // and both go at once though the cursor is past their changes.
        let listed = by_shard(&[key(2), key(4)]);
        let (mine, known) = counters.changed_for(all.version, 100, 0, Some(asker(true, &listed)));
        assert!(known);
        let mut got = keys_of(&mine);
        got.sort_unstable();
        assert_eq!(got, [2, 4]);
        // Every key changes again: the reply carries the named counter
        // and the asker's keys only.
        for k in 1..=6 {
            add_key(k);
        }
        add(&counters, 1, 1.0);
        let (next, _) = counters.changed_for(mine.version, 100, 0, Some(asker(false, &none)));
        let mut got = keys_of(&next);
        got.sort_unstable();
        assert_eq!((got, ids(&next)), (vec![2, 4], vec![1]));
        // A root that does not answer by interest sends them all.
        assert_eq!(
            keys_of(&counters.changed_since(mine.version, 100, 0)).len(),
            6
        );
    }

    #[test]
    fn max_keys_holds_across_shards() {
        let counters = Counters::new(8, KeyLimits::new(3, Some(100)));
        let mut added = 0;
        for key in 1..=10u64 {
            let counter = CounterKey { id: 1, key };
            let mut shard = counters.lock(counters.shard_of(counter));
            let delta = super::super::counter_book::Delta {
                weight: 1.0,
                window: None,
            };
            added += usize::from(
                shard
                    .book
                    .add_counter(counter, delta, 0, None, || Some(Counting::Leak(0.0).into())),
            );
        }
        assert_eq!((added, counters.keys(), counters.keys_refused()), (3, 3, 7));
        counters.remove(1);
        assert_eq!(counters.keys(), 0);
    }
}
