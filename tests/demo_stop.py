"""`make run` (nginx-conf/demo.sh) stops what it started however it ends.

Each case starts the real demo (a `sluice root` and an nginx on 127.0.0.1
ports 7070, 8080 and 8081) in a scratch directory, as a terminal would run
it: in a process group of its own, Ctrl-C not ignored, its output through
a pipe. Then:

- Ctrl-C after the pipe's reader died (`make run | tee log`: tee dies of
  the same Ctrl-C, and the demo's own messages then have nowhere to go):
  the demo exits 0 and nothing listens any more;
- a hang-up (the terminal closed): the same;
- a demo killed outright leaves its servers behind: the next one says an
  nginx it started earlier runs, and prints the command that stops it;
  that command and the root's work.

While it runs, the demo prints the console's address plainly (not a
macOS `open` command) and the root's log in run/logs is plain text (no
colour codes).

Standard library only; run by `make test-demo` (and `make test`). About
20 s; every wait is bounded.
"""

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "nginx-conf", "demo.sh")
PORTS = (7070, 8080, 8081)


def listening(port):
    """True when something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# Process groups of the demos started, for the cleanup after a failure.
GROUPS = []


def start(run_dir):
    """The demo, in a process group of its own with SIGINT at its default
    (a background job's ignored SIGINT would be inherited otherwise)."""
    env = dict(os.environ, SLUICE_DEMO_DIR=run_dir)
    proc = subprocess.Popen(
        [DEMO],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    GROUPS.append(proc.pid)
    return proc


def read_until(proc, pattern, timeout=60.0):
    """The demo's output up to the first line matching `pattern`."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(timeout=deadline - time.monotonic()):
            break
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        out += chunk
        if re.search(pattern, out.decode(errors="replace"), re.M):
            return out.decode(errors="replace")
    raise AssertionError(f"no {pattern!r} from the demo within {timeout} s:\n{out.decode()}")


def nothing_listens(timeout=10.0):
    """Waits until no demo port is listening; the ports still listening."""
    deadline = time.monotonic() + timeout
    while True:
        busy = [p for p in PORTS if listening(p)]
        if not busy or time.monotonic() > deadline:
            return busy


def pid_in(path):
    """The pid in a pid file, or None."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def alive(pid):
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stopped_by(run_dir, how):
    """Starts the demo, waits until it serves, ends it with `how` and
    checks it stopped everything and exited 0."""
    demo = start(run_dir)
    out = read_until(demo, r"^Ctrl-C stops nginx and the root\.$")
    assert all(listening(p) for p in PORTS), "the demo's servers listen"
    assert re.search(r"^  console: http://127\.0\.0\.1:7070/ui ", out, re.M), out
    assert not re.search(r"^\s*open ", out, re.M), "no macOS `open` command:\n" + out
    with open(os.path.join(run_dir, "logs", "root.log"), "rb") as f:
        log = f.read()
    assert log and b"\x1b" not in log, f"the root's log is plain text: {log[:300]!r}"
    nginx_pid = pid_in(os.path.join(run_dir, "logs", "nginx.pid"))
    how(demo)
    code = demo.wait(timeout=30)
    busy = nothing_listens()
    assert not busy, f"still listening after the demo stopped: {busy}"
    assert not alive(nginx_pid), "the nginx master is gone"
    assert code == 0, f"the demo exited {code}, not 0"


def ctrl_c_after_the_pipe_died(demo):
    # `tee` dies of the same Ctrl-C: the pipe's reader is gone first.
    demo.stdout.close()
    os.killpg(demo.pid, signal.SIGINT)


def hang_up(demo):
    demo.stdout.close()
    os.killpg(demo.pid, signal.SIGHUP)


def leftovers_are_named_with_the_command_that_stops_them(run_dir):
    first = start(run_dir)
    read_until(first, r"^Ctrl-C stops nginx and the root\.$")
    # No trap runs for SIGKILL: nginx and the root stay up.
    first.kill()
    first.wait(timeout=10)
    first.stdout.close()
    second = start(run_dir)
    out = second.communicate(timeout=30)[0].decode()
    assert second.returncode == 1, f"the second demo exited {second.returncode}:\n{out}"
    assert "port 8080 on 127.0.0.1 is in use" in out, out
    assert "an nginx an earlier 'make run' started still runs" in out, out
    assert "a quota root an earlier 'make run' started still runs" in out, out
    commands = re.findall(r"^  (\S.*)$", out, re.M)
    assert any(c.endswith("-s quit") for c in commands), out
    for command in commands:
        subprocess.run(command, shell=True, check=True, timeout=30)
    busy = nothing_listens()
    assert not busy, f"the printed commands left {busy} listening"


def main():
    for binary in ("build/nginx/sbin/nginx", "target/release/sluice"):
        if not os.access(os.path.join(REPO, binary), os.X_OK):
            sys.exit(f"demo_stop: {binary} is missing (make nginx module bin)")
    busy = [p for p in PORTS if listening(p)]
    if busy:
        print(f"demo_stop: SKIPPED: ports {busy} on 127.0.0.1 are in use (the demo needs them)")
        return
    cases = [
        ("Ctrl-C after the output pipe died", lambda d: stopped_by(d, ctrl_c_after_the_pipe_died)),
        ("a hang-up", lambda d: stopped_by(d, hang_up)),
        ("leftovers of a killed demo", leftovers_are_named_with_the_command_that_stops_them),
    ]
    failed = 0
    for name, case in cases:
        with tempfile.TemporaryDirectory(prefix="sluice-demo-") as run_dir:
            try:
                case(run_dir)
                print(f"ok - {name}")
            except Exception as e:  # one failed case is reported, the others run
                failed += 1
                print(f"not ok - {name}: {e}")
            finally:
                # Whatever a failed case left: the demos' process groups
                # (the root is in its demo's) and the nginx it started.
                for group in GROUPS:
                    try:
                        os.killpg(group, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                GROUPS.clear()
                nginx_pid = pid_in(os.path.join(run_dir, "logs", "nginx.pid"))
                if alive(nginx_pid):
                    os.kill(nginx_pid, signal.SIGTERM)
                nothing_listens()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
