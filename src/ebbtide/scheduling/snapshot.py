"""The plain values the planner and the victim policy decide on.

No I/O and no clock here: the live scheduler, the node agent's fast path and the
simulator all build these and call the same pure functions.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

from ebbtide.queue.states import JobState


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for a slice."""

    id: int
    priority: int
    queue: str
    owner: str
    compute_pct: float
    gpus: int
    memory_mib: int
    array_id: int | None
    array_limit: int | None
    attempts: int
    #: eviction deadline, in seconds (admission before a window closes)
    deadline_s: float = 30.0
    #: seconds from start to the first checkpoint, if known
    first_checkpoint_s: float | None = None
    #: Unix seconds of its last requeue (backoff after repeated evictions counts from it)
    requeued_at: float | None = None
    evictions: int = 0
    #: Unix seconds it was submitted
    submitted_at: float | None = None


def queue_order(job: QueuedJob) -> tuple[int, int]:
    """A queued job's place in scheduling order: priority (high first), then id."""
    return (-job.priority, job.id)


def plan_group(job: QueuedJob, singled_out: Container[str] = ()) -> tuple[object, ...]:
    """What makes queued jobs fit, or not, together: the shape of their slice (they fit
    where the others do), under windows their queue and timing (they fit in time where
    the others do), and their owner where a node singles it out (``singled_out``: the
    owners some node treats unlike the others, :func:`~ebbtide.queue.whose_jobs.singled_out`;
    every other owner's jobs go to the same nodes); and what makes them refused together:
    their queue (its quota), their array when it has a limit, and whether they may be in
    a backoff (evicted twice or more).  Once the planner knows that one fits nowhere, or
    that its array or its queue's quota is spent, it knows it of every job of the group.
    See :class:`GroupedJobs`."""
    limit = job.array_limit
    return (
        job.compute_pct,
        job.memory_mib,
        job.gpus,
        job.queue,
        job.first_checkpoint_s,
        job.deadline_s,
        None if limit is None else job.array_id,
        limit,
        job.evictions >= 2,
        job.owner if job.owner in singled_out else "",
    )


class GroupedJobs(Sequence[QueuedJob]):
    """Queued jobs in scheduling order (:func:`queue_order`), held as groups of one
    :func:`plan_group` each, each group in that order (no id twice).

    Iterating merges the groups; the planner merges them as it reads and leaves a group
    behind once it knows that none of its jobs can start this pass, so that a pass reads
    the jobs it places and refuses, not the whole queue (the scheduler's copy of the queue
    keeps these groups: :mod:`ebbtide.scheduling.mirror`).  :meth:`find` looks a job up by
    id (``find``: the holder's own lookup; without one it reads the groups).  Indexing
    makes the whole list once (for tests).

    ``singled_out``: the owners the groups were told apart by (:func:`plan_group`); the
    planner leaves a group unread for want of a node that runs its owner's jobs only
    when that covers every owner some node of the pass singles out."""

    def __init__(
        self,
        groups: Sequence[Iterable[QueuedJob]],
        size: int,
        find: Callable[[int], QueuedJob | None] | None = None,
        singled_out: frozenset[str] = frozenset(),
    ) -> None:
        #: each group, iterable again and again, in scheduling order
        self.groups = groups
        self.singled_out = singled_out
        self._size = size
        self._find = find
        self._list: list[QueuedJob] | None = None

    def find(self, job_id: int) -> QueuedJob | None:
        """The job ``job_id``, or None when it is not here."""
        if self._find is not None:
            return self._find(job_id)
        return next((j for g in self.groups for j in g if j.id == job_id), None)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[QueuedJob]:
        return heapq.merge(*self.groups, key=queue_order)

    @overload
    def __getitem__(self, i: int) -> QueuedJob: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[QueuedJob]: ...

    def __getitem__(self, i: int | slice) -> QueuedJob | Sequence[QueuedJob]:
        if self._list is None:
            self._list = list(self)
        return self._list[i]


@dataclass(frozen=True)
class ActiveAttempt:
    """An attempt that holds a slice (dispatched, running or evicting)."""

    job_id: int
    attempt: int
    state: JobState
    priority: int
    queue: str
    node: str
    devices: tuple[int, ...]
    compute_pct: float
    memory_mib: int
    deadline_s: float
    signal: int
    dispatched_at: float
    started_at: float | None
    last_checkpoint_at: float | None
    cancel_requested: bool = False
    array_id: int | None = None
    gpus: int = 0
    owner: str = ""
    #: Unix seconds it was paused (frozen: holds its memory, uses no compute); None: runs
    paused_at: float | None = None
    #: it may be paused rather than evicted for compute (its spec and queue allow it, and
    #: its executor can)
    pausable: bool = False
    #: Unix seconds its CUDA state was moved to host memory (suspended: it holds neither
    #: compute nor GPU memory, and is paused too); None: its memory is on its GPU
    suspended_at: float | None = None

    @property
    def evicting(self) -> bool:
        return self.state == JobState.EVICTING

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def suspended(self) -> bool:
        return self.suspended_at is not None

    def lost_work_s(self, now: float) -> float:
        """Work an eviction now would throw away: time since the last checkpoint."""
        since = self.last_checkpoint_at or self.started_at or self.dispatched_at
        return max(0.0, now - since)


@dataclass(frozen=True)
class DeviceView:
    """One device as the planner sees it: capacity and the latest online usage."""

    node: str
    index: int
    memory_mib: float
    online_compute_pct: float = 0.0
    online_memory_mib: float = 0.0
    #: online growth expected within the eviction deadline (a forecast), in percent
    reserve_compute_pct: float = 0.0
    #: online memory growth expected within the eviction deadline, in MiB
    reserve_memory_mib: float = 0.0
    #: the reserve is the cold one for this many more seconds (0: the forecast)
    reserve_cold_for_s: float = 0.0
    #: Unix seconds of the sample these figures come from
    sampled_at: float = 0.0
    #: nothing new is dispatched here before this (Unix seconds): eviction cooldown
    cooldown_until: float = 0.0
    #: why nothing new may go here at all (a fault, an admin's drain); "" when it may
    unavailable: str = ""
    #: the figures come from a planning-only source (seconds old): no online-pressure
    #: eviction is decided on them
    planning_only: bool = False
    #: whose jobs its node's agent runs, as its heartbeat says (``any``, ``users``,
    #: ``user:NAME``: :mod:`ebbtide.queue.whose_jobs`); None: not said (an older agent),
    #: anyone's
    runs_jobs_of: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.node, self.index)


@dataclass(frozen=True)
class Margins:
    """Headroom never handed out, so a small online rise needs no eviction."""

    #: compute kept free on every device, in percent
    compute_pct: float = 5.0
    #: memory kept free on every device, in MiB
    memory_mib: float = 2048.0


@dataclass(frozen=True)
class QueueLimits:
    """A queue's quotas and protections, as the planner and the victim policy see them."""

    #: False: evicted for online pressure only when memory is short, never for compute
    preemptible: bool = True
    #: not evicted in its first seconds unless memory is short (seconds)
    min_runtime_s: float = 0.0
    #: fraction of the fleet's compute the queue may hold
    max_fleet_share: float | None = None
    #: fraction of the fleet's compute one user of the queue may hold
    max_user_share: float | None = None
    #: attempts of the queue that may hold slices at once
    max_running: int | None = None
    #: after a pause, compute counts as free this long later, in seconds (None: default)
    pause_drain_s: float | None = None


#: Defaults of :class:`PauseRules` (the policy's ``defaults`` and queues override them).
PAUSE_DRAIN_S = 0.05
MAX_PAUSE_S = 600.0
THAW_HYSTERESIS_PCT = 2.0
MIN_PAUSE_S = 5.0
MAX_SUSPEND_S = 1800.0
RESTORE_HYSTERESIS_MIB = 4096.0
#: Share of a node's physical memory its suspended attempts may hold together, in %.
SUSPEND_HOST_MEMORY_PCT = 50.0


@dataclass(frozen=True)
class PauseRules:
    """When pausing is chosen over eviction, and when a paused attempt runs again."""

    #: pausing is on at all (off: every shortfall evicts, as before pausing existed)
    enabled: bool = True
    #: compute counts as free this long after a pause (in-flight GPU work drains), in s
    drain_s: float = PAUSE_DRAIN_S
    #: a job paused this long is evicted so that it can run elsewhere, in seconds
    max_pause_s: float = MAX_PAUSE_S
    #: thaw only when the device would still have this much compute spare, in percent
    thaw_hysteresis_pct: float = THAW_HYSTERESIS_PCT
    #: a paused job stays paused at least this long, in seconds (a suspended one too)
    min_pause_s: float = MIN_PAUSE_S
    #: memory shortage suspends to host (moves the CUDA state off the GPU) rather than
    #: evicts, where the node can and the move fits the deadline (off: evict, as before)
    suspend: bool = False
    #: a job suspended this long is evicted so that it can run elsewhere, in seconds
    max_suspend_s: float = MAX_SUSPEND_S
    #: restore only when the device would still have this much memory spare, in MiB
    restore_hysteresis_mib: float = RESTORE_HYSTERESIS_MIB
    #: the attempts suspended on a node hold at most this share of its physical memory
    #: together, in percent (the node agent checks it, and that the host has the room)
    host_memory_pct: float = SUSPEND_HOST_MEMORY_PCT


def protected(a: ActiveAttempt, limits: QueueLimits | None, now: float) -> bool:
    """Whether ``a`` is spared when only compute is short (memory shortage takes anyone)."""
    if limits is None:
        return False
    if not limits.preemptible:
        return True
    started = a.started_at or a.dispatched_at
    return now - started < limits.min_runtime_s


@dataclass(frozen=True)
class QueueGate:
    """A queue on a device: may run until ``open_until`` holding at most ``share``."""

    open_until: float
    share: float
    #: the window whose close ends it (empty with no known end)
    window: str = ""


@dataclass
class DeviceGates:
    """What the policy allows on one device now, per queue; ``closed`` says why not."""

    open: dict[str, QueueGate] = field(default_factory=dict)
    closed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    now: float
    queued: Sequence[QueuedJob]
    active: Sequence[ActiveAttempt]
    devices: Sequence[DeviceView]
    margins: Margins = field(default_factory=Margins)
    #: graduated response: compute spikes pause pausable attempts (the agent does it)
    pause: PauseRules = field(default_factory=PauseRules)
    #: False while no window admits offline work (the policy issue fills this in)
    offline_allowed: bool = True
    #: at most this many dispatches per pass (keeps one pass short)
    max_dispatches: int = 1000
    #: per-queue quotas and protections, of every queue of the policy: a queued job of a
    #: queue not listed waits (its queue was taken out of the policy); none listed at
    #: all: no queue has any
    queues: Mapping[str, QueueLimits] = field(default_factory=dict)
    #: what the windows allow per device and queue (``None``: everything, always)
    gates: Mapping[tuple[str, int], DeviceGates] | None = None
    #: a job evicted k ≥ 2 times waits backoff_base_s × 2^(k-2), at most backoff_max_s
    backoff_base_s: float = 0.0
    backoff_max_s: float = 0.0


@dataclass(frozen=True)
class PlanRules:
    """What a scheduler's pass takes from the policy in effect: the live loop and the
    simulator build their :class:`Snapshot` through it, so that a rule added here reaches
    both (see :meth:`ebbtide.config.policy.Policy.plan_rules`)."""

    margins: Margins = field(default_factory=Margins)
    pause: PauseRules = field(default_factory=PauseRules)
    queues: Mapping[str, QueueLimits] = field(default_factory=dict)
    backoff_base_s: float = 0.0
    backoff_max_s: float = 0.0

    def snapshot(
        self,
        now: float,
        queued: Sequence[QueuedJob],
        active: Sequence[ActiveAttempt],
        devices: Sequence[DeviceView],
        gates: Mapping[tuple[str, int], DeviceGates] | None = None,
    ) -> Snapshot:
        """The planner's input: these jobs, attempts and devices under these rules."""
        return Snapshot(
            now=now,
            queued=queued,
            active=active,
            devices=devices,
            margins=self.margins,
            pause=self.pause,
            queues=self.queues,
            gates=gates,
            backoff_base_s=self.backoff_base_s,
            backoff_max_s=self.backoff_max_s,
        )


def backoff_s(evictions: int, base_s: float, max_s: float) -> float:
    """How long a job evicted ``evictions`` times waits before it may run again."""
    if evictions < 2 or base_s <= 0:
        return 0.0
    return min(max_s, base_s * 2 ** (evictions - 2))
