"""Smoke test of ``benchmarks/top_render.py``: it runs on a tiny fleet and prints what it
promises (figures are not asserted here; the target lives in the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.helpers import REPO

pytestmark = pytest.mark.e2e

TOP_RENDER = REPO / "benchmarks" / "top_render.py"


def test_top_render_json() -> None:
    args = ["--gpus", "16", "--attempts", "40", "--frames", "12", "--json"]
    proc = subprocess.run(
        [sys.executable, str(TOP_RENDER), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.strip().splitlines()
    result = json.loads(line)
    assert (result["gpus"], result["attempts"], result["frames"]) == (16, 40, 12)
    assert (result["width"], result["height"]) == (200, 60)
    assert 0 < result["frame_p50_s"] <= result["frame_p99_s"] <= result["frame_max_s"]
    for key in ("build_snapshot_s", "every_row_once_s", "json_s", "json_bytes"):
        assert result[key] > 0, key
    assert result["target_p99_s"] == 0.2 and isinstance(result["met"], bool)


def test_top_render_text() -> None:
    proc = subprocess.run(
        [sys.executable, str(TOP_RENDER), "--gpus", "8", "--attempts", "8", "--frames", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ebb top, 8 GPUs, 8 attempts, 200x60, 3 frames" in proc.stdout
    assert "frame p99" in proc.stdout and "target (frame p99 ≤ 200 ms)" in proc.stdout
