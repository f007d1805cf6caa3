"""The in-memory store against the SQL one: the same history read back the same (reports,
evictions, usage, the scheduler's snapshot), the same purges, every transition of the
table performed, the leadership fence, and writes that fail leaving nothing behind.

The shared behaviour is tested on every backend by the store's own tests (``any_store``);
these are what only the in-memory store needs, or what is easiest to see side by side."""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.clock import FakeClock
from ebbtide.errors import NotLeader, StaleState
from ebbtide.queue.lifecycle import submission
from ebbtide.queue.memory import MemoryStore, base
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import TRANSITIONS, EventType, JobState
from ebbtide.queue.store import REPORT_PROBE_EVENTS, Store
from tests.integration.test_lost_loops import (
    test_the_schedulers_own_take_backs_are_not_losses_of_the_job as take_backs,
)
from tests.integration.test_transitions_used import _exercise
from tests.report_fleet import WINDOW, make_history

S = JobState


def _pair(url: str) -> tuple[Store, MemoryStore]:
    return Store(url, clock=FakeClock()), MemoryStore(clock=FakeClock())


def _reads(store: Any, t0: float) -> dict[str, Any]:
    """Everything the store tells about its jobs, comparable between backends."""
    ids = [j.id for j in store.list_jobs()]
    return {
        "jobs": [j.model_dump() for j in store.list_jobs()],
        "events": {i: store.events(i) for i in ids},
        "attempts": {i: [a.model_dump() for a in store.attempts(i)] for i in ids},
        "stats": store.queue_stats(),
        "queued": store.queued_jobs(),
        "active": store.active_attempts(),
        "evictions": store.recent_evictions(10),
        "measured": store.measured_attempts(queue="default"),
        "rows": store.job_rows(["id", "state", "reason"], owner="bob"),
        "nodes": store.nodes(),
        "reports": [
            store.report_rows(t0 + since, t0 + until)
            for since, until in [WINDOW, (2200, 2300), (-86400, -3600), (0, 10_000)]
        ],
    }


def test_the_same_history_reads_the_same(sqlite_url: str) -> None:
    sql, memory = _pair(sqlite_url)
    try:
        reads = []
        for store in (sql, memory):
            t0 = store.clock.time()
            make_history(store, store.clock)  # type: ignore[arg-type]
            reads.append(_reads(store, t0))
        assert reads[0] == reads[1]
    finally:
        sql.close()


def _finished_history(store: Any) -> None:
    """Singles and an array finished at different times (one task not: the array
    stays), and a job waiting on one of them (it stays too)."""
    clock = store.clock

    def run(job_id: int, exit_code: int = 0) -> None:
        job = store.get(job_id)
        n = store.dispatch(
            job_id,
            expected_attempts=job.attempts,
            node="n",
            devices=(0,),
            compute_pct=1,
            memory_mib=1,
        )
        store.mark_started(job_id, n, pid=1, stdout_path="o", stderr_path="e")
        store.finish_attempt(job_id, n, exit_code=exit_code)

    singles = [
        store.submit(JobSpec(command=["x"]), "a", defaults_deadline_s=5)[0] for _ in range(5)
    ]
    array = store.submit(
        JobSpec(command=["x"], array={"start": 0, "end": 3}), "a", defaults_deadline_s=5
    )
    for n, job_id in enumerate([*singles, *array]):
        clock.advance(60)
        if job_id != array[-1]:
            run(job_id, exit_code=n % 2)
    store.submit(
        JobSpec(command=["x"], depends=[{"kind": "afterany", "job_id": singles[2]}]),
        "a",
        defaults_deadline_s=5,
    )
    clock.advance(7200)


@pytest.mark.parametrize("batch", [1, 2, 1000])
@pytest.mark.parametrize("dry_run", [False, True])
def test_the_same_purges(sqlite_url: str, batch: int, dry_run: bool) -> None:
    sql, memory = _pair(sqlite_url)
    try:
        results = []
        for store in (sql, memory):
            _finished_history(store)
            steps = list(store.purge_batches(3600 + 120, batch=batch, dry_run=dry_run))
            left = [j.id for j in store.list_jobs()]
            results.append((steps, left))
        assert results[0] == results[1]
        assert any(step.jobs for step in results[0][0])
        sql_total = sql.purge(3600, batch=batch, pause_s=0)
        memory_total = memory.purge(3600, batch=batch, pause_s=0)
        assert (sql_total.jobs, sql_total.kept, sql_total.oldest_kept_finished_at) == (
            memory_total.jobs,
            memory_total.kept,
            memory_total.oldest_kept_finished_at,
        )
    finally:
        sql.close()


def test_every_allowed_transition_is_performed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[tuple[Any, Any]] = set()
    real = base.check_transition

    def record(source: Any, target: Any) -> None:
        seen.add((source, target))
        real(source, target)

    for module in (base, submission):  # the two places the memory store checks the table
        monkeypatch.setattr(module, "check_transition", record)
    _exercise(MemoryStore())  # type: ignore[arg-type]
    assert seen == set(TRANSITIONS)


def test_the_schedulers_own_take_backs_are_not_losses() -> None:
    take_backs(MemoryStore(clock=FakeClock()))  # type: ignore[arg-type]


def test_a_leader_deposed_by_a_later_epoch_writes_nothing() -> None:
    store = MemoryStore(clock=FakeClock())
    assert store.current_epoch() == 0
    first = store.fenced(store.begin_epoch("a"))
    [job_id] = first.submit(JobSpec(command=["x"]), "u", defaults_deadline_s=5)
    first.publish_policy("", "defaults")
    second = store.fenced(store.begin_epoch("b"))
    assert store.current_epoch() == 2
    before = (store.get(job_id).model_dump(), store.events(job_id))
    with pytest.raises(NotLeader, match="epoch 2 has begun"):
        first.dispatch(
            job_id, expected_attempts=0, node="n", devices=(0,), compute_pct=1, memory_mib=1
        )
    with pytest.raises(NotLeader):
        first.publish_policy("x", "p.yaml")
    assert (store.get(job_id).model_dump(), store.events(job_id)) == before
    assert (
        second.dispatch(
            job_id, expected_attempts=0, node="n", devices=(0,), compute_pct=1, memory_mib=1
        )
        == 1
    )
    assert store.published_policy() == ("", "defaults", store.clock.time())
    assert first.get(job_id).state == S.DISPATCHED  # reads are not fenced


def test_a_write_that_fails_leaves_nothing_behind() -> None:
    """An event written before the step that fails goes with it, as in a transaction."""
    store = MemoryStore(clock=FakeClock())
    [job_id] = store.submit(JobSpec(command=["x"]), "u", defaults_deadline_s=5)
    before = (store.get(job_id).model_dump(), store.events(job_id))
    with pytest.raises(ValueError, match="no column"):
        store.transition(
            job_id, S.QUEUED, S.HELD, event=EventType.HELD, changes={"no_such_column": 1}
        )
    # a write of several steps, the last of which loses a race
    with pytest.raises(StaleState), store._tx() as conn:
        store._event(conn, job_id, EventType.HELD)
        store._transition(conn, job_id, S.WAITING, S.QUEUED, event=EventType.DEPENDENCIES_MET)
    assert (store.get(job_id).model_dump(), store.events(job_id)) == before
    assert [e["type"] for e in store._data.events] == ["submitted"]


def test_the_bisection_starts_at_the_window_not_the_history() -> None:
    """The SQL store's test of its bisection, on the in-memory list of event ids."""
    store = MemoryStore(clock=FakeClock())
    clock = store.clock
    assert isinstance(clock, FakeClock)
    assert store._first_event_id(0.0) == 0  # no events yet
    times = []
    for n in range(60):
        store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=30)
        times.append(clock.time())
        if n == 45:  # an event reported an hour late: an old time, a new id
            clock.advance(-3600)
            store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=30)
            clock.advance(3600)
        clock.advance(60)
    rows = [(e["id"], e["time"]) for e in store._data.events]
    for n in (0, 10, 30, 46, 59):
        boundary = next(i for i, t in rows if t >= times[n])
        first = store._first_event_id(times[n])
        assert boundary - REPORT_PROBE_EVENTS < first <= boundary
    assert store._first_event_id(times[-1] + 1) == rows[-1][0] + 1
