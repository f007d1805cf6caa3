"""The in-memory store: :class:`MemoryStore`, the SQL store's behaviour over Python data.

It keeps what the SQL store keeps — jobs, attempts, events with increasing ids, nodes and
their heartbeats, the leadership epoch and the published policy, admins' drains — and
does to them what the SQL store does, through the same transition table
(:func:`~ebbtide.queue.states.check_transition`) and the same outcome policy
(:func:`~ebbtide.queue.outcomes.decide`); it satisfies
:class:`~ebbtide.queue.interface.JobStore` and returns the same types.  Tests and the
simulator use it where a database is not the point: the scheduler's pass and the node
agent's decisions on a virtual clock (the clock is taken as :class:`Store
<ebbtide.queue.store.Store>` takes it).

- The logic both stores share (transitions, hold, alter, release, cancel, dispatch to the
  end of an attempt, losses, dependencies and holds for evictions) is
  :mod:`ebbtide.queue.lifecycle`'s, written once; this package provides its primitives
  (:class:`~ebbtide.queue.lifecycle.backend.Backend`) over Python data: its :meth:`_tx`
  yields the tables, which every primitive takes where the SQL store takes a connection.
- One lock (reentrant) guards everything: the agent's store thread and the scheduler may
  share one store in one process.  A write holds it for its whole length and keeps an
  undo log: one that fails (a lost race, :class:`~ebbtide.errors.StaleState`) leaves
  nothing behind, as a rolled-back transaction leaves nothing.
- Fencing: :meth:`MemoryStore.begin_epoch` is what the leader lock does to the SQL
  store's leadership row (:mod:`ebbtide.scheduling.leader`): it begins the next epoch;
  a view from :meth:`MemoryStore.fenced` checks it at the start of every write.
  :meth:`MemoryStore.current_epoch` reads it.
- What the SQL store does only in SQL is done by simpler means with the same results:
  ``report_rows``' bisection of the event ids runs over a sorted list of ids, the purge's
  batches over the job rows in ``(finished_at, id)`` order.
- Not kept: API tokens (``ebb server``'s), which are the SQL store's ``tokens``.

This package imports no ``sqlalchemy`` itself, but what it imports does: the row models
(:mod:`ebbtide.queue.models`, SQLModel classes, built here without a database), the
purge's result and limits (:mod:`ebbtide.queue.purge`), and the constants it shares with
the SQL store (``REPORT_PROBE_EVENTS``, the report's event types, ``LOST_LOOKBACK_S`` ...)
from :mod:`ebbtide.queue.store`.  For a simulator that imports no SQL at all, those
would move to modules without SQL: plain dataclasses (or pydantic models) for ``Job``,
``Attempt`` and ``Node`` that the SQL tables derive from, ``PurgeResult`` and the purge
limits beside them, and the shared constants into a module of their own.
"""

from __future__ import annotations

from ebbtide.queue.lifecycle import AttemptLogic, UserActionLogic
from ebbtide.queue.memory.actions import MemoryActionMixin
from ebbtide.queue.memory.attempts import MemoryAttemptMixin
from ebbtide.queue.memory.base import MemoryBase
from ebbtide.queue.memory.changes import MemoryChangeMixin
from ebbtide.queue.memory.drains import MemoryDrains
from ebbtide.queue.memory.losses import MemoryLossMixin
from ebbtide.queue.memory.purge import MemoryPurgeMixin
from ebbtide.queue.memory.queries import MemoryQueryMixin
from ebbtide.queue.memory.reports import MemoryReportMixin

__all__ = ["MemoryBase", "MemoryDrains", "MemoryStore"]


class MemoryStore(
    MemoryAttemptMixin,
    MemoryLossMixin,
    MemoryActionMixin,
    MemoryPurgeMixin,
    MemoryChangeMixin,
    MemoryQueryMixin,
    MemoryReportMixin,
    UserActionLogic,
    AttemptLogic,
):
    """Every read and write of jobs, attempts, events and nodes, in memory.  Safe to
    share between threads."""
