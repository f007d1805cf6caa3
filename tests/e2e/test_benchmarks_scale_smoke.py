"""Smoke test of the scale benchmarks: they run at tiny sizes and print what they promise.

No figure is asserted (the targets live in the scripts and ``benchmarks/README.md``); only
the shape of the output and that the values make sense.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.e2e.helpers import REPO

pytestmark = pytest.mark.e2e

PLAN_SCALE = REPO / "benchmarks" / "plan_scale.py"
SUBMIT_THROUGHPUT = REPO / "benchmarks" / "submit_throughput.py"
PASS_SCALE = REPO / "benchmarks" / "pass_scale.py"
DISPATCH_BATCH = REPO / "benchmarks" / "dispatch_batch.py"
#: The server ``submit_throughput.py`` uses by default (as ``tests/conftest.py`` does).
POSTGRES_ADMIN_URL = os.environ.get(
    "EBBTIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def run_script(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=240, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def run_json(*args: str) -> Any:
    lines = run_script(*args).strip().splitlines()
    assert len(lines) == 1, lines
    return json.loads(lines[0])


def assert_machine(machine: dict[str, Any]) -> None:
    """The ``machine`` a benchmark says it ran on (``benchmarks/bench_machine.py``)."""
    assert set(machine) == {"cpu_model", "cpus", "memory_gib", "system", "python"}
    assert machine["cpu_model"] and machine["cpus"] >= 1 and machine["memory_gib"] > 0
    assert machine["python"].split()[-1].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")


def postgres_reachable() -> bool:
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(POSTGRES_ADMIN_URL)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception:
        return False
    return True


def test_plan_scale_json() -> None:
    result = run_json(
        str(PLAN_SCALE), "--jobs", "2000", "--devices", "50", "--repeat", "2", "--json"
    )
    assert set(result) == {
        "jobs",
        "devices",
        "active",
        "passes",
        "median_s",
        "p99_s",
        "max_s",
        "cpu_median_s",
        "dispatches",
        "evictions",
        "peak_rss_mib",
        "target",
        "met",
        "machine",
    }
    assert (result["jobs"], result["devices"], result["passes"]) == (2000, 50, 2)
    assert 0 < result["median_s"] <= result["p99_s"] <= result["max_s"]
    assert result["dispatches"] > 0  # 50 lightly loaded devices take some of 2000 jobs
    assert 0 < result["peak_rss_mib"] < result["target"]["peak_rss_mib"]
    met = result["median_s"] <= result["target"]["median_s"]
    assert result["met"] is met  # the RSS target holds (above): the median decides
    assert_machine(result["machine"])


def test_plan_scale_text_reports_decisions() -> None:
    out = run_script(str(PLAN_SCALE), "--jobs", "2000", "--devices", "50", "--repeat", "2")
    decided = re.search(r"one pass decides (\d+) dispatches", out)
    assert decided is not None, out
    assert int(decided.group(1)) > 0  # 50 lightly loaded devices take some of 2000 jobs
    assert "median" in out and "p99" in out and "max" in out


def test_submit_throughput_json() -> None:
    pg = postgres_reachable()
    args = [str(SUBMIT_THROUGHPUT), "--array", "500", "--single", "50", "--json"]
    if not pg:
        args.append("--skip-postgres")
    result = run_json(*args)
    assert set(result) == {"sqlite", "postgres"}
    backends = ["sqlite", "postgres"] if pg else ["sqlite"]
    if not pg:
        assert result["postgres"] is None
    for name in backends:
        figures = result[name]
        assert set(figures) == {"array_per_s", "single_per_s"}, name
        assert figures["array_per_s"] > 0 and figures["single_per_s"] > 0, name


def test_pass_scale_json() -> None:
    if not postgres_reachable():
        why = "pass_scale.py measures PostgreSQL, which is not reachable"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    result = run_json(
        str(PASS_SCALE), "--jobs", "300", "600", "--repeat", "3", "--nodes", "1", "--json"
    )
    assert set(result) == {"devices", "trickle", "blocked", "runs", "machine"}
    assert_machine(result["machine"])
    assert result["devices"] == 8 and result["blocked"] == "room"
    assert [run["jobs"] for run in result["runs"]] == [300, 600]
    for run in result["runs"]:
        assert set(run) == {
            "jobs",
            "load_s",
            "full_p50_s",
            "full_p99_s",
            "mirror_p50_s",
            "mirror_p99_s",
            "rebuild_s",
        }
        assert 0 < run["full_p50_s"] <= run["full_p99_s"]
        assert 0 < run["mirror_p50_s"] <= run["mirror_p99_s"]
    # the queue held up by a spent quota, measured with the copy only
    quota = run_json(
        str(PASS_SCALE), "--jobs", "300", "--repeat", "3", "--nodes", "1", "--blocked",
        "quota", "--copy-only", "--json",
    )  # fmt: skip
    assert quota["blocked"] == "quota"
    [run] = quota["runs"]
    assert run["full_p50_s"] is None and 0 < run["mirror_p50_s"] <= run["mirror_p99_s"]


def test_dispatch_batch_json() -> None:
    if not postgres_reachable():
        why = "dispatch_batch.py measures PostgreSQL, which is not reachable"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    result = run_json(str(DISPATCH_BATCH), "--dispatches", "5", "--repeat", "2", "--json")
    assert result["dispatches"] == 5
    assert [r["backend"] for r in result["runs"]] == ["postgresql", "sqlite"]
    for run in result["runs"]:
        assert run["one_each_ms"] > 0 and run["one_for_all_ms"] > 0 and run["speedup"] > 0


def test_fleet_scale_json() -> None:
    if not postgres_reachable():
        why = "fleet_scale.py measures PostgreSQL, which is not reachable"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    result = run_json(
        str(REPO / "benchmarks" / "fleet_scale.py"),
        *("--agents", "20", "--seconds", "10", "--warmup", "3", "--submit-rate", "2", "--json"),
    )
    wanted = {"agents", "pass_p50_s", "pass_p99_s", "dispatch_p99_s", "sql_writes_per_s"}
    assert wanted | {"redis_ops_per_s"} <= set(result)
    assert_machine(result["machine"])
    assert result["agents"] == 20 and result["liveness_in_redis"] is True
    assert result["passes"] > 0 and 0 < result["pass_p50_s"] <= result["pass_p99_s"]
    assert result["dispatches"] > 0 and result["dispatch_p99_s"] > 0
    # fewer heartbeats written than journaled (two a second per agent)
    assert 0 < result["heartbeat_writes_per_s"] < 20 * 2
    assert result["sql_writes_per_s"] > 0 and result["redis_ops_per_s"] > 0
    assert isinstance(result["harness_kept_up"], bool)


def _exit_with(code: int) -> None:
    sys.exit(code)


def test_fleet_scale_names_a_child_that_died_at_once() -> None:
    """A child process that dies is named at once, not after minutes of waiting on its
    figures (a smoke run once timed out at 240 s without saying why)."""
    import multiprocessing
    import time

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import fleet_scale
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    spawn = multiprocessing.get_context("spawn")
    proc = spawn.Process(target=_exit_with, args=(3,))
    proc.start()
    proc.join(30)
    began = time.monotonic()
    with pytest.raises(fleet_scale.ChildDied, match=r"the poller process ended .*exit code 3"):
        fleet_scale.collect(spawn.Queue(), "poller", proc, 60)
    assert time.monotonic() - began < 5
    with pytest.raises(fleet_scale.ChildDied, match=r"the scheduler process ended early"):
        fleet_scale.sleep_watching(30, {"scheduler": proc})
    assert time.monotonic() - began < 10
    fleet_scale.end_child(proc, 1)  # already ended: returns
