package sluice

import (
	"strings"
	"testing"
	"time"
)

// A per-key quota, a frozen batch quota and a slow one (0.01/s: a unit
// takes 100 s to leak, so waits barely move while a test runs).
const grantQuotas = `{"quotas": [
  {"name": "per_user", "limit": 0.001, "low_burst": 2, "high_burst": 2, "per_key": true},
  {"name": "batch", "limit": 0, "low_burst": 10, "high_burst": 10},
  {"name": "slow", "limit": 0.01, "low_burst": 1, "high_burst": 1}
]}`

func withGrantQuotas(t *testing.T) *Limiter {
	t.Helper()
	lim, err := New(Config{"capacity": 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	if err := lim.LoadQuotas(grantQuotas); err != nil {
		t.Fatal(err)
	}
	return lim
}

func TestAKeyHasItsOwnCounter(t *testing.T) {
	lim := withGrantQuotas(t)
	var got []string
	for _, key := range []string{"alice", "alice", "alice", "bob", ""} {
		r, err := lim.CheckKey("per_user", key, 1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.String())
	}
	expect(t, strings.Join(got, " "), "PASS PASS REJECT PASS NO_KEY")
	if r, _ := lim.Check("per_user", 1); r != NoKey || !r.Allowed() {
		t.Fatalf("a per-key quota without a key: %v", r)
	}
}

func TestObtainGrantsWhatIsLeft(t *testing.T) {
	lim := withGrantQuotas(t)
	type grant struct {
		n uint64
		r Result
	}
	var got []grant
	for _, want := range []uint64{5, 100, 1} {
		n, r, err := lim.Obtain("batch", want)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, grant{n, r})
	}
	if got[0] != (grant{5, Pass}) || got[1] != (grant{5, Pass}) || got[2] != (grant{0, Reject}) {
		t.Fatalf("grants %v", got)
	}
	if n, r, err := lim.Obtain("nothing_here", 3); n != 0 || r != Unknown || err != nil {
		t.Fatalf("unknown quota: %d %v %v", n, r, err)
	}
	if n, r, err := lim.ObtainKey("per_user", "carol", 5); n != 2 || r != Pass || err != nil {
		t.Fatalf("a key's grant: %d %v %v", n, r, err)
	}
	if _, _, err := lim.Obtain("batch", 0); err == nil || !strings.Contains(err.Error(), "want") {
		t.Fatalf("asking for nothing: %v", err)
	}
}

func TestReserveSpacesRequestsAtTheRate(t *testing.T) {
	lim := withGrantQuotas(t)
	wait, r, err := lim.Reserve("slow", 1, time.Second)
	if err != nil || r != Pass || wait != 0 {
		t.Fatalf("first: %v %v %v", wait, r, err)
	}
	wait, r, _ = lim.Reserve("slow", 1, 1000*time.Second)
	if r != Pass || wait <= 99*time.Second || wait > 100*time.Second {
		t.Fatalf("the next waits a unit's worth, 100 s: %v %v", wait, r)
	}
	wait, r, _ = lim.Reserve("slow", 1, 10*time.Second)
	if r != Reject || wait <= 199*time.Second || wait > 200*time.Second {
		t.Fatalf("past max_wait it is refused: %v %v", wait, r)
	}
	if wait, r, _ = lim.Reserve("slow", 2, time.Hour); r != Reject || wait != Never {
		t.Fatalf("above high_burst: %v %v", wait, r)
	}
	if wait, r, _ = lim.ReserveKey("per_user", "dave", 1, time.Second); r != Pass || wait != 0 {
		t.Fatalf("a key: %v %v", wait, r)
	}
	if wait, r, _ = lim.Reserve("nothing_here", 1, time.Second); r != Unknown || wait != 0 {
		t.Fatalf("unknown: %v %v", wait, r)
	}
}

func TestTheNewCallsFailOnAClosedLimiter(t *testing.T) {
	lim := withGrantQuotas(t)
	lim.Close()
	if _, err := lim.CheckKey("per_user", "a", 1); err != ErrClosed {
		t.Fatal(err)
	}
	if _, _, err := lim.Obtain("batch", 1); err != ErrClosed {
		t.Fatal(err)
	}
	if _, _, err := lim.Reserve("slow", 1, time.Second); err != ErrClosed {
		t.Fatal(err)
	}
}

func TestKeysWithoutRoomShareTheQuotasCounter(t *testing.T) {
	lim, err := New(Config{"capacity": 1000, "key_capacity": 0})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	if err := lim.LoadQuotas(grantQuotas); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, key := range []string{"a", "b", "c"} {
		r, err := lim.CheckKey("per_user", key, 1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.String())
	}
	expect(t, strings.Join(got, " "), "KEY_OVERFLOW KEY_OVERFLOW REJECT")
	if !KeyOverflow.Allowed() {
		t.Fatal("an overflow passes")
	}
}
