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
)
REPLACED_BY = {
    "gpu": ("compute_pct", "gpus"),
    "gpumem": ("memory_mib",),
    "walltime": ("walltime_s",),
    "deadline": ("deadline_s",),
    "checkpoint_interval": ("checkpoint_interval_s",),
}

#: What ``qstat -f`` shows of a job as it was submitted, beside the job's state.
SUBMITTED_FIELDS = (
    "command",
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
    items = [state] if isinstance(state, str | JobState) else builtins.list(state)
    try:
        return [JobState(s) for s in items]
    except ValueError:
        known = ", ".join(s.value for s in JobState)
        raise SpecError("state", f"expected one of {known}, got {shown(state, 60)}") from None


def submitted_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """The job's spec as ``qstat -f`` shows it: the fields above (a script shows as
    ``"script"`` in ``command``), and the warning signal by name."""
    data = {name: spec.get(name) for name in SUBMITTED_FIELDS}
    if data["command"] is None and spec.get("script") is not None:
        data["command"] = ["script"]
    data["signal_name"] = signal_name(int(spec.get("signal", signal.SIGTERM)))
    return data
