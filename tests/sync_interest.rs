//! Replies by interest against a real `sluice root` process (docs/DESIGN.md,
//! "Replies by interest"): a host is sent the named counters and the keys
//! it holds, never another host's keys, and every count stays exact.
//!
//! The first test speaks the protocol by hand (JSON over HTTP), so that
//! each reply can be read whole; the second runs two real limiters (a
//! table and its sync thread each) and looks at what their tables hold.

mod sync_support;

use std::sync::Arc;

use serde_json::{json, Value};
use sluice::table::Table;
use sync_support::{http, wait_until, Db, Limiter, Root};

/// A host speaking the sync protocol by hand: its cursor and numbers.
struct Host {
    id: &'static str,
    incarnation: u64,
    seq: u64,
    version: u64,
    instance: u64,
    quotas_after: Value,
}

impl Host {
    fn new(id: &'static str, incarnation: u64) -> Self {
        Self {
            id,
            incarnation,
            seq: 0,
            version: 0,
            instance: 0,
            quotas_after: json!({"epoch": 0, "id": 0}),
        }
    }

    /// One numbered sync with `named` deltas `(id, weight)`, `keyed`
    /// deltas `(key, weight)` of template `template`, and an interest list
    /// (`(full, keys)`); returns the reply after taking its cursors.
    fn sync(
        &mut self,
        root: &Root,
        named: &[(u64, u64)],
        (template, keyed): (u64, &[(u64, u64)]),
        interest: Option<(bool, &[u64])>,
    ) -> Value {
        self.seq += 1;
        let mut request = json!({
            "limiter": self.id,
            "quotas_after": self.quotas_after,
            "counter_version": self.version,
            "root_instance": self.instance,
            "deltas": named.iter().map(|&(id, d)| json!({"id": id, "delta": d})).collect::<Vec<_>>(),
            "sequence": {"incarnation": self.incarnation, "seq": self.seq},
        });
        if !keyed.is_empty() {
            let deltas: Vec<Value> = keyed.iter().map(|&(k, d)| json!([k, d])).collect();
            request["keyed"] = json!([{"id": template, "deltas": deltas}]);
        }
        if let Some((full, keys)) = interest {
            request["interest"] = json!({"full": full, "keys": [{"id": template, "keys": keys}]});
        }
        let (status, reply) = http(&root.url, "POST", "/v1/sync", Some(&request)).unwrap();
        assert_eq!(status, 200, "{reply}");
        self.version = reply["counter_version"].as_u64().unwrap();
        self.instance = reply["root_instance"].as_u64().unwrap();
        self.quotas_after = reply["quotas_after"].clone();
        reply
    }
}

/// The reply's keys of template `id` as `key -> level`.
fn keys(reply: &Value, id: u64) -> Vec<(u64, f64)> {
    let mut out: Vec<(u64, f64)> = reply["keyed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["id"] == id)
        .flat_map(|g| g["values"].as_array().unwrap().iter())
        .map(|v| (v[0].as_u64().unwrap(), v[1].as_f64().unwrap()))
        .collect();
    out.sort_by_key(|&(k, _)| k);
    out
}

fn named(reply: &Value, id: u64) -> Option<f64> {
    reply["counters"]
        .as_array()?
        .iter()
        .find(|c| c["id"] == id)
        .and_then(|c| c["level"].as_f64())
}

fn id_of(reply: &Value, name: &str) -> u64 {
    reply["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == name)
        .and_then(|q| q["id"].as_u64())
        .unwrap()
}

#[test]
fn a_host_is_sent_its_own_keys_and_the_named_counters_with_exact_counts() {
    let db = Db::new();
    let root = Root::start(&db, "root");
    // No leak: a level is exactly the weight counted.
    root.put(
        "api",
        json!({"limit": 0, "low_burst": 1e6, "high_burst": 1e6}),
    );
    root.put(
        "per_user",
        json!({"limit": 0, "low_burst": 1e6, "high_burst": 1e6, "per_key": true, "parent": "api"}),
    );
    let (mut a, mut b) = (Host::new("host-a", 11), Host::new("host-b", 22));
    let first = a.sync(&root, &[], (0, &[]), None);
    b.sync(&root, &[], (0, &[]), None);
    let (api, user) = (id_of(&first, "api"), id_of(&first, "per_user"));
    // Before its list the root knows nothing of a host: it asks for it,
    // and sends every changed counter meanwhile.
    assert_eq!(first["takes_interest"], true);
    assert_eq!(first["wants_interest"], true);
    a.sync(&root, &[(api, 5)], (user, &[(0xa1, 5)]), None);
    let reply = b.sync(&root, &[(api, 3)], (user, &[(0xb1, 3)]), None);
    assert_eq!(keys(&reply, user), [(0xa1, 5.0), (0xb1, 3.0)]);
    // The whole lists: the root stops asking.
    let reply = a.sync(&root, &[], (user, &[]), Some((true, &[0xa1])));
    assert_eq!(reply.get("wants_interest"), None, "{reply}");
    let reply = b.sync(&root, &[], (user, &[]), Some((true, &[0xb1])));
    assert_eq!(reply.get("wants_interest"), None, "{reply}");
    // B changes its key and the named counter; A its key.
    b.sync(&root, &[(api, 2)], (user, &[(0xb1, 2)]), None);
    let reply = a.sync(&root, &[(api, 1)], (user, &[(0xa1, 1)]), None);
    assert_eq!(keys(&reply, user), [(0xa1, 6.0)], "{reply}");
    assert_eq!(named(&reply, api), Some(11.0));
    let reply = b.sync(&root, &[], (user, &[]), None);
    assert_eq!(keys(&reply, user), [], "{reply}");
    assert_eq!(named(&reply, api), Some(11.0));
    // A key A starts to hold is sent at once, though it last changed
    // before A's cursor.
    let reply = a.sync(&root, &[], (user, &[]), Some((false, &[0xb1])));
    assert_eq!(keys(&reply, user), [(0xb1, 5.0)], "{reply}");
    // From then on, B's changes to it reach A; A's own key did not move.
    b.sync(&root, &[], (user, &[(0xb1, 4)]), None);
    let reply = a.sync(&root, &[], (user, &[]), None);
    assert_eq!(keys(&reply, user), [(0xb1, 9.0)], "{reply}");
    // A whole list without 0xb1 lets it go again.
    a.sync(&root, &[], (user, &[]), Some((true, &[0xa1])));
    b.sync(&root, &[], (user, &[(0xb1, 1)]), None);
    let reply = a.sync(&root, &[], (user, &[]), None);
    assert_eq!(keys(&reply, user), [], "{reply}");
    // The root shows what it records: A's key and B's.
    let metric = |name: &str| metric(&root, name);
    assert_eq!(metric("sluice_root_interest_keys"), 2.0);
    assert_eq!(metric("sluice_root_interest_overflowed"), 0.0);
    // A restarted root knows nothing of A: it asks again and sends all.
    let mut root = root;
    root.restart();
    let reply = a.sync(&root, &[], (user, &[(0xa1, 1)]), None);
    assert_eq!(reply["wants_interest"], true);
}

/// The value of the root's metric `name` (a series without labels).
fn metric(root: &Root, name: &str) -> f64 {
    use std::io::{Read, Write};
    let addr = root.url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the scrape"))
}

#[test]
fn a_host_listing_more_keys_than_its_share_is_sent_every_counter_and_counted() {
    let db = Db::new();
    // A share of 16 keys: 4 shards or more take at least 2 each.
    let config = db.dir().join("root.toml");
    std::fs::write(&config, "sync_interest_per_limiter = 16\n").unwrap();
    let root = Root::start_with(&db, "root", &["--config", config.to_str().unwrap()]);
    root.put(
        "per_user",
        json!({"limit": 0, "low_burst": 1e6, "high_burst": 1e6, "per_key": true}),
    );
    let (mut a, mut b) = (Host::new("host-a", 11), Host::new("host-b", 22));
    let first = a.sync(&root, &[], (0, &[]), None);
    b.sync(&root, &[], (0, &[]), None);
    let user = id_of(&first, "per_user");
    // A claims 1,000 keys: past its share in every shard.
    let claimed: Vec<u64> = (1..=1000).collect();
    a.sync(&root, &[], (user, &[]), Some((true, &claimed)));
    b.sync(&root, &[], (user, &[]), Some((true, &[0xb1])));
    assert!(metric(&root, "sluice_root_interest_overflowed") >= 1.0);
    assert!(metric(&root, "sluice_root_interest_overflows_total") >= 1.0);
    assert!(metric(&root, "sluice_root_interest_keys") <= 16.0 + 1.0);
    // Its record let go of its keys: it is sent every changed key, as
    // before interest; B, within its share, only its own.
    b.sync(&root, &[], (user, &[(0xb1, 2), (0xb2, 3)]), None);
    let reply = a.sync(&root, &[], (user, &[]), None);
    assert_eq!(keys(&reply, user), [(0xb1, 2.0), (0xb2, 3.0)], "{reply}");
    let reply = b.sync(&root, &[], (user, &[(0xb1, 1)]), None);
    assert_eq!(keys(&reply, user), [(0xb1, 3.0)], "{reply}");
    let reply = a.sync(&root, &[], (user, &[(5, 1)]), None);
    assert_eq!(keys(&reply, user), [(5, 1.0), (0xb1, 3.0)], "{reply}");
}

/// A limiter syncing with `url`, with room for `keys` keys, once it
/// holds `per_user`. Every limiter uses the built-in key secret: a key
/// has one hash fleet-wide.
fn start(id: &str, url: &str, keys: u64) -> Limiter {
    let table = Arc::new(Table::new_heap_with(64, 16, keys, 1024));
    let l = Limiter::start_on(id, &[url], table, |_| {});
    wait_until("the limiter holds the quota", || {
        l.quota("per_user").is_some()
    });
    l
}

/// Waits until `l` synced `n` more times.
fn syncs(l: &Limiter, n: u64) {
    let from = l.syncs(0);
    wait_until("more syncs", || l.syncs(0) >= from + n);
}

/// Bytes `l` received from its root so far.
fn received(l: &Limiter) -> u64 {
    l.metrics().roots[0].bytes_received
}

#[test]
fn a_limiter_is_not_sent_the_keys_of_another_and_shares_the_count_of_a_common_one() {
    let db = Db::new();
    let root = Root::start(&db, "root");
    // No leak: the common key's count is what both admitted.
    root.put(
        "per_user",
        json!({"limit": 0, "low_burst": 100, "high_burst": 100, "per_key": true}),
    );
    let (a, b) = (
        start("host-a", &root.url, 1024),
        start("host-b", &root.url, 1024),
    );
    // Both use one key, 60 each: more than its burst of 100 together.
    let mut passed = 0;
    for _ in 0..60 {
        passed += u32::from(a.check_key("per_user", "common"));
        passed += u32::from(b.check_key("per_user", "common"));
    }
    assert!(passed >= 100, "{passed} of 120 passed before any sync");
    syncs(&a, 4);
    syncs(&b, 4);
    // B makes 400 keys of its own: A is sent none of them (20 bytes each
    // in the binary encoding, 8,000 in all).
    let before = received(&a);
    for i in 0..400 {
        assert!(b.check_key("per_user", &format!("b{i}")));
    }
    syncs(&b, 2);
    syncs(&a, 3);
    let got = received(&a) - before;
    assert!(got < 3000, "A received {got} bytes while B made 400 keys");
    // The common key is both's: each saw the other's count, and the limit
    // holds (its burst is full, nothing more passes).
    assert!(!a.check_key("per_user", "common"));
    assert!(!b.check_key("per_user", "common"));
    let (_, top) = http(&root.url, "GET", "/v1/quotas/per_user/keys?top=1", None).unwrap();
    assert_eq!(top["keys_held"], 401, "{top}");
    assert_eq!(top["keys"][0]["level"], f64::from(passed), "{top}");
}

/// Checks `n` keys `{prefix}{i}` once each and `common` `n` times at `l`.
fn touch(l: &Limiter, prefix: &str, n: usize) {
    for i in 0..n {
        assert!(l.check_key("per_user", &format!("{prefix}{i}")));
        assert!(l.check_key("per_user", "common"));
    }
}

/// A rolling upgrade through a proxy that makes the root look as one that
/// predates interest (`Versioned::PREDATES_INTEREST`), then current, then
/// rolled back; a second limiter syncs with the root directly. Counts are
/// exact throughout, and only the current root spares the first limiter
/// the second's keys.
#[test]
fn a_root_upgraded_to_interest_under_a_limiter_then_rolled_back_counts_every_unit_once() {
    use std::net::SocketAddr;
    use std::sync::atomic::Ordering;
    use sync_support::fake_root::{FakeRoot, Misbehaviour, Versioned};

    let db = Db::new();
    let root = Root::start(&db, "root");
    root.put(
        "per_user",
        json!({"limit": 0, "low_burst": 1e6, "high_burst": 1e6, "per_key": true}),
    );
    let addr: SocketAddr = root.url.trim_start_matches("http://").parse().unwrap();
    let proxy = FakeRoot::start(Misbehaviour::Versioned { root: addr });
    proxy
        .mode
        .store(Versioned::PREDATES_INTEREST, Ordering::Release);
    let (a, b) = (
        start("host-a", &proxy.url, 4096),
        start("host-b", &root.url, 4096),
    );
    // B's 300 new keys while A syncs three times: the bytes A receives.
    let keys_of_b = |prefix: &str| {
        let before = received(&a);
        touch(&b, prefix, 300);
        syncs(&b, 2);
        syncs(&a, 3);
        received(&a) - before
    };
    let (_, top) = http(&root.url, "GET", "/v1/quotas/per_user/keys?top=1", None).unwrap();
    assert_eq!(top["keys_held"], 0);
    let common = |expected: usize| {
        let (_, top) = http(&root.url, "GET", "/v1/quotas/per_user/keys?top=1", None).unwrap();
        assert_eq!(top["keys"][0]["level"], expected as f64, "{top}");
    };

    // An older root: no list is sent, and A is sent B's keys.
    touch(&a, "a", 10);
    syncs(&a, 2);
    let old = keys_of_b("b");
    assert_eq!(proxy.interest.load(Ordering::Acquire), 0);
    assert!(old > 5000, "A received {old} bytes of B's 300 keys");
    common(310);

    // Upgraded: it asks for A's list, A sends it, and B's keys stay away.
    proxy.mode.store(Versioned::CURRENT, Ordering::Release);
    wait_until("a list", || proxy.interest.load(Ordering::Acquire) >= 1);
    touch(&a, "a", 10);
    syncs(&a, 2);
    let new = keys_of_b("c");
    assert!(new < 3000, "A received {new} bytes of B's 300 keys");
    common(620);

    // Rolled back: the first list is refused as that root refuses it (the
    // binary format, then the JSON field), the limiter takes it as a root
    // before interest, and no list goes after; counts stay exact.
    proxy
        .mode
        .store(Versioned::PREDATES_INTEREST, Ordering::Release);
    touch(&a, "d", 10);
    syncs(&a, 4);
    let lists = proxy.interest.load(Ordering::Acquire);
    touch(&a, "f", 10);
    syncs(&a, 2);
    keys_of_b("e");
    assert_eq!(proxy.interest.load(Ordering::Acquire), lists);
    common(940);
    let (_, top) = http(&root.url, "GET", "/v1/quotas/per_user/keys?top=1", None).unwrap();
    assert_eq!(top["keys_held"], 10 + 10 + 10 + 300 * 3 + 1, "{top}");
}
