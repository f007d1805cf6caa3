"""Smoke test of ``benchmarks/purge_batch.py``: it runs on a small history and prints
what it promises (figures are not asserted here; the target lives in the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.helpers import REPO

pytestmark = pytest.mark.e2e

PURGE_BATCH = REPO / "benchmarks" / "purge_batch.py"


def test_purge_batch_json() -> None:
    args = ["--history", "1000", "--active", "20", "--batch", "100", "--skip-postgres", "--json"]
    proc = subprocess.run(
        [sys.executable, str(PURGE_BATCH), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["postgres"] is None
    sqlite = result["sqlite"]
    purged = sqlite["purged"]
    # half the history finished over 30 days ago; the two it held jobs need stay
    assert 400 < purged["jobs"] < 500 and purged["attempts"] == purged["jobs"]
    assert purged["events"] == 6 * purged["jobs"]
    assert sqlite["batches"] >= -(-purged["jobs"] // 100)  # 100 jobs per batch at most
    assert 0 < sqlite["batch_p50_s"] <= sqlite["batch_max_s"]
    assert sqlite["heartbeat_during_max_s"] is not None
