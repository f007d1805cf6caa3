"""What both SDK clients share: :class:`~ebbtide.client.Client` (the store itself) and
:class:`~ebbtide.api.remote.RemoteClient` (through ``ebb server``) implement a few
methods each; submitting one job, reading a log's text, waiting and closing are built on
them once, here."""

from __future__ import annotations

import builtins
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Self

from ebbtide.args import whole
from ebbtide.attempt_logs import DEFAULT_TAIL_BYTES, LogTail
from ebbtide.client_fields import without_replaced
from ebbtide.errors import EbbtideError, SpecError
from ebbtide.handle import JobHandle
from ebbtide.identity import Caller
from ebbtide.queue.models import Job
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import FINAL_STATES

#: How often ``wait`` looks at the job, in seconds.
WAIT_POLL_S = 0.2


class WaitTimeout(EbbtideError):
    """``Client.wait`` ran out of time; the job goes on."""


def spec_from(spec: JobSpec | Mapping[str, Any] | None, fields: dict[str, Any]) -> JobSpec:
    """What ``submit(spec, **fields)`` submits: the spec, or one made of the fields, or
    the spec with the fields on top (re-validated, what the spec left unset kept unset).
    A mapping of fields stands for the spec they make; anything else is a
    :class:`SpecError` (a trial's trap: ``submit({...})`` was an AttributeError)."""
    if spec is None:
        return JobSpec(**fields)
    if isinstance(spec, JobSpec) and not fields:
        return spec
    if isinstance(spec, JobSpec):
        kept = spec.model_dump(exclude_unset=True)
    elif isinstance(spec, Mapping):
        kept = dict(spec)
    else:
        raise SpecError(
            "spec", f"expected a JobSpec or its fields as keywords, got {type(spec).__name__}"
        )
    # gpu="50%" on top replaces the compute_pct the spec had
    return JobSpec(**without_replaced(kept, fields), **fields)


class ClientBase(ABC):
    """What :class:`Client` and :class:`~ebbtide.api.remote.RemoteClient` share, made of
    the methods each implements (the store's way, or through ``ebb server``)."""

    @property
    @abstractmethod
    def caller(self) -> Caller:
        """Who acts: whose name jobs are submitted in, and whether an admin."""

    @property
    def user(self) -> str:
        return self.caller.user

    @property
    def is_admin(self) -> bool:
        return self.caller.admin

    #: What the last submission should tell its submitter about how the spec was taken
    #: here, one sentence each (a queue named by an alias, a whole GPU's memory, what
    #: attempts running as pods do not do): ``qsub`` prints them as notes.
    last_notes: builtins.list[str] = []

    @abstractmethod
    def submit_many(
        self, spec: JobSpec | None = None, *, allow_future: bool = False, **fields: Any
    ) -> builtins.list[int]:
        """Like :meth:`submit` but returns every task id of an array (and sets
        :attr:`last_notes`)."""

    @abstractmethod
    def get(self, job_id: int) -> Job: ...

    @abstractmethod
    def log_tail(
        self,
        job_id: int,
        *,
        attempt: int | None = None,
        stderr: bool = False,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> LogTail:
        """Like :meth:`logs`, with which attempt was read, the file's size, whether
        more of it was left unread, and the job's own file it was read from (``path``;
        None: the attempt's log)."""

    @abstractmethod
    def events(self, job_id: int) -> builtins.list[dict[str, Any]]:
        """What happened to the job, oldest first (``ebb events``)."""

    @abstractmethod
    def cancel(self, job_id: int) -> Job:
        """Cancel the job (its owner or an admin)."""

    @abstractmethod
    def close(self) -> None: ...

    def scheduler_running(self) -> bool | None:
        """Whether a scheduler leads the store now; None when this client cannot tell
        (through ``ebb server``, whose scheduler is its admins' concern)."""
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        spec: JobSpec | Mapping[str, Any] | None = None,
        *,
        allow_future: bool = False,
        **fields: Any,
    ) -> JobHandle:
        """Submit a job; return its :class:`~ebbtide.handle.JobHandle` — its id, with
        ``state``, ``wait()``, ``cancel()``, ``logs()``, ``events()`` and ``result()``.

        Pass a :class:`JobSpec` or its fields as keywords (``command=[...]``,
        ``gpu="25%"``).  An array (``array="1-4%2"``) is :meth:`submit_many`'s: it
        returns every task's id (one handle would answer for its first task alone).
        Raises :class:`~ebbtide.errors.SpecError` for a bad spec,
        :class:`~ebbtide.errors.PermissionDenied` for a queue the caller may not use.
        A job no node that has reported could ever hold (more GPUs than any node has, more
        memory than any card) is refused, saying what the fleet offers, unless
        ``allow_future`` (such a node will join).
        """
        spec = spec_from(spec, fields)
        if spec.array is not None:  # a trial's trap: task 1's handle "succeeded" as the rest ran
            raise SpecError(
                "array",
                "submit() returns one job's handle; submit an array with submit_many(), "
                "which returns every task's id (client.handle(id) makes a handle of each)",
            )
        return JobHandle(self.submit_many(spec, allow_future=allow_future)[0], self)

    def _job_of(self, job: Job | int) -> Job:
        """``job`` itself, or the job a handle or an id names (a trial's trap:
        ``as_dict(handle)`` was an AttributeError); a :class:`SpecError` for anything
        else."""
        if isinstance(job, Job):
            return job
        return self.get(whole(job, "job"))

    def handle(self, job_id: int) -> JobHandle:
        """A :class:`~ebbtide.handle.JobHandle` for a job submitted before (it must exist)."""
        return JobHandle(self.get(job_id).id or 0, self)

    def logs(
        self,
        job_id: int,
        *,
        attempt: int | None = None,
        stderr: bool = False,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> str:
        """The end (``tail_bytes``, 1 MiB by default) of an attempt's stdout (or
        ``stderr``); the latest attempt by default.  Where the job sent it to a file
        (``-o``/``-e``, ``--output``/``--error``, Slurm's ``slurm-%j.out``), that file's, if
        it is a plain file of the job's owner (:meth:`log_tail` says which file).  Its
        owner and admins only; :class:`~ebbtide.attempt_logs.NoLogYet` (a
        :class:`~ebbtide.errors.UserError`) while there is nothing to read yet."""
        return self.log_tail(job_id, attempt=attempt, stderr=stderr, tail_bytes=tail_bytes).text

    def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Block until the job is succeeded, failed or cancelled; return it."""
        job_id = whole(job_id, "job_id")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not (math.isfinite(timeout) and timeout >= 0)
        ):
            raise SpecError("timeout", f"expected seconds (a finite number >= 0), got {timeout!r}")
        give_up = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.state in {s.value for s in FINAL_STATES}:
                return job
            if give_up is not None and time.monotonic() >= give_up:
                raise WaitTimeout(
                    f"job {job_id} still {job.state} after {timeout:g}s{self._why_waits(job)}"
                )
            time.sleep(WAIT_POLL_S)

    def _why_waits(self, job: Job) -> str:
        """What a job that has not ended waits on, for :class:`WaitTimeout` (a trial's
        trap: "still queued" with no scheduler running, and nothing said of it)."""
        if job.state == "queued" and self.scheduler_running() is False:
            return "; no scheduler runs for this store (ebb up, or ebb scheduler)"
        return f"; {job.reason}" if job.reason else ""
