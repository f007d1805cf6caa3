"""The attempt lifecycle: dispatch, start, what a running attempt reports (checkpoints,
pauses, thaws, progress, results), eviction requests, and the end of its process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ebbtide.errors import StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.lifecycle.backend import Shared
from ebbtide.queue.states import ACTIVE_STATES, FINAL_STATES, EventType, JobState

#: The job's reason follows its pauses only while it runs (an evicting job's says why).
RUNNING_ONLY = (JobState.RUNNING.value,)


class Grant(Protocol):
    """A slice to grant (the planner's ``Dispatch``): the job, at the attempt count it
    was planned at, and where."""

    @property
    def job_id(self) -> int: ...
    @property
    def expected_attempts(self) -> int: ...
    @property
    def node(self) -> str: ...
    @property
    def devices(self) -> tuple[int, ...]: ...
    @property
    def compute_pct(self) -> float: ...
    @property
    def memory_mib(self) -> int: ...


@dataclass(frozen=True)
class _Granted:
    """A :class:`Grant` made of :meth:`AttemptLogic.dispatch`'s arguments."""

    job_id: int
    expected_attempts: int
    node: str
    devices: tuple[int, ...]
    compute_pct: float
    memory_mib: int


class AttemptLogic(Shared):
    """From a granted slice to the end of the attempt's process; every report fenced by
    the attempt's number."""

    def dispatch(
        self,
        job_id: int,
        *,
        expected_attempts: int,
        node: str,
        devices: tuple[int, ...],
        compute_pct: float,
        memory_mib: int,
    ) -> int:
        """Grant a slice: queued → dispatched, create the next attempt; return its number."""
        grant = _Granted(job_id, expected_attempts, node, devices, compute_pct, memory_mib)
        now = self.clock.time()
        with self._tx() as conn:
            return self._dispatch(conn, grant, now)

    def dispatch_many(self, grants: Sequence[Grant]) -> list[int | None]:
        """Grant several slices in one write (a scheduler's pass: one commit, not one a
        job): each as :meth:`dispatch` grants it, its attempt's number in the list, or
        None for a job that is no longer queued at that attempt count (nothing written
        for it; the others are granted all the same)."""
        now = self.clock.time()
        numbers: list[int | None] = []
        with self._tx() as conn:
            for g in grants:
                try:
                    numbers.append(self._dispatch(conn, g, now))
                except StaleState:  # the fence failed before anything was written for it
                    numbers.append(None)
        return numbers

    def _dispatch(self, conn: Any, g: Grant, now: float) -> int:
        number = g.expected_attempts + 1
        devs = ",".join(str(d) for d in g.devices)
        self._transition(
            conn,
            g.job_id,
            JobState.QUEUED,
            JobState.DISPATCHED,
            event=EventType.DISPATCHED,
            attempt=number,
            fence_attempt=g.expected_attempts,
            now=now,
            data={
                "node": g.node,
                "devices": list(g.devices),
                "compute_pct": g.compute_pct,
                "memory_mib": g.memory_mib,
            },
            changes={
                "attempts": number,
                "node": g.node,
                "devices": devs,
                "reason": f"dispatched to {g.node} device {devs}",
            },
        )
        self._insert_attempt(
            conn,
            {
                "job_id": g.job_id,
                "number": number,
                "node": g.node,
                "devices": devs,
                "compute_pct": g.compute_pct,
                "memory_mib": g.memory_mib,
                "dispatched_at": now,
            },
        )
        return number

    def mark_started(
        self, job_id: int, attempt: int, *, pid: int, stdout_path: str, stderr_path: str
    ) -> None:
        now = self.clock.time()
        with self._tx() as conn:
            self._transition(
                conn,
                job_id,
                JobState.DISPATCHED,
                JobState.RUNNING,
                event=EventType.STARTED,
                attempt=attempt,
                now=now,
                data={"pid": pid},
                changes={
                    "started_at": now,
                    "stdout_path": stdout_path,
                    "stderr_path": stderr_path,
                    "reason": "",
                },
            )
            self._write_attempt(
                conn,
                job_id,
                attempt,
                {
                    "started_at": now,
                    "pid": pid,
                    "stdout_path": stdout_path,
                    "stderr_path": stderr_path,
                },
            )

    def record_checkpoint(
        self,
        job_id: int,
        attempt: int,
        *,
        path: str,
        at: float,
        size_bytes: int | None = None,
        duration_s: float | None = None,
    ) -> None:
        with self._tx() as conn:
            self._fenced_update(
                conn, job_id, attempt, {"checkpoint_path": path, "last_checkpoint_at": at}
            )
            self._write_attempt(conn, job_id, attempt, {"last_checkpoint_at": at})
            data = {"path": path, "size_bytes": size_bytes, "duration_s": duration_s}
            self._event(conn, job_id, EventType.CHECKPOINTED, attempt=attempt, now=at, data=data)

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
    ) -> None:
        """The attempt was paused (frozen in place: it keeps its memory, uses no compute;
        its compute is free ``drain_s`` later, when its GPU work in flight has drained), or,
        ``kind`` ``"suspend"``, paused with its CUDA state moved to host memory (it holds no
        GPU memory either: ``suspended_at``; an attempt paused before keeps its
        ``paused_at``)."""
        with self._tx() as conn:
            changes: dict[str, Any] = {"paused_at": at}
            if kind == "suspend":
                changes = {"paused_at": self._paused_at_or(conn, job_id, at), "suspended_at": at}
            self._fenced_update(conn, job_id, attempt, changes)
            # qstat's REASON says why a running job makes no progress (an evicting one
            # keeps its "evicting: ..."): the agent's words for the spike
            verb = "suspended" if kind == "suspend" else "paused"
            self._update_job_if(conn, job_id, RUNNING_ONLY, {"reason": f"{verb}: {reason}"})
            self._event(
                conn,
                job_id,
                EventType.PAUSED,
                attempt=attempt,
                now=at,
                data={
                    "reason": reason,
                    "reason_code": reason_code,
                    "freed_at": at + drain_s,
                    "kind": kind,
                },
            )

    def record_thaw(
        self, job_id: int, attempt: int, *, at: float, paused_s: float, kind: str = "thaw"
    ) -> None:
        """The paused attempt runs again (``kind`` ``"restore"``: its CUDA state was
        brought back to its GPU first)."""
        with self._tx() as conn:
            self._fenced_update(conn, job_id, attempt, {"paused_at": None, "suspended_at": None})
            self._update_job_if(conn, job_id, RUNNING_ONLY, {"reason": ""})
            data = {"paused_s": round(paused_s, 6), "kind": kind}
            self._event(conn, job_id, EventType.THAWED, attempt=attempt, now=at, data=data)

    def record_progress(self, job_id: int, attempt: int, done: float, total: float | None) -> None:
        with self._tx() as conn:
            values = {"progress_done": done, "progress_total": total}
            self._fenced_update(conn, job_id, attempt, values)

    def record_result(self, job_id: int, attempt: int, value: Any) -> None:
        """The value attempt ``attempt`` gave as the job's result (an event; the last
        one is the job's)."""
        with self._tx() as conn:
            self._event(conn, job_id, EventType.RESULT, attempt=attempt, data={"value": value})

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
    ) -> None:
        """running → evicting, recording why and by when the slice will be free."""
        self.transition(
            job_id,
            JobState.RUNNING,
            JobState.EVICTING,
            event=EventType.EVICT_REQUESTED,
            attempt=attempt,
            data={
                "reason": reason,
                "reason_code": reason_code,
                "deadline_s": deadline_s,
                "spike_at": spike_at,
                "source": source,
            },
            changes={"reason": f"evicting: {reason}"},
        )

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
    ) -> JobState:
        """Record the end of an attempt's process and move the job on; return its new state.

        What the end means is :func:`ebbtide.queue.outcomes.decide`'s verdict (success,
        cancellation, eviction, failure, and what counts toward which limit); ``final``
        makes a failure end the job (it cannot be started at all); ``why`` says what ended
        it when the agent knows better than the exit code (``"walltime 2h exceeded"``),
        ``reason_code`` the constant for it where there is one (``oom``, ``image``);
        ``usage`` what the attempt used, where its agent measured it (kept on its row,
        evicted or not: it ran).
        """
        job = self.get(job_id)
        if job.attempts != attempt or job.state not in {s.value for s in ACTIVE_STATES}:
            raise StaleState(f"job {job_id} attempt {attempt} is no longer current")
        source = JobState(job.state)
        now = self.clock.time()
        if max_attempts is None:
            max_attempts = self.spec(job_id).max_attempts
        verdict = outcomes.decide(
            source=source,
            exit_code=exit_code,
            eviction=eviction,
            cancel_requested=job.cancel_requested,
            evictions=job.evictions,
            failures=job.failures,
            max_attempts=max_attempts,
            attempt=attempt,
            warning_signal=job.signal,
            why=why,
            final=final,
            ran_out=reason_code == outcomes.WALLTIME,
        )
        target = verdict.target
        data: dict[str, Any] = {"exit_code": exit_code}
        if reason_code:
            data["reason_code"] = reason_code
        reason = verdict.reason
        asked = job.reason or ""
        if target == JobState.CANCELLED and asked.startswith(outcomes.CANCEL_ASKED):
            # who cancelled it, as for a job cancelled before it ran (not a bare "cancelled")
            reason = "cancelled by " + asked.removeprefix(outcomes.CANCEL_ASKED)
        changes: dict[str, Any] = {
            "exit_code": exit_code,
            "reason": reason,
            "evictions": verdict.evictions,
            "failures": verdict.failures,
        }
        if target in FINAL_STATES:  # where it last ran stays on record (qstat -x, -f)
            changes["finished_at"] = now
        else:  # queued again: it holds no slice
            changes.update(requeued_at=now, node=None, devices=None)
        if exit_code == 0 and eviction:
            data["finished_during_eviction"] = eviction  # its latency stays on record
        with self._tx() as conn:
            if verdict.evicted:
                evicted = {"reason": verdict.why, **(eviction or {}), "exit_code": exit_code}
                self._event(conn, job_id, EventType.EVICTED, attempt=attempt, now=now, data=evicted)
                data["reason"] = verdict.why
            if verdict.failed_before_requeue:
                failed = {
                    "exit_code": exit_code,
                    "final": False,
                    "why": why,
                    **({"reason_code": reason_code} if reason_code else {}),
                }
                self._event(conn, job_id, EventType.FAILED, attempt=attempt, now=now, data=failed)
                data["reason"] = verdict.why
            if verdict.final:
                data.update(final=True, why=verdict.why)
            self._transition(
                conn,
                job_id,
                source,
                target,
                event=verdict.event,
                attempt=attempt,
                data=data,
                changes=changes,
                now=now,
            )
            self._end_attempt(conn, job_id, attempt, verdict.outcome, exit_code, usage)
        return target
