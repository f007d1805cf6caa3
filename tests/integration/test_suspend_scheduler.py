"""The scheduler sees a suspension to host through the store (SQLite and PostgreSQL): a
suspended slice holds no GPU memory, so the memory shortage that caused the suspension
evicts nobody; it is moved after ``max_suspend_s``; and admission keeps its memory for
its restore in place."""

from __future__ import annotations

from ebbtide.clock import FakeClock
from ebbtide.config.policy import parse_policy
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.loop import Scheduler
from ebbtide.scheduling.planner import Plan, plan

DEVICE_MIB = 81920
#: online memory after the spike: with the 2 GiB margin it leaves 19,872 MiB to offline
#: slices, less than the suspended job's 20,000 MiB
ONLINE_MIB = 60_000
POLICY = "defaults:\n  suspend_to_host: auto\n  max_suspend_s: 30m\n"


def running(store: Store, memory_mib: int, compute_pct: float = 20) -> tuple[int, int]:
    spec = JobSpec(command=["train"], compute_pct=compute_pct, memory_mib=memory_mib)
    [job_id] = store.submit(spec, "alice", defaults_deadline_s=30)
    attempt = store.dispatch(
        job_id,
        expected_attempts=0,
        node="n1",
        devices=(0,),
        compute_pct=compute_pct,
        memory_mib=memory_mib,
    )
    store.mark_started(job_id, attempt, pid=1000, stdout_path="o", stderr_path="e")
    return job_id, attempt


def suspend(store: Store, job_id: int, attempt: int, at: float) -> None:
    store.record_pause(
        job_id,
        attempt,
        at=at,
        reason="online memory rose; suspended to host",
        reason_code="online_memory",
        kind="suspend",
    )


def pass_at(store: Store, now: float) -> Plan:
    """One planning pass on the snapshot the scheduler builds from the store."""
    store.heartbeat(
        "n1",
        started_at=now - 3600,
        devices=[
            {
                "index": 0,
                "memory_mib": DEVICE_MIB,
                "online_compute_pct": 10.0,
                "online_memory_mib": ONLINE_MIB,
                "sampled_at": now,
            }
        ],
    )
    clock = FakeClock(start=now)
    scheduler = Scheduler(store, policy=parse_policy(POLICY, "p.yaml"), clock=clock, wakeups=False)
    return plan(scheduler.snapshot(now))


def test_a_suspended_slice_holds_no_memory_for_the_eviction_phase(store: Store) -> None:
    now = store.clock.time()
    job_id, attempt = running(store, 20_000)
    # recorded as paused only, the slice would hold its 20,000 MiB and be evicted
    store.record_pause(job_id, attempt, at=now - 10, reason="r", reason_code="online_compute")
    evicted = pass_at(store, now).evictions
    assert [(e.job_id, e.reason.value) for e in evicted] == [(job_id, "online_memory")]
    # suspended to host: its memory is off the GPU, nothing needs to leave
    suspend(store, job_id, attempt, at=now - 10)
    assert pass_at(store, now).evictions == []


def test_a_neighbour_is_not_evicted_for_the_memory_of_a_suspended_slice(store: Store) -> None:
    now = store.clock.time()
    job_id, attempt = running(store, 20_000)
    neighbour, _ = running(store, 10_000)
    suspend(store, job_id, attempt, at=now - 10)
    assert pass_at(store, now).evictions == []
    [a, b] = store.active_attempts()
    assert (a.job_id, a.suspended) == (job_id, True) and (b.job_id, b.suspended) == (
        neighbour,
        False,
    )


def test_a_slice_suspended_past_max_suspend_s_is_moved(store: Store) -> None:
    now = store.clock.time()
    job_id, attempt = running(store, 20_000)
    suspend(store, job_id, attempt, at=now - 1801)
    [e] = pass_at(store, now).evictions
    assert (e.job_id, e.reason.value) == (job_id, "suspended_too_long")
    assert "longer than max_suspend_s 1800s" in e.message


def test_admission_keeps_a_suspended_slices_memory_for_its_restore(store: Store) -> None:
    """Admission counts a suspended slice's memory as held (``scheduling/capacity.py``):
    what it left on the GPU is where it is restored, so a new job does not take it."""
    now = store.clock.time()
    job_id, attempt = running(store, 20_000)
    suspend(store, job_id, attempt, at=now - 10)
    [small] = store.submit(
        JobSpec(command=["infer"], compute_pct=10, memory_mib=10_240),
        "bob",
        defaults_deadline_s=30,
    )
    decided = pass_at(store, now)
    assert decided.evictions == [] and decided.dispatches == []
    assert "waiting for headroom" in decided.blocked[small]
    # the suspended job ends: its memory is free for admission
    store.finish_attempt(job_id, attempt, exit_code=0)
    assert [d.job_id for d in pass_at(store, now).dispatches] == [small]
