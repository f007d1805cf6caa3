"""One active scheduler: a leader lock that dies with its holder.

On PostgreSQL the lock is a session-level advisory lock on a connection the scheduler
keeps open; on SQLite it is an ``flock`` on ``$EBBTIDE_HOME/scheduler.lock``.  Either way
the operating system or the database frees it when the process dies (even by
``kill -9``), and a standby scheduler takes over on its next try.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa

#: Advisory lock key of the scheduler's leadership (PostgreSQL).
LEADER_LOCK_KEY = 724_312


class LeaderLock:
    def __init__(self, engine: sa.Engine, home: Path) -> None:
        self.engine = engine
        self.home = home
        self._conn: Any = None
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None or self._fd is not None

    def try_acquire(self) -> bool:
        if self.held:
            return True
        if self.engine.dialect.name == "postgresql":
            conn = self.engine.connect()
            got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK_KEY})
            if got.scalar():
                conn.commit()
                self._conn = conn
                return True
            conn.close()
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.home / "scheduler.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": LEADER_LOCK_KEY})
                self._conn.commit()
            finally:
                self._conn.close()
                self._conn = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
