//! The main request's state, kept in its pool: its `$sluice_status`, the
//! checks it was counted on, and its `wait=` hold (an nginx timer per
//! held request).
//!
//! A request is charged once: its outcome is stored on the main request
//! in a pool cleanup entry (the module context would be wiped by an
//! internal redirect, which runs the access phase again), and a request
//! that already has an outcome is not checked again. nginx skips the
//! access phase for subrequests.
//!
//! A request over a quota checked with `wait=` whose turn comes within
//! that time is counted at once and held, as `limit_req` holds one
//! without `nodelay`: [`hold`] arms an nginx timer on the connection's
//! write event and the access handler returns `NGX_AGAIN`; when the timer
//! fires, the phases resume at the access handler, which finds the
//! outcome (`DELAYED`) and lets the request go on. A client that closes
//! meanwhile ends the request (nginx watches the read side with
//! `ngx_http_test_reading`); the state's pool cleanup then removes the
//! timer if it is still armed, counts the hold as abandoned and gives its
//! weight back to every quota it was counted on ([`Table::give_back`]:
//! what was not sent to the roots yet is uncounted, the rest goes to them
//! as a return with the next sync, or is folded in while this host counts
//! locally), as a rejected request is not counted. `sluice_wait_max` caps
//! the requests held at once under it (every worker together, a slot of
//! the zone's counts each): one over the cap is rejected at once, its
//! weight given back.
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

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

use ngx::ffi::{
    ngx_add_timer, ngx_connection_t, ngx_current_msec, ngx_del_timer, ngx_delete_posted_event,
    ngx_handle_read_event, ngx_handle_write_event, ngx_http_block_reading,
    ngx_http_core_run_phases, ngx_http_finalize_request, ngx_http_request_t, ngx_http_test_reading,
    ngx_http_variable_value_t, ngx_int_t, ngx_msec_t, ngx_pool_cleanup_add, ngx_post_event,
    ngx_posted_events, NGX_AGAIN, NGX_DECLINED, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_OK,
};

use super::args::{wait_timer_ms, RequestStatus};
use super::held_item::HeldItem;
use super::request_counters::RequestCounters;
use super::util::{cleanup_data, set_variable};
use crate::core::Nanos;
use crate::table::{CheckItem, Table, MAX_CHECKS};

/// The outcome of the main request, kept in its pool.
#[repr(C)]
pub(super) struct RequestState {
    /// What `$sluice_status` says.
    pub(super) status: RequestStatus,
    /// When its checks were counted (passed or held): the table, when,
    /// and the checks (null, 0 and none otherwise): to give a held
    /// request's weight back if the client leaves first, and what a
    /// `sluice_charge ... settle` settles ([`admitted`]).
    pub(super) table: *const Table,
    pub(super) charged_at: u64,
    pub(super) held_items: [HeldItem; MAX_CHECKS],
    pub(super) held_count: usize,
    /// While held under `sluice_wait_max`: its slot of the zone's counts.
    pub(super) cap_slot: Option<usize>,
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
pub(super) fn let_go_coalesced() {
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
    /// Records the checks counted for this request at `charged_at` (it
    /// passed or is held): what a hold whose client leaves gives back,
    /// and what a settle settles.
    pub(super) fn record_counted(&mut self, table: &Table, charged_at: Nanos, items: &[CheckItem]) {
        self.table = table;
        self.charged_at = charged_at;
        self.held_count = items.len();
        for (held, item) in self.held_items.iter_mut().zip(items) {
            *held = HeldItem::of(item);
        }
    }

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
pub(super) unsafe fn state<'a>(r: *const ngx_http_request_t) -> Option<&'a mut RequestState> {
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

/// Whether the main request's `sluice` checks refused it (rejected,
/// denied by an override, or without the key `no_key=reject` needs; not
/// in dry run): see [`RequestStatus::refused`].
///
/// # Safety
/// `r` must be a live request.
pub(super) unsafe fn rejected(r: *const ngx_http_request_t) -> bool {
    // SAFETY: `r` is live per the contract.
    unsafe { find_state(r) }.is_some_and(|s| s.status.refused())
}

/// Holds a request `wait_ns` nanoseconds with an nginx timer on its
/// connection's write event, as `limit_req` delays one: the phases stop
/// here (`NGX_AGAIN`) and [`delay_handler`] resumes them. With a
/// coalescing window (`coalesce_ms`, 0 for none) the hold joins the
/// worker's coalescing list, and a wait no longer than the window is not
/// held at all.
pub(super) fn hold(
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
