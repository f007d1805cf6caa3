"""``/healthz`` and ``/readyz``: whether a process's loops go round, as Kubernetes' probes
read it beside ``/metrics`` (:mod:`ebbtide.probes`, :func:`ebbtide.metrics.serve_metrics`).
The scheduler's loop is watched in ``test_scheduler_clock``."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from ebbtide.metrics import Metrics, serve_metrics
from ebbtide.probes import Probes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_lives_while_it_goes_round_and_is_ready_while_its_rounds_go_well() -> None:
    clock = Clock()
    probes = Probes(clock=clock)
    assert probes.live() == (True, "ok: no loop in this process")
    probes.watch("agent gpu-a", stall_s=60)
    assert probes.ready() == (True, "agent gpu-a: ok, went round 0.0 s ago")  # its start
    clock.now += 59
    probes.beat("agent gpu-a", ok=False, why="its last tick failed: NVMLError")
    assert probes.live()[0]
    assert probes.ready() == (False, "agent gpu-a: not ready, its last tick failed: NVMLError")
    clock.now += 30
    probes.beat("agent gpu-a")
    assert probes.ready()[0]
    # whoever reaches the metrics port reads it: a URL's password in an error is masked
    probes.beat("agent gpu-a", ok=False, why="could not connect to redis://:hunter2@r:6379/0")
    assert probes.ready() == (
        False,
        "agent gpu-a: not ready, could not connect to redis://:***@r:6379/0",
    )


def test_a_loop_that_stops_going_round_is_named_as_stalled_and_another_does_not_hide_it() -> None:
    clock = Clock()
    probes = Probes(clock=clock)
    probes.watch("scheduler", stall_s=120)
    probes.watch("agent box", stall_s=60)
    clock.now += 61
    probes.beat("scheduler")
    live, text = probes.live()
    assert not live
    assert text.splitlines() == [
        "agent box: stalled, last went round 61 s ago (limit 60 s)",
        "scheduler: ok, went round 0.0 s ago",
    ]
    assert not probes.ready()[0]
    probes.forget("agent box")  # stopped on purpose
    assert probes.live()[0]
    probes.beat("never watched")  # ignored
    assert probes.live() == (True, "scheduler: ok, went round 0.0 s ago")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_metrics_port_answers_the_probes_and_still_serves_metrics() -> None:
    clock = Clock()
    metrics = Metrics(CollectorRegistry())
    metrics.probes = Probes(clock=clock)
    metrics.probes.watch("scheduler", stall_s=120)
    port = _free_port()
    stop = serve_metrics(metrics, "127.0.0.1", port)
    base = f"http://127.0.0.1:{port}"
    try:
        assert _get(f"{base}/healthz") == (200, "scheduler: ok, went round 0.0 s ago\n")
        metrics.probes.beat("scheduler", ok=False, why="cannot reach the store: refused")
        assert _get(f"{base}/healthz")[0] == 200
        assert _get(f"{base}/readyz") == (
            503,
            "scheduler: not ready, cannot reach the store: refused\n",
        )
        clock.now += 121
        status, text = _get(f"{base}/healthz")
        assert (status, text.split(",")[0]) == (503, "scheduler: stalled")
        status, text = _get(f"{base}/metrics")
        assert status == 200
        assert "ebbtide_admitted_jobs" in text
    finally:
        stop()
