"""Job dependencies (``afterok``, ``afternotok``, ``afterany``): met, pending or never.

A dependency names a job, or with ``array`` (PBS's ``afterok:12[]``) the whole array whose
id it is: its tasks' states together (:func:`array_state`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from ebbtide.queue.states import FINAL_STATES, JobState

_FINAL = frozenset(s.value for s in FINAL_STATES)


def array_state(task_states: Iterable[str]) -> str | None:
    """An array's state as its dependents see it: a task's that is not final while one
    is not; ``succeeded`` once every task succeeded; else ``failed`` if one failed, else
    ``cancelled``.  None: no tasks."""
    states = list(task_states)
    if not states:
        return None
    for state in states:
        if state not in _FINAL:
            return state
    if all(s == JobState.SUCCEEDED for s in states):
        return JobState.SUCCEEDED.value
    if any(s == JobState.FAILED for s in states):
        return JobState.FAILED.value
    return JobState.CANCELLED.value


def array_states(tasks: Iterable[tuple[int, str]]) -> dict[int, str]:
    """Each array's :func:`array_state`, from its tasks' ``(array_id, state)``."""
    by_array: dict[int, list[str]] = {}
    for array_id, state in tasks:
        by_array.setdefault(array_id, []).append(state)
    return {a: s for a, states in by_array.items() if (s := array_state(states)) is not None}


def split_ids(depends: Iterable[Mapping[str, Any]]) -> tuple[set[int], set[int]]:
    """The ids the dependencies name (arrays' included), and those named as arrays."""
    depends = list(depends)
    return {d["job_id"] for d in depends}, {d["job_id"] for d in depends if d.get("array")}


def dependencies_verdict(
    depends: list[dict[str, Any]],
    dep_state: dict[int, str],
    arrays: Mapping[int, str] | None = None,
) -> tuple[str, str]:
    """``("met" | "pending" | "never", why)`` for a job's dependency list; ``arrays``:
    the state of each array named with ``array`` (see :func:`array_states`)."""
    pending = False
    arrays = arrays or {}
    for dep in depends:
        whole = bool(dep.get("array"))
        state = (arrays if whole else dep_state).get(dep["job_id"])
        kind = dep["kind"]
        label = dependency_text(dep)
        if state is None:
            return "never", f"dependency {label} names no {'array' if whole else 'job'}"
        final = state in _FINAL
        if not final:
            pending = True
            continue
        ok = {
            "afterok": state == JobState.SUCCEEDED,
            "afternotok": state in (JobState.FAILED, JobState.CANCELLED),
            "afterany": True,
        }[kind]
        if not ok:
            what = f"array {dep['job_id']}" if whole else f"job {dep['job_id']}"
            return "never", f"dependency {label} can never be met ({what} {state})"
    return ("pending", "waiting for dependencies") if pending else ("met", "")


def dependency_text(dep: Mapping[str, Any]) -> str:
    """A dependency as ``-W depend=`` writes it: ``afterok:12``, ``afterok:12[]``,
    ``afterok:12[3]`` (a task by its index, before the store names it by its id)."""
    task = dep.get("task")
    brackets = "[]" if dep.get("array") else ("" if task is None else f"[{task}]")
    return f"{dep['kind']}:{dep['job_id']}{brackets}"


def cycle_through(
    job_id: int,
    array_id: int | None,
    depends: Iterable[Mapping[str, Any]],
    dependents: Iterable[tuple[int, int | None, list[dict[str, Any]]]],
) -> list[int] | None:
    """The jobs through which job ``job_id`` (a task of array ``array_id``, or None) would
    wait for itself if it depended on ``depends`` (``qalter -W depend=``; a new job cannot:
    it names only jobs there before it): each job in turn that waits for the next, from
    the first it would wait for to ``job_id`` itself (``[job_id]`` alone: it names
    itself); None when there is no cycle.  ``dependents``: ``(id, array_id, depends)``
    of each unfinished job that has dependencies (the job's own, being replaced, are
    left out); a dependency on an array waits for each of its tasks."""
    deps_of: dict[int, list[dict[str, Any]]] = {}
    tasks: dict[int, list[int]] = {}
    for other, other_array, its in dependents:
        if other != job_id:
            deps_of[other] = its
            if other_array is not None:
                tasks.setdefault(other_array, []).append(other)
    frontier: deque[tuple[int, list[int]]] = deque()  # breadth first: a shortest cycle
    seen: set[int] = set()

    def reach(dep: Mapping[str, Any], path: list[int]) -> list[int] | None:
        named = int(dep["job_id"])
        if dep.get("array") and named == array_id:
            return [*path, job_id]  # its own array, of which it is a task
        for other in tasks.get(named, []) if dep.get("array") else [named]:
            if other == job_id:
                return [*path, job_id]
            if other not in seen:
                seen.add(other)
                frontier.append((other, [*path, other]))
        return None

    for dep in depends:
        if (found := reach(dep, [])) is not None:
            return found
    while frontier:
        current, path = frontier.popleft()
        for dep in deps_of.get(current, []):
            if (found := reach(dep, path)) is not None:
                return found
    return None
