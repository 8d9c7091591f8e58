package sluice

import (
	"runtime"
	"strings"
	"testing"
)

const inFlightQuotas = `{"quotas": [
  {"name": "uploads", "limit": 2, "in_flight": true},
  {"name": "per_client", "limit": 1, "in_flight": true, "per_key": true},
  {"name": "rate", "limit": 1}
]}`

func inFlight(t *testing.T) *Limiter {
	t.Helper()
	lim, err := New(Config{"capacity": 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	if err := lim.LoadQuotas(inFlightQuotas); err != nil {
		t.Fatal(err)
	}
	return lim
}

func TestTwoSlotsTakeTwoAndAReleaseLetsTheThirdIn(t *testing.T) {
	lim := inFlight(t)
	a, ra, _ := lim.Acquire("uploads")
	b, rb, _ := lim.Acquire("uploads")
	c, rc, err := lim.Acquire("uploads")
	if ra != Pass || rb != Pass || a == nil || b == nil {
		t.Fatalf("two slots: %v %v", ra, rb)
	}
	if rc != Reject || c != nil || err != nil {
		t.Fatalf("a third: %v %v %v", rc, c, err)
	}
	a.Release()
	a.Release() // once only
	c, rc, _ = lim.Acquire("uploads")
	if rc != Pass {
		t.Fatalf("after a release: %v", rc)
	}
	if _, r, _ := lim.Acquire("uploads"); r != Reject {
		t.Fatalf("a second Release gave back more: %v", r)
	}
	b.Release()
	c.Release()
	var none *Slot
	none.Release() // a nil Slot is a no-op
}

func TestEachKeyHasItsOwnSlots(t *testing.T) {
	lim := inFlight(t)
	alice, r, _ := lim.AcquireKey("per_client", "alice")
	if r != Pass {
		t.Fatalf("alice: %v", r)
	}
	if _, r, _ := lim.AcquireKey("per_client", "alice"); r != Reject {
		t.Fatalf("alice twice: %v", r)
	}
	bob, r, _ := lim.AcquireKey("per_client", "bob")
	if r != Pass {
		t.Fatalf("bob: %v", r)
	}
	if s, r, _ := lim.AcquireKey("per_client", ""); r != NoKey || s != nil {
		t.Fatalf("no key: %v %v", r, s)
	}
	alice.Release()
	bob.Release()
}

func TestAcquireRefusesAQuotaThatIsNotInFlight(t *testing.T) {
	lim := inFlight(t)
	if s, r, err := lim.Acquire("nobody"); r != Unknown || s != nil || err != nil {
		t.Fatalf("unknown: %v %v %v", r, s, err)
	}
	_, _, err := lim.Acquire("rate")
	if err == nil || !strings.Contains(err.Error(), "not an in-flight quota") {
		t.Fatalf("rate: %v", err)
	}
}

func TestADroppedSlotGoesBackWhenCollected(t *testing.T) {
	lim := inFlight(t)
	for i := 0; i < 2; i++ {
		if _, r, _ := lim.Acquire("uploads"); r != Pass {
			t.Fatalf("slot %d: %v", i, r)
		}
	}
	for i := 0; i < 50; i++ {
		runtime.GC()
		if s, r, _ := lim.Acquire("uploads"); r == Pass {
			s.Release()
			return
		}
	}
	t.Fatal("dropped slots never came back")
}
