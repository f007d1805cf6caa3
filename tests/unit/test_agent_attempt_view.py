"""An attempt's view (what the victim policy sees) is made again whenever a field it is
made of changes, and only then."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ebbtide.preemption.enforcer import EvictionClock
from ebbtide.queue.states import JobState
from ebbtide.workers.attempt import LocalAttempt
from ebbtide.workers.executor import Handle
from ebbtide.workers.ownership import Tree
from ebbtide.workers.status import StatusReader

from .builders import att


def local(tmp_path: Path) -> LocalAttempt:
    return LocalAttempt(
        slice=att(7, node="n", c=20.0, m=8192, dispatched=100.0, started=101.0),
        handle=Handle(pid=0, pgid=0),
        tree=Tree(job_id=7, root_pid=0, root_created=0.0),
        status=StatusReader(tmp_path / "status"),
    )


def test_the_view_follows_the_attempt(tmp_path: Path) -> None:
    a = local(tmp_path)
    first = a.view()
    assert a.view() is first
    a.paused_at = 200.0
    paused = a.view()
    assert paused.paused_at == 200.0 and paused is not first
    a.last_checkpoint_at = 210.0
    assert a.view().last_checkpoint_at == 210.0
    a.suspended_at = 220.0
    assert a.view().suspended_at == 220.0
    a.eviction = EvictionClock(reason="r", message="m", spike_at=230.0, deadline_s=5.0)
    assert a.view().state == JobState.EVICTING
    assert a.view() == dataclasses.replace(
        a.slice,
        state=JobState.EVICTING,
        last_checkpoint_at=210.0,
        paused_at=200.0,
        suspended_at=220.0,
    )
    # what the view is made of besides is the slice as it started
    assert (a.job_id, a.attempt, a.started_at) == (7, 1, 101.0)
