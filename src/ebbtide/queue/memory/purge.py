"""Retention in memory: :mod:`ebbtide.queue.purge`'s rules (finished jobs before a cutoff
go with their attempts and events, a batch at a time; never one that a job not yet
finished depends on, nor part of an array not all finished before the cutoff) over the
in-memory tables, candidates read in ``(finished_at, id)`` order as there."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from ebbtide.queue.memory.base import MemoryBase, Tables
from ebbtide.queue.purge import (
    DEFAULT_BATCH_JOBS,
    PurgeResult,
    PurgeRules,
)
from ebbtide.queue.states import FINAL_STATES

#: The states of finished jobs.
FINAL = frozenset(s.value for s in FINAL_STATES)


def _depended_on(data: Tables) -> set[int]:
    """The ids of the jobs that a job not yet finished depends on."""
    return {
        int(d["job_id"])
        for row in data.jobs.values()
        if row["state"] not in FINAL and row["depends_json"] != "[]"
        for d in json.loads(row["depends_json"])
    }


class _Purger(PurgeRules):
    """:class:`~ebbtide.queue.purge.PurgeRules` over the in-memory tables (its ``conn``
    is ignored: every read and write is of ``data``, under the caller's lock)."""

    def __init__(self, data: Tables, cutoff: float, *, batch: int, dry_run: bool) -> None:
        super().__init__(cutoff, batch=batch, dry_run=dry_run)
        self.data = data

    def _candidates(self, conn: object) -> list[tuple[int, int | None, float, str]]:
        rows = sorted(
            (r["finished_at"], r["id"])
            for r in self.data.jobs.values()
            if r["finished_at"] is not None
            and r["finished_at"] < self.cutoff
            and (self._cursor is None or (r["finished_at"], r["id"]) > self._cursor)
        )[: self.batch]
        jobs = self.data.jobs
        return [(i, jobs[i]["array_id"], at, jobs[i]["state"]) for at, i in rows]

    def _depended_on(self, conn: object) -> set[int]:
        return _depended_on(self.data)

    def _tasks(self, conn: object, array_id: int) -> list[tuple[int, str, float | None]]:
        return sorted(
            (r["id"], r["state"], r["finished_at"])
            for r in self.data.jobs.values()
            if r["array_id"] == array_id
        )

    def _present(self, conn: object, chunk: list[int]) -> set[int]:
        jobs = self.data.jobs
        return {
            i
            for i in chunk
            if i in jobs and jobs[i]["state"] in FINAL and jobs[i]["finished_at"] < self.cutoff
        }

    def _counts(self, conn: object, ids: list[int]) -> tuple[int, int]:
        data = self.data
        return (
            sum(len(data.attempts.get(i, ())) for i in ids),
            sum(len(data.events_of.get(i, ())) for i in ids),
        )

    def _delete(self, conn: object, ids: list[int]) -> tuple[int, int, int]:
        data = self.data
        attempts, events = self._counts(conn, ids)
        gone = set(ids)
        for i in ids:
            row = data.jobs.pop(i)
            data.by_state[row["state"]].discard(i)
            data.attempts.pop(i, None)
            data.events_of.pop(i, None)
        data.events[:] = [e for e in data.events if e["job_id"] not in gone]
        data.event_ids[:] = [e["id"] for e in data.events]
        return len(ids), attempts, events


class MemoryPurgeMixin(MemoryBase):
    """:meth:`purge` and :meth:`purge_batches`."""

    def purge_batches(
        self,
        older_than_s: float,
        *,
        batch: int = DEFAULT_BATCH_JOBS,
        dry_run: bool = False,
        now: float | None = None,
        pause: Callable[[], bool] | None = None,
    ) -> Iterator[PurgeResult]:
        """:meth:`purge`, one batch at a time; ``pause`` is called between two batches,
        False ends the purge there."""
        cutoff = (self.clock.time() if now is None else now) - older_than_s
        purger = _Purger(self._data, cutoff, batch=batch, dry_run=dry_run)
        first = True
        while True:
            with self._data.lock:
                more = purger.select(self._data)
            if not more:
                rest = purger.leftover()
                if rest.kept:
                    yield rest
                return
            if not first and pause is not None and not pause():
                return
            first = False
            with self._tx() as conn:
                result = purger.remove(conn)
            yield result

    def _oldest_finished_at(self) -> float | None:
        with self._data.lock:
            finished = [r["finished_at"] for r in self._data.jobs.values()]
            return min((f for f in finished if f is not None), default=None)
