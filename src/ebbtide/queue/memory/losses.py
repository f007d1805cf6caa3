"""Losses in memory: the jobs held because they keep being lost
(:func:`~ebbtide.queue.outcomes.hold_after_losses` decides), as the SQL store's
:mod:`~ebbtide.queue.store.losses` finds them."""

from __future__ import annotations

from bisect import bisect_right

from ebbtide.errors import StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.lifecycle.losses import LossLogic, hold_if_lost_too_often
from ebbtide.queue.memory.queries import MemoryQueryMixin
from ebbtide.queue.states import AttemptOutcome, EventType, JobState
from ebbtide.queue.store.losses import LOST_LOOKBACK_S, LOST_RESCAN_EVENTS


class MemoryLossMixin(MemoryQueryMixin, LossLogic):
    """:meth:`hold_lost` (and the shared :meth:`requeue_lost`)."""

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
                losses = self._losses_since_release(data, job_id)
                if outcomes.hold_after_losses(losses, max_losses, loss_window_s):
                    lost.append((job_id, row["attempts"]))
        held = []
        for job_id, attempt in lost:  # decided again where it is written
            try:
                with self._tx() as data:
                    if hold_if_lost_too_often(
                        self, data, job_id, attempt, max_losses, loss_window_s
                    ):
                        held.append(job_id)
            except StaleState:
                continue
        return held, int(newest)
