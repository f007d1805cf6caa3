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
  makes that true, so it is checked on every pass, outside the cache);
- where only compute is over and every slice may pause (the policy pauses), the relief
  pauses and evicts nothing, and a pause is the node agent's to make: the planner decides
  nothing there (its compute headroom is below zero, so it places nothing either).

:class:`Candidates` keeps every other device, with its attempts; best fit among the devices
kept is best fit among all.  Under a policy file's windows the planner also evicts where a
slice's window is closed, due for a drain, or over the open windows' share
(:func:`window_bound`); those devices are kept too, and gates only ever shrink headroom.

The candidates are kept incrementally, so that a pass costs in proportion to the devices
that changed since the last one, not to the fleet (``--tile``): the engine calls
:meth:`Candidates.touch` whenever what the scheduler sees of a device changes, and only
the devices touched are judged again (where every slice may pause, a pause or a thaw
alone changes no candidacy: :meth:`Candidates.pause_changed`); a device with paused
slices waits in a heap until the first of them may have been paused too long.
``Simulation(debug=True)`` checks all this on every pass by planning the full snapshot as
well and comparing.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from ebbtide.scheduling.admission import device_share
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, headroom, overflow, within
from ebbtide.scheduling.planner import MIN_WHOLE_GPU_HEADROOM_PCT
from ebbtide.scheduling.snapshot import DeviceGates, DeviceView, Margins
from ebbtide.sim.backlog import Shape
from ebbtide.sim.state import SimDevice
from ebbtide.sim.windows import drain_due

#: The planner's fit slack, in percent or MiB (a job fits headroom this much smaller).
FIT_SLACK = 1e-6
#: :func:`placeable` keeps a job that misses fitting by this much, in percent or MiB, so
#: that float rounding never leaves out one the planner would have placed.
KEEP_SLACK = 1e-3
#: A pause falls due this close to a pass's instant is checked again, in seconds (float
#: rounding of ``paused_at + max_pause_s`` against ``now - paused_at``).
_DUE_SLACK_S = 1e-6


def device_view(dev: SimDevice, *, watch_compute: bool, now: float) -> DeviceView:
    """The device as the scheduler last heard of it (cached until it changes)."""
    if dev.view is None:
        dev.view = dev.view_with(
            online_compute_pct=dev.seen_c if watch_compute else 0.0,
            online_memory_mib=dev.seen_m,
            reserve_compute_pct=dev.reserve[0],
            reserve_memory_mib=dev.reserve[1],
            sampled_at=now,
            cooldown_until=dev.cooldown_until,
        )
    return dev.view


class Candidates:
    """The present devices a pass could place a job on or evict from (see the module
    docstring), kept up to date from the devices touched since the last pass."""

    def __init__(self, devices: Sequence[SimDevice]) -> None:
        self._devices = devices
        #: devices touched since the last pass (their candidacy is judged again)
        self._touched: set[int] = set(range(len(devices)))
        #: devices where only which slices are paused changed since the last pass
        self._pause_changed: set[int] = set()
        #: devices that could act, by index, as of the last pass
        self._could: set[int] = set()
        #: (when a slice there may first have been paused too long, device index): at
        #: most one entry a device, never later than its first pause's due time (see
        #: :meth:`pick`)
        self._due: list[tuple[float, int]] = []
        #: devices with an entry in ``_due``
        self._due_held: set[int] = set()
        #: devices with a slice paused too long, as of the last pass
        self._overdue: set[int] = set()
        self._smallest: tuple[float, float] | None = None

    def touch(self, dev: SimDevice) -> None:
        """What the scheduler sees of ``dev`` changed: its usage, its slices, its presence."""
        self._touched.add(dev.k)

    def pause_changed(self, dev: SimDevice) -> None:
        """Only which of ``dev``'s slices are paused changed, under a policy where every
        slice may pause (``pick(pausing=True)``): neither its headroom nor its memory
        shortfall moved, so whether it could act stands (a compute shortfall alone is not
        a reason to act there); only when its first pause may run too long is read again."""
        self._pause_changed.add(dev.k)

    def pick(
        self,
        margins: Margins,
        *,
        smallest: tuple[float, float],
        watch_compute: bool,
        checkpoint_aware: bool,
        now: float,
        max_pause_s: float = math.inf,
        pausing: bool = False,
    ) -> list[SimDevice]:
        """The candidates now, in fleet order.  ``smallest``: the least compute and the
        least memory of any queued fractional job (``inf`` when there is none);
        ``max_pause_s``: how long a slice may stay paused; ``pausing``: every slice may
        pause, so a compute shortfall alone is relieved by pauses (both constant over a
        run)."""
        devices = self._devices
        if smallest != self._smallest:  # every device's headroom is judged anew
            self._smallest = smallest
            self._touched.update(range(len(devices)))
        touched, self._touched = self._touched, set()
        for k in touched:
            dev = devices[k]
            if (
                dev.present
                and dev.reported
                and _could_act(
                    dev, margins, smallest, watch_compute, checkpoint_aware, now, pausing
                )
            ):
                self._could.add(k)
            else:
                self._could.discard(k)
        due_list, held = self._due, self._due_held
        if max_pause_s < math.inf:
            # A device's first pause only ever moves later (a new pause is now; a thaw, an
            # eviction or an end takes one away), so an entry held for it is never later
            # than its due time: none is added then, and the entry, once it falls due,
            # is replaced by one for the first pause there as it is by then.
            for k in touched | self._pause_changed:
                if k not in held and devices[k].paused_n:
                    heapq.heappush(due_list, (_first_due(devices[k], max_pause_s), k))
                    held.add(k)
        self._pause_changed = set()
        self._overdue = {
            k for k in self._overdue if _paused_too_long_here(devices[k], now, max_pause_s)
        }
        later = []
        while due_list and due_list[0][0] <= now + _DUE_SLACK_S:
            _, k = heapq.heappop(due_list)
            held.discard(k)
            dev = devices[k]
            if _paused_too_long_here(dev, now, max_pause_s):
                self._overdue.add(k)
            elif dev.paused_n and (first := _first_due(dev, max_pause_s)) > now - _DUE_SLACK_S:
                # due now but for rounding, or a later pause's turn: look again then
                later.append((first, k))
        for entry in later:
            heapq.heappush(due_list, entry)
            held.add(entry[1])
        return [devices[k] for k in sorted(self._could | self._overdue)]


def _first_due(dev: SimDevice, max_pause_s: float) -> float:
    """When ``dev``'s first paused slice will have been paused ``max_pause_s``."""
    first = min(a.paused_at for a in dev.attempts.values() if a.paused_at is not None)
    return first + max_pause_s


def _paused_too_long_here(dev: SimDevice, now: float, max_pause_s: float) -> bool:
    return dev.present and dev.reported and paused_too_long(dev, now, max_pause_s)


def placeable(
    devs: Sequence[SimDevice],
    headroom_of: Callable[[SimDevice], tuple[float, float]],
) -> Callable[[Shape], bool]:
    """Whether a queued job of a shape (compute, memory, gpus) fits the headroom of some
    device of ``devs`` before the pass decides anything (``headroom_of``): a fractional job
    where compute and memory cover it, a whole-GPU job where ``gpus`` devices of one node
    hold no slice and have :data:`~ebbtide.scheduling.planner.MIN_WHOLE_GPU_HEADROOM_PCT`
    of compute and its memory free.  A pass only ever shrinks headroom (a placement, an
    eviction decided, a cooldown, a window's share), so the others fit nowhere all pass:
    the planner would skip them, and leaving them out changes no decision (``KEEP_SLACK``
    errs on keeping).  Asked once a group of the backlog (:meth:`Backlog.heads`), not
    once a job; the headroom is read at once."""
    rooms = [(dev, *headroom_of(dev)) for dev in devs]
    known: dict[Shape, bool] = {}

    def fits(shape: Shape) -> bool:
        ok = known.get(shape)
        if ok is None:
            compute, memory, gpus = shape
            if gpus:
                empty = Counter(
                    dev.node
                    for dev, c, m in rooms
                    if not dev.attempts
                    and c + KEEP_SLACK >= MIN_WHOLE_GPU_HEADROOM_PCT
                    and m + KEEP_SLACK >= memory
                )
                ok = max(empty.values(), default=0) >= gpus
            else:
                ok = any(
                    c + KEEP_SLACK >= compute and m + KEEP_SLACK >= memory for _, c, m in rooms
                )
            known[shape] = ok
        return ok

    return fits


def surely_calm(view: DeviceView, dev: SimDevice, margins: Margins) -> bool:
    """Whether the planner has no relief to reckon on ``dev`` (seen as ``view``): no slice
    there is paused, and online usage plus the slices' compute and memory, summed in the
    planner's order, fit capacity minus the margin (as the planner judges a device calm,
    :mod:`ebbtide.scheduling.planner`).  A pass with no queued job and only calm devices
    decides nothing."""
    compute = memory = 0.0
    for a in dev.attempts.values():
        if a.paused_at is not None:
            return False
        spec = a.job.spec
        memory += spec.memory_mib
        if spec.gpus == 0:
            compute += spec.compute_pct
    return within(view, compute, memory, margins)


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
    alloc_c = dev.alloc_c()
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
    pausing: bool = False,
) -> bool:
    if not dev.attempts:
        return True
    view = device_view(dev, watch_compute=watch_compute, now=now)
    c, m = headroom(view, dev.alloc_c(), dev.held_m, margins)
    if c + FIT_SLACK >= smallest[0] and m + FIT_SLACK >= smallest[1]:
        return True
    if dev.surely_within(view.online_compute_pct, view.online_memory_mib, margins):
        return False
    views = [a.view or a.active_view(checkpoint_aware) for a in dev.attempts.values()]
    over_c, over_m = overflow(view, views, margins)
    return over_m > 0 or (over_c > 0 and not pausing)
