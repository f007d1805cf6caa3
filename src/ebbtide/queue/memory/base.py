"""The in-memory store's base: its tables as Python data, one lock, the leadership fence,
and the writes every concept makes through it (rows changed, events appended), each
undone if the operation that made it fails, as a database transaction would be.

A write is one :meth:`MemoryBase._tx`: it takes the lock, checks the leadership epoch
of a fenced view (:meth:`MemoryBase.fenced`), and keeps an undo log; an exception
inside it undoes every change made since it began.  Reads take the lock and copy out.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.errors import NotLeader, StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.lifecycle.jobs import ended_attempt_values, lost_race, transition_values
from ebbtide.queue.memory.drains import MemoryDrains
from ebbtide.queue.models import Attempt, Job
from ebbtide.queue.states import (
    ACTIVE_STATES,
    AttemptOutcome,
    EventType,
    JobState,
    check_transition,
)
from ebbtide.queue.store.base import REPORT_PROBE_EVENTS

Row = dict[str, Any]

#: The job columns, with the value of each that a new row has unless told otherwise.
JOB_DEFAULTS: Row = {
    name: (None if info.is_required() else info.default) for name, info in Job.model_fields.items()
}
#: The attempt columns, likewise.
ATTEMPT_DEFAULTS: Row = {
    name: (None if info.is_required() else info.default)
    for name, info in Attempt.model_fields.items()
}


@dataclass
class Tables:
    """What the store holds; shared by a store and its fenced views."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    #: job rows by id, in id order
    jobs: dict[int, Row] = field(default_factory=dict)
    #: the ids of the jobs in each state
    by_state: dict[str, set[int]] = field(default_factory=dict)
    #: each job's attempt rows, in number order
    attempts: dict[int, list[Row]] = field(default_factory=dict)
    #: every event row, in id order, with their ids alone for bisection
    events: list[Row] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    #: each job's event rows, in id order
    events_of: dict[int, list[Row]] = field(default_factory=dict)
    #: node rows by name
    nodes: dict[str, Row] = field(default_factory=dict)
    #: the leadership row: ``epoch``, ``holder``, ``acquired_at``, ``policy_*``
    leadership: Row = field(
        default_factory=lambda: {
            "epoch": 0,
            "holder": "",
            "acquired_at": 0.0,
            "policy_text": None,
            "policy_source": None,
            "policy_at": None,
        }
    )
    job_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    attempt_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    event_seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: the undo log of the write in progress (None: none is)
    undo: list[Callable[[], None]] | None = None


class MemoryBase:
    """The tables, the lock and the fence; each concept of the store is a mixin over it."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._data = Tables()
        #: admins' drains and undrains of nodes and devices
        self.drains = MemoryDrains(clock)

    #: the leadership epoch every write must still hold (a leader's view); None: any
    _epoch: int | None = None

    def close(self) -> None:
        """Nothing to release: the data goes with the object."""

    def fenced(self, epoch: int) -> Self:
        """This store as a leader of ``epoch`` sees it: every write first checks that the
        epoch is still the current one, and raises :class:`NotLeader` (writing nothing)
        once another leader has begun a later epoch (:meth:`begin_epoch`)."""
        view = copy.copy(self)
        view._epoch = epoch
        return view

    # -- leadership (what the leader lock does to the SQL store's leadership row) ------

    def begin_epoch(self, holder: str = "") -> int:
        """Begin the next leadership epoch, held by ``holder``; return it.  Writes through
        a view fenced by an earlier epoch fail from now on."""
        with self._data.lock:
            row = self._data.leadership
            row.update(epoch=row["epoch"] + 1, holder=holder, acquired_at=self.clock.time())
            return int(row["epoch"])

    def current_epoch(self) -> int:
        """The leadership epoch now (0: no leader has begun one)."""
        with self._data.lock:
            return int(self._data.leadership["epoch"])

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[Tables]:
        """One write: the lock held, the epoch checked, every change undone on error.
        A write inside another joins it."""
        data = self._data
        with data.lock:
            if data.undo is not None:
                yield data
                return
            if self._epoch is not None and data.leadership["epoch"] != self._epoch:
                current = data.leadership["epoch"]
                raise NotLeader(
                    f"this scheduler led in epoch {self._epoch}, but epoch {current} has "
                    "begun: another scheduler leads now"
                )
            data.undo = []
            try:
                yield data
            except BaseException:
                for step in reversed(data.undo):
                    step()
                raise
            finally:
                data.undo = None

    def _undo(self, step: Callable[[], None]) -> None:
        if self._data.undo is not None:
            self._data.undo.append(step)

    # -- rows -----------------------------------------------------------------------------

    def _insert_job(self, row: Row) -> int:
        data = self._data
        job_id = next(data.job_ids)
        data.jobs[job_id] = {**JOB_DEFAULTS, **row, "id": job_id}
        data.by_state.setdefault(row["state"], set()).add(job_id)

        def undo() -> None:
            del data.jobs[job_id]
            data.by_state[row["state"]].discard(job_id)

        self._undo(undo)
        return job_id

    def _update_job(self, job_id: int, values: Row) -> None:
        unknown = set(values) - set(JOB_DEFAULTS)
        if unknown:
            raise ValueError(f"jobs have no column {sorted(unknown)[0]!r}")
        data = self._data
        row = data.jobs[job_id]
        old = {k: row[k] for k in values}
        self._set_job(job_id, values)
        self._undo(lambda: self._set_job(job_id, old))

    def _set_job(self, job_id: int, values: Row) -> None:
        data = self._data
        row = data.jobs[job_id]
        if "state" in values and values["state"] != row["state"]:
            data.by_state[row["state"]].discard(job_id)
            data.by_state.setdefault(values["state"], set()).add(job_id)
        row.update(values)

    def _ids_in(self, states: Any) -> list[int]:
        """The ids of the jobs in ``states`` (values or :class:`JobState`), in id order."""
        data = self._data
        return sorted(i for s in states for i in data.by_state.get(str(s), ()))

    def _attempt(self, job_id: int, number: int) -> Row | None:
        for row in reversed(self._data.attempts.get(job_id, ())):
            if row["number"] == number:
                return row
        return None

    def _insert_attempt(self, conn: Tables, values: Row) -> None:
        rows = self._data.attempts.setdefault(values["job_id"], [])
        rows.append({**ATTEMPT_DEFAULTS, **values, "id": next(self._data.attempt_ids)})
        self._undo(lambda: rows.__delitem__(-1))

    def _write_attempt(self, conn: Tables, job_id: int, number: int, values: Row) -> None:
        row = self._attempt(job_id, number)
        if row is not None:
            self._update_attempt(row, values)

    def _update_attempt(self, row: Row, values: Row) -> None:
        old = {k: row[k] for k in values}
        row.update(values)
        self._undo(lambda: row.update(old))

    def _event(
        self,
        conn: Tables,
        job_id: int,
        event: EventType,
        *,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        tables = self._data
        event_id = next(tables.event_seq)
        row: Row = {
            "id": event_id,
            "job_id": job_id,
            "attempt": attempt,
            "type": event.value,
            "time": self.clock.time() if now is None else now,
            "data_json": json.dumps(data or {}),
        }
        tables.events.append(row)
        tables.event_ids.append(event_id)
        mine = tables.events_of.setdefault(job_id, [])
        mine.append(row)

        def undo() -> None:
            tables.events.pop()
            tables.event_ids.pop()
            mine.pop()

        self._undo(undo)

    def _first_event_id(self, t: float) -> int:
        """The id from which on events are at ``t`` or later: the SQL store's bisection of
        the ids, each probe the latest time of :data:`REPORT_PROBE_EVENTS` events."""
        ids, events = self._data.event_ids, self._data.events
        if not ids:
            return 0
        low, high = ids[0], ids[-1] + 1
        while low < high:
            mid = (low + high) // 2
            at = bisect_left(ids, mid)
            run = events[at : at + REPORT_PROBE_EVENTS]
            if run and max(e["time"] for e in run) >= t:
                high = mid
            else:
                low = mid + 1
        return low

    # -- transitions --------------------------------------------------------------------

    def _transition(
        self,
        conn: Tables,
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
        """The one place a job's state changes, as the SQL store's: the row must still be
        in ``source`` and, when given, at attempt ``fence_attempt`` (default ``attempt``);
        the event is recorded for ``attempt``."""
        check_transition(source, target)
        fence = attempt if fence_attempt is None else fence_attempt
        row = self._data.jobs.get(job_id)
        if (
            row is None
            or row["state"] != source.value
            or (fence is not None and row["attempts"] != fence)
        ):
            raise lost_race(job_id, source, fence)
        self._update_job(job_id, transition_values(target, changes))
        self._event(conn, job_id, event, attempt=attempt, data=data, now=now)

    def _end_attempt(
        self,
        conn: Tables,
        job_id: int,
        attempt: int,
        outcome: AttemptOutcome,
        exit_code: int | None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """Close the attempt's row (if still open), with what it used where measured."""
        row = self._attempt(job_id, attempt)
        if row is None or row["outcome"] is not None:
            return
        self._update_attempt(
            row, ended_attempt_values(outcome, exit_code, self.clock.time(), usage)
        )

    def _fenced_update(self, conn: Tables, job_id: int, attempt: int, values: Row) -> None:
        """Change the job's row only while ``attempt`` is its current, active attempt."""
        row = self._data.jobs.get(job_id)
        active = {s.value for s in ACTIVE_STATES}
        if row is None or row["attempts"] != attempt or row["state"] not in active:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")
        self._update_job(job_id, values)

    def _update_job_if(
        self, conn: Tables, job_id: int, states: Collection[str], values: Row
    ) -> bool:
        """Change the job's row if it is in one of ``states``; whether it was."""
        row = self._data.jobs.get(job_id)
        if row is None or row["state"] not in states:
            return False
        self._update_job(job_id, values)
        return True

    def _paused_at_or(self, conn: Tables, job_id: int, at: float) -> Any:
        """``at``, unless the job was paused before: then when it was."""
        row = self._data.jobs.get(job_id)
        paused_at = row["paused_at"] if row is not None else None
        return at if paused_at is None else paused_at

    def _losses_since_release(self, conn: Tables, job_id: int) -> list[outcomes.Loss]:
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
