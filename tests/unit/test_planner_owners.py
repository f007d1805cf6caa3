"""The planner places a job only on a node that would run it for its owner (each node's
heartbeat says whose jobs it runs: ``DeviceView.runs_jobs_of``), and a job that only
other nodes have room for waits, saying so."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ebbtide.scheduling import planner
from ebbtide.scheduling.owners import NOT_RUN_ANYWHERE, NOT_RUN_WITH_ROOM, Owners
from ebbtide.scheduling.planner import plan
from ebbtide.scheduling.snapshot import (
    DeviceGates,
    GroupedJobs,
    QueuedJob,
    QueueGate,
    Snapshot,
    plan_group,
)

from .builders import NOW, counted, dev, job, snap


def placed(s: Snapshot) -> dict[int, tuple[str, tuple[int, ...]]]:
    return {d.job_id: (d.node, d.devices) for d in plan(s).dispatches}


def test_roots_job_on_a_node_that_runs_users_jobs_waits() -> None:
    """gpu-a has room, but room there would never help: no node runs root's jobs."""
    s = snap([job(1, owner="root"), job(2, owner="alice")], devices=[dev("gpu-a", runs="users")])
    decided = plan(s)
    assert [d.job_id for d in decided.dispatches] == [2]
    assert decided.blocked[1] == NOT_RUN_ANYWHERE.format(
        owner="root", nodes="gpu-a: every user's but root's"
    )
    assert (
        decided.blocked[1] == "waiting: no node runs root's jobs (gpu-a: every user's but root's)"
    )


def test_a_job_only_refusing_nodes_have_room_for_waits_saying_so() -> None:
    devices = [dev("gpu-a", runs="users"), dev("gpu-c", oc=95, runs="any")]
    decided = plan(snap([job(1, c=30, owner="root")], devices=devices))
    assert decided.dispatches == []
    assert decided.blocked[1] == NOT_RUN_WITH_ROOM.format(
        owner="root", nodes="gpu-a: every user's but root's"
    )
    assert decided.blocked[1] == (
        "waiting: no node with room runs root's jobs (gpu-a: every user's but root's)"
    )


def test_alices_job_on_a_node_that_runs_bobs_only_waits() -> None:
    s = snap([job(1, owner="alice")], devices=[dev("gpu-b", runs="user:bob")])
    decided = plan(s)
    assert decided.dispatches == []
    assert decided.blocked[1] == "waiting: no node runs alice's jobs (gpu-b: bob's only)"
    # bob's goes there
    assert placed(snap([job(1, owner="bob")], devices=[dev("gpu-b", runs="user:bob")])) == {
        1: ("gpu-b", (0,))
    }


def test_a_job_goes_to_the_node_that_runs_it_not_the_best_fit() -> None:
    """Bob's node is the tighter fit (more online load); alice's job goes to the other."""
    devices = [dev("gpu-b", oc=60, runs="user:bob"), dev("gpu-c", runs="any")]
    assert placed(snap([job(1, c=30, owner="alice")], devices=devices)) == {1: ("gpu-c", (0,))}
    assert placed(snap([job(1, c=30, owner="bob")], devices=devices)) == {1: ("gpu-b", (0,))}


def test_a_mixed_fleet_places_each_owner_where_they_run() -> None:
    """Each job goes to its best fit among the nodes that run its owner's jobs: root's not
    on gpu-a (every user's but root's) nor gpu-b (bob's only), alice's and carol's not on
    gpu-b, bob's anywhere."""
    devices = [
        dev("gpu-a", 0, oc=50, runs="users"),  # 45 % free
        dev("gpu-a", 1, oc=50, runs="users"),
        dev("gpu-b", 0, oc=40, runs="user:bob"),  # 55 %
        dev("gpu-c", 0, runs="any"),  # 95 %
        dev("gpu-d", 0, oc=20),  # 75 %, an older agent: anyone's
    ]
    jobs = [
        job(1, c=30, owner="root"),
        job(2, c=30, owner="bob"),
        job(3, c=30, owner="alice"),
        job(4, c=30, owner="carol"),
        job(5, c=100, gpus=1, owner="root"),
    ]
    assert placed(snap(jobs, devices=devices)) == {
        1: ("gpu-d", (0,)),
        2: ("gpu-d", (0,)),  # a slice there already: the least memory left over
        3: ("gpu-a", (0,)),
        4: ("gpu-a", (1,)),
        5: ("gpu-c", (0,)),
    }


def test_an_older_agent_and_a_newer_value_run_anyones() -> None:
    for runs in (None, "", "any", "from-a-newer-agent"):
        assert placed(snap([job(1, owner="root")], devices=[dev(runs=runs)])) == {1: ("n", (0,))}


def test_whole_gpu_jobs_go_only_to_nodes_that_run_them() -> None:
    devices = [dev("gpu-b", i, runs="user:bob") for i in range(2)] + [
        dev("gpu-c", i, oc=10, runs="any") for i in range(2)
    ]
    s = snap([job(1, c=100, gpus=2, owner="alice")], devices=devices)
    assert placed(s) == {1: ("gpu-c", (0, 1))}
    s = snap([job(1, c=100, gpus=2, owner="alice")], devices=devices[:2] + devices[2:3])
    decided = plan(s)
    assert decided.dispatches == []
    assert decided.blocked[1] == "waiting: no node with room runs alice's jobs (gpu-b: bob's only)"


def test_under_windows_too() -> None:
    devices = [dev("gpu-b", runs="user:bob"), dev("gpu-c", oc=50, runs="any")]
    closing = QueueGate(open_until=NOW + 3600, share=1.0, window="day")
    gates = {d.key: DeviceGates(open={"default": closing}) for d in devices}
    s = dataclasses.replace(snap([job(1, c=30, owner="alice")], devices=devices), gates=gates)
    assert placed(s) == {1: ("gpu-c", (0,))}
    s = dataclasses.replace(s, devices=[devices[0], dev("gpu-c", oc=95, runs="any")])
    assert plan(s).blocked[1].startswith("waiting: no node with room runs alice's jobs")
    s = dataclasses.replace(s, devices=devices[:1])
    assert plan(s).blocked[1].startswith("waiting: no node runs alice's jobs")


def test_no_room_anywhere_is_said_as_before() -> None:
    """Only where a refusing node has the room does the owner's reason replace the
    headroom one."""
    devices = [dev("gpu-b", oc=95, runs="user:bob"), dev("gpu-c", oc=95, runs="any")]
    why = plan(snap([job(1, c=30, owner="alice")], devices=devices)).blocked[1]
    assert why.startswith("waiting for headroom: no device has 30%")


def test_no_node_up_runs_the_owners_jobs() -> None:
    devices = [dev(f"gpu-{n}", oc=95, runs="user:bob") for n in "abcd"]
    why = plan(snap([job(1, c=30, owner="alice")], devices=devices)).blocked[1]
    nodes = "gpu-a: bob's only; gpu-b: bob's only; gpu-c: bob's only (+1 more)"
    assert why == NOT_RUN_ANYWHERE.format(owner="alice", nodes=nodes)


def test_every_owner_is_told_their_own_reason() -> None:
    devices = [dev("gpu-b", runs="user:bob")]
    decided = plan(snap([job(1, owner="alice"), job(2, owner="carol")], devices=devices))
    assert "alice's jobs" in decided.blocked[1] and "carol's jobs" in decided.blocked[2]


def test_why_a_class_of_owners_waits_is_worked_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Owners that no node singles out go to the same nodes: the reason of a shape that
    fits nowhere they go is worked out at the first of their jobs, and written for each
    job with its own owner's name; root's, singled out, has its own."""
    calls: list[str] = []
    reason = Owners.reason

    def counting(self: Owners, *args: Any) -> Any:
        calls.append("reason")
        return reason(self, *args)

    monkeypatch.setattr(Owners, "reason", counting)
    devices = [
        dev("gpu-a", oc=95, runs="users"),
        dev("gpu-b", runs="user:bob"),
        dev("gpu-c", oc=95, runs="any"),
    ]
    names = [f"user{i}" for i in range(50)]
    jobs = [job(i, c=30, owner=o) for i, o in enumerate(names, 1)]
    decided = plan(snap([*jobs, job(51, c=30, owner="root")], devices=devices))
    assert decided.dispatches == [] and len(calls) == 2
    assert [decided.blocked[i] for i in range(1, 52)] == [
        f"waiting: no node with room runs {o}'s jobs (gpu-b: bob's only)" for o in [*names, "root"]
    ]


def test_the_headroom_reason_is_of_the_nodes_that_run_the_owners_jobs() -> None:
    """Where no refusing node has room either, a job is told why the nodes that would run
    it take nothing, not what the others say: alice's one node drained, or cooling down."""
    drained = dataclasses.replace(dev("gpu-c", runs="any"), unavailable="gpu-c drained by root")
    busy = dev("gpu-b", oc=95, runs="user:bob")
    decided = plan(snap([job(1, c=30, owner="alice")], devices=[busy, drained]))
    assert decided.blocked[1] == "waiting: no device takes work (gpu-c drained by root)"
    cooling = dataclasses.replace(dev("gpu-c", runs="any"), cooldown_until=NOW + 60)
    decided = plan(snap([job(1, c=30, owner="alice")], devices=[busy, cooling]))
    assert decided.blocked[1].startswith("waiting: devices cooling down after evictions")
    # bob's job may go to either node: what both say
    decided = plan(snap([job(1, c=30, owner="bob")], devices=[busy, drained]))
    assert decided.blocked[1].startswith("waiting for headroom: no device has 30%")
    assert decided.blocked[1].endswith("gpu-c drained by root")


def test_owners_are_told_apart_only_where_a_node_singles_them_out() -> None:
    owners = Owners([dev("a", runs="users"), dev("b", runs="user:bob"), dev("c", runs="any")])
    assert owners.singled_out == {"root", "bob"} and not owners.anyone
    assert Owners([dev("a", runs="any"), dev("b"), dev("c", runs="from-a-newer-agent")]).anyone


def by_group(jobs: list[QueuedJob], told: frozenset[str], read: list[int]) -> GroupedJobs:
    groups: dict[Any, list[QueuedJob]] = {}
    for j in jobs:
        groups.setdefault(plan_group(j, told), []).append(j)
    Counted = counted(read)
    return GroupedJobs([Counted(g) for g in groups.values()], len(jobs), singled_out=told)


def test_a_group_whose_owner_no_node_with_room_runs_is_left_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand of root's jobs on a fleet that runs every user's but root's, ahead of
    alice's: the pass reads the jobs it needs for its reasons, not the rest."""
    monkeypatch.setattr(planner, "MAX_REASONS", 3)
    jobs = [job(i, prio=1, owner="root") for i in range(1, 1001)] + [job(1001, owner="alice")]
    read: list[int] = []
    devices = [dev("gpu-a", runs="users")]
    s = snap(devices=devices)
    decided = plan(dataclasses.replace(s, queued=by_group(jobs, frozenset({"root"}), read)))
    assert [d.job_id for d in decided.dispatches] == [1001]
    assert len(read) < 10
    # a copy of the queue that does not tell root apart is read on, and decides the same
    read.clear()
    again = plan(dataclasses.replace(s, queued=by_group(jobs, frozenset(), read)))
    assert again == decided and len(read) == len(jobs)


def test_owners_of_one_class_share_a_misfit_backoffs_included(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Alice's and carol's jobs go to the same nodes (one class of owners): once alice's
    finds no node, carol's of that shape, in a backoff of its own, fits nowhere either,
    and its backoff's end would change nothing, so the pass asks to be woken at none
    (as where every node runs anyone's), reading the queue by group or in order."""
    monkeypatch.setattr(planner, "MAX_REASONS", 1)
    first = job(1, prio=2, owner="alice")
    ready = dataclasses.replace(job(2, prio=1, owner="alice"), evictions=2, requeued_at=0.0)
    waits = dataclasses.replace(job(3, prio=1, owner="carol"), evictions=2, requeued_at=NOW - 1)
    s = dataclasses.replace(
        snap(devices=[dev("gpu-b", runs="user:bob")]), backoff_base_s=30.0, backoff_max_s=600.0
    )
    jobs = [first, ready, waits]
    decided = plan(dataclasses.replace(s, queued=by_group(jobs, frozenset({"bob"}), [])))
    assert decided == plan(dataclasses.replace(s, queued=jobs), queued_in_order=True)
    assert decided.wake_at is None
    assert decided.blocked == {1: "waiting: no node runs alice's jobs (gpu-b: bob's only)"}


def test_a_fleet_that_runs_anyones_groups_and_places_as_before() -> None:
    """Owners are not told apart (one group for every owner) where no node singles one
    out, and the pass's wake-up, reasons and dispatches do not depend on them."""
    jobs = [job(i, owner=o) for i, o in enumerate(("alice", "bob", "root"), 1)]
    assert len({plan_group(j) for j in jobs}) == 1
    assert len({plan_group(j, frozenset({"root"})) for j in jobs}) == 2
    s = snap(jobs, devices=[dev(runs="any")])
    bare = dataclasses.replace(s, queued=[dataclasses.replace(j, owner="") for j in jobs])
    assert plan(s) == plan(bare)
