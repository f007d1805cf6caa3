"""User actions: hold, alter, release and cancel a job, by its owner or an admin, each
attributed to who acted."""

from __future__ import annotations

import json
from typing import Any

from ebbtide.errors import PermissionDenied, SpecError, StaleState, UserError
from ebbtide.queue import outcomes
from ebbtide.queue.dependencies import cycle_through, dependency_text
from ebbtide.queue.lifecycle.backend import Shared
from ebbtide.queue.lifecycle.submission import packed_memory_mib, resolved_depends
from ebbtide.queue.models import Job
from ebbtide.queue.spec import JobSpec, SliceGrant
from ebbtide.queue.states import FINAL_STATES, AttemptOutcome, EventType, JobState, state_said

#: The states in which ``qalter`` may change a job: it has not started.
ALTERABLE_STATES = (JobState.HELD, JobState.WAITING, JobState.QUEUED)


def actor(user: str, attribution: dict[str, Any] | None) -> str:
    """Who really acted: the attribution's ``by`` (an admin acting for ``user``), else
    ``user``."""
    return str((attribution or {}).get("by") or user)


def check_owner(job: Job, user: str, admin: bool) -> None:
    """Raise :class:`PermissionDenied` unless ``user`` owns the job or is an admin."""
    if not admin and job.owner != user:
        raise PermissionDenied(
            f"job {job.id} belongs to {job.owner}; only its owner or an admin may change it"
        )


def altered_values(
    job: Job, spec: JobSpec, *, defaults_deadline_s: float, grant: SliceGrant | None
) -> dict[str, Any]:
    """The job's columns that ``qalter`` to ``spec`` sets (its slice: the grant, if any)."""
    granted = spec if grant is None else grant
    name = spec.display_name()
    return {
        "name": name if job.array_index is None else f"{name}[{job.array_index}]",
        "priority": spec.priority,
        "kind": spec.kind,
        "spec_json": spec.model_dump_json(),
        "compute_pct": granted.compute_pct,
        "gpus": granted.gpus,
        "memory_mib": packed_memory_mib(spec, granted),
        "deadline_s": spec.deadline_s or defaults_deadline_s,
        "first_checkpoint_s": spec.checkpoint_interval_s or spec.walltime_s,
    }


class UserActionLogic(Shared):
    """``qhold``, ``qalter``, ``qrls`` and ``qdel``."""

    def hold(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        job = self.get(job_id)
        check_owner(job, user, admin)
        state = JobState(job.state)
        if state == JobState.HELD:
            return job
        if state not in (JobState.QUEUED, JobState.WAITING):
            raise UserError(
                f"job {job_id} {state_said(state)}; only queued or waiting jobs can be held"
            )
        self.transition(
            job_id,
            state,
            JobState.HELD,
            event=EventType.HELD,
            data=attribution or {"by": user},
            changes={"reason": f"held by {actor(user, attribution)}"},
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
        its own: its name, priority, slice, walltime, deadline and dependencies
        (``qalter``).  New dependencies are checked as at submission, and may not make
        jobs wait for each other in a ring; a queued job given some waits for them, a
        waiting one left with none is queued (a held one stays held)."""
        job = self.get(job_id)
        check_owner(job, user, admin)
        spec, depends = resolved_depends(self, spec)
        values = altered_values(job, spec, defaults_deadline_s=defaults_deadline_s, grant=grant)
        changes = dict(changes or {})
        if "depends" in changes:  # as -W depend= writes them
            changes["depends"] = ",".join(map(dependency_text, depends)) or "none"
        data = {"changes": changes, **(attribution or {"by": user})}
        state, target = JobState(job.state), None
        if depends != json.loads(job.depends_json):
            if state not in ALTERABLE_STATES:
                self._not_alterable(job_id)
            self._check_ring(job, depends)
            values["depends_json"] = json.dumps(depends)
            # a held job stays held (released, it waits for them)
            target = JobState.WAITING if depends else JobState.QUEUED
            target = state if state == JobState.HELD else target
        with self._tx() as conn:
            if depends and target is not None:  # (read again here: see _check_named)
                self._check_named(conn, depends)
            if target is not None and target != state:
                values["reason"] = "waiting for dependencies" if depends else ""
                try:
                    self._transition(
                        conn, job_id, state, target, event=EventType.ALTERED, data=data,
                        changes=values,
                    )  # fmt: skip
                except StaleState:  # it changed meanwhile (it started, or was held)
                    self._not_alterable(job_id)
            elif not self._update_job_if(conn, job_id, [s.value for s in ALTERABLE_STATES], values):
                self._not_alterable(job_id)
            else:
                self._event(conn, job_id, EventType.ALTERED, data=data)
        return self.get(job_id)

    def _not_alterable(self, job_id: int) -> None:
        state = self.get(job_id).state
        raise UserError(
            f"job {job_id} {state_said(state)}; only held, waiting or queued jobs can be "
            "altered (a running job keeps the slice it was given)"
        )

    def _check_ring(self, job: Job, depends: list[dict[str, Any]]) -> None:
        """Refuse dependencies that would make ``job`` wait for itself."""
        ring = cycle_through(job.id or 0, job.array_id, depends, self._waiting_on())
        if ring == [job.id]:
            what = f"array {job.array_id}, of which it is a task" if job.array_id else "itself"
            raise SpecError("depends", f"job {job.id} would wait for {what}: it could never run")
        if ring is not None:  # job 1 would wait for job 3, which waits for job 1
            waits = ", which waits for ".join(f"job {i}" for i in ring)
            raise SpecError(
                "depends", f"job {job.id} would wait for {waits}: none of them could ever run"
            )

    def release(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        attribution: dict[str, Any] | None = None,
    ) -> Job:
        job = self.get(job_id)
        check_owner(job, user, admin)
        if job.state != JobState.HELD:
            raise UserError(f"job {job_id} {state_said(job.state)}, not held")
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
            check_owner(job, user, admin)
            state = JobState(job.state)
            if state in FINAL_STATES:
                raise UserError(f"job {job_id} already {state.value}")
            try:
                if state in (JobState.RUNNING, JobState.EVICTING):
                    with self._tx() as conn:
                        requested = {
                            "cancel_requested": True,
                            "reason": f"{outcomes.CANCEL_ASKED}{actor(user, attribution)}",
                        }
                        if not self._update_job_if(conn, job_id, [state.value], requested):
                            raise StaleState("moved")
                        self._event(
                            conn,
                            job_id,
                            EventType.CANCEL_REQUESTED,
                            attempt=job.attempts,
                            data=attribution or {"by": user},
                        )
                else:
                    changes: dict[str, Any] = {
                        "reason": f"cancelled by {actor(user, attribution)}",
                        "finished_at": self.clock.time(),
                    }
                    with self._tx() as conn:
                        self._transition(
                            conn,
                            job_id,
                            state,
                            JobState.CANCELLED,
                            event=EventType.CANCELLED,
                            data=attribution or {"by": user},
                            changes=changes,
                        )
                        if state == JobState.DISPATCHED:
                            self._end_attempt(
                                conn, job_id, job.attempts, AttemptOutcome.CANCELLED, None
                            )
                return self.get(job_id)
            except StaleState:
                continue
        raise StaleState(f"job {job_id} kept changing; try again")
