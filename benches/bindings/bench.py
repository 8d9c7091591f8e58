"""Per-call cost of a check from Python (benches/bindings/run.sh): one hot
quota, standalone, never full. Prints "<call>\t<ns per check>", the median
of ROUNDS rounds: Limiter.check, and the bare ctypes call under it."""

import statistics
import sys
import time

import sluice

ROUNDS = 7
QUOTAS = {"quotas": [
    {"name": "bench_hot", "limit": 1e12, "low_burst": 1e15, "high_burst": 1e15},
    {"name": "bench_key", "limit": 1e12, "low_burst": 1e15, "high_burst": 1e15, "per_key": True},
]}


def median_ns(loop, n):
    loop(n // 10)  # warm up
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter_ns()
        loop(n)
        rounds.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(rounds)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with sluice.Limiter(capacity=1000) as lim:
        lim.load_quotas(QUOTAS)
        assert lim.check("bench_hot") is sluice.Decision.PASS

        def with_limiter(n, check=lim.check):
            for _ in range(n):
                check("bench_hot")

        raw = lim._native.hot.sluice_check

        def bare_ctypes(n, raw=raw):
            for _ in range(n):
                raw(b"bench_hot", 9, 1)

        def with_key(n, check=lim.check):
            for _ in range(n):
                check("bench_key", key="user-1")

        def obtain(n, obtain=lim.obtain):
            for _ in range(n):
                obtain("bench_hot", 1)

        def reserve(n, reserve=lim.reserve):
            for _ in range(n):
                reserve("bench_hot", 1)

        def empty_loop(n):
            for _ in range(n):
                pass

        print(f"Limiter.check(name)\t{median_ns(with_limiter, n):.1f}")
        print(f"ctypes sluice_check(bytes, len, 1)\t{median_ns(bare_ctypes, n):.1f}")
        print(f"Limiter.check(name, key=key)\t{median_ns(with_key, n):.1f}")
        print(f"Limiter.obtain(name, 1)\t{median_ns(obtain, n):.1f}")
        print(f"Limiter.reserve(name, 1)\t{median_ns(reserve, n):.1f}")
        print(f"(the empty Python loop)\t{median_ns(empty_loop, n):.1f}")


if __name__ == "__main__":
    main()
