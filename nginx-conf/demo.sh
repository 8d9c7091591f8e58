#!/usr/bin/env bash
# `make run`: a quota root and an nginx with the S3 example, on 127.0.0.1.
#
#   root   127.0.0.1:7070   SQLite database run/sluice.db
#   nginx  127.0.0.1:8080   nginx-conf/s3.conf, prefix run/
#
# (run/ is $SLUICE_DEMO_DIR when set: tests/demo_stop.py uses a scratch
# directory.)
#
# Loads the demo quota tree (nginx-conf/s3-quotas.json) into the root,
# shows a burst of requests turning from 200 into 429, prints commands to
# try, and stops both servers on Ctrl-C. Expects `make all bin` to have
# run (make run does it).
#
# Whatever ends it (Ctrl-C, TERM, HUP, an error, its output going away as
# with `make run | tee log` and Ctrl-C), it stops what it started before
# it exits; Ctrl-C, TERM and HUP are a clean stop (exit 0).

set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
run=${SLUICE_DEMO_DIR:-$repo/run}
nginx=$repo/build/nginx/sbin/nginx
conf=$repo/nginx-conf/s3.conf
sluice=$repo/target/release/sluice
root_url=http://127.0.0.1:7070

# A dead stdout (the reader of a pipe gone) makes a write fail instead of
# killing the script before it stops what it started.
trap '' PIPE

# Prints a line; a failed write (EPIPE) is no reason to stop.
say() { printf '%s\n' "$*" 2>/dev/null || true; }

# The pid in `file` when that process runs `name`, else nothing.
running() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
        [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = "$2" ] && echo "$pid"
}

busy=
for port in 7070 8080 8081; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        say "run: port $port on 127.0.0.1 is in use" >&2
        busy=1
    fi
done
if [ -n "$busy" ]; then
    if pid=$(running "$run/logs/nginx.pid" nginx); then
        say "run: an nginx an earlier 'make run' started still runs (pid $pid); stop it with:" >&2
        say "  $nginx -p $run/ -c $conf -s quit" >&2
    fi
    if pid=$(running "$run/root.pid" sluice); then
        say "run: a quota root an earlier 'make run' started still runs (pid $pid); stop it with:" >&2
        say "  kill $pid" >&2
    fi
    say "run: stop what listens there first" >&2
    exit 1
fi

mkdir -p "$run/logs"
ln -sfn "$repo/build/nginx/modules" "$run/modules"

# Waits up to 5 s for `pid` to exit; true when it did.
gone() {
    for _ in $(seq 50); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    ! kill -0 "$1" 2>/dev/null
}

root_pid=
nginx_started=
stopping=
stop() {
    [ -z "$stopping" ] || return 0
    stopping=1
    # Finish stopping whatever arrives meanwhile (a second Ctrl-C too).
    trap '' INT TERM HUP
    set +e
    say ""
    local pid
    if [ -n "$nginx_started" ] && pid=$(running "$run/logs/nginx.pid" nginx); then
        say "run: stopping nginx"
        "$nginx" -p "$run/" -c "$conf" -s quit 2>/dev/null
        gone "$pid" || { kill -TERM "$pid" 2>/dev/null; gone "$pid"; }
    fi
    if [ -n "$root_pid" ]; then
        say "run: stopping the quota root"
        kill -TERM "$root_pid" 2>/dev/null
        gone "$root_pid" || kill -KILL "$root_pid" 2>/dev/null
        wait "$root_pid" 2>/dev/null
        rm -f "$run/root.pid"
    fi
    say "run: stopped (logs in run/logs, quota database run/sluice.db)"
}
trap stop EXIT
trap 'stop; exit 0' INT TERM HUP

say "run: starting the quota root on $root_url (run/sluice.db)"
"$sluice" root --listen 127.0.0.1:7070 --db "sqlite://$run/sluice.db" \
    >>"$run/logs/root.log" 2>&1 &
root_pid=$!
echo "$root_pid" >"$run/root.pid"
for _ in $(seq 100); do
    curl -fsS "$root_url/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "$root_url/healthz" >/dev/null || { say "run: the root did not start; see run/logs/root.log" >&2; exit 1; }

say "run: loading the demo quota tree (nginx-conf/s3-quotas.json)"
"$sluice" quota apply -f "$repo/nginx-conf/s3-quotas.json" --root "$root_url"
"$sluice" quota list --root "$root_url"

say "run: starting nginx with nginx-conf/s3.conf on http://127.0.0.1:8080"
nginx_started=1
"$nginx" -p "$run/" -c "$conf"
sleep 1.5   # one sync: nginx learns the quotas from the root

say ""
say "run: 40 quick reads of bucket 'photos' (s3_photos_read: 15/s, burst 15-30):"
codes=$(for _ in $(seq 40); do
    curl -s -o /dev/null -w '%{http_code} ' -H 'Host: photos.s3.example' http://127.0.0.1:8080/cat.jpg
done)
say "  $codes"
say "  $(grep -o 200 <<<"$codes" | wc -l) passed, $(grep -o 429 <<<"$codes" | wc -l) rejected"

say "
Try:
  curl -i -H 'Host: photos.s3.example' http://127.0.0.1:8080/cat.jpg     # read: s3_photos_read
  curl -i -X PUT http://127.0.0.1:8080/photos/new.jpg -d x              # write, path style
  for i in \$(seq 30); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:8080/photos/a; done; echo
  curl -s http://127.0.0.1:8080/sluice-metrics | grep -v '^#'            # nginx's view
  $sluice quota get s3_photos_read --root $root_url           # the root's view (level, limiters)
  $sluice quota set s3_photos_read --limit 1 --low-burst 1 --high-burst 2 --root $root_url
  $sluice top --root $root_url                                # busiest quotas, limiters (Ctrl-C)
  console: $root_url/ui                                 # the root's web console, in a browser
  bindings: SLUICE_LIBRARY=\$PWD/target/release/libsluice.so (built by make run, or make lib)
  tail -f run/logs/s3-access.log

Ctrl-C stops nginx and the root."
# `wait` returns when a trapped signal arrives; the trap stops everything.
wait "$root_pid"
