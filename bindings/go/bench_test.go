package sluice

import "testing"

// BenchmarkCheck is the per-call cost of a check from Go (one hot quota,
// standalone, never full), for benches/bindings/run.sh:
// go test -run '^$' -bench Check -count 7
func BenchmarkCheck(b *testing.B) {
	lim, err := New(Config{"capacity": 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer lim.Close()
	if err := lim.LoadQuotas(`{"quotas": [{"name": "bench_hot", "limit": 1e12, "low_burst": 1e15, "high_burst": 1e15}]}`); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r, _ := lim.Check("bench_hot", 1); r != Pass {
			b.Fatalf("check %d: %v", i, r)
		}
	}
}
