"""The store on SQLite and PostgreSQL: submission, ordering, fencing, outcomes, user actions.

Every test runs once per backend through the ``store`` fixture (a Store with a FakeClock).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ebbtide.errors import (
    InvalidTransition,
    JobNotFound,
    PermissionDenied,
    SpecError,
    StaleState,
    UserError,
)
from ebbtide.queue.spec import REQUEUE_EXIT_CODE, JobSpec
from ebbtide.queue.states import ACTIVE_STATES, AttemptOutcome, EventType, JobState
from ebbtide.queue.store import Store, job_to_dict

S = JobState
DEADLINE_S = 30.0


@pytest.fixture
def store(any_store: Store) -> Store:
    """The store's behaviour on every backend: SQLite, PostgreSQL and in memory."""
    return any_store


# ------------------------------------------------------------------ builders


def submit(store: Store, owner: str = "alice", **fields: Any) -> int:
    fields.setdefault("command", ["python", "train.py"])
    return store.submit(JobSpec(**fields), owner, defaults_deadline_s=DEADLINE_S)[0]


def dispatch(store: Store, job_id: int, node: str = "n1", devices: tuple[int, ...] = (0,)) -> int:
    job = store.get(job_id)
    return store.dispatch(
        job_id,
        expected_attempts=job.attempts,
        node=node,
        devices=devices,
        compute_pct=job.compute_pct,
        memory_mib=job.memory_mib,
    )


def start(store: Store, job_id: int) -> int:
    """Dispatch and start the job's next attempt; return its number."""
    attempt = dispatch(store, job_id)
    store.mark_started(job_id, attempt, pid=1000 + attempt, stdout_path="o", stderr_path="e")
    return attempt


EVICTION = {
    "reason": "online spike on n1/0",
    "deadline_s": 5.0,
    "spike_at": 123.0,
    "source": "nvml",
}


def evict(store: Store, job_id: int, attempt: int) -> None:
    store.begin_eviction(job_id, attempt, **EVICTION)


def in_state(store: Store, state: JobState, **fields: Any) -> tuple[int, int]:
    """A new job brought to ``state`` (dispatched, running or evicting); ``(id, attempt)``."""
    job_id = submit(store, **fields)
    attempt = dispatch(store, job_id)
    if state != S.DISPATCHED:
        store.mark_started(job_id, attempt, pid=1, stdout_path="o", stderr_path="e")
    if state == S.EVICTING:
        evict(store, job_id, attempt)
    assert store.get(job_id).state == state
    return job_id, attempt


def types(store: Store, job_id: int) -> list[str]:
    return [e["type"] for e in store.events(job_id)]


def snapshot(store: Store, job_id: int) -> tuple[dict[str, Any], list[Any], list[dict[str, Any]]]:
    return (
        store.get(job_id).model_dump(),
        [a.model_dump() for a in store.attempts(job_id)],
        store.events(job_id),
    )


# ------------------------------------------------------------------ submission


def test_submit_single(store: Store) -> None:
    job_id = submit(store, name="train", gpu="25%", gpumem="4GiB", priority=5, deadline="10s")
    job = store.get(job_id)
    assert job.id == job_id
    assert (job.name, job.owner, job.queue, job.priority) == ("train", "alice", "default", 5)
    assert job.state == S.QUEUED
    assert (job.compute_pct, job.gpus, job.memory_mib) == (25.0, 0, 4096)
    assert job.deadline_s == 10.0
    assert job.attempts == 0
    assert job.array_id is None and job.array_index is None and job.array_limit is None
    assert job.submitted_at == store.clock.time()
    assert store.spec(job_id).command == ["python", "train.py"]
    assert types(store, job_id) == [EventType.SUBMITTED]


def test_submit_uses_default_deadline(store: Store) -> None:
    assert store.get(submit(store)).deadline_s == DEADLINE_S


def test_submit_held(store: Store) -> None:
    job = store.get(submit(store, hold=True))
    assert (job.state, job.reason) == (S.HELD, "held at submission")
    assert store.queued_jobs() == []


def test_submit_with_dependencies_waits(store: Store) -> None:
    first = submit(store)
    second = submit(store, depends=[{"kind": "afterok", "job_id": first}])
    job = store.get(second)
    assert job.state == S.WAITING
    assert json.loads(job.depends_json) == [{"kind": "afterok", "job_id": first}]
    assert job_to_dict(job)["depends"] == [{"kind": "afterok", "job_id": first}]


def test_submit_array(store: Store) -> None:
    spec = JobSpec(command=["x"], name="sweep", array={"start": 1, "end": 7, "step": 3, "limit": 2})
    ids = store.submit(spec, "alice", defaults_deadline_s=DEADLINE_S)
    assert len(ids) == 3
    assert ids == sorted(ids)
    jobs = store.list_jobs(array_id=ids[0])
    assert [j.id for j in jobs] == ids
    assert {j.array_id for j in jobs} == {ids[0]}
    assert [j.name for j in jobs] == ["sweep[1]", "sweep[4]", "sweep[7]"]
    assert [j.array_index for j in jobs] == [1, 4, 7]
    assert {j.array_limit for j in jobs} == {2}
    assert {j.state for j in jobs} == {S.QUEUED}
    for job_id in ids:
        assert types(store, job_id) == [EventType.SUBMITTED]
    queued = store.queued_jobs()
    assert [(q.array_id, q.array_limit) for q in queued] == [(ids[0], 2)] * 3


def test_two_arrays_do_not_share_an_id(store: Store) -> None:
    spec = JobSpec(command=["x"], array={"start": 0, "end": 1})
    a = store.submit(spec, "alice", defaults_deadline_s=DEADLINE_S)
    b = store.submit(spec, "alice", defaults_deadline_s=DEADLINE_S)
    assert {j.array_id for j in store.list_jobs(ids=a)} == {a[0]}
    assert {j.array_id for j in store.list_jobs(ids=b)} == {b[0]}


def test_a_dependency_that_can_never_be_met_is_refused_and_inserts_nothing(
    store: Store,
) -> None:
    """A trial's trap: ``-W depend=afterok:ID`` on a job that had failed was accepted, and
    the job cancelled the moment it was submitted."""
    failed, done = submit(store), submit(store)
    store.finish_attempt(failed, start(store, failed), exit_code=1, max_attempts=1)
    store.finish_attempt(done, start(store, done), exit_code=0)
    assert (store.get(failed).state, store.get(done).state) == (S.FAILED, S.SUCCEEDED)
    for kind, job_id, state in (("afterok", failed, "failed"), ("afternotok", done, "succeeded")):
        spec = JobSpec(command=["x"], depends=[{"kind": kind, "job_id": job_id}])
        with pytest.raises(SpecError) as info:
            store.submit(spec, "alice", defaults_deadline_s=DEADLINE_S)
        assert info.value.field == "depends"
        assert str(info.value) == (
            f"depends: dependency {kind}:{job_id} can never be met (job {job_id} {state}): "
            "the job could never run"
        )
    assert [j.id for j in store.list_jobs()] == [failed, done]
    # met already, or still to come: accepted
    met = submit(store, depends=[{"kind": "afterany", "job_id": failed}])
    ok = submit(store, depends=[{"kind": "afterok", "job_id": done}])
    assert (store.get(met).state, store.get(ok).state) == (S.WAITING, S.WAITING)


def test_dependency_on_unknown_id_inserts_nothing(store: Store) -> None:
    known = submit(store)
    spec = JobSpec(
        command=["x"],
        array={"start": 0, "end": 2},
        depends=[{"kind": "afterok", "job_id": known}, {"kind": "afterany", "job_id": 9999}],
    )
    with pytest.raises(SpecError) as info:
        store.submit(spec, "alice", defaults_deadline_s=DEADLINE_S)
    assert info.value.field == "depends"
    assert "9999" in str(info.value)
    assert [j.id for j in store.list_jobs()] == [known]


def test_get_unknown_job(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.get(12345)
    with pytest.raises(JobNotFound):
        store.events(12345)


def test_list_jobs_filters(store: Store) -> None:
    a = submit(store, owner="alice")
    b = submit(store, owner="bob", hold=True)
    c = submit(store, owner="alice", queue="gpu")
    ids = lambda jobs: [j.id for j in jobs]  # noqa: E731
    assert ids(store.list_jobs()) == [a, b, c]
    assert ids(store.list_jobs(owner="alice")) == [a, c]
    assert ids(store.list_jobs(states=[S.HELD])) == [b]
    assert ids(store.list_jobs(states=[S.QUEUED, S.HELD])) == [a, b, c]
    assert ids(store.list_jobs(queue="gpu")) == [c]
    assert ids(store.list_jobs(ids=[c, a])) == [a, c]
    assert ids(store.list_jobs(limit=2)) == [a, b]
    assert store.queue_stats() == {"default": {"queued": 1, "held": 1}, "gpu": {"queued": 1}}


def test_job_to_dict(store: Store) -> None:
    job_id = submit(store, gpu="50%", gpumem="2GiB")
    start(store, job_id)
    data = job_to_dict(store.get(job_id))
    assert "spec_json" not in data and "depends_json" not in data
    assert data["slice"] == {"compute_pct": 50.0, "gpus": 0, "memory_mib": 2048}
    assert data["device"] == "0"
    assert data["state"] == "running"
    json.dumps(data)  # serialisable as is


# ------------------------------------------------------------------ ordering


def test_queued_jobs_order_priority_then_id(store: Store) -> None:
    low = submit(store, priority=-5)
    mid1 = submit(store)
    high = submit(store, priority=10)
    mid2 = submit(store)
    submit(store, hold=True, priority=100)  # not queued: not listed
    assert [q.id for q in store.queued_jobs()] == [high, mid1, mid2, low]
    assert [q.id for q in store.queued_jobs(limit=2)] == [high, mid1]
    assert [q.priority for q in store.queued_jobs()] == [10, 0, 0, -5]


def test_requeued_job_goes_ahead_of_later_submissions(store: Store) -> None:
    first = submit(store)
    attempt = start(store, first)
    later = submit(store)
    assert [q.id for q in store.queued_jobs()] == [later]
    evict(store, first, attempt)
    assert store.finish_attempt(first, attempt, exit_code=REQUEUE_EXIT_CODE) == S.QUEUED
    queued = store.queued_jobs()
    assert [q.id for q in queued] == [first, later]
    assert queued[0].attempts == 1  # the next dispatch is fenced on it


# ------------------------------------------------------------------ fencing


def test_dispatch_creates_an_attempt(store: Store) -> None:
    job_id = submit(store, gpu="25%", gpumem="1GiB")
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0, 1), compute_pct=25.0, memory_mib=1024
    )
    assert attempt == 1
    job = store.get(job_id)
    assert (job.state, job.attempts, job.node, job.devices) == (S.DISPATCHED, 1, "n1", "0,1")
    [row] = store.attempts(job_id)
    assert (row.number, row.node, row.devices, row.outcome) == (1, "n1", "0,1", None)
    assert row.dispatched_at == store.clock.time()
    event = store.events(job_id)[-1]
    assert event["type"] == EventType.DISPATCHED
    assert event["attempt"] == 1
    assert event["node"] == "n1" and event["devices"] == [0, 1]
    [active] = store.active_attempts()
    assert (active.job_id, active.attempt, active.state, active.devices) == (
        job_id,
        1,
        S.DISPATCHED,
        (0, 1),
    )
    assert store.active_attempts(node="n2") == []


def test_dispatch_with_stale_expected_attempts(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    store.finish_attempt(job_id, attempt, exit_code=REQUEUE_EXIT_CODE)
    before = snapshot(store, job_id)
    with pytest.raises(StaleState):
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
        )
    assert snapshot(store, job_id) == before
    assert dispatch(store, job_id) == 2


def test_dispatch_of_a_job_not_queued(store: Store) -> None:
    held = submit(store, hold=True)
    dispatched = submit(store)
    dispatch(store, dispatched)
    for job_id in (held, dispatched):
        before = snapshot(store, job_id)
        with pytest.raises(StaleState):
            store.dispatch(
                job_id,
                expected_attempts=store.get(job_id).attempts,
                node="n2",
                devices=(0,),
                compute_pct=10,
                memory_mib=1,
            )
        assert snapshot(store, job_id) == before


def _job_on_second_attempt(store: Store) -> tuple[int, int]:
    """A job whose attempt 1 was lost and which now runs attempt 2."""
    job_id = submit(store)
    first = start(store, job_id)
    store.requeue_lost(job_id, first, why="agent n1 stopped heartbeating")
    assert start(store, job_id) == 2
    return job_id, first


def test_mark_started_for_an_old_attempt(store: Store) -> None:
    job_id = submit(store)
    first = dispatch(store, job_id)
    store.requeue_lost(job_id, first, why="never started")
    assert dispatch(store, job_id) == 2
    before = snapshot(store, job_id)
    with pytest.raises(StaleState):
        store.mark_started(job_id, first, pid=1, stdout_path="x", stderr_path="y")
    assert snapshot(store, job_id) == before
    assert store.get(job_id).state == S.DISPATCHED


def test_record_checkpoint_for_an_old_attempt(store: Store) -> None:
    job_id, old = _job_on_second_attempt(store)
    before = snapshot(store, job_id)
    with pytest.raises(StaleState):
        store.record_checkpoint(job_id, old, path="/ckpt/old", at=store.clock.time())
    assert snapshot(store, job_id) == before
    assert store.get(job_id).checkpoint_path is None


def test_record_checkpoint_for_the_current_attempt(store: Store) -> None:
    job_id, _ = _job_on_second_attempt(store)
    store.clock.advance(5)  # type: ignore[attr-defined]
    at = store.clock.time()
    store.record_checkpoint(job_id, 2, path="/ckpt/2", at=at, size_bytes=10, duration_s=0.5)
    job = store.get(job_id)
    assert (job.checkpoint_path, job.last_checkpoint_at) == ("/ckpt/2", at)
    assert store.attempts(job_id)[1].last_checkpoint_at == at
    assert store.attempts(job_id)[0].last_checkpoint_at is None
    event = store.events(job_id)[-1]
    assert (event["type"], event["attempt"], event["path"], event["size_bytes"]) == (
        EventType.CHECKPOINTED,
        2,
        "/ckpt/2",
        10,
    )


def test_finish_attempt_for_an_old_attempt(store: Store) -> None:
    job_id, old = _job_on_second_attempt(store)
    before = snapshot(store, job_id)
    for exit_code in (0, 1, REQUEUE_EXIT_CODE):
        with pytest.raises(StaleState):
            store.finish_attempt(job_id, old, exit_code=exit_code)
    assert snapshot(store, job_id) == before
    assert store.get(job_id).state == S.RUNNING


def test_begin_eviction_for_an_old_attempt(store: Store) -> None:
    job_id, old = _job_on_second_attempt(store)
    before = snapshot(store, job_id)
    with pytest.raises(StaleState):
        evict(store, job_id, old)
    assert snapshot(store, job_id) == before


def test_finish_attempt_twice(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    store.finish_attempt(job_id, attempt, exit_code=0)
    before = snapshot(store, job_id)
    with pytest.raises(StaleState):
        store.finish_attempt(job_id, attempt, exit_code=1)
    assert snapshot(store, job_id) == before


def test_transition_guards_the_source_state(store: Store) -> None:
    job_id = submit(store)
    with pytest.raises(StaleState):
        store.transition(job_id, S.WAITING, S.QUEUED, event=EventType.DEPENDENCIES_MET)
    with pytest.raises(InvalidTransition):
        store.transition(job_id, S.QUEUED, S.RUNNING, event=EventType.STARTED)
    assert store.get(job_id).state == S.QUEUED
    assert types(store, job_id) == [EventType.SUBMITTED]


# ------------------------------------------------------------------ outcomes


def test_exit_0_succeeds(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    store.clock.advance(60)  # type: ignore[attr-defined]
    assert store.finish_attempt(job_id, attempt, exit_code=0) == S.SUCCEEDED
    job = store.get(job_id)
    # where it ran stays on record (qstat -x): a trial found finished jobs had forgotten it
    assert (job.state, job.exit_code, job.node, job.devices) == (S.SUCCEEDED, 0, "n1", "0")
    assert job.finished_at == store.clock.time()
    assert store.active_attempts() == [] and store.active_attempts(node="n1") == []
    [row] = store.attempts(job_id)
    assert (row.outcome, row.exit_code, row.ended_at) == (
        AttemptOutcome.SUCCEEDED,
        0,
        store.clock.time(),
    )
    assert types(store, job_id)[-1] == EventType.SUCCEEDED
    assert store.active_attempts() == []


#: exit codes of an evicted attempt: asked to requeue, ended by the warning signal (TERM),
#: killed at the deadline, not known
EVICTED_EXITS = [REQUEUE_EXIT_CODE, 128 + 15, 137, None]


def test_exit_while_evicting_requeues(store: Store) -> None:
    """An eviction's exits are evictions, whatever max_attempts says."""
    jobs = {code: in_state(store, S.EVICTING, max_attempts=1) for code in EVICTED_EXITS}
    ended = {
        code: store.finish_attempt(
            job_id,
            attempt,
            exit_code=code,
            eviction={**EVICTION, "killed": True} if code == 137 else EVICTION,
        )
        for code, (job_id, attempt) in jobs.items()
    }
    assert ended == dict.fromkeys(EVICTED_EXITS, S.QUEUED)
    for code, (job_id, attempt) in jobs.items():
        job = store.get(job_id)
        assert (job.state, job.evictions, job.failures, job.node) == (S.QUEUED, 1, 0, None)
        assert EVICTION["reason"] in job.reason
        events = store.events(job_id)
        assert [e["type"] for e in events[-4:]] == [
            EventType.STARTED,
            EventType.EVICT_REQUESTED,
            EventType.EVICTED,
            EventType.REQUEUED,
        ]
        requested, evicted, requeued = events[-3:]
        for key, value in EVICTION.items():
            assert requested[key] == value
            assert evicted[key] == value
        assert evicted["exit_code"] == code
        assert requeued["reason"] == EVICTION["reason"]
        assert {e["attempt"] for e in events[-3:]} == {attempt}
        assert store.attempts(job_id)[0].outcome == AttemptOutcome.EVICTED
    assert sorted(q.id for q in store.queued_jobs()) == sorted(j for j, _ in jobs.values())


@pytest.mark.parametrize(("max_attempts", "state"), [(1, S.FAILED), (3, S.QUEUED)])
def test_a_crash_while_evicting_counts_as_a_failure(
    store: Store, max_attempts: int, state: JobState
) -> None:
    """A traceback in the checkpoint code is the job's failure, not just an eviction:
    a job that always crashes when warned runs out of attempts."""
    job_id, attempt = in_state(store, S.EVICTING, max_attempts=max_attempts)
    assert store.finish_attempt(job_id, attempt, exit_code=1, eviction=EVICTION) == state
    job = store.get(job_id)
    assert (job.evictions, job.failures) == (1, 1)
    assert "crashed while being evicted (exit 1)" in job.reason
    assert f"1 of {max_attempts} failures" in job.reason
    assert types(store, job_id)[-2] == EventType.EVICTED


def test_exit_0_while_evicting_succeeds(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    evict(store, job_id, attempt)
    assert store.finish_attempt(job_id, attempt, exit_code=0, eviction=EVICTION) == S.SUCCEEDED


def test_exit_99_while_running_requeues(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    assert store.finish_attempt(job_id, attempt, exit_code=REQUEUE_EXIT_CODE) == S.QUEUED
    job = store.get(job_id)
    assert (job.state, job.evictions, job.failures) == (S.QUEUED, 1, 0)
    assert types(store, job_id)[-2:] == [EventType.EVICTED, EventType.REQUEUED]
    assert "99" in store.events(job_id)[-1]["reason"]
    assert store.attempts(job_id)[0].outcome == AttemptOutcome.EVICTED


def test_evictions_do_not_use_up_attempts(store: Store) -> None:
    job_id = submit(store, max_attempts=1)
    for _ in range(3):
        attempt = start(store, job_id)
        assert store.finish_attempt(job_id, attempt, exit_code=REQUEUE_EXIT_CODE) == S.QUEUED
    attempt = start(store, job_id)
    assert attempt == 4
    assert store.finish_attempt(job_id, attempt, exit_code=0) == S.SUCCEEDED
    assert [a.number for a in store.attempts(job_id)] == [1, 2, 3, 4]


@pytest.mark.parametrize("from_spec", [True, False])
def test_failure_requeues_while_attempts_remain(store: Store, from_spec: bool) -> None:
    job_id = submit(store, max_attempts=2 if from_spec else 1)
    override = None if from_spec else 2
    first = start(store, job_id)
    assert store.finish_attempt(job_id, first, exit_code=3, max_attempts=override) == S.QUEUED
    job = store.get(job_id)
    assert (job.state, job.failures, job.exit_code) == (S.QUEUED, 1, 3)
    assert types(store, job_id)[-2:] == [EventType.FAILED, EventType.REQUEUED]
    assert store.events(job_id)[-2]["final"] is False

    second = start(store, job_id)
    assert store.finish_attempt(job_id, second, exit_code=4, max_attempts=override) == S.FAILED
    job = store.get(job_id)
    assert (job.state, job.failures, job.exit_code) == (S.FAILED, 2, 4)
    assert job.finished_at == store.clock.time()
    last = store.events(job_id)[-1]
    assert (last["type"], last["final"], last["attempt"]) == (EventType.FAILED, True, 2)
    assert [a.outcome for a in store.attempts(job_id)] == [AttemptOutcome.FAILED] * 2


def test_failure_without_attempts_left_fails(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    assert store.finish_attempt(job_id, attempt, exit_code=1) == S.FAILED
    assert "1" in store.get(job_id).reason


def test_cancel_requested_ends_cancelled(store: Store) -> None:
    """Once a cancel was asked for, the attempt's end cancels the job, whatever the exit."""
    cases = [
        (state, code) for state in (S.RUNNING, S.EVICTING) for code in (1, REQUEUE_EXIT_CODE, -15)
    ]
    jobs = {}
    for state, code in cases:
        job_id, attempt = in_state(store, S.RUNNING, max_attempts=5)
        store.cancel(job_id, user="alice")
        if state == S.EVICTING:
            evict(store, job_id, attempt)
        jobs[(state, code)] = (job_id, attempt)
    ended = {
        case: store.finish_attempt(job_id, attempt, exit_code=case[1])
        for case, (job_id, attempt) in jobs.items()
    }
    assert ended == dict.fromkeys(cases, S.CANCELLED)
    for (state, _), (job_id, _) in jobs.items():
        job = store.get(job_id)
        assert (job.state, job.cancel_requested) == (S.CANCELLED, True)
        assert job.finished_at is not None
        if state == S.RUNNING:  # who, as for a job cancelled before it ran (a trial's trap)
            assert job.reason == "cancelled by alice"
        assert types(store, job_id)[-1] == EventType.CANCELLED
        assert store.attempts(job_id)[0].outcome == AttemptOutcome.CANCELLED


# ------------------------------------------------------------------ user actions


def test_hold_and_release(store: Store) -> None:
    job_id = submit(store)
    job = store.hold(job_id, user="alice")
    assert (job.state, job.reason) == (S.HELD, "held by alice")
    assert [q.id for q in store.queued_jobs()] == []
    assert store.hold(job_id, user="alice").state == S.HELD  # idempotent
    job = store.release(job_id, user="alice")
    assert (job.state, job.reason) == (S.QUEUED, "")
    assert types(store, job_id) == [EventType.SUBMITTED, EventType.HELD, EventType.RELEASED]
    assert store.events(job_id)[1]["by"] == "alice"


def test_release_of_a_held_job_with_dependencies_waits(store: Store) -> None:
    dep = submit(store)
    job_id = submit(store, depends=[{"kind": "afterok", "job_id": dep}])
    assert store.hold(job_id, user="alice").state == S.HELD
    assert store.release(job_id, user="alice").state == S.WAITING


def test_release_of_a_job_not_held(store: Store) -> None:
    job_id = submit(store)
    with pytest.raises(UserError):
        store.release(job_id, user="alice")


#: what each action does to a job of alice's when an admin does it
ADMIN_ACTIONS = {"hold": S.HELD, "release": S.QUEUED, "cancel": S.CANCELLED}


def test_other_users_may_not_act(store: Store) -> None:
    for action, expected in ADMIN_ACTIONS.items():
        job_id = submit(store, owner="alice", hold=action == "release")
        before = snapshot(store, job_id)
        with pytest.raises(PermissionDenied) as info:
            getattr(store, action)(job_id, user="bob")
        assert "alice" in str(info.value)
        assert isinstance(info.value, UserError)
        assert snapshot(store, job_id) == before
        job = getattr(store, action)(job_id, user="bob", admin=True)
        assert job.state == expected
        assert store.events(job_id)[-1]["by"] == "bob"


def test_hold_of_an_active_job_is_a_user_error(store: Store) -> None:
    for state in ACTIVE_STATES:
        job_id, _ = in_state(store, state)
        with pytest.raises(UserError, match=state.value):
            store.hold(job_id, user="alice")
        assert store.get(job_id).state == state


def test_cancel_of_a_queued_job(store: Store) -> None:
    job_id = submit(store)
    job = store.cancel(job_id, user="alice")
    assert (job.state, job.reason) == (S.CANCELLED, "cancelled by alice")
    assert job.finished_at == store.clock.time()
    assert types(store, job_id)[-1] == EventType.CANCELLED
    with pytest.raises(UserError, match="already cancelled"):
        store.cancel(job_id, user="alice")


def test_cancel_of_a_dispatched_job_ends_its_attempt(store: Store) -> None:
    job_id = submit(store)
    dispatch(store, job_id)
    assert store.cancel(job_id, user="alice").state == S.CANCELLED
    assert store.attempts(job_id)[0].outcome == AttemptOutcome.CANCELLED
    assert store.active_attempts() == []


def test_cancel_of_a_running_job_asks_for_it(store: Store) -> None:
    for state in (S.RUNNING, S.EVICTING):
        job_id, attempt = in_state(store, state)
        job = store.cancel(job_id, user="alice")
        assert (job.state, job.cancel_requested) == (state, True)
        assert "alice" in job.reason
        event = store.events(job_id)[-1]
        assert (event["type"], event["attempt"], event["by"]) == (
            EventType.CANCEL_REQUESTED,
            attempt,
            "alice",
        )
    assert {(a.state, a.cancel_requested) for a in store.active_attempts()} == {
        (S.RUNNING, True),
        (S.EVICTING, True),
    }


# ------------------------------------------------------------------ dependencies


def _finish(store: Store, job_id: int, exit_code: int) -> None:
    store.finish_attempt(job_id, start(store, job_id), exit_code=exit_code)


#: (dependency kind, how the dependency ended) → where the waiting job goes
PROMOTIONS = {
    ("afterok", S.SUCCEEDED): S.QUEUED,
    ("afterok", S.FAILED): S.CANCELLED,
    ("afterok", S.CANCELLED): S.CANCELLED,
    ("afternotok", S.FAILED): S.QUEUED,
    ("afternotok", S.CANCELLED): S.QUEUED,
    ("afternotok", S.SUCCEEDED): S.CANCELLED,
    ("afterany", S.SUCCEEDED): S.QUEUED,
    ("afterany", S.FAILED): S.QUEUED,
    ("afterany", S.CANCELLED): S.QUEUED,
}


def test_promote_waiting(store: Store) -> None:
    jobs = {}
    for kind, dep_end in PROMOTIONS:
        dep, attempt = in_state(store, S.RUNNING)
        waiter = submit(store, depends=[{"kind": kind, "job_id": dep}])
        jobs[(kind, dep_end)] = (dep, attempt, waiter)
    assert store.promote_waiting() == []  # every dependency still running: pending
    assert {j.id for j in store.list_jobs(states=[S.WAITING])} == {w for *_, w in jobs.values()}

    for (_, dep_end), (dep, attempt, _) in jobs.items():
        if dep_end == S.CANCELLED:
            store.cancel(dep, user="alice")
        store.finish_attempt(dep, attempt, exit_code=0 if dep_end == S.SUCCEEDED else 1)
        assert store.get(dep).state == dep_end

    promoted = store.promote_waiting()
    assert sorted(promoted) == sorted(w for *_, w in jobs.values())
    assert {case: store.get(w).state for case, (*_, w) in jobs.items()} == PROMOTIONS
    for (kind, _), (dep, _, waiter) in jobs.items():
        job = store.get(waiter)
        last = store.events(waiter)[-1]
        if job.state == S.QUEUED:
            assert last["type"] == EventType.DEPENDENCIES_MET
            assert job.reason == ""
        else:  # the reason says which dependency can never be met
            assert last["type"] == EventType.CANCELLED
            assert f"{kind}:{dep}" in last["reason"]
            assert f"{kind}:{dep}" in job.reason
            assert job.finished_at is not None
    assert store.promote_waiting() == []  # nothing left to do


def test_promote_waiting_needs_every_dependency(store: Store) -> None:
    a = submit(store)
    b = submit(store)
    job_id = submit(
        store, depends=[{"kind": "afterok", "job_id": a}, {"kind": "afterok", "job_id": b}]
    )
    _finish(store, a, 0)
    assert store.promote_waiting() == []
    assert store.get(job_id).state == S.WAITING
    _finish(store, b, 0)
    assert store.promote_waiting() == [job_id]
    assert store.get(job_id).state == S.QUEUED


def test_an_array_dependency_waits_for_every_task(store: Store) -> None:
    """``-W depend=afterok:12[]`` waited for task 12 alone (the ``[]`` was dropped, and
    an array's id is its first task's): it waits for the whole array, as PBS's does."""
    first, second, third = store.submit(
        JobSpec(command=["true"], array={"start": 1, "end": 3}), "alice", defaults_deadline_s=30
    )
    whole = submit(store, depends=[{"kind": "afterok", "job_id": first, "array": True}])
    task = submit(store, depends=[{"kind": "afterok", "job_id": first}])
    failed = submit(store, depends=[{"kind": "afternotok", "job_id": first, "array": True}])
    assert store.get(whole).state == S.WAITING
    _finish(store, first, 0)
    assert store.promote_waiting() == [task]  # the first task alone is done
    _finish(store, second, 0)
    assert store.promote_waiting() == []
    assert (store.get(whole).state, store.get(failed).state) == (S.WAITING, S.WAITING)
    _finish(store, third, 0)
    assert sorted(store.promote_waiting()) == sorted([whole, failed])
    assert store.get(whole).state == S.QUEUED
    assert store.get(failed).state == S.CANCELLED  # every task succeeded: never met
    why = f"afternotok:{first}[] can never be met (array {first} succeeded)"
    assert why in store.get(failed).reason


def test_an_array_dependency_on_a_job_that_is_none_is_refused(store: Store) -> None:
    lone = submit(store)
    with pytest.raises(SpecError, match=f"job {lone} is not an array: depend on {lone}, without"):
        submit(store, depends=[{"kind": "afterok", "job_id": lone, "array": True}])
    assert [j.id for j in store.list_jobs()] == [lone]  # nothing submitted
    tasks = store.submit(
        JobSpec(command=["true"], array={"start": 1, "end": 2}), "alice", defaults_deadline_s=30
    )
    _finish(store, tasks[0], 0)
    store.cancel(tasks[1], user="alice")  # the array can never succeed
    with pytest.raises(SpecError, match=rf"afterok:{tasks[0]}\[\] can never be met \(array"):
        submit(store, depends=[{"kind": "afterok", "job_id": tasks[0], "array": True}])


def test_a_task_named_by_its_index_is_depended_on_by_its_id(store: Store) -> None:
    """``-W depend=afterok:12[2]`` was refused (``qstat``, ``qhold`` and ``qdel`` take
    ``12[2]``): it names the array's task of index 2, and the store keeps it as that
    task's own id, in the job's dependencies and its spec alike."""
    tasks = store.submit(
        JobSpec(command=["true"], array={"start": 0, "end": 4, "step": 2}),
        "alice",
        defaults_deadline_s=30,
    )  # indices 0, 2, 4
    job_id = submit(
        store,
        depends=[f"afterok:{tasks[0]}[2]", f"afterok:{tasks[1]}", f"afterany:{tasks[0]}[4]"],
    )
    expected = [
        {"kind": "afterok", "job_id": tasks[1]},  # the repeat kept once
        {"kind": "afterany", "job_id": tasks[2]},
    ]
    assert json.loads(store.get(job_id).depends_json) == expected
    spec = store.spec(job_id)
    assert [(d.kind, d.job_id, d.task) for d in spec.depends] == [
        ("afterok", tasks[1], None),
        ("afterany", tasks[2], None),
    ]
    _finish(store, tasks[1], 0)
    assert store.promote_waiting() == []
    _finish(store, tasks[2], 1)
    assert store.promote_waiting() == [job_id]
    before = [j.id for j in store.list_jobs()]
    with pytest.raises(SpecError, match=rf"array {tasks[0]} has no task 3 \(its indices: 0-4\)"):
        submit(store, depends=[f"afterok:{tasks[0]}[3]"])
    with pytest.raises(SpecError, match=f"job {job_id} is not an array: no task 1"):
        submit(store, depends=[f"afterok:{job_id}[1]"])
    assert [j.id for j in store.list_jobs()] == before  # nothing submitted


def test_promote_waiting_gives_up_early(store: Store) -> None:
    """One dependency that can never be met cancels the job even while others run."""
    a = submit(store)
    b = submit(store)
    job_id = submit(
        store, depends=[{"kind": "afterok", "job_id": a}, {"kind": "afterok", "job_id": b}]
    )
    _finish(store, b, 1)
    assert store.promote_waiting() == [job_id]
    assert store.get(job_id).state == S.CANCELLED


# ------------------------------------------------------------------ events


def test_events_oldest_first(store: Store) -> None:
    clock = store.clock
    job_id = submit(store)
    times = [clock.time()]

    def tick() -> None:
        clock.advance(1)  # type: ignore[attr-defined]
        times.append(clock.time())

    tick()
    attempt = dispatch(store, job_id)
    tick()
    store.mark_started(job_id, attempt, pid=7, stdout_path="o", stderr_path="e")
    tick()
    store.finish_attempt(job_id, attempt, exit_code=0)
    events = store.events(job_id)
    assert [e["type"] for e in events] == [
        EventType.SUBMITTED,
        EventType.DISPATCHED,
        EventType.STARTED,
        EventType.SUCCEEDED,
    ]
    assert [e["time"] for e in events] == times
    assert [e["attempt"] for e in events] == [None, 1, 1, 1]
    assert events[0]["owner"] == "alice"
    assert events[2]["pid"] == 7
    assert events[3]["exit_code"] == 0


def test_events_belong_to_their_job(store: Store) -> None:
    a = submit(store)
    b = submit(store)
    store.hold(b, user="alice")
    assert types(store, a) == [EventType.SUBMITTED]
    assert types(store, b) == [EventType.SUBMITTED, EventType.HELD]


# ------------------------------------------------------------------ lost attempts


def test_requeue_lost(store: Store) -> None:
    why = "agent n1 stopped heartbeating"
    jobs = {state: in_state(store, state) for state in (S.DISPATCHED, S.RUNNING, S.EVICTING)}
    for job_id, attempt in jobs.values():
        store.requeue_lost(job_id, attempt, why=why)
    for job_id, attempt in jobs.values():
        job = store.get(job_id)
        assert (job.state, job.node, job.devices) == (S.QUEUED, None, None)
        assert why in job.reason
        lost, requeued = store.events(job_id)[-2:]
        assert (lost["type"], lost["attempt"], lost["reason"]) == (EventType.LOST, attempt, why)
        assert requeued["type"] == EventType.REQUEUED
        assert store.attempts(job_id)[0].outcome == AttemptOutcome.LOST
        with pytest.raises(StaleState):  # a second reaper loses
            store.requeue_lost(job_id, attempt, why="again")
    assert store.active_attempts() == []
    assert [q.id for q in store.queued_jobs()] == [j for j, _ in jobs.values()]


def test_requeue_lost_in_the_state_seen_only(store: Store) -> None:
    """An attempt seen dispatched, which has started since, is not lost for not starting:
    the reaper says the state it saw, and loses the race."""
    job_id, attempt = in_state(store, S.RUNNING)
    with pytest.raises(StaleState):
        store.requeue_lost(job_id, attempt, why="never started", state=S.DISPATCHED)
    assert store.get(job_id).state == S.RUNNING
    assert EventType.LOST not in types(store, job_id)
    other, second = in_state(store, S.DISPATCHED)
    store.requeue_lost(other, second, why="never started", state=S.DISPATCHED)
    assert store.get(other).state == S.QUEUED


def test_dispatch_many_grants_each_and_leaves_out_a_lost_race(store: Store) -> None:
    """A pass's grants in one write: each as ``dispatch`` grants it; one whose job is no
    longer queued at the planned attempt count is left out, the others granted."""
    from ebbtide.scheduling.planner import Dispatch

    first, gone, requeued = submit(store), submit(store), submit(store)
    store.cancel(gone, user="alice")
    lost = start(store, requeued)
    store.requeue_lost(requeued, lost, why="agent gone")  # queued again, at attempt 1
    numbers = store.dispatch_many(
        [
            Dispatch(first, 0, "n1", (0,), 25.0, 1024),
            Dispatch(gone, 0, "n1", (1,), 25.0, 1024),
            Dispatch(requeued, 0, "n1", (2,), 25.0, 1024),  # planned before its requeue
            Dispatch(requeued + 100, 0, "n1", (3,), 25.0, 1024),  # no such job
        ]
    )
    assert numbers == [1, None, None, None]
    job = store.get(first)
    assert (job.state, job.attempts, job.node, job.devices) == (S.DISPATCHED, 1, "n1", "0")
    assert types(store, first)[-1] == EventType.DISPATCHED
    assert store.get(gone).state == S.CANCELLED
    assert (store.get(requeued).state, store.get(requeued).attempts) == (S.QUEUED, 1)
    assert types(store, requeued)[-2:] == [EventType.LOST, EventType.REQUEUED]
    assert [(a.job_id, a.attempt) for a in store.active_attempts()] == [(first, 1)]
    assert store.dispatch_many([Dispatch(requeued, 1, "n2", (0, 1), 50.0, 2048)]) == [2]
    assert store.get(requeued).devices == "0,1"
    assert store.dispatch_many([]) == []


def test_requeue_lost_of_a_cancelled_job_cancels(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    store.cancel(job_id, user="alice")
    store.requeue_lost(job_id, attempt, why="agent gone")
    assert store.get(job_id).state == S.CANCELLED
    assert types(store, job_id)[-2:] == [EventType.LOST, EventType.CANCELLED]


def test_late_report_after_requeue_lost_is_refused(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    store.requeue_lost(job_id, attempt, why="agent gone")
    before = snapshot(store, job_id)
    with pytest.raises(StaleState):
        store.finish_attempt(job_id, attempt, exit_code=0)
    with pytest.raises(StaleState):
        store.record_progress(job_id, attempt, 5, 10)
    assert snapshot(store, job_id) == before


# ------------------------------------------------------------------ nodes


def test_heartbeat_and_nodes(store: Store) -> None:
    devices = [{"index": 0, "memory_mib": 81920, "online_compute_pct": 40.0}]
    store.heartbeat("n2", started_at=1.0, devices=devices)
    store.heartbeat("n1", started_at=2.0, devices=[])
    store.clock.advance(3)  # type: ignore[attr-defined]
    store.heartbeat("n2", started_at=1.0, devices=devices, stopping=True)
    nodes = store.nodes()
    assert [n.name for n in nodes] == ["n1", "n2"]
    n2 = nodes[1]
    assert (n2.heartbeat_at, n2.stopping) == (store.clock.time(), True)
    assert json.loads(n2.devices_json) == devices
    store.forget_node("n2")
    assert [n.name for n in store.nodes()] == ["n1"]


# ------------------------------------------------------------------ concurrency


def test_racing_dispatches_exactly_one_wins(store: Store) -> None:
    job_id = submit(store)
    barrier = threading.Barrier(2)
    results: list[Any] = []
    lock = threading.Lock()

    def race(node: str) -> None:
        barrier.wait()
        try:
            outcome: Any = store.dispatch(
                job_id, expected_attempts=0, node=node, devices=(0,), compute_pct=10, memory_mib=1
            )
        except StaleState as exc:
            outcome = exc
        with lock:
            results.append((node, outcome))

    threads = [threading.Thread(target=race, args=(n,)) for n in ("n1", "n2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 2
    winners = [(node, r) for node, r in results if not isinstance(r, BaseException)]
    losers = [r for _, r in results if isinstance(r, StaleState)]
    assert len(winners) == 1 and len(losers) == 1
    node, attempt = winners[0]
    assert attempt == 1
    job = store.get(job_id)
    assert (job.state, job.attempts, job.node) == (S.DISPATCHED, 1, node)
    assert [a.node for a in store.attempts(job_id)] == [node]
    assert types(store, job_id).count(EventType.DISPATCHED) == 1
    assert {a.state for a in store.active_attempts()} <= ACTIVE_STATES


def _evict_once(store, job_id: int) -> None:  # type: ignore[no-untyped-def]
    job = store.get(job_id)
    n = store.dispatch(
        job_id,
        expected_attempts=job.attempts,
        node="n",
        devices=(0,),
        compute_pct=10,
        memory_mib=1024,
    )
    store.mark_started(job_id, n, pid=1, stdout_path="o", stderr_path="e")
    store.begin_eviction(job_id, n, reason="spike", deadline_s=5, spike_at=0.0, source="test")
    store.finish_attempt(job_id, n, exit_code=99, eviction={"reason": "spike"})


def test_jobs_evicted_max_preemptions_times_are_held_with_a_reason(store) -> None:  # type: ignore[no-untyped-def]
    from ebbtide.queue.spec import JobSpec

    [twice, once] = [
        store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=5)[0] for _ in range(2)
    ]
    _evict_once(store, twice)
    _evict_once(store, twice)
    _evict_once(store, once)
    assert store.get(twice).requeued_at is not None
    assert store.hold_overpreempted("default", 2) == [twice]
    held = store.get(twice)
    assert held.state == "held" and "max_preemptions 2" in held.reason
    assert store.get(once).state == "queued"
    assert store.events(twice)[-1]["type"] == "held"
    # a release lets it try again; it is held again only after another eviction
    store.release(twice, user="alice")
    assert store.get(twice).state == "queued"
    assert store.hold_overpreempted("default", 2) == []
    _evict_once(store, twice)
    assert store.hold_overpreempted("default", 2) == []
    _evict_once(store, twice)
    assert store.hold_overpreempted("default", 2) == [twice]


# ------------------------------------------------------------------ pauses and suspensions


def test_a_suspension_is_recorded_seen_by_the_scheduler_and_cleared_by_the_restore(
    store: Store,
) -> None:
    job_id, attempt = in_state(store, S.RUNNING)
    store.record_pause(job_id, attempt, at=100.0, reason="compute", reason_code="online_compute")
    [a] = store.active_attempts()
    assert (a.paused_at, a.suspended_at) == (100.0, None)
    store.record_pause(
        job_id, attempt, at=110.0, reason="memory", reason_code="online_memory", kind="suspend"
    )
    job = store.get(job_id)
    # paused since the first pause, suspended since the move to host memory
    assert (job.paused_at, job.suspended_at) == (100.0, 110.0)
    assert job_to_dict(job)["suspended_at"] == 110.0
    [a] = store.active_attempts()
    assert (a.paused_at, a.suspended_at) == (100.0, 110.0) and a.suspended
    [paused, suspended] = [e for e in store.events(job_id) if e["type"] == "paused"]
    assert (paused["kind"], suspended["kind"]) == ("pause", "suspend")

    store.record_thaw(job_id, attempt, at=130.0, paused_s=30.0, kind="restore")
    job = store.get(job_id)
    assert (job.paused_at, job.suspended_at) == (None, None)
    assert store.active_attempts()[0].suspended_at is None


def test_a_paused_job_says_why_while_it_runs_and_an_evicting_one_keeps_its_reason(
    store: Store,
) -> None:
    """A user's trap: qstat showed a paused job's state and an empty REASON, so nothing
    said why it made no progress."""
    job_id, attempt = in_state(store, S.RUNNING)
    store.record_pause(
        job_id, attempt, at=100.0, reason="online compute 85% on n1/0", reason_code="online_compute"
    )
    assert store.get(job_id).reason == "paused: online compute 85% on n1/0"
    store.record_pause(
        job_id,
        attempt,
        at=110.0,
        reason="online memory",
        reason_code="online_memory",
        kind="suspend",
    )
    assert store.get(job_id).reason == "suspended: online memory"
    store.record_thaw(job_id, attempt, at=120.0, paused_s=20.0, kind="restore")
    assert store.get(job_id).reason == ""
    # a paused attempt being taken back is thawed to checkpoint: it says it is evicted
    store.record_pause(job_id, attempt, at=130.0, reason="spike", reason_code="online_compute")
    evict(store, job_id, attempt)
    store.record_thaw(job_id, attempt, at=131.0, paused_s=1.0)
    assert store.get(job_id).reason == f"evicting: {EVICTION['reason']}"


def test_a_plain_pause_records_no_suspension(store: Store) -> None:
    job_id, attempt = in_state(store, S.RUNNING)
    store.record_pause(job_id, attempt, at=100.0, reason="r", reason_code="online_compute")
    assert store.get(job_id).suspended_at is None


def test_an_attempt_that_ends_suspended_is_suspended_no_more(store: Store) -> None:
    job_id, attempt = in_state(store, S.RUNNING)
    store.record_pause(
        job_id, attempt, at=110.0, reason="memory", reason_code="online_memory", kind="suspend"
    )
    evict(store, job_id, attempt)
    assert store.get(job_id).suspended_at == 110.0  # still on the host while it is evicted
    # its CUDA calls block on the host: killed at the deadline
    killed = {**EVICTION, "killed": True}
    assert store.finish_attempt(job_id, attempt, exit_code=137, eviction=killed) == S.QUEUED
    job = store.get(job_id)
    assert (job.paused_at, job.suspended_at) == (None, None)
    # the next attempt starts on its GPU
    attempt = start(store, job_id)
    [a] = store.active_attempts()
    assert (a.attempt, a.paused_at, a.suspended_at) == (attempt, None, None)


def test_a_suspension_of_an_old_attempt_is_refused(store: Store) -> None:
    job_id, attempt = in_state(store, S.RUNNING)
    with pytest.raises(StaleState):
        store.record_pause(
            job_id, attempt + 1, at=1.0, reason="r", reason_code="online_memory", kind="suspend"
        )
    assert store.get(job_id).suspended_at is None
