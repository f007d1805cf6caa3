"""Shared fixtures.

Integration and end-to-end tests use the real Redis (127.0.0.1:6379) and PostgreSQL
(127.0.0.1:5432) servers.  On a laptop without them those tests skip with a reason;
when ``CI=true`` a missing server is a failure, never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_URL = os.environ.get("EBBTIDE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ADMIN_URL = os.environ.get(
    "EBBTIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
IN_CI = os.environ.get("CI", "").lower() == "true"


def _missing(service: str, why: str) -> None:
    message = f"{service} is not reachable ({why})"
    if IN_CI:
        pytest.fail(f"{message}; CI=true requires it", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        _missing("Redis at " + REDIS_URL, str(exc))
    return REDIS_URL


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(POSTGRES_ADMIN_URL)
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        _missing("PostgreSQL at " + POSTGRES_ADMIN_URL, str(exc).splitlines()[0])
    return POSTGRES_ADMIN_URL


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    import sqlalchemy as sa

    name = f"ebbtide_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    base = postgres_admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path / 'ebbtide.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """The store's URL, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ebbtide.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(db_url: str):  # type: ignore[no-untyped-def]
    from ebbtide.clock import FakeClock
    from ebbtide.queue.store import Store

    s = Store(db_url, clock=FakeClock())
    yield s
    s.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sql_only(reason): a store test about SQL itself (raw SQL, engines, tokens): "
        "any_store skips its in-memory run",
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "memory"])
def any_store(request: pytest.FixtureRequest, tmp_path):  # type: ignore[no-untyped-def]
    """A store with a FakeClock on SQLite, on PostgreSQL and in memory: for the tests of
    the store's behaviour, which every backend must share.  A test marked ``sql_only``
    runs on the two databases only."""
    from ebbtide.clock import FakeClock
    from ebbtide.queue.memory import MemoryStore
    from ebbtide.queue.store import Store

    if request.param == "memory":
        marker = request.node.get_closest_marker("sql_only")
        if marker is not None:
            pytest.skip(f"SQL only: {marker.kwargs.get('reason') or marker.args[0]}")
        yield MemoryStore(clock=FakeClock())
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ebbtide.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    s = Store(url, clock=FakeClock())
    yield s
    s.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``EBBTIDE_HOME`` in a fresh directory (not made yet: the first command makes it),
    the current directory its parent: what a user's first ``ebb`` commands meet."""
    monkeypatch.setenv("EBBTIDE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"
