//! The shared memory zone that holds the table, one per nginx.
//!
//! The zone is named `sluice`. nginx maps it into the master and every
//! worker; the table region is carved out of the zone's slab pool once and
//! found again through the pool's `data` pointer, so:
//!
//! - on `nginx -s reload` with the same size, nginx hands the zone over
//!   and the table (quotas and counters) is attached as it is;
//! - when the size changed, nginx makes a new zone; the table in the old
//!   one (still mapped while the new cycle starts) is adopted: quotas,
//!   levels and unsent weight are copied, and the log says so;
//! - each cycle then applies its `sluice_quotas` file and sets the
//!   estimator for its sync interval.
//!
//! All of this runs in the master (or a single process), before workers
//! start; it never starts threads.

use std::ffi::c_void;
use std::sync::Arc;

use ngx::ffi::{
    ngx_conf_t, ngx_cycle, ngx_int_t, ngx_list_part_t, ngx_log_t, ngx_pagesize,
    ngx_shared_memory_add, ngx_shm_zone_t, ngx_slab_alloc, ngx_slab_pool_t, ngx_str_t, ngx_uint_t,
    NGX_ERROR, NGX_LOG_EMERG, NGX_LOG_NOTICE, NGX_LOG_WARN, NGX_OK,
};
use ngx::http::HttpModule;

use super::conf::MainConf;
use super::request_counters::RequestCounters;
use super::unknown_names::UnknownNames;
use super::util::{bytes, log, runtime_boundary};
use super::zone_size::{AVG_NAME_BYTES, DEFAULT_ZONE_SIZE};
use super::Module;
use crate::core::Extrapolation;
use crate::table::file::{load_set, FileRole};
use crate::table::geometry::Geometry;
use crate::table::Table;

/// The zone's name.
const ZONE_NAME: &str = "sluice";

/// Where the table region lives, kept in the zone itself (the slab pool's
/// `data` points here) so a later cycle finds it; and the request counts
/// only nginx keeps, and when each unknown name was last logged.
#[repr(C)]
struct ZoneHead {
    base: *mut u8,
    len: usize,
    counters: RequestCounters,
    unknown: UnknownNames,
}

/// This machine's physical memory, if the system says.
pub(crate) fn physical_memory() -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let bytes = usize::try_from(pages)
        .ok()?
        .checked_mul(usize::try_from(page).ok()?)?;
    (bytes > 0).then_some(bytes)
}

/// Asks nginx for the zone; called once the `http` block is parsed.
pub(crate) fn add(cf: *mut ngx_conf_t, mcf: &mut MainConf) -> Result<(), String> {
    // Keys get their own share on top of the quotas'.
    let size = mcf.zone_size.unwrap_or(DEFAULT_ZONE_SIZE) + mcf.keys_size() + mcf.overrides_size();
    let mut name = ngx_str_t {
        len: ZONE_NAME.len(),
        data: ZONE_NAME.as_ptr().cast_mut(),
    };
    let tag = std::ptr::from_ref(Module::module())
        .cast_mut()
        .cast::<c_void>();
    // SAFETY: `cf` is the live configuration; nginx copies nothing from
    // `name` but keeps pointing at it, and it is static.
    let zone = unsafe { ngx_shared_memory_add(cf, &mut name, size, tag) };
    if zone.is_null() {
        return Err("sluice: cannot add the shared memory zone".into());
    }
    // SAFETY: nginx returned a live zone of this cycle.
    let zone = unsafe { &mut *zone };
    if !zone.data.is_null() {
        return Err("sluice: only one \"http\" block may use sluice".into());
    }
    zone.init = Some(init_zone);
    zone.data = std::ptr::from_mut(mcf).cast();
    mcf.zone = zone;
    Ok(())
}

/// nginx's zone init callback: `data` is the previous cycle's zone data
/// when nginx reuses the zone as it is (same size), null for a new zone.
///
/// # Safety
///
/// nginx calls it once per cycle with the zone this module added and, on
/// a reload, the previous cycle's data for it (NULL the first time).
unsafe extern "C" fn init_zone(zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes a live zone whose `shm.log` is the cycle's log.
    let (zone, log_to) = unsafe { (&mut *zone, (*zone).shm.log) };
    runtime_boundary(log_to, "the zone setup", NGX_ERROR as ngx_int_t, || {
        match init(zone, !data.is_null(), log_to) {
            Ok(()) => NGX_OK as ngx_int_t,
            Err(message) => {
                // SAFETY: the cycle's log.
                unsafe {
                    log(
                        NGX_LOG_EMERG as ngx_uint_t,
                        log_to,
                        format_args!("{message}"),
                    )
                };
                NGX_ERROR as ngx_int_t
            }
        }
    })
}

fn init(zone: &mut ngx_shm_zone_t, reused: bool, log_to: *mut ngx_log_t) -> Result<(), String> {
    // SAFETY: `data` is the MainConf `add` stored, alive for this cycle.
    let mcf = unsafe { &mut *zone.data.cast::<MainConf>() };
    let pool = zone.shm.addr.cast::<ngx_slab_pool_t>();
    // SAFETY: nginx initialised the zone's slab pool at its start; `data`
    // is null in a new zone and our ZoneHead in a reused one.
    let head = unsafe { (*pool).data.cast::<ZoneHead>() };
    let table = if reused && !head.is_null() {
        // SAFETY: the head and region were made by `create` in this zone.
        unsafe { Table::from_raw((*head).base, (*head).len, AVG_NAME_BYTES, 0, 0, false) }
            .map_err(|e| format!("sluice: zone \"{ZONE_NAME}\": {e}"))?
    } else {
        let table = create(pool, zone.shm.size, mcf.keys_size(), mcf.overrides_size())?;
        // SAFETY: the cycle's log.
        unsafe {
            log(
                NGX_LOG_NOTICE as ngx_uint_t,
                log_to,
                format_args!(
                    "sluice: zone \"{ZONE_NAME}\" of {} KiB holds up to {} quotas and {} keys",
                    zone.shm.size >> 10,
                    table.capacity(),
                    table.key_capacity()
                ),
            )
        };
        if let Some(old) = previous_table(zone) {
            let report = table.books().adopt(old.books(), crate::clock::now());
            let level = if report.refused.is_empty() {
                NGX_LOG_NOTICE
            } else {
                NGX_LOG_WARN
            };
            // SAFETY: the cycle's log.
            unsafe {
                log(
                    level as ngx_uint_t,
                    log_to,
                    format_args!(
                        "sluice: zone \"{ZONE_NAME}\" changed size: {} quotas and their \
                         counters copied from the old zone, {} did not fit",
                        report.inserted,
                        report.refused.len()
                    ),
                )
            };
        }
        table
    };
    table.set_estimator(mcf.sync_config().estimator(Extrapolation::Adaptive));
    table.set_key_secret(mcf.key_secret);
    table.set_key_overflow(mcf.key_overflow.unwrap_or_default());
    if let Some(file) = &mcf.quotas {
        let role = if mcf.roots.is_empty() {
            FileRole::Authoritative
        } else {
            FileRole::Seed
        };
        let report = load_set(&table, &file.set, role);
        if let Some(first) = report.refused.first() {
            // Past configuration time: the message names the directive
            // to change, as nginx names a line ("in file:line").
            let fix = match &mcf.zone_at {
                Some(at) => format!("make \"sluice_zone\" larger in {at}"),
                None => format!(
                    "set \"sluice_zone\" above the default {}m for \"sluice_quotas\" in {}",
                    DEFAULT_ZONE_SIZE >> 20,
                    file.at
                ),
            };
            return Err(format!(
                "sluice: {} quota(s) of \"{}\" do not fit in zone \"{ZONE_NAME}\" \
                 (first: {first}); {fix}",
                report.refused.len(),
                file.path
            ));
        }
    }
    mcf.table = Some(Arc::new(table));
    // SAFETY: `create` or an earlier cycle stored the head in the pool's
    // `data`; it lives as long as the zone.
    let head = unsafe { (*pool).data.cast::<ZoneHead>() };
    // SAFETY: as above.
    (mcf.counters, mcf.unknown_names) = unsafe {
        (
            std::ptr::addr_of!((*head).counters),
            std::ptr::addr_of!((*head).unknown),
        )
    };
    Ok(())
}

/// Carves the largest table that fits out of a new zone's slab pool.
fn create(
    pool: *mut ngx_slab_pool_t,
    zone_size: usize,
    key_bytes: usize,
    tier_bytes: usize,
) -> Result<Table, String> {
    // SAFETY: `pool` is the zone's slab pool, only touched by this process
    // while nginx starts the cycle.
    unsafe {
        (*pool).set_log_nomem(0);
        let head = ngx_slab_alloc(pool, std::mem::size_of::<ZoneHead>()).cast::<ZoneHead>();
        if head.is_null() {
            return Err(format!("sluice: zone \"{ZONE_NAME}\" is too small"));
        }
        let page = ngx_pagesize;
        let mut avail = (*pool).pfree.saturating_sub(1) * page;
        // A large allocation takes whole pages; retry smaller if the free
        // pages are not contiguous enough. Keys keep their share of the
        // zone (the pool's own overhead shrinks both parts alike).
        for _ in 0..16 {
            let share =
                |bytes: usize| (avail as u128 * bytes as u128 / zone_size.max(1) as u128) as usize;
            let (key_bytes, tier_bytes) = (share(key_bytes), share(tier_bytes));
            let Some(geometry) =
                Geometry::fitting_with(avail, AVG_NAME_BYTES, key_bytes, tier_bytes)
            else {
                break;
            };
            let len = geometry.region_len();
            let base = ngx_slab_alloc(pool, len).cast::<u8>();
            if !base.is_null() {
                // Fresh shared memory is zeroed: no need to write over it.
                let table =
                    Table::from_raw(base, len, AVG_NAME_BYTES, key_bytes, tier_bytes, false)
                        .map_err(|e| format!("sluice: zone \"{ZONE_NAME}\": {e}"))?;
                (*head).base = base;
                (*head).len = len;
                // The slab allocator does not zero.
                std::ptr::addr_of_mut!((*head).counters).write(RequestCounters::default());
                std::ptr::addr_of_mut!((*head).unknown).write(UnknownNames::default());
                (*pool).data = head.cast();
                return Ok(table);
            }
            avail -= avail / 16;
        }
        Err(format!(
            "sluice: zone \"{ZONE_NAME}\" of {zone_size} bytes is too small for a quota table"
        ))
    }
}

/// The table of the running cycle's zone, when the new cycle's zone is a
/// different one (the size changed).
fn previous_table(zone: &ngx_shm_zone_t) -> Option<Table> {
    // SAFETY: while a new cycle is initialised, `ngx_cycle` is still the
    // running (old) cycle, whose zones stay mapped until the new cycle is
    // up. Its list of zones is nginx's ngx_list_t of ngx_shm_zone_t.
    unsafe {
        let old = ngx_cycle;
        if old.is_null() {
            return None;
        }
        let mut part: *const ngx_list_part_t = &(*old).shared_memory.part;
        while !part.is_null() {
            let zones =
                std::slice::from_raw_parts((*part).elts.cast::<ngx_shm_zone_t>(), (*part).nelts);
            for z in zones {
                if z.tag == zone.tag
                    && bytes(&z.shm.name) == ZONE_NAME.as_bytes()
                    && z.shm.addr != zone.shm.addr
                    && !z.shm.addr.is_null()
                {
                    let head = (*z.shm.addr.cast::<ngx_slab_pool_t>())
                        .data
                        .cast::<ZoneHead>();
                    if head.is_null() {
                        return None;
                    }
                    return Table::from_raw((*head).base, (*head).len, AVG_NAME_BYTES, 0, 0, false)
                        .ok();
                }
            }
            part = (*part).next;
        }
        None
    }
}
