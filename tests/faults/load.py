#!/usr/bin/env python3
"""Paced HTTP load for the fault suite, run inside a host's namespace.

Sends GET requests at a fixed rate to one nginx for a fixed time on a
kept-alive connection, and writes what came back per 100 ms bucket of
CLOCK_MONOTONIC (the same clock in every namespace, so the driver lines
the buckets of all hosts up with its own fault times):

    {"buckets": {"<index>": [passed, rejected, errors]}, "retried": n,
     "errors": ["first few error texts"], "sent": n, "skipped": n}

A request is paced by the time it was due, so a busy machine sends the
same total; after a stall of more than a second (the process was
stopped: a frozen host) the requests it missed are skipped, not fired at
once, and counted in `skipped`. Like any HTTP client (RFC 9110 9.2.2), a GET whose reused
connection was closed before any byte of the answer (a worker killed or
reloaded while the connection sat idle) is sent once more on a new
connection and counted in `retried`; anything else that is not 200 or
429 (another status, a timeout, a reset on a fresh connection, a second
failure) is an error. Stops by itself after --seconds. Standard library
only.
"""

import argparse
import http.client
import json
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="nginx address")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/q/index.html")
    parser.add_argument("--rate", type=float, required=True, help="requests/s")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument(
        "--start", type=float, required=True, help="CLOCK_MONOTONIC time of bucket 0"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    buckets = {}
    errors = []
    retried = 0
    sent = 0
    skipped = 0
    conn = None
    fresh = True

    def count(slot):
        index = int((time.monotonic() - args.start) * 10)
        row = buckets.setdefault(index, [0, 0, 0])
        row[slot] += 1

    def error(text):
        count(2)
        if len(errors) < 20:
            errors.append(f"{time.monotonic() - args.start:.1f}s {text}")

    begin = max(time.monotonic(), args.start)
    end = begin + args.seconds
    while True:
        due = begin + sent / args.rate
        now = time.monotonic()
        if due >= end:
            break
        if due > now:
            time.sleep(due - now)
        elif now - due > 1.0:
            behind = int((now - due) * args.rate)
            skipped += behind
            sent += behind
            continue
        sent += 1
        for attempt in (0, 1):
            if conn is None:
                conn = http.client.HTTPConnection(args.host, args.port, timeout=5)
                fresh = True
            try:
                conn.request("GET", args.path)
                response = conn.getresponse()
                response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                conn = None
                if attempt == 0 and not fresh:
                    retried += 1
                    continue
                error(f"{type(e).__name__}: {e}")
                break
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = None
                error(f"{type(e).__name__}: {e}")
                break
            fresh = False
            if response.status == 200:
                count(0)
            elif response.status == 429:
                count(1)
            else:
                error(f"status {response.status}")
            if response.will_close:
                conn.close()
                conn = None
            break
    with open(args.out, "w") as f:
        json.dump(
            {"buckets": buckets, "retried": retried, "errors": errors, "sent": sent,
             "skipped": skipped},
            f,
        )


if __name__ == "__main__":
    main()
