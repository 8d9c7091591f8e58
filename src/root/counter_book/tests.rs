//! The counter book's tests.

use super::*;

const SEC: Nanos = 1_000_000_000;

fn ids(changed: &ChangedCounters) -> Vec<u64> {
    changed.counters.iter().map(|c| c.id).collect()
}

#[test]
fn adding_leaks_then_adds_in_root_time() {
    let mut book = CounterBook::default();
    assert!(book.add(1, 50.0, 0, None, || Some(Counting::Leak(10.0).into())));
    assert!(book.add(1, 5.0, 2 * SEC, None, || unreachable!("known counter")));
    // 50 leaked 20 over two seconds, then +5.
    assert_eq!(book.view(1, 2 * SEC).unwrap().level, 35.0);
    assert_eq!(book.view(1, 10 * SEC).unwrap().level, 0.0);
}

#[test]
fn unknown_quotas_get_no_counter() {
    let mut book = CounterBook::default();
    assert!(!book.add(9, 1.0, 0, None, || None));
    assert!(book.is_empty());
    assert_eq!(book.version(), 0);
}

#[test]
fn changed_since_returns_each_changed_counter_once_in_version_order() {
    let mut book = CounterBook::default();
    for id in 1..=4 {
        book.add(id, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
    }
    let v = book.version();
    book.add(2, 1.0, 0, None, || None);
    book.add(4, 1.0, 0, None, || None);
    book.add(2, 1.0, 0, None, || None);
    let changed = book.changed_since(v, 100, 0);
    assert_eq!(ids(&changed), [4, 2]);
    assert_eq!(changed.version, book.version());
    assert_eq!(changed.counters[1].level, 3.0);
    assert!(book
        .changed_since(book.version(), 100, 0)
        .counters
        .is_empty());
}

#[test]
fn a_capped_answer_resumes_where_it_stopped() {
    let mut book = CounterBook::default();
    for id in 1..=5 {
        book.add(id, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
    }
    let first = book.changed_since(0, 2, 0);
    assert_eq!(ids(&first), [1, 2]);
    assert_eq!(first.version, 2);
    let rest = book.changed_since(first.version, 10, 0);
    assert_eq!(ids(&rest), [3, 4, 5]);
}

#[test]
fn version_zero_skips_counters_back_at_the_floor() {
    let mut book = CounterBook::default();
    book.add(1, 5.0, 0, None, || Some(Counting::Leak(1.0).into()));
    book.add(2, 500.0, 0, None, || Some(Counting::Leak(1.0).into()));
    assert_eq!(ids(&book.changed_since(0, 10, 10 * SEC)), [2]);
    // An incremental reader still learns both changed.
    assert_eq!(book.changed_since(0, 10, 0).counters.len(), 2);
}

#[test]
fn removed_counters_leave_the_list_and_their_slot_is_reused() {
    let mut book = CounterBook::default();
    for id in 1..=3 {
        book.add(id, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
    }
    book.remove(2);
    book.remove(7);
    assert_eq!(ids(&book.changed_since(0, 10, 0)), [1, 3]);
    book.add(4, 1.0, 0, None, || Some(Counting::Leak(0.0).into()));
    assert_eq!(book.slots.len(), 3);
    assert_eq!(ids(&book.changed_since(0, 10, 0)), [1, 3, 4]);
    book.remove(1);
    book.remove(4);
    book.remove(3);
    assert!(book.changed_since(0, 10, 0).counters.is_empty());
    assert_eq!((book.oldest, book.newest), (NIL, NIL));
}

#[test]
fn levels_are_cut_to_the_cap_and_a_new_cap_applies_from_the_next_update() {
    let mut book = CounterBook::default();
    let rule = CounterRule {
        cap: 100.0,
        ..Counting::Leak(10.0).into()
    };
    assert!(book.add(1, 1e15, 0, None, || Some(rule)));
    assert_eq!(book.view(1, 0).unwrap().level, 100.0);
    assert_eq!(book.capped(), 1);
    // It drains from the cap: 9 s at 10/s.
    assert_eq!(book.view(1, 9 * SEC).unwrap().level, 10.0);
    book.add(1, 5.0, 9 * SEC, None, || None);
    assert_eq!(
        (book.view(1, 9 * SEC).unwrap().level, book.capped()),
        (15.0, 1)
    );
    book.set_counting(1, false, CounterRule { cap: 12.0, ..rule }, 9 * SEC);
    book.add(1, 1.0, 9 * SEC, None, || None);
    assert_eq!(book.view(1, 9 * SEC).unwrap().level, 12.0);
}

#[test]
fn a_limit_change_leaks_at_the_old_rate_first() {
    let mut book = CounterBook::default();
    book.add(1, 100.0, 0, None, || Some(Counting::Leak(10.0).into()));
    book.set_counting(1, false, Counting::Leak(0.0).into(), 5 * SEC);
    // 50 leaked at 10/s, then nothing more at 0/s.
    assert_eq!(book.view(1, 100 * SEC).unwrap().level, 50.0);
}

#[test]
fn fill_rate_follows_the_incoming_weight_and_decays_when_idle() {
    let mut book = CounterBook::default();
    for s in 0..10 {
        book.add(1, 100.0, s * SEC, None, || Some(Counting::Leak(0.0).into()));
    }
    let busy = book.view(1, 10 * SEC).unwrap().fill_rate;
    assert!((busy - 100.0).abs() < 1.0, "{busy}");
    let idle = book.view(1, 30 * SEC).unwrap().fill_rate;
    assert!(idle < 10.0, "{idle}");
}

#[test]
fn newest_first_walks_from_the_last_update_back() {
    let mut book = CounterBook::default();
    for id in 1..=3 {
        book.add(id, 10.0, 0, None, || Some(Counting::Leak(1.0).into()));
    }
    book.add(1, 5.0, SEC, None, || None);
    let walked: Vec<(u64, f64)> = book
        .newest_first(2 * SEC)
        .map(|(counter, level, _, _)| (counter.id, level))
        .collect();
    assert_eq!(walked, [(1, 13.0), (3, 8.0), (2, 8.0)]);
    assert_eq!(CounterBook::default().newest_first(0).count(), 0);
}

#[test]
fn recent_limiters_are_remembered_newest_first_and_bounded() {
    let mut book = CounterBook::default();
    for limiter in 0..(MAX_SEEN as u32 + 3) {
        book.add(1, 1.0, u64::from(limiter) * SEC, Some(limiter), || {
            Some(Counting::Leak(0.0).into())
        });
    }
    book.add(1, 1.0, 100 * SEC, Some(5), || None);
    let seen = book.view(1, 100 * SEC).unwrap().seen;
    assert_eq!(seen.len(), MAX_SEEN);
    assert_eq!(
        seen[0],
        Seen {
            limiter: 5,
            at: 100 * SEC
        }
    );
    assert!(seen.iter().all(|s| s.limiter >= 3));
}

/// A key counter of template 1 for `limiter`, leaking at `limit`.
fn add_key(book: &mut CounterBook, key: u64, limiter: u32, limit: f64, now: Nanos) -> bool {
    let counter = CounterKey { id: 1, key };
    let delta = Delta {
        weight: 1.0,
        window: None,
    };
    book.add_counter(counter, delta, now, Some(limiter), || {
        Some(Counting::Leak(limit).into())
    })
}

#[test]
fn a_limiter_makes_at_most_its_share_of_key_counters() {
    let mut book = CounterBook::with_max_keys(100);
    let limits = KeyLimits::new(100, Some(10));
    book.limits = limits;
    let made = (1..=50)
        .filter(|&k| add_key(&mut book, k, 7, 0.0, 0))
        .count();
    assert_eq!((made, book.keys_of(7), book.keys_refused()), (10, 10, 40));
    // Another limiter is not held back, and adds to a key it did not make.
    assert!(add_key(&mut book, 1_000, 8, 0.0, 0));
    assert!(add_key(&mut book, 1, 8, 0.0, 0));
    assert_eq!((book.keys_of(7), book.keys_of(8)), (10, 1));
}

#[test]
fn a_full_book_makes_room_for_a_limiter_within_its_share_from_the_largest_holder() {
    let mut book = CounterBook::with_max_keys(8);
    book.limits = KeyLimits::new(8, Some(8));
    // One limiter's junk fills the book.
    for k in 1..=8 {
        assert!(add_key(&mut book, k, 1, 0.0, 0));
    }
    // Another limiter's key gets a place: the junk gives way, one key at
    // a time, while it holds more than the asker.
    assert!(add_key(&mut book, 100, 2, 0.0, 0));
    assert_eq!((book.keys_of(1), book.keys_of(2)), (7, 1));
    assert_eq!(book.keys_displaced(), 1);
    for k in 101..=103 {
        assert!(add_key(&mut book, k, 2, 0.0, 0), "{k}");
    }
    assert_eq!((book.keys_of(1), book.keys_of(2)), (4, 4));
    // Shared fairly now: the next asker holding as many is refused.
    assert!(!add_key(&mut book, 104, 2, 0.0, 0));
    assert_eq!(book.keys(), 8);
}

#[test]
fn a_full_book_first_takes_the_place_of_a_key_that_drained() {
    let mut book = CounterBook::with_max_keys(4);
    book.limits = KeyLimits::new(4, Some(4));
    for k in 1..=4 {
        assert!(add_key(&mut book, k, 1, 10.0, 0));
    }
    // A tenth of a second later every key (1 unit at 10/s) has drained:
    // a new key takes one's place, nothing displaced.
    assert!(add_key(&mut book, 5, 2, 10.0, SEC / 10));
    assert_eq!(book.keys_displaced(), 0);
    assert!(book.keys_forgotten() >= 1);
}

#[test]
fn a_window_templates_keys_give_their_places_the_moment_their_window_ends() {
    use crate::core::window::{Window, WindowRule};
    let rule = WindowRule {
        window: Window::TenSeconds,
        sliding: false,
        utc_offset: 0,
    };
    let mut book = CounterBook::with_max_keys(3);
    book.limits = KeyLimits::new(3, Some(3));
    let add = |book: &mut CounterBook, key: u64, limiter: u32, now: Nanos| {
        let delta = Delta {
            weight: 1.0,
            window: None,
        };
        book.add_counter(CounterKey { id: 1, key }, delta, now, Some(limiter), || {
            Some(Counting::Window(rule).into())
        })
    };
    for k in 1..=3 {
        assert!(add(&mut book, k, 1, SEC));
    }
    // The same window: nothing drained, so the holder of the most keys
    // gives one way.
    assert!(add(&mut book, 4, 2, 9 * SEC));
    assert_eq!(book.keys_displaced(), 1);
    // The next window: every old key is empty, so a place is reclaimed
    // without displacing anything.
    assert!(add(&mut book, 5, 3, 10 * SEC));
    assert_eq!(book.keys_displaced(), 1);
}
