//! Keys a root will not hold, through the sync engine and a real root
//! ledger whose per-limiter key share is two keys (one shard): the key
//! keeps its count at the host across replies, is checked as the overflow
//! mode says, ends its mark once a root holds it, and a root that
//! predates refusals is still read.

use super::*;
use crate::core::{Quota, Window};
use crate::root::counter_book::KeyLimits;
use crate::root::counter_shards::Counters;
use crate::root::ledger::{Ledger, SyncPaging};
use crate::table::{CheckItem, CheckOptions, KeyOverflow, Outcome};
use crate::wire::SyncResponse;

const SEC: Nanos = 1_000_000_000;

/// The root's instance.
const INSTANCE: u64 = 100;

/// Template `daily` (id 1): 10 a day per key.
fn quotas() -> Vec<Quota> {
    vec![Quota::new(1, "daily", 10.0, 10.0, 10.0)
        .windowed(Window::Day, false)
        .keyed()]
}

/// A root holding two keys of any one limiter (one shard: a share of 1
/// is 2 keys there, see `KeyLimits::per_shard`).
fn root() -> Ledger {
    let ledger = Ledger {
        counters: Counters::new(1, KeyLimits::new(1000, Some(1))),
        ..Ledger::default()
    };
    ledger.load(quotas(), 0);
    ledger
}

fn host(name: &str, mode: KeyOverflow) -> (Table, SyncEngine) {
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books().apply_quotas(&quotas());
    t.set_key_overflow(mode);
    let e = SyncEngine::new(&["http://root0".to_string()], name.into(), SEC, 100, 0);
    (t, e)
}

/// One cycle of `e` on `t` with root `r`, its reply changed by `edit`;
/// returns what the engine logged.
fn cycle(
    e: &mut SyncEngine,
    t: &Table,
    r: &Ledger,
    now: Nanos,
    edit: impl Fn(&mut SyncResponse),
) -> Vec<LogLine> {
    let paging = SyncPaging {
        quotas: 1000,
        counters: 1000,
    };
    let mut log = Vec::new();
    for o in e.begin_cycle(t, now) {
        let mut reply = r
            .sync(&o.request, INSTANCE, now, paging)
            .into_response(INSTANCE, now, 0);
        edit(&mut reply);
        let page = Page {
            sent_at: now,
            received_at: now,
            reply,
        };
        log.extend(e.finish(t, o.root, o.owed, &[page], None, now));
    }
    log.extend(e.end_cycle(t, now));
    log
}

/// One check of `key` on `daily` at `now`; true if it passed.
fn check(t: &Table, key: &str, now: Nanos) -> bool {
    let item = CheckItem {
        name: b"daily",
        key: Some(key.as_bytes()),
        weight: 1,
        max_wait: None,
    };
    let r = t
        .gate()
        .check_many(&[item], now, CheckOptions::default(), || 0.5);
    r.outcome == Outcome::Pass
}

/// Two keys fill the host's share at `r`, then `late` is checked three
/// times a cycle for twelve cycles; returns the checks of `late` that
/// passed, the time after, and the log.
fn late_after_two_keys(
    t: &Table,
    e: &mut SyncEngine,
    r: &Ledger,
    edit: impl Fn(&mut SyncResponse),
) -> (usize, Nanos, Vec<LogLine>) {
    let mut now = SEC;
    cycle(e, t, r, now, &edit);
    assert!(check(t, "a", now) && check(t, "b", now));
    now += SEC;
    cycle(e, t, r, now, &edit);
    let (mut passed, mut log) = (0, Vec::new());
    for _ in 0..12 {
        now += SEC;
        passed += (0..3).filter(|_| check(t, "late", now)).count();
        log.extend(cycle(e, t, r, now, &edit));
    }
    (passed, now, log)
}

/// The level of `key` of `daily` at the host.
fn level(t: &Table, key: &str, now: Nanos) -> f64 {
    let hash = t.key_secret().hash(key.as_bytes());
    let slot = t.gate().lookup(b"daily");
    t.keys(slot, now)
        .iter()
        .find(|k| k.hash == hash)
        .map_or(0.0, |k| k.level)
}

#[test]
fn a_key_the_root_refuses_keeps_its_count_reply_after_reply() {
    let (t, mut e) = host("h", KeyOverflow::Pass);
    let r = root();
    let (passed, now, log) = late_after_two_keys(&t, &mut e, &r, |_| {});
    // Its own count holds it to 10 (36 passed before: each reply that
    // made no counter of it released its weight).
    assert_eq!(passed, 10);
    assert_eq!(level(&t, "late", now), 10.0);
    // Refused once per reply that refused it, and said.
    assert!(t.key_stats().refused >= 4, "{:?}", t.key_stats());
    assert!(
        log.iter()
            .any(|(_, line)| line.contains("keys refused") && line.contains("own counts")),
        "{log:?}"
    );
}

#[test]
fn a_refused_key_in_reject_mode_is_rejected_with_its_count_kept() {
    let (t, mut e) = host("h", KeyOverflow::Reject);
    let r = root();
    let (passed, now, _) = late_after_two_keys(&t, &mut e, &r, |_| {});
    // The first three passed before the root refused it.
    assert_eq!(passed, 3);
    assert_eq!(level(&t, "late", now), 3.0);
}

#[test]
fn a_refused_key_counts_on_its_template_s_shared_counter_too() {
    let (t, mut e) = host("h", KeyOverflow::Shared);
    let r = root();
    let (passed, now, _) = late_after_two_keys(&t, &mut e, &r, |_| {});
    assert_eq!(passed, 10);
    // What the root refused went to the template's own counter, there.
    let template = r.counters.view(1, now).map_or(0.0, |v| v.level);
    assert_eq!(template, 10.0);
    // Another key is checked on its own count until a root refuses it,
    // then held to the template's too: at its limit, it is rejected.
    assert!(check(&t, "later", now));
    cycle(&mut e, &t, &r, now + SEC, |_| {});
    assert!(!check(&t, "later", now + SEC));
}

#[test]
fn a_refused_key_a_root_holds_later_keeps_its_count_and_loses_its_mark() {
    let (t, mut e) = host("h", KeyOverflow::Pass);
    let r = root();
    let mut now = SEC;
    cycle(&mut e, &t, &r, now, |_| {});
    assert!(check(&t, "a", now) && check(&t, "b", now));
    now += SEC;
    cycle(&mut e, &t, &r, now, |_| {});
    for _ in 0..4 {
        assert!(check(&t, "late", now));
    }
    now += SEC;
    cycle(&mut e, &t, &r, now, |_| {});
    let refused = t.key_stats().refused;
    assert_eq!(refused, 1);
    // Another host makes the key at the root (its own share has room).
    let (other, mut oe) = host("other", KeyOverflow::Pass);
    cycle(&mut oe, &other, &r, now, |_| {});
    assert!(check(&other, "late", now));
    cycle(&mut oe, &other, &r, now, |_| {});
    // This host's next delta counts there: the reply carries the key's
    // value (1 + 1), max-merged with the 4 this host kept (its own level
    // is a fold, as when every root is down): never below what it kept.
    now += SEC;
    assert!(check(&t, "late", now));
    cycle(&mut e, &t, &r, now, |_| {});
    assert_eq!(t.key_stats().refused, refused, "not refused again");
    assert_eq!(level(&t, "late", now), 4.0);
    // Held by the root now, and no longer under the overflow mode: its
    // count is the root's, 2 and this host's next 5.
    now += SEC;
    for _ in 0..5 {
        assert!(check(&t, "late", now));
    }
    cycle(&mut e, &t, &r, now, |_| {});
    assert_eq!(level(&t, "late", now), 7.0);
}

/// A rolling upgrade: a root that predates refusals never says which
/// keys it refused. Its replies are read as before (and the key's count
/// is released with them, as it was); nothing is marked refused.
#[test]
fn a_root_that_predates_refusals_is_read_as_before() {
    let (t, mut e) = host("h", KeyOverflow::Pass);
    let r = root();
    let older = |reply: &mut SyncResponse| reply.refused.clear();
    let (passed, _, log) = late_after_two_keys(&t, &mut e, &r, older);
    assert!(passed >= 10);
    assert_eq!(t.key_stats().refused, 0);
    assert!(!log.iter().any(|(_, l)| l.contains("keys refused")));
    assert!(e.metrics().roots[0].up && e.metrics().roots[0].errors == 0);
}
