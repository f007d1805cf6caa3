"""End to end: ``ebb demo`` replays the shipped real trace on two simulated GPUs, runs its
checkpointing jobs through evictions, and reports a summary that holds the product's bars."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.helpers import EBB, ebb_env

pytestmark = pytest.mark.e2e

SPEEDUP = 3  # the 91 s trace in about 30 s; the tour ends in under 60 s


def test_demo_evicts_within_deadline_and_finishes_every_job(tmp_path):  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [*EBB, "demo", "--speedup", str(SPEEDUP), "--json"],
        env=ebb_env(tmp_path / "home"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    log = proc.stderr
    assert summary["jobs_succeeded"] == summary["jobs_submitted"] == 5, log
    assert all(j["state"] == "succeeded" for j in summary["jobs"]), log
    assert summary["evictions"] >= 1, log
    assert summary["deadline_misses"] == 0, log
    assert summary["eviction_latency_max_s"] is not None, log
    assert 0 < summary["harvested_gpu_s"] < summary["spare_gpu_s"], log
    assert summary["wall_s"] < 60, log
    # the live lines went to stderr: each eviction shows as it happened
    assert "evicted" in log and "resumed" in log, log
