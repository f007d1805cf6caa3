"""Every transition the table allows is one the store performs: no dead entries.

Runs the store through every path (submission, holds, dependencies, dispatch, starts,
evictions, outcomes, losses, cancellations) and records each (from, to) it checks."""

from __future__ import annotations

from typing import Any

from ebbtide.queue.lifecycle import submission
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import TRANSITIONS, JobState
from ebbtide.queue.store import Store, transitions

S = JobState


def test_every_allowed_transition_is_performed(sqlite_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: set[tuple[Any, Any]] = set()
    real = transitions.check_transition

    def record(source: Any, target: Any) -> None:
        seen.add((source, target))
        real(source, target)

    for module in (submission, transitions):  # the two places the store checks the table
        monkeypatch.setattr(module, "check_transition", record)
    store = Store(sqlite_url)
    try:
        _exercise(store)
    finally:
        store.close()
    assert seen == set(TRANSITIONS), {
        "never performed": sorted(map(str, set(TRANSITIONS) - seen)),
        "not in the table": sorted(map(str, seen - set(TRANSITIONS))),
    }


def _submit(store: Store, **fields: Any) -> int:
    fields.setdefault("command", ["true"])
    return store.submit(JobSpec(**fields), "alice", defaults_deadline_s=30)[0]


def _dispatch(store: Store, job_id: int) -> int:
    job = store.get(job_id)
    return store.dispatch(
        job_id, expected_attempts=job.attempts, node="n", devices=(0,), compute_pct=1, memory_mib=1
    )


def _run(store: Store, job_id: int) -> int:
    attempt = _dispatch(store, job_id)
    store.mark_started(job_id, attempt, pid=1, stdout_path="o", stderr_path="e")
    return attempt


def _evicting(store: Store, job_id: int) -> int:
    attempt = _run(store, job_id)
    store.begin_eviction(job_id, attempt, reason="r", deadline_s=1, spike_at=0, source="t")
    return attempt


def _exercise(store: Store) -> None:
    fin = store.finish_attempt
    # submission: queued, held, waiting; holds and releases; dependencies
    held = _submit(store, hold=True)
    store.release(held, user="alice")  # held → queued
    store.hold(held, user="alice")  # queued → held
    store.cancel(held, user="alice")  # held → cancelled
    dep = _submit(store)
    waiting = _submit(store, depends=[{"kind": "afterok", "job_id": dep}])
    store.hold(waiting, user="alice")  # waiting → held
    store.release(waiting, user="alice")  # held → waiting
    store.cancel(waiting, user="alice")  # waiting → cancelled
    later = _submit(store, depends=[{"kind": "afterany", "job_id": dep}])
    store.cancel(dep, user="alice")  # queued → cancelled
    store.promote_waiting()  # waiting → queued
    store.cancel(later, user="alice")
    # qalter -W depend= of a queued job: queued → waiting
    first, second = _submit(store), _submit(store)
    given = JobSpec(command=["true"], depends=[f"afterok:{first}"])
    store.alter(second, given, user="alice", defaults_deadline_s=30)
    store.cancel(second, user="alice")
    store.cancel(first, user="alice")
    # dispatch, start, outcomes while running
    j = _submit(store)
    fin(j, _run(store, j), exit_code=0)  # running → succeeded
    j = _submit(store, max_attempts=1)
    fin(j, _run(store, j), exit_code=3)  # running → failed
    j = _submit(store, max_attempts=2)
    fin(j, _run(store, j), exit_code=3)  # running → queued
    a = _dispatch(store, j)
    store.requeue_lost(j, a, why="t")  # dispatched → queued
    a = _dispatch(store, j)
    fin(j, a, exit_code=127, why="cannot start", final=True)  # dispatched → failed
    j = _submit(store)
    _dispatch(store, j)
    store.cancel(j, user="alice")  # dispatched → cancelled
    j = _submit(store)
    a = _run(store, j)
    store.cancel(j, user="alice")  # cancel requested while running
    store.requeue_lost(j, a, why="agent gone")  # running → cancelled
    # evictions and their ends
    j = _submit(store)
    fin(j, _evicting(store, j), exit_code=99)  # evicting → queued
    fin(j, _evicting(store, j), exit_code=0)  # evicting → succeeded
    j = _submit(store, max_attempts=1)
    fin(j, _evicting(store, j), exit_code=1, eviction={"reason": "r"})  # evicting → failed
    j = _submit(store)
    a = _evicting(store, j)
    store.cancel(j, user="alice")
    fin(j, a, exit_code=143)  # evicting → cancelled
