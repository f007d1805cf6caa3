"""The store: every read and write of jobs, attempts, events and nodes.

SQLite under ``$EBBTIDE_HOME`` by default, PostgreSQL via ``EBBTIDE_DB_URL``.  The store
is the source of truth: messages may be lost or duplicated, state may not.

Every state change goes through :meth:`Store._transition`: it checks the transition
table, updates the row only if it is still in the expected state (and, for reports from
an attempt, only if that attempt is still the job's current one), and appends an event,
all in one database transaction.  Losing a race raises :class:`StaleState`.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.config.settings import redacted
from ebbtide.errors import (
    InvalidTransition,
    JobNotFound,
    NotLeader,
    PermissionDenied,
    SpecError,
    StaleState,
    StoreUnavailable,
    UserError,
)
from ebbtide.queue import migrations, outcomes
from ebbtide.queue.dependencies import dependencies_verdict
from ebbtide.queue.drains import Drains
from ebbtide.queue.engine import create_engine, reading
from ebbtide.queue.models import USAGE_COLUMNS, Attempt, Event, Job, JobTable, Leadership, Node
from ebbtide.queue.purge import (
    DEFAULT_BATCH_JOBS,
    PURGE_PAUSE_S,
    Purger,
    PurgeResult,
    oldest_finished_at,
)
from ebbtide.queue.rightsizing import RECENT_JOBS, MeasuredAttempt
from ebbtide.queue.spec import JobSpec, SliceGrant
from ebbtide.queue.states import (
    ACTIVE_STATES,
    FINAL_STATES,
    AttemptOutcome,
    EventType,
    JobState,
    check_transition,
)
from ebbtide.queue.tokens import Tokens
from ebbtide.scheduling.snapshot import ActiveAttempt, QueuedJob

JOBS: sa.Table = JobTable.__table__  # type: ignore[attr-defined]
ATTEMPTS: sa.Table = Attempt.__table__  # type: ignore[attr-defined]
EVENTS: sa.Table = Event.__table__  # type: ignore[attr-defined]
NODES: sa.Table = Node.__table__  # type: ignore[attr-defined]
LEADERSHIP: sa.Table = Leadership.__table__  # type: ignore[attr-defined]

#: How far back :meth:`Store.hold_lost` looks for losses when it is not told where it
#: stopped (a scheduler's first pass), in seconds: at least the policy's ``loss_window_s``.
LOST_LOOKBACK_S = 600.0
#: How many events before where it stopped :meth:`Store.hold_lost` looks again, in events.
LOST_RESCAN_EVENTS = 1_000
#: How many of the latest events :meth:`Store.recent_evictions` looks through, in events.
RECENT_EVICTIONS_SCAN_EVENTS = 200_000
#: How far an event's time may lag behind the order of ids for :meth:`Store.report_rows`
#: to find it, in seconds (agents report pauses and checkpoints with their own times).
REPORT_EVENT_ORDER_SLACK_S = 3600.0
#: Consecutive events each probe of :meth:`Store.report_rows`'s bisection reads, the latest
#: of their times deciding: one event reported late does not mislead it.
REPORT_PROBE_EVENTS = 16
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
_END_EVENT_TYPES = tuple(
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


def check_epoch(conn: Connection, epoch: int) -> None:
    """Raise :class:`NotLeader` unless ``epoch`` is the current leadership epoch.

    On PostgreSQL the row is read ``FOR SHARE``: a new leader's bump waits for this
    transaction, and this one, once the bump is in, sees it.  SQLite's writes hold the
    database's write lock from their first statement, which orders them the same way.
    """
    stmt = sa.select(LEADERSHIP.c.epoch).where(LEADERSHIP.c.id == 1)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(read=True)
    current = conn.execute(stmt).scalar()
    if current != epoch:
        raise NotLeader(
            f"this scheduler led in epoch {epoch}, but epoch {current} has begun: another "
            "scheduler leads now"
        )


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


def _actor(user: str, attribution: dict[str, Any] | None) -> str:
    """Who really acted: the attribution's ``by`` (an admin acting for ``user``), else
    ``user``."""
    return str((attribution or {}).get("by") or user)


class Store:
    """All job database I/O.  Safe to share between threads."""

    def __init__(
        self, url: str, *, clock: Clock = SYSTEM_CLOCK, migrate: bool = True, create: bool = True
    ) -> None:
        """The store at ``url``, its tables brought up to date (``migrate``).  With
        ``create`` False, a SQLite file that is not there is an error, not a new store:
        for commands that only read (``ebb qstat`` with a mistyped ``EBBTIDE_HOME``)."""
        self.url = url
        self.clock = clock
        self.engine = create_engine(url, create=create)
        if migrate:
            try:
                migrations.migrate(self.engine)
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                self.engine.dispose()
                cause = str(exc.orig or exc).strip().splitlines()[0] if str(exc) else ""
                raise StoreUnavailable(
                    f"cannot reach the store at {redacted(url)}: {cause}"
                ) from None
            except BaseException:
                self.engine.dispose()
                raise
        #: admins' drains and undrains of nodes and devices
        self.drains = Drains(self.engine, clock)
        #: ``ebb server``'s bearer tokens
        self.tokens = Tokens(self.engine, clock)

    #: the leadership epoch every write must still hold (a leader's view); None: any
    _epoch: int | None = None

    def close(self) -> None:
        self.engine.dispose()

    def fenced(self, epoch: int) -> Store:
        """This store as a leader of ``epoch`` sees it: every write first checks, in its
        own transaction, that the epoch is still the current one, and raises
        :class:`NotLeader` (writing nothing) once another scheduler has taken the lead."""
        view = copy.copy(self)
        view._epoch = epoch
        return view

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            if self._epoch is not None:
                check_epoch(conn, self._epoch)
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with reading(self.engine) as conn:
            yield conn

    # -- submission ---------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec,
        owner: str,
        *,
        defaults_deadline_s: float,
        grant: SliceGrant | None = None,
        pausable: bool | None = None,
        attribution: dict[str, Any] | None = None,
    ) -> list[int]:
        """Insert the job (or the tasks of an array); return their ids, first task first.

        ``pausable``: whether an online compute spike may pause it rather than evict it
        (default: what its spec says, else yes; the client applies its queue's default).

        ``grant``: what the fleet's resource profile really grants for the spec's slice
        request; the rows' slice (what the planner packs) is the grant, ``spec_json``
        keeps what was asked, and the submitted event records the grant.

        ``attribution``: who submitted and from where (:meth:`Caller.attribution
        <ebbtide.identity.Caller.attribution>`), recorded in the submitted event.
        """
        granted = spec if grant is None else grant
        now = self.clock.time()
        indices: Iterable[int | None] = spec.array.indices() if spec.array else [None]
        base_name = spec.display_name()
        depends = [d.model_dump() for d in spec.depends]
        with self._tx() as conn:
            if depends:
                wanted = {d["job_id"] for d in depends}
                named = sa.select(JOBS.c.id).where(JOBS.c.id.in_(wanted))
                if conn.dialect.name == "postgresql":
                    # a purge locks the jobs it removes before it reads who depends on
                    # them: one of the two waits for the other (queue/purge.py)
                    named = named.with_for_update(read=True)
                found = {r[0] for r in conn.execute(named)}
                missing = sorted(wanted - found)
                if missing:
                    raise SpecError("depends", f"no job with id {missing[0]}")
            state = (
                JobState.HELD if spec.hold else (JobState.WAITING if depends else JobState.QUEUED)
            )
            check_transition(None, state)
            reason = (
                "held at submission"
                if spec.hold
                else ("waiting for dependencies" if depends else "")
            )
            row = {
                "owner": owner,
                "queue": spec.queue,
                "priority": spec.priority,
                "kind": spec.kind,
                "state": state.value,
                "reason": reason,
                "spec_json": spec.model_dump_json(),
                "compute_pct": granted.compute_pct,
                "gpus": granted.gpus,
                "memory_mib": granted.memory_mib,
                "deadline_s": spec.deadline_s or defaults_deadline_s,
                "first_checkpoint_s": spec.checkpoint_interval_s or spec.walltime_s,
                "signal": spec.signal,
                "array_limit": spec.array.limit if spec.array else None,
                "depends_json": json.dumps(depends),
                "submitted_at": now,
                "attempts": 0,
                "evictions": 0,
                "failures": 0,
                "cancel_requested": False,
                "pausable": (spec.pause is not False) if pausable is None else pausable,
            }
            # the first task alone: its id is the array's id; the other tasks in one
            # executemany (one statement compiled for all, not one per task), their ids
            # read back in task order (array indices ascend, whatever order ids were given)
            task_indices: list[int | None] = list(indices)
            first_index = task_indices[0]
            first = dict(
                row,
                name=base_name if first_index is None else f"{base_name}[{first_index}]",
                array_index=first_index,
                array_id=None,
            )
            first_id = int(conn.execute(JOBS.insert(), first).inserted_primary_key[0])  # type: ignore[index]
            ids = [first_id]
            if spec.array:
                conn.execute(JOBS.update().where(JOBS.c.id == first_id).values(array_id=first_id))
                rest = [
                    dict(row, name=f"{base_name}[{index}]", array_index=index, array_id=first_id)
                    for index in task_indices[1:]
                ]
                if rest:
                    conn.execute(JOBS.insert(), rest)
                    ids = list(
                        conn.execute(
                            sa.select(JOBS.c.id)
                            .where(JOBS.c.array_id == first_id)
                            .order_by(JOBS.c.array_index)
                        ).scalars()
                    )
            data: dict[str, Any] = {"state": state.value, "owner": owner, **(attribution or {})}
            if grant is not None:
                data["granted"] = {
                    "compute_pct": grant.compute_pct,
                    "gpus": grant.gpus,
                    "memory_mib": grant.memory_mib,
                    "profile": grant.profile,
                    "note": grant.note,
                }
            data_json = json.dumps(data)
            conn.execute(
                EVENTS.insert(),
                [
                    {
                        "job_id": jid,
                        "attempt": None,
                        "type": EventType.SUBMITTED.value,
                        "time": now,
                        "data_json": data_json,
                    }
                    for jid in ids
                ],
            )
        return ids

    # -- reading ------------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        with self._read() as conn:
            row = conn.execute(sa.select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
        if row is None:
            raise JobNotFound(job_id)
        return Job.model_validate(dict(row))

    def spec(self, job_id: int) -> JobSpec:
        return JobSpec.model_validate_json(self.get(job_id).spec_json)

    def list_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
        queue: str | None = None,
        array_id: int | None = None,
        ids: Iterable[int] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
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
                sa.select(e.job_id).where(recent, e.type.in_(_END_EVENT_TYPES)),
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
                    "heartbeat_at": beat,
                    "devices": len(json.loads(devices or "[]")),
                }
                for name, started, beat, devices in nodes
            ],
        }

    @staticmethod
    def _first_event_id(conn: Connection, t: float) -> int:
        """The id from which on events are at ``t`` or later, by bisection of the primary
        key (ids grow with time; each probe takes the latest time of
        :data:`REPORT_PROBE_EVENTS` events, so one reported late does not mislead it)."""
        e = EVENTS.c
        low = conn.execute(sa.select(sa.func.min(e.id))).scalar()
        high = conn.execute(sa.select(sa.func.max(e.id))).scalar()
        if low is None or high is None:
            return 0
        high += 1
        while low < high:
            mid = (low + high) // 2
            run = sa.select(e.time).where(e.id >= mid).order_by(e.id).limit(REPORT_PROBE_EVENTS)
            latest = conn.execute(sa.select(sa.func.max(run.subquery().c.time))).scalar()
            if latest is not None and latest >= t:
                high = mid
            else:
                low = mid + 1
        return int(low)

    # -- the one way a state changes ----------------------------------------------------

    def _transition(
        self,
        conn: Connection,
        job_id: int,
        source: JobState,
        target: JobState,
        *,
        event: EventType,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        changes: dict[str, Any] | None = None,
        now: float | None = None,
        fence_attempt: int | None = None,
    ) -> None:
        """The one place a job's state changes (see the module doc).  The row must still be
        in ``source`` and, when given, at attempt ``fence_attempt`` (default ``attempt``);
        the event is recorded for ``attempt``."""
        check_transition(source, target)
        fence = attempt if fence_attempt is None else fence_attempt
        stmt = JOBS.update().where(JOBS.c.id == job_id, JOBS.c.state == source.value)
        if fence is not None:
            stmt = stmt.where(JOBS.c.attempts == fence)
        values = dict(changes or {})
        if target not in ACTIVE_STATES:
            # an attempt that ended is paused (and suspended) no more
            values.setdefault("paused_at", None)
            values.setdefault("suspended_at", None)
        result = conn.execute(stmt.values(state=target.value, **values))
        if result.rowcount != 1:
            at = f" attempt {fence}" if fence is not None else ""
            raise StaleState(f"job {job_id}{at} is no longer {source.value}")
        self._event(conn, job_id, event, attempt=attempt, data=data, now=now)

    def _event(
        self,
        conn: Connection,
        job_id: int,
        event: EventType,
        *,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        conn.execute(
            EVENTS.insert().values(
                job_id=job_id,
                attempt=attempt,
                type=event.value,
                time=self.clock.time() if now is None else now,
                data_json=json.dumps(data or {}),
            )
        )

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
        """Move one job from ``source`` to ``target`` and record ``event``; see module doc."""
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

    # -- user actions -------------------------------------------------------------------

    def _check_owner(self, job: Job, user: str, admin: bool) -> None:
        if not admin and job.owner != user:
            raise PermissionDenied(
                f"job {job.id} belongs to {job.owner}; only its owner or an admin may change it"
            )

    def hold(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        job = self.get(job_id)
        self._check_owner(job, user, admin)
        state = JobState(job.state)
        if state == JobState.HELD:
            return job
        if state not in (JobState.QUEUED, JobState.WAITING):
            raise UserError(
                f"job {job_id} is {state.value}; only queued or waiting jobs can be held"
            )
        self.transition(
            job_id,
            state,
            JobState.HELD,
            event=EventType.HELD,
            data=attribution or {"by": user},
            changes={"reason": f"held by {_actor(user, attribution)}"},
        )
        return self.get(job_id)

    def alter(
        self,
        job_id: int,
        spec: JobSpec,
        *,
        user: str,
        admin: bool = False,
        defaults_deadline_s: float,
        grant: SliceGrant | None = None,
        changes: dict[str, Any] | None = None,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        """Give a job that has not started (held, waiting or queued) ``spec`` instead of
        its own: its name, priority, slice, walltime and deadline (``qalter``)."""
        job = self.get(job_id)
        self._check_owner(job, user, admin)
        granted = spec if grant is None else grant
        name = spec.display_name()
        alterable = [JobState.HELD.value, JobState.WAITING.value, JobState.QUEUED.value]
        with self._tx() as conn:
            result = conn.execute(
                JOBS.update()
                .where(JOBS.c.id == job_id, JOBS.c.state.in_(alterable))
                .values(
                    name=name if job.array_index is None else f"{name}[{job.array_index}]",
                    priority=spec.priority,
                    kind=spec.kind,
                    spec_json=spec.model_dump_json(),
                    compute_pct=granted.compute_pct,
                    gpus=granted.gpus,
                    memory_mib=granted.memory_mib,
                    deadline_s=spec.deadline_s or defaults_deadline_s,
                    first_checkpoint_s=spec.checkpoint_interval_s or spec.walltime_s,
                )
            )
            if result.rowcount != 1:
                state = self.get(job_id).state
                raise UserError(
                    f"job {job_id} is {state}; only held, waiting or queued jobs can be "
                    "altered (a running job keeps the slice it was given)"
                )
            self._event(
                conn,
                job_id,
                EventType.ALTERED,
                data={"changes": changes or {}, **(attribution or {"by": user})},
            )
        return self.get(job_id)

    def release(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        job = self.get(job_id)
        self._check_owner(job, user, admin)
        if job.state != JobState.HELD:
            raise UserError(f"job {job_id} is {job.state}, not held")
        target = JobState.WAITING if json.loads(job.depends_json) else JobState.QUEUED
        self.transition(
            job_id,
            JobState.HELD,
            target,
            event=EventType.RELEASED,
            data=attribution or {"by": user},
            changes={"reason": "", "evictions_forgiven": job.evictions},
        )
        return self.get(job_id)

    def cancel(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        """Cancel now, or ask for an eviction if the job holds a slice (it ends ``cancelled``)."""
        for _ in range(5):
            job = self.get(job_id)
            self._check_owner(job, user, admin)
            state = JobState(job.state)
            if state in FINAL_STATES:
                raise UserError(f"job {job_id} already {state.value}")
            try:
                if state in (JobState.RUNNING, JobState.EVICTING):
                    with self._tx() as conn:
                        result = conn.execute(
                            JOBS.update()
                            .where(JOBS.c.id == job_id, JOBS.c.state == state.value)
                            .values(
                                cancel_requested=True,
                                reason=f"cancel requested by {_actor(user, attribution)}",
                            )
                        )
                        if result.rowcount != 1:
                            raise StaleState("moved")
                        self._event(
                            conn,
                            job_id,
                            EventType.CANCEL_REQUESTED,
                            attempt=job.attempts,
                            data=attribution or {"by": user},
                        )
                else:
                    changes: dict[str, Any] = {
                        "reason": f"cancelled by {_actor(user, attribution)}",
                        "finished_at": self.clock.time(),
                    }
                    with self._tx() as conn:
                        self._transition(
                            conn,
                            job_id,
                            state,
                            JobState.CANCELLED,
                            event=EventType.CANCELLED,
                            data=attribution or {"by": user},
                            changes=changes,
                        )
                        if state == JobState.DISPATCHED:
                            self._end_attempt(
                                conn, job_id, job.attempts, AttemptOutcome.CANCELLED, None
                            )
                return self.get(job_id)
            except StaleState:
                continue
        raise StaleState(f"job {job_id} kept changing; try again")

    # -- scheduling ---------------------------------------------------------------------

    def queued_jobs(self, limit: int | None = None) -> list[QueuedJob]:
        """Queued jobs in scheduling order: priority (high first), then submission order.

        A requeued job keeps its id, so it goes ahead of later submissions of its priority.
        """
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
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as conn:
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

    def active_attempts(self, node: str | None = None) -> list[ActiveAttempt]:
        c = JOBS.c
        stmt = (
            sa.select(
                c.id,
                c.attempts,
                c.state,
                c.priority,
                c.queue,
                c.node,
                c.devices,
                c.compute_pct,
                c.memory_mib,
                c.deadline_s,
                c.signal,
                ATTEMPTS.c.dispatched_at,
                ATTEMPTS.c.started_at,
                ATTEMPTS.c.last_checkpoint_at,
                c.cancel_requested,
                c.array_id,
                c.gpus,
                c.owner,
                c.paused_at,
                c.pausable,
                c.suspended_at,
            )
            .join(ATTEMPTS, sa.and_(ATTEMPTS.c.job_id == c.id, ATTEMPTS.c.number == c.attempts))
            .where(c.state.in_([s.value for s in ACTIVE_STATES]))
            .order_by(c.id)
        )
        if node is not None:
            stmt = stmt.where(c.node == node)
        out = []
        with self._read() as conn:
            for r in conn.execute(stmt):
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

    def dispatch(
        self,
        job_id: int,
        *,
        expected_attempts: int,
        node: str,
        devices: tuple[int, ...],
        compute_pct: float,
        memory_mib: int,
    ) -> int:
        """Grant a slice: queued → dispatched, create the next attempt; return its number."""
        now = self.clock.time()
        number = expected_attempts + 1
        devs = ",".join(str(d) for d in devices)
        with self._tx() as conn:
            self._transition(
                conn,
                job_id,
                JobState.QUEUED,
                JobState.DISPATCHED,
                event=EventType.DISPATCHED,
                attempt=number,
                fence_attempt=expected_attempts,
                now=now,
                data={
                    "node": node,
                    "devices": list(devices),
                    "compute_pct": compute_pct,
                    "memory_mib": memory_mib,
                },
                changes={
                    "attempts": number,
                    "node": node,
                    "devices": devs,
                    "reason": f"dispatched to {node} device {devs}",
                },
            )
            conn.execute(
                ATTEMPTS.insert().values(
                    job_id=job_id,
                    number=number,
                    node=node,
                    devices=devs,
                    compute_pct=compute_pct,
                    memory_mib=memory_mib,
                    dispatched_at=now,
                )
            )
        return number

    def mark_started(
        self, job_id: int, attempt: int, *, pid: int, stdout_path: str, stderr_path: str
    ) -> None:
        now = self.clock.time()
        with self._tx() as conn:
            self._transition(
                conn,
                job_id,
                JobState.DISPATCHED,
                JobState.RUNNING,
                event=EventType.STARTED,
                attempt=attempt,
                now=now,
                data={"pid": pid},
                changes={
                    "started_at": now,
                    "stdout_path": stdout_path,
                    "stderr_path": stderr_path,
                    "reason": "",
                },
            )
            conn.execute(
                ATTEMPTS.update()
                .where(ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.number == attempt)
                .values(started_at=now, pid=pid, stdout_path=stdout_path, stderr_path=stderr_path)
            )

    def _fenced_update(self, conn: Connection, job_id: int, attempt: int, **values: Any) -> None:
        result = conn.execute(
            JOBS.update()
            .where(
                JOBS.c.id == job_id,
                JOBS.c.attempts == attempt,
                JOBS.c.state.in_([s.value for s in ACTIVE_STATES]),
            )
            .values(**values)
        )
        if result.rowcount != 1:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")

    def record_checkpoint(
        self,
        job_id: int,
        attempt: int,
        *,
        path: str,
        at: float,
        size_bytes: int | None = None,
        duration_s: float | None = None,
    ) -> None:
        with self._tx() as conn:
            self._fenced_update(conn, job_id, attempt, checkpoint_path=path, last_checkpoint_at=at)
            conn.execute(
                ATTEMPTS.update()
                .where(ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.number == attempt)
                .values(last_checkpoint_at=at)
            )
            self._event(
                conn,
                job_id,
                EventType.CHECKPOINTED,
                attempt=attempt,
                now=at,
                data={
                    "path": path,
                    "size_bytes": size_bytes,
                    "duration_s": duration_s,
                },
            )

    def record_pause(
        self,
        job_id: int,
        attempt: int,
        *,
        at: float,
        reason: str,
        reason_code: str,
        drain_s: float = 0.0,
        kind: str = "pause",
    ) -> None:
        """The attempt was paused (frozen in place: it keeps its memory, uses no compute;
        its compute is free ``drain_s`` later, when its GPU work in flight has drained), or,
        ``kind`` ``"suspend"``, paused with its CUDA state moved to host memory (it holds no
        GPU memory either: ``suspended_at``; an attempt paused before keeps its
        ``paused_at``)."""
        changes: dict[str, Any] = {"paused_at": at}
        if kind == "suspend":
            changes = {"paused_at": sa.func.coalesce(JOBS.c.paused_at, at), "suspended_at": at}
        with self._tx() as conn:
            self._fenced_update(conn, job_id, attempt, **changes)
            self._event(
                conn,
                job_id,
                EventType.PAUSED,
                attempt=attempt,
                now=at,
                data={
                    "reason": reason,
                    "reason_code": reason_code,
                    "freed_at": at + drain_s,
                    "kind": kind,
                },
            )

    def record_thaw(
        self, job_id: int, attempt: int, *, at: float, paused_s: float, kind: str = "thaw"
    ) -> None:
        """The paused attempt runs again (``kind`` ``"restore"``: its CUDA state was
        brought back to its GPU first)."""
        with self._tx() as conn:
            self._fenced_update(conn, job_id, attempt, paused_at=None, suspended_at=None)
            self._event(
                conn,
                job_id,
                EventType.THAWED,
                attempt=attempt,
                now=at,
                data={"paused_s": round(paused_s, 6), "kind": kind},
            )

    def record_progress(self, job_id: int, attempt: int, done: float, total: float | None) -> None:
        with self._tx() as conn:
            self._fenced_update(conn, job_id, attempt, progress_done=done, progress_total=total)

    def record_result(self, job_id: int, attempt: int, value: Any) -> None:
        """The value attempt ``attempt`` gave as the job's result (an event; the last
        one is the job's)."""
        with self._tx() as conn:
            self._event(conn, job_id, EventType.RESULT, attempt=attempt, data={"value": value})

    def begin_eviction(
        self,
        job_id: int,
        attempt: int,
        *,
        reason: str,
        deadline_s: float,
        spike_at: float,
        source: str,
        reason_code: str | None = None,
    ) -> None:
        """running → evicting, recording why and by when the slice will be free."""
        self.transition(
            job_id,
            JobState.RUNNING,
            JobState.EVICTING,
            event=EventType.EVICT_REQUESTED,
            attempt=attempt,
            data={
                "reason": reason,
                "reason_code": reason_code,
                "deadline_s": deadline_s,
                "spike_at": spike_at,
                "source": source,
            },
            changes={"reason": f"evicting: {reason}"},
        )

    def eviction_request(self, job_id: int, attempt: int) -> dict[str, Any] | None:
        """What the last ``evict_requested`` of this attempt said (reason, reason code,
        deadline, spike time), or None."""
        stmt = (
            sa.select(EVENTS.c.data_json)
            .where(
                EVENTS.c.job_id == job_id,
                EVENTS.c.attempt == attempt,
                EVENTS.c.type == EventType.EVICT_REQUESTED.value,
            )
            .order_by(EVENTS.c.id.desc())
            .limit(1)
        )
        with self._read() as conn:
            row = conn.execute(stmt).scalar()
        return json.loads(row) if row else None

    def _end_attempt(
        self,
        conn: Connection,
        job_id: int,
        attempt: int,
        outcome: AttemptOutcome,
        exit_code: int | None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """Close the attempt's row, with what it used where its agent measured it
        (``usage``: :data:`~ebbtide.queue.models.USAGE_COLUMNS`; other keys are not ours)."""
        measured = {k: v for k, v in (usage or {}).items() if k in USAGE_COLUMNS}
        conn.execute(
            ATTEMPTS.update()
            .where(
                ATTEMPTS.c.job_id == job_id,
                ATTEMPTS.c.number == attempt,
                ATTEMPTS.c.outcome.is_(None),
            )
            .values(
                outcome=outcome.value, exit_code=exit_code, ended_at=self.clock.time(), **measured
            )
        )

    def finish_attempt(
        self,
        job_id: int,
        attempt: int,
        *,
        exit_code: int | None,
        eviction: dict[str, Any] | None = None,
        max_attempts: int | None = None,
        why: str | None = None,
        final: bool = False,
        reason_code: str | None = None,
        usage: dict[str, Any] | None = None,
    ) -> JobState:
        """Record the end of an attempt's process and move the job on; return its new state.

        What the end means is :func:`ebbtide.queue.outcomes.decide`'s verdict (success,
        cancellation, eviction, failure, and what counts toward which limit); ``final``
        makes a failure end the job (it cannot be started at all); ``why`` says what ended
        it when the agent knows better than the exit code (``"walltime 2h exceeded"``),
        ``reason_code`` the constant for it where there is one (``oom``, ``image``);
        ``usage`` what the attempt used, where its agent measured it (kept on its row,
        evicted or not: it ran).
        """
        job = self.get(job_id)
        if job.attempts != attempt or job.state not in {s.value for s in ACTIVE_STATES}:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")
        source = JobState(job.state)
        now = self.clock.time()
        if max_attempts is None:
            max_attempts = self.spec(job_id).max_attempts
        verdict = outcomes.decide(
            source=source,
            exit_code=exit_code,
            eviction=eviction,
            cancel_requested=job.cancel_requested,
            evictions=job.evictions,
            failures=job.failures,
            max_attempts=max_attempts,
            attempt=attempt,
            warning_signal=job.signal,
            why=why,
            final=final,
        )
        target = verdict.target
        data: dict[str, Any] = {"exit_code": exit_code}
        if reason_code:
            data["reason_code"] = reason_code
        changes: dict[str, Any] = {
            "exit_code": exit_code,
            "node": None,
            "devices": None,
            "reason": verdict.reason,
            "evictions": verdict.evictions,
            "failures": verdict.failures,
        }
        if target in FINAL_STATES:
            changes["finished_at"] = now
        else:
            changes["requeued_at"] = now
        if exit_code == 0 and eviction:
            data["finished_during_eviction"] = eviction  # its latency stays on record
        with self._tx() as conn:
            if verdict.evicted:
                self._event(
                    conn,
                    job_id,
                    EventType.EVICTED,
                    attempt=attempt,
                    now=now,
                    data={"reason": verdict.why, **(eviction or {}), "exit_code": exit_code},
                )
                data["reason"] = verdict.why
            if verdict.failed_before_requeue:
                self._event(
                    conn,
                    job_id,
                    EventType.FAILED,
                    attempt=attempt,
                    now=now,
                    data={
                        "exit_code": exit_code,
                        "final": False,
                        "why": why,
                        **({"reason_code": reason_code} if reason_code else {}),
                    },
                )
                data["reason"] = verdict.why
            if verdict.final:
                data.update(final=True, why=verdict.why)
            self._transition(
                conn,
                job_id,
                source,
                target,
                event=verdict.event,
                attempt=attempt,
                data=data,
                changes=changes,
                now=now,
            )
            self._end_attempt(conn, job_id, attempt, verdict.outcome, exit_code, usage)
        return target

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
        """Give up on an attempt whose agent is gone or whose start never happened;
        ``reason_code``: the constant for why, where there is one (``unschedulable``,
        ``node_silent``: see :mod:`ebbtide.queue.outcomes`).

        With ``max_losses``, a job that keeps being lost is held with the reason instead
        of restarting in a loop, as :func:`~ebbtide.queue.outcomes.hold_after_losses`
        says (``max_losses`` losses since it was last released, or two unexplained ones
        within ``loss_window_s``); losses do not count toward ``max_attempts``, which is
        for the job's own failures.  (Losses its node agent reports are held by
        :meth:`hold_lost`, which the scheduler calls every pass.)  ``usage``: what the
        attempt used while it ran, where its agent measured it.
        """
        job = self.get(job_id)
        if job.attempts != attempt or job.state not in {s.value for s in ACTIVE_STATES}:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")
        source = JobState(job.state)
        with self._tx() as conn:
            lost = {"reason": why, **({"reason_code": reason_code} if reason_code else {})}
            self._event(conn, job_id, EventType.LOST, attempt=attempt, data=lost)
            if job.cancel_requested:
                self._transition(
                    conn,
                    job_id,
                    source,
                    JobState.CANCELLED,
                    event=EventType.CANCELLED,
                    attempt=attempt,
                    changes={
                        "reason": "cancelled",
                        "node": None,
                        "devices": None,
                        "finished_at": self.clock.time(),
                    },
                )
            else:
                self._transition(
                    conn,
                    job_id,
                    source,
                    JobState.QUEUED,
                    event=EventType.REQUEUED,
                    attempt=attempt,
                    data={"reason": why},
                    changes={
                        "reason": f"requeued: {why}",
                        "node": None,
                        "devices": None,
                        "requeued_at": self.clock.time(),
                    },
                )
            self._end_attempt(conn, job_id, attempt, AttemptOutcome.LOST, None, usage)
            if max_losses is not None and not job.cancel_requested:
                self._hold_if_lost_too_often(conn, job_id, attempt, max_losses, loss_window_s)

    def hold_lost(
        self, max_losses: int, loss_window_s: float, *, after_event: int | None = None
    ) -> tuple[list[int], int]:
        """Hold the queued jobs whose latest attempt was lost and that keep being lost
        (:func:`~ebbtide.queue.outcomes.hold_after_losses`): what :meth:`requeue_lost`
        does with ``max_losses``, for the losses node agents report.  Only jobs with a
        ``lost`` event after event id ``after_event`` are looked at (None: those of the
        last :data:`LOST_LOOKBACK_S`), so a pass reads what happened since the one before,
        not every queued job.  Their ids, and the last event id looked at (the next
        call's ``after_event``)."""
        a, j, e = ATTEMPTS.c, JOBS.c, EVENTS.c
        with self._read() as conn:
            if after_event is None:
                since = self.clock.time() - max(LOST_LOOKBACK_S, loss_window_s)
                after_event = self._first_event_id(conn, since) - 1
            newest = conn.execute(sa.select(sa.func.max(e.id))).scalar() or after_event
            # from a little before: an event whose id was taken earlier may have been
            # written after the last look (a job looked at twice is decided again, alike)
            since_id = after_event - LOST_RESCAN_EVENTS
            recent = (
                sa.select(e.job_id)
                .where(e.id > since_id, e.id <= newest, e.type == EventType.LOST.value)
                .distinct()
            )
            stmt = (
                sa.select(j.id, j.attempts)
                .join(ATTEMPTS, sa.and_(a.job_id == j.id, a.number == j.attempts))
                .where(
                    j.id.in_(recent),
                    j.state == JobState.QUEUED.value,
                    a.outcome == AttemptOutcome.LOST.value,
                )
            )
            lost = [
                (job_id, attempt)
                for job_id, attempt in conn.execute(stmt).all()
                if outcomes.hold_after_losses(
                    self._losses_since_release(conn, job_id), max_losses, loss_window_s
                )
            ]
        held = []
        for job_id, attempt in lost:  # decided again where it is written
            try:
                with self._tx() as conn:
                    if self._hold_if_lost_too_often(
                        conn, job_id, attempt, max_losses, loss_window_s
                    ):
                        held.append(job_id)
            except StaleState:
                continue
        return held, int(newest)

    def _hold_if_lost_too_often(
        self, conn: Connection, job_id: int, attempt: int, max_losses: int, window_s: float
    ) -> bool:
        """Hold the (queued) job if its losses since its last ``qrls`` say so."""
        hold = outcomes.hold_after_losses(
            self._losses_since_release(conn, job_id), max_losses, window_s
        )
        if hold is None:
            return False
        self._transition(
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

    @staticmethod
    def _losses_since_release(conn: Connection, job_id: int) -> list[outcomes.Loss]:
        """The job's lost attempts since its last ``qrls`` (all of them, if never),
        oldest first."""
        e = EVENTS.c
        released = (
            sa.select(sa.func.coalesce(sa.func.max(e.id), 0))
            .where(e.job_id == job_id, e.type == EventType.RELEASED.value)
            .scalar_subquery()
        )
        stmt = (
            sa.select(e.attempt, e.time, e.data_json)
            .where(e.job_id == job_id, e.type == EventType.LOST.value, e.id > released)
            .order_by(e.id)
        )
        losses = []
        for number, at, data_json in conn.execute(stmt):
            data = json.loads(data_json or "{}")
            losses.append(
                outcomes.Loss(
                    attempt=int(number or 0),
                    at=float(at),
                    reason=str(data.get("reason", "")),
                    reason_code=data.get("reason_code"),
                )
            )
        return losses

    def promote_waiting(self) -> list[int]:
        """Move waiting jobs whose dependencies are met to queued; cancel the hopeless."""
        waiting = self.list_jobs(states=[JobState.WAITING])
        if not waiting:
            return []
        dep_ids = {d["job_id"] for j in waiting for d in json.loads(j.depends_json)}
        with self._read() as conn:
            dep_state = dict(
                conn.execute(sa.select(JOBS.c.id, JOBS.c.state).where(JOBS.c.id.in_(dep_ids))).all()
            )
        changed = []
        for job in waiting:
            verdict, why = dependencies_verdict(json.loads(job.depends_json), dep_state)
            try:
                if verdict == "met":
                    self.transition(
                        job.id or 0,
                        JobState.WAITING,
                        JobState.QUEUED,
                        event=EventType.DEPENDENCIES_MET,
                        changes={"reason": ""},
                    )
                elif verdict == "never":
                    self.transition(
                        job.id or 0,
                        JobState.WAITING,
                        JobState.CANCELLED,
                        event=EventType.CANCELLED,
                        data={"reason": why},
                        changes={"reason": why, "finished_at": self.clock.time()},
                    )
                else:
                    continue
            except (StaleState, InvalidTransition):
                continue
            changed.append(job.id or 0)
        return changed

    def set_reasons(self, reasons: dict[int, str]) -> int:
        """Record why queued jobs wait (policy, quota, room); only rows whose reason
        changed are written.  Returns how many changed."""
        if not reasons:
            return 0
        changed = 0
        with self._tx() as conn:
            current = dict(
                conn.execute(
                    sa.select(JOBS.c.id, JOBS.c.reason).where(
                        JOBS.c.id.in_(list(reasons)), JOBS.c.state == JobState.QUEUED.value
                    )
                ).all()
            )
            for job_id, reason in reasons.items():
                if job_id in current and current[job_id] != reason:
                    conn.execute(
                        JOBS.update()
                        .where(JOBS.c.id == job_id, JOBS.c.state == JobState.QUEUED.value)
                        .values(reason=reason)
                    )
                    changed += 1
        return changed

    def hold_overpreempted(self, queue: str, max_preemptions: int) -> list[int]:
        """Hold the queue's queued jobs evicted ``max_preemptions`` times or more."""
        with self._read() as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    sa.select(JOBS.c.id).where(
                        JOBS.c.state == JobState.QUEUED.value,
                        JOBS.c.queue == queue,
                        JOBS.c.evictions - JOBS.c.evictions_forgiven >= max_preemptions,
                    )
                )
            ]
        held = []
        for job_id in ids:
            why = (
                f"held: evicted {max_preemptions} or more times (queue {queue!r} allows "
                f"max_preemptions {max_preemptions}); qrls to try again"
            )
            try:
                self.transition(
                    job_id,
                    JobState.QUEUED,
                    JobState.HELD,
                    event=EventType.HELD,
                    data={"by": "policy", "reason": why},
                    changes={"reason": why},
                )
                held.append(job_id)
            except StaleState:
                continue
        return held

    # -- retention ----------------------------------------------------------------------

    def purge_batches(
        self,
        older_than_s: float,
        *,
        batch: int = DEFAULT_BATCH_JOBS,
        dry_run: bool = False,
        now: float | None = None,
        pause: Callable[[], bool] | None = None,
    ) -> Iterator[PurgeResult]:
        """:meth:`purge`, one batch at a time: each item is one batch's counts, its
        transaction over.  ``pause`` is called between two batches; False ends the purge
        there."""
        cutoff = (self.clock.time() if now is None else now) - older_than_s
        postgres = self.engine.dialect.name == "postgresql"
        purger = Purger(cutoff, batch=batch, dry_run=dry_run, postgres=postgres)
        first = True
        while True:
            with self._read() as conn:
                more = purger.select(conn)
            if not more:
                rest = purger.leftover()
                if rest.kept:
                    yield rest
                return
            if not first and pause is not None and not pause():
                return
            first = False
            batch_tx = self._read() if dry_run else self._tx()
            with batch_tx as conn:
                result = purger.remove(conn)
            yield result

    def purge(
        self,
        older_than_s: float,
        *,
        batch: int = DEFAULT_BATCH_JOBS,
        dry_run: bool = False,
        now: float | None = None,
        pause_s: float = PURGE_PAUSE_S,
    ) -> PurgeResult:
        """Remove the jobs that finished (succeeded, failed, cancelled) more than
        ``older_than_s`` seconds before ``now`` (default: the clock's), with their
        attempts and events, ``batch`` jobs per transaction and ``pause_s`` seconds
        apart; ``dry_run``: count them, remove nothing.  Never a job in another state,
        one that a job not yet finished depends on, or part of an array not all
        finished that long ago (:mod:`ebbtide.queue.purge`)."""
        started = time.perf_counter()
        at = self.clock.time() if now is None else now
        total = PurgeResult(cutoff=at - older_than_s, dry_run=dry_run)

        def pause() -> bool:
            time.sleep(pause_s)
            return True

        for step in self.purge_batches(
            older_than_s, batch=batch, dry_run=dry_run, now=at, pause=pause
        ):
            total += step
        with self._read() as conn:
            oldest = oldest_finished_at(conn)
        return replace(
            total, oldest_kept_finished_at=oldest, elapsed_s=time.perf_counter() - started
        )

    # -- nodes --------------------------------------------------------------------------

    # -- the published policy -----------------------------------------------------------

    def publish_policy(self, text: str, source: str) -> None:
        """The leading scheduler's policy (its file's text; "" for the built-in defaults),
        for clients to check jobs against; fenced like every leader's write."""
        with self._tx() as conn:
            conn.execute(
                LEADERSHIP.update()
                .where(LEADERSHIP.c.id == 1)
                .values(policy_text=text, policy_source=source, policy_at=self.clock.time())
            )

    def published_policy(self) -> tuple[str, str, float] | None:
        """``(text, source, published at)`` of the policy the leading scheduler (or the
        last one) runs with; None when no scheduler has published one."""
        stmt = sa.select(
            LEADERSHIP.c.policy_text, LEADERSHIP.c.policy_source, LEADERSHIP.c.policy_at
        ).where(LEADERSHIP.c.id == 1)
        with self._read() as conn:
            row = conn.execute(stmt).first()
        if row is None or row[0] is None:
            return None
        return str(row[0]), str(row[1] or "the scheduler's policy"), float(row[2] or 0.0)

    def heartbeat(
        self, node: str, *, started_at: float, devices: list[dict[str, Any]], stopping: bool = False
    ) -> None:
        now = self.clock.time()
        values = {"heartbeat_at": now, "devices_json": json.dumps(devices), "stopping": stopping}
        with self._tx() as conn:
            result = conn.execute(
                NODES.update().where(NODES.c.name == node).values(started_at=started_at, **values)
            )
            if result.rowcount == 0:
                conn.execute(NODES.insert().values(name=node, started_at=started_at, **values))

    def nodes(self) -> list[Node]:
        with self._read() as conn:
            rows = conn.execute(sa.select(NODES).order_by(NODES.c.name)).mappings().all()
        return [Node.model_validate(dict(r)) for r in rows]

    def forget_node(self, node: str) -> None:
        with self._tx() as conn:
            conn.execute(NODES.delete().where(NODES.c.name == node))
