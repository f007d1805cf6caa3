"""``ebb report``: what the fleet harvested over a time window, and what it cost — pure.

(Longer than our modules should be: every figure's counting rule (harvest, pauses,
evictions, latencies, per queue and per user) is here, next to the others, so the
definitions this docstring gives are checked against one file; it is pure, and plotting
(``report_plot``) and reading the store already stand alone.)

:func:`build_report` takes the attempts and events the store read for a window
``[since, until)`` (:meth:`Store.report_rows <ebbtide.queue.store.Store.report_rows>`)
and computes, for everything, each queue and each user, what :data:`COUNTING` says.  No
clock is read and nothing is fetched here: the time the report is made (``now``) is
given, and the same rows give the same report.

Online utilisation *before and after* is not here, because the store does not keep it:
each node's heartbeat holds only its devices' latest online load.  Its history is in the
Prometheus metrics (``ebbtide_online_compute_ratio`` beside ``ebbtide_offline_compute_ratio``,
on the Grafana dashboard), and ``ebb sim`` measures it against baselines on a recorded
trace.  What the store does tell is how much offline work ran per device-hour of the
fleet seen in the window (``fleet``).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ebbtide.queue.states import EventType
from ebbtide.units import MAX_DURATION_S, parse_duration_s, shown

#: Seconds in an hour.
HOUR_S = 3600.0
#: MiB in a GiB.
GIB_MIB = 1024.0
#: The longest window a report covers, in seconds (366 days).
MAX_REPORT_SPAN_S = MAX_DURATION_S
#: The timeline's bin widths, in seconds: the narrowest that cuts the window into at
#: most :data:`TIMELINE_MAX_BINS` bins (an hour for a day, 6 h for a week).
TIMELINE_BIN_LADDER_S = (10.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0, 604800.0)
#: The most bins the timeline is cut into (unless the widest bin gives more).
TIMELINE_MAX_BINS = 48
#: The eviction latency CDF a report carries: its 0th to 100th percentiles, in seconds.
LATENCY_CDF_POINTS = 101
#: The reason code of an eviction whose event names none (a job that asked to be requeued).
UNSPECIFIED = "unspecified"

WHEN_FORMS = (
    "an ISO timestamp (2024-05-01T09:00, 2024-05-01 09:00+02:00, 2024-05-01), "
    "a time ago (30m, 24h, 7d) or now"
)
_AGO = re.compile(r"\s*[0-9]+(?:\.[0-9]+)?\s*(?:s|m|min|h|d)\s*")

#: How each figure is counted, in the report itself (``--json``) and in the docs.
COUNTING = {
    "gpu_hours": (
        "GPU-hours harvested: for each attempt, the seconds it ran inside the window (from "
        "its start to its end, or to the report's time while it runs), less the seconds it "
        "was paused, times its granted slice: compute_pct / 100 on each device it held "
        "(a whole-GPU attempt on 2 devices counts 2 GPU-hours an hour)"
    ),
    "gpu_memory_gib_hours": (
        "the same run time, paused time included (a paused job keeps its memory) and "
        "suspended-to-host time not, times the GPU memory granted on each device, in GiB-hours"
    ),
    "jobs": (
        "submitted, succeeded, failed (for good: not a failure that was requeued) and "
        "cancelled, by the time of that event inside the window"
    ),
    "attempts": "attempts that held a slice at some time inside the window",
    "evictions": (
        "evicted events inside the window, by reason code: latency from the online spike "
        "(or the decision) to the slice being free, deadline misses, kills at the deadline, "
        "and lost work (seconds since the attempt's last checkpoint; times its slice in "
        "GPU-hours, and that as a share of the GPU-hours harvested)"
    ),
    "lost_attempts": (
        "lost events inside the window, by reason code: attempts whose node went silent, "
        "whose start never happened or was taken back, or that vanished; the job is "
        "requeued, held or cancelled, and none is counted in evictions"
    ),
    "pauses": (
        "paused events inside the window (suspensions to host memory among them), and "
        "the seconds attempts were paused inside it"
    ),
    "queue_wait": (
        "each dispatch inside the window, from when its job last became queued "
        "(submitted, released, dependencies met, requeued); time held is not waiting"
    ),
    "percentiles": "nearest rank: p50 of 4 values is the 2nd, p99 the 4th",
    "fleet": (
        "devices of the nodes known now, from their agent's start to their last heartbeat "
        "(widened to the attempts that ran there), inside the window"
    ),
}
ONLINE_HISTORY = (
    "not in the store, which keeps only each device's latest load: see "
    "ebbtide_online_compute_ratio in Prometheus (the Grafana dashboard), or `ebb sim`"
)

_BECOMES_QUEUED = frozenset(
    {EventType.SUBMITTED, EventType.RELEASED, EventType.DEPENDENCIES_MET, EventType.REQUEUED}
)


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt with its job's queue and owner, as the store reads it."""

    job_id: int
    number: int
    queue: str
    owner: str
    node: str
    devices: tuple[int, ...]
    #: granted compute on each device, in % of one GPU
    compute_pct: float
    #: granted memory on each device, in MiB
    memory_mib: int
    dispatched_at: float
    started_at: float | None
    ended_at: float | None
    outcome: str | None

    @property
    def gpus(self) -> float:
        """The slice in GPUs: compute_pct / 100 on each device held (at least one)."""
        return self.compute_pct / 100.0 * max(1, len(self.devices))


@dataclass(frozen=True, slots=True)
class EventRow:
    """One event with its job's queue and owner; ``data`` is the event's own."""

    id: int
    job_id: int
    attempt: int | None
    type: str
    time: float
    queue: str
    owner: str
    data: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A node the store knows now: its agent's start, last heartbeat, device count."""

    name: str
    started_at: float
    heartbeat_at: float
    devices: int


# -- the window ---------------------------------------------------------------------------


def parse_when(text: str, now: float) -> float:
    """Unix seconds of ``text``: a time ago (``24h``, ``7d``, ``30m``), an ISO timestamp
    (local time unless it says its offset), or ``now``; else a ``ValueError`` naming the
    forms."""
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError(f"expected {WHEN_FORMS}, got {shown(text)}")
    if text.strip().lower() == "now":
        return now
    if _AGO.fullmatch(text):
        return now - parse_duration_s(text)
    try:
        stamp = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"expected {WHEN_FORMS}, got {shown(text)}") from None
    if not 1970 <= stamp.year <= 9000:  # a trial's trap: year 1 said "year 0 is out of range"
        raise ValueError(f"expected a time from 1970 to 9000, got {shown(text)}")
    if stamp.tzinfo is None:
        stamp = stamp.astimezone()  # a person's timestamps are in their local time
    return stamp.timestamp()


def window_error(since: float, until: float) -> str | None:
    """What is wrong with the window ``[since, until)``, or None."""
    for value in (since, until):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected Unix seconds, got {shown(value)}"
        if not math.isfinite(value):
            return f"expected finite Unix seconds, got {value}"
    if since >= until:
        return f"the window's start ({stamp(since)}) must be before its end ({stamp(until)})"
    if until - since > MAX_REPORT_SPAN_S:
        return f"a report covers at most 366 days; this window is {(until - since) / 86400:.0f}"
    return None


def stamp(t: float) -> str:
    """``t`` as a local ISO timestamp, to the second (Unix seconds past the calendar)."""
    try:
        return dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
    except (ValueError, OverflowError, OSError):  # before year 1 or after 9999
        # exact while it is a number one could mean; 1e300 is not 301 digits' worth
        return f"{t:.0f} (Unix seconds)" if abs(t) < 1e18 else f"{t:.6g} (Unix seconds)"


def timeline_bin_s(span_s: float) -> float:
    """The timeline's bin width for a window of ``span_s`` seconds."""
    for width in TIMELINE_BIN_LADDER_S:
        if math.ceil(span_s / width) <= TIMELINE_MAX_BINS:
            return width
    return TIMELINE_BIN_LADDER_S[-1]


def percentile(ordered: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile of sorted values by nearest rank; None for none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


# -- intervals ----------------------------------------------------------------------------

Span = tuple[float, float]


def _clip(span: Span, window: Span) -> Span | None:
    start, end = max(span[0], window[0]), min(span[1], window[1])
    return (start, end) if end > start else None


def _minus(span: Span, holes: Sequence[Span]) -> list[Span]:
    """The parts of ``span`` outside ``holes`` (sorted, not overlapping)."""
    parts, start = [], span[0]
    for h0, h1 in holes:
        if h1 <= start or h0 >= span[1]:
            continue
        if h0 > start:
            parts.append((start, h0))
        start = max(start, h1)
    if start < span[1]:
        parts.append((start, span[1]))
    return parts


def _length(spans: Iterable[Span]) -> float:
    return sum(b - a for a, b in spans)


def _pauses(events: Sequence[EventRow], end: float) -> tuple[list[Span], list[Span]]:
    """An attempt's paused spans (its compute given back) and suspended spans (its
    memory given back too), from its paused and thawed events in order; a pause never
    thawed lasts until ``end``, the attempt's."""
    paused: list[Span] = []
    suspended: list[Span] = []
    paused_at = suspended_at = None
    for e in events:
        if e.type == EventType.PAUSED:
            paused_at = e.time if paused_at is None else paused_at
            if e.data.get("kind") == "suspend" and suspended_at is None:
                suspended_at = e.time
        elif e.type == EventType.THAWED:
            if paused_at is not None:
                paused.append((paused_at, e.time))
            if suspended_at is not None:
                suspended.append((suspended_at, e.time))
            paused_at = suspended_at = None
    if paused_at is not None:
        paused.append((paused_at, end))
    if suspended_at is not None:
        suspended.append((suspended_at, end))
    return paused, suspended


# -- the tallies --------------------------------------------------------------------------


@dataclass
class _Tally:
    """What one group (everything, a queue, a user) did in the window."""

    jobs: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("submitted", "succeeded", "failed", "cancelled"), 0)
    )
    attempts: int = 0
    gpu_s: float = 0.0
    memory_gib_s: float = 0.0
    evictions: list[EventRow] = field(default_factory=list)
    lost_gpu_s: float = 0.0
    #: lost attempts, by reason code
    lost: dict[str, int] = field(default_factory=dict)
    pauses: int = 0
    suspended: int = 0
    paused_s: float = 0.0
    waits: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        waits = sorted(self.waits)
        lost_share = self.lost_gpu_s / self.gpu_s if self.gpu_s > 0 else None
        return {
            "jobs": dict(self.jobs),
            "attempts": self.attempts,
            "gpu_hours": round(self.gpu_s / HOUR_S, 6),
            "gpu_memory_gib_hours": round(self.memory_gib_s / HOUR_S, 6),
            "evictions": {
                **_evictions(self.evictions),
                "lost_work_gpu_hours": round(self.lost_gpu_s / HOUR_S, 6),
                "lost_share_of_harvest": None if lost_share is None else round(lost_share, 6),
                "by_reason": {
                    code: _evictions(group)
                    for code, group in sorted(_by_reason(self.evictions).items())
                },
            },
            "lost_attempts": {
                "count": sum(self.lost.values()),
                "by_reason": dict(sorted(self.lost.items())),
            },
            "pauses": {
                "count": self.pauses,
                "suspended": self.suspended,
                "paused_s": round(self.paused_s, 3),
            },
            "queue_wait": {
                "count": len(waits),
                "p50_s": _rounded(percentile(waits, 50)),
                "p99_s": _rounded(percentile(waits, 99)),
                "max_s": _rounded(waits[-1] if waits else None),
            },
        }


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _by_reason(events: Iterable[EventRow]) -> dict[str, list[EventRow]]:
    out: dict[str, list[EventRow]] = defaultdict(list)
    for e in events:
        out[str(e.data.get("reason_code") or UNSPECIFIED)].append(e)
    return out


def _latencies(events: Iterable[EventRow]) -> list[float]:
    return sorted(
        float(e.data["latency_s"])
        for e in events
        if isinstance(e.data.get("latency_s"), int | float)
    )


def _evictions(events: Sequence[EventRow]) -> dict[str, Any]:
    latencies = _latencies(events)
    return {
        "count": len(events),
        "latency_p50_s": _rounded(percentile(latencies, 50)),
        "latency_p99_s": _rounded(percentile(latencies, 99)),
        "latency_max_s": _rounded(latencies[-1] if latencies else None),
        "deadline_misses": sum(bool(e.data.get("deadline_missed")) for e in events),
        "killed": sum(bool(e.data.get("killed")) for e in events),
        "lost_work_s": round(sum(float(e.data.get("lost_work_s") or 0.0) for e in events), 3),
    }


class _Counter:
    """What the window holds, added up attempt by attempt and event by event, for
    everything, each queue and each user."""

    def __init__(self, since: float, until: float, end: float) -> None:
        self.since, self.until = since, until
        #: the window as far as it has come (``end``: the report's time, if earlier)
        self.window: Span = (since, end)
        self.overall = _Tally()
        self.queues: dict[str, _Tally] = defaultdict(_Tally)
        self.users: dict[str, _Tally] = defaultdict(_Tally)
        self.bin_s = timeline_bin_s(until - since)
        #: per queue, the GPU-hours harvested in each bin
        self.timeline: dict[str, list[float]] = {}
        #: per node, from the first start of an attempt there to its last end
        self.ran_on: dict[str, Span] = {}

    def of(self, queue: str, owner: str) -> tuple[_Tally, _Tally, _Tally]:
        return self.overall, self.queues[queue], self.users[owner]

    def add_attempt(self, a: AttemptRow, events: Sequence[EventRow]) -> None:
        """An attempt, with its paused and thawed events in order."""
        since, end = self.window
        ended = a.ended_at if a.ended_at is not None else end
        if a.dispatched_at >= end or (ended <= since and a.dispatched_at < since):
            return  # it held no slice inside the window
        paused, suspended = _pauses(events, ended)
        ran = _clip((a.started_at, ended), self.window) if a.started_at is not None else None
        harvest = _minus(ran, paused) if ran else []
        memory_s = _length(_minus(ran, suspended)) if ran else 0.0
        paused_s = _length(c for p in paused if (c := _clip(p, self.window)) is not None)
        if a.started_at is not None:
            first, last = self.ran_on.get(a.node, (a.started_at, ended))
            self.ran_on[a.node] = (min(first, a.started_at), max(last, ended))
        self._bin(a.queue, harvest, a.gpus)
        for t in self.of(a.queue, a.owner):
            t.attempts += 1
            t.gpu_s += _length(harvest) * a.gpus
            t.memory_gib_s += memory_s * a.memory_mib / GIB_MIB * max(1, len(a.devices))
            t.paused_s += paused_s

    def _bin(self, queue: str, spans: Sequence[Span], gpus: float) -> None:
        width = self.bin_s
        line = self.timeline.setdefault(queue, [0.0] * math.ceil((self.until - self.since) / width))
        for s0, s1 in spans:
            first, last = int((s0 - self.since) // width), int((s1 - self.since) // width)
            for k in range(first, min(last, len(line) - 1) + 1):
                low, high = self.since + k * width, self.since + (k + 1) * width
                line[k] += max(0.0, min(s1, high) - max(s0, low)) * gpus / HOUR_S

    def add_event(
        self, e: EventRow, history: Sequence[EventRow], slice_of: AttemptRow | None
    ) -> None:
        """An event inside the window, with its job's events (``history``) and the
        attempt it is about (``slice_of``), where there is one."""
        group = self.of(e.queue, e.owner)
        kind = e.type
        if kind in ("submitted", "succeeded", "cancelled") or (
            kind == EventType.FAILED and e.data.get("final") is not False
        ):
            for t in group:
                t.jobs[kind] += 1
        elif kind == EventType.EVICTED:
            lost_s = float(e.data.get("lost_work_s") or 0.0)
            for t in group:
                t.evictions.append(e)
                t.lost_gpu_s += lost_s * (slice_of.gpus if slice_of else 0.0)
        elif kind == EventType.LOST:
            code = str(e.data.get("reason_code") or UNSPECIFIED)
            for t in group:
                t.lost[code] = t.lost.get(code, 0) + 1
        elif kind == EventType.PAUSED:
            for t in group:
                t.pauses += 1
                t.suspended += e.data.get("kind") == "suspend"
        elif kind == EventType.DISPATCHED:
            became = [q.time for q in history if q.id < e.id and q.type in _BECOMES_QUEUED]
            if became:
                for t in group:
                    t.waits.append(max(0.0, e.time - max(became)))


# -- the report ---------------------------------------------------------------------------


def build_report(
    attempts: Sequence[AttemptRow],
    events: Sequence[EventRow],
    nodes: Sequence[NodeRow],
    *,
    since: float,
    until: float,
    now: float,
    queue: str | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The report of ``[since, until)`` made at ``now`` (see the module doc and
    :data:`COUNTING`), of one ``queue`` and one ``user`` if given.  ``events`` are the
    events of the jobs concerned, before the window too (when they became queued, when
    a pause began); any order."""
    error = window_error(since, until)
    if error:
        raise ValueError(error)

    # 1. the rows of the queue and the user asked for, indexed by attempt and by job
    def wanted(row: AttemptRow | EventRow) -> bool:
        return (queue is None or row.queue == queue) and (user is None or row.owner == user)

    attempts = [a for a in attempts if wanted(a)]
    ordered = sorted((e for e in events if wanted(e)), key=lambda e: e.id)
    by_attempt: dict[tuple[int, int | None], list[EventRow]] = defaultdict(list)
    by_job: dict[int, list[EventRow]] = defaultdict(list)
    for e in ordered:
        by_attempt[e.job_id, e.attempt].append(e)
        by_job[e.job_id].append(e)
    slices = {(a.job_id, a.number): a for a in attempts}

    # 2. attempts: harvest, memory, paused time, the timeline, where nodes ran work
    end = min(until, now)
    count = _Counter(since, until, end)
    for a in attempts:
        count.add_attempt(a, by_attempt.get((a.job_id, a.number), []))

    # 3. events inside the window: jobs, evictions, pauses, queue waits
    for e in ordered:
        if since <= e.time < end:
            count.add_event(e, by_job[e.job_id], slices.get((e.job_id, e.attempt or 0)))

    # 4. the report
    overall = count.overall.summary()
    evictions = count.overall.evictions
    latencies = _latencies(evictions)
    deadlines = {e.data.get("deadline_s") for e in evictions}
    return {
        "window": {"since": since, "until": until, "measured_until": end},
        "filters": {"queue": queue, "user": user},
        "counting": COUNTING,
        "fleet": _fleet(nodes, count.ran_on, count.window, overall["gpu_hours"]),
        "overall": overall,
        "queues": {q: t.summary() for q, t in sorted(count.queues.items())},
        "users": {u: t.summary() for u, t in sorted(count.users.items())},
        "timeline": {
            "start": since,
            "bin_s": count.bin_s,
            "gpu_hours": {
                q: [round(v, 6) for v in line] for q, line in sorted(count.timeline.items())
            },
        },
        "eviction_latency_cdf_s": [
            _rounded(percentile(latencies, k)) for k in range(LATENCY_CDF_POINTS) if latencies
        ],
        "eviction_deadlines_s": sorted(float(d) for d in deadlines if isinstance(d, int | float)),
    }


def _fleet(
    nodes: Sequence[NodeRow], ran_on: Mapping[str, Span], window: Span, gpu_hours: float
) -> dict[str, Any]:
    """The fleet seen in the window: each node from its agent's start to its last
    heartbeat, widened to the attempts that ran there (an agent restarted in the window
    ran before its start; a silent one's attempts run on until they are reaped)."""
    device_s = 0.0
    for n in nodes:
        first, last = ran_on.get(n.name, (n.started_at, n.heartbeat_at))
        seen = _clip((min(n.started_at, first), max(n.heartbeat_at, last)), window)
        device_s += n.devices * (_length([seen]) if seen else 0.0)
    device_hours = device_s / HOUR_S
    return {
        "nodes": len(nodes),
        "devices": sum(n.devices for n in nodes),
        "device_hours": round(device_hours, 6),
        "harvested_gpu_hours_per_device_hour": (
            round(gpu_hours / device_hours, 6) if device_hours > 0 else None
        ),
        "online_utilisation": ONLINE_HISTORY,
    }


def report_from_rows(
    rows: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    since: float,
    until: float,
    now: float,
    queue: str | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """:func:`build_report` of the rows :meth:`Store.report_rows
    <ebbtide.queue.store.Store.report_rows>` gives (plain mappings)."""
    attempts = [AttemptRow(**{**r, "devices": tuple(r["devices"])}) for r in rows["attempts"]]
    events = [EventRow(**r) for r in rows["events"]]
    nodes = [NodeRow(**r) for r in rows["nodes"]]
    return build_report(
        attempts, events, nodes, since=since, until=until, now=now, queue=queue, user=user
    )
