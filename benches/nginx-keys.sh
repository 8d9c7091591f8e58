#!/usr/bin/env bash
# `make bench-nginx-keys`: per-key limits in nginx, sluice against
# `limit_req_zone` keyed by the same variable, on 127.0.0.1.
#
# 1. Memory: each zone gets 1 MiB for its keys (limit_req_zone ... 1m;
#    sluice_keys 1m) and a limit that lets one request per key pass and
#    rejects the second (bursts of 1, next to no leak). N distinct keys go
#    in once, more than either zone holds. limit_req keeps the most
#    recently used keys (an LRU list): they are asked again newest first
#    until one passes (its state was gone), and the rejected ones before
#    it are the keys kept. sluice keeps keys per bucket, not as one LRU
#    list, so its count comes from its own metric (`sluice_keys`, the
#    entries in use), checked against the same newest-first probe (a lower
#    bound for it). Keys of 16 and of 64 bytes (limit_req stores the key
#    whole; sluice a 64-bit hash).
# 2. Throughput: wrk sends each request with a key drawn at random from
#    KEYS (1,000,000) distinct ones (an X-Key header, a Lua script), to a
#    location limited by limit_req_zone $http_x_key and to one limited by
#    `sluice per_key key=$http_x_key`, both with limits that never reject,
#    zones large enough for every key. ROUNDS paired rounds of DURATION
#    seconds, the order flipped each round; the median of each and of the
#    per-round ratio are printed.
#
# Bounded: N (default 60000) keys per memory run, ROUNDS (default 7) of
# DURATION (default 4) seconds, CONNECTIONS (64), 2 workers, one wrk
# thread. Prints Markdown.

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
nginx=$repo/build/nginx/sbin/nginx
module=$repo/build/nginx/modules/ngx_http_sluice_module.so
n=${N:-60000}
keys=${KEYS:-1000000}
rounds=${ROUNDS:-7}
duration=${DURATION:-4}
connections=${CONNECTIONS:-64}

command -v wrk >/dev/null || { echo "bench-nginx-keys: wrk not found (make deps)" >&2; exit 1; }

dir=$(mktemp -d)
chmod 0755 "$dir"
mkdir -p "$dir/conf" "$dir/logs" "$dir/html"
head -c 612 /dev/zero | tr '\0' 'x' >"$dir/html/file.txt"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
    "$nginx" -p "$dir/" -c "$dir/conf/nginx.conf" -s stop 2>/dev/null || true
    sleep 0.5
    rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/conf/quotas.json" <<'EOF'
{"quotas": [
  {"name": "one_each", "limit": 0.0001, "low_burst": 1, "high_burst": 1, "per_key": true},
  {"name": "never", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9, "per_key": true}
]}
EOF

# nginx with the memory zones ($1 = 1) or the throughput zones.
start_nginx() {
    local lr_size keys_size
    if [[ $1 == memory ]]; then lr_size=1m; keys_size=1m; else lr_size=256m; keys_size=128m; fi
    cat >"$dir/conf/nginx.conf" <<EOF
load_module $module;
worker_processes 2;
error_log logs/error.log crit;
pid logs/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    sluice_zone 1m;
    sluice_keys $keys_size;
    sluice_quotas quotas.json;
    limit_req_zone \$http_x_key zone=keys:$lr_size rate=1r/m;
    limit_req_zone \$http_x_key zone=fast:$lr_size rate=100000000r/s;
    limit_req_status 429;
    sluice_log_level info;
    limit_req_log_level info;
    server {
        listen 127.0.0.1:$port;
        root html;
        location = /mem/lr { alias html/file.txt; limit_req zone=keys; }
        location = /mem/sluice { alias html/file.txt; sluice one_each key=\$http_x_key; }
        location = /lr { alias html/file.txt; limit_req zone=fast burst=1000000 nodelay; }
        location = /sluice { alias html/file.txt; sluice never key=\$http_x_key; }
        location = /metrics { sluice_metrics; }
    }
}
EOF
    "$nginx" -p "$dir/" -c "$dir/conf/nginx.conf" -s stop 2>/dev/null || true
    sleep 0.5
    "$nginx" -p "$dir/" -c "$dir/conf/nginx.conf"
    sleep 0.5
}

# N keys of $2 bytes to location $1, then the newest again until one
# passes: prints how many were rejected first (still held).
kept() {
    python3 - "$port" "$1" "$n" "$2" <<'PY'
import http.client, sys
port, path, n, length = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
conn = http.client.HTTPConnection("127.0.0.1", port)
def status(i):
    conn.request("GET", path, headers={"X-Key": ("%0*d" % (length, i))[-length:]})
    r = conn.getresponse(); r.read()
    return r.status
for i in range(n):
    status(i)
held = 0
for i in reversed(range(n)):
    if status(i) != 429:
        break
    held += 1
print(held)
PY
}

# Live keys in sluice's key section, from its metrics.
sluice_live() {
    curl -fsS "http://127.0.0.1:$port/metrics" | awk '/^sluice_keys / { print $2 }'
}

echo "### Keys per MiB ($n distinct keys, twice, into 1 MiB)"
echo
echo "| key length | limit_req_zone: keys kept | bytes per key | sluice_keys: keys in use | bytes per key |"
echo "|---|---|---|---|---|"
for length in 16 64; do
    start_nginx memory
    lr=$(kept /mem/lr "$length")
    start_nginx memory
    python3 - "$port" "$n" "$length" <<'PY'
import http.client, sys
port, n, length = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port)
for i in range(n):
    conn.request("GET", "/mem/sluice", headers={"X-Key": ("%0*d" % (length, i))[-length:]})
    conn.getresponse().read()
PY
    sk=$(sluice_live)
    printf '| %s bytes | %s | %.0f | %s | %.0f |\n' "$length" "$lr" \
        "$(echo "1048576 / $lr" | bc -l)" "$sk" "$(echo "1048576 / $sk" | bc -l)"
done
echo

cat >"$dir/keys.lua" <<EOF
local keys = $keys
math.randomseed(os.time())
request = function()
    return wrk.format("GET", nil, { ["X-Key"] = "token-" .. math.random(1, keys) })
end
EOF

start_nginx throughput
# Warm both zones with every key once at full speed for a few seconds.
wrk -t1 -c"$connections" -d2s -s "$dir/keys.lua" "http://127.0.0.1:$port/lr" >/dev/null
wrk -t1 -c"$connections" -d2s -s "$dir/keys.lua" "http://127.0.0.1:$port/sluice" >/dev/null
rps() {
    wrk -t1 -c"$connections" -d"${duration}s" -s "$dir/keys.lua" "http://127.0.0.1:$port$1" |
        awk '/Requests\/sec/ { print $2 }'
}
lrs=() sks=() ratios=()
for ((r = 0; r < rounds; r++)); do
    if ((r % 2 == 0)); then a=$(rps /lr); b=$(rps /sluice); else b=$(rps /sluice); a=$(rps /lr); fi
    lrs+=("$a") sks+=("$b")
    ratios+=("$(echo "$b / $a" | bc -l)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "### Throughput, a random key of $keys per request ($rounds paired rounds of ${duration} s)"
echo
echo "| | requests/s (median) | all rounds |"
echo "|---|---|---|"
echo "| limit_req_zone \$http_x_key | $(median "${lrs[@]}") | ${lrs[*]} |"
echo "| sluice per_key key=\$http_x_key | $(median "${sks[@]}") | ${sks[*]} |"
printf '| sluice / limit_req, per round | %.3f (median) | %s |\n' "$(median "${ratios[@]}")" \
    "$(printf '%.3f ' "${ratios[@]}")"
