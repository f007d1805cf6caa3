"""The metrics: what each update and each scrape shows (on a fresh registry each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ebbtide.clock import FakeClock
from ebbtide.metrics import CATALOGUE, Metrics
from ebbtide.queue.spec import Dependency, JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.loop import Scheduler
from ebbtide.workers.agent import NodeAgent, _outcome


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def eviction(**over: Any) -> dict[str, Any]:
    return {
        "reason_code": "online_compute",
        "latency_s": 1.5,
        "lost_work_s": 12.0,
        "deadline_missed": False,
    } | over


def test_an_eviction_counts_its_reason_latency_lost_work_and_a_miss(metrics: Metrics) -> None:
    metrics.attempt_ended("n1", "batch", "evicted", eviction())
    metrics.attempt_ended("n1", "batch", "evicted", eviction(latency_s=7.0, deadline_missed=True))
    metrics.attempt_ended("n1", "batch", "succeeded")
    where = {"node": "n1", "queue": "batch"}
    assert get(metrics, "ebbtide_evicted_jobs_total", reason="online_compute", **where) == 2
    assert get(metrics, "ebbtide_eviction_latency_seconds_count", **where) == 2
    assert get(metrics, "ebbtide_eviction_latency_seconds_sum", **where) == 8.5
    assert get(metrics, "ebbtide_eviction_latency_seconds_bucket", le="2.0", **where) == 1
    assert get(metrics, "ebbtide_lost_work_seconds_total", **where) == 24.0
    assert get(metrics, "ebbtide_deadline_misses_total", **where) == 1
    assert get(metrics, "ebbtide_attempts_ended_total", outcome="evicted", **where) == 2
    assert get(metrics, "ebbtide_attempts_ended_total", outcome="succeeded", **where) == 1


def test_a_users_cancellation_is_no_eviction(metrics: Metrics) -> None:
    """A trial's trap: one ``qdel`` of a job that ignored its warning counted an eviction
    of 30 s (and lost work) and fired the eviction latency alert, while ``ebb report``
    and ``ebb top`` counted none."""
    cancel = eviction(reason_code="cancelled", latency_s=29.9, lost_work_s=40.0)
    metrics.attempt_ended("n1", "batch", "evicted", cancel)
    where = {"node": "n1", "queue": "batch"}
    assert get(metrics, "ebbtide_attempts_ended_total", outcome="cancelled", **where) == 1
    assert get(metrics, "ebbtide_attempts_ended_total", outcome="evicted", **where) is None
    assert get(metrics, "ebbtide_evicted_jobs_total", reason="cancelled", **where) is None
    assert not get(metrics, "ebbtide_eviction_latency_seconds_count", **where)
    assert not get(metrics, "ebbtide_lost_work_seconds_total", **where)


def test_a_device_sample_gives_ratios_and_bytes_and_headroom_never_below_zero(
    metrics: Metrics,
) -> None:
    metrics.device_sample(
        "n1",
        0,
        memory_mib=81920,
        online_compute_pct=70,
        online_memory_mib=80000,
        offline_compute_pct=40,
        offline_memory_mib=4096,
        healthy=False,
    )
    where = {"node": "n1", "device": "0"}
    assert get(metrics, "ebbtide_online_compute_ratio", **where) == 0.7
    assert get(metrics, "ebbtide_offline_compute_ratio", **where) == 0.4
    assert get(metrics, "ebbtide_headroom_compute_ratio", **where) == 0.0
    assert get(metrics, "ebbtide_online_memory_bytes", **where) == 80000 * 2**20
    assert get(metrics, "ebbtide_headroom_memory_bytes", **where) == 0.0
    assert get(metrics, "ebbtide_device_memory_bytes", **where) == 81920 * 2**20
    assert get(metrics, "ebbtide_device_healthy", **where) == 0


@pytest.mark.parametrize(
    ("code", "evicted", "ended_by", "outcome"),
    [
        (0, False, None, "succeeded"),
        (1, False, None, "failed"),
        (99, False, None, "requeued"),
        (137, False, "walltime of 1m reached", "killed"),
        (143, True, None, "evicted"),
        (0, True, None, "evicted"),
    ],
)
def test_each_end_has_one_outcome(
    code: int, evicted: bool, ended_by: str | None, outcome: str
) -> None:
    assert _outcome(code, eviction() if evicted else None, ended_by) == outcome


def test_the_leading_scheduler_reports_queues_and_nodes_at_scrape_time(
    tmp_path: Path, metrics: Metrics
) -> None:
    clock = FakeClock(1_000_000.0)
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=clock)
    try:
        spec = JobSpec(command=["true"])
        [a] = store.submit(spec, "alice", defaults_deadline_s=30)
        night = JobSpec(command=["true"], queue="night")
        [b] = store.submit(night, "bob", defaults_deadline_s=30)
        after_a = JobSpec(command=["true"], depends=[Dependency(kind="afterok", job_id=a)])
        store.submit(after_a, "bob", defaults_deadline_s=30)
        store.hold(b, user="bob")
        store.heartbeat("n1", started_at=clock.time(), devices=[], stopping=False)
        scheduler = Scheduler(store, clock=clock, metrics=metrics)
        clock.advance(4.0)

        # standing by: the fleet is the leader's to report
        assert get(metrics, "ebbtide_pending_jobs", queue="default", status="queued") is None
        assert get(metrics, "ebbtide_scheduler_leader") == 0

        scheduler._lead_as(True)
        assert get(metrics, "ebbtide_scheduler_leader") == 1
        assert get(metrics, "ebbtide_pending_jobs", queue="default", status="queued") == 1
        assert get(metrics, "ebbtide_pending_jobs", queue="default", status="held") == 1
        assert get(metrics, "ebbtide_pending_jobs", queue="night", status="held") == 1
        assert get(metrics, "ebbtide_pending_jobs", queue="night", status="queued") == 0
        assert get(metrics, "ebbtide_running_jobs", queue="default") == 0
        assert get(metrics, "ebbtide_node_heartbeat_age_seconds", node="n1") == 4.0

        # a store that cannot be read: the scrape still answers, without those figures
        store.close()
        store.engine.dispose()
        scheduler.store = _Broken()  # type: ignore[assignment]
        assert get(metrics, "ebbtide_pending_jobs", queue="default", status="queued") is None
        assert get(metrics, "ebbtide_scheduler_leader") == 1
    finally:
        store.close()


def test_a_queue_its_windows_keep_out_is_said_so(tmp_path: Path, metrics: Metrics) -> None:
    """A trial's trap: ``EbbtideQueueStuck`` fired every day on a queue that waits for its
    night window; ``ebbtide_queue_window_open`` says which queues the windows keep out."""
    from ebbtide.config.policy import parse_policy

    policy = parse_policy(
        "queues: {night: {}, day: {}}\n"
        "windows:\n"
        "  - {name: nights, kind: cron, schedule: '0 22 * * *', duration: 8h, queues: [night]}\n"
    )
    clock = FakeClock(1_767_268_800.0)  # 2026-01-01 12:00 UTC: the night window is shut
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=clock)
    try:
        devices = [{"index": 0, "memory_mib": 81920}]
        store.heartbeat("n1", started_at=clock.time(), devices=devices, stopping=False)
        scheduler = Scheduler(store, clock=clock, metrics=metrics, policy=policy, wakeups=False)
        scheduler._lead_as(True)
        assert get(metrics, "ebbtide_queue_window_open", queue="night") == 0
        assert get(metrics, "ebbtide_queue_window_open", queue="default") == 0
        clock.advance(11 * 3600)  # 23:00: the night window is open
        store.heartbeat("n1", started_at=clock.time(), devices=devices, stopping=False)
        assert get(metrics, "ebbtide_queue_window_open", queue="night") == 1
    finally:
        store.close()


class _Broken:
    def __getattr__(self, name: str) -> Any:
        def fail(*_a: Any, **_k: Any) -> Any:
            raise OSError("connection refused\nmore")

        return fail


def test_the_catalogue_names_every_metric_and_its_labels(metrics: Metrics, tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    try:
        scheduler = Scheduler(store, metrics=metrics)
        scheduler._lead_as(True)
        store.heartbeat("n1", started_at=0.0, devices=[], stopping=False)
        store.submit(JobSpec(command=["true"]), "alice", defaults_deadline_s=30)
        metrics.attempt_ended("n1", "q", "evicted", eviction(deadline_missed=True))
        metrics.dispatched("q", 3.0)
        metrics.pass_duration.observe(0.01)
        metrics.pauses.labels("n1", "q", "pause").inc()
        metrics.samples.labels("n1").inc()
        metrics.watch_agent("n1", heartbeat_age=lambda: 0.5, running=lambda: 2)
        metrics.device_sample(
            "n1",
            0,
            memory_mib=1,
            online_compute_pct=0,
            online_memory_mib=0,
            offline_compute_pct=0,
            offline_memory_mib=0,
            healthy=True,
        )
        text = generate_latest(metrics.registry).decode()
        seen = {f.name: f for f in text_string_to_metric_families(text)}
        assert set(seen) == set(CATALOGUE)
        for name, labels in CATALOGUE.items():
            for s in seen[name].samples:
                assert set(s.labels) - {"le"} == set(labels), name
    finally:
        store.close()


def test_only_a_scheduler_exports_the_leader_gauge(metrics: Metrics, tmp_path: Path) -> None:
    """``ebb worker`` exported ``ebbtide_scheduler_leader 0``: a node agent is no
    scheduler standing by, and a dashboard counted it as one; and an empty pass-duration
    histogram."""
    from ebbtide.workers.devices import parse_devices
    from ebbtide.workers.headroom.static import StaticSource

    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    try:
        agent = NodeAgent(
            "n1", store, StaticSource(parse_devices("1x80GiB")), home=tmp_path, metrics=metrics
        )
        metrics.watch_agent("n1", heartbeat_age=lambda: 0.5, running=lambda: 0)
        assert agent.metrics is metrics
        exposed = generate_latest(metrics.registry).decode()
        names = {f.name for f in text_string_to_metric_families(exposed)}
        assert "ebbtide_agent_running_attempts" in names
        assert "ebbtide_scheduler_leader" not in names
        assert "ebbtide_scheduler_pass_duration_seconds" not in names
        Scheduler(store, metrics=metrics)  # ebb up: a scheduler beside the agent
        assert get(metrics, "ebbtide_scheduler_leader") == 0
        metrics.pass_duration.observe(0.01)  # (as its loop does at each pass)
        exposed = generate_latest(metrics.registry).decode()
        assert "ebbtide_scheduler_pass_duration_seconds_count 1.0" in exposed
    finally:
        agent.journal.close()
        store.close()
