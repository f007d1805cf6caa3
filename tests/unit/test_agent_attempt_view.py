"""An attempt's view (what the victim policy sees) is made again whenever a field it is
made of changes, and only then."""

from __future__ import annotations

from pathlib import Path

from ebbtide.preemption.enforcer import EvictionClock
from ebbtide.queue.states import JobState
from ebbtide.workers.attempt import LocalAttempt
from ebbtide.workers.executor import Handle
from ebbtide.workers.ownership import Tree
from ebbtide.workers.status import StatusReader


def local(tmp_path: Path) -> LocalAttempt:
    return LocalAttempt(
        job_id=7,
        attempt=1,
        priority=0,
        queue="default",
        devices=(0,),
        compute_pct=20.0,
        memory_mib=8192,
        gpus=0,
        deadline_s=30.0,
        signal=15,
        handle=Handle(pid=0, pgid=0),
        tree=Tree(job_id=7, root_pid=0, root_created=0.0),
        dispatched_at=100.0,
        started_at=101.0,
        status=StatusReader(tmp_path / "status"),
    )


def test_the_view_follows_the_attempt(tmp_path: Path) -> None:
    a = local(tmp_path)
    first = a.view("n")
    assert a.view("n") is first
    a.paused_at = 200.0
    paused = a.view("n")
    assert paused.paused_at == 200.0 and paused is not first
    a.last_checkpoint_at = 210.0
    assert a.view("n").last_checkpoint_at == 210.0
    a.suspended_at = 220.0
    assert a.view("n").suspended_at == 220.0
    a.eviction = EvictionClock(reason="r", message="m", spike_at=230.0, deadline_s=5.0)
    assert a.view("n").state == JobState.EVICTING
    assert a.view("other").node == "other"
    assert a.view("other") == a._make_view("other")
