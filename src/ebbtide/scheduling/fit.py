"""Best fit of a fractional slice: the definition (a scan) and a fast index that agrees.

:func:`best_fit_scan` is the definition: among the devices whose free headroom covers
the job (within :data:`EPS`), the one with the lowest :func:`fit_score`; among equal scores,
the earlier device in snapshot order.  :class:`FitIndex` finds the same device without
scanning every device (``benchmarks/plan_scale.py``; ``tests/unit/test_planner_equivalence.py``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable
from dataclasses import dataclass, field

from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT
from ebbtide.scheduling.snapshot import DeviceView, QueuedJob

#: Fit slack so float noise never refuses an exact fit, in percent or MiB.
EPS = 1e-6
#: The fit index serves values of at most this magnitude (percent or MiB), where integers
#: and floats compute alike; anything larger, or not finite, falls back to the scan.
INDEX_LIMIT = 2.0**50


@dataclass(eq=False)
class Free:
    """What is left of one device during a pass (the admit phase spends it)."""

    device: DeviceView
    compute: float
    memory: float
    offline_slices: int
    #: the device's place in the snapshot: equal fits go to the earlier one
    pos: int = 0
    #: offline compute (percent) and memory (MiB) held on the device, new slices included
    alloc_compute: float = 0.0
    alloc_memory: float = 0.0


def fits(f: Free, job: QueuedJob) -> bool:
    return not (f.compute + EPS < job.compute_pct or f.memory + EPS < job.memory_mib)


def fit_score(f: Free, job: QueuedJob) -> float:
    """Headroom left over on ``f`` after ``job``: compute and memory, each as a fraction of
    the device (lower is a tighter fit)."""
    compute_left = (f.compute - job.compute_pct) / DEVICE_COMPUTE_PCT
    memory_left = (f.memory - job.memory_mib) / max(f.device.memory_mib, 1.0)
    return compute_left + memory_left


def best_fit_scan(job: QueuedJob, frees: Iterable[Free]) -> Free | None:
    """The definition of best fit: the lowest score; among equal scores, the first device."""
    best: Free | None = None
    best_score = 0.0
    for f in frees:
        if not fits(f, job):
            continue
        score = fit_score(f, job)
        if best is None or score < best_score:
            best, best_score = f, score
    return best


def indexable(value: float) -> bool:
    """Finite and within :data:`INDEX_LIMIT` (false for NaN; never converts an int)."""
    return -INDEX_LIMIT <= value <= INDEX_LIMIT


@dataclass
class Shelf:
    """The devices of one memory divisor (``max(memory_mib, 1)``, the score's)."""

    divisor: float
    #: free memory of every device on the shelf, ascending, in MiB
    memory: list[float] = field(default_factory=list)
    #: whole percent of free compute → (free memory ascending, the devices in that order)
    buckets: dict[int, tuple[list[float], list[Free]]] = field(default_factory=dict)
    #: the buckets' keys, ascending
    keys: list[int] = field(default_factory=list)


class FitIndex:
    """Finds the device :func:`best_fit_scan` picks for a fractional job, without the scan.

    Devices sit on a shelf per memory divisor (one or two in a real cluster), in buckets by
    whole percent of free compute, each bucket sorted by free memory.  A query walks a
    shelf's buckets from the job's compute upward and, in each, the devices from the least
    free memory that fits upward, and stops as soon as a lower bound on every score still
    ahead exceeds the best score found.  A bound is the score's own expression on smaller
    inputs (the bucket's floor for compute, a smaller free memory); rounding is monotone,
    so a bound never exceeds the score it bounds and no device that could win or tie is
    passed over.  Scores are computed exactly as the scan computes them, and an equal
    score goes to the earlier device in snapshot order, as in the scan.

    Every change to a :class:`Free` must be followed by :meth:`refile`.  Should a value
    leave the range where the bounds are exact (:data:`INDEX_LIMIT`, finite), the index
    stops serving and the planner scans.
    """

    def __init__(self, frees: Iterable[Free]) -> None:
        self.usable = True
        self._shelves: dict[float, Shelf] = {}
        #: where each device is filed (by pos): its shelf, bucket and free memory
        self._filed: dict[int, tuple[Shelf, int, float]] = {}
        for f in frees:
            self._file(f)

    def serves(self, job: QueuedJob) -> bool:
        return self.usable and indexable(job.compute_pct) and indexable(job.memory_mib)

    def refile(self, f: Free) -> None:
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

    def _file(self, f: Free) -> None:
        divisor = max(f.device.memory_mib, 1.0)
        if not (indexable(f.compute) and indexable(f.memory) and indexable(divisor)):
            self.usable = False
            return
        shelf = self._shelves.get(divisor)
        if shelf is None:
            shelf = self._shelves[divisor] = Shelf(divisor)
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

    def best_fit(self, job: QueuedJob) -> Free | None:
        c, m = job.compute_pct, job.memory_mib
        best: Free | None = None
        best_score = 0.0
        for shelf in self._shelves.values():
            first = first_fit(shelf.memory, m)
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
                if mems[-1] + EPS < m:
                    continue  # no device in this bucket has the memory
                if best is not None and compute_bound + (mems[0] - m) / divisor > best_score:
                    continue  # every device in this bucket has at least mems[0]
                for i in range(first_fit(mems, m), len(mems)):
                    if best is not None and compute_bound + (mems[i] - m) / divisor > best_score:
                        break  # and so would every later device of this bucket
                    f = frees[i]
                    if f.compute + EPS < c:
                        continue
                    score = fit_score(f, job)
                    if (
                        best is None
                        or score < best_score
                        or (score == best_score and f.pos < best.pos)
                    ):
                        best, best_score = f, score
        return best


def first_fit(memory: list[float], need: float) -> int:
    """Index of the first value in ascending ``memory`` that fits ``need`` (as in
    :func:`fits`); ``len(memory)`` when none does."""
    i = bisect_left(memory, need - EPS)
    while i > 0 and memory[i - 1] + EPS >= need:
        i -= 1
    while i < len(memory) and memory[i] + EPS < need:
        i += 1
    return i
