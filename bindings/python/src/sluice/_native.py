"""Loading libsluice.so and declaring the C ABI (include/sluice.h) to ctypes.

This is the only module that knows the C signatures. Adding a C function
to the binding is one entry in ``_SIGNATURES`` (or ``_HOT_SIGNATURES``)
plus a method on ``Limiter`` that calls it.
"""

import ctypes
import os
import threading
from pathlib import Path

# Result codes, as in include/sluice.h.
SLUICE_PASS = 0
SLUICE_REJECT = 1
SLUICE_UNKNOWN = 2
SLUICE_NO_KEY = 3
SLUICE_KEY_OVERFLOW = 4
SLUICE_NOT_READY = 5
SLUICE_ERROR = -1

_c_str = ctypes.c_char_p
_c_int = ctypes.c_int

# name: (result type, argument types). Called with the GIL released:
# these may wait (init and shutdown start and stop the sync thread, a load
# reads a file), and other Python threads keep running meanwhile.
_SIGNATURES = {
    "sluice_init": (_c_int, [_c_str]),
    "sluice_load_quotas_json": (_c_int, [_c_str]),
    "sluice_load_quotas_file": (_c_int, [_c_str]),
    "sluice_quota_count": (_c_int, []),
    # Sleeps until the roots' quota set is in: never with the GIL held.
    "sluice_wait_ready": (_c_int, [ctypes.c_uint64]),
    # c_void_p, not c_char_p: ctypes would copy a c_char_p result into
    # bytes and lose the pointer that sluice_free_string needs.
    "sluice_sync_metrics_json": (ctypes.c_void_p, []),
    "sluice_free_string": (None, [ctypes.c_void_p]),
    "sluice_shutdown": (_c_int, []),
    "sluice_last_error": (_c_str, []),
}

# The same, called with the GIL held. Only for calls the header promises
# never block or do IO (a check): releasing and retaking the GIL would
# cost more than the check itself.
_size = ctypes.c_size_t
_u64 = ctypes.c_uint64
_u64_out = ctypes.POINTER(ctypes.c_uint64)
_HOT_SIGNATURES = {
    "sluice_check": (_c_int, [_c_str, _size, _u64]),
    "sluice_check_key": (_c_int, [_c_str, _size, _c_str, _size, _u64]),
    # want, *granted
    "sluice_obtain": (_c_int, [_c_str, _size, _u64, _u64_out]),
    "sluice_obtain_key": (_c_int, [_c_str, _size, _c_str, _size, _u64, _u64_out]),
    # weight, max_wait_ms, *wait_ns: the call only computes the wait; the
    # caller sleeps.
    "sluice_reserve": (_c_int, [_c_str, _size, _u64, _u64, _u64_out]),
    "sluice_reserve_key": (_c_int, [_c_str, _size, _c_str, _size, _u64, _u64, _u64_out]),
    # weight: counted whatever the level (never a rejection).
    "sluice_charge": (_c_int, [_c_str, _size, _u64]),
    "sluice_charge_key": (_c_int, [_c_str, _size, _c_str, _size, _u64]),
    # reserved, actual
    "sluice_settle": (_c_int, [_c_str, _size, _u64, _u64]),
    "sluice_settle_key": (_c_int, [_c_str, _size, _c_str, _size, _u64, _u64]),
    # *slot: an opaque SluiceSlot pointer, given back by sluice_release.
    "sluice_acquire": (_c_int, [_c_str, _size, ctypes.POINTER(ctypes.c_void_p)]),
    "sluice_acquire_key": (_c_int, [_c_str, _size, _c_str, _size, ctypes.POINTER(ctypes.c_void_p)]),
    "sluice_release": (_c_int, [ctypes.c_void_p]),
}

LIBRARY_ENV = "SLUICE_LIBRARY"


class LibraryNotFound(OSError):
    """libsluice.so could not be loaded from any of the places searched."""


class Native:
    """The loaded library: ``lib`` (GIL released) and ``hot`` (GIL held)."""

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.hot = ctypes.PyDLL(path)
        for table, handle in ((_SIGNATURES, self.lib), (_HOT_SIGNATURES, self.hot)):
            for name, (restype, argtypes) in table.items():
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes

    def last_error(self):
        """The calling thread's last sluice error (thread-local in the library)."""
        raw = self.lib.sluice_last_error()
        return raw.decode("utf-8", "replace") if raw else ""

    def take_string(self, ptr):
        """Copies a string the library returned and frees the original."""
        if not ptr:
            return None
        try:
            return ctypes.string_at(ptr).decode("utf-8")
        finally:
            self.lib.sluice_free_string(ptr)


def candidates():
    """Where libsluice.so is looked for, in order.

    1. ``$SLUICE_LIBRARY``: the full path of the library (set it, e.g. to
       ``target/release/libsluice.so`` after ``make lib``);
    2. ``libsluice.so`` inside this package's directory (a copy installed
       with the package);
    3. ``libsluice.so`` through the dynamic loader (``LD_LIBRARY_PATH``,
       the ``ldconfig`` cache: for a system-wide install).
    """
    env = os.environ.get(LIBRARY_ENV)
    if env:
        # An explicit path is the only candidate: falling back to another
        # copy would hide a typo.
        return [env]
    return [str(Path(__file__).resolve().parent / "libsluice.so"), "libsluice.so"]


_loaded = None
_loading = threading.Lock()


def load():
    """The library, loaded once per process."""
    global _loaded
    with _loading:
        if _loaded is None:
            tried = []
            for path in candidates():
                if os.sep in path and not os.path.exists(path):
                    tried.append(f"{path}: no such file")
                    continue
                try:
                    _loaded = Native(path)
                    break
                except OSError as e:
                    tried.append(f"{path}: {e}")
            else:
                raise LibraryNotFound(
                    "cannot load libsluice.so ("
                    + "; ".join(tried)
                    + f"); build it with `make lib` and set {LIBRARY_ENV} to its path"
                )
        return _loaded
