"""Right-sizing slices: what a job should ask for, from what its attempts used — pure.

Node agents measure each attempt's GPU use where the headroom source attributes it per
process (NVML; :mod:`ebbtide.workers.usage`) and the store keeps the summary on the
attempt's row.  From those rows (:class:`MeasuredAttempt`, read by
:meth:`Store.measured_attempts <ebbtide.queue.store.Store.measured_attempts>`):

- :func:`recommend` suggests ``-l gpu=…,gpumem=…`` for a job, or for each job name of a
  user's or a queue's latest finished jobs: compute = the measured p95 plus
  :data:`COMPUTE_HEADROOM_FRACTION`, memory = the measured *peak* plus
  :data:`MEMORY_HEADROOM_FRACTION` and :data:`MEMORY_HEADROOM_MIB` (memory must never be
  under-asked: memory past the grant gets a job evicted, or killed by an OOM), rounded up
  to :data:`COMPUTE_STEP_PCT` and :data:`MEMORY_STEP_MIB`, capped at the device;
- :func:`hint` is ``qstat -f``'s line for a job that used under
  :data:`HINT_UNDER_FRACTION` of what it was granted.

Several attempts combine conservatively: the largest p95 and the largest peak of any.
No clock is read and nothing is fetched here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ebbtide.units import format_mib

#: Compute asked above the measured p95, as a fraction of it: room for run-to-run
#: variation and the 5 % of the time above the p95 (a slice too small slows a job down;
#: it does not get it evicted).
COMPUTE_HEADROOM_FRACTION = 0.20
#: Memory asked above the measured peak, as a fraction of it, and ...
MEMORY_HEADROOM_FRACTION = 0.10
#: ... in MiB on top: allocator growth, a larger batch, a longer sequence.  Memory past
#: the grant can get the job evicted (or killed by an OOM), so the peak is the base.
MEMORY_HEADROOM_MIB = 1024
#: A compute recommendation is rounded up to a multiple of this, in percent (and is at
#: least this).
COMPUTE_STEP_PCT = 5
#: A memory recommendation is rounded up to a multiple of this, in MiB (and is at least
#: this).
MEMORY_STEP_MIB = 1024
#: ``qstat -f`` hints when a job's peak memory, or its p95 compute, is under this
#: fraction of its grant.
HINT_UNDER_FRACTION = 0.5
#: How many of a user's or a queue's latest finished jobs ``ebb recommend`` looks at.
RECENT_JOBS = 50
#: A whole device's compute, in percent (what a whole-GPU grant holds of each GPU).
WHOLE_DEVICE_PCT = 100.0

#: What ``ebb recommend`` says when no attempt has a measurement.
NO_MEASUREMENT = (
    "no usage measured: attempts ran where the headroom source cannot attribute GPU use "
    "per process (static, trace, prometheus); run with --headroom nvml"
)

_TASK_SUFFIX = re.compile(r"\[[0-9]+\]$")


@dataclass(frozen=True)
class MeasuredAttempt:
    """One attempt's slice and what it used (per device, its fullest device)."""

    job_id: int
    name: str
    owner: str
    queue: str
    attempt: int
    #: the slice granted: compute per device in percent (100 for whole GPUs), whole GPUs
    #: (0: a share of one), memory per device in MiB
    compute_pct: float
    gpus: int
    memory_mib: int
    samples: int
    compute_p95_pct: float | None
    compute_peak_pct: float | None
    memory_p95_mib: float | None
    memory_peak_mib: float | None


@dataclass(frozen=True)
class Used:
    """What some attempts used, combined: the largest p95 and peak of any."""

    attempts: int
    samples: int
    compute_p95_pct: float | None
    compute_peak_pct: float | None
    memory_p95_mib: float | None
    memory_peak_mib: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "samples": self.samples,
            "compute_p95_pct": self.compute_p95_pct,
            "compute_peak_pct": self.compute_peak_pct,
            "memory_p95_mib": self.memory_p95_mib,
            "memory_peak_mib": self.memory_peak_mib,
        }

    def words(self) -> str:
        """``compute p95 18%, peak 31%; memory p95 5.2GiB, peak 6.1GiB``."""
        parts = []
        if self.compute_peak_pct is not None:
            parts.append(
                f"compute p95 {_pct(self.compute_p95_pct)}, peak {_pct(self.compute_peak_pct)}"
            )
        if self.memory_peak_mib is not None:
            parts.append(
                f"memory p95 {_mib(self.memory_p95_mib)}, peak {_mib(self.memory_peak_mib)}"
            )
        return "; ".join(parts)


def combine(attempts: Iterable[MeasuredAttempt]) -> Used | None:
    """The attempts' usage together; ``None`` when none was measured."""
    measured = [a for a in attempts if a.samples > 0]
    if not measured:
        return None
    return Used(
        attempts=len(measured),
        samples=sum(a.samples for a in measured),
        compute_p95_pct=_largest(a.compute_p95_pct for a in measured),
        compute_peak_pct=_largest(a.compute_peak_pct for a in measured),
        memory_p95_mib=_largest(a.memory_p95_mib for a in measured),
        memory_peak_mib=_largest(a.memory_peak_mib for a in measured),
    )


@dataclass(frozen=True)
class Recommendation:
    """The slice to ask for, for one job or one job name."""

    #: the job's name (an array's, without the task's index)
    name: str
    owner: str
    #: the jobs measured, oldest first
    jobs: tuple[int, ...]
    used: Used
    #: the slice the latest of them was granted
    asked_compute_pct: float
    asked_gpus: int
    asked_memory_mib: int
    #: what to ask for: compute per device in percent (with ``gpus`` 0, a share), whole
    #: GPUs, memory per device in MiB
    compute_pct: float
    gpus: int
    memory_mib: int
    #: what else to know, in words
    notes: tuple[str, ...] = ()

    @property
    def asked(self) -> str:
        """The slice asked for, as ``-l`` takes it: ``gpu=50%,gpumem=16GiB``."""
        return _resources(self.asked_compute_pct, self.asked_gpus, self.asked_memory_mib)

    @property
    def resources(self) -> str:
        """The slice to ask for, as ``-l`` takes it: ``gpu=25%,gpumem=8GiB``."""
        return _resources(self.compute_pct, self.gpus, self.memory_mib)

    @property
    def devices(self) -> int:
        return max(1, self.gpus)

    @property
    def freed_compute_pct(self) -> float:
        """Compute freed on each device, in percent (negative: it should ask for more)."""
        return _granted_pct(self.asked_compute_pct, self.asked_gpus) - self.compute_pct

    @property
    def freed_memory_mib(self) -> int:
        """Memory freed on each device, in MiB (negative: it should ask for more)."""
        return self.asked_memory_mib - self.memory_mib

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "owner": self.owner,
            "jobs": list(self.jobs),
            "used": self.used.to_dict(),
            "asked": {
                "compute_pct": self.asked_compute_pct,
                "gpus": self.asked_gpus,
                "memory_mib": self.asked_memory_mib,
                "resources": self.asked,
            },
            "recommended": {
                "compute_pct": self.compute_pct,
                "gpus": self.gpus,
                "memory_mib": self.memory_mib,
                "resources": self.resources,
            },
            "freed_per_device": {
                "compute_pct": self.freed_compute_pct,
                "memory_mib": self.freed_memory_mib,
            },
            "devices": self.devices,
            "notes": list(self.notes),
        }


def recommend(
    attempts: Sequence[MeasuredAttempt], device_memory_mib: int | None = None
) -> list[Recommendation]:
    """One recommendation per owner and job name among ``attempts`` (the measured ones),
    by name; ``device_memory_mib`` caps memory (the largest device of the fleet; None:
    not known)."""
    groups: dict[tuple[str, str], list[MeasuredAttempt]] = {}
    for a in sorted(attempts, key=lambda a: (a.job_id, a.attempt)):
        if a.samples > 0:
            groups.setdefault((a.owner, _TASK_SUFFIX.sub("", a.name)), []).append(a)
    out = []
    for (owner, name), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        used = combine(group)
        assert used is not None
        latest = group[-1]
        jobs = tuple(dict.fromkeys(a.job_id for a in group))
        asked = (latest.compute_pct, latest.gpus, latest.memory_mib)
        out.append(recommend_slice(name, owner, jobs, used, *asked, device_memory_mib))
    return out


def recommend_slice(
    name: str,
    owner: str,
    jobs: tuple[int, ...],
    used: Used,
    asked_compute_pct: float,
    asked_gpus: int,
    asked_memory_mib: int,
    device_memory_mib: int | None = None,
) -> Recommendation:
    """The slice to ask for given what was ``used`` and what was asked (see the module
    doc); what was not measured stays as asked."""
    notes: list[str] = []
    gpus, compute_pct = asked_gpus, _granted_pct(asked_compute_pct, asked_gpus)
    if used.compute_p95_pct is not None:
        wanted = _round_up(used.compute_p95_pct * (1 + COMPUTE_HEADROOM_FRACTION), COMPUTE_STEP_PCT)
        wanted = min(WHOLE_DEVICE_PCT, max(float(COMPUTE_STEP_PCT), wanted))
        if asked_gpus > 1:
            notes.append(
                f"{asked_gpus} whole GPUs are kept: a share is of one GPU only (its p95 "
                f"compute was {_pct(used.compute_p95_pct)} of each)"
            )
        elif asked_gpus == 1 and wanted < WHOLE_DEVICE_PCT:
            gpus, compute_pct = 0, wanted  # a share of the GPU: the rest is others'
        elif asked_gpus == 0:
            compute_pct = wanted
    else:
        notes.append("compute was not measured per process here: its share stays as asked")
    memory_mib = asked_memory_mib
    if used.memory_peak_mib is not None:
        need = used.memory_peak_mib * (1 + MEMORY_HEADROOM_FRACTION) + MEMORY_HEADROOM_MIB
        memory_mib = max(MEMORY_STEP_MIB, int(_round_up(need, MEMORY_STEP_MIB)))
        if device_memory_mib is not None and memory_mib > device_memory_mib:
            memory_mib = device_memory_mib
            notes.append(
                f"memory capped at the largest device ({format_mib(device_memory_mib)}), "
                "less than its peak with headroom"
            )
        if used.memory_peak_mib > asked_memory_mib:
            notes.append(
                f"its peak memory ({_mib(used.memory_peak_mib)}) was above its grant "
                f"({format_mib(asked_memory_mib)}): ask for more, or it may be evicted or "
                "killed for memory"
            )
    else:
        notes.append("memory was not measured per process here: it stays as asked")
    return Recommendation(
        name=name,
        owner=owner,
        jobs=jobs,
        used=used,
        asked_compute_pct=asked_compute_pct,
        asked_gpus=asked_gpus,
        asked_memory_mib=asked_memory_mib,
        compute_pct=compute_pct,
        gpus=gpus,
        memory_mib=memory_mib,
        notes=tuple(notes),
    )


def hint(
    job_id: int, used: Used | None, compute_pct: float, gpus: int, memory_mib: int
) -> str | None:
    """``qstat -f``'s hint for a job granted that slice that used ``used``: said when its
    peak memory or its p95 compute is under :data:`HINT_UNDER_FRACTION` of the grant."""
    if used is None:
        return None
    granted_pct = _granted_pct(compute_pct, gpus)
    under = []
    peak = used.memory_peak_mib
    if peak is not None and peak < HINT_UNDER_FRACTION * memory_mib:
        under.append(f"at most {_mib(peak)} of its {format_mib(memory_mib)} of memory")
    p95 = used.compute_p95_pct
    if p95 is not None and p95 < HINT_UNDER_FRACTION * granted_pct:
        under.append(f"{_pct(p95)} compute (p95) of its {_pct(granted_pct)}")
    if not under:
        return None
    return (
        f"it used {' and '.join(under)} per device; `ebb recommend {job_id}` suggests a "
        "smaller slice"
    )


def _granted_pct(compute_pct: float, gpus: int) -> float:
    return WHOLE_DEVICE_PCT if gpus else compute_pct


def _resources(compute_pct: float, gpus: int, memory_mib: int) -> str:
    share = str(gpus) if gpus else f"{compute_pct:g}%"
    memory = f"{memory_mib // 1024}GiB" if memory_mib % 1024 == 0 else f"{memory_mib}MiB"
    return f"gpu={share},gpumem={memory}"


def _round_up(value: float, step: float) -> float:
    """``value`` rounded up to a multiple of ``step`` (a hair over one is not the next)."""
    return float(math.ceil(value / step - 1e-9) * step)


def _largest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _mib(value: float | None) -> str:
    return "-" if value is None else format_mib(round(value))
