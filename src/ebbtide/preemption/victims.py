"""Victim selection: pure, shared by the scheduler, the agent's fast path and the simulator.

When online usage plus offline slices on a device exceed capacity minus the margin, the
victims are taken in this order: lowest priority first; then the least work lost since
the last checkpoint; then the most recently started.  Attempts already being evicted
count as freed (an in-flight set: nobody is evicted twice), and after picking, any victim
the others already cover is spared, so the set is minimal in that order.

When only compute is short and the victims are to be paused (the graduated response, see
:mod:`ebbtide.preemption.relief`), :func:`pause_victims` picks instead: a pause loses no
work, but the compute it stops beyond the need stays idle until the thaw, so within a
priority it takes the set that covers the need with the least to spare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import groupby

from ebbtide.preemption.cover import smallest_cover
from ebbtide.scheduling.capacity import on_device, overflow
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins
from ebbtide.units import format_mib


class EvictReason(StrEnum):
    ONLINE_MEMORY = "online_memory"
    ONLINE_COMPUTE = "online_compute"
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"
    WINDOW_CLOSING = "window_closing"  # drained so the slice is free by the close
    WINDOW_CLOSED = "window_closed"  # no open window admits it here any more
    SHARE = "offline_share"  # over the share the open windows allow
    GPU_FAULT = "gpu_fault"  # the device failed (an XID, off the bus): moved, not counted
    PAUSED_TOO_LONG = "paused_too_long"  # paused past max_pause_s: moved to run elsewhere
    SUSPENDED_TOO_LONG = "suspended_too_long"  # suspended past max_suspend_s: moved
    # taken back by the cluster, not by ebbtide (the Kubernetes executor observes these):
    KUBE_PREEMPTED = "kube_preempted"  # the kube-scheduler preempted it for a pod of its own
    NODE_PRESSURE = "node_pressure"  # the kubelet evicted it: the node ran short of memory


#: Evictions after which a device cools down (``eviction_cooldown_s``): online pressure.  A
#: cancel, a window's close, a move, a fault or a shutdown says nothing about the online
#: side's next spike.  The node agent and the simulator both apply it.
COOLDOWN_REASONS = frozenset({EvictReason.ONLINE_MEMORY, EvictReason.ONLINE_COMPUTE})


@dataclass(frozen=True)
class Eviction:
    """A decision to take an attempt's slice back."""

    job_id: int
    attempt: int
    node: str
    reason: EvictReason
    #: the longest time from now until the slice is free, in seconds
    deadline_s: float
    #: a sentence a person can act on
    message: str


def compute_used(a: ActiveAttempt) -> float:
    """The compute an attempt's slice uses, in percent: none for a whole-GPU slice (it
    yields to online work), a paused or a suspended one."""
    return a.compute_pct if a.gpus == 0 and not a.paused and not a.suspended else 0.0


def memory_used(a: ActiveAttempt) -> float:
    """The GPU memory an attempt's slice uses, in MiB: none for a suspended one (its
    memory is on the host)."""
    return 0.0 if a.suspended else float(a.memory_mib)


def victim_order_key(a: ActiveAttempt, now: float) -> tuple[int, float, float]:
    started = a.started_at or a.dispatched_at
    return (a.priority, a.lost_work_s(now), -started)


def select_victims(
    active: Sequence[ActiveAttempt],
    need_compute: float,
    need_memory: float,
    now: float,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
) -> list[ActiveAttempt]:
    """The attempts to evict so that ``need_compute`` % and ``need_memory`` MiB come free.

    Protected attempts (not preemptible, or inside their queue's min-runtime) are never
    taken for compute, and taken for memory only after every unprotected one.
    """
    need_c, need_m = need_compute, need_memory
    for a in active:
        if a.evicting:
            need_c -= compute_used(a)
            need_m -= memory_used(a)
    if need_c <= 0 and need_m <= 0:
        return []
    guarded = {id(a) for a in active if is_protected is not None and is_protected(a)}
    candidates = sorted(
        (a for a in active if not a.evicting),
        key=lambda a: (id(a) in guarded, *victim_order_key(a, now)),
    )
    picked: list[ActiveAttempt] = []
    got_c = got_m = 0.0
    for a in candidates:
        if got_c >= need_c and got_m >= need_m:
            break
        gives_c = compute_used(a)
        for_compute = got_c < need_c and gives_c > 0 and id(a) not in guarded
        useful = for_compute or (got_m < need_m and memory_used(a) > 0)
        if not useful:
            continue
        picked.append(a)
        got_c += gives_c
        got_m += memory_used(a)
    # spare, latest pick first, any victim the others already cover
    for a in list(reversed(picked)):
        rest = [p for p in picked if p is not a]
        c = sum(compute_used(p) for p in rest)
        m = sum(memory_used(p) for p in rest)
        if c >= need_c and m >= need_m:
            picked = rest
    return picked


def evictions_for_device(
    device: DeviceView,
    active: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
) -> list[Eviction]:
    """Evictions that bring ``device`` back within capacity minus the margin."""
    here = on_device(device, active)
    over_c, over_m = overflow(device, here, margins)
    if over_c <= 0 and over_m <= 0:
        return []
    where = f"{device.node}/{device.index}"
    parts = []
    if over_m > 0:
        parts.append(
            f"online memory on {where} rose to {format_mib(device.online_memory_mib)}; "
            f"offline slices must free {format_mib(over_m)} "
            f"(margin {format_mib(margins.memory_mib)})"
        )
    if over_c > 0:
        parts.append(
            f"online compute on {where} rose to {device.online_compute_pct:.0f}%; "
            f"offline slices must free {over_c:.1f}% (margin {margins.compute_pct:g}%)"
        )
    reason = EvictReason.ONLINE_MEMORY if over_m > 0 else EvictReason.ONLINE_COMPUTE
    message = "; and ".join(parts)
    return [
        Eviction(a.job_id, a.attempt, a.node, reason, a.deadline_s, message)
        for a in select_victims(here, over_c, over_m, now, is_protected)
    ]


def pause_victims(
    active: Sequence[ActiveAttempt],
    need_compute: float,
    now: float,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
) -> list[ActiveAttempt]:
    """The attempts to stop so that ``need_compute`` % of compute comes free, when only
    compute is short: lowest priority first, and within a priority those that may pause
    before those that would have to be evicted (the cheaper action); within each such
    pausable group the set whose compute covers what is still needed with the least to
    spare, then the fewest attempts, then the victim order (:func:`victim_order_key`);
    those to be evicted are taken in the victim order, as :func:`select_victims` takes
    them (work since the last checkpoint is lost).  Then, as there, any victim the others
    already cover is spared, latest pick first; with no pausable attempt the pick is
    :func:`select_victims`'s own.

    Unlike an eviction, a pause loses no work, so the work since the last checkpoint is
    no reason to pick one attempt over another; what a pause does cost is the compute it
    stops beyond the need: a paused slice keeps its compute reserved (it is thawed in
    place), so that surplus stays idle until the thaw.  Attempts already being evicted
    count as freed; protected attempts are never taken for compute; whole-GPU slices free
    none.
    """
    need = need_compute
    candidates = []
    for a in active:
        used = compute_used(a)
        if a.evicting:
            need -= used
        elif used > 0 and (is_protected is None or not is_protected(a)):
            candidates.append(a)
    if need <= 0 or not candidates:
        return []
    if len(candidates) == 1:
        return candidates
    # every candidate uses compute, so what it gives is its compute_pct (compute_used)
    candidates.sort(key=lambda a: (a.priority, not a.pausable, *victim_order_key(a, now)))
    picked: list[ActiveAttempt] = []
    left = need
    for (_, pausable), group in groupby(candidates, key=lambda a: (a.priority, a.pausable)):
        if left <= 0:
            break
        members = list(group)
        if pausable:
            chosen = smallest_cover(members, left)
        else:  # evicted: in the victim order, as select_victims takes them
            chosen, got = [], 0.0
            for a in members:
                if got >= left:
                    break
                chosen.append(a)
                got += a.compute_pct
        picked += chosen
        left -= sum(a.compute_pct for a in chosen)
    # spare, latest pick first, any victim the others already cover (as select_victims)
    for a in list(reversed(picked)):
        rest = [p for p in picked if p is not a]
        if sum(p.compute_pct for p in rest) >= need:
            picked = rest
    return picked
