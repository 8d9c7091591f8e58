"""Keys, partial grants and pacing: sluice_check_key, sluice_obtain[_key]
and sluice_reserve[_key] from Python, standalone.

The slow quota leaks 0.01 unit a second (a unit takes 100 s), so waits
barely move while a test runs.
"""

import math
import time

import pytest

import sluice
from sluice import NEVER, Decision, Grant, Reservation, SluiceError

QUOTAS = {"quotas": [
    {"name": "per_user", "limit": 0.001, "low_burst": 2, "high_burst": 2, "per_key": True},
    {"name": "batch", "limit": 0, "low_burst": 10, "high_burst": 10},
    {"name": "slow", "limit": 0.01, "low_burst": 1, "high_burst": 1},
    {"name": "hourly", "limit": 3, "window": "1h"},
]}


@pytest.fixture
def limiter():
    with sluice.Limiter(capacity=1000) as lim:
        lim.load_quotas(QUOTAS)
        yield lim


def test_a_key_has_its_own_counter(limiter):
    assert [limiter.check("per_user", key="alice") for _ in range(3)] == [
        Decision.PASS, Decision.PASS, Decision.REJECT]
    assert limiter.check("per_user", key=b"bob") is Decision.PASS


def test_a_per_key_quota_without_a_key_passes_uncounted(limiter):
    assert limiter.check("per_user") is Decision.NO_KEY
    assert limiter.check("per_user", key="") is Decision.NO_KEY
    assert limiter.check("per_user", key="") and Decision.NO_KEY.allowed


def test_a_key_given_for_a_plain_quota_is_ignored(limiter):
    assert limiter.check("batch", 10, key="whoever") is Decision.PASS
    assert limiter.check("batch", 1) is Decision.REJECT


def test_obtain_grants_what_is_left_and_counts_it(limiter):
    assert limiter.obtain("batch", 5) == Grant(Decision.PASS, 5)
    assert limiter.obtain("batch", 100) == Grant(Decision.PASS, 5)
    grant = limiter.obtain("batch", 1)
    assert grant == Grant(Decision.REJECT, 0) and not grant
    assert limiter.check("batch", 0) is Decision.REJECT


def test_obtain_on_an_unknown_quota_grants_nothing_and_says_so(limiter):
    assert limiter.obtain("nothing_here", 3) == Grant(Decision.UNKNOWN, 0)


def test_obtain_on_a_key_takes_from_the_keys_counter(limiter):
    assert limiter.obtain("per_user", 5, key="carol") == Grant(Decision.PASS, 2)
    assert limiter.obtain("per_user", 5, key="dave") == Grant(Decision.PASS, 2)
    assert limiter.obtain("per_user", 5) == Grant(Decision.NO_KEY, 0)


def test_obtain_of_nothing_is_an_error(limiter):
    with pytest.raises(SluiceError, match="want"):
        limiter.obtain("batch", 0)
    with pytest.raises(ValueError):
        limiter.obtain("batch", -1)


def test_reserve_spaces_requests_at_the_rate(limiter):
    first = limiter.reserve("slow", 1, max_wait=1)
    assert first == Reservation(Decision.PASS, 0) and first
    second = limiter.reserve("slow", 1, max_wait=1000)
    assert second.decision is Decision.PASS
    assert 99 < second.wait <= 100


def test_a_reservation_past_max_wait_is_refused_uncounted(limiter):
    limiter.reserve("slow", 1)
    refused = limiter.reserve("slow", 1, max_wait=10)
    assert refused.decision is Decision.REJECT and not refused
    assert 99 < refused.wait <= 100
    # Not counted: the same wait again.
    assert 99 < limiter.reserve("slow", 1, max_wait=10).wait <= 100


def test_a_weight_above_high_burst_can_never_be_reserved(limiter):
    never = limiter.reserve("slow", 2, max_wait=3600)
    assert never.decision is Decision.REJECT
    assert never.wait_ns == NEVER and never.wait == math.inf


def test_reserve_on_a_key_and_on_an_unknown_quota(limiter):
    assert limiter.reserve("per_user", 1, key="erin") == Reservation(Decision.PASS, 0)
    assert limiter.reserve("nothing_here", 1) == Reservation(Decision.UNKNOWN, 0)


def test_pace_sleeps_the_reserved_wait(limiter):
    slept = []
    assert limiter.pace("slow", 1, sleep=slept.append).wait_ns == 0
    assert slept == []
    reservation = limiter.pace("slow", 1, max_wait=1000, sleep=slept.append)
    assert slept == [reservation.wait] and 99 < slept[0] <= 100
    limiter.pace("slow", 1, max_wait=1, sleep=slept.append)
    assert len(slept) == 1, "a refused reservation does not sleep"


def test_the_new_calls_fail_on_a_closed_limiter():
    lim = sluice.Limiter(capacity=1000)
    lim.close()
    for call in (lambda: lim.check("x", key="k"), lambda: lim.obtain("x", 1),
                 lambda: lim.reserve("x", 1)):
        with pytest.raises(SluiceError, match="closed"):
            call()


def away_from_the_hours_end():
    """Waits out the last seconds of a UTC hour, so one window holds a test."""
    left = 3600 - time.time() % 3600
    if left < 5:
        time.sleep(left + 0.1)


def test_obtain_on_a_window_quota_takes_the_rest_of_the_window(limiter):
    away_from_the_hours_end()
    assert limiter.obtain("hourly", 2) == Grant(Decision.PASS, 2)
    assert limiter.obtain("hourly", 5) == Grant(Decision.PASS, 1)
    assert limiter.obtain("hourly", 5) == Grant(Decision.REJECT, 0)


def test_a_full_window_is_not_reserved_into_the_next_one(limiter):
    # Its next window cannot be taken in advance: refused, uncounted, and
    # the wait is the time to the window's end (at most an hour).
    away_from_the_hours_end()
    assert limiter.reserve("hourly", 3) == Reservation(Decision.PASS, 0)
    refused = limiter.reserve("hourly", 1, max_wait=7200)
    assert refused.decision is Decision.REJECT
    assert 0 < refused.wait <= 3600


def test_a_key_without_room_passes_on_the_quotas_shared_counter_and_says_so():
    # No key section at all: every key is an overflow, and all of them
    # share per_user's own counter (2 units).
    with sluice.Limiter(capacity=1000, key_capacity=0) as lim:
        lim.load_quotas(QUOTAS)
        got = [lim.check("per_user", key=k) for k in ("a", "b", "c")]
        assert got == [Decision.KEY_OVERFLOW, Decision.KEY_OVERFLOW, Decision.REJECT]
        assert Decision.KEY_OVERFLOW.allowed


def test_key_overflow_pass_lets_a_key_without_room_through_uncounted():
    with sluice.Limiter(capacity=1000, key_capacity=0, key_overflow="pass") as lim:
        lim.load_quotas(QUOTAS)
        got = {lim.check("per_user", key="a") for _ in range(5)}
        assert got == {Decision.KEY_OVERFLOW}
    with pytest.raises(SluiceError, match="key_overflow"):
        sluice.Limiter(capacity=1000, key_overflow="sometimes")


def test_every_call_answers_with_the_decision_enum_never_a_bare_int():
    """The issue's report: ``check()`` returned bare ints. Every call, on
    every outcome (keyed or not, a key without room included), answers
    with a ``Decision`` member: ``type(d) is Decision``, so ``d.name`` and
    ``d.allowed`` always work and a 0 (PASS) is never falsy."""
    with sluice.Limiter(capacity=100, key_capacity=0) as lim:
        lim.load_quotas(QUOTAS)
        seen = {
            "check pass": lim.check("batch", 1),
            "check reject": lim.check("batch", 100),
            "check unknown": lim.check("nothing_here"),
            "check no key": lim.check("per_user"),
            "check_key overflow": lim.check("per_user", key="k"),
            "check_key reject": lim.check("per_user", 5, key="k"),
            "obtain pass": lim.obtain("batch", 1).decision,
            "obtain reject": lim.obtain("slow", 5).decision,
            "obtain unknown": lim.obtain("nothing_here", 1).decision,
            "obtain no key": lim.obtain("per_user", 1, key="").decision,
            "obtain_key overflow": lim.obtain("per_user", 1, key="k2").decision,
            "reserve pass": lim.reserve("slow", 1).decision,
            "reserve reject": lim.reserve("slow", 5).decision,
            "reserve unknown": lim.reserve("nothing_here").decision,
            "reserve no key": lim.reserve("per_user", key="").decision,
            "reserve_key overflow": lim.reserve("per_user", key="k3").decision,
        }
    wrong = {what: d for what, d in seen.items() if type(d) is not Decision}
    assert wrong == {}
    assert {d for d in seen.values()} == set(Decision), seen
    assert seen["check pass"] and seen["check pass"].name == "PASS"
