"""Job dependencies (``afterok``, ``afternotok``, ``afterany``): met, pending or never."""

from __future__ import annotations

from typing import Any

from ebbtide.queue.states import FINAL_STATES, JobState


def dependencies_verdict(
    depends: list[dict[str, Any]], dep_state: dict[int, str]
) -> tuple[str, str]:
    """``("met" | "pending" | "never", why)`` for a job's dependency list."""
    pending = False
    for dep in depends:
        state = dep_state.get(dep["job_id"])
        kind = dep["kind"]
        label = f"{kind}:{dep['job_id']}"
        if state is None:
            return "never", f"dependency {label} names no job"
        final = state in {s.value for s in FINAL_STATES}
        if not final:
            pending = True
            continue
        ok = {
            "afterok": state == JobState.SUCCEEDED,
            "afternotok": state in (JobState.FAILED, JobState.CANCELLED),
            "afterany": True,
        }[kind]
        if not ok:
            return "never", f"dependency {label} can never be met (job {dep['job_id']} {state})"
    return ("pending", "waiting for dependencies") if pending else ("met", "")
