//! Numbered sync requests through a rolling upgrade, against a real
//! `sluice root` (docs/DESIGN.md, "Exactly once"). A proxy in this
//! process makes the root look as one that predates them
//! (`Versioned::PREDATES_SEQUENCES`: it answers the older reply format,
//! without the flag that says it takes them, and refuses a numbered
//! request as such a root does), then current, then rolled back; and it
//! loses the root's replies for a while after the root applied each
//! request.

mod sync_support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sync_support::fake_root::{FakeRoot, Misbehaviour, Versioned};
use sync_support::{quota, wait_until, Db, Limiter, Root};

fn level(root: &Root) -> f64 {
    root.get("api")["level"].as_f64().unwrap_or(0.0)
}

/// Checks `weight` units of `api` every 50 ms for `seconds`; the units
/// admitted.
fn load(limiter: &Limiter, weight: u64, seconds: f64) -> u64 {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut admitted = 0;
    while Instant::now() < end {
        if limiter.check("api", weight) {
            admitted += weight;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    admitted
}

/// Waits until the root counts `admitted`, then a few more syncs, and
/// checks it still does: nothing was counted twice.
fn counted_once(limiter: &Limiter, root: &Root, admitted: u64) {
    let want = admitted as f64;
    wait_until("the root counts what was admitted", || level(root) >= want);
    let syncs = limiter.syncs(0);
    wait_until("more syncs", || limiter.syncs(0) >= syncs + 5);
    let got = level(root);
    assert_eq!(got, want, "the root's count for {admitted} admitted");
}

#[test]
fn a_root_upgraded_under_a_limiter_then_rolled_back_counts_every_unit_once() {
    let db = Db::new();
    let root = Root::start(&db, "root0");
    // A day's count far from its limit: the root's level is exactly the
    // weight it counted (a leaky level sent late loses its leak, rounded
    // down to whole units).
    let mut api = quota(1e9, 1e9, 1e9, None);
    api["window"] = "1d".into();
    root.put("api", api);
    let addr: SocketAddr = root.url.trim_start_matches("http://").parse().unwrap();
    let proxy = FakeRoot::start(Misbehaviour::Versioned { root: addr });
    proxy
        .mode
        .store(Versioned::PREDATES_SEQUENCES, Ordering::Release);
    let limiter = Limiter::start("host0", &[proxy.url.as_str()], 0);
    wait_until("the limiter holds the quota", || {
        limiter.quota("api").is_some()
    });

    // An older root: requests go unnumbered, and count.
    let mut admitted = load(&limiter, 3, 1.0);
    counted_once(&limiter, &root, admitted);
    assert_eq!(proxy.numbered.load(Ordering::Acquire), 0);

    // Upgraded: its replies say it takes numbered requests, and the
    // limiter numbers them from then on.
    proxy.mode.store(Versioned::CURRENT, Ordering::Release);
    wait_until("numbered requests", || {
        proxy.numbered.load(Ordering::Acquire) >= 3
    });
    admitted += load(&limiter, 3, 0.5);
    counted_once(&limiter, &root, admitted);

    // Replies lost for 3 s (15 syncs) under load: every request reached
    // the root and is sent again until a reply comes; the root counts
    // each once.
    let errors = limiter.metrics().roots[0].errors;
    proxy.mode.store(Versioned::REPLIES_LOST, Ordering::Release);
    admitted += load(&limiter, 2, 3.0);
    assert!(limiter.metrics().roots[0].errors > errors + 3);
    proxy.mode.store(Versioned::CURRENT, Ordering::Release);
    counted_once(&limiter, &root, admitted);
    assert_eq!(limiter.metrics().roots[0].unconfirmed, 0);

    // Rolled back to a version that predates them: it refuses the next
    // numbered request, the limiter sends unnumbered ones again, and
    // nothing is lost.
    proxy
        .mode
        .store(Versioned::PREDATES_SEQUENCES, Ordering::Release);
    admitted += load(&limiter, 3, 1.0);
    counted_once(&limiter, &root, admitted);
    let numbered = proxy.numbered.load(Ordering::Acquire);
    let syncs = limiter.syncs(0);
    wait_until("more syncs", || limiter.syncs(0) >= syncs + 5);
    assert_eq!(proxy.numbered.load(Ordering::Acquire), numbered);
}
