"""A larger fleet from a recorded one (``ebb sim --tile N``): the online devices repeated
``N`` times, each copy shifted in time, and the offline stream repeated with them.

Copy 0 is the recorded fleet as it is (``--tile 1`` changes nothing).  Copy ``c`` ≥ 1 has
a phase ``φ_c`` drawn uniformly from ``[0, TILE_MAX_PHASE_S)`` by a generator seeded with
``"{seed}:tile"`` (the same seed gives the same phases, whatever else changes), and each of
its devices replays the recorded device's usage ``φ_c`` later, cyclically within the
device's own presence: a device present over ``[start, end)`` is present over the same
span in every copy, and what it used at ``start + x`` the copy uses at
``start + (x + φ_c) mod (end − start)``.  So every copy has the same device-hours and the
same online GPU-hours as the recorded fleet, the fleet keeps the day's shape (busy and
quiet at the same hours, as a fleet serving one region is), and the copies' minute-scale
spikes fall at different instants rather than in lockstep.  Copy ``c`` of device ``name``
is named ``name/c``.

The offline stream is repeated ``N`` times as well (copy ``c`` of job ``key`` has key
``c × len(stream) + key``, the same arrival and shape), so that ``--load trace`` brings
``N`` times the arrivals to ``N`` times the devices.  A backlogged queue is the stream
repeated without end anyway: there the copies change only the jobs' ids.
"""

from __future__ import annotations

import random
from dataclasses import replace

from ebbtide.sim.jobs import SimJob
from ebbtide.sim.online import DeviceLoad, OnlineLoad, merge_steps

#: Most copies ``--tile`` takes (143 GenAI devices × 1,000 = 143,000 GPUs).
TILE_MAX = 1000
#: Copies are shifted by a phase below this, in seconds (one hour).
TILE_MAX_PHASE_S = 3600.0


def tile_phases(copies: int, *, seed: int) -> list[float]:
    """The phase of each copy, in seconds: 0 for copy 0, then seeded draws."""
    if not 1 <= copies <= TILE_MAX:
        raise ValueError(f"tile: expected 1 to {TILE_MAX} copies, not {copies}")
    rng = random.Random(f"{seed}:tile")
    return [0.0] + [round(rng.uniform(0.0, TILE_MAX_PHASE_S), 3) for _ in range(copies - 1)]


def shift_device(dev: DeviceLoad, phase_s: float, name: str) -> DeviceLoad:
    """``dev``'s usage ``phase_s`` later, cyclically within its presence (same span)."""
    start, life = dev.start_s, dev.end_s - dev.start_s
    shift = phase_s % life if life > 0 else 0.0
    if shift == 0.0:
        return replace(dev, name=name)
    # the recorded step in force at start + life − shift is what the copy starts with
    cut = start + life - shift
    i = 0
    while i + 1 < len(dev.times_s) and dev.times_s[i + 1] <= cut:
        i += 1
    points = [(start, dev.compute_pct[i], dev.memory_mib[i])]
    for t, c, m in zip(dev.times_s, dev.compute_pct, dev.memory_mib, strict=True):
        moved = start + (t - start + shift) % life
        if moved > start and t < dev.end_s:  # (a step at or after the end never holds)
            points.append((moved, c, m))
    points.sort(key=lambda p: p[0])
    times, comp, mem = merge_steps(
        [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]
    )
    return DeviceLoad(name, times, comp, mem, dev.end_s)


def tile_load(load: OnlineLoad, copies: int, *, seed: int) -> OnlineLoad:
    """``load``'s devices repeated ``copies`` times, copy ``c`` shifted by its phase (see
    the module docstring); ``copies`` 1 returns ``load`` itself."""
    phases = tile_phases(copies, seed=seed)
    if copies == 1:
        return load
    devices = list(load.devices)
    for c, phase in enumerate(phases[1:], start=1):
        devices += [shift_device(d, phase, f"{d.name}/{c}") for d in load.devices]
    return replace(load, devices=tuple(devices))


def tile_stream(stream: list[SimJob], copies: int) -> list[SimJob]:
    """``stream`` repeated ``copies`` times, copy ``c`` of job ``key`` keyed
    ``c × len(stream) + key`` (in arrival order, copies of one job together)."""
    if copies == 1:
        return stream
    size = len(stream)
    tiled = [replace(j, key=c * size + j.key) for j in stream for c in range(copies)]
    return tiled
