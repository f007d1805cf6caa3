"""User actions and the scheduler's housekeeping in memory: hold, alter, release and
cancel (by the owner or an admin), dependencies, reasons, holds for evictions, node
heartbeats and the published policy, as the SQL store's modules of those names do them."""

from __future__ import annotations

import json
from typing import Any

from ebbtide.errors import InvalidTransition, PermissionDenied, StaleState, UserError
from ebbtide.queue.dependencies import dependencies_verdict
from ebbtide.queue.memory.queries import MemoryQueryMixin
from ebbtide.queue.models import Job
from ebbtide.queue.spec import JobSpec, SliceGrant
from ebbtide.queue.states import FINAL_STATES, AttemptOutcome, EventType, JobState


def _actor(user: str, attribution: dict[str, Any] | None) -> str:
    """Who really acted: the attribution's ``by`` (an admin acting for ``user``), else
    ``user``."""
    return str((attribution or {}).get("by") or user)


class MemoryActionMixin(MemoryQueryMixin):
    """``qhold``, ``qalter``, ``qrls``, ``qdel``; dependencies, reasons, holds; nodes."""

    def _check_owner(self, job: Job, user: str, admin: bool) -> None:
        if not admin and job.owner != user:
            raise PermissionDenied(
                f"job {job.id} belongs to {job.owner}; only its owner or an admin may change it"
            )

    def hold(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        job = self.get(job_id)
        self._check_owner(job, user, admin)
        state = JobState(job.state)
        if state == JobState.HELD:
            return job
        if state not in (JobState.QUEUED, JobState.WAITING):
            raise UserError(
                f"job {job_id} is {state.value}; only queued or waiting jobs can be held"
            )
        self.transition(
            job_id,
            state,
            JobState.HELD,
            event=EventType.HELD,
            data=attribution or {"by": user},
            changes={"reason": f"held by {_actor(user, attribution)}"},
        )
        return self.get(job_id)

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
    ) -> Job:
        """Give a job that has not started (held, waiting or queued) ``spec`` instead of
        its own (``qalter``)."""
        job = self.get(job_id)
        self._check_owner(job, user, admin)
        granted = spec if grant is None else grant
        name = spec.display_name()
        alterable = {JobState.HELD.value, JobState.WAITING.value, JobState.QUEUED.value}
        with self._tx() as data:
            row = data.jobs.get(job_id)
            if row is None or row["state"] not in alterable:
                state = self.get(job_id).state
                raise UserError(
                    f"job {job_id} is {state}; only held, waiting or queued jobs can be "
                    "altered (a running job keeps the slice it was given)"
                )
            self._update_job(
                job_id,
                {
                    "name": name if job.array_index is None else f"{name}[{job.array_index}]",
                    "priority": spec.priority,
                    "kind": spec.kind,
                    "spec_json": spec.model_dump_json(),
                    "compute_pct": granted.compute_pct,
                    "gpus": granted.gpus,
                    "memory_mib": granted.memory_mib,
                    "deadline_s": spec.deadline_s or defaults_deadline_s,
                    "first_checkpoint_s": spec.checkpoint_interval_s or spec.walltime_s,
                },
            )
            data_ = {"changes": changes or {}, **(attribution or {"by": user})}
            self._event(job_id, EventType.ALTERED, data=data_)
        return self.get(job_id)

    def release(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        job = self.get(job_id)
        self._check_owner(job, user, admin)
        if job.state != JobState.HELD:
            raise UserError(f"job {job_id} is {job.state}, not held")
        target = JobState.WAITING if json.loads(job.depends_json) else JobState.QUEUED
        self.transition(
            job_id,
            JobState.HELD,
            target,
            event=EventType.RELEASED,
            data=attribution or {"by": user},
            changes={"reason": "", "evictions_forgiven": job.evictions},
        )
        return self.get(job_id)

    def cancel(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        """Cancel now, or ask for an eviction if the job holds a slice (it ends ``cancelled``)."""
        for _ in range(5):
            job = self.get(job_id)
            self._check_owner(job, user, admin)
            state = JobState(job.state)
            if state in FINAL_STATES:
                raise UserError(f"job {job_id} already {state.value}")
            try:
                with self._tx() as data:
                    if state in (JobState.RUNNING, JobState.EVICTING):
                        row = data.jobs.get(job_id)
                        if row is None or row["state"] != state.value:
                            raise StaleState("moved")
                        self._update_job(
                            job_id,
                            {
                                "cancel_requested": True,
                                "reason": f"cancel requested by {_actor(user, attribution)}",
                            },
                        )
                        self._event(
                            job_id,
                            EventType.CANCEL_REQUESTED,
                            attempt=job.attempts,
                            data=attribution or {"by": user},
                        )
                    else:
                        self._transition(
                            job_id,
                            state,
                            JobState.CANCELLED,
                            event=EventType.CANCELLED,
                            data=attribution or {"by": user},
                            changes={
                                "reason": f"cancelled by {_actor(user, attribution)}",
                                "finished_at": self.clock.time(),
                            },
                        )
                        if state == JobState.DISPATCHED:
                            self._end_attempt(job_id, job.attempts, AttemptOutcome.CANCELLED, None)
                return self.get(job_id)
            except StaleState:
                continue
        raise StaleState(f"job {job_id} kept changing; try again")

    # -- housekeeping ---------------------------------------------------------------------

    def promote_waiting(self) -> list[int]:
        """Move waiting jobs whose dependencies are met to queued; cancel the hopeless."""
        waiting = self.list_jobs(states=[JobState.WAITING])
        if not waiting:
            return []
        dep_ids = {d["job_id"] for j in waiting for d in json.loads(j.depends_json)}
        with self._data.lock:
            jobs = self._data.jobs
            dep_state = {i: jobs[i]["state"] for i in dep_ids if i in jobs}
        changed = []
        for job in waiting:
            verdict, why = dependencies_verdict(json.loads(job.depends_json), dep_state)
            try:
                if verdict == "met":
                    self.transition(
                        job.id or 0,
                        JobState.WAITING,
                        JobState.QUEUED,
                        event=EventType.DEPENDENCIES_MET,
                        changes={"reason": ""},
                    )
                elif verdict == "never":
                    self.transition(
                        job.id or 0,
                        JobState.WAITING,
                        JobState.CANCELLED,
                        event=EventType.CANCELLED,
                        data={"reason": why},
                        changes={"reason": why, "finished_at": self.clock.time()},
                    )
                else:
                    continue
            except (StaleState, InvalidTransition):
                continue
            changed.append(job.id or 0)
        return changed

    def set_reasons(self, reasons: dict[int, str]) -> int:
        """Record why queued jobs wait; only rows whose reason changed are written.
        Returns how many changed."""
        if not reasons:
            return 0
        changed = 0
        with self._tx() as data:
            for job_id, reason in reasons.items():
                row = data.jobs.get(job_id)
                if row is None or row["state"] != JobState.QUEUED.value or row["reason"] == reason:
                    continue
                self._update_job(job_id, {"reason": reason})
                changed += 1
        return changed

    def hold_overpreempted(self, queue: str, max_preemptions: int) -> list[int]:
        """Hold the queue's queued jobs evicted ``max_preemptions`` times or more."""
        with self._data.lock:
            ids = [
                r["id"]
                for r in self._rows([JobState.QUEUED], None, queue=queue)
                if r["evictions"] - r["evictions_forgiven"] >= max_preemptions
            ]
        held = []
        for job_id in ids:
            why = (
                f"held: evicted {max_preemptions} or more times (queue {queue!r} allows "
                f"max_preemptions {max_preemptions}); qrls to try again"
            )
            try:
                self.transition(
                    job_id,
                    JobState.QUEUED,
                    JobState.HELD,
                    event=EventType.HELD,
                    data={"by": "policy", "reason": why},
                    changes={"reason": why},
                )
                held.append(job_id)
            except StaleState:
                continue
        return held

    # -- nodes and the published policy ---------------------------------------------------

    def heartbeat(
        self, node: str, *, started_at: float, devices: list[dict[str, Any]], stopping: bool = False
    ) -> None:
        row = {
            "name": node,
            "started_at": started_at,
            "heartbeat_at": self.clock.time(),
            "devices_json": json.dumps(devices),
            "stopping": stopping,
        }
        with self._tx() as data:
            data.nodes[node] = row

    def forget_node(self, node: str) -> None:
        with self._tx() as data:
            data.nodes.pop(node, None)

    def publish_policy(self, text: str, source: str) -> None:
        """The leading scheduler's policy, for clients to check jobs against; fenced."""
        with self._tx() as data:
            data.leadership.update(
                policy_text=text, policy_source=source, policy_at=self.clock.time()
            )
