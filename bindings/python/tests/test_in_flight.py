"""In-flight quotas: slots acquired and released (``Limiter.acquire``)."""

import gc

import pytest

import sluice
from sluice import Decision, SluiceError

QUOTAS = {"quotas": [
    {"name": "uploads", "limit": 2, "in_flight": True},
    {"name": "per_client", "limit": 1, "in_flight": True, "per_key": True},
    {"name": "rate", "limit": 10},
]}


@pytest.fixture
def limiter():
    with sluice.Limiter(capacity=100) as lim:
        lim.load_quotas(QUOTAS)
        yield lim


def test_two_slots_take_two_and_a_release_lets_the_third_in(limiter):
    a, b = limiter.acquire("uploads"), limiter.acquire("uploads")
    assert a.decision is Decision.PASS and b and a.held
    third = limiter.acquire("uploads")
    assert not third and third.decision is Decision.REJECT and not third.held
    a.release()
    assert not a.held
    with limiter.acquire("uploads") as c:
        assert c.decision is Decision.PASS
    # c went back on leaving the block: one more fits beside b.
    d = limiter.acquire("uploads")
    assert d.decision is Decision.PASS
    b.release()
    d.release()


def test_releasing_twice_gives_back_once(limiter):
    a = limiter.acquire("uploads")
    b = limiter.acquire("uploads")
    a.release()
    a.release()
    c = limiter.acquire("uploads")
    assert c.decision is Decision.PASS
    # Kept in a name: a Slot nobody holds is given back at once.
    d = limiter.acquire("uploads")
    assert d.decision is Decision.REJECT
    b.release()
    c.release()


def test_a_slot_dropped_unreleased_goes_back_when_collected(limiter):
    for _ in range(5):
        limiter.acquire("uploads")
        gc.collect()
    assert limiter.acquire("uploads")


def test_each_key_has_its_own_slots(limiter):
    alice = limiter.acquire("per_client", key="alice")
    assert alice.decision is Decision.PASS
    assert limiter.acquire("per_client", key="alice").decision is Decision.REJECT
    bob = limiter.acquire("per_client", key=b"bob")
    assert bob.decision is Decision.PASS
    assert limiter.acquire("per_client").decision is Decision.NO_KEY


def test_unknown_names_pass_and_other_quotas_are_refused(limiter):
    assert limiter.acquire("nobody").decision is Decision.UNKNOWN
    with pytest.raises(SluiceError, match="not an in-flight quota"):
        limiter.acquire("rate")


def test_a_slot_can_be_released_after_the_limiter_closed():
    lim = sluice.Limiter(capacity=100)
    lim.load_quotas(QUOTAS)
    slot = lim.acquire("uploads")
    lim.close()
    slot.release()
    with pytest.raises(SluiceError, match="closed"):
        lim.acquire("uploads")
