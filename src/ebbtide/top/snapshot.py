"""What ``ebb top`` shows, read once per refresh: every GPU with its online load, the
offline slices held there and the headroom left, the attempts on it, queue depths and
the fleet's latest evictions.

:func:`build_snapshot` is pure (what the client gave, and the time, in; a
:class:`FleetSnapshot` out); :func:`ebbtide.top.fetch.fetch_snapshot` does the reading.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: How many of the latest evictions a snapshot carries, in evictions.
SNAPSHOT_EVICTIONS = 50
#: The job states of an attempt that holds a slice.
ACTIVE_STATE_NAMES = ("dispatched", "running", "evicting")

#: What a device's state word means (the ``state`` of :class:`GpuView`), best first.
STATE_WORDS = {
    "ok": "in service",
    "cooling": "cooling down after an eviction: no new work for a moment",
    "stale": "no fresh figures from the device: the worst case is assumed",
    "stopping": "its agent is stopping",
    "drained": "drained by an admin: nothing new starts there",
    "out": "out of service: a fault (XID, device not answering)",
    "silent": "its agent is silent: its jobs are lost and requeued",
}
#: States in which a device takes no new work: it offers no headroom.
NO_WORK_STATES = frozenset({"stopping", "drained", "out", "silent"})


@dataclass(frozen=True, slots=True)
class AttemptView:
    """An attempt that holds a slice of a GPU."""

    job_id: int
    name: str
    owner: str
    queue: str
    #: ``dispatched``, ``running`` or ``evicting``
    state: str
    #: frozen in place by an online compute spike (it keeps its memory)
    paused: bool
    #: its CUDA state moved to host memory (paused, holding no GPU memory)
    suspended: bool
    #: its share of each of its devices: compute in percent (100: a whole GPU), memory in MiB
    compute_pct: float
    memory_mib: float


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as its node agent last reported it, with the slices ebbtide holds there."""

    node: str
    index: int
    memory_mib: float
    online_compute_pct: float
    online_memory_mib: float
    #: the slices ebbtide's attempts hold here (granted, not measured)
    offline_compute_pct: float
    offline_memory_mib: float
    #: what admission keeps back here for the online side's growth (the forecast's
    #: reserve; the policy's margin comes on top): compute in percent, memory in MiB
    reserve_compute_pct: float
    reserve_memory_mib: float
    #: the reserve is the cold one (its agent is still learning the online load) for
    #: this many more seconds; 0: it is the forecast
    reserve_cold_for_s: float
    #: one word of :data:`STATE_WORDS`
    state: str
    #: what the state is about, in words (the fault, who drained it and why), or ""
    note: str
    attempts: tuple[AttemptView, ...]

    @property
    def name(self) -> str:
        return f"{self.node}/{self.index}"

    @property
    def headroom_compute_pct(self) -> float:
        """Compute neither online nor offline uses; none where the device takes no work.
        The reserve and the policy's margin are not taken off it: admission offers less."""
        if self.state in NO_WORK_STATES:
            return 0.0
        return max(0.0, 100.0 - self.online_compute_pct - self.offline_compute_pct)

    @property
    def headroom_memory_mib(self) -> float:
        """Memory neither online nor offline uses (the reserve and the margin not taken
        off); none where the device takes no work."""
        if self.state in NO_WORK_STATES:
            return 0.0
        return max(0.0, self.memory_mib - self.online_memory_mib - self.offline_memory_mib)


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue's jobs by state (``ebb qstat -Q``)."""

    name: str
    counts: Mapping[str, int]

    @property
    def active(self) -> int:
        """Jobs that hold a slice: dispatched, running (paused too) or evicting."""
        return sum(self.counts.get(s, 0) for s in ACTIVE_STATE_NAMES)

    def count(self, state: str) -> int:
        return self.counts.get(state, 0)


@dataclass(frozen=True, slots=True)
class EvictionView:
    """One eviction: a slice taken back for the online load (or a cancel, or walltime)."""

    job_id: int
    attempt: int | None
    #: Unix seconds the slice was freed (the ``evicted`` event's time)
    time: float
    owner: str
    queue: str
    node: str | None
    devices: tuple[int, ...]
    reason: str
    reason_code: str | None
    #: seconds from the spike to the free slice, and the deadline it had
    latency_s: float | None
    deadline_s: float | None
    killed: bool
    #: True: freed within its deadline; False: missed it; None: not known
    met_deadline: bool | None

    @property
    def where(self) -> str:
        if self.node is None:
            return "-"
        return f"{self.node}/{','.join(map(str, self.devices))}" if self.devices else self.node


@dataclass(frozen=True, slots=True)
class FleetTotals:
    """The header's figures: means over every GPU (compute) and sums (memory)."""

    gpus: int
    nodes: int
    silent_nodes: int
    #: GPUs that take no work: out of service, drained, silent or stopping
    unavailable: int
    online_compute_pct: float
    offline_compute_pct: float
    headroom_compute_pct: float
    memory_mib: float
    online_memory_mib: float
    offline_memory_mib: float
    headroom_memory_mib: float
    #: what admission keeps back for online growth where work may run: compute as a
    #: mean over every GPU (as the headroom), memory summed
    reserve_compute_pct: float
    reserve_memory_mib: float
    attempts: int
    paused: int


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The fleet at ``taken_at`` (Unix seconds), GPUs in node order (``gpu-2`` before
    ``gpu-10``)."""

    taken_at: float
    gpus: tuple[GpuView, ...]
    queues: tuple[QueueView, ...]
    #: newest first
    evictions: tuple[EvictionView, ...]
    totals: FleetTotals
    #: what could not be read, in words (e.g. an older server without evictions)
    notes: tuple[str, ...] = ()

    def to_dict(
        self,
        gpus: Sequence[GpuView] | None = None,
        evictions: Sequence[EvictionView] | None = None,
    ) -> dict[str, Any]:
        """The ``ebb top --json`` shape; ``gpus`` and ``evictions`` as a view shows
        them (default: all)."""
        return {
            "taken_at": self.taken_at,
            "totals": _fields(self.totals),
            "queues": {q.name: {**dict(q.counts), "active": q.active} for q in self.queues},
            "gpus": [_gpu_dict(g) for g in (self.gpus if gpus is None else gpus)],
            "evictions": [
                {**_fields(e), "devices": list(e.devices)}
                for e in (self.evictions if evictions is None else evictions)
            ],
            "notes": list(self.notes),
        }


def _gpu_dict(g: GpuView) -> dict[str, Any]:
    return {
        "node": g.node,
        "index": g.index,
        "state": g.state,
        "note": g.note,
        "memory_mib": g.memory_mib,
        "online_compute_pct": g.online_compute_pct,
        "online_memory_mib": g.online_memory_mib,
        "offline_compute_pct": g.offline_compute_pct,
        "offline_memory_mib": g.offline_memory_mib,
        "headroom_compute_pct": g.headroom_compute_pct,
        "headroom_memory_mib": g.headroom_memory_mib,
        "reserve_compute_pct": g.reserve_compute_pct,
        "reserve_memory_mib": g.reserve_memory_mib,
        "reserve_cold_for_s": g.reserve_cold_for_s,
        "attempts": [_fields(a) for a in g.attempts],
    }


def _fields(view: Any) -> dict[str, Any]:
    """A view's fields as a dict (flat: faster than ``dataclasses.asdict``)."""
    return {f.name: getattr(view, f.name) for f in dataclasses.fields(view)}


# -- building ---------------------------------------------------------------------------


def natural_key(text: str) -> tuple[Any, ...]:
    """``gpu-2`` before ``gpu-10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _attempt(job: Any) -> tuple[str, tuple[int, ...], AttemptView]:
    """A job row (:class:`~ebbtide.queue.models.Job`) as its node, devices and attempt."""
    devices = tuple(int(d) for d in str(job.devices).split(",") if d) if job.devices else ()
    view = AttemptView(
        job_id=int(job.id),
        name=str(job.name),
        owner=str(job.owner),
        queue=str(job.queue),
        state=str(job.state),
        paused=bool(getattr(job, "paused_at", None)),
        suspended=bool(getattr(job, "suspended_at", None)),
        compute_pct=100.0 if job.gpus else float(job.compute_pct),
        memory_mib=float(job.memory_mib),
    )
    return str(job.node or ""), devices, view


def _state(node: Mapping[str, Any], device: Mapping[str, Any], now: float) -> tuple[str, str]:
    """A device's state word and its note (see :data:`STATE_WORDS`)."""
    if node.get("silent"):
        return "silent", ""
    if device.get("health") == "unhealthy":
        fault = device.get("fault") or {}
        return "out", str(fault.get("meaning") or device.get("failing") or "a fault")
    if device.get("drained"):
        return "drained", str(device["drained"])
    if node.get("stopping"):
        return "stopping", ""
    if device.get("sample_ok") is False:
        return "stale", ""
    cooldown = device.get("cooldown_until")
    if cooldown and cooldown > now:
        return "cooling", f"cooling down {cooldown - now:.0f}s"
    return "ok", ""


def build_snapshot(
    nodes: Sequence[Mapping[str, Any]],
    jobs: Iterable[Any],
    queue_stats: Mapping[str, Mapping[str, int]],
    evictions: Sequence[Mapping[str, Any]],
    *,
    taken_at: float,
    notes: Sequence[str] = (),
) -> FleetSnapshot:
    """The snapshot of what the client gave: ``nodes`` as ``Client.nodes()`` (``ebb
    nodes --json``), ``jobs`` the active ones (``Client.list`` in dispatched, running,
    evicting), ``queue_stats`` as ``Client.queue_stats()``, ``evictions`` as
    ``Client.recent_evictions()``.  Pure: no clock read, no I/O."""
    held: dict[tuple[str, int], list[AttemptView]] = {}
    for job in jobs:
        node, devices, view = _attempt(job)
        for index in devices:
            held.setdefault((node, index), []).append(view)
    gpus = []
    for n in sorted(nodes, key=lambda n: natural_key(str(n["name"]))):
        name = str(n["name"])
        for d in sorted(n.get("devices") or [], key=lambda d: int(d["index"])):
            index = int(d["index"])
            attempts = tuple(held.get((name, index), ()))
            state, note = _state(n, d, taken_at)
            gpus.append(
                GpuView(
                    node=name,
                    index=index,
                    memory_mib=float(d.get("memory_mib") or 0.0),
                    online_compute_pct=float(d.get("online_compute_pct") or 0.0),
                    online_memory_mib=float(d.get("online_memory_mib") or 0.0),
                    offline_compute_pct=sum((a.compute_pct for a in attempts), 0.0),
                    offline_memory_mib=sum(
                        (0.0 if a.suspended else a.memory_mib for a in attempts), 0.0
                    ),
                    reserve_compute_pct=float(d.get("reserve_compute_pct") or 0.0),
                    reserve_memory_mib=float(d.get("reserve_memory_mib") or 0.0),
                    reserve_cold_for_s=float(d.get("reserve_cold_for_s") or 0.0),
                    state=state,
                    note=note,
                    attempts=attempts,
                )
            )
    queues = tuple(
        QueueView(name, dict(counts))
        for name, counts in sorted(queue_stats.items(), key=lambda q: natural_key(q[0]))
    )
    shown = tuple(_eviction(e) for e in evictions)
    return FleetSnapshot(
        taken_at=taken_at,
        gpus=tuple(gpus),
        queues=queues,
        evictions=shown,
        totals=_totals(nodes, gpus),
        notes=tuple(notes),
    )


def _eviction(e: Mapping[str, Any]) -> EvictionView:
    latency = e.get("latency_s")
    deadline = e.get("deadline_s")
    missed = e.get("deadline_missed")
    if missed is not None:
        met: bool | None = not missed
    elif latency is not None and deadline is not None:
        met = float(latency) <= float(deadline)
    else:
        met = None
    return EvictionView(
        job_id=int(e["job_id"]),
        attempt=e.get("attempt"),
        time=float(e.get("time") or 0.0),
        owner=str(e.get("owner") or "?"),
        queue=str(e.get("queue") or "?"),
        node=e.get("node"),
        devices=tuple(int(d) for d in e.get("devices") or ()),
        reason=str(e.get("reason") or ""),
        reason_code=e.get("reason_code"),
        latency_s=None if latency is None else float(latency),
        deadline_s=None if deadline is None else float(deadline),
        killed=bool(e.get("killed")),
        met_deadline=met,
    )


def _totals(nodes: Sequence[Mapping[str, Any]], gpus: Sequence[GpuView]) -> FleetTotals:
    count = len(gpus) or 1  # means over no GPU are 0

    def mean(values: Iterable[float]) -> float:
        return sum(values) / count

    return FleetTotals(
        gpus=len(gpus),
        nodes=len(nodes),
        silent_nodes=sum(1 for n in nodes if n.get("silent")),
        unavailable=sum(1 for g in gpus if g.state in NO_WORK_STATES),
        online_compute_pct=mean(min(100.0, g.online_compute_pct) for g in gpus),
        offline_compute_pct=mean(min(100.0, g.offline_compute_pct) for g in gpus),
        headroom_compute_pct=mean(g.headroom_compute_pct for g in gpus),
        memory_mib=sum(g.memory_mib for g in gpus),
        online_memory_mib=sum(g.online_memory_mib for g in gpus),
        offline_memory_mib=sum(g.offline_memory_mib for g in gpus),
        headroom_memory_mib=sum(g.headroom_memory_mib for g in gpus),
        reserve_compute_pct=mean(g.reserve_compute_pct for g in gpus if _takes_work(g)),
        reserve_memory_mib=sum(g.reserve_memory_mib for g in gpus if _takes_work(g)),
        attempts=len({a.job_id for g in gpus for a in g.attempts}),
        paused=len({a.job_id for g in gpus for a in g.attempts if a.paused}),
    )


def keeps_back(compute_pct: float, memory_mib: float) -> bool:
    """Whether a device's reserve is worth saying (``ebb top``, ``ebb nodes``): a whole
    percent of compute, or a MiB of memory."""
    return compute_pct >= 0.5 or memory_mib >= 1


def _takes_work(g: GpuView) -> bool:
    return g.state not in NO_WORK_STATES
