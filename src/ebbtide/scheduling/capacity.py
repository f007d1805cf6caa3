"""Capacity arithmetic shared by the planner, the agent's fast path and the simulator.

A device has 100 compute units (percent of SMs) and its memory.  Headroom is
capacity − online usage − expected online growth − safety margin − offline slices.
A whole-GPU slice (``gpus >= 1``) holds the device's compute exclusively for offline
work, but yields to online compute without eviction (only memory forces it out).  A paused
slice holds its compute for admission (it is thawed in place before new work goes there)
but uses none: it never adds to an overflow.  A suspended slice (its CUDA state moved to
host memory) holds both for admission, so that it can be restored in place, but uses
neither.
"""

from __future__ import annotations

from collections.abc import Iterable

from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins

#: Compute capacity of one device, in percent.
DEVICE_COMPUTE_PCT = 100.0


def on_device(device: DeviceView, active: Iterable[ActiveAttempt]) -> list[ActiveAttempt]:
    """The attempts of ``active`` whose slices are on ``device``."""
    return [a for a in active if a.node == device.node and device.index in a.devices]


def allocated(device: DeviceView, active: Iterable[ActiveAttempt]) -> tuple[float, float]:
    """Compute (percent) and memory (MiB) that offline slices hold on ``device``."""
    here = on_device(device, active)
    return sum((a.compute_pct for a in here), 0.0), sum((a.memory_mib for a in here), 0.0)


def headroom(
    device: DeviceView, alloc_compute: float, alloc_memory: float, margins: Margins
) -> tuple[float, float]:
    """Compute and memory still free for new offline slices (may be negative)."""
    compute = (
        DEVICE_COMPUTE_PCT
        - device.online_compute_pct
        - device.reserve_compute_pct
        - margins.compute_pct
        - alloc_compute
    )
    memory = (
        device.memory_mib
        - device.online_memory_mib
        - device.reserve_memory_mib
        - margins.memory_mib
        - alloc_memory
    )
    return compute, memory


def within(device: DeviceView, compute: float, memory: float, margins: Margins) -> bool:
    """Whether online usage plus offline slices using ``compute`` percent (fractional
    slices, running) and ``memory`` MiB fit ``device``'s capacity minus the margin: whether
    :func:`overflow` of those slices is (0, 0).  For checks that sum the slices their own
    way (the planner's and the simulator's calm devices)."""
    over_c = device.online_compute_pct + compute - (DEVICE_COMPUTE_PCT - margins.compute_pct)
    over_m = device.online_memory_mib + memory - (device.memory_mib - margins.memory_mib)
    return (compute <= 0 or over_c <= 0) and over_m <= 0


def overflow(
    device: DeviceView, active: Iterable[ActiveAttempt], margins: Margins
) -> tuple[float, float]:
    """How much offline compute and memory must leave ``device`` (0 when none).

    Online usage plus offline slices may not exceed capacity minus the margin.  The
    expected-growth reserve is not counted here: it guards admission, not eviction.
    Whole-GPU slices yield compute to online work, so only their memory counts; so do
    paused slices (they hold their memory and use no compute).  Suspended slices count
    for nothing: their memory is on the host.
    """
    compute = memory = 0.0
    node, index = device.node, device.index
    # on_device() and the slices' properties written out: this runs at every sample of
    # every device (the node agent's and the simulator's), summing in the same order
    for a in active:
        if a.node != node or index not in a.devices:
            continue
        if a.suspended_at is None:
            memory += a.memory_mib
            if a.gpus == 0 and a.paused_at is None:  # a paused slice uses no compute
                compute += a.compute_pct
    # as within() reckons it, written out
    over_c = device.online_compute_pct + compute - (DEVICE_COMPUTE_PCT - margins.compute_pct)
    over_m = device.online_memory_mib + memory - (device.memory_mib - margins.memory_mib)
    # compute overflow only matters while some fractional slice can give it back
    return (max(0.0, over_c) if compute > 0 else 0.0), max(0.0, over_m)
