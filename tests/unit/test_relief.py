"""Graduated response, pure: pause for compute, evict for memory, thaw with hysteresis."""

from __future__ import annotations

import dataclasses

import pytest

from ebbtide.preemption.relief import ActionKind, relief_for_device, thaws_for_device
from ebbtide.preemption.victims import EvictReason
from ebbtide.scheduling.capacity import overflow
from ebbtide.scheduling.snapshot import ActiveAttempt, Margins, PauseRules

from .builders import DEVICE_MIB, NOW, att, dev

RULES = PauseRules(max_pause_s=600, thaw_hysteresis_pct=10, min_pause_s=5)
MARGINS = Margins(compute_pct=5, memory_mib=2048)


def pausable(a: ActiveAttempt, paused_at: float | None = None) -> ActiveAttempt:
    return dataclasses.replace(a, pausable=True, paused_at=paused_at)


def acts(reliefs) -> list[tuple[int, str, str]]:  # type: ignore[no-untyped-def]
    return [(r.job_id, r.kind.value, r.reason.value) for r in reliefs]


@pytest.mark.parametrize(
    ("device", "active", "expected"),
    [
        pytest.param(
            dev(oc=80, om=10_000),
            [pausable(att(1, c=30)), pausable(att(2, c=10, prio=5))],
            [(1, "pause", "online_compute")],
            id="compute-spike-pauses-the-lowest-priority",
        ),
        pytest.param(
            dev(oc=80, om=10_000),
            [att(1, c=30)],
            [(1, "evict", "online_compute")],
            id="an-attempt-that-may-not-pause-is-evicted",
        ),
        pytest.param(
            dev(oc=20, om=DEVICE_MIB - 2048),
            [pausable(att(1, c=30, m=4096))],
            [(1, "evict", "online_memory")],
            id="memory-short-evicts-a-pause-would-free-none",
        ),
        pytest.param(
            dev(oc=99, om=DEVICE_MIB - 4096),
            [pausable(att(1, c=30, m=4096), paused_at=NOW - 10)],
            [(1, "evict", "online_memory")],
            id="a-paused-attempt-still-holds-memory",
        ),
        pytest.param(
            dev(oc=99, om=10_000),
            [pausable(att(1, c=30), paused_at=NOW - 10)],
            [],
            id="a-paused-attempt-uses-no-compute",
        ),
        pytest.param(
            dev(oc=70, om=10_000),
            [pausable(att(1, c=30), paused_at=NOW - 601)],
            [(1, "evict", "paused_too_long")],
            id="paused-past-max-pause-is-moved",
        ),
        pytest.param(
            dev(oc=60, om=10_000),
            [pausable(att(1, c=30), paused_at=NOW - 601)],
            [],
            id="paused-past-max-pause-but-fits-again-is-not-moved",
        ),
        pytest.param(
            dev(oc=50, om=10_000),
            [pausable(att(1, c=30))],
            [],
            id="room-for-both-nothing-to-do",
        ),
    ],
)
def test_relief(device, active, expected) -> None:  # type: ignore[no-untyped-def]
    assert acts(relief_for_device(device, active, MARGINS, NOW, RULES)) == expected


def test_with_pausing_off_every_shortfall_evicts_as_before() -> None:
    off = dataclasses.replace(RULES, enabled=False)
    got = relief_for_device(dev(oc=80), [pausable(att(1, c=30))], MARGINS, NOW, off)
    assert acts(got) == [(1, "evict", "online_compute")]


def test_a_paused_attempt_is_never_paused_twice_and_its_compute_frees_the_device() -> None:
    paused = pausable(att(1, c=30), paused_at=NOW)
    assert overflow(dev(oc=80), [paused], MARGINS) == (0.0, 0.0)
    running = pausable(att(2, c=30))
    got = relief_for_device(dev(oc=80), [paused, running], MARGINS, NOW, RULES)
    assert acts(got) == [(2, "pause", "online_compute")]


def test_protected_attempts_are_not_taken_for_compute() -> None:
    got = relief_for_device(
        dev(oc=80), [pausable(att(1, c=30))], MARGINS, NOW, RULES, is_protected=lambda a: True
    )
    assert got == []


def test_thaw_waits_for_room_with_hysteresis_and_the_minimum_pause() -> None:
    paused = pausable(att(1, c=30), paused_at=NOW - 10)
    # 100 - 5 margin - 10 hysteresis - online = room for 30 only below 55 % online
    assert thaws_for_device(dev(oc=56), [paused], MARGINS, NOW, RULES) == []
    assert thaws_for_device(dev(oc=55), [paused], MARGINS, NOW, RULES) == [paused]
    recent = pausable(att(1, c=30), paused_at=NOW - 1)
    assert thaws_for_device(dev(oc=0), [recent], MARGINS, NOW, RULES) == []


def test_past_max_pause_a_thaw_needs_only_the_margin() -> None:
    """Paused past max_pause_s, a job that fits within the margin runs here again rather
    than being moved (a move costs a restart; running here at most another pause)."""
    old = pausable(att(1, c=30), paused_at=NOW - 601)
    young = pausable(att(1, c=30), paused_at=NOW - 10)
    # 60 online + 30 fits 95 %, but not with 10 % hysteresis on top
    assert thaws_for_device(dev(oc=60), [old], MARGINS, NOW, RULES) == [old]
    assert thaws_for_device(dev(oc=60), [young], MARGINS, NOW, RULES) == []
    assert thaws_for_device(dev(oc=66), [old], MARGINS, NOW, RULES) == []
    # the hysteresis a younger job needs still counts once the old one is thawed
    b = pausable(att(2, c=5), paused_at=NOW - 10)
    assert thaws_for_device(dev(oc=51), [old, b], MARGINS, NOW, RULES) == [old]
    assert thaws_for_device(dev(oc=50), [old, b], MARGINS, NOW, RULES) == [old, b]


def test_thaw_order_priority_then_longest_paused_within_the_room() -> None:
    a = pausable(att(1, c=30, prio=0), paused_at=NOW - 100)
    b = pausable(att(2, c=30, prio=5), paused_at=NOW - 10)
    c = pausable(att(3, c=30, prio=0), paused_at=NOW - 200)
    # room: 100 - 5 - 10 - 20 online = 65: two of the three
    got = thaws_for_device(dev(oc=20), [a, b, c], MARGINS, NOW, RULES)
    assert [t.job_id for t in got] == [2, 3]


def test_no_flapping_between_pause_and_thaw() -> None:
    """A compute level that just needed a pause never thaws it at once: the hysteresis
    keeps the job paused until online compute has dropped by more than the margin."""
    job = pausable(att(1, c=30))
    for online in range(0, 101):
        d = dev(oc=online)
        if relief_for_device(d, [job], MARGINS, NOW, RULES):
            paused = dataclasses.replace(job, paused_at=NOW - 60)
            assert thaws_for_device(d, [paused], MARGINS, NOW, RULES) == []


def test_every_reason_is_a_known_constant() -> None:
    got = relief_for_device(
        dev(oc=99, om=DEVICE_MIB), [pausable(att(1)), att(2)], MARGINS, NOW, RULES
    )
    assert got and all(isinstance(r.reason, EvictReason) for r in got)
    assert all(r.kind in ActionKind for r in got)
