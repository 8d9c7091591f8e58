#!/usr/bin/env python3
"""The fault suite's network: a TCP relay between nginx hosts and roots.

The kernel here has no netem, so every limiter-to-root connection of the
fault suite goes through this relay instead of a route: each link (one
nginx host to one root) is a listening address in the default network
namespace that forwards to the root's address in its namespace. Hosts have
no route to the roots, so the relay is their only way there.

Each direction of a link ("up": limiter to root, "down": root to limiter)
is in one of these modes, changed at run time over a control socket:

- ``pass``: bytes are forwarded, after ``delay_ms`` if set;
- ``blackhole``: bytes are read and thrown away, as a partition loses
  packets. A connection that lost bytes is marked broken and reset when
  the link heals (TCP never delivers a stream with a hole in it: a real
  connection either retransmits or is abandoned by its endpoints);
- ``hold``: bytes wait in the relay until the mode changes (a stall that
  ends with everything delivered, late);
- ``cut``: existing connections are reset and new ones are accepted and
  reset at once (an unreachable port answers RST).

``drop`` (a probability) resets a connection as a chunk crosses it: loss
bad enough that the endpoints give up.

Control: a Unix socket taking one JSON object per line and answering one:

    {"cmd": "set", "links": ["h1-r1"], "up": "blackhole", "down": "pass",
     "delay_ms": 0, "drop": 0.0}
    {"cmd": "heal"}            every link back to pass; broken ones reset
    {"cmd": "stats"}           bytes, connections and losses per link

Usage: relay.py --control PATH --links JSON, where JSON is a list of
``{"name": ..., "listen": "addr:port", "target": "addr:port"}``.
Standard library only; stops on SIGTERM or when stdin closes.
"""

import argparse
import asyncio
import json
import random
import signal
import sys

MODES = ("pass", "blackhole", "hold", "cut")


class Link:
    """One host-to-root path and the faults on it."""

    def __init__(self, name, listen, target):
        self.name = name
        self.listen = listen
        self.target = target
        self.mode = {"up": "pass", "down": "pass"}
        self.delay = 0.0
        self.drop = 0.0
        self.conns = set()
        self.stats = {
            "accepted": 0,
            "refused": 0,
            "reset": 0,
            "bytes_up": 0,
            "bytes_down": 0,
            "lost_up": 0,
            "lost_down": 0,
        }

    def cut(self):
        return "cut" in self.mode.values()


class Conn:
    """A relayed connection: the client's and the root's streams."""

    def __init__(self, link, client, server):
        self.link = link
        self.client = client
        self.server = server
        self.broken = False
        self.closed = False

    def reset(self):
        if self.closed:
            return
        self.closed = True
        self.link.stats["reset"] += 1
        for writer in (self.client, self.server):
            writer.transport.abort()
        self.link.conns.discard(self)


async def pump(conn, reader, writer, direction):
    """Copies one direction of `conn` under its link's current faults."""
    link = conn.link
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            while link.mode[direction] == "hold" and not conn.closed:
                await asyncio.sleep(0.01)
            mode = link.mode[direction]
            if conn.closed or mode == "cut":
                conn.reset()
                return
            if mode == "blackhole":
                conn.broken = True
                link.stats["lost_" + direction] += len(data)
                continue
            if link.drop and random.random() < link.drop:
                conn.reset()
                return
            if link.delay:
                await asyncio.sleep(link.delay)
            link.stats["bytes_" + direction] += len(data)
            writer.write(data)
            await writer.drain()
        # The end of the stream is a packet like any other: held, or lost.
        while link.mode[direction] == "hold" and not conn.closed:
            await asyncio.sleep(0.01)
        if link.mode[direction] == "blackhole":
            conn.broken = True
            return
        if not conn.closed and writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        conn.reset()


async def serve(link, client_reader, client_writer):
    if link.cut():
        link.stats["refused"] += 1
        client_writer.transport.abort()
        return
    host, port = link.target.rsplit(":", 1)
    try:
        server_reader, server_writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port)), timeout=2.0
        )
    except (OSError, asyncio.TimeoutError):
        link.stats["refused"] += 1
        client_writer.transport.abort()
        return
    link.stats["accepted"] += 1
    conn = Conn(link, client_writer, server_writer)
    link.conns.add(conn)
    await asyncio.gather(
        pump(conn, client_reader, server_writer, "up"),
        pump(conn, server_reader, client_writer, "down"),
    )
    if not conn.closed:
        conn.closed = True
        link.conns.discard(conn)
        for writer in (client_writer, server_writer):
            writer.close()


def apply(links, command):
    """Runs one control command; returns the reply."""
    cmd = command.get("cmd")
    if cmd == "stats":
        return {"ok": True, "links": {n: l.stats for n, l in links.items()}}
    if cmd == "heal":
        targets = list(links.values())
        command = {"up": "pass", "down": "pass", "delay_ms": 0, "drop": 0.0}
    elif cmd == "set":
        names = command.get("links", [])
        unknown = [n for n in names if n not in links]
        if unknown:
            return {"ok": False, "error": f"unknown links {unknown}"}
        targets = [links[n] for n in names]
    else:
        return {"ok": False, "error": f"unknown cmd {cmd!r}"}
    for direction in ("up", "down"):
        mode = command.get(direction)
        if mode is not None and mode not in MODES:
            return {"ok": False, "error": f"{direction}: unknown mode {mode!r}"}
    for link in targets:
        for direction in ("up", "down"):
            if command.get(direction) is not None:
                link.mode[direction] = command[direction]
        if "delay_ms" in command:
            link.delay = float(command["delay_ms"]) / 1000.0
        if "drop" in command:
            link.drop = float(command["drop"])
        for conn in list(link.conns):
            healed = link.mode == {"up": "pass", "down": "pass"}
            if link.cut() or (healed and conn.broken):
                conn.reset()
    return {"ok": True}


async def control(links, reader, writer):
    while True:
        line = await reader.readline()
        if not line:
            break
        try:
            reply = apply(links, json.loads(line))
        except (ValueError, TypeError, AttributeError) as e:
            reply = {"ok": False, "error": str(e)}
        writer.write((json.dumps(reply) + "\n").encode())
        await writer.drain()
    writer.close()


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", required=True)
    parser.add_argument("--links", required=True)
    args = parser.parse_args()
    links = {}
    servers = []
    for spec in json.loads(args.links):
        link = Link(spec["name"], spec["listen"], spec["target"])
        links[link.name] = link
        host, port = link.listen.rsplit(":", 1)
        servers.append(
            await asyncio.start_server(
                lambda r, w, link=link: serve(link, r, w), host, int(port)
            )
        )
    servers.append(
        await asyncio.start_unix_server(
            lambda r, w: control(links, r, w), path=args.control
        )
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The driver holds our stdin: when it dies, so do we.
    loop.add_reader(sys.stdin.fileno(), stop.set)
    print("relay ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
