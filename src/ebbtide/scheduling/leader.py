"""One active scheduler: a leader lock that dies with its holder, and an epoch that fences.

On PostgreSQL the lock is a session-level advisory lock on a connection the scheduler
keeps open; on SQLite it is an ``flock`` on a file beside the database
(``ebbtide.db.scheduler.lock``), so two schedulers on one database contend for one lock
whatever their ``EBBTIDE_HOME``.  Either way the operating system or the database frees
it when the process dies (even by ``kill -9``), and a standby takes over on its next try.

A lock alone is not enough: a leader whose lock connection dropped (or that was paused
while a standby took over) may still be in the middle of a pass.  So whoever takes the
lock also bumps the **leadership epoch** in the store, and the leader writes through
:meth:`~ebbtide.queue.store.Store.fenced`: every write checks the epoch in its own
transaction, and a deposed leader's writes fail with :class:`~ebbtide.errors.NotLeader`.
The leader also re-checks its lock and the epoch before every pass
(:meth:`LeaderLock.still_held`) and stands down the moment either is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.queue.engine import reading
from ebbtide.queue.store import LEADERSHIP

log = logging.getLogger("ebbtide.scheduler")

#: Advisory lock key of the scheduler's leadership (PostgreSQL).
LEADER_LOCK_KEY = 724_312


def lock_path(engine: sa.Engine, home: Path) -> Path:
    """Where the SQLite leader lock lives: beside the database file (``home`` for an
    in-memory database)."""
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        return Path(database).with_name(Path(database).name + ".scheduler.lock")
    return home / "scheduler.lock"


def scheduler_running(engine: sa.Engine, home: Path) -> bool | None:
    """Whether a scheduler holds the leader lock of this store now, for clients that
    want to say why a queued job has no reason yet; None when it cannot be told.

    Nothing is written and no lock is kept.  On PostgreSQL it reads ``pg_locks`` (any
    role may); on SQLite it tries a shared ``flock`` on the lock file and lets it go at
    once (a scheduler that tries for the lock in that instant tries again a moment
    later: :data:`PROBE_RETRIES`), and a lock file this user may not open (another
    user's scheduler) cannot tell."""
    if engine.dialect.name == "postgresql":
        try:
            with reading(engine) as conn:
                held = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                        "AND classid = 0 AND objid = :k AND objsubid = 1 AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database())"
                    ),
                    {"k": LEADER_LOCK_KEY},
                ).scalar()
        except Exception:
            return None
        return bool(held)
    if engine.dialect.name != "sqlite":
        return None
    try:
        fd = os.open(lock_path(engine, home), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # no scheduler ever ran on this store
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


#: A client's look at the SQLite lock (:func:`scheduler_running`) holds it shared for
#: microseconds: a scheduler that meets one tries again this many times, so many seconds
#: apart, before it takes the lock for another scheduler's.
PROBE_RETRIES, PROBE_RETRY_S = 5, 0.01


def _flock_soon(fd: int) -> None:
    """Take ``fd``'s exclusive ``flock`` now, or after a client's look at it is over;
    ``BlockingIOError`` when another holds it."""
    for _ in range(PROBE_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(PROBE_RETRY_S)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class LeaderLock:
    def __init__(
        self,
        engine: sa.Engine,
        home: Path,
        holder: str | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.engine = engine
        self.home = home
        #: stamps when an epoch began (``acquired_at``)
        self.clock = clock
        #: who leads, for the record: host and pid
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        #: the leadership epoch this holder took, while it holds the lock
        self.epoch: int | None = None
        self._conn: Any = None
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None or self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free, and begin a new epoch; True while it is held.

        May raise when the store cannot be reached (the caller retries)."""
        if self.held:
            return True
        if not self._lock():
            return False
        try:
            self.epoch = self._begin_epoch()
        except BaseException:
            self.release()
            raise
        return True

    def _lock(self) -> bool:
        if self.engine.dialect.name == "postgresql":
            conn = self.engine.connect()
            try:
                got = conn.execute(
                    sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK_KEY}
                ).scalar()
                conn.commit()
            except BaseException:
                conn.close()
                raise
            if got:
                self._conn = conn
                return True
            conn.close()
            return False
        path = lock_path(self.engine, self.home)
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0600, and made so if older: flock needs only a descriptor, so a lock file others
        # can open is one any local user could hold to keep every scheduler standing by
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            _flock_soon(fd)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.holder}\n".encode())
        self._fd = fd
        return True

    def _begin_epoch(self) -> int:
        with self.engine.begin() as conn:
            conn.execute(
                LEADERSHIP.update()
                .where(LEADERSHIP.c.id == 1)
                .values(
                    epoch=LEADERSHIP.c.epoch + 1, holder=self.holder, acquired_at=self.clock.time()
                )
            )
            epoch = conn.execute(
                sa.select(LEADERSHIP.c.epoch).where(LEADERSHIP.c.id == 1)
            ).scalar_one()
        return int(epoch)

    def still_held(self) -> bool:
        """Whether this holder still leads: its lock is alive and no one began a later
        epoch.  False when the store cannot tell (a leader that cannot check stands down)."""
        if not self.held or self.epoch is None:
            return False
        try:
            if self._conn is not None:
                self._conn.execute(sa.text("SELECT 1"))
                self._conn.commit()
            with reading(self.engine) as conn:
                current = conn.execute(
                    sa.select(LEADERSHIP.c.epoch).where(LEADERSHIP.c.id == 1)
                ).scalar()
        except Exception as exc:
            log.warning("cannot confirm the scheduler lock: %s", str(exc).splitlines()[0])
            return False
        return current == self.epoch

    def release(self) -> None:
        self.epoch = None
        if self._conn is not None:
            try:
                self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": LEADER_LOCK_KEY})
                self._conn.commit()
            except Exception:
                pass  # a dead connection: the database already let the lock go
            finally:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
