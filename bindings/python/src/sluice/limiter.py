"""The process-wide limiter of libsluice, as a Python object."""

import enum
import json
import os

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

    @property
    def allowed(self):
        """True unless the request was rejected (unknown names pass)."""
        return self is not Decision.REJECT

    def __bool__(self):
        # `if limiter.check(...)` reads as "if allowed"; without this,
        # PASS (0) would be falsy.
        return self.allowed


_CLOSED = "the limiter is closed"

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
    ``early_sync``; see include/sluice.h). The library validates it; a bad
    field raises ``SluiceError`` naming the key.

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
        self._check = self._native.hot.sluice_check

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

    def check(self, name, weight=1):
        """Checks quota ``name`` (and its ancestors) for ``weight`` units.

        Returns a ``Decision`` (truthy when the request may pass) and counts
        the weight when it passes; ``weight=0`` checks without counting.
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
        code = self._check(name, len(name), weight)
        decision = _DECISIONS.get(code)
        if decision is None:
            raise SluiceError(self._native.last_error())
        return decision

    def quota_count(self):
        """The number of quotas in the table."""
        return self._call(self._native.lib.sluice_quota_count)

    def sync_metrics(self):
        """The sync thread's state as a dict (``cycles``, ``all_roots_down``,
        ``roots``: per root ``url``, ``up``, ``syncs``, ``errors``, ...)."""
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
