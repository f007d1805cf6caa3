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

One pass over 100,000 queued jobs and 1,000 devices takes tens of milliseconds
(``benchmarks/plan_scale.py``): the best fit is found with an index of the devices' free
headroom (:class:`_FitIndex`) instead of a scan of every device, and it picks the very
device the scan (:func:`_best_fit_scan`) would, ties included.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from ebbtide.preemption.victims import Eviction, EvictReason, evictions_for_device
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, headroom
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, QueuedJob, Snapshot

#: Fit slack so float noise never refuses an exact fit, in percent or MiB.
_EPS = 1e-6
#: A whole-GPU job goes only where at least this much compute is free, in percent.
MIN_WHOLE_GPU_HEADROOM_PCT = 50.0
#: The fit index serves values of at most this magnitude (percent or MiB), where integers
#: and floats compute alike; anything larger, or not finite, falls back to the scan.
_INDEX_LIMIT = 2.0**50


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


@dataclass(eq=False)
class _Free:
    """What is left of one device during a pass (the admit phase spends it)."""

    device: DeviceView
    compute: float
    memory: float
    offline_slices: int
    #: the device's place in the snapshot: equal fits go to the earlier one
    pos: int = 0


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
        here = by_device.get(device.key)
        if not here:
            continue  # no slice to take back
        for ev in evictions_for_device(device, here, snapshot.margins, now):
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
    for pos, f in enumerate(free.values()):
        f.pos = pos
    by_node: dict[str, list[_Free]] = {}
    for f in free.values():
        by_node.setdefault(f.device.node, []).append(f)

    running_per_array = Counter(a.array_id for a in snapshot.active if a.array_id is not None)

    # 3. nominate, 4. admit
    index = _FitIndex(free.values())
    misfits: set[tuple[float, int, int]] = set()
    dispatches = out.dispatches
    for job in _nominated(snapshot.queued):
        if len(dispatches) >= snapshot.max_dispatches:
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
        if job.gpus >= 1:
            placed = _place_whole(job, by_node, index)
        else:
            placed = _place_fraction(job, free, index)
        if placed is None:
            misfits.add(shape)
            continue
        node, devices = placed
        dispatches.append(
            Dispatch(job.id, job.attempts, node, devices, job.compute_pct, job.memory_mib)
        )
        if job.array_id is not None:
            running_per_array[job.array_id] += 1
    return out


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
    job: QueuedJob, free: dict[tuple[str, int], _Free], index: _FitIndex
) -> tuple[str, tuple[int, ...]] | None:
    best = index.best_fit(job) if index.serves(job) else _best_fit_scan(job, free.values())
    if best is None:
        return None
    best.compute -= job.compute_pct
    best.memory -= job.memory_mib
    best.offline_slices += 1
    index.refile(best)
    return best.device.node, (best.device.index,)


def _fits(f: _Free, job: QueuedJob) -> bool:
    return not (f.compute + _EPS < job.compute_pct or f.memory + _EPS < job.memory_mib)


def _score(f: _Free, job: QueuedJob) -> float:
    """Headroom left over on ``f`` after ``job``: compute and memory, each as a fraction of
    the device (lower is a tighter fit)."""
    compute_left = (f.compute - job.compute_pct) / DEVICE_COMPUTE_PCT
    memory_left = (f.memory - job.memory_mib) / max(f.device.memory_mib, 1.0)
    return compute_left + memory_left


def _best_fit_scan(job: QueuedJob, frees: Iterable[_Free]) -> _Free | None:
    """The definition of best fit: the lowest score; among equal scores, the first device."""
    best: _Free | None = None
    best_score = 0.0
    for f in frees:
        if not _fits(f, job):
            continue
        score = _score(f, job)
        if best is None or score < best_score:
            best, best_score = f, score
    return best


def _indexable(value: float) -> bool:
    """Finite and within :data:`_INDEX_LIMIT` (false for NaN; never converts an int)."""
    return -_INDEX_LIMIT <= value <= _INDEX_LIMIT


@dataclass
class _Shelf:
    """The devices of one memory divisor (``max(memory_mib, 1)``, the score's)."""

    divisor: float
    #: free memory of every device on the shelf, ascending, in MiB
    memory: list[float] = field(default_factory=list)
    #: whole percent of free compute → (free memory ascending, the devices in that order)
    buckets: dict[int, tuple[list[float], list[_Free]]] = field(default_factory=dict)
    #: the buckets' keys, ascending
    keys: list[int] = field(default_factory=list)


class _FitIndex:
    """Finds the device :func:`_best_fit_scan` picks for a fractional job, without the scan.

    Devices sit on a shelf per memory divisor (one or two in a real cluster), in buckets by
    whole percent of free compute, each bucket sorted by free memory.  A query walks a
    shelf's buckets from the job's compute upward and, in each, the devices from the least
    free memory that fits upward, and stops as soon as a lower bound on every score still
    ahead exceeds the best score found.  A bound is the score's own expression on smaller
    inputs (the bucket's floor for compute, a smaller free memory); rounding is monotone,
    so a bound never exceeds the score it bounds and no device that could win or tie is
    passed over.  Scores are computed exactly as the scan computes them, and an equal
    score goes to the earlier device in snapshot order, as in the scan.

    Every change to a :class:`_Free` must be followed by :meth:`refile`.  Should a value
    leave the range where the bounds are exact (:data:`_INDEX_LIMIT`, finite), the index
    stops serving and the planner scans.
    """

    def __init__(self, frees: Iterable[_Free]) -> None:
        self.usable = True
        self._shelves: dict[float, _Shelf] = {}
        #: where each device is filed (by pos): its shelf, bucket and free memory
        self._filed: dict[int, tuple[_Shelf, int, float]] = {}
        for f in frees:
            self._file(f)

    def serves(self, job: QueuedJob) -> bool:
        return self.usable and _indexable(job.compute_pct) and _indexable(job.memory_mib)

    def refile(self, f: _Free) -> None:
        """Move ``f`` to where its new headroom belongs."""
        if not self.usable:
            return
        shelf, bucket, memory = self._filed.pop(f.pos)
        del shelf.memory[bisect_left(shelf.memory, memory)]
        mems, frees = shelf.buckets[bucket]
        i = bisect_left(mems, memory)
        while frees[i] is not f:  # among equal memory
            i += 1
        del mems[i], frees[i]
        if not mems:
            del shelf.buckets[bucket]
            del shelf.keys[bisect_left(shelf.keys, bucket)]
        self._file(f)

    def _file(self, f: _Free) -> None:
        divisor = max(f.device.memory_mib, 1.0)
        if not (_indexable(f.compute) and _indexable(f.memory) and _indexable(divisor)):
            self.usable = False
            return
        shelf = self._shelves.get(divisor)
        if shelf is None:
            shelf = self._shelves[divisor] = _Shelf(divisor)
        bucket = math.floor(f.compute)
        insort(shelf.memory, f.memory)
        if bucket not in shelf.buckets:
            shelf.buckets[bucket] = ([], [])
            insort(shelf.keys, bucket)
        mems, frees = shelf.buckets[bucket]
        i = bisect_right(mems, f.memory)
        mems.insert(i, f.memory)
        frees.insert(i, f)
        self._filed[f.pos] = (shelf, bucket, f.memory)

    def best_fit(self, job: QueuedJob) -> _Free | None:
        c, m = job.compute_pct, job.memory_mib
        best: _Free | None = None
        best_score = 0.0
        for shelf in self._shelves.values():
            first = _first_fit(shelf.memory, m)
            if first == len(shelf.memory):
                continue  # no device on this shelf has the memory
            divisor = shelf.divisor
            # every device that fits has at least this memory term
            memory_bound = (shelf.memory[first] - m) / divisor
            keys = shelf.keys
            # a device that fits has compute > c - 1 (the slack is 1e-6), so floor ≥ this
            for k in range(bisect_left(keys, math.floor(c) - 1), len(keys)):
                bucket = keys[k]
                # every device in this bucket and above has at least this compute term
                compute_bound = (bucket - c) / DEVICE_COMPUTE_PCT
                if best is not None and compute_bound + memory_bound > best_score:
                    break
                mems, frees = shelf.buckets[bucket]
                if mems[-1] + _EPS < m:
                    continue  # no device in this bucket has the memory
                if best is not None and compute_bound + (mems[0] - m) / divisor > best_score:
                    continue  # every device in this bucket has at least mems[0]
                for i in range(_first_fit(mems, m), len(mems)):
                    if best is not None and compute_bound + (mems[i] - m) / divisor > best_score:
                        break  # and so would every later device of this bucket
                    f = frees[i]
                    if f.compute + _EPS < c:
                        continue
                    score = _score(f, job)
                    if (
                        best is None
                        or score < best_score
                        or (score == best_score and f.pos < best.pos)
                    ):
                        best, best_score = f, score
        return best


def _first_fit(memory: list[float], need: float) -> int:
    """Index of the first value in ascending ``memory`` that fits ``need`` (as in
    :func:`_fits`); ``len(memory)`` when none does."""
    i = bisect_left(memory, need - _EPS)
    while i > 0 and memory[i - 1] + _EPS >= need:
        i -= 1
    while i < len(memory) and memory[i] + _EPS < need:
        i += 1
    return i


def _place_whole(
    job: QueuedJob, by_node: dict[str, list[_Free]], index: _FitIndex
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
        index.refile(f)
    return best[0].device.node, tuple(sorted(f.device.index for f in best))
