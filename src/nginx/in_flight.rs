//! In-flight quotas in nginx: a slot taken in the access phase, given
//! back in the log phase (see docs/DESIGN.md, "In-flight quotas").
//!
//! `sluice <name>` on an in-flight quota is a check of weight 1 (any
//! `weight=` or `wait=` is ignored for it: a request holds one slot, and
//! waiting for a slot is not offered). When the request passes, the slots
//! it took are written to a pool cleanup entry of the main request (its
//! own, beside the handler's state), and the log-phase handler gives
//! them back when the request ends, whichever way it ends: a response
//! sent, a client that closed, an upstream error, a request finalized
//! after internal redirects (the access phase charged it once; the log
//! phase runs once, for the main request). Should a request be freed
//! without its log phase, the cleanup entry gives them back then.
//!
//! A request held by `wait=` for another check of its location that is
//! abandoned gives that check's weight back with the hold; its slots are
//! not part of the hold's weight ([`exclude_from_hold`]) and go back here.
//!
//! Each slot is also recorded in the zone with this worker's identity
//! ([`set_owner`], at `init_process`): a worker killed with its requests
//! never runs their log phase or cleanup, and the sync thread gives back
//! the slots recorded for a dead process instead (`table/region/holds.rs`).
//!
//! Installed by [`install_log_handler`], one line in `module.rs`'s
//! postconfiguration beside the access handler.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use ngx::ffi::{
    ngx_conf_t, ngx_http_phases_NGX_HTTP_LOG_PHASE, ngx_http_request_t, ngx_int_t,
    ngx_pool_cleanup_add, NGX_OK,
};

use super::held_item::HeldItem;
use super::util::{add_phase_handler, runtime_boundary};
use crate::core::Nanos;
use crate::table::{CheckItem, HeldSlot, Table, MAX_CHECKS};

/// This process's identity ([`crate::host::process_identity`]), which the
/// slots its requests take are recorded with; 0 until `init_process` (the
/// master never serves requests).
static OWNER: AtomicU64 = AtomicU64::new(0);

/// Names this process as the holder of the slots its requests take from
/// now on: called at `init_process`, after the fork (a worker must not
/// pass for its master, nor for a sibling).
pub(super) fn set_owner() {
    OWNER.store(crate::host::process_identity(), Ordering::Relaxed);
}

/// The checks of a request that take in-flight slots, one bit per item.
pub(super) type SlotMask = u32;

/// Makes the in-flight items of a request's checks what they are: a
/// weight of 1 and no wait. Returns which items they are.
pub(super) fn prepare(table: &Table, items: &mut [CheckItem]) -> SlotMask {
    let mut mask = 0;
    for (i, item) in items.iter_mut().enumerate() {
        if table.gate().is_in_flight(item.name) {
            item.weight = 1;
            item.max_wait = None;
            mask |= 1 << i;
        }
    }
    mask
}

/// Takes the in-flight items out of what an abandoned `wait=` hold gives
/// back: their slots go back in the log phase.
pub(super) fn exclude_from_hold(held: &mut [HeldItem], mask: SlotMask) {
    for (i, item) in held.iter_mut().enumerate() {
        if mask & (1 << i) != 0 {
            item.weight = 0;
        }
    }
}

/// The slots a main request holds, in its pool's cleanup list.
#[repr(C)]
struct Slots {
    /// The cycle's table (it outlives the cycle's requests).
    table: *const Table,
    /// When they were taken, and whether a key overflowed.
    held: HeldSlot,
    /// The checks that took them (names and keys in the request's pool).
    items: [HeldItem; MAX_CHECKS],
    /// Each slot's hold record in the zone (0: not recorded).
    records: [u32; MAX_CHECKS],
    /// The process the records name.
    owner: u64,
    count: usize,
}

impl Slots {
    /// Gives every slot back, once.
    fn release(&mut self, now: Nanos) {
        let count = std::mem::take(&mut self.count).min(MAX_CHECKS);
        // SAFETY: set from the cycle's table, which outlives its requests.
        let Some(table) = (unsafe { self.table.as_ref() }) else {
            return;
        };
        for (held, &record) in self.items[..count].iter().zip(&self.records) {
            // SAFETY: called from the log phase or the pool's cleanup,
            // before the pool (where names and keys live) is freed.
            let item = unsafe { held.item() };
            table
                .gate()
                .release_recorded(&item, self.held, record, self.owner, now);
        }
    }
}

/// Records the slots a passed request took (the items of `mask`), to be
/// given back when it ends. Returns false when the pool had no memory for
/// it: the slots are then given back at once (the request goes on
/// uncounted rather than holding them forever).
pub(super) fn hold(
    r: &mut ngx_http_request_t,
    table: &Table,
    items: &[CheckItem],
    mask: SlotMask,
    held: HeldSlot,
) -> bool {
    if mask == 0 {
        return true;
    }
    let owner = OWNER.load(Ordering::Relaxed);
    let mut slots = Slots {
        table,
        held,
        items: [HeldItem::NONE; MAX_CHECKS],
        records: [0; MAX_CHECKS],
        owner,
        count: 0,
    };
    for (i, item) in items.iter().enumerate().take(MAX_CHECKS) {
        if mask & (1 << i) != 0 {
            slots.items[slots.count] = HeldItem::of(item);
            slots.records[slots.count] = table.gate().record_slot(item, held, owner);
            slots.count += 1;
        }
    }
    // SAFETY: `r` is live; its main request's pool outlives this entry's
    // use (the cleanup runs before the pool's memory is freed).
    let c = unsafe { ngx_pool_cleanup_add((*r.main).pool, std::mem::size_of::<Slots>()) };
    if c.is_null() {
        slots.release(held.at);
        return false;
    }
    // SAFETY: nginx sized the entry's data for `Slots`.
    unsafe {
        (*c).data.cast::<Slots>().write(slots);
        (*c).handler = Some(slots_cleanup);
    }
    true
}

/// The pool cleanup of [`Slots`]: gives back what the log phase did not.
///
/// # Safety
///
/// nginx calls it once, when the request's pool is destroyed, with `data`
/// the slots this module registered with the pool cleanup.
unsafe extern "C" fn slots_cleanup(data: *mut c_void) {
    // SAFETY: nginx passes the entry's data, written by `hold`.
    if let Some(slots) = unsafe { data.cast::<Slots>().as_mut() } {
        slots.release(crate::clock::now());
    }
}

/// The main request's slots, if it holds any.
///
/// # Safety
/// `r` must be a live request.
unsafe fn find_slots<'a>(r: *const ngx_http_request_t) -> Option<&'a mut Slots> {
    // SAFETY: a live request has a live main request and pool; the
    // cleanup list holds entries nginx allocated from that pool.
    unsafe {
        let mut c = (*(*(*r).main).pool).cleanup;
        while !c.is_null() {
            let ours = (*c)
                .handler
                .is_some_and(|h| std::ptr::fn_addr_eq(h, slots_cleanup as unsafe extern "C" fn(_)));
            if ours {
                return (*c).data.cast::<Slots>().as_mut();
            }
            c = (*c).next;
        }
        None
    }
}

/// The log-phase handler: the request ended, its slots go back.
///
/// # Safety
///
/// nginx calls it in the log phase with a live request.
unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx passes the request being logged, valid for the call.
    let log_to = unsafe { (*(*r).connection).log };
    runtime_boundary(
        log_to,
        "the in-flight log handler",
        NGX_OK as ngx_int_t,
        || {
            // SAFETY: as above.
            if let Some(slots) = unsafe { find_slots(r) } {
                slots.release(crate::clock::now());
            }
            NGX_OK as ngx_int_t
        },
    )
}

/// Adds the log-phase handler that gives slots back.
pub(super) fn install_log_handler(cf: *mut ngx_conf_t) -> Result<(), String> {
    add_phase_handler(cf, ngx_http_phases_NGX_HTTP_LOG_PHASE, log_handler)
}
