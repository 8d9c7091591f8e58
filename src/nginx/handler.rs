//! The access-phase check, `wait=` holds, and the `$sluice_status`
//! variable.
//!
//! A request is charged once: its outcome is stored on the main request
//! in a pool cleanup entry (the module context would be wiped by an
//! internal redirect, which runs the access phase again), and a request
//! that already has an outcome is not checked again. nginx skips the
//! access phase for subrequests.
//!
//! A request over a quota checked with `wait=` whose turn comes within
//! that time is counted at once and held, as `limit_req` holds one
//! without `nodelay`: the handler arms an nginx timer on the connection's
//! write event and returns `NGX_AGAIN`; when the timer fires, the phases
//! resume at this handler, which finds the outcome (`DELAYED`) and lets
//! the request go on. A client that closes meanwhile ends the request
//! (nginx watches the read side with `ngx_http_test_reading`); the state's
//! pool cleanup then removes the timer if it is still armed, counts the
//! hold as abandoned and gives its weight back to every quota it was
//! counted on ([`crate::table::Gate::give_back`]: what was not sent to the roots yet
//! is uncounted, the rest goes to them as a return with the next sync, or
//! is folded in while this host counts locally), as a rejected request is
//! not counted. `sluice_wait_max` caps the requests held at once under
//! it (every worker together, a slot of the zone's counts each): one over
//! the cap is rejected at once, its weight given back.
//!
//! Each hold's timer wakes the worker once more. With
//! `sluice_wait_coalesce <time>` a hold may end up to that time before
//! its turn when the worker is awake anyway: the holds that allow it are
//! also kept in a per-worker list ordered by the time they may end, and
//! every request through the access phase, and every hold's timer, lets
//! go those whose time has come (their timers removed, their write events
//! posted, so nginx resumes them later in the same turn of its event
//! loop). The list is the worker's own: nginx runs a worker's requests on
//! one thread. An entry leaves it when its hold ends, whichever way.
//!
//! The request path allocates nothing beyond what nginx takes from the
//! request pool (evaluated names, response headers): items and header
//! values live on the stack.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt::Write;
use std::sync::atomic::Ordering;

use ngx::ffi::{
    ngx_add_timer, ngx_connection_t, ngx_current_msec, ngx_del_timer, ngx_delete_posted_event,
    ngx_handle_read_event, ngx_handle_write_event, ngx_http_block_reading, ngx_http_complex_value,
    ngx_http_complex_value_t, ngx_http_core_run_phases, ngx_http_finalize_request,
    ngx_http_request_t, ngx_http_test_reading, ngx_http_variable_value_t, ngx_int_t, ngx_msec_t,
    ngx_pool_cleanup_add, ngx_post_event, ngx_posted_events, ngx_str_t, ngx_uint_t, NGX_AGAIN,
    NGX_DECLINED, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};

use super::args::{runtime_weight, wait_timer_ms, Answer, RequestStatus, Then, WeightError};
use super::conf::{Check, LocConf, Weight};
use super::headers::{rate_limit_fields, HeaderValue, Reset};
use super::held_item::HeldItem;
use super::request_counters::RequestCounters;
use super::unknown_names::{self, ShownName, UnknownNames};
use super::util::{bytes, cleanup_data, log, runtime_boundary, set_variable, text};
use super::{inflight, Module};
use crate::core::key::KeyHash;
use crate::core::{Nanos, Terms, Wait};
use crate::table::{
    CheckItem, CheckOptions, Headroom, HeldSlot, ManyOutcome, Outcome, Rejection, Table, MAX_CHECKS,
};

/// Most bytes of a bad weight value a log line quotes (the value comes
/// from the client).
pub(super) const MAX_LOGGED_WEIGHT: usize = 64;

/// The outcome of the main request, kept in its pool.
#[repr(C)]
struct RequestState {
    status: RequestStatus,
    /// When its checks were counted (passed or held): the table, when,
    /// and the checks (null, 0 and none otherwise): to give a held
    /// request's weight back if the client leaves first, and what a
    /// `sluice_charge ... settle` settles ([`admitted`]).
    table: *const Table,
    charged_at: u64,
    held_items: [HeldItem; MAX_CHECKS],
    held_count: usize,
    /// While held under `sluice_wait_max`: its slot of the zone's counts.
    cap_slot: Option<usize>,
    /// While the request is held by `wait=`: its connection, whose write
    /// event carries the timer. Null otherwise.
    held: *mut ngx_connection_t,
    /// The zone's counters, to count the end of a hold (null without).
    counters: *const RequestCounters,
    /// While the hold is in the worker's coalescing list: its key there.
    coalescing: Option<CoalesceKey>,
    /// When the hold's turn comes (`ngx_current_msec`).
    due_msec: u64,
    /// The hold was let go early: its write event was posted by
    /// [`let_go_coalesced`], not by its timer.
    posted_early: bool,
}

/// A hold's place in the coalescing list: the earliest time it may end
/// (`ngx_current_msec`), and a number that makes the key unique.
type CoalesceKey = (u64, u64);

/// The holds of this worker that may end early
/// (`sluice_wait_coalesce`), by the time they may end.
struct Coalescing {
    next: u64,
    holds: BTreeMap<CoalesceKey, *mut RequestState>,
}

thread_local! {
    static COALESCING: RefCell<Coalescing> = const {
        RefCell::new(Coalescing {
            next: 0,
            holds: BTreeMap::new(),
        })
    };
}

/// Adds a hold to the worker's coalescing list.
fn coalesce(state: &mut RequestState, earliest_msec: u64) {
    let key = COALESCING.with_borrow_mut(|c| {
        c.next += 1;
        let key = (earliest_msec, c.next);
        c.holds.insert(key, std::ptr::from_mut(state));
        key
    });
    state.coalescing = Some(key);
}

/// Takes a hold off the worker's coalescing list, if it is there.
fn uncoalesce(state: &mut RequestState) {
    if let Some(key) = state.coalescing.take() {
        COALESCING.with_borrow_mut(|c| c.holds.remove(&key));
    }
}

/// Lets go every hold in the coalescing list whose earliest end has come:
/// its timer is removed and its write event posted, so nginx resumes it
/// after the handlers of this turn of its event loop, on this wakeup.
fn let_go_coalesced() {
    // SAFETY: nginx's cached clock, read on the worker's own thread.
    let now = unsafe { ngx_current_msec } as u64;
    loop {
        let next = COALESCING.with_borrow_mut(|c| {
            let (&(earliest, _), _) = c.holds.first_key_value()?;
            if earliest > now {
                return None;
            }
            c.holds.pop_first().map(|(_, state)| state)
        });
        let Some(state) = next else {
            return;
        };
        // SAFETY: an entry stays in the list only while its request is
        // held: `state_cleanup` and `delay_handler` take it off before the
        // request's pool (which holds the state) can be freed.
        let Some(state) = (unsafe { state.as_mut() }) else {
            continue;
        };
        state.coalescing = None;
        let c = state.held;
        if c.is_null() {
            continue;
        }
        // SAFETY: a held request's connection and its write event are
        // live while it is held; the timer on the event is this hold's.
        unsafe {
            let wev = (*c).write;
            if wev.is_null() {
                continue;
            }
            if (*wev).timer_set() != 0 {
                ngx_del_timer(wev);
            }
            (*wev).set_delayed(0);
            ngx_post_event(wev, std::ptr::addr_of_mut!(ngx_posted_events));
            state.posted_early = true;
            if now < state.due_msec {
                if let Some(counters) = state.counters.as_ref() {
                    counters.coalesced.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

impl RequestState {
    /// Ends a hold (the timer fired, or the request is freed first):
    /// forgets the connection and takes the request off the `waiting`
    /// gauge. Returns the connection that was held, if any.
    fn release(&mut self) -> Option<*mut ngx_connection_t> {
        let held = std::mem::replace(&mut self.held, std::ptr::null_mut());
        if held.is_null() {
            return None;
        }
        // SAFETY: set with the counters of the zone, which outlives every
        // request of the cycle that points at it.
        if let Some(c) = unsafe { self.counters.as_ref() } {
            c.waiting.fetch_sub(1, Ordering::Relaxed);
            if let Some(slot) = self.cap_slot.take() {
                c.end_hold(slot);
            }
        }
        Some(held)
    }

    /// Gives the held checks' weight back (the client left before its
    /// turn); returns the units given back to the checked quotas.
    fn give_back(&mut self) -> u64 {
        let count = std::mem::take(&mut self.held_count);
        // SAFETY: set from the cycle's table, which outlives its requests.
        let Some(table) = (unsafe { self.table.as_ref() }) else {
            return 0;
        };
        let now = crate::clock::now();
        self.held_items[..count.min(MAX_CHECKS)]
            .iter()
            .map(|held| {
                // SAFETY: called from the pool's cleanup, which runs before
                // the pool's memory (where the names and keys live) is
                // freed.
                let item = unsafe { held.item() };
                table
                    .gate()
                    .give_back(&item, item.weight, self.charged_at, now, false)
            })
            .sum()
    }
}

/// The pool cleanup of a [`RequestState`] (it also marks the entry): a
/// request freed while it is still held, because its client closed or
/// nginx ended it, has its timer removed and its hold counted as
/// abandoned. nginx runs pool cleanups before it frees the pool's memory
/// and before it closes the connection.
unsafe extern "C" fn state_cleanup(data: *mut c_void) {
    // SAFETY: nginx passes the entry's data, a RequestState written by
    // `state` and alive until the pool's memory is freed after this.
    let Some(state) = (unsafe { data.cast::<RequestState>().as_mut() }) else {
        return;
    };
    uncoalesce(state);
    let posted_early = std::mem::take(&mut state.posted_early);
    let Some(c) = state.release() else {
        return;
    };
    // SAFETY: the held connection outlives its requests (nginx closes it
    // after freeing them); its write event is live with it. The timer on
    // it is this hold's: nothing else arms it while the request waits,
    // and a post of it is this hold's when `let_go_coalesced` made it.
    unsafe {
        let wev = (*c).write;
        if !wev.is_null() {
            if (*wev).timer_set() != 0 {
                ngx_del_timer(wev);
            }
            if posted_early && (*wev).posted() != 0 {
                ngx_delete_posted_event(wev);
            }
            (*wev).set_delayed(0);
        }
        let returned = state.give_back();
        if let Some(counters) = state.counters.as_ref() {
            counters.abandoned.fetch_add(1, Ordering::Relaxed);
            counters.returned.fetch_add(returned, Ordering::Relaxed);
        }
    }
}

/// The main request's state, if it has one.
///
/// # Safety
/// `r` must be a live request.
unsafe fn find_state<'a>(r: *const ngx_http_request_t) -> Option<&'a mut RequestState> {
    // SAFETY: a live request has a live main request and pool; the entry
    // marked by `state_cleanup` holds a RequestState.
    unsafe {
        cleanup_data((*(*r).main).pool, state_cleanup)
            .cast::<RequestState>()
            .as_mut()
    }
}

/// The main request's state, created (unchecked) if it has none; `None`
/// only when the pool is out of memory.
///
/// # Safety
/// `r` must be a live request.
unsafe fn state<'a>(r: *const ngx_http_request_t) -> Option<&'a mut RequestState> {
    // SAFETY: as in `find_state`; the new entry's data is sized for
    // RequestState by ngx_pool_cleanup_add and lives as long as the pool.
    unsafe {
        if let Some(s) = find_state(r) {
            return Some(s);
        }
        let c = ngx_pool_cleanup_add((*(*r).main).pool, std::mem::size_of::<RequestState>());
        if c.is_null() {
            return None;
        }
        let data = (*c).data.cast::<RequestState>();
        data.write(RequestState {
            status: RequestStatus::Unchecked,
            table: std::ptr::null(),
            charged_at: 0,
            held_items: [HeldItem::NONE; MAX_CHECKS],
            held_count: 0,
            cap_slot: None,
            held: std::ptr::null_mut(),
            counters: std::ptr::null(),
            coalescing: None,
            due_msec: 0,
            posted_early: false,
        });
        (*c).handler = Some(state_cleanup);
        data.as_mut()
    }
}

/// The weight the main request's `sluice` check of `name` (and `key`)
/// counted, and when: what a `sluice_charge ... settle` settles. `None`
/// when no such check counted (it was rejected, its name is not among
/// the checks, its key overflowed) or the request is still held: a hold
/// whose client left gives its whole weight back when the request is
/// freed, so a settle must not give it back too.
///
/// # Safety
/// `r` must be a live request.
pub(super) unsafe fn admitted(
    r: *const ngx_http_request_t,
    name: &[u8],
    key: Option<&[u8]>,
) -> Option<(u64, Nanos)> {
    // SAFETY: `r` is live per the contract.
    let state = unsafe { find_state(r) }?;
    if state.table.is_null() || !state.held.is_null() {
        return None;
    }
    state.held_items[..state.held_count.min(MAX_CHECKS)]
        .iter()
        .find_map(|held| {
            // SAFETY: the names and keys live in the main request's pool,
            // alive while the request is.
            let item = unsafe { held.item() };
            (item.name == name && item.key.unwrap_or(&[]) == key.unwrap_or(&[]))
                .then_some((item.weight, state.charged_at))
        })
}

/// Whether the main request's `sluice` checks rejected it (not in dry
/// run): its response is sluice's own refusal, and a charge after it
/// would only deepen the debt that refused it.
///
/// # Safety
/// `r` must be a live request.
pub(super) unsafe fn rejected(r: *const ngx_http_request_t) -> bool {
    // SAFETY: `r` is live per the contract.
    unsafe { find_state(r) }.is_some_and(|s| s.status == RequestStatus::Rejected)
}

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

fn check(r: &mut ngx_http_request_t) -> ngx_int_t {
    let declined = NGX_DECLINED as ngx_int_t;
    // The worker is awake for this request: holds that may end now go too.
    let_go_coalesced();
    let Some(lcf) = Module::location_conf(r) else {
        return declined;
    };
    let checks = match lcf.checks.as_deref() {
        Some(checks) if !checks.is_empty() => checks,
        _ => return declined,
    };
    let Some(mcf) = Module::main_conf(r) else {
        return declined;
    };
    let Some(table) = mcf.table.as_deref() else {
        return declined;
    };
    let counters = mcf.counters();
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
    for (item, c) in items.iter_mut().zip(checks) {
        let name = evaluate(r, c.name).unwrap_or(&[]);
        let weight = match weight(r, c) {
            Ok(weight) => weight,
            Err((error, value)) => {
                return reject_weight(r, lcf, state, counters, name, error, value);
            }
        };
        // A key nginx cannot evaluate is an empty key: not checked.
        let key = c.key.map(|cv| evaluate(r, cv).unwrap_or(&[]));
        *item = CheckItem {
            name,
            key,
            weight,
            max_wait: c.max_wait,
        };
    }
    let count = checks.len().min(MAX_CHECKS);
    let slots = inflight::prepare(table, &mut items[..count]);
    let items = &items[..count];
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
    let charged_at = crate::clock::now();
    let result = table
        .gate()
        .check_many(items, charged_at, options, crate::host::thread_unit);
    if let (Some(level), Some(before), Some(names)) =
        (unknown_log, unknown_before, mcf.unknown_names())
    {
        if result.outcome == Outcome::Unknown || table.unknown_checks() != before {
            log_unknown(r, level, table, names, items, charged_at);
        }
    }
    let mut answer = Answer::of(&result, dry_run, headers);
    if let (Then::Hold(wait), Some(cap), Some(c)) = (answer.then, lcf.wait_max, counters) {
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
    if result.outcome == Outcome::Pass && answer.then != Then::Reject {
        let held = HeldSlot {
            at: charged_at,
            overflowed: result.overflow,
        };
        inflight::hold(r, table, items, slots, held);
    }
    state.status = answer.status;
    match (result.outcome, result.item) {
        (Outcome::Pass, Some(i)) if result.wait > 0 => {
            if let (Some(item), Some(check)) = (items.get(i), checks.get(i)) {
                let allowed = check.max_wait.unwrap_or(0);
                log_delay(r, lcf, dry_run, item, result.wait, allowed);
            }
        }
        (Outcome::Reject(rejection), item) => {
            log_rejected(r, lcf, dry_run, table, items, item.unwrap_or(0), &rejection);
        }
        _ => {}
    }
    if let Some(c) = counters {
        if answer.unpassable {
            c.unpassable.fetch_add(1, Ordering::Relaxed);
        }
        if answer.status == RequestStatus::DelayedDryRun {
            c.delayed_dry_run.fetch_add(1, Ordering::Relaxed);
        }
    }
    if answer.headers {
        add_rate_limit_headers(r, lcf, table, items, &result, answer.reset);
    }
    if matches!(
        answer.status,
        RequestStatus::Passed | RequestStatus::Delayed | RequestStatus::DelayedDryRun
    ) {
        state.table = table;
        state.charged_at = charged_at;
        state.held_count = items.len();
        for (held, item) in state.held_items.iter_mut().zip(items) {
            *held = HeldItem::of(item);
        }
    }
    match answer.then {
        Then::Continue => declined,
        Then::Hold(wait) => {
            // Its in-flight slots go back in the log phase, not with a
            // hold whose client leaves.
            inflight::exclude_from_hold(&mut state.held_items, slots);
            hold(r, state, counters, wait, lcf.wait_coalesce_ms())
        }
        Then::Reject => lcf.status() as ngx_int_t,
        Then::Deny => lcf.deny_status() as ngx_int_t,
    }
}

/// Logs the checks of `items` whose names have no quota (at
/// `sluice_unknown_log`), each the first time and then at most once a
/// period per name ([`UnknownNames`]).
fn log_unknown(
    r: &mut ngx_http_request_t,
    level: ngx_uint_t,
    table: &Table,
    names: &UnknownNames,
    items: &[CheckItem],
    now: Nanos,
) {
    for item in items {
        if table.gate().lookup(item.name).is_some() {
            continue;
        }
        let Some(due) = names.note(item.name, now) else {
            continue;
        };
        let name = ShownName(item.name);
        let period = unknown_names::PERIOD;
        let mut more = HeaderValue::default();
        if due.repeats > 0 {
            let _ = write!(more, "; {} check(s) of it since the last line", due.repeats);
        }
        if due.held_back > 0 {
            let _ = write!(
                more,
                "; {} line(s) about other unknown names held back",
                due.held_back
            );
        }
        let more = more.as_str();
        // SAFETY: the request's log; nginx appends client and request.
        unsafe {
            log(
                level,
                (*r.connection).log,
                format_args!(
                    "sluice: no quota is named \"{name}\": its checks pass uncounted \
                     (logged at most once every {period}s per name{more})"
                ),
            )
        }
    }
}

/// Logs a rejection (at `sluice_log_level`) naming the quota that
/// rejected, which may be an ancestor of the checked one.
fn log_rejected(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    dry_run: bool,
    table: &Table,
    items: &[CheckItem],
    item: usize,
    rejection: &Rejection,
) {
    let checked = items.get(item).map_or(&[][..], |i| i.name);
    let mut quota_buf = [0u8; 256];
    let quota = table
        .name_into(rejection.slot, &mut quota_buf)
        .unwrap_or(checked);
    let rejected = Rejected {
        quota,
        checked,
        weight: items.get(item).map_or(0, |i| i.weight),
        limit: Limit(table.terms_of(rejection.slot), rejection.limit),
        wait: rejection.wait,
        key: rejection.key,
    };
    log_rejection(r, lcf, dry_run, &rejected);
}

/// Holds a request `wait_ns` nanoseconds with an nginx timer on its
/// connection's write event, as `limit_req` delays one: the phases stop
/// here (`NGX_AGAIN`) and [`delay_handler`] resumes them. With a
/// coalescing window (`coalesce_ms`, 0 for none) the hold joins the
/// worker's coalescing list, and a wait no longer than the window is not
/// held at all.
fn hold(
    r: &mut ngx_http_request_t,
    state: &mut RequestState,
    counters: Option<&RequestCounters>,
    wait_ns: u64,
    coalesce_ms: u64,
) -> ngx_int_t {
    let ms = wait_timer_ms(wait_ns);
    if let Some(c) = counters {
        c.delayed.fetch_add(1, Ordering::Relaxed);
        c.delay_ns.fetch_add(wait_ns, Ordering::Relaxed);
    }
    if ms <= coalesce_ms {
        // Its turn is within the window: let it go on this wakeup.
        if let Some(c) = counters {
            c.coalesced.fetch_add(1, Ordering::Relaxed);
        }
        return NGX_DECLINED as ngx_int_t;
    }
    if let Some(c) = counters {
        c.waiting.fetch_add(1, Ordering::Relaxed);
    }
    state.counters = counters.map_or(std::ptr::null(), std::ptr::from_ref);
    state.held = r.connection;
    r.read_event_handler = Some(ngx_http_test_reading);
    r.write_event_handler = Some(delay_handler);
    // SAFETY: the request's live connection and its write event; the
    // timer is removed by nginx when it fires, or by `state_cleanup` when
    // the request ends first.
    unsafe {
        let wev = (*r.connection).write;
        (*wev).set_delayed(1);
        // ngx_add_timer keeps an armed timer due within 300 ms of the new
        // one (NGX_TIMER_LAZY_DELAY): start from none, so the hold ends
        // when it should, never earlier.
        if (*wev).timer_set() != 0 {
            ngx_del_timer(wev);
        }
        ngx_add_timer(wev, ms as ngx_msec_t);
        state.due_msec = ngx_current_msec as u64 + ms;
    }
    if coalesce_ms > 0 {
        coalesce(state, state.due_msec - coalesce_ms);
    }
    NGX_AGAIN as ngx_int_t
}

/// The write event handler of a held request: nginx calls it when the
/// timer fires (the event is no longer `delayed`), or when the socket
/// became writable before (it keeps waiting).
unsafe extern "C" fn delay_handler(r: *mut ngx_http_request_t) {
    // SAFETY: nginx passes the live request; its connection and events
    // are live with it.
    unsafe {
        let c = (*r).connection;
        let wev = (*c).write;
        if (*wev).delayed() != 0 {
            if ngx_handle_write_event(wev, 0) != NGX_OK as ngx_int_t {
                ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
            }
            return;
        }
        if let Some(state) = find_state(r) {
            uncoalesce(state);
            state.posted_early = false;
            state.release();
        }
        // A hold's timer woke the worker: holds that may end now go too.
        let_go_coalesced();
        if ngx_handle_read_event((*c).read, 0) != NGX_OK as ngx_int_t {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
            return;
        }
        (*r).read_event_handler = Some(ngx_http_block_reading);
        (*r).write_event_handler = Some(ngx_http_core_run_phases);
        // Back to the access phase at this module's handler, which finds
        // the request DELAYED and lets it go on.
        ngx_http_core_run_phases(r);
    }
}

/// Logs a request held (or, in dry run, one that would have been held)
/// by `wait=`.
fn log_delay(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    dry_run: bool,
    item: &CheckItem,
    wait_ns: u64,
    allowed_ns: u64,
) {
    let how = if dry_run { ", dry run," } else { "" };
    let quota = text(item.name);
    let weight = item.weight;
    let ms = wait_timer_ms(wait_ns);
    let allowed = allowed_ns / 1_000_000;
    // SAFETY: the request's log; nginx appends client and request.
    unsafe {
        log(
            lcf.log_level(),
            (*r.connection).log,
            format_args!(
                "sluice: delaying request{how} by {ms}ms for quota \"{quota}\" \
                 (weight {weight}, wait={allowed}ms)"
            ),
        )
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

/// Rejects a request whose weight is not a number (or empty, with
/// `empty=reject`): as a rejection by a quota (the configured status and
/// log level, let through by dry run), but nothing is checked or counted,
/// and there is no `Retry-After`: waiting cannot fix the weight.
fn reject_weight(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: &mut RequestState,
    counters: Option<&RequestCounters>,
    quota: &[u8],
    error: WeightError,
    value: &[u8],
) -> ngx_int_t {
    let dry_run = lcf.dry_run.unwrap_or(false);
    if let Some(c) = counters {
        let counter = match error {
            WeightError::Invalid => &c.invalid_weight,
            WeightError::Empty => &c.empty_weight,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    let how = if dry_run { ", dry run," } else { "" };
    let quota = text(quota);
    let shown = text(&value[..value.len().min(MAX_LOGGED_WEIGHT)]);
    let cut = if value.len() > MAX_LOGGED_WEIGHT {
        "..."
    } else {
        ""
    };
    // SAFETY: the request's log; nginx appends client and request.
    unsafe {
        match error {
            WeightError::Invalid => log(
                lcf.log_level(),
                (*r.connection).log,
                format_args!(
                    "sluice: limiting requests{how} for quota \"{quota}\": weight \
                     \"{shown}{cut}\" is not a non-negative integer"
                ),
            ),
            WeightError::Empty => log(
                lcf.log_level(),
                (*r.connection).log,
                format_args!(
                    "sluice: limiting requests{how} for quota \"{quota}\": the weight is \
                     empty (set \"empty=0\" to check such requests without counting)"
                ),
            ),
        }
    }
    if dry_run {
        state.status = RequestStatus::RejectedDryRun;
        NGX_DECLINED as ngx_int_t
    } else {
        state.status = RequestStatus::Rejected;
        lcf.status() as ngx_int_t
    }
}

/// A rejection as the log line tells it.
struct Rejected<'a> {
    /// The quota that rejected.
    quota: &'a [u8],
    /// The quota the directive named (the same, or a descendant).
    checked: &'a [u8],
    weight: u64,
    /// What the quota that rejected allows.
    limit: Limit,
    wait: Wait,
    /// The key's hash when a key's counter rejected; 0 otherwise.
    key: KeyHash,
}

fn log_rejection(r: &mut ngx_http_request_t, lcf: &LocConf, dry_run: bool, rejected: &Rejected) {
    let how = if dry_run { ", dry run," } else { "" };
    let quota = text(rejected.quota);
    let checked = text(rejected.checked);
    let (limit, weight) = (&rejected.limit, rejected.weight);
    // A request that waiting cannot help says why (and gets no
    // Retry-After).
    let (never, why) = match &rejected.wait {
        Wait::Never(why) => (": it can never pass, ", Some(why)),
        Wait::Seconds(_) => ("", None),
    };
    let why = DisplayOr(why);
    // Only the key's hash: keys are secrets or personal data.
    let mut key_buf = HeaderValue::default();
    if rejected.key != 0 {
        let _ =
            std::fmt::Write::write_fmt(&mut key_buf, format_args!(" key {:016x}", rejected.key));
    }
    let key = key_buf.as_str();
    // SAFETY: the request's log; nginx appends client and request.
    unsafe {
        if quota == checked {
            log(
                lcf.log_level(),
                (*r.connection).log,
                format_args!(
                    "sluice: limiting requests{how} by quota \"{quota}\"{key} (limit {limit}, \
                     weight {weight}){never}{why}"
                ),
            );
        } else {
            log(
                lcf.log_level(),
                (*r.connection).log,
                format_args!(
                    "sluice: limiting requests{how} by quota \"{quota}\", an ancestor of \
                     \"{checked}\" (limit {limit}, weight {weight}){never}{why}"
                ),
            );
        }
    }
}

/// A quota's limit in a log line: in its own terms (`5 /s`, `10 / min`)
/// when its slot could be read, else the bare number (the quota changed
/// meanwhile).
struct Limit(Option<Terms>, f64);

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(terms) => terms.fmt(f),
            None => self.1.fmt(f),
        }
    }
}

/// Shows the value if there is one, nothing otherwise.
struct DisplayOr<T>(Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for DisplayOr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(value) => value.fmt(f),
            None => Ok(()),
        }
    }
}

/// Adds `RateLimit-Policy` and `RateLimit` for the tightest quota (named
/// as `sluice_headers ... names=` says), and `Retry-After` when `retry`
/// is given.
fn add_rate_limit_headers(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    table: &Table,
    items: &[CheckItem],
    result: &ManyOutcome,
    reset: Reset,
) {
    let mut name_buf = [0u8; 256];
    // SAFETY: `r` is the live request; Request is a transparent wrapper.
    let request = unsafe { Request::from_ngx_http_request(r) };
    if let Reset::RetryAfter(secs) = reset {
        let mut value = HeaderValue::default();
        if std::fmt::Write::write_fmt(&mut value, format_args!("{secs}")).is_ok() {
            request.add_header_out("Retry-After", value.as_str());
        }
    }
    let Some(h): Option<Headroom> = result.headroom else {
        return;
    };
    let name = match table.name_into(h.slot, &mut name_buf) {
        Some(n) => n,
        None => items.get(h.item).map_or(&[][..], |i| i.name),
    };
    let Ok(name) = std::str::from_utf8(name) else {
        return;
    };
    let mut shown = HeaderValue::default();
    let name = lcf.header_names.show(name, table.key_secret(), &mut shown);
    if let Some((policy, state)) = rate_limit_fields(name, &h.room, reset) {
        request.add_header_out("RateLimit-Policy", policy.as_str());
        request.add_header_out("RateLimit", state.as_str());
    }
}

/// The `$sluice_status` variable's get handler.
pub(crate) unsafe extern "C" fn status_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    // SAFETY: nginx passes the live request and a value to fill.
    unsafe {
        let status = find_state(r).map_or(RequestStatus::Unchecked, |s| s.status);
        set_variable(&mut *v, Some(status.as_str()));
    }
    NGX_OK as ngx_int_t
}
