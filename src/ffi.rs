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

use crate::core::spec::QuotaSet;
use crate::core::{Estimator, Extrapolation};
use crate::sync::{SyncConfig, SyncHandle};
use crate::table::file::{load_set, FileRole};
use crate::table::{Outcome, Table};

/// The request may pass: every quota in its chain had room; the weight was
/// counted.
pub const SLUICE_PASS: c_int = 0;
/// The request is over a quota (its own or an ancestor's); nothing was
/// counted.
pub const SLUICE_REJECT: c_int = 1;
/// No quota has this name: the request passes and is not counted.
pub const SLUICE_UNKNOWN: c_int = 2;
/// The call failed (not initialised, NULL or invalid argument, internal
/// error); `sluice_last_error()` says why. A check that fails should be
/// treated as a pass (fail open).
pub const SLUICE_ERROR: c_int = -1;

/// Limiter configuration, from the JSON given to `sluice_init`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Config {
    /// Quotas the table can hold.
    capacity: u32,
    /// Average quota name length the name space is sized for.
    avg_name_bytes: usize,
    /// Quota root URLs; none for standalone.
    roots: Vec<String>,
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
    if config.sync_interval_ms < 10 {
        return Err("sync_interval_ms must be at least 10".into());
    }
    if let Some(Extrapolation::ConstantRatio { ratio }) = config.extrapolation {
        if !(ratio.is_finite() && ratio >= 0.0) {
            return Err("extrapolation ratio must be a finite, non-negative number".into());
        }
    }
    let _lock = LIFECYCLE
        .lock()
        .map_err(|_| "sluice lifecycle lock poisoned")?;
    if !LIMITER.load(Ordering::Acquire).is_null() {
        return Err("sluice is already initialised: call sluice_shutdown first".into());
    }
    let table = Arc::new(Table::new_heap(config.capacity, config.avg_name_bytes));
    let interval = Duration::from_millis(config.sync_interval_ms);
    table.set_estimator(Estimator {
        mode: config.extrapolation.unwrap_or(Extrapolation::Adaptive),
        horizon: 2 * interval.as_nanos() as u64,
    });
    for root in &config.roots {
        if !(root.starts_with("http://") || root.starts_with("https://")) {
            return Err(format!("root {root:?} is not an http:// or https:// URL"));
        }
    }
    let sync_config = SyncConfig {
        roots: config.roots,
        interval,
        timeout: config.sync_timeout_ms.map(Duration::from_millis),
        token: config.sync_token,
        limiter_id: config
            .limiter_id
            .unwrap_or_else(crate::sync::default_limiter_id),
        early_sync: config.early_sync,
        ..SyncConfig::default()
    };
    let sync = SyncHandle::start(Arc::clone(&table), sync_config)
        .map_err(|e| format!("cannot start the sluice sync thread: {e}"))?;
    let limiter = Box::new(Limiter {
        table,
        loads: Mutex::new(()),
        sync: Mutex::new(Some(sync)),
    });
    LIMITER.store(Box::into_raw(limiter), Ordering::Release);
    Ok(SLUICE_PASS)
}

fn load_quotas(text: &str) -> Result<c_int, String> {
    let limiter = limiter()?;
    let set = QuotaSet::from_json(text).map_err(|e| e.to_string())?;
    let _guard = limiter
        .loads
        .lock()
        .map_err(|_| "sluice quota lock poisoned")?;
    let report = load_set(&limiter.table, &set, FileRole::Authoritative);
    if let Some(first) = report.refused.first() {
        return Err(format!(
            "{} quota(s) refused, first: {first}",
            report.refused.len()
        ));
    }
    Ok(SLUICE_PASS)
}

fn check(name: &[u8], weight: u64) -> Result<c_int, String> {
    let limiter = limiter()?;
    Ok(
        match limiter.table.check(name, weight, crate::clock::now()) {
            Outcome::Pass => SLUICE_PASS,
            Outcome::Reject(_) => SLUICE_REJECT,
            Outcome::Unknown => SLUICE_UNKNOWN,
        },
    )
}

/// Starts the process-wide limiter.
///
/// `config_json` may be NULL for defaults, or a JSON object with any of:
/// `capacity` (quotas the table holds, default 100000), `avg_name_bytes`
/// (default 32), `sync_interval_ms` (default 1000), `extrapolation`
/// (`{"mode": "adaptive"}`, the default, or
/// `{"mode": "constant_ratio", "ratio": 1.0}`), `roots` (quota root URLs,
/// e.g. `["http://10.0.0.1:7070"]`; none: standalone, counting locally),
/// `sync_timeout_ms`, `sync_token` (bearer token for the roots),
/// `limiter_id` (default: the host name), `early_sync`
/// (`{"fraction": 0.02, "max_per_second": 4}`: sync at once when a quota's
/// unsent weight reaches that share of its burst band; off by default).
/// The string is only read during the call.
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

/// Replaces the standalone quota set with the one in `json`:
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
        check(name.to_bytes(), weight)
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
        if name.is_null() {
            return Err("name is NULL".into());
        }
        // SAFETY: non-null, and the caller guarantees `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) };
        check(bytes, weight)
    })
}

/// Number of quotas loaded, or `SLUICE_ERROR` if not initialised.
#[no_mangle]
pub extern "C" fn sluice_quota_count() -> c_int {
    boundary(|| Ok(c_int::try_from(limiter()?.table.len()).unwrap_or(c_int::MAX)))
}

/// The sync thread's state as a JSON object (`cycles`, `all_roots_down`,
/// and per root: `url`, `up`, `last_success`, `syncs`, `errors`,
/// `last_error`, `round_trip`, `clock_offset`, `bytes_sent`,
/// `bytes_received`, `dropped_deltas`), or NULL on error. The caller owns
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
