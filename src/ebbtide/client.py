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

:class:`Client` is assembled from parts: its logs (``client_logs``), reports and
recommendations (``client_reports``), nodes, retention and tokens (``client_admin``); what
a submission is checked against and told is in ``client_checks`` (whether the fleet could
hold it in ``client_fleet``), which fields each view shows in ``client_fields``.  Every
name is importable from here as before.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable, Sequence
from typing import Any

from ebbtide.args import filter_name, flag, whole
from ebbtide.client_admin import MAX_REASON_CHARS as MAX_REASON_CHARS
from ebbtide.client_admin import ClientAdmin
from ebbtide.client_base import ClientBase, WaitTimeout, spec_from
from ebbtide.client_checks import (
    check_deadline,
    check_policy_first,
    kubernetes_grant,
    new_store_file,
    policy_in_effect,
    say_new_store,
    submit_notes,
)
from ebbtide.client_checks import pod_notes as pod_notes
from ebbtide.client_checks import published_policy as published_policy
from ebbtide.client_checks import queue_notes as queue_notes
from ebbtide.client_fields import (
    ALTERABLE_FIELDS,
    TABLE_COLUMNS,
    _job_states,
    altered_spec,
    submitted_fields,
)
from ebbtide.client_fields import SUBMITTED_FIELDS as SUBMITTED_FIELDS
from ebbtide.client_fleet import NO_AGENT_NOTE as NO_AGENT_NOTE
from ebbtide.client_fleet import check_someone_runs, fit_to_fleet, waiting_notes
from ebbtide.client_logs import ClientLogs
from ebbtide.client_paths import missing_path_notes
from ebbtide.client_reports import MAX_RECOMMEND_JOBS as MAX_RECOMMEND_JOBS
from ebbtide.client_reports import ClientReports
from ebbtide.config.in_force import queue_refused
from ebbtide.config.policy import Policy
from ebbtide.config.settings import Settings
from ebbtide.errors import ConfigError, PermissionDenied, SpecError
from ebbtide.identity import Caller, local_caller
from ebbtide.queue.models import Job
from ebbtide.queue.rightsizing import combine, hint
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store, job_to_dict, open_store
from ebbtide.units import shown
from ebbtide.workdir import with_submit_host, with_workdir

#: Most evictions :meth:`Client.recent_evictions` gives at once.
MAX_RECENT_EVICTIONS = 1000

__all__ = ["Client", "ClientBase", "WaitTimeout", "kubernetes_grant"]


class Client(ClientLogs, ClientReports, ClientAdmin):
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
        create: bool | None = None,
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
        create: bool | None = None,
    ) -> None:
        """``create`` False: a SQLite store that is not there is an error (a command that
        only reads must not make an empty one where ``EBBTIDE_HOME`` was mistyped); None
        (the SDK's default): made, with a warning that names it."""
        self.settings = settings or Settings.from_env()
        self._owns_store = store is None
        if store is None:  # a bad policy file is refused before a new store is made
            check_policy_first(self.settings)
        made = new_store_file(self.settings) if store is None and create is None else None
        self.store = store or open_store(self.settings, create=create is not False)
        if made is not None:
            say_new_store(made)
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
        check = not flag(allow_future, "allow_future")
        spec, memory_note = fit_to_fleet(spec, self.user, nodes, self.policy.defaults, check)
        try:  # a trial's trap: a ConfigError, which `except SpecError` did not catch
            named = self.policy.queue_named(spec.queue)  # an alias: recorded as its queue
        except ConfigError as exc:  # saying so where the user's file is not in force
            raise queue_refused(exc, self.store, self.settings.policy_path) from None
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
        check_deadline(spec, self.policy)
        if check:
            check_someone_runs(self.user, nodes)
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
        self.last_notes += waiting_notes(nodes, self.scheduler_running)
        if self._reads_for_itself:  # on the submitting host (a server's is another's)
            self.last_notes += missing_path_notes(spec, self.policy)
        return ids

    def scheduler_running(self) -> bool | None:
        """Whether a scheduler leads this store now (it holds the leader lock); None when
        this client cannot tell (another user's SQLite lock file, an in-memory store)."""
        from ebbtide.scheduling.leader import scheduler_running

        engine = getattr(self.store, "engine", None)
        return None if engine is None else scheduler_running(engine, self.settings.home)

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
        """Jobs per queue and state (``ebb qstat -Q``): every queue of the policy, those
        with no job too (a trial's trap), and any other that holds jobs."""
        return {**{q: {} for q in sorted(self.policy.queues)}, **self.store.queue_stats()}

    def recent_evictions(self, limit: int = 20) -> builtins.list[dict[str, Any]]:
        """The fleet's last ``limit`` evictions (at most 1,000), newest first: the job, its
        owner and queue, the node and devices, the reason, the latency and whether it met
        its deadline (``ebb top``)."""
        return self.store.recent_evictions(whole(limit, "limit", 0, MAX_RECENT_EVICTIONS))

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
        events = self.events(job.id or 0)
        submitted = next((e for e in events if e["type"] == "submitted"), {})
        granted = submitted.get("granted") or {}
        data["slice_granted"] = {
            "compute_pct": job.compute_pct,
            "gpus": job.gpus,
            "memory_mib": job.memory_mib,
            "profile": granted.get("profile"),
            "note": granted.get("note", ""),
        }
        data["image"] = self.policy.image_for(job.queue, spec.get("image"))
        # what the job gave with ebbtide.job.result() (the last one wins; *** for others)
        data["result"] = next((e["value"] for e in reversed(events) if e["type"] == "result"), None)
        data["submitted"] = submitted_fields(spec)
        # what its attempts used where their agents measured it, and whether it asks for
        # far more than that (qstat -f's hint)
        used = combine(self.store.measured_attempts(job_id=job.id))
        data["usage"] = used.to_dict() if used else None
        data["hint"] = hint(job.id or 0, used, job.compute_pct, job.gpus, job.memory_mib)
        return data

    def as_dict(self, job: Job | int) -> dict[str, Any]:
        """The ``qstat --json`` shape of a job (or of the job a handle or an id names),
        with ``backoff_until`` (Unix seconds) for one that waits out a backoff after
        repeated evictions."""
        job = self._job_of(job)
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

    def alter(self, job_id: int, *, allow_future: bool = False, **changes: Any) -> Job:
        """Change a job that has not started (``qalter``): ``name``, ``priority``, ``kind``,
        its resources (``gpu``, ``gpumem``, ``walltime``, ``deadline``, ``checkpoint_interval``)
        and ``depends`` (all of them, replaced), in the forms :class:`JobSpec` takes.  Its
        owner or admins; checked as at submission (the queue's deadline limit, the fleet's
        resource profile, dependencies; ``allow_future`` as :meth:`submit` takes it)."""
        job_id = whole(job_id, "job_id")
        unknown = sorted(set(changes) - set(ALTERABLE_FIELDS))
        if unknown:
            raise SpecError(
                unknown[0],
                f"cannot be altered; what can: {', '.join(ALTERABLE_FIELDS)}",
            )
        if not changes:
            raise SpecError("changes", "nothing to alter; give at least one field")
        spec = altered_spec(self.store.spec(job_id), changes)
        # a trial's trap: qalter -l gpu=2,gpumem=100GiB was taken where qsub refused it;
        # checked on the owner's nodes, and only a new slice (-p on a job submitted with
        # allow_future, or in a fleet that shrank since, is still taken)
        owner, future = self.store.get(job_id).owner, flag(allow_future, "allow_future")
        check = bool({"gpu", "gpumem"} & set(changes)) and not future
        spec, note = fit_to_fleet(spec, owner, self.store.nodes(), self.policy.defaults, check)
        self.last_notes = [note] if note else []
        check_deadline(spec, self.policy)
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
