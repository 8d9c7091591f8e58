//! Root groups (shards) against a real cluster: two groups of two
//! `sluice root` processes each, all on one SQLite database, and limiters
//! (a table and its sync thread each, in this process) configured with the
//! groups, syncing every 200 ms.
//!
//! Which group serves a quota is [`sluice::sync::shard`] of its id; the
//! tests create quotas until they have one in each shard, and read at each
//! root the level it holds for them (`GET /v1/quotas/{name}`: the root's
//! own cluster level). As in `sync_cluster.rs`, bounds on counts are
//! generous (a loaded two-core CI machine) and nothing asserts on speed.

mod sync_support;

use std::sync::Arc;
use std::time::Duration;

use sluice::sync::{shard, SyncConfig, SyncHandle};
use sluice::wire::CounterKey;
use sync_support::{admitted, offer, quota, wait_until, Db, Limiter, Root, INTERVAL};

/// Each quota's limit, units per second.
const L: f64 = 400.0;
/// Level up to which everything passes.
const LOW: f64 = 200.0;
/// Level from which everything is rejected.
const HIGH: f64 = 400.0;

/// Two groups of two roots, and a quota in each shard: `(roots, names)`,
/// `names[g]` being served by group `g`.
fn groups(db: &Db) -> (Vec<Root>, [String; 2]) {
    let roots: Vec<Root> = (0..4)
        .map(|i| Root::start(db, &format!("root{i}")))
        .collect();
    let mut names: [Option<String>; 2] = [None, None];
    for i in 0.. {
        let name = format!("q{i}");
        roots[0].put(&name, quota(L, LOW, HIGH, None));
        let id = roots[0].get(&name)["id"].as_u64().expect("a quota id");
        let g = shard(CounterKey::named(id), 2);
        names[g].get_or_insert(name);
        if names.iter().all(Option::is_some) {
            break;
        }
        assert!(i < 64, "no quota in one of the shards");
    }
    (roots, names.map(Option::unwrap))
}

/// The limiter config for `roots` in groups `0, 0, 1, 1` (or the first
/// `n` of them, all in group 0, when `grouped` is false).
fn grouped(config: &mut SyncConfig, grouped: bool) {
    if grouped {
        config.root_groups = vec![0, 0, 1, 1];
    } else {
        config.roots.truncate(2);
    }
}

fn start(id: &str, roots: &[Root], with_groups: bool) -> Limiter {
    let urls: Vec<&str> = roots.iter().map(|r| r.url.as_str()).collect();
    Limiter::start_with(id, &urls, |c| grouped(c, with_groups))
}

/// The level root `root` holds for quota `name`.
fn level_at(root: &Root, name: &str) -> f64 {
    root.get(name)["level"].as_f64().unwrap_or(0.0)
}

/// Offers `rate` per second of quota `name` to each limiter, both quotas
/// at once, for `secs`; returns what was admitted of each.
fn offer_both(limiters: &[Limiter], names: &[String; 2], rate: f64, secs: u64) -> [f64; 2] {
    let load: Vec<_> = limiters.iter().map(|l| (l, rate)).collect();
    let duration = Duration::from_secs(secs);
    std::thread::scope(|s| {
        let a = s.spawn(|| admitted(&offer(&names[0], &load, duration)) as f64);
        let b = s.spawn(|| admitted(&offer(&names[1], &load, duration)) as f64);
        [a.join().unwrap(), b.join().unwrap()]
    })
}

fn wait_for_quotas(limiters: &[Limiter], names: &[String; 2]) {
    for l in limiters {
        for name in names {
            wait_until("every limiter holds both quotas", || {
                l.quota(name).is_some()
            });
        }
    }
}

#[test]
fn counters_of_each_shard_reach_only_their_group() {
    let db = Db::new();
    let (roots, names) = groups(&db);
    let limiters: Vec<Limiter> = (0..2)
        .map(|i| start(&format!("host{i}"), &roots, true))
        .collect();
    wait_for_quotas(&limiters, &names);
    // 2x overload on each quota, split over two hosts.
    let [a, b] = offer_both(&limiters, &names, L, 6);
    for (name, got) in names.iter().zip([a, b]) {
        let expected = L * 6.0 + HIGH;
        assert!(
            (0.85 * expected..=1.15 * expected).contains(&got),
            "{name}: admitted {got:.0}, fleet-wide {expected:.0}"
        );
    }
    // The levels are where the counters went: each group holds its own
    // shard's counter only.
    for (i, root) in roots.iter().enumerate() {
        let g = i / 2;
        assert!(level_at(root, &names[g]) > 0.0, "root {i} lacks its shard");
        assert_eq!(
            level_at(root, &names[1 - g]),
            0.0,
            "root {i} got another shard"
        );
    }
    for l in &limiters {
        let m = l.metrics();
        let groups: Vec<u32> = m.roots.iter().map(|r| r.group).collect();
        assert_eq!(groups, vec![0, 0, 1, 1]);
        assert!(m.roots.iter().all(|r| r.up), "{m:?}");
        assert!(m.groups_down.is_empty());
    }
}

#[test]
fn a_whole_group_down_leaves_its_shard_per_host_and_the_other_fleet_wide() {
    let db = Db::new();
    let (mut roots, names) = groups(&db);
    let limiters: Vec<Limiter> = (0..2)
        .map(|i| start(&format!("host{i}"), &roots, true))
        .collect();
    wait_for_quotas(&limiters, &names);
    roots[2].kill();
    roots[3].kill();
    for l in &limiters {
        wait_until("group 1 is down", || l.metrics().groups_down == vec![1]);
        assert!(!l.metrics().all_roots_down);
        assert_eq!(l.logged("every quota root of group 1 unreachable"), 1);
    }
    // Each host alone gets L of the shard-1 quota (two hosts: 2L), the
    // fleet L of the shard-0 one.
    let secs = 6.0;
    let [a, b] = offer_both(&limiters, &names, L, secs as u64);
    let fleet = L * secs + HIGH;
    assert!(
        (0.85 * fleet..=1.15 * fleet).contains(&a),
        "shard 0: admitted {a:.0}, fleet-wide {fleet:.0}"
    );
    let per_host = 2.0 * (L * secs + HIGH);
    assert!(
        b >= 0.85 * 2.0 * L * secs && b <= 1.15 * per_host,
        "shard 1: admitted {b:.0}, per host {per_host:.0}"
    );
    // The group comes back: its shard is fleet-wide again.
    roots[2].restart();
    roots[3].restart();
    for l in &limiters {
        wait_until("group 1 is back", || l.metrics().groups_down.is_empty());
        assert_eq!(l.logged("group 1 answers again"), 1);
    }
    let [_, b] = offer_both(&limiters, &names, L, 5);
    let fleet = L * 5.0 + HIGH;
    assert!(b <= 1.15 * fleet, "shard 1 after the group is back: {b:.0}");
}

#[test]
fn a_group_added_by_restarting_the_limiters_converges_within_two_intervals() {
    let db = Db::new();
    let (roots, names) = groups(&db);
    // One group first (roots 0 and 1): every counter goes there.
    let limiters: Vec<Limiter> = (0..2)
        .map(|i| start(&format!("host{i}"), &roots, false))
        .collect();
    wait_for_quotas(&limiters, &names);
    offer_both(&limiters, &names, L, 3);
    assert!(level_at(&roots[0], &names[1]) > 0.0);
    assert_eq!(level_at(&roots[2], &names[1]), 0.0);
    // The config gains group 1 (roots 2 and 3): each limiter's sync thread
    // restarts on the same table with it, as after a reload.
    let limiters: Vec<Limiter> = limiters
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let Limiter {
                table,
                sync,
                log,
                skew,
            } = l;
            sync.stop();
            let mut config = SyncConfig {
                roots: roots.iter().map(|r| r.url.clone()).collect(),
                interval: INTERVAL,
                timeout: Some(Duration::from_secs(1)),
                limiter_id: format!("host{i}"),
                ..SyncConfig::default()
            };
            grouped(&mut config, true);
            let sync = SyncHandle::start(Arc::clone(&table), config).expect("sync thread");
            Limiter {
                table,
                sync,
                log,
                skew,
            }
        })
        .collect();
    // Two intervals (cycles, not seconds: a slow machine stretches them).
    for l in &limiters {
        wait_until("two cycles with the new groups", || {
            let m = l.metrics();
            m.cycles >= 2 && m.roots[2].syncs >= 1 && m.roots[3].syncs >= 1
        });
    }
    // From then on both shards are fleet-wide: the moved counter's weight
    // reaches group 1 only, and the fleet admits the limit.
    let secs = 6.0;
    let [a, b] = offer_both(&limiters, &names, L, secs as u64);
    for (name, got) in names.iter().zip([a, b]) {
        // At most the burst left over from before, on top of the limit.
        let (lo, hi) = (0.85 * L * secs, 1.15 * (L * secs + HIGH));
        assert!((lo..=hi).contains(&got), "{name}: admitted {got:.0}");
    }
    for root in &roots[2..] {
        assert!(level_at(root, &names[1]) > 0.0, "group 1 holds its shard");
        assert_eq!(level_at(root, &names[0]), 0.0, "group 1 got shard 0");
    }
}
