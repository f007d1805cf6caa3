"""What the simulated scheduler hands the planner: device views, and only the devices a
pass could act on.

A planner pass costs time in proportion to the devices and attempts in its snapshot.  Of
a packed fleet, most devices can neither take a job nor need an eviction, and leaving them
out changes no decision:

- the planner places a job only where the headroom (capacity − online − reserve − margin
  − slices, :func:`ebbtide.scheduling.capacity.headroom`) covers the slice, and a whole-GPU
  job only on a device with no slice; so a device with a slice and less headroom than the
  smallest queued fractional job, in compute or in memory, takes nothing;
- the planner evicts only where online usage plus slices exceed capacity minus the margin
  (:func:`ebbtide.scheduling.capacity.overflow`), or where a slice has been paused longer
  than ``max_pause_s`` (:func:`ebbtide.preemption.relief.relief_for_device`; time alone
  makes that true, so it is checked on every pass, outside the cache).

:func:`candidates` keeps every other device, with its attempts; best fit among the devices
kept is best fit among all.  Under a policy file's windows the planner also evicts where a
slice's window is closed, due for a drain, or over the open windows' share
(:func:`window_bound`); those devices are kept too, and gates only ever shrink headroom.
``Simulation(debug=True)`` checks this on every pass by
planning the full snapshot as well and comparing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ebbtide.scheduling.admission import device_share
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, headroom, overflow
from ebbtide.scheduling.snapshot import DeviceView, Margins
from ebbtide.scheduling.windows import DeviceGates
from ebbtide.sim.state import SimDevice
from ebbtide.sim.windows import drain_due

#: The planner's fit slack, in percent or MiB (a job fits headroom this much smaller).
FIT_SLACK = 1e-6


def device_view(dev: SimDevice, *, watch_compute: bool, now: float) -> DeviceView:
    """The device as the scheduler last heard of it (cached until it changes)."""
    if dev.view is None:
        dev.view = DeviceView(
            node=dev.node,
            index=0,
            memory_mib=dev.memory_mib,
            online_compute_pct=dev.seen_c if watch_compute else 0.0,
            online_memory_mib=dev.seen_m,
            reserve_compute_pct=dev.reserve[0],
            reserve_memory_mib=dev.reserve[1],
            sampled_at=now,
            cooldown_until=dev.cooldown_until,
        )
    return dev.view


def candidates(
    devices: Iterable[SimDevice],
    margins: Margins,
    *,
    smallest: tuple[float, float],
    watch_compute: bool,
    checkpoint_aware: bool,
    now: float,
    max_pause_s: float = math.inf,
) -> list[SimDevice]:
    """The present devices a pass could place a job on or evict from (see the module
    docstring).  ``smallest``: the least compute and the least memory of any queued
    fractional job (``inf`` when there is none); ``max_pause_s``: how long a slice may
    stay paused."""
    out = []
    for dev in devices:
        if not (dev.present and dev.reported):
            continue
        key = (dev.changed, smallest)
        if dev.candidate_key != key:
            dev.candidate_key = key
            dev.candidate = _could_act(dev, margins, smallest, watch_compute, checkpoint_aware, now)
        if dev.candidate or (dev.paused_n and paused_too_long(dev, now, max_pause_s)):
            out.append(dev)
    return out


def paused_too_long(dev: SimDevice, now: float, max_pause_s: float) -> bool:
    """Whether a slice on ``dev`` has been paused ``max_pause_s`` or longer."""
    return any(
        a.paused_at is not None and now - a.paused_at >= max_pause_s for a in dev.attempts.values()
    )


def window_bound(
    dev: SimDevice, gates: Mapping[tuple[str, int], DeviceGates], queue: str, now: float
) -> bool:
    """Whether the windows have the planner evict on ``dev`` now: a slice held where its
    queue's window is closed, or due for a drain before the close, or more slices than
    the share the open windows allow."""
    if not dev.attempts:
        return False
    g = gates.get((dev.node, 0))
    if g is None:
        return False
    q = g.open.get(queue)
    if q is None:
        return True
    if math.isfinite(q.open_until) and any(
        now >= drain_due(q.open_until, a.job.spec.deadline_s) for a in dev.attempts.values()
    ):
        return True
    share = device_share(g)
    alloc_c = sum(a.job.spec.compute_pct for a in dev.attempts.values())
    alloc_m = sum(a.job.spec.memory_mib for a in dev.attempts.values())
    return alloc_c > share * DEVICE_COMPUTE_PCT + FIT_SLACK or alloc_m > (
        share * dev.memory_mib + FIT_SLACK
    )


def _could_act(
    dev: SimDevice,
    margins: Margins,
    smallest: tuple[float, float],
    watch_compute: bool,
    checkpoint_aware: bool,
    now: float,
) -> bool:
    if not dev.attempts:
        return True
    view = device_view(dev, watch_compute=watch_compute, now=now)
    alloc_c = sum(a.job.spec.compute_pct for a in dev.attempts.values())
    c, m = headroom(view, alloc_c, dev.held_m, margins)
    if c + FIT_SLACK >= smallest[0] and m + FIT_SLACK >= smallest[1]:
        return True
    views = [a.active_view(checkpoint_aware) for a in dev.attempts.values()]
    over_c, over_m = overflow(view, views, margins)
    return over_c > 0 or over_m > 0
