//! The C ABI against a real `sluice root` (a child process over SQLite on
//! 127.0.0.1): what a program linking the library sees of the fleet.
//!
//! The C ABI's limiter is one per process, so this file is one test that
//! runs its cases in turn, each on a quota of its own.

mod sync_support;

use std::ffi::{c_char, CStr, CString};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sluice::ffi::{
    sluice_check, sluice_init, sluice_last_error, sluice_settle, sluice_shutdown,
    sluice_wait_ready, SLUICE_PASS, SLUICE_REJECT,
};
use sync_support::{quota, wait_until, Db, Root, PATIENCE};

/// The limiter's id at the root.
const LIMITER: &str = "capi-host";

fn name(quota: &str) -> (*const c_char, usize) {
    (quota.as_ptr().cast(), quota.len())
}

/// One `sluice_check` of `weight` on `quota`.
fn check(quota: &str, weight: u64) -> i32 {
    let (p, len) = name(quota);
    // SAFETY: `p` points to `len` readable bytes.
    unsafe { sluice_check(p, len, weight) }
}

/// `sluice_settle(reserved -> actual)` on `quota`.
fn settle(quota: &str, reserved: u64, actual: u64) -> i32 {
    let (p, len) = name(quota);
    // SAFETY: `p` points to `len` readable bytes.
    unsafe { sluice_settle(p, len, reserved, actual) }
}

/// The message of the last `SLUICE_ERROR`.
fn last_error() -> String {
    let p = sluice_last_error();
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string the library keeps until the next
    // call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The level of `quota` at the root.
fn root_level(root: &Root, quota: &str) -> f64 {
    root.get(quota)["level"].as_f64().unwrap_or(0.0)
}

/// The root's Prometheus text.
fn root_metrics(root: &Root) -> String {
    let addr = root.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect to the root");
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// The sum of the samples of metric `family` in `text` (0 when none).
fn metric_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}

#[test]
fn the_c_abi_against_a_real_root() {
    let db = Db::new();
    let root = Root::start(&db, "root");
    // Burst 10 that never leaks: ten units may pass, ever.
    root.put("burst10", quota(0.0, 10.0, 10.0, None));
    let config = CString::new(format!(
        r#"{{"roots": ["{}"], "sync_interval_ms": 200,
            "limiter_id": "{LIMITER}"}}"#,
        root.url
    ))
    .unwrap();
    // SAFETY: a NUL-terminated string.
    let started = unsafe { sluice_init(config.as_ptr()) };
    assert_eq!(started, SLUICE_PASS, "sluice_init: {}", last_error());
    assert_eq!(sluice_wait_ready(PATIENCE.as_millis() as u64), SLUICE_PASS);

    an_honest_return_does_not_cost_the_limit(&root);

    assert_eq!(sluice_shutdown(), SLUICE_PASS);
}

/// Issue 34, case 2: nine checks reach the root, `sluice_settle(9 -> 0)`
/// gives them back, and the return syncs on its own. Afterwards ten more
/// units pass of 90 checks, and no more: the return did not use up the
/// allowance that bounds this limiter's adds at the root, so the next
/// adds are counted whole (nothing clipped) and the root's level says the
/// quota is full.
fn an_honest_return_does_not_cost_the_limit(root: &Root) {
    for i in 0..9 {
        assert_eq!(check("burst10", 1), SLUICE_PASS, "check {i}");
    }
    wait_until("the root holds the nine units", || {
        root_level(root, "burst10") == 9.0
    });
    assert_eq!(settle("burst10", 9, 0), SLUICE_PASS);
    wait_until("the root has the nine units back", || {
        root_level(root, "burst10") == 0.0
    });
    // 90 checks over about 18 sync intervals: the host hears the root's
    // level many times over.
    let mut passed = 0;
    for _ in 0..90 {
        match check("burst10", 1) {
            SLUICE_PASS => passed += 1,
            SLUICE_REJECT => {}
            other => panic!("check: {other}"),
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    let level = root_level(root, "burst10");
    let clipped = metric_sum(
        &root_metrics(root),
        "sluice_root_limiter_deltas_clipped_total",
    );
    eprintln!("burst 10 after an honest return: {passed} of 90 passed, root level {level}, clipped {clipped}");
    assert_eq!(passed, 10, "root level {level}, deltas clipped {clipped}");
    assert_eq!(level, 10.0);
    assert_eq!(clipped, 0.0);
}
