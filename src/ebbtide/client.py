"""The Python SDK.

    from ebbtide import Client, JobSpec

    client = Client()                       # configured from EBBTIDE_* variables
    job_id = client.submit(JobSpec(command=["python", "train.py"], gpu="25%", gpumem="8GiB"))
    job = client.wait(job_id, timeout=3600)
    print(job.state, job.exit_code)

Jobs come back as :class:`ebbtide.queue.models.Job` rows; ``client.as_dict(job)`` gives
the JSON shape that ``ebb qstat --json`` prints.

With ``EBBTIDE_URL`` set, ``Client()`` talks to that ``ebb server`` instead of opening the
store (see :class:`Client`); the methods, their results and their errors are the same.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ebbtide.args import filter_name, flag, text, whole
from ebbtide.attempt_logs import (
    DEFAULT_TAIL_BYTES,
    MAX_TAIL_BYTES,
    LogTail,
    NoLogYet,
    is_kept_log,
    read_job_file,
    read_tail,
)
from ebbtide.client_base import ClientBase, WaitTimeout, spec_from
from ebbtide.config.policy import Policy, load_policy, parse_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import ConfigError, PermissionDenied, SpecError, UserError
from ebbtide.identity import Caller, local_caller
from ebbtide.kube.profiles import Grant, grant_for
from ebbtide.queue.drains import WHOLE_NODE
from ebbtide.queue.models import Job
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS, MAX_BATCH_JOBS, check_age
from ebbtide.queue.rightsizing import NO_MEASUREMENT, RECENT_JOBS, combine, hint, recommend
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store, job_to_dict
from ebbtide.queue.tokens import TokenInfo
from ebbtide.units import format_mib, shown, signal_name
from ebbtide.workdir import with_submit_host, with_workdir

log = logging.getLogger("ebbtide.client")

#: Longest reason for a drain, in characters.
MAX_REASON_CHARS = 1000
#: Most evictions :meth:`Client.recent_evictions` gives at once.
MAX_RECENT_EVICTIONS = 1000
#: Most of a user's or a queue's latest jobs :meth:`Client.recommend` looks at.
MAX_RECOMMEND_JOBS = 1000


__all__ = ["Client", "ClientBase", "WaitTimeout", "kubernetes_grant"]


def kubernetes_grant(spec: JobSpec, policy: Policy) -> Grant | None:
    """Under a ``kubernetes:`` section, what the fleet's resource profile grants for the
    spec's slice (None without one).  Refuses, naming the field, a slice the profile
    cannot express, a warning signal other than SIGTERM, and a job with no image."""
    settings = policy.kubernetes
    if settings is None:
        return None
    if spec.signal != int(signal.SIGTERM):
        raise SpecError(
            "signal",
            f"the kubelet warns a pod with SIGTERM only, so a job cannot ask for "
            f"{signal_name(spec.signal)} under the Kubernetes executor; leave the signal "
            "unset (TERM)",
        )
    if policy.image_for(spec.queue, spec.image) is None:
        raise SpecError(
            "image",
            f"the job names no image, and neither queue {spec.queue!r} nor the policy's "
            "kubernetes section has a default; give one (ebb qsub --image IMAGE, "
            "JobSpec(image=...))",
        )
    return grant_for(spec, settings)


#: The published policy last parsed, by its text: a server parses it once, not per request.
_parsed: dict[str, Policy] = {}


def submit_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """What to tell whoever submits ``spec`` about how it is taken here: a queue it names
    by an alias (:func:`queue_notes`), what attempts running as pods do not do
    (:func:`pod_notes`)."""
    return [*queue_notes(spec, policy), *pod_notes(spec, policy)]


def queue_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """A note when the spec names its queue by an alias (a Slurm partition, a PBS queue
    of another site's): the job is recorded under the queue's own name."""
    try:
        named = policy.queue_named(spec.queue)
    except ConfigError:
        return []
    if named == spec.queue:
        return []
    what = "partition" if spec.compat == "slurm" else "queue"
    return [f"{what} {spec.queue!r} is queue {named!r} here"]


def pod_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """What a spec asks that attempts running as pods do not do (the policy has a
    ``kubernetes:`` section): said at submission, never dropped silently."""
    if policy.kubernetes is None:
        return []
    notes = []
    for name, option in (("stdout", "-o/--output"), ("stderr", "-e/--error")):
        if getattr(spec, name):
            notes.append(
                f"{option}: where attempts run as pods, their output is the pod's log, kept "
                "as the attempt's log (`ebb logs ID`), not this file"
            )
    if spec.signal_shell_only:
        notes.append(
            "--signal=B:: where attempts run as pods, the warning is the kubelet's SIGTERM "
            "to the container's first process, the script's shell or not"
        )
    return notes


def policy_in_effect(store: Store, path: Path | None) -> Policy:
    """The policy jobs are checked against: the one the running (or last) scheduler
    published to the store (:func:`published_policy`), so every client sees the queues,
    defaults and deadlines the scheduler applies; the file at ``path``
    (``EBBTIDE_POLICY``) only while none is published."""
    return published_policy(store) or load_policy(path)


def published_policy(store: Store) -> Policy | None:
    """The policy the scheduler published, parsed once per text; None when none is, or
    when this ebbtide cannot read it (a newer scheduler's: a warning says so)."""
    published = store.published_policy()
    if published is None:
        return None
    text, source, _ = published
    if not text:
        return Policy()  # the scheduler runs with the built-in defaults
    policy = _parsed.get(text)
    if policy is None:  # (threads of a server may both parse it: no harm)
        try:
            policy = parse_policy(text, f"{source} (as the scheduler published it)")
        except ConfigError as exc:
            log.warning("the scheduler's published policy cannot be read here: %s", exc)
            return None
        _parsed.clear()
        _parsed[text] = policy
    return policy


def check_fits_fleet(spec: JobSpec, nodes: Sequence[Any]) -> None:
    """Refuse, saying what the fleet offers, a job no node that has reported could ever
    hold: more GPUs than any node has, or more memory per GPU than any card.  With no
    node reported yet there is nothing to compare with, so nothing is refused."""
    fleet = []
    for node in nodes:
        memories = sorted(
            (int(d.get("memory_mib") or 0) for d in json.loads(node.devices_json or "[]")),
            reverse=True,
        )
        if memories:
            fleet.append((node.name, memories))
    need = max(spec.gpus, 1)
    if not fleet or any(
        sum(1 for m in memories if m >= spec.memory_mib) >= need for _, memories in fleet
    ):
        return
    largest = sorted(fleet, key=lambda n: (len(n[1]), n[1][0]), reverse=True)[:3]
    offers = ", ".join(f"{name}: {len(mems)} × {format_mib(mems[0])}" for name, mems in largest)
    more = f" (and {len(fleet) - 3} more)" if len(fleet) > 3 else ""
    asked = f"{need} GPU{'s' if need > 1 else ''} with {format_mib(spec.memory_mib)} each"
    raise SpecError(
        "gpu" if need > max(len(m) for _, m in fleet) else "gpumem",
        f"no node could ever hold it: it asks for {asked} on one node, and the largest "
        f"nodes are {offers}{more}; give --allow-future (allow_future=True) if such a "
        "node will join",
    )


#: What a submission to a store no node agent ever reported to is told.
NO_AGENT_NOTE = (
    "no node agent has ever reported to this store: the job waits until one does (ebb up, "
    "ebb worker; is EBBTIDE_HOME or EBBTIDE_DB_URL mistyped?)"
)


def with_whole_gpu_memory(spec: JobSpec, nodes: Sequence[Any]) -> tuple[JobSpec, str | None]:
    """A job that asks for whole GPUs (``-l ngpus=1``, ``--gres=gpu:1``) and not for an
    amount of their memory is given all of each card's memory, as a PBS or Slurm user
    expects of a GPU: the smallest card's among the nodes that have reported (so it may
    run on any of them), with a note saying so.  With none reported, or an amount asked
    for, ``spec`` as it is."""
    if not spec.gpus or "memory_mib" in spec.model_fields_set:
        return spec, None
    cards = [
        int(d.get("memory_mib") or 0)
        for node in nodes
        for d in json.loads(node.devices_json or "[]")
        if d.get("memory_mib")
    ]
    if not cards:
        return spec, None
    memory = min(cards)
    plural = "s" if spec.gpus > 1 else ""
    note = (
        f"{spec.gpus} whole GPU{plural} with no gpumem: granted {format_mib(memory)} of "
        f"memory on each, a whole card here (the smallest); -l gpumem=SIZE asks for less"
    )
    return spec.model_copy(update={"memory_mib": memory}), note


#: What ``Client.alter`` (``ebb qalter``) may change, and the spec fields each replaces.
ALTERABLE_FIELDS = (
    "name",
    "priority",
    "kind",
    "gpu",
    "gpumem",
    "walltime",
    "deadline",
    "checkpoint_interval",
)
REPLACED_BY = {
    "gpu": ("compute_pct", "gpus"),
    "gpumem": ("memory_mib",),
    "walltime": ("walltime_s",),
    "deadline": ("deadline_s",),
    "checkpoint_interval": ("checkpoint_interval_s",),
}

#: What ``qstat -f`` shows of a job as it was submitted, beside the job's state.
SUBMITTED_FIELDS = (
    "command",
    "args",
    "cwd",
    "walltime_s",
    "checkpoint_interval_s",
    "checkpoint_dir",
    "account",
    "cpus",
    "host_memory_mib",
    "stdout",
    "stderr",
    "signal_shell_only",
    "compat",
    "submit_host",
)


#: The fields of a job anyone may list for any job, in :meth:`Client.table`'s order (no
#: spec: what a job runs is for its owner and admins to see).
TABLE_COLUMNS = (
    "id",
    "name",
    "owner",
    "queue",
    "priority",
    "state",
    "suspended_at",
    "paused_at",
    "attempts",
    "node",
    "devices",
    "gpus",
    "compute_pct",
    "memory_mib",
    "submitted_at",
    "started_at",
    "finished_at",
    "reason",
    "array_id",
    "array_index",
)


def _job_states(
    state: JobState | str | Iterable[JobState | str] | None,
) -> builtins.list[JobState] | None:
    """``state`` as a list of states; None for all."""
    if state is None:
        return None
    items = [state] if isinstance(state, str | JobState) else builtins.list(state)
    try:
        return [JobState(s) for s in items]
    except ValueError:
        known = ", ".join(s.value for s in JobState)
        raise SpecError("state", f"expected one of {known}, got {shown(state, 60)}") from None


def submitted_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """The job's spec as ``qstat -f`` shows it: the fields above (a script shows as
    ``"script"`` in ``command``), and the warning signal by name."""
    data = {name: spec.get(name) for name in SUBMITTED_FIELDS}
    if data["command"] is None and spec.get("script") is not None:
        data["command"] = ["script"]
    data["signal_name"] = signal_name(int(spec.get("signal", signal.SIGTERM)))
    return data


class Client(ClientBase):
    """Jobs and nodes as one caller sees them, straight from the store.

    The caller is the OS user running this process (an admin may act for another user
    with ``EBBTIDE_USER``); ``ebb server`` hands each request's authenticated ``caller``
    in.  Owners act on their own jobs, admins on all; what a job was submitted with
    (its environment) and its logs are shown only to them.

    With ``settings.url`` set (``EBBTIDE_URL``) and no ``store`` handed in,
    ``Client(...)`` returns a :class:`ebbtide.api.remote.RemoteClient` instead: the same
    methods, results and errors, through that ``ebb server`` (which then decides who the
    caller is; ``policy`` and ``caller`` are not used).

    ``workdir`` is the directory jobs are submitted from (see :func:`ebbtide.workdir.with_workdir`):
    ``"."``, this process's current directory when it submits; ``ebb server`` hands in
    the one its caller sent, or None.
    """

    def __new__(
        cls,
        settings: Settings | None = None,
        *,
        store: Store | None = None,
        policy: Policy | None = None,
        caller: Caller | None = None,
        workdir: str | None = ".",
        create: bool = True,
    ) -> Client:
        if store is None and cls is Client:
            settings = settings or Settings.from_env()
            if settings.url:
                from ebbtide.api.remote import RemoteClient

                # not a Client, so Python does not call Client.__init__ on it
                remote: Any = RemoteClient(settings, workdir=workdir)
                return remote
        return super().__new__(cls)

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        store: Store | None = None,
        policy: Policy | None = None,
        caller: Caller | None = None,
        workdir: str | None = ".",
        create: bool = True,
    ) -> None:
        """``create`` False: a SQLite store that is not there is an error (a command that
        only reads must not make an empty one where ``EBBTIDE_HOME`` was mistyped)."""
        self.settings = settings or Settings.from_env()
        self._owns_store = store is None
        self.store = store or Store(self.settings.db_url, create=create)
        try:
            self.policy = policy or policy_in_effect(self.store, self.settings.policy_path)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        self._caller = caller or local_caller(self.policy.admins, self.settings.act_as)
        #: the caller is this process's own user (not ``ebb server`` reading for someone)
        self._reads_for_itself = caller is None
        self.workdir = workdir

    @property
    def caller(self) -> Caller:
        return self._caller

    def close(self) -> None:
        """Close the store, unless it was handed in by the caller."""
        if self._owns_store:
            self.store.close()

    # -- submitting ---------------------------------------------------------------------

    def submit_many(
        self, spec: JobSpec | None = None, *, allow_future: bool = False, **fields: Any
    ) -> builtins.list[int]:
        """Like :meth:`submit` but returns every task id of an array."""
        spec = spec_from(spec, fields)
        self.last_notes = []
        # under Kubernetes, a job with no cwd runs in its image's working directory
        spec = with_workdir(spec, self.workdir, default_cwd=self.policy.kubernetes is None)
        spec = with_submit_host(spec)
        notes = submit_notes(spec, self.policy)
        nodes = self.store.nodes()
        spec, memory_note = with_whole_gpu_memory(spec, nodes)
        named = self.policy.queue_named(spec.queue)  # an alias: recorded as its queue
        if named != spec.queue:
            spec = spec.model_copy(update={"queue": named})
        queue = self.policy.queues[spec.queue]
        if queue.users is not None and not self.is_admin and self.user not in queue.users:
            raise PermissionDenied(
                f"queue {spec.queue!r} takes jobs from {', '.join(queue.users) or 'admins'} "
                f"only; {self.user} may not submit to it"
            )
        if "priority" not in spec.model_fields_set and queue.priority:
            spec = spec.model_copy(update={"priority": queue.priority})
        self._check_deadline(spec)
        if not flag(allow_future, "allow_future"):
            check_fits_fleet(spec, nodes)
        grant = kubernetes_grant(spec, self.policy)
        ids = self.store.submit(
            spec,
            self.user,
            defaults_deadline_s=self.policy.deadline_for(spec.queue),
            grant=grant,
            pausable=queue.pause if spec.pause is None else spec.pause,
            attribution=self.caller.attribution(),
        )
        self.last_notes = [*notes, *([memory_note] if memory_note else [])]
        if not nodes:  # a new system, or a mistyped EBBTIDE_HOME: say that it waits
            self.last_notes.append(NO_AGENT_NOTE)
        return ids

    # -- reading ------------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        return self._shown(self.store.get(whole(job_id, "job_id")))

    def _shown(self, job: Job) -> Job:
        """The job as the caller may see it: what it was submitted with — its
        environment's values, its script, its arguments — only for its owner and admins
        (``***`` for anyone else, who sees the program it runs and its state)."""
        if self.caller.may_act_on(job.owner):
            return job
        spec = json.loads(job.spec_json)
        if spec.get("env"):
            spec["env"] = dict.fromkeys(spec["env"], "***")
        if spec.get("script"):
            spec["script"] = "***"
        if spec.get("args"):
            spec["args"] = ["***"] * len(spec["args"])
        if spec.get("command"):
            spec["command"] = spec["command"][:1] + ["***"] * (len(spec["command"]) - 1)
        return job.model_copy(update={"spec_json": json.dumps(spec)})

    def list(
        self,
        *,
        state: JobState | str | Iterable[JobState | str] | None = None,
        owner: str | None = None,
        queue: str | None = None,
        array_id: int | None = None,
        limit: int | None = None,
    ) -> builtins.list[Job]:
        states = _job_states(state)
        if array_id is not None:
            array_id = whole(array_id, "array_id")
        if limit is not None:
            limit = whole(limit, "limit", 0)
        jobs = self.store.list_jobs(
            states=states,
            owner=filter_name(owner, "owner"),
            queue=filter_name(queue, "queue"),
            array_id=array_id,
            limit=limit,
        )
        return [self._shown(job) for job in jobs]

    def table(
        self,
        columns: Sequence[str],
        *,
        state: JobState | str | Iterable[JobState | str] | None = None,
        owner: str | None = None,
    ) -> builtins.list[tuple[Any, ...]]:
        """``columns`` (fields of :class:`~ebbtide.queue.models.Job` that say nothing of
        what it runs: ``ebb qstat``'s table) of the jobs :meth:`list` lists, a tuple
        each: far cheaper than whole jobs for a long queue."""
        for name in columns:
            if name not in TABLE_COLUMNS:
                raise SpecError("columns", f"{shown(name, 40)} is not a column of the table")
        return self.store.job_rows(
            columns, states=_job_states(state), owner=filter_name(owner, "owner")
        )

    def events(self, job_id: int) -> builtins.list[dict[str, Any]]:
        """What happened to the job, oldest first; a result's value only for the job's
        owner and admins (``***`` for others, as its environment's values)."""
        job_id = whole(job_id, "job_id")
        events = self.store.events(job_id)
        if not self.caller.may_act_on(self.store.get(job_id).owner):
            for event in events:
                if event["type"] == "result":
                    event["value"] = "***"
        return events

    def queue_stats(self) -> dict[str, dict[str, int]]:
        """Jobs per queue and state (``ebb qstat -Q``)."""
        return self.store.queue_stats()

    def recent_evictions(self, limit: int = 20) -> builtins.list[dict[str, Any]]:
        """The fleet's last ``limit`` evictions (at most 1,000), newest first: the job, its
        owner and queue, the node and devices, the reason, the latency and whether it met
        its deadline (``ebb top``)."""
        return self.store.recent_evictions(whole(limit, "limit", 0, MAX_RECENT_EVICTIONS))

    def report(
        self,
        since: float,
        until: float,
        *,
        queue: str | None = None,
        user: str | None = None,
    ) -> dict[str, Any]:
        """What was harvested in ``[since, until)`` (Unix seconds, at most 366 days) and
        what it cost, for everything, each queue and each user, or only ``queue`` and
        ``user`` (``ebb report``; :mod:`ebbtide.report` says how each figure is counted).
        Anyone may read it, as ``qstat``."""
        from ebbtide.report import report_from_rows, window_error

        error = window_error(since, until)
        if error:
            raise SpecError("since", error)
        queue, user = filter_name(queue, "queue"), filter_name(user, "user")
        rows = self.store.report_rows(float(since), float(until))
        now = self.store.clock.time()
        return report_from_rows(rows, since=since, until=until, now=now, queue=queue, user=user)

    def log_tail(
        self,
        job_id: int,
        *,
        attempt: int | None = None,
        stderr: bool = False,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> LogTail:
        """Like :meth:`logs`, with which attempt was read, the file's size and whether
        more of it was left unread."""
        job = self.store.get(whole(job_id, "job_id"))
        if not self.caller.may_act_on(job.owner):
            raise PermissionDenied(
                f"job {job.id} belongs to {job.owner}; only its owner or an admin may read its logs"
            )
        if job.attempts == 0:
            raise NoLogYet(f"job {job.id} has not started yet, so it has no logs")
        number = job.attempts if attempt is None else whole(attempt, "attempt", 1, job.attempts)
        size = whole(tail_bytes, "tail_bytes", 1, MAX_TAIL_BYTES)
        stream = "stderr" if flag(stderr, "stderr") else "stdout"
        job_id = job.id or 0
        if json.loads(job.spec_json).get(stream):  # -o/--output: where this attempt's went
            row = next((a for a in self.store.attempts(job_id) if a.number == number), None)
            path = getattr(row, f"{stream}_path", None) if row is not None else None
            if path is None:
                raise NoLogYet(
                    f"job {job_id} attempt {number} has not started yet; its {stream} will "
                    "go to the file the job named"
                )
            if not is_kept_log(path, job_id, number, stream):  # (pods: kept as the log)
                reader = os.geteuid() if self._reads_for_itself else None
                return read_job_file(
                    path, job_id, number, stream, size, owner=job.owner, reader_uid=reader
                )
        return read_tail(self.settings.home, job_id, number, stream, size, owner=job.owner)

    def describe(self, job_id: int) -> dict[str, Any]:
        """One job in full, as ``ebb qstat -f --json`` shows it: :meth:`as_dict` with the
        slice asked for (``slice_asked``) beside the slice granted (``slice_granted``,
        with the resource profile that granted it and what it rounded) and the image."""
        job = self.get(job_id)
        data = self.as_dict(job)
        spec = json.loads(job.spec_json)
        data["slice_asked"] = {
            "compute_pct": spec.get("compute_pct", job.compute_pct),
            "gpus": spec.get("gpus", job.gpus),
            "memory_mib": spec.get("memory_mib", job.memory_mib),
        }
        submitted = next((e for e in self.events(job.id or 0) if e["type"] == "submitted"), {})
        granted = submitted.get("granted") or {}
        data["slice_granted"] = {
            "compute_pct": job.compute_pct,
            "gpus": job.gpus,
            "memory_mib": job.memory_mib,
            "profile": granted.get("profile"),
            "note": granted.get("note", ""),
        }
        data["image"] = self.policy.image_for(job.queue, spec.get("image"))
        data["submitted"] = submitted_fields(spec)
        # what its attempts used where their agents measured it, and whether it asks for
        # far more than that (qstat -f's hint)
        used = combine(self.store.measured_attempts(job_id=job.id))
        data["usage"] = used.to_dict() if used else None
        data["hint"] = hint(job.id or 0, used, job.compute_pct, job.gpus, job.memory_mib)
        return data

    def recommend(
        self,
        job_id: int | None = None,
        *,
        user: str | None = None,
        queue: str | None = None,
        last: int = RECENT_JOBS,
    ) -> dict[str, Any]:
        """The slice to ask for (``-l gpu=…,gpumem=…``), from what attempts used as their
        node agents measured it (``ebb recommend``; :mod:`ebbtide.queue.rightsizing` says
        how): for job ``job_id``, or for each job name among the latest ``last`` finished
        jobs of ``user`` and/or in ``queue`` that were measured.  ``recommendations`` is
        empty, and ``note`` says why, when nothing was measured.  Anyone may read it, as
        ``qstat``."""
        if job_id is not None and (user is not None or queue is not None):
            raise SpecError("job_id", "give a job id, or a user and/or a queue, not both")
        if job_id is None and user is None and queue is None:
            raise SpecError("job_id", "give a job id, a user or a queue")
        note = None
        if job_id is not None:
            job = self.store.get(whole(job_id, "job_id"))
            scope: dict[str, Any] = {"job_id": job.id}
            measured = self.store.measured_attempts(job_id=job.id)
            if not measured:
                ended = [a for a in self.store.attempts(job.id or 0) if a.ended_at is not None]
                if job.attempts == 0:
                    note = f"job {job.id} has not run yet: nothing was measured"
                elif not ended:
                    note = (
                        f"job {job.id} has not ended an attempt yet: what an attempt used is "
                        "recorded when it ends"
                    )
        else:
            user, queue = filter_name(user, "user"), filter_name(queue, "queue")
            last = whole(last, "last", 1, MAX_RECOMMEND_JOBS)
            scope = {"user": user, "queue": queue, "last": last}
            measured = self.store.measured_attempts(owner=user, queue=queue, jobs=last)
        largest = max(
            (
                int(d.get("memory_mib") or 0)
                for n in self.store.nodes()
                for d in json.loads(n.devices_json or "[]")
            ),
            default=0,
        )
        found = recommend(measured, largest or None)
        return {
            "scope": scope,
            "recommendations": [r.to_dict() for r in found],
            "note": None if found else note or NO_MEASUREMENT,
        }

    def as_dict(self, job: Job) -> dict[str, Any]:
        """The ``qstat --json`` shape, with ``backoff_until`` (Unix seconds) for a job that
        waits out a backoff after repeated evictions."""
        data = job_to_dict(job)
        wait = self.policy.defaults.backoff_s(job.evictions)
        data["backoff_until"] = (
            job.requeued_at + wait
            if wait > 0 and job.requeued_at is not None and job.state == JobState.QUEUED
            else None
        )
        return data

    # -- acting -------------------------------------------------------------------------

    def cancel(self, job_id: int) -> Job:
        job_id = whole(job_id, "job_id")
        return self.store.cancel(
            job_id, user=self.user, admin=self.is_admin, attribution=self.caller.attribution()
        )

    def _check_deadline(self, spec: JobSpec) -> None:
        """A deadline no longer than the spec's queue allows (``max_deadline_s``)."""
        queue = self.policy.queues.get(spec.queue)
        limit = None if queue is None else queue.max_deadline_s
        if limit is not None and (spec.deadline_s or 0) > limit:
            raise SpecError(
                "deadline",
                f"{spec.deadline_s:g}s is longer than queue {spec.queue!r} allows "
                f"(max_deadline_s {limit:g}s)",
            )

    def alter(self, job_id: int, **changes: Any) -> Job:
        """Change a job that has not started (``qalter``): ``name``, ``priority``,
        ``kind`` and its resources (``gpu``, ``gpumem``, ``walltime``, ``deadline``,
        ``checkpoint_interval``), in the forms :class:`JobSpec` takes.  Its owner or
        admins; checked as at submission (the queue's deadline limit, the fleet's
        resource profile)."""
        job_id = whole(job_id, "job_id")
        unknown = sorted(set(changes) - set(ALTERABLE_FIELDS))
        if unknown:
            raise SpecError(
                unknown[0],
                f"cannot be altered; what can: {', '.join(ALTERABLE_FIELDS)}",
            )
        if not changes:
            raise SpecError("changes", "nothing to alter; give at least one field")
        spec = self.store.spec(job_id)
        kept = spec.model_dump(exclude_unset=True)
        for field in changes:
            kept.pop(field, None)
            for replaced in REPLACED_BY.get(field, ()):
                kept.pop(replaced, None)
        spec = JobSpec(**kept, **changes)
        self._check_deadline(spec)
        return self._shown(
            self.store.alter(
                job_id,
                spec,
                user=self.user,
                admin=self.is_admin,
                defaults_deadline_s=self.policy.deadline_for(spec.queue),
                grant=kubernetes_grant(spec, self.policy),
                changes={k: str(v) for k, v in changes.items()},
                attribution=self.caller.attribution(),
            )
        )

    def hold(self, job_id: int) -> Job:
        job_id = whole(job_id, "job_id")
        return self.store.hold(
            job_id, user=self.user, admin=self.is_admin, attribution=self.caller.attribution()
        )

    def release(self, job_id: int) -> Job:
        job_id = whole(job_id, "job_id")
        return self.store.release(
            job_id, user=self.user, admin=self.is_admin, attribution=self.caller.attribution()
        )

    # -- nodes --------------------------------------------------------------------------

    def nodes(self) -> builtins.list[dict[str, Any]]:
        """Node agents as ``ebb nodes --json`` shows them: heartbeat age, whether the agent
        is ``silent`` (no heartbeat within the policy's timeout), drains, and per
        device the latest online (and offline) usage, health, the last fault, cooldown."""
        now = time.time()
        cooldown_s = self.policy.defaults.eviction_cooldown_s
        drains = {(d.node, d.device): d for d in self.store.drains.drained()}
        held: dict[tuple[str, int], list[Any]] = {}
        for a in self.store.active_attempts():
            for index in a.devices:
                held.setdefault((a.node, index), []).append(a)
        out = []
        for n in self.store.nodes():
            node_drain = drains.get((n.name, WHOLE_NODE))
            devices = json.loads(n.devices_json)
            for d in devices:
                evicted = d.get("last_eviction_at")
                d["cooldown_until"] = evicted + cooldown_s if evicted else None
                drain = drains.get((n.name, int(d["index"]))) or node_drain
                d["drained"] = drain.describe() if drain else None
                d.setdefault("health", "healthy")
                slices = held.get((n.name, int(d["index"])), [])
                d["slices"] = {
                    "jobs": [a.job_id for a in slices],
                    "compute_pct": sum(100.0 if a.gpus else a.compute_pct for a in slices),
                    "memory_mib": sum(a.memory_mib for a in slices),
                }
            out.append(
                {
                    "name": n.name,
                    "heartbeat_age_s": round(now - n.heartbeat_at, 3),
                    # silent past the policy's heartbeat timeout: the scheduler treats
                    # its attempts as lost and plans nothing there
                    "silent": now - n.heartbeat_at > self.policy.defaults.heartbeat_timeout_s,
                    "stopping": n.stopping,
                    "drained": node_drain.describe() if node_drain else None,
                    "devices": devices,
                }
            )
        return out

    def drain(self, node: str, device: int | None = None, *, reason: str = "") -> None:
        """Keep new work off ``node`` (or one device of it); what runs there goes on.
        Admins only."""
        self._device_admin("drain", node, device)
        reason = text(reason, "reason", max_chars=MAX_REASON_CHARS, empty=True)
        self.store.drains.drain(
            node, WHOLE_NODE if device is None else device, by=self.caller.actor, reason=reason
        )

    def undrain(self, node: str, device: int | None = None) -> None:
        """Return ``node`` (or one device) to service: lifts drains, and clears a fault the
        node agent holds against it (it takes work again at once).  Admins only."""
        self._device_admin("undrain", node, device)
        self.store.drains.undrain(
            node, WHOLE_NODE if device is None else device, by=self.caller.actor
        )

    def forget_node(self, node: str) -> None:
        """Remove a node whose agent is gone for good from ``ebb nodes`` and the metrics
        (what it ran is requeued, as for any silent node).  A node that still heartbeats
        is refused: stop its agent first.  Admins only."""
        self._device_admin("forget", node, None)
        row = next((n for n in self.store.nodes() if n.name == node), None)
        if row is None:
            raise UserError(f"no node named {node!r}")
        age = self.store.clock.time() - row.heartbeat_at
        timeout = self.policy.defaults.heartbeat_timeout_s
        running = self.store.active_attempts(node=node)
        if age <= timeout and (not row.stopping or running):
            doing = f"is evicting {len(running)} attempt(s)" if row.stopping else "is alive"
            raise UserError(
                f"node {node!r} heartbeated {age:.0f}s ago: its agent {doing}; stop it "
                f"first (a node is forgotten once it stopped, or after {timeout:g}s of silence)"
            )
        self.store.forget_node(node)

    # -- retention ----------------------------------------------------------------------

    def purge(
        self, older_than_s: float, *, batch: int = DEFAULT_BATCH_JOBS, dry_run: bool = False
    ) -> dict[str, Any]:
        """Remove the jobs that finished more than ``older_than_s`` seconds ago (1 hour
        at least), with their attempts and events, ``batch`` jobs per transaction;
        ``dry_run``: count them, remove nothing.  Never a job not yet finished, one that
        a job not yet finished depends on, or part of an array not all finished that
        long ago.  Admins only.  What went (``ebb admin purge --json``): ``jobs``,
        ``attempts``, ``events``, ``kept``, ``oldest_kept_finished_at``, ``elapsed_s``..."""
        if not self.is_admin:
            raise PermissionDenied(f"only admins may purge finished jobs; {self.user} is not one")
        age = check_age(older_than_s)
        batch = whole(batch, "batch", 1, MAX_BATCH_JOBS)
        result = self.store.purge(age, batch=batch, dry_run=flag(dry_run, "dry_run"))
        log.info(
            "%s %s %s finished jobs, %s attempts, %s events (finished over %gs ago)",
            self.caller.actor,
            "would purge" if dry_run else "purged",
            result.jobs,
            result.attempts,
            result.events,
            age,
        )
        return result.as_dict()

    # -- tokens -------------------------------------------------------------------------

    def create_token(
        self, user: str, *, note: str = "", expires_s: float | None = None
    ) -> tuple[int, str]:
        """Issue a bearer token of ``ebb server`` to ``user``: its id and the token, given
        this once (only its hash is kept).  Admins only, on the store itself."""
        self._token_admin()
        return self.store.tokens.create(user, by=self.caller.actor, note=note, expires_s=expires_s)

    def tokens(self) -> builtins.list[TokenInfo]:
        """Every token issued, oldest first (never the token itself).  Admins only."""
        self._token_admin()
        return self.store.tokens.all()

    def revoke_token(self, token_id: int) -> TokenInfo:
        """Refuse the token ``token_id`` from now on (one already revoked stays as it
        was).  Admins only."""
        self._token_admin()
        return self.store.tokens.revoke(token_id, by=self.caller.actor)

    def _token_admin(self) -> None:
        if not self.is_admin:
            raise PermissionDenied(f"only admins may manage tokens; {self.user} is not one")

    def _device_admin(self, what: str, node: str, device: int | None) -> None:
        if not self.is_admin:
            raise PermissionDenied(f"only admins may {what} nodes; {self.user} is not one")
        known = {n.name: n for n in self.store.nodes()}
        if node not in known:
            names = ", ".join(sorted(known)) or "none yet"
            raise UserError(f"no node named {node!r} (known: {names})")
        if device is not None:
            indices = sorted(int(d["index"]) for d in json.loads(known[node].devices_json))
            if device not in indices:
                raise UserError(
                    f"node {node!r} has no device {device} (devices: "
                    f"{', '.join(map(str, indices)) or 'none'})"
                )
