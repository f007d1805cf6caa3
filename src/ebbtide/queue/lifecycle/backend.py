"""What a store backend provides for the shared logic (:mod:`ebbtide.queue.lifecycle`):
:class:`Backend`, a ``Protocol``.  The shared mixins derive from it for mypy alone
(:data:`Shared`; at run time from ``object``, so that its declarations never stand in
front of a backend's methods): mypy checks each store's primitives against it, and a
store that lacks one cannot be instantiated (``queue/interface.py`` instantiates both
for mypy).  A store lists the shared mixins after its own, so that mypy, too, finds the
store's primitives before these declarations."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ebbtide.clock import Clock

if TYPE_CHECKING:
    from ebbtide.queue import outcomes
    from ebbtide.queue.models import Job
    from ebbtide.queue.purge import PurgeResult
    from ebbtide.queue.spec import JobSpec
    from ebbtide.queue.states import AttemptOutcome, EventType, JobState


class Backend(Protocol):
    """The reads and writes the shared logic is made of.  ``conn`` is what the
    backend's :meth:`_tx` yields (a connection; the memory store's tables), passed back
    to every write of that transaction."""

    #: the clock every write stamps its times with
    clock: Clock

    def _tx(self) -> AbstractContextManager[Any]:
        """One write transaction: all or nothing, fenced by the leadership epoch."""
        ...

    def get(self, job_id: int) -> Job: ...

    def spec(self, job_id: int) -> JobSpec: ...

    def transition(
        self,
        job_id: int,
        source: JobState,
        target: JobState,
        *,
        event: EventType,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        changes: dict[str, Any] | None = None,
    ) -> None: ...

    def _transition(
        self,
        conn: Any,
        job_id: int,
        source: JobState,
        target: JobState,
        *,
        event: EventType,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        changes: dict[str, Any] | None = None,
        now: float | None = None,
        fence_attempt: int | None = None,
    ) -> None:
        """The guarded state change: the row must still be in ``source`` (and at attempt
        ``fence_attempt``, default ``attempt``), else :class:`StaleState`; with its event."""
        ...

    def _event(
        self,
        conn: Any,
        job_id: int,
        event: EventType,
        *,
        attempt: int | None = None,
        data: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        """Append an event."""
        ...

    def _update_job_if(
        self, conn: Any, job_id: int, states: Collection[str], values: dict[str, Any]
    ) -> bool:
        """Change the job's row if it is in one of ``states``; whether it was."""
        ...

    def _fenced_update(self, conn: Any, job_id: int, attempt: int, values: dict[str, Any]) -> None:
        """Change the job's row only while ``attempt`` is its current, active attempt,
        else :class:`StaleState`."""
        ...

    def _paused_at_or(self, conn: Any, job_id: int, at: float) -> Any:
        """The value that sets ``paused_at`` to ``at`` unless the job was paused before."""
        ...

    def _insert_attempt(self, conn: Any, values: dict[str, Any]) -> None:
        """Insert an attempt's row."""
        ...

    def _write_attempt(self, conn: Any, job_id: int, number: int, values: dict[str, Any]) -> None:
        """Change attempt ``number``'s row (if there is one)."""
        ...

    def _end_attempt(
        self,
        conn: Any,
        job_id: int,
        attempt: int,
        outcome: AttemptOutcome,
        exit_code: int | None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """Close the attempt's row (if still open), with what it used where measured."""
        ...

    def list_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
        queue: str | None = None,
        array_id: int | None = None,
        ids: Iterable[int] | None = None,
        limit: int | None = None,
        ran: bool = False,
    ) -> list[Job]: ...

    def _states_of(self, job_ids: Collection[int]) -> dict[int, str]:
        """The state of each of these jobs that exists, by id."""
        ...

    def _tasks_of(self, array_ids: Collection[int]) -> list[tuple[int, str]]:
        """``(array_id, state)`` of every task of these arrays."""
        ...

    def _task_ids(self, array_ids: Collection[int]) -> dict[tuple[int, int], int]:
        """The id of every task of these arrays, by ``(array_id, array_index)``."""
        ...

    def _check_named(self, conn: Any, depends: list[dict[str, Any]]) -> None:
        """Refuse ``depends`` when one names no job (or no array), or can never be met
        (:func:`~ebbtide.queue.lifecycle.submission.check_dependencies`), reading the
        jobs named in the transaction ``conn`` so that a purge does not take them
        between the look and the write (on PostgreSQL, locked for share until it ends)."""
        ...

    def _waiting_on(self) -> list[tuple[int, int | None, list[dict[str, Any]]]]:
        """``(id, array_id, depends)`` of every unfinished job that has dependencies."""
        ...

    def _overpreempted(self, queue: str, max_preemptions: int) -> list[int]:
        """The ids of the queue's queued jobs evicted ``max_preemptions`` times or more
        since they were last released."""
        ...

    def _losses_since_release(self, conn: Any, job_id: int) -> list[outcomes.Loss]:
        """The job's lost attempts since its last ``qrls`` (all, if never), oldest first."""
        ...

    def purge_batches(
        self,
        older_than_s: float,
        *,
        batch: int = ...,
        dry_run: bool = False,
        now: float | None = None,
        pause: Callable[[], bool] | None = None,
    ) -> Iterator[PurgeResult]:
        """Retention's batches, each in its own transaction (:mod:`ebbtide.queue.purge`)."""
        ...

    def _oldest_finished_at(self) -> float | None:
        """When the oldest finished job still in the store finished; None if none."""
        ...


if TYPE_CHECKING:
    Shared = Backend
else:
    #: the shared mixins' base: :class:`Backend` to mypy, nothing at run time
    Shared = object
