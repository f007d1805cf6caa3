"""Small builders for the pure scheduling tests: jobs, devices, attempts, snapshots.

Defaults describe an 80 GiB device on node ``n`` with no online load, and a running
attempt started long before ``NOW``, so each test states only what it is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins, QueuedJob, Snapshot

#: The ``now`` every builder assumes, in Unix seconds.
NOW = 10_000.0
#: Memory of one default device, in MiB (80 GiB).
DEVICE_MIB = 81920


def job(
    id: int,
    prio: int = 0,
    c: float = 10,
    m: int = 1024,
    gpus: int = 0,
    array: int | None = None,
    limit: int | None = None,
    *,
    attempts: int = 0,
    queue: str = "default",
    owner: str = "alice",
) -> QueuedJob:
    """A queued job asking for ``c`` % compute and ``m`` MiB (per device when ``gpus``)."""
    return QueuedJob(
        id=id,
        priority=prio,
        queue=queue,
        owner=owner,
        compute_pct=float(c),
        gpus=gpus,
        memory_mib=m,
        array_id=array,
        array_limit=limit,
        attempts=attempts,
    )


def dev(
    node: str = "n",
    i: int = 0,
    mem: float = DEVICE_MIB,
    oc: float = 0,
    om: float = 0,
    rc: float = 0,
    rm: float = 0,
    *,
    runs: str | None = None,
) -> DeviceView:
    """A device with online compute ``oc`` %, online memory ``om`` MiB and reserves, on a
    node whose agent runs ``runs``' jobs (``users``, ``user:bob``; None: not said)."""
    return DeviceView(
        node=node,
        index=i,
        memory_mib=float(mem),
        online_compute_pct=float(oc),
        online_memory_mib=float(om),
        reserve_compute_pct=float(rc),
        reserve_memory_mib=float(rm),
        sampled_at=NOW,
        runs_jobs_of=runs,
    )


def att(
    job_id: int,
    *,
    node: str = "n",
    devices: tuple[int, ...] = (0,),
    c: float = 10,
    m: int = 1024,
    prio: int = 0,
    gpus: int = 0,
    state: JobState = JobState.RUNNING,
    attempt: int = 1,
    dispatched: float = NOW - 3600,
    started: float | None = NOW - 3600,
    ckpt: float | None = None,
    deadline: float = 30.0,
    cancel: bool = False,
    array: int | None = None,
    queue: str = "default",
) -> ActiveAttempt:
    """An attempt holding a slice of ``c`` % and ``m`` MiB on ``node``/``devices``."""
    return ActiveAttempt(
        job_id=job_id,
        attempt=attempt,
        state=state,
        priority=prio,
        queue=queue,
        node=node,
        devices=devices,
        compute_pct=float(c),
        memory_mib=m,
        deadline_s=deadline,
        signal=15,
        dispatched_at=dispatched,
        started_at=started,
        last_checkpoint_at=ckpt,
        cancel_requested=cancel,
        array_id=array,
        gpus=gpus,
    )


def snap(
    queued: Sequence[QueuedJob] = (),
    active: Sequence[ActiveAttempt] = (),
    devices: Sequence[DeviceView] = (),
    *,
    now: float = NOW,
    margins: Margins | None = None,
    offline_allowed: bool = True,
    max_dispatches: int = 1000,
) -> Snapshot:
    return Snapshot(
        now=now,
        queued=list(queued),
        active=list(active),
        devices=list(devices),
        margins=margins if margins is not None else Margins(),
        offline_allowed=offline_allowed,
        max_dispatches=max_dispatches,
    )


class JobRow:
    """The fields of a job row that an attempt's environment is made from
    (``workers.launch.env_for``): job 7 of alice, first attempt, default queue."""

    id = 7
    owner = "alice"
    queue = "default"
    gpus = 0
    array_id = None
    array_index = None
    checkpoint_path = None
    signal = 15
    deadline_s = 30.0
    compute_pct = 10.0
    memory_mib = 1024


def counted(read: list[int]) -> type[list[QueuedJob]]:
    """A planning group's list that notes in ``read`` the id of each job the planner
    reads from it."""

    class Counted(list[QueuedJob]):
        def __iter__(self) -> Any:
            for j in super().__iter__():
                read.append(j.id)
                yield j

    return Counted
