"""The store's interface: :class:`JobStore`, what the SQL store
(:class:`~ebbtide.queue.store.Store`) and the in-memory one
(:class:`~ebbtide.queue.memory.MemoryStore`) both offer.

Every public method of :class:`~ebbtide.queue.store.Store`, with its exact signature; a
test checks that none is missing, and mypy checks here (below) that both stores satisfy
it.  The SQL store's other attributes (``url``, ``engine``, ``drains``, ``tokens``) are
its own.  This module imports nothing at run time but the standard library and the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from ebbtide.clock import Clock

if TYPE_CHECKING:
    from ebbtide.queue.lifecycle.attempts import Grant
    from ebbtide.queue.memory import MemoryStore
    from ebbtide.queue.models import Attempt, Job, NodeRow
    from ebbtide.queue.purge import PurgeResult
    from ebbtide.queue.rightsizing import MeasuredAttempt
    from ebbtide.queue.spec import JobSpec, SliceGrant
    from ebbtide.queue.states import EventType, JobState
    from ebbtide.queue.store import Store
    from ebbtide.queue.store.changes import Changes, EventCursor
    from ebbtide.scheduling.snapshot import ActiveAttempt, QueuedJob


@runtime_checkable
class JobStore(Protocol):
    """Jobs, attempts, events and nodes: the truth of the system (see
    :mod:`ebbtide.queue.store` for what each method does)."""

    #: the clock every write stamps its times with
    clock: Clock

    def close(self) -> None: ...

    def fenced(self, epoch: int) -> Self: ...

    # -- submission and user actions ------------------------------------------------------

    def submit(
        self,
        spec: JobSpec,
        owner: str,
        *,
        defaults_deadline_s: float,
        grant: SliceGrant | None = None,
        pausable: bool | None = None,
        attribution: dict[str, Any] | None = None,
    ) -> list[int]: ...

    def hold(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job: ...

    def alter(
        self,
        job_id: int,
        spec: JobSpec,
        *,
        user: str,
        admin: bool = False,
        defaults_deadline_s: float,
        grant: SliceGrant | None = None,
        changes: dict[str, Any] | None = None,
        attribution: dict[str, Any] | None = None,
    ) -> Job: ...

    def release(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job: ...

    def cancel(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job: ...

    # -- queries --------------------------------------------------------------------------

    def get(self, job_id: int) -> Job: ...

    def spec(self, job_id: int) -> JobSpec: ...

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

    def job_rows(
        self,
        columns: Sequence[str],
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
    ) -> list[tuple[Any, ...]]: ...

    def events(self, job_id: int) -> list[dict[str, Any]]: ...

    def attempts(self, job_id: int) -> list[Attempt]: ...

    def measured_attempts(
        self,
        *,
        job_id: int | None = None,
        owner: str | None = None,
        queue: str | None = None,
        jobs: int = ...,
    ) -> list[MeasuredAttempt]: ...

    def queue_stats(self, states: Iterable[str] | None = None) -> dict[str, dict[str, int]]: ...

    def queued_jobs(self, limit: int | None = None) -> list[QueuedJob]: ...

    def active_attempts(self, node: str | None = None) -> list[ActiveAttempt]: ...

    def changes_since(
        self, cursor: EventCursor | None, *, max_events: int = ...
    ) -> Changes | None: ...

    def eviction_request(self, job_id: int, attempt: int) -> dict[str, Any] | None: ...

    # -- reports --------------------------------------------------------------------------

    def recent_evictions(self, limit: int, *, scan_events: int = ...) -> list[dict[str, Any]]: ...

    def report_rows(self, since: float, until: float) -> dict[str, list[dict[str, Any]]]: ...

    # -- transitions and the attempt lifecycle --------------------------------------------

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

    def dispatch(
        self,
        job_id: int,
        *,
        expected_attempts: int,
        node: str,
        devices: tuple[int, ...],
        compute_pct: float,
        memory_mib: int,
    ) -> int: ...

    def dispatch_many(self, grants: Sequence[Grant]) -> list[int | None]: ...

    def mark_started(
        self, job_id: int, attempt: int, *, pid: int, stdout_path: str, stderr_path: str
    ) -> None: ...

    def record_checkpoint(
        self,
        job_id: int,
        attempt: int,
        *,
        path: str,
        at: float,
        size_bytes: int | None = None,
        duration_s: float | None = None,
    ) -> None: ...

    def record_pause(
        self,
        job_id: int,
        attempt: int,
        *,
        at: float,
        reason: str,
        reason_code: str,
        drain_s: float = 0.0,
        kind: str = "pause",
    ) -> None: ...

    def record_thaw(
        self, job_id: int, attempt: int, *, at: float, paused_s: float, kind: str = "thaw"
    ) -> None: ...

    def record_progress(
        self, job_id: int, attempt: int, done: float, total: float | None
    ) -> None: ...

    def record_result(self, job_id: int, attempt: int, value: Any) -> None: ...

    def begin_eviction(
        self,
        job_id: int,
        attempt: int,
        *,
        reason: str,
        deadline_s: float,
        spike_at: float,
        source: str,
        reason_code: str | None = None,
    ) -> None: ...

    def finish_attempt(
        self,
        job_id: int,
        attempt: int,
        *,
        exit_code: int | None,
        eviction: dict[str, Any] | None = None,
        max_attempts: int | None = None,
        why: str | None = None,
        final: bool = False,
        reason_code: str | None = None,
        usage: dict[str, Any] | None = None,
    ) -> JobState: ...

    # -- losses ---------------------------------------------------------------------------

    def requeue_lost(
        self,
        job_id: int,
        attempt: int,
        *,
        why: str,
        reason_code: str | None = None,
        max_losses: int | None = None,
        loss_window_s: float = 0.0,
        usage: dict[str, Any] | None = None,
        state: JobState | None = None,
    ) -> None: ...

    def hold_lost(
        self, max_losses: int, loss_window_s: float, *, after_event: int | None = None
    ) -> tuple[list[int], int]: ...

    # -- housekeeping ---------------------------------------------------------------------

    def promote_waiting(self) -> list[int]: ...

    def set_reasons(self, reasons: dict[int, str]) -> int: ...

    def hold_overpreempted(self, queue: str, max_preemptions: int) -> list[int]: ...

    def purge_batches(
        self,
        older_than_s: float,
        *,
        batch: int = ...,
        dry_run: bool = False,
        now: float | None = None,
        pause: Callable[[], bool] | None = None,
    ) -> Iterator[PurgeResult]: ...

    def purge(
        self,
        older_than_s: float,
        *,
        batch: int = ...,
        dry_run: bool = False,
        now: float | None = None,
        pause_s: float = ...,
    ) -> PurgeResult: ...

    # -- nodes and the published policy ---------------------------------------------------

    def heartbeat(
        self,
        node: str,
        *,
        started_at: float,
        devices: list[dict[str, Any]],
        stopping: bool = False,
        runs_jobs_of: str | None = None,
    ) -> None: ...

    def nodes(self) -> list[NodeRow]: ...

    def forget_node(self, node: str) -> None: ...

    def publish_policy(self, text: str, source: str) -> None: ...

    def published_policy(self) -> tuple[str, str, float] | None: ...


if TYPE_CHECKING:

    def _both_stores_are_job_stores(sql: Store, memory: MemoryStore) -> tuple[JobStore, JobStore]:
        """Not called: mypy checks that both stores satisfy :class:`JobStore`."""
        return sql, memory

    def _neither_store_lacks_a_primitive() -> None:
        """Not called: mypy checks that both stores provide every primitive of the shared
        logic (:class:`~ebbtide.queue.lifecycle.backend.Backend`): one that lacks any is
        abstract, and cannot be instantiated."""
        Store("")
        MemoryStore()
