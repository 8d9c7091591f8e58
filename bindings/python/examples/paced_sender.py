"""Several processes sending at one fleet-wide rate, paced by sluice_reserve.

Pushwoosh's problem (pushwoosh-algorithms.txt): deliver a campaign at
``send_rate`` messages a second in all, whatever number of workers sends
it, without dropping any. Each worker here is a separate process with its
own limiter (as separate hosts would be), synced with a quota root; before
each message it calls ``reserve``: the unit is counted now and the worker
sleeps the wait the library computes (GCRA's theoretical arrival time on
the fleet-wide level), so the workers together keep to the quota's rate.
A reservation that would wait longer than ``--max-wait`` is not counted;
the worker sleeps a little and asks again, so no message is lost.

    sluice root --listen 127.0.0.1:7070 --db sqlite://quotas.db &
    SLUICE_LIBRARY=target/release/libsluice.so \\
        python bindings/python/examples/paced_sender.py \\
        --root http://127.0.0.1:7070 --quota campaign_42 --create \\
        --rate 20 --burst 2 --processes 4 --messages 25

It prints what each second of the run sent, then the fleet's rate.
``run()`` does the same for a program (the tests call it).
"""

import argparse
import json
import multiprocessing
import sys
import time
import urllib.request


def create_quota(root, name, rate, burst, token=None):
    """Creates (or updates) the quota at the root's admin API: ``rate``
    messages a second, ``burst`` at once after an idle spell."""
    body = json.dumps({"limit": rate, "low_burst": burst, "high_burst": burst}).encode()
    request = urllib.request.Request(f"{root}/v1/quotas/{name}", data=body, method="PUT")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def sender(root, quota, index, messages, max_wait, sync_interval_ms, sync_token, ready, go,
           results):
    """One worker process: its own limiter, its share of the messages."""
    import sluice  # in the child: each process loads its own limiter

    # A root started with --sync-token-file answers only limiters that send
    # its sync token (the option is left out for a root without one).
    options = {"sync_token": sync_token} if sync_token else {}
    with sluice.Limiter(roots=[root], limiter_id=f"paced-sender-{index}",
                        sync_interval_ms=sync_interval_ms, capacity=1000, **options) as limiter:
        deadline = time.monotonic() + 30
        while limiter.check(quota, 0) is sluice.Decision.UNKNOWN:
            if time.monotonic() > deadline:
                results.put((index, None, f"quota {quota!r} did not arrive from {root}"))
                return
            time.sleep(0.02)
        ready.put(index)
        go.wait()
        sent, refused = [], 0
        for _ in range(messages):
            while True:
                reservation = limiter.reserve(quota, 1, max_wait=max_wait)
                if reservation.decision is sluice.Decision.PASS:
                    time.sleep(reservation.wait)
                    break
                if reservation.decision is not sluice.Decision.REJECT:
                    results.put((index, None, f"quota {quota!r}: {reservation.decision.name}"))
                    return
                # The fleet is more than max_wait ahead: nothing was
                # counted; come back when it may have room.
                refused += 1
                time.sleep(min(reservation.wait, max_wait))
            sent.append(time.time())  # the message goes out here
        results.put((index, sent, refused))


def run(root, quota, processes=4, messages=25, max_wait=1.0, sync_interval_ms=100, timeout=120,
        sync_token=None):
    """Runs ``processes`` senders of ``messages`` each against ``root`` and
    returns what happened: ``sent`` (every send time, sorted), ``per_process``
    (counts), ``refused`` (reservations refused and retried), ``elapsed``
    (first send to last, seconds) and ``rate`` (sends after the first, per
    second of that span). ``sync_token`` is the roots' sync token, if they
    require one."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = [
        ctx.Process(target=sender, args=(root, quota, i, messages, max_wait, sync_interval_ms,
                                         sync_token, ready, go, results))
        for i in range(processes)
    ]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + timeout
        started = 0
        while started < processes:
            if not results.empty():
                index, _, error = results.get()
                raise RuntimeError(f"sender {index}: {error}")
            try:
                ready.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                started += 1
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError("the senders did not start") from None
        go.set()
        sent, per_process, refused = [], {}, 0
        for _ in range(processes):
            index, times, extra = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if times is None:
                raise RuntimeError(f"sender {index}: {extra}")
            sent += times
            per_process[index] = len(times)
            refused += extra
        for w in workers:
            w.join(timeout=10)
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
    sent.sort()
    elapsed = sent[-1] - sent[0] if len(sent) > 1 else 0.0
    return {
        "sent": sent,
        "per_process": per_process,
        "refused": refused,
        "elapsed": elapsed,
        "rate": (len(sent) - 1) / elapsed if elapsed > 0 else float("inf"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="quota root base URL")
    parser.add_argument("--quota", default="campaign", help="the quota to pace on")
    parser.add_argument("--create", action="store_true",
                        help="create the quota at the root first (--rate, --burst)")
    parser.add_argument("--rate", type=float, default=20, help="messages a second, fleet-wide")
    parser.add_argument("--burst", type=float, default=2, help="messages sent at once when idle")
    parser.add_argument("--token", help="the root's admin token, for --create")
    parser.add_argument("--sync-token-file",
                        help="a file holding the roots' sync token (a root started with "
                             "--sync-token-file wants it)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--messages", type=int, default=25, help="per process")
    parser.add_argument("--max-wait", type=float, default=1.0,
                        help="longest wait a reservation may ask for, seconds")
    parser.add_argument("--sync-interval-ms", type=int, default=100)
    args = parser.parse_args(argv)
    if args.create:
        create_quota(args.root, args.quota, args.rate, args.burst, args.token)
    sync_token = None
    if args.sync_token_file:
        with open(args.sync_token_file) as f:
            sync_token = f.read().strip()
    result = run(args.root, args.quota, args.processes, args.messages, args.max_wait,
                 args.sync_interval_ms, sync_token=sync_token)
    start = result["sent"][0]
    per_second = {}
    for t in result["sent"]:
        second = int(t - start)
        per_second[second] = per_second.get(second, 0) + 1
    for second in sorted(per_second):
        print(f"second {second:3d}: {per_second[second]:4d} sent")
    print(f"{len(result['sent'])} messages from {args.processes} processes in "
          f"{result['elapsed']:.2f} s: {result['rate']:.1f}/s "
          f"({result['refused']} reservations refused and retried)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
