package sluice

import "testing"

// Token quotas that leak 0.001 unit a second: the level is what was
// counted while a test runs.
const chargeQuotas = `{"quotas": [
  {"name": "tokens", "limit": 0.001, "low_burst": 1000, "high_burst": 1000},
  {"name": "tokens_key", "limit": 0.001, "low_burst": 1000, "high_burst": 1000, "per_key": true}
]}`

func withChargeQuotas(t *testing.T) *Limiter {
	t.Helper()
	lim, err := New(Config{"capacity": 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	if err := lim.LoadQuotas(chargeQuotas); err != nil {
		t.Fatal(err)
	}
	return lim
}

func must(t *testing.T, r Result, err error, want Result, what string) {
	t.Helper()
	if err != nil || r != want {
		t.Fatalf("%s: %v %v, want %v", what, r, err, want)
	}
}

func TestAChargeCountsPastTheLimitAndTheDebtRejects(t *testing.T) {
	lim := withChargeQuotas(t)
	r, err := lim.Charge("tokens", 1500)
	must(t, r, err, Pass, "a charge over the burst")
	r, err = lim.Check("tokens", 0)
	must(t, r, err, Reject, "a check in debt")
	r, err = lim.Charge("tokens", 1)
	must(t, r, err, Pass, "a charge in debt")
}

func TestSettleGivesBackAndChargesTheDifference(t *testing.T) {
	lim := withChargeQuotas(t)
	for i := 0; i < 4; i++ {
		r, err := lim.Check("tokens", 600)
		must(t, r, err, Pass, "an estimate of 600")
		r, err = lim.Settle("tokens", 600, 100)
		must(t, r, err, Pass, "settled at 100")
	}
	r, err := lim.Check("tokens", 700)
	must(t, r, err, Reject, "four settled estimates left 400: 700 does not fit")
	r, err = lim.Settle("tokens", 100, 1000)
	must(t, r, err, Pass, "a cost above the estimate")
	r, err = lim.Check("tokens", 0)
	must(t, r, err, Reject, "is charged: the quota is in debt")
}

func TestKeyedChargesMoveOnlyTheirKey(t *testing.T) {
	lim := withChargeQuotas(t)
	r, err := lim.ChargeKey("tokens_key", "alice", 2000)
	must(t, r, err, Pass, "a keyed charge")
	r, err = lim.CheckKey("tokens_key", "alice", 0)
	must(t, r, err, Reject, "its key is in debt")
	r, err = lim.CheckKey("tokens_key", "bob", 900)
	must(t, r, err, Pass, "another key is not")
	r, err = lim.SettleKey("tokens_key", "bob", 900, 0)
	must(t, r, err, Pass, "a keyed settle")
	r, err = lim.CheckKey("tokens_key", "bob", 900)
	must(t, r, err, Pass, "gave the key its units back")
	r, err = lim.ChargeKey("tokens_key", "", 1)
	must(t, r, err, NoKey, "an empty key")
	r, err = lim.Charge("nothing_here", 1)
	must(t, r, err, Unknown, "an unknown name")
}

func TestChargeAndSettleFailOnAClosedLimiter(t *testing.T) {
	lim := withChargeQuotas(t)
	lim.Close()
	if _, err := lim.Charge("tokens", 1); err != ErrClosed {
		t.Fatal(err)
	}
	if _, err := lim.SettleKey("tokens_key", "a", 1, 2); err != ErrClosed {
		t.Fatal(err)
	}
}
