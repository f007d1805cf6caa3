"""Best fit of a slice: the definitions (scans) and fast indexes that agree.

:func:`best_fit_scan` is the definition for a fractional slice: among the devices whose
free headroom covers the job (within :data:`EPS`), the one with the lowest
:func:`fit_score`; among equal scores, the earlier device in snapshot order.
:class:`FitIndex` finds the same device without scanning every device.  A whole-GPU job
goes to the node whose :func:`whole_pick` leaves the least memory over, the first node
among equals; :class:`WholeFit` finds it without scoring every node each time
(``benchmarks/plan_scale.py``; ``tests/unit/test_planner_equivalence.py``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from operator import attrgetter

from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT
from ebbtide.scheduling.snapshot import DeviceView, QueuedJob

#: Fit slack so float noise never refuses an exact fit, in percent or MiB.
EPS = 1e-6
#: A whole-GPU job goes only where at least this much compute is free, in percent.
MIN_WHOLE_GPU_HEADROOM_PCT = 50.0
#: The fit index serves values of at most this magnitude (percent or MiB), where integers
#: and floats compute alike; anything larger, or not finite, falls back to the scan.
INDEX_LIMIT = 2.0**50


@dataclass(eq=False, slots=True)
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


@dataclass(slots=True)
class Bucket:
    """The devices of one whole percent of free compute on a shelf."""

    #: their free memory, ascending, in MiB
    mems: list[float]
    #: the devices, in that order
    frees: list[Free]
    #: at least the free compute of each, in percent (the most any had when filed here)
    top: float


@dataclass
class Shelf:
    """The devices of one memory divisor (``max(memory_mib, 1)``, the score's)."""

    divisor: float
    #: whole percent of free compute → its bucket
    buckets: dict[int, Bucket] = field(default_factory=dict)
    #: the buckets' keys, ascending
    keys: list[int] = field(default_factory=list)


#: A shape's second search and later ones keep this many best fits, so that the next jobs
#: of the shape (an array's tasks) are placed without a search of their own while they last.
PICKS = 16
#: Beyond this many devices refiled since a shape's last search, search again.
MAX_REFILED_SINCE = 64


@dataclass(slots=True)
class Picks:
    """A shape's best fits as of its last search, for the next job of that shape.

    Every device that is not in ``best`` and has not been refiled since ``seen`` either
    does not fit or has a higher ``(score, pos)`` than ``bound``: its score is what it
    was, and it was passed over.  So the best fit now is the best of ``best`` without
    the devices refiled since and of those devices as they are now, when that one is
    within ``bound``; otherwise a search tells.
    """

    #: (score, pos, device), ascending
    best: list[tuple[float, int, Free]]
    bound: tuple[float, int]
    #: how many refiles the index had made then
    seen: int
    #: every device that fitted is in ``best`` (the bound is infinite)
    exhaustive: bool


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

    A shape (compute, memory) that comes back, as an array's tasks do, is searched for its
    :data:`PICKS` best fits, kept as :class:`Picks`; the next jobs of the shape take the
    best of them that has not changed since, unless a device that did change (each one
    refiled since, scored afresh) now fits better: no search, while the picks last.

    Every change to a :class:`Free` must be followed by :meth:`refile`.  Should a value
    leave the range where the bounds are exact (:data:`INDEX_LIMIT`, finite), the index
    stops serving and the planner scans.
    """

    def __init__(self, frees: Iterable[Free]) -> None:
        self.usable = True
        self._shelves: dict[float, Shelf] = {}
        #: every device refiled so far, in that order (a device as often as it was)
        self.refiled: list[Free] = []
        #: the last search's picks for each shape (compute, memory) queried
        self._picks: dict[tuple[float, int], Picks] = {}
        #: where each device is filed (by pos): its shelf, bucket and free memory
        self._filed: dict[int, tuple[Shelf, int, float]] = {}
        # filed in bulk: grouped by shelf and bucket, then each bucket sorted once
        staged: dict[float, dict[int, list[Free]]] = {}
        limit = INDEX_LIMIT
        for f in frees:
            divisor = max(f.device.memory_mib, 1.0)
            compute = f.compute
            # indexable(), inline: a fleet has many devices
            if not (
                -limit <= compute <= limit and -limit <= f.memory <= limit and divisor <= limit
            ):
                self.usable = False
                return
            staged.setdefault(divisor, {}).setdefault(math.floor(compute), []).append(f)
        filed = self._filed
        for divisor, buckets in staged.items():
            shelf = self._shelves[divisor] = Shelf(divisor)
            for bucket, members in buckets.items():
                members.sort(key=_MEMORY)
                mems = [f.memory for f in members]
                shelf.buckets[bucket] = Bucket(mems, members, max(f.compute for f in members))
                for f in members:
                    filed[f.pos] = (shelf, bucket, f.memory)
            shelf.keys = sorted(shelf.buckets)

    def serves(self, job: QueuedJob) -> bool:
        return self.usable and indexable(job.compute_pct) and indexable(job.memory_mib)

    def refile(self, f: Free) -> None:
        """Move ``f`` to where its new headroom belongs."""
        self.refiled.append(f)
        if not self.usable:
            return
        shelf, bucket, memory = self._filed.pop(f.pos)
        b = shelf.buckets[bucket]
        mems, frees = b.mems, b.frees
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
        b = shelf.buckets.get(bucket)
        if b is None:
            b = shelf.buckets[bucket] = Bucket([], [], f.compute)
            insort(shelf.keys, bucket)
        b.top = max(b.top, f.compute)
        i = bisect_right(b.mems, f.memory)
        b.mems.insert(i, f.memory)
        b.frees.insert(i, f)
        self._filed[f.pos] = (shelf, bucket, f.memory)

    def best_fit(self, job: QueuedJob) -> Free | None:
        shape = (job.compute_pct, job.memory_mib)
        picks = self._picks.get(shape)
        if picks is not None and len(self.refiled) - picks.seen <= MAX_REFILED_SINCE:
            found = self._reuse(picks, job)
            if found is not None or picks.exhaustive:
                return found
        # the first job of a shape looks for its best fit only; a shape that comes back
        # (an array's tasks) keeps PICKS for those that follow
        picks = self._picks[shape] = self._search(job, 1 if picks is None else PICKS)
        return picks.best[0][2] if picks.best else None

    def _reuse(self, picks: Picks, job: QueuedJob) -> Free | None:
        """The best fit from the shape's last search, or None when that cannot tell."""
        changed = {f.pos: f for f in self.refiled[picks.seen :]}
        best = [p for p in picks.best if p[1] not in changed]
        for f in changed.values():
            if fits(f, job):
                best.append((fit_score(f, job), f.pos, f))
        best = sorted(p for p in best if p[:2] <= picks.bound)
        picks.best, picks.seen = best, len(self.refiled)
        return best[0][2] if best else None

    def _search(self, job: QueuedJob, picks: int) -> Picks:
        """The ``picks`` best fits for ``job``, by a walk of the shelves."""
        c, m = job.compute_pct, job.memory_mib
        best: list[tuple[float, int, Free]] = []
        worst = math.inf  # the score of the last pick, once there are enough
        for shelf in self._shelves.values():
            divisor = shelf.divisor
            # every device that fits has at least this memory term: its free memory is
            # short of the job's by 1e-6 at most (within INDEX_LIMIT, by 0.125 with rounding)
            memory_bound = -1.0 / divisor
            keys = shelf.keys
            # a device that fits has compute > c - 1 (the slack is 1e-6), so floor ≥ this
            for k in range(bisect_left(keys, math.floor(c) - 1), len(keys)):
                bucket = keys[k]
                # every device in this bucket and above has at least this compute term
                compute_bound = (bucket - c) / DEVICE_COMPUTE_PCT
                if compute_bound + memory_bound > worst:
                    break
                b = shelf.buckets[bucket]
                mems = b.mems
                start = first_fit(mems, m)
                if start == len(mems) or compute_bound + (mems[start] - m) / divisor > worst:
                    continue  # no device in this bucket has the memory, or could be picked
                if b.top + EPS < c:
                    continue  # nor the compute (only the bucket below the job's can miss it)
                frees = b.frees
                for i in range(start, len(mems)):
                    if compute_bound + (mems[i] - m) / divisor > worst:
                        break  # and so would every later device of this bucket
                    f = frees[i]
                    if f.compute + EPS < c:
                        continue
                    score = fit_score(f, job)
                    if score <= worst:
                        insort(best, (score, f.pos, f))
                        if len(best) >= picks:
                            del best[picks:]
                            worst = best[-1][0]
        exhaustive = len(best) < picks
        bound = (math.inf, 0) if exhaustive else best[-1][:2]
        return Picks(best, bound, len(self.refiled), exhaustive)


_MEMORY = attrgetter("memory")


def first_fit(memory: list[float], need: float) -> int:
    """Index of the first value in ascending ``memory`` that fits ``need`` (as in
    :func:`fits`); ``len(memory)`` when none does."""
    i = bisect_left(memory, need - EPS)
    while i > 0 and memory[i - 1] + EPS >= need:
        i -= 1
    while i < len(memory) and memory[i] + EPS < need:
        i += 1
    return i


def whole_pick(
    frees: Iterable[Free], job: QueuedJob, allowed: Callable[[Free], bool] | None = None
) -> tuple[float, list[Free]] | None:
    """The ``job.gpus`` devices of one node that a whole-GPU job takes there, and the memory
    they leave over, summed (lower is tighter); None where the node has too few.  They have
    no offline slice, at least :data:`MIN_WHOLE_GPU_HEADROOM_PCT` of compute and the memory
    free (and are ``allowed``); the least memory first, then the lower index."""
    fit = [
        f
        for f in frees
        if f.offline_slices == 0
        and (allowed is None or allowed(f))
        and f.compute + EPS >= MIN_WHOLE_GPU_HEADROOM_PCT
        and f.memory + EPS >= job.memory_mib
    ]
    if len(fit) < job.gpus:
        return None
    fit.sort(key=lambda f: (f.memory, f.device.index))
    pick = fit[: job.gpus]
    return sum(f.memory - job.memory_mib for f in pick), pick


@dataclass(slots=True)
class NodeScores:
    """Every node's :func:`whole_pick` score for one shape, as of ``seen`` refiles."""

    #: node number → its score (a node with too few devices has none)
    score: dict[int, float]
    #: (score, node number), a heap; an entry that is not the node's score any more is
    #: dropped when it comes to the top
    heap: list[tuple[float, int]]
    seen: int


class WholeFit:
    """Finds the node a scan of every node picks for a whole-GPU job: the lowest
    :func:`whole_pick` score, the first node (in ``by_node``'s order) among equals.

    A shape's (gpus, memory) first job scores every node; the scores are kept, and the next
    jobs of the shape rescore only the nodes with a device refiled since (``index``'s
    :attr:`FitIndex.refiled`): a node's score changes with its devices only.  For the jobs
    the index serves (finite scores).
    """

    def __init__(self, by_node: dict[str, list[Free]], index: FitIndex) -> None:
        self._nodes = list(by_node.values())
        self._number = {node: n for n, node in enumerate(by_node)}
        self._refiled = index.refiled
        self._shapes: dict[tuple[int, int], NodeScores] = {}

    def best(self, job: QueuedJob) -> list[Free] | None:
        shape = (job.gpus, job.memory_mib)
        scores = self._shapes.get(shape)
        if scores is None:
            score = {}
            for n, frees in enumerate(self._nodes):
                if (picked := whole_pick(frees, job)) is not None:
                    score[n] = picked[0]
            heap = [(value, n) for n, value in score.items()]
            heapify(heap)
            scores = self._shapes[shape] = NodeScores(score, heap, 0)
        else:
            for n in {self._number[f.device.node] for f in self._refiled[scores.seen :]}:
                if (picked := whole_pick(self._nodes[n], job)) is None:
                    scores.score.pop(n, None)
                else:
                    scores.score[n] = picked[0]
                    heappush(scores.heap, (picked[0], n))
        scores.seen = len(self._refiled)
        heap = scores.heap
        while heap and scores.score.get(heap[0][1]) != heap[0][0]:
            heappop(heap)
        if not heap:
            return None
        picked = whole_pick(self._nodes[heap[0][1]], job)
        assert picked is not None
        return picked[1]
