"""Queries: jobs, their specs, events and attempts, measured usage, counts per queue, and
the queued jobs and active attempts a scheduling pass starts from.  Reads only."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from ebbtide.errors import JobNotFound
from ebbtide.queue.lifecycle.jobs import JobLogic
from ebbtide.queue.models import Attempt, Job
from ebbtide.queue.rightsizing import RECENT_JOBS, MeasuredAttempt
from ebbtide.queue.states import FINAL_STATES, JobState
from ebbtide.queue.store import statements
from ebbtide.queue.store.base import ATTEMPTS, EVENTS, JOBS
from ebbtide.queue.store.transitions import TransitionMixin
from ebbtide.scheduling.snapshot import ActiveAttempt, QueuedJob


def array_tasks(conn: Connection, array_ids: Iterable[int]) -> list[tuple[int, str]]:
    """``(array_id, state)`` of every task of these arrays."""
    stmt = sa.select(JOBS.c.array_id, JOBS.c.state).where(JOBS.c.array_id.in_(list(array_ids)))
    return [(int(a), str(s)) for a, s in conn.execute(stmt).all()]


def job_to_dict(job: Job) -> dict[str, Any]:
    """The JSON shape of a job in ``qstat --json`` and the SDK."""
    data = job.model_dump()
    data.pop("spec_json", None)
    data["depends"] = json.loads(data.pop("depends_json") or "[]")
    data["device"] = job.devices
    data["slice"] = {
        "compute_pct": job.compute_pct,
        "gpus": job.gpus,
        "memory_mib": job.memory_mib,
    }
    data["checkpoint"] = job.checkpoint_path
    if job.state not in FINAL_STATES:
        # the job has not ended: an exit code is its last attempt's, not the job's
        data["last_exit_code"] = data["exit_code"]
        data["exit_code"] = None
    return data


class QueryMixin(TransitionMixin, JobLogic):
    """What jobs there are and what happened to them."""

    def get(self, job_id: int) -> Job:
        with self._read() as conn:
            row = conn.execute(sa.select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
        if row is None:
            raise JobNotFound(job_id)
        return Job.model_validate(dict(row))

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
        """The jobs that match, oldest first; ``ran``: only those that ran (at least one
        attempt; a job cancelled in the queue did not)."""
        stmt = sa.select(JOBS).order_by(JOBS.c.id)
        if states is not None:
            stmt = stmt.where(JOBS.c.state.in_([s.value for s in states]))
        if owner is not None:
            stmt = stmt.where(JOBS.c.owner == owner)
        if queue is not None:
            stmt = stmt.where(JOBS.c.queue == queue)
        if array_id is not None:
            stmt = stmt.where(JOBS.c.array_id == array_id)
        if ids is not None:
            stmt = stmt.where(JOBS.c.id.in_(list(ids)))
        if ran:
            stmt = stmt.where(JOBS.c.attempts > 0)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as conn:
            rows = conn.execute(stmt).mappings().all()
        return [Job.model_validate(dict(r)) for r in rows]

    def job_rows(
        self,
        columns: Sequence[str],
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
    ) -> list[tuple[Any, ...]]:
        """``columns`` of the jobs :meth:`list_jobs` lists, a tuple each, oldest first: no
        :class:`Job` is made, which is most of the cost of a long listing."""
        stmt = sa.select(*(JOBS.c[name] for name in columns)).order_by(JOBS.c.id)
        if states is not None:
            stmt = stmt.where(JOBS.c.state.in_([s.value for s in states]))
        if owner is not None:
            stmt = stmt.where(JOBS.c.owner == owner)
        with self._read() as conn:
            return [tuple(row) for row in conn.execute(stmt)]

    def events(self, job_id: int) -> list[dict[str, Any]]:
        """The job's events, oldest first: ``type``, ``time`` (Unix s), ``attempt`` and data."""
        self.get(job_id)
        stmt = sa.select(EVENTS).where(EVENTS.c.job_id == job_id).order_by(EVENTS.c.id)
        with self._read() as conn:
            rows = conn.execute(stmt).mappings().all()
        out = []
        for r in rows:
            event = {"type": r["type"], "time": r["time"], "attempt": r["attempt"]}
            event.update(json.loads(r["data_json"] or "{}"))
            out.append(event)
        return out

    def attempts(self, job_id: int) -> list[Attempt]:
        stmt = sa.select(ATTEMPTS).where(ATTEMPTS.c.job_id == job_id).order_by(ATTEMPTS.c.number)
        with self._read() as conn:
            return [Attempt.model_validate(dict(r)) for r in conn.execute(stmt).mappings()]

    def measured_attempts(
        self,
        *,
        job_id: int | None = None,
        owner: str | None = None,
        queue: str | None = None,
        jobs: int = RECENT_JOBS,
    ) -> list[MeasuredAttempt]:
        """The attempts whose usage an agent measured (``usage_samples`` > 0), oldest
        first: job ``job_id``'s, else those of the latest ``jobs`` finished jobs of
        ``owner`` and/or in ``queue`` that have one (``ebb recommend``)."""
        a, j = ATTEMPTS.c, JOBS.c
        joined = ATTEMPTS.join(JOBS, j.id == a.job_id)
        measured = a.usage_samples > 0
        stmt = (
            sa.select(ATTEMPTS, j.name, j.owner, j.queue, j.gpus)
            .select_from(joined)
            .where(measured)
            .order_by(a.job_id, a.number)
        )
        if job_id is not None:
            stmt = stmt.where(a.job_id == job_id)
        else:
            latest = (
                sa.select(j.id)
                .select_from(joined)
                .where(measured, j.state.in_([s.value for s in FINAL_STATES]))
                .group_by(j.id)
                .order_by(j.id.desc())
                .limit(jobs)
            )
            if owner is not None:
                latest = latest.where(j.owner == owner)
            if queue is not None:
                latest = latest.where(j.queue == queue)
            stmt = stmt.where(a.job_id.in_(sa.select(latest.subquery().c.id)))
        with self._read() as conn:
            rows = conn.execute(stmt).mappings().all()
        return [
            MeasuredAttempt(
                job_id=r["job_id"],
                name=r["name"],
                owner=r["owner"],
                queue=r["queue"],
                attempt=r["number"],
                compute_pct=r["compute_pct"],
                gpus=r["gpus"],
                memory_mib=r["memory_mib"],
                samples=r["usage_samples"],
                compute_p95_pct=r["used_compute_p95_pct"],
                compute_peak_pct=r["used_compute_peak_pct"],
                memory_p95_mib=r["used_memory_p95_mib"],
                memory_peak_mib=r["used_memory_peak_mib"],
            )
            for r in rows
        ]

    def queue_stats(self, states: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
        """Jobs per queue and state (``qstat -Q``); only in ``states`` when given (the
        metrics count the unfinished ones: an index range, not the whole history)."""
        stmt = sa.select(JOBS.c.queue, JOBS.c.state, sa.func.count()).group_by(
            JOBS.c.queue, JOBS.c.state
        )
        if states is not None:
            stmt = stmt.where(JOBS.c.state.in_(list(states)))
        out: dict[str, dict[str, int]] = {}
        with self._read() as conn:
            for queue, state, count in conn.execute(stmt):
                out.setdefault(queue, {})[state] = count
        return out

    # -- scheduling ---------------------------------------------------------------------

    def queued_jobs(self, limit: int | None = None) -> list[QueuedJob]:
        """Queued jobs in scheduling order: priority (high first), then submission order.

        A requeued job keeps its id, so it goes ahead of later submissions of its priority.
        """
        with self._read() as conn:
            return self._queued_rows(conn, limit=limit)

    def active_attempts(self, node: str | None = None) -> list[ActiveAttempt]:
        with self._read() as conn:
            return self._active_rows(conn, node=node)

    @staticmethod
    def _queued_rows(
        conn: Connection, where: ColumnElement[bool] | None = None, *, limit: int | None = None
    ) -> list[QueuedJob]:
        """The queued jobs (``where`` too), in scheduling order."""
        c = JOBS.c
        stmt = (
            sa.select(
                c.id,
                c.priority,
                c.queue,
                c.owner,
                c.compute_pct,
                c.gpus,
                c.memory_mib,
                c.array_id,
                c.array_limit,
                c.attempts,
                c.deadline_s,
                c.first_checkpoint_s,
                c.requeued_at,
                c.evictions,
                c.submitted_at,
            )
            .where(c.state == JobState.QUEUED.value)
            .order_by(c.priority.desc(), c.id)
        )
        if where is not None:
            stmt = stmt.where(where)
        if limit is not None:
            stmt = stmt.limit(limit)
        return [
            QueuedJob(
                *row[:10],
                deadline_s=row[10],
                first_checkpoint_s=row[11],
                requeued_at=row[12],
                evictions=row[13],
                submitted_at=row[14],
            )
            for row in conn.execute(stmt)
        ]

    @staticmethod
    def _active_rows(
        conn: Connection,
        where: ColumnElement[bool] | None = None,
        *,
        node: str | None = None,
    ) -> list[ActiveAttempt]:
        """The attempts that hold a slice (of the jobs ``where`` says, on ``node``), by
        job id.  A node's agent asks for its own twice a second: that statement is built
        once, the node bound."""
        stmt = statements.active_attempts() if node is None else statements.node_attempts()
        if where is not None:
            stmt = stmt.where(where)
        out = []
        for r in conn.execute(stmt, None if node is None else {"node": node}):
            devices = tuple(int(d) for d in r[6].split(",")) if r[6] else ()
            out.append(
                ActiveAttempt(
                    job_id=r[0],
                    attempt=r[1],
                    state=JobState(r[2]),
                    priority=r[3],
                    queue=r[4],
                    node=r[5],
                    devices=devices,
                    compute_pct=r[7],
                    memory_mib=r[8],
                    deadline_s=r[9],
                    signal=r[10],
                    dispatched_at=r[11],
                    started_at=r[12],
                    last_checkpoint_at=r[13],
                    cancel_requested=bool(r[14]),
                    array_id=r[15],
                    gpus=r[16],
                    owner=r[17],
                    paused_at=r[18],
                    pausable=bool(r[19]),
                    suspended_at=r[20],
                )
            )
        return out
