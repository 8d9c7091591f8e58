//! The process-wide limiter behind the exports: its lifecycle (init,
//! shutdown) and the work each export does once its arguments are read.
//!
//! The limiter's memory is never freed, even by `sluice_shutdown`, so a
//! check racing a shutdown on another thread reads valid memory; each
//! `sluice_init` after a shutdown allocates a new table.

use std::ffi::{c_int, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::codes::{
    SLUICE_KEY_OVERFLOW, SLUICE_NOT_READY, SLUICE_NO_KEY, SLUICE_PASS, SLUICE_REJECT,
    SLUICE_UNKNOWN,
};
use super::config::Settings;
use super::status::SyncStatus;
use crate::core::spec::QuotaSet;
use crate::sync::SyncHandle;
use crate::table::file::{load_set, FileRole};
use crate::table::{CheckItem, CheckOptions, Outcome, Table};

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
    /// A root's whole quota set has arrived (or there are no roots): the
    /// table holds the fleet's quotas. Never goes back.
    ready: AtomicBool,
    /// `no_key` `reject`: a check of a per-key quota without a key is
    /// rejected instead of passing uncounted.
    no_key_rejects: bool,
}

impl Limiter {
    /// The C code of a decision (a check, grant, reservation or slot):
    /// [`outcome_code`], with a missing key rejected when `no_key` says
    /// so (nothing was counted either way).
    fn decision_code(&self, outcome: Outcome, overflow: bool) -> c_int {
        match outcome_code(outcome, overflow) {
            SLUICE_NO_KEY if self.no_key_rejects => SLUICE_REJECT,
            code => code,
        }
    }
}

impl Limiter {
    /// True once the table holds the roots' quota set (at once without
    /// roots). The sync thread marks the table as holding seeds until a
    /// root's whole quota set is in (`init` sets the mark first, so it
    /// also stands for "nothing from a root yet"), and clears it then.
    fn is_ready(&self) -> bool {
        if self.ready.load(Ordering::Acquire) {
            return true;
        }
        let ready = !self.has_roots || !self.table.holds_seeds();
        if ready {
            self.ready.store(true, Ordering::Release);
        }
        ready
    }
}

static LIMITER: AtomicPtr<Limiter> = AtomicPtr::new(ptr::null_mut());
/// Serialises init and shutdown against each other.
static LIFECYCLE: Mutex<()> = Mutex::new(());

#[inline]
fn limiter() -> Result<&'static Limiter, String> {
    let p = LIMITER.load(Ordering::Acquire);
    // SAFETY: a non-null LIMITER points to a leaked Box that is never freed.
    unsafe { p.as_ref() }.ok_or_else(not_initialised)
}

/// The error of a call made before `sluice_init`.
#[cold]
#[inline(never)]
fn not_initialised() -> String {
    "sluice is not initialised: call sluice_init".to_string()
}

/// Starts the limiter from `sluice_init`'s JSON (`None`: defaults).
pub(super) fn init(config_json: Option<&str>) -> Result<c_int, String> {
    let settings = Settings::from_json(config_json)?;
    let _lock = LIFECYCLE
        .lock()
        .map_err(|_| "sluice lifecycle lock poisoned")?;
    if !LIMITER.load(Ordering::Acquire).is_null() {
        return Err("sluice is already initialised: call sluice_shutdown first".into());
    }
    // No count of passed checks: nothing in the library reads it.
    let table = Arc::new(
        Table::new_heap_with(
            settings.capacity,
            settings.avg_name_bytes,
            settings.key_capacity,
            settings.override_capacity,
        )
        .without_pass_tally(),
    );
    table.set_key_secret(settings.key_secret);
    table.set_key_overflow(settings.key_overflow);
    table.set_estimator(settings.sync.estimator(settings.extrapolation));
    let has_roots = !settings.sync.roots.is_empty();
    if has_roots {
        // Until a root's whole quota set is in, whatever the table holds
        // stands in (see `Limiter::is_ready`).
        table.set_holds_seeds(true);
    }
    let sync = SyncHandle::start(Arc::clone(&table), settings.sync)
        .map_err(|e| format!("cannot start the sluice sync thread: {e}"))?;
    let limiter = Box::new(Limiter {
        table,
        loads: Mutex::new(()),
        has_roots,
        sync: Mutex::new(Some(sync)),
        ready: AtomicBool::new(!has_roots),
        no_key_rejects: settings.no_key_rejects,
    });
    LIMITER.store(Box::into_raw(limiter), Ordering::Release);
    Ok(SLUICE_PASS)
}

/// Stops the sync thread and forgets the limiter (its memory stays).
pub(super) fn shutdown() -> Result<c_int, String> {
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
}

/// Loads a quota set: the whole set without roots, seeds with them.
pub(super) fn load_quotas(text: &str) -> Result<c_int, String> {
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

/// Checks `weight` on quota `name` (and a key of it).
// Inlined into its export, with the fast path it inlines in turn: called,
// its answer went through memory and was copied again (a hot keyed check
// took 1.3 ns more, BENCHMARKS.md, "Hot path before and after").
#[inline(always)]
pub(super) fn check(name: &[u8], key: Option<&[u8]>, weight: u64) -> Result<c_int, String> {
    let limiter = limiter()?;
    let item = check_item(name, key, weight);
    let outcome = limiter.table.gate().check_many(
        &[item],
        crate::clock::now(),
        CheckOptions::default(),
        crate::host::thread_unit,
    );
    Ok(limiter.decision_code(outcome.outcome, outcome.overflow))
}

/// Counts `weight` on quota `name` (and a key of it) whatever its level:
/// a charge after the fact, never a rejection.
pub(super) fn charge(name: &[u8], key: Option<&[u8]>, weight: u64) -> Result<c_int, String> {
    let limiter = limiter()?;
    not_in_flight(&limiter.table, name)?;
    let item = check_item(name, key, weight);
    let counted = limiter.table.gate().charge(&item, crate::clock::now());
    Ok(outcome_code(counted.outcome, counted.overflow))
}

/// Refuses a charge or settle of an in-flight quota: its slots are taken
/// and given back (`sluice_acquire`, `sluice_release`), never charged.
fn not_in_flight(table: &Table, name: &[u8]) -> Result<(), String> {
    if table.gate().is_in_flight(name) {
        return Err(format!(
            "quota {:?} is an in-flight quota: take its slots with sluice_acquire, \
             not sluice_charge or sluice_settle",
            String::from_utf8_lossy(name)
        ));
    }
    Ok(())
}

/// Settles `reserved` units counted earlier on quota `name` (and a key
/// of it) at their `actual` cost: the difference charged, or given back.
pub(super) fn settle(
    name: &[u8],
    key: Option<&[u8]>,
    reserved: u64,
    actual: u64,
) -> Result<c_int, String> {
    let limiter = limiter()?;
    not_in_flight(&limiter.table, name)?;
    let item = check_item(name, key, actual);
    let now = crate::clock::now();
    // The C ABI does not know when the reservation was counted: taken as
    // now, so a window quota gets units back in its current window.
    let settled = limiter.table.gate().settle(&item, reserved, now, now);
    Ok(outcome_code(settled.outcome, settled.overflow))
}

/// A partial grant of up to `want` units: the outcome and the units
/// granted.
pub(super) fn obtain(name: &[u8], key: Option<&[u8]>, want: u64) -> Result<(c_int, u64), String> {
    if want == 0 {
        return Err("want must be at least 1".into());
    }
    let limiter = limiter()?;
    let item = check_item(name, key, want);
    let grant = limiter.table.gate().obtain(&item, crate::clock::now());
    Ok((
        limiter.decision_code(grant.outcome, grant.overflow),
        grant.granted,
    ))
}

/// A pacing reservation of `weight`: the outcome and the wait in
/// nanoseconds.
pub(super) fn reserve(
    name: &[u8],
    key: Option<&[u8]>,
    weight: u64,
    max_wait_ms: u64,
) -> Result<(c_int, u64), String> {
    let limiter = limiter()?;
    let item = check_item(name, key, weight);
    let max_wait = max_wait_ms.saturating_mul(1_000_000);
    let reservation = limiter
        .table
        .gate()
        .reserve(&item, max_wait, crate::clock::now());
    Ok((
        limiter.decision_code(reservation.outcome, reservation.overflow),
        reservation.wait,
    ))
}

/// How often [`wait_ready`] looks again: a sync cycle is a second by
/// default, a reply is applied as it arrives.
const READY_POLL: Duration = Duration::from_millis(5);

/// Waits up to `timeout_ms` for the roots' quota set: `SLUICE_PASS` once
/// it is in (at once without roots), `SLUICE_NOT_READY` when the time ran
/// out first.
pub(super) fn wait_ready(timeout_ms: u64) -> Result<c_int, String> {
    let limiter = limiter()?;
    // No deadline when it would overflow: wait until ready.
    let deadline = Instant::now().checked_add(Duration::from_millis(timeout_ms));
    loop {
        if limiter.is_ready() {
            return Ok(SLUICE_PASS);
        }
        if !ptr::eq(LIMITER.load(Ordering::Acquire), limiter) {
            return Err("sluice_shutdown was called while waiting for the quota set".into());
        }
        let now = Instant::now();
        let pause = match deadline {
            Some(deadline) if now >= deadline => return Ok(SLUICE_NOT_READY),
            Some(deadline) => READY_POLL.min(deadline - now),
            None => READY_POLL,
        };
        std::thread::sleep(pause);
    }
}

/// The limiter's table (for a slot, which keeps it alive).
pub(super) fn table() -> Result<Arc<Table>, String> {
    Ok(Arc::clone(&limiter()?.table))
}

/// The C code of a slot taken (or not): as a check's, a missing key
/// rejected when `no_key` says so.
pub(super) fn slot_code(outcome: Outcome, overflow: bool) -> Result<c_int, String> {
    Ok(limiter()?.decision_code(outcome, overflow))
}

/// Number of quotas loaded.
pub(super) fn quota_count() -> Result<c_int, String> {
    Ok(c_int::try_from(limiter()?.table.len()).unwrap_or(c_int::MAX))
}

/// The sync thread's state as JSON, in the units the header states.
pub(super) fn sync_metrics_json() -> Result<CString, String> {
    let limiter = limiter()?;
    let metrics = limiter
        .sync
        .lock()
        .map_err(|_| "sluice sync lock poisoned")?
        .as_ref()
        .map(|s| s.metrics())
        .unwrap_or_default();
    let status = SyncStatus::of(&metrics, limiter.is_ready(), crate::clock::now());
    let text = serde_json::to_string(&status).map_err(|e| e.to_string())?;
    CString::new(text).map_err(|e| e.to_string())
}

/// A check of `weight` on quota `name` (and a key of it); the C ABI never
/// waits inside a call.
fn check_item<'a>(name: &'a [u8], key: Option<&'a [u8]>, weight: u64) -> CheckItem<'a> {
    CheckItem {
        name,
        key,
        weight,
        max_wait: None,
    }
}

/// The C code of an outcome (`overflow`: a key found no entry).
pub(super) fn outcome_code(outcome: Outcome, overflow: bool) -> c_int {
    match outcome {
        Outcome::Pass if overflow => SLUICE_KEY_OVERFLOW,
        Outcome::Pass => SLUICE_PASS,
        Outcome::Reject(_) => SLUICE_REJECT,
        Outcome::Unknown => SLUICE_UNKNOWN,
        Outcome::NoKey => SLUICE_NO_KEY,
        Outcome::KeyOverflow => SLUICE_KEY_OVERFLOW,
    }
}
