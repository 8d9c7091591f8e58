#!/usr/bin/env bash
# `make bench-nginx`: nginx throughput and latency with wrk on 127.0.0.1,
# the same static file served with no limit, with limit_req, and with
# sluice (passing, rejecting, a depth-3 chain, a name built from
# variables, and passing while syncing with a real quota root every
# 200 ms). Every case runs in the same nginx, one after another, so they
# compare side by side. Prints a Markdown table.
#
# Bounded: DURATION seconds per case (default 10), CONNECTIONS (default
# 32), one wrk thread, one nginx worker (the machine has 2 cores: one for
# nginx, one for wrk).

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
nginx=$repo/build/nginx/sbin/nginx
module=$repo/build/nginx/modules/ngx_http_sluice_module.so
sluice=$repo/target/release/sluice
duration=${DURATION:-10}
connections=${CONNECTIONS:-32}
workers=${WORKERS:-1}

command -v wrk >/dev/null || { echo "bench-nginx: wrk not found (make deps)" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d)
chmod 0755 "$dir"
mkdir -p "$dir/conf" "$dir/logs" "$dir/html" "$dir/root"
head -c 612 /dev/zero | tr '\0' 'x' >"$dir/html/file.txt"
chmod -R a+rX "$dir"
port=$(free_port)
root_port=$(free_port)
root_url=http://127.0.0.1:$root_port

cleanup() {
    "$nginx" -p "$dir/" -c "$dir/conf/nginx.conf" -s stop 2>/dev/null || true
    [ -n "${root_pid:-}" ] && kill "$root_pid" 2>/dev/null && wait "$root_pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

"$sluice" root --listen "127.0.0.1:$root_port" --db "sqlite://$dir/root/q.db" \
    --reload-interval 200ms >"$dir/logs/root.log" 2>&1 &
root_pid=$!
for _ in $(seq 100); do curl -fsS "$root_url/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
# Leaks 1 unit/s with room for 1e12: its level at the root counts the requests.
"$sluice" quota set synced --limit 1 --low-burst 1e12 --high-burst 2e12 --root "$root_url" >/dev/null

cat >"$dir/conf/quotas.json" <<'EOF'
{"quotas": [
  {"name": "pass", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "reject", "limit": 0, "low_burst": 0, "high_burst": 0},
  {"name": "top", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "mid", "parent": "top", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "leaf", "parent": "mid", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9},
  {"name": "s3_photos_read", "limit": 1e9, "low_burst": 1e9, "high_burst": 2e9}
]}
EOF

cat >"$dir/conf/nginx.conf" <<EOF
load_module $module;
worker_processes $workers;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    sluice_zone 32m;
    sluice_quotas quotas.json;
    limit_req_zone \$binary_remote_addr zone=perip:10m rate=100000000r/s;
    server {
        listen 127.0.0.1:$port;
        root html;
        location = /none { try_files /file.txt =404; }
        location = /limit_req { limit_req zone=perip burst=100000000 nodelay; try_files /file.txt =404; }
        location = /sluice { sluice pass; try_files /file.txt =404; }
        location = /sluice_reject { sluice reject; sluice_log_level info; try_files /file.txt =404; }
        location = /sluice_chain { sluice leaf; try_files /file.txt =404; }
        location = /sluice_vars { set \$rw read; sluice s3_\${arg_b}_\${rw}; try_files /file.txt =404; }
        location = /sluice_headers { sluice pass; sluice_headers on; try_files /file.txt =404; }
    }
}
EOF
"$nginx" -p "$dir/" -c "$dir/conf/nginx.conf"
sleep 0.5

# Runs wrk against $1; prints "requests/s|p50|p99|non-2xx".
measure() {
    local out
    out=$(wrk -t1 -c"$connections" -d"${duration}s" --latency "http://127.0.0.1:$port$1")
    local rps p50 p99 non2xx
    rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
    p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
    p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
    echo "${rps}|${p50}|${p99}|${non2xx:-0}"
}

printf '| case | requests/s | p50 | p99 | non-2xx |\n|---|---|---|---|---|\n'
for case in none limit_req sluice sluice_chain "sluice_vars?b=photos" sluice_headers sluice_reject; do
    IFS='|' read -r rps p50 p99 non2xx <<<"$(measure "/$case")"
    printf '| `%s` | %s | %s | %s | %s |\n' "$case" "$rps" "$p50" "$p99" "$non2xx"
done

# The same nginx again, now synced with the root every 200 ms.
sed -i "s|sluice_quotas quotas.json;|sluice_quotas quotas.json; sluice_root $root_url; sluice_sync_interval 200ms;|; s|location = /sluice {|location = /sluice_synced { sluice synced; try_files /file.txt =404; }\n        location = /sluice {|" "$dir/conf/nginx.conf"
"$nginx" -p "$dir/" -c "$dir/conf/nginx.conf" -s stop
sleep 0.5
"$nginx" -p "$dir/" -c "$dir/conf/nginx.conf"
sleep 1.5
IFS='|' read -r rps p50 p99 non2xx <<<"$(measure /sluice_synced)"
printf '| `%s` | %s | %s | %s | %s |\n' "sluice_synced (root, 200 ms)" "$rps" "$p50" "$p99" "$non2xx"
level=$("$sluice" quota get synced --root "$root_url" --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("level"))')
echo
echo "root level of \`synced\` after the run: $level (requests counted at the root)"
