"""The limiter without roots: quotas loaded from Python, counted in this process.

Limits are 0.001/s, so next to nothing leaks during a test: a quota with
bursts of 3 passes exactly 3 units.
"""

import json
import os
import subprocess
import sys
import threading

import pytest

import sluice
from sluice import Decision, SluiceError

QUOTAS = {"quotas": [
    {"name": "three", "limit": 0.001, "low_burst": 3, "high_burst": 3},
    {"name": "frozen_ten", "limit": 0, "low_burst": 10, "high_burst": 10},
    {"name": "parent2", "limit": 0.001, "low_burst": 2, "high_burst": 2},
    {"name": "child", "parent": "parent2", "limit": 0.001, "low_burst": 100, "high_burst": 100},
    {"name": "many", "limit": 0.001, "low_burst": 1000, "high_burst": 1000},
]}


@pytest.fixture
def limiter():
    with sluice.Limiter(capacity=1000) as lim:
        lim.load_quotas(QUOTAS)
        yield lim


def test_a_quota_passes_its_burst_then_rejects(limiter):
    assert [limiter.check("three") for _ in range(5)] == [
        Decision.PASS, Decision.PASS, Decision.PASS, Decision.REJECT, Decision.REJECT]


def test_a_decision_is_truthy_unless_rejected(limiter):
    assert limiter.check("three", 3)
    assert limiter.check("three").allowed is False
    assert not limiter.check("three")
    assert limiter.check("no_such_quota")


def test_a_weight_counts_that_many_units(limiter):
    assert limiter.check("frozen_ten", 7) is Decision.PASS
    assert limiter.check("frozen_ten", 4) is Decision.REJECT
    assert limiter.check("frozen_ten", 3) is Decision.PASS


def test_weight_zero_checks_without_counting(limiter):
    assert all(limiter.check("frozen_ten", 0) is Decision.PASS for _ in range(100))
    assert limiter.check("frozen_ten", 10) is Decision.PASS
    assert limiter.check("frozen_ten", 0) is Decision.REJECT


def test_a_child_stops_at_its_parents_limit(limiter):
    assert [limiter.check("child") for _ in range(3)] == [
        Decision.PASS, Decision.PASS, Decision.REJECT]
    assert limiter.check("parent2") is Decision.REJECT


def test_an_unknown_name_passes_uncounted(limiter):
    assert limiter.check("no_such_quota", 10**6) is Decision.UNKNOWN


def test_names_may_be_bytes(limiter):
    assert limiter.check(b"three", 3) is Decision.PASS
    assert limiter.check("three") is Decision.REJECT


def test_a_negative_weight_is_refused_before_the_library(limiter):
    with pytest.raises(ValueError, match="weight"):
        limiter.check("three", -1)
    assert limiter.check("three", 3) is Decision.PASS


def test_threads_share_one_count(limiter):
    results = []
    lock = threading.Lock()

    def worker():
        mine = [limiter.check("many") for _ in range(600)]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(Decision.PASS) == 1000
    assert results.count(Decision.REJECT) == 1400


def test_quotas_load_from_text_and_from_a_file(tmp_path):
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps([{"name": "from_file", "limit": 0.001, "low_burst": 1}]))
    with sluice.Limiter(capacity=1000) as lim:
        lim.load_quotas('{"quotas": [{"name": "from_text", "limit": 1}]}')
        assert lim.quota_count() == 1
        assert lim.check("from_text") is Decision.PASS
        lim.load_quotas_file(path)
        assert lim.quota_count() == 1
        assert lim.check("from_text") is Decision.UNKNOWN
        assert [lim.check("from_file") for _ in range(2)] == [Decision.PASS, Decision.REJECT]


def test_an_invalid_quota_set_raises_and_changes_nothing(limiter):
    with pytest.raises(SluiceError, match="name"):
        limiter.load_quotas({"quotas": [{"name": "a b", "limit": 1}]})
    with pytest.raises(SluiceError, match="limit"):
        limiter.load_quotas([{"name": "ok", "limit": -1}])
    assert limiter.quota_count() == len(QUOTAS["quotas"])


def test_a_missing_quota_file_raises_with_the_path(limiter):
    with pytest.raises(SluiceError, match="/nonexistent/quotas.json"):
        limiter.load_quotas_file("/nonexistent/quotas.json")


def test_a_value_that_is_not_json_is_a_type_error(limiter):
    with pytest.raises(TypeError, match="quotas"):
        limiter.load_quotas({"quotas": [object()]})


@pytest.mark.parametrize("config, key", [
    ({"sync_interval_ms": 50}, "sync_interval_ms"),
    ({"sync_interval_ms": 1000, "sync_timeout_ms": 1000}, "sync_timeout_ms"),
    ({"limiter_id": "web 1"}, "limiter_id"),
    ({"roots": ["http://root:7070/v1/sync"]}, "roots"),
    ({"rootz": []}, "rootz"),
])
def test_a_bad_config_raises_naming_the_key(config, key):
    with pytest.raises(SluiceError, match=key):
        sluice.Limiter(config)
    # and nothing was started: a good config works right after
    with sluice.Limiter(capacity=1000):
        pass


def test_config_and_keyword_options_merge():
    with pytest.raises(SluiceError, match="sync_timeout_ms"):
        sluice.Limiter({"sync_interval_ms": 1000}, sync_timeout_ms=2000)


def test_one_limiter_at_a_time(limiter):
    with pytest.raises(SluiceError, match="already initialised"):
        sluice.Limiter()


def test_a_closed_limiter_raises_on_check():
    with sluice.Limiter(capacity=1000) as lim:
        lim.load_quotas(QUOTAS)
        assert lim.check("three") is Decision.PASS
    assert lim.closed
    with pytest.raises(SluiceError, match="closed"):
        lim.check("three")
    lim.close()  # idempotent


def test_a_closed_limiter_does_not_reach_the_next_one():
    with sluice.Limiter(capacity=1000) as old:
        pass
    with sluice.Limiter(capacity=1000) as new:
        new.load_quotas(QUOTAS)
        with pytest.raises(SluiceError, match="closed"):
            old.check("three")
        with pytest.raises(SluiceError, match="closed"):
            old.quota_count()
        assert new.check("three", 3) is Decision.PASS


def test_a_new_limiter_after_close_starts_empty():
    with sluice.Limiter(capacity=1000) as lim:
        lim.load_quotas(QUOTAS)
    with sluice.Limiter(capacity=1000) as lim:
        assert lim.quota_count() == 0


def test_sync_metrics_of_a_standalone_limiter_list_no_roots(limiter):
    metrics = limiter.sync_metrics()
    assert metrics["roots"] == []
    assert "cycles" in metrics


def test_the_library_is_the_one_sluice_library_names(limiter):
    assert limiter.library_path == os.environ["SLUICE_LIBRARY"]


def test_a_missing_library_is_reported_with_the_variable_to_set():
    # In a child: this process has the library loaded already.
    env = dict(os.environ, SLUICE_LIBRARY="/nonexistent/libsluice.so")
    child = subprocess.run(
        [sys.executable, "-c", "import sluice; sluice.Limiter()"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert child.returncode != 0
    assert "LibraryNotFound" in child.stderr
    assert "/nonexistent/libsluice.so: no such file" in child.stderr
    assert "SLUICE_LIBRARY" in child.stderr


def test_a_decision_prints_as_its_name_not_its_code(limiter):
    # The case: print(limiter.check(...)) showed "2".
    decision = limiter.check("no_such_quota")
    assert str(decision) == "Decision.UNKNOWN"
    assert f"{decision}" == "Decision.UNKNOWN"
    assert f"{decision:d}" == "2"
    assert decision == 2 and int(decision) == 2


def test_a_missing_key_passes_by_default_and_is_rejected_with_no_key_reject():
    per_key = [{"name": "per_token", "limit": 0.001, "low_burst": 3, "per_key": True}]
    with sluice.Limiter(capacity=100) as lim:
        lim.load_quotas(per_key)
        assert lim.check("per_token") is Decision.NO_KEY
    with sluice.Limiter(capacity=100, no_key="reject") as lim:
        lim.load_quotas(per_key)
        assert lim.check("per_token") is Decision.REJECT
        assert lim.check("per_token", key="") is Decision.REJECT
        assert lim.check("per_token", key="t1") is Decision.PASS
    with pytest.raises(SluiceError, match="no_key"):
        sluice.Limiter(no_key="sometimes")


def test_a_deny_override_of_a_quota_file_is_held():
    # The key "stolen" hashes to 7e4ad326f01febd5 with the built-in secret.
    quotas = [{"name": "per_token", "limit": 0.001, "low_burst": 3, "per_key": True,
               "overrides": [{"key_hash": "7e4ad326f01febd5", "deny": True}]}]
    with sluice.Limiter(capacity=100) as lim:
        lim.load_quotas(quotas)
        assert lim.check("per_token", key="stolen") is Decision.REJECT
        assert lim.check("per_token", key="alice") is Decision.PASS
