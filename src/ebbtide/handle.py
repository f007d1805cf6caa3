"""``JobHandle``: what ``Client.submit`` returns — a submitted job to watch, wait for,
cancel, read the output and the result of (as submitit's ``Job`` and Ray's job client
give)::

    from ebbtide import Client

    with Client() as client:
        job = client.submit(command=["python", "train.py"], gpu="25%", gpumem="8GiB")
        print(job.id, job.state)          # 12 queued
        job.wait(timeout=3600)            # the job as it ended (a Job row)
        print(job.logs())                 # the end of its latest attempt's stdout
        print(job.result())               # what it gave with ebbtide.job.result(...)

A handle *is* the job's id: an ``int`` (``client.get(job)``, ``json.dumps(job)`` and code
that kept ids as ints go on working), with methods that ask its client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ebbtide.errors import EbbtideError
from ebbtide.queue.states import FINAL_STATES, JobState

if TYPE_CHECKING:
    from ebbtide.client_base import ClientBase
    from ebbtide.queue.models import Job


class JobFailed(EbbtideError):
    """``JobHandle.result()`` on a job that failed or was cancelled: it has no result.
    ``job`` is the job as it ended (its ``state``, ``reason``, ``exit_code``)."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} {job.state}: {job.reason or 'no reason recorded'}")
        self.job = job


class JobHandle(int):
    """A submitted job: its id, and the calls a submitter makes about it."""

    _client: ClientBase

    def __new__(cls, job_id: int, client: ClientBase) -> JobHandle:
        handle = super().__new__(cls, job_id)
        handle._client = client
        return handle

    def __repr__(self) -> str:
        return f"JobHandle({int(self)})"

    def __str__(self) -> str:  # as an id is written: "12" (in paths, messages, f-strings)
        return int.__repr__(self)

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)

    def __reduce__(self) -> tuple[type[int], tuple[int]]:
        return (int, (int(self),))  # pickled (or copied) as the plain id: a client does not travel

    @property
    def id(self) -> int:
        return int(self)

    @property
    def state(self) -> JobState:
        """The job's state now (asks the store or the server)."""
        return JobState(self.info().state)

    def info(self) -> Job:
        """The job now: state, reason, attempts, node, times, exit code."""
        return self._client.get(self.id)

    def done(self) -> bool:
        """Whether it has ended (succeeded, failed or cancelled)."""
        return self.state in FINAL_STATES

    def wait(self, timeout: float | None = None) -> Job:
        """Block until the job ends; return it.  :class:`~ebbtide.client_base.WaitTimeout`
        after ``timeout`` seconds (the job goes on)."""
        return self._client.wait(self.id, timeout=timeout)

    def cancel(self) -> Job:
        """Cancel it (a running job is warned and evicted first, then cancelled)."""
        return self._client.cancel(self.id)

    def logs(self, *, attempt: int | None = None, stderr: bool = False) -> str:
        """The end of its latest (or ``attempt``'s) stdout, or ``stderr`` — from the file
        it sent them to, if it named one (``stdout=``/``stderr=``, ``-o``/``--output``)."""
        return self._client.logs(self.id, attempt=attempt, stderr=stderr)

    def events(self) -> list[dict[str, Any]]:
        """What happened to it, oldest first (as ``ebb events``)."""
        return self._client.events(self.id)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job to end and return the value it gave with
        ``ebbtide.job.result(...)`` (the last one; None if it gave none).  Raises
        :class:`JobFailed` if it failed or was cancelled."""
        job = self.wait(timeout)
        if job.state != JobState.SUCCEEDED:
            raise JobFailed(job)
        results = [e for e in self.events() if e["type"] == "result"]
        return results[-1].get("value") if results else None
