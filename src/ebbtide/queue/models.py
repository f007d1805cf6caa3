"""The tables: jobs, attempts, events, nodes, device drains, API tokens.

All database I/O lives in the ``store`` package (and ``drains.py``, ``tokens.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


class Job(SQLModel):
    """A job as the store gives it.  A plain model, built quickly (listing 10,000 jobs
    validates 10,000 of them); the table itself is :class:`JobTable`'s."""

    id: int | None = Field(default=None, primary_key=True)
    name: str
    owner: str = Field(index=True)
    queue: str
    priority: int = 0
    kind: str = "batch"
    state: str
    #: why the job is where it is, in words a person can act on
    reason: str = ""
    spec_json: str = Field(sa_column=Column(Text, nullable=False))
    compute_pct: float
    gpus: int = 0
    memory_mib: int
    deadline_s: float
    signal: int
    array_id: int | None = Field(default=None, index=True)
    array_index: int | None = None
    array_limit: int | None = None
    depends_json: str = "[]"
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    #: number of attempts so far; the current attempt's number
    attempts: int = 0
    node: str | None = None
    devices: str | None = None
    exit_code: int | None = None
    checkpoint_path: str | None = None
    last_checkpoint_at: float | None = None
    evictions: int = 0
    failures: int = 0
    cancel_requested: bool = False
    stdout_path: str | None = None
    stderr_path: str | None = None
    progress_done: float | None = None
    progress_total: float | None = None
    # -- schema version 2 --
    #: Unix seconds of the last requeue (backoff counts from it)
    requeued_at: float | None = None
    #: seconds from start to the first checkpoint, if the job says (checkpoint interval,
    #: else walltime): admission before a window closes
    first_checkpoint_s: float | None = None
    #: evictions before the last release: max_preemptions counts only those after it
    evictions_forgiven: int = 0
    #: it may be paused for an online compute spike rather than evicted (schema v5)
    pausable: bool = False
    #: Unix seconds its current attempt was paused; None while it runs (schema v5)
    paused_at: float | None = None
    #: Unix seconds its current attempt's CUDA state was moved to host memory (suspended:
    #: paused too, and holding no GPU memory); None while it is on its GPU (schema v8)
    suspended_at: float | None = None


class JobTable(Job, table=True):
    """The ``jobs`` table (its columns are :class:`Job`'s)."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_priority", "state", "priority", "id"),
        # retention reads finished jobs oldest first, from where its last batch stopped
        # (schema v10)
        Index("ix_jobs_finished_at", "finished_at", "id"),
    )


class Attempt(SQLModel, table=True):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "number"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(index=True)
    number: int
    node: str
    devices: str
    compute_pct: float
    memory_mib: int
    dispatched_at: float
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str | None = None
    exit_code: int | None = None
    pid: int | None = None
    last_checkpoint_at: float | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    # -- schema version 9: what the attempt used, as its node agent measured it where
    # the headroom source attributes GPU use per process (NVML); NULL: not measured --
    #: samples taken (about one a second while it ran and was not paused)
    usage_samples: int | None = None
    #: compute, in percent of a device's SMs (the fullest of its devices), p95 and peak
    used_compute_p95_pct: float | None = None
    used_compute_peak_pct: float | None = None
    #: GPU memory its processes held, in MiB (the fullest of its devices), p95 and peak
    used_memory_p95_mib: float | None = None
    used_memory_peak_mib: float | None = None


#: The attempt columns of measured usage (schema v9), as an agent reports them.
USAGE_COLUMNS = (
    "usage_samples",
    "used_compute_p95_pct",
    "used_compute_peak_pct",
    "used_memory_p95_mib",
    "used_memory_peak_mib",
)


class Event(SQLModel, table=True):
    __tablename__ = "events"

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(index=True)
    attempt: int | None = None
    type: str
    time: float
    data_json: str = "{}"


class Node(SQLModel, table=True):
    __tablename__ = "nodes"

    name: str = Field(primary_key=True)
    started_at: float
    heartbeat_at: float
    #: JSON list of device views: index, memory_mib, online_compute_pct, online_memory_mib
    devices_json: str = "[]"
    stopping: bool = False
    # -- schema version 11 --
    #: whose jobs the node's agent runs (``workers.runas.jobs_run_here``: ``any``,
    #: ``users``, ``user:NAME``); None: an agent older than the field did not say
    runs_jobs_of: str | None = None


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A row of ``nodes`` as the stores read it back: plain values, not checked again (the
    store wrote them; validating a :class:`Node` per row was the largest cost of a
    scheduler's pass at a thousand nodes)."""

    name: str
    started_at: float
    heartbeat_at: float
    devices_json: str = "[]"
    stopping: bool = False
    runs_jobs_of: str | None = None


class DeviceDrain(SQLModel, table=True):
    """An admin's drain or undrain of a device (``device`` -1: the whole node)."""

    __tablename__ = "device_drains"

    node: str = Field(primary_key=True)
    device: int = Field(primary_key=True)
    #: ``drained``: nothing new goes there; ``undrained``: back in service (kept as the
    #: record the node agent reads to clear a fault)
    state: str
    by: str
    reason: str = ""
    at: float


class Leadership(SQLModel, table=True):
    """The scheduler's leadership epoch: one row, bumped by every scheduler that takes the
    lead; every write a leader makes checks it (a deposed leader's writes fail)."""

    __tablename__ = "leadership"

    id: int = Field(primary_key=True)
    epoch: int
    holder: str = ""
    acquired_at: float = 0.0
    # -- schema version 7: the policy the leader runs with, published for clients --
    #: the policy file's text (None: none published; "": the built-in defaults)
    policy_text: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    #: where it was read from, for messages
    policy_source: str | None = None
    #: Unix seconds it was published
    policy_at: float | None = None


class Token(SQLModel, table=True):
    """A bearer token of ``ebb server``, issued by an admin to one user (schema v6).

    Only the token's SHA-256 is kept: the token itself is shown once, when it is made."""

    __tablename__ = "tokens"
    __table_args__ = (UniqueConstraint("digest"),)

    id: int | None = Field(default=None, primary_key=True)
    #: whose name requests with the token act in
    user: str
    #: hex SHA-256 of the token
    digest: str
    #: what the token is for, in the issuing admin's words
    note: str = ""
    created_by: str
    #: Unix seconds
    created_at: float
    #: Unix seconds after which the token is refused; None: never
    expires_at: float | None = None
    #: Unix seconds of its revocation; None: in force
    revoked_at: float | None = None
    revoked_by: str | None = None


class SchemaVersion(SQLModel, table=True):
    __tablename__ = "ebbtide_schema"

    version: int = Field(primary_key=True)
    applied_at: float
