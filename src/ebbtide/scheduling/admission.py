"""Policy rules the planner applies around placement.  Pure: no clock, no I/O.

- **drains**: a slice held under a window that closes is warned at close − deadline
  (a little earlier, :data:`DRAIN_LEAD_S`), with a deadline that ends at the close; one
  whose queue no window admits any more is evicted now;
- **shares**: offline slices on a device may hold at most the largest
  ``max_offline_share`` of the windows open there;
- **quotas**: per queue ``max_running``, ``max_fleet_share`` and ``max_user_share``;
- **backoff**: a job evicted k ≥ 2 times waits ``backoff_base_s × 2^(k-2)``;
- **admission**: a job starts only if its first checkpoint (and then its eviction
  deadline) fits before the window closes.

Every refusal comes with a sentence for ``qstat`` (see :class:`Reasons`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

from ebbtide.preemption.victims import Eviction, EvictReason, select_victims
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, allocated
from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    DeviceGates,
    DeviceView,
    PlanRules,
    QueuedJob,
    QueueLimits,
    Snapshot,
    backoff_s,
)
from ebbtide.units import format_mib

#: Drains start this much before close − deadline, so a pass that runs a little late
#: still leaves the job its whole deadline, in seconds.
DRAIN_LEAD_S = 0.25
#: The shortest deadline a drain gives, in seconds (the slice must still go).
MIN_DRAIN_S = 0.2
#: At most this many queued jobs get a reason written per pass.
MAX_REASONS = 1000


def _closing(gates: Mapping[tuple[str, int], DeviceGates] | None, d: DeviceView, queue: str) -> str:
    g = gates.get(d.key) if gates is not None else None
    q = g.open.get(queue) if g is not None else None
    return q.window if q is not None else ""


def clock_text(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S UTC")


def drain_evictions(
    snapshot: Snapshot, chosen: set[tuple[int, int]]
) -> tuple[list[Eviction], list[float]]:
    """Evictions the windows require now, and the future instants more will be due."""
    gates = snapshot.gates
    if gates is None:
        return [], []
    now = snapshot.now
    out: list[Eviction] = []
    later: list[float] = []
    for a in snapshot.active:
        if a.evicting or (a.job_id, a.attempt) in chosen or not a.devices:
            continue
        g = gates.get((a.node, a.devices[0]))
        if g is None:
            continue
        q = g.open.get(a.queue)
        if q is None:
            why = g.closed.get(a.queue) or f"no window admits queue {a.queue!r} here"
            out.append(
                Eviction(
                    a.job_id,
                    a.attempt,
                    a.node,
                    EvictReason.WINDOW_CLOSED,
                    a.deadline_s,
                    f"window closed: {why}",
                )
            )
            continue
        if math.isinf(q.open_until):
            continue
        warn_at = q.open_until - a.deadline_s - DRAIN_LEAD_S
        if now >= warn_at:
            left = max(MIN_DRAIN_S, q.open_until - now)
            out.append(
                Eviction(
                    a.job_id,
                    a.attempt,
                    a.node,
                    EvictReason.WINDOW_CLOSING,
                    min(left, a.deadline_s + DRAIN_LEAD_S),
                    f"its window closes at {clock_text(q.open_until)}: "
                    "the slice must be free by then",
                )
            )
        else:
            later.append(warn_at)
    for ev in out:
        chosen.add((ev.job_id, ev.attempt))
    return out, later


def device_share(gates: DeviceGates | None) -> float:
    """The largest share any open window allows on the device (1 with no windows)."""
    if gates is None:
        return 1.0
    return max((g.share for g in gates.open.values()), default=0.0)


def share_evictions(
    snapshot: Snapshot,
    by_device: dict[tuple[str, int], list[ActiveAttempt]],
    chosen: set[tuple[int, int]],
) -> list[Eviction]:
    """Evictions that bring each device back within the share its open windows allow."""
    if snapshot.gates is None:
        return []
    out = []
    for device in snapshot.devices:
        here = [a for a in by_device.get(device.key, []) if (a.job_id, a.attempt) not in chosen]
        if not here:
            continue
        share = device_share(snapshot.gates.get(device.key))
        alloc_c, alloc_m = allocated(device, here)
        over_c = alloc_c - share * DEVICE_COMPUTE_PCT
        over_m = alloc_m - share * device.memory_mib
        if over_c <= 1e-6 and over_m <= 1e-6:
            continue
        message = (
            f"offline slices on {device.node}/{device.index} exceed the {share:g} share "
            "the open windows allow"
        )
        for a in select_victims(here, max(0.0, over_c), max(0.0, over_m), snapshot.now):
            chosen.add((a.job_id, a.attempt))
            out.append(
                Eviction(a.job_id, a.attempt, a.node, EvictReason.SHARE, a.deadline_s, message)
            )
    return out


class Quotas:
    """Per-queue limits, spent as the pass admits jobs; ``limits`` has every queue of the
    policy, and a job of a queue it lacks is refused (see :meth:`queue_refusal`)."""

    def __init__(
        self,
        limits: Mapping[str, QueueLimits],
        active: Sequence[ActiveAttempt],
        devices: int,
    ) -> None:
        self.limits = limits
        self.fleet_units = devices * DEVICE_COMPUTE_PCT
        self.running: Counter[str] = Counter()
        self.queue_units: defaultdict[str, float] = defaultdict(float)
        self.user_units: defaultdict[tuple[str, str], float] = defaultdict(float)
        for a in active:
            self._take(a.queue, a.owner, a.compute_pct * max(1, len(a.devices)))

    def _take(self, queue: str, owner: str, units: float) -> None:
        self.running[queue] += 1
        self.queue_units[queue] += units
        self.user_units[(queue, owner)] += units

    def take(self, job: QueuedJob) -> None:
        self._take(job.queue, job.owner, job.compute_pct * max(1, job.gpus))

    def refusal(self, job: QueuedJob) -> str | None:
        """Why the quotas refuse ``job`` now, or None."""
        why = self.queue_refusal(job)
        if why is not None:
            return why
        lim = self.limits[job.queue]  # (the queue's own refusal says when it is not there)
        units = job.compute_pct * max(1, job.gpus)
        q = job.queue
        if lim.max_user_share is not None and (
            self.user_units[(q, job.owner)] + units > lim.max_user_share * self.fleet_units + 1e-6
        ):
            return (
                f"quota: {job.owner} would hold more than max_user_share "
                f"{lim.max_user_share:g} of the fleet in queue {q!r}"
            )
        return None

    def queue_refusal(self, job: QueuedJob) -> str | None:
        """Why the queue's own limits (``max_running``, ``max_fleet_share``) refuse ``job``
        now, or None.  What they count only grows in a pass: a job they refuse, they refuse
        every later job of its queue and its slice."""
        lim = self.limits.get(job.queue)
        if lim is None:
            # a trial's trap: a queue taken out of the policy left its jobs to run under
            # no queue's rules (and, with windows, waiting "for a device to be up")
            return (
                f"waiting: queue {job.queue!r} is not in the policy (taken out of it?): its "
                "jobs wait until it is back; qdel them, or add the queue again"
            )
        units = job.compute_pct * max(1, job.gpus)
        q = job.queue
        if lim.max_running is not None and self.running[q] >= lim.max_running:
            return (
                f"quota: queue {q!r} has {self.running[q]} running (max_running {lim.max_running})"
            )
        if lim.max_fleet_share is not None and (
            self.queue_units[q] + units > lim.max_fleet_share * self.fleet_units + 1e-6
        ):
            return (
                f"quota: queue {q!r} would hold more than max_fleet_share "
                f"{lim.max_fleet_share:g} of the fleet"
            )
        return None


def ready_at(job: QueuedJob, rules: Snapshot | PlanRules) -> float:
    """When the job's backoff after repeated evictions ends (0 when it has none)."""
    if job.requeued_at is None:
        return 0.0
    wait = backoff_s(job.evictions, rules.backoff_base_s, rules.backoff_max_s)
    return job.requeued_at + wait if wait > 0 else 0.0


def fits_before_close(job: QueuedJob, open_until: float, now: float) -> bool:
    """Its first checkpoint, then its eviction deadline, fit before the window closes
    (a job that does not say when it first checkpoints must at least not be due for a
    drain the moment it starts)."""
    if math.isinf(open_until):
        return True
    return now + (job.first_checkpoint_s or 0.0) + job.deadline_s + DRAIN_LEAD_S < open_until


def unplaced_reason(job: QueuedJob, snapshot: Snapshot, devices: Iterable[DeviceView]) -> str:
    """Why a job that passed its quotas found no device: windows, cooldown, or room."""
    return Unplaced(snapshot, devices).reason(job)


class Unplaced:
    """:func:`unplaced_reason` for the jobs of one pass: what the devices say is worked out
    once per queue and timing (a fleet has many devices), only the slice's size per job."""

    def __init__(self, snapshot: Snapshot, devices: Iterable[DeviceView]) -> None:
        self._snapshot = snapshot
        self._devices = list(devices)
        self._said: dict[tuple[str, float | None, float], str | tuple[str, str]] = {}
        self._busy: set[tuple[str, int]] | None = None

    def _busy_devices(self) -> set[tuple[str, int]]:
        """The devices other offline jobs hold slices on (worked out once)."""
        if self._busy is None:
            self._busy = {(a.node, d) for a in self._snapshot.active for d in a.devices}
        return self._busy

    def reason(self, job: QueuedJob) -> str:
        key = (job.queue, job.first_checkpoint_s, job.deadline_s)
        said = self._said.get(key)
        if said is None:
            said = self._said[key] = self._devices_say(job)
        if isinstance(said, str):
            return said
        share, notes = said
        slice_text = f"{job.gpus} whole GPU(s)" if job.gpus else f"{job.compute_pct:g}%"
        return (
            f"waiting for headroom: no device has {slice_text} and "
            f"{format_mib(job.memory_mib)} free{share} (margin included){notes}"
        )

    def _devices_say(self, job: QueuedJob) -> str | tuple[str, str]:
        """The whole reason where the devices alone give it (no window, a cooldown, none
        up); else what follows the slice's size in it: the share and the notes."""
        now, gates = self._snapshot.now, self._snapshot.gates
        devices = self._devices
        out = _listed(sorted({d.unavailable for d in devices if d.unavailable}))
        if devices and all(d.unavailable for d in devices):
            return f"waiting: no device takes work ({out})"
        devices = [d for d in devices if not d.unavailable]
        closed_why = ""
        if gates is None:  # every device that is up takes every queue, for ever
            open_here = [(d, math.inf) for d in devices]
        else:
            open_here = []
            for d in devices:
                g = gates.get(d.key)
                if g is not None and job.queue not in g.open:
                    closed_why = closed_why or g.closed.get(job.queue, "")
                    continue
                open_here.append((d, g.open[job.queue].open_until if g is not None else math.inf))
        if not open_here:
            return f"waiting: {closed_why}" if closed_why else "waiting: no device is up"
        in_time = (
            open_here
            if gates is None
            else [(d, u) for d, u in open_here if fits_before_close(job, u, now)]
        )
        if not in_time:
            close, name = max((u, _closing(gates, d, job.queue)) for d, u in open_here)
            window = f"window {name!r}" if name else "its window"
            first = (
                f"its first checkpoint ({job.first_checkpoint_s:g}s) and "
                if job.first_checkpoint_s
                else ""
            )
            return (
                f"waiting: {first}its eviction deadline ({job.deadline_s:g}s) would not fit "
                f"before {window} closes at {clock_text(close)}"
            )
        if all(d.cooldown_until > now for d, _ in in_time):
            until = min(d.cooldown_until for d, _ in in_time)
            return f"waiting: devices cooling down after evictions until {clock_text(until)}"
        share = ""
        if gates is not None:
            share = " within the share the open windows allow"
        notes = []
        busy = self._busy_devices()
        # often the plain reason: the room is taken by other jobs (no count: a reason that
        # changes with every start is a write per waiting job)
        if all((d.node, d.index) in busy for d, _ in in_time):
            notes.append("every device runs other jobs' slices")
        # only the devices still cooling down get a name (not every device of a fleet)
        cooling = sorted(
            (d.cooldown_until, f"{d.node}/{d.index}") for d, _ in in_time if d.cooldown_until > now
        )
        if cooling:
            names = _listed([name for _, name in cooling])
            first_free = clock_text(cooling[0][0])
            notes.append(f"cooling down after an eviction: {names} until {first_free}")
        if out:
            notes.append(f"not taking work: {out}")
        # the least loaded device, the first by key among equals (as ``(compute, key)``)
        roomiest = min((d for d, _ in in_time), key=_LOAD_THEN_KEY)
        if roomiest.reserve_compute_pct >= 0.5 or roomiest.reserve_memory_mib >= 1:
            notes.append(_kept_back(roomiest))
        return share, "".join(f"; {n}" for n in notes)


_LOAD_THEN_KEY = attrgetter("online_compute_pct", "node", "index")


def _kept_back(d: DeviceView) -> str:
    """What the least loaded device keeps back for the online side's growth, in words."""
    text = (
        f"{d.node}/{d.index} keeps {d.reserve_compute_pct:.0f}% and "
        f"{format_mib(d.reserve_memory_mib)} back for the online side's growth"
    )
    if d.reserve_cold_for_s > 0:  # no countdown: a reason that changes every pass is a
        # write per waiting job per pass
        text += (
            " (the cold reserve, while its agent learns the online load: "
            "defaults.forecast_warmup_s)"
        )
    return text


def _listed(items: list[str], most: int = 3) -> str:
    """``a, b, c (+2 more)``."""
    shown = ", ".join(items[:most])
    return shown + (f" (+{len(items) - most} more)" if len(items) > most else "")
