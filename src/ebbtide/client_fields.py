"""Which of a job's fields each view shows or changes: what ``qalter`` may alter, what
``qstat -f`` shows of the spec, the table's columns anyone may list.
"""

from __future__ import annotations

import builtins
import signal
from collections.abc import Iterable
from typing import Any

from ebbtide.errors import SpecError
from ebbtide.queue.states import JobState
from ebbtide.units import shown, signal_name

#: What ``Client.alter`` (``ebb qalter``) may change, and the spec fields each replaces.
ALTERABLE_FIELDS = (
    "name",
    "priority",
    "kind",
    "gpu",
    "gpumem",
    "walltime",
    "deadline",
    "checkpoint_interval",
    "depends",
)
REPLACED_BY = {
    "gpu": ("compute_pct", "gpus"),
    "gpumem": ("memory_mib",),
    "walltime": ("walltime_s",),
    "deadline": ("deadline_s",),
    "checkpoint_interval": ("checkpoint_interval_s",),
}


def without_replaced(kept: dict[str, Any], changes: Iterable[str]) -> dict[str, Any]:
    """``kept`` (a spec's fields) without those ``changes`` set anew: the fields
    themselves, and the raw fields a friendly one sets (``gpu`` replaces
    ``compute_pct`` and ``gpus``: :data:`REPLACED_BY`)."""
    kept = dict(kept)
    for field in changes:
        kept.pop(field, None)
        for replaced in REPLACED_BY.get(field, ()):
            kept.pop(replaced, None)
    return kept


def altered_spec(spec: Any, changes: dict[str, Any]) -> Any:
    """``spec`` (a :class:`~ebbtide.queue.spec.JobSpec`) with ``changes`` (``qalter``'s),
    its slice's memory as submission would give it: a fraction made whole GPUs with no
    ``gpumem`` gets a card's memory (dropped here; the client sets it from the fleet),
    and whole GPUs made a fraction must say their ``gpumem`` (the card's memory they had
    would keep a card from anyone sharing it)."""
    from ebbtide.queue.spec import JobSpec

    kept = without_replaced(spec.model_dump(exclude_unset=True), changes)
    altered = JobSpec(**kept, **changes)
    if "gpumem" in changes or bool(altered.gpus) == bool(spec.gpus):
        return altered
    if spec.gpus:
        raise SpecError(
            "gpumem",
            f"the job had whole GPUs with {spec.memory_mib} MiB of memory on each; "
            "a fraction of one needs gpumem= too (gpu=50%,gpumem=8GiB)",
        )
    kept.pop("memory_mib", None)
    return JobSpec(**kept, **changes)


#: What ``qstat -f`` shows of a job as it was submitted, beside the job's state.
SUBMITTED_FIELDS = (
    "command",
    "script_path",
    "args",
    "cwd",
    "walltime_s",
    "checkpoint_interval_s",
    "checkpoint_dir",
    "account",
    "cpus",
    "host_memory_mib",
    "stdout",
    "stderr",
    "join",
    "signal_shell_only",
    "compat",
    "submit_host",
)


#: The fields of a job anyone may list for any job, in :meth:`Client.table`'s order (no
#: spec: what a job runs is for its owner and admins to see).
TABLE_COLUMNS = (
    "id",
    "name",
    "owner",
    "queue",
    "priority",
    "state",
    "suspended_at",
    "paused_at",
    "attempts",
    "node",
    "devices",
    "gpus",
    "compute_pct",
    "memory_mib",
    "submitted_at",
    "started_at",
    "finished_at",
    "reason",
    "array_id",
    "array_index",
)


def _job_states(
    state: JobState | str | Iterable[JobState | str] | None,
) -> builtins.list[JobState] | None:
    """``state`` as a list of states; None for all."""
    if state is None:
        return None
    try:
        items = [state] if isinstance(state, str | JobState) else builtins.list(state)
        return [JobState(s) for s in items]
    except (ValueError, TypeError):  # a trial's trap: state=5 was a raw TypeError
        known = ", ".join(s.value for s in JobState)
        raise SpecError("state", f"expected one of {known}, got {shown(state, 60)}") from None


def submitted_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """The job's spec as ``qstat -f`` shows it: the fields above (a script shows as
    ``"script"`` in ``command``, its file in ``script_path``), and the warning signal by
    name."""
    data = {name: spec.get(name) for name in SUBMITTED_FIELDS}
    if data["command"] is None and spec.get("script") is not None:
        data["command"] = ["script"]
    data["signal_name"] = signal_name(int(spec.get("signal", signal.SIGTERM)))
    return data
