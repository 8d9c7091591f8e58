//! `sluice_charge`: weight known only after the response (bytes sent,
//! tokens an upstream reports, a failed login), counted in the log phase.
//!
//! The log phase runs once a request is done, when every variable has its
//! final value. A charge never rejects (the response is gone): it counts
//! its weight in full, past the limit if need be ([`crate::table::Gate::charge`]), so
//! the debt is what later checks see. With `settle`, it counts only the
//! difference from the weight the request's own `sluice` check of the
//! same quota (and key) counted, giving units back when the actual cost
//! is lower ([`crate::table::Gate::settle`]; see docs/DESIGN.md, "Counters that give
//! units back").
//!
//! A request the `sluice` checks refused is not charged, whatever refused
//! it (a quota, a deny override, a weight that is no number, a missing
//! key with `no_key=reject`, `sluice_wait_max`): its response is
//! sluice's own refusal (a 429's bytes would only deepen the debt that
//! refused it, and a flood of refusals could keep a quota shut).
//!
//! A request is charged once: only the main request (a subrequest logged
//! with `log_subrequest on` is not), and a mark kept in the main
//! request's pool (a cleanup entry, as `request_state.rs` keeps its state)
//! says it was, with the status `$sluice_charge_status` shows.
//!
//! This file registers its own log-phase handler ([`install`]) beside
//! whatever else the module runs in that phase.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use ngx::ffi::{
    ngx_array_push, ngx_conf_t, ngx_http_handler_pt, ngx_http_phases_NGX_HTTP_LOG_PHASE,
    ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t, ngx_pool_cleanup_add, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};

use super::answer::ShownWeight;
use super::charge_args::{charge_condition, charge_weight, ChargeStatus};
use super::conf::{ChargeConf, LocConf, Weight};
use super::handler::evaluate;
use super::request_counters::RequestCounters;
use super::request_state::{admitted, rejected};
use super::util::{cleanup_data, log, runtime_boundary, set_variable, text};
use super::Module;
use crate::core::Nanos;
use crate::table::{CheckItem, Outcome, Table};

/// Adds the charging handler to the log phase (at the end of the `http`
/// block, from `postconfiguration`), first in it: the access log (whose
/// module registered earlier) then shows `$sluice_charge_status`.
pub(super) fn install(cf: *mut ngx_conf_t) -> Result<(), String> {
    // SAFETY: `cf` is the live configuration at the end of the http block.
    let cmcf = NgxHttpCoreModule::main_conf_mut(unsafe { &*cf })
        .ok_or("sluice: no http core configuration")?;
    let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_LOG_PHASE as usize].handlers;
    // SAFETY: the phase's handler array holds `nelts` ngx_http_handler_pt
    // entries; the push made room for one more, and the earlier entries
    // move up by one to put this one first.
    unsafe {
        if ngx_array_push(handlers).is_null() {
            return Err("sluice: out of memory".into());
        }
        let all = std::slice::from_raw_parts_mut(
            handlers.elts.cast::<ngx_http_handler_pt>(),
            handlers.nelts,
        );
        all.rotate_right(1);
        all[0] = Some(log_handler);
    }
    Ok(())
}

/// The charges of a main request, kept in its pool.
#[repr(C)]
struct ChargeMark {
    status: ChargeStatus,
}

/// Marks the pool cleanup entry that holds a [`ChargeMark`]; nothing to
/// free.
unsafe extern "C" fn mark_cleanup(_data: *mut c_void) {}

/// The main request's charge mark, if it was charged.
///
/// # Safety
/// `r` must be a live request.
unsafe fn find_mark<'a>(r: *const ngx_http_request_t) -> Option<&'a mut ChargeMark> {
    // SAFETY: a live request has a live main request and pool; the entry
    // marked by `mark_cleanup` holds a ChargeMark.
    unsafe {
        cleanup_data((*(*r).main).pool, mark_cleanup)
            .cast::<ChargeMark>()
            .as_mut()
    }
}

/// The log-phase handler nginx calls.
unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx passes the request being logged, valid for the call.
    let log_to = unsafe { (*(*r).connection).log };
    runtime_boundary(log_to, "the charge handler", NGX_OK as ngx_int_t, || {
        // SAFETY: as above; nothing else uses the request meanwhile.
        charge_request(unsafe { &mut *r });
        NGX_OK as ngx_int_t
    })
}

fn charge_request(r: &mut ngx_http_request_t) {
    if !std::ptr::eq(r, r.main) {
        return;
    }
    let Some(lcf) = Module::location_conf(r) else {
        return;
    };
    let charges = match lcf.charges.as_deref() {
        Some(charges) if !charges.is_empty() => charges,
        _ => return,
    };
    let Some(mcf) = Module::main_conf(r) else {
        return;
    };
    let Some(table) = mcf.table.as_deref() else {
        return;
    };
    // SAFETY: `r` is live for this call.
    if unsafe { find_mark(r) }.is_some() {
        return;
    }
    // SAFETY: the main request's live pool; the entry's data is sized
    // for a ChargeMark and lives as long as the pool.
    let mark = unsafe {
        let c = ngx_pool_cleanup_add(r.pool, std::mem::size_of::<ChargeMark>());
        if c.is_null() {
            return;
        }
        (*c).handler = Some(mark_cleanup);
        let data = (*c).data.cast::<ChargeMark>();
        data.write(ChargeMark {
            status: ChargeStatus::Uncharged,
        });
        &mut *data
    };
    // SAFETY: `r` is live for this call.
    if unsafe { rejected(r) } {
        mark.status = ChargeStatus::Skipped;
        return;
    }
    let counters = mcf.counters();
    let now = crate::clock::now();
    for charge in charges {
        let status = charge_one(r, lcf, table, counters, charge, now);
        mark.status = mark.status.and(status);
    }
}

/// Runs one `sluice_charge` for the request; returns what it did.
fn charge_one(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    table: &Table,
    counters: Option<&RequestCounters>,
    charge: &ChargeConf,
    now: Nanos,
) -> ChargeStatus {
    if let Some(condition) = charge.condition {
        if !evaluate(r, condition).is_some_and(charge_condition) {
            return ChargeStatus::Skipped;
        }
    }
    let name = evaluate(r, charge.name).unwrap_or(&[]);
    let weight = match charge.weight {
        Weight::Fixed(w) => Ok(Some(w)),
        // A value nginx could not evaluate has no number either.
        Weight::Value { value, .. } => match evaluate(r, value) {
            Some(value) => charge_weight(value).map_err(|_| value),
            None => Err(&[][..]),
        },
    };
    let weight = match weight {
        Ok(Some(weight)) => weight,
        Ok(None) => return ChargeStatus::Skipped,
        Err(value) => {
            if let Some(c) = counters {
                c.invalid_weight.fetch_add(1, Ordering::Relaxed);
            }
            log_invalid_weight(r, lcf, name, value);
            return ChargeStatus::InvalidWeight;
        }
    };
    // A key nginx cannot evaluate is an empty key: nothing is charged.
    let key = charge.key.map(|cv| evaluate(r, cv).unwrap_or(&[]));
    let item = CheckItem {
        name,
        key,
        weight,
        max_wait: None,
    };
    // SAFETY: `r` is live for this call.
    let estimate = charge.settle.then(|| unsafe { admitted(r, name, key) });
    let (counted, settled) = match estimate.flatten() {
        Some((estimate, at)) => (table.gate().settle(&item, estimate, at, now), true),
        None => (table.gate().charge(&item, now), false),
    };
    match counted.outcome {
        Outcome::Pass if settled => ChargeStatus::Settled,
        Outcome::Pass => ChargeStatus::Charged,
        Outcome::Unknown => ChargeStatus::Unknown,
        Outcome::NoKey => ChargeStatus::NoKey,
        Outcome::KeyOverflow | Outcome::Reject(_) => ChargeStatus::KeyOverflow,
    }
}

/// Logs a charge whose weight is no number (at `sluice_log_level`).
fn log_invalid_weight(r: &mut ngx_http_request_t, lcf: &LocConf, quota: &[u8], value: &[u8]) {
    let quota = text(quota);
    let shown = ShownWeight(value);
    // SAFETY: the request's log; nginx appends client and request.
    unsafe {
        log(
            lcf.log_level(),
            (*r.connection).log,
            format_args!(
                "sluice: nothing charged to quota \"{quota}\": weight \"{shown}\" is not a \
                 non-negative integer"
            ),
        )
    }
}

/// The `$sluice_charge_status` variable's get handler: what the request's
/// charges did (not found before the log phase, or without charges).
pub(crate) unsafe extern "C" fn charge_status_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    // SAFETY: nginx passes the live request and a value to fill.
    unsafe {
        let status = find_mark(r).map_or(ChargeStatus::Uncharged, |m| m.status);
        set_variable(&mut *v, Some(status.as_str()));
    }
    NGX_OK as ngx_int_t
}
