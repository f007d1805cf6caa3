"""The API's paths: one per SDK method, under ``/v1``.

Each handler does what the :class:`~ebbtide.client.Client` made for its caller does, and
nothing else: the client checks the arguments and decides what the caller may do.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from ebbtide.api.app import request_client
from ebbtide.api.wire import PREFIX, job_out
from ebbtide.attempt_logs import DEFAULT_TAIL_BYTES
from ebbtide.client import TABLE_COLUMNS, Client
from ebbtide.errors import SpecError
from ebbtide.queue.models import Job
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS
from ebbtide.queue.rightsizing import RECENT_JOBS
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.units import shown

router = APIRouter(prefix=PREFIX)
Caller = Annotated[Client, Depends(request_client)]
JobObject = dict[str, Any]


def _job(client: Client, job: Job) -> JobObject:
    return job_out(client.as_dict(job), job)


# -- who ----------------------------------------------------------------------------------


class WhoAmI(BaseModel):
    user: str = Field(description="Whose name requests act in (the owner of what they submit).")
    admin: bool = Field(description="Whether the caller may act on every job and node.")
    by: str | None = Field(description="The admin acting for `user`, if one does.")
    via: str = Field(description="How the caller was identified, and from where.")


@router.get("/whoami", summary="Who the server takes the caller for", tags=["caller"])
def whoami(client: Caller) -> WhoAmI:
    c = client.caller
    return WhoAmI(user=c.user, admin=c.admin, by=c.by, via=c.via)


# -- jobs ---------------------------------------------------------------------------------


class Submitted(BaseModel):
    id: int = Field(description="The job's id; for an array, the array's (its first task's).")
    ids: list[int] = Field(description="Every task's id, in task order (one for a plain job).")
    array: bool = Field(description="Whether the spec asked for an array of tasks.")
    notes: list[str] = Field(
        default_factory=list,
        description="What to tell the submitter about how the spec is taken here (a queue "
        "named by an alias, what attempts running as pods do not do), one sentence each.",
    )


@router.post(
    "/jobs",
    status_code=201,
    summary="Submit a job, or an array of tasks",
    tags=["jobs"],
)
def submit(
    client: Caller,
    spec: Annotated[dict[str, Any], Body(description="A JobSpec.")],
    workdir: Annotated[
        str | None,
        Query(
            description="The absolute directory the job is submitted from: a relative cwd "
            "or checkpoint_dir is resolved against it, and a spec with no cwd runs there."
        ),
    ] = None,
    allow_future: Annotated[
        bool,
        Query(description="Accept a job no node that has reported could hold (one will join)."),
    ] = False,
) -> Submitted:
    """Check the spec as the SDK does (queue, deadline, who may submit there) and queue
    it in the caller's name."""
    job_spec = JobSpec(**spec)
    if workdir is not None and not workdir.startswith("/"):
        raise SpecError("workdir", f"must be an absolute path, got {shown(workdir, 60)}")
    client.workdir = workdir  # checked as the job's cwd when it becomes that
    ids = client.submit_many(job_spec, allow_future=allow_future)
    notes = client.last_notes
    return Submitted(id=ids[0], ids=ids, array=job_spec.array is not None, notes=notes)


class ScriptText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="The script's path as the submitter gave it (for messages).")
    text: str = Field(description="The script itself.")


class QsubRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    options: dict[str, Any] = Field(
        description="`ebb qsub`'s options by their names in the CLI's code (name, queue, "
        "resources, array, depend, env, hold, pause, export_all, signal, ...): text, lists "
        "of text for repeated flags, true/false for switches."
    )
    args: list[str] = Field(description="The script's arguments; with no script, the command.")
    script: ScriptText | None = Field(default=None, description="The job script, if any.")
    workdir: str = Field(description="The absolute directory it is submitted from.")
    host: str | None = Field(default=None, description="The host it is submitted from.")
    environ: dict[str, str] = Field(
        default_factory=dict,
        description="The submitting environment, for -V and a bare -v VAR (else empty).",
    )
    allow_future: bool = False


@router.post(
    "/qsub",
    status_code=201,
    summary="Submit a job from a qsub command line (the thin CLI)",
    tags=["jobs"],
)
def qsub(client: Caller, request: QsubRequest) -> Submitted:
    """Read the command line and the script's directives as ``ebb qsub`` does, then
    submit as ``POST /jobs`` does.  What the script's directives read from the submitting
    environment comes from ``environ``, never the server's own."""
    from ebbtide.queue.qsub import qsub_spec
    from ebbtide.workdir import with_submit_host

    if not request.workdir.startswith("/"):
        raise SpecError("workdir", f"must be an absolute path, got {shown(request.workdir, 60)}")
    notes: list[str] = []
    script = None if request.script is None else (request.script.name, request.script.text)
    spec = qsub_spec(
        request.options, request.args, script=script, environ=request.environ, notes=notes
    )
    spec = with_submit_host(spec, request.host or "")
    client.workdir = request.workdir
    ids = client.submit_many(spec, allow_future=request.allow_future)
    notes.extend(client.last_notes)
    return Submitted(id=ids[0], ids=ids, array=spec.array is not None, notes=notes)


@router.get("/jobs", summary="List jobs, oldest first (qstat)", tags=["jobs"])
def list_jobs(
    client: Caller,
    state: Annotated[list[str] | None, Query(description="Only jobs in these states.")] = None,
    owner: Annotated[str | None, Query(description="Only this user's jobs.")] = None,
    queue: Annotated[str | None, Query(description="Only this queue's jobs.")] = None,
    array_id: Annotated[int | None, Query(description="Only the tasks of this array.")] = None,
    limit: Annotated[int | None, Query(description="At most this many jobs.")] = None,
) -> list[JobObject]:
    """Each job as ``ebb qstat --json`` shows it, with the spec it was submitted with
    (the values of its environment as ``***`` unless the caller owns it or is an admin)."""
    jobs = client.list(state=state, owner=owner, queue=queue, array_id=array_id, limit=limit)
    return [_job(client, job) for job in jobs]


class Table(BaseModel):
    fields: list[str] = Field(description="The name of each column of a row.")
    rows: list[list[Any]] = Field(description="A job a row, oldest first.")
    scheduler_running: bool | None = Field(
        None,
        description="Whether a scheduler holds the store's leader lock (null: cannot tell); "
        "qstat notes it when a queued job has no reason yet.",
    )


@router.get(
    "/qstat",
    summary="The rows of qstat's table (the thin CLI)",
    tags=["jobs"],
    response_model=Table,
)
def qstat_table(
    client: Caller,
    state: Annotated[list[str] | None, Query(description="Only jobs in these states.")] = None,
    owner: Annotated[str | None, Query(description="Only this user's jobs.")] = None,
) -> Response:
    """The jobs ``GET /jobs`` lists, with only the fields of ``ebb qstat``'s table (no
    spec), as rows: far less to make and send for a long queue."""
    rows = client.table(TABLE_COLUMNS, state=state, owner=owner)
    answer: dict[str, Any] = {"fields": TABLE_COLUMNS, "rows": rows, "scheduler_running": None}
    reason_at, state_at = TABLE_COLUMNS.index("reason"), TABLE_COLUMNS.index("state")
    if any(row[state_at] == JobState.QUEUED and not row[reason_at] for row in rows):
        answer["scheduler_running"] = client.scheduler_running()  # only when it matters
    # written as it is: checking 200,000 plain values against the model takes longer
    # than reading them from the store
    body = json.dumps(answer, separators=(",", ":"))
    return Response(body, media_type="application/json")


@router.get("/jobs/{job_id}", summary="One job in full (qstat -f)", tags=["jobs"])
def describe(client: Caller, job_id: int) -> JobObject:
    """As ``ebb qstat -f --json`` shows it (the slice asked for and granted, the image),
    with its spec."""
    data = client.describe(job_id)
    return job_out(data, client.get(job_id))


@router.get("/jobs/{job_id}/events", summary="What happened to a job, oldest first", tags=["jobs"])
def events(client: Caller, job_id: int) -> list[dict[str, Any]]:
    """Each event with its ``type``, ``time`` (Unix seconds), ``attempt``, and who did it
    and from where (``by``, ``for``, ``via``)."""
    return client.events(job_id)


@router.post("/jobs/{job_id}/cancel", summary="Cancel a job (qdel)", tags=["jobs"])
def cancel(client: Caller, job_id: int) -> JobObject:
    """A running job is evicted (warned, killed at its deadline); its owner or admins."""
    return _job(client, client.cancel(job_id))


@router.post(
    "/jobs/{job_id}/alter", summary="Change a job that has not started (qalter)", tags=["jobs"]
)
def alter(
    client: Caller,
    job_id: int,
    changes: Annotated[
        dict[str, Any],
        Body(
            description="What to change: name, priority, kind, gpu, gpumem, walltime, deadline, "
            "checkpoint_interval, depends (all), in the forms a job spec takes.",
            examples=[{"gpu": "50%", "walltime": "02:00:00"}],
        ),
    ],
    allow_future: Annotated[
        bool,
        Query(description="Accept a slice no node that has reported could hold (one will join)."),
    ] = False,
) -> JobObject:
    """Its owner or admins; checked as at submission."""
    return _job(client, client.alter(job_id, allow_future=allow_future, **changes))


@router.post("/jobs/{job_id}/hold", summary="Hold a queued or waiting job (qhold)", tags=["jobs"])
def hold(client: Caller, job_id: int) -> JobObject:
    return _job(client, client.hold(job_id))


@router.post("/jobs/{job_id}/release", summary="Release a held job (qrls)", tags=["jobs"])
def release(client: Caller, job_id: int) -> JobObject:
    return _job(client, client.release(job_id))


@router.get("/jobs/{job_id}/logs", summary="The end of an attempt's output", tags=["jobs"])
def logs(
    client: Caller,
    job_id: int,
    attempt: Annotated[int | None, Query(description="The attempt; default the latest.")] = None,
    stream: Annotated[Literal["stdout", "stderr"], Query(description="Which output.")] = "stdout",
    tail_bytes: Annotated[int, Query(description="How much of its end, in bytes.")] = (
        DEFAULT_TAIL_BYTES
    ),
) -> dict[str, Any]:
    """The job's owner and admins only.  ``text`` is the end of the file as UTF-8;
    ``truncated`` says whether more of it (``size`` bytes in all) was left unread;
    ``path`` is the file the job sent this output to (``-o``, ``--output``), if it named
    one, read if it is a plain file of the job's owner (null: the attempt's own log)."""
    tail = client.log_tail(
        job_id, attempt=attempt, stderr=stream == "stderr", tail_bytes=tail_bytes
    )
    return tail.to_dict()


@router.get(
    "/recommendations",
    summary="The slice to ask for, from what jobs used (ebb recommend)",
    tags=["jobs"],
)
def recommendations(
    client: Caller,
    job_id: Annotated[int | None, Query(description="This job's attempts.")] = None,
    user: Annotated[str | None, Query(description="This user's latest finished jobs.")] = None,
    queue: Annotated[str | None, Query(description="This queue's latest finished jobs.")] = None,
    last: Annotated[
        int, Query(description="How many of the latest finished jobs to look at.")
    ] = RECENT_JOBS,
) -> dict[str, Any]:
    """``-l gpu=…,gpumem=…`` per job name, from the attempts' measured p95 compute and
    peak memory with headroom, beside what was asked and what it would free; ``note``
    says why when nothing was measured.  Anyone may read it, as ``qstat``."""
    return client.recommend(job_id, user=user, queue=queue, last=last)


@router.get("/queues", summary="Jobs per queue and state (qstat -Q)", tags=["jobs"])
def queue_stats(client: Caller) -> dict[str, dict[str, int]]:
    return client.queue_stats()


@router.get("/evictions", summary="The fleet's latest evictions (ebb top)", tags=["jobs"])
def recent_evictions(
    client: Caller,
    limit: Annotated[int, Query(description="At most this many, newest first.")] = 20,
) -> list[dict[str, Any]]:
    """Each with the job, its owner and queue, the node and devices it left, the reason,
    ``latency_s`` (spike to free slice), ``deadline_s`` and ``deadline_missed``."""
    return client.recent_evictions(limit)


@router.get(
    "/report",
    summary="What was harvested in a window, and what it cost (ebb report)",
    tags=["jobs"],
)
def report(
    client: Caller,
    since: Annotated[float, Query(description="The window's start, in Unix seconds.")],
    until: Annotated[float, Query(description="The window's end (excluded), in Unix seconds.")],
    queue: Annotated[str | None, Query(description="Only this queue's jobs.")] = None,
    user: Annotated[str | None, Query(description="Only this user's jobs.")] = None,
) -> dict[str, Any]:
    """GPU-hours harvested, jobs, evictions by reason with their latency and lost work,
    pauses and queue waits, overall, per queue and per user, with how each is counted
    (``counting``).  Anyone may read it, as ``qstat``."""
    return client.report(since, until, queue=queue, user=user)


# -- nodes --------------------------------------------------------------------------------


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: int | None = Field(
        default=None, description="One device's index; none: the whole node."
    )
    reason: str = Field(default="", description="Why, for `ebb nodes` and qstat.")


class UndrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: int | None = Field(
        default=None, description="One device's index; none: the whole node."
    )


@router.get("/nodes", summary="Node agents, device load and health (ebb nodes)", tags=["nodes"])
def nodes(client: Caller) -> list[dict[str, Any]]:
    return client.nodes()


@router.delete("/nodes/{node}", summary="Forget a node whose agent is gone", tags=["nodes"])
def forget_node(client: Caller, node: str) -> dict[str, Any]:
    """Admins only; a node that still heartbeats is refused."""
    client.forget_node(node)
    return {"node": node, "forgotten": True}


@router.post("/nodes/{node}/drain", summary="Keep new work off a node or device", tags=["nodes"])
def drain(
    client: Caller, node: str, body: Annotated[DrainRequest, Body()] | None = None
) -> dict[str, Any]:
    """Admins only; what runs there goes on."""
    body = body or DrainRequest()
    client.drain(node, body.device, reason=body.reason)
    return {"node": node, "device": body.device, "drained": True}


@router.post("/nodes/{node}/undrain", summary="Return a node or device to service", tags=["nodes"])
def undrain(
    client: Caller, node: str, body: Annotated[UndrainRequest, Body()] | None = None
) -> dict[str, Any]:
    """Admins only; lifts its drain (a node's own only: a device drained on its own stays
    drained) and clears a fault the node agent holds against it."""
    body = body or UndrainRequest()
    client.undrain(node, body.device)
    return {"node": node, "device": body.device, "drained": False}


# -- admin ------------------------------------------------------------------------------


class PurgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    older_than_s: float = Field(
        description="Jobs that finished more than this many seconds ago go (1 hour at least)."
    )
    batch: int = Field(default=DEFAULT_BATCH_JOBS, description="Jobs removed per transaction.")
    dry_run: bool = Field(default=False, description="Count them; remove nothing.")


@router.post(
    "/admin/purge",
    summary="Remove old finished jobs with their attempts and events (ebb admin purge)",
    tags=["admin"],
)
def purge(client: Caller, body: Annotated[PurgeRequest, Body()]) -> dict[str, Any]:
    """Admins only.  Never a job not yet finished, one that a job not yet finished depends
    on, or part of an array not all finished that long ago; ``batch`` jobs per
    transaction, so the scheduler runs between two batches."""
    return client.purge(body.older_than_s, batch=body.batch, dry_run=body.dry_run)
