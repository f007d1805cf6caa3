"""Traps an SRE met running a fleet (a trial of 2026-12-07): ``ebb token`` read who is
an admin from ``EBBTIDE_POLICY`` rather than the policy the scheduler published, a far
``--at`` ended in a traceback, a newline in a drain reason made a row of ``ebb nodes``,
``purge --older-than 400d`` was told the wrong forms, and ``qstat -Q`` left out a queue
with no job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ebbtide.cli.main import cli
from ebbtide.queue.store import Store


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def _store(home: Path) -> Store:
    home.mkdir(parents=True, exist_ok=True)
    return Store(f"sqlite:///{home / 'ebbtide.db'}")


def test_token_reads_the_admins_of_the_policy_the_scheduler_published(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(home)
    store.publish_policy("admins: [carol]\n", "/etc/ebbtide/ebbtide.yaml")
    store.close()
    result = run("token", "create", "carol")
    assert result.exit_code == 0, result.output
    assert "ebb token: note: carol is an admin here" in result.stderr
    # a caller's own EBBTIDE_POLICY does not decide it while one is published
    mine = tmp_path / "mine.yaml"
    mine.write_text("admins: [dave]\n")
    monkeypatch.setenv("EBBTIDE_POLICY", str(mine))
    result = run("token", "create", "dave")
    assert result.exit_code == 0, result.output
    assert "is an admin" not in result.stderr
    assert "carol is an admin here" in run("token", "create", "carol").stderr


def test_token_with_no_store_yet_reads_the_policy_file(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text("admins: [erin]\n")
    monkeypatch.setenv("EBBTIDE_POLICY", str(policy))
    result = run("token", "create", "erin")
    assert result.exit_code == 0, result.output
    assert "erin is an admin here" in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["policy", "explain", "--at", "9999-12-31T23:59+00:00"], "--at: expected a time from"),
        (["policy", "explain", "--at", "0001-01-01T00:00+00:00"], "--at: expected a time from"),
        (["report", "--since", "0001-01-01"], "--since: expected a time from 1970 to 9000"),
    ],
)
def test_times_past_the_calendar_are_one_line_errors_naming_the_flag(
    home: Path, args: list[str], says: str
) -> None:
    config = Path(__file__).resolve().parents[2] / "config" / "ebbtide.yaml"  # cron windows
    if args[0] == "policy":
        args = [*args, "--policy", str(config)]
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert says in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_drain_reason_is_one_line(home: Path) -> None:
    store = _store(home)
    store.heartbeat("gpu-a", started_at=time.time(), devices=[{"index": 0, "memory_mib": 81920}])
    store.close()
    result = run("node", "drain", "gpu-a/0", "--reason", "fan\nNODE fake")
    assert result.exit_code == 1, result.output
    assert "reason: must be one line of printable text" in result.output
    assert "drained" not in run("nodes").output  # nothing changed
    assert run("node", "drain", "gpu-a/0", "--reason", "fan").exit_code == 0


def test_purge_past_the_longest_age_says_the_range(home: Path) -> None:
    _store(home).close()
    result = run("admin", "purge", "--older-than", "400d", "--dry-run")
    assert result.exit_code == 1, result.output
    assert "--older-than: must be from 1h to 366d, got 400d" in result.output


def test_qstat_q_lists_every_queue_the_policy_defines(home: Path) -> None:
    store = _store(home)
    store.publish_policy("queues:\n  research: {}\n  extra: {}\n", "/etc/ebbtide/ebbtide.yaml")
    store.close()
    assert run("qsub", "-h", "--", "true").exit_code == 0  # default
    counts = json.loads(run("qstat", "-Q", "--json").stdout)
    assert set(counts) == {"default", "research", "extra"}
    assert counts["default"]["held"] == 1 and sum(counts["extra"].values()) == 0
    table = run("qstat", "-Q").stdout.splitlines()
    assert [line.split()[0] for line in table[1:]] == ["default", "extra", "research"]


def test_a_policy_lists_only_user_names_a_token_can_be_made_for(home: Path, tmp_path: Path) -> None:
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text('admins: ["bad user", ""]\nqueues:\n  q: {users: ["a\\tb"]}\n')
    result = run("policy", "check", str(policy))
    assert result.exit_code == 1, result.output
    for where in ("1:10: admins.0: 'bad user'", "1:22: admins.1: ''", "3:15: queues.q.users.0"):
        assert f"{policy}:{where}" in result.output, result.output
    assert "is not a user name" in result.output
