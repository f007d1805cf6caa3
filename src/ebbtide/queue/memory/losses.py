"""Losses in memory: attempts given up on, and the jobs held because they keep being lost
(:func:`~ebbtide.queue.outcomes.hold_after_losses` decides), as the SQL store's
:mod:`~ebbtide.queue.store.losses` does them."""

from __future__ import annotations

import json
from bisect import bisect_right
from typing import Any

from ebbtide.errors import StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.memory.queries import MemoryQueryMixin
from ebbtide.queue.states import ACTIVE_STATES, AttemptOutcome, EventType, JobState
from ebbtide.queue.store.losses import LOST_LOOKBACK_S, LOST_RESCAN_EVENTS


class MemoryLossMixin(MemoryQueryMixin):
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
        """Give up on an attempt whose agent is gone or whose start never happened (see
        the SQL store's)."""
        job = self.get(job_id)
        if job.attempts != attempt or job.state not in {s.value for s in ACTIVE_STATES}:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")
        source = JobState(job.state)
        with self._tx():
            lost = {"reason": why, **({"reason_code": reason_code} if reason_code else {})}
            self._event(job_id, EventType.LOST, attempt=attempt, data=lost)
            changes: dict[str, Any] = {"node": None, "devices": None}
            if job.cancel_requested:
                changes.update(reason="cancelled", finished_at=self.clock.time())
                self._transition(
                    job_id,
                    source,
                    JobState.CANCELLED,
                    event=EventType.CANCELLED,
                    attempt=attempt,
                    changes=changes,
                )
            else:
                changes.update(reason=f"requeued: {why}", requeued_at=self.clock.time())
                self._transition(
                    job_id,
                    source,
                    JobState.QUEUED,
                    event=EventType.REQUEUED,
                    attempt=attempt,
                    data={"reason": why},
                    changes=changes,
                )
            self._end_attempt(job_id, attempt, AttemptOutcome.LOST, None, usage)
            if max_losses is not None and not job.cancel_requested:
                self._hold_if_lost_too_often(job_id, attempt, max_losses, loss_window_s)

    def hold_lost(
        self, max_losses: int, loss_window_s: float, *, after_event: int | None = None
    ) -> tuple[list[int], int]:
        """Hold the queued jobs whose latest attempt was lost and that keep being lost,
        looking at those with a ``lost`` event after event id ``after_event`` (None: of
        the last :data:`LOST_LOOKBACK_S`); their ids, and the last event id looked at."""
        data = self._data
        with data.lock:
            if after_event is None:
                since = self.clock.time() - max(LOST_LOOKBACK_S, loss_window_s)
                after_event = self._first_event_id(since) - 1
            newest = (data.event_ids[-1] if data.event_ids else None) or after_event
            since_id = after_event - LOST_RESCAN_EVENTS
            start = bisect_right(data.event_ids, since_id)
            recent = {
                e["job_id"]
                for e in data.events[start:]
                if e["id"] <= newest and e["type"] == EventType.LOST.value
            }
            lost = []
            for job_id in sorted(recent):
                row = data.jobs.get(job_id)
                if row is None or row["state"] != JobState.QUEUED.value:
                    continue
                current = self._attempt(job_id, row["attempts"])
                if current is None or current["outcome"] != AttemptOutcome.LOST.value:
                    continue
                losses = self._losses_since_release(job_id)
                if outcomes.hold_after_losses(losses, max_losses, loss_window_s):
                    lost.append((job_id, row["attempts"]))
        held = []
        for job_id, attempt in lost:  # decided again where it is written
            try:
                with self._tx():
                    if self._hold_if_lost_too_often(job_id, attempt, max_losses, loss_window_s):
                        held.append(job_id)
            except StaleState:
                continue
        return held, int(newest)

    def _hold_if_lost_too_often(
        self, job_id: int, attempt: int, max_losses: int, window_s: float
    ) -> bool:
        """Hold the (queued) job if its losses since its last ``qrls`` say so."""
        hold = outcomes.hold_after_losses(self._losses_since_release(job_id), max_losses, window_s)
        if hold is None:
            return False
        self._transition(
            job_id,
            JobState.QUEUED,
            JobState.HELD,
            event=EventType.HELD,
            attempt=attempt,
            data={"by": "policy", "reason": hold},
            changes={"reason": hold},
        )
        return True

    def _losses_since_release(self, job_id: int) -> list[outcomes.Loss]:
        """The job's lost attempts since its last ``qrls`` (all, if never), oldest first."""
        losses: list[outcomes.Loss] = []
        for e in self._data.events_of.get(job_id, ()):
            if e["type"] == EventType.RELEASED.value:
                losses = []
            elif e["type"] == EventType.LOST.value:
                data = json.loads(e["data_json"] or "{}")
                losses.append(
                    outcomes.Loss(
                        attempt=int(e["attempt"] or 0),
                        at=float(e["time"]),
                        reason=str(data.get("reason", "")),
                        reason_code=data.get("reason_code"),
                    )
                )
        return losses
