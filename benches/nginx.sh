#!/usr/bin/env bash
# `make bench-nginx`: nginx throughput and latency with wrk on 127.0.0.1.
#
# The same static file (612 bytes, keepalive) is served by one nginx
# (2 workers) with: (a) no limit, (b) limit_req with a zone and a rate
# that never limits, (c) sluice with a quota that never rejects, and
# more sluice cases (a depth-3 chain, a name built from variables, the
# RateLimit headers, a quota that rejects everything). The cases are
# interleaved over ROUNDS rounds, in a new random order each round, and
# the median is reported, so slow drifts of a shared machine hit them
# alike. Then (d) the same sluice
# check with every quota root hung (SIGSTOP), (e) synced with a live root
# every 200 ms, and (f) 20 `nginx -s reload` during a wrk run, counting
# failed requests. Prints Markdown.
#
# Each row is the median over the rounds of: wrk's requests/s and latency
# percentiles, and the CPU time nginx's workers spent per request
# (/proc/<pid>/stat), the steadiest of the three on a shared machine.
#
# (c) is measured twice in every round: the second, "(c) again", is an
# A/A control that shows how far two measurements of the same thing land
# apart here, the yardstick for reading the other differences (p99 most).
#
# Bounded: DURATION seconds per measurement (default 4), ROUNDS (11),
# CONNECTIONS (64), WORKERS (2), one wrk thread. PIN=1 pins wrk to CPU 0
# and the nginx workers to the other CPUs (use with WORKERS=1 on two
# cores), so the two do not preempt each other and latency is steadier.

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
nginx=$repo/build/nginx/sbin/nginx
module=$repo/build/nginx/modules/ngx_http_sluice_module.so
sluice=$repo/target/release/sluice
duration=${DURATION:-4}
rounds=${ROUNDS:-11}
connections=${CONNECTIONS:-64}
workers=${WORKERS:-2}
pin=${PIN:-0}
wrk=(wrk)
affinity=
if [[ $pin == 1 ]]; then
    wrk=(taskset -c 0 wrk)
    # One mask per worker: CPU 1, 2, ... (wrapping past the last CPU).
    cpus=$(nproc)
    for ((i = 0; i < workers; i++)); do
        # nginx masks are binary, lowest CPU rightmost: CPU k is 1 and k zeros.
        affinity+=" 1$(printf '%0*d' $((1 + i % (cpus - 1))) 0)"
    done
    affinity="worker_cpu_affinity$affinity;"
fi

command -v wrk >/dev/null || { echo "bench-nginx: wrk not found (make deps)" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d)
chmod 0755 "$dir"
# Two nginx prefixes: "a" (standalone, then with a live root) and "b"
# (every root hung), running side by side.
for p in a b; do
    mkdir -p "$dir/$p/conf" "$dir/$p/logs" "$dir/$p/html"
    head -c 612 /dev/zero | tr '\0' 'x' >"$dir/$p/html/file.txt"
done
mkdir -p "$dir/root" "$dir/logs"
chmod -R a+rX "$dir"
declare -A PORT=([a]=$(free_port) [b]=$(free_port))
root_port=$(free_port)
root_url=http://127.0.0.1:$root_port
root_pid=
hung_pids=()

stop_nginx() { # prefix
    "$nginx" -p "$dir/$1/" -c "$dir/$1/conf/nginx.conf" -s stop 2>/dev/null || true
    sleep 0.5
}
cleanup() {
    stop_nginx a
    stop_nginx b
    for p in $root_pid "${hung_pids[@]}"; do
        kill -CONT "$p" 2>/dev/null || true
        kill "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

start_root() { # port db -> pid on stdout
    "$sluice" root --listen "127.0.0.1:$1" --db "sqlite://$2" --reload-interval 200ms \
        >>"$dir/logs/root.log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$1/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
    echo "$pid"
}

cat >"$dir/quotas.json" <<'EOF'
{"quotas": [
  {"name": "pass", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "reject", "limit": 0, "low_burst": 0, "high_burst": 0},
  {"name": "top", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "mid", "parent": "top", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "leaf", "parent": "mid", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "s3_photos_read", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9}
]}
EOF

# nginx.conf of prefix $1 with the extra http-level sluice lines $2.
write_conf() {
    cp "$dir/quotas.json" "$dir/$1/conf/quotas.json"
    cat >"$dir/$1/conf/nginx.conf" <<EOF
load_module $module;
worker_processes $workers;
$affinity
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    sluice_zone 32m;
    sluice_quotas quotas.json;
    $2
    limit_req_zone \$binary_remote_addr zone=perip:10m rate=100000000r/s;
    server {
        listen 127.0.0.1:${PORT[$1]};
        root html;
        location = /none { try_files /file.txt =404; }
        location = /limit_req { limit_req zone=perip burst=100000000 nodelay; try_files /file.txt =404; }
        location = /sluice { sluice pass; try_files /file.txt =404; }
        location = /sluice_chain { sluice leaf; try_files /file.txt =404; }
        location = /sluice_vars { set \$rw read; sluice s3_\${arg_b}_\${rw}; try_files /file.txt =404; }
        location = /sluice_headers { sluice pass; sluice_headers on; try_files /file.txt =404; }
        location = /sluice_reject { sluice reject; sluice_log_level info; try_files /file.txt =404; }
        location = /sluice_synced { sluice synced; try_files /file.txt =404; }
    }
}
EOF
}

start_nginx() { # prefix extra-lines settle-seconds
    write_conf "$1" "$2"
    "$nginx" -p "$dir/$1/" -c "$dir/$1/conf/nginx.conf"
    sleep "${3:-0.5}"
}

# CPU time (user + system, clock ticks) of nginx $1's workers so far.
worker_ticks() {
    local master total=0 pid
    master=$(cat "$dir/$1/logs/nginx.pid")
    for pid in $(pgrep -P "$master"); do
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo "$total"
}

# wrk against nginx $1, path $2, for $3 seconds; prints "rps p50 p99
# non2xx errors total cpu_us_per_request".
measure() {
    local out before after
    before=$(worker_ticks "$1")
    out=$("${wrk[@]}" -t1 -c"$connections" -d"${3:-$duration}s" --latency "http://127.0.0.1:${PORT[$1]}$2")
    after=$(worker_ticks "$1")
    awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
        /^Requests\/sec/ { rps = $2 }
        $1 == "50%" { p50 = $2 }
        $1 == "99%" { p99 = $2 }
        /Non-2xx/ { non2xx = $NF }
        /Socket errors/ { gsub(",", ""); errors = $4 + $6 + $8 + $10 }
        / requests in / { total = $1 }
        END { printf "%s %s %s %d %d %d %.2f\n", rps, p50, p99, non2xx, errors, total,
                     total ? ticks / hz * 1e6 / total : 0 }
    ' <<<"$out"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# Latency in microseconds from wrk's "1.23ms" / "456.00us" / "1.2s".
to_us() {
    awk '{ v = $1; if (v ~ /us$/) { sub("us", "", v); print v }
           else if (v ~ /ms$/) { sub("ms", "", v); print v * 1000 }
           else if (v ~ /s$/) { sub("s", "", v); print v * 1000000 } }'
}

declare -A RPS P50 P99 NON2XX ERRORS TOTAL CPU
record() { # case "rps p50 p99 non2xx errors total cpu"
    local rps p50 p99 non2xx errors total cpu
    read -r rps p50 p99 non2xx errors total cpu <<<"$2"
    TOTAL[$1]=$(( ${TOTAL[$1]:-0} + total ))
    CPU[$1]+="$cpu "
    RPS[$1]+="$rps "
    P50[$1]+="$(to_us <<<"$p50") "
    P99[$1]+="$(to_us <<<"$p99") "
    NON2XX[$1]+="$non2xx "
    ERRORS[$1]+="$errors "
}
row() { # label case
    local rps p50 p99 cpu
    rps=$(tr ' ' '\n' <<<"${RPS[$2]}" | grep . | median)
    p50=$(tr ' ' '\n' <<<"${P50[$2]}" | grep . | median)
    p99=$(tr ' ' '\n' <<<"${P99[$2]}" | grep . | median)
    cpu=$(tr ' ' '\n' <<<"${CPU[$2]}" | grep . | median)
    # Reloads replace the workers whose CPU time is read: no figure.
    [[ $2 == reloads* ]] && cpu=—
    printf '| %s | %.0f | %.0f | %.0f | %s | %s | %s |\n' "$1" "$rps" "$p50" "$p99" "$cpu" \
        "$(tr -s ' ' <<<"${NON2XX[$2]% }")" "$(tr -s ' ' <<<"${ERRORS[$2]% }")"
}

cases=(none limit_req sluice sluice_chain "sluice_vars?b=photos" sluice_headers sluice_reject)

echo "bench-nginx: $workers workers${affinity:+ ($affinity wrk on CPU 0)}, $connections connections, ${duration}s x $rounds rounds per case" >&2
# (d): every root hung. Two roots, both stopped with SIGSTOP after they
# started: connections are accepted by the kernel and never answered.
hung_urls=
for _ in 1 2; do
    p=$(free_port)
    hung_pids+=("$(start_root "$p" "$dir/root/hung-$p.db")")
    hung_urls+="http://127.0.0.1:$p "
done
kill -STOP "${hung_pids[@]}"
start_nginx a ""
start_nginx b "sluice_root $hung_urls; sluice_sync_interval 1s;" 3
"${wrk[@]}" -t1 -c"$connections" -d2s "http://127.0.0.1:${PORT[a]}/none" >/dev/null    # warm up
# Each round runs the cases in a new random order: a case's place in the
# round shifts its numbers by several percent here (a measurement after a
# light one runs faster), which a fixed order would turn into a bias.
for r in $(seq "$rounds"); do
    for c in $(printf '%s\n' "${cases[@]}" sluice_again hung | shuf); do
        case $c in
        sluice_again) record "$c" "$(measure a /sluice)" ;;
        hung) record "$c" "$(measure b /sluice)" ;;
        *) record "$c" "$(measure a "/$c")" ;;
        esac
    done
done
stop_nginx a
stop_nginx b

# (e) and (f): a live root.
root_pid=$(start_root "$root_port" "$dir/root/live.db")
# Leaks 1 unit/s with room for 1e12: its level at the root counts requests.
"$sluice" quota set synced --create --limit 1 --low-burst 1e12 --high-burst 2e12 --root "$root_url" >/dev/null
start_nginx a "sluice_root $root_url; sluice_sync_interval 200ms;" 1.5
for r in $(seq "$rounds"); do
    record "synced" "$(measure a /sluice_synced)"
done
sleep 1
level=$("$sluice" quota get synced --root "$root_url" --json |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin).get("level", 0)))')

reload_secs=$((20 / 2 + 4))
# The same with no limit: socket errors there are nginx's own (old
# workers close idle keepalive connections), not sluice's.
for path in /sluice_synced /none; do
    ( sleep 2; for _ in $(seq 20); do "$nginx" -p "$dir/a/" -c "$dir/a/conf/nginx.conf" -s reload; sleep 0.5; done ) &
    reloader=$!
    record "reloads$path" "$(measure a "$path" "$reload_secs")"
    wait "$reloader"
done

printf '| case | requests/s | p50 µs | p99 µs | nginx CPU µs/request | non-2xx per round | socket errors per round |\n|---|---|---|---|---|---|---|\n'
row '(a) no limit' none
row '(b) `limit_req`, rate never reached' limit_req
row '(c) `sluice`, quota never rejects' sluice
row '(c) again, A/A control' sluice_again
row '`sluice`, depth-3 chain' sluice_chain
row '`sluice`, name from variables' 'sluice_vars?b=photos'
row '`sluice`, RateLimit headers on' sluice_headers
row '`sluice`, every request rejected (429)' sluice_reject
row '(d) `sluice`, both roots hung (SIGSTOP)' hung
row '(e) `sluice`, synced with a root every 200 ms' synced
row '(f) (e) while nginx reloads 20 times' reloads/sluice_synced
row '(f) control: no limit while nginx reloads 20 times' reloads/none
# Ratios of two cases within each round (measured a few seconds apart), so
# drifts of the machine cancel; the median over rounds.
paired() { # label array-name case-x case-y
    local -n values=$2
    local x=(${values[$3]}) y=(${values[$4]}) i
    for i in "${!x[@]}"; do
        awk -v x="${x[$i]}" -v y="${y[$i]}" 'BEGIN { if (y > 0) printf "%.3f\n", x / y }'
    done | median | xargs printf '| %s | %s |\n' "$1"
}
echo
printf '| paired per round, median | ratio |\n|---|---|\n'
paired '(c)/(a) requests/s' RPS sluice none
paired '(c)/(b) requests/s' RPS sluice limit_req
paired '(c) again/(c) requests/s (A/A)' RPS sluice_again sluice
paired '(c)/(a) CPU per request' CPU sluice none
paired '(c)/(b) CPU per request' CPU sluice limit_req
paired '(c) again/(c) CPU per request (A/A)' CPU sluice_again sluice
paired '(d)/(c) p99' P99 hung sluice
paired '(c) again/(c) p99 (A/A)' P99 sluice_again sluice
echo
echo "p99 µs of each round, in order:"
for c in none sluice sluice_again hung; do
    echo "- $c: ${P99[$c]% }"
done
echo
echo "Requests wrk completed in the (e) rounds: ${TOTAL[synced]}; the root's level of their quota" \
    "just after (it leaks 1 unit/s): $level."

