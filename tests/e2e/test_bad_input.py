"""The real ``ebb`` on the inputs a fault run found crashing or accepted: each is refused
with exit code 1 and one ``ebb: error:`` line naming what is wrong (no traceback), and
nothing is submitted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.helpers import EBB, ebb, ebb_env, ebb_json

pytestmark = pytest.mark.e2e

HUGE = "99999999999999999999"  # past 2**63 - 1
ALLOWED_SIGNALS = "use one of TERM, INT, HUP, USR1, USR2, QUIT, ALRM, XCPU"


def _refused(env: dict[str, str], args: list[str | bytes], *words: str) -> str:
    """Run ``ebb ARGS``; assert one clear error line holding ``words``; return it."""
    proc = subprocess.run([*EBB, *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ebb: error: "), proc.stderr
    for word in words:
        assert word in lines[0], proc.stderr
    return lines[0]


def _nothing_submitted(env: dict[str, str]) -> None:
    clean = {k: v for k, v in env.items() if k != "EBBTIDE_POLICY"}
    assert ebb_json(clean, "qstat") == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["qsub", "-l", "gpu=inf", "--", "echo"], ["-l gpu:", "'inf'"]),
        (["qsub", "-l", "gpu=1e-300", "--", "echo"], ["-l gpu:", "'1e-300'"]),
        (["qsub", "-l", "gpu=nan", "--", "echo"], ["-l gpu:", "'nan'"]),
        (["qsub", "-l", "gpu=33.333%", "--", "echo"], ["-l gpu:", "two decimals"]),
        (["qsub", "-l", "gpu=65", "--", "echo"], ["-l gpu:", "at most 64"]),
        (["qsub", "-l", f"gpumem={HUGE}TiB", "--", "echo"], ["-l gpumem:", "1TiB"]),
        (["qsub", "-l", f"walltime={HUGE}", "--", "echo"], ["-l walltime:", "366 days"]),
        (["qsub", "--deadline", "1ms", "--", "echo"], ["--deadline:", "at least 1s"]),
        (["qsub", "-J", f"0-{HUGE}", "--", "echo"], ["-J:", "2147483647"]),
        (["qsub", "-J", "1-10%1000000", "--", "echo"], ["-J:", "100000"]),
        (["qsub", "-p", HUGE, "--", "echo"], ["-p:", "-1024 to 1023"]),
        (["qsub", "--max-attempts", HUGE, "--", "echo"], ["--max-attempts:", "1 to 100"]),
        (["qsub", "-W", f"depend=afterok:{HUGE}", "--", "echo"], ["-W:", "9223372036854775807"]),
        (["qsub", "--signal", "KILL", "--", "echo"], ["--signal: KILL", ALLOWED_SIGNALS]),
        (["qsub", "--signal", "STOP", "--", "echo"], ["--signal: STOP", ALLOWED_SIGNALS]),
        (["qsub", "--signal", "9", "--", "echo"], ["--signal: KILL", ALLOWED_SIGNALS]),
        (["qsub", "--signal", "SEGV", "--", "echo"], ["--signal: SEGV", ALLOWED_SIGNALS]),
        (["qsub", "-v", "1A=2", "--", "echo"], ["-v:", "variable name"]),
        (["qsub", "--", "echo", b"\xff"], ["command:", "not valid UTF-8"]),
        (["qsub", "/dev/zero"], ["SCRIPT:", "'/dev/zero' is a character device"]),
        (["qdel", HUGE], ["is not a job id", "9223372036854775807"]),
        (["qdel", f"{HUGE}[]"], ["is not a job id", "9223372036854775807"]),
        (["qhold", HUGE], ["is not a job id", "9223372036854775807"]),
        (["qstat", "-f", HUGE], ["is not a job id", "9223372036854775807"]),
        (["events", HUGE], ["is not a job id", "9223372036854775807"]),
    ],
)
def test_command_line_traps(tmp_path: Path, args: list[str | bytes], words: list[str]) -> None:
    env = ebb_env(tmp_path)
    _refused(env, args, *words)
    _nothing_submitted(env)


def _script(tmp_path: Path, content: bytes) -> str:
    path = tmp_path / "job.sh"
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"#!/bin/sh\n" + b"#" * (1024 * 1024) + b"\n", ["SCRIPT:", "at most 1048576"]),
        (b"#!/bin/sh\necho \x00\n", ["SCRIPT:", "NUL byte"]),
        (b"#!/bin/sh\n#PBS -l gpu=inf\necho\n", ["job.sh line 2: -l gpu:"]),
        (b"#!/bin/sh\n#EBB --signal KILL\necho\n", ["job.sh line 2: --signal: KILL"]),
        (b"#!/bin/sh\n#PBS -J 0-" + HUGE.encode() + b"\necho\n", ["job.sh line 2: -J:"]),
        (b"#!/bin/sh\n#PBS -v A=B=C,1X=2\necho\n", ["job.sh line 2: -v:", "'1X=2'"]),
    ],
)
def test_script_traps(tmp_path: Path, content: bytes, words: list[str]) -> None:
    env = ebb_env(tmp_path / "home")
    _refused(env, ["qsub", _script(tmp_path, content)], *words)
    _nothing_submitted(env)


def test_fifo_script_is_refused_without_hanging(tmp_path: Path) -> None:
    env = ebb_env(tmp_path / "home")
    fifo = tmp_path / "job.sh"
    os.mkfifo(fifo)
    _refused(env, ["qsub", str(fifo)], "SCRIPT:", "is a named pipe")
    _nothing_submitted(env)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "defaults:\n  deadline_s: 10s\n  deadline_s: 20s\n",
            [":3:3: defaults.deadline_s: duplicate key (first given on line 2)"],
        ),
        ("defaults:\n  deadline_s: yes\n", [":2:3: defaults.deadline_s:", "boolean true"]),
        ("queues:\n  default: {priority: on}\n", [":2:13: queues.default.priority:", "boolean"]),
        (
            "defaults:\n  heartbeat_timeout_s: 0.000001\n",
            [":2:3: defaults.heartbeat_timeout_s: must be from 2s to 1h"],
        ),
        (
            "windows:\n  - {name: feb, kind: cron, schedule: '0 0 31 2 *', duration: 1h}\n",
            [":2:29: windows.0.schedule:", "never fires"],
        ),
        ("defaults:\n  backoff_max_s: .inf\n", [":2:3: defaults.backoff_max_s:", "finite"]),
        ("defaults:\n  margin_compute_pct: .nan\n", [":2:3: defaults.margin_compute_pct:"]),
        ("admins: " + "[" * 5000 + "]" * 5000 + "\n", [":1:", "nested deeper than 32 levels"]),
    ],
)
def test_policy_traps(tmp_path: Path, text: str, words: list[str]) -> None:
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text(text)
    env = ebb_env(tmp_path / "home", EBBTIDE_POLICY=str(policy))
    line = _refused(env, ["qsub", "--", "echo"], *words)
    assert line.startswith(f"ebb: error: {policy}:")
    _nothing_submitted(env)
    check = ebb(ebb_env(tmp_path / "home"), "policy", "check", str(policy), check=False)
    assert check.returncode == 1 and "Traceback" not in check.stderr
    assert check.stderr.strip().splitlines() == [line]


def test_input_at_the_bounds_still_goes_through(tmp_path: Path) -> None:
    env = ebb_env(tmp_path)
    first = ebb_json(env, "qsub", "--", "echo")["id"]
    out = ebb_json(
        env,
        "qsub",
        "-l",
        "gpu=33.33%,gpumem=1TiB,walltime=366d,deadline=1s",
        "-J",
        "2147483645-2147483647%100000",
        "--signal",
        "XCPU",
        "-W",
        f"depend=afterany:{first}",
        "--",
        "echo",
    )
    assert len(out["tasks"]) == 3
    job = ebb_json(env, "qstat", "-f", str(out["id"]))
    assert job["slice"] == {"compute_pct": 33.33, "gpus": 0, "memory_mib": 1024 * 1024}
