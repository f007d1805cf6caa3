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

from ebbtide.config.settings import redacted, sqlite_file
from ebbtide.errors import NoStore, UserError

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


#: What a database URL may name: ebbtide keeps its jobs in SQLite or PostgreSQL.
URL_FORMS = "sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"
#: How to install the PostgreSQL driver (SQLite's comes with Python).
_POSTGRES_DRIVER = (
    "pip install 'ebbtide[postgres]' (the psycopg driver; from a clone: pip install -e "
    "'.[postgres]')"
)


def _sqlite_engine(url: str, create: bool) -> sa.Engine:
    path = sqlite_file(url)
    if path is not None:
        _sqlite_file(path, create)
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        if create:  # a switch to WAL is a write: not before the file is known to be ours
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


def _sqlite_file(path: Path, create: bool) -> None:
    """Make the database file (``create``), private to its owner: it holds jobs'
    environments (``-v``), and SQLite gives its -wal and -shm files its mode.  Its
    directory is made only when that directory's own parent exists (``~/.ebbtide``, a
    new ``EBBTIDE_HOME``): a mistyped path is refused, never made."""
    if path.exists():
        return
    if not create:
        raise NoStore(str(path))
    if not path.parent.is_dir():
        if not path.parent.parent.is_dir():
            raise UserError(
                f"cannot make the store {path}: the directory {path.parent.parent} does not "
                "exist; check EBBTIDE_HOME (or EBBTIDE_DB_URL)"
            )
        with contextlib.suppress(FileExistsError):
            path.parent.mkdir(mode=0o700)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def create_engine(url: str, *, create: bool = True) -> sa.Engine:
    """An engine for ``url``: SQLite tuned for several processes, or a pooled server.
    A URL that is not SQLite's or PostgreSQL's, or whose driver is missing, is a
    :class:`UserError` saying so; with ``create`` False a SQLite file that is not there
    is one too (a command that only reads must not make an empty store), and the file is
    not switched to WAL (:func:`enable_wal` does, once it proved ebbtide's)."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise UserError(
            f"EBBTIDE_DB_URL: cannot read {redacted(url)!r} as a database URL; expected {URL_FORMS}"
        ) from None
    dialect = parsed.get_backend_name()
    if dialect not in ("sqlite", "postgresql"):
        raise UserError(
            f"EBBTIDE_DB_URL: ebbtide keeps its jobs in SQLite or PostgreSQL, not {dialect} "
            f"({URL_FORMS})"
        )
    try:
        if dialect == "sqlite":
            return _sqlite_engine(url, create)
        return sa.create_engine(url, pool_pre_ping=True, pool_size=5)
    except (ModuleNotFoundError, sa.exc.NoSuchModuleError) as exc:
        name = getattr(exc, "name", None) or parsed.get_driver_name()
        hint = _POSTGRES_DRIVER
        if "psycopg" not in str(name):
            hint = f"install it, or write postgresql:// for psycopg: {hint}"
        raise UserError(
            f"EBBTIDE_DB_URL: {redacted(url)} needs the {name} driver, which is not "
            f"installed: {hint}"
        ) from None


def enable_wal(engine: sa.Engine) -> None:
    """Switch a SQLite database to WAL (it stays so; a no-op elsewhere, or when it is
    already): for an engine made with ``create`` False, once the file proved ebbtide's."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return
    conn = engine.raw_connection()  # outside a transaction, where the switch can be made
    try:
        cur = conn.cursor()
        if cur.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            _enable_wal(cur)
        cur.close()
    finally:
        conn.close()


@contextmanager
def reading(engine: sa.Engine) -> Iterator[Connection]:
    """A connection for reads only: on SQLite it takes no write lock."""
    with engine.connect() as conn:
        yield conn.execution_options(**{_READ_ONLY: True})
