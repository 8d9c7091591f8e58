//! The sync thread's encoding against real `sluice root` processes: binary
//! with a root that reads it, JSON with one that refuses it.
//!
//! A proxy in this process (`fake_root::Misbehaviour::Proxy`) stands
//! between the limiter and a real root: it counts binary requests and
//! can refuse them as a root older than the binary encoding does (400:
//! the body is not JSON) or as one that knows the type but not its
//! version (415). Everything else goes through to the real root.

mod sync_support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use sync_support::fake_root::{FakeRoot, Misbehaviour};
use sync_support::{quota, wait_until, Db, Limiter, Root};

fn addr(root: &Root) -> SocketAddr {
    root.url.trim_start_matches("http://").parse().unwrap()
}

/// Checks `weight` units of `api` on `limiter` and waits until the root
/// counts at least `level`.
fn counted(limiter: &Limiter, root: &Root, weight: u64, level: f64) {
    assert!(limiter.check("api", weight));
    wait_until("the root counts the weight", || {
        root.get("api")["level"]
            .as_f64()
            .is_some_and(|l| l >= level - 1.0)
    });
}

#[test]
fn a_limiter_syncs_in_binary_with_a_root_that_reads_it() {
    let db = Db::new();
    let root = Root::start(&db, "root0");
    root.put("api", quota(0.001, 1000.0, 1000.0, None));
    let proxy = FakeRoot::start(Misbehaviour::Proxy {
        root: addr(&root),
        refuse: None,
    });
    let limiter = Limiter::start("host0", &[proxy.url.as_str()], 0);
    wait_until("the limiter holds the quota", || {
        limiter.quota("api").is_some()
    });
    counted(&limiter, &root, 40, 40.0);
    let syncs = limiter.syncs(0);
    wait_until("more syncs", || limiter.syncs(0) >= syncs + 3);
    // Every request was binary, and none failed.
    let (requests, binary) = (
        proxy.requests.load(Ordering::Acquire),
        proxy.binary.load(Ordering::Acquire),
    );
    assert!(
        requests >= 4 && binary == requests,
        "{binary} of {requests}"
    );
    assert_eq!(limiter.metrics().roots[0].errors, 0);
}

/// A root behind a proxy that refuses binary with `status`: the limiter
/// asks again in JSON at once (no error, no lost weight), stays with JSON,
/// and tries binary again once the root restarts.
fn falls_back_to_json(status: u16) {
    let db = Db::new();
    let mut root = Root::start(&db, "root0");
    root.put("api", quota(0.001, 1000.0, 1000.0, None));
    let proxy = FakeRoot::start(Misbehaviour::Proxy {
        root: addr(&root),
        refuse: Some(status),
    });
    let limiter = Limiter::start("host0", &[proxy.url.as_str()], 0);
    wait_until("the limiter holds the quota", || {
        limiter.quota("api").is_some()
    });
    counted(&limiter, &root, 30, 30.0);
    let syncs = limiter.syncs(0);
    wait_until("more syncs", || limiter.syncs(0) >= syncs + 3);
    assert_eq!(proxy.binary.load(Ordering::Acquire), 1, "one binary try");
    assert!(proxy.requests.load(Ordering::Acquire) >= 5);
    assert_eq!(limiter.metrics().roots[0].errors, 0, "{:?}", limiter.log);

    // A restarted root may have been upgraded: binary is tried again
    // (refused again here), and syncs go on in JSON (a restarted root
    // starts its counters afresh).
    root.restart();
    wait_until("binary is tried again", || {
        proxy.binary.load(Ordering::Acquire) == 2
    });
    counted(&limiter, &root, 20, 20.0);
    assert_eq!(proxy.binary.load(Ordering::Acquire), 2);
}

#[test]
fn a_limiter_falls_back_to_json_for_a_root_that_answers_415() {
    falls_back_to_json(415);
}

#[test]
fn a_limiter_falls_back_to_json_for_a_root_that_predates_binary() {
    // Such a root reads any body as JSON: a binary one is a 400.
    falls_back_to_json(400);
}
