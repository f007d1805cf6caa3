"""Graduated response with real processes: a compute spike pauses a job in place (no
eviction, no requeue: its count goes on after the thaw); a memory spike still evicts; the
job counts exactly to N."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.snapshot import PauseRules
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.static import StaticSource
from ebbtide.workers.shim import descendants

COUNT = Path(__file__).resolve().parents[2] / "examples" / "count.py"
RULES = PauseRules(min_pause_s=0.5, max_pause_s=600, thaw_hysteresis_pct=10)


def wait_until(predicate, timeout=15.0):  # type: ignore[no-untyped-def]
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def states(agent: NodeAgent, job_id: int) -> set[str]:
    local = agent.attempts.get(job_id)
    if local is None:
        return set()
    out = set()
    for pid in descendants(local.handle.pid):
        try:
            out.add(psutil.Process(pid).status())
        except psutil.NoSuchProcess:
            pass
    return out


def types(store: Store, job_id: int) -> list[str]:
    return [e["type"] for e in store.events(job_id)]


def test_a_compute_spike_pauses_a_memory_spike_evicts_and_the_count_is_exact(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    agent = NodeAgent("n1", store, source, home=tmp_path, pause=RULES)
    agent.start()
    try:
        out = tmp_path / "result.json"
        spec = JobSpec(
            command=[sys.executable, str(COUNT), "60", "--step-s", "0.05", "--every", "5",
                     "--out", str(out)],
            deadline_s=5,
        )  # fmt: skip
        [job_id] = store.submit(spec, "alice", defaults_deadline_s=5, pausable=True)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=2048
        )
        wait_until(lambda: store.get(job_id).state == "running")
        wait_until(lambda: store.get(job_id).checkpoint_path)

        # online compute rises, memory fits: paused, not evicted
        source.set(0, 90.0, 10_000)
        wait_until(lambda: "paused" in types(store, job_id))
        wait_until(lambda: states(agent, job_id) == {psutil.STATUS_STOPPED})
        job = store.get(job_id)
        assert job.state == "running" and job.paused_at is not None
        checkpoint = job.last_checkpoint_at
        time.sleep(0.6)
        assert store.get(job_id).last_checkpoint_at == checkpoint  # frozen: no progress
        [paused] = [e for e in store.events(job_id) if e["type"] == "paused"]
        assert paused["reason_code"] == "online_compute" and "paused" in paused["reason"]

        # headroom returns: thawed after the minimum pause, the count goes on
        source.set(0, 0.0, 0)
        wait_until(lambda: "thawed" in types(store, job_id))
        assert psutil.STATUS_STOPPED not in states(agent, job_id)
        assert store.get(job_id).paused_at is None
        assert "evict_requested" not in types(store, job_id)

        # memory short: a pause would free none, so it is evicted (and resumes later)
        source.set(0, 10.0, 80_000)
        wait_until(lambda: store.get(job_id).state == "queued")
        source.set(0, 0.0, 0)
        store.dispatch(
            job_id, expected_attempts=1, node="n1", devices=(0,), compute_pct=20, memory_mib=2048
        )
        wait_until(lambda: store.get(job_id).state == "succeeded", timeout=30)
        result = json.loads(out.read_text())
        assert result["count"] == 60 and result["attempts_seen"] == [1, 2]
        [ev] = [e for e in store.events(job_id) if e["type"] == "evicted"]
        assert ev["reason_code"] == "online_memory"
    finally:
        agent.shutdown(timeout_s=20)
        store.close()


def test_a_job_that_may_not_pause_is_evicted_for_compute(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    agent = NodeAgent("n1", store, source, home=tmp_path, pause=RULES)
    agent.start()
    try:
        sleeper = JobSpec(
            command=[sys.executable, "-c", "import time; time.sleep(30)"], pause=False
        )
        [job_id] = store.submit(sleeper, "bob", defaults_deadline_s=5)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=2048
        )
        wait_until(lambda: store.get(job_id).state == "running")
        source.set(0, 90.0, 10_000)
        wait_until(lambda: store.get(job_id).state == "queued")
        assert "paused" not in types(store, job_id)
    finally:
        agent.shutdown(timeout_s=20)
        store.close()
