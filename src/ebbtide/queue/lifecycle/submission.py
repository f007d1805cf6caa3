"""Submission's rules, for every backend's :meth:`submit`: the state a new job starts in,
the row each of its tasks gets, and what its ``submitted`` event records.  The backend
checks the dependencies exist and inserts the rows (one statement for many tasks, in SQL)."""

from __future__ import annotations

import json
from typing import Any

from ebbtide.errors import SpecError
from ebbtide.queue.dependencies import dependencies_verdict
from ebbtide.queue.spec import Dependency, JobSpec, SliceGrant
from ebbtide.queue.states import JobState, check_transition


def check_dependencies(
    depends: list[dict[str, Any]], states: dict[int, str], arrays: dict[int, str]
) -> None:
    """Refuse a job whose dependencies name no job (``states``: each named job's state,
    as the store holds it), name as an array (``12[]``) a job that is none (``arrays``:
    each named array's state, see :func:`~ebbtide.queue.dependencies.array_states`), or
    can never be met (``afterok`` on a job that has failed): it would be cancelled the
    moment it was submitted."""
    missing = sorted({d["job_id"] for d in depends} - set(states))
    if missing:
        raise SpecError("depends", f"no job with id {missing[0]}")
    lone = sorted({d["job_id"] for d in depends if d.get("array")} - set(arrays))
    if lone:
        raise SpecError(
            "depends", f"job {lone[0]} is not an array: depend on {lone[0]}, without []"
        )
    verdict, why = dependencies_verdict(depends, states, arrays)
    if verdict == "never":
        raise SpecError("depends", f"{why}: the job could never run")


def resolved_depends(backend: Any, spec: JobSpec) -> tuple[JobSpec, list[dict[str, Any]]]:
    """The spec as the store keeps it, its tasks named by index named by id
    (:func:`resolve_tasks`), and its dependencies as ``depends_json`` holds them."""
    depends = [d.model_dump(exclude_defaults=True) for d in spec.depends]
    resolved = resolve_tasks(backend, depends)
    if resolved is not depends:
        spec = spec.model_copy(update={"depends": [Dependency(**d) for d in resolved]})
    return spec, resolved


def resolve_tasks(backend: Any, depends: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``depends`` with each dependency on one task of an array by its index (``task``:
    ``afterok:12[3]``) naming that task by its own job id, as the rest of the store reads
    dependencies (``backend._task_ids``: the tasks' ids by array and index); repeats
    kept once.  Refused where the array has no task of that index, or the job is no
    array."""
    arrays = {d["job_id"] for d in depends if d.get("task") is not None}
    if not arrays:
        return depends
    ids: dict[tuple[int, int], int] = backend._task_ids(arrays)
    out: list[dict[str, Any]] = []
    for dep in depends:
        if dep.get("task") is not None:
            array, index = dep["job_id"], dep["task"]
            if (array, index) not in ids:
                indices = sorted(i for a, i in ids if a == array)
                if not indices:
                    raise SpecError("depends", f"job {array} is not an array: no task {index}")
                raise SpecError(
                    "depends",
                    f"array {array} has no task {index} (its indices: {indices[0]}-{indices[-1]})",
                )
            dep = {"kind": dep["kind"], "job_id": ids[array, index]}
        if dep not in out:
            out.append(dep)
    return out


def packed_memory_mib(spec: JobSpec, granted: SliceGrant | JobSpec) -> int:
    """The GPU memory the planner packs for a job, per device: the grant's, but for whole
    cards what was asked (a whole GPU with no gpumem: the smallest card less the margin
    kept there), as without a grant.  A whole card's pod gets all of its memory, and a
    card's nominal size (``kubernetes.gpu_memory_mib``) is more than any card has free
    beside the margin: packed at that, it would never be placed."""
    if granted.gpus:
        return min(int(granted.memory_mib), int(spec.memory_mib))
    return int(granted.memory_mib)


def new_job_row(
    spec: JobSpec,
    owner: str,
    *,
    now: float,
    depends: list[dict[str, Any]],
    defaults_deadline_s: float,
    grant: SliceGrant | None,
    pausable: bool | None,
) -> dict[str, Any]:
    """The columns every task of a submitted job starts with (``name`` and the array's
    ``array_index``/``array_id`` are each task's own); its state checked against the
    transition table."""
    granted = spec if grant is None else grant
    state = JobState.HELD if spec.hold else (JobState.WAITING if depends else JobState.QUEUED)
    check_transition(None, state)
    reason = "held at submission" if spec.hold else ("waiting for dependencies" if depends else "")
    return {
        "owner": owner,
        "queue": spec.queue,
        "priority": spec.priority,
        "kind": spec.kind,
        "state": state.value,
        "reason": reason,
        "spec_json": spec.model_dump_json(),
        "compute_pct": granted.compute_pct,
        "gpus": granted.gpus,
        "memory_mib": packed_memory_mib(spec, granted),
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


def submitted_data(
    state: str, owner: str, grant: SliceGrant | None, attribution: dict[str, Any] | None
) -> dict[str, Any]:
    """What each task's ``submitted`` event records: its state, owner, who submitted
    from where, and the grant, if the fleet's profile changed the request."""
    data: dict[str, Any] = {"state": state, "owner": owner, **(attribution or {})}
    if grant is not None:
        data["granted"] = {
            "compute_pct": grant.compute_pct,
            "gpus": grant.gpus,
            "memory_mib": grant.memory_mib,
            "profile": grant.profile,
            "note": grant.note,
        }
    return data
