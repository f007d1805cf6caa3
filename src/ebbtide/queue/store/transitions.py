"""Transitions: the one way a job's state changes (checked against the transition table,
guarded by the state and attempt the row must still be in, recorded as an event), and the
closing of an attempt's row that every transition ending an attempt writes with it."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from ebbtide.errors import StaleState
from ebbtide.queue.models import USAGE_COLUMNS
from ebbtide.queue.states import (
    ACTIVE_STATES,
    AttemptOutcome,
    EventType,
    JobState,
    check_transition,
)
from ebbtide.queue.store.base import ATTEMPTS, JOBS, StoreBase


class TransitionMixin(StoreBase):
    """:meth:`transition` and the helpers the other concepts write their changes with."""

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
        values = dict(changes or {})
        if target not in ACTIVE_STATES:
            # an attempt that ended is paused (and suspended) no more
            values.setdefault("paused_at", None)
            values.setdefault("suspended_at", None)
        result = conn.execute(stmt.values(state=target.value, **values))
        if result.rowcount != 1:
            at = f" attempt {fence}" if fence is not None else ""
            raise StaleState(f"job {job_id}{at} is no longer {source.value}")
        self._event(conn, job_id, event, attempt=attempt, data=data, now=now)

    def transition(
        self,
        job_id: int,
        source: JobState,
        target: JobState,
        *,
        event: EventType,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        changes: dict[str, Any] | None = None,
    ) -> None:
        """Move one job from ``source`` to ``target`` and record ``event``; see module doc."""
        with self._tx() as conn:
            self._transition(
                conn,
                job_id,
                source,
                target,
                event=event,
                attempt=attempt,
                data=data,
                changes=changes,
            )

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
        measured = {k: v for k, v in (usage or {}).items() if k in USAGE_COLUMNS}
        conn.execute(
            ATTEMPTS.update()
            .where(
                ATTEMPTS.c.job_id == job_id,
                ATTEMPTS.c.number == attempt,
                ATTEMPTS.c.outcome.is_(None),
            )
            .values(
                outcome=outcome.value, exit_code=exit_code, ended_at=self.clock.time(), **measured
            )
        )
