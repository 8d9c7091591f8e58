"""examples/paced_sender.py against a real root: several processes, each its
own limiter, send at one fleet-wide rate through ``reserve``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import paced_sender  # noqa: E402


def test_senders_in_several_processes_keep_to_one_fleet_wide_rate(root):
    # 40 a second in all, 4 at once; 3 processes of 20 messages: 60
    # messages take at least (60 - 4) / 40 = 1.4 s at the fleet's rate,
    # 0.4 s if each process paced only itself.
    paced_sender.create_quota(root.url, "campaign", rate=40, burst=4)
    result = paced_sender.run(root.url, "campaign", processes=3, messages=20,
                              max_wait=1.0, sync_interval_ms=100, timeout=60)
    assert len(result["sent"]) == 60, "no message is lost"
    assert result["per_process"] == {0: 20, 1: 20, 2: 20}
    # The processes learn of each other's reservations a sync later, so
    # the fleet runs a little over the rate at first; each pacing alone
    # would run at three times it.
    assert result["rate"] < 2 * 40, result["rate"]
    # Every reservation was counted once at the root.
    status, quota = root.call("GET", "/v1/quotas/campaign")
    assert status == 200
    assert sorted(entry["limiter"] for entry in quota["limiters"]) == [
        "paced-sender-0", "paced-sender-1", "paced-sender-2"]


def test_the_example_runs_from_the_command_line(root, capsys):
    assert paced_sender.main(["--root", root.url, "--quota", "cli_campaign", "--create",
                              "--rate", "50", "--burst", "5", "--processes", "2",
                              "--messages", "5"]) == 0
    out = capsys.readouterr().out
    assert "10 messages from 2 processes" in out, out


def test_the_example_sends_the_roots_sync_token(tmp_path):
    # A root that wants a sync token answers only limiters that send it:
    # the example passes sync_token to every process's Limiter.
    from conftest import Root

    (tmp_path / "sync.token").write_text("paced-sender-sync-token\n")
    root = Root(tmp_path, "--sync-token-file", str(tmp_path / "sync.token"))
    try:
        paced_sender.create_quota(root.url, "tokened", rate=50, burst=5)
        result = paced_sender.run(root.url, "tokened", processes=2, messages=5,
                                  sync_interval_ms=100, timeout=60,
                                  sync_token="paced-sender-sync-token")
        assert len(result["sent"]) == 10
    finally:
        root.stop()
