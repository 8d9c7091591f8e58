//! In-flight quotas through the limiter's sync thread against a real
//! `sluice root` process: the local lease. While every root is silent a
//! host cannot hear the other hosts' releases; once the roots' lease has
//! passed (they drop this host's slots), it drops the other hosts' in
//! turn and limits by its own slots only. A root back replaces that view
//! and the hosts converge on it.

mod sync_support;

use std::time::Duration;

use serde_json::json;
use sluice::table::{CheckItem, HeldSlot, Outcome};
use sync_support::{wait_until, Db, Limiter, Root};

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
