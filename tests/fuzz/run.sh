#!/usr/bin/env bash
# Runs fuzz targets built by `make fuzz-build`, each for a bounded time,
# and prints executions per second, executions and crashes per target.
#
#   run.sh BIN_DIR WORK_DIR SECONDS TARGET...
#
# Each target reads the committed corpus (tests/fuzz/corpus/TARGET) and
# writes what it learns to WORK_DIR/corpus/TARGET (libFuzzer writes new
# inputs to its first corpus directory only), so the committed corpus is
# never changed by a run. A crashing input is kept in
# WORK_DIR/artifacts/TARGET/; the target's log is WORK_DIR/TARGET.log.
# Exits non-zero if any target crashed, timed out or ran out of memory.
set -euo pipefail

bins=$1 work=$2 seconds=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
passed=0
failed=0
stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }

printf '%-10s %10s %12s %8s\n' target "exec/s" executions crashes
for t in "$@"; do
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
    rm -f "$work/artifacts/$t"/*
    log=$work/$t.log
    rc=0
    "$bins/$t" "$work/corpus/$t" "$here/corpus/$t" \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/$t/" >"$log" 2>&1 || rc=$?
    crashes=$(find "$work/artifacts/$t" -type f | wc -l)
    printf '%-10s %10s %12s %8s\n' "$t" "$(stat average_exec_per_sec "$log")" \
        "$(stat number_of_executed_units "$log")" "$crashes"
    if [ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "--- $t failed (exit $rc); the end of $log:" >&2
        grep -v '^#[0-9]' "$log" | tail -25 >&2
        for a in "$work/artifacts/$t"/*; do
            [ -e "$a" ] && echo "reproduce: $bins/$t $a" >&2
        done
    fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
