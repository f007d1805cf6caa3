"""The live scheduler, on a real store (SQLite) and a fake clock, places a job only on a
node whose heartbeat says it runs its owner's jobs, and writes why one waits; its copy of
the queue tells owners apart once a node singles one out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ebbtide.clock import FakeClock
from ebbtide.config.policy import Policy
from ebbtide.messaging.messages import DeviceReport
from ebbtide.queue.interface import JobStore
from ebbtide.queue.memory import MemoryStore
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.scheduling.loop import Scheduler
from ebbtide.scheduling.mirror import REBUILD_PERIOD_S, Mirror

DEVICE_MIB = 81920.0


def beat(store: Store, node: str, runs: str | None, online_pct: float = 0.0) -> None:
    device = DeviceReport(
        index=0, memory_mib=DEVICE_MIB, online_compute_pct=online_pct, online_memory_mib=0.0
    )
    store.heartbeat(
        node, started_at=1.0, devices=[device.model_dump(mode="json")], runs_jobs_of=runs
    )


def submit(store: JobStore, owner: str, compute_pct: float = 30.0) -> int:
    spec = JobSpec(command=["true"], compute_pct=compute_pct, memory_mib=1024)
    return store.submit(spec, owner, defaults_deadline_s=30.0)[0]


@pytest.fixture(params=[True, False], ids=["with-the-copy", "reading-all"])
def world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Store, Scheduler]]:
    clock = FakeClock()
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=clock)
    scheduler = Scheduler(
        store, policy=Policy(), clock=clock, wakeups=False, incremental=request.param
    )
    yield store, scheduler
    store.close()


def test_each_job_goes_to_a_node_that_runs_its_owners(world: tuple[Store, Scheduler]) -> None:
    """gpu-a is the tighter fit for both, but runs every user's jobs but root's."""
    store, scheduler = world
    beat(store, "gpu-a", "users", online_pct=40.0)
    beat(store, "gpu-c", "any")
    root, alice = submit(store, "root"), submit(store, "alice")
    decided = scheduler.run_once()
    assert {d.job_id: d.node for d in decided.dispatches} == {root: "gpu-c", alice: "gpu-a"}


def test_a_job_only_refusing_nodes_have_room_for_waits_saying_why(
    world: tuple[Store, Scheduler],
) -> None:
    """Root's job waits while only gpu-a has room (gpu-c, full, runs it), with the reason
    qstat shows, and says that no node runs it once gpu-c is gone; a node that turns to
    run anyone's (a new policy there) takes it at the next pass."""
    store, scheduler = world
    beat(store, "gpu-a", "any")
    beat(store, "gpu-b", "user:bob", online_pct=90.0)
    beat(store, "gpu-c", "any", online_pct=100.0)
    first = submit(store, "root")
    assert [d.job_id for d in scheduler.run_once().dispatches] == [first]
    beat(store, "gpu-a", "users")  # restarted without allow_root_jobs
    root, bob = submit(store, "root"), submit(store, "bob", compute_pct=5.0)
    decided = scheduler.run_once()
    assert [(d.job_id, d.node) for d in decided.dispatches] == [(bob, "gpu-b")]
    job = store.get(root)
    assert job.state == JobState.QUEUED.value
    assert job.reason == (
        "waiting: no node with room runs root's jobs (gpu-a: every user's but root's)"
    )
    if scheduler.mirror is not None:  # its copy now tells root's jobs apart
        assert scheduler.mirror._queued.singled_out == frozenset({"root", "bob"})
    store.forget_node("gpu-c")
    scheduler.run_once()
    assert store.get(root).reason == (
        "waiting: no node runs root's jobs (gpu-a: every user's but root's; gpu-b: bob's only)"
    )
    beat(store, "gpu-a", "any")
    assert [d.job_id for d in scheduler.run_once().dispatches] == [root]


def test_an_older_agent_runs_anyones(world: tuple[Store, Scheduler]) -> None:
    store, scheduler = world
    beat(store, "gpu-a", None)
    root = submit(store, "root")
    assert [d.job_id for d in scheduler.run_once().dispatches] == [root]


def test_the_copy_splits_its_groups_by_owner_once_a_node_singles_one_out() -> None:
    """Jobs of three owners share one group while no node singles one out; once a node
    runs users' jobs only, root's are a group of their own (read from the copy, the
    order kept), and a full read forgets it when no node does any more."""
    store = MemoryStore(clock=FakeClock())
    ids = [submit(store, owner) for owner in ("alice", "root", "bob", "root")]
    mirror = Mirror()
    queued, _ = mirror.sync(store, 0.0)
    assert len(queued.groups) == 1 and queued.singled_out == frozenset()
    queued, _ = mirror.sync(store, 1.0, singled_out=frozenset({"root"}))
    assert [j.id for j in queued] == ids
    assert sorted({j.owner for j in g} for g in queued.groups) == [{"alice", "bob"}, {"root"}]
    assert mirror.rebuilds == 1  # split from the copy
    queued, _ = mirror.sync(store, 1.0 + REBUILD_PERIOD_S)
    assert len(queued.groups) == 1 and mirror.rebuilds == 2
