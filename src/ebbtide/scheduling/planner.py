"""The planner: snapshot → decisions.  Pure: no clock reads, no I/O.

One pass reads as numbered phases (after kueue's scheduling cycle):

1. **evict**: on every device where online usage plus offline slices exceed capacity
   minus the margin, pick victims with :mod:`ebbtide.preemption.victims`; also evict
   attempts whose cancellation was asked for.
2. **account**: headroom per device = capacity − online − expected growth − margin −
   offline slices (slices being evicted still count until they are free).
3. **nominate**: queued jobs in order — priority (high first), then submission order
   (a requeued job keeps its place ahead of later submissions of its priority).
4. **admit**: each job goes to the device that fits it best (least headroom left over,
   compute and memory together, each as a fraction of the device); a job that fits
   nowhere is skipped, and so is every later job of the same shape.  Never into
   headroom that does not cover the slice plus the margin.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ebbtide.preemption.victims import Eviction, EvictReason, evictions_for_device
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, headroom
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, QueuedJob, Snapshot

#: Fit slack so float noise never refuses an exact fit, in percent or MiB.
_EPS = 1e-6
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


@dataclass
class _Free:
    device: DeviceView
    compute: float
    memory: float
    offline_slices: int


def plan(snapshot: Snapshot) -> Plan:
    out = Plan()
    now = snapshot.now

    # 1. evict
    by_device: dict[tuple[str, int], list[ActiveAttempt]] = {}
    for a in snapshot.active:
        for d in a.devices:
            by_device.setdefault((a.node, d), []).append(a)
    chosen: set[tuple[int, int]] = set()
    for device in snapshot.devices:
        for ev in evictions_for_device(
            device, by_device.get(device.key, []), snapshot.margins, now
        ):
            if (ev.job_id, ev.attempt) not in chosen:
                chosen.add((ev.job_id, ev.attempt))
                out.evictions.append(ev)
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

    if not snapshot.offline_allowed:
        return out

    # 2. account
    free: dict[tuple[str, int], _Free] = {}
    for device in snapshot.devices:
        here = by_device.get(device.key, [])
        alloc_c = sum(a.compute_pct for a in here)
        alloc_m = sum(a.memory_mib for a in here)
        c, m = headroom(device, alloc_c, alloc_m, snapshot.margins)
        # a device under pressure (an eviction decided now or still in flight) takes
        # nothing new until its slices are free
        if any(a.evicting or (a.job_id, a.attempt) in chosen for a in here):
            c = m = 0.0
        free[device.key] = _Free(device, c, m, len(here))
    by_node: dict[str, list[_Free]] = {}
    for f in free.values():
        by_node.setdefault(f.device.node, []).append(f)

    running_per_array = Counter(a.array_id for a in snapshot.active if a.array_id is not None)

    # 3. nominate, 4. admit
    misfits: set[tuple[float, int, int]] = set()
    # timsort is linear on the store's already-ordered list
    for job in sorted(snapshot.queued, key=_nomination_key):
        if len(out.dispatches) >= snapshot.max_dispatches:
            break
        shape = (job.compute_pct, job.memory_mib, job.gpus)
        if shape in misfits:
            continue
        if (
            job.array_id is not None
            and job.array_limit is not None
            and running_per_array[job.array_id] >= job.array_limit
        ):
            continue
        placed = _place_whole(job, by_node) if job.gpus >= 1 else _place_fraction(job, free)
        if placed is None:
            misfits.add(shape)
            continue
        node, devices = placed
        out.dispatches.append(
            Dispatch(job.id, job.attempts, node, devices, job.compute_pct, job.memory_mib)
        )
        if job.array_id is not None:
            running_per_array[job.array_id] += 1
    return out


def _nomination_key(job: QueuedJob) -> tuple[int, int]:
    """Priority (high first), then submission order: a requeued job keeps its id."""
    return (-job.priority, job.id)


def _place_fraction(
    job: QueuedJob, free: dict[tuple[str, int], _Free]
) -> tuple[str, tuple[int, ...]] | None:
    best: _Free | None = None
    best_score = 0.0
    for f in free.values():
        if f.compute + _EPS < job.compute_pct or f.memory + _EPS < job.memory_mib:
            continue
        score = (f.compute - job.compute_pct) / DEVICE_COMPUTE_PCT + (
            f.memory - job.memory_mib
        ) / max(f.device.memory_mib, 1.0)
        if best is None or score < best_score:
            best, best_score = f, score
    if best is None:
        return None
    best.compute -= job.compute_pct
    best.memory -= job.memory_mib
    best.offline_slices += 1
    return best.device.node, (best.device.index,)


def _place_whole(
    job: QueuedJob, by_node: dict[str, list[_Free]]
) -> tuple[str, tuple[int, ...]] | None:
    """``gpus`` devices on one node with no offline slice, each with compute headroom of at
    least :data:`MIN_WHOLE_GPU_HEADROOM_PCT`; the job then holds all of that headroom."""
    best: list[_Free] | None = None
    best_score = 0.0
    for frees in by_node.values():
        fit = [
            f
            for f in frees
            if f.offline_slices == 0
            and f.compute + _EPS >= MIN_WHOLE_GPU_HEADROOM_PCT
            and f.memory + _EPS >= job.memory_mib
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
        f.offline_slices += 1
    return best[0].device.node, tuple(sorted(f.device.index for f in best))
