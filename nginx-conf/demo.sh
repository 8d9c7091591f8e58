#!/usr/bin/env bash
# `make run`: a quota root and an nginx with the S3 example, on 127.0.0.1.
#
#   root   127.0.0.1:7070   SQLite database run/sluice.db
#   nginx  127.0.0.1:8080   nginx-conf/s3.conf, prefix run/
#
# Loads the demo quota tree (nginx-conf/s3-quotas.json) into the root,
# shows a burst of requests turning from 200 into 429, prints commands to
# try, and stops both servers on Ctrl-C. Expects `make all bin` to have
# run (make run does it).

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
run=$repo/run
nginx=$repo/build/nginx/sbin/nginx
sluice=$repo/target/release/sluice
root_url=http://127.0.0.1:7070

for port in 7070 8080 8081; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "run: port $port on 127.0.0.1 is in use; stop what listens there first" >&2
        exit 1
    fi
done

mkdir -p "$run/logs"
ln -sfn "$repo/build/nginx/modules" "$run/modules"

root_pid=
nginx_up=
stop() {
    trap - INT TERM EXIT
    echo
    if [ -n "$nginx_up" ]; then
        echo "run: stopping nginx"
        "$nginx" -p "$run/" -c "$repo/nginx-conf/s3.conf" -s quit 2>/dev/null || true
    fi
    if [ -n "$root_pid" ]; then
        echo "run: stopping the quota root"
        kill -TERM "$root_pid" 2>/dev/null || true
        wait "$root_pid" 2>/dev/null || true
    fi
    echo "run: stopped (logs in run/logs, quota database run/sluice.db)"
}
trap stop INT TERM EXIT

echo "run: starting the quota root on $root_url (run/sluice.db)"
"$sluice" root --listen 127.0.0.1:7070 --db "sqlite://$run/sluice.db" \
    >>"$run/logs/root.log" 2>&1 &
root_pid=$!
for _ in $(seq 100); do
    curl -fsS "$root_url/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "$root_url/healthz" >/dev/null || { echo "run: the root did not start; see run/logs/root.log" >&2; exit 1; }

echo "run: loading the demo quota tree (nginx-conf/s3-quotas.json)"
"$sluice" quota apply -f "$repo/nginx-conf/s3-quotas.json" --root "$root_url"
"$sluice" quota list --root "$root_url"

echo "run: starting nginx with nginx-conf/s3.conf on http://127.0.0.1:8080"
"$nginx" -p "$run/" -c "$repo/nginx-conf/s3.conf"
nginx_up=1
sleep 1.5   # one sync: nginx learns the quotas from the root

echo
echo "run: 40 quick reads of bucket 'photos' (s3_photos_read: 15/s, burst 15-30):"
codes=$(for _ in $(seq 40); do
    curl -s -o /dev/null -w '%{http_code} ' -H 'Host: photos.s3.example' http://127.0.0.1:8080/cat.jpg
done)
echo "  $codes"
echo "  $(grep -o 200 <<<"$codes" | wc -l) passed, $(grep -o 429 <<<"$codes" | wc -l) rejected"

cat <<EOF

Try:
  curl -i -H 'Host: photos.s3.example' http://127.0.0.1:8080/cat.jpg     # read: s3_photos_read
  curl -i -X PUT http://127.0.0.1:8080/photos/new.jpg -d x              # write, path style
  for i in \$(seq 30); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:8080/photos/a; done; echo
  curl -s http://127.0.0.1:8080/sluice-metrics | grep -v '^#'            # nginx's view
  $sluice quota get s3_photos_read --root $root_url           # the root's view (level, limiters)
  $sluice quota set s3_photos_read --limit 1 --low-burst 1 --high-burst 2 --root $root_url
  $sluice top --root $root_url                                # busiest quotas, limiters (Ctrl-C)
  open $root_url/ui in a browser                               # the root's console
  tail -f run/logs/s3-access.log

Ctrl-C stops nginx and the root.
EOF
wait "$root_pid"
