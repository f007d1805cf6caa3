"""What attempts used, on SQLite and PostgreSQL: recorded with the attempt's end (evicted
and lost ones too), and read back per job or for a user's or queue's latest jobs."""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.errors import StaleState
from ebbtide.queue.models import USAGE_COLUMNS
from ebbtide.queue.rightsizing import MeasuredAttempt
from ebbtide.queue.states import AttemptOutcome, JobState
from ebbtide.queue.store import Store
from tests.integration.test_store import EVICTION, evict, start, submit

GIB = 1024


@pytest.fixture
def store(any_store: Store) -> Store:
    """The store's behaviour on every backend: SQLite, PostgreSQL and in memory."""
    return any_store


def usage(samples: int = 60, p95: float = 18.0, peak_mib: float = 6 * GIB) -> dict[str, Any]:
    return {
        "usage_samples": samples,
        "used_compute_p95_pct": p95,
        "used_compute_peak_pct": p95 + 10,
        "used_memory_p95_mib": peak_mib - 512,
        "used_memory_peak_mib": peak_mib,
    }


def ran(store: Store, job_id: int, measured: dict[str, Any] | None, exit_code: int = 0) -> int:
    attempt = start(store, job_id)
    store.finish_attempt(job_id, attempt, exit_code=exit_code, usage=measured)
    return attempt


def test_the_end_of_an_attempt_records_what_it_used(store: Store) -> None:
    job_id = submit(store, name="train", gpu="50%", gpumem="16GiB")
    ran(store, job_id, {**usage(), "from_a_newer_agent": 1})  # unknown keys: not ours
    [row] = store.attempts(job_id)
    assert row.outcome == AttemptOutcome.SUCCEEDED
    assert {c: getattr(row, c) for c in USAGE_COLUMNS} == usage()
    [m] = store.measured_attempts(job_id=job_id)
    assert m == MeasuredAttempt(
        job_id=job_id,
        name="train",
        owner="alice",
        queue="default",
        attempt=1,
        compute_pct=50.0,
        gpus=0,
        memory_mib=16 * GIB,
        samples=60,
        compute_p95_pct=18.0,
        compute_peak_pct=28.0,
        memory_p95_mib=6 * GIB - 512,
        memory_peak_mib=6 * GIB,
    )


def test_nothing_measured_is_null_not_zero(store: Store) -> None:
    job_id = submit(store)
    ran(store, job_id, None)
    [row] = store.attempts(job_id)
    assert {getattr(row, c) for c in USAGE_COLUMNS} == {None}
    assert store.measured_attempts(job_id=job_id) == []


def test_evicted_and_lost_attempts_keep_what_they_used(store: Store) -> None:
    job_id = submit(store)
    first = start(store, job_id)
    evict(store, job_id, first)
    store.finish_attempt(job_id, first, exit_code=99, eviction=EVICTION, usage=usage(30))
    second = start(store, job_id)
    store.requeue_lost(job_id, second, why="its lease ran out", usage=usage(10, 40.0))
    rows = store.attempts(job_id)
    assert [(r.outcome, r.usage_samples) for r in rows] == [
        (AttemptOutcome.EVICTED, 30),
        (AttemptOutcome.LOST, 10),
    ]
    assert [m.compute_p95_pct for m in store.measured_attempts(job_id=job_id)] == [18.0, 40.0]


def test_a_stale_report_records_nothing(store: Store) -> None:
    job_id = submit(store)
    ran(store, job_id, usage(5))
    ended_again = store.attempts(job_id)[0].model_dump()
    with pytest.raises(StaleState):
        store.finish_attempt(job_id, 1, exit_code=0, usage=usage(999))
    assert store.attempts(job_id)[0].model_dump() == ended_again


def test_the_latest_finished_measured_jobs_of_a_user_or_queue(store: Store) -> None:
    alice = [submit(store, name=f"train-{i}") for i in range(4)]
    for job_id in alice:
        ran(store, job_id, usage())
    unmeasured = submit(store, name="static")
    ran(store, unmeasured, None)
    running = submit(store, name="running")  # measured once, not finished
    evict(store, running, first := start(store, running))
    store.finish_attempt(running, first, exit_code=99, eviction=EVICTION, usage=usage())
    start(store, running)
    assert store.get(running).state == JobState.RUNNING
    bob = submit(store, owner="bob", queue="default", name="b")
    ran(store, bob, usage())

    def jobs(**kw: Any) -> list[int]:
        return sorted({m.job_id for m in store.measured_attempts(**kw)})

    assert jobs(owner="alice") == alice
    assert jobs(owner="alice", jobs=2) == alice[-2:]
    assert jobs(queue="default") == [*alice, bob]
    assert jobs(queue="default", jobs=1) == [bob]
    assert jobs(owner="bob", queue="other") == []
    assert jobs(job_id=running) == [running]  # one job: finished or not


def test_only_jobs_that_ran_are_listed_with_ran(store: Store) -> None:
    """``ebb recommend``'s "nothing has finished" check: a job cancelled in the queue
    ended, but ran nowhere."""
    from ebbtide.queue.states import FINAL_STATES

    cancelled = submit(store, name="never")
    store.cancel(cancelled, user="alice")
    done = submit(store, name="done")
    ran(store, done, None)
    finished = store.list_jobs(states=FINAL_STATES, owner="alice")
    assert [j.id for j in finished] == [cancelled, done]
    assert [j.id for j in store.list_jobs(states=FINAL_STATES, owner="alice", ran=True)] == [done]
    assert store.list_jobs(states=FINAL_STATES, ids=[cancelled], ran=True) == []
