//! The access-phase handler: a request's `sluice` checks, in four steps
//! (see [`check`]): evaluate the directives' arguments for this request,
//! decide (the table's check, `sluice_wait_max`'s cap), keep what must
//! outlive the access phase (the counted checks, the in-flight slots),
//! and answer (`answer.rs`: log, headers, status). The main request's
//! state, its holds and `$sluice_status` are in `request_state.rs`.
//!
//! The request path allocates nothing beyond what nginx takes from the
//! request pool (evaluated names, response headers): items and header
//! values live on the stack.

use std::sync::atomic::Ordering;

use ngx::ffi::{
    ngx_http_complex_value, ngx_http_complex_value_t, ngx_http_request_t, ngx_int_t, ngx_str_t,
    NGX_DECLINED, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};

use super::answer::{log_unknown, reject_no_key, reject_weight, respond, Decision};
use super::args::{runtime_weight, Answer, NoKey, RequestStatus, Then, WeightError};
use super::conf::{Check, LocConf, MainConf, Weight};
use super::in_flight::{self, SlotMask};
use super::request_counters::RequestCounters;
use super::request_state::{let_go_coalesced, state, RequestState};
use super::util::{bytes, runtime_boundary};
use super::Module;
use crate::core::Nanos;
use crate::table::{CheckItem, CheckOptions, HeldSlot, Outcome, Table, MAX_CHECKS};

/// The access-phase handler nginx calls.
pub(crate) unsafe extern "C" fn access_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx passes the request being processed, valid for the call.
    let log_to = unsafe { (*(*r).connection).log };
    runtime_boundary(
        log_to,
        "the access handler",
        NGX_DECLINED as ngx_int_t,
        || {
            // SAFETY: as above; nothing else uses the request meanwhile.
            check(unsafe { &mut *r })
        },
    )
}

/// Evaluates a complex value for `r`; `None` if nginx could not.
pub(super) fn evaluate<'a>(
    r: &mut ngx_http_request_t,
    cv: *const ngx_http_complex_value_t,
) -> Option<&'a [u8]> {
    let mut value = ngx_str_t::default();
    // SAFETY: `cv` was compiled at configuration time and lives with the
    // configuration; the value nginx returns lives in the request pool (or
    // in the configuration, for a literal).
    unsafe {
        if ngx_http_complex_value(r, cv.cast_mut(), &mut value) != NGX_OK as ngx_int_t {
            return None;
        }
        Some(bytes(&value))
    }
}

/// What a location checks with: its configuration and the zone's table
/// and counts.
struct Location<'a> {
    lcf: &'a LocConf,
    mcf: &'a MainConf,
    /// The location's `sluice` directives (at least one).
    checks: &'a [Check],
    table: &'a Table,
    counters: Option<&'a RequestCounters>,
}

impl Location<'static> {
    /// The location of `r`, when it checks anything and the zone is up.
    fn of(r: &ngx_http_request_t) -> Option<Self> {
        let lcf = Module::location_conf(r)?;
        let checks = match lcf.checks.as_deref() {
            Some(checks) if !checks.is_empty() => checks,
            _ => return None,
        };
        let mcf = Module::main_conf(r)?;
        let table = mcf.table.as_deref()?;
        Some(Location {
            lcf,
            mcf,
            checks,
            table,
            counters: mcf.counters(),
        })
    }
}

/// Why a request's checks are not made: it is refused (or, in dry run,
/// let through) without counting anything.
enum Unchecked<'a> {
    /// A check's weight could not be had from its variable.
    Weight {
        /// The quota it checks.
        name: &'a [u8],
        error: WeightError,
        /// The variable's value.
        value: &'a [u8],
    },
    /// A check with `no_key=reject` has an empty key.
    NoKey {
        /// The quota it checks.
        name: &'a [u8],
    },
}

fn check(r: &mut ngx_http_request_t) -> ngx_int_t {
    let declined = NGX_DECLINED as ngx_int_t;
    // The worker is awake for this request: holds that may end now go too.
    let_go_coalesced();
    let Some(at) = Location::of(r) else {
        return declined;
    };
    // SAFETY: `r` is live for this call.
    let Some(state) = (unsafe { state(r) }) else {
        return declined;
    };
    if state.status != RequestStatus::Unchecked {
        return declined;
    }
    let none = CheckItem {
        name: &[],
        key: None,
        weight: 0,
        max_wait: None,
    };
    let mut items = [none; MAX_CHECKS];
    match evaluate_checks(r, at.checks, &mut items) {
        Ok(()) => {}
        Err(Unchecked::Weight { name, error, value }) => {
            return reject_weight(r, at.lcf, state, at.counters, name, error, value);
        }
        Err(Unchecked::NoKey { name }) => return reject_no_key(r, at.lcf, state, name),
    }
    let count = at.checks.len().min(MAX_CHECKS);
    let slots = in_flight::prepare(at.table, &mut items[..count]);
    let items = &items[..count];
    let charged_at = crate::clock::now();
    let decision = decide(r, &at, state, items, charged_at);
    keep(r, &at, state, &decision, slots, charged_at);
    respond(r, at.lcf, at.table, at.counters, state, &decision)
}

/// Evaluates the location's checks for this request into `items`: each
/// one's name, key and weight. A weight that is no number, or an empty key
/// where `no_key=reject`, stops it.
fn evaluate_checks<'a>(
    r: &mut ngx_http_request_t,
    checks: &[Check],
    items: &mut [CheckItem<'a>],
) -> Result<(), Unchecked<'a>> {
    for (item, c) in items.iter_mut().zip(checks) {
        let name = evaluate(r, c.name).unwrap_or(&[]);
        let weight =
            weight(r, c).map_err(|(error, value)| Unchecked::Weight { name, error, value })?;
        // A key nginx cannot evaluate is an empty key: not checked, or
        // refused with `no_key=reject`.
        let key = c.key.map(|cv| evaluate(r, cv).unwrap_or(&[]));
        if c.no_key == NoKey::Reject && key.is_some_and(<[u8]>::is_empty) {
            return Err(Unchecked::NoKey { name });
        }
        *item = CheckItem {
            name,
            key,
            weight,
            max_wait: c.max_wait,
        };
    }
    Ok(())
}

/// Decides the request: the table checks (and counts) `items` at
/// `charged_at`, checks of unknown names are logged, and a hold over
/// `sluice_wait_max`'s cap becomes a rejection.
fn decide<'a>(
    r: &mut ngx_http_request_t,
    at: &Location<'a>,
    state: &mut RequestState,
    items: &'a [CheckItem<'a>],
    charged_at: Nanos,
) -> Decision<'a> {
    let (lcf, table) = (at.lcf, at.table);
    let dry_run = lcf.dry_run.unwrap_or(false);
    let headers = lcf.headers.unwrap_or(false);
    let options = CheckOptions {
        dry_run,
        headroom: headers,
    };
    let unknown_log = lcf.unknown_log_level();
    // A name with no quota is skipped among known ones; the table's count
    // of such checks moving is the cue to look for it (another worker's
    // check may move it too: then no name is found unknown).
    let unknown_before = unknown_log.map(|_| table.unknown_checks());
    let result = table
        .gate()
        .check_many(items, charged_at, options, crate::host::thread_unit);
    if let (Some(level), Some(before), Some(names)) =
        (unknown_log, unknown_before, at.mcf.unknown_names())
    {
        if result.outcome == Outcome::Unknown || table.unknown_checks() != before {
            log_unknown(r, level, table, names, items, charged_at);
        }
    }
    let mut answer = Answer::of(&result, dry_run, headers);
    if let (Then::Hold(wait), Some(cap), Some(c)) = (answer.then, lcf.wait_max, at.counters) {
        if !c.take_hold(cap.slot, cap.max) {
            // Over the cap: rejected at once, its weight (just counted,
            // not sent yet) given back, told when its turn would have
            // been.
            for item in items {
                table
                    .gate()
                    .give_back(item, item.weight, charged_at, charged_at, false);
            }
            c.hold_refused.fetch_add(1, Ordering::Relaxed);
            answer = answer.refused_hold(wait);
        } else {
            state.cap_slot = Some(cap.slot);
        }
    }
    Decision {
        items,
        checks: at.checks,
        result,
        answer,
    }
}

/// Keeps what must outlive the access phase: the in-flight slots of a
/// request that passed (given back in the log phase), and the checks
/// counted for it (given back if its hold is abandoned; what a settle
/// settles).
fn keep(
    r: &mut ngx_http_request_t,
    at: &Location,
    state: &mut RequestState,
    decision: &Decision,
    slots: SlotMask,
    charged_at: Nanos,
) {
    let Decision {
        items,
        result,
        answer,
        ..
    } = decision;
    if result.outcome == Outcome::Pass && answer.then != Then::Reject {
        let held = HeldSlot {
            at: charged_at,
            overflowed: result.overflow,
        };
        in_flight::hold(r, at.table, items, slots, held);
    }
    if matches!(
        answer.status,
        RequestStatus::Passed | RequestStatus::Delayed | RequestStatus::DelayedDryRun
    ) {
        state.record_counted(at.table, charged_at, items);
    }
    if let Then::Hold(_) = answer.then {
        // Its in-flight slots go back in the log phase, not with a hold
        // whose client leaves.
        in_flight::exclude_from_hold(&mut state.held_items, slots);
    }
}

/// The weight of one check for this request, or why it has none (with
/// the variable's value).
fn weight<'a>(r: &mut ngx_http_request_t, c: &Check) -> Result<u64, (WeightError, &'a [u8])> {
    match c.weight {
        Weight::Fixed(w) => Ok(w),
        Weight::Value { value, empty } => {
            // A value nginx could not evaluate is no number either.
            let Some(value) = evaluate(r, value) else {
                return Err((WeightError::Invalid, &[]));
            };
            runtime_weight(value, empty).map_err(|e| (e, value))
        }
    }
}
