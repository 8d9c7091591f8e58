"""The limiter synced with a real `sluice root`: quotas come from the root's
admin API, and a limit is shared by every limiter of the fleet."""

import json
import subprocess
import sys
import textwrap

import pytest

import sluice
from sluice import Decision

from conftest import Root, wait_until

# Sync fast so the tests do not wait long (100 ms is the minimum).
FAST = {"sync_interval_ms": 100, "capacity": 1000}

# Another process of the fleet: its own limiter with the same root; checks
# weight 0 until the fleet's level reaches it (counting nothing), then
# `n` real checks. Prints what it saw as JSON.
OTHER_HOST = textwrap.dedent("""
    import json, sys, time
    import sluice
    url, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with sluice.Limiter(roots=[url], sync_interval_ms=100, capacity=1000,
                        limiter_id="pytest-other-host") as lim:
        deadline = time.monotonic() + 10
        first = lim.check(name, 0)
        while lim.check(name, 0) is not sluice.Decision.REJECT and time.monotonic() < deadline:
            time.sleep(0.02)
        checks = [lim.check(name).name for _ in range(n)]
        print(json.dumps({"first": first.name, "checks": checks,
                          "syncs": lim.sync_metrics()["roots"][0]["syncs"]}))
""")


def known(lim, name):
    return lim.check(name, 0) is not Decision.UNKNOWN


def first_root(lim):
    """The first root's sync metrics; empty until the first cycle ends."""
    roots = lim.sync_metrics()["roots"]
    return roots[0] if roots else {}


def test_a_quota_created_at_the_root_reaches_the_limiter(root):
    with sluice.Limiter(roots=[root.url], **FAST) as lim:
        assert lim.check("api_acme") is Decision.UNKNOWN
        root.put_quota("api_acme", limit=0.001, low_burst=2, high_burst=2)
        wait_until(lambda: known(lim, "api_acme"), what="the quota to arrive")
        assert [lim.check("api_acme") for _ in range(3)] == [
            Decision.PASS, Decision.PASS, Decision.REJECT]


def test_the_root_sees_what_the_limiter_counted(root):
    root.put_quota("reports", limit=0.001, low_burst=100, high_burst=100)
    with sluice.Limiter(roots=[root.url], limiter_id="pytest-counter", **FAST) as lim:
        wait_until(lambda: known(lim, "reports"), what="the quota to arrive")
        assert lim.check("reports", 30) is Decision.PASS

        def root_level():
            _, quota = root.call("GET", "/v1/quotas/reports")
            return quota if quota["level"] >= 29.9 else None

        quota = wait_until(root_level, what="the root's level to reach 30")
        assert quota["level"] <= 30
        assert [entry["limiter"] for entry in quota["limiters"]] == ["pytest-counter"]


def test_a_limit_is_enforced_fleet_wide(root):
    # 40 units for the whole fleet; it leaks 0.001/s, i.e. not at all here.
    root.put_quota("fleet", limit=0.001, low_burst=40, high_burst=40)
    with sluice.Limiter(roots=[root.url], limiter_id="pytest-this-host", **FAST) as lim:
        wait_until(lambda: known(lim, "fleet"), what="the quota to arrive")
        here = [lim.check("fleet") for _ in range(40)]
        assert here.count(Decision.PASS) == 40
        assert lim.check("fleet") is Decision.REJECT
        wait_until(lambda: root.call("GET", "/v1/quotas/fleet")[1]["level"] >= 39.9,
                   what="this host's 40 units to reach the root")

        # Another process, alone, would pass 40 more: the fleet's count stops it.
        other = subprocess.run(
            [sys.executable, "-c", OTHER_HOST, root.url, "fleet", "20"],
            capture_output=True, text=True, timeout=60,
        )
        assert other.returncode == 0, other.stderr
        seen = json.loads(other.stdout)
        assert seen["syncs"] >= 1
        assert seen["checks"] == ["REJECT"] * 20, seen

    _, quota = root.call("GET", "/v1/quotas/fleet")
    assert quota["level"] <= 40, "the other host counted nothing it rejected"
    # Only limiters that counted something are listed.
    assert [entry["limiter"] for entry in quota["limiters"]] == ["pytest-this-host"]


def test_sync_metrics_show_the_root_up(root):
    with sluice.Limiter(roots=[root.url], **FAST) as lim:
        wait_until(lambda: first_root(lim).get("syncs", 0) >= 2, what="two syncs")
        metrics = lim.sync_metrics()
        assert metrics["all_roots_down"] is False
        assert metrics["ready"] is True
        first = metrics["roots"][0]
        assert first["url"] == root.url
        assert first["up"] is True
        # Seconds since the last sync and milliseconds, not the sync
        # thread's clock and nanoseconds.
        assert 0 <= first["last_success_seconds_ago"] < 5
        assert 0 < first["round_trip_ms"] < 5000
        assert "last_success" not in first and "round_trip" not in first


def test_a_check_before_the_quota_set_arrives_is_unknown_and_wait_ready_waits_for_it(tmp_path):
    # The quota is in the root's database before the limiter starts...
    first = Root(tmp_path)
    first.put_quota("ready_q", limit=0.001, low_burst=2, high_burst=2)
    address = first.url.removeprefix("http://")
    first.stop()
    # ...but the root is not answering yet when the limiter starts.
    with sluice.Limiter(roots=[first.url], **FAST) as lim:
        assert lim.check("ready_q") is Decision.UNKNOWN, "no quota before the first sync"
        assert lim.wait_ready(0) is False
        assert lim.wait_ready(0.3) is False
        assert lim.sync_metrics()["ready"] is False
        again = Root(tmp_path, listen=address)
        try:
            assert lim.wait_ready(15) is True
            assert lim.sync_metrics()["ready"] is True
            # Counted from now on: the UNKNOWN above counted nothing.
            assert [lim.check("ready_q") for _ in range(3)] == [
                Decision.PASS, Decision.PASS, Decision.REJECT]
            wait_until(lambda: again.call("GET", "/v1/quotas/ready_q")[1]["level"] >= 1.99,
                       what="the root to count the two checks")
            assert lim.wait_ready(0) is True, "ready stays ready"
        finally:
            again.stop()


def test_a_standalone_limiter_is_ready_at_once():
    with sluice.Limiter(capacity=100) as lim:
        assert lim.wait_ready(0) is True
        assert lim.sync_metrics()["ready"] is True
    with pytest.raises(sluice.SluiceError):
        lim.wait_ready(0)


def test_with_every_root_down_limits_become_per_host(root):
    url = root.url
    root.stop()  # nothing listens there now
    with sluice.Limiter(roots=[url], **FAST) as lim:
        # Seeds, as nginx's sluice_quotas: used until a root answers.
        lim.load_quotas([{"name": "seeded", "limit": 0.001, "low_burst": 2, "high_burst": 2}])
        wait_until(lambda: first_root(lim).get("errors", 0) >= 1, what="a failed sync")
        metrics = lim.sync_metrics()
        assert metrics["roots"][0]["up"] is False
        assert metrics["roots"][0]["last_error"]
        assert [lim.check("seeded") for _ in range(3)] == [
            Decision.PASS, Decision.PASS, Decision.REJECT]


def test_a_load_after_syncing_seeds_and_never_replaces_the_roots_quotas(root):
    root.put_quota("from_root", limit=0.001, low_burst=1, high_burst=1)
    with sluice.Limiter(roots=[root.url], **FAST) as lim:
        wait_until(lambda: lim.check("from_root", 0) == Decision.PASS, what="the root's quota")
        lim.load_quotas([{"name": "local_only", "limit": 1}])
        # Some syncs later the root's quota is still there and the seed
        # no root knows is gone.
        syncs = first_root(lim).get("syncs", 0)
        wait_until(lambda: first_root(lim).get("syncs", 0) >= syncs + 2, what="two more syncs")
        assert lim.check("from_root", 0) == Decision.PASS
        assert lim.check("local_only") == Decision.UNKNOWN


def test_a_root_requiring_a_sync_token_refuses_a_limiter_without_it(tmp_path):
    (tmp_path / "sync.token").write_text("s3cret-sync-token\n")
    secured = Root(tmp_path, "--sync-token-file", str(tmp_path / "sync.token"))
    try:
        with sluice.Limiter(roots=[secured.url], **FAST) as lim:
            wait_until(lambda: first_root(lim).get("errors", 0) >= 1, what="a refused sync")
            assert "401" in lim.sync_metrics()["roots"][0]["last_error"]
        with sluice.Limiter(roots=[secured.url], sync_token="s3cret-sync-token", **FAST) as lim:
            wait_until(lambda: first_root(lim).get("syncs", 0) >= 1, what="a sync")
    finally:
        secured.stop()


def test_overrides_beyond_the_tables_room_name_the_option_that_gives_it(root, capfd):
    # The case: the log said "raise sluice_overrides", a setting a
    # limiter of the C ABI or a binding does not have.
    root.put_quota("per_token", limit=1, per_key=True)
    for i in range(100):
        status, body = root.call("PUT", f"/v1/quotas/per_token/overrides/{i + 1:016x}",
                                 {"deny": True})
        assert status in (200, 201), (status, body)
    with sluice.Limiter(roots=[root.url], override_capacity=1, **FAST) as lim:
        assert lim.wait_ready(10)
        wait_until(lambda: "override_capacity" in capfd.readouterr().err or None,
                   what="the refusal in the log")
