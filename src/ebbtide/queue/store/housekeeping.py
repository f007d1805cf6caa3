"""The scheduler's housekeeping: waiting jobs promoted (or cancelled) as their
dependencies say, why queued jobs wait, jobs evicted too often held, and the retention
purge of jobs finished long ago (:mod:`ebbtide.queue.purge` does each batch)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.lifecycle.housekeeping import HousekeepingLogic
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS, PurgeResult
from ebbtide.queue.states import JobState
from ebbtide.queue.store.base import JOBS
from ebbtide.queue.store.purge import NOT_FINAL, Purger, oldest_finished_at
from ebbtide.queue.store.queries import QueryMixin, array_tasks


class HousekeepingMixin(QueryMixin, HousekeepingLogic):
    """What a scheduler does to the queue besides dispatching and evicting: reasons and
    retention here, the rest the shared :class:`HousekeepingLogic`."""

    def _states_of(self, job_ids: Collection[int]) -> dict[int, str]:
        with self._read() as conn:
            return dict(
                conn.execute(sa.select(JOBS.c.id, JOBS.c.state).where(JOBS.c.id.in_(job_ids))).all()
            )

    def _tasks_of(self, array_ids: Collection[int]) -> list[tuple[int, str]]:
        with self._read() as conn:
            return array_tasks(conn, array_ids)

    def _task_ids(self, array_ids: Collection[int]) -> dict[tuple[int, int], int]:
        j = JOBS.c
        stmt = sa.select(j.array_id, j.array_index, j.id).where(j.array_id.in_(list(array_ids)))
        with self._read() as conn:
            return {(a, i): job for a, i, job in conn.execute(stmt).all()}

    def _waiting_on(self) -> list[tuple[int, int | None, list[dict[str, Any]]]]:
        j = JOBS.c
        stmt = sa.select(j.id, j.array_id, j.depends_json).where(
            j.state.in_(NOT_FINAL), j.depends_json != "[]"
        )
        with self._read() as conn:
            return [(i, a, json.loads(d)) for i, a, d in conn.execute(stmt).all()]

    def set_reasons(self, reasons: dict[int, str]) -> int:
        """Record why queued jobs wait (policy, quota, room); only rows whose reason
        changed are written.  Returns how many changed."""
        if not reasons:
            return 0
        changed = 0
        with self._tx() as conn:
            current = dict(
                conn.execute(
                    sa.select(JOBS.c.id, JOBS.c.reason).where(
                        JOBS.c.id.in_(list(reasons)), JOBS.c.state == JobState.QUEUED.value
                    )
                ).all()
            )
            for job_id, reason in reasons.items():
                if job_id in current and current[job_id] != reason:
                    conn.execute(
                        JOBS.update()
                        .where(JOBS.c.id == job_id, JOBS.c.state == JobState.QUEUED.value)
                        .values(reason=reason)
                    )
                    changed += 1
        return changed

    def _overpreempted(self, queue: str, max_preemptions: int) -> list[int]:
        with self._read() as conn:
            return [
                r[0]
                for r in conn.execute(
                    sa.select(JOBS.c.id).where(
                        JOBS.c.state == JobState.QUEUED.value,
                        JOBS.c.queue == queue,
                        JOBS.c.evictions - JOBS.c.evictions_forgiven >= max_preemptions,
                    )
                )
            ]

    # -- retention ----------------------------------------------------------------------

    def purge_batches(
        self,
        older_than_s: float,
        *,
        batch: int = DEFAULT_BATCH_JOBS,
        dry_run: bool = False,
        now: float | None = None,
        pause: Callable[[], bool] | None = None,
    ) -> Iterator[PurgeResult]:
        """:meth:`purge`, one batch at a time: each item is one batch's counts, its
        transaction over.  ``pause`` is called between two batches; False ends the purge
        there."""
        cutoff = (self.clock.time() if now is None else now) - older_than_s
        postgres = self.engine.dialect.name == "postgresql"
        purger = Purger(cutoff, batch=batch, dry_run=dry_run, postgres=postgres)
        first = True
        while True:
            with self._read() as conn:
                more = purger.select(conn)
            if not more:
                rest = purger.leftover()
                if rest.kept:
                    yield rest
                return
            if not first and pause is not None and not pause():
                return
            first = False
            batch_tx = self._read() if dry_run else self._tx()
            with batch_tx as conn:
                result = purger.remove(conn)
            yield result

    def _oldest_finished_at(self) -> float | None:
        with self._read() as conn:
            return oldest_finished_at(conn)
