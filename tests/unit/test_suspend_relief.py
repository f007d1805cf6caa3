"""Suspend to host, pure: memory shortage suspends what can be, restores with hysteresis."""

from __future__ import annotations

import dataclasses

import pytest

from ebbtide.preemption.relief import (
    relief_for_device,
    restores_for_device,
    thaws_for_device,
)
from ebbtide.preemption.victims import compute_used, memory_used, select_victims
from ebbtide.scheduling.capacity import overflow
from ebbtide.scheduling.snapshot import ActiveAttempt, Margins, PauseRules

from .builders import DEVICE_MIB, NOW, att, dev

RULES = PauseRules(
    max_pause_s=600,
    thaw_hysteresis_pct=10,
    min_pause_s=5,
    suspend=True,
    max_suspend_s=1800,
    restore_hysteresis_mib=4096,
)
MARGINS = Margins(compute_pct=5, memory_mib=2048)


def pausable(a: ActiveAttempt) -> ActiveAttempt:
    return dataclasses.replace(a, pausable=True)


def suspended(a: ActiveAttempt, at: float) -> ActiveAttempt:
    return dataclasses.replace(a, pausable=True, paused_at=at, suspended_at=at)


def anyone(a: ActiveAttempt) -> bool:
    return True


def acts(reliefs) -> list[tuple[int, str, str]]:  # type: ignore[no-untyped-def]
    return [(r.job_id, r.kind.value, r.reason.value) for r in reliefs]


#: online memory that leaves room for no offline slice (capacity minus the margin)
FULL_MIB = DEVICE_MIB - 2048


@pytest.mark.parametrize(
    ("device", "active", "rules", "can_suspend", "expected"),
    [
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [pausable(att(1, c=30, m=4096))],
            RULES,
            anyone,
            [(1, "suspend", "online_memory")],
            id="memory-short-suspends-what-can-be",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [pausable(att(1, c=30, m=4096))],
            RULES,
            None,
            [(1, "evict", "online_memory")],
            id="no-say-from-the-node-evicts-as-before",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [pausable(att(1, c=30, m=4096))],
            RULES,
            lambda a: False,
            [(1, "evict", "online_memory")],
            id="the-node-cannot-or-the-move-misses-the-deadline-evicts",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [pausable(att(1, c=30, m=4096))],
            dataclasses.replace(RULES, suspend=False),
            anyone,
            [(1, "evict", "online_memory")],
            id="suspend-off-evicts",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [pausable(att(1, c=30, m=4096))],
            dataclasses.replace(RULES, enabled=False),
            anyone,
            [(1, "evict", "online_memory")],
            id="pausing-off-evicts",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [att(1, c=30, m=4096)],
            RULES,
            anyone,
            [(1, "evict", "online_memory")],
            id="an-attempt-that-may-not-pause-is-evicted",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB - 4096),
            [pausable(att(1, c=30, m=4096)), pausable(att(2, c=10, m=4096, prio=5))],
            RULES,
            lambda a: a.job_id == 2,
            [(1, "evict", "online_memory")],
            id="the-victim-order-is-unchanged-suspension-only-replaces-the-eviction",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB - 4096),
            [dataclasses.replace(pausable(att(1, c=30, m=4096)), paused_at=NOW - 10)],
            RULES,
            anyone,
            [],
            id="a-paused-attempt-whose-memory-fits-stays-paused",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [dataclasses.replace(pausable(att(1, c=30, m=4096)), paused_at=NOW - 10)],
            RULES,
            anyone,
            [(1, "suspend", "online_memory")],
            id="a-paused-attempt-is-suspended-when-memory-runs-short",
        ),
        pytest.param(
            dev(oc=99, om=FULL_MIB),
            [suspended(att(1, c=30, m=4096), NOW - 10)],
            RULES,
            anyone,
            [],
            id="a-suspended-attempt-holds-nothing",
        ),
        pytest.param(
            dev(oc=0, om=FULL_MIB),
            [suspended(att(1, c=30, m=4096), NOW - 1801)],
            RULES,
            anyone,
            [(1, "evict", "suspended_too_long")],
            id="suspended-past-max-suspend-is-moved",
        ),
        pytest.param(
            dev(oc=0, om=FULL_MIB),
            [suspended(att(1, c=30, m=4096), NOW - 700)],
            RULES,
            anyone,
            [],
            id="max-pause-does-not-apply-to-a-suspended-attempt",
        ),
        pytest.param(
            dev(oc=20, om=FULL_MIB),
            [suspended(att(1, c=30, m=4096), NOW - 10), pausable(att(2, c=10, m=4096))],
            RULES,
            anyone,
            [(2, "suspend", "online_memory")],
            id="a-suspended-attempt-is-never-taken-for-memory-it-does-not-hold",
        ),
    ],
)
def test_relief_with_suspension(device, active, rules, can_suspend, expected) -> None:  # type: ignore[no-untyped-def]
    got = relief_for_device(device, active, MARGINS, NOW, rules, can_suspend=can_suspend)
    assert acts(got) == expected


def test_a_suspended_slice_uses_neither_compute_nor_memory() -> None:
    s = suspended(att(1, c=30, m=4096), NOW)
    assert overflow(dev(oc=95, om=FULL_MIB), [s], MARGINS) == (0.0, 0.0)
    assert compute_used(s) == 0.0 and memory_used(s) == 0.0
    assert select_victims([s], 10.0, 4096.0, NOW) == []


@pytest.mark.parametrize(
    ("online_compute_pct", "online_memory_mib", "since_s", "restored"),
    [
        # memory room: 81920 - 2048 margin - 4096 hysteresis - online ≥ 4096
        pytest.param(0, DEVICE_MIB - 2048 - 4096 - 4096, 10, True, id="both-fit"),
        pytest.param(0, DEVICE_MIB - 2048 - 4096 - 4095, 10, False, id="memory-within-hysteresis"),
        # compute room: 100 - 5 margin - 10 hysteresis - online ≥ 30
        pytest.param(56, 0, 10, False, id="compute-within-hysteresis"),
        pytest.param(55, 0, 10, True, id="compute-just-fits"),
        pytest.param(0, 0, 1, False, id="before-the-minimum-suspension"),
    ],
)
def test_restore_needs_memory_and_compute_with_hysteresis(
    online_compute_pct: float, online_memory_mib: float, since_s: float, restored: bool
) -> None:
    s = suspended(att(1, c=30, m=4096), NOW - since_s)
    d = dev(oc=online_compute_pct, om=online_memory_mib)
    assert restores_for_device(d, [s], MARGINS, NOW, RULES) == ([s] if restored else [])
    assert thaws_for_device(d, [s], MARGINS, NOW, RULES) == []  # restores, never thaws


def test_restore_order_priority_then_longest_suspended_within_the_room() -> None:
    a = suspended(att(1, c=10, m=8192, prio=0), NOW - 100)
    b = suspended(att(2, c=10, m=8192, prio=5), NOW - 10)
    c = suspended(att(3, c=10, m=8192, prio=0), NOW - 200)
    # room for two: 81920 - 2048 - 4096 - online ≥ 16384
    d = dev(om=DEVICE_MIB - 2048 - 4096 - 16384)
    assert [r.job_id for r in restores_for_device(d, [a, b, c], MARGINS, NOW, RULES)] == [2, 3]


def test_running_slices_count_against_the_room_for_a_restore() -> None:
    s = suspended(att(1, c=30, m=4096), NOW - 10)
    other = att(2, c=10, m=72_000)  # room left: 81920 - 2048 - 4096 - 72000 < 4096
    assert restores_for_device(dev(), [s, other], MARGINS, NOW, RULES) == []


def test_no_flapping_between_suspend_and_restore() -> None:
    """A memory level that just needed a suspension never restores it at once."""
    job = pausable(att(1, c=30, m=4096))
    for online_mib in range(DEVICE_MIB - 16_384, DEVICE_MIB + 1, 256):
        d = dev(oc=20, om=online_mib)
        if relief_for_device(d, [job], MARGINS, NOW, RULES, can_suspend=anyone):
            s = dataclasses.replace(job, paused_at=NOW - 60, suspended_at=NOW - 60)
            assert restores_for_device(d, [s], MARGINS, NOW, RULES) == []
