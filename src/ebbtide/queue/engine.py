"""Database engines: SQLite (WAL, a busy timeout; writes BEGIN IMMEDIATE, reads a plain
deferred BEGIN, so a read never waits for a writer nor holds one up) or PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: SQLite waits this long for a lock held by another process, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: The execution option that marks a connection as only reading.
_READ_ONLY = "ebbtide_read_only"


def _enable_wal(cur: Any) -> None:
    """Switch the database to WAL (it stays so).  The switch needs the database to
    itself and does not wait on the busy handler, so a process opening it while another
    writes retries for up to :data:`SQLITE_BUSY_TIMEOUT_MS`."""
    give_up = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > give_up:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _sqlite_engine(url: str) -> sa.Engine:
    path = url.removeprefix("sqlite:///")
    if path and path != ":memory:":
        # the database holds jobs' environments (``-v``): only its owner reads it; SQLite
        # gives its -wal and -shm files the database file's mode
        Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _enable_wal(cur)
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_READ_ONLY):
            conn.exec_driver_sql("BEGIN")  # a snapshot; WAL lets it run beside a writer
        else:
            # take the write lock up front: no deadlock upgrading a read lock
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def create_engine(url: str) -> sa.Engine:
    """An engine for ``url``: SQLite tuned for several processes, or a pooled server."""
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5)


@contextmanager
def reading(engine: sa.Engine) -> Iterator[Connection]:
    """A connection for reads only: on SQLite it takes no write lock."""
    with engine.connect() as conn:
        yield conn.execution_options(**{_READ_ONLY: True})
