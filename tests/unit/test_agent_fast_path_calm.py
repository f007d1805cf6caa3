"""The node agent's fast path skips a device that ``calm`` says needs nothing: checked
against the pure functions it stands for (:func:`relief_for_device`,
:func:`thaws_for_device`, :func:`restores_for_device`) on random devices and attempts."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ebbtide.preemption.relief import relief_for_device, restores_for_device, thaws_for_device
from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins, PauseRules
from ebbtide.workers.agent import calm

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
