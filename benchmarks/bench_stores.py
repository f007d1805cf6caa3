"""Throwaway stores for the benchmarks that measure one: a SQLite file in a temporary
directory, or a fresh database on a PostgreSQL server; each removed afterwards.  (Imported
by the benchmark scripts beside it, which run as ``python benchmarks/NAME.py``.)"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa


@contextmanager
def sqlite_url(prefix: str = "ebbtide-bench-") -> Iterator[str]:
    home = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield f"sqlite:///{home / 'ebbtide.db'}"
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def postgres_url(admin_url: str, *, keep: bool = False) -> Iterator[str]:
    """A fresh database on ``admin_url``'s server, dropped afterwards (unless ``keep``)."""
    name = f"ebbtide_bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
        finally:
            if not keep:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
