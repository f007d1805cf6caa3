"""One attempt as its node agent holds it: the slice, the process tree, the eviction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ebbtide.preemption.enforcer import EvictionClock
from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt
from ebbtide.workers.executor import Handle
from ebbtide.workers.ownership import Tree
from ebbtide.workers.status import StatusReader
from ebbtide.workers.usage import UsageSummary


@dataclass
class LocalAttempt:
    job_id: int
    attempt: int
    priority: int
    queue: str
    devices: tuple[int, ...]
    compute_pct: float
    memory_mib: int
    gpus: int
    deadline_s: float
    signal: int
    handle: Handle
    #: the attempt's process tree, as ownership lookups know it
    tree: Tree
    dispatched_at: float
    started_at: float
    #: the job's status lines (checkpoints, progress)
    status: StatusReader
    last_checkpoint_at: float | None = None
    eviction: EvictionClock | None = None
    walltime_s: float | None = None
    #: why the agent ended it, when it was not the job's own doing (walltime, fencing)
    ended_by: str | None = None
    #: Unix seconds it was paused (frozen in place); None while it runs
    paused_at: float | None = None
    #: an online compute spike may pause it rather than evict it
    pausable: bool = False
    #: Unix seconds its CUDA state was moved to host memory; None while it is on its GPU
    suspended_at: float | None = None
    #: the processes whose CUDA state was moved to host memory (restored the same way)
    suspended_pids: tuple[int, ...] = ()
    #: what it used of its GPUs so far, where the headroom source attributes GPU use per
    #: process (None: nothing measured yet, or nothing can be)
    usage: UsageSummary | None = None
    #: Unix seconds its usage may be sampled next (about once a second, not every tick)
    usage_due_at: float = 0.0
    #: the last view, and what it was made from (the fast path asks for one every tick)
    _view: tuple[tuple[Any, ...], ActiveAttempt] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def view(self, node: str) -> ActiveAttempt:
        """The attempt as the victim policy sees it (the same object until one of the
        fields it is made of changes)."""
        key = (
            node,
            self.eviction is not None,
            self.last_checkpoint_at,
            self.paused_at,
            self.suspended_at,
            self.pausable,
            self.priority,
            self.queue,
            self.devices,
            self.compute_pct,
            self.memory_mib,
            self.gpus,
            self.deadline_s,
            self.signal,
            self.dispatched_at,
            self.started_at,
        )
        if self._view is not None and self._view[0] == key:
            return self._view[1]
        view = self._make_view(node)
        self._view = (key, view)
        return view

    def _make_view(self, node: str) -> ActiveAttempt:
        return ActiveAttempt(
            job_id=self.job_id,
            attempt=self.attempt,
            state=JobState.EVICTING if self.eviction else JobState.RUNNING,
            priority=self.priority,
            queue=self.queue,
            node=node,
            devices=self.devices,
            compute_pct=self.compute_pct,
            memory_mib=self.memory_mib,
            deadline_s=self.deadline_s,
            signal=self.signal,
            dispatched_at=self.dispatched_at,
            started_at=self.started_at,
            last_checkpoint_at=self.last_checkpoint_at,
            gpus=self.gpus,
            paused_at=self.paused_at,
            pausable=self.pausable,
            suspended_at=self.suspended_at,
        )
