"""A job's spec, a transition in a write of its own, and what every backend's guarded
state change (:meth:`Backend._transition`) and closing of an attempt write."""

from __future__ import annotations

from typing import Any

from ebbtide.errors import StaleState
from ebbtide.queue.lifecycle.backend import Shared
from ebbtide.queue.models import USAGE_COLUMNS
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import ACTIVE_STATES, AttemptOutcome, EventType, JobState


def transition_values(target: JobState, changes: dict[str, Any] | None) -> dict[str, Any]:
    """The columns a transition to ``target`` sets: ``changes`` and the state; an attempt
    that ended is paused (and suspended) no more."""
    values = dict(changes or {})
    if target not in ACTIVE_STATES:
        values.setdefault("paused_at", None)
        values.setdefault("suspended_at", None)
    return {**values, "state": target.value}


def lost_race(job_id: int, source: JobState, fence: int | None) -> StaleState:
    """The error of a transition whose row was no longer in ``source`` (at ``fence``)."""
    at = f" attempt {fence}" if fence is not None else ""
    return StaleState(f"job {job_id}{at} is no longer {source.value}")


def ended_attempt_values(
    outcome: AttemptOutcome, exit_code: int | None, now: float, usage: dict[str, Any] | None
) -> dict[str, Any]:
    """The columns that close an attempt's row, with what it used where its agent measured
    it (``usage``: :data:`~ebbtide.queue.models.USAGE_COLUMNS`; other keys are not ours)."""
    measured = {k: v for k, v in (usage or {}).items() if k in USAGE_COLUMNS}
    return {"outcome": outcome.value, "exit_code": exit_code, "ended_at": now, **measured}


class JobLogic(Shared):
    """:meth:`spec` and :meth:`transition`."""

    def spec(self, job_id: int) -> JobSpec:
        return JobSpec.model_validate_json(self.get(job_id).spec_json)

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
        """Move one job from ``source`` to ``target`` and record ``event``, in one write
        (see :meth:`Backend._transition`)."""
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
