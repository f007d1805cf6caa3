"""Throwaway stores for the benchmarks that measure one: a SQLite file in a temporary
directory, or a fresh database on a PostgreSQL server; each removed afterwards.  (Imported
by the benchmark scripts beside it, which run as ``python benchmarks/NAME.py``.)"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store


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


def fill_jobs(
    url: str,
    spec: JobSpec,
    *,
    jobs: int,
    varying: Mapping[str, str],
    events_insert: str,
    params: Mapping[str, Any],
    last_id: int,
) -> float:
    """Fill a PostgreSQL store, server side, with ``jobs`` jobs copied from one job of
    ``spec`` submitted through the store (``generate_series`` as ``g``): each column as
    the template's, but those of ``varying`` (SQL over ``g`` and ``params``); then its
    events by ``events_insert`` (an ``INSERT INTO events ... FROM generate_series(...) g,
    etpl e``, ``etpl`` holding the template's first event); the id sequences set to
    ``last_id``.  Seconds it took."""
    started = time.perf_counter()
    store = Store(url)
    try:
        [template] = store.submit(spec, "user0", defaults_deadline_s=30)
    finally:
        store.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        columns = list(conn.execute(sa.text("SELECT * FROM jobs LIMIT 0")).keys())
        columns.remove("id")
        chosen = ", ".join(varying.get(c, f"t.{c}") for c in columns)
        conn.execute(
            sa.text("CREATE TEMP TABLE tpl AS SELECT * FROM jobs WHERE id = :t"), {"t": template}
        )
        conn.execute(
            sa.text("CREATE TEMP TABLE etpl AS SELECT * FROM events WHERE job_id = :t LIMIT 1"),
            {"t": template},
        )
        conn.execute(sa.text("DELETE FROM events"))
        conn.execute(sa.text("DELETE FROM jobs"))
        conn.execute(
            sa.text(
                f"INSERT INTO jobs (id, {', '.join(columns)}) "
                f"SELECT g, {chosen} FROM generate_series(1, :jobs) g, tpl t"
            ),
            {**params, "jobs": jobs},
        )
        conn.execute(sa.text(events_insert), {**params, "jobs": jobs})
        for table in ("jobs", "events"):
            conn.execute(
                sa.text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), :n)"),
                {"n": last_id},
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE jobs"))
        conn.execute(sa.text("VACUUM ANALYZE events"))
    engine.dispose()
    return time.perf_counter() - started
