"""Helpers that drive real ebbtide processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
EBB = [sys.executable, "-m", "ebbtide.cli.main"]
FINAL = {"succeeded", "failed", "cancelled"}


def ebb_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of ebb commands on ``home``.  ``ebb worker`` runs jobs as the
    agent's user here (``EBBTIDE_RUN_AS=agent``): the tests submit as whoever runs them,
    root in CI, whose jobs an owner-mode worker refuses (tests/e2e/test_run_as_owner.py
    runs one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env.update({"EBBTIDE_HOME": str(home), "PYTHONUNBUFFERED": "1", "EBBTIDE_RUN_AS": "agent"})
    env.update(extra)
    return env


def ebb(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*EBB, *args], env=env, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"ebb {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def ebb_json(env: dict[str, str], command: str, *args: str) -> Any:
    """Run ``ebb COMMAND --json ARGS`` and parse its output."""
    return json.loads(ebb(env, command, "--json", *args).stdout)


def start(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a long-running ebb command (up, scheduler, worker) logging to ``log``."""
    with open(log, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen([*EBB, *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    give_up = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def job(env: dict[str, str], job_id: int) -> dict[str, Any]:
    return ebb_json(env, "qstat", "-f", str(job_id))


def jobs_by_id(env: dict[str, str]) -> dict[int, dict[str, Any]]:
    """Every job, finished ones too, from one ``qstat -x --json``."""
    return {j["id"]: j for j in ebb_json(env, "qstat", "-x")}


def wait_final(env: dict[str, str], job_ids: list[int], timeout: float) -> dict[int, dict]:
    def done() -> dict[int, dict] | None:
        every = jobs_by_id(env)
        jobs = {j: every[j] for j in job_ids}
        return jobs if all(j["state"] in FINAL for j in jobs.values()) else None

    return wait_for(done, timeout, f"jobs {job_ids} to finish", interval=0.5)


def events(env: dict[str, str], job_id: int) -> list[dict[str, Any]]:
    return ebb_json(env, "events", str(job_id))


def write_trace(path: Path, rows: list[tuple[float, int, float, float]]) -> Path:
    lines = ["t_s,device,online_compute_pct,online_memory_mib"]
    lines += [f"{t},{d},{c},{m}" for t, d, c, m in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def submit_count(
    env: dict[str, str], out: Path, n: int, *, name: str, deadline: str, extra: tuple[str, ...] = ()
) -> int:
    res = ebb_json(
        env,
        "qsub",
        "-N",
        name,
        "-l",
        "gpu=20%,gpumem=4GiB",
        "--deadline",
        deadline,
        "--",
        sys.executable,
        str(EXAMPLES / "count.py"),
        str(n),
        "--step-s",
        "0.05",
        "--every",
        "10",
        "--out",
        str(out),
        *extra,
    )
    return int(res["id"])
