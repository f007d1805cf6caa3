"""Transitions: the one way a job's state changes (checked against the transition table,
guarded by the state and attempt the row must still be in, recorded as an event), the
closing of an attempt's row that every transition ending an attempt writes with it, and
the other primitives the shared logic (:mod:`ebbtide.queue.lifecycle`) writes through."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ebbtide.errors import StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.lifecycle.jobs import ended_attempt_values, lost_race, transition_values
from ebbtide.queue.states import (
    AttemptOutcome,
    EventType,
    JobState,
    check_transition,
)
from ebbtide.queue.store import statements
from ebbtide.queue.store.base import ATTEMPTS, EVENTS, JOBS, StoreBase


class TransitionMixin(StoreBase):
    """The primitives the other concepts, and the shared logic, write their changes with
    (:class:`~ebbtide.queue.lifecycle.backend.Backend`)."""

    def _transition(
        self,
        conn: Connection,
        job_id: int,
        source: JobState,
        target: JobState,
        *,
        event: EventType,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        changes: dict[str, Any] | None = None,
        now: float | None = None,
        fence_attempt: int | None = None,
    ) -> None:
        """The one place a job's state changes (see the module doc).  The row must still be
        in ``source`` and, when given, at attempt ``fence_attempt`` (default ``attempt``);
        the event is recorded for ``attempt``."""
        check_transition(source, target)
        fence = attempt if fence_attempt is None else fence_attempt
        stmt = JOBS.update().where(JOBS.c.id == job_id, JOBS.c.state == source.value)
        if fence is not None:
            stmt = stmt.where(JOBS.c.attempts == fence)
        result = conn.execute(stmt.values(**transition_values(target, changes)))
        if result.rowcount != 1:
            raise lost_race(job_id, source, fence)
        self._event(conn, job_id, event, attempt=attempt, data=data, now=now)

    def _end_attempt(
        self,
        conn: Connection,
        job_id: int,
        attempt: int,
        outcome: AttemptOutcome,
        exit_code: int | None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """Close the attempt's row, with what it used where its agent measured it
        (``usage``: :data:`~ebbtide.queue.models.USAGE_COLUMNS`; other keys are not ours)."""
        conn.execute(
            ATTEMPTS.update()
            .where(
                ATTEMPTS.c.job_id == job_id,
                ATTEMPTS.c.number == attempt,
                ATTEMPTS.c.outcome.is_(None),
            )
            .values(**ended_attempt_values(outcome, exit_code, self.clock.time(), usage))
        )

    def _fenced_update(
        self, conn: Connection, job_id: int, attempt: int, values: dict[str, Any]
    ) -> None:
        result = conn.execute(*statements.fenced_update(values, job_id, attempt))
        if result.rowcount != 1:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")

    def _update_job_if(
        self, conn: Connection, job_id: int, states: Collection[str], values: dict[str, Any]
    ) -> bool:
        result = conn.execute(
            JOBS.update().where(JOBS.c.id == job_id, JOBS.c.state.in_(states)).values(**values)
        )
        return bool(result.rowcount == 1)

    def _paused_at_or(self, conn: Connection, job_id: int, at: float) -> Any:
        return sa.func.coalesce(JOBS.c.paused_at, at)

    def _insert_attempt(self, conn: Connection, values: dict[str, Any]) -> None:
        conn.execute(ATTEMPTS.insert().values(**values))

    def _write_attempt(
        self, conn: Connection, job_id: int, number: int, values: dict[str, Any]
    ) -> None:
        conn.execute(*statements.attempt_update(values, job_id, number))

    def _losses_since_release(self, conn: Connection, job_id: int) -> list[outcomes.Loss]:
        e = EVENTS.c
        released = (
            sa.select(sa.func.coalesce(sa.func.max(e.id), 0))
            .where(e.job_id == job_id, e.type == EventType.RELEASED.value)
            .scalar_subquery()
        )
        stmt = (
            sa.select(e.attempt, e.time, e.data_json)
            .where(e.job_id == job_id, e.type == EventType.LOST.value, e.id > released)
            .order_by(e.id)
        )
        losses = []
        for number, at, data_json in conn.execute(stmt):
            data = json.loads(data_json or "{}")
            losses.append(
                outcomes.Loss(
                    attempt=int(number or 0),
                    at=float(at),
                    reason=str(data.get("reason", "")),
                    reason_code=data.get("reason_code"),
                )
            )
        return losses
