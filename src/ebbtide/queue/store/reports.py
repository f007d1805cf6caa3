"""Fleet-wide reads of the event history: the latest evictions (``ebb top``) and the rows
``ebb report`` counts, each a bounded read of the events' primary key however long the
history."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.states import ACTIVE_STATES, EventType
from ebbtide.queue.store.base import ATTEMPTS, EVENTS, JOBS, NODES, StoreBase

#: How many of the latest events :meth:`Store.recent_evictions` looks through, in events.
RECENT_EVICTIONS_SCAN_EVENTS = 200_000
#: How far an event's time may lag behind the order of ids for :meth:`Store.report_rows`
#: to find it, in seconds (agents report pauses and checkpoints with their own times).
REPORT_EVENT_ORDER_SLACK_S = 3600.0
#: The events a report reads (not checkpoints, results, alterations ...).
REPORT_EVENT_TYPES = tuple(
    t.value
    for t in (
        EventType.SUBMITTED,
        EventType.RELEASED,
        EventType.DEPENDENCIES_MET,
        EventType.DISPATCHED,
        EventType.PAUSED,
        EventType.THAWED,
        EventType.EVICTED,
        EventType.REQUEUED,
        EventType.LOST,
        EventType.SUCCEEDED,
        EventType.FAILED,
        EventType.CANCELLED,
    )
)
#: The events that end an attempt (or a job).
END_EVENT_TYPES = tuple(
    t.value
    for t in (
        EventType.EVICTED,
        EventType.REQUEUED,
        EventType.LOST,
        EventType.SUCCEEDED,
        EventType.FAILED,
        EventType.CANCELLED,
    )
)


class ReportMixin(StoreBase):
    """:meth:`recent_evictions` and :meth:`report_rows`."""

    def recent_evictions(
        self, limit: int, *, scan_events: int = RECENT_EVICTIONS_SCAN_EVENTS
    ) -> list[dict[str, Any]]:
        """The fleet's last ``limit`` ``evicted`` events, newest first, among the last
        ``scan_events`` events of all kinds (a bounded read of the primary key however
        long the history): ``job_id``, ``attempt``, ``time``, the job's ``owner`` and
        ``queue``, the ``node`` and ``devices`` it was evicted from, and the event's
        data (``reason``, ``reason_code``, ``latency_s``, ``deadline_s``,
        ``deadline_missed``, ``killed`` ...).  For ``ebb top``."""
        e, a, j = EVENTS.c, ATTEMPTS.c, JOBS.c
        newest = sa.select(sa.func.coalesce(sa.func.max(e.id), 0)).scalar_subquery()
        stmt = (
            sa.select(e.job_id, e.attempt, e.time, e.data_json, j.owner, j.queue, a.node, a.devices)
            .select_from(
                EVENTS.join(JOBS, j.id == e.job_id).outerjoin(
                    ATTEMPTS, sa.and_(a.job_id == e.job_id, a.number == e.attempt)
                )
            )
            .where(e.type == EventType.EVICTED.value, e.id > newest - scan_events)
            .order_by(e.id.desc())
            .limit(limit)
        )
        out = []
        with self._read() as conn:
            for job_id, attempt, at, data, owner, queue, node, devices in conn.execute(stmt):
                event = json.loads(data or "{}")
                event.update(
                    job_id=job_id,
                    attempt=attempt,
                    time=at,
                    owner=owner,
                    queue=queue,
                    node=node,
                    devices=[int(d) for d in devices.split(",")] if devices else [],
                )
                out.append(event)
        return out

    def report_rows(self, since: float, until: float) -> dict[str, list[dict[str, Any]]]:
        """What ``ebb report`` counts for ``[since, until)`` (Unix seconds), as plain rows
        for :func:`ebbtide.report.report_from_rows`:

        - ``events``: the events of the kinds in :data:`REPORT_EVENT_TYPES` before
          ``until`` of the jobs concerned — those with an event inside the window, with an
          attempt that ended after it, or with one running now — each with its job's
          ``queue`` and ``owner`` and its own ``data`` (before the window too: when a job
          became queued, when a pause began);
        - ``attempts``: those jobs' attempts that held a slice inside the window;
        - ``nodes``: the nodes known now, with their device counts.

        Events have no index on their time but their ids grow with it: a bisection of the
        primary key finds the first event of the window (allowing
        :data:`REPORT_EVENT_ORDER_SLACK_S` for events reported late), and the rest are
        read from there on and by job id.  So the cost follows the events since ``since``,
        not the whole history.
        """
        e, a, j = EVENTS.c, ATTEMPTS.c, JOBS.c
        with self._read() as conn:
            first = self._first_event_id(conn, since - REPORT_EVENT_ORDER_SLACK_S)
            recent = sa.and_(e.id >= first, e.time >= since)
            concerned = sa.union(
                sa.select(e.job_id).where(recent, e.time < until),
                sa.select(e.job_id).where(recent, e.type.in_(END_EVENT_TYPES)),
                sa.select(j.id).where(j.state.in_([s.value for s in ACTIVE_STATES])),
            ).subquery()
            events = conn.execute(
                sa.select(e.id, e.job_id, e.attempt, e.type, e.time, e.data_json, j.queue, j.owner)
                .select_from(EVENTS.join(JOBS, j.id == e.job_id))
                .where(
                    e.job_id.in_(sa.select(concerned.c[0])),
                    e.type.in_(REPORT_EVENT_TYPES),
                    e.time < until,
                )
                .order_by(e.id)
            ).all()
            attempts = conn.execute(
                sa.select(
                    a.job_id,
                    a.number,
                    j.queue,
                    j.owner,
                    a.node,
                    a.devices,
                    a.compute_pct,
                    a.memory_mib,
                    a.dispatched_at,
                    a.started_at,
                    a.ended_at,
                    a.outcome,
                )
                .select_from(ATTEMPTS.join(JOBS, j.id == a.job_id))
                .where(
                    a.job_id.in_(sa.select(concerned.c[0])),
                    a.dispatched_at < until,
                    sa.or_(a.ended_at.is_(None), a.ended_at >= since),
                )
                .order_by(a.job_id, a.number)
            ).mappings()
            attempt_rows = [
                dict(r, devices=[int(d) for d in r["devices"].split(",") if d]) for r in attempts
            ]
            nodes = conn.execute(
                sa.select(
                    NODES.c.name, NODES.c.started_at, NODES.c.heartbeat_at, NODES.c.devices_json
                )
            ).all()
        # each node's latest heartbeat, as ``nodes()`` has it: the store's may be up to 30 s
        # older than the liveness in Redis where agents keep alive there
        seen = self.liveness.seen() if self.liveness is not None else {}
        return {
            "events": [
                {
                    "id": r[0],
                    "job_id": r[1],
                    "attempt": r[2],
                    "type": r[3],
                    "time": r[4],
                    "data": json.loads(r[5] or "{}"),
                    "queue": r[6],
                    "owner": r[7],
                }
                for r in events
            ],
            "attempts": attempt_rows,
            "nodes": [
                {
                    "name": name,
                    "started_at": started,
                    "heartbeat_at": max(beat, seen.get(name, beat)),
                    "devices": len(json.loads(devices or "[]")),
                }
                for name, started, beat, devices in nodes
            ],
        }
