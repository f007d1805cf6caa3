"""Losses: attempts given up on (their agent is gone, their start never happened), and the
jobs held because they keep being lost (:func:`~ebbtide.queue.outcomes.hold_after_losses`
decides; this module writes the hold).  Which jobs to look at, for
:meth:`~ebbtide.queue.interface.JobStore.hold_lost`, each backend reads its own way."""

from __future__ import annotations

from typing import Any

from ebbtide.errors import StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.lifecycle.backend import Backend, Shared
from ebbtide.queue.states import ACTIVE_STATES, AttemptOutcome, EventType, JobState


def hold_if_lost_too_often(
    store: Backend, conn: Any, job_id: int, attempt: int, max_losses: int, window_s: float
) -> bool:
    """Hold the (queued) job if its losses since its last ``qrls`` say so; whether it did."""
    hold = outcomes.hold_after_losses(
        store._losses_since_release(conn, job_id), max_losses, window_s
    )
    if hold is None:
        return False
    store._transition(
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


class LossLogic(Shared):
    """:meth:`requeue_lost`."""

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
        state: JobState | None = None,
    ) -> None:
        """Give up on an attempt whose agent is gone or whose start never happened;
        ``reason_code``: the constant for why, where there is one (``unschedulable``,
        ``node_silent``: see :mod:`ebbtide.queue.outcomes`).

        With ``max_losses``, a job that keeps being lost is held with the reason instead
        of restarting in a loop, as :func:`~ebbtide.queue.outcomes.hold_after_losses`
        says (``max_losses`` losses since it was last released, or two unexplained ones
        within ``loss_window_s``); losses do not count toward ``max_attempts``, which is
        for the job's own failures.  (Losses its node agent reports are held by
        ``hold_lost``, which the scheduler calls every pass.)  ``usage``: what the
        attempt used while it ran, where its agent measured it.  ``state``: the state the
        caller saw it in (StaleState when it is in another now: an attempt seen
        dispatched that has started since is not lost for not starting).
        """
        job = self.get(job_id)
        if job.attempts != attempt or job.state not in {s.value for s in ACTIVE_STATES}:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")
        if state is not None and job.state != state.value:
            raise StaleState(f"job {job_id} attempt {attempt} is {job.state} now, not {state}")
        source = JobState(job.state)
        with self._tx() as conn:
            lost = {"reason": why, **({"reason_code": reason_code} if reason_code else {})}
            self._event(conn, job_id, EventType.LOST, attempt=attempt, data=lost)
            changes: dict[str, Any] = {}
            if job.cancel_requested:  # where it last ran stays on record
                changes.update(reason="cancelled", finished_at=self.clock.time())
                self._transition(
                    conn,
                    job_id,
                    source,
                    JobState.CANCELLED,
                    event=EventType.CANCELLED,
                    attempt=attempt,
                    changes=changes,
                )
            else:  # queued again: it holds no slice
                changes.update(
                    reason=f"requeued: {why}",
                    requeued_at=self.clock.time(),
                    node=None,
                    devices=None,
                )
                self._transition(
                    conn,
                    job_id,
                    source,
                    JobState.QUEUED,
                    event=EventType.REQUEUED,
                    attempt=attempt,
                    data={"reason": why},
                    changes=changes,
                )
            self._end_attempt(conn, job_id, attempt, AttemptOutcome.LOST, None, usage)
            if max_losses is not None and not job.cancel_requested:
                hold_if_lost_too_often(self, conn, job_id, attempt, max_losses, loss_window_s)
