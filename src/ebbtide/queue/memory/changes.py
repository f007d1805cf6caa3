"""Changes in memory: which jobs have new events since a cursor, and their rows now, as
the SQL store's :mod:`~ebbtide.queue.store.changes` says (the same cursor, the same
arithmetic: :func:`~ebbtide.queue.store.changes.advance`).  Writes here hold one lock, so
events appear in id order; an id a failed write took is a gap that never fills, and
expires as the SQL store's do."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from ebbtide.queue.memory.queries import MemoryQueryMixin, active_attempt, queued_job
from ebbtide.queue.states import ACTIVE_STATES, JobState
from ebbtide.queue.store.changes import (
    MAX_CHANGE_EVENTS,
    START_MARGIN_EVENTS,
    Changes,
    EventCursor,
    advance,
)
from ebbtide.scheduling.snapshot import ActiveAttempt, QueuedJob


class MemoryChangeMixin(MemoryQueryMixin):
    """:meth:`changes_since`."""

    def changes_since(
        self, cursor: EventCursor | None, *, max_events: int = MAX_CHANGE_EVENTS
    ) -> Changes | None:
        """The jobs with events since ``cursor``, their rows now, and the next cursor;
        None when ``cursor`` cannot be followed (read everything again)."""
        data = self._data
        now = self.clock.time()
        with data.lock:
            ids, events = data.event_ids, data.events
            if cursor is None:
                if not ids:
                    return Changes(EventCursor())
                high = ids[-1]
                low = max(0, high - START_MARGIN_EVENTS)
                present = set(ids[bisect_right(ids, low) :])
                gaps = {i: now for i in range(low + 1, high) if i not in present}
                return Changes(EventCursor(high, gaps, events[-1]["job_id"]))
            if cursor.high:
                at = bisect_left(ids, cursor.high)
                if at == len(ids) or ids[at] != cursor.high:
                    return None
                if events[at]["job_id"] != cursor.anchor:
                    return None
            start = bisect_right(ids, cursor.high)
            if len(ids) - start > max_events:
                return None
            new = [(e["id"], e["job_id"]) for e in events[start:]]
            filled = []
            for gap in cursor.gaps:
                at = bisect_left(ids, gap)
                if at < len(ids) and ids[at] == gap:
                    filled.append((gap, events[at]["job_id"]))
            after = advance(cursor, new, (i for i, _ in filled), now)
            if after is None:
                return None
            job_ids = frozenset(j for _, j in new) | frozenset(j for _, j in filled)
            queued: list[QueuedJob] = []
            active: list[ActiveAttempt] = []
            active_states = {s.value for s in ACTIVE_STATES}
            for job_id in sorted(job_ids):
                row = data.jobs.get(job_id)
                if row is None:
                    continue
                if row["state"] == JobState.QUEUED.value:
                    queued.append(queued_job(row))
                elif row["state"] in active_states:
                    attempt = self._attempt(job_id, row["attempts"])
                    if attempt is not None:
                        active.append(active_attempt(row, attempt))
        queued.sort(key=lambda q: (-q.priority, q.id))
        return Changes(after, job_ids, queued, active)
