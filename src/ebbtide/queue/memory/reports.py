"""Fleet-wide reads of the event history in memory: the latest evictions (``ebb top``) and
the rows ``ebb report`` counts, with the SQL store's results (its bisection of the event
ids included, :meth:`~ebbtide.queue.memory.base.MemoryBase._first_event_id`)."""

from __future__ import annotations

import json
from bisect import bisect_left
from typing import Any

from ebbtide.queue.memory.base import MemoryBase
from ebbtide.queue.states import ACTIVE_STATES, EventType
from ebbtide.queue.store.reports import (
    END_EVENT_TYPES,
    RECENT_EVICTIONS_SCAN_EVENTS,
    REPORT_EVENT_ORDER_SLACK_S,
    REPORT_EVENT_TYPES,
)


class MemoryReportMixin(MemoryBase):
    """:meth:`recent_evictions` and :meth:`report_rows`."""

    def recent_evictions(
        self, limit: int, *, scan_events: int = RECENT_EVICTIONS_SCAN_EVENTS
    ) -> list[dict[str, Any]]:
        """The fleet's last ``limit`` ``evicted`` events, newest first, among the last
        ``scan_events`` events of all kinds (see the SQL store's)."""
        data = self._data
        out: list[dict[str, Any]] = []
        with data.lock:
            newest = data.event_ids[-1] if data.event_ids else 0
            start = bisect_left(data.event_ids, newest - scan_events + 1)
            for e in reversed(data.events[start:]):
                if len(out) >= limit:
                    break
                job = data.jobs.get(e["job_id"])
                if e["type"] != EventType.EVICTED.value or job is None:
                    continue
                attempt = self._attempt(e["job_id"], e["attempt"]) if e["attempt"] else None
                devices = attempt["devices"] if attempt else None
                event = json.loads(e["data_json"] or "{}")
                event.update(
                    job_id=e["job_id"],
                    attempt=e["attempt"],
                    time=e["time"],
                    owner=job["owner"],
                    queue=job["queue"],
                    node=attempt["node"] if attempt else None,
                    devices=[int(d) for d in devices.split(",")] if devices else [],
                )
                out.append(event)
        return out

    def report_rows(self, since: float, until: float) -> dict[str, list[dict[str, Any]]]:
        """What ``ebb report`` counts for ``[since, until)`` (Unix seconds): the SQL
        store's ``events``, ``attempts`` and ``nodes`` rows (see its doc)."""
        data = self._data
        with data.lock:
            first = self._first_event_id(since - REPORT_EVENT_ORDER_SLACK_S)
            recent = data.events[bisect_left(data.event_ids, first) :]
            concerned = {
                e["job_id"]
                for e in recent
                if e["time"] >= since and (e["time"] < until or e["type"] in END_EVENT_TYPES)
            }
            concerned.update(self._ids_in(ACTIVE_STATES))
            jobs = data.jobs
            events = [
                {
                    "id": e["id"],
                    "job_id": e["job_id"],
                    "attempt": e["attempt"],
                    "type": e["type"],
                    "time": e["time"],
                    "data": json.loads(e["data_json"] or "{}"),
                    "queue": jobs[e["job_id"]]["queue"],
                    "owner": jobs[e["job_id"]]["owner"],
                }
                for e in sorted(
                    (e for job_id in concerned for e in data.events_of.get(job_id, ())),
                    key=lambda e: e["id"],
                )
                if e["job_id"] in jobs and e["type"] in REPORT_EVENT_TYPES and e["time"] < until
            ]
            attempts = [
                {
                    "job_id": a["job_id"],
                    "number": a["number"],
                    "queue": jobs[job_id]["queue"],
                    "owner": jobs[job_id]["owner"],
                    "node": a["node"],
                    "devices": [int(d) for d in a["devices"].split(",") if d],
                    "compute_pct": a["compute_pct"],
                    "memory_mib": a["memory_mib"],
                    "dispatched_at": a["dispatched_at"],
                    "started_at": a["started_at"],
                    "ended_at": a["ended_at"],
                    "outcome": a["outcome"],
                }
                for job_id in sorted(concerned)
                if job_id in jobs
                for a in data.attempts.get(job_id, ())
                if a["dispatched_at"] < until and (a["ended_at"] is None or a["ended_at"] >= since)
            ]
            nodes = [
                {
                    "name": n["name"],
                    "started_at": n["started_at"],
                    "heartbeat_at": n["heartbeat_at"],
                    "devices": len(json.loads(n["devices_json"] or "[]")),
                }
                for n in data.nodes.values()
            ]
        return {"events": events, "attempts": attempts, "nodes": nodes}
