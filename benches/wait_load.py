#!/usr/bin/env python3
"""A small open-loop load generator for `benches/nginx-wait.sh`.

Sends GET <path> to 127.0.0.1:<port> at a steady <rate> per second for
<seconds>, each request on its own connection (a held request keeps its
connection, so a closed-loop tool such as wrk would slow down with the
holds instead of keeping the offered load). Bounded: at most <max-inflight>
requests open at once (later ones are counted as `skipped`, not queued).

Prints one JSON object: what was sent, the statuses, `$sluice_status` (from
an `X-Sluice` response header), latency percentiles per outcome, and the
steady-state rate of 200s (by the time they completed, after --warmup
seconds, until the last request was sent): the rate the backend sees.
"""

import argparse
import asyncio
import json
import time


async def one(port, path, results, start):
    sent = time.monotonic()
    status, sluice = 0, ""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        raw = await reader.read()
        writer.close()
        head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        lines = head.split("\r\n")
        status = int(lines[0].split()[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "x-sluice":
                sluice = value.strip()
    except (OSError, IndexError, ValueError):
        status = 0
    results.append((sent - start, time.monotonic() - sent, status, sluice))


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--max-inflight", type=int, default=4000)
    ap.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        help="seconds left out of the steady-state rate (the burst is spent there)",
    )
    args = ap.parse_args()

    results, tasks = [], set()
    skipped = 0
    start = time.monotonic()
    total = int(args.rate * args.seconds)
    for i in range(total):
        due = start + i / args.rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= args.max_inflight:
            skipped += 1
            continue
        t = asyncio.ensure_future(one(args.port, args.path, results, start))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    send_secs = time.monotonic() - start
    if tasks:
        await asyncio.wait(tasks, timeout=30)

    by = {}
    released = 0
    for sent, latency, status, sluice in results:
        by.setdefault(f"{status} {sluice}".strip(), []).append(latency)
        # A 200 reaches the backend when its response starts, about when
        # it completes here (a 612-byte file): held requests by the end
        # of their hold.
        if status == 200 and args.warmup <= sent + latency < send_secs:
            released += 1
    out = {
        "offered_rate": args.rate,
        "seconds": args.seconds,
        "send_seconds": round(send_secs, 3),
        "sent": len(results),
        "skipped": skipped,
        "steady_200_per_s": round(released / max(1e-9, send_secs - args.warmup), 1),
        "outcomes": {
            k: {
                "count": len(v),
                "p50_ms": round(percentile(v, 50) * 1e3, 2),
                "p99_ms": round(percentile(v, 99) * 1e3, 2),
                "max_ms": round(max(v) * 1e3, 2),
            }
            for k, v in sorted(by.items())
        },
    }
    print(json.dumps(out))


asyncio.run(main())
