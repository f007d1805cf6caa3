"""Retention in memory: :mod:`ebbtide.queue.purge`'s rules (finished jobs before a cutoff
go with their attempts and events, a batch at a time; never one that a job not yet
finished depends on, nor part of an array not all finished before the cutoff) over the
in-memory tables, candidates read in ``(finished_at, id)`` order as there."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from ebbtide.queue.memory.base import MemoryBase, Tables
from ebbtide.queue.purge import (
    DEFAULT_BATCH_JOBS,
    MAX_BATCH_JOBS,
    PURGE_PAUSE_S,
    PurgeResult,
)
from ebbtide.queue.states import FINAL_STATES

_FINAL = frozenset(s.value for s in FINAL_STATES)


def _depended_on(data: Tables) -> set[int]:
    """The ids of the jobs that a job not yet finished depends on."""
    return {
        int(d["job_id"])
        for row in data.jobs.values()
        if row["state"] not in _FINAL and row["depends_json"] != "[]"
        for d in json.loads(row["depends_json"])
    }


class _Purger:
    """One purge's way through the candidates, as :class:`ebbtide.queue.purge.Purger`'s."""

    def __init__(self, data: Tables, cutoff: float, *, batch: int, dry_run: bool) -> None:
        if not 1 <= batch <= MAX_BATCH_JOBS:
            raise ValueError(f"batch must be 1 to {MAX_BATCH_JOBS} jobs, got {batch}")
        self.data, self.cutoff, self.batch, self.dry_run = data, cutoff, batch, dry_run
        self._cursor: tuple[float, int] | None = None
        self._pending: list[int] = []
        self._array_of: dict[int, int] = {}
        self._judged: set[int] = set()
        self._kept = 0

    def select(self) -> bool:
        """Choose the next jobs to go; False when no candidate is left."""
        jobs = self.data.jobs
        while not self._pending:
            rows = sorted(
                (r["finished_at"], r["id"])
                for r in jobs.values()
                if r["finished_at"] is not None
                and r["finished_at"] < self.cutoff
                and (self._cursor is None or (r["finished_at"], r["id"]) > self._cursor)
            )[: self.batch]
            if not rows:
                return False
            self._cursor = rows[-1]
            protected = _depended_on(self.data)
            for _, job_id in rows:
                row = jobs[job_id]
                array_id = row["array_id"]
                if row["state"] not in _FINAL:
                    continue
                if array_id is None:
                    if job_id in protected:
                        self._kept += 1
                    else:
                        self._pending.append(job_id)
                elif array_id not in self._judged:
                    self._judged.add(array_id)
                    self._judge_array(array_id, protected)
        return True

    def leftover(self) -> PurgeResult:
        kept, self._kept = self._kept, 0
        return PurgeResult(cutoff=self.cutoff, dry_run=self.dry_run, kept=kept)

    def _judge_array(self, array_id: int, protected: set[int]) -> None:
        tasks = [r for r in self.data.jobs.values() if r["array_id"] == array_id]
        old = [
            r["id"]
            for r in tasks
            if r["state"] in _FINAL
            and r["finished_at"] is not None
            and r["finished_at"] < self.cutoff
        ]
        if len(old) == len(tasks) and protected.isdisjoint(old):
            self._pending.extend(old)
            self._array_of.update(dict.fromkeys(old, array_id))
        else:
            self._kept += len(old)

    def remove(self) -> PurgeResult:
        """Remove (a dry run: count) the next batch of the chosen jobs."""
        data = self.data
        chunk = self._pending[: self.batch]
        del self._pending[: self.batch]
        present = {
            i
            for i in chunk
            if i in data.jobs
            and data.jobs[i]["state"] in _FINAL
            and data.jobs[i]["finished_at"] < self.cutoff
        }
        protected = _depended_on(data)
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
        attempts = sum(len(data.attempts.get(i, ())) for i in ids)
        events = sum(len(data.events_of.get(i, ())) for i in ids)
        if not self.dry_run:
            gone = set(ids)
            for i in ids:
                row = data.jobs.pop(i)
                data.by_state[row["state"]].discard(i)
                data.attempts.pop(i, None)
                data.events_of.pop(i, None)
            data.events[:] = [e for e in data.events if e["job_id"] not in gone]
            data.event_ids[:] = [e["id"] for e in data.events]
        return replace(result, jobs=len(ids), attempts=attempts, events=events)


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
                more = purger.select()
            if not more:
                rest = purger.leftover()
                if rest.kept:
                    yield rest
                return
            if not first and pause is not None and not pause():
                return
            first = False
            with self._tx():
                result = purger.remove()
            yield result

    def purge(
        self,
        older_than_s: float,
        *,
        batch: int = DEFAULT_BATCH_JOBS,
        dry_run: bool = False,
        now: float | None = None,
        pause_s: float = PURGE_PAUSE_S,
    ) -> PurgeResult:
        """Remove the jobs that finished more than ``older_than_s`` seconds before ``now``
        (default: the clock's), with their attempts and events, ``batch`` jobs at a time
        and ``pause_s`` seconds apart; ``dry_run``: count them, remove nothing."""
        started = time.perf_counter()
        at = self.clock.time() if now is None else now
        total = PurgeResult(cutoff=at - older_than_s, dry_run=dry_run)

        def pause() -> bool:
            time.sleep(pause_s)
            return True

        for step in self.purge_batches(
            older_than_s, batch=batch, dry_run=dry_run, now=at, pause=pause
        ):
            total += step
        with self._data.lock:
            finished = [r["finished_at"] for r in self._data.jobs.values()]
            oldest = min((f for f in finished if f is not None), default=None)
        return replace(
            total, oldest_kept_finished_at=oldest, elapsed_s=time.perf_counter() - started
        )
