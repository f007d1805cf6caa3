"""Losses: attempts given up on (their agent is gone, their start never happened), and the
jobs held because they keep being lost (:func:`~ebbtide.queue.outcomes.hold_after_losses`
decides; this module reads the losses and writes the hold)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ebbtide.errors import StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.states import ACTIVE_STATES, AttemptOutcome, EventType, JobState
from ebbtide.queue.store.base import ATTEMPTS, EVENTS, JOBS
from ebbtide.queue.store.queries import QueryMixin
from ebbtide.queue.store.transitions import TransitionMixin

#: How far back :meth:`Store.hold_lost` looks for losses when it is not told where it
#: stopped (a scheduler's first pass), in seconds: at least the policy's ``loss_window_s``.
LOST_LOOKBACK_S = 600.0
#: How many events before where it stopped :meth:`Store.hold_lost` looks again, in events.
LOST_RESCAN_EVENTS = 1_000


class LossMixin(QueryMixin, TransitionMixin):
    """:meth:`requeue_lost` and :meth:`hold_lost`."""

    def requeue_lost(
        self,
        job_id: int,
        attempt: int,
        *,
        why: str,
        reason_code: str | None = None,
        max_losses: int | None = None,
        loss_window_s: float = 0.0,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """Give up on an attempt whose agent is gone or whose start never happened;
        ``reason_code``: the constant for why, where there is one (``unschedulable``,
        ``node_silent``: see :mod:`ebbtide.queue.outcomes`).

        With ``max_losses``, a job that keeps being lost is held with the reason instead
        of restarting in a loop, as :func:`~ebbtide.queue.outcomes.hold_after_losses`
        says (``max_losses`` losses since it was last released, or two unexplained ones
        within ``loss_window_s``); losses do not count toward ``max_attempts``, which is
        for the job's own failures.  (Losses its node agent reports are held by
        :meth:`hold_lost`, which the scheduler calls every pass.)  ``usage``: what the
        attempt used while it ran, where its agent measured it.
        """
        job = self.get(job_id)
        if job.attempts != attempt or job.state not in {s.value for s in ACTIVE_STATES}:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")
        source = JobState(job.state)
        with self._tx() as conn:
            lost = {"reason": why, **({"reason_code": reason_code} if reason_code else {})}
            self._event(conn, job_id, EventType.LOST, attempt=attempt, data=lost)
            if job.cancel_requested:
                self._transition(
                    conn,
                    job_id,
                    source,
                    JobState.CANCELLED,
                    event=EventType.CANCELLED,
                    attempt=attempt,
                    changes={
                        "reason": "cancelled",
                        "node": None,
                        "devices": None,
                        "finished_at": self.clock.time(),
                    },
                )
            else:
                self._transition(
                    conn,
                    job_id,
                    source,
                    JobState.QUEUED,
                    event=EventType.REQUEUED,
                    attempt=attempt,
                    data={"reason": why},
                    changes={
                        "reason": f"requeued: {why}",
                        "node": None,
                        "devices": None,
                        "requeued_at": self.clock.time(),
                    },
                )
            self._end_attempt(conn, job_id, attempt, AttemptOutcome.LOST, None, usage)
            if max_losses is not None and not job.cancel_requested:
                self._hold_if_lost_too_often(conn, job_id, attempt, max_losses, loss_window_s)

    def hold_lost(
        self, max_losses: int, loss_window_s: float, *, after_event: int | None = None
    ) -> tuple[list[int], int]:
        """Hold the queued jobs whose latest attempt was lost and that keep being lost
        (:func:`~ebbtide.queue.outcomes.hold_after_losses`): what :meth:`requeue_lost`
        does with ``max_losses``, for the losses node agents report.  Only jobs with a
        ``lost`` event after event id ``after_event`` are looked at (None: those of the
        last :data:`LOST_LOOKBACK_S`), so a pass reads what happened since the one before,
        not every queued job.  Their ids, and the last event id looked at (the next
        call's ``after_event``)."""
        a, j, e = ATTEMPTS.c, JOBS.c, EVENTS.c
        with self._read() as conn:
            if after_event is None:
                since = self.clock.time() - max(LOST_LOOKBACK_S, loss_window_s)
                after_event = self._first_event_id(conn, since) - 1
            newest = conn.execute(sa.select(sa.func.max(e.id))).scalar() or after_event
            # from a little before: an event whose id was taken earlier may have been
            # written after the last look (a job looked at twice is decided again, alike)
            since_id = after_event - LOST_RESCAN_EVENTS
            recent = (
                sa.select(e.job_id)
                .where(e.id > since_id, e.id <= newest, e.type == EventType.LOST.value)
                .distinct()
            )
            stmt = (
                sa.select(j.id, j.attempts)
                .join(ATTEMPTS, sa.and_(a.job_id == j.id, a.number == j.attempts))
                .where(
                    j.id.in_(recent),
                    j.state == JobState.QUEUED.value,
                    a.outcome == AttemptOutcome.LOST.value,
                )
            )
            lost = [
                (job_id, attempt)
                for job_id, attempt in conn.execute(stmt).all()
                if outcomes.hold_after_losses(
                    self._losses_since_release(conn, job_id), max_losses, loss_window_s
                )
            ]
        held = []
        for job_id, attempt in lost:  # decided again where it is written
            try:
                with self._tx() as conn:
                    if self._hold_if_lost_too_often(
                        conn, job_id, attempt, max_losses, loss_window_s
                    ):
                        held.append(job_id)
            except StaleState:
                continue
        return held, int(newest)

    def _hold_if_lost_too_often(
        self, conn: Connection, job_id: int, attempt: int, max_losses: int, window_s: float
    ) -> bool:
        """Hold the (queued) job if its losses since its last ``qrls`` say so."""
        hold = outcomes.hold_after_losses(
            self._losses_since_release(conn, job_id), max_losses, window_s
        )
        if hold is None:
            return False
        self._transition(
            conn,
            job_id,
            JobState.QUEUED,
            JobState.HELD,
            event=EventType.HELD,
            attempt=attempt,
            data={"by": "policy", "reason": hold},
            changes={"reason": hold},
        )
        return True

    @staticmethod
    def _losses_since_release(conn: Connection, job_id: int) -> list[outcomes.Loss]:
        """The job's lost attempts since its last ``qrls`` (all of them, if never),
        oldest first."""
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
