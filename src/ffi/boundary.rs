//! Where C meets Rust: every export runs inside a panic boundary that
//! turns an error or a panic into `SLUICE_ERROR` plus a message for
//! `sluice_last_error`, and pointer arguments are read here, each NULL
//! checked and named in the message.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use super::codes::{SLUICE_ERROR, SLUICE_MAX_KEY_LEN, SLUICE_MAX_NAME_LEN};

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// What a panic caught at the boundary leaves as the error message.
const PANIC_MESSAGE: &str = "internal error (panic) in sluice; the call was abandoned";

/// Sets this thread's last error (a NUL inside becomes a space).
pub(super) fn set_error(message: impl Into<String>) {
    let text = CString::new(message.into().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// This thread's last error, valid until its next call that sets one.
pub(super) fn last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr())).unwrap_or(c"internal error".as_ptr())
}

/// Runs `f` as an export body: errors become `SLUICE_ERROR` plus a message,
/// panics are caught.
// Inlined into its export (each has its own copy anyway, the function
// being generic): called, it spilled and copied the export's arguments
// for the closure (20 of a hot keyed check's instructions, callgrind).
#[inline(always)]
pub(super) fn boundary(f: impl FnOnce() -> Result<c_int, String>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(message)) => {
            set_error(message);
            SLUICE_ERROR
        }
        Err(_) => {
            set_error(PANIC_MESSAGE);
            SLUICE_ERROR
        }
    }
}

/// [`boundary`] for an export that returns a string the caller owns:
/// NULL on an error or a panic.
pub(super) fn boundary_string(f: impl FnOnce() -> Result<CString, String>) -> *mut c_char {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(text)) => text.into_raw(),
        Ok(Err(message)) => {
            set_error(message);
            ptr::null_mut()
        }
        Err(_) => {
            set_error(PANIC_MESSAGE);
            ptr::null_mut()
        }
    }
}

/// Reads a C string argument; NULL is an error naming the argument.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
pub(super) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a CStr, String> {
    if p.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    Ok(unsafe { CStr::from_ptr(p) })
}

/// `len` bytes at `p`: NULL, or a length over `max`, is an error naming
/// the argument, given before anything at `p` is read.
///
/// # Safety
/// `p` must be NULL or point to at least `len` readable bytes when `len`
/// is at most `max`.
///
/// Inlined into every export, with its messages made out of line: a
/// check's arguments cost a few compares, not a call returning a
/// `Result` through memory.
#[inline(always)]
unsafe fn c_bytes<'a>(
    p: *const c_char,
    len: usize,
    max: usize,
    what: &str,
) -> Result<&'a [u8], String> {
    if p.is_null() || len > max {
        return Err(bad_bytes(p, len, max, what));
    }
    // SAFETY: non-null, and the caller guarantees `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Why [`c_bytes`] refused its argument.
#[cold]
#[inline(never)]
fn bad_bytes(p: *const c_char, len: usize, max: usize, what: &str) -> String {
    if p.is_null() {
        format!("{what} is NULL")
    } else {
        format!("{what} is {len} bytes long, at most {max} allowed")
    }
}

/// A quota name given as `len` bytes at `p` (no NUL): at most
/// [`SLUICE_MAX_NAME_LEN`] bytes, the longest name a quota can have; a longer
/// length is refused before the name is read.
///
/// # Safety
/// `p` must be NULL or point to at least `len` readable bytes when `len`
/// is at most [`SLUICE_MAX_NAME_LEN`].
#[inline]
pub(super) unsafe fn c_name<'a>(p: *const c_char, len: usize) -> Result<&'a [u8], String> {
    // SAFETY: per the contract.
    unsafe { c_bytes(p, len, SLUICE_MAX_NAME_LEN, "name") }
}

/// A quota name given NUL-terminated: at most [`SLUICE_MAX_NAME_LEN`] bytes are
/// read looking for the NUL, and a name without one by then is refused
/// (no quota has a longer name).
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
pub(super) unsafe fn c_name_nul<'a>(p: *const c_char) -> Result<&'a [u8], String> {
    if p.is_null() {
        return Err("name is NULL".into());
    }
    // SAFETY: a NUL-terminated string is readable up to its NUL, and
    // strnlen reads no further than the NUL or the bound.
    let len = unsafe { libc::strnlen(p, SLUICE_MAX_NAME_LEN + 1) };
    if len > SLUICE_MAX_NAME_LEN {
        return Err(format!(
            "name is longer than {SLUICE_MAX_NAME_LEN} bytes (no NUL within them)"
        ));
    }
    // SAFETY: the `len` bytes before the NUL were just read.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// The name and key arguments of a keyed call (a NULL key with length 0
/// is the empty key); lengths over [`SLUICE_MAX_NAME_LEN`] and [`SLUICE_MAX_KEY_LEN`]
/// are refused before anything is read.
///
/// # Safety
/// `name` must be NULL or point to at least `name_len` readable bytes;
/// `key` must be NULL or point to at least `key_len` readable bytes.
#[inline]
pub(super) unsafe fn name_and_key<'a>(
    name: *const c_char,
    name_len: usize,
    key: *const c_char,
    key_len: usize,
) -> Result<(&'a [u8], &'a [u8]), String> {
    // SAFETY: per the contract.
    let name = unsafe { c_name(name, name_len) }?;
    let key = if key.is_null() && key_len == 0 {
        &[][..]
    } else {
        // The one rule on a key's length (the CLI follows it too).
        crate::core::key::check_key_len(key_len)?;
        // SAFETY: per the contract.
        unsafe { c_bytes(key, key_len, SLUICE_MAX_KEY_LEN, "key") }?
    };
    Ok((name, key))
}

/// Runs a call that answers a code and a number, writing the number
/// through `out`. A NULL `out` is refused (naming it as `what`) before
/// the call runs, so nothing is counted for a caller who cannot learn
/// the number.
///
/// # Safety
/// `out` must be NULL or point to a writable `uint64_t`.
pub(super) unsafe fn with_out(
    out: *mut u64,
    what: &str,
    call: impl FnOnce() -> Result<(c_int, u64), String>,
) -> Result<c_int, String> {
    if out.is_null() {
        return Err(format!("{what} is NULL"));
    }
    let (code, value) = call()?;
    // SAFETY: non-null and writable per the contract.
    unsafe { out.write(value) };
    Ok(code)
}
