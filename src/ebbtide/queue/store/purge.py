"""Retention over the SQL store: :class:`~ebbtide.queue.purge.PurgeRules` (the rules, in
:mod:`ebbtide.queue.purge`, with the SQL-free constants) given this store's reads and
deletes."""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ebbtide.queue.models import Attempt, Event, JobTable
from ebbtide.queue.purge import PurgeRules
from ebbtide.queue.states import FINAL_STATES, JobState

JOBS: sa.Table = JobTable.__table__  # type: ignore[attr-defined]
ATTEMPTS: sa.Table = Attempt.__table__  # type: ignore[attr-defined]
EVENTS: sa.Table = Event.__table__  # type: ignore[attr-defined]

_FINAL = tuple(s.value for s in FINAL_STATES)
#: The states of jobs not yet finished (their dependencies still count).
NOT_FINAL = tuple(s.value for s in JobState if s not in FINAL_STATES)


def depended_on(conn: Connection) -> set[int]:
    """The ids of the jobs that a job not yet finished depends on."""
    stmt = sa.select(JOBS.c.depends_json).where(
        JOBS.c.state.in_(NOT_FINAL), JOBS.c.depends_json != "[]"
    )
    return {int(d["job_id"]) for text in conn.execute(stmt).scalars() for d in json.loads(text)}


def oldest_finished_at(conn: Connection) -> float | None:
    """When the oldest finished job in the store finished (only final jobs have a
    ``finished_at``); None when there is none."""
    value = conn.execute(sa.select(sa.func.min(JOBS.c.finished_at))).scalar()
    return None if value is None else float(value)


class Purger(PurgeRules):
    """:class:`PurgeRules` over the SQL store (``conn``: a connection)."""

    def __init__(self, cutoff: float, *, batch: int, dry_run: bool, postgres: bool) -> None:
        super().__init__(cutoff, batch=batch, dry_run=dry_run)
        self._postgres = postgres

    def _candidates(self, conn: Connection) -> list[tuple[int, int | None, float, str]]:
        j = JOBS.c
        # the state is checked by the caller, not in SQL: SQLite would take the state
        # index and sort every finished job (only final jobs have a finished_at anyway)
        stmt = (
            sa.select(j.id, j.array_id, j.finished_at, j.state)
            .where(j.finished_at < self.cutoff)
            .order_by(j.finished_at, j.id)
            .limit(self.batch)
        )
        if self._cursor is not None:
            stmt = stmt.where(sa.tuple_(j.finished_at, j.id) > sa.tuple_(*self._cursor))
        return [tuple(row) for row in conn.execute(stmt).all()]

    def _depended_on(self, conn: Connection) -> set[int]:
        return depended_on(conn)

    def _tasks(self, conn: Connection, array_id: int) -> list[tuple[int, str, float | None]]:
        j = JOBS.c
        stmt = sa.select(j.id, j.state, j.finished_at).where(j.array_id == array_id)
        return [tuple(row) for row in conn.execute(stmt.order_by(j.id)).all()]

    def _present(self, conn: Connection, chunk: list[int]) -> set[int]:
        j = JOBS.c
        # on PostgreSQL locked first, then who depends on them is read: a submission that
        # read one of them FOR SHARE has committed its job by now, and is seen then
        there = sa.select(j.id).where(
            j.id.in_(chunk), j.state.in_(_FINAL), j.finished_at < self.cutoff
        )
        if self._postgres and not self.dry_run:
            there = there.with_for_update()
        return set(conn.execute(there).scalars())

    def _counts(self, conn: Connection, ids: list[int]) -> tuple[int, int]:
        return self._count(conn, ATTEMPTS, ids), self._count(conn, EVENTS, ids)

    def _delete(self, conn: Connection, ids: list[int]) -> tuple[int, int, int]:
        jobs = conn.execute(JOBS.delete().where(JOBS.c.id.in_(ids))).rowcount
        attempts = conn.execute(ATTEMPTS.delete().where(ATTEMPTS.c.job_id.in_(ids))).rowcount
        events = conn.execute(EVENTS.delete().where(EVENTS.c.job_id.in_(ids))).rowcount
        return jobs, attempts, events

    @staticmethod
    def _count(conn: Connection, table: sa.Table, ids: list[int]) -> int:
        stmt = sa.select(sa.func.count()).select_from(table).where(table.c.job_id.in_(ids))
        return int(conn.execute(stmt).scalar_one())
