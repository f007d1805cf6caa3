"""The scheduler's copy of the queue: the queued jobs in scheduling order and the active
attempts, kept up to date from what changed since the last pass
(:meth:`Store.changes_since <ebbtide.queue.store.Store.changes_since>`), so a pass reads
what changed, not the whole queue.

Each pass (:meth:`Mirror.sync`) reads the jobs with new events since its cursor and their
rows now, takes each of them out of the copy and puts back the ones still queued or
active.  It reads everything again (a full rebuild, as a pass without the copy does) when
it must:

- at its first pass, and after :meth:`Mirror.reset` (a pass that failed on a store
  error: the copy may have missed what that pass would have read);
- when the leadership epoch is not the one it was built in (another scheduler led in
  between and wrote what this copy never saw applied);
- when the store cannot follow the cursor (too much changed, too many gaps, the cursor's
  anchor event gone: see :mod:`ebbtide.queue.store.changes`);
- every :data:`REBUILD_PERIOD_S` as a safety net (a write that outlived the gaps'
  expiry, a row changed by hand in the database).

The queued jobs are kept by planning group (:func:`~ebbtide.scheduling.snapshot.plan_group`:
jobs that fit, or not, together, and are refused together), each group in a list of sorted
runs of at most ``2 × RUN_LENGTH`` jobs (:class:`OrderedJobs`): an insertion or removal by
``(-priority, id)`` moves at most one run's elements.  The planner gets the groups as they
are (:class:`~ebbtide.scheduling.snapshot.GroupedJobs`, with a lookup by id for the jobs a
pass dispatches), merges them as it reads and leaves a group unread once none of its jobs
can start, so nothing in a pass reads the whole queue.

Owners are told apart only as the nodes single them out (a node that runs every user's
jobs but root's, or one user's only: :func:`~ebbtide.queue.whose_jobs.singled_out`); where
no node does, every owner's jobs share their groups.  An owner singled out for the first
time splits the groups once, from the copy; one that no node singles out any more is
forgotten at the next full read.
"""

from __future__ import annotations

import gc
import logging
from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, Protocol

from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    GroupedJobs,
    QueuedJob,
    plan_group,
    queue_order,
)

log = logging.getLogger("ebbtide.scheduler")

#: The copy is read again from scratch at least this often, in seconds (5 minutes).
REBUILD_PERIOD_S = 300.0
#: After a store could not say what changed (too many new events or gaps: a transaction
#: of many events, say an array of 100,000 tasks, may still be in flight), the copy is
#: read again from scratch this much later too, in seconds: what that transaction
#: commits below the new cursor's start margin is then seen within this, not 5 minutes.
FALLBACK_RECHECK_S = 10.0
#: The length a run of :class:`OrderedJobs` is split at twice of, in jobs.
RUN_LENGTH = 1_000


class OrderedJobs:
    """Queued jobs in scheduling order, with cheap insertions and removals by id."""

    def __init__(self, jobs: Iterable[QueuedJob] = (), *, in_order: bool = False) -> None:
        """``in_order``: ``jobs`` are in scheduling order already (as the store lists
        them), not sorted again."""
        ordered = list(jobs) if in_order else sorted(jobs, key=queue_order)
        self._by_id = {j.id: j for j in ordered}
        self._runs = [ordered[i : i + RUN_LENGTH] for i in range(0, len(ordered), RUN_LENGTH)]
        #: the place of each run's last job
        self._lasts = [queue_order(run[-1]) for run in self._runs]

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._by_id

    def __iter__(self) -> Iterator[QueuedJob]:
        """The jobs in scheduling order, read lazily (do not change the jobs meanwhile)."""
        return chain.from_iterable(self._runs)

    def get(self, job_id: int) -> QueuedJob | None:
        """The job ``job_id``, or None when it is not in."""
        return self._by_id.get(job_id)

    def add(self, job: QueuedJob) -> None:
        """Add ``job`` (one of its id is taken out first)."""
        self.discard(job.id)
        self._by_id[job.id] = job
        key = queue_order(job)
        if not self._runs:
            self._runs.append([job])
            self._lasts.append(key)
            return
        i = min(bisect_left(self._lasts, key), len(self._runs) - 1)
        run = self._runs[i]
        insort(run, job, key=queue_order)
        self._lasts[i] = queue_order(run[-1])
        if len(run) > 2 * RUN_LENGTH:
            self._runs[i : i + 1] = [run[:RUN_LENGTH], run[RUN_LENGTH:]]
            self._lasts[i : i + 1] = [queue_order(run[RUN_LENGTH - 1]), queue_order(run[-1])]

    def discard(self, job_id: int) -> None:
        """Take the job ``job_id`` out, if it is in."""
        job = self._by_id.pop(job_id, None)
        if job is None:
            return
        key = queue_order(job)
        i = bisect_left(self._lasts, key)
        run = self._runs[i]
        del run[bisect_left(run, key, key=queue_order)]
        if run:
            self._lasts[i] = queue_order(run[-1])
        else:
            del self._runs[i]
            del self._lasts[i]

    def as_list(self) -> list[QueuedJob]:
        """The jobs in scheduling order, as a new list."""
        return list(chain.from_iterable(self._runs))


class ChangeSet(Protocol):
    """What changed since a cursor (:class:`~ebbtide.queue.store.changes.Changes`)."""

    @property
    def cursor(self) -> Any: ...

    @property
    def job_ids(self) -> frozenset[int]: ...

    @property
    def queued(self) -> Sequence[QueuedJob]: ...

    @property
    def active(self) -> Sequence[ActiveAttempt]: ...


class ChangeFeed(Protocol):
    """What the copy reads a store through (the store's interface has it all; this
    layer does not import the store)."""

    def changes_since(self, cursor: Any) -> ChangeSet | None: ...

    def queued_jobs(self) -> list[QueuedJob]: ...

    def active_attempts(self) -> list[ActiveAttempt]: ...


class Groups:
    """Queued jobs by planning group, each group an :class:`OrderedJobs`."""

    def __init__(
        self, jobs: Iterable[QueuedJob] = (), singled_out: frozenset[str] = frozenset()
    ) -> None:
        """``jobs`` in scheduling order (as the store lists them); ``singled_out``: the
        owners told apart (:func:`~ebbtide.scheduling.snapshot.plan_group`)."""
        #: the owners the groups tell apart
        self.singled_out = singled_out
        by_group: dict[Hashable, list[QueuedJob]] = {}
        for job in jobs:
            by_group.setdefault(plan_group(job, singled_out), []).append(job)
        self._groups = {g: OrderedJobs(js, in_order=True) for g, js in by_group.items()}
        self._group_of = {j.id: g for g, js in by_group.items() for j in js}

    def __len__(self) -> int:
        return len(self._group_of)

    def add(self, job: QueuedJob) -> None:
        """Add ``job`` (one of its id is taken out first)."""
        self.discard(job.id)
        group = plan_group(job, self.singled_out)
        self._groups.setdefault(group, OrderedJobs()).add(job)
        self._group_of[job.id] = group

    def discard(self, job_id: int) -> None:
        """Take the job ``job_id`` out, if it is in."""
        group = self._group_of.pop(job_id, None)
        if group is None:
            return
        jobs = self._groups[group]
        jobs.discard(job_id)
        if not jobs:
            del self._groups[group]

    def find(self, job_id: int) -> QueuedJob | None:
        """The job ``job_id``, or None when it is not in."""
        group = self._group_of.get(job_id)
        return None if group is None else self._groups[group].get(job_id)

    def view(self) -> GroupedJobs:
        """The planner's view (read only, until the next change)."""
        return GroupedJobs(list(self._groups.values()), len(self), self.find, self.singled_out)


class Mirror:
    """The queued jobs and active attempts as of the last :meth:`sync`."""

    def __init__(self) -> None:
        self._cursor: Any = None
        self._queued = Groups()
        self._active: dict[int, ActiveAttempt] = {}
        #: the leadership epoch the copy was built in, and when (Unix seconds)
        self._epoch: int | None = None
        self._built_at = 0.0
        #: when the next full read is due (Unix seconds)
        self._due_at = 0.0
        #: full rebuilds so far, and passes that applied changes only
        self.rebuilds = 0
        self.updates = 0

    def reset(self) -> None:
        """Read everything again at the next :meth:`sync`."""
        self._cursor = None

    def sync(
        self,
        store: ChangeFeed,
        now: float,
        *,
        epoch: int | None = None,
        singled_out: frozenset[str] = frozenset(),
    ) -> tuple[GroupedJobs, list[ActiveAttempt]]:
        """Bring the copy up to date with ``store`` at ``now`` (Unix seconds) in
        leadership ``epoch``; return the queued jobs in scheduling order (by planning
        group, owners in ``singled_out`` told apart: those some node singles out) and the
        active attempts by job id, as :meth:`Store.queued_jobs` and
        :meth:`Store.active_attempts` would.  A store error leaves the copy to be rebuilt
        at the next call."""
        try:
            followed = self._follow(store, now, epoch)
            if followed is not True:
                self._rebuild(store, now, epoch, singled_out, fallback=followed is None)
        except BaseException:
            self.reset()
            raise
        told = self._queued.singled_out
        if not singled_out <= told:  # a node singles out someone new: split the groups
            self._queued = Groups(self._queued.view(), told | singled_out)
        active = [self._active[job_id] for job_id in sorted(self._active)]
        return self._queued.view(), active

    def _follow(self, store: ChangeFeed, now: float, epoch: int | None) -> bool | None:
        """Apply what changed since the cursor; False when a full rebuild is due, None
        when the store could not say what changed."""
        if self._cursor is None or epoch != self._epoch or not self._built_at <= now < self._due_at:
            return False
        changes = store.changes_since(self._cursor)
        if changes is None:
            log.info("the queue changed too much since the last pass: reading all of it")
            return None
        for job_id in changes.job_ids:
            self._queued.discard(job_id)
            self._active.pop(job_id, None)
        for job in changes.queued:
            self._queued.add(job)
        for attempt in changes.active:
            self._active[attempt.job_id] = attempt
        self._cursor = changes.cursor
        self.updates += 1
        return True

    def _rebuild(
        self,
        store: ChangeFeed,
        now: float,
        epoch: int | None,
        singled_out: frozenset[str],
        *,
        fallback: bool = False,
    ) -> None:
        start = store.changes_since(None)
        assert start is not None  # a new cursor always begins
        self._queued = Groups(store.queued_jobs(), singled_out)
        self._active = {a.job_id: a for a in store.active_attempts()}
        # the copy's objects are walked once by a full garbage collection, here in the
        # pass that reads everything anyway, not by the one the copy's allocations would
        # set off at the next pass (about 0.2 s at 100,000 queued jobs)
        gc.collect()
        self._cursor = start.cursor
        self._epoch = epoch
        self._built_at = now
        self._due_at = now + (FALLBACK_RECHECK_S if fallback else REBUILD_PERIOD_S)
        self.rebuilds += 1
