package sluice

import (
	"testing"
	"time"
)

// BenchmarkCheck is the per-call cost of a check from Go (one hot quota,
// standalone, never full), for benches/bindings/run.sh:
// go test -run '^$' -bench Check -count 7
func BenchmarkCheck(b *testing.B) {
	lim, err := New(Config{"capacity": 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer lim.Close()
	if err := lim.LoadQuotas(benchQuotas); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r, _ := lim.Check("bench_hot", 1); r != Pass {
			b.Fatalf("check %d: %v", i, r)
		}
	}
}

// The same hot quota, and a per-key one with a hot key.
const benchQuotas = `{"quotas": [
  {"name": "bench_hot", "limit": 1e12, "low_burst": 1e15, "high_burst": 1e15},
  {"name": "bench_key", "limit": 1e12, "low_burst": 1e15, "high_burst": 1e15, "per_key": true}
]}`

func benchLimiter(b *testing.B) *Limiter {
	lim, err := New(Config{"capacity": 1000})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lim.Close() })
	if err := lim.LoadQuotas(benchQuotas); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	return lim
}

// BenchmarkCheckKey: a hot key of a per-key quota.
func BenchmarkCheckKey(b *testing.B) {
	lim := benchLimiter(b)
	for i := 0; i < b.N; i++ {
		if r, _ := lim.CheckKey("bench_key", "user-1", 1); r != Pass {
			b.Fatalf("check %d: %v", i, r)
		}
	}
}

// BenchmarkObtain: a grant of 1 from a quota that never fills.
func BenchmarkObtain(b *testing.B) {
	lim := benchLimiter(b)
	for i := 0; i < b.N; i++ {
		if n, _, _ := lim.Obtain("bench_hot", 1); n != 1 {
			b.Fatalf("obtain %d: %d", i, n)
		}
	}
}

// BenchmarkReserve: a reservation of 1 that never waits.
func BenchmarkReserve(b *testing.B) {
	lim := benchLimiter(b)
	for i := 0; i < b.N; i++ {
		if _, r, _ := lim.Reserve("bench_hot", 1, time.Second); r != Pass {
			b.Fatalf("reserve %d: %v", i, r)
		}
	}
}
