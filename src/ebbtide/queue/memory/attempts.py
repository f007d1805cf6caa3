"""Submission and the attempt lifecycle in memory: a job (or an array's tasks) inserted,
dispatch to the end of an attempt, as the SQL store's modules of those names do them;
every report fenced by the attempt."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ebbtide.errors import SpecError, StaleState
from ebbtide.queue import outcomes
from ebbtide.queue.memory.queries import MemoryQueryMixin
from ebbtide.queue.spec import JobSpec, SliceGrant
from ebbtide.queue.states import (
    ACTIVE_STATES,
    FINAL_STATES,
    EventType,
    JobState,
    check_transition,
)


class MemoryAttemptMixin(MemoryQueryMixin):
    """:meth:`submit`, and dispatch to :meth:`finish_attempt`."""

    def submit(
        self,
        spec: JobSpec,
        owner: str,
        *,
        defaults_deadline_s: float,
        grant: SliceGrant | None = None,
        pausable: bool | None = None,
        attribution: dict[str, Any] | None = None,
    ) -> list[int]:
        """Insert the job (or the tasks of an array); return their ids, first task first."""
        granted = spec if grant is None else grant
        now = self.clock.time()
        indices: Iterable[int | None] = spec.array.indices() if spec.array else [None]
        base_name = spec.display_name()
        depends = [d.model_dump() for d in spec.depends]
        with self._tx() as data:
            missing = sorted({d["job_id"] for d in depends} - set(data.jobs))
            if missing:
                raise SpecError("depends", f"no job with id {missing[0]}")
            state = (
                JobState.HELD if spec.hold else (JobState.WAITING if depends else JobState.QUEUED)
            )
            check_transition(None, state)
            reason = (
                "held at submission"
                if spec.hold
                else ("waiting for dependencies" if depends else "")
            )
            row = {
                "owner": owner,
                "queue": spec.queue,
                "priority": spec.priority,
                "kind": spec.kind,
                "state": state.value,
                "reason": reason,
                "spec_json": spec.model_dump_json(),
                "compute_pct": granted.compute_pct,
                "gpus": granted.gpus,
                "memory_mib": granted.memory_mib,
                "deadline_s": spec.deadline_s or defaults_deadline_s,
                "first_checkpoint_s": spec.checkpoint_interval_s or spec.walltime_s,
                "signal": spec.signal,
                "array_limit": spec.array.limit if spec.array else None,
                "depends_json": json.dumps(depends),
                "submitted_at": now,
                "attempts": 0,
                "evictions": 0,
                "failures": 0,
                "cancel_requested": False,
                "pausable": (spec.pause is not False) if pausable is None else pausable,
            }
            ids: list[int] = []
            for index in indices:  # array indices ascend: ids follow them
                name = base_name if index is None else f"{base_name}[{index}]"
                array_id = ids[0] if ids else None  # the first task's id is the array's
                ids.append(
                    self._insert_job(
                        {**row, "name": name, "array_index": index, "array_id": array_id}
                    )
                )
            if spec.array:
                self._update_job(ids[0], {"array_id": ids[0]})
            data_: dict[str, Any] = {"state": state.value, "owner": owner, **(attribution or {})}
            if grant is not None:
                data_["granted"] = {
                    "compute_pct": grant.compute_pct,
                    "gpus": grant.gpus,
                    "memory_mib": grant.memory_mib,
                    "profile": grant.profile,
                    "note": grant.note,
                }
            for job_id in ids:
                self._event(job_id, EventType.SUBMITTED, data=data_, now=now)
        return ids

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
        now = self.clock.time()
        number = expected_attempts + 1
        devs = ",".join(str(d) for d in devices)
        with self._tx():
            self._transition(
                job_id,
                JobState.QUEUED,
                JobState.DISPATCHED,
                event=EventType.DISPATCHED,
                attempt=number,
                fence_attempt=expected_attempts,
                now=now,
                data={
                    "node": node,
                    "devices": list(devices),
                    "compute_pct": compute_pct,
                    "memory_mib": memory_mib,
                },
                changes={
                    "attempts": number,
                    "node": node,
                    "devices": devs,
                    "reason": f"dispatched to {node} device {devs}",
                },
            )
            self._insert_attempt(
                {
                    "job_id": job_id,
                    "number": number,
                    "node": node,
                    "devices": devs,
                    "compute_pct": compute_pct,
                    "memory_mib": memory_mib,
                    "dispatched_at": now,
                }
            )
        return number

    def mark_started(
        self, job_id: int, attempt: int, *, pid: int, stdout_path: str, stderr_path: str
    ) -> None:
        now = self.clock.time()
        with self._tx():
            self._transition(
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
            row = self._attempt(job_id, attempt)
            if row is not None:
                values: dict[str, Any] = {"started_at": now, "pid": pid}
                values.update(stdout_path=stdout_path, stderr_path=stderr_path)
                self._update_attempt(row, values)

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
        with self._tx():
            self._fenced_update(
                job_id, attempt, {"checkpoint_path": path, "last_checkpoint_at": at}
            )
            row = self._attempt(job_id, attempt)
            if row is not None:
                self._update_attempt(row, {"last_checkpoint_at": at})
            data = {"path": path, "size_bytes": size_bytes, "duration_s": duration_s}
            self._event(job_id, EventType.CHECKPOINTED, attempt=attempt, now=at, data=data)

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
        """The attempt was paused (``kind`` ``"suspend"``: its CUDA state moved to host
        memory too; an attempt paused before keeps its ``paused_at``)."""
        with self._tx() as data:
            changes: dict[str, Any] = {"paused_at": at}
            if kind == "suspend":
                row = data.jobs.get(job_id)
                paused_at = row["paused_at"] if row is not None else None
                changes = {"paused_at": at if paused_at is None else paused_at, "suspended_at": at}
            self._fenced_update(job_id, attempt, changes)
            self._event(
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
        """The paused attempt runs again (``kind`` ``"restore"``: back on its GPU first)."""
        with self._tx():
            self._fenced_update(job_id, attempt, {"paused_at": None, "suspended_at": None})
            data = {"paused_s": round(paused_s, 6), "kind": kind}
            self._event(job_id, EventType.THAWED, attempt=attempt, now=at, data=data)

    def record_progress(self, job_id: int, attempt: int, done: float, total: float | None) -> None:
        with self._tx():
            self._fenced_update(job_id, attempt, {"progress_done": done, "progress_total": total})

    def record_result(self, job_id: int, attempt: int, value: Any) -> None:
        """The value attempt ``attempt`` gave as the job's result (an event)."""
        with self._tx():
            self._event(job_id, EventType.RESULT, attempt=attempt, data={"value": value})

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
        """Record the end of an attempt's process and move the job on; return its new
        state, as :func:`ebbtide.queue.outcomes.decide` says (see the SQL store's)."""
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
        )
        target = verdict.target
        data: dict[str, Any] = {"exit_code": exit_code}
        if reason_code:
            data["reason_code"] = reason_code
        changes: dict[str, Any] = {
            "exit_code": exit_code,
            "node": None,
            "devices": None,
            "reason": verdict.reason,
            "evictions": verdict.evictions,
            "failures": verdict.failures,
        }
        changes["finished_at" if target in FINAL_STATES else "requeued_at"] = now
        if exit_code == 0 and eviction:
            data["finished_during_eviction"] = eviction
        with self._tx():
            if verdict.evicted:
                evicted = {"reason": verdict.why, **(eviction or {}), "exit_code": exit_code}
                self._event(job_id, EventType.EVICTED, attempt=attempt, now=now, data=evicted)
                data["reason"] = verdict.why
            if verdict.failed_before_requeue:
                failed = {
                    "exit_code": exit_code,
                    "final": False,
                    "why": why,
                    **({"reason_code": reason_code} if reason_code else {}),
                }
                self._event(job_id, EventType.FAILED, attempt=attempt, now=now, data=failed)
                data["reason"] = verdict.why
            if verdict.final:
                data.update(final=True, why=verdict.why)
            self._transition(
                job_id,
                source,
                target,
                event=verdict.event,
                attempt=attempt,
                data=data,
                changes=changes,
                now=now,
            )
            self._end_attempt(job_id, attempt, verdict.outcome, exit_code, usage)
        return target
