"""The store's logic, written once for every backend: what a hold, a cancel, a dispatch,
the end of an attempt or a loss does to a job, whatever holds the rows.

Each module is a mixin that the SQL store (:class:`~ebbtide.queue.store.Store`) and the
in-memory one (:class:`~ebbtide.queue.memory.MemoryStore`) both inherit.  Its methods
read and write only through the primitives a backend provides, listed (and checked by
mypy) in :class:`~ebbtide.queue.lifecycle.backend.Backend`: a write transaction that
yields a token (a connection, or nothing the memory store needs), the job and its spec,
the guarded state change, events, the attempt rows, and the few conditional updates.
Nothing here imports SQL itself (the row models it reads are SQLModel classes).

- :mod:`~ebbtide.queue.lifecycle.jobs`: :meth:`transition`, :meth:`spec`, and the
  columns a transition and the end of an attempt write;
- :mod:`~ebbtide.queue.lifecycle.submission`: the row and event of a submitted job;
- :mod:`~ebbtide.queue.lifecycle.user_actions`: hold, alter, release, cancel;
- :mod:`~ebbtide.queue.lifecycle.attempts`: dispatch to the end of an attempt;
- :mod:`~ebbtide.queue.lifecycle.losses`: lost attempts, and holds for being lost;
- :mod:`~ebbtide.queue.lifecycle.housekeeping`: dependencies met, holds for evictions.
"""

from __future__ import annotations

from ebbtide.queue.lifecycle.attempts import AttemptLogic
from ebbtide.queue.lifecycle.backend import Backend
from ebbtide.queue.lifecycle.housekeeping import HousekeepingLogic
from ebbtide.queue.lifecycle.jobs import JobLogic
from ebbtide.queue.lifecycle.losses import LossLogic
from ebbtide.queue.lifecycle.user_actions import UserActionLogic

__all__ = [
    "AttemptLogic",
    "Backend",
    "HousekeepingLogic",
    "JobLogic",
    "LossLogic",
    "UserActionLogic",
]
