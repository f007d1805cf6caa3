"""The store: every read and write of jobs, attempts, events and nodes.

SQLite under ``$EBBTIDE_HOME`` by default, PostgreSQL via ``EBBTIDE_DB_URL``.  The store
is the source of truth: messages may be lost or duplicated, state may not.

Every state change goes through :meth:`Store._transition`: it checks the transition
table, updates the row only if it is still in the expected state (and, for reports from
an attempt, only if that attempt is still the job's current one), and appends an event,
all in one database transaction.  Losing a race raises :class:`StaleState`.

One module per concept, each a mixin over :class:`~ebbtide.queue.store.base.StoreBase`
(the engine, transactions, the leadership fence, events); :class:`Store` is all of them,
with the logic it shares with the in-memory store (:mod:`ebbtide.queue.lifecycle`:
transitions, hold, alter, release, cancel, dispatch to the end of an attempt, losses):

- :mod:`~ebbtide.queue.store.submission`: :meth:`Store.submit`;
- :mod:`~ebbtide.queue.store.queries`: jobs, events, attempts, the scheduler's snapshot;
- :mod:`~ebbtide.queue.store.changes`: what changed since a cursor on the events (the
  scheduler's copy of the queue follows it);
- :mod:`~ebbtide.queue.store.reports`: ``ebb top``'s evictions, ``ebb report``'s rows;
- :mod:`~ebbtide.queue.store.transitions`: the guarded state change and the other
  primitives the shared logic writes through;
- :mod:`~ebbtide.queue.store.attempts`: what an eviction request said;
- :mod:`~ebbtide.queue.store.losses`: the jobs held for being lost;
- :mod:`~ebbtide.queue.store.housekeeping`: dependencies, reasons, holds, retention;
- :mod:`~ebbtide.queue.store.nodes`: heartbeats, nodes, the published policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ebbtide.queue.lifecycle.user_actions import UserActionLogic
from ebbtide.queue.store.attempts import AttemptMixin
from ebbtide.queue.store.base import (
    ATTEMPTS,
    EVENTS,
    JOBS,
    LEADERSHIP,
    NODES,
    REPORT_PROBE_EVENTS,
    StoreBase,
    check_epoch,
)
from ebbtide.queue.store.changes import ChangeMixin, Changes, EventCursor
from ebbtide.queue.store.housekeeping import HousekeepingMixin
from ebbtide.queue.store.losses import LOST_LOOKBACK_S, LOST_RESCAN_EVENTS, LossMixin
from ebbtide.queue.store.nodes import NodeMixin
from ebbtide.queue.store.queries import QueryMixin, job_to_dict
from ebbtide.queue.store.reports import (
    RECENT_EVICTIONS_SCAN_EVENTS,
    REPORT_EVENT_ORDER_SLACK_S,
    REPORT_EVENT_TYPES,
    ReportMixin,
)
from ebbtide.queue.store.submission import SubmissionMixin
from ebbtide.queue.store.transitions import TransitionMixin

if TYPE_CHECKING:
    from ebbtide.config.settings import Settings

__all__ = [
    "ATTEMPTS",
    "EVENTS",
    "JOBS",
    "LEADERSHIP",
    "LOST_LOOKBACK_S",
    "LOST_RESCAN_EVENTS",
    "NODES",
    "RECENT_EVICTIONS_SCAN_EVENTS",
    "REPORT_EVENT_ORDER_SLACK_S",
    "REPORT_EVENT_TYPES",
    "REPORT_PROBE_EVENTS",
    "Changes",
    "EventCursor",
    "Store",
    "StoreBase",
    "check_epoch",
    "job_to_dict",
    "open_store",
]


class Store(
    SubmissionMixin,
    AttemptMixin,
    LossMixin,
    HousekeepingMixin,
    ChangeMixin,
    QueryMixin,
    ReportMixin,
    TransitionMixin,
    NodeMixin,
    UserActionLogic,
):
    """All job database I/O.  Safe to share between threads."""


def open_store(settings: Settings, *, create: bool = True) -> Store:
    """The store a client or ``ebb server`` reads (``create``: as :class:`Store`), with
    the nodes' liveness read from Redis where ``EBBTIDE_REDIS_URL`` is set
    (:mod:`ebbtide.messaging.liveness`)."""
    from ebbtide.messaging.liveness import RedisLiveness

    store = Store(settings.db_url, create=create)
    if settings.redis_url:
        store.liveness = RedisLiveness.from_url(settings.redis_url, settings.namespace)
    return store
