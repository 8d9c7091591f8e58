"""Charges after the fact and settled estimates: sluice_charge[_key] and
sluice_settle[_key] from Python, standalone.

The quotas leak 0.001 unit a second, so levels barely move while a test
runs: the level is what was counted.
"""

import pytest

import sluice
from sluice import Decision, SluiceError

QUOTAS = {"quotas": [
    {"name": "tokens", "limit": 0.001, "low_burst": 1000, "high_burst": 1000},
    {"name": "tokens_key", "limit": 0.001, "low_burst": 1000, "high_burst": 1000,
     "per_key": True},
]}


@pytest.fixture
def limiter():
    with sluice.Limiter(capacity=1000) as lim:
        lim.load_quotas(QUOTAS)
        yield lim


def test_a_charge_counts_past_the_limit_and_the_debt_rejects(limiter):
    assert limiter.charge("tokens", 1500) is Decision.PASS
    assert limiter.check("tokens", 0) is Decision.REJECT
    # Never a rejection, even in debt.
    assert limiter.charge(b"tokens", 10) is Decision.PASS


def test_settle_gives_back_what_the_estimate_overcounted(limiter):
    for _ in range(4):
        assert limiter.check("tokens", 600) is Decision.PASS
        assert limiter.settle("tokens", reserved=600, actual=100) is Decision.PASS
    # Four estimates of 600 passed a quota of 1000: each came back down to
    # 100; the level is 400, so 700 no longer fits.
    assert limiter.check("tokens", 700) is Decision.REJECT
    assert limiter.check("tokens", 600) is Decision.PASS


def test_settle_charges_what_the_cost_exceeded(limiter):
    assert limiter.check("tokens", 100) is Decision.PASS
    assert limiter.settle("tokens", 100, 950) is Decision.PASS
    assert limiter.check("tokens", 100) is Decision.REJECT


def test_a_keyed_charge_and_settle_move_only_the_key(limiter):
    assert limiter.charge("tokens_key", 2000, key="alice") is Decision.PASS
    assert limiter.check("tokens_key", 0, key="alice") is Decision.REJECT
    assert limiter.check("tokens_key", 900, key="bob") is Decision.PASS
    assert limiter.settle("tokens_key", 900, 0, key=b"bob") is Decision.PASS
    assert limiter.check("tokens_key", 900, key="bob") is Decision.PASS


def test_unknown_names_and_empty_keys_count_nothing_and_say_so(limiter):
    assert limiter.charge("nothing_here", 5) is Decision.UNKNOWN
    assert limiter.settle("nothing_here", 5, 1) is Decision.UNKNOWN
    assert limiter.charge("tokens_key", 5, key="") is Decision.NO_KEY


def test_bad_arguments_are_refused(limiter):
    with pytest.raises(ValueError):
        limiter.charge("tokens", -1)
    with pytest.raises(ValueError):
        limiter.settle("tokens", 1, -1)
    with pytest.raises(TypeError):
        limiter.charge(5, 1)


def test_a_closed_limiter_refuses_charges():
    lim = sluice.Limiter(capacity=100)
    lim.close()
    with pytest.raises(SluiceError):
        lim.charge("tokens", 1)
    with pytest.raises(SluiceError):
        lim.settle("tokens", 1, 2)
