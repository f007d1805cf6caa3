"""The planner: snapshot → decisions.  Pure: no clock reads, no I/O.

One pass reads as numbered phases (after kueue's scheduling cycle):

1. **evict**: on every device where online usage plus offline slices exceed capacity
   minus the margin, pick victims with :mod:`ebbtide.preemption.victims` (not on figures
   from a planning-only source); also evict attempts whose cancellation was asked for.
2. **account**: headroom per device = capacity − online − expected growth − margin −
   offline slices (slices being evicted still count until they are free); none on a
   device that is out of service or drained.
3. **nominate**: queued jobs in order — priority (high first), then submission order
   (a requeued job keeps its place ahead of later submissions of its priority).
4. **admit**: each job goes to the device that fits it best (least headroom left over,
   compute and memory together, each as a fraction of the device); a job that fits
   nowhere is skipped, and so is every later job of the same shape.  Never into
   headroom that does not cover the slice plus the margin.

One pass over 100,000 queued jobs and 1,000 devices takes tens of milliseconds
(``benchmarks/plan_scale.py``): the best fit is found with an index of the devices' free
headroom (:class:`FitIndex`) instead of a scan of every device, and it picks the very
device the scan (:func:`best_fit_scan`) would, ties included.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from ebbtide.preemption.relief import ActionKind, relief_for_device
from ebbtide.preemption.victims import Eviction, EvictReason
from ebbtide.scheduling import fit
from ebbtide.scheduling.admission import (
    MAX_REASONS,
    Quotas,
    clock_text,
    device_share,
    drain_evictions,
    fits_before_close,
    ready_at,
    share_evictions,
    unplaced_reason,
)
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, allocated, headroom
from ebbtide.scheduling.fit import EPS, FitIndex, Free
from ebbtide.scheduling.snapshot import ActiveAttempt, QueuedJob, Snapshot, protected
from ebbtide.scheduling.windows import QueueGate

#: A whole-GPU job goes only where at least this much compute is free, in percent.
MIN_WHOLE_GPU_HEADROOM_PCT = 50.0


@dataclass(frozen=True)
class Dispatch:
    """A decision to start ``job_id`` on a slice."""

    job_id: int
    #: the job's attempt count seen in the snapshot; the store fences on it
    expected_attempts: int
    node: str
    devices: tuple[int, ...]
    compute_pct: float
    memory_mib: int


@dataclass
class Plan:
    dispatches: list[Dispatch] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    #: why queued jobs were not started this pass (a window, a quota, a backoff, no room)
    blocked: dict[int, str] = field(default_factory=dict)
    #: the next instant (Unix seconds) at which time alone changes a decision: a drain
    #: before a window closes, a backoff or a cooldown ending; None when nothing waits
    wake_at: float | None = None


def plan(snapshot: Snapshot) -> Plan:
    out = Plan()
    now = snapshot.now
    limits = snapshot.queues
    wakes: list[float] = []

    def guarded(a: ActiveAttempt) -> bool:
        return protected(a, limits.get(a.queue), now)

    # 1. evict: online pressure, cancellations, windows closing, shares exceeded
    by_device: dict[tuple[str, int], list[ActiveAttempt]] = {}
    for a in snapshot.active:
        for d in a.devices:
            by_device.setdefault((a.node, d), []).append(a)
    chosen: set[tuple[int, int]] = set()
    for device in snapshot.devices:
        here = by_device.get(device.key)
        if not here or device.planning_only:
            continue  # no slice to take back, or figures too old to evict on
        for r in relief_for_device(device, here, snapshot.margins, now, snapshot.pause, guarded):
            # a pause is the node agent's to make (it freezes the attempt in place); the
            # scheduler evicts only what a pause cannot relieve
            if r.kind is ActionKind.EVICT and (r.job_id, r.attempt) not in chosen:
                chosen.add((r.job_id, r.attempt))
                out.evictions.append(
                    Eviction(r.job_id, r.attempt, r.node, r.reason, r.deadline_s, r.message)
                )
    for a in snapshot.active:
        if a.cancel_requested and not a.evicting and (a.job_id, a.attempt) not in chosen:
            chosen.add((a.job_id, a.attempt))
            out.evictions.append(
                Eviction(
                    a.job_id,
                    a.attempt,
                    a.node,
                    EvictReason.CANCELLED,
                    a.deadline_s,
                    "cancelled by its owner",
                )
            )
    drains, later = drain_evictions(snapshot, chosen)
    out.evictions += drains
    wakes += later
    out.evictions += share_evictions(snapshot, by_device, chosen)

    if not snapshot.offline_allowed:
        out.wake_at = _next(wakes, now)
        return out

    # 2. account
    gates = snapshot.gates
    free: dict[tuple[str, int], Free] = {}
    for device in snapshot.devices:
        here = by_device.get(device.key, [])
        alloc_c, alloc_m = allocated(device, here)
        c, m = headroom(device, alloc_c, alloc_m, snapshot.margins)
        # a device under pressure (an eviction decided now or still in flight) takes
        # nothing new until its slices are free; nor does one cooling down after one
        if any(a.evicting or (a.job_id, a.attempt) in chosen for a in here):
            c = m = 0.0
        if device.cooldown_until > now:
            c = m = 0.0
            wakes.append(device.cooldown_until)
        if device.unavailable:
            c = m = 0.0  # out of service (a fault) or drained by an admin
        if gates is not None:
            share = device_share(gates.get(device.key))
            c = min(c, share * DEVICE_COMPUTE_PCT - alloc_c)
            m = min(m, share * device.memory_mib - alloc_m)
        free[device.key] = Free(
            device, c, m, len(here), alloc_compute=alloc_c, alloc_memory=alloc_m
        )
    for pos, f in enumerate(free.values()):
        f.pos = pos
    by_node: dict[str, list[Free]] = {}
    for f in free.values():
        by_node.setdefault(f.device.node, []).append(f)

    running_per_array = Counter(a.array_id for a in snapshot.active if a.array_id is not None)
    quotas = Quotas(limits, snapshot.active, len(snapshot.devices)) if limits else None
    lanes = _Lanes(snapshot, free) if gates is not None else None

    def refuse(job: QueuedJob, why: str) -> None:
        if len(out.blocked) < MAX_REASONS:
            out.blocked[job.id] = why

    # 3. nominate, 4. admit
    index = FitIndex(free.values())
    misfits: dict[tuple[object, ...], str] = {}
    dispatches = out.dispatches
    for job in _nominated(snapshot.queued):
        if len(dispatches) >= snapshot.max_dispatches:
            break
        shape: tuple[object, ...] = (job.compute_pct, job.memory_mib, job.gpus)
        if lanes is not None:
            shape += (job.queue, job.first_checkpoint_s, job.deadline_s)
        if shape in misfits:
            refuse(job, misfits[shape])
            continue
        if (
            job.array_id is not None
            and job.array_limit is not None
            and running_per_array[job.array_id] >= job.array_limit
        ):
            refuse(job, f"array limit: {job.array_limit} of its array already running")
            continue
        if job.evictions >= 2 and (until := ready_at(job, snapshot)) > now:
            refuse(job, f"backoff: evicted {job.evictions} times; not before {clock_text(until)}")
            wakes.append(until)
            continue
        if quotas is not None and (why := quotas.refusal(job)) is not None:
            refuse(job, why)
            continue
        if job.gpus >= 1:
            allowed = lanes.allows(job) if lanes is not None else None
            placed = _place_whole(job, by_node, index, allowed)
        elif lanes is not None and not lanes.plain(job):
            placed = _place_gated(job, lanes, index)
        else:
            placed = _place_fraction(job, free, index)
        if placed is None:
            misfits[shape] = unplaced_reason(job, snapshot, snapshot.devices)
            refuse(job, misfits[shape])
            continue
        node, devices = placed
        dispatches.append(
            Dispatch(job.id, job.attempts, node, devices, job.compute_pct, job.memory_mib)
        )
        if job.array_id is not None:
            running_per_array[job.array_id] += 1
        if quotas is not None:
            quotas.take(job)
    out.wake_at = _next(wakes, now)
    return out


def _next(times: list[float], now: float) -> float | None:
    return min((t for t in times if t > now), default=None)


class _Lanes:
    """Which devices take a queue under the open windows, and on what terms."""

    def __init__(self, snapshot: Snapshot, free: dict[tuple[str, int], Free]) -> None:
        assert snapshot.gates is not None
        self.now = snapshot.now
        self._gates = snapshot.gates
        self._free = free
        self._lanes: dict[str, list[tuple[Free, QueueGate]]] = {}
        self._plain: dict[str, bool] = {}

    def lane(self, queue: str) -> list[tuple[Free, QueueGate]]:
        if queue not in self._lanes:
            lane = []
            for key, f in self._free.items():
                g = self._gates.get(key)
                q = g.open.get(queue) if g is not None else None
                if q is not None:
                    lane.append((f, q))
            self._lanes[queue] = lane
            # every device, no close and the device's own share: the fit index serves it
            self._plain[queue] = len(lane) == len(self._free) and all(
                math.isinf(q.open_until) and q.share >= device_share(self._gates.get(f.device.key))
                for f, q in lane
            )
        return self._lanes[queue]

    def plain(self, job: QueuedJob) -> bool:
        self.lane(job.queue)
        return self._plain[job.queue]

    def allows(self, job: QueuedJob) -> Callable[[Free], bool]:
        ok = {
            f.pos
            for f, q in self.lane(job.queue)
            if fits_before_close(job, q.open_until, self.now) and _within_share(f, q, job)
        }
        return lambda f: f.pos in ok


def _within_share(f: Free, q: QueueGate, job: QueuedJob) -> bool:
    """The queue's own share on the device (tighter than the device's, when windows
    admitting other queues allow more)."""
    return (
        f.alloc_compute + job.compute_pct <= q.share * DEVICE_COMPUTE_PCT + EPS
        and f.alloc_memory + job.memory_mib <= q.share * f.device.memory_mib + EPS
    )


def _place_gated(
    job: QueuedJob, lanes: _Lanes, index: FitIndex
) -> tuple[str, tuple[int, ...]] | None:
    now = lanes.now
    cands = [
        f
        for f, q in lanes.lane(job.queue)
        if fits_before_close(job, q.open_until, now) and _within_share(f, q, job)
    ]
    best = fit.best_fit_scan(job, cands)
    if best is None:
        return None
    _spend(best, job, index)
    return best.device.node, (best.device.index,)


def _spend(f: Free, job: QueuedJob, index: FitIndex) -> None:
    f.compute -= job.compute_pct
    f.memory -= job.memory_mib
    f.alloc_compute += job.compute_pct
    f.alloc_memory += job.memory_mib
    f.offline_slices += 1
    index.refile(f)


def _nominated(queued: Iterable[QueuedJob]) -> list[QueuedJob]:
    """``queued`` by priority (high first), then submission order (a requeued job keeps
    its id); jobs equal in both keep their given order.

    Two stable sorts on plain attributes (id, then priority descending, which keeps the id
    order among equal priorities) give the same list as one sort on ``(-priority, id)``,
    faster: no key tuple per job.  Timsort is linear on the store's already ordered list.
    """
    by_id = sorted(queued, key=attrgetter("id"))
    return sorted(by_id, key=attrgetter("priority"), reverse=True)


def _place_fraction(
    job: QueuedJob, free: dict[tuple[str, int], Free], index: FitIndex
) -> tuple[str, tuple[int, ...]] | None:
    best = index.best_fit(job) if index.serves(job) else fit.best_fit_scan(job, free.values())
    if best is None:
        return None
    _spend(best, job, index)
    return best.device.node, (best.device.index,)


def _place_whole(
    job: QueuedJob,
    by_node: dict[str, list[Free]],
    index: FitIndex,
    allowed: Callable[[Free], bool] | None = None,
) -> tuple[str, tuple[int, ...]] | None:
    """``gpus`` devices on one node with no offline slice, each with compute headroom of at
    least :data:`MIN_WHOLE_GPU_HEADROOM_PCT`; the job then holds all of that headroom."""
    best: list[Free] | None = None
    best_score = 0.0
    for frees in by_node.values():
        fit = [
            f
            for f in frees
            if f.offline_slices == 0
            and (allowed is None or allowed(f))
            and f.compute + EPS >= MIN_WHOLE_GPU_HEADROOM_PCT
            and f.memory + EPS >= job.memory_mib
        ]
        if len(fit) < job.gpus:
            continue
        fit.sort(key=lambda f: (f.memory, f.device.index))
        pick = fit[: job.gpus]
        score = sum(f.memory - job.memory_mib for f in pick)
        if best is None or score < best_score:
            best, best_score = pick, score
    if best is None:
        return None
    for f in best:
        f.compute = 0.0
        f.memory -= job.memory_mib
        f.alloc_compute += DEVICE_COMPUTE_PCT
        f.alloc_memory += job.memory_mib
        f.offline_slices += 1
        index.refile(f)
    return best[0].device.node, tuple(sorted(f.device.index for f in best))
