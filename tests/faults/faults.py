#!/usr/bin/env python3
"""Fault suite and soak: nginx hosts and quota roots in network namespaces.

Every process runs in a network namespace of its own with one veth pair to
the default namespace: three nginx hosts (the project's nginx and module,
each with its own zone), two roots (`sluice root` over SQLite, or over
PostgreSQL for the PostgreSQL case) and PostgreSQL when a case uses it.
Namespaces have no route to each other: the hosts' `sluice_root` URLs
and the roots' database URL point at links of `relay.py`, a TCP relay in
the default namespace with one link per host and root (and per root and
the database) that can delay, blackhole, hold or cut either direction
(the kernel has no netem). Load comes from
`load.py` inside each host's namespace, to the nginx on the veth address.
The case list, with what each does, is `CASES` below.

Every host checks two quotas on each request: `api` (the fleet's limit:
LIMIT units/s, offered twice over, split 50/30/20 across the hosts) and
`audit_h<i>`, a quota of its own with limit 0 and a burst nothing reaches.
A limit-0 counter never leaks, so a root's level of `audit_h<i>` is exactly
the weight that root received from host i: compared with what host i's
clients saw admitted, it shows weight lost (below) or counted twice
(above) by that root.

Every host also keeps a few requests open to a slow location that checks
two in-flight quotas (`hold.py`): `slots` and `slots_key` (per key, one
key all hosts share). Through the fault each request is closed after 1 to
4 s and another opened; once the load ends they stay open, and every
root's level of both must come to the number of requests open across
the hosts (the clients' own count) within IN_FLIGHT_EXACT seconds: slots
held exactly, whatever the fault did to the syncs that carried them.

A case is: a fresh cluster (new database, roots, nginx; the namespaces and
the relay stay), WARM seconds of load, the fault, AFTER seconds of load,
then the load stops by itself and the hosts' last deltas are given time to
reach the roots. Reported per case: admitted/limit during the fault and
after it, client errors, the roots' audit difference, and the time from
the fault's end until every host syncs with every root again and every
root that ran throughout holds all the weight admitted before the fault
ended.

    faults.py cases [--short] [NAME ...]   the fault cases; table on stdout
    faults.py soak [--minutes N]           the soak (SOAK_MINUTES)
    faults.py table FILE.json              a cases run's table again
    faults.py soak-report FILE.json        a soak's report again

Tables (and JSON) are also written under build/faults/. Must run as root
(namespaces). Everything it starts is stopped, and its namespaces
deleted, when it exits, fails or is interrupted; `make` wraps it in a trap
that deletes leftover namespaces of the run too (`FAULTS_RUN` names them).
Standard library only.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NGINX = os.environ.get("TEST_NGINX_BINARY", f"{REPO}/build/nginx/sbin/nginx")
MODULE = os.environ.get(
    "TEST_NGINX_SLUICE_MODULE",
    f"{REPO}/build/nginx/modules/ngx_http_sluice_module.so",
)
SLUICE = os.environ.get("TEST_NGINX_SLUICE_BIN", f"{REPO}/target/release/sluice")
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
OUT_DIR = os.environ.get("FAULTS_OUT", f"{REPO}/build/faults")

# The fleet's quota: LIMIT units/s, everything passes up to LOW, everything
# is rejected from HIGH. The band is wider than the offered load times the
# sync interval (2 * 100 * 0.25 s), so the fleet does not oscillate.
LIMIT = 100.0
LOW = 100.0
HIGH = 200.0
# Offered load: twice the limit, split over the hosts.
OFFERED = 2.0 * LIMIT
SHARES = [0.5, 0.3, 0.2]
INTERVAL = "250ms"
# A burst no audit quota reaches: they never reject.
AUDIT_BURST = 1e11
ROOT_PORT = 7070
PG_PORT = 5432
NGINX_PORT = 8080
WARM = 5.0
AFTER = 10.0
# Requests each host keeps open on the in-flight quotas (h1, h2, h3).
HOLDS = [3, 2, 1]
# A limit the open requests never reach.
SLOTS_LIMIT = 1000
# Seconds after the churn stops within which every root must hold every
# open request's slot: the client's close reaching nginx, and two sync
# intervals (the first may have been under way).
IN_FLIGHT_EXACT = 3.0
ADMIN_TOKEN = "faults-admin-token-0123456789"
SYNC_TOKEN = "faults-sync-token-0123456789"


def log(text):
    print(f"[faults {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def sh(*args, check=True, **kw):
    """Runs a command; its output, or an exception naming it."""
    done = subprocess.run(
        list(args), stdin=subprocess.DEVNULL, capture_output=True, text=True, **kw
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def http(url, method="GET", body=None, token=None, timeout=2.0):
    """(status, text) of one request; (None, error) when nothing answers."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as e:
        return None, str(e)


def wait_for(what, done, timeout=30.0, every=0.05):
    started = time.monotonic()
    while True:
        value = done()
        if value:
            return value
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"gave up waiting: {what}")
        time.sleep(every)


def rss_kib(pid, kind="VmRSS"):
    """Resident memory of `pid` in KiB, or None when it is gone. `kind`:
    VmRSS (all), RssAnon (private: the heap, where a leak shows), RssShmem
    (shared: an nginx zone's pages, counted as they are first touched)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(kind + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    """Pids whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The name may hold spaces: the fields after it start past ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


class Net:
    """The namespaces, veth pairs and addresses of one run."""

    def __init__(self, run_id, nodes):
        self.run_id = run_id
        self.nodes = nodes
        self.namespaces = []
        self.subnet = self.free_subnet()

    @staticmethod
    def free_subnet():
        used = sh("ip", "-o", "-4", "addr", "show")
        for _ in range(200):
            n = random.randint(160, 239)
            if f" 10.{n}." not in used:
                return n
        raise RuntimeError("no free 10.N.0.0/16 for the fault network")

    def ns(self, node):
        return f"{self.run_id}-{node}"

    def index(self, node):
        return self.nodes.index(node) + 1

    def outer(self, node):
        """The default namespace's address on `node`'s veth."""
        return f"10.{self.subnet}.{self.index(node)}.1"

    def inner(self, node):
        """`node`'s own address."""
        return f"10.{self.subnet}.{self.index(node)}.2"

    def up(self):
        for node in self.nodes:
            ns = self.ns(node)
            outer_if, inner_if = f"{self.run_id}{node}", f"{self.run_id}{node}p"
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", outer_if, "type", "veth", "peer", "name", inner_if)
            sh("ip", "link", "set", inner_if, "netns", ns)
            sh("ip", "addr", "add", f"{self.outer(node)}/24", "dev", outer_if)
            sh("ip", "link", "set", outer_if, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.inner(node)}/24", "dev", inner_if)
            sh("ip", "-n", ns, "link", "set", inner_if, "up")

    def exec(self, node):
        return ["ip", "netns", "exec", self.ns(node)]

    def kill_inside(self):
        """SIGKILL to every process in this run's namespaces."""
        for ns in self.namespaces:
            for pid in sh("ip", "netns", "pids", ns, check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass

    def down(self):
        self.kill_inside()
        time.sleep(0.2)
        for ns in self.namespaces:
            # Deleting a namespace destroys its veth and so the pair.
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces = []


class Relay:
    """relay.py in the default namespace: one link per host and root."""

    def __init__(self, net, hosts, roots, workdir):
        # Each root reaches the database (when a case uses PostgreSQL)
        # through a link of its own too.
        self.links = [
            {
                "name": f"{r}-db",
                "listen": f"{net.outer(r)}:{PG_PORT}",
                "target": f"{net.inner('db')}:{PG_PORT}",
            }
            for r in roots
        ]
        for h in hosts:
            for j, r in enumerate(roots):
                self.links.append(
                    {
                        "name": f"{h}-{r}",
                        "listen": f"{net.outer(h)}:{7101 + j}",
                        "target": f"{net.inner(r)}:{ROOT_PORT}",
                    }
                )
        self.control = os.path.join(workdir, "relay.sock")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "relay.py"), "--control", self.control,
             "--links", json.dumps(self.links)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(os.path.join(workdir, "relay.log"), "w"),
            text=True,
        )
        if self.proc.stdout.readline().strip() != "relay ready":
            raise RuntimeError("relay did not start: see relay.log")
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.control)
        self.reader = self.sock.makefile("r")

    def url(self, host, j):
        link = next(l for l in self.links if l["name"] == f"{host}-r{j + 1}")
        return f"http://{link['listen']}"

    def command(self, **command):
        self.sock.sendall((json.dumps(command) + "\n").encode())
        reply = json.loads(self.reader.readline())
        if not reply.get("ok"):
            raise RuntimeError(f"relay: {reply}")
        return reply

    def set(self, links, **modes):
        self.command(cmd="set", links=links, **modes)

    def heal(self):
        self.command(cmd="heal")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Postgres:
    """A throwaway PostgreSQL cluster in the `db` namespace, which the
    roots reach through relay links of their own (`r1-db`, `r2-db`)."""

    def __init__(self, net, workdir):
        self.net = net
        bins = sorted(
            (d for d in os.listdir("/usr/lib/postgresql") if d.isdigit()), key=int
        )
        if not bins:
            raise RuntimeError("PostgreSQL is not installed (make deps)")
        self.bin = f"/usr/lib/postgresql/{bins[-1]}/bin"
        self.dir = os.path.join(workdir, "pg")
        os.makedirs(self.dir)
        sh("chown", "postgres:postgres", self.dir)
        self.port = PG_PORT
        self.tool("initdb", "-D", self.data, "-A", "trust", "-U", "postgres",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
            f.write("host all all 10.0.0.0/8 trust\n")
        self.start()
        self.tool("psql", "-h", self.dir, "-p", str(self.port), "-U", "postgres",
                  "-c", "CREATE DATABASE sluice")

    @property
    def data(self):
        return os.path.join(self.dir, "data")

    def url(self, root):
        """The database's URL for `root`: its relay link."""
        return f"postgres://postgres@{self.net.outer(root)}:{PG_PORT}/sluice"

    def tool(self, name, *args):
        return sh("runuser", "-u", "postgres", "--", f"{self.bin}/{name}", *args)

    def start(self):
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses={self.net.inner('db')} "
            "-c fsync=off -c synchronous_commit=off -c max_connections=100"
        )
        # After a kill, backends may hold the old shared memory a moment.
        wait_for(
            "PostgreSQL starts",
            lambda: subprocess.run(
                self.net.exec("db") +
                ["runuser", "-u", "postgres", "--", f"{self.bin}/pg_ctl", "-D", self.data,
                 "-l", os.path.join(self.dir, "log"), "-w", "-t", "30", "-o", options,
                 "start"],
                stdin=subprocess.DEVNULL, capture_output=True,
            ).returncode == 0,
            timeout=60,
            every=0.5,
        )

    def kill(self):
        """SIGKILL to the postmaster: a crash, not a shutdown."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            pid = int(f.readline())
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self):
        subprocess.run(
            ["runuser", "-u", "postgres", "--", f"{self.bin}/pg_ctl", "-D", self.data,
             "-m", "immediate", "-w", "stop"],
            stdin=subprocess.DEVNULL, capture_output=True,
        )


class Root:
    """`sluice root` in its namespace."""

    def __init__(self, net, node, db_url, workdir):
        self.net = net
        self.node = node
        self.db_url = db_url
        self.url = f"http://{net.inner(node)}:{ROOT_PORT}"
        self.workdir = workdir
        self.proc = None
        self.starts = 0

    def start(self):
        log_file = open(os.path.join(self.workdir, f"{self.node}.log"), "a")
        self.proc = subprocess.Popen(
            self.net.exec(self.node) + [
                SLUICE, "root", "--listen", f"{self.net.inner(self.node)}:{ROOT_PORT}",
                "--db", self.db_url,
                "--admin-token-file", os.path.join(self.workdir, "admin.token"),
                "--sync-token-file", os.path.join(self.workdir, "sync.token"),
                "--reload-interval", "200ms",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_file,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        self.starts += 1
        wait_for(
            f"{self.node} serves",
            lambda: self.proc.poll() is None
            and http(f"{self.url}/healthz", timeout=1)[0] == 200
            or self.failed(),
        )

    def failed(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.node} exited: see {self.node}.log")
        return False

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def restart(self):
        self.kill()
        self.start()

    def pid(self):
        return self.proc.pid

    def put(self, name, body):
        status, text = http(f"{self.url}/v1/quotas/{name}", "PUT", body, ADMIN_TOKEN, 5)
        if status not in (200, 201):
            raise RuntimeError(f"PUT {name} at {self.node}: {status} {text}")

    def level(self, name, timeout=0.5):
        status, text = http(f"{self.url}/v1/quotas/{name}", token=ADMIN_TOKEN, timeout=timeout)
        if status != 200:
            return None
        return json.loads(text).get("level")


    def key_level(self, name, timeout=0.5):
        """The level of the one key of per-key quota `name` (0 when the
        root holds none), or None when the root does not answer."""
        status, text = http(f"{self.url}/v1/quotas/{name}/keys?top=1", token=ADMIN_TOKEN,
                            timeout=timeout)
        if status != 200:
            return None
        keys = json.loads(text).get("keys") or []
        return keys[0].get("level", 0.0) if keys else 0.0


class Nginx:
    """One nginx host: the project's nginx with the module, in its
    namespace, with its own prefix and zone."""

    def __init__(self, net, node, relay, roots, workdir, faketime=None):
        self.net = net
        self.node = node
        self.address = net.inner(node)
        self.prefix = os.path.join(workdir, node)
        # "all": every clock through libfaketime; "wall": CLOCK_REALTIME only.
        self.faketime_clocks = faketime
        self.faketime = os.path.join(self.prefix, "faketime") if faketime else None
        for d in ("conf", "logs", "html"):
            os.makedirs(os.path.join(self.prefix, d), exist_ok=True)
        with open(os.path.join(self.prefix, "html/index.html"), "w") as f:
            f.write("ok\n")
        # Sent at 1 KB/s: a request lasts far longer than a case.
        with open(os.path.join(self.prefix, "html/big.bin"), "wb") as f:
            f.write(b"x" * (1 << 20))
        root_urls = " ".join(relay.url(node, j) for j in range(len(roots)))
        self.conf = os.path.join(self.prefix, "conf/nginx.conf")
        with open(self.conf, "w") as f:
            f.write(
                f"load_module {MODULE};\n"
                "user root root;\n"
                "worker_processes 2;\n"
                # nginx clears the workers' environment: libfaketime in
                # them needs its settings kept.
                + ("env LD_PRELOAD;\nenv FAKETIME_TIMESTAMP_FILE;\nenv FAKETIME_CACHE_DURATION;\n"
                   "env FAKETIME_DONT_FAKE_MONOTONIC;\n"
                   if faketime else "")
                + 
                "error_log logs/error.log notice;\n"
                "pid logs/nginx.pid;\n"
                "events { worker_connections 1024; }\n"
                "http {\n"
                "    access_log off;\n"
                "    sluice_zone 1m;\n"
                f"    sluice_root {root_urls};\n"
                f"    sluice_sync_interval {INTERVAL};\n"
                f"    sluice_sync_token_file {workdir}/sync.token;\n"
                f"    sluice_host_id {node};\n"
                "    server {\n"
                f"        listen {self.address}:{NGINX_PORT};\n"
                "        root html;\n"
                f"        location /q/ {{ alias html/; sluice api; sluice audit_{node}; }}\n"
                "        location /hold/ { alias html/; sluice slots; sluice slots_key key=fleet;"
                " limit_rate 1k; }\n"
                "        location = /metrics { sluice_metrics; }\n"
                "    }\n"
                "}\n"
            )
        if self.faketime:
            self.step_clock("+0")

    def env(self):
        if not self.faketime:
            return dict(os.environ)
        return {
            **os.environ,
            "LD_PRELOAD": FAKETIME_LIB,
            "FAKETIME_TIMESTAMP_FILE": self.faketime,
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1" if self.faketime_clocks == "wall" else "0",
        }

    def step_clock(self, offset):
        """Moves every clock of this nginx (wall and monotonic) to
        `offset` from the real ones (libfaketime rereads it within 1 s)."""
        with open(self.faketime + ".tmp", "w") as f:
            f.write(offset + "\n")
        os.replace(self.faketime + ".tmp", self.faketime)

    def nginx(self, *args):
        return subprocess.run(
            self.net.exec(self.node) + [NGINX, "-p", self.prefix, "-c", self.conf, *args],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, env=self.env(),
        )

    def start(self):
        done = self.nginx()
        if done.returncode != 0:
            raise RuntimeError(f"nginx {self.node}: {done.stderr}")
        wait_for(f"nginx {self.node} listens", lambda: self.metrics() is not None)

    def master(self):
        try:
            with open(os.path.join(self.prefix, "logs/nginx.pid")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def workers(self):
        master = self.master()
        return children(master) if master else []

    def reload(self):
        master = self.master()
        if master:
            os.kill(master, signal.SIGHUP)

    def kill_worker(self):
        workers = self.workers()
        if workers:
            os.kill(random.choice(workers), signal.SIGKILL)

    def kill_sync_worker(self):
        """Kills (SIGKILL) the worker running the sync thread (the one
        with a thread named sluice-sync); returns its pid, or None."""
        for pid in self.workers():
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    with open(f"/proc/{pid}/task/{task}/comm") as f:
                        named = f.read().strip() == "sluice-sync"
                except OSError:
                    continue
                if named:
                    os.kill(pid, signal.SIGKILL)
                    return pid
        return None

    def stop(self):
        master = self.master()
        if master:
            try:
                os.kill(master, signal.SIGTERM)
            except OSError:
                return
            try:
                wait_for(f"nginx {self.node} stops", lambda: rss_kib(master) is None, 10)
            except RuntimeError:
                os.kill(master, signal.SIGKILL)

    def metrics(self):
        status, text = http(f"http://{self.address}:{NGINX_PORT}/metrics", timeout=1)
        return text if status == 200 else None

    def roots_up(self, count):
        """True when this host's last sync with every root succeeded."""
        text = self.metrics() or ""
        up = re.findall(r'^sluice_sync_root_up\{[^}]*\} (\S+)', text, re.M)
        return len(up) == count and all(float(v) == 1 for v in up)

    def clock_offsets(self):
        """This host's estimates of each root's clock minus its own, s."""
        text = self.metrics() or ""
        return [float(v) for v in re.findall(
            r"^sluice_sync_root_clock_offset_seconds\{[^}]*\} (\S+)", text, re.M)]

    def syncs(self):
        """Successful syncs so far with each root."""
        text = self.metrics() or ""
        return [float(v) for v in re.findall(
            r"^sluice_sync_root_syncs_total\{[^}]*\} (\S+)", text, re.M)]

    def gauge(self, name):
        text = self.metrics() or ""
        m = re.search(rf"^{name} (\S+)", text, re.M)
        return float(m.group(1)) if m else None


class Cluster:
    """Namespaces, the relay, and per case fresh roots and nginx."""

    def __init__(self, net, workdir):
        self.hosts_names = [n for n in net.nodes if n.startswith("h")]
        self.root_names = [n for n in net.nodes if n.startswith("r")]
        assert "db" in net.nodes
        self.workdir = workdir
        self.net = net
        for name, token in (("admin.token", ADMIN_TOKEN), ("sync.token", SYNC_TOKEN)):
            with open(os.path.join(workdir, name), "w") as f:
                f.write(token)
        self.relay = Relay(self.net, self.hosts_names, self.root_names, workdir)
        self.pg = None
        self.roots = []
        self.hosts = []
        self.loads = []
        self.holds = []

    def postgres(self):
        if self.pg is None:
            self.pg = Postgres(self.net, self.workdir)
        return self.pg

    def begin(self, case, db="sqlite", faketime_host=None, faketime_clocks="all"):
        """Fresh roots over a new database and fresh nginx, quotas set,
        every host synced with every root."""
        self.relay.heal()
        casedir = os.path.join(self.workdir, case)
        os.makedirs(casedir)
        os.chmod(casedir, 0o755)
        for name in ("admin.token", "sync.token"):
            shutil.copy(os.path.join(self.workdir, name), casedir)
        self.roots = []
        for r in self.root_names:
            if db == "postgres":
                url = self.postgres().url(r)
            else:
                url = f"sqlite://{casedir}/quotas.db"
            self.roots.append(Root(self.net, r, url, casedir))
        if db == "postgres":
            # A new, empty schema for this case.
            self.pg.tool("psql", "-h", self.pg.dir, "-p", str(self.pg.port), "-U",
                         "postgres", "-d", "sluice", "-c",
                         "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        for root in self.roots:
            root.start()
        self.roots[0].put("api", {"limit": LIMIT, "low_burst": LOW, "high_burst": HIGH})
        for h in self.hosts_names:
            self.roots[0].put(
                f"audit_{h}", {"limit": 0, "low_burst": AUDIT_BURST, "high_burst": AUDIT_BURST}
            )
        self.roots[0].put("slots", {"limit": SLOTS_LIMIT, "in_flight": True})
        self.roots[0].put("slots_key", {"limit": SLOTS_LIMIT, "in_flight": True, "per_key": True})
        self.hosts = [
            Nginx(self.net, h, self.relay, self.roots, casedir,
                  faketime=faketime_clocks if h == faketime_host else None)
            for h in self.hosts_names
        ]
        for host in self.hosts:
            host.start()
        quotas = 3 + len(self.hosts)
        for host in self.hosts:
            wait_for(
                f"{host.node} holds the quotas and syncs",
                lambda: host.roots_up(len(self.roots)) and host.gauge("sluice_quotas") == quotas,
            )
        return casedir

    def end(self):
        for load in self.loads + self.holds:
            if load.poll() is None:
                load.kill()
                load.wait()
        self.loads = []
        self.holds = []
        for host in self.hosts:
            host.stop()
        for root in self.roots:
            root.kill()
        self.relay.heal()
        self.net.kill_inside()

    def start_load(self, casedir, seconds, start):
        """load.py in every host's namespace; returns the output files."""
        outs = []
        for host, share in zip(self.hosts, SHARES):
            out = os.path.join(casedir, f"load-{host.node}.json")
            outs.append(out)
            self.loads.append(self.client(
                host, "load.py", "--rate", str(OFFERED * share), "--seconds", str(seconds),
                "--start", repr(start), "--out", out,
            ))
        return outs

    def client(self, host, script, *args):
        """Starts `script` of this folder in `host`'s namespace, aimed at
        its nginx."""
        return subprocess.Popen(
            self.net.exec(host.node) + [
                sys.executable, os.path.join(HERE, script),
                "--host", host.address, "--port", str(NGINX_PORT), *args,
            ],
            stdin=subprocess.DEVNULL,
        )

    def start_holds(self, casedir, seconds, churn_until):
        """hold.py in every host's namespace; returns the status files."""
        files = []
        for i, (host, count) in enumerate(zip(self.hosts, HOLDS)):
            status = os.path.join(casedir, f"hold-{host.node}.json")
            files.append(status)
            self.holds.append(self.client(
                host, "hold.py", "--count", str(count), "--seconds", str(seconds),
                "--churn-until", repr(churn_until), "--status", status, "--seed", str(i + 1),
            ))
        return files

    def wait_load(self, outs, timeout):
        deadline = time.monotonic() + timeout
        for load in self.loads:
            load.wait(max(1.0, deadline - time.monotonic()))
        self.loads = []
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
        return results

    def close(self):
        self.end()
        if self.pg:
            self.pg.stop()
        self.relay.stop()


class Loads:
    """The load results of all hosts, by 100 ms bucket."""

    def __init__(self, results):
        self.results = results

    def admitted(self, host, start, end):
        """Requests host `host` saw pass in [start, end) (seconds from the
        load's start)."""
        lo, hi = int(round(start * 10)), int(round(end * 10))
        buckets = self.results[host]["buckets"]
        return sum(row[0] for k, row in buckets.items() if lo <= int(k) < hi)

    def fleet_admitted(self, start, end):
        return sum(self.admitted(h, start, end) for h in range(len(self.results)))

    def errors(self):
        return sum(row[2] for r in self.results for row in r["buckets"].values())

    def error_texts(self):
        return [e for r in self.results for e in r["errors"]]

    def retried(self):
        return sum(r["retried"] for r in self.results)


# ---------------------------------------------------------------------------
# Fault cases. Each takes the cluster and a context, does its fault (blocking
# for as long as the fault lasts) and returns the roots restarted by it.


def relay_fault(cluster, ctx, hosts, **link):
    """Sets the links from `hosts` to r1 as `link` says (see Relay.set)
    for the fault, then heals them; no root is restarted."""
    cluster.relay.set([f"{h}-r1" for h in hosts], **link)
    time.sleep(ctx["fault"])
    cluster.relay.heal()
    return []


def partition_half(cluster, ctx):
    """r1 unreachable from h1 and h2 (both directions, packets lost)."""
    return relay_fault(cluster, ctx, cluster.hosts_names[:2], up="blackhole", down="blackhole")


def asymmetric(cluster, ctx):
    """Every host's syncs reach r1, r1's replies never come back."""
    return relay_fault(cluster, ctx, cluster.hosts_names, up="pass", down="blackhole")


def sync_killed(cluster, ctx):
    """r1's replies lost (as asymmetric); halfway through, every host's sync worker killed (SIGKILL)."""
    cluster.relay.set([f"{h}-r1" for h in cluster.hosts_names], up="pass", down="blackhole")
    time.sleep(ctx["fault"] / 2)
    killed = [h.kill_sync_worker() for h in cluster.hosts]
    if None in killed:
        raise RuntimeError(f"no sync worker found to kill on some host: {killed}")
    time.sleep(ctx["fault"] / 2)
    cluster.relay.heal()
    # How each host's new sync thread took over (from its metrics).
    ctx["takeovers"] = [takeovers(h) for h in cluster.hosts]
    return []


def sync_reloaded(cluster, ctx):
    """r1's replies lost (as asymmetric); halfway through, every host reloaded (SIGHUP)."""
    cluster.relay.set([f"{h}-r1" for h in cluster.hosts_names], up="pass", down="blackhole")
    time.sleep(ctx["fault"] / 2)
    for h in cluster.hosts:
        h.reload()
    time.sleep(ctx["fault"] / 2)
    cluster.relay.heal()
    return []


def takeovers(host):
    """The host's sync takeovers by outcome, from its metrics."""
    found = {"continued": 0, "resent": 0}
    for line in (host.metrics() or "").splitlines():
        m = re.match(r'sluice_sync_takeovers_total\{outcome="(\w+)"\} (\S+)', line)
        if m:
            found[m.group(1)] = int(float(m.group(2)))
    return found


def lossy_link(cluster, ctx):
    """Every link to r1 slow (50 ms each way) and lossy (5% of chunks reset the connection)."""
    return relay_fault(cluster, ctx, cluster.hosts_names, delay_ms=50, drop=0.05)


def stall(cluster, ctx):
    """r1's links held both ways, then everything delivered late."""
    return relay_fault(cluster, ctx, cluster.hosts_names, up="hold", down="hold")


def sigstop(cluster, ctx):
    """r1 stopped (SIGSTOP) for the fault, then continued."""
    root = cluster.roots[0]
    os.kill(root.pid(), signal.SIGSTOP)
    time.sleep(ctx["fault"])
    os.kill(root.pid(), signal.SIGCONT)
    return []


def host_paused(cluster, ctx):
    """h1 paused whole (nginx and its clients, SIGSTOP) for the fault, as a frozen VM."""
    pids = [int(p) for p in sh("ip", "netns", "pids", cluster.net.ns("h1")).split()]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(ctx["fault"])
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    return []


def postgres_kill(cluster, ctx):
    """PostgreSQL killed (SIGKILL) for 5 s under admin writes to both roots."""
    pg = cluster.pg
    writes = ctx.setdefault("writes", [])
    stop = threading.Event()

    def writer():
        k = 0
        while not stop.is_set():
            root = cluster.roots[k % 2]
            started = time.monotonic()
            status, _ = http(
                f"{root.url}/v1/quotas/w{k % 5}", "PUT",
                {"limit": 1000 + k, "low_burst": 1000 + k, "high_burst": 2000 + k},
                ADMIN_TOKEN, 5,
            )
            writes.append((started, root.node, k, status))
            k += 1
            time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(2)
        pg.kill()
        killed = time.monotonic()
        time.sleep(5)
        pg.start()
        ctx["pg_restarted"] = time.monotonic()
        ctx["pg_killed"] = killed
        time.sleep(max(0.0, ctx["fault"] - (time.monotonic() - killed) - 2))
        # Writes go on a few seconds into the after window.
        time.sleep(3)
    finally:
        stop.set()
        thread.join()
    return []


def clock_step(offset, wall_only=False):
    def case(cluster, ctx):
        host = cluster.hosts[0]
        before = host.clock_offsets()
        host.step_clock(offset)
        time.sleep(ctx["fault"])
        # Evidence that the step took: h1's offsets to the roots' clocks
        # moved by the step.
        ctx["clock_offsets"] = {"before": before, "after": host.clock_offsets()}
        return []

    clocks = "wall clock" if wall_only else "clocks (wall and monotonic)"
    case.__doc__ = f"h1's {clocks} stepped {offset} (libfaketime) and left there"
    return case


def reloads_and_kills(cluster, ctx):
    """50 reloads (SIGHUP) and 5 worker kills (SIGKILL), round robin over the hosts."""
    every = ctx["fault"] / 50
    for i in range(50):
        cluster.hosts[i % len(cluster.hosts)].reload()
        if i % 10 == 5:
            cluster.hosts[(i // 10) % len(cluster.hosts)].kill_worker()
        time.sleep(every)
    return []


def root_restarts(cluster, ctx):
    """r1 killed (SIGKILL) and started again every 5 s."""
    started = time.monotonic()
    while time.monotonic() - started < ctx["fault"]:
        time.sleep(5)
        cluster.roots[0].restart()
    return ["r1"]


# name, fault function, fault seconds, options
CASES = [
    ("partition-half", partition_half, 10, {}),
    ("asymmetric", asymmetric, 10, {}),
    # The measurement: replies lost for 4 s and for 30 s, every
    # retry applied again before requests were numbered (4.5 times the
    # truth at 4 s). Now the roots count each unit once.
    ("lost-replies-4s", asymmetric, 4, {}),
    ("lost-replies-30s", asymmetric, 30, {}),
    # A sync thread killed while its requests to r1 go unconfirmed (every
    # worker killed then: nginx respawns it). Before handover records the
    # new thread sent that backlog again as new, and r1 counted it twice;
    # now it continues the dead thread's numbers.
    ("sync-killed", sync_killed, 6, {}),
    # The same with a reload instead: the old sync thread stops with its
    # requests to r1 unconfirmed and leaves them to the new one, which
    # sends them under the old thread's numbers (before, as new: counted
    # twice at r1).
    ("sync-reloaded", sync_reloaded, 6, {}),
    # The root stopped past the in-flight lease (10 s) does not take
    # its own stall for its limiters' silence (`Wakefulness`): before,
    # it forgot their slots when it woke, and per-key slots, which were
    # not sent again, read 3-5 of 6 there.
    ("sigstop-10s", sigstop, 10, {}),
    ("lossy-link", lossy_link, 10, {}),
    ("stall-10s", stall, 10, {}),
    # The real-world form of a forward clock step (below): when h1 wakes
    # up, 10 s passed since its last sync.
    ("host-paused-10s", host_paused, 10, {"lost_bound": LIMIT}),
    ("postgres-kill", postgres_kill, 10, {"db": "postgres"}),
    # A forward step of the monotonic clock is what a host paused for 30 s
    # (a frozen VM) sees; the sync engine asks its roots at once and does
    # not take the 30 s it has not asked them for an outage.
    ("clock+30s", clock_step("+30s"), 10, {"faketime": "h1"}),
    # Backwards, tokio's timers would wait the step out (30 s without a
    # sync, converged 22 s after the fault): the sync loop starts over on
    # a new runtime as soon as its clock watch sees the step.
    ("clock-30s", clock_step("-30s"), 10, {"faketime": "h1"}),
    # What an NTP step does: the wall clock only.
    ("wall+30s", clock_step("+30s", wall_only=True), 10, {"faketime": "h1", "clocks": "wall"}),
    ("wall-30s", clock_step("-30s", wall_only=True), 10, {"faketime": "h1", "clocks": "wall"}),
    ("reloads+kills", reloads_and_kills, 25, {}),
    ("root-restarts", root_restarts, 60, {}),
]
SHORT = ["partition-half", "asymmetric", "sigstop-10s", "lost-replies-4s", "sync-killed",
         "sync-reloaded"]


def run_case(cluster, name, fault, seconds, options):
    log(f"case {name}: setting up")
    casedir = cluster.begin(name, db=options.get("db", "sqlite"),
                            faketime_host=options.get("faketime"),
                            faketime_clocks=options.get("clocks", "all"))
    ctx = {"fault": seconds}
    after = options.get("after", AFTER)
    total = WARM + seconds + after
    start = time.monotonic() + 0.3
    outs = cluster.start_load(casedir, total, start)
    holds = cluster.start_holds(casedir, total + 60, start + total)
    time.sleep(max(0.0, start + WARM - time.monotonic()))
    log(f"case {name}: fault ({fault.__doc__.strip().splitlines()[0]})")
    fault_start = time.monotonic() - start
    restarted = fault(cluster, ctx)
    fault_end = time.monotonic() - start
    log(f"case {name}: fault over after {fault_end - fault_start:.1f} s; sampling")
    # Sample until the load ends: hosts' sync state and roots' audit levels.
    samples = []
    load_end = start + total
    while time.monotonic() < load_end:
        t = time.monotonic() - start
        # Syncing: every host's last sync with every root succeeded, and
        # it synced with each again since the previous sample.
        syncs = [h.syncs() for h in cluster.hosts]
        up = all(h.roots_up(len(cluster.roots)) for h in cluster.hosts) and bool(samples) and all(
            len(now) == len(before) and all(a > b for a, b in zip(now, before))
            for now, before in zip(syncs, samples[-1][4])
        )
        audit = {
            r.node: [r.level(f"audit_{h}") for h in cluster.hosts_names]
            for r in cluster.roots
        }
        api = [r.level("api") for r in cluster.roots]
        samples.append((t, up, audit, api, syncs))
        time.sleep(0.5)
    loads = Loads(cluster.wait_load(outs, 30))
    admitted = [loads.admitted(h, 0, 1e9) for h in range(len(cluster.hosts))]

    def audit_levels():
        return {r.node: [r.level(f"audit_{h}", 2) for h in cluster.hosts_names]
                for r in cluster.roots}

    def settled():
        levels = audit_levels()
        return all(
            all(v is not None and v >= a for v, a in zip(levels[r.node], admitted))
            for r in cluster.roots if r.node not in restarted
        )

    # The last deltas reach the roots within a few intervals; what never
    # does is reported as lost below.
    try:
        wait_for("the roots hold every admitted unit", settled, timeout=10, every=0.25)
    except RuntimeError:
        pass
    time.sleep(1.0)  # anything still in flight would show as a double count
    final = audit_levels()
    in_flight = in_flight_exact(cluster, holds, start + total)

    lost = dup = 0
    per_root = {}
    for r in cluster.roots:
        if r.node in restarted:
            per_root[r.node] = None
            continue
        diffs = [(v if v is not None else 0) - a for v, a in zip(final[r.node], admitted)]
        per_root[r.node] = diffs
        lost += sum(-d for d in diffs if d < 0)
        dup += sum(d for d in diffs if d > 0)

    before_end = [loads.admitted(h, 0, fault_end) for h in range(len(cluster.hosts))]
    converge = None
    for t, up, audit, _, _ in samples:
        caught_up = all(
            all(v is not None and v >= a for v, a in zip(audit[r.node], before_end))
            for r in cluster.roots if r.node not in restarted
        )
        if up and caught_up:
            converge = t - fault_end
            break

    # How far apart the roots' levels of `api` were after the fault (r1
    # minus r2 where the difference was largest): repeats a root counted
    # twice show as r1 above r2, weight it missed as r1 below.
    gaps = [api[0] - api[1] for _, _, _, api, _ in samples if None not in api]
    row = {
        "api_gap": round(max(gaps, key=abs), 1) if gaps else None,
        "api_gap_end": round(gaps[-1], 1) if gaps else None,
        "case": name,
        "fault": fault.__doc__.strip().splitlines()[0],
        "fault_s": round(fault_end - fault_start, 1),
        "during": loads.fleet_admitted(fault_start, fault_end)
        / (LIMIT * (fault_end - fault_start)),
        "after": loads.fleet_admitted(fault_end, total) / (LIMIT * (total - fault_end)),
        "errors": loads.errors(),
        "error_texts": loads.error_texts()[:5],
        "retried": loads.retried(),
        "admitted": admitted,
        "lost": lost,
        "dup": dup,
        "per_root": per_root,
        "restarted": restarted,
        "lost_bound": options.get("lost_bound", 0),
        "dup_bound": options.get("dup_bound", 0),
        "converge_s": None if converge is None else round(max(converge, 0.0), 1),
        "in_flight": in_flight,
    }
    if "clock_offsets" in ctx:
        row["clock_offsets"] = ctx["clock_offsets"]
    if "takeovers" in ctx:
        row["takeovers"] = ctx["takeovers"]
    if "writes" in ctx:
        writes = ctx["writes"]
        failed = [w for w in writes if w[3] not in (200, 201)]
        recovered = [w for w in writes if w[0] >= ctx["pg_restarted"] and w[3] in (200, 201)]
        row["writes"] = {
            "total": len(writes),
            "failed": len(failed),
            "failed_statuses": sorted({str(w[3]) for w in failed}),
            "ok_after_restart_s": round(recovered[0][0] - ctx["pg_restarted"], 1)
            if recovered else None,
        }
        # The last write made is what both roots serve.
        last = max((w for w in writes if w[3] in (200, 201)), key=lambda w: w[2], default=None)
        if last:
            name_w = f"w{last[2] % 5}"
            seen = [
                json.loads(http(f"{r.url}/v1/quotas/{name_w}", token=ADMIN_TOKEN)[1]).get("limit")
                for r in cluster.roots
            ]
            row["writes"]["last_write_served"] = all(s == 1000 + last[2] for s in seen)
    log(f"case {name}: {summary(row)}")
    cluster.end()
    return row


def held_now(holds):
    """Requests open across the hosts by their clients' count, or None
    while a holder is still churning or has not written yet."""
    total = 0
    for path in holds:
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return None
        if state["churning"]:
            return None
        total += state["open"]
    return total


def in_flight_exact(cluster, holds, churn_end):
    """Waits until every root's levels of `slots` and `slots_key` equal
    the requests open across the hosts: how long that took from the churn's
    end, or the levels last seen when it did not within IN_FLIGHT_EXACT."""
    deadline = max(time.monotonic(), churn_end) + IN_FLIGHT_EXACT
    while True:
        held = held_now(holds)
        levels = {r.node: [r.level("slots", 2), r.key_level("slots_key", 2)]
                  for r in cluster.roots}
        exact = held is not None and all(
            v is not None and round(v) == held for pair in levels.values() for v in pair
        )
        if exact or time.monotonic() >= deadline:
            after = time.monotonic() - churn_end
            return {
                "held": held,
                "levels": levels,
                "exact": exact,
                "after_s": round(max(after, 0.0), 1),
            }
        time.sleep(0.1)


def summary(row):
    lost = "n/a" if row["per_root"] and all(v is None for v in row["per_root"].values()) else row["lost"]
    return (
        f"during {row['during']:.2f}, after {row['after']:.2f}, errors {row['errors']} "
        f"(retried {row['retried']}), lost {lost}, dup {row['dup']}, "
        f"converge {row['converge_s']} s, in flight {in_flight_cell(row)}"
    )


def in_flight_cell(row):
    """The in-flight column: open requests, each root's `slots` and
    `slots_key` levels, and how long after the churn they were exact."""
    f = row.get("in_flight")
    if not f:
        return "-"
    levels = ", ".join(
        f"{node}: " + " / ".join("-" if v is None else f"{v:g}" for v in pair)
        for node, pair in f["levels"].items()
    )
    when = f"exact after {f['after_s']} s" if f["exact"] else f"NOT exact after {f['after_s']} s"
    return f"{f['held']} open; {levels}; {when}"


def table(rows):
    lines = [
        "| case | fault | admitted/limit during | after | client errors (retried) "
        "| lost / double counted at the roots | `api` level r1 - r2 after: widest, at the end "
        "| converged after | in-flight: open, roots' `slots` / `slots_key` |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        roots = ", ".join(
            f"{name}: restarted" if diffs is None else
            f"{name}: -{sum(-d for d in diffs if d < 0):.0f} / +{sum(d for d in diffs if d > 0):.0f}"
            for name, diffs in r["per_root"].items()
        )
        converge = "never" if r["converge_s"] is None else f"{r['converge_s']} s"
        lines.append(
            f"| {r['case']} | {r['fault']} ({r['fault_s']} s) | {r['during']:.2f} | "
            f"{r['after']:.2f} | {r['errors']} ({r['retried']}) | {roots} | "
            f"{r['api_gap']}, {r.get('api_gap_end')} | "
            f"{converge} | {in_flight_cell(r)} |"
        )
    for r in rows:
        if "writes" in r:
            w = r["writes"]
            lines.append(
                f"\n{r['case']}: {w['total']} admin writes, {w['failed']} refused while the "
                f"database was down (status {', '.join(w['failed_statuses']) or '-'}), the first "
                f"accepted {w['ok_after_restart_s']} s after PostgreSQL was back; both roots "
                f"serve the last write: {'yes' if w.get('last_write_served') else 'NO'}."
            )
        if "takeovers" in r:
            per_host = ", ".join(f"{t['continued']}/{t['resent']}" for t in r["takeovers"])
            lines.append(
                f"\n{r['case']}: sync takeovers per host (continued from the handover "
                f"record / resent as new): {per_host}."
            )
        if "clock_offsets" in r:
            before, after = r["clock_offsets"]["before"], r["clock_offsets"]["after"]
            moved = ", ".join(f"{a - b:+.1f} s" for a, b in zip(after, before))
            lines.append(
                f"\n{r['case']}: h1's clock offset to each root moved by {moved} "
                "over the fault (0 while its sync thread waits)."
            )
    return "\n".join(lines)


def check(rows):
    """What must hold in every case; returns the failures."""
    failures = []
    for r in rows:
        if r["errors"]:
            failures.append(f"{r['case']}: {r['errors']} client errors: {r['error_texts']}")
        if r["lost"] > r["lost_bound"]:
            failures.append(f"{r['case']}: {r['lost']} units admitted never reached a root "
                            f"(bound {r['lost_bound']})")
        if r["dup"] > r.get("dup_bound", 0):
            failures.append(f"{r['case']}: {r['dup']} units counted twice at the roots "
                            f"(bound {r.get('dup_bound', 0)})")
        if r["converge_s"] is None:
            failures.append(f"{r['case']}: did not converge before the load ended")
        if not 0.7 <= r["after"] <= 1.3:
            failures.append(f"{r['case']}: admitted/limit after the fault {r['after']:.2f}")
        f = r.get("in_flight")
        if f is not None:
            if not f["exact"]:
                failures.append(
                    f"{r['case']}: in-flight slots not exact at the roots within "
                    f"{IN_FLIGHT_EXACT} s of the churn's end: {in_flight_cell(r)}"
                )
        if "takeovers" in r and any(t["continued"] < 1 or t["resent"] for t in r["takeovers"]):
            failures.append(f"{r['case']}: a killed sync thread was not taken over from its "
                            f"handover record on every host: {r['takeovers']}")
        if "writes" in r and not r["writes"].get("last_write_served"):
            failures.append(f"{r['case']}: the last admin write is not what both roots serve")
    return failures


# ---------------------------------------------------------------------------
# Soak


def soak(cluster, minutes):
    """Two nginx at twice the limit for `minutes`; r2 restarted every 3
    minutes and h1 reloaded every 2 (r1 and h2 run throughout, so their
    memory is comparable); samples every minute."""
    casedir = cluster.begin("soak")
    hosts, roots = cluster.hosts[:2], cluster.roots
    cluster.hosts[2].stop()
    total = minutes * 60.0
    start = time.monotonic() + 0.3
    outs = []
    for host, share in zip(hosts, [0.6, 0.4]):
        out = os.path.join(casedir, f"load-{host.node}.json")
        outs.append(out)
        cluster.loads.append(
            subprocess.Popen(
                cluster.net.exec(host.node) + [
                    sys.executable, os.path.join(HERE, "load.py"),
                    "--host", host.address, "--port", str(NGINX_PORT),
                    "--rate", str(OFFERED * share), "--seconds", str(total),
                    "--start", repr(start), "--out", out,
                ],
                stdin=subprocess.DEVNULL,
            )
        )
    samples = []
    events = []
    minute = 0
    # Off the minute marks, so a sample never lands on a reload or a restart.
    next_restart, next_reload = 150.0, 90.0
    prev_admitted = {h.node: 0.0 for h in hosts}
    while True:
        now = time.monotonic() - start
        if now >= total and minute >= int(total // 60):
            break
        if now >= next_restart:
            roots[1].restart()
            events.append((round(now), "restart r2"))
            next_restart += 180
        if now >= next_reload:
            hosts[0].reload()
            events.append((round(now), "reload h1"))
            next_reload += 120
        if now >= (minute + 1) * 60:
            minute += 1
            row = {"minute": minute}
            for r in roots:
                row[f"{r.node}_rss_mib"] = (rss_kib(r.pid()) or 0) / 1024
            for h in hosts:
                workers = sorted(h.workers())
                anon = [(rss_kib(w, "RssAnon") or 0) / 1024 for w in workers]
                shared = [(rss_kib(w, "RssShmem") or 0) / 1024 for w in workers]
                # Private memory per worker (the one with the sync thread
                # is the larger) and the zone pages touched.
                row[f"{h.node}_worker_anon_mib"] = max(anon, default=0.0)
                row[f"{h.node}_workers_anon_mib"] = sum(anon)
                row[f"{h.node}_zone_rss_mib"] = max(shared, default=0.0)
                text = h.metrics() or ""
                passed = re.search(r'^sluice_checks_total\{quota="api",result="passed"\} (\S+)',
                                   text, re.M)
                count = float(passed.group(1)) if passed else 0.0
                row[f"{h.node}_admitted"] = count - prev_admitted[h.node]
                prev_admitted[h.node] = count
                quotas = h.gauge("sluice_quotas") or 0
                capacity = h.gauge("sluice_table_capacity") or 1
                row[f"{h.node}_zone_fill"] = quotas / capacity
            row["admitted_per_limit"] = sum(row[f"{h.node}_admitted"] for h in hosts) / (60 * LIMIT)
            samples.append(row)
            log("soak: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in row.items()))
        time.sleep(1.0)
    loads = Loads(cluster.wait_load(outs, 60))
    cluster.end()
    return samples, events, loads


def soak_report(samples, events, errors, retried, minutes):
    # The JSON has more (per-host admitted counts, the larger worker).
    keys = [k for k in samples[0]
            if k != "minute" and not k.endswith("_admitted") and "_worker_" not in k
            ] if samples else []
    lines = [f"Soak: {minutes} min, two nginx at 2x the limit, r2 restarted every 3 min "
             "(from 2.5), h1 reloaded every 2 (from 1.5); sampled each minute.", ""]
    lines.append("| minute | " + " | ".join(keys) + " |")
    lines.append("|---" * (len(keys) + 1) + "|")
    for s in samples:
        cells = []
        for k in keys:
            v = s[k]
            cells.append(f"{v:.1%}" if k.endswith("fill") else
                         f"{v:.2f}" if k == "admitted_per_limit" else f"{v:.1f}")
        lines.append(f"| {s['minute']} | " + " | ".join(cells) + " |")
    verdicts = []
    # r1 and h2's workers run throughout: their memory after the first two
    # minutes (warm-up, allocator pools) against the end. More than 1 MiB
    # and 5% is growth; the slope says how fast.
    for key in ("r1_rss_mib", "h2_workers_anon_mib"):
        series = [s[key] for s in samples[2:]]
        if len(series) < 2:
            verdicts.append(f"{key}: too short to tell")
            continue
        grew = series[-1] - series[0]
        verdict = "grew" if grew > max(1.0, 0.05 * series[0]) else "did not grow"
        slope = grew / (len(series) - 1) * 1024
        verdicts.append(
            f"{key}: {series[0]:.1f} -> {series[-1]:.1f} MiB, {slope:+.0f} KiB/min ({verdict})"
        )
    zone = [s["h2_zone_rss_mib"] for s in samples]
    if zone:
        # Shared pages count once a process touches them: the workers'
        # share of the zone grows until they have touched all of it, and
        # the key sweep walks the whole keys region once an hour.
        verdicts.append(
            f"h2's zone pages touched (shared, bounded by sluice_zone + sluice_keys = "
            f"{ZONE_MIB} MiB): {zone[0]:.1f} -> {zone[-1]:.1f} MiB"
        )
    lines += ["", "Memory: " + "; ".join(verdicts)]
    lines.append(f"Client errors: {errors} (retried on closed keep-alive: {retried})")
    lines.append("Events: " + ", ".join(f"{t}s {e}" for t, e in events))
    return "\n".join(lines), any("(grew)" in v for v in verdicts)


# sluice_zone 1m and the default sluice_keys 16m.
ZONE_MIB = 17


# ---------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    cases = sub.add_parser("cases")
    cases.add_argument("--short", action="store_true", help="only the short cases")
    cases.add_argument("names", nargs="*")
    table_p = sub.add_parser("table", help="print the table of a cases JSON file")
    table_p.add_argument("json")
    report_p = sub.add_parser("soak-report", help="print the report of a soak JSON file")
    report_p.add_argument("json")
    soak_p = sub.add_parser("soak")
    soak_p.add_argument("--minutes", type=float,
                        default=float(os.environ.get("SOAK_MINUTES", "30")))
    args = parser.parse_args()
    if args.what == "table":
        with open(args.json) as f:
            print(table(json.load(f)))
        return 0
    if args.what == "soak-report":
        with open(args.json) as f:
            soaked = json.load(f)
        print(soak_report(soaked["samples"], soaked["events"], soaked.get("errors", "?"),
                          soaked.get("retried", "?"), soaked.get("minutes", "?"))[0])
        return 0
    if os.geteuid() != 0:
        sys.exit("faults.py: must run as root (network namespaces)")
    for path in (NGINX, MODULE, SLUICE):
        if not os.path.exists(path):
            sys.exit(f"faults.py: {path} is missing: make nginx module bin")

    run_id = os.environ.get("FAULTS_RUN") or f"sf{random.randrange(16**4):04x}"
    os.makedirs(OUT_DIR, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=f"{run_id}-", dir="/tmp")
    os.chmod(workdir, 0o755)
    # SIGTERM (make's timeout, a CI cancel) unwinds like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = None
    net = Net(run_id, ["h1", "h2", "h3", "r1", "r2", "db"])
    try:
        net.up()
        cluster = Cluster(net, workdir)
        if args.what == "soak":
            samples, events, loads = soak(cluster, args.minutes)
            report, grew = soak_report(samples, events, loads.errors(), loads.retried(),
                                       args.minutes)
            print(report)
            with open(os.path.join(OUT_DIR, "soak.md"), "w") as f:
                f.write(report + "\n")
            with open(os.path.join(OUT_DIR, "soak.json"), "w") as f:
                json.dump({"samples": samples, "events": events, "minutes": args.minutes,
                           "errors": loads.errors(), "retried": loads.retried()}, f, indent=1)
            if loads.errors() or grew:
                print("FAIL: client errors or memory growth; see the report", file=sys.stderr)
                return 1
            return 0
        selected = [c for c in CASES
                    if (not args.names or c[0] in args.names)
                    and (not args.short or c[0] in SHORT)]
        unknown = set(args.names) - {c[0] for c in CASES}
        if unknown:
            sys.exit(f"faults.py: unknown cases {sorted(unknown)}; known: {[c[0] for c in CASES]}")
        rows = []
        for name, fault, seconds, options in selected:
            if options.get("faketime") and not os.path.exists(FAKETIME_LIB):
                sys.exit(f"faults.py: {FAKETIME_LIB} missing: apt-get install faketime (make deps)")
            rows.append(run_case(cluster, name, fault, seconds, options))
        text = table(rows)
        print(text)
        suffix = "-short" if args.short else ""
        with open(os.path.join(OUT_DIR, f"cases{suffix}.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(OUT_DIR, f"cases{suffix}.json"), "w") as f:
            json.dump(rows, f, indent=1)
        failures = check(rows)
        for failure in failures:
            print(f"FAIL {failure}", file=sys.stderr)
        return 1 if failures else 0
    finally:
        if cluster is not None:
            try:
                cluster.close()
            except Exception as e:  # cleanup must go on
                log(f"cleanup: {e}")
        net.down()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
