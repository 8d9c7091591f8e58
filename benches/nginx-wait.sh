#!/usr/bin/env bash
# `make bench-nginx-wait`: `sluice <name> wait=1s` under a steady load of
# twice the limit, beside the plain check under the same load.
#
# One nginx (WORKERS workers, default 2) serves a 612-byte file behind two
# quotas of LIMIT/s (default 100) with a burst of LIMIT/10: /wait checks
# its quota with `wait=1s`, /plain its own without. benches/wait_load.py
# offers 2 x LIMIT requests/s, open loop, each on a new connection, for
# DURATION seconds (default 30), to each case in turn, ROUNDS times
# (default 3, alternating which goes first); the quotas drain between
# runs. Per run it reports what was admitted (200), the rate at which
# 200s completed after the first 2 s (what a backend behind nginx sees)
# against the limit, the rejections, the latency of each outcome, the
# longest hold nginx logged ($request_time of DELAYED requests), and the
# CPU time the workers spent per request (/proc/<pid>/task/*/schedstat)
# and how often they slept and woke (voluntary context switches).
# Two more cases under the same load measure what a 200 alone costs
# (/pass: a quota that never rejects) and a 429 alone (/reject: limit 0),
# so that each wait/plain run's CPU is also shown against what its own mix
# of 200s and 429s costs without any hold. nginx's own `limit_req` with
# `burst=LIMIT delay=LIMIT/10` (delaying up to a second, like wait=1s) is
# measured alike as a yardstick. A last case, /coalesce, is /wait with
# `sluice_wait_coalesce COALESCE` (default 10ms): holds may end that much
# early on a wakeup the worker has anyway. Prints Markdown.

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
nginx=$repo/build/nginx/sbin/nginx
module=$repo/build/nginx/modules/ngx_http_sluice_module.so
limit=${LIMIT:-100}
duration=${DURATION:-30}
rounds=${ROUNDS:-3}
workers=${WORKERS:-2}
coalesce=${COALESCE:-10ms}
# The cases each round runs, in this order in odd rounds and reversed in
# even ones (pass and reject first when present: the mix column needs
# them).
read -r -a cases <<<"${CASES:-pass reject wait plain coalesce limit_req}"
burst=$((limit / 10))
rate=$((limit * 2))

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d)
chmod 0755 "$dir"
mkdir -p "$dir/conf" "$dir/logs" "$dir/html"
head -c 612 /dev/zero | tr '\0' 'x' >"$dir/html/file.txt"
chmod -R a+rX "$dir"
port=$(free_port)

cleanup() {
    "$nginx" -p "$dir/" -c "$dir/conf/nginx.conf" -s stop 2>/dev/null || true
    sleep 0.5
    # nginx's error log outlives the run, for a look at anything odd.
    cp "$dir/logs/error.log" "${TMPDIR:-/tmp}/nginx-wait-bench-error.log" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/conf/quotas.json" <<EOF
{"quotas": [
  {"name": "paced", "limit": $limit, "low_burst": $burst, "high_burst": $burst},
  {"name": "plain", "limit": $limit, "low_burst": $burst, "high_burst": $burst},
  {"name": "coalesced", "limit": $limit, "low_burst": $burst, "high_burst": $burst},
  {"name": "open", "limit": 1e9, "low_burst": 1e9, "high_burst": 1e9},
  {"name": "shut", "limit": 0, "low_burst": 0, "high_burst": 0}
]}
EOF
cat >"$dir/conf/nginx.conf" <<EOF
load_module $module;
worker_processes $workers;
worker_rlimit_nofile 65536;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 16384; }
http {
    log_format bench '\$uri \$status \$sluice_status\$limit_req_status \$request_time';
    limit_req_zone \$server_port zone=pace:1m rate=${limit}r/s;
    access_log logs/access.log bench;
    sluice_zone 1m;
    sluice_quotas quotas.json;
    sluice_log_level info;
    server {
        listen 127.0.0.1:$port backlog=4096;
        root html;
        # One of the two is set: sluice's, or limit_req's for /limit_req.
        add_header X-Sluice \$sluice_status\$limit_req_status always;
        location = /wait { sluice paced wait=1s; try_files /file.txt =404; }
        location = /plain { sluice plain; try_files /file.txt =404; }
        location = /coalesce {
            sluice coalesced wait=1s;
            sluice_wait_coalesce $coalesce;
            try_files /file.txt =404;
        }
        location = /pass { sluice open; try_files /file.txt =404; }
        location = /reject { sluice shut; try_files /file.txt =404; }
        # nginx's own pacing, as a yardstick: a burst of one second at the
        # limit, delayed beyond the first LIMIT/10 (as the quota's burst).
        location = /limit_req {
            limit_req zone=pace burst=$limit delay=$burst;
            limit_req_status 429;
            try_files /file.txt =404;
        }
    }
}
EOF
ulimit -n 65536 2>/dev/null || true
"$nginx" -p "$dir/" -c "$dir/conf/nginx.conf"
sleep 0.5

# CPU time (ns, every thread) of the workers so far, from schedstat: the
# clock ticks of /proc/<pid>/stat are too coarse at these rates.
worker_cpu_ns() {
    local pid
    for pid in $(pgrep -P "$(cat "$dir/logs/nginx.pid")"); do
        cat /proc/"$pid"/task/*/schedstat
    done | awk '{ t += $1 } END { printf "%.0f\n", t }'
}

# Times the workers went to sleep and were woken (every thread), so far.
worker_wakeups() {
    local pid
    for pid in $(pgrep -P "$(cat "$dir/logs/nginx.pid")"); do
        cat /proc/"$pid"/task/*/status
    done | awk '/^voluntary_ctxt_switches/ { t += $2 } END { printf "%.0f\n", t }'
}

# One run: case ($1 = wait|plain); prints a Markdown row.
run() {
    local before after json
    : >"$dir/logs/access.log"
    before=$(worker_cpu_ns)
    wakes_before=$(worker_wakeups)
    json=$(python3 "$repo/benches/wait_load.py" --port "$port" --path "/$1" \
        --rate "$rate" --seconds "$duration")
    after=$(worker_cpu_ns)
    wakes_after=$(worker_wakeups)
    python3 - "$1" "$json" $((after - before)) "$limit" "$dir/logs/access.log" "$dir/cost" \
        "$dir/rows" $((wakes_after - wakes_before)) "$round" <<'PY'
import json, sys
case, out, cpu_ns, limit, log, cost_file, rows, wakes, round_no = sys.argv[1:]
out = json.loads(out)
cpu_ns, limit = int(cpu_ns), float(limit)
o = out["outcomes"]
get = lambda k, f: o.get(k, {}).get(f, 0)
admitted = get("200 PASSED", "count") + get("200 DELAYED", "count")
rejected = get("429 REJECTED", "count")
errors = sum(v["count"] for k, v in o.items() if not k.startswith(("200", "429")))
steady = out["steady_200_per_s"]
# "DELAYED-": the access log shows the variable that is not set as "-".
held = [float(l.split()[3]) for l in open(log) if l.split()[2:3] in (["DELAYED"], ["DELAYED-"], ["-DELAYED"])]
cpu_us = cpu_ns / 1e3 / max(1, out["sent"])
# The cost of a 200 and of a 429 alone (the "pass" and "reject" runs):
# what this run's mix of them would cost without any hold.
cost = dict(l.split() for l in open(cost_file)) if case not in ("pass", "reject") else {}
if case in ("pass", "reject"):
    with open(cost_file, "a") as f:
        f.write(f"{case} {cpu_us}\n")
mix = "-"
if "pass" in cost and "reject" in cost and admitted + rejected > 0:
    expected = (admitted * float(cost["pass"]) + rejected * float(cost["reject"])) / max(1, admitted + rejected)
    mix = f"{cpu_us / expected:.2f}x"
with open(rows, "a") as f:
    f.write(f"{round_no} {case} {cpu_us} {mix.rstrip('x') if mix != '-' else 'nan'} "
            f"{int(wakes) / max(1, out['sent'])}\n")
print(f"| {case} | {out['sent']} in {out['send_seconds']} s | {admitted} | "
      f"{steady}/s ({steady / limit * 100 - 100:+.1f}%) | "
      f"{get('200 DELAYED', 'count')} | {rejected} | {errors + out['skipped']} | "
      f"{get('200 DELAYED', 'p99_ms')} / {get('200 DELAYED', 'max_ms')} | "
      f"{max(held) if held else '-'} | {get('429 REJECTED', 'p99_ms')} | {cpu_us:.1f} | {mix} | "
      f"{int(wakes) / max(1, out['sent']):.2f} |")
PY
    sleep 3    # the quota drains (a full bucket plus a second scheduled ahead)
}

echo "limit $limit/s, burst $burst, offered $rate/s for $duration s, $workers workers, $(nproc) CPUs, sluice_wait_coalesce $coalesce on /coalesce"
echo
echo "| case | sent | admitted (200) | 200s/s reaching the backend after 2 s, vs limit | held | rejected (429) | errors | held latency p99 / max, ms | longest \$request_time held, s | 429 latency p99, ms | worker CPU us/request | CPU vs its mix of 200s and 429s without holds | worker wakeups/request |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
: >"$dir/cost"
for ((round = 1; round <= rounds; round++)); do
    # Each round measures what a bare 200 and a bare 429 cost first.
    : >"$dir/cost"
    order=("${cases[@]}")
    if ((round % 2 == 0)); then
        order=()
        for c in "${cases[@]}"; do
            case $c in pass | reject) order=("${order[@]}" "$c") ;; esac
        done
        for ((i = ${#cases[@]} - 1; i >= 0; i--)); do
            case ${cases[i]} in pass | reject) ;; *) order=("${order[@]}" "${cases[i]}") ;; esac
        done
    fi
    for c in "${order[@]}"; do run "$c"; done
done
echo
echo "Medians over the $rounds rounds:"
echo
python3 - "$dir/rows" <<'PY'
import math, statistics, sys
rows, by_round = {}, {}
for line in open(sys.argv[1]):
    round_no, case, cpu, mix, wakes = line.split()
    rows.setdefault(case, []).append((float(cpu), float(mix), float(wakes)))
    by_round.setdefault(round_no, {})[case] = float(cpu)
med = {c: statistics.median(v[0] for v in r) for c, r in rows.items()}
print("| case | worker CPU us/request | CPU vs its mix of 200s and 429s without holds | "
      "worker wakeups/request | CPU vs plain's in the same round: median (min-max) |")
print("|---|---|---|---|---|")
ratios = {}
for c in ("pass", "reject", "plain", "wait", "coalesce", "limit_req"):
    if c not in rows:
        continue
    mixes = [m for _, m, _ in rows[c] if not math.isnan(m)]
    mix = f"{statistics.median(mixes):.2f}x" if mixes else "-"
    wakes = statistics.median(w for _, _, w in rows[c])
    paired = [r[c] / r["plain"] for r in by_round.values() if c in r and "plain" in r]
    ratios[c] = paired
    vs = (f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f})"
          if paired and c != "plain" else "-")
    print(f"| {c} | {med[c]:.1f} | {mix} | {wakes:.2f} | {vs} |")
print()
for c in ("wait", "coalesce", "limit_req"):
    if ratios.get(c):
        print(f"{c} / plain: {med[c] / med['plain']:.2f}x of the medians, "
              f"{statistics.median(ratios[c]):.2f}x the median of the rounds' ratios")
PY
