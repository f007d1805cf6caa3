"""The mutable state of one simulation: devices, jobs and attempts, and how an attempt
progresses.  The event loop (:mod:`ebbtide.sim.engine`) drives it.

An attempt goes ``STARTING`` (dispatched; the process starts) → ``RESTORING`` (a resumed
attempt only: the restart overhead, restoring its checkpoint and building its CUDA context
on the GPU) → ``RUNNING`` (progress at its slice's rate) ⇄ ``CHECKPOINTING`` (every
``ckpt_interval_s`` of running it spends ``ckpt_cost_s`` saving its progress) → finished,
or → ``EVICTING`` (warned; out of the way after the eviction's steps, see
:meth:`ebbtide.sim.engine.Simulation._evict`).

In any phase but ``EVICTING`` an attempt may be *paused* (``paused_at`` set): frozen where
it is, it keeps its slice's memory, uses no compute once its work in flight drained, and
its phase makes no headway; thawed, the phase goes on where it stopped (its timers move by
the time it was paused, see :meth:`SimAttempt.thaw`).  A paused attempt may also be
*suspended to host* (``suspended_at`` set): once its CUDA state is copied to host memory,
its slice's memory leaves the GPU too (``on_gpu`` False), though the planner still keeps
room for its return; restored, its memory is back at once and it runs again once the copy
back is done.

Progress is counted in seconds of running at the full slice: a fractional slice makes one
second of progress per second; a whole-GPU slice yields compute to the online tenant, so it
progresses at ``(100 − online compute) / 100`` per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from ebbtide.preemption.victims import EvictReason
from ebbtide.queue.states import JobState
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT
from ebbtide.scheduling.forecast import Forecaster
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins, QueuedJob
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.online import DeviceLoad

STARTING, RUNNING, CHECKPOINTING, EVICTING, RESTORING = range(5)
#: Signal number recorded in attempt views (TERM); the simulation sends none.
_SIGTERM = 15
#: Progress within this of the work left counts as finished, in seconds.
DONE_EPS_S = 1e-6
#: A running sum of slices' compute may differ from a fresh one by float rounding; a
#: decision taken on a running sum keeps this much to spare, in percent.
SUM_SLACK = 1e-6


@dataclass(eq=False)
class SimDevice:
    k: int
    load: DeviceLoad
    node: str
    memory_mib: float
    forecaster: Forecaster | None = None
    present: bool = False
    next_step: int = 0
    online_c: float = 0.0
    online_m: float = 0.0
    #: compute still held by fractional slices (until each is out of the way), in percent
    held_c: float = 0.0
    #: memory held by all slices, in MiB (those suspended to host too: the planner keeps
    #: room for their return)
    held_m: float = 0.0
    #: memory the slices use on the GPU itself, in MiB (not those suspended to host)
    gpu_m: float = 0.0
    attempts: dict[int, SimAttempt] = field(default_factory=dict)
    #: metrics are accounted up to this time
    accounted_to: float = 0.0
    last_step_at: float = 0.0
    #: what the scheduler has heard: online compute, memory, and the forecast reserve
    seen_c: float = 0.0
    seen_m: float = 0.0
    reserve: tuple[float, float] = (0.0, 0.0)
    reported: bool = False
    #: nothing new is dispatched here before this: the policy's eviction cooldown
    cooldown_until: float = 0.0
    view: DeviceView | None = None
    #: the slices here, as sums of their compute in percent (see :meth:`count`): all held,
    #: paused, restoring, running fractional and running whole-GPU slices
    slice_c: float = 0.0
    paused_c: float = 0.0
    restoring_c: float = 0.0
    running_c: float = 0.0
    running_whole_c: float = 0.0
    #: paused slices here, and whole-GPU slices running (their progress follows online
    #: compute)
    paused_n: int = 0
    running_whole_n: int = 0
    #: compute of the fractional slices here that are not paused (any phase, evicting
    #: included): what :func:`~ebbtide.scheduling.capacity.overflow` adds up, in percent
    awake_c: float = 0.0
    #: :meth:`alloc_c` as last summed; None once ``attempts`` changed (see :meth:`changed`)
    alloc_sum: float | None = None
    #: its first view: later views copy it with what changed (see :meth:`view_with`)
    _view_base: DeviceView | None = field(default=None, repr=False)

    def view_with(self, **changes: object) -> DeviceView:
        """The device seen with ``changes`` (usage, reserve, cooldown, when sampled): a
        view is made at every non-idle sample and every report, so it is copied from the
        first one rather than made through the frozen dataclass's constructor."""
        if self._view_base is None:
            self._view_base = DeviceView(node=self.node, index=0, memory_mib=self.memory_mib)
        return _with(self._view_base, changes)

    def alloc_c(self) -> float:
        """Compute its slices hold for admission (every slice, paused or evicting), in %.

        A fresh sum in ``attempts``' order, kept until :meth:`changed`, so that it is the
        same float a sum taken at every call would be."""
        if self.alloc_sum is None:
            self.alloc_sum = sum(a.job.spec.compute_pct for a in self.attempts.values())
        return self.alloc_sum

    def changed(self) -> None:
        """A slice was added to ``attempts`` or taken from it."""
        self.alloc_sum = None

    def offline_in_use(self) -> float:
        """Offline compute in use: fractional slices held, whole-GPU slices' share, in %."""
        whole = sum(
            max(0.0, 100.0 - self.online_c)
            for a in self.attempts.values()
            if a.job.spec.gpus and a.phase != EVICTING
        )
        return self.held_c + whole

    def count(self, att: SimAttempt, sign: float) -> None:
        """Add (``sign`` 1) or take away (−1) ``att``'s share of the slice sums: take it
        away before its phase or pause changes and add it back after; when it leaves, take
        it away after it is out of ``attempts``."""
        c = sign * att.job.spec.compute_pct
        self.slice_c += c
        if att.paused_at is not None:
            self.paused_c += c
            self.paused_n += 1 if sign > 0 else -1
        else:
            if not att.job.spec.gpus:
                self.awake_c += c
            if att.phase == RESTORING:
                self.restoring_c += c
            elif att.phase == RUNNING:
                if att.job.spec.gpus:
                    self.running_whole_c += c
                    self.running_whole_n += 1 if sign > 0 else -1
                else:
                    self.running_c += c
        if not self.attempts and sign < 0:  # no float drift once the device is empty
            self.slice_c = self.paused_c = self.restoring_c = self.awake_c = 0.0
            self.running_c = self.running_whole_c = 0.0

    def surely_within(self, online_c: float, online_m: float, margins: Margins) -> bool:
        """Whether online usage ``online_c``/``online_m`` plus the slices here surely fit
        capacity minus the margin: whether :func:`~ebbtide.scheduling.capacity.overflow`
        surely returns (0, 0).  Memory is exact (whole MiB add up without rounding);
        compute errs on "not sure" by :data:`SUM_SLACK` (its sums here are running ones)."""
        if online_m + self.gpu_m - (self.memory_mib - margins.memory_mib) > 0:
            return False
        return online_c + self.awake_c - (DEVICE_COMPUTE_PCT - margins.compute_pct) <= -SUM_SLACK


@dataclass(eq=False)
class SimJobState:
    id: int
    spec: SimJob
    submitted_at: float
    #: progress saved by the last checkpoint, in seconds at the full slice
    progress_s: float = 0.0
    attempts: int = 0
    #: evictions counted against it (the live outcome policy's count: backoff)
    evictions: int = 0
    #: when it was last requeued (its backoff counts from then)
    requeued_at: float | None = None

    def queued(self, declare_checkpoint: bool = False) -> QueuedJob:
        """The job as the planner sees it; ``declare_checkpoint``: it declares when it
        first checkpoints (its interval, or its whole run when shorter), as jobs do under
        a policy file whose windows close."""
        s = self.spec
        return QueuedJob(
            id=self.id,
            priority=0,
            queue="default",
            owner="sim",
            compute_pct=s.compute_pct,
            gpus=s.gpus,
            memory_mib=s.memory_mib,
            array_id=None,
            array_limit=None,
            attempts=self.attempts,
            deadline_s=s.deadline_s,
            first_checkpoint_s=min(s.ckpt_interval_s, s.work_s) if declare_checkpoint else None,
            requeued_at=self.requeued_at,
            evictions=self.evictions,
        )


@dataclass(eq=False)
class SimAttempt:
    job: SimJobState
    number: int
    dev: SimDevice
    dispatched_at: float
    #: when progress can begin (process started, checkpoint restored)
    run_from: float
    progress_s: float
    saved_s: float
    phase: int = STARTING
    updated_at: float = 0.0
    rate: float = 1.0
    #: seconds of running since the last checkpoint
    since_ckpt_s: float = 0.0
    last_ckpt_at: float | None = None
    ckpt_progress_s: float = 0.0
    ckpt_end: float = 0.0
    #: bumped whenever a scheduled transition of this attempt becomes stale
    version: int = 0
    holds_compute: bool = False
    view: ActiveAttempt | None = None
    #: when its process is up (the end of ``STARTING``; ``RESTORING`` follows until
    #: ``run_from`` for a resumed attempt); None: at ``run_from``
    up_at: float | None = None
    #: when it was paused (frozen in place); None: not paused
    paused_at: float | None = None
    #: the victim policy may pause it rather than evict it for compute
    pausable: bool = False
    #: when it was suspended to host (its CUDA state moved off the GPU); None: not
    suspended_at: float | None = None
    #: its slice's memory is on the GPU (False once a suspension's copy to host is done)
    on_gpu: bool = True
    #: being restored from host: its memory is back, it runs once the copy is done
    restoring_state: bool = False
    #: a copy of its memory to or from host runs until then (the agent waits for it)
    toggle_until: float = 0.0
    #: evicted for online pressure: its device cools down once its slice is free
    pressure: bool = False
    #: why it is being evicted (None: its device left, or a fixed window closed)
    reason: EvictReason | None = None
    #: killed at its eviction's deadline
    killed: bool = False
    #: its first view: later views copy it with what changed (see :func:`_with`)
    _view_base: ActiveAttempt | None = field(default=None, repr=False)

    def active_view(self, checkpoint_aware: bool) -> ActiveAttempt:
        """The attempt as the planner and the victim policy see it (cached)."""
        if self.view is None:
            if self.phase == EVICTING:
                state = JobState.EVICTING
            elif self.phase == STARTING:
                state = JobState.DISPATCHED
            else:
                state = JobState.RUNNING
            # the agent thaws what it evicts, a job suspended to host too (whose CUDA
            # calls block until it is killed): evicting, it shows as not paused
            paused_at = None if self.phase == EVICTING else self.paused_at
            last_ckpt_at = self.last_ckpt_at if checkpoint_aware else None
            base = self._view_base
            if base is None:
                s = self.job.spec
                self.view = self._view_base = ActiveAttempt(
                    job_id=self.job.id,
                    attempt=self.number,
                    state=state,
                    priority=0,
                    queue="default",
                    node=self.dev.node,
                    devices=(0,),
                    compute_pct=s.compute_pct,
                    memory_mib=s.memory_mib,
                    deadline_s=s.deadline_s,
                    signal=_SIGTERM,
                    dispatched_at=self.dispatched_at,
                    started_at=self.run_from,
                    last_checkpoint_at=last_ckpt_at,
                    gpus=s.gpus,
                    paused_at=paused_at,
                    pausable=self.pausable,
                    suspended_at=self.suspended_at,
                )
            else:  # only these change over an attempt's life
                self.view = _with(
                    base,
                    {
                        "state": state,
                        "started_at": self.run_from,
                        "last_checkpoint_at": last_ckpt_at,
                        "paused_at": paused_at,
                        "suspended_at": self.suspended_at,
                    },
                )
        return self.view

    def phase_end(self) -> float:
        """When the current timed phase ends (``STARTING``, ``RESTORING``,
        ``CHECKPOINTING``); for ``RUNNING``, its next transition."""
        if self.phase == STARTING:
            return self.run_from if self.up_at is None else self.up_at
        if self.phase == RESTORING:
            return self.run_from
        if self.phase == CHECKPOINTING:
            return self.ckpt_end
        return self.next_transition(self.updated_at)

    def thaw(self, now: float) -> None:
        """Run again after a pause: what was left of the current phase is left still."""
        assert self.paused_at is not None
        shift = now - self.paused_at
        self.paused_at = None
        if self.phase in (STARTING, RESTORING):
            self.run_from += shift
            if self.up_at is not None and self.phase == STARTING:
                self.up_at += shift
        elif self.phase == CHECKPOINTING:
            self.ckpt_end += shift
        self.updated_at = now
        self.view = None

    def advance(self, now: float) -> float:
        """Account progress up to ``now``; returns the progress made, in compute %-seconds."""
        made = 0.0
        if self.phase == RUNNING and self.paused_at is None and now > self.updated_at:
            dt = now - self.updated_at
            step = self.rate * dt
            self.progress_s += step
            self.since_ckpt_s += dt
            made = step * self.job.spec.compute_pct
        self.updated_at = now
        return made

    def next_transition(self, now: float) -> float:
        """When a running attempt next finishes or starts a checkpoint (inf: never)."""
        s = self.job.spec
        left = s.work_s - self.progress_s
        done = now + left / self.rate if self.rate > 0 else float("inf")
        ckpt = now + max(0.0, s.ckpt_interval_s - self.since_ckpt_s)
        return min(done, ckpt)

    @property
    def finished(self) -> bool:
        return self.progress_s >= self.job.spec.work_s - DONE_EPS_S


#: an attempt's view or a device's (see :func:`_with`)
_View = TypeVar("_View", ActiveAttempt, DeviceView)


def _with(view: _View, changes: dict[str, object]) -> _View:
    """``dataclasses.replace(view, **changes)`` without validating the fields again (a
    view is made again at every phase change, pause and checkpoint): the same object
    ``replace`` would return, in a fraction of the time."""
    copy = object.__new__(type(view))
    copy.__dict__.update(view.__dict__)
    copy.__dict__.update(changes)
    return copy
