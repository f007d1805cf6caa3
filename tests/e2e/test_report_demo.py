"""End to end: ``ebb report`` on the store of a real run (``ebb demo`` kept in a home of
its own: the scheduler, a node agent, real processes evicted and resumed), as JSON and as a
PNG, agreeing with the summary the demo gives of the same run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.helpers import EBB, ebb, ebb_env

pytestmark = pytest.mark.e2e

SPEEDUP = 4  # the 91 s trace in about 23 s
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_report_of_a_real_run_agrees_with_its_summary_and_draws_it(tmp_path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("matplotlib is in the dev extra: CI=true must draw the plot")
        pytest.skip("matplotlib is not installed (pip install 'ebbtide[plot]')")
    home = tmp_path / "kept" / "home"  # a directory demo --home makes (a traceback once)
    env = ebb_env(home)
    demo = subprocess.run(
        [*EBB, "demo", "--home", str(home), "--speedup", str(SPEEDUP), "--jobs", "3", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert demo.returncode == 0, demo.stderr
    summary = json.loads(demo.stdout)
    png = tmp_path / "report.png"
    proc = ebb(env, "report", "--since", "10m", "--json", "--plot", str(png))
    report = json.loads(proc.stdout)
    overall, log = report["overall"], demo.stderr
    assert overall["jobs"]["submitted"] == summary["jobs_submitted"] == 3, log
    assert overall["jobs"]["succeeded"] == summary["jobs_succeeded"], log
    evictions = overall["evictions"]
    assert evictions["count"] == summary["evictions"], log
    assert evictions["deadline_misses"] == summary["deadline_misses"], log
    assert evictions["killed"] == summary["killed_at_deadline"], log
    assert evictions["lost_work_s"] == pytest.approx(summary["lost_work_s"], abs=0.01)
    if summary["evictions"]:
        assert evictions["latency_max_s"] == pytest.approx(
            summary["eviction_latency_max_s"], abs=1e-3
        )
    assert overall["pauses"]["count"] == summary["pauses"], log
    # the demo counts paused time as harvest; the report does not
    assert 0 < overall["gpu_hours"] * 3600 <= summary["harvested_gpu_s"] + 0.1, log
    assert png.read_bytes().startswith(PNG_SIGNATURE) and png.stat().st_size > 10_000
