"""Fixtures: the library under test, and a real `sluice root` to sync with.

SLUICE_LIBRARY (libsluice.so) and SLUICE_BIN (the `sluice` binary) default
to the repository's release builds (`make lib bin`).
"""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
os.environ.setdefault("SLUICE_LIBRARY", str(REPO / "target/release/libsluice.so"))
SLUICE_BIN = os.environ.get("SLUICE_BIN", str(REPO / "target/release/sluice"))


def wait_until(predicate, timeout=10.0, what="condition"):
    """Polls `predicate` until it returns something truthy; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Root:
    """A `sluice root` process on a loopback port the kernel picked (or at
    `listen`), with SQLite in tmp; ready (its /healthz answers 200) once
    constructed. A root started again on the same tmp has the same quotas."""

    def __init__(self, tmp, *args, listen="127.0.0.1:0"):
        self.log_path = tmp / "root.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [SLUICE_BIN, "root", "--listen", listen, "--db", f"sqlite://{tmp}/quotas.db",
             "--reload-interval", "100ms", "--log-format", "json", *args],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        self.url = wait_until(self._listening, what=f"the root to listen (log: {self.log_path})")
        # Writes get 503 until the root has read its database once.
        wait_until(lambda: self.call("GET", "/healthz")[0] == 200, what="the root to be ready")

    def _listening(self):
        if self.process.poll() is not None:
            pytest.fail(f"sluice root exited with {self.process.returncode}: {self.log()}")
        for line in self.log().splitlines():
            try:
                fields = json.loads(line).get("fields", {})
            except ValueError:
                continue
            if fields.get("message") == "quota root listening":
                return f"http://{fields['address']}"
        return None

    def log(self):
        return self.log_path.read_text(errors="replace")

    def call(self, method, path, body=None, token=None):
        """One admin API call; returns (status, decoded JSON body)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def put_quota(self, name, **fields):
        status, body = self.call("PUT", f"/v1/quotas/{name}", fields)
        assert status in (200, 201), (status, body)
        return body

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def root(tmp_path):
    """A fresh root, stopped after the test."""
    r = Root(tmp_path)
    yield r
    r.stop()
