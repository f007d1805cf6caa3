"""Smoke test of the benchmark scripts: they run and print what they promise.

Figures are not asserted here (speed targets live in the benchmarks themselves, see
``benchmarks/README.md``); only the shape of the output, the absence of missed deadlines,
and that a paused job's processes really stopped and resumed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


PAUSE_LATENCY = REPO / "benchmarks" / "pause_latency.py"
PAUSE_KEYS = {
    "procs",
    "rounds",
    "sigstop_freeze_ms",
    "sigstop_thaw_ms",
    "sigstop_call_ms",
    "sigstop_resume_ms",
    "cgroup_freeze_ms",
    "cgroup_thaw_ms",
    "cgroup_call_ms",
    "cgroup_resume_ms",
    "cgroup_skipped",
    "verified",
    "leftovers",
    "cgroups_left",
    "target",
}
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


def bench_processes() -> list[int]:
    """Processes of a pause benchmark's jobs still alive (their argv names its directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"ebbtide-pause-bench-" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def assert_figures(f: dict[str, float]) -> None:
    assert set(f) == {"p50", "p99", "max"}, f
    assert 0 <= f["p50"] <= f["p99"] <= f["max"], f


@linux_only
@pytest.mark.parametrize("work", ["sleep", "busy"])
def test_pause_latency_json(work: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(PAUSE_LATENCY), "--rounds", "3", "--work", work, "--cgroup", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert not PAUSE_KEYS - result.keys(), result
    assert (result["procs"], result["rounds"]) == (4, 3)
    every = result["verified"]["processes"]
    assert every == 12
    # every process of every attempt was seen stopped, made no progress while it was,
    # and made progress again after the resume
    assert result["verified"]["sigstop"] == {"stopped": every, "resumed": every}
    for measure in ("freeze", "thaw", "call", "resume"):
        assert_figures(result[f"sigstop_{measure}_ms"])
    if result["cgroup_freeze_ms"] is None:  # no root or no writable cgroup v2 here
        assert result["cgroup_skipped"], result
        assert result["verified"]["cgroup"] is None
        assert result["target"]["cgroup_met"] is None
    else:
        assert result["cgroup_skipped"] is None
        assert result["verified"]["cgroup"] == {"stopped": every, "resumed": every}
        for measure in ("freeze", "thaw", "call", "resume"):
            assert_figures(result[f"cgroup_{measure}_ms"])
    assert isinstance(result["target"]["met"], bool)
    # everything cleaned up: no process, no cgroup left
    assert result["leftovers"] == 0
    assert result["cgroups_left"] == 0
    assert bench_processes() == []


@linux_only
def test_pause_latency_text() -> None:
    proc = subprocess.run(
        [sys.executable, str(PAUSE_LATENCY), "--rounds", "1", "--procs", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1 round, 2 processes per attempt" in out
    assert "SIGSTOP/SIGCONT freeze" in out
    assert "2/2" in out  # both processes stopped and resumed
    assert "cgroup freezer: skipped: not asked for (--cgroup)" in out
    assert "target (freeze p99 ≤ 20 ms" in out


def test_cli_latency_json() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "cli_latency.py"),
            *("--submits", "2", "--lists", "1", "--jobs", "1000", "--no-postgres", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    sqlite = result["sqlite"]
    assert sqlite["jobs"] == 1000 + 2 + 2  # the filled jobs and the timed submits, both ways
    for key in ("qsub_p50_s", "qsub_p99_s", "qstat_p50_s", "qstat_array_p50_s"):
        assert sqlite[key] > 0, key
        assert sqlite["socket"][key] > 0, key  # through ebb server, the thin client
    assert result["postgresql"] is None and set(result["targets"]) == {"qsub_p50_s", "qstat_p50_s"}


@pytest.mark.parametrize("nvml", ["stub", "fake"])
def test_agent_overhead_json(nvml: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "agent_overhead.py"),
            *("--gpus", "2", "--attempts", "2", "--seconds", "1", "--windows", "3"),
            *("--warmup-s", "1", "--nvml", nvml, "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    r = json.loads(lines[0])
    assert (r["gpus"], r["attempts"], r["running"]) == (2, 2, 2)
    assert 1 < r["sample_hz"] <= 21  # a tick every 50 ms at most
    assert 0 < r["cpu_core_frac"] < 2 and r["cpu_per_tick_ms"] > 0
    assert 10 < r["rss_mib"] < 2000 and r["threads"] >= 3  # loop, store, XID watcher
    assert r["threads_cpu_core_frac"]["loop"] > 0
    assert r["nvml_calls_per_tick"] > 0 and r["nvml_by_call_per_tick"]
    # the stub counts the library's entry points (pynvml's _v3 process lists), the fake
    # pynvml's functions
    lists = "nvmlDeviceGetComputeRunningProcesses" + ("_v3" if nvml == "stub" else "")
    assert r["nvml"] == nvml and r["nvml_by_call_per_tick"].get(lists, 0) > 0
    assert r["nvml_call_us"] == 100 and r["nvml_floor_core_frac"] > 0
    assert set(r["targets"]) == {"cpu_core_frac", "rss_mib", "cpu_met", "rss_met"}
    assert r["machine"]["cpus"] >= 1 and r["machine"]["cpu_model"]
    # three windows, the median one's figures; what is left of 2 % for the NVML calls
    assert r["windows"] == 3 and len(r["cpu_core_frac_windows"]) == 3
    assert r["cpu_core_frac"] == sorted(r["cpu_core_frac_windows"])[1]
    assert 0 <= r["own_core_frac"] <= r["cpu_core_frac"]
    spare = max(0.0, r["targets"]["cpu_core_frac"] - r["own_core_frac"])
    calls_per_s = r["nvml_calls_per_tick"] * r["sample_hz"]
    assert r["nvml_break_even_us"] == pytest.approx(spare / calls_per_s * 1e6, rel=0.1, abs=1)


def test_qstat_scale_json(postgres_admin_url: str) -> None:
    """A small history: the figures are there and qstat lists the unfinished jobs only."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "qstat_scale.py"),
            *("--jobs", "2000", "--active", "50", "--events", "8000", "--repeat", "4", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["jobs"], result["events"], result["listed"]) == (2000, 8000, 50)
    assert result["machine"]["cpus"] >= 1 and result["machine"]["cpu_model"]
    for key in ("table_p50_s", "describe_p50_s", "thin_p50_s", "load_s"):
        assert result[key] > 0, key
