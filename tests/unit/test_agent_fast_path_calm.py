"""The node agent's fast path skips a device that ``calm`` says needs nothing: checked
against the pure functions it stands for (:func:`relief_for_device`,
:func:`thaws_for_device`, :func:`restores_for_device`) on random devices and attempts.
And it skips every device in a tick whose :func:`calm_key` is that of the last tick that
found them all calm: checked against what ``calm`` says of each device of both ticks."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ebbtide.preemption.relief import relief_for_device, restores_for_device, thaws_for_device
from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins, PauseRules
from ebbtide.workers.agent import calm, calm_key, device_views
from ebbtide.workers.headroom.base import DeviceInfo, DeviceSample

from .builders import DEVICE_MIB, NOW, att, dev

MARGINS = Margins(compute_pct=5, memory_mib=2048)


def random_attempts(rng: random.Random) -> list[ActiveAttempt]:
    out = []
    for job in range(rng.randint(0, 6)):
        a = att(
            job + 1,
            devices=rng.choice([(0,), (1,), (0, 1)]),
            c=rng.choice([5, 10, 20, 30]),
            m=rng.choice([1024, 4096, 8192, 16384]),
            prio=rng.randint(0, 2),
            gpus=rng.choice([0, 0, 0, 1]),
            state=rng.choice([JobState.RUNNING] * 4 + [JobState.EVICTING]),
            started=NOW - rng.choice([1, 100, 3600]),
        )
        paused_at = rng.choice([None, None, None, NOW - 1, NOW - 10, NOW - 700])
        suspended_at = rng.choice([None, None, None, None, NOW - 10, NOW - 4000])
        out.append(
            dataclasses.replace(
                a,
                pausable=rng.random() < 0.7,
                paused_at=paused_at if suspended_at is None else suspended_at,
                suspended_at=suspended_at,
            )
        )
    return out


def random_device(rng: random.Random) -> DeviceView:
    """Device 0 or 1 of node ``n``, with online usage from idle to full."""
    return dev(
        i=rng.choice([0, 1]),
        oc=rng.choice([0, 20, 40, 60, 80, 95, 100]),
        om=rng.choice([0, 10_000, 40_000, 70_000, DEVICE_MIB - 4096, DEVICE_MIB]),
    )


@pytest.mark.parametrize("seed", range(20))
def test_a_calm_device_needs_no_action(seed: int) -> None:
    rng = random.Random(seed)
    said_calm = acted = 0
    for _ in range(300):
        device = random_device(rng)
        active = random_attempts(rng)
        rules = rng.choice(
            [PauseRules(), PauseRules(enabled=False), PauseRules(suspend=True, min_pause_s=5)]
        )
        needed = (
            relief_for_device(device, active, MARGINS, NOW, rules, None, lambda a: True)
            or thaws_for_device(device, active, MARGINS, NOW, rules)
            or restores_for_device(device, active, MARGINS, NOW, rules)
        )
        if calm(device, active, MARGINS):
            said_calm += 1
            assert not needed, (device, active, rules)
        acted += bool(needed)
    assert said_calm > 50 and acted > 50  # both sides were exercised


#: The node's two devices, for the ticks below.
DEVICES = [DeviceInfo(index=0, memory_mib=DEVICE_MIB), DeviceInfo(index=1, memory_mib=DEVICE_MIB)]


def random_samples(rng: random.Random, at: float) -> list[DeviceSample]:
    """A tick's samples at ``at``: each device's (or one of them, or none), with online
    usage from a few values, some of them planning-only."""
    indices = rng.choice([[0, 1], [0, 1], [0, 1], [1, 0], [0], [1], []])
    return [
        DeviceSample(
            index=i,
            time=at,
            online_compute_pct=float(rng.choice([0, 0, 40, 80, 100])),
            online_memory_mib=float(rng.choice([0, 40_000, DEVICE_MIB - 4096])),
            eviction_trigger=rng.random() < 0.9,
        )
        for i in indices
    ]


def next_tick(
    rng: random.Random, latest: list[DeviceSample], active: list[ActiveAttempt]
) -> tuple[list[DeviceSample], list[ActiveAttempt], Margins]:
    """The next tick: most often the same figures at a later time and the same attempts
    (the same views, or equal ones made again); else some of it drawn anew."""
    later = latest[0].time + 0.05 if latest else NOW
    if rng.random() < 0.8:
        samples = [dataclasses.replace(s, time=later) for s in latest]
        if samples and rng.random() < 0.2:  # one figure of one device changes
            k = rng.randrange(len(samples))
            samples[k] = dataclasses.replace(
                samples[k],
                **rng.choice(
                    [
                        {"eviction_trigger": not samples[k].eviction_trigger},
                        {"online_compute_pct": float(rng.choice([0, 40, 80, 100]))},
                        {"online_memory_mib": float(rng.choice([0, 40_000, DEVICE_MIB]))},
                    ]
                ),
            )
    else:
        samples = random_samples(rng, later)
    if rng.random() < 0.8:
        attempts = list(active) if rng.random() < 0.5 else [dataclasses.replace(a) for a in active]
    else:
        attempts = random_attempts(rng)
    margins = MARGINS if rng.random() < 0.9 else Margins(compute_pct=0, memory_mib=0)
    return samples, attempts, margins


def verdicts(
    latest: list[DeviceSample], active: list[ActiveAttempt], margins: Margins
) -> list[bool]:
    """Per device, whether the fast path leaves it alone (planning-only, or calm)."""
    return [
        view.planning_only or calm(view, active, margins)
        for view in device_views("n", DEVICES, latest)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_a_tick_with_the_key_of_an_all_calm_one_is_all_calm(seed: int) -> None:
    rng = random.Random(seed)
    latest, active, margins = random_samples(rng, NOW), random_attempts(rng), MARGINS
    all_calm_at = None
    skipped = looked = 0
    for _ in range(500):
        latest, active, margins = next_tick(rng, latest, active)
        key = calm_key(latest, active, margins)
        found = verdicts(latest, active, margins)
        if key == all_calm_at:
            skipped += 1
            assert all(found), (latest, active, margins)
        else:
            looked += 1
            all_calm_at = key if all(found) else None
    assert skipped > 10 and looked > 100  # both sides were exercised
