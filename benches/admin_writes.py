#!/usr/bin/env python3
"""Admin write latency of a real `sluice root` (SQLite), with and without
idle connections open: every acknowledged write looks at the root's own
descriptors (/proc/self/fd) for a deleted copy of its database, so its cost
grows with the connections the root holds.

    python3 benches/admin_writes.py [--bin target/release/sluice] [--writes 300] [--idle 0,900]

Prints one line per idle-connection count: milliseconds per sequential
PATCH (client round trip, loopback). Standard library only.
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/release/sluice")
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--idle", default="0,900")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as dir:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        root = subprocess.Popen(
            [args.bin, "root", "--listen", f"127.0.0.1:{port}", "--db", f"sqlite://{dir}/q.db"],
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(url + "/healthz", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)

            def call(method, body):
                request = urllib.request.Request(
                    url + "/v1/quotas/q",
                    data=json.dumps(body).encode(),
                    method=method,
                    headers={"Content-Type": "application/json"},
                )
                return urllib.request.urlopen(request, timeout=10).status

            call("PUT", {"limit": 1})
            idle = []
            for count in (int(n) for n in args.idle.split(",")):
                while len(idle) < count:
                    # 200 an address: a root sheds idle connections past
                    # max_connections_per_address (256).
                    source = (f"127.0.1.{1 + len(idle) // 200}", 0)
                    s = socket.create_connection(("127.0.0.1", port), source_address=source)
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: root\r\n\r\n")
                    idle.append(s)
                time.sleep(0.5)
                started = time.perf_counter()
                for i in range(args.writes):
                    call("PATCH", {"limit": 2 + i})
                per_write = (time.perf_counter() - started) / args.writes * 1e3
                fds = len(os.listdir(f"/proc/{root.pid}/fd"))
                print(
                    f"idle connections {count} ({fds} descriptors open in the root): "
                    f"{per_write:.2f} ms per PATCH ({args.writes} sequential)"
                )
            for s in idle:
                s.close()
        finally:
            root.terminate()
            root.wait()


if __name__ == "__main__":
    main()
