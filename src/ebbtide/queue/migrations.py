"""Versioned schema migrations.

Each migration is a function that takes a connection and moves the schema one version
up; its DDL is frozen here, never derived from the current models, so an old database
upgrades the same way a new one is built.  ``tests/integration/test_migrations.py``
checks that the migrated schema matches the models (no drift) and that queued jobs
survive an upgrade.

To change the schema: change ``models.py``, append a migration below, bump nothing else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ebbtide.config.settings import redacted
from ebbtide.errors import EbbtideError, NoStore, UserError
from ebbtide.queue.engine import reading


def _v1_initial(conn: Connection) -> None:
    md = sa.MetaData()
    f, i, s, b, t = sa.Float, sa.Integer, sa.String, sa.Boolean, sa.Text
    sa.Table(
        "jobs",
        md,
        sa.Column("id", i, primary_key=True, autoincrement=True),
        sa.Column("name", s, nullable=False),
        sa.Column("owner", s, nullable=False, index=True),
        sa.Column("queue", s, nullable=False),
        sa.Column("priority", i, nullable=False),
        sa.Column("kind", s, nullable=False),
        sa.Column("state", s, nullable=False),
        sa.Column("reason", s, nullable=False),
        sa.Column("spec_json", t, nullable=False),
        sa.Column("compute_pct", f, nullable=False),
        sa.Column("gpus", i, nullable=False),
        sa.Column("memory_mib", i, nullable=False),
        sa.Column("deadline_s", f, nullable=False),
        sa.Column("signal", i, nullable=False),
        sa.Column("array_id", i, index=True),
        sa.Column("array_index", i),
        sa.Column("array_limit", i),
        sa.Column("depends_json", s, nullable=False),
        sa.Column("submitted_at", f, nullable=False),
        sa.Column("started_at", f),
        sa.Column("finished_at", f),
        sa.Column("attempts", i, nullable=False),
        sa.Column("node", s),
        sa.Column("devices", s),
        sa.Column("exit_code", i),
        sa.Column("checkpoint_path", s),
        sa.Column("last_checkpoint_at", f),
        sa.Column("evictions", i, nullable=False),
        sa.Column("failures", i, nullable=False),
        sa.Column("cancel_requested", b, nullable=False),
        sa.Column("stdout_path", s),
        sa.Column("stderr_path", s),
        sa.Column("progress_done", f),
        sa.Column("progress_total", f),
        sa.Index("ix_jobs_state_priority", "state", "priority", "id"),
    )
    sa.Table(
        "attempts",
        md,
        sa.Column("id", i, primary_key=True, autoincrement=True),
        sa.Column("job_id", i, nullable=False, index=True),
        sa.Column("number", i, nullable=False),
        sa.Column("node", s, nullable=False),
        sa.Column("devices", s, nullable=False),
        sa.Column("compute_pct", f, nullable=False),
        sa.Column("memory_mib", i, nullable=False),
        sa.Column("dispatched_at", f, nullable=False),
        sa.Column("started_at", f),
        sa.Column("ended_at", f),
        sa.Column("outcome", s),
        sa.Column("exit_code", i),
        sa.Column("pid", i),
        sa.Column("last_checkpoint_at", f),
        sa.Column("stdout_path", s),
        sa.Column("stderr_path", s),
        sa.UniqueConstraint("job_id", "number"),
    )
    sa.Table(
        "events",
        md,
        sa.Column("id", i, primary_key=True, autoincrement=True),
        sa.Column("job_id", i, nullable=False, index=True),
        sa.Column("attempt", i),
        sa.Column("type", s, nullable=False),
        sa.Column("time", f, nullable=False),
        sa.Column("data_json", s, nullable=False),
    )
    sa.Table(
        "nodes",
        md,
        sa.Column("name", s, primary_key=True),
        sa.Column("started_at", f, nullable=False),
        sa.Column("heartbeat_at", f, nullable=False),
        sa.Column("devices_json", s, nullable=False),
        sa.Column("stopping", b, nullable=False),
    )
    md.create_all(conn)


def _v2_backoff_and_admission(conn: Connection) -> None:
    """Policies: requeue time (backoff), time to the first checkpoint (admission), and
    evictions forgiven by a release (max_preemptions counts the ones since)."""
    for column in ("requeued_at", "first_checkpoint_s"):
        conn.execute(sa.text(f"ALTER TABLE jobs ADD COLUMN {column} FLOAT"))
    conn.execute(
        sa.text("ALTER TABLE jobs ADD COLUMN evictions_forgiven INTEGER NOT NULL DEFAULT 0")
    )


def _v3_device_drains(conn: Connection) -> None:
    """Admins drain and undrain nodes and devices (``ebb node drain|undrain``)."""
    sa.Table(
        "device_drains",
        sa.MetaData(),
        sa.Column("node", sa.String, primary_key=True),
        sa.Column("device", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("state", sa.String, nullable=False),
        sa.Column("by", sa.String, nullable=False),
        sa.Column("reason", sa.String, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    ).create(conn)


def _v4_leadership(conn: Connection) -> None:
    """The scheduler's leadership epoch, which fences a deposed leader's writes."""
    table = sa.Table(
        "leadership",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("holder", sa.String, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
    )
    table.create(conn)
    conn.execute(table.insert().values(id=1, epoch=0, holder="", acquired_at=0.0))


def _v5_pause(conn: Connection) -> None:
    """Graduated response: whether a job may be paused for compute rather than evicted,
    and since when its current attempt is paused (NULL: it runs)."""
    conn.execute(sa.text("ALTER TABLE jobs ADD COLUMN pausable BOOLEAN NOT NULL DEFAULT FALSE"))
    conn.execute(sa.text("ALTER TABLE jobs ADD COLUMN paused_at FLOAT"))


def _v6_tokens(conn: Connection) -> None:
    """``ebb server``'s bearer tokens, which admins issue and revoke (``ebb token``);
    only their SHA-256 is kept."""
    f, s = sa.Float, sa.String
    sa.Table(
        "tokens",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user", s, nullable=False),
        sa.Column("digest", s, nullable=False),
        sa.Column("note", s, nullable=False),
        sa.Column("created_by", s, nullable=False),
        sa.Column("created_at", f, nullable=False),
        sa.Column("expires_at", f),
        sa.Column("revoked_at", f),
        sa.Column("revoked_by", s),
        sa.UniqueConstraint("digest"),
    ).create(conn)


def _v7_published_policy(conn: Connection) -> None:
    """The policy the leading scheduler runs with, published for clients (the queues,
    defaults and deadlines they check a job against)."""
    conn.execute(sa.text("ALTER TABLE leadership ADD COLUMN policy_text TEXT"))
    conn.execute(sa.text("ALTER TABLE leadership ADD COLUMN policy_source VARCHAR"))
    conn.execute(sa.text("ALTER TABLE leadership ADD COLUMN policy_at FLOAT"))


def _v8_suspend(conn: Connection) -> None:
    """Suspend to host: since when the current attempt's CUDA state is in host memory
    (NULL: on its GPU), so that the scheduler counts no GPU memory for it."""
    conn.execute(sa.text("ALTER TABLE jobs ADD COLUMN suspended_at FLOAT"))


def _v9_attempt_usage(conn: Connection) -> None:
    """Right-sizing: what each attempt used of its GPUs as its node agent measured it
    (samples, p95 and peak compute and memory; NULL where nothing was measured)."""
    conn.execute(sa.text("ALTER TABLE attempts ADD COLUMN usage_samples INTEGER"))
    for column in (
        "used_compute_p95_pct",
        "used_compute_peak_pct",
        "used_memory_p95_mib",
        "used_memory_peak_mib",
    ):
        conn.execute(sa.text(f"ALTER TABLE attempts ADD COLUMN {column} FLOAT"))


def _v10_finished_at_index(conn: Connection) -> None:
    """Retention: finished jobs are read oldest first, a batch at a time from where the
    last one stopped, as a range of this index (``queue/purge.py``)."""
    conn.execute(sa.text("CREATE INDEX ix_jobs_finished_at ON jobs (finished_at, id)"))


def _v11_node_runs_jobs_of(conn: Connection) -> None:
    """Whose jobs each node's agent runs, from its heartbeat, so that a submission no
    node would run is refused at once rather than failed at its start."""
    conn.execute(sa.text("ALTER TABLE nodes ADD COLUMN runs_jobs_of VARCHAR"))


def _v12_liveness_in_redis(conn: Connection) -> None:
    """No table changes: the mark of a store whose nodes may keep alive in Redis
    (``messaging/liveness.py``), whose store heartbeats can then be up to 30 s old.  A
    scheduler older than this refuses the store rather than give such nodes up."""


#: Migrations in order; the list index + 1 is the version a migration produces.
MIGRATIONS: list[Callable[[Connection], None]] = [
    _v1_initial,
    _v2_backoff_and_admission,
    _v3_device_drains,
    _v4_leadership,
    _v5_pause,
    _v6_tokens,
    _v7_published_policy,
    _v8_suspend,
    _v9_attempt_usage,
    _v10_finished_at_index,
    _v11_node_runs_jobs_of,
    _v12_liveness_in_redis,
]
LATEST_VERSION = len(MIGRATIONS)
#: The tables the migrations make.
MIGRATION_TABLES = frozenset(
    {"jobs", "attempts", "events", "nodes", "device_drains", "leadership", "tokens"}
)


def _version_table() -> sa.Table:
    return sa.Table(
        "ebbtide_schema",
        sa.MetaData(),
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("applied_at", sa.Float, nullable=False),
    )


def current_version(conn: Connection) -> int:
    if not sa.inspect(conn).has_table("ebbtide_schema"):
        return 0
    value = conn.execute(sa.select(sa.func.max(_version_table().c.version))).scalar()
    return int(value or 0)


#: Set to 1 to let ebbtide create its tables in a database that holds others already.
INIT_VARIABLE = "EBBTIDE_DB_INIT"


def _refuse_foreign_tables(conn: Connection, engine: sa.Engine) -> None:
    """ebbtide makes its tables only in an empty database (or one that is its own):
    tables of something else there mean a wrong URL, unless ``EBBTIDE_DB_INIT=1``."""
    ours = {*MIGRATION_TABLES, "ebbtide_schema"}
    foreign = sorted(set(sa.inspect(conn).get_table_names()) - ours)
    if not foreign or os.environ.get(INIT_VARIABLE) == "1":
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    raise UserError(
        f"the database {engine.url.database} holds tables that are not ebbtide's ({shown}): "
        "point EBBTIDE_DB_URL at a database of ebbtide's own, or set "
        f"{INIT_VARIABLE}=1 once to make ebbtide's tables beside them"
    )


def migrate(engine: sa.Engine, *, create: bool = True) -> int:
    """Bring the schema up to :data:`LATEST_VERSION`; return the version found before.
    With ``create`` False, a database that holds no ebbtide schema yet is
    :class:`~ebbtide.errors.NoStore`, and nothing is written to it (a command that only
    reads, pointed at a shared database, must not fill it with ebbtide's tables)."""
    table = _version_table()
    if not create:
        with reading(engine) as conn:  # no write lock: the file may be someone else's
            if current_version(conn) == 0:
                raise NoStore(f"{redacted(engine.url.render_as_string(hide_password=False))}")
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # one migrator at a time across processes
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(724311)"))
        found = current_version(conn)
        if found == 0 and not create:
            raise NoStore(f"{redacted(engine.url.render_as_string(hide_password=False))}")
        if found == 0:
            _refuse_foreign_tables(conn, engine)
        table.create(conn, checkfirst=True)
        if found > LATEST_VERSION:
            raise EbbtideError(
                f"the database schema is version {found}, newer than this ebbtide "
                f"understands ({LATEST_VERSION}); upgrade ebbtide"
            )
        for version in range(found + 1, LATEST_VERSION + 1):
            MIGRATIONS[version - 1](conn)
            conn.execute(table.insert().values(version=version, applied_at=time.time()))
    return found
