"""One attempt as its node agent holds it: the slice, the process tree, the eviction."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ebbtide.preemption.enforcer import EvictionClock
from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt
from ebbtide.workers.executor import Handle
from ebbtide.workers.ownership import Tree
from ebbtide.workers.status import StatusReader
from ebbtide.workers.usage import UsageSummary

#: How often one attempt's progress reaches the store at most, in seconds: the latest
#: the job gave, the first at once and the last when the attempt ends.  A job may call
#: ``job.progress()`` at every step; each status line was a journal entry and a SQL
#: write, ahead of the node's heartbeats in the journal.
PROGRESS_REPORT_PERIOD_S = 10.0


@dataclass
class LocalAttempt:
    """An attempt running on this node.  ``slice`` is the attempt as the scheduler
    dispatched it and the victim policy sees it (its job's share of the devices, priority,
    queue, deadline, signal, start); what changes while it runs is kept beside it, and
    :meth:`view` puts the two together."""

    slice: ActiveAttempt
    handle: Handle
    #: the attempt's process tree, as ownership lookups know it
    tree: Tree
    #: the job's status lines (checkpoints, progress)
    status: StatusReader
    last_checkpoint_at: float | None = None
    eviction: EvictionClock | None = None
    walltime_s: float | None = None
    #: Unix seconds it is killed for running past its walltime (warned its deadline
    #: before); None: it has not
    walltime_kill_at: float | None = None
    #: why the agent ended it, when it was not the job's own doing (walltime, fencing)
    ended_by: str | None = None
    #: Unix seconds it was paused (frozen in place); None while it runs
    paused_at: float | None = None
    #: Unix seconds its CUDA state was moved to host memory; None while it is on its GPU
    suspended_at: float | None = None
    #: the processes whose CUDA state was moved to host memory (restored the same way)
    suspended_pids: tuple[int, ...] = ()
    #: what it used of its GPUs so far, where the headroom source attributes GPU use per
    #: process (None: nothing measured yet, or nothing can be)
    usage: UsageSummary | None = None
    #: Unix seconds its usage may be sampled next (about once a second, not every tick)
    usage_due_at: float = 0.0
    #: the job's latest progress (done, total) not reported to the store yet
    progress: tuple[float, float | None] | None = None
    #: Unix seconds its progress was last reported (-inf: never)
    progress_sent_at: float = -math.inf
    #: the last view, and what it was made from (the fast path asks for one every tick)
    _view: tuple[tuple[Any, ...], ActiveAttempt] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def job_id(self) -> int:
        return self.slice.job_id

    @property
    def attempt(self) -> int:
        return self.slice.attempt

    @property
    def started_at(self) -> float:
        """Unix seconds the agent started it (a local attempt has always started)."""
        assert self.slice.started_at is not None
        return self.slice.started_at

    def view(self) -> ActiveAttempt:
        """The attempt as the victim policy sees it now (the same object until what
        changed since its start changes again)."""
        key = (
            self.eviction is not None,
            self.last_checkpoint_at,
            self.paused_at,
            self.suspended_at,
        )
        if self._view is not None and self._view[0] == key:
            return self._view[1]
        view = dataclasses.replace(
            self.slice,
            state=JobState.EVICTING if self.eviction else JobState.RUNNING,
            last_checkpoint_at=self.last_checkpoint_at,
            paused_at=self.paused_at,
            suspended_at=self.suspended_at,
        )
        self._view = (key, view)
        return view

    def progress_to_report(
        self, now: float, *, final: bool = False
    ) -> tuple[float, float | None] | None:
        """The progress to report ``now``, if any: the latest the job gave, at most once
        per :data:`PROGRESS_REPORT_PERIOD_S` (the first at once); any when ``final``."""
        if self.progress is None:
            return None
        if not final and now - self.progress_sent_at < PROGRESS_REPORT_PERIOD_S:
            return None
        progress, self.progress, self.progress_sent_at = self.progress, None, now
        return progress
