"""Schema migrations on SQLite and PostgreSQL: fresh builds, re-runs, refusals, no drift."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlmodel import SQLModel

import ebbtide.queue.models  # noqa: F401  (registers the tables on SQLModel.metadata)
from ebbtide.clock import FakeClock
from ebbtide.errors import EbbtideError
from ebbtide.queue import migrations
from ebbtide.queue.migrations import LATEST_VERSION, current_version, migrate
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store

MODEL_TABLES = sorted(SQLModel.metadata.tables)


def test_the_migrations_know_every_table_of_the_models() -> None:
    """ebbtide's own tables, told from a database's foreign ones, are the models'."""
    from ebbtide.queue.migrations import MIGRATION_TABLES

    assert set(MODEL_TABLES) == MIGRATION_TABLES | {"ebbtide_schema"}


@pytest.fixture
def bare(db_url: str) -> Iterator[Store]:
    """A store on an empty database, not migrated."""
    store = Store(db_url, clock=FakeClock(), migrate=False)
    yield store
    store.close()


def _versions(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT version FROM ebbtide_schema ORDER BY version"))
        return [r[0] for r in rows]


def test_fresh_database_migrates_to_latest(bare: Store) -> None:
    assert sa.inspect(bare.engine).get_table_names() == []
    assert migrate(bare.engine) == 0  # the version found before
    assert _versions(bare.engine) == list(range(1, LATEST_VERSION + 1))
    with bare.engine.connect() as conn:
        assert current_version(conn) == LATEST_VERSION
    assert sorted(sa.inspect(bare.engine).get_table_names()) == MODEL_TABLES


def test_latest_version_counts_the_migrations() -> None:
    assert LATEST_VERSION == len(migrations.MIGRATIONS) >= 1


def test_store_migrates_on_open(db_url: str) -> None:
    store = Store(db_url, clock=FakeClock())
    try:
        assert _versions(store.engine)[-1] == LATEST_VERSION
    finally:
        store.close()


def test_migrating_again_is_a_no_op_and_keeps_jobs(db_url: str) -> None:
    first = Store(db_url, clock=FakeClock())
    ids = [
        first.submit(JobSpec(command=["x"], priority=p), "alice", defaults_deadline_s=30.0)[0]
        for p in (0, 5, 0)
    ]
    first.hold(ids[2], user="alice")
    before = [job.model_dump() for job in first.list_jobs()]
    queued = first.queued_jobs()
    versions = _versions(first.engine)
    first.close()

    engine = sa.create_engine(db_url)
    try:
        assert migrate(engine) == LATEST_VERSION
    finally:
        engine.dispose()
    second = Store(db_url, clock=FakeClock())
    try:
        assert _versions(second.engine) == versions
        assert [job.model_dump() for job in second.list_jobs()] == before
        assert second.queued_jobs() == queued
        assert [q.id for q in queued] == [ids[1], ids[0]]
        assert second.get(ids[2]).state == JobState.HELD
        # and it still works
        new = second.submit(JobSpec(command=["y"]), "bob", defaults_deadline_s=30.0)[0]
        assert new > max(ids)
    finally:
        second.close()


def test_newer_schema_is_refused(bare: Store) -> None:
    migrate(bare.engine)
    with bare.engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO ebbtide_schema (version, applied_at) VALUES (:v, 0)"),
            {"v": LATEST_VERSION + 1},
        )
    with pytest.raises(EbbtideError) as info:
        migrate(bare.engine)
    message = str(info.value)
    assert str(LATEST_VERSION + 1) in message
    assert "upgrade ebbtide" in message
    assert _versions(bare.engine) == [*range(1, LATEST_VERSION + 1), LATEST_VERSION + 1]


def test_store_refuses_a_newer_schema_and_closes_its_connections(bare: Store) -> None:
    """Opening a store on a too-new database raises, and leaves no connection open behind."""
    migrate(bare.engine)
    with bare.engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO ebbtide_schema (version, applied_at) VALUES (:v, 0)"),
            {"v": LATEST_VERSION + 1},
        )
    with pytest.raises(EbbtideError):
        Store(bare.url, migrate=True)
    # a connection left in the pool of the abandoned engine warns (an error here) when freed
    gc.collect()


def test_newer_schema_on_an_otherwise_empty_database_is_refused(bare: Store) -> None:
    with bare.engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE ebbtide_schema"
                " (version INTEGER PRIMARY KEY, applied_at FLOAT NOT NULL)"
            )
        )
        conn.execute(
            sa.text("INSERT INTO ebbtide_schema (version, applied_at) VALUES (:v, 0)"),
            {"v": LATEST_VERSION + 7},
        )
    with pytest.raises(EbbtideError, match=str(LATEST_VERSION + 7)):
        migrate(bare.engine)
    # nothing was built on top of a schema this version does not understand
    assert sa.inspect(bare.engine).get_table_names() == ["ebbtide_schema"]


def test_concurrent_migrators_apply_each_version_once(bare: Store) -> None:
    engines = [bare.engine, Store(bare.url, migrate=False).engine]
    barrier = threading.Barrier(len(engines))
    errors: list[BaseException] = []

    def run(engine: sa.Engine) -> None:
        barrier.wait()
        try:
            migrate(engine)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    engines[1].dispose()
    assert errors == []
    assert _versions(bare.engine) == list(range(1, LATEST_VERSION + 1))


# ------------------------------------------------------------------ drift
#
# One database per backend for all tables: creating a PostgreSQL database costs most of a
# second, so the checks loop over the tables and compare whole dicts (the diff names them).


@pytest.fixture
def migrated(bare: Store) -> sa.Inspector:
    migrate(bare.engine)
    return sa.inspect(bare.engine)


def _kind(column_type: sa.types.TypeEngine) -> str:
    """The family of a column type, the same whether declared or reflected."""
    if isinstance(column_type, sa.types.TypeDecorator):  # SQLModel's AutoString
        column_type = column_type.impl_instance
    for family, name in (
        (sa.Boolean, "bool"),
        (sa.Integer, "int"),
        (sa.Float, "float"),
        (sa.Numeric, "float"),
        (sa.Text, "text"),
        (sa.String, "str"),
    ):
        if isinstance(column_type, family):
            return name
    return type(column_type).__name__


def test_no_drift_in_columns(migrated: sa.Inspector) -> None:
    """Every model table exists with the same column names and nullability."""
    assert sorted(migrated.get_table_names()) == MODEL_TABLES
    expected = {
        t: sorted((c.name, c.nullable) for c in SQLModel.metadata.tables[t].columns)
        for t in MODEL_TABLES
    }
    actual = {
        t: sorted((c["name"], c["nullable"]) for c in migrated.get_columns(t)) for t in MODEL_TABLES
    }
    assert actual == expected


def test_no_drift_in_column_types(migrated: sa.Inspector) -> None:
    expected = {
        t: {c.name: _kind(c.type) for c in SQLModel.metadata.tables[t].columns}
        for t in MODEL_TABLES
    }
    actual = {
        t: {c["name"]: _kind(c["type"]) for c in migrated.get_columns(t)} for t in MODEL_TABLES
    }
    assert actual == expected


def test_no_drift_in_keys_and_indexes(migrated: sa.Inspector) -> None:
    def declared(t: str) -> dict[str, object]:
        model = SQLModel.metadata.tables[t]
        return {
            "pk": [c.name for c in model.primary_key.columns],
            "indexes": sorted(
                (ix.name, tuple(c.name for c in ix.columns), bool(ix.unique))
                for ix in model.indexes
            ),
            "unique": sorted(
                tuple(c.name for c in uc.columns)
                for uc in model.constraints
                if isinstance(uc, sa.UniqueConstraint)
            ),
        }

    def reflected(t: str) -> dict[str, object]:
        return {
            "pk": migrated.get_pk_constraint(t)["constrained_columns"],
            "indexes": sorted(
                (ix["name"], tuple(ix["column_names"]), bool(ix["unique"]))
                for ix in migrated.get_indexes(t)
                # PostgreSQL backs a unique constraint with an index; checked as "unique"
                if not ix.get("duplicates_constraint")
            ),
            "unique": sorted(
                tuple(uc["column_names"]) for uc in migrated.get_unique_constraints(t)
            ),
        }

    assert {t: reflected(t) for t in MODEL_TABLES} == {t: declared(t) for t in MODEL_TABLES}


def test_upgrade_from_version_1_keeps_queued_jobs(db_url: str) -> None:
    """A database left at version 1 with a queued job upgrades without losing it."""
    import time

    import sqlalchemy as sa

    from ebbtide.queue import migrations as m

    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            m._version_table().create(conn)
            m.MIGRATIONS[0](conn)
            conn.execute(m._version_table().insert().values(version=1, applied_at=time.time()))
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (name, owner, queue, priority, kind, state, reason,"
                    " spec_json, compute_pct, gpus, memory_mib, deadline_s, signal,"
                    " depends_json, submitted_at, attempts, evictions, failures,"
                    " cancel_requested) VALUES ('old', 'alice', 'default', 0, 'batch',"
                    " 'queued', '', '{\"command\": [\"true\"]}', 10, 0, 1024, 30, 15,"
                    " '[]', 1.0, 0, 0, 0, false)"
                )
            )
        assert m.migrate(engine) == 1
        with engine.connect() as conn:
            assert m.current_version(conn) == m.LATEST_VERSION
            row = conn.execute(sa.text("SELECT name, state, requeued_at FROM jobs")).one()
        assert tuple(row) == ("old", "queued", None)
    finally:
        engine.dispose()


def test_upgrade_from_version_5_adds_the_tokens_table(db_url: str) -> None:
    """Version 6 adds ``ebb server``'s tokens to a database that has jobs already."""
    import time

    from ebbtide.queue import migrations as m

    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            m._version_table().create(conn)
            for version in range(1, 6):
                m.MIGRATIONS[version - 1](conn)
                conn.execute(
                    m._version_table().insert().values(version=version, applied_at=time.time())
                )
        assert "tokens" not in sa.inspect(engine).get_table_names()
        assert m.migrate(engine) == 5
        assert "tokens" in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    store = Store(db_url, clock=FakeClock())
    try:
        token_id, token = store.tokens.create("alice", by="root")
        assert store.tokens.check(token).id == token_id
    finally:
        store.close()


def test_upgrade_from_version_7_adds_suspended_at_and_keeps_a_paused_job(db_url: str) -> None:
    """Version 8 records suspensions; a job paused before the upgrade is paused, not
    suspended."""
    import time

    from ebbtide.queue import migrations as m

    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            m._version_table().create(conn)
            for version in range(1, 8):
                m.MIGRATIONS[version - 1](conn)
                conn.execute(
                    m._version_table().insert().values(version=version, applied_at=time.time())
                )
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (name, owner, queue, priority, kind, state, reason,"
                    " spec_json, compute_pct, gpus, memory_mib, deadline_s, signal,"
                    " depends_json, submitted_at, attempts, evictions, failures,"
                    " cancel_requested, pausable, paused_at) VALUES ('old', 'alice',"
                    " 'default', 0, 'batch', 'running', '', '{\"command\": [\"true\"]}', 10,"
                    " 0, 1024, 30, 15, '[]', 1.0, 1, 0, 0, false, true, 5.0)"
                )
            )
        columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
        assert "suspended_at" not in columns
        assert m.migrate(engine) == 7
        with engine.connect() as conn:
            row = conn.execute(sa.text("SELECT paused_at, suspended_at FROM jobs")).one()
        assert tuple(row) == (5.0, None)
    finally:
        engine.dispose()


def test_upgrade_from_version_8_adds_the_usage_columns_and_keeps_an_attempt(db_url: str) -> None:
    """Version 9 records what attempts used; an attempt that ended before the upgrade was
    not measured (NULL, never zero), and a new one can record its usage."""
    import time

    from ebbtide.queue import migrations as m
    from ebbtide.queue.models import USAGE_COLUMNS

    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            m._version_table().create(conn)
            for version in range(1, 9):
                m.MIGRATIONS[version - 1](conn)
                conn.execute(
                    m._version_table().insert().values(version=version, applied_at=time.time())
                )
            conn.execute(
                sa.text(
                    "INSERT INTO attempts (job_id, number, node, devices, compute_pct,"
                    " memory_mib, dispatched_at, ended_at, outcome, exit_code) VALUES"
                    " (1, 1, 'n1', '0', 25, 8192, 1.0, 2.0, 'succeeded', 0)"
                )
            )
        columns = {c["name"] for c in sa.inspect(engine).get_columns("attempts")}
        assert not columns & set(USAGE_COLUMNS)
        assert m.migrate(engine) == 8
        with engine.begin() as conn:
            row = conn.execute(sa.text(f"SELECT {', '.join(USAGE_COLUMNS)} FROM attempts")).one()
            assert tuple(row) == (None,) * len(USAGE_COLUMNS)
            conn.execute(
                sa.text(
                    "UPDATE attempts SET usage_samples = 120, used_compute_p95_pct = 18.0,"
                    " used_memory_peak_mib = 3072.5"
                )
            )
            row = conn.execute(
                sa.text(
                    "SELECT usage_samples, used_compute_p95_pct, used_memory_peak_mib FROM attempts"
                )
            ).one()
        assert tuple(row) == (120, 18.0, 3072.5)
    finally:
        engine.dispose()


def test_upgrade_from_version_9_indexes_finished_jobs_and_keeps_them(db_url: str) -> None:
    """Version 10 indexes jobs by ``(finished_at, id)`` for retention; jobs that finished
    before the upgrade are found through it, and only they are purged."""
    import time

    from ebbtide.queue import migrations as m

    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            m._version_table().create(conn)
            for version in range(1, 10):
                m.MIGRATIONS[version - 1](conn)
                conn.execute(
                    m._version_table().insert().values(version=version, applied_at=time.time())
                )
            for name, state, finished_at in (("done", "succeeded", 5.0), ("next", "queued", None)):
                conn.execute(
                    sa.text(
                        "INSERT INTO jobs (name, owner, queue, priority, kind, state, reason,"
                        " spec_json, compute_pct, gpus, memory_mib, deadline_s, signal,"
                        " depends_json, submitted_at, finished_at, attempts, evictions,"
                        " failures, cancel_requested) VALUES (:name, 'alice', 'default', 0,"
                        " 'batch', :state, '', '{\"command\": [\"true\"]}', 10, 0, 1024, 30,"
                        " 15, '[]', 1.0, :finished_at, 0, 0, 0, false)"
                    ),
                    {"name": name, "state": state, "finished_at": finished_at},
                )
        indexes = {ix["name"] for ix in sa.inspect(engine).get_indexes("jobs")}
        assert "ix_jobs_finished_at" not in indexes
        assert m.migrate(engine) == 9
        indexed = sa.inspect(engine).get_indexes("jobs")
        [index] = [ix for ix in indexed if ix["name"] == "ix_jobs_finished_at"]
        assert index["column_names"] == ["finished_at", "id"]
    finally:
        engine.dispose()
    store = Store(db_url, clock=FakeClock())
    try:
        result = store.purge(0.0, now=10.0, pause_s=0.0)
        assert (result.jobs, result.attempts, result.events) == (1, 0, 0)
        assert [job.name for job in store.list_jobs()] == ["next"]
    finally:
        store.close()


def test_a_reading_command_leaves_a_database_without_ebbtide_alone(db_url: str) -> None:
    """A trial's trap: ``EBBTIDE_DB_URL=.../postgres ebb qstat`` printed an empty list
    and made ebbtide's tables in the shared database.  A store opened only to read
    (``create`` False) is :class:`NoStore` there, and writes nothing."""
    from ebbtide.errors import NoStore

    if db_url.startswith("sqlite"):  # the file exists, empty: as a database made by hand
        import sqlite3

        sqlite3.connect(db_url.removeprefix("sqlite:///")).close()
    with pytest.raises(NoStore, match="there is no ebbtide store at"):
        Store(db_url, create=False)
    engine = sa.create_engine(db_url)
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
    Store(db_url).close()  # a command that writes makes the store, as before
    Store(db_url, create=False).close()  # ... and one that reads then finds it


def test_a_reading_open_writes_nothing_to_a_foreign_sqlite_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Opening a SQLite file that is not ebbtide's only to read (``create`` False) once
    switched it to WAL, a write, before it found no schema: the file is left as it was."""
    import sqlite3

    from ebbtide.errors import NoStore

    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('theirs')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(NoStore, match="there is no ebbtide store at"):
        Store(f"sqlite:///{path}", create=False)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        conn.close()


def test_a_reading_open_of_ebbtides_own_sqlite_store_keeps_it_in_wal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sqlite3

    path = tmp_path / "ebbtide.db"
    Store(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    conn.close()
    store = Store(f"sqlite:///{path}", create=False)
    try:
        assert store.list_jobs() == []
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()
