"""One active scheduler: the leader lock on SQLite (flock beside the database) and
PostgreSQL (advisory lock), the leadership epoch that fences a deposed leader's writes,
and schedulers that stand down when they lose the lead.  The loop's timing (the standby's
retries, a store outage waited out) is tested on a fake clock in
``tests/unit/test_scheduler_clock.py``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from ebbtide.errors import NotLeader
from ebbtide.messaging.messages import StartAttempt
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.leader import LeaderLock, lock_path, scheduler_running
from ebbtide.scheduling.loop import Scheduler


def test_only_one_holder_and_a_standby_takes_over(db_url, tmp_path):  # type: ignore[no-untyped-def]
    a_store, b_store = Store(db_url), Store(db_url)
    a = LeaderLock(a_store.engine, tmp_path)
    b = LeaderLock(b_store.engine, tmp_path)
    try:
        assert a.try_acquire() is True
        assert a.try_acquire() is True  # re-entrant for its holder
        assert b.try_acquire() is False
        a.release()
        assert a.held is False
        assert b.try_acquire() is True
        assert a.try_acquire() is False
    finally:
        a.release()
        b.release()
        a_store.close()
        b_store.close()


def test_every_leader_begins_a_new_epoch_and_a_deposed_ones_writes_fail(db_url, tmp_path):  # type: ignore[no-untyped-def]
    store = Store(db_url)
    [job_id] = store.submit(JobSpec(command=["true"]), "alice", defaults_deadline_s=30)
    a, b = LeaderLock(store.engine, tmp_path, "a"), LeaderLock(store.engine, tmp_path, "b")
    try:
        assert a.try_acquire()
        first = a.epoch
        assert first is not None and a.still_held()
        as_a = store.fenced(first)
        as_a.set_reasons({job_id: "a is leading"})  # writes while it leads
        a.release()
        assert b.try_acquire() and b.epoch == first + 1
        with pytest.raises(NotLeader, match=f"epoch {first + 1} has begun"):
            as_a.dispatch(
                job_id, expected_attempts=0, node="n", devices=(0,), compute_pct=1, memory_mib=1
            )
        assert store.get(job_id).state == "queued"  # nothing was written
        assert store.fenced(first + 1).set_reasons({job_id: "b leads"}) == 1
    finally:
        a.release()
        b.release()
        store.close()


def test_the_sqlite_lock_lives_with_the_database_whatever_the_home(tmp_path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a_store, b_store = Store(url), Store(url)
    a = LeaderLock(a_store.engine, tmp_path / "home-a")
    b = LeaderLock(b_store.engine, tmp_path / "home-b")
    try:
        assert lock_path(a_store.engine, tmp_path) == tmp_path / "shared.db.scheduler.lock"
        assert a.try_acquire() is True
        assert b.try_acquire() is False
        # only the schedulers' user may open it (flock needs no more than that)
        assert (tmp_path / "shared.db.scheduler.lock").stat().st_mode & 0o777 == 0o600
    finally:
        a.release()
        b.release()
        a_store.close()
        b_store.close()


@pytest.mark.postgres
def test_a_leader_whose_lock_connection_drops_no_longer_leads(postgres_url, tmp_path):  # type: ignore[no-untyped-def]
    store = Store(postgres_url)
    a, b = LeaderLock(store.engine, tmp_path, "a"), LeaderLock(store.engine, tmp_path, "b")
    try:
        assert a.try_acquire()
        pid = a._conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        a._conn.commit()
        _terminate(store, pid)
        assert a.still_held() is False
        assert b.try_acquire() is True  # the database let the lock go with the session
    finally:
        a.release()
        b.release()
        store.close()


def _terminate(store: Store, pid: int) -> None:
    with store.engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        conn.commit()


def _wait(predicate: Any, timeout: float = 20.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not met in time"
        time.sleep(0.05)


class Recorder:
    """The ``send`` of one scheduler: counts its dispatches."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, node: str, cmd: Any) -> None:
        if isinstance(cmd, StartAttempt):
            with self.lock:
                self.starts.append(cmd.job_id)


def _heartbeat(store: Store) -> None:
    store.heartbeat(
        "n1",
        started_at=time.time(),
        devices=[
            {
                "index": 0,
                "memory_mib": 81920,
                "online_compute_pct": 0,
                "online_memory_mib": 0,
                "sampled_at": time.time(),
            }
        ],
    )


@pytest.mark.postgres
def test_a_deposed_scheduler_stands_down_and_nothing_is_dispatched_twice(postgres_url, tmp_path):  # type: ignore[no-untyped-def]
    store = Store(postgres_url)
    sends = {"a": Recorder(), "b": Recorder()}
    locks = {name: LeaderLock(store.engine, tmp_path, name) for name in ("a", "b")}
    schedulers = {
        name: Scheduler(Store(postgres_url), send=sends[name], leader=locks[name], wakeups=False)
        for name in ("a", "b")
    }
    try:
        _heartbeat(store)
        schedulers["a"].start()
        _wait(lambda: locks["a"].epoch is not None)
        first_epoch = locks["a"].epoch
        schedulers["b"].start()
        spec = JobSpec(command=["true"], gpu="1%", gpumem="1MiB")
        first = store.submit(spec, "alice", defaults_deadline_s=30)
        _wait(lambda: len(sends["a"].starts) == 1)
        # a's lock connection drops: a stands down at its next pass, and whoever leads
        # next (b, or a again) does so in a new epoch
        pid = locks["a"]._conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        locks["a"]._conn.commit()
        _terminate(store, pid)
        _wait(lambda: any((lk.epoch or 0) > (first_epoch or 0) for lk in locks.values()))
        _wait(lambda: sum(lk.held for lk in locks.values()) == 1)
        _heartbeat(store)
        second = [*store.submit(spec, "alice", defaults_deadline_s=30)]
        second += store.submit(spec, "alice", defaults_deadline_s=30)
        _wait(lambda: len(sends["a"].starts) + len(sends["b"].starts) == 3)
        time.sleep(1.5)  # a few more passes
        assert sorted(sends["a"].starts + sends["b"].starts) == sorted(first + second)
        assert {j: store.get(j).attempts for j in first + second} == dict.fromkeys(
            first + second, 1
        )
    finally:
        for s in schedulers.values():
            s.stop()
            s._store.close()
        store.close()


def test_a_client_can_tell_whether_a_scheduler_leads_without_taking_the_lock(db_url, tmp_path):  # type: ignore[no-untyped-def]
    """``qstat`` says so when no scheduler runs (a queued job's reason stays empty): it
    reads the lock and leaves nothing behind."""
    store = Store(db_url)
    a = LeaderLock(store.engine, tmp_path)
    try:
        assert scheduler_running(store.engine, tmp_path) is False
        assert a.try_acquire()
        assert scheduler_running(store.engine, tmp_path) is True
        a.release()
        assert scheduler_running(store.engine, tmp_path) is False
        assert a.try_acquire()  # the look left nothing behind
    finally:
        a.release()
        store.close()


def test_a_scheduler_is_not_kept_out_by_a_clients_look_at_the_sqlite_lock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A client's look (a shared ``flock`` held for a moment) while a scheduler tries
    for the lock: it tries again a moment later instead of standing by for another
    scheduler that is not there."""
    import fcntl
    import os

    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    path = lock_path(store.engine, tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a client looking
    timer = threading.Timer(0.02, lambda: fcntl.flock(fd, fcntl.LOCK_UN))
    timer.start()
    lock = LeaderLock(store.engine, tmp_path)
    try:
        assert lock.try_acquire() is True
    finally:
        timer.join()
        os.close(fd)
        lock.release()
        store.close()
