"""The scheduler's copy of the queue (:class:`~ebbtide.scheduling.mirror.Mirror`) against
a full read, after every step of seeded random histories, on SQLite, PostgreSQL and in
memory; and the event that PostgreSQL commits after a later one was read.
"""

from __future__ import annotations

import contextlib
import random
import threading
from typing import Any

import pytest

from ebbtide.clock import FakeClock
from ebbtide.errors import SpecError, StaleState, UserError
from ebbtide.queue.memory import MemoryStore
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import ACTIVE_STATES, EventType, JobState
from ebbtide.queue.store import Store
from ebbtide.queue.store.changes import GAP_EXPIRY_S, EventCursor, advance
from ebbtide.scheduling.mirror import (
    FALLBACK_RECHECK_S,
    REBUILD_PERIOD_S,
    Groups,
    Mirror,
    OrderedJobs,
)
from ebbtide.scheduling.snapshot import QueuedJob, plan_group

S = JobState
DEADLINE_S = 30.0
NODES = ("n1", "n2")
#: Steps of each random history, and the histories (seeds) per backend.
STEPS = 120
SEEDS = (1, 2, 3)


def submit(store: Store, rng: random.Random) -> None:
    spec = JobSpec(
        command=["train"],
        priority=rng.choice((0, 0, 0, 5, -3, 10)),
        compute_pct=rng.choice((10.0, 25.0, 50.0)),
        memory_mib=rng.choice((1024, 4096)),
        hold=rng.random() < 0.1,
        max_attempts=3,
        array={"start": 0, "end": 2} if rng.random() < 0.1 else None,
    )
    store.submit(spec, rng.choice(("alice", "bob")), defaults_deadline_s=DEADLINE_S)


def pick(store: Store, rng: random.Random, *states: JobState) -> Any:
    jobs = store.list_jobs(states=states)
    return rng.choice(jobs) if jobs else None


def step(store: Store, clock: FakeClock, rng: random.Random) -> None:
    """One random change: a submission, a dispatch, a start, an eviction and its end, a
    loss, a hold or release, a qalter of the priority or the dependencies (and waiting
    jobs promoted), a cancellation, a checkpoint, a pause or thaw, a purge, or a finish."""
    clock.advance(rng.choice((0.1, 1.0, 5.0)))
    action = rng.choice(
        (
            "submit",
            "submit",
            "dispatch",
            "dispatch",
            "start",
            "evict",
            "end",
            "lost",
            "hold",
            "release",
            "alter",
            "depend",
            "promote",
            "cancel",
            "checkpoint",
            "pause",
            "purge",
        )
    )
    if action == "submit":
        submit(store, rng)
    elif action == "dispatch" and (job := pick(store, rng, S.QUEUED)):
        store.dispatch(
            job.id,
            expected_attempts=job.attempts,
            node=rng.choice(NODES),
            devices=(rng.randrange(2),),
            compute_pct=job.compute_pct,
            memory_mib=job.memory_mib,
        )
    elif action == "start" and (job := pick(store, rng, S.DISPATCHED)):
        store.mark_started(job.id, job.attempts, pid=1, stdout_path="o", stderr_path="e")
    elif action == "evict" and (job := pick(store, rng, S.RUNNING)):
        store.begin_eviction(
            job.id, job.attempts, reason="spike", deadline_s=5.0, spike_at=1.0, source="test"
        )
    elif action == "end" and (job := pick(store, rng, S.RUNNING, S.EVICTING)):
        eviction = {"reason": "spike"} if job.state == S.EVICTING.value else None
        store.finish_attempt(
            job.id, job.attempts, exit_code=rng.choice((0, 1, 143)), eviction=eviction
        )
    elif action == "lost" and (job := pick(store, rng, *ACTIVE_STATES)):
        store.requeue_lost(job.id, job.attempts, why="node n1 stopped heartbeating")
    elif action == "hold" and (job := pick(store, rng, S.QUEUED, S.WAITING)):
        store.hold(job.id, user=job.owner)
    elif action == "release" and (job := pick(store, rng, S.HELD)):
        store.release(job.id, user=job.owner)
    elif action == "alter" and (job := pick(store, rng, S.QUEUED, S.HELD)):
        spec = JobSpec.model_validate_json(job.spec_json)
        spec = spec.model_copy(update={"priority": rng.randrange(-5, 20)})
        store.alter(job.id, spec, user=job.owner, defaults_deadline_s=DEADLINE_S)
    elif action == "depend" and (job := pick(store, rng, S.QUEUED, S.WAITING)):
        # queued → waiting, waiting → queued (none left), through qalter -W depend=
        other = pick(store, rng, S.QUEUED, S.RUNNING, S.SUCCEEDED)
        depends = [] if other is None or rng.random() < 0.3 else [f"afterany:{other.id}"]
        spec = JobSpec.model_validate_json(job.spec_json).model_copy(update={"depends": []})
        spec = JobSpec(**{**spec.model_dump(exclude_unset=True), "depends": depends})
        with contextlib.suppress(SpecError):  # itself, or a ring
            store.alter(job.id, spec, user=job.owner, defaults_deadline_s=DEADLINE_S)
    elif action == "promote":
        store.promote_waiting()
    elif action == "cancel" and (job := pick(store, rng, S.QUEUED, S.HELD, S.RUNNING)):
        store.cancel(job.id, user=job.owner)
    elif action == "checkpoint" and (job := pick(store, rng, S.RUNNING)):
        store.record_checkpoint(job.id, job.attempts, path="/ckpt", at=clock.time())
    elif action == "pause" and (job := pick(store, rng, S.RUNNING)):
        if job.paused_at is None:
            store.record_pause(
                job.id, job.attempts, at=clock.time(), reason="spike", reason_code="spike"
            )
        else:
            store.record_thaw(job.id, job.attempts, at=clock.time(), paused_s=1.0)
    elif action == "purge":
        store.purge(30.0, pause_s=0.0)


def check(mirror: Mirror, store: Store, now: float) -> None:
    queued, active = mirror.sync(store, now)
    expected = store.queued_jobs()
    assert list(queued) == expected
    assert all(queued.find(j.id) == j for j in expected)  # as a pass's dispatches look up
    assert queued.find(0) is None
    assert active == store.active_attempts()


@pytest.mark.parametrize("seed", SEEDS)
def test_the_copy_equals_a_full_read_after_every_step(any_store: Store, seed: int) -> None:
    store, rng = any_store, random.Random(seed)
    clock = store.clock
    assert isinstance(clock, FakeClock)
    mirror = Mirror()
    for _ in range(STEPS):
        try:
            step(store, clock, rng)
        except (StaleState, UserError):
            pass
        check(mirror, store, clock.time())
    assert mirror.rebuilds >= 1
    assert mirror.updates > STEPS // 2  # most passes read changes only


def burn_an_event_id(store: Store | MemoryStore, job_id: int) -> None:
    """A write that appends an event, then fails: its id is taken and never seen."""
    with pytest.raises(RuntimeError), store._tx() as tx:
        store._event(tx, job_id, EventType.ALTERED)
        raise RuntimeError("rolled back")


def test_a_failed_write_leaves_a_gap_that_expires(any_store: Store) -> None:
    store = any_store
    clock = store.clock
    assert isinstance(clock, FakeClock)
    [first] = store.submit(JobSpec(command=["a"]), "alice", defaults_deadline_s=DEADLINE_S)
    mirror = Mirror()
    check(mirror, store, clock.time())
    burn_an_event_id(store, first)
    store.submit(JobSpec(command=["b"]), "alice", defaults_deadline_s=DEADLINE_S)
    check(mirror, store, clock.time())
    cursor = mirror._cursor
    # SQLite gives a rolled-back id again; a sequence (PostgreSQL's, memory's) does not
    sqlite = isinstance(store, Store) and store.url.startswith("sqlite")
    assert len(cursor.gaps) == (0 if sqlite else 1)
    clock.advance(REBUILD_PERIOD_S / 2)
    check(mirror, store, clock.time())
    assert mirror.rebuilds == 1
    clock.advance(GAP_EXPIRY_S)
    changes = store.changes_since(cursor)
    assert changes is not None and not changes.cursor.gaps and not changes.job_ids


def test_a_purge_of_the_latest_event_reads_everything_again(any_store: Store) -> None:
    """SQLite gives the id of a deleted last row again: the cursor's anchor tells."""
    store = any_store
    clock = store.clock
    assert isinstance(clock, FakeClock)
    [first] = store.submit(JobSpec(command=["a"]), "alice", defaults_deadline_s=DEADLINE_S)
    store.cancel(first, user="alice")
    mirror = Mirror()
    check(mirror, store, clock.time())
    clock.advance(100.0)
    store.purge(10.0, pause_s=0.0)
    store.submit(JobSpec(command=["b"]), "alice", defaults_deadline_s=DEADLINE_S)
    check(mirror, store, clock.time())
    assert mirror.rebuilds == 2


def test_a_rebuild_at_a_new_epoch_and_after_the_period(any_store: Store) -> None:
    store = any_store
    clock = store.clock
    assert isinstance(clock, FakeClock)
    mirror = Mirror()
    mirror.sync(store, clock.time(), epoch=1)
    mirror.sync(store, clock.time(), epoch=1)
    assert mirror.rebuilds == 1
    mirror.sync(store, clock.time(), epoch=2)
    assert mirror.rebuilds == 2
    clock.advance(REBUILD_PERIOD_S)
    mirror.sync(store, clock.time(), epoch=2)
    assert mirror.rebuilds == 3


def test_too_many_changes_read_everything_again(any_store: Store) -> None:
    store = any_store
    mirror = Mirror()
    mirror.sync(store, 0.0)
    cursor = mirror._cursor
    for _ in range(3):
        store.submit(JobSpec(command=["a"]), "alice", defaults_deadline_s=DEADLINE_S)
    assert store.changes_since(cursor, max_events=2) is None
    changes = store.changes_since(cursor, max_events=3)
    assert changes is not None and len(changes.queued) == 3


def test_a_store_that_cannot_say_what_changed_is_read_again_soon_after() -> None:
    """A transaction of many events (an array of 100,000 tasks) in flight past the new
    cursor's start margin makes the store give up (None) and the copy read everything;
    what it commits below that margin is seen at a second full read shortly after, not
    at the 5-minute one."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)

    class GivesUpOnce:
        give_up = False

        def changes_since(self, cursor: Any) -> Any:
            if self.give_up:
                self.give_up = False
                return None
            return store.changes_since(cursor)

        def queued_jobs(self) -> list[QueuedJob]:
            return store.queued_jobs()

        def active_attempts(self) -> Any:
            return store.active_attempts()

    feed = GivesUpOnce()
    mirror = Mirror()
    mirror.sync(feed, clock.time())
    feed.give_up = True
    mirror.sync(feed, clock.time())
    assert mirror.rebuilds == 2
    mirror.sync(feed, clock.time() + FALLBACK_RECHECK_S / 2)
    assert (mirror.rebuilds, mirror.updates) == (2, 1)
    mirror.sync(feed, clock.time() + FALLBACK_RECHECK_S)
    assert mirror.rebuilds == 3
    mirror.sync(feed, clock.time() + FALLBACK_RECHECK_S * 2)  # then every 5 minutes again
    assert mirror.rebuilds == 3


def test_the_cursor_keeps_and_drops_gaps() -> None:
    cursor = EventCursor(10, {}, 1)
    after = advance(cursor, [(11, 5), (14, 6)], [], now=100.0)
    assert after == EventCursor(14, {12: 100.0, 13: 100.0}, 6)
    after = advance(after, [], [12], now=101.0)
    assert after == EventCursor(14, {13: 100.0}, 6)
    assert advance(after, [], [], now=100.0 + GAP_EXPIRY_S) == EventCursor(14, {}, 6)


def test_ordered_jobs_keep_scheduling_order() -> None:
    rng = random.Random(7)
    jobs = OrderedJobs()
    plain: dict[int, QueuedJob] = {}
    for _ in range(5000):
        job_id = rng.randrange(3000)
        if rng.random() < 0.4:
            jobs.discard(job_id)
            plain.pop(job_id, None)
        else:
            job = QueuedJob(job_id, rng.randrange(-3, 4), "q", "o", 10.0, 0, 1, None, None, 0)
            jobs.add(job)
            plain[job_id] = job
        if rng.random() < 0.01:
            assert jobs.as_list() == sorted(plain.values(), key=lambda j: (-j.priority, j.id))
    assert jobs.as_list() == sorted(plain.values(), key=lambda j: (-j.priority, j.id))
    assert len(jobs) == len(plain)


def test_groups_keep_scheduling_order_in_each_group_and_merged() -> None:
    rng = random.Random(8)
    groups = Groups()
    plain: dict[int, QueuedJob] = {}
    for _ in range(5000):
        job_id = rng.randrange(3000)
        if rng.random() < 0.4:
            groups.discard(job_id)
            plain.pop(job_id, None)
        else:
            c, m = rng.choice(((10.0, 1), (10.0, 2), (25.0, 1)))
            array, limit = rng.choice(((None, None), (7, 2), (7, 3), (8, 2)))
            job = QueuedJob(
                job_id,
                rng.randrange(-3, 4),
                "q",
                "o",
                c,
                0,
                m,
                array,
                limit,
                0,
                evictions=rng.choice((0, 0, 1, 2)),
            )
            groups.add(job)  # may move the job to another group
            plain[job_id] = job
        if rng.random() < 0.01 or len(plain) < 3:
            view = groups.view()
            assert list(view) == sorted(plain.values(), key=lambda j: (-j.priority, j.id))
            assert len(view) == len(plain)
            assert all(view.find(i) is plain.get(i) for i in range(3000))
            for group in view.groups:
                jobs = list(group)
                assert jobs and len({plan_group(j) for j in jobs}) == 1
                assert jobs == sorted(jobs, key=lambda j: (-j.priority, j.id))


@pytest.mark.postgres
def test_an_event_committed_after_a_later_one_is_seen(postgres_url: str) -> None:
    """Event ids are taken at insert: the hold below takes its id, then waits to commit
    while another write takes and commits the next id; the copy reads the later one
    first, then the earlier one once it is committed."""
    store = Store(postgres_url, clock=FakeClock())
    try:
        ids = [
            store.submit(JobSpec(command=["a"]), "alice", defaults_deadline_s=DEADLINE_S)[0]
            for _ in range(2)
        ]
        mirror = Mirror()
        check(mirror, store, 0.0)
        taken, go_on = threading.Event(), threading.Event()

        def slow_hold() -> None:
            with store._tx() as conn:
                store._transition(
                    conn, ids[0], S.QUEUED, S.HELD, event=EventType.HELD, data={"by": "a"}
                )
                taken.set()
                go_on.wait(10)

        writer = threading.Thread(target=slow_hold)
        writer.start()
        assert taken.wait(10)
        store.hold(ids[1], user="alice")  # a later id, committed first
        queued, _ = mirror.sync(store, 0.0)
        assert [q.id for q in queued] == [ids[0]]  # the first hold is not committed yet
        assert mirror._cursor.gaps  # its id is a gap
        go_on.set()
        writer.join(10)
        check(mirror, store, 0.0)
        assert list(mirror.sync(store, 0.0)[0]) == []
        assert mirror.rebuilds == 1
        assert not mirror._cursor.gaps
    finally:
        store.close()
