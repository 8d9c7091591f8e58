//! The result codes every export returns (`SLUICE_PASS`...) and the
//! longest arguments they take, in the header beside the functions.

use std::ffi::c_int;

/// The request may pass: every quota in its chain had room; the weight was
/// counted.
pub const SLUICE_PASS: c_int = 0;
/// The request is over a quota (its own or an ancestor's), or, with
/// `no_key` `"reject"` in `sluice_init`'s JSON, a per-key quota was checked
/// without a key; nothing was counted.
pub const SLUICE_REJECT: c_int = 1;
/// No quota has this name: the request passes and is not counted.
pub const SLUICE_UNKNOWN: c_int = 2;
/// The quota is per-key and the check gave no key (or an empty one): the
/// request passes and is not counted (the default `no_key` `"pass"`; with
/// `"reject"` a check answers `SLUICE_REJECT` instead).
pub const SLUICE_NO_KEY: c_int = 3;
/// The quota is per-key and its key found no entry: every entry of the
/// key section it could have had holds a key whose count still matters
/// (give keys more memory). The request passes: with `key_overflow`
/// `shared` (the default) it was checked against and counted on the
/// quota's own counter, which all such keys share; with `pass` it is not
/// counted. A rejection is `SLUICE_REJECT`, whatever the mode.
pub const SLUICE_KEY_OVERFLOW: c_int = 4;
/// `sluice_wait_ready` only: the roots' quota set has not arrived within
/// the time given (no root answered yet, or none is reachable). Checks
/// meanwhile answer from what the table holds: `SLUICE_UNKNOWN` (pass)
/// for a name it does not hold yet.
pub const SLUICE_NOT_READY: c_int = 5;
/// The call failed (not initialised, NULL or invalid argument, internal
/// error); `sluice_last_error()` says why. A check that fails should be
/// treated as a pass (fail open).
pub const SLUICE_ERROR: c_int = -1;

/// Longest quota name, in bytes. A longer name (a `name_len` above this,
/// or no NUL within this many bytes) is an error, refused before the name
/// is read.
pub const SLUICE_MAX_NAME_LEN: usize = 255;

/// Longest key of a keyed call, in bytes. A key is hashed whole on every
/// check; a `key_len` above this is taken for a caller's bug (a negative
/// length cast to `size_t`, a length that is not the buffer's) and is an
/// error, refused before the key is read.
pub const SLUICE_MAX_KEY_LEN: usize = 65536;

// The C ABI's name limit is the quota model's, its key limit the keys'.
const _: () = assert!(SLUICE_MAX_NAME_LEN == crate::core::quota::MAX_NAME_LEN);
const _: () = assert!(SLUICE_MAX_KEY_LEN == crate::core::key::MAX_KEY_LEN);
