"""End to end: ``ebb up --metrics-port`` serves Prometheus metrics that move during an
eviction, read with a real HTTP scrape and Prometheus's own text parser."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.helpers import (
    ebb_env,
    job,
    start,
    stop,
    submit_count,
    wait_final,
    wait_for,
    write_trace,
)

pytestmark = pytest.mark.e2e

SPIKE_AT_S = 8.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at ``/metrics``, by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def test_counters_and_histograms_move_during_an_eviction(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path / "home")
    port = free_port()
    trace = write_trace(
        tmp_path / "spike.csv",
        [(0, 0, 5, 1024), (0, 1, 5, 1024), (SPIKE_AT_S, 0, 30, 81000)],
    )
    coop = submit_count(env, tmp_path / "coop.json", 200, name="coop", deadline="5s")
    up = start(
        env,
        "up",
        "--node",
        "box",
        "--devices",
        "2x80GiB",
        "--headroom",
        f"trace:{trace}",
        "--metrics-port",
        str(port),
        "--metrics-address",
        "127.0.0.1",
        log=tmp_path / "up.log",
    )
    try:
        wait_for(lambda: job(env, coop)["state"] == "running", 20, "the job running")
        # counted at the dispatch; the device figures at the agent's next heartbeat
        before = wait_for(
            lambda: (
                (s := scrape(port))
                and value(s, "ebbtide_admitted_jobs_total")
                and value(s, "ebbtide_offline_compute_ratio", node="box")
                and s
            ),
            10,
            "the first admission and its slice counted",
        )
        device = job(env, coop)["device"]
        assert value(before, "ebbtide_scheduler_leader") == 1
        assert value(before, "ebbtide_admitted_jobs_total", queue="default") == 1
        assert value(before, "ebbtide_admission_wait_time_seconds_count", queue="default") == 1
        assert value(before, "ebbtide_running_jobs", queue="default") == 1
        assert value(before, "ebbtide_evicted_jobs_total") == 0
        assert value(before, "ebbtide_agent_running_attempts", node="box") == 1
        assert value(before, "ebbtide_device_memory_bytes", node="box", device="0") == 80 * 2**30
        assert value(before, "ebbtide_offline_compute_ratio", node="box", device=device) > 0
        assert value(before, "ebbtide_node_heartbeat_age_seconds", node="box") < 10
        assert value(before, "ebbtide_agent_samples_total", node="box") > 0
        assert value(before, "process_resident_memory_bytes") > 0  # the process collector
        # the probes beside the metrics: both loops of ``ebb up`` go round
        for probe in ("healthz", "readyz"):
            url = f"http://127.0.0.1:{port}/{probe}"
            with urllib.request.urlopen(url, timeout=5) as response:
                lines = response.read().decode().splitlines()
            assert [line.split(",")[0] for line in lines] == ["agent box: ok", "scheduler: ok"]

        # the spike on device 0: evicted, requeued, finished on device 1
        jobs = wait_final(env, [coop], timeout=90)
        assert jobs[coop]["state"] == "succeeded"
        after = wait_for(
            lambda: (
                (s := scrape(port))
                and value(s, "ebbtide_attempts_ended_total", outcome="succeeded")
                and s
            ),
            10,
            "the end counted",
        )
    finally:
        rc = stop(up)
    log = (tmp_path / "up.log").read_text()
    assert rc == 0, log
    assert f"metrics on http://127.0.0.1:{port}/metrics" in log
    node = {"node": "box", "queue": "default"}
    assert value(after, "ebbtide_evicted_jobs_total", reason="online_memory", **node) == 1
    assert value(after, "ebbtide_eviction_latency_seconds_count", **node) == 1
    assert 0 < value(after, "ebbtide_eviction_latency_seconds_sum", **node) < 5
    assert value(after, "ebbtide_deadline_misses_total") == 0
    assert value(after, "ebbtide_lost_work_seconds_total", **node) >= 0
    assert value(after, "ebbtide_attempts_ended_total", outcome="evicted", **node) == 1
    assert value(after, "ebbtide_attempts_ended_total", outcome="succeeded", **node) == 1
    assert value(after, "ebbtide_admitted_jobs_total", queue="default") == 2
    assert value(after, "ebbtide_admission_wait_time_seconds_count", queue="default") == 2
    assert value(after, "ebbtide_online_memory_bytes", node="box", device="0") == 81000 * 2**20
    assert value(after, "ebbtide_scheduler_pass_duration_seconds_count") > 0
    assert value(after, "ebbtide_pending_jobs", queue="default", status="queued") == 0
    assert value(after, "ebbtide_running_jobs", queue="default") == 0


def test_a_port_in_use_is_refused_with_its_number(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path / "home")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = start(
            env,
            "up",
            "--metrics-port",
            str(port),
            "--metrics-address",
            "127.0.0.1",
            log=tmp_path / "up.log",
        )
        try:
            up.wait(timeout=30)
        finally:
            stop(up)
    log = (tmp_path / "up.log").read_text()
    assert up.returncode != 0
    assert f"--metrics-port {port}: cannot serve metrics on 127.0.0.1:{port}" in log
    assert "Traceback" not in log
