#!/usr/bin/env python3
"""Requests that hold in-flight slots, for the fault suite; run inside a
host's namespace.

Keeps --count requests open at once to a slow location of one nginx (a
big file sent at a low `limit_rate`, so a request lasts far longer than a
case) whose `sluice` quotas are in-flight quotas: each open request holds
one slot of each. Until --churn-until (CLOCK_MONOTONIC), each request is
closed after a random 1 to 4 s and another opened in its place, so slots
are taken and given back all through the fault; after it the requests
stay open until --seconds have passed, and the file --status says how many
are open:

    {"open": n, "opened": n, "closed": n, "broken": n, "churning": bool,
     "errors": ["first few error texts"], "at": monotonic}

A request counts as open from its response's status line (200) until this
script closes it, or the connection breaks (a worker killed with SIGKILL
resets it): a broken request is counted in `broken` and replaced at once.
The status file is rewritten every 100 ms and at every change. Standard
library only.
"""

import argparse
import json
import os
import random
import select
import socket
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="nginx address")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/hold/big.bin")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--churn-until", type=float, required=True,
                        help="CLOCK_MONOTONIC time the churn stops")
    parser.add_argument("--status", required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    state = {"open": 0, "opened": 0, "closed": 0, "broken": 0, "churning": True,
             "errors": []}
    # Open requests: socket -> the time this script closes it (None: kept).
    held = {}

    def write_status():
        state["open"] = len(held)
        state["churning"] = time.monotonic() < args.churn_until
        state["at"] = time.monotonic()
        tmp = args.status + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, args.status)

    def error(text):
        if len(state["errors"]) < 20:
            state["errors"].append(text)

    def open_one():
        """Opens one request; True once its status line says 200."""
        try:
            s = socket.create_connection((args.host, args.port), timeout=5)
            s.sendall(f"GET {args.path} HTTP/1.1\r\nHost: hold\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    raise ConnectionError("closed before the response headers")
                head += chunk
        except OSError as e:
            error(f"open: {type(e).__name__}: {e}")
            return False
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status + b" ":
            error(f"open: {status.decode(errors='replace')}")
            s.close()
            return False
        s.setblocking(False)
        now = time.monotonic()
        until = now + rng.uniform(1.0, 4.0)
        held[s] = until if until < args.churn_until else None
        state["opened"] += 1
        return True

    end = time.monotonic() + args.seconds
    last_write = 0.0
    while time.monotonic() < end:
        while len(held) < args.count and time.monotonic() < end:
            if not open_one():
                time.sleep(0.1)
                break
            write_status()
        now = time.monotonic()
        for s, until in list(held.items()):
            if until is not None and now >= until:
                del held[s]
                s.close()
                state["closed"] += 1
                write_status()
        ready, _, _ = select.select(list(held), [], [], 0.05)
        for s in ready:
            # The body trickles in; an empty read or an error is a
            # connection that broke.
            try:
                if s.recv(65536):
                    continue
                error("connection closed by nginx")
            except BlockingIOError:
                continue
            except OSError as e:
                error(f"read: {type(e).__name__}: {e}")
            del held[s]
            s.close()
            state["broken"] += 1
            write_status()
        if time.monotonic() - last_write >= 0.1:
            write_status()
            last_write = time.monotonic()
    for s in list(held):
        s.close()
    held.clear()
    write_status()


if __name__ == "__main__":
    main()
