"""The process-wide limiter of libsluice, as a Python object."""

import ctypes
import enum
import json
import math
import os
import threading
from time import sleep as _sleep
from typing import NamedTuple

from . import _native


class SluiceError(Exception):
    """A sluice call failed; the message is the library's ``sluice_last_error()``."""


class Decision(enum.IntEnum):
    """The answer to a check (the C ABI's result codes)."""

    #: Every quota in the chain had room; the weight was counted.
    PASS = _native.SLUICE_PASS
    #: Over a quota (the named one or an ancestor); nothing was counted.
    REJECT = _native.SLUICE_REJECT
    #: No quota has this name: the request passes, uncounted.
    UNKNOWN = _native.SLUICE_UNKNOWN
    #: The quota is per-key and the call gave no key (or an empty one):
    #: the request passes, uncounted.
    NO_KEY = _native.SLUICE_NO_KEY
    #: The quota is per-key and its key found no room in a key section
    #: full of live keys: the request passes as ``key_overflow`` says
    #: (checked and counted on the quota's shared counter by default).
    KEY_OVERFLOW = _native.SLUICE_KEY_OVERFLOW

    @property
    def allowed(self):
        """True unless the request was rejected (unknown names pass)."""
        return self is not Decision.REJECT

    def __str__(self):
        # An IntEnum prints as its number ("2") since Python 3.11; a
        # decision reads as its name.
        return f"Decision.{self.name}"

    def __format__(self, spec):
        # f"{decision}" is its name; a numeric format ("{:d}") its code.
        return str(self) if not spec else format(self.value, spec)

    def __bool__(self):
        # `if limiter.check(...)` reads as "if allowed"; without this,
        # PASS (0) would be falsy.
        return self.allowed


class Grant(NamedTuple):
    """What ``Limiter.obtain`` granted: truthy when ``granted`` > 0."""

    #: ``PASS`` (something granted), ``REJECT`` (nothing can be granted
    #: now), ``UNKNOWN`` or ``NO_KEY`` (nothing checked, nothing granted:
    #: the caller decides).
    decision: "Decision"
    #: Units granted and counted, at most what was wanted.
    granted: int

    def __bool__(self):
        return self.granted > 0


#: ``Reservation.wait_ns`` when waiting cannot help (a weight above the
#: quota's high_burst): the C ABI's ``UINT64_MAX``.
NEVER = 2**64 - 1


class Reservation(NamedTuple):
    """What ``Limiter.reserve`` decided: truthy unless it was refused."""

    #: ``PASS`` (counted: wait, then act), ``REJECT`` (not counted: the
    #: wait would exceed ``max_wait``, or cannot end), ``UNKNOWN`` or
    #: ``NO_KEY`` (not counted; no wait).
    decision: "Decision"
    #: Nanoseconds to wait before acting; on a refusal the wait it would
    #: have needed, ``NEVER`` when waiting cannot help.
    wait_ns: int

    @property
    def wait(self):
        """``wait_ns`` in seconds (``math.inf`` for ``NEVER``)."""
        return math.inf if self.wait_ns == NEVER else self.wait_ns / 1e9

    def __bool__(self):
        return self.decision is not Decision.REJECT


class Slot:
    """A slot of an in-flight quota from ``Limiter.acquire``: truthy unless
    every slot was taken. Give it back with ``release()`` when the work it
    stands for ends, or use it as a context manager; releasing twice (or a
    slot that holds nothing) does nothing. A slot dropped unreleased is
    given back when it is garbage-collected.
    """

    __slots__ = ("decision", "_ptr", "_release")

    def __init__(self, decision, ptr, release):
        #: ``PASS`` (a slot is held), ``REJECT`` (none free), ``UNKNOWN``,
        #: ``NO_KEY`` or ``KEY_OVERFLOW`` (as for a check).
        self.decision = decision
        self._ptr = ptr
        self._release = release

    @property
    def held(self):
        """True while this object holds a slot to give back."""
        return self._ptr is not None

    def release(self):
        """Gives the slot back (once; later calls do nothing)."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._release(ptr)

    def __bool__(self):
        return self.decision is not Decision.REJECT

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.release()

    def __del__(self):
        self.release()


_CLOSED = "the limiter is closed"
_MAX_U64 = 2**64 - 1
# Builds a Grant or Reservation without NamedTuple's keyword-handling
# constructor (a third of a grant's cost in Python).
_new_tuple = tuple.__new__


def _name_bytes(value, what):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"{what} must be str or bytes, got {type(value).__name__}")


def _count(value, what):
    """A non-negative count for a uint64_t argument (larger ones count as the most there is)."""
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    return min(int(value), _MAX_U64)

# Indexed by the C result code, so a check maps its code without a call.
_DECISIONS = {d.value: d for d in Decision}


def _json_text(value, what):
    """A JSON document as bytes: a str is taken as JSON text, anything else is encoded."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    try:
        return json.dumps(value).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} is not JSON-serialisable: {e}") from None


class Limiter:
    """The limiter embedded in this process (one at a time, as in the C ABI).

    ``Limiter(config=None, **options)`` starts it: ``config`` and the
    keyword options are merged into the JSON object ``sluice_init`` takes
    (``roots``, ``sync_interval_ms``, ``sync_timeout_ms``, ``sync_token``,
    ``limiter_id``, ``capacity``, ``avg_name_bytes``, ``extrapolation``,
    ``early_sync``, ``key_overflow``, ``no_key``, ``override_capacity``;
    see include/sluice.h). ``no_key="reject"`` makes a check of a per-key
    quota without a key ``Decision.REJECT`` (the default ``"pass"`` is
    ``Decision.NO_KEY``, uncounted, as nginx's ``limit_req`` does). The
    library validates it; a bad field raises ``SluiceError`` naming the
    key.

    Use it as a context manager, or call ``close()``: that stops the sync
    thread, and only then can another ``Limiter`` start.
    """

    def __init__(self, config=None, **options):
        merged = dict(config or {})
        merged.update(options)
        self._native = _native.load()
        self._closed = False
        self._call(self._native.lib.sluice_init, _json_text(merged, "config"))
        # Bound once: the check path then touches no module globals.
        hot = self._native.hot
        self._check = hot.sluice_check
        self._check_key = hot.sluice_check_key
        self._obtain = hot.sluice_obtain
        self._obtain_key = hot.sluice_obtain_key
        self._reserve = hot.sluice_reserve
        self._reserve_key = hot.sluice_reserve_key
        self._charge = hot.sluice_charge
        self._charge_key = hot.sluice_charge_key
        self._settle = hot.sluice_settle
        self._settle_key = hot.sluice_settle_key
        self._acquire = hot.sluice_acquire
        self._acquire_key = hot.sluice_acquire_key
        self._release_slot = hot.sluice_release
        # The out-parameter of obtain and reserve: one per thread, made
        # once (a new c_uint64 and byref per call cost more than the call).
        self._cells = threading.local()

    def _call(self, fn, *args):
        if self._closed:
            raise SluiceError(_CLOSED)
        code = fn(*args)
        if code == _native.SLUICE_ERROR:
            raise SluiceError(self._native.last_error())
        return code

    def load_quotas(self, quotas):
        """Replaces the quota set (standalone), or seeds it (with roots).

        ``quotas`` is ``{"quotas": [...]}``, a bare list of quotas, or that
        JSON as text. Quotas keep their counters across loads; quotas not in
        the new set are removed; an invalid set changes nothing and raises
        ``SluiceError``. With roots the set only seeds the table: quotas the
        roots do not have stand in until a root's whole quota set has
        arrived, and the roots' quotas are never replaced.
        """
        self._call(self._native.lib.sluice_load_quotas_json, _json_text(quotas, "quotas"))

    def load_quotas_file(self, path):
        """Like ``load_quotas``, from a JSON file."""
        self._call(self._native.lib.sluice_load_quotas_file, os.fsencode(path))

    def check(self, name, weight=1, key=None):
        """Checks quota ``name`` (and its ancestors) for ``weight`` units.

        Returns a ``Decision`` (truthy when the request may pass) and counts
        the weight when it passes; ``weight=0`` checks without counting.
        ``key`` (str or bytes) checks that key's own counter of a per-key
        quota (``sluice_check_key``; hashed at once, never kept); a
        per-key quota checked without a key, or with an empty one, is
        ``Decision.NO_KEY`` (passes, uncounted), or ``Decision.REJECT``
        with ``no_key="reject"``.
        Never blocks. Raises ``SluiceError`` when the library cannot
        decide (the limiter is closed, an internal error); the C ABI's
        advice for that case is to let the request pass.
        """
        if not isinstance(name, bytes):
            name = name.encode("utf-8")
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        if self._closed:
            # Not left to the library: it would answer for whichever
            # limiter was started after this one closed.
            raise SluiceError(_CLOSED)
        if key is None:
            code = self._check(name, len(name), weight)
        else:
            key = _name_bytes(key, "key")
            code = self._check_key(name, len(name), key, len(key), weight)
        return self._decision(code)

    def charge(self, name, weight, key=None):
        """Counts ``weight`` units on quota ``name`` (and its ancestors)
        whatever its level: a cost known only after the work is done
        (bytes sent, tokens used, a failed login). Never rejects: past
        the limit it is a debt, and later checks are rejected until it
        has drained (``sluice_charge``). With ``key``, the key's own
        counter of a per-key quota (``sluice_charge_key``).

        Returns ``Decision.PASS`` (counted), ``UNKNOWN`` or ``NO_KEY``
        (nothing counted) or ``KEY_OVERFLOW``. Never blocks.
        """
        name = _name_bytes(name, "name")
        weight = _count(weight, "weight")
        if key is None:
            return self._decision(self._call_hot(self._charge, name, len(name), weight))
        key = _name_bytes(key, "key")
        return self._decision(
            self._call_hot(self._charge_key, name, len(name), key, len(key), weight))

    def settle(self, name, reserved, actual, key=None):
        """Settles an estimate: a passed check of ``reserved`` units on
        quota ``name`` cost ``actual`` in the end (``sluice_settle``). The
        difference above the estimate is charged (whatever the level);
        below it, it is given back (uncounted if not sent to the roots
        yet, else returned to them with the next sync). Check with an
        estimate at least the cost (an LLM request's ``max_tokens``) so
        that the fleet never admits more than the limit. With ``key``,
        the key's counter (``sluice_settle_key``).

        Returns a ``Decision`` as ``charge`` does. Never blocks.
        """
        name = _name_bytes(name, "name")
        reserved = _count(reserved, "reserved")
        actual = _count(actual, "actual")
        if key is None:
            code = self._call_hot(self._settle, name, len(name), reserved, actual)
        else:
            key = _name_bytes(key, "key")
            code = self._call_hot(
                self._settle_key, name, len(name), key, len(key), reserved, actual)
        return self._decision(code)

    def _call_hot(self, fn, *args):
        """A call of the hot table, refused once this limiter is closed
        (the library would answer for whichever limiter started since)."""
        if self._closed:
            raise SluiceError(_CLOSED)
        return fn(*args)

    def _decision(self, code):
        decision = _DECISIONS.get(code)
        if decision is None:
            raise SluiceError(self._native.last_error())
        return decision

    def obtain(self, name, want, key=None):
        """A partial grant: counts and returns the most units, up to ``want``
        (at least 1), that quota ``name`` and all its ancestors allow with
        certainty now (``sluice_obtain``): a sender takes "as many as
        allowed" for a batch and sends that many. With ``key``, the key's
        own counter of a per-key quota (``sluice_obtain_key``).

        Returns a ``Grant(decision, granted)``, truthy when something was
        granted. Never blocks.
        """
        # The common case (bytes or str, a plain int) is tested inline: a
        # call per argument would cost as much as the C call.
        if type(name) is not bytes:
            name = _name_bytes(name, "name")
        if type(want) is not int or not 0 <= want <= _MAX_U64:
            want = _count(want, "want")
        if self._closed:
            raise SluiceError(_CLOSED)
        granted = self._cell()
        # ctypes passes a c_uint64 by reference where the argument type is
        # a pointer to one.
        if key is None:
            code = self._obtain(name, len(name), want, granted)
        else:
            key = _name_bytes(key, "key")
            code = self._obtain_key(name, len(name), key, len(key), want, granted)
        decision = _DECISIONS.get(code)
        if decision is None:
            raise SluiceError(self._native.last_error())
        return _new_tuple(Grant, (decision, granted.value))

    def _cell(self):
        """This thread's out-parameter (the library writes it on every
        answer but an error)."""
        try:
            return self._cells.cell
        except AttributeError:
            cell = self._cells.cell = ctypes.c_uint64()
            return cell

    def reserve(self, name, weight=1, max_wait=1.0, key=None):
        """Pacing: counts ``weight`` on quota ``name`` now and returns how long
        to wait before acting so that the whole fleet stays at the quota's
        rate (``sluice_reserve``: GCRA's theoretical arrival time on the
        fleet-wide level). If the wait would exceed ``max_wait`` seconds
        (whole milliseconds), nothing is counted and the reservation is
        refused. With ``key``, the key's own counter of a per-key quota.

        Returns a ``Reservation(decision, wait_ns)`` (``.wait`` in
        seconds), truthy unless refused. Never blocks: the caller sleeps
        (``time.sleep(r.wait)``), or see ``pace``.
        """
        if type(name) is not bytes:
            name = _name_bytes(name, "name")
        if type(weight) is not int or not 0 <= weight <= _MAX_U64:
            weight = _count(weight, "weight")
        if not max_wait >= 0:
            raise ValueError(f"max_wait must be >= 0, got {max_wait}")
        max_wait_ms = min(int(max_wait * 1000), _MAX_U64)
        if self._closed:
            raise SluiceError(_CLOSED)
        wait = self._cell()
        if key is None:
            code = self._reserve(name, len(name), weight, max_wait_ms, wait)
        else:
            key = _name_bytes(key, "key")
            code = self._reserve_key(name, len(name), key, len(key), weight, max_wait_ms, wait)
        decision = _DECISIONS.get(code)
        if decision is None:
            raise SluiceError(self._native.last_error())
        return _new_tuple(Reservation, (decision, wait.value))

    def acquire(self, name, key=None):
        """Takes a slot of the in-flight quota ``name`` (``sluice_acquire``;
        with ``key``, a slot of that key of a per-key one): at most the
        quota's limit are held at once across the fleet. Returns a ``Slot``,
        truthy unless every slot is taken; give it back with
        ``slot.release()`` or ``with limiter.acquire("uploads") as slot:``.
        Never blocks. A quota that is not in-flight raises ``SluiceError``.
        """
        if type(name) is not bytes:
            name = _name_bytes(name, "name")
        if self._closed:
            raise SluiceError(_CLOSED)
        ptr = ctypes.c_void_p()
        if key is None:
            code = self._acquire(name, len(name), ctypes.byref(ptr))
        else:
            key = _name_bytes(key, "key")
            code = self._acquire_key(name, len(name), key, len(key), ctypes.byref(ptr))
        return Slot(self._decision(code), ptr.value, self._release_slot)

    def pace(self, name, weight=1, max_wait=1.0, key=None, sleep=None):
        """``reserve``, then sleep the wait when the reservation was counted.

        Returns the ``Reservation``; when it is refused nothing was counted
        and nothing slept, and the caller decides (retry later, drop, queue).
        ``sleep`` defaults to ``time.sleep``.
        """
        reservation = self.reserve(name, weight, max_wait, key)
        if reservation.decision is Decision.PASS and reservation.wait_ns:
            (sleep or _sleep)(reservation.wait_ns / 1e9)
        return reservation

    def wait_ready(self, timeout=None):
        """Waits until the limiter holds the roots' quota set, at most
        ``timeout`` seconds (``None``: as long as it takes; 0: only look).

        A limiter started with roots has no quotas until its first sync
        brings them, about one sync interval later: until then a check of a
        name it does not hold is ``Decision.UNKNOWN`` and passes uncounted.
        Returns True once the set is in (at once without roots), False when
        the time ran out first (``sluice_wait_ready``). Other Python threads
        run meanwhile.
        """
        if timeout is None:
            timeout_ms = _MAX_U64
        elif not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
        else:
            timeout_ms = min(math.ceil(timeout * 1000), _MAX_U64)
        code = self._call(self._native.lib.sluice_wait_ready, timeout_ms)
        return code == _native.SLUICE_PASS

    def quota_count(self):
        """The number of quotas in the table."""
        return self._call(self._native.lib.sluice_quota_count)

    def sync_metrics(self):
        """The sync thread's state as a dict: ``cycles``, ``ready`` (see
        ``wait_ready``), ``all_roots_down``, ``roots``: per root ``url``,
        ``up``, ``last_success_seconds_ago`` (None before the first),
        ``syncs``, ``errors``, ``last_error``, ``round_trip_ms``,
        ``clock_offset_ms``, ... (include/sluice.h has them all)."""
        if self._closed:
            raise SluiceError(_CLOSED)
        text = self._native.take_string(self._native.lib.sluice_sync_metrics_json())
        if text is None:
            raise SluiceError(self._native.last_error())
        return json.loads(text)

    def close(self):
        """Stops the limiter (idempotent). Later checks raise ``SluiceError``."""
        if not self._closed:
            self._call(self._native.lib.sluice_shutdown)
            self._closed = True

    @property
    def closed(self):
        """True once ``close()`` ran."""
        return self._closed

    @property
    def library_path(self):
        """The libsluice.so this limiter runs on."""
        return self._native.path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
