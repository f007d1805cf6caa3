"""The node agent's loop on a fake clock: it waits through its clock, so a test runs it in
its own thread tick by tick on fake time and says exactly when each tick came and what
it did, with no sleep and no tolerance.  The tick period, the faster one while a slice
is taken back, the heartbeat period, the store thread's write and reconcile periods, and
the fence of a node cut off from the store.

SQLite in ``tmp_path`` on the same fake clock; one static 80 GiB device; the executor is
a stand-in that runs nothing and records what it is told (at what fake time).  The store
thread's work is done in the test's thread too: a round of it (:meth:`StoreSync.pump`)
after every tick, as if it always kept up.

The agent's periods (0.05 s and 5 ms) are not binary fractions, so the fake times they
add up to are not round numbers: the first test keeps them and checks the ticks against
the same sums; the others set periods that are binary fractions (1/16 s and 1/128 s,
read by the loop on every pass), so that "exactly every half second" is exact."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from ebbtide.clock import FakeClock
from ebbtide.messaging.messages import EvictAttempt
from ebbtide.metrics import Metrics
from ebbtide.preemption.enforcer import KILL_LEAD_S
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.workers import agent as agent_module
from ebbtide.workers.agent import HEARTBEAT_PERIOD_S, NodeAgent
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.executor import Exit, Handle, Leftover
from ebbtide.workers.headroom.base import DeviceInfo
from ebbtide.workers.headroom.static import StaticSource
from ebbtide.workers.heartbeat import write_period_s
from ebbtide.workers.launch import Launch
from ebbtide.workers.ownership import Tree
from ebbtide.workers.sync import RECONCILE_PERIOD_S
from ebbtide.workers.undrains import UNDRAIN_PERIOD_S

T0 = 1_700_000_000.0
#: binary fractions for the agent's periods (see the module's docstring)
SAMPLE_S = 1 / 16
EVICTING_S = 1 / 128
HEARTBEAT_TIMEOUT_S = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=clock)
    yield s
    s.close()


@pytest.fixture
def exact_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "SAMPLE_PERIOD_S", SAMPLE_S)
    monkeypatch.setattr(agent_module, "EVICTING_PERIOD_S", EVICTING_S)


class Executor:
    """Runs nothing: an attempt "runs" from its start until it is swept, ignoring
    signals, and every call is recorded as (seconds after T0, what, job id)."""

    inherit_env = False
    can_pause = False

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[tuple[float, str, int]] = []
        self._jobs: dict[int, int] = {}  # pid → job id
        self._ended: dict[int, Exit] = {}
        self._pids = itertools.count(1000)

    def _note(self, what: str, handle: Handle) -> None:
        self.calls.append((self.clock.time() - T0, what, self._jobs[handle.pid]))

    def start(self, launch: Launch) -> Handle:
        pid = next(self._pids)
        self._jobs[pid] = launch.job_id
        handle = Handle(pid=pid, pgid=pid)
        self._note("start", handle)
        return handle

    def tree(self, job_id: int, handle: Handle) -> Tree:
        return Tree(job_id, 0, 0.0)

    def describe(self, handle: Handle) -> str:
        return f"stand-in {handle.pid}"

    def poll(self, handle: Handle) -> Exit | None:
        return self._ended.get(handle.pid)

    def signal(self, handle: Handle, signum: int) -> None:
        self._note(f"signal {signum}", handle)

    def renew(self, handle: Handle) -> None:
        pass  # on real time (the shims' leases): not what these tests time

    def pause(self, handle: Handle) -> None:
        self._note("pause", handle)

    def thaw(self, handle: Handle) -> None:
        self._note("thaw", handle)

    def kill_at(self, handle: Handle, monotonic_s: float) -> None:
        self._note("kill_at", handle)

    def sweep(self, handle: Handle) -> None:
        self._note("sweep", handle)
        self._ended.setdefault(handle.pid, Exit(128 + signal.SIGKILL, cause="killed"))

    def reap_leftovers(self) -> list[Leftover]:
        return []

    def of(self, what: str) -> list[tuple[float, int]]:
        """(seconds after T0, job id) of each call named ``what``."""
        return [(t, job) for t, w, job in self.calls if w == what]


class Node:
    """Node agent ``n1`` on the fake clock, with its ticks (seconds after T0) and the
    reports it journaled (seconds after T0, report) as they come."""

    def __init__(self, store: Store, clock: FakeClock, home: Path) -> None:
        self.clock = clock
        self.executor = Executor(clock)
        self.agent = NodeAgent(
            "n1",
            store,
            StaticSource(parse_devices("1x80GiB")),
            home=home,
            clock=clock,
            executor=self.executor,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
            metrics=Metrics(CollectorRegistry()),
        )
        self.ticks: list[float] = []
        self.reports: list[tuple[float, str]] = []
        tick, append = self.agent.tick, self.agent.journal.append

        def timed_tick() -> None:
            self.ticks.append(self.since_t0())
            tick()
            self.agent.sync.pump()  # the store thread keeps up

        def timed_append(op: str, **kwargs: Any) -> int:
            self.reports.append((self.since_t0(), op))
            return append(op, **kwargs)

        self.agent.tick = timed_tick  # type: ignore[method-assign]
        self.agent.journal.append = timed_append  # type: ignore[method-assign]

    def since_t0(self) -> float:
        return self.clock.time() - T0

    def run_until(self, at: float) -> None:
        """Run the loop in this thread until ``at`` seconds after T0 (fake time)."""
        self.clock.call_at(T0 + at, self.agent.kill)
        self.agent.run()

    def journaled(self, op: str) -> list[float]:
        return [t for t, o in self.reports if o == op]


@pytest.fixture
def node(store: Store, clock: FakeClock, tmp_path: Path) -> Iterator[Node]:
    n = Node(store, clock, tmp_path)
    yield n
    n.agent.kill()


def dispatch(store: Store) -> int:
    """A job dispatched to n1/0 (the store thread's first reconcile starts it)."""
    [job_id] = store.submit(
        JobSpec(command=["train"], gpu="20%", gpumem="4GiB"), "alice", defaults_deadline_s=30
    )
    store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=4096
    )
    return job_id


def at(clock: FakeClock, seconds: float, action: Callable[[], object]) -> None:
    clock.call_at(T0 + seconds, action)


def every(period_s: float, start: float, until: float) -> list[float]:
    """``start``, ``start + period_s``, ... (as the clock adds them) up to ``until``, as
    seconds after T0."""
    out, t = [], T0 + start
    while t - T0 <= until:
        out.append(t - T0)
        t += period_s
    return out


# -- ticks ------------------------------------------------------------------------------


def test_the_loop_ticks_every_sample_period_of_fake_time(node: Node) -> None:
    node.run_until(1.0)
    assert agent_module.SAMPLE_PERIOD_S == 0.05
    assert node.ticks == every(agent_module.SAMPLE_PERIOD_S, 0.0, 1.0)
    # one every 0.05 s, as the clock adds them: 20 of them fall a hair short of 1.0 s
    assert len(node.ticks) == 21 and node.ticks[-1] < 1.0


@pytest.mark.usefixtures("exact_periods")
def test_a_slice_being_taken_back_is_looked_at_every_evicting_period(
    node: Node, store: Store, clock: FakeClock
) -> None:
    job_id = dispatch(store)
    warned_at = 1 + 1 / 32  # between two ticks: the command wakes the loop at once
    deadline_s = 1.0
    at(
        clock,
        warned_at,
        lambda: node.agent.command(
            EvictAttempt(job_id=job_id, attempt=1, reason="scheduler", deadline_s=deadline_s)
        ),
    )
    node.run_until(3.0)
    # killed at the first look on or after the deadline less KILL_LEAD_S
    looks = every(EVICTING_S, warned_at, warned_at + deadline_s - KILL_LEAD_S + EVICTING_S)
    killed_at = looks[-1]
    assert killed_at >= warned_at + deadline_s - KILL_LEAD_S > looks[-2]
    assert node.ticks == [
        0.0,  # the store thread's first reconcile posts the start: the loop wakes at once
        *every(SAMPLE_S, 0.0, warned_at),
        *looks,
        *every(SAMPLE_S, killed_at + SAMPLE_S, 3.0),
    ]
    assert node.executor.of("start") == [(0.0, job_id)]
    assert node.executor.of("signal 15") == [(warned_at, job_id)]
    assert set(node.executor.of("sweep")) == {(killed_at, job_id)}  # (and as it is reaped)
    assert node.journaled("finish_attempt") == [killed_at]
    assert node.agent.attempts == {}


@pytest.mark.usefixtures("exact_periods")
def test_a_running_attempt_is_looked_at_one_tick_in_five_and_its_end_noticed_there(
    node: Node, store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = dispatch(store)
    looks: list[float] = []
    poll = node.executor.poll

    def looked(handle: Handle) -> Exit | None:
        looks.append(node.since_t0())
        return poll(handle)

    monkeypatch.setattr(node.executor, "poll", looked)
    ended_at = 2 + 1 / 32  # between two ticks
    at(clock, ended_at, lambda: node.executor._ended.setdefault(1000, Exit(0, cause="job")))
    node.run_until(4.0)
    assert agent_module.WATCH_EVERY_TICKS == 5
    running = [t for t in looks if t < ended_at]
    gaps = {round(b - a, 9) for a, b in itertools.pairwise(running)}
    assert gaps == {5 * SAMPLE_S}  # not at every tick
    # its end is noticed at the next look, at most five ticks on
    [finished_at] = node.journaled("finish_attempt")
    assert finished_at == running[-1] + 5 * SAMPLE_S
    assert ended_at < finished_at <= ended_at + 5 * SAMPLE_S
    assert node.executor.of("sweep") == [(finished_at, job_id)]
    assert node.agent.attempts == {}


# -- heartbeats and the store thread ----------------------------------------------------


@pytest.mark.usefixtures("exact_periods")
def test_heartbeats_are_journaled_every_heartbeat_period(node: Node) -> None:
    node.run_until(3.1)
    assert HEARTBEAT_PERIOD_S == 0.5
    assert node.journaled("heartbeat") == every(HEARTBEAT_PERIOD_S, 0.0, 3.0)


def test_the_heartbeat_says_whose_jobs_the_node_runs(node: Node, store: Store) -> None:
    """The library's agent runs every job as its own user: anyone's (``ebb up`` as root
    and owner-mode agents say less; ``test_runas`` checks each against ``resolve``)."""
    node.run_until(1.1)
    assert [n.runs_jobs_of for n in store.nodes()] == ["any"]
    # as root, running local processes as itself, and told to run no one else's
    node.agent.others_as_agent = False
    node.executor.runs_as_owner = True  # type: ignore[attr-defined]
    node.agent._post_heartbeat()
    expected = "user:root" if os.geteuid() == 0 else "any"
    assert node.agent._get_heartbeat()["runs_jobs_of"] == expected


def test_the_heartbeat_says_which_devices_are_mig_instances(node: Node) -> None:
    """Clients size a whole GPU by the cards, not by MIG instances (``client_checks``)."""
    node.agent._post_heartbeat()
    assert [d["mig_parent"] for d in node.agent._get_heartbeat()["devices"]] == [None]
    node.agent.devices = [DeviceInfo(index=0, memory_mib=10240, mig_parent=3)]
    node.agent._post_heartbeat()
    assert [d["mig_parent"] for d in node.agent._get_heartbeat()["devices"]] == [3]


@pytest.mark.usefixtures("exact_periods")
def test_the_store_thread_writes_once_a_write_period_and_reconciles_every_period(
    node: Node, store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[float] = []
    reconciles: list[float] = []
    undrain_reads: list[float] = []
    heartbeat, active_attempts = store.heartbeat, store.active_attempts
    undrains = store.drains.undrains

    def read_undrains(*args: Any, **kwargs: Any) -> Any:
        undrain_reads.append(node.since_t0())
        return undrains(*args, **kwargs)

    def written(*args: Any, **kwargs: Any) -> None:
        writes.append(node.since_t0())
        heartbeat(*args, **kwargs)

    def reconciled(*args: Any, **kwargs: Any) -> Any:
        reconciles.append(node.since_t0())
        return active_attempts(*args, **kwargs)

    monkeypatch.setattr(store, "heartbeat", written)
    monkeypatch.setattr(store, "active_attempts", reconciled)
    monkeypatch.setattr(store.drains, "undrains", read_undrains)
    node.run_until(9.1)
    period_s = node.agent.sync.heartbeats.rules.period_s
    assert period_s == write_period_s(HEARTBEAT_TIMEOUT_S)
    assert period_s % HEARTBEAT_PERIOD_S == 0  # a heartbeat is journaled when one is due
    # nothing the scheduler acts on changes: the first heartbeat, then one a period
    assert writes == every(period_s, 0.0, 9.0)
    assert node.agent.sync.last_heartbeat_ok == T0 + writes[-1]
    assert RECONCILE_PERIOD_S == 0.5
    assert reconciles == every(RECONCILE_PERIOD_S, 0.0, 9.0)
    # an admin's undrain is read with every fourth reconcile, not with each
    assert UNDRAIN_PERIOD_S == 2.0
    assert undrain_reads == every(UNDRAIN_PERIOD_S, 0.0, 9.0)


# -- the fence --------------------------------------------------------------------------


@pytest.mark.usefixtures("exact_periods")
def test_an_agent_cut_off_from_the_store_fences_at_half_the_heartbeat_timeout(
    node: Node, store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = dispatch(store)
    silent_at: list[float] = []

    def down(*args: Any, **kwargs: Any) -> Any:
        raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))

    def cut_off() -> None:  # between two reconciles: the last answer came at 1.5 s
        monkeypatch.setattr(store, "heartbeat", down)
        monkeypatch.setattr(store, "active_attempts", down)

    at(clock, 1.75, cut_off)
    at(clock, 6.5 - SAMPLE_S, lambda: silent_at.append(node.agent.sync.silence_s()))
    node.run_until(8.0)
    assert node.executor.of("start") == [(0.0, job_id)]
    assert silent_at == [5.0 - SAMPLE_S]  # a tick before: not yet
    assert node.executor.of("sweep") == [(1.5 + HEARTBEAT_TIMEOUT_S / 2, job_id)]
    assert node.agent.attempts == {}
    assert store.get(job_id).state == "running"  # the store never heard: it gives it up


@pytest.mark.usefixtures("exact_periods")
def test_a_fence_says_whether_the_job_may_be_elsewhere_already(
    node: Node, store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """At half the heartbeat timeout the job is not yet given away; an agent thawed past
    the whole timeout (a trial's trap: stopped, then resumed) says it may be already."""
    job_id = dispatch(store)
    silence = {"s": 0.0}
    at(clock, 1.0, lambda: setattr(node.agent.sync, "silence_s", lambda: silence["s"]))
    at(clock, 2.0, lambda: silence.update(s=HEARTBEAT_TIMEOUT_S + 20))
    node.run_until(2.5)
    assert node.agent.attempts == {}
    (line,) = [r.getMessage() for r in caplog.records if "cut off from the store" in r.message]
    assert line == (
        f"job {job_id} attempt 1: cut off from the store for {HEARTBEAT_TIMEOUT_S + 20:.1f}s; "
        f"past the heartbeat timeout ({HEARTBEAT_TIMEOUT_S:g}s): the scheduler may have "
        "given it to another node already; killing this copy"
    )
