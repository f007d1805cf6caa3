"""Smoke test of the benchmark scripts: they run and print what they promise.

Figures are not asserted here (speed targets live in the benchmarks themselves, see
``benchmarks/README.md``); only the shape of the output and the absence of missed deadlines.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.helpers import REPO

pytestmark = pytest.mark.e2e

EVICT_LATENCY = REPO / "benchmarks" / "evict_latency.py"
KEYS = {
    "checkpointed",
    "evictions",
    "p50_s",
    "p99_s",
    "max_s",
    "mean_s",
    "deadline_misses",
    "killed",
}


def test_evict_latency_json() -> None:
    proc = subprocess.run(
        [sys.executable, str(EVICT_LATENCY), "--evictions", "12", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert not KEYS - result.keys(), result
    assert result["evictions"] >= 12
    assert result["deadline_misses"] == 0
    assert result["killed"] == 0  # every job cooperates by default
    assert result["checkpointed"] == result["evictions"]
