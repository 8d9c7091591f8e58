#!/usr/bin/env bash
# The per-call cost of a check (and of a keyed check, a grant and a
# reservation) from C, Python, LuaJIT and Go, measured one
# after the other in one run (`make bench-bindings`): the same hot quota,
# standalone, never full, in each language's own bench program. Each
# prints the median of 7 rounds; this script prints a Markdown table for
# BENCHMARKS.md, with the machine and the versions.
#
# Expects `make lib`, the Python venv (build/py-venv with the package
# installed) and the apt packages of `make test-bindings`.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROOT=$PWD
LIB_DIR=$ROOT/target/release
PYTHON=${PYTHON:-$ROOT/build/py-venv/bin/python}
GO=${GO:-go}
N=${N:-2000000}
export SLUICE_LIBRARY=$LIB_DIR/libsluice.so

mkdir -p build
cc -O2 -Wall -Wextra -Werror -Iinclude benches/bindings/bench.c \
    -L"$LIB_DIR" -Wl,-rpath,"$LIB_DIR" -lsluice -o build/bench_bindings_c

row() { printf '| %s | `%s` | %s |\n' "$1" "$2" "$3"; }
rows() {
    local lang=$1
    shift
    while IFS=$'\t' read -r call ns; do row "$lang" "$call" "$ns"; done < <("$@")
}
# go test -bench prints one line per count: name, iterations, ns/op.
go_median() {
    (cd bindings/go && "$GO" test -run '^$' -bench "^Benchmark$1\$" -count 7 .) |
        awk -v name="Benchmark$1" '$1 ~ "^" name "(-[0-9]+)?$" { print $3 }' |
        sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'),"\
    "load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "versions: $(cc --version | head -1); $("$PYTHON" --version); $(luajit -v | cut -d' ' -f1-2);"\
    "$("$GO" version | cut -d' ' -f3)"
echo
echo "| language | call | ns per call (median of 7) |"
echo "|---|---|---|"
rows C build/bench_bindings_c "$N"
rows Python "$PYTHON" benches/bindings/bench.py "$((N / 2))"
rows LuaJIT luajit benches/bindings/bench.lua bindings/lua "$N"
row Go 'lim.Check(name, 1)' "$(go_median Check)"
row Go 'lim.CheckKey(name, key, 1)' "$(go_median CheckKey)"
row Go 'lim.Obtain(name, 1)' "$(go_median Obtain)"
row Go 'lim.Reserve(name, 1, time.Second)' "$(go_median Reserve)"
