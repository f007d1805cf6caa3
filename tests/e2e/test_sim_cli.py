"""``ebb sim`` end to end: a real process, its JSON and its table, on a small generated
trace; and, where the shared traces are present, on a slice of the real ones."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import EBB, REPO

pytestmark = pytest.mark.e2e

POLICIES = ["ebbtide", "exclusive", "static-night", "greedy"]
METRICS = {
    "harvest_efficiency",
    "utilization_before",
    "utilization_after",
    "interference_compute_frac",
    "oom_events",
    "evictions",
    "evictions_per_gpu_hour",
    "pauses",
    "paused_frac",
    "restart_overhead_frac",
    "deadline_misses",
    "wasted_work_frac",
    "jobs_completed",
    "jct_p50_s",
    "jct_p99_s",
    "sim_wall_s",
}


def shared_traces() -> Path | None:
    """The shared traces: ``$EBBTIDE_TRACES``, else ``shared/traces`` beside the repository."""
    for candidate in (os.environ.get("EBBTIDE_TRACES"), REPO.parent / "shared" / "traces"):
        if candidate and (Path(candidate) / "openb_pod_list_default.csv").is_file():
            return Path(candidate)
    return None


def sim(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*EBB, "sim", *args], capture_output=True, text=True, timeout=240, cwd=REPO
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"ebb sim {' '.join(args)} failed: {proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def trace_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("sim") / "online.csv"
    rows = ["t_s,device,online_compute_pct,online_memory_mib"]
    for device in range(3):
        for step in range(120):  # 2 h of one-minute samples
            compute = rng.choice([0, 0, 0, 5, 30, rng.uniform(0, 100)])
            memory = rng.choice([4096, 4096, 20000])
            rows.append(f"{step * 60},{device},{compute:.1f},{memory}")
    path.write_text("\n".join(rows) + "\n")
    return path


def as_json(*args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(sim(*args, "--json").stdout)
    return result


def test_json_has_every_metric_for_every_policy(trace_csv: Path) -> None:
    result = as_json("--online", f"trace:{trace_csv}", "--jobs", "synthetic:3")
    assert result["workload"]["devices"] == 3
    assert result["workload"]["online"] == f"trace:{trace_csv}"
    assert list(result["policies"]) == POLICIES
    for figures in result["policies"].values():
        assert set(figures) >= METRICS
    assert result["policies"]["exclusive"]["harvest_efficiency"] == 0.0
    assert result["policies"]["ebbtide"]["harvest_efficiency"] > 0.0


def test_same_seed_same_json(trace_csv: Path) -> None:
    args = ("--online", f"trace:{trace_csv}", "--jobs", "synthetic", "--seed", "5")
    a, b = as_json(*args), as_json(*args)
    for result in (a, b):
        for figures in result["policies"].values():
            figures.pop("sim_wall_s")
    assert a == b


def test_pausing_and_restart_overhead_flags(trace_csv: Path) -> None:
    """``--no-pause`` makes ebbtide evict on every shortfall; ``--restart-overhead`` takes
    a duration; the workload records both; every harvest is at most 1."""
    base = ("--online", f"trace:{trace_csv}", "--jobs", "synthetic:3", "--restart-overhead")
    paused = as_json(*base, "60s")
    evicting = as_json(*base, "1m", "--no-pause")
    assert (paused["workload"]["pause"], evicting["workload"]["pause"]) == (True, False)
    assert paused["workload"]["restart_overhead_s"] == 60.0
    assert paused["policies"]["ebbtide"]["pauses"] > 0
    assert evicting["policies"]["ebbtide"]["pauses"] == 0
    assert paused["policies"]["ebbtide"]["evictions"] < evicting["policies"]["ebbtide"]["evictions"]
    for result in (paused, evicting):
        assert all(0 <= f["harvest_efficiency"] <= 1 for f in result["policies"].values())
    assert paused["policies"]["greedy"] == {
        **evicting["policies"]["greedy"],
        "sim_wall_s": paused["policies"]["greedy"]["sim_wall_s"],
    }


def test_bad_restart_overhead_is_one_line(trace_csv: Path) -> None:
    proc = sim("--online", f"trace:{trace_csv}", "--restart-overhead", "soon", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("ebb: error: --restart-overhead 'soon'")


@pytest.mark.parametrize("tile", ["0", "1001", "many"])
def test_bad_tile_is_one_line(trace_csv: Path, tile: str) -> None:
    proc = sim("--online", f"trace:{trace_csv}", "--tile", tile, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"ebb: error: --tile '{tile}': expected a whole number")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_tile_doubles_the_fleet(trace_csv: Path) -> None:
    args = ("--online", f"trace:{trace_csv}", "--jobs", "synthetic:3", "--no-baselines")
    one, two = as_json(*args), as_json(*args, "--tile", "2")
    assert (one["workload"]["tile"], two["workload"]["tile"]) == (1, 2)
    assert two["workload"]["devices"] == 2 * one["workload"]["devices"]
    assert two["workload"]["stream_jobs"] == 2 * one["workload"]["stream_jobs"]
    assert two["workload"]["online_gpu_hours"] == pytest.approx(
        2 * one["workload"]["online_gpu_hours"], rel=1e-3
    )


def test_table_and_no_baselines(trace_csv: Path) -> None:
    out = sim("--online", f"trace:{trace_csv}", "--no-baselines", "--load", "trace").stdout
    assert "harvest efficiency" in out and "ebbtide" in out
    assert "greedy" not in out


def test_bad_spelling_is_one_line(trace_csv: Path) -> None:
    proc = sim("--online", "nvml", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("ebb: error: --online 'nvml'")
    assert "Traceback" not in proc.stderr


def test_plot(trace_csv: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "sim.png"
    sim("--online", f"trace:{trace_csv}", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_real_traces_slice() -> None:
    traces = shared_traces()
    if traces is None:
        pytest.skip("the shared traces are not beside the repository (set EBBTIDE_TRACES)")
    result = as_json(
        "--online",
        f"genai:{traces}",
        "--jobs",
        f"openb:{traces / 'openb_pod_list_default.csv'}",
        "--hours",
        "2",
        "--devices",
        "20",
    )
    w = result["workload"]
    assert (w["devices"], w["clock_start"], w["stream_jobs"]) == (20, "09:12", 2947)
    ebbtide = result["policies"]["ebbtide"]
    assert ebbtide["harvest_efficiency"] > 0.5
    assert ebbtide["deadline_misses"] == 0


def test_sim_speed_benchmark_smoke() -> None:
    traces = shared_traces()
    if traces is None:
        pytest.skip("the shared traces are not beside the repository (set EBBTIDE_TRACES)")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "sim_speed.py"),
            "--traces",
            str(traces),
            "--hours",
            "1",
            "--devices",
            "10",
            "--tile",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"wall_s", "target_s", "policies", "sim_wall_s", "peak_rss_mib"} <= set(out)
    assert out["machine"]["cpus"] >= 1 and out["machine"]["cpu_model"]
    assert (out["tile"], out["gpus"]) == (2, 20)
    assert list(out["policies"]) == POLICIES
