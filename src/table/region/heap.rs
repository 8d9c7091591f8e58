//! The heap region behind a table that is not in shared memory (the C
//! ABI, tests, the simulator).

use std::ptr;

/// A private anonymous mapping holding a heap table's region.
///
/// Asked for transparent huge pages: a table of a million quotas spans
/// ~150 MB, and with 4 KiB pages every random lookup would also miss the
/// TLB.
pub(in crate::table) struct HeapRegion {
    pub(in crate::table) base: *mut u8,
    len: usize,
}

impl HeapRegion {
    pub(in crate::table) fn new(len: usize) -> HeapRegion {
        // SAFETY: a fresh private anonymous mapping; arguments are valid.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len, 64)
                    .unwrap_or(std::alloc::Layout::new::<u8>()),
            );
        }
        // SAFETY: advice on our own mapping; failure only loses the hint.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        HeapRegion {
            base: p.cast(),
            len,
        }
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
