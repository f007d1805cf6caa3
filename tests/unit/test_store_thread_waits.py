"""The node agent's store thread waits for work, not polling: it wakes for a report, a
start or a stop (other threads wake it), and when a reconcile is due; each wake-up costs
the node CPU beside its online service."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ebbtide.messaging.messages import StartAttempt
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.workers.heartbeat import HeartbeatRules
from ebbtide.workers.journal import Journal
from ebbtide.workers.sync import (
    RECONCILE_EARLY_S,
    RECONCILE_LATE_S,
    RECONCILE_PERIOD_S,
    Prepared,
    StoreSync,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    yield s
    s.close()


class Thread:
    """A running store thread for node n1, counting its steps and what it posted."""

    def quiet(self) -> None:
        """No reconcile for an hour, and the thread just begun a wait (after a report)."""
        self.sync._next_reconcile = time.monotonic() + 3600
        self.journal.append("heartbeat")
        assert self.journal.wait_empty(5.0)
        time.sleep(0.05)

    def __init__(self, store: Store) -> None:
        self.journal = Journal(None)
        self.posted: list[tuple[float, Any]] = []
        self.steps = 0
        self.sync = StoreSync(
            "n1",
            store,
            self.journal,
            post=lambda item: self.posted.append((time.monotonic(), item)),
            view=lambda: (self.journal.seq, {}),
            heartbeat=lambda: {"started_at": 0.0, "devices": [], "stopping": False},
            heartbeat_rules=HeartbeatRules.for_timeout(10.0),
        )
        step = self.sync._step

        def counted() -> None:
            self.steps += 1
            step()

        self.sync._step = counted  # type: ignore[method-assign]

    def reconciles(self) -> list[float]:
        """When each reconcile from now on begins (a list filled as they come)."""
        times: list[float] = []
        reconcile = self.sync._reconcile

        def timed() -> None:
            times.append(time.monotonic())
            reconcile()

        self.sync._reconcile = timed  # type: ignore[method-assign]
        return times


@pytest.fixture
def thread(store: Store) -> Iterator[Thread]:
    t = Thread(store)
    t.sync.start()
    yield t
    t.sync.kill()


def test_an_idle_store_thread_wakes_for_its_reconciles_only(thread: Thread) -> None:
    time.sleep(0.3)
    steps = thread.steps
    time.sleep(2.0)
    # 2 s: about four reconciles (at most one step each, and one for a timer's early
    # return); a 50 ms poll made forty
    assert RECONCILE_PERIOD_S == 0.5
    assert thread.steps - steps <= 8


def test_a_start_is_prepared_at_once_between_reconciles(store: Store, thread: Thread) -> None:
    [job_id] = store.submit(
        JobSpec(command=["train"], gpu="20%", gpumem="4GiB"), "alice", defaults_deadline_s=30
    )
    time.sleep(0.3)  # the first reconcile is past (nothing was dispatched then)
    thread.quiet()  # no reconcile finds it for us
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=4096
    )
    asked = time.monotonic()
    thread.sync.request_start(StartAttempt(job_id=job_id, attempt=attempt))
    give_up = asked + 5.0
    while not thread.posted and time.monotonic() < give_up:
        time.sleep(0.005)
    [(at, item)] = thread.posted[:1]
    assert isinstance(item, Prepared) and item.job.id == job_id
    assert at - asked < 0.3  # not at the end of the wait (0.5 s)


def test_a_report_is_delivered_at_once(thread: Thread) -> None:
    thread.quiet()
    asked = time.monotonic()
    thread.journal.append("heartbeat")
    assert thread.journal.wait_empty(5.0)
    assert time.monotonic() - asked < 0.3


def test_a_stop_ends_the_wait(thread: Thread) -> None:
    thread.quiet()
    asked = time.monotonic()
    thread.sync.finish(timeout_s=5.0)  # nothing journaled: it leaves at once
    assert time.monotonic() - asked < 0.3


def test_progress_waits_for_the_next_pressing_report(store: Store, thread: Thread) -> None:
    # a checkpoint or a progress line need not reach the store at once: the thread does
    # not wake for one, and delivers it, in order, with the next report that must go
    # now (or at the next reconcile)
    [job_id] = store.submit(
        JobSpec(command=["train"], gpu="20%", gpumem="4GiB"), "alice", defaults_deadline_s=30
    )
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=4096
    )
    thread.quiet()
    steps = thread.steps
    thread.journal.append("record_progress", job_id=job_id, attempt=attempt, done=5.0, total=10.0)
    thread.journal.append(
        "record_checkpoint", job_id=job_id, attempt=attempt, path="/ck/5", at=time.time()
    )
    time.sleep(0.3)
    assert thread.journal.pending() == 2 and thread.steps == steps
    assert store.get(job_id).checkpoint_path is None
    thread.journal.append("heartbeat")
    assert thread.journal.wait_empty(5.0)
    job = store.get(job_id)
    assert job.checkpoint_path == "/ck/5" and job.progress_done == 5.0


def test_lingering_reports_go_at_the_next_reconcile(store: Store, thread: Thread) -> None:
    thread.quiet()
    thread.sync._next_reconcile = time.monotonic() + 0.2
    asked = time.monotonic()
    thread.journal.append("record_progress", job_id=999, attempt=1, done=1.0, total=None)
    assert thread.journal.wait_empty(5.0)  # (no such job: dropped, as a stale report is)
    assert time.monotonic() - asked >= 0.15


def test_reconciles_fall_in_with_the_heartbeats(thread: Thread) -> None:
    # the agent posts a heartbeat every 0.5 s and the thread reconciles every 0.5 s: a
    # reconcile due within RECONCILE_EARLY_S is done when a heartbeat wakes the thread,
    # so that it wakes once for both, not twice (a wake-up costs more than the work)
    reconciles = thread.reconciles()
    assert RECONCILE_EARLY_S == RECONCILE_PERIOD_S / 2
    thread.quiet()
    thread.sync._next_reconcile = time.monotonic() + 0.2  # out of step with the heartbeats
    steps, began = thread.steps, time.monotonic()
    heartbeats = 6
    for n in range(heartbeats):
        # every other one a little after the reconcile is due (a loop's tick runs late)
        late_s = 0.03 if n % 2 else 0.0
        time.sleep(max(0.0, began + n * RECONCILE_PERIOD_S + late_s - time.monotonic()))
        thread.journal.append("heartbeat")
    time.sleep(0.1)
    # one wake-up a heartbeat (and a timer racing one now and then), each with its
    # reconcile: none skipped, none on a wake-up of its own (waking for a reconcile due
    # just before a heartbeat came made nine or more)
    assert thread.steps - steps <= heartbeats + 1
    assert heartbeats - 1 <= len(reconciles) <= heartbeats + 1


def test_without_reports_the_reconciles_still_come(thread: Thread) -> None:
    reconciles = thread.reconciles()
    time.sleep(2.0)
    # one every RECONCILE_PERIOD_S, RECONCILE_LATE_S late: 0.6 s apart (a busy machine
    # may wake the thread later still)
    gaps = [b - a for a, b in itertools.pairwise(reconciles)]
    assert len(reconciles) >= 3
    assert all(
        RECONCILE_PERIOD_S <= g <= RECONCILE_PERIOD_S + RECONCILE_LATE_S + 0.25 for g in gaps
    )
