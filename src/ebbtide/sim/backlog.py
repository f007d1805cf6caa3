"""The simulated queue: jobs waiting for a slice, in the planner's order.

The planner takes queued jobs by priority, then submission order, and once a job of some
shape (compute, memory, GPUs) fits nowhere it skips every later job of that shape.  So a
pass over the whole queue decides exactly what a pass over each shape's first few jobs
decides, *unless* every one of a shape's first jobs was placed.  :meth:`Backlog.heads`
hands the planner the first ``n`` jobs of each shape; the engine asks again with a larger
``n`` whenever a shape's heads were all placed (see :meth:`Backlog.saturated`).  That keeps
a pass short on a long queue without changing a single decision.

A backlogged queue (``--load backlogged``) is the job stream repeated without end, all
submitted at time 0: copy 0 of every job, then copy 1, and so on (job ids in that order).
It is materialised lazily, shape by shape, as far as the planner looks (:class:`EndlessStream`),
so the planner always finds every shape the stream has, in the order an endless queue
would offer it.

A job waiting out a backoff after repeated evictions is refused whatever room there is, so
it would spoil the count of a shape's heads placed: jobs are grouped by shape *and* the time
their backoff ends (:func:`~ebbtide.scheduling.admission.ready_at`, 0 for most), and the
argument above holds group by group.  A group whose backoff has not ended is not handed to
the planner at all (it would refuse every job of it, deciding nothing): :meth:`Backlog.ripen`
moves groups in as their time comes, and :meth:`Backlog.next_ready` says when the next one
does, for the engine to plan then.  Jobs evicted again and again each wait in a group of
their own, so on a long run of evictions (``--no-pause``) these groups number thousands.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from ebbtide.scheduling.admission import ready_at
from ebbtide.scheduling.planner import Dispatch
from ebbtide.scheduling.snapshot import PlanRules, QueuedJob
from ebbtide.sim.jobs import SimJob

Shape = tuple[float, int, int]
#: a shape and when its jobs' backoff ends
Group = tuple[float, int, int, float]


def shape_of(job: QueuedJob | SimJob) -> Shape:
    return (job.compute_pct, job.memory_mib, job.gpus)


class Backlog:
    """``rules``: the backoff the planner applies (none: every job is ready)."""

    def __init__(self, rules: PlanRules | None = None) -> None:
        self._rules = rules or PlanRules()
        #: per group, the ids of its queued jobs, ascending (submission order); no group
        #: is empty
        self._by_group: dict[Group, list[int]] = {}
        self._jobs: dict[int, QueuedJob] = {}
        #: the groups whose backoff has ended by ``_now`` (as an ordered set)
        self._ready: dict[Group, None] = {}
        #: the other groups, by when their backoff ends (some may be gone since)
        self._later: list[tuple[float, Group]] = []
        self._now = 0.0  # (a job with no backoff to wait out is ready at 0)

    def __len__(self) -> int:
        return len(self._jobs)

    def _group(self, job: QueuedJob) -> Group:
        return (*shape_of(job), ready_at(job, self._rules))

    def count(self, shape: Shape) -> int:
        """How many jobs of ``shape`` wait with no backoff."""
        return len(self._by_group.get((*shape, 0.0), ()))

    def add(self, job: QueuedJob) -> None:
        group = self._group(job)
        ids = self._by_group.get(group)
        if ids is None:
            ids = self._by_group[group] = []
            if group[3] <= self._now:
                self._ready[group] = None
            else:
                heapq.heappush(self._later, (group[3], group))
        bisect.insort(ids, job.id)
        self._jobs[job.id] = job

    def remove(self, job_id: int) -> QueuedJob:
        job = self._jobs.pop(job_id)
        group = self._group(job)
        ids = self._by_group[group]
        del ids[bisect.bisect_left(ids, job_id)]
        if not ids:
            del self._by_group[group]
            self._ready.pop(group, None)
        return job

    def ripen(self, now: float) -> None:
        """From ``now`` on (it never goes back), the groups whose backoff has ended by then
        are handed out."""
        self._now = max(self._now, now)
        later = self._later
        while later and later[0][0] <= self._now:
            group = heapq.heappop(later)[1]
            if group in self._by_group:
                self._ready[group] = None

    def next_ready(self) -> float | None:
        """When the next group's backoff ends (None: no group waits one out)."""
        later = self._later
        while later and later[0][1] not in self._by_group:
            heapq.heappop(later)  # gone meanwhile
        return later[0][0] if later else None

    def smallest_fraction(self) -> tuple[float, float]:
        """The least compute and the least memory of any ready fractional job (inf: none)."""
        shapes = [s for s in self._ready if not s[2]]
        return (
            min((s[0] for s in shapes), default=float("inf")),
            min((float(s[1]) for s in shapes), default=float("inf")),
        )

    def waiting_heads(self, n: int) -> list[QueuedJob]:
        """The first ``n`` queued jobs of every group still in backoff (``--debug``: a
        pass with them decides what one without them does)."""
        jobs = self._jobs
        return [
            jobs[i] for g, ids in self._by_group.items() if g not in self._ready for i in ids[:n]
        ]

    def heads(self, n: int, fits: Callable[[Shape], bool] | None = None) -> list[QueuedJob]:
        """The first ``n`` queued jobs of every ready group (with ``fits``: of every ready
        group whose shape it accepts, asked once a group, so that a pass lists only the
        jobs it could place)."""
        jobs, by_group = self._jobs, self._by_group
        if fits is None:
            return [jobs[i] for g in self._ready for i in by_group[g][:n]]
        return [jobs[i] for g in self._ready if fits(g[:3]) for i in by_group[g][:n]]

    def saturated(self, dispatches: Iterable[Dispatch], n: int) -> bool:
        """Whether some group had all of its ``n`` heads placed while more wait behind them
        (call before removing the dispatched jobs)."""
        placed = Counter(self._group(self._jobs[d.job_id]) for d in dispatches)
        return any(count >= n and len(self._by_group[group]) > n for group, count in placed.items())


class EndlessStream:
    """The job stream repeated without end, handed out shape by shape in id order.

    Copy ``c`` of the stream's job ``key`` has id ``c * len(stream) + key + 1``.
    """

    def __init__(self, stream: Sequence[SimJob]) -> None:
        self.size = len(stream)
        self._keys: dict[Shape, list[SimJob]] = {}
        for spec in sorted(stream, key=lambda j: j.key):
            self._keys.setdefault(shape_of(spec), []).append(spec)
        self._taken: dict[Shape, int] = dict.fromkeys(self._keys, 0)

    def shapes(self) -> list[Shape]:
        return list(self._keys)

    def take(self, shape: Shape) -> tuple[int, SimJob]:
        """The next job of ``shape``: its id and its spec."""
        specs = self._keys[shape]
        i = self._taken[shape]
        self._taken[shape] = i + 1
        copy, spec = divmod(i, len(specs))
        return copy * self.size + specs[spec].key + 1, specs[spec]
