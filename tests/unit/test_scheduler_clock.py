"""The scheduler's loop on a fake clock: it waits through its clock, so a test runs it in
its own thread pass by pass on fake time and says exactly when each pass came and what
it sent, with no sleep and no tolerance.  The pass period, a wake-up by an event, the
planner's own instants (a backoff's end, a drain before a window's close), windows
that open and close, the admission-wait figure and the standby's retries.  SQLite in
``tmp_path``; the node is a stand-in that heartbeats every second of fake time and
records what it is sent."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from ebbtide.clock import FakeClock
from ebbtide.config.policy import parse_policy
from ebbtide.messaging.messages import EvictAttempt, StartAttempt
from ebbtide.metrics import Metrics
from ebbtide.probes import Probes
from ebbtide.queue.spec import REQUEUE_EXIT_CODE, JobSpec
from ebbtide.queue.states import EventType, JobState
from ebbtide.queue.store import LEADERSHIP, Store
from ebbtide.scheduling.admission import DRAIN_LEAD_S
from ebbtide.scheduling.leader import LeaderLock
from ebbtide.scheduling.loop import LEADER_RETRY_S, PLAN_PERIOD_S, Scheduler

T0 = 1_700_000_000.0
Command = StartAttempt | EvictAttempt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=clock)
    yield s
    s.close()


class Node:
    """Node ``n1`` as the scheduler sees it: one 80 GiB device whose online load the test
    sets, a heartbeat every second of fake time, and the commands it is sent (at what
    fake time).  It starts what it is told to start; a job it is told to evict checkpoints
    and ends at once."""

    def __init__(self, store: Store, clock: FakeClock, origin: float = T0) -> None:
        self.store = store
        self.clock = clock
        #: the times noted are seconds after this
        self.origin = origin
        self.online_compute_pct = 0.0
        self.sent: list[tuple[float, Command]] = []

    def beat(self) -> None:
        now = self.clock.time()
        device = {
            "index": 0,
            "memory_mib": 81920,
            "online_compute_pct": self.online_compute_pct,
            "online_memory_mib": 0.0,
            "sampled_at": now,
        }
        self.store.heartbeat("n1", started_at=self.origin - 3600, devices=[device])
        self.clock.call_at(now + 1.0, self.beat)

    def __call__(self, node: str, command: Command) -> None:
        """The scheduler's ``send``."""
        assert node == "n1"
        self.sent.append((self.clock.time() - self.origin, command))
        if isinstance(command, StartAttempt):
            self.store.mark_started(
                command.job_id, command.attempt, pid=1, stdout_path="o", stderr_path="e"
            )
        else:
            self.store.finish_attempt(command.job_id, command.attempt, exit_code=REQUEUE_EXIT_CODE)

    def starts(self) -> list[tuple[float, int]]:
        """(seconds after the origin, job id) of each start sent."""
        return [(t, c.job_id) for t, c in self.sent if isinstance(c, StartAttempt)]

    def evictions(self) -> list[tuple[float, EvictAttempt]]:
        return [(t, c) for t, c in self.sent if isinstance(c, EvictAttempt)]


@pytest.fixture
def node(store: Store, clock: FakeClock) -> Node:
    return Node(store, clock)


def scheduler(
    store: Store, clock: FakeClock, node: Node, policy: str | None = None, **kwargs: Any
) -> Scheduler:
    return Scheduler(
        store,
        policy=parse_policy(policy, "p.yaml") if policy is not None else None,
        clock=clock,
        send=node,
        wakeups=False,
        metrics=Metrics(CollectorRegistry()),
        **kwargs,
    )


def timed_passes(sched: Scheduler) -> list[float]:
    """The fake times (seconds after T0) of ``sched``'s passes, as they come."""
    times: list[float] = []
    pass_once = sched.run_once

    def timed() -> Any:
        times.append(sched.clock.time() - T0)
        return pass_once()

    sched.run_once = timed  # type: ignore[method-assign]
    return times


def run_until(sched: Scheduler, clock: FakeClock, at: float) -> None:
    """Run the loop in this thread until ``at`` seconds after T0 (fake time)."""
    clock.call_at(T0 + at, sched.stop)
    sched.run()


def submit(store: Store, *, deadline_s: float = 30.0, **spec: Any) -> int:
    [job_id] = store.submit(
        JobSpec(command=["train"], gpu="20%", gpumem="4GiB", **spec),
        "alice",
        defaults_deadline_s=deadline_s,
    )
    return job_id


def at(clock: FakeClock, seconds: float, action: Callable[[], object]) -> None:
    clock.call_at(T0 + seconds, action)


def wait_s(sched: Scheduler) -> tuple[float | None, float | None]:
    """The admission-wait histogram of queue ``default``: (count, sum in seconds)."""
    name, labels = "ebbtide_admission_wait_time_seconds", {"queue": "default"}
    registry = sched.metrics.registry
    return (
        registry.get_sample_value(f"{name}_count", labels),
        registry.get_sample_value(f"{name}_sum", labels),
    )


# -- the fake clock ---------------------------------------------------------------------


def test_a_fake_wait_moves_the_time_by_its_timeout_or_stops_at_what_sets_the_event() -> None:
    clock = FakeClock(T0)
    event = threading.Event()
    assert clock.wait(event, 2.5) is False
    assert clock.time() == T0 + 2.5
    clock.call_at(T0 + 3.0, lambda: None)
    clock.call_at(T0 + 4.0, event.set)
    clock.call_at(T0 + 4.5, lambda: pytest.fail("run past the event"))
    assert clock.wait(event, 10.0) is True
    assert clock.time() == T0 + 4.0
    assert clock.wait(event, 10.0) is True  # set already: at once, the time stays
    assert clock.time() == T0 + 4.0


def test_a_wait_in_another_thread_is_real_and_leaves_the_fake_time_alone() -> None:
    clock = FakeClock(T0)
    event = threading.Event()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(clock.wait(event, 60.0)))
    waiter.start()
    event.set()
    waiter.join()
    assert got == [True] and clock.time() == T0


# -- passes -----------------------------------------------------------------------------


def test_passes_come_every_period_and_an_event_brings_the_next_at_once(
    store: Store, clock: FakeClock, node: Node
) -> None:
    sched = scheduler(store, clock, node)
    passes = timed_passes(sched)
    node.beat()
    first = submit(store)
    woken: list[int] = []
    # submitted with a wake-up (an agent's event, a submission through the server) ...
    at(clock, 1.25, lambda: (woken.append(submit(store)), sched.wake()))
    # ... and without one: the next periodic pass takes it
    late: list[int] = []
    at(clock, 2.375, lambda: late.append(submit(store)))
    run_until(sched, clock, 3.1)
    assert PLAN_PERIOD_S == 0.5
    assert passes == [0.0, 0.5, 1.0, 1.25, 1.75, 2.25, 2.75]
    assert node.starts() == [(0.0, first), (1.25, woken[0]), (2.75, late[0])]
    assert [store.get(j).state for j in (first, *woken, *late)] == ["running"] * 3


def test_a_backoff_holds_the_job_until_its_end_and_the_pass_comes_at_that_instant(
    store: Store, clock: FakeClock, node: Node
) -> None:
    job_id = submit(store)
    for _ in range(2):  # evicted twice: backoff_base_s before it runs again
        n = store.dispatch(
            job_id,
            expected_attempts=store.get(job_id).attempts,
            node="n1",
            devices=(0,),
            compute_pct=20,
            memory_mib=4096,
        )
        store.mark_started(job_id, n, pid=1, stdout_path="o", stderr_path="e")
        store.finish_attempt(job_id, n, exit_code=REQUEUE_EXIT_CODE)
    assert store.get(job_id).requeued_at == T0
    clock.advance(0.25)  # passes at .25, .75, ...: the end of the backoff falls between two
    sched = scheduler(store, clock, node, "defaults: {backoff_base_s: 30s, backoff_max_s: 10m}")
    passes = timed_passes(sched)
    node.beat()
    reasons: list[str] = []
    at(clock, 29.9, lambda: reasons.append(store.get(job_id).reason or ""))
    run_until(sched, clock, 30.4)
    assert reasons[0].startswith("backoff: evicted 2 times; not before ")
    assert node.starts() == [(30.0, job_id)]
    assert passes[-3:] == [29.25, 29.75, 30.0]  # the planner's instant, not the next period
    # waited from its last requeue, on the fake clock
    assert wait_s(sched) == (1, 30.0)


def test_the_admission_wait_is_timed_on_the_schedulers_clock(
    store: Store, clock: FakeClock, node: Node
) -> None:
    first = submit(store)
    clock.advance(7.0)
    sched = scheduler(store, clock, node)
    node.beat()
    second: list[int] = []
    at(clock, 8.25, lambda: (second.append(submit(store)), sched.wake()))
    run_until(sched, clock, 9.1)
    assert node.starts() == [(7.0, first), (8.25, second[0])]
    assert wait_s(sched) == (2, 7.0)  # 7 s queued, then 0 s


# -- windows ----------------------------------------------------------------------------

LULL = """\
windows:
  - name: quiet
    kind: lull
    below: {compute_pct: 20, memory: 8GiB}
    for: 5s
    close_above: {compute_pct: 40, memory: 16GiB}
"""


def test_a_lull_window_opens_after_its_quiet_and_closes_on_a_rise_by_fake_time(
    store: Store, clock: FakeClock, node: Node
) -> None:
    sched = scheduler(store, clock, node, LULL)
    node.beat()  # quiet from T0 on: open at T0 + 5 s
    a = submit(store)
    b: list[int] = []
    reasons: dict[str, str] = {}

    def note(key: str, job_id: Callable[[], int]) -> Callable[[], None]:
        return lambda: reasons.__setitem__(key, store.get(job_id()).reason or "")

    at(clock, 4.9, note("quiet for 4.9 s", lambda: a))

    def rise() -> None:  # the next heartbeat (T0 + 8 s) says so
        node.online_compute_pct = 45.0
        b.append(submit(store))

    at(clock, 7.75, rise)
    at(clock, 8.1, note("risen", lambda: b[0]))
    at(clock, 10.5, lambda: setattr(node, "online_compute_pct", 0.0))  # quiet from T0 + 11 s
    run_until(sched, clock, 16.1)

    assert "lull 'quiet'" in reasons["quiet for 4.9 s"]
    [(evicted_at, ev)] = node.evictions()
    assert (evicted_at, ev.job_id, ev.reason) == (8.0, a, "window_closed")
    # quiet again from T0 + 11 s: open again at T0 + 16 s, for both
    assert node.starts() == [(5.0, a), (16.0, a), (16.0, b[0])]
    assert reasons["risen"].startswith("waiting: lull 'quiet' closed on n1/0: ")
    assert "online compute rose to 45% (it closes above 40%)" in reasons["risen"]


def test_a_cron_window_admits_at_its_opening_and_drains_by_its_close(
    tmp_path: Path,
) -> None:
    """On a fake clock that starts 2 s before 22:00 UTC, a window 22:00-22:01: the job
    starts at the opening; with a 10 s deadline it is warned at close − deadline −
    DRAIN_LEAD_S (the planner's instant, between two periodic passes) with a deadline
    that ends at the close; a job whose first checkpoint would not fit is not started."""
    opening = dt.datetime(2024, 1, 1, 22, 0, tzinfo=dt.UTC).timestamp()
    start = opening - 2.0
    clock = FakeClock(start)
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=clock)
    try:
        node = Node(store, clock, origin=opening)
        policy = (
            "windows:\n  - {name: nights, kind: cron, schedule: '0 22 * * *', "
            "duration: 60s, timezone: UTC}\n"
        )
        sched = scheduler(store, clock, node, policy)
        node.beat()
        job_id = submit(store, deadline_s=10.0)
        slow = submit(store, deadline_s=10.0, checkpoint_interval_s=60.0)
        reasons: list[str] = []
        for t, j in ((start + 1.0, job_id), (opening + 1.0, slow)):
            clock.call_at(t, lambda j=j: reasons.append(store.get(j).reason or ""))
        clock.call_at(opening + 61.0, sched.stop)
        sched.run()
        close = opening + 60.0
        assert reasons[0] == "waiting: window 'nights' opens 22:00 UTC"
        assert "first checkpoint" in reasons[1]
        assert node.starts() == [(0.0, job_id)]
        [(warned_at, warned)] = node.evictions()
        assert (warned.job_id, warned.reason) == (job_id, "window_closing")
        assert warned_at == 60.0 - 10.0 - DRAIN_LEAD_S  # between two periodic passes
        assert warned.spike_at == close - 10.0 - DRAIN_LEAD_S
        assert warned.spike_at + warned.deadline_s == close  # free by the close
        assert store.get(slow).state == "queued"
    finally:
        store.close()


# -- the lead ---------------------------------------------------------------------------


def test_a_standby_tries_every_leader_retry_and_leads_at_the_first_try_after_a_release(
    store: Store, clock: FakeClock, node: Node, tmp_path: Path
) -> None:
    active = LeaderLock(store.engine, tmp_path, "active")
    assert active.try_acquire()
    lock = LeaderLock(store.engine, tmp_path, "standby", clock=clock)
    tries: list[float] = []
    real = lock.try_acquire

    def counted() -> bool:
        tries.append(clock.time() - T0)
        return real()

    lock.try_acquire = counted  # type: ignore[method-assign]
    sched = scheduler(store, clock, node, leader=lock)
    passes = timed_passes(sched)
    node.beat()
    at(clock, 2.25, active.release)
    run_until(sched, clock, 3.6)
    assert LEADER_RETRY_S == 1.0
    assert tries == [0.0, 1.0, 2.0, 3.0]
    assert passes == [3.0, 3.5]
    assert _leadership(store) == ("standby", T0 + 3.0)


def _store_down_for(tries: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The leader lock's first ``tries`` tries fail as a store that is down does; the
    count of those left."""
    real = LeaderLock.try_acquire
    outage = {"left": tries}

    def flaky(self: LeaderLock) -> bool:
        if outage["left"] > 0:
            outage["left"] -= 1
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
        return real(self)

    monkeypatch.setattr(LeaderLock, "try_acquire", flaky)
    return outage


def test_a_standby_waits_out_a_store_outage_and_takes_the_lead(
    store: Store, clock: FakeClock, node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = LeaderLock(store.engine, tmp_path, "standby", clock=clock)
    outage = _store_down_for(3, monkeypatch)
    sched = scheduler(store, clock, node, leader=lock)
    passes = timed_passes(sched)
    node.beat()
    job_id = submit(store)
    run_until(sched, clock, 3.1)  # returns: the loop survived the outage
    assert outage["left"] == 0
    assert passes == [3.0]
    assert node.starts() == [(3.0, job_id)]
    assert _leadership(store) == ("standby", T0 + 3.0)


def test_the_probes_say_a_standby_lives_through_a_store_outage_but_is_not_ready(
    store: Store, clock: FakeClock, node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/healthz`` stays 200 while the store is down (a restart brings no store back),
    ``/readyz`` says why it is not ready, and both are 200 once it leads; a pass that
    fails is not ready either.  After the loop stops it no longer counts."""
    lock = LeaderLock(store.engine, tmp_path, "standby", clock=clock)
    _store_down_for(2, monkeypatch)
    sched = scheduler(store, clock, node, leader=lock)
    sched.metrics.probes = Probes(clock=clock.monotonic)
    seen: list[tuple[float, bool, bool, str]] = []

    def look() -> None:
        (live, _), (ready, why) = sched.metrics.probes.live(), sched.metrics.probes.ready()
        seen.append((clock.time() - T0, live, ready, why))

    real_pass = sched.run_once

    def failing_pass() -> Any:
        if clock.time() - T0 == 3.0:
            raise RuntimeError("the mirror is confused")
        return real_pass()

    sched.run_once = failing_pass  # type: ignore[method-assign]
    node.beat()
    for t in (0.5, 1.5, 2.25, 3.25, 3.75):
        at(clock, t, look)
    run_until(sched, clock, 4.0)
    assert [(t, live, ready) for t, live, ready, _ in seen] == [
        (0.5, True, False),
        (1.5, True, False),
        (2.25, True, True),  # it leads, and its first pass went well
        (3.25, True, False),
        (3.75, True, True),
    ]
    assert "scheduler: not ready, cannot reach the store: " in seen[0][3]
    assert "connection refused" in seen[0][3]
    assert seen[3][3] == "scheduler: not ready, its last pass failed: the mirror is confused"
    assert sched.metrics.probes.ready() == (True, "ok: no loop in this process")


def _leadership(store: Store) -> tuple[str, float]:
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(LEADERSHIP.c.holder, LEADERSHIP.c.acquired_at)).one()
    return row.holder, row.acquired_at


# -- reconciling from the pass's own read ------------------------------------------------


def test_a_pass_reconciles_from_its_copy_and_spares_an_attempt_started_since(
    store: Store, clock: FakeClock, node: Node
) -> None:
    """A pass reconciles from the attempts as it read them (the mirror's copy), once.  One
    read as dispatched past the dispatch timeout that has started since is not requeued:
    the store's requeue is fenced on the state the pass saw."""
    sched = scheduler(store, clock, node)
    node.beat()
    job_id = submit(store)
    sched.run_once()
    assert node.starts() == [(0.0, job_id)]  # started at once by the stand-in node
    [running] = store.active_attempts()
    stale = dataclasses.replace(running, state=JobState.DISPATCHED, dispatched_at=T0 - 3600)
    reads: list[float] = []

    def work(now: float, *_: Any) -> tuple[Any, list[Any]]:
        reads.append(now)
        return [], [stale]

    sched.work = work  # type: ignore[method-assign]
    sched.run_once()
    assert len(reads) == 1  # one read of the queue a pass
    assert store.get(job_id).state == JobState.RUNNING
    assert EventType.LOST not in [e["type"] for e in store.events(job_id)]


def test_a_grant_that_breaks_the_passs_one_write_does_not_keep_the_others_back(
    store: Store, clock: FakeClock, node: Node, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A pass writes its grants in one transaction.  If that write fails for one grant's
    own reason (not a lost race), the others are granted one by one, and the bad one is
    left for the next pass: one poisoned grant must not stop every dispatch."""
    jobs = [submit(store) for _ in range(3)]
    node.beat()
    real = store.dispatch_many

    def dispatch_many(grants: Any) -> Any:
        if len(grants) > 1 or grants[0].job_id == jobs[1]:
            raise RuntimeError("this row is poisoned")
        return real(grants)

    monkeypatch.setattr(store, "dispatch_many", dispatch_many)
    sched = scheduler(store, clock, node)
    sched.run_once()
    assert sorted(j for _, j in node.starts()) == [jobs[0], jobs[2]]
    assert store.get(jobs[1]).state == "queued"
    assert "granting 3 slices at once failed; granting each alone" in caplog.text
