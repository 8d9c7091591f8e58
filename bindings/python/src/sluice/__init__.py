"""sluice for Python: the limiter of libsluice.so (the C ABI) through ctypes.

    import sluice

    with sluice.Limiter(roots=["http://127.0.0.1:7070"]) as limiter:
        if not limiter.check("api_acme", weight=1):
            ...  # over the quota: answer 429

The library is found through ``$SLUICE_LIBRARY`` (its full path), a
``libsluice.so`` inside this package, or the dynamic loader's path, in that
order. The semantics (quotas, levels, the decision, sync) are the library's;
this package only converts arguments and errors.
"""

from ._native import LIBRARY_ENV, LibraryNotFound
from .limiter import NEVER, Decision, Grant, Limiter, Reservation, Slot, SluiceError

__all__ = [
    "Decision", "Grant", "LIBRARY_ENV", "LibraryNotFound", "Limiter", "NEVER", "Reservation",
    "Slot", "SluiceError",
]
