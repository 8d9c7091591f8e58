//! The exports of in-flight quotas: `sluice_acquire` takes a slot and
//! hands back a [`SluiceSlot`]; `sluice_release` gives it back and frees
//! it (see docs/DESIGN.md, "In-flight quotas").

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use super::boundary::{boundary, c_name, name_and_key};
use super::codes::SLUICE_PASS;
use super::limiter;
use crate::table::{CheckItem, HeldSlot, Table};

/// A slot of an in-flight quota taken by `sluice_acquire`: opaque, owned
/// by the caller until `sluice_release` gives it back and frees it.
pub struct SluiceSlot {
    /// The table it was taken in (kept alive past a `sluice_shutdown`).
    table: Arc<Table>,
    /// The quota's name and the key, copied: the caller's buffers may be
    /// gone by the release.
    name: Box<[u8]>,
    key: Option<Box<[u8]>>,
    held: HeldSlot,
}

/// Takes a slot of the in-flight quota `name` (`name_len` bytes): a
/// request that will run for a while holds it until
/// `sluice_release(*slot)`. At most `limit` slots are held at once across
/// the fleet (`{"limit": N, "in_flight": true}`); a slot held by a
/// process that stops syncing is dropped by the roots after their lease.
///
/// Returns `SLUICE_PASS` (`*slot` is the slot to release),
/// `SLUICE_REJECT` (every slot is taken: `*slot` is NULL),
/// `SLUICE_UNKNOWN` (no such quota: pass, `*slot` NULL), `SLUICE_ERROR`
/// (not initialised, a NULL `slot`, a `name_len` above
/// `SLUICE_MAX_NAME_LEN`, or a quota that is not in-flight: use
/// `sluice_check` for those; `*slot` NULL when `slot` is not).
///
/// # Safety
/// `name` must be NULL or point to at least `name_len` readable bytes;
/// `slot` must be NULL or point to a writable `SluiceSlot *`.
#[no_mangle]
pub unsafe extern "C" fn sluice_acquire(
    name: *const c_char,
    name_len: usize,
    slot: *mut *mut SluiceSlot,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        acquire_into(slot, || {
            let name = c_name(name, name_len)?;
            Ok((name, None))
        })
    }
}

/// [`sluice_acquire`] for the key `key` (`key_len` bytes) of a per-key
/// in-flight quota: each key has `limit` slots of its own.
/// `SLUICE_NO_KEY` (pass, `*slot` NULL) for an empty key;
/// `SLUICE_KEY_OVERFLOW` when the key found no entry and the slot was
/// taken as the overflow mode says (`*slot` set: release it as any other).
///
/// # Safety
/// As [`sluice_acquire`]; `key` must be NULL or point to at least
/// `key_len` readable bytes (NULL with `key_len` 0 is an empty key).
#[no_mangle]
pub unsafe extern "C" fn sluice_acquire_key(
    name: *const c_char,
    name_len: usize,
    key: *const c_char,
    key_len: usize,
    slot: *mut *mut SluiceSlot,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        acquire_into(slot, || {
            let (name, key) = name_and_key(name, name_len, key, key_len)?;
            Ok((name, Some(key)))
        })
    }
}

/// Gives back and frees a slot `sluice_acquire` took, when the request it
/// stood for ends (done, failed or abandoned alike). NULL is a no-op
/// (`SLUICE_PASS`), so a caller may release whatever `sluice_acquire`
/// wrote. Returns `SLUICE_PASS`, or `SLUICE_ERROR` only when a panic was
/// caught (the slot is then freed or leaked, never given back twice).
///
/// # Safety
/// `slot` must be NULL or a slot from `sluice_acquire`/`sluice_acquire_key`
/// not released yet; it is invalid afterwards (release it exactly once).
#[no_mangle]
pub unsafe extern "C" fn sluice_release(slot: *mut SluiceSlot) -> c_int {
    boundary(|| {
        if slot.is_null() {
            return Ok(SLUICE_PASS);
        }
        // SAFETY: a slot from `sluice_acquire` (a Box) not released yet,
        // per the contract: taken back here once.
        let slot = unsafe { Box::from_raw(slot) };
        let item = CheckItem {
            name: &slot.name,
            key: slot.key.as_deref(),
            weight: 1,
            max_wait: None,
        };
        slot.table
            .gate()
            .release(&item, slot.held, crate::clock::now());
        Ok(SLUICE_PASS)
    })
}

/// Runs an acquire whose arguments `read` returns, writing the slot (or
/// NULL) through `out`; a NULL `out` is refused before anything counts.
///
/// # Safety
/// `out` must be NULL or point to a writable `SluiceSlot *`; `read` must
/// read only what its caller's contract allows.
unsafe fn acquire_into<'a>(
    out: *mut *mut SluiceSlot,
    read: impl FnOnce() -> Result<(&'a [u8], Option<&'a [u8]>), String>,
) -> c_int {
    if out.is_null() {
        return boundary(|| Err("slot is NULL".into()));
    }
    // SAFETY: non-null and writable per the contract.
    unsafe { out.write(std::ptr::null_mut()) };
    boundary(|| {
        let (name, key) = read()?;
        let (code, slot) = acquire(name, key)?;
        if let Some(slot) = slot {
            // SAFETY: as above.
            unsafe { out.write(Box::into_raw(Box::new(slot))) };
        }
        Ok(code)
    })
}

/// Takes a slot of `name` (and `key`): the code, and the slot on a pass.
fn acquire(name: &[u8], key: Option<&[u8]>) -> Result<(c_int, Option<SluiceSlot>), String> {
    let table = limiter::table()?;
    if table.gate().lookup(name).is_some() && !table.gate().is_in_flight(name) {
        return Err(format!(
            "quota {:?} is not an in-flight quota: check it with sluice_check",
            String::from_utf8_lossy(name)
        ));
    }
    let item = CheckItem {
        name,
        key,
        weight: 1,
        max_wait: None,
    };
    let (result, held) =
        table
            .gate()
            .acquire(&item, crate::clock::now(), false, crate::host::thread_unit);
    let code = limiter::slot_code(result.outcome, result.overflow)?;
    let slot = held.map(|held| SluiceSlot {
        table: Arc::clone(&table),
        name: name.into(),
        key: key.map(Into::into),
        held,
    });
    debug_assert!(slot.is_some() || code != SLUICE_PASS);
    Ok((code, slot))
}
