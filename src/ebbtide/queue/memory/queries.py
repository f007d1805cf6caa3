"""Queries in memory: jobs, their specs, events and attempts, measured usage, counts per
queue, the scheduler's queued jobs and active attempts, nodes and the published policy.
Reads only; each takes the lock and copies out, in the SQL store's orders."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ebbtide.errors import JobNotFound
from ebbtide.queue.lifecycle.jobs import JobLogic
from ebbtide.queue.memory.base import MemoryBase, Row
from ebbtide.queue.models import Attempt, Job, NodeRow
from ebbtide.queue.rightsizing import RECENT_JOBS, MeasuredAttempt
from ebbtide.queue.states import ACTIVE_STATES, FINAL_STATES, JobState
from ebbtide.scheduling.snapshot import ActiveAttempt, QueuedJob


class MemoryQueryMixin(MemoryBase, JobLogic):
    """What jobs there are and what happened to them."""

    def _row(self, job_id: int) -> Row:
        row = self._data.jobs.get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return row

    def get(self, job_id: int) -> Job:
        with self._data.lock:
            row = dict(self._row(job_id))
        return Job.model_validate(row)

    def _rows(
        self,
        states: Iterable[JobState] | None,
        owner: str | None,
        *,
        queue: str | None = None,
        array_id: int | None = None,
        ids: Iterable[int] | None = None,
    ) -> list[Row]:
        """The job rows that match, in id order (the lock held by the caller)."""
        jobs = self._data.jobs
        if states is not None:
            rows = [jobs[i] for i in self._ids_in(states)]
        elif ids is not None:
            rows = [jobs[i] for i in sorted(set(ids)) if i in jobs]
        else:
            rows = list(jobs.values())
        wanted = None if ids is None else set(ids)
        return [
            r
            for r in rows
            if (owner is None or r["owner"] == owner)
            and (queue is None or r["queue"] == queue)
            and (array_id is None or r["array_id"] == array_id)
            and (wanted is None or r["id"] in wanted)
        ]

    def list_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
        queue: str | None = None,
        array_id: int | None = None,
        ids: Iterable[int] | None = None,
        limit: int | None = None,
        ran: bool = False,
    ) -> list[Job]:
        with self._data.lock:
            rows = self._rows(states, owner, queue=queue, array_id=array_id, ids=ids)
            if ran:
                rows = [r for r in rows if r["attempts"] > 0]
            rows = [dict(r) for r in (rows if limit is None else rows[: max(limit, 0)])]
        return [Job.model_validate(r) for r in rows]

    def job_rows(
        self,
        columns: Sequence[str],
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
    ) -> list[tuple[Any, ...]]:
        """``columns`` of the jobs :meth:`list_jobs` lists, a tuple each, oldest first."""
        with self._data.lock:
            return [tuple(r[c] for c in columns) for r in self._rows(states, owner)]

    def events(self, job_id: int) -> list[dict[str, Any]]:
        """The job's events, oldest first: ``type``, ``time`` (Unix s), ``attempt`` and data."""
        with self._data.lock:
            self._row(job_id)
            rows = list(self._data.events_of.get(job_id, ()))
        out = []
        for r in rows:
            event = {"type": r["type"], "time": r["time"], "attempt": r["attempt"]}
            event.update(json.loads(r["data_json"] or "{}"))
            out.append(event)
        return out

    def attempts(self, job_id: int) -> list[Attempt]:
        with self._data.lock:
            rows = [dict(r) for r in self._data.attempts.get(job_id, ())]
        return [Attempt.model_validate(r) for r in rows]

    def eviction_request(self, job_id: int, attempt: int) -> dict[str, Any] | None:
        """What the last ``evict_requested`` of this attempt said, or None."""
        with self._data.lock:
            for e in reversed(self._data.events_of.get(job_id, ())):
                if e["attempt"] == attempt and e["type"] == "evict_requested":
                    return json.loads(e["data_json"]) if e["data_json"] else None
        return None

    def measured_attempts(
        self,
        *,
        job_id: int | None = None,
        owner: str | None = None,
        queue: str | None = None,
        jobs: int = RECENT_JOBS,
    ) -> list[MeasuredAttempt]:
        """The attempts whose usage an agent measured, oldest first: job ``job_id``'s,
        else those of the latest ``jobs`` finished jobs of ``owner`` and/or in ``queue``
        that have one (``ebb recommend``)."""
        data = self._data
        with data.lock:

            def measured(i: int) -> list[Row]:
                return [a for a in data.attempts.get(i, ()) if (a["usage_samples"] or 0) > 0]

            if job_id is not None:
                chosen = [job_id] if job_id in data.jobs else []
            else:
                finished = self._rows(FINAL_STATES, owner, queue=queue)
                latest = [r["id"] for r in reversed(finished) if measured(r["id"])]
                chosen = sorted(latest[: max(jobs, 0)])
            rows = [(data.jobs[i], a) for i in chosen for a in measured(i)]
            return [
                MeasuredAttempt(
                    job_id=a["job_id"],
                    name=j["name"],
                    owner=j["owner"],
                    queue=j["queue"],
                    attempt=a["number"],
                    compute_pct=a["compute_pct"],
                    gpus=j["gpus"],
                    memory_mib=a["memory_mib"],
                    samples=a["usage_samples"],
                    compute_p95_pct=a["used_compute_p95_pct"],
                    compute_peak_pct=a["used_compute_peak_pct"],
                    memory_p95_mib=a["used_memory_p95_mib"],
                    memory_peak_mib=a["used_memory_peak_mib"],
                )
                for j, a in rows
            ]

    def queue_stats(self, states: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
        """Jobs per queue and state (``qstat -Q``); only in ``states`` when given."""
        out: dict[str, dict[str, int]] = {}
        with self._data.lock:
            rows = (
                self._data.jobs.values()
                if states is None
                else [self._data.jobs[i] for i in self._ids_in(states)]
            )
            for r in rows:
                per_state = out.setdefault(r["queue"], {})
                per_state[r["state"]] = per_state.get(r["state"], 0) + 1
        return out

    # -- scheduling ---------------------------------------------------------------------

    def queued_jobs(self, limit: int | None = None) -> list[QueuedJob]:
        """Queued jobs in scheduling order: priority (high first), then submission order."""
        with self._data.lock:
            rows = self._rows([JobState.QUEUED], None)
            rows.sort(key=lambda r: -r["priority"])  # stable: ids ascend within a priority
            if limit is not None:
                rows = rows[: max(limit, 0)]
            return [queued_job(r) for r in rows]

    def active_attempts(self, node: str | None = None) -> list[ActiveAttempt]:
        out = []
        with self._data.lock:
            for r in self._rows(ACTIVE_STATES, None):
                a = self._attempt(r["id"], r["attempts"])
                if a is None or (node is not None and r["node"] != node):
                    continue
                out.append(active_attempt(r, a))
        return out

    # -- nodes and the published policy ---------------------------------------------------

    def nodes(self) -> list[NodeRow]:
        with self._data.lock:
            rows = [dict(self._data.nodes[name]) for name in sorted(self._data.nodes)]
        return [NodeRow(**r) for r in rows]

    def published_policy(self) -> tuple[str, str, float] | None:
        """``(text, source, published at)`` of the leader's policy; None when none was."""
        with self._data.lock:
            row = dict(self._data.leadership)
        if row["policy_text"] is None:
            return None
        return (
            str(row["policy_text"]),
            str(row["policy_source"] or "the scheduler's policy"),
            float(row["policy_at"] or 0.0),
        )


def queued_job(r: Row) -> QueuedJob:
    """A queued job's row as the planner sees it."""
    return QueuedJob(
        r["id"],
        r["priority"],
        r["queue"],
        r["owner"],
        r["compute_pct"],
        r["gpus"],
        r["memory_mib"],
        r["array_id"],
        r["array_limit"],
        r["attempts"],
        deadline_s=r["deadline_s"],
        first_checkpoint_s=r["first_checkpoint_s"],
        requeued_at=r["requeued_at"],
        evictions=r["evictions"],
        submitted_at=r["submitted_at"],
    )


def active_attempt(r: Row, a: Row) -> ActiveAttempt:
    """An active job's row ``r`` and its current attempt's row ``a`` as the planner sees
    them."""
    devices = tuple(int(d) for d in r["devices"].split(",")) if r["devices"] else ()
    return ActiveAttempt(
        job_id=r["id"],
        attempt=r["attempts"],
        state=JobState(r["state"]),
        priority=r["priority"],
        queue=r["queue"],
        node=r["node"],
        devices=devices,
        compute_pct=r["compute_pct"],
        memory_mib=r["memory_mib"],
        deadline_s=r["deadline_s"],
        signal=r["signal"],
        dispatched_at=a["dispatched_at"],
        started_at=a["started_at"],
        last_checkpoint_at=a["last_checkpoint_at"],
        cancel_requested=bool(r["cancel_requested"]),
        array_id=r["array_id"],
        gpus=r["gpus"],
        owner=r["owner"],
        paused_at=r["paused_at"],
        pausable=bool(r["pausable"]),
        suspended_at=r["suspended_at"],
    )
