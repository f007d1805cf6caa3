"""Retention on SQLite and PostgreSQL: ``Store.purge`` removes old finished jobs with
their attempts and events, and nothing else — nothing active, nothing a job not yet
finished depends on, no part of an array still running — and a purge during a run loses
nothing.  Every test runs once per backend (the ``store`` fixture, a FakeClock)."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from ebbtide.clock import FakeClock
from ebbtide.errors import JobNotFound, SpecError
from ebbtide.queue.purge import PurgeResult
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import FINAL_STATES, JobState
from ebbtide.queue.store import Store
from ebbtide.queue.store.purge import ATTEMPTS, EVENTS, JOBS

S = JobState
DAY_S = 86400.0
WEEK_S = 7 * DAY_S


# ------------------------------------------------------------------ builders


def clock(store: Store) -> FakeClock:
    assert isinstance(store.clock, FakeClock)
    return store.clock


def submit(store: Store, **fields: Any) -> int:
    fields.setdefault("command", ["python", "train.py"])
    return store.submit(JobSpec(**fields), "alice", defaults_deadline_s=30.0)[0]


def start(store: Store, job_id: int) -> int:
    job = store.get(job_id)
    attempt = store.dispatch(
        job_id,
        expected_attempts=job.attempts,
        node="n1",
        devices=(0,),
        compute_pct=job.compute_pct,
        memory_mib=job.memory_mib,
    )
    store.mark_started(job_id, attempt, pid=1000 + attempt, stdout_path="o", stderr_path="e")
    return attempt


def finish(store: Store, job_id: int, exit_code: int = 0) -> None:
    """Run the job's next attempt to its end (a checkpoint on the way: one more event)."""
    attempt = start(store, job_id)
    store.record_checkpoint(job_id, attempt, path="/ckpt", at=store.clock.time())
    store.finish_attempt(job_id, attempt, exit_code=exit_code, max_attempts=1)


def succeeded(store: Store, **fields: Any) -> int:
    job_id = submit(store, **fields)
    finish(store, job_id)
    return job_id


def cancelled(store: Store, **fields: Any) -> int:
    job_id = submit(store, **fields)
    store.cancel(job_id, user="alice")
    return job_id


def rows(store: Store, table: sa.Table, job_ids: list[int]) -> int:
    column = table.c.id if table is JOBS else table.c.job_id
    stmt = sa.select(sa.func.count()).select_from(table).where(column.in_(job_ids))
    with store.engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def everything(store: Store) -> dict[int, tuple[Any, ...]]:
    """Every job in the store with its attempts and events."""
    return {
        job.id or 0: (
            job.model_dump(),
            [a.model_dump() for a in store.attempts(job.id or 0)],
            store.events(job.id or 0),
        )
        for job in store.list_jobs()
    }


def gone(store: Store, job_ids: list[int]) -> bool:
    return all(rows(store, t, job_ids) == 0 for t in (JOBS, ATTEMPTS, EVENTS))


def purge(store: Store, older_than_s: float = WEEK_S, **kwargs: Any) -> PurgeResult:
    return store.purge(older_than_s, pause_s=0.0, **kwargs)


def no_orphans(store: Store) -> None:
    """No attempt and no event of a job that is not there."""
    with store.engine.connect() as conn:
        for table in (ATTEMPTS, EVENTS):
            orphans = conn.execute(
                sa.select(sa.func.count())
                .select_from(table)
                .where(table.c.job_id.not_in(sa.select(JOBS.c.id)))
            ).scalar_one()
            assert orphans == 0, table.name


# ------------------------------------------------------------------ what goes


def test_old_finished_jobs_go_with_their_attempts_and_events(store: Store) -> None:
    ok = succeeded(store)
    failed = submit(store)
    finish(store, failed, exit_code=3)
    dropped = cancelled(store)
    old = [ok, failed, dropped]
    assert [store.get(i).state for i in old] == [S.SUCCEEDED, S.FAILED, S.CANCELLED]
    events = rows(store, EVENTS, old)
    clock(store).advance(WEEK_S + 1)
    young = succeeded(store)
    kept = everything(store)
    del kept[ok], kept[failed], kept[dropped]

    result = purge(store)

    assert (result.jobs, result.attempts, result.events) == (3, 2, events)
    assert (result.batches, result.kept, result.dry_run) == (1, 0, False)
    assert result.cutoff == clock(store).time() - WEEK_S
    assert result.oldest_kept_finished_at == store.get(young).finished_at
    assert result.elapsed_s > 0
    assert gone(store, old)
    for job_id in old:
        with pytest.raises(JobNotFound):
            store.get(job_id)
    assert everything(store) == kept
    no_orphans(store)
    # nothing left to do: a second purge finds nothing
    assert (purge(store).jobs, purge(store).batches) == (0, 0)


def test_a_job_finished_just_inside_the_age_is_kept(store: Store) -> None:
    job_id = succeeded(store)
    clock(store).advance(WEEK_S)  # finished exactly a week ago: not older than a week
    assert purge(store).jobs == 0
    clock(store).advance(0.5)
    assert purge(store).jobs == 1 and gone(store, [job_id])


def test_nothing_unfinished_goes_however_old(store: Store) -> None:
    held = submit(store, hold=True)
    queued = submit(store)
    running = submit(store)
    start(store, running)
    waiting = submit(store, depends=[{"kind": "afterok", "job_id": running}])
    dispatched = submit(store)
    store.dispatch(
        dispatched, expected_attempts=0, node="n1", devices=(0,), compute_pct=1, memory_mib=1
    )
    evicting = submit(store)
    store.begin_eviction(
        evicting, start(store, evicting), reason="spike", deadline_s=5, spike_at=0, source="t"
    )
    states = {store.get(i).state for i in (held, queued, running, waiting, dispatched, evicting)}
    assert states == {s for s in S if s not in FINAL_STATES}
    # even a row that claims a finish time is not purged while its state is not final
    with store.engine.begin() as conn:
        conn.execute(JOBS.update().where(JOBS.c.id == queued).values(finished_at=1.0))
    clock(store).advance(400 * DAY_S)
    before = everything(store)

    result = purge(store, 0.0)

    assert (result.jobs, result.attempts, result.events, result.kept) == (0, 0, 0, 0)
    assert everything(store) == before


def test_nodes_drains_tokens_and_the_leadership_are_untouched(store: Store) -> None:
    store.heartbeat("n1", started_at=0.0, devices=[{"index": 0, "memory_mib": 1024}])
    store.drains.drain("n1", 0, by="root", reason="fan")
    store.tokens.create("alice", by="root")
    store.publish_policy("queues:\n  default: {}\n", "p.yaml")
    succeeded(store)

    def others() -> list[Any]:
        with store.engine.connect() as conn:
            return [
                conn.execute(sa.text(f"SELECT * FROM {table}")).all()
                for table in ("nodes", "device_drains", "tokens", "leadership", "ebbtide_schema")
            ]

    before = others()
    clock(store).advance(WEEK_S + 1)
    assert purge(store).jobs == 1
    assert others() == before


# ------------------------------------------------------------------ what stays


def test_a_job_that_an_unfinished_job_depends_on_is_kept(store: Store) -> None:
    needed = succeeded(store)  # a waiting job needs it
    held_needs = succeeded(store)  # a held job does: qrls makes it wait again
    queued_needs = succeeded(store)  # so does a queued one (qhold, then qrls)
    free = succeeded(store)
    running = submit(store)
    start(store, running)
    waiting = submit(
        store,
        depends=[{"kind": "afterok", "job_id": needed}, {"kind": "afterok", "job_id": running}],
    )
    held = submit(store, hold=True, depends=[{"kind": "afterany", "job_id": held_needs}])
    queued = submit(store, depends=[{"kind": "afterok", "job_id": queued_needs}])
    assert store.promote_waiting() == [queued]
    clock(store).advance(WEEK_S + 1)

    result = purge(store)

    assert (result.jobs, result.kept) == (1, 3)
    assert gone(store, [free])
    for job_id in (needed, held_needs, queued_needs):
        assert store.get(job_id).state == S.SUCCEEDED
    # the dependents still see what they depend on
    store.hold(queued, user="alice")
    store.release(queued, user="alice")
    store.release(held, user="alice")
    assert store.get(queued).state == store.get(held).state == S.WAITING
    assert sorted(store.promote_waiting()) == [held, queued]
    assert store.get(waiting).state == S.WAITING

    # once the dependents have finished, what they needed may go too
    attempt = store.get(running).attempts
    store.finish_attempt(running, attempt, exit_code=0, max_attempts=1)
    assert store.promote_waiting() == [waiting]
    for job_id in (waiting, held, queued):
        store.cancel(job_id, user="alice")
    clock(store).advance(WEEK_S + 1)
    assert purge(store).jobs == 7
    assert store.list_jobs() == []
    no_orphans(store)


def test_an_array_goes_whole_once_every_task_finished_long_enough_ago(store: Store) -> None:
    first, second, third = store.submit(
        JobSpec(command=["x"], array="1-3"), "alice", defaults_deadline_s=30.0
    )
    finish(store, first)
    finish(store, second)
    start(store, third)
    done = store.submit(JobSpec(command=["x"], array="1-2"), "alice", defaults_deadline_s=30.0)
    for job_id in done:
        store.cancel(job_id, user="alice")
    clock(store).advance(WEEK_S + 1)

    result = purge(store)  # the finished array goes; the running one stays whole

    assert (result.jobs, result.kept) == (2, 2)
    assert gone(store, done)
    assert [j.id for j in store.list_jobs()] == [first, second, third]

    store.finish_attempt(third, 1, exit_code=0, max_attempts=1)
    result = purge(store)  # its last task finished just now
    assert (result.jobs, result.kept) == (0, 2)
    clock(store).advance(WEEK_S + 1)
    result = purge(store)
    assert (result.jobs, result.kept) == (3, 0)
    assert store.list_jobs() == []
    no_orphans(store)


def test_an_array_some_job_depends_on_stays_whole(store: Store) -> None:
    tasks = store.submit(JobSpec(command=["x"], array="0-2"), "alice", defaults_deadline_s=30.0)
    for job_id in tasks:
        store.cancel(job_id, user="alice")
    waiting = submit(store, hold=True, depends=[{"kind": "afterany", "job_id": tasks[1]}])
    clock(store).advance(WEEK_S + 1)
    assert (purge(store).jobs, len(store.list_jobs())) == (0, 4)
    store.cancel(waiting, user="alice")
    clock(store).advance(WEEK_S + 1)
    assert purge(store).jobs == 4


def test_an_array_larger_than_a_batch_goes_in_several(store: Store) -> None:
    tasks = store.submit(JobSpec(command=["x"], array="1-5"), "alice", defaults_deadline_s=30.0)
    for job_id in tasks:
        store.cancel(job_id, user="alice")
    clock(store).advance(WEEK_S + 1)
    steps = list(store.purge_batches(WEEK_S, batch=2))
    assert [s.jobs for s in steps] == [2, 2, 1]
    assert gone(store, tasks)


# ------------------------------------------------------------------ batches and dry runs


def test_batches_add_up(store: Store) -> None:
    old = [succeeded(store) for _ in range(5)]
    events = rows(store, EVENTS, old)
    clock(store).advance(WEEK_S + 1)
    steps = list(store.purge_batches(WEEK_S, batch=2))
    assert [(s.jobs, s.attempts, s.batches) for s in steps] == [(2, 2, 1), (2, 2, 1), (1, 1, 1)]
    assert sum(s.events for s in steps) == events
    assert gone(store, old)

    more = [succeeded(store) for _ in range(5)]
    clock(store).advance(WEEK_S + 1)
    result = purge(store, batch=2)
    assert (result.jobs, result.attempts, result.batches) == (5, 5, 3)
    assert gone(store, more)


def test_a_pause_that_says_stop_ends_the_purge_between_batches(store: Store) -> None:
    old = [cancelled(store) for _ in range(5)]
    clock(store).advance(WEEK_S + 1)
    steps = list(store.purge_batches(WEEK_S, batch=2, pause=lambda: False))
    assert [s.jobs for s in steps] == [2]
    assert len(store.list_jobs()) == 3
    assert purge(store).jobs == 3 and gone(store, old)


def test_a_dry_run_counts_and_removes_nothing(store: Store) -> None:
    old = [succeeded(store) for _ in range(3)] + [cancelled(store)]
    tasks = store.submit(JobSpec(command=["x"], array="1-3"), "alice", defaults_deadline_s=30.0)
    for job_id in tasks:
        store.cancel(job_id, user="alice")
    needed = succeeded(store)
    submit(store, hold=True, depends=[{"kind": "afterok", "job_id": needed}])
    clock(store).advance(WEEK_S + 1)
    before = everything(store)

    dry = purge(store, batch=2, dry_run=True)

    assert everything(store) == before
    assert dry.dry_run and (dry.jobs, dry.kept) == (7, 1)
    assert dry.oldest_kept_finished_at == store.get(old[0]).finished_at
    real = purge(store, batch=2)
    assert (real.jobs, real.attempts, real.events, real.kept, real.batches) == (
        dry.jobs,
        dry.attempts,
        dry.events,
        dry.kept,
        dry.batches,
    )
    assert gone(store, old + tasks)
    assert real.oldest_kept_finished_at == store.get(needed).finished_at


def test_a_bad_batch_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="1 to 10000"):
        store.purge(WEEK_S, batch=0)


# ------------------------------------------------------------------ beside a running system


def test_a_purge_during_a_run_loses_nothing(store: Store) -> None:
    """A purge runs in a thread, one job per batch, while jobs are submitted (some with
    dependencies on the jobs it is removing), dispatched, started, checkpointed,
    finished and cancelled: the old finished jobs go, and every other job is there with
    every one of its events."""
    rng = random.Random(7)
    old = [succeeded(store) for _ in range(30)] + [cancelled(store) for _ in range(10)]
    clock(store).advance(WEEK_S + 1)
    stop = threading.Event()
    results: list[PurgeResult] = []
    errors: list[BaseException] = []

    def purging() -> None:
        try:
            while not stop.is_set():
                results.append(store.purge(WEEK_S, batch=1, pause_s=0.0))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=purging)
    thread.start()
    events_written: dict[int, int] = {}  # job -> events this test caused
    depending: dict[int, int] = {}  # job -> the old job it depends on
    try:
        for _ in range(60):
            dep = rng.choice(old)
            try:
                job_id = submit(store, hold=True, depends=[{"kind": "afterany", "job_id": dep}])
                depending[job_id] = dep
                events_written[job_id] = 1
            except SpecError as exc:  # the purge removed it first: refused, not left waiting
                assert f"no job with id {dep}" in str(exc)
            job_id = submit(store)
            events_written[job_id] = 1
            if rng.random() < 0.7:
                attempt = start(store, job_id)
                store.record_checkpoint(job_id, attempt, path="/c", at=store.clock.time())
                store.finish_attempt(job_id, attempt, exit_code=rng.choice([0, 1]), max_attempts=1)
                events_written[job_id] += 4  # dispatched, started, checkpointed, the end
            elif rng.random() < 0.5:
                store.cancel(job_id, user="alice")
                events_written[job_id] += 1
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive() and errors == []
    result = purge(store)

    purged = sum(r.jobs for r in results) + result.jobs
    kept = set(depending.values())
    assert purged == len(old) - len(kept)
    assert gone(store, [i for i in old if i not in kept])
    for job_id, dep in depending.items():
        assert store.get(dep).state in FINAL_STATES  # what it depends on is there
        assert store.get(job_id).state == S.HELD
    for job_id, count in events_written.items():
        assert len(store.events(job_id)) == count, job_id
    no_orphans(store)


def race(store: Store, target: int) -> int | None:
    """A purge and a submission depending on ``target`` at once; the job submitted, or
    None when it was refused."""
    barrier = threading.Barrier(2)
    submitted: list[int | None] = []

    def purging() -> None:
        barrier.wait()
        store.purge(WEEK_S, pause_s=0.0)

    def submitting() -> None:
        barrier.wait()
        try:
            submitted.append(submit(store, depends=[{"kind": "afterany", "job_id": target}]))
        except SpecError:
            submitted.append(None)

    threads = [threading.Thread(target=purging), threading.Thread(target=submitting)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    [job_id] = submitted
    return job_id


def test_a_purge_and_a_submission_depending_on_its_candidate_race_safely(store: Store) -> None:
    """Many times over: a submission naming a job the purge is removing either keeps
    that job or is refused; never a job waiting on nothing."""
    for _ in range(15):
        target = cancelled(store)
        clock(store).advance(WEEK_S + 1)
        job_id = race(store, target)
        if job_id is None:
            assert gone(store, [target])
        else:
            assert store.get(target).state == S.CANCELLED
            assert store.promote_waiting() == [job_id]
            store.cancel(job_id, user="alice")


# ------------------------------------------------------------------ the index


def test_candidates_are_read_as_a_range_of_the_finished_at_index(store: Store) -> None:
    from ebbtide.queue.store.purge import Purger

    for _ in range(3):
        succeeded(store)
    purger = Purger(store.clock.time(), batch=2, dry_run=True, postgres=False)
    purger._cursor = (0.0, 0)
    captured: list[tuple[str, Any]] = []

    @sa.event.listens_for(store.engine, "before_cursor_execute")
    def capture(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "ORDER BY jobs.finished_at" in statement and not captured:
            captured.append((statement, params))

    with store.engine.connect() as conn:
        purger.select(conn)
    sa.event.remove(store.engine, "before_cursor_execute", capture)
    [(statement, params)] = captured
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            explained = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params)
            plan = " ".join(str(r[-1]) for r in explained)
            assert "USING INDEX ix_jobs_finished_at" in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # no sort: the index's order
        else:
            conn.exec_driver_sql("SET enable_seqscan = off")
            plan = " ".join(str(r[0]) for r in conn.exec_driver_sql("EXPLAIN " + statement, params))
            assert "ix_jobs_finished_at" in plan, plan
            assert "Sort" not in plan, plan
