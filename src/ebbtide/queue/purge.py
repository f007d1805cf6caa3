"""Retention: finished jobs leave the store, with their attempts and events.

A purge removes the jobs in a final state (succeeded, failed, cancelled) that finished
before a cutoff, a batch at a time: each batch is its own short transaction, so the
scheduler's and the node agents' transactions run between two batches, and none waits
for more than one batch.  Nothing else goes:

- a job in any other state, however old (held, waiting, queued, dispatched, running,
  evicting);
- a job that a job not yet finished depends on (``-W depend=afterok:N``).  Not only a
  waiting dependent needs N: a queued or held one may go back to waiting (``qhold``,
  ``qrls``) and must then find N's final state again, or it would be cancelled as
  depending on no job.  So N stays until every job that names it has finished;
- a task of an array, until every task of the array finished before the cutoff (an
  array is one line in ``qstat``): then the whole array goes;
- nodes, drains, tokens and the leadership row: only jobs, attempts and events.

Whether a job may go never changes once it may — a final state is final and
``finished_at`` is set once — except that it may gain a dependent.  So the candidates
are chosen in a read, and the transaction that deletes checks the dependents again
after locking the rows (PostgreSQL: ``FOR UPDATE``, while :meth:`Store.submit
<ebbtide.queue.store.Store.submit>` reads the jobs it depends on ``FOR SHARE``; SQLite
runs one writer at a time): a job submitted meanwhile with a dependency on a candidate
either keeps it or is refused (``no job with id N``), never left waiting on nothing.

Candidates are read in ``(finished_at, id)`` order, each read starting where the last
one stopped: a range of the index ``ix_jobs_finished_at`` (schema v10) on both
databases, whatever the length of the history or the number of jobs kept.  An array
larger than a batch goes in several batches, its tasks in id order; a job submitted
meanwhile with a dependency on one of its tasks keeps the tasks not yet gone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ebbtide.errors import SpecError
from ebbtide.queue.states import FINAL_STATES
from ebbtide.units import MAX_DURATION_S, shown

#: Jobs one batch removes unless told otherwise; each batch is one transaction.
DEFAULT_BATCH_JOBS = 1000
#: Most jobs one batch may remove (one transaction; their ids are bound parameters).
MAX_BATCH_JOBS = 10_000
#: The least age, in seconds, at which the policy or ``ebb admin purge`` purges a
#: finished job: one that ended just now is still waited on (``Client.wait``,
#: ``result()``) and looked at (``qstat -f``, ``ebb events``).
MIN_PURGE_AGE_S = 3600.0
#: Pause between two batches of :meth:`Store.purge <ebbtide.queue.store.Store.purge>`, in
#: seconds: another process waiting for the store (SQLite's one writer) gets it first.
PURGE_PAUSE_S = 0.1

_FINAL = tuple(s.value for s in FINAL_STATES)


@dataclass(frozen=True)
class PurgeResult:
    """What a purge removed (a dry run: would remove), or one batch of it."""

    #: jobs that finished before this (Unix seconds) may go
    cutoff: float
    dry_run: bool = False
    jobs: int = 0
    attempts: int = 0
    events: int = 0
    #: transactions that removed (or counted) jobs
    batches: int = 0
    #: finished jobs older than the cutoff kept: a job not yet finished depends on them,
    #: or not every task of their array finished before the cutoff
    kept: int = 0
    #: when the oldest finished job still in the store finished (Unix seconds); None:
    #: none is left (a dry run: the oldest now)
    oldest_kept_finished_at: float | None = None
    #: how long the purge took, in seconds
    elapsed_s: float = 0.0

    def __add__(self, other: PurgeResult) -> PurgeResult:
        """This result with ``other``'s counts added (a later batch of the same purge)."""
        return replace(
            self,
            jobs=self.jobs + other.jobs,
            attempts=self.attempts + other.attempts,
            events=self.events + other.events,
            batches=self.batches + other.batches,
            kept=self.kept + other.kept,
        )

    def as_dict(self) -> dict[str, Any]:
        """The shape of ``ebb admin purge --json``."""
        return asdict(self)


def check_age(value: Any, name: str = "older_than_s") -> float:
    """A purge's age, in seconds: from :data:`MIN_PURGE_AGE_S` to the longest duration
    (366 days), else a :class:`SpecError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(name, f"expected a number of seconds, got {shown(value)}")
    if not math.isfinite(value) or not MIN_PURGE_AGE_S <= value <= MAX_DURATION_S:
        raise SpecError(
            name,
            f"must be from {MIN_PURGE_AGE_S:g}s (1h: a job that just finished is still "
            f"waited on and looked at) to {MAX_DURATION_S:g}s (366d), got {shown(value)}",
        )
    return float(value)


class PurgeRules:
    """One purge's way through the candidates: :meth:`select` in a read, then
    :meth:`remove` in the batch's own transaction, until :meth:`select` finds no more
    (see the module doc).  The rules live here once; a store gives the reads and writes
    (:class:`~ebbtide.queue.store.purge.Purger` for SQL, the in-memory store's own), each
    taking the ``conn`` its caller passes.  Not thread-safe: one purge, one thread."""

    def __init__(self, cutoff: float, *, batch: int, dry_run: bool) -> None:
        if not 1 <= batch <= MAX_BATCH_JOBS:
            raise ValueError(f"batch must be 1 to {MAX_BATCH_JOBS} jobs, got {batch}")
        self.cutoff = cutoff
        self.batch = batch
        self.dry_run = dry_run
        #: where the last read stopped: the last candidate's (finished_at, id)
        self._cursor: tuple[float, int] | None = None
        #: ids chosen to go, in order
        self._pending: list[int] = []
        #: the array of each pending array task
        self._array_of: dict[int, int] = {}
        #: arrays already judged, by their id
        self._judged: set[int] = set()
        #: old finished jobs kept since the last batch
        self._kept = 0

    # -- what a store provides ------------------------------------------------------------

    def _candidates(self, conn: Any) -> list[tuple[int, int | None, float, str]]:
        """Up to ``batch`` jobs that finished before the cutoff, after ``_cursor``, in
        ``(finished_at, id)`` order: their id, array, finished_at and state."""
        raise NotImplementedError

    def _depended_on(self, conn: Any) -> set[int]:
        """The ids of the jobs that a job not yet finished depends on."""
        raise NotImplementedError

    def _tasks(self, conn: Any, array_id: int) -> list[tuple[int, str, float | None]]:
        """Every task of an array: its id, state and finished_at, by id."""
        raise NotImplementedError

    def _present(self, conn: Any, chunk: list[int]) -> set[int]:
        """Those of ``chunk`` still there, final and finished before the cutoff."""
        raise NotImplementedError

    def _counts(self, conn: Any, ids: list[int]) -> tuple[int, int]:
        """The attempts and events of the jobs ``ids``."""
        raise NotImplementedError

    def _delete(self, conn: Any, ids: list[int]) -> tuple[int, int, int]:
        """Remove the jobs ``ids`` with their attempts and events; how many of each."""
        raise NotImplementedError

    # -- the rules ------------------------------------------------------------------------

    def select(self, conn: Any) -> bool:
        """Choose the next jobs to go, reading on from where the last read stopped;
        False when no candidate is left."""
        while not self._pending:
            rows = self._candidates(conn)
            if not rows:
                return False
            self._cursor = (float(rows[-1][2]), int(rows[-1][0]))
            protected = self._depended_on(conn)
            for job_id, array_id, _, state in rows:
                if state not in _FINAL:
                    continue
                if array_id is None:
                    if job_id in protected:
                        self._kept += 1
                    else:
                        self._pending.append(job_id)
                elif array_id not in self._judged:
                    self._judged.add(array_id)
                    self._judge_array(conn, array_id, protected)
        return True

    def leftover(self) -> PurgeResult:
        """The old finished jobs kept since the last batch, once :meth:`select` found no
        more candidates."""
        kept, self._kept = self._kept, 0
        return PurgeResult(cutoff=self.cutoff, dry_run=self.dry_run, kept=kept)

    def _judge_array(self, conn: Any, array_id: int, protected: set[int]) -> None:
        """An array goes whole, once every task finished before the cutoff and no job
        not yet finished depends on any of them; else its old tasks are kept."""
        tasks = self._tasks(conn, array_id)
        old = [
            task_id
            for task_id, state, finished_at in tasks
            if state in _FINAL and finished_at is not None and finished_at < self.cutoff
        ]
        if len(old) == len(tasks) and protected.isdisjoint(old):
            self._pending.extend(old)
            self._array_of.update(dict.fromkeys(old, array_id))
        else:
            self._kept += len(old)

    def remove(self, conn: Any) -> PurgeResult:
        """Remove (a dry run: count) the next batch of the chosen jobs, with their
        attempts and events, in ``conn``'s transaction; those that gained a dependent
        since they were chosen are kept, with the rest of their array."""
        chunk = self._pending[: self.batch]
        del self._pending[: self.batch]
        # still there and still purgeable (another purge may have been first); who
        # depends on them is read after (see Purger._present)
        present = self._present(conn, chunk) if chunk else set()
        protected = self._depended_on(conn)
        arrays = {self._array_of[i] for i in chunk if i in protected and i in self._array_of}
        keep = {i for i in chunk if i in protected or self._array_of.get(i) in arrays}
        if arrays:
            keep.update(i for i in self._pending if self._array_of.get(i) in arrays)
            self._pending = [i for i in self._pending if i not in keep]
        ids = [i for i in chunk if i in present and i not in keep]
        kept, self._kept = self._kept + len(keep), 0
        for i in chunk:
            self._array_of.pop(i, None)
        result = PurgeResult(cutoff=self.cutoff, dry_run=self.dry_run, batches=1, kept=kept)
        if not ids:
            return result
        if self.dry_run:
            attempts, events = self._counts(conn, ids)
            return replace(result, jobs=len(ids), attempts=attempts, events=events)
        jobs, attempts, events = self._delete(conn, ids)
        return replace(result, jobs=jobs, attempts=attempts, events=events)
