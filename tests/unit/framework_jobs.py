"""Playing the node agent for the framework callbacks' tests (``test_integrations_*``).

A training script runs as an attempt would: in a subprocess with the ``EBBTIDE_*``
variables the agent sets (``ebbtide.workers.launch.attempt_env``); the test sends the
warning signal, reads the status file, and starts the next attempt with
``EBBTIDE_RESUME_FROM`` set to the last checkpoint the job reported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
FIXTURES = ROOT / "tests" / "fixtures" / "frameworks"
#: The contract's "checkpointed, requeue me" exit code (ebbtide.queue.spec.REQUEUE_EXIT_CODE).
REQUEUE_EXIT_CODE = 99
#: How long a test waits for a training process to reach a point or end, in seconds
#: (importing torch and a framework takes 5-10 s on a loaded 2-core machine).
WAIT_S = 120.0


def skip_without(*modules: str, extra: str) -> None:
    """Skip the calling test module unless every one of ``modules`` is installed (found
    without importing them: importing a framework takes seconds)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: these tests need the optional extra "
            f"(pip install -e '.[{extra}]'), which is not in the default install",
            allow_module_level=True,
        )


def agent_env(directory: Path, attempt: int = 1, **extra: str) -> dict[str, str]:
    """An attempt's environment, as the node agent sets it (files under ``directory``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # the same arithmetic in every attempt, and a shared CPU
    checkpoints = directory / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    env |= {
        "EBBTIDE_JOB_ID": "7",
        "EBBTIDE_ATTEMPT": str(attempt),
        "EBBTIDE_CHECKPOINT_DIR": str(checkpoints),
        "EBBTIDE_RESUME_FROM": "",
        "EBBTIDE_WARNING_SIGNAL": "TERM",
        "EBBTIDE_STATUS_FILE": str(directory / "status.jsonl"),
        "EBBTIDE_DEADLINE_S": "30",
    }
    return env | extra


def status_lines(directory: Path) -> list[dict[str, Any]]:
    path = directory / "status.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def checkpoints_reported(directory: Path) -> list[Path]:
    return [Path(s["path"]) for s in status_lines(directory) if s["type"] == "checkpoint"]


@dataclass
class Ended:
    code: int
    output: str


def run(command: Sequence[str], env: dict[str, str], cwd: Path) -> Ended:
    """Run one attempt to its end."""
    done = subprocess.run(
        [sys.executable, *command],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=WAIT_S,
    )
    return Ended(done.returncode, done.stdout)


def run_warned(
    command: Sequence[str], env: dict[str, str], cwd: Path, ready: Path, signum: int
) -> Ended:
    """Run one attempt, send it ``signum`` once ``ready`` exists, and wait for its end."""
    proc = subprocess.Popen(
        [sys.executable, *command],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not ready.exists() and proc.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"{command[0]} did not reach its pause in {WAIT_S:g} s")
            time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signum)
        output, _ = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return Ended(proc.returncode, output)


def warning_signal(name: str) -> int:
    return int(signal.Signals[f"SIG{name}"])
