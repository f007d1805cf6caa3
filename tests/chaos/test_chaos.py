"""The chaos suite: real schedulers, workers and jobs on real Redis and PostgreSQL, with
schedulers and workers killed and paused, job processes killed, Redis restarted empty and
PostgreSQL connections cut — and not one job lost, run twice at once, wrong, late or
stuck (``benchmarks/chaos.py``, here in a shorter run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def test_no_job_is_lost_run_twice_wrong_late_or_stuck(postgres_admin_url: str) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("the chaos suite needs redis-server on PATH")
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--jobs",
            "60",
            "--duration-s",
            "60",
            "--fault-every-s",
            "3",
            "--drain-s",
            "150",
            "--seed",
            "7",
            "--pg",
            postgres_admin_url,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.stdout, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    zeros = {
        k: report[k] for k in ("lost", "double_run_s", "wrong_results", "deadline_misses", "stuck")
    }
    assert zeros == dict.fromkeys(zeros, 0), report["detail"]
    assert proc.returncode == 0
    # the faults really happened, and the jobs really were disturbed
    assert sum(report["faults"].values()) >= 15
    assert report["evictions"] > 0 and report["lost_attempts_requeued"] > 0
