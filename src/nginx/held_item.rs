//! A check of a request kept past the access phase (a `wait=` hold's
//! checks, a request's in-flight slots), by pointers into the main
//! request's pool: what both the access handler and the in-flight log
//! handler give back from.

use crate::table::CheckItem;

/// A check of a held request, kept to give its weight back if the client
/// leaves first: the name and key point into the main request's pool (or
/// the configuration, for a literal), alive until the pool is freed,
/// after its cleanups ran.
#[derive(Clone, Copy)]
#[repr(C)]
pub(super) struct HeldItem {
    name: *const u8,
    name_len: usize,
    /// Null: no key.
    key: *const u8,
    key_len: usize,
    /// What a give-back returns (0 for an in-flight slot, which goes back
    /// in the log phase instead: see `in_flight.rs`).
    pub(super) weight: u64,
}

impl HeldItem {
    pub(super) const NONE: HeldItem = HeldItem {
        name: std::ptr::null(),
        name_len: 0,
        key: std::ptr::null(),
        key_len: 0,
        weight: 0,
    };

    pub(super) fn of(item: &CheckItem) -> Self {
        let (key, key_len) = item
            .key
            .map_or((std::ptr::null(), 0), |k| (k.as_ptr(), k.len()));
        HeldItem {
            name: item.name.as_ptr(),
            name_len: item.name.len(),
            key,
            key_len,
            weight: item.weight,
        }
    }

    /// The check again.
    ///
    /// # Safety
    /// The bytes it points at must still be alive (see the type's doc).
    pub(super) unsafe fn item(&self) -> CheckItem<'_> {
        // SAFETY: per the contract; lengths are those of live slices.
        unsafe {
            CheckItem {
                name: std::slice::from_raw_parts(self.name, self.name_len),
                key: (!self.key.is_null())
                    .then(|| std::slice::from_raw_parts(self.key, self.key_len)),
                weight: self.weight,
                max_wait: None,
            }
        }
    }
}
