"""The store's base: the engine, its connections and transactions, the leadership fence,
the events every write appends, and the tables the other modules read and write.

A store that a leader fences (:meth:`StoreBase.fenced`) checks the leadership epoch at
the start of every write transaction (:func:`check_epoch`); reads are not fenced.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Self

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.config.settings import redacted
from ebbtide.errors import NotLeader, StoreUnavailable
from ebbtide.queue import migrations
from ebbtide.queue.drains import Drains
from ebbtide.queue.engine import create_engine, enable_wal, reading
from ebbtide.queue.models import Attempt, Event, JobTable, Leadership, Node
from ebbtide.queue.states import EventType
from ebbtide.queue.tokens import Tokens

if TYPE_CHECKING:
    from ebbtide.messaging.liveness import NodeLiveness


JOBS: sa.Table = JobTable.__table__  # type: ignore[attr-defined]
ATTEMPTS: sa.Table = Attempt.__table__  # type: ignore[attr-defined]
EVENTS: sa.Table = Event.__table__  # type: ignore[attr-defined]
NODES: sa.Table = Node.__table__  # type: ignore[attr-defined]
LEADERSHIP: sa.Table = Leadership.__table__  # type: ignore[attr-defined]

#: Consecutive events each probe of :meth:`Store.report_rows`'s bisection reads, the latest
#: of their times deciding: one event reported late does not mislead it.
REPORT_PROBE_EVENTS = 16


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


class StoreBase:
    """The engine and how the store's methods use it: one transaction per write
    (:meth:`_tx`, fenced when the store is a leader's view), a connection per read
    (:meth:`_read`).  Each concept of the store is a mixin over this class."""

    def __init__(
        self, url: str, *, clock: Clock = SYSTEM_CLOCK, migrate: bool = True, create: bool = True
    ) -> None:
        """The store at ``url``, its tables brought up to date (``migrate``).  With
        ``create`` False, a SQLite file that is not there, or a database with no ebbtide
        schema, is an error, not a new store: for commands that only read (``ebb qstat``
        with a mistyped ``EBBTIDE_HOME`` or ``EBBTIDE_DB_URL``)."""
        self.url = url
        self.clock = clock
        self.engine = create_engine(url, create=create)
        if migrate:
            try:
                migrations.migrate(self.engine, create=create)
                if not create:  # an ebbtide store, then: WAL, as a store made here is
                    enable_wal(self.engine)
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
    #: where nodes' heartbeats also arrive (Redis, in distributed mode: see
    #: :mod:`ebbtide.messaging.liveness`); :meth:`nodes` takes the later of the two
    liveness: NodeLiveness | None = None

    def close(self) -> None:
        self.engine.dispose()
        if self.liveness is not None:
            self.liveness.close()

    def fenced(self, epoch: int) -> Self:
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
            EVENTS.insert(),
            {
                "job_id": job_id,
                "attempt": attempt,
                "type": event.value,
                "time": self.clock.time() if now is None else now,
                "data_json": json.dumps(data or {}),
            },
        )

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
