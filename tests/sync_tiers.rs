//! Tiers per key through the limiter's sync thread against real `sluice
//! root` processes (two, on one SQLite database) and limiters in this
//! process, syncing every 200 ms: overrides written or edited at either
//! root reach every limiter without a restart, and a penalty started on
//! one limiter bars the key on the other within two sync intervals.
//!
//! Delays are counted in syncs, not seconds (see `sync_cluster.rs`).

mod sync_support;

use serde_json::{json, Value};
use sluice::core::key::format_hash;
use sluice::table::layout::{TIER_ALLOW, TIER_DENY, TIER_LIMIT, TIER_NONE};
use sluice::table::{Cause, CheckItem, CheckOptions, Outcome};
use sync_support::{http, wait_until, Db, Limiter, Root};

/// Two roots on one database and two limiters syncing with both, once
/// every limiter holds quota `name`.
fn cluster(db: &Db, name: &str, quota: Value) -> (Root, Root, Vec<Limiter>) {
    let (a, b) = (Root::start(db, "root0"), Root::start(db, "root1"));
    a.put(name, quota);
    let roots = [a.url.as_str(), b.url.as_str()];
    let limiters: Vec<Limiter> = (0..2)
        .map(|i| Limiter::start(&format!("host{i}"), &roots, 0))
        .collect();
    for l in &limiters {
        wait_until("every limiter holds the quota", || l.quota(name).is_some());
    }
    (a, b, limiters)
}

/// One check of `key` on the per-key quota `name`.
fn check(l: &Limiter, name: &str, key: &str) -> Outcome {
    let item = CheckItem {
        name: name.as_bytes(),
        key: Some(key.as_bytes()),
        weight: 1,
        max_wait: None,
    };
    l.table
        .gate()
        .check_many(&[item], l.now(), CheckOptions::default(), || 0.999_999)
        .outcome
}

fn cause(outcome: Outcome) -> Option<Cause> {
    match outcome {
        Outcome::Reject(r) => Some(r.cause),
        _ => None,
    }
}

/// Checks of `key` that pass out of `n`.
fn passes(l: &Limiter, name: &str, key: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| cause(check(l, name, key)).is_none())
        .count()
}

/// `PUT` (or with `None`, `DELETE`) of `key`'s override of `name` at
/// `root`, hashed as the limiters hash it.
fn set_override(root: &Root, l: &Limiter, name: &str, key: &str, body: Option<Value>) {
    let hash = format_hash(l.table.key_secret().hash(key.as_bytes()));
    let path = format!("/v1/quotas/{name}/overrides/{hash}");
    let method = if body.is_some() { "PUT" } else { "DELETE" };
    let reply = http(&root.url, method, &path, body.as_ref());
    assert!(
        matches!(reply, Some((200..=201, _))),
        "{method} {path}: {reply:?}"
    );
}

/// Most syncs with any root of limiter `l` so far.
fn syncs(l: &Limiter) -> u64 {
    l.syncs(0).max(l.syncs(1))
}

/// The kind of `key`'s override of `name` that limiter `l` holds.
fn held(l: &Limiter, name: &str, key: &str) -> u32 {
    let id = l.quota(name).unwrap().quota.id;
    let hash = l.table.key_secret().hash(key.as_bytes());
    l.table.tier(id, hash).map_or(TIER_NONE, |t| t.kind)
}

#[test]
fn overrides_written_at_either_root_reach_every_limiter() {
    let db = Db::new();
    // Slow enough to count in: 3 a key, about nothing leaks in the test.
    let template = json!({"limit": 0.001, "low_burst": 3, "high_burst": 3, "per_key": true});
    let (a, b, limiters) = cluster(&db, "api_user", template);
    let (l0, l1) = (&limiters[0], &limiters[1]);
    let numbers = json!({"limit": 0.001, "low_burst": 10, "high_burst": 10});
    set_override(&a, l0, "api_user", "paid", Some(numbers));
    set_override(&a, l0, "api_user", "partner", Some(json!({"allow": true})));
    set_override(&a, l0, "api_user", "stolen", Some(json!({"deny": true})));
    for l in &limiters {
        wait_until("the overrides reach every limiter", || {
            held(l, "api_user", "stolen") == TIER_DENY
                && held(l, "api_user", "paid") == TIER_LIMIT
                && held(l, "api_user", "partner") == TIER_ALLOW
        });
    }
    // Each key on its own numbers (each counted on one limiter: the two
    // count together).
    assert_eq!(passes(l0, "api_user", "free", 20), 3);
    assert_eq!(passes(l0, "api_user", "paid", 20), 10);
    assert_eq!(passes(l1, "api_user", "partner", 50), 50);
    for l in &limiters {
        assert_eq!(cause(check(l, "api_user", "stolen")), Some(Cause::Denied));
    }

    // Edited at the other root: from numbers to a deny, on both.
    let before: Vec<u64> = limiters.iter().map(syncs).collect();
    set_override(&b, l0, "api_user", "paid", Some(json!({"deny": true})));
    for (l, before) in limiters.iter().zip(&before) {
        wait_until("the edit reaches every limiter", || {
            held(l, "api_user", "paid") == TIER_DENY
        });
        // The writing root answers it at once; a limiter syncs with it
        // every interval (a loaded machine may take a sync more).
        let took = syncs(l) - before;
        assert!(took <= 4, "{took} syncs");
        assert_eq!(cause(check(l, "api_user", "paid")), Some(Cause::Denied));
    }
    // Removed: the template's numbers again (denied checks were not
    // counted: the key has all of its burst).
    set_override(&a, l0, "api_user", "stolen", None);
    for l in &limiters {
        wait_until("the removal reaches every limiter", || {
            held(l, "api_user", "stolen") == TIER_NONE
        });
    }
    assert_eq!(passes(l1, "api_user", "stolen", 20), 3);
}

#[test]
fn a_penalty_started_on_one_limiter_bars_the_key_on_the_other_within_two_intervals() {
    let db = Db::new();
    let template = json!({"limit": 0.001, "low_burst": 2, "high_burst": 2, "per_key": true,
                          "penalty": "15m"});
    let (_a, _b, limiters) = cluster(&db, "login", template);
    let (l0, l1) = (&limiters[0], &limiters[1]);
    let id = l0.quota("login").unwrap().quota.id;
    let hash = l0.table.key_secret().hash(b"mallory");
    // Two pass, the third reaches the high burst and starts the penalty.
    assert_eq!(passes(l0, "login", "mallory", 2), 2);
    assert_eq!(cause(check(l0, "login", "mallory")), Some(Cause::Penalty));
    let before = syncs(l1);
    wait_until("the penalty reaches the other limiter", || {
        l1.table.tier(id, hash).is_some_and(|t| t.until > 0)
    });
    // Host 0 sends it in its next sync (at most an interval), host 1 gets
    // it in its next sync after that.
    let took = syncs(l1) - before;
    assert!(took <= 3, "{took} syncs");
    let Outcome::Reject(r) = check(l1, "login", "mallory") else {
        panic!("the penalty bars the key")
    };
    assert_eq!(r.cause, Cause::Penalty);
    let sluice::core::Wait::Seconds(wait) = r.wait else {
        panic!("{:?}", r.wait)
    };
    assert!(wait > 14.0 * 60.0 && wait <= 16.0 * 60.0, "{wait}");
    // Other keys pass.
    assert_eq!(passes(l1, "login", "alice", 2), 2);
}
