"""A job whose attempts keep vanishing from a node that stays up is held with the reason
instead of restarting in a loop (the trial's two agents under one node name: 34 restarts
in 15 s), while losses a node explains — it went silent, its agent restarted — requeue as
before (``benchmarks/chaos.py``'s faults).  The scheduler's passes on the store (SQLite
and PostgreSQL), with its node agent played through the store as it reports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from ebbtide.clock import FakeClock
from ebbtide.config.policy import parse_policy
from ebbtide.queue.outcomes import AGENT_RESTARTED, GONE, NODE_SILENT
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.scheduling.loop import Scheduler
from tests.e2e.helpers import EBB

S = JobState
POLICY = "defaults:\n  loss_window_s: 60s\n  max_losses: 5\n  forecast_warmup_s: 0s\n"


def scheduler(store: Store) -> Scheduler:
    assert isinstance(store.clock, FakeClock)
    return Scheduler(store, policy=parse_policy(POLICY, "p.yaml"), clock=store.clock, wakeups=False)


def heartbeat(store: Store) -> None:
    device = {
        "index": 0,
        "memory_mib": 81920,
        "online_compute_pct": 0.0,
        "online_memory_mib": 0.0,
        "sampled_at": store.clock.time(),
    }
    store.heartbeat("n1", started_at=store.clock.time() - 3600, devices=[device])


def run_and_lose(store: Store, sched: Scheduler, job_id: int, code: str, why: str) -> None:
    """A pass dispatches the job to n1; the agent starts it, then reports it lost."""
    heartbeat(store)
    sched.run_once()
    job = store.get(job_id)
    assert job.state == S.DISPATCHED, job.reason
    store.mark_started(job_id, job.attempts, pid=1, stdout_path="o", stderr_path="e")
    store.clock.advance(0.4)  # type: ignore[attr-defined]
    store.requeue_lost(job_id, job.attempts, why=why, reason_code=code)  # as sync.py does


def test_an_attempt_lost_twice_within_a_minute_from_a_live_node_is_held(
    store: Store, tmp_path: Path
) -> None:
    sched = scheduler(store)
    [job_id] = store.submit(JobSpec(command=["train"], gpu="20%"), "alice", defaults_deadline_s=30)
    why = "its process is no longer running on node n1"
    run_and_lose(store, sched, job_id, GONE, why)
    run_and_lose(store, sched, job_id, GONE, why)  # dispatched again: one loss is bad luck
    heartbeat(store)
    sched.run_once()  # the pass holds it before it plans
    job = store.get(job_id)
    assert (job.state, job.attempts, job.failures) == (S.HELD, 2, 0)
    assert job.reason == (
        "held: attempts 1 and 2 were lost 0.4s apart (loss_window_s 60) while their node "
        f"stayed up, last: {why}; qrls to try again"
    )
    [held] = [e for e in store.events(job_id) if e["type"] == "held"]
    assert held["by"] == "policy" and held["reason"] == job.reason
    # qstat says why
    env = {**os.environ, "EBBTIDE_DB_URL": store.url, "EBBTIDE_HOME": str(tmp_path)}
    shown = subprocess.run(
        [*EBB, "qstat", "-f", str(job_id)], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "were lost 0.4s apart" in shown.stdout and "qrls to try again" in shown.stdout
    # qrls forgives: one more loss alone does not hold it again
    store.release(job_id, user="alice")
    run_and_lose(store, sched, job_id, GONE, why)
    heartbeat(store)
    sched.run_once()
    assert store.get(job_id).state == S.DISPATCHED


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (NODE_SILENT, "node n1 stopped heartbeating"),  # a worker stopped or killed
        (AGENT_RESTARTED, "node agent n1 restarted; the attempt did not survive it"),
        ("lease", "its lease ran out on node n1"),
    ],
)
def test_losses_the_node_explains_requeue_until_max_losses(
    store: Store, code: str, why: str
) -> None:
    sched = scheduler(store)
    [job_id] = store.submit(JobSpec(command=["train"], gpu="20%"), "alice", defaults_deadline_s=30)
    for n in range(1, 5):
        run_and_lose(store, sched, job_id, code, why)
        heartbeat(store)
        sched.run_once()
        assert store.get(job_id).state == S.DISPATCHED, (n, store.get(job_id).reason)
    store.mark_started(job_id, 5, pid=1, stdout_path="o", stderr_path="e")
    store.requeue_lost(job_id, 5, why=why, reason_code=code)
    sched.run_once()  # the fifth loss: max_losses 5, whoever reported it
    job = store.get(job_id)
    assert job.state == S.HELD
    assert job.reason == f"held: lost 5 times (max_losses 5), last: {why}; qrls to try again"


def test_the_schedulers_own_take_backs_are_not_losses_of_the_job(store: Store) -> None:
    [job_id] = store.submit(JobSpec(command=["train"]), "alice", defaults_deadline_s=30)
    for _ in range(3):
        attempt = store.dispatch(
            job_id,
            expected_attempts=store.get(job_id).attempts,
            node="n1",
            devices=(0,),
            compute_pct=10,
            memory_mib=1024,
        )
        store.requeue_lost(
            job_id, attempt, why="taken back before it started", reason_code="taken_back"
        )
    assert store.hold_lost(max_losses=2, loss_window_s=60)[0] == []
    assert store.get(job_id).state == S.QUEUED


def test_a_pass_looks_only_at_the_losses_since_the_last(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hold_lost`` reads the ``lost`` events after where the last pass stopped, not every
    queued job (a million queued jobs would make each pass read them all)."""
    import ebbtide.queue.store as store_module
    import ebbtide.queue.store.losses as losses_module

    monkeypatch.setattr(losses_module, "LOST_RESCAN_EVENTS", 0)
    sched = scheduler(store)
    [job_id] = store.submit(JobSpec(command=["train"], gpu="20%"), "alice", defaults_deadline_s=30)
    why = "its process is no longer running on node n1"
    run_and_lose(store, sched, job_id, GONE, why)
    run_and_lose(store, sched, job_id, GONE, why)
    e = store_module.EVENTS.c
    with store.engine.connect() as conn:
        newest = conn.execute(sa.select(sa.func.max(e.id))).scalar()
        last_loss = conn.execute(sa.select(sa.func.max(e.id)).where(e.type == "lost")).scalar()
    assert store.hold_lost(5, 60, after_event=newest) == ([], newest)  # nothing new
    assert store.get(job_id).state == S.QUEUED
    held, seen = store.hold_lost(5, 60, after_event=last_loss - 1)  # the second loss is new
    assert (held, seen) == ([job_id], newest)
    assert store.get(job_id).state == S.HELD
