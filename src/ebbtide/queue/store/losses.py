"""Losses: attempts given up on (their agent is gone, their start never happened), and the
jobs held because they keep being lost (:func:`~ebbtide.queue.outcomes.hold_after_losses`
decides; this module reads the losses and writes the hold)."""

from __future__ import annotations

import sqlalchemy as sa

from ebbtide.errors import StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.lifecycle.losses import LossLogic, hold_if_lost_too_often
from ebbtide.queue.states import AttemptOutcome, EventType, JobState
from ebbtide.queue.store.base import ATTEMPTS, EVENTS, JOBS
from ebbtide.queue.store.queries import QueryMixin

#: How far back :meth:`Store.hold_lost` looks for losses when it is not told where it
#: stopped (a scheduler's first pass), in seconds: at least the policy's ``loss_window_s``.
LOST_LOOKBACK_S = 600.0
#: How many events before where it stopped :meth:`Store.hold_lost` looks again, in events.
LOST_RESCAN_EVENTS = 1_000


class LossMixin(QueryMixin, LossLogic):
    """:meth:`hold_lost` (and the shared :meth:`requeue_lost`)."""

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
                    if hold_if_lost_too_often(
                        self, conn, job_id, attempt, max_losses, loss_window_s
                    ):
                        held.append(job_id)
            except StaleState:
                continue
        return held, int(newest)
