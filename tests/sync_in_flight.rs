//! In-flight quotas through the limiter's sync thread against a real
//! `sluice root` process: the local lease. While every root is silent a
//! host cannot hear the other hosts' releases; once the roots' lease has
//! passed (they drop this host's slots), it drops the other hosts' in
//! turn and limits by its own slots only. A root back replaces that view
//! and the hosts converge on it. Two root processes behind one URL each
//! count every slot, and neither is taken for a restart at every switch.
//! Held slots through a rolling upgrade of the root.

mod sync_support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::table::{CheckItem, HeldSlot, Outcome};
use sync_support::fake_root::{FakeRoot, Misbehaviour, Versioned};
use sync_support::{quota, wait_until, Db, Limiter, Root};

/// The roots' and the limiters' lease: long enough that a host is seen
/// counting the other hosts' slots after every root went silent, before
/// it.
const LEASE: Duration = Duration::from_secs(3);

const UPLOADS: CheckItem<'static> = CheckItem {
    name: b"uploads",
    key: None,
    weight: 1,
    max_wait: None,
};

/// Takes `n` slots of `uploads` on `l`; each must pass.
fn take(l: &Limiter, n: usize) -> Vec<HeldSlot> {
    (0..n)
        .map(|_| {
            let (r, held) = l.table.gate().acquire(&UPLOADS, l.now(), false, || 0.5);
            assert_eq!(r.outcome, Outcome::Pass, "{:?}", l.quota("uploads"));
            held.unwrap()
        })
        .collect()
}

/// Gives every slot of `held` back on `l`.
fn release(l: &Limiter, held: Vec<HeldSlot>) {
    for slot in held {
        assert!(l.table.gate().release(&UPLOADS, slot, l.now()));
    }
}

/// Slots `l` may still take now (taken and given back at once: they
/// cancel before any sync sees them).
fn room(l: &Limiter) -> usize {
    let mut taken = Vec::new();
    loop {
        let (r, held) = l.table.gate().acquire(&UPLOADS, l.now(), false, || 0.5);
        match (r.outcome, held) {
            (Outcome::Pass, Some(held)) => taken.push(held),
            _ => break,
        }
    }
    let n = taken.len();
    release(l, taken);
    n
}

fn level(l: &Limiter) -> f64 {
    l.quota("uploads").map_or(-1.0, |q| q.level)
}

fn root_level(root: &Root) -> f64 {
    root.get("uploads")["level"].as_f64().unwrap_or(0.0)
}

#[test]
fn a_host_admits_up_to_the_limit_less_its_own_slots_once_every_root_is_past_the_lease() {
    let db = Db::new();
    let config = db.dir().join("root.toml");
    std::fs::write(
        &config,
        format!("in_flight_lease = \"{}s\"\n", LEASE.as_secs()),
    )
    .unwrap();
    let mut root = Root::start_with(&db, "root", &["--config", config.to_str().unwrap()]);
    root.put("uploads", json!({"limit": 10, "in_flight": true}));
    let start = |id: &str| Limiter::start_with(id, &[&root.url], |c| c.in_flight_lease = LEASE);
    let (a, b) = (start("host-a"), start("host-b"));
    wait_until("both hosts hold the quota", || {
        a.quota("uploads").is_some() && b.quota("uploads").is_some()
    });
    let b_slots = take(&b, 6);
    let a_slots = take(&a, 2);
    wait_until("both hosts see the 8 slots", || {
        level(&a) == 8.0 && level(&b) == 8.0
    });
    assert_eq!(room(&a), 2);

    // The root dies while b holds 6 slots. Until the lease a keeps
    // counting them (b's releases could not reach it): strict.
    root.kill();
    wait_until("a sees every root down", || a.metrics().all_roots_down);
    assert_eq!(room(&a), 2, "before the lease");
    // Past the lease a counts its own 2 slots only: 8 more, not 9.
    wait_until("a's level drops to its own slots", || level(&a) == 2.0);
    assert_eq!(a.logged("in-flight lease"), 1);
    assert_eq!(a.table.books().held_here(b"uploads"), Some(2));
    let a_more = take(&a, 8);
    assert_eq!(room(&a), 0);
    wait_until("b's level drops to its own slots", || level(&b) == 6.0);

    // The root restarts knowing nothing. Each host sends what it owed it
    // since the outage (a's 8 new slots) and, finding it restarted, the
    // slots it held there before (a's 2, b's 6): the root counts every
    // slot held, 16 (above the limit by b's 6, which the lease let a
    // take again: the cut-off rule), and both hosts take its view.
    root.restart();
    let mut seen = (0.0, 0.0, 0.0);
    let converged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until("both hosts converge on the restarted root", || {
            seen = (root_level(&root), level(&a), level(&b));
            seen.0 == 16.0 && seen.1 == seen.0 && seen.2 == seen.0
        })
    }));
    assert!(converged.is_ok(), "root, a, b: {seen:?}");
    assert!(!a.metrics().all_roots_down && !b.metrics().all_roots_down);
    assert_eq!(a.table.books().held_here(b"uploads"), Some(10));

    // Every slot given back: every count comes down to nothing, none
    // stuck on a host, none counted twice.
    release(&a, a_slots);
    release(&a, a_more);
    release(&b, b_slots);
    wait_until("every count back to 0", || {
        root_level(&root) == 0.0 && level(&a) == 0.0 && level(&b) == 0.0
    });
    assert_eq!(room(&a), 10);
    assert_eq!(
        (
            a.table.books().held_here(b"uploads"),
            b.table.books().held_here(b"uploads")
        ),
        (Some(0), Some(0))
    );
}

fn addr(root: &Root) -> SocketAddr {
    root.url.trim_start_matches("http://").parse().unwrap()
}

/// Checks 2 units of `api` on `l` every 20 ms for `seconds`; the units
/// admitted.
fn load(l: &Limiter, seconds: f64) -> u64 {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut admitted = 0;
    while Instant::now() < end {
        if l.check("api", 2) {
            admitted += 2;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    admitted
}

/// Waits until `l` has synced `n` more times.
fn syncs(l: &Limiter, n: u64) {
    let from = l.syncs(0);
    wait_until("more syncs", || l.syncs(0) >= from + n);
}

#[test]
fn two_root_processes_behind_one_url_each_count_every_slot_and_no_restart_is_found() {
    let db = Db::new();
    let r0 = Root::start(&db, "root0");
    r0.put("uploads", json!({"limit": 10, "in_flight": true}));
    // A day's count far from its limit: a root's level is exactly the
    // weight it counted.
    let mut api = quota(1e9, 1e9, 1e9, None);
    api["window"] = "1d".into();
    r0.put("api", api);
    // Started after the quotas were written: it reads them as it starts.
    let r1 = Root::start(&db, "root1");
    let relay = FakeRoot::start(Misbehaviour::Alternate {
        roots: [addr(&r0), addr(&r1)],
    });
    let l = Limiter::start("host0", &[relay.url.as_str()], 0);
    wait_until("the limiter holds the quotas", || {
        l.quota("uploads").is_some() && l.quota("api").is_some()
    });

    // Slots come and go while the two processes answer in turn.
    let mut held = take(&l, 4);
    let mut admitted = load(&l, 1.0);
    release(&l, held.drain(..3).collect());
    held.extend(take(&l, 5));
    admitted += load(&l, 1.0);
    // Each process holds every slot (each request tells whichever answers
    // what the host holds), and the day's count is split between them,
    // each unit counted once.
    let want = held.len() as f64;
    let mut seen = (0.0, 0.0, 0.0);
    let exact = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until("each process counts every slot", || {
            let api = |r: &Root| r.get("api")["level"].as_f64().unwrap_or(0.0);
            seen = (root_level(&r0), root_level(&r1), api(&r0) + api(&r1));
            seen == (want, want, admitted as f64)
        })
    }));
    assert!(exact.is_ok(), "{want} held, {admitted} admitted: {seen:?}");
    syncs(&l, 4);
    assert_eq!((root_level(&r0), root_level(&r1)), (want, want));
    // The first reply of the second process cannot be told from a
    // restart; every later turn is a switch.
    let m = &l.metrics().roots[0];
    assert!(m.restarts <= 1, "{m:?}");
    assert!(m.switches >= 5, "{m:?}");
    assert_eq!(level(&l), want);

    release(&l, held);
    wait_until("every count back to 0", || {
        root_level(&r0) == 0.0 && root_level(&r1) == 0.0 && level(&l) == 0.0
    });
    assert_eq!(room(&l), 10);
}

#[test]
fn held_slots_reach_a_root_upgraded_under_a_limiter_then_rolled_back_exactly() {
    let db = Db::new();
    let root = Root::start(&db, "root");
    root.put("uploads", json!({"limit": 50, "in_flight": true}));
    let proxy = FakeRoot::start(Misbehaviour::Versioned { root: addr(&root) });
    proxy
        .mode
        .store(Versioned::PREDATES_HELD, Ordering::Release);
    let l = Limiter::start("host0", &[proxy.url.as_str()], 0);
    wait_until("the limiter holds the quota", || {
        l.quota("uploads").is_some()
    });
    let counts = |held: &[HeldSlot]| {
        let want = held.len() as f64;
        wait_until("the root counts the slots held", || {
            root_level(&root) == want
        });
        syncs(&l, 4);
        assert_eq!(root_level(&root), want);
    };

    // A root that predates held slots: numbered requests, slots counted
    // as adds and returns.
    let mut held = take(&l, 5);
    counts(&held);
    assert!(proxy.numbered.load(Ordering::Acquire) > 0);
    assert_eq!(proxy.held.load(Ordering::Acquire), 0);

    // Upgraded: its replies say it takes them, and every numbered request
    // carries them from then on.
    proxy.mode.store(Versioned::CURRENT, Ordering::Release);
    wait_until("held slots reported", || {
        proxy.held.load(Ordering::Acquire) >= 3
    });
    release(&l, held.drain(..2).collect());
    held.extend(take(&l, 4));
    counts(&held);

    // Replies lost for 2 s while slots come and go: every request reached
    // the root, and none counts a slot twice.
    proxy.mode.store(Versioned::REPLIES_LOST, Ordering::Release);
    for _ in 0..4 {
        held.extend(take(&l, 2));
        release(&l, held.drain(..1).collect());
        std::thread::sleep(Duration::from_millis(500));
    }
    proxy.mode.store(Versioned::CURRENT, Ordering::Release);
    counts(&held);

    // Rolled back: it refuses the next request that reports them, and
    // the limiter goes on without; nothing lost, nothing doubled.
    proxy
        .mode
        .store(Versioned::PREDATES_HELD, Ordering::Release);
    syncs(&l, 3);
    let reported = proxy.held.load(Ordering::Acquire);
    release(&l, held.drain(..3).collect());
    held.extend(take(&l, 1));
    counts(&held);
    assert_eq!(proxy.held.load(Ordering::Acquire), reported);

    release(&l, held);
    wait_until("every slot given back", || root_level(&root) == 0.0);
}

/// The slots of one key of `per_upload` at `root` (`keys?top=1`).
fn root_key_level(root: &Root) -> f64 {
    let (_, top) = sync_support::http(&root.url, "GET", "/v1/quotas/per_upload/keys?top=1", None)
        .expect("keys");
    top["keys"][0]["level"].as_f64().unwrap_or(0.0)
}

/// A rolling upgrade of the held slots of keys: a root that predates them
/// (`Versioned::PREDATES_KEYED_HELD`: numbered requests, a key's slots
/// counted as adds and returns), then upgraded (every numbered request
/// reports the keys it moves), replies lost meanwhile, then rolled back
/// (it refuses the next request that reports them, and the limiter goes
/// on without): the root counts the key's slots exactly throughout.
#[test]
fn keys_held_slots_reach_a_root_upgraded_under_a_limiter_then_rolled_back_exactly() {
    const ITEM: CheckItem<'static> = CheckItem {
        name: b"per_upload",
        key: Some(b"tenant-a"),
        weight: 1,
        max_wait: None,
    };
    let db = Db::new();
    let root = Root::start(&db, "root");
    root.put(
        "per_upload",
        json!({"limit": 50, "in_flight": true, "per_key": true}),
    );
    let proxy = FakeRoot::start(Misbehaviour::Versioned { root: addr(&root) });
    proxy
        .mode
        .store(Versioned::PREDATES_KEYED_HELD, Ordering::Release);
    let l = Limiter::start("host0", &[proxy.url.as_str()], 0);
    wait_until("the limiter holds the quota", || {
        l.quota("per_upload").is_some()
    });
    let take = |n: usize| -> Vec<HeldSlot> {
        (0..n)
            .map(|_| {
                let (r, held) = l.table.gate().acquire(&ITEM, l.now(), false, || 0.5);
                assert_eq!(r.outcome, Outcome::Pass);
                held.unwrap()
            })
            .collect()
    };
    let release = |held: Vec<HeldSlot>| {
        for slot in held {
            assert!(l.table.gate().release(&ITEM, slot, l.now()));
        }
    };
    let counts = |held: &[HeldSlot]| {
        let want = held.len() as f64;
        wait_until("the root counts the key's slots held", || {
            root_key_level(&root) == want
        });
        syncs(&l, 4);
        assert_eq!(root_key_level(&root), want);
    };

    let mut held = take(5);
    counts(&held);
    assert!(proxy.numbered.load(Ordering::Acquire) > 0);
    assert_eq!(proxy.keyed_held.load(Ordering::Acquire), 0);

    // Upgraded: the key's slots are reported with the requests that move
    // them.
    proxy.mode.store(Versioned::CURRENT, Ordering::Release);
    syncs(&l, 2);
    release(held.drain(..2).collect());
    held.extend(take(4));
    wait_until("keys' held slots reported", || {
        proxy.keyed_held.load(Ordering::Acquire) >= 1
    });
    counts(&held);

    // Replies lost for 2 s while slots come and go.
    proxy.mode.store(Versioned::REPLIES_LOST, Ordering::Release);
    for _ in 0..4 {
        held.extend(take(2));
        release(held.drain(..1).collect());
        std::thread::sleep(Duration::from_millis(500));
    }
    proxy.mode.store(Versioned::CURRENT, Ordering::Release);
    counts(&held);

    // Rolled back.
    proxy
        .mode
        .store(Versioned::PREDATES_KEYED_HELD, Ordering::Release);
    release(held.drain(..3).collect());
    held.extend(take(1));
    counts(&held);
    let reported = proxy.keyed_held.load(Ordering::Acquire);
    release(held.drain(..2).collect());
    counts(&held);
    assert_eq!(proxy.keyed_held.load(Ordering::Acquire), reported);

    release(held);
    wait_until("every slot given back", || root_key_level(&root) == 0.0);
}
