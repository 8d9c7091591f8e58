//! The C ABI: one process-wide limiter behind `check_by_name`.
//!
//! `include/sluice.h` is generated from this file by cbindgen (see
//! `tests/header.rs`); the doc comments here are the header's. Every export
//! is a panic boundary: a bug inside sluice returns `SLUICE_ERROR` with a
//! message, it never unwinds into C. Every pointer argument may be NULL.
//!
//! The limiter's memory is never freed, even by `sluice_shutdown`, so a
//! check racing a shutdown on another thread reads valid memory; each
//! `sluice_init` after a shutdown allocates a new table.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use crate::core::key::KeySecret;
use crate::core::spec::QuotaSet;
use crate::core::Extrapolation;
use crate::sync::{SyncConfig, SyncHandle};
use crate::table::file::{load_set, FileRole};
use crate::table::{CheckItem, CheckOptions, KeyOverflow, Outcome, Table};

/// The request may pass: every quota in its chain had room; the weight was
/// counted.
pub const SLUICE_PASS: c_int = 0;
/// The request is over a quota (its own or an ancestor's); nothing was
/// counted.
pub const SLUICE_REJECT: c_int = 1;
/// No quota has this name: the request passes and is not counted.
pub const SLUICE_UNKNOWN: c_int = 2;
/// The quota is per-key and the check gave no key (or an empty one): the
/// request passes and is not counted.
pub const SLUICE_NO_KEY: c_int = 3;
/// The quota is per-key and its key found no entry: every entry of the
/// key section it could have had holds a key whose count still matters
/// (give keys more memory). The request passes: with `key_overflow`
/// `shared` (the default) it was checked against and counted on the
/// quota's own counter, which all such keys share; with `pass` it is not
/// counted. A rejection is `SLUICE_REJECT`, whatever the mode.
pub const SLUICE_KEY_OVERFLOW: c_int = 4;
/// The call failed (not initialised, NULL or invalid argument, internal
/// error); `sluice_last_error()` says why. A check that fails should be
/// treated as a pass (fail open).
pub const SLUICE_ERROR: c_int = -1;

/// One entry of `roots`: a base URL (in group 0), or a URL with its root
/// group.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a root URL or {\"url\": \"http://...\", \"group\": n}"
)]
enum RootEntry {
    /// `"http://10.0.0.1:7070"`.
    Url(String),
    /// `{"url": "http://10.0.0.1:7070", "group": 1}`.
    Grouped(GroupedRoot),
}

/// A root URL with its group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupedRoot {
    url: String,
    #[serde(default)]
    group: u32,
}

impl RootEntry {
    fn split(self) -> (String, u32) {
        match self {
            RootEntry::Url(url) => (url, 0),
            RootEntry::Grouped(g) => (g.url, g.group),
        }
    }
}

/// Limiter configuration, from the JSON given to `sluice_init`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Config {
    /// Quotas the table can hold.
    capacity: u32,
    /// Average quota name length the name space is sized for.
    avg_name_bytes: usize,
    /// Keys of per-key quotas the table holds at once.
    key_capacity: u64,
    /// File holding the fleet's key secret (keys are hashed with it).
    key_secret_file: Option<String>,
    /// What a check does with a key that finds no entry: `shared`,
    /// `reject` or `pass`.
    key_overflow: Option<String>,
    /// Quota roots: URLs (group 0), or `{"url": ..., "group": n}`; none
    /// for standalone.
    roots: Vec<RootEntry>,
    /// Sync interval in milliseconds.
    sync_interval_ms: u64,
    /// Timeout of one sync request (default: 80% of the interval).
    sync_timeout_ms: Option<u64>,
    /// Bearer token the roots require for `/v1/sync`.
    sync_token: Option<String>,
    /// This limiter's id at the roots (default: the host name).
    limiter_id: Option<String>,
    /// How levels are extrapolated between syncs.
    extrapolation: Option<Extrapolation>,
    /// Sync early when a quota's unsent weight passes a share of its band.
    early_sync: Option<crate::sync::EarlySync>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            avg_name_bytes: 32,
            key_capacity: 100_000,
            key_secret_file: None,
            key_overflow: None,
            roots: Vec::new(),
            sync_interval_ms: 1000,
            sync_timeout_ms: None,
            sync_token: None,
            limiter_id: None,
            extrapolation: None,
            early_sync: None,
        }
    }
}

/// The process-wide limiter.
struct Limiter {
    /// All quotas and counters.
    table: Arc<Table>,
    /// Serialises quota loads (each reads the table, then writes it).
    loads: Mutex<()>,
    /// Roots are configured: a loaded quota set only seeds the table until
    /// a root answers, and never replaces the roots' quotas.
    has_roots: bool,
    /// The sync thread (standalone folding when there are no roots).
    sync: Mutex<Option<SyncHandle>>,
}

static LIMITER: AtomicPtr<Limiter> = AtomicPtr::new(ptr::null_mut());
/// Serialises init and shutdown against each other.
static LIFECYCLE: Mutex<()> = Mutex::new(());

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(message: impl Into<String>) {
    let text = CString::new(message.into().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Runs `f` as an export body: errors become `SLUICE_ERROR` plus a message,
/// panics are caught.
fn boundary(f: impl FnOnce() -> Result<c_int, String>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(message)) => {
            set_error(message);
            SLUICE_ERROR
        }
        Err(_) => {
            set_error("internal error (panic) in sluice; the call was abandoned");
            SLUICE_ERROR
        }
    }
}

fn limiter() -> Result<&'static Limiter, String> {
    let p = LIMITER.load(Ordering::Acquire);
    // SAFETY: a non-null LIMITER points to a leaked Box that is never freed.
    unsafe { p.as_ref() }.ok_or_else(|| "sluice is not initialised: call sluice_init".to_string())
}

/// Reads a C string argument; NULL is an error naming the argument.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a CStr, String> {
    if p.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    Ok(unsafe { CStr::from_ptr(p) })
}

fn init(config_json: Option<&str>) -> Result<c_int, String> {
    let config: Config = match config_json {
        Some(text) => {
            serde_json::from_str(text).map_err(|e| format!("invalid config JSON: {e}"))?
        }
        None => Config::default(),
    };
    if let Some(Extrapolation::ConstantRatio { ratio }) = config.extrapolation {
        if !(ratio.is_finite() && ratio >= 0.0) {
            return Err("extrapolation ratio must be a finite, non-negative number".into());
        }
    }
    let (roots, root_groups) = config.roots.into_iter().map(RootEntry::split).unzip();
    let sync_config = SyncConfig {
        roots,
        root_groups,
        interval: Duration::from_millis(config.sync_interval_ms),
        timeout: config.sync_timeout_ms.map(Duration::from_millis),
        token: config.sync_token,
        limiter_id: config
            .limiter_id
            .unwrap_or_else(crate::sync::default_limiter_id),
        early_sync: config.early_sync,
        ..SyncConfig::default()
    };
    sync_config
        .validate()
        .map_err(|e| format!("invalid config: {}", config_field(e)))?;
    let _lock = LIFECYCLE
        .lock()
        .map_err(|_| "sluice lifecycle lock poisoned")?;
    if !LIMITER.load(Ordering::Acquire).is_null() {
        return Err("sluice is already initialised: call sluice_shutdown first".into());
    }
    let secret = match &config.key_secret_file {
        Some(path) => {
            let contents =
                std::fs::read(path).map_err(|e| format!("key_secret_file {path:?}: {e}"))?;
            Some(
                KeySecret::from_file_contents(&contents)
                    .map_err(|why| format!("key_secret_file {path:?} {why}"))?,
            )
        }
        None => None,
    };
    crate::table::layout::check_key_capacity(config.key_capacity)
        .map_err(|why| format!("key_capacity: {why}"))?;
    let overflow = match config.key_overflow.as_deref() {
        None => KeyOverflow::default(),
        Some(word) => KeyOverflow::parse(word).ok_or_else(|| {
            format!("key_overflow: {word:?} is not one of \"shared\", \"reject\", \"pass\"")
        })?,
    };
    let table = Arc::new(Table::new_heap_with_keys(
        config.capacity,
        config.avg_name_bytes,
        config.key_capacity,
    ));
    table.set_key_secret(secret);
    table.set_key_overflow(overflow);
    table.set_estimator(
        sync_config.estimator(config.extrapolation.unwrap_or(Extrapolation::Adaptive)),
    );
    let has_roots = !sync_config.roots.is_empty();
    let sync = SyncHandle::start(Arc::clone(&table), sync_config)
        .map_err(|e| format!("cannot start the sluice sync thread: {e}"))?;
    let limiter = Box::new(Limiter {
        table,
        loads: Mutex::new(()),
        has_roots,
        sync: Mutex::new(Some(sync)),
    });
    LIMITER.store(Box::into_raw(limiter), Ordering::Release);
    Ok(SLUICE_PASS)
}

/// A configuration error in the C ABI's words: the JSON key names the
/// field (`interval` is `sync_interval_ms`, and so on).
fn config_field(e: crate::core::ValidationError) -> String {
    let key = match e.field {
        "interval" => "sync_interval_ms",
        "timeout" => "sync_timeout_ms",
        "limiter" => "limiter_id",
        "root_groups" => "roots",
        other => other,
    };
    format!("{key}: {}", e.message)
}

fn load_quotas(text: &str) -> Result<c_int, String> {
    let limiter = limiter()?;
    let set = QuotaSet::from_json(text).map_err(|e| e.to_string())?;
    let _guard = limiter
        .loads
        .lock()
        .map_err(|_| "sluice quota lock poisoned")?;
    let role = if limiter.has_roots {
        FileRole::Seed
    } else {
        FileRole::Authoritative
    };
    let report = load_set(&limiter.table, &set, role);
    if let Some(first) = report.refused.first() {
        return Err(format!(
            "{} quota(s) refused, first: {first}",
            report.refused.len()
        ));
    }
    Ok(SLUICE_PASS)
}

fn check(name: &[u8], key: Option<&[u8]>, weight: u64) -> Result<c_int, String> {
    let limiter = limiter()?;
    let item = CheckItem {
        name,
        key,
        weight,
        max_wait: None,
    };
    let outcome = limiter.table.check_many(
        &[item],
        crate::clock::now(),
        CheckOptions::default(),
        crate::core::rng::thread_unit,
    );
    Ok(outcome_code(outcome.outcome, outcome.overflow))
}

/// The name and key arguments of a keyed call (a NULL key with length 0
/// is the empty key).
///
/// # Safety
/// `name` must be NULL or point to at least `name_len` readable bytes;
/// `key` must be NULL or point to at least `key_len` readable bytes.
unsafe fn name_and_key<'a>(
    name: *const c_char,
    name_len: usize,
    key: *const c_char,
    key_len: usize,
) -> Result<(&'a [u8], &'a [u8]), String> {
    // SAFETY: per the contract.
    let name = unsafe { c_bytes(name, name_len, "name") }?;
    let key = if key.is_null() && key_len == 0 {
        &[][..]
    } else {
        // SAFETY: per the contract.
        unsafe { c_bytes(key, key_len, "key") }?
    };
    Ok((name, key))
}

/// The C code of an outcome (`overflow`: a key found no entry).
fn outcome_code(outcome: Outcome, overflow: bool) -> c_int {
    match outcome {
        Outcome::Pass if overflow => SLUICE_KEY_OVERFLOW,
        Outcome::Pass => SLUICE_PASS,
        Outcome::Reject(_) => SLUICE_REJECT,
        Outcome::Unknown => SLUICE_UNKNOWN,
        Outcome::NoKey => SLUICE_NO_KEY,
        Outcome::KeyOverflow => SLUICE_KEY_OVERFLOW,
    }
}

/// Writes `value` through an out-pointer (NULL is an error naming it).
///
/// # Safety
/// `out` must be NULL or point to a writable `uint64_t`.
unsafe fn write_out(out: *mut u64, value: u64, what: &str) -> Result<(), String> {
    if out.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null and writable per the contract.
    unsafe { out.write(value) };
    Ok(())
}

/// # Safety
/// `granted` must be NULL or point to a writable `uint64_t`.
unsafe fn obtain(
    name: &[u8],
    key: Option<&[u8]>,
    want: u64,
    granted: *mut u64,
) -> Result<c_int, String> {
    if granted.is_null() {
        return Err("granted is NULL".into());
    }
    if want == 0 {
        return Err("want must be at least 1".into());
    }
    let limiter = limiter()?;
    let item = CheckItem {
        name,
        key,
        weight: want,
        max_wait: None,
    };
    let grant = limiter.table.obtain(&item, crate::clock::now());
    // SAFETY: checked above; writable per the contract.
    unsafe { write_out(granted, grant.granted, "granted") }?;
    Ok(outcome_code(grant.outcome, grant.overflow))
}

/// # Safety
/// `wait_ns` must be NULL or point to a writable `uint64_t`.
unsafe fn reserve(
    name: &[u8],
    key: Option<&[u8]>,
    weight: u64,
    max_wait_ms: u64,
    wait_ns: *mut u64,
) -> Result<c_int, String> {
    if wait_ns.is_null() {
        return Err("wait_ns is NULL".into());
    }
    let limiter = limiter()?;
    let item = CheckItem {
        name,
        key,
        weight,
        max_wait: None,
    };
    let max_wait = max_wait_ms.saturating_mul(1_000_000);
    let reservation = limiter.table.reserve(&item, max_wait, crate::clock::now());
    // SAFETY: checked above; writable per the contract.
    unsafe { write_out(wait_ns, reservation.wait, "wait_ns") }?;
    Ok(outcome_code(reservation.outcome, reservation.overflow))
}

/// `len` bytes at `p` (NULL is an error naming the argument).
///
/// # Safety
/// `p` must be NULL or point to at least `len` readable bytes.
unsafe fn c_bytes<'a>(p: *const c_char, len: usize, what: &str) -> Result<&'a [u8], String> {
    if p.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null, and the caller guarantees `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Starts the process-wide limiter.
///
/// `config_json` may be NULL for defaults, or a JSON object with any of:
/// `capacity` (quotas the table holds, default 100000), `avg_name_bytes`
/// (default 32), `key_capacity` (keys of per-key quotas held at once,
/// default 100000, at most 2^30; 49 bytes each), `key_secret_file` (a
/// file holding the fleet's secret, at least 16 bytes, that keys are
/// hashed with: every host of a fleet must use the same one; default: a
/// built-in secret),
/// `key_overflow` (what a check does with a key that finds no entry, the
/// key section being full of live keys: `"shared"`, the default, checks
/// and counts it on the quota's own counter, shared by all such keys;
/// `"reject"` rejects it; `"pass"` lets it through uncounted),
/// `sync_interval_ms` (100 to 3600000, default 1000),
/// `extrapolation` (`{"mode": "adaptive"}`, the default, or
/// `{"mode": "constant_ratio", "ratio": 1.0}`), `roots` (at most 16 quota
/// root base URLs, e.g. `["http://10.0.0.1:7070"]`; none: standalone,
/// counting locally; with root groups, an entry is
/// `{"url": "http://10.0.0.2:7070", "group": 1}`, groups numbered from 0
/// with no gap, a bare URL being in group 0), `sync_timeout_ms` (below the interval; default 80%
/// of it), `sync_token` (bearer token for the roots), `limiter_id` (1 to
/// 255 printable ASCII bytes, no spaces; default: the host name),
/// `early_sync` (`{"fraction": 0.02, "max_per_second": 4}`: sync at once
/// when a quota's unsent weight reaches that share, in (0, 1], of its
/// burst band, at most 1 to 100 times a second; off by default). These
/// are the rules nginx's `sluice_*` directives follow. The string is only
/// read during the call.
///
/// Returns `SLUICE_PASS` (0) on success, `SLUICE_ERROR` if the config is
/// invalid or the limiter is already running.
///
/// # Safety
/// `config_json` must be NULL or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sluice_init(config_json: *const c_char) -> c_int {
    boundary(|| {
        let text = if config_json.is_null() {
            None
        } else {
            // SAFETY: non-null; the caller passes a NUL-terminated string.
            let s = unsafe { c_str(config_json, "config_json") }?;
            Some(
                s.to_str()
                    .map_err(|_| "config_json is not UTF-8".to_string())?,
            )
        };
        init(text)
    })
}

/// Without roots, replaces the quota set with the one in `json`; with
/// roots, loads it as seeds: quotas the roots do not have stand in until
/// a root's whole quota set has arrived (then they are removed), and the
/// roots' quotas are never replaced. The set:
/// `{"quotas": [{"name": "...", "limit": 100, "low_burst": 100,
/// "high_burst": 200, "parent": "name-or-null"}, ...]}` (or a bare array).
/// Quotas keep their counters across loads; quotas absent from the new set
/// are removed. Nothing is applied if the set is invalid.
///
/// Returns `SLUICE_PASS` or `SLUICE_ERROR` (see `sluice_last_error`).
///
/// # Safety
/// `json` must be NULL or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sluice_load_quotas_json(json: *const c_char) -> c_int {
    boundary(|| {
        // SAFETY: NULL-checked by c_str; NUL-terminated per the contract.
        let text = unsafe { c_str(json, "json") }?;
        load_quotas(
            text.to_str()
                .map_err(|_| "quota JSON is not UTF-8".to_string())?,
        )
    })
}

/// Like `sluice_load_quotas_json`, reading the JSON from the file at `path`.
///
/// # Safety
/// `path` must be NULL or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sluice_load_quotas_file(path: *const c_char) -> c_int {
    boundary(|| {
        // SAFETY: NULL-checked by c_str; NUL-terminated per the contract.
        let path = unsafe { c_str(path, "path") }?;
        let path = path.to_str().map_err(|_| "path is not UTF-8".to_string())?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        load_quotas(&text)
    })
}

/// Checks the quota named by the NUL-terminated `name` (and all its
/// ancestors) for a request of `weight` units, counting the weight if it
/// passes. `weight` 0 checks without counting; weights above 2^40 count as
/// 2^40. Never blocks and never does IO.
///
/// Returns `SLUICE_PASS`, `SLUICE_REJECT`, `SLUICE_UNKNOWN` (no such quota:
/// pass) or `SLUICE_ERROR` (not initialised or NULL name: pass, fail open).
///
/// # Safety
/// `name` must be NULL or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn check_by_name(name: *const c_char, weight: u64) -> c_int {
    boundary(|| {
        // SAFETY: NULL-checked by c_str; NUL-terminated per the contract.
        let name = unsafe { c_str(name, "name") }?;
        check(name.to_bytes(), None, weight)
    })
}

/// `check_by_name` for a name given as `len` bytes (no NUL needed), for
/// callers holding Go or Lua strings.
///
/// # Safety
/// `name` must be NULL or point to at least `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn sluice_check(name: *const c_char, len: usize, weight: u64) -> c_int {
    boundary(|| {
        // SAFETY: NULL-checked; `len` readable bytes per the contract.
        let bytes = unsafe { c_bytes(name, len, "name") }?;
        check(bytes, None, weight)
    })
}

/// Checks the key `key` (`key_len` bytes, any bytes at all) of the per-key
/// quota `name` (`name_len` bytes): the key gets a counter of its own with
/// the quota's numbers (made on first use, in memory only), checked with
/// the quota's ancestors like any quota, counted if the request passes.
/// The key is hashed with the fleet's secret at once and never kept.
///
/// Returns `SLUICE_PASS`, `SLUICE_REJECT`, `SLUICE_UNKNOWN` (no such quota:
/// pass), `SLUICE_NO_KEY` (an empty key: pass, uncounted),
/// `SLUICE_KEY_OVERFLOW` (no room for the key: passed on the quota's shared
/// overflow counter, or uncounted; see `key_overflow`) or `SLUICE_ERROR`.
/// A key given for a quota that is not per-key is ignored: the quota
/// itself is checked.
///
/// # Safety
/// `name` must be NULL or point to at least `name_len` readable bytes;
/// `key` must be NULL or point to at least `key_len` readable bytes (NULL
/// with `key_len` 0 is an empty key).
#[no_mangle]
pub unsafe extern "C" fn sluice_check_key(
    name: *const c_char,
    name_len: usize,
    key: *const c_char,
    key_len: usize,
    weight: u64,
) -> c_int {
    boundary(|| {
        // SAFETY: per the contract.
        let (name, key) = unsafe { name_and_key(name, name_len, key, key_len) }?;
        check(name, Some(key), weight)
    })
}

/// A partial grant: counts and writes to `*granted` the most units, up to
/// `want`, that the quota `name` (`name_len` bytes) and all its ancestors
/// allow with certainty now (its level plus the grant at most
/// `low_burst`, whole units); a sender takes "as many as allowed" for a
/// batch.
///
/// Returns `SLUICE_PASS` (`*granted` ≥ 1), `SLUICE_REJECT` (nothing can be
/// granted now: `*granted` is 0), `SLUICE_UNKNOWN` (no such quota: nothing
/// counted, `*granted` 0; the caller decides) or `SLUICE_ERROR` (`want`
/// 0, a NULL pointer, not initialised).
///
/// # Safety
/// `name` must be NULL or point to at least `name_len` readable bytes;
/// `granted` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn sluice_obtain(
    name: *const c_char,
    name_len: usize,
    want: u64,
    granted: *mut u64,
) -> c_int {
    boundary(|| {
        // SAFETY: NULL-checked; `name_len` readable bytes per the contract.
        let name = unsafe { c_bytes(name, name_len, "name") }?;
        // SAFETY: per the contract.
        unsafe { obtain(name, None, want, granted) }
    })
}

/// [`sluice_obtain`] for the key `key` (`key_len` bytes) of a per-key
/// quota (see [`sluice_check_key`]); `SLUICE_NO_KEY` for an empty key.
///
/// # Safety
/// As [`sluice_obtain`]; `key` must be NULL or point to at least
/// `key_len` readable bytes (NULL with `key_len` 0 is an empty key).
#[no_mangle]
pub unsafe extern "C" fn sluice_obtain_key(
    name: *const c_char,
    name_len: usize,
    key: *const c_char,
    key_len: usize,
    want: u64,
    granted: *mut u64,
) -> c_int {
    boundary(|| {
        // SAFETY: per the contract.
        let (name, key) = unsafe { name_and_key(name, name_len, key, key_len) }?;
        // SAFETY: per the contract.
        unsafe { obtain(name, Some(key), want, granted) }
    })
}

/// Pacing: counts `weight` on the quota `name` now and writes to
/// `*wait_ns` how long the caller must wait before acting so that the
/// fleet stays at the quota's rate (GCRA's theoretical arrival time on the
/// fleet-wide level: callers reserving one after another are spaced
/// `weight / limit` apart once the low burst is used). When the wait would
/// exceed `max_wait_ms`, nothing is counted.
///
/// Returns `SLUICE_PASS` (wait `*wait_ns`, then act), `SLUICE_REJECT`
/// (uncounted; `*wait_ns` is the wait it would have needed, or
/// `UINT64_MAX` when waiting cannot help: a weight above `high_burst`),
/// `SLUICE_UNKNOWN` or `SLUICE_ERROR`. A window quota in the chain is not
/// paced: its next window cannot be reserved in advance, so with no room
/// left in the current one the reservation is refused and `*wait_ns` is
/// the time to the window's end.
///
/// # Safety
/// `name` must be NULL or point to at least `name_len` readable bytes;
/// `wait_ns` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn sluice_reserve(
    name: *const c_char,
    name_len: usize,
    weight: u64,
    max_wait_ms: u64,
    wait_ns: *mut u64,
) -> c_int {
    boundary(|| {
        // SAFETY: NULL-checked; `name_len` readable bytes per the contract.
        let name = unsafe { c_bytes(name, name_len, "name") }?;
        // SAFETY: per the contract.
        unsafe { reserve(name, None, weight, max_wait_ms, wait_ns) }
    })
}

/// [`sluice_reserve`] for the key `key` (`key_len` bytes) of a per-key
/// quota; `SLUICE_NO_KEY` for an empty key.
///
/// # Safety
/// As [`sluice_reserve`]; `key` must be NULL or point to at least
/// `key_len` readable bytes (NULL with `key_len` 0 is an empty key).
#[no_mangle]
pub unsafe extern "C" fn sluice_reserve_key(
    name: *const c_char,
    name_len: usize,
    key: *const c_char,
    key_len: usize,
    weight: u64,
    max_wait_ms: u64,
    wait_ns: *mut u64,
) -> c_int {
    boundary(|| {
        // SAFETY: per the contract.
        let (name, key) = unsafe { name_and_key(name, name_len, key, key_len) }?;
        // SAFETY: per the contract.
        unsafe { reserve(name, Some(key), weight, max_wait_ms, wait_ns) }
    })
}

/// Number of quotas loaded, or `SLUICE_ERROR` if not initialised.
#[no_mangle]
pub extern "C" fn sluice_quota_count() -> c_int {
    boundary(|| Ok(c_int::try_from(limiter()?.table.len()).unwrap_or(c_int::MAX)))
}

/// The sync thread's state as a JSON object (`cycles`, `all_roots_down`,
/// `groups_down` with root groups: the groups whose shards are limited
/// per host, and per root: `url`, `group`, `up`, `last_success`,
/// `syncs`, `errors`, `last_error`, `round_trip`, `clock_offset`,
/// `bytes_sent`, `bytes_received`, `dropped_deltas`), or NULL on error. The caller owns
/// the string and frees it with `sluice_free_string`.
#[no_mangle]
pub extern "C" fn sluice_sync_metrics_json() -> *mut c_char {
    let result = catch_unwind(|| -> Result<CString, String> {
        let limiter = limiter()?;
        let metrics = limiter
            .sync
            .lock()
            .map_err(|_| "sluice sync lock poisoned")?
            .as_ref()
            .map(|s| s.metrics())
            .unwrap_or_default();
        let text = serde_json::to_string(&metrics).map_err(|e| e.to_string())?;
        CString::new(text).map_err(|e| e.to_string())
    });
    match result {
        Ok(Ok(text)) => text.into_raw(),
        Ok(Err(message)) => {
            set_error(message);
            ptr::null_mut()
        }
        Err(_) => {
            set_error("internal error (panic) in sluice; the call was abandoned");
            ptr::null_mut()
        }
    }
}

/// Frees a string returned by sluice (NULL is ignored).
///
/// # Safety
/// `s` must be NULL or a pointer returned by a sluice function that says
/// the caller frees it, not freed before.
#[no_mangle]
pub unsafe extern "C" fn sluice_free_string(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from CString::into_raw in this library, once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { CString::from_raw(s) })));
    }
}

/// Stops the limiter's thread. Later checks return `SLUICE_ERROR` until
/// `sluice_init` is called again. Safe to call when not initialised.
#[no_mangle]
pub extern "C" fn sluice_shutdown() -> c_int {
    boundary(|| {
        let _lock = LIFECYCLE
            .lock()
            .map_err(|_| "sluice lifecycle lock poisoned")?;
        let p = LIMITER.swap(ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: a non-null LIMITER points to a leaked Box never freed.
        if let Some(limiter) = unsafe { p.as_ref() } {
            let sync = limiter.sync.lock().ok().and_then(|mut s| s.take());
            if let Some(sync) = sync {
                sync.stop();
            }
        }
        Ok(SLUICE_PASS)
    })
}

/// Text of the last error on this thread ("" if none). The pointer stays
/// valid until the next sluice call on the same thread; do not free it.
#[no_mangle]
pub extern "C" fn sluice_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr())).unwrap_or(c"internal error".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots_of(json: &str) -> Result<(Vec<String>, Vec<u32>), String> {
        let config: Config = serde_json::from_str(json).map_err(|e| e.to_string())?;
        Ok(config.roots.into_iter().map(RootEntry::split).unzip())
    }

    #[test]
    fn roots_are_urls_or_urls_with_their_group() {
        let (urls, groups) = roots_of(r#"{"roots": ["http://a:1", "http://b:1"]}"#).unwrap();
        assert_eq!((urls.len(), groups), (2, vec![0, 0]));
        let (urls, groups) =
            roots_of(r#"{"roots": ["http://a:1", {"url": "http://b:1", "group": 1}]}"#).unwrap();
        assert_eq!(urls, vec!["http://a:1", "http://b:1"]);
        assert_eq!(groups, vec![0, 1]);
        let err = roots_of(r#"{"roots": [{"url": "http://b:1", "grup": 1}]}"#).unwrap_err();
        assert!(err.contains("a root URL or"), "{err}");
        // A gap is refused by the shared check, naming `roots`.
        let (roots, root_groups) =
            roots_of(r#"{"roots": [{"url": "http://b:1", "group": 1}]}"#).unwrap();
        let e = SyncConfig {
            roots,
            root_groups,
            ..SyncConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(config_field(e).split(':').next(), Some("roots"));
    }
}
