//! The sync engine's tests (`engine.rs`), driven without a network:
//! replies are built by hand, roots fail by giving no page.

use super::*;
use crate::core::Quota;
use crate::sync::early::EARLY_PROBES_PER_INTERVAL;
use crate::sync::request::next_page;
use crate::table::Outcome;
use crate::wire::{CounterDelta, CounterKey, CounterValue, KeyDelta, QuotaCursor, SyncRequest};

const SEC: Nanos = 1_000_000_000;

fn table() -> Table {
    table_with(10.0)
}

/// A table with quota `q` (id 1) leaking at `limit`.
fn table_with(limit: f64) -> Table {
    let t = Table::new_heap(8, 16);
    t.books()
        .apply_quotas(&[Quota::new(1, "q", limit, 100.0, 100.0)]);
    t
}

fn reply(level: f64, at: Nanos) -> SyncResponse {
    SyncResponse {
        keyed: Vec::new(),
        root_instance: 7,
        root_time: at,
        quotas: vec![],
        quotas_after: QuotaCursor { epoch: 1, id: 1 },
        more_quotas: false,
        counters: vec![CounterValue {
            id: 1,
            level,
            at,
            prev: 0.0,
        }],
        counter_version: 1,
        root_utc: None,
        ..Default::default()
    }
}

fn page(level: f64, at: Nanos) -> Page {
    Page {
        sent_at: at,
        received_at: at,
        reply: reply(level, at),
    }
}

/// A reply at `at` that reports no counter (none changed).
fn quiet_page(at: Nanos) -> Page {
    let mut page = page(0.0, at);
    page.reply.counters.clear();
    page
}

/// One cycle at `now` in which every root answers `pages(root)`
/// (no page: the root failed).
fn cycle(
    e: &mut SyncEngine,
    t: &Table,
    now: Nanos,
    pages: impl Fn(usize) -> Vec<Page>,
) -> Vec<Outgoing> {
    let out = e.begin_cycle(t, now);
    for o in &out {
        let pages = pages(o.root);
        let error = pages.is_empty().then(|| "down".to_string());
        e.finish(t, o.root, o.owed.clone(), &pages, error, now);
    }
    e.end_cycle(t, now);
    out
}

fn deltas_to(out: &[Outgoing], root: usize) -> Vec<CounterDelta> {
    let o = out.iter().find(|o| o.root == root).expect("a request");
    o.request.deltas.clone()
}

#[test]
fn the_first_answer_acknowledges_and_the_second_only_merges() {
    let t = table();
    let roots = ["http://a".to_string(), "http://b".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    for _ in 0..5 {
        assert_eq!(t.gate().check(b"q", 2, 0), Outcome::Pass);
    }
    let out = e.begin_cycle(&t, SEC);
    assert_eq!(out.len(), 2);
    assert_eq!(
        out[0].request.deltas,
        vec![CounterDelta {
            id: 1,
            delta: 10,
            window: None
        }]
    );
    let st = t.quota(b"q", SEC).unwrap();
    assert_eq!((st.pending, st.unacked), (0, 10));
    e.finish(&t, 0, out[0].owed.clone(), &[page(30.0, SEC)], None, SEC);
    assert_eq!(t.quota(b"q", SEC).unwrap().unacked, 0);
    assert_eq!(t.quota(b"q", SEC).unwrap().level, 30.0);
    e.finish(&t, 1, out[1].owed.clone(), &[page(25.0, SEC)], None, SEC);
    let st = t.quota(b"q", SEC).unwrap();
    assert_eq!((st.unacked, st.level), (0, 30.0));
}

#[test]
fn a_counter_whose_quota_moved_slots_since_collection_is_merged_where_it_is_now() {
    let t = table();
    let mut e = SyncEngine::new(&["http://a".to_string()], "h".into(), SEC, 100, 0);
    assert_eq!(t.gate().check(b"q", 4, 0), Outcome::Pass);
    let out = e.begin_cycle(&t, SEC);
    // The reply renames quota 1: its old slot goes, a new one holds it.
    let mut page = page(30.0, SEC);
    let mut renamed = Quota::new(1, "q2", 10.0, 100.0, 100.0);
    renamed.epoch = 3;
    page.reply.quotas = vec![Quota::tombstone(1, "q", 2), renamed];
    e.finish(&t, 0, out[0].owed.clone(), &[page], None, SEC);
    assert!(t.quota(b"q", SEC).is_none());
    assert_eq!(t.quota(b"q2", SEC).unwrap().level, 30.0);
}

#[test]
fn rejections_since_the_last_cycle_go_to_every_root() {
    // Limit 0, burst 100: the table rejects everything above 100.
    let t = table_with(0.0);
    let roots = ["http://a".to_string(), "http://b".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    assert_eq!(t.gate().check(b"q", 100, 0), Outcome::Pass);
    assert_ne!(t.gate().check(b"q", 1, 0), Outcome::Pass);
    // The first cycle takes the baseline: an earlier sync thread (of a
    // worker that died) already reported what the zone holds.
    let out = e.begin_cycle(&t, SEC);
    assert!(out.iter().all(|o| o.request.rejected.is_empty()));
    for o in out {
        e.finish(&t, o.root, o.owed, &[page(100.0, SEC)], None, SEC);
    }
    for _ in 0..3 {
        assert_ne!(t.gate().check(b"q", 1, SEC), Outcome::Pass);
    }
    let out = e.begin_cycle(&t, 2 * SEC);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|o| o.request.rejected == [(1, 3)]));
    for o in out {
        e.finish(&t, o.root, o.owed, &[page(100.0, 2 * SEC)], None, 2 * SEC);
    }
    // Nothing new: nothing sent.
    let out = e.begin_cycle(&t, 3 * SEC);
    assert!(out.iter().all(|o| o.request.rejected.is_empty()));
}

#[test]
fn a_failed_root_is_owed_its_deltas_and_gets_them_next_time() {
    // Nothing leaks at a limit of 0: the whole delta is still owed.
    let t = table_with(0.0);
    let roots = ["http://a".to_string(), "http://b".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 4, 0);
    let out = e.begin_cycle(&t, SEC);
    e.finish(&t, 0, out[0].owed.clone(), &[page(4.0, SEC)], None, SEC);
    let logs = e.finish(&t, 1, out[1].owed.clone(), &[], Some("refused".into()), SEC);
    assert_eq!(logs.len(), 1);
    t.gate().check(b"q", 3, 0);
    // b backs off one interval; at 2 s it is due again with 4 + 3.
    let out = e.begin_cycle(&t, 2 * SEC);
    let to_b = out.iter().find(|o| o.root == 1).unwrap();
    assert_eq!(
        to_b.request.deltas,
        vec![CounterDelta {
            id: 1,
            delta: 7,
            window: None
        }]
    );
    let to_a = out.iter().find(|o| o.root == 0).unwrap();
    assert_eq!(
        to_a.request.deltas,
        vec![CounterDelta {
            id: 1,
            delta: 3,
            window: None
        }]
    );
    let m = e.metrics();
    assert!(m.roots[0].up && !m.roots[1].up);
}

#[test]
fn a_stopping_engine_hands_unacknowledged_weight_back_to_pending() {
    let t = table_with(0.0);
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 4, 0);
    // Sent, never answered.
    let _out = e.begin_cycle(&t, SEC);
    assert_eq!(t.quota(b"q", SEC).unwrap().unacked, 4);
    e.abandon(&t);
    let s = t.quota(b"q", SEC).unwrap();
    assert_eq!((s.pending, s.unacked), (4, 0));
    // The next engine sends it.
    let mut next = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    let out = next.begin_cycle(&t, 2 * SEC);
    assert_eq!(
        out[0].request.deltas,
        vec![CounterDelta {
            id: 1,
            delta: 4,
            window: None
        }]
    );
}

#[test]
fn a_root_that_never_answered_is_reported_unreachable_once() {
    let t = table();
    let roots = ["http://a".to_string(), "http://b".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    let mut about_b = 0;
    for s in 1..=10 {
        let now = s * SEC;
        for o in e.begin_cycle(&t, now) {
            let logs = if o.root == 0 {
                e.finish(&t, 0, o.owed, &[page(0.0, now)], None, now)
            } else {
                e.finish(&t, 1, o.owed, &[], Some("refused".into()), now)
            };
            about_b += logs.iter().filter(|l| l.1.contains("http://b")).count();
        }
        e.end_cycle(&t, now);
    }
    assert_eq!(about_b, 1);
    // When it comes back (once its backoff lets it be tried), that is
    // said once too.
    let mut back = Vec::new();
    for s in 11..=40 {
        let now = s * SEC;
        for o in e.begin_cycle(&t, now) {
            let logs = e.finish(&t, o.root, o.owed, &[page(0.0, now)], None, now);
            back.extend(logs.into_iter().filter(|l| l.1.contains("http://b")));
        }
        e.end_cycle(&t, now);
    }
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].0, LogLevel::Info);
}

#[test]
fn with_every_root_down_the_engine_counts_locally_and_says_so_once() {
    let t = table();
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 50, 0);
    let mut warnings = 0;
    for s in 1..=10 {
        let now = s * SEC;
        for o in e.begin_cycle(&t, now) {
            e.finish(&t, o.root, o.owed, &[], Some("down".into()), now);
        }
        warnings += e
            .end_cycle(&t, now)
            .iter()
            .filter(|l| l.0 == LogLevel::Warn)
            .count();
    }
    assert!(e.all_down());
    assert_eq!(warnings, 1);
    // Folded and leaked locally: 50 units at 10/s are gone after 10 s.
    let st = t.quota(b"q", 10 * SEC).unwrap();
    assert_eq!((st.pending, st.unacked, st.level), (0, 0, 0.0));
    // The root comes back: merged by max, and the log says so.
    let out = e.begin_cycle(&t, 20 * SEC);
    let logs = e.finish(
        &t,
        0,
        out[0].owed.clone(),
        &[page(60.0, 20 * SEC)],
        None,
        20 * SEC,
    );
    assert!(logs.iter().any(|l| l.1.contains("reachable again")));
    assert!(logs
        .iter()
        .any(|l| l.1.contains("cluster limiting resumed")));
    assert!(!e.all_down());
    assert!(e.end_cycle(&t, 20 * SEC).is_empty());
    assert_eq!(t.quota(b"q", 20 * SEC).unwrap().level, 60.0);
}

#[test]
fn keys_go_out_grouped_by_template_and_come_back_merged() {
    use crate::table::{CheckItem, CheckOptions};
    use crate::wire::{KeyValue, KeyedValues};
    let t = Table::new_heap_with_keys(8, 16, 64);
    t.books()
        .apply_quotas(&[Quota::new(3, "per_user", 10.0, 100.0, 100.0).keyed()]);
    for (key, weight) in [(&b"alice"[..], 4), (b"bob", 1)] {
        let item = CheckItem {
            name: b"per_user",
            key: Some(key),
            weight,
            max_wait: None,
        };
        t.gate()
            .check_many(&[item], 0, CheckOptions::default(), || 0.5);
    }
    let (alice, bob) = (t.key_secret().hash(b"alice"), t.key_secret().hash(b"bob"));
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    let out = e.begin_cycle(&t, SEC);
    let request = &out[0].request;
    assert!(request.deltas.is_empty());
    assert_eq!(request.keyed.len(), 1);
    assert_eq!(request.keyed[0].id, 3);
    let mut sent = request.keyed[0].deltas.clone();
    sent.sort_by_key(|d| d.1);
    assert_eq!(sent, vec![KeyDelta(bob, 1), KeyDelta(alice, 4)]);
    // The root sums alice with another host's 6; bob is not reported.
    let mut reply = quiet_page(SEC);
    reply.reply.keyed = vec![KeyedValues {
        id: 3,
        values: vec![KeyValue(alice, 10.0, SEC)],
        prev: Vec::new(),
    }];
    e.finish(&t, 0, out[0].owed.clone(), &[reply], None, SEC);
    let keys = t.keys(None, SEC);
    let state = |h: u64| *keys.iter().find(|k| k.hash == h).unwrap();
    assert_eq!((state(alice).level, state(alice).unacked), (10.0, 0));
    // Bob's unit was acknowledged without a value: released.
    assert_eq!((state(bob).unacked, state(bob).pending), (0, 0));
}

#[test]
fn a_backlog_larger_than_a_request_goes_out_over_several_cycles() {
    use crate::table::{CheckItem, CheckOptions};
    let t = Table::new_heap_with_keys(8, 16, 256);
    t.books()
        .apply_quotas(&[Quota::new(3, "per_user", 0.0, 1e6, 1e6).keyed()]);
    let keys: Vec<String> = (0..50).map(|i| format!("user-{i}")).collect();
    for key in &keys {
        let item = CheckItem {
            name: b"per_user",
            key: Some(key.as_bytes()),
            weight: 2,
            max_wait: None,
        };
        t.gate()
            .check_many(&[item], 0, CheckOptions::default(), || 0.5);
    }
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 1000, 0);
    // A root takes 40 entries a request: 10 counters of 4 entries each.
    e.limit_request_entries(40);
    let mut sent = std::collections::HashMap::new();
    for s in 1..=8 {
        let out = cycle(&mut e, &t, s * SEC, |_| vec![quiet_page(s * SEC)]);
        let request = &out[0].request;
        assert!(request.entry_count() <= 40, "{request:?}");
        for group in &request.keyed {
            for d in &group.deltas {
                *sent.entry(d.0).or_insert(0) += d.1;
            }
        }
    }
    // Every key went out once, whole, within five cycles of ten.
    assert_eq!(sent.len(), 50);
    assert!(sent.values().all(|&w| w == 2), "{sent:?}");
}

/// A table with quotas `a` (id 1..) and `b` whose counters are in
/// different shards of two, leaking at 10/s; their ids.
fn two_shard_table() -> (Table, u64, u64) {
    let ids: Vec<u64> = (1..100).collect();
    let a = *ids
        .iter()
        .find(|&&i| crate::sync::shard(CounterKey::named(i), 2) == 0)
        .unwrap();
    let b = *ids
        .iter()
        .find(|&&i| crate::sync::shard(CounterKey::named(i), 2) == 1)
        .unwrap();
    let t = Table::new_heap(8, 16);
    t.books().apply_quotas(&[
        Quota::new(a, "a", 10.0, 100.0, 100.0),
        Quota::new(b, "b", 10.0, 100.0, 100.0),
    ]);
    (t, a, b)
}

fn page_of(counters: &[(u64, f64)], at: Nanos) -> Page {
    let mut page = quiet_page(at);
    page.reply.counters = counters
        .iter()
        .map(|&(id, level)| CounterValue {
            id,
            level,
            at,
            prev: 0.0,
        })
        .collect();
    page
}

#[test]
fn shards_spread_counters_and_one_group_is_shard_zero() {
    let mut per = [0usize; 4];
    for id in 1..=4000u64 {
        assert_eq!(crate::sync::shard(CounterKey::named(id), 1), 0);
        per[crate::sync::shard(CounterKey::named(id), 4)] += 1;
        // Keys of one template spread too.
        let key = CounterKey {
            id: 7,
            key: id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        };
        assert!(crate::sync::shard(key, 4) < 4);
    }
    assert!(per.iter().all(|&n| (900..1100).contains(&n)), "{per:?}");
}

#[test]
fn each_counter_goes_only_to_the_roots_of_its_shard() {
    let (t, a, b) = two_shard_table();
    let roots = ["http://g0a".into(), "http://g0b".into(), "http://g1".into()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    e.set_groups(&[0, 0, 1]);
    assert_eq!(e.groups(), 2);
    t.gate().check(b"a", 3, 0);
    t.gate().check(b"b", 5, 0);
    let out = cycle(&mut e, &t, SEC, |r| {
        vec![if r == 2 {
            page_of(&[(b, 5.0)], SEC)
        } else {
            page_of(&[(a, 3.0)], SEC)
        }]
    });
    let only = |id, delta| {
        vec![CounterDelta {
            id,
            delta,
            window: None,
        }]
    };
    assert_eq!(deltas_to(&out, 0), only(a, 3));
    assert_eq!(deltas_to(&out, 1), only(a, 3));
    assert_eq!(deltas_to(&out, 2), only(b, 5));
    // Every root was asked for quotas while none was known up; now
    // only group 0 is, and group 1 is asked for none.
    assert!(out.iter().all(|o| o.request.quotas_after != NO_QUOTAS));
    let out = cycle(&mut e, &t, 2 * SEC, |_| vec![quiet_page(2 * SEC)]);
    let cursor = |r: usize| {
        out.iter()
            .find(|o| o.root == r)
            .unwrap()
            .request
            .quotas_after
    };
    assert_ne!(cursor(0), NO_QUOTAS);
    assert_eq!(cursor(2), NO_QUOTAS);
    let st = |name: &[u8]| t.quota(name, 2 * SEC).unwrap();
    assert_eq!((st(b"a").unacked, st(b"b").unacked), (0, 0));
    assert_eq!(e.metrics().roots[2].group, 1);
}

#[test]
fn a_group_down_leaves_its_shard_per_host_and_the_other_fleet_wide() {
    let (t, a, b) = two_shard_table();
    let roots = ["http://g0".into(), "http://g1".into()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    e.set_groups(&[0, 1]);
    let mut warned = 0;
    for s in 1..=4 {
        let now = s * SEC;
        t.gate().check(b"a", 2, now);
        t.gate().check(b"b", 2, now);
        let out = e.begin_cycle(&t, now);
        for o in out {
            if o.root == 0 {
                // Group 0 holds the others' 50 on top of this host's.
                let page = page_of(&[(a, 50.0 + 2.0 * s as f64)], now);
                e.finish(&t, 0, o.owed, &[page], None, now);
            } else {
                e.finish(&t, 1, o.owed, &[], Some("down".into()), now);
            }
        }
        let logs = e.end_cycle(&t, now);
        warned += logs.iter().filter(|l| l.1.contains("group 1")).count();
    }
    assert_eq!(warned, 1);
    assert!(!e.all_down());
    assert_eq!(e.metrics().groups_down, vec![1]);
    let st = |name: &[u8]| t.quota(name, 4 * SEC).unwrap();
    // Shard 0: the fleet's level. Shard 1: this host's weight folded
    // locally, nothing left unacked.
    assert_eq!(st(b"a").level, 58.0);
    assert_eq!(st(b"b").unacked, 0);
    assert!(st(b"b").level > 0.0 && st(b"b").level <= 8.0);
    // Group 1 comes back: its shard is fleet-wide again.
    let now = 5 * SEC;
    let out = e.begin_cycle(&t, now);
    let mut logs = Vec::new();
    for o in out {
        let page = page_of(&[if o.root == 0 { (a, 60.0) } else { (b, 70.0) }], now);
        logs.extend(e.finish(&t, o.root, o.owed, &[page], None, now));
    }
    e.end_cycle(&t, now);
    assert!(logs.iter().any(|l| l.1.contains("group 1 answers again")));
    assert!(e.metrics().groups_down.is_empty());
    assert_eq!(t.quota(b"b", now).unwrap().level, 70.0);
}

#[test]
fn later_pages_carry_no_deltas() {
    let first = SyncRequest {
        keyed: Vec::new(),
        rejected: Vec::new(),
        limiter: "h".into(),
        quotas_after: QuotaCursor::default(),
        counter_version: 0,
        root_instance: 0,
        deltas: vec![CounterDelta {
            id: 1,
            delta: 1,
            window: None,
        }],
        ..Default::default()
    };
    let mut r = reply(1.0, 0);
    assert!(next_page(&first, &r).is_none());
    r.more_quotas = true;
    r.quotas = vec![Quota::new(2, "x", 1.0, 1.0, 1.0)];
    let next = next_page(&first, &r).unwrap();
    assert!(next.deltas.is_empty());
    assert_eq!(next.quotas_after, r.quotas_after);
}

#[test]
fn deltas_owed_to_a_failed_root_leak_at_the_limit_until_resent() {
    let t = table();
    let roots = ["http://a".to_string(), "http://b".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 40, 0);
    // a takes the 40; b fails and backs off one interval.
    cycle(&mut e, &t, SEC, |r| {
        if r == 0 {
            vec![page(40.0, SEC)]
        } else {
            vec![]
        }
    });
    t.gate().check(b"q", 5, 0);
    let out = cycle(&mut e, &t, 3 * SEC, |_| vec![page(45.0, 3 * SEC)]);
    // Two seconds at 10/s took 20 off the 40 owed to b; the fresh 5
    // goes to both in full.
    assert_eq!(
        deltas_to(&out, 1),
        vec![CounterDelta {
            id: 1,
            delta: 25,
            window: None
        }]
    );
    assert_eq!(
        deltas_to(&out, 0),
        vec![CounterDelta {
            id: 1,
            delta: 5,
            window: None
        }]
    );
}

#[test]
fn a_root_back_after_a_long_outage_gets_fresh_deltas_but_no_backlog() {
    let t = table();
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 50, 0);
    for s in 1..24 {
        cycle(&mut e, &t, s * SEC, |_| vec![]);
    }
    assert!(e.all_down());
    t.gate().check(b"q", 3, 24 * SEC);
    let out = cycle(&mut e, &t, 24 * SEC, |_| vec![page(3.0, 24 * SEC)]);
    // The 50 collected at 1 s leaked away long ago (10/s).
    assert_eq!(
        out[0].request.deltas,
        vec![CounterDelta {
            id: 1,
            delta: 3,
            window: None
        }]
    );
    assert!(!e.all_down());
}

#[test]
fn a_dead_root_backs_off_while_another_is_up_and_not_when_none_is() {
    let t = table();
    let roots = ["http://a".to_string(), "http://b".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    let asked = |out: &[Outgoing]| out.iter().map(|o| o.root).collect::<Vec<_>>();
    let mut b_asked = Vec::new();
    for s in 1..=16 {
        let out = cycle(&mut e, &t, s * SEC, |r| {
            if r == 0 {
                vec![quiet_page(s * SEC)]
            } else {
                vec![]
            }
        });
        if asked(&out).contains(&1) {
            b_asked.push(s);
        }
    }
    // Every cycle, then every 2nd, 4th and 8th.
    assert_eq!(b_asked, vec![1, 2, 4, 8, 16]);
    // a goes down too: from then on both are tried every cycle.
    for s in 17..=20 {
        let out = cycle(&mut e, &t, s * SEC, |_| vec![]);
        if s > 17 {
            assert_eq!(asked(&out), vec![0, 1], "at {s} s");
        }
    }
}

#[test]
fn a_root_still_answering_is_left_out_of_later_cycles() {
    let t = table_with(0.0);
    let roots = ["http://a".to_string(), "http://b".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 4, 0);
    let first = e.begin_cycle(&t, SEC);
    e.finish(&t, 0, first[0].owed.clone(), &[page(4.0, SEC)], None, SEC);
    e.end_cycle(&t, SEC);
    // b has not answered; the next cycles ask only a, and owe b more.
    t.gate().check(b"q", 3, 0);
    for s in 2..=4 {
        let out = e.begin_cycle(&t, s * SEC);
        assert_eq!(out.iter().map(|o| o.root).collect::<Vec<_>>(), vec![0]);
        e.finish(
            &t,
            0,
            out[0].owed.clone(),
            &[page(7.0, s * SEC)],
            None,
            s * SEC,
        );
        e.end_cycle(&t, s * SEC);
    }
    // b's answer finally arrives; the next cycle asks it again, with
    // the 3 it has not had yet.
    e.finish(
        &t,
        1,
        first[1].owed.clone(),
        &[page(4.0, SEC)],
        None,
        4 * SEC,
    );
    let out = e.begin_cycle(&t, 5 * SEC);
    assert_eq!(
        deltas_to(&out, 1),
        vec![CounterDelta {
            id: 1,
            delta: 3,
            window: None
        }]
    );
}

#[test]
fn early_sync_is_due_when_unsent_weight_passes_its_share_of_the_band() {
    // Band 100..300: a tenth of it is 20 units.
    let t = Table::new_heap(8, 16);
    t.books()
        .apply_quotas(&[Quota::new(1, "q", 10.0, 100.0, 300.0)]);
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 25, 0);
    assert!(!e.early_sync_due(&t, SEC), "off by default");
    assert_eq!(e.early_probe_every(), None);
    e.set_early_sync(Some(EarlySync {
        fraction: 0.1,
        max_per_second: 2.0,
    }));
    assert_eq!(e.early_probe_every(), Some(SEC / EARLY_PROBES_PER_INTERVAL));
    assert!(e.early_sync_due(&t, SEC));
    // At most two a second: not again within half a second, even
    // with more weight waiting.
    e.begin_cycle(&t, SEC);
    t.gate().check(b"q", 25, 0);
    assert!(!e.early_sync_due(&t, SEC + SEC / 4));
    assert!(e.early_sync_due(&t, SEC + SEC / 2));
    // Once sent, the weight no longer calls for one.
    e.begin_cycle(&t, SEC + SEC / 2);
    t.gate().check(b"q", 19, 0);
    assert!(!e.early_sync_due(&t, 3 * SEC));
}

#[test]
fn a_resend_that_leaked_to_nothing_still_clears_unacked_weight() {
    let t = table_with(1000.0);
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 40, 0);
    cycle(&mut e, &t, SEC, |_| vec![]);
    assert_eq!(t.quota(b"q", SEC).unwrap().unacked, 40);
    // One interval later the 40 (1000/s) are long gone: nothing to
    // send, but the root's answer covers them.
    let out = cycle(&mut e, &t, 2 * SEC, |_| vec![quiet_page(2 * SEC)]);
    assert!(out[0].request.deltas.is_empty());
    assert_eq!(out[0].owed[&CounterKey::named(1)].weight, 40);
    let st = t.quota(b"q", 2 * SEC).unwrap();
    assert_eq!((st.pending, st.unacked), (0, 0));
}

#[test]
fn a_repeated_request_after_a_lost_reply_counts_only_what_has_not_leaked() {
    // The root got the request but its reply was lost: the 100 are
    // owed again. Resent after 1 s at 60/s, only 40 count twice.
    let t = table_with(60.0);
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    t.gate().check(b"q", 100, 0);
    cycle(&mut e, &t, SEC, |_| vec![]);
    let out = cycle(&mut e, &t, 2 * SEC, |_| vec![page(100.0, 2 * SEC)]);
    assert_eq!(
        out[0].request.deltas,
        vec![CounterDelta {
            id: 1,
            delta: 40,
            window: None
        }]
    );
}

#[test]
fn a_counter_no_root_reports_is_known_unchanged_and_not_extrapolated() {
    let t = table();
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    cycle(&mut e, &t, SEC, |_| vec![page(50.0, SEC)]);
    cycle(&mut e, &t, 2 * SEC, |_| vec![page(100.0, 2 * SEC)]);
    // The others filled 50/s, then 60/s: smoothed 42.5/s.
    let st = t.quota(b"q", 2 * SEC).unwrap();
    assert_eq!((st.level, st.fill_rate), (100.0, 42.5));
    // The root says nothing changed up to 3 s: 100 leaked 1 s at 10/s,
    // no extrapolated fill on top, and the fill rate halves.
    cycle(&mut e, &t, 3 * SEC, |_| vec![quiet_page(3 * SEC)]);
    let st = t.quota(b"q", 3 * SEC).unwrap();
    assert_eq!((st.level, st.fill_rate), (90.0, 21.25));
}

#[test]
fn a_reply_still_paging_quotas_says_nothing_about_counters() {
    let t = table();
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    cycle(&mut e, &t, SEC, |_| vec![page(50.0, SEC)]);
    cycle(&mut e, &t, 2 * SEC, |_| vec![page(100.0, 2 * SEC)]);
    let mut paging = quiet_page(3 * SEC);
    paging.reply.more_quotas = true;
    cycle(&mut e, &t, 3 * SEC, |_| vec![paging.clone()]);
    assert_eq!(t.quota(b"q", 2 * SEC).unwrap().fill_rate, 42.5);
}

#[test]
fn penalties_go_to_a_root_that_takes_tiers_a_quarter_of_a_request_at_a_time() {
    use crate::core::tier::PenaltyTime;
    let t = Table::new_heap_with(8, 16, 256, 256);
    let fifteen = Some(PenaltyTime::parse("15m").unwrap());
    t.books()
        .apply_quotas(&[Quota::new(1, "login", 0.0, 1.0, 1.0)
            .keyed()
            .penalized(fifteen)]);
    // 30 keys each rejected at the high burst: 30 penalties.
    for k in 0..30u32 {
        let key = k.to_le_bytes();
        for _ in 0..2 {
            let item = crate::table::CheckItem {
                name: b"login",
                key: Some(&key),
                weight: 1,
                max_wait: None,
            };
            t.gate()
                .check_many(&[item], 0, crate::table::CheckOptions::default(), || 0.5);
        }
    }
    assert_eq!(t.tier_stats().started, 30);
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 1000, 0);
    e.limit_request_entries(40);
    let tiers_page = |at: Nanos| {
        let mut p = quiet_page(at);
        p.reply.takes_tiers = true;
        vec![p]
    };
    // The root has not said it takes tiers: none is sent (an older root
    // would refuse the field).
    let out = cycle(&mut e, &t, SEC, |_| tiers_page(SEC));
    assert!(
        out[0].request.tiers.is_empty(),
        "{:?}",
        out[0].request.tiers
    );
    // Now it has: every penalty held, at most 10 (a quarter of 40) a
    // request, until all went.
    let mut sent = std::collections::HashSet::new();
    for s in 2..=6 {
        let out = cycle(&mut e, &t, s * SEC, |_| tiers_page(s * SEC));
        let request = &out[0].request;
        assert!(request.tiers.penalties.len() <= 10, "{s}");
        assert!(request.entry_count() <= 40);
        sent.extend(request.tiers.penalties.iter().map(|p| p.key()));
    }
    assert_eq!(sent.len(), 30);
}

#[test]
fn a_penalty_started_here_brings_on_an_early_cycle_with_early_sync_off() {
    use crate::core::tier::PenaltyTime;
    let t = Table::new_heap_with(8, 16, 0, 64);
    t.books()
        .apply_quotas(&[Quota::new(1, "login", 0.0, 2.0, 2.0)
            .penalized(Some(PenaltyTime::parse("15m").unwrap()))]);
    let roots = ["http://a".to_string()];
    let mut e = SyncEngine::new(&roots, "h".into(), SEC, 100, 0);
    assert_eq!(e.probe_every(), SEC / EARLY_PROBES_PER_INTERVAL);
    assert!(!e.early_sync_due(&t, SEC), "nothing to send");
    // Two pass, the third reaches the high burst: a penalty starts.
    for _ in 0..3 {
        t.gate().check(b"login", 1, 0);
    }
    assert!(t.books().has_unsent_penalties());
    assert!(e.early_sync_due(&t, SEC));
    // At most PENALTY_SYNCS_PER_SECOND: not again at once.
    assert!(!e.early_sync_due(&t, SEC + 1));
    // Once the cycle took it, nothing is due.
    e.begin_cycle(&t, SEC);
    assert!(!t.books().has_unsent_penalties());
    assert!(!e.early_sync_due(&t, 3 * SEC));
}
