"""Statements the store runs many times a second, built once.

SQLAlchemy caches how a statement compiles, but building the statement object itself
(``JOBS.update().where(...).values(...)``) costs a Python call tree at every call: about
half of what a small write costs on SQLite, more than the database's own work.  The
statements here take their values as bound parameters, so that each is built once per
shape (the columns it sets) and the node agent's store thread, which records a
checkpoint, a progress line or a heartbeat several times a second, does not rebuild them.
A value that is itself an SQL expression (``coalesce(paused_at, :at)``) cannot be bound:
its statement is built as before (:func:`bindable`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.states import ACTIVE_STATES
from ebbtide.queue.store.base import ATTEMPTS, JOBS

#: The names the statements below bind their keys under: a bound parameter may not take a
#: column's name in an UPDATE's SET clause.
JOB_ID, ATTEMPT = "key_job_id", "key_attempt"


def bindable(values: Mapping[str, Any]) -> bool:
    """Whether every value is plain data (no SQL expression), so it can be bound."""
    return not any(isinstance(v, sa.ClauseElement) for v in values.values())


def params(values: Mapping[str, Any], job_id: int, attempt: int) -> dict[str, Any]:
    """The parameters of :func:`fenced_update` and :func:`attempt_update`."""
    out = {f"set_{k}": v for k, v in values.items()}
    out[JOB_ID] = job_id
    out[ATTEMPT] = attempt
    return out


@functools.cache
def fenced_update(columns: tuple[str, ...]) -> sa.Update:
    """Set ``columns`` of a job's row while the attempt is its current, active one."""
    return (
        JOBS.update()
        .where(
            JOBS.c.id == sa.bindparam(JOB_ID),
            JOBS.c.attempts == sa.bindparam(ATTEMPT),
            JOBS.c.state.in_([s.value for s in ACTIVE_STATES]),
        )
        .values({c: sa.bindparam(f"set_{c}") for c in columns})
    )


@functools.cache
def attempt_update(columns: tuple[str, ...]) -> sa.Update:
    """Set ``columns`` of an attempt's row."""
    return (
        ATTEMPTS.update()
        .where(
            ATTEMPTS.c.job_id == sa.bindparam(JOB_ID), ATTEMPTS.c.number == sa.bindparam(ATTEMPT)
        )
        .values({c: sa.bindparam(f"set_{c}") for c in columns})
    )


@functools.cache
def active_attempts() -> sa.Select[Any]:
    """The attempts that hold a slice, with what the planner and the agents read of them
    (:meth:`~ebbtide.queue.store.queries.QueryMixin._active_rows` reads the columns by
    position), by job id."""
    c = JOBS.c
    return (
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


@functools.cache
def node_attempts() -> sa.Select[Any]:
    """:func:`active_attempts` on the node bound as ``node``."""
    return active_attempts().where(JOBS.c.node == sa.bindparam("node"))
