"""Statements the store runs many times a second, built once.

SQLAlchemy caches how a statement compiles, but building the statement object itself
(``JOBS.update().where(...).values(...)``) costs a Python call tree at every call: about
half of what a small write costs on SQLite, more than the database's own work.  The
statements here take their values as bound parameters, so that each is built once per
shape (the columns it sets) and the node agent's store thread, which records a
checkpoint, a progress line or a heartbeat several times a second, does not rebuild them.
A value that is itself an SQL expression (``coalesce(paused_at, :at)``) cannot be bound:
its statement is built at the call, on the same fenced ``WHERE``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.states import ACTIVE_STATES
from ebbtide.queue.store.base import ATTEMPTS, JOBS

#: The names the statements below bind their keys under: a bound parameter may not take a
#: column's name in an UPDATE's SET clause.
JOB_ID, ATTEMPT = "key_job_id", "key_attempt"


Statement = tuple[sa.Update, dict[str, Any]]


def fenced_update(values: Mapping[str, Any], job_id: int, attempt: int) -> Statement:
    """Set ``values`` on a job's row while ``attempt`` is its current, active one: the
    statement and its parameters."""
    return _update(_fenced_update, values, job_id, attempt)


def attempt_update(values: Mapping[str, Any], job_id: int, number: int) -> Statement:
    """Set ``values`` on attempt ``number``'s row: the statement and its parameters."""
    return _update(_attempt_update, values, job_id, number)


def _update(
    shape: Callable[[tuple[str, ...]], sa.Update],
    values: Mapping[str, Any],
    job_id: int,
    number: int,
) -> Statement:
    keys = {JOB_ID: job_id, ATTEMPT: number}
    if any(isinstance(v, sa.ClauseElement) for v in values.values()):
        return shape(()).values(**values), keys  # an expression is not bound: built now
    return shape(tuple(values)), {**{f"set_{k}": v for k, v in values.items()}, **keys}


@functools.cache
def _fenced_update(columns: tuple[str, ...]) -> sa.Update:
    stmt = JOBS.update().where(
        JOBS.c.id == sa.bindparam(JOB_ID),
        JOBS.c.attempts == sa.bindparam(ATTEMPT),
        JOBS.c.state.in_([s.value for s in ACTIVE_STATES]),
    )
    return stmt.values({c: sa.bindparam(f"set_{c}") for c in columns}) if columns else stmt


@functools.cache
def _attempt_update(columns: tuple[str, ...]) -> sa.Update:
    stmt = ATTEMPTS.update().where(
        ATTEMPTS.c.job_id == sa.bindparam(JOB_ID), ATTEMPTS.c.number == sa.bindparam(ATTEMPT)
    )
    return stmt.values({c: sa.bindparam(f"set_{c}") for c in columns}) if columns else stmt


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
