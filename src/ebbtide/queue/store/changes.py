"""Changes: which jobs have new events since a cursor on the event ids, and their rows now,
for a scheduler that keeps its own copy of the queue
(:class:`~ebbtide.scheduling.mirror.Mirror`) instead of reading all of it every pass.

Why a cursor needs more than the highest id seen.  Every change to a column that
:meth:`Store.queued_jobs` or :meth:`Store.active_attempts` returns is written together
with an event, in one transaction (transitions, ``qalter``, cancellation requests,
checkpoints, pauses, thaws and suspensions, dispatch and start; the purge removes only
finished jobs, which are in neither).  Event ids come from a sequence when the row is
inserted, not when its transaction commits: on PostgreSQL a transaction can commit event
10 after another one committed event 11, and a reader that only asks for ``id > 11`` once
it has seen 11 never sees 10.

The choice here: **remember the gaps**.  :class:`EventCursor` holds the highest id seen
and every id below it not seen yet (a gap), each with when it was first missed; every
call asks for the events above the highest id *and* for the gaps again, so an event
committed late is found on the next call.  A gap that never fills is an id a rolled-back
transaction took (a lost race after the event was written, a sequence's ids cached by a
crashed server); it is dropped after :data:`GAP_EXPIRY_S`, longer than any of the
store's write transactions (a few statements on rows by key) can last.  Re-reading a
fixed margin of recent ids instead would read the same events again each pass, and a
transaction slower than the margin would still be missed; gaps cost nothing while the
ids are dense, which they are but for rare rollbacks.  Whatever is still missed (a
transaction that outlived the expiry) is bounded by the mirror's periodic full rebuild.

A cursor begins (``changes_since(None)``) at the highest id committed, with the ids not
present among the :data:`START_MARGIN_EVENTS` below it as gaps: the transactions still in
flight at that moment.  The reader then reads everything (the full rebuild); an event
committed after it began is found as a gap or above the cursor, and re-reading a job's
current row twice is harmless.

SQLite commits in id order (one writer at a time), but it may give the highest id again
once that row is deleted (the purge, for events of jobs finished long ago).  So the cursor
also keeps the job of the event at its highest id (its anchor): when that event is gone
or is another one, the cursor is no longer trusted and the caller reads everything again.

:func:`advance` is the cursor's arithmetic, shared with the in-memory store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ebbtide.queue.store.base import EVENTS, JOBS
from ebbtide.queue.store.queries import QueryMixin
from ebbtide.scheduling.snapshot import ActiveAttempt, QueuedJob

#: A gap (an event id below the highest seen, not seen yet) is dropped this long after it
#: was first missed, in seconds: a transaction this old has rolled back (it took an id
#: and wrote nothing), as no write transaction of the store lasts anywhere near as long.
GAP_EXPIRY_S = 600.0
#: More gaps than this and the cursor is given up (the caller reads everything), in ids.
MAX_GAPS = 10_000
#: A new cursor counts the ids missing among this many below the highest as gaps (the
#: transactions in flight when it begins), in events.
START_MARGIN_EVENTS = 1_000
#: More new events than this since the cursor and the caller reads everything instead
#: (cheaper than one lookup per job), in events.
MAX_CHANGE_EVENTS = 50_000
#: Ids per ``IN (...)`` list of one statement (SQLite's bound on parameters).
IDS_PER_STATEMENT = 900


@dataclass(frozen=True)
class EventCursor:
    """Where a reader of the events stands: everything up to ``high`` seen, but ``gaps``."""

    #: the highest event id seen (0: none)
    high: int = 0
    #: the ids below ``high`` not seen yet, each with when it was first missed (Unix s)
    gaps: Mapping[int, float] = field(default_factory=dict)
    #: the job of the event at ``high`` (None: no event yet); see the module doc
    anchor: int | None = None


@dataclass(frozen=True)
class Changes:
    """What changed since a cursor: the jobs with new events and their rows now."""

    #: where the next call starts
    cursor: EventCursor
    #: the jobs with events since the cursor (its gaps filled included)
    job_ids: frozenset[int] = frozenset()
    #: those of them queued now, in scheduling order
    queued: Sequence[QueuedJob] = ()
    #: those of them holding a slice now, by job id; the others are in neither
    active: Sequence[ActiveAttempt] = ()


def advance(
    cursor: EventCursor,
    new: Sequence[tuple[int, int]],
    filled: Iterable[int],
    now: float,
    *,
    anchor: int | None = None,
) -> EventCursor | None:
    """The cursor after reading ``new`` (``(id, job id)`` of the events above
    ``cursor.high``, by id) and finding the gaps ``filled``; None when there would be more
    than :data:`MAX_GAPS` gaps (give the cursor up).  Gaps older than
    :data:`GAP_EXPIRY_S` at ``now`` are dropped; ``anchor``: the job of the event at the
    highest id when ``new`` is empty and the cursor has none yet."""
    done = set(filled)
    gaps = {i: t for i, t in cursor.gaps.items() if i not in done and now - t < GAP_EXPIRY_S}
    if not new:
        return EventCursor(cursor.high, gaps, cursor.anchor if anchor is None else anchor)
    high = new[-1][0]
    missing = (high - cursor.high) - len(new)
    if len(gaps) + missing > MAX_GAPS:
        return None
    if missing:
        expected = cursor.high + 1
        for event_id, _ in new:
            for gap in range(expected, event_id):
                gaps[gap] = now
            expected = event_id + 1
    return EventCursor(high, gaps, new[-1][1])


def chunks(ids: Iterable[int], size: int = IDS_PER_STATEMENT) -> Iterable[list[int]]:
    """``ids``, sorted, ``size`` at a time."""
    ordered = sorted(ids)
    for i in range(0, len(ordered), size):
        yield ordered[i : i + size]


class ChangeMixin(QueryMixin):
    """:meth:`changes_since`."""

    def changes_since(
        self, cursor: EventCursor | None, *, max_events: int = MAX_CHANGE_EVENTS
    ) -> Changes | None:
        """The jobs with events since ``cursor``, their rows now, and the next cursor (see
        the module doc).  ``cursor`` None: a new cursor at the latest event, no jobs (read
        everything after it).  None when ``cursor`` cannot be followed: more than
        ``max_events`` new events, too many gaps, or its anchor event gone (read
        everything again, from a new cursor)."""
        e = EVENTS.c
        now = self.clock.time()
        with self._read() as conn:
            if cursor is None:
                return Changes(self._start_cursor(conn, now))
            if cursor.high:
                anchor = conn.execute(sa.select(e.job_id).where(e.id == cursor.high)).scalar()
                if anchor is None or anchor != cursor.anchor:
                    return None
            new = [
                (int(i), int(j))
                for i, j in conn.execute(
                    sa.select(e.id, e.job_id)
                    .where(e.id > cursor.high)
                    .order_by(e.id)
                    .limit(max_events + 1)
                )
            ]
            if len(new) > max_events:
                return None
            filled: list[tuple[int, int]] = []
            for part in chunks(cursor.gaps):
                stmt = sa.select(e.id, e.job_id).where(e.id.in_(part))
                filled.extend((int(i), int(j)) for i, j in conn.execute(stmt))
            after = advance(cursor, new, (i for i, _ in filled), now)
            if after is None:
                return None
            job_ids = frozenset(j for _, j in new) | frozenset(j for _, j in filled)
            queued: list[QueuedJob] = []
            active: list[ActiveAttempt] = []
            for part in chunks(job_ids):
                queued.extend(self._queued_rows(conn, JOBS.c.id.in_(part)))
                active.extend(self._active_rows(conn, JOBS.c.id.in_(part)))
        queued.sort(key=lambda q: (-q.priority, q.id))
        active.sort(key=lambda a: a.job_id)
        return Changes(after, job_ids, queued, active)

    def _start_cursor(self, conn: Connection, now: float) -> EventCursor:
        e = EVENTS.c
        top = conn.execute(sa.select(e.id, e.job_id).order_by(e.id.desc()).limit(1)).first()
        if top is None:
            return EventCursor()
        high, anchor = int(top[0]), int(top[1])
        low = max(0, high - START_MARGIN_EVENTS)
        present = set(conn.execute(sa.select(e.id).where(e.id > low, e.id <= high)).scalars())
        gaps = {i: now for i in range(low + 1, high) if i not in present}
        return EventCursor(high, gaps, anchor)
