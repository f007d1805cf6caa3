"""Capacity arithmetic: allocated, headroom (admission) and overflow (eviction)."""

from __future__ import annotations

import pytest

from ebbtide.queue.states import JobState
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, allocated, headroom, overflow
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins

from .builders import att, dev

NO_MARGIN = Margins(compute_pct=0.0, memory_mib=0.0)


def test_device_compute_is_one_hundred_percent() -> None:
    assert DEVICE_COMPUTE_PCT == 100.0


@pytest.mark.parametrize(
    ("device", "active", "expected"),
    [
        pytest.param(dev(), [], (0.0, 0.0), id="empty"),
        pytest.param(dev(), [att(1, c=20, m=4096), att(2, c=5, m=512)], (25.0, 4608.0), id="sum"),
        pytest.param(
            dev(i=1), [att(1, devices=(0, 1), c=100, m=8192, gpus=2)], (100.0, 8192.0), id="multi"
        ),
        pytest.param(dev(i=0), [att(1, devices=(1,))], (0.0, 0.0), id="other-index"),
        pytest.param(dev(node="a"), [att(1, node="b")], (0.0, 0.0), id="other-node"),
        pytest.param(
            dev(), [att(1, c=30, m=2048, state=JobState.EVICTING)], (30.0, 2048.0), id="evicting"
        ),
    ],
)
def test_allocated(
    device: DeviceView, active: list[ActiveAttempt], expected: tuple[float, float]
) -> None:
    assert allocated(device, active) == expected


@pytest.mark.parametrize(
    ("device", "alloc", "margins", "expected"),
    [
        pytest.param(dev(), (0, 0), Margins(), (95.0, 79872.0), id="empty-default-margins"),
        pytest.param(dev(), (0, 0), NO_MARGIN, (100.0, 81920.0), id="empty-no-margin"),
        pytest.param(dev(oc=30, om=10240), (0, 0), Margins(), (65.0, 69632.0), id="online"),
        pytest.param(dev(rc=10, rm=4096), (0, 0), Margins(), (85.0, 75776.0), id="reserve"),
        pytest.param(dev(), (20, 8192), Margins(), (75.0, 71680.0), id="offline-slices"),
        pytest.param(
            dev(), (0, 0), Margins(compute_pct=10, memory_mib=8192), (90.0, 73728.0), id="margins"
        ),
        pytest.param(
            dev(oc=30, om=10240, rc=10, rm=4096),
            (20, 8192),
            Margins(),
            (35.0, 57344.0),
            id="everything",
        ),
        pytest.param(
            dev(mem=40960, om=1024), (0, 0), Margins(), (95.0, 37888.0), id="small-device"
        ),
        pytest.param(dev(oc=90, om=78000), (20, 4096), Margins(), (-15.0, -2224.0), id="negative"),
    ],
)
def test_headroom(
    device: DeviceView,
    alloc: tuple[float, float],
    margins: Margins,
    expected: tuple[float, float],
) -> None:
    assert headroom(device, alloc[0], alloc[1], margins) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("device", "active", "margins", "expected"),
    [
        pytest.param(dev(), [], Margins(), (0.0, 0.0), id="idle"),
        pytest.param(dev(oc=80), [att(1, c=15)], Margins(), (0.0, 0.0), id="compute-at-margin"),
        pytest.param(dev(oc=90), [att(1, c=10)], Margins(), (5.0, 0.0), id="compute-over"),
        pytest.param(dev(oc=90), [att(1, c=10)], NO_MARGIN, (0.0, 0.0), id="compute-no-margin"),
        pytest.param(dev(om=71680), [att(1, m=8192)], Margins(), (0.0, 0.0), id="memory-at-margin"),
        pytest.param(dev(om=75000), [att(1, m=8192)], Margins(), (0.0, 3320.0), id="memory-over"),
        pytest.param(
            dev(oc=95, om=79000), [att(1, c=10, m=2048)], Margins(), (10.0, 1176.0), id="both"
        ),
        # the expected-growth reserve guards admission only
        pytest.param(
            dev(rc=50, rm=40000),
            [att(1, c=90, m=70000)],
            Margins(),
            (0.0, 0.0),
            id="reserve-not-counted",
        ),
        # a whole-GPU slice yields compute to online work: only its memory forces it out
        pytest.param(
            dev(oc=100), [att(1, c=100, m=4096, gpus=1)], Margins(), (0.0, 0.0), id="whole-compute"
        ),
        pytest.param(
            dev(oc=100, om=75000),
            [att(1, c=100, m=8192, gpus=1)],
            Margins(),
            (0.0, 3320.0),
            id="whole-memory",
        ),
        pytest.param(
            dev(oc=90),
            [att(1, c=100, m=0, gpus=1), att(2, c=10, m=0)],
            Margins(),
            (5.0, 0.0),
            id="whole-plus-fraction",
        ),
        pytest.param(
            dev(oc=90, om=75000),
            [att(1, node="other", c=50, m=8192), att(2, devices=(1,), c=50, m=8192)],
            Margins(),
            (0.0, 0.0),
            id="elsewhere-ignored",
        ),
        pytest.param(
            dev(oc=90),
            [att(1, c=10, state=JobState.EVICTING)],
            Margins(),
            (5.0, 0.0),
            id="evicting-still-counts",
        ),
    ],
)
def test_overflow(
    device: DeviceView,
    active: list[ActiveAttempt],
    margins: Margins,
    expected: tuple[float, float],
) -> None:
    assert overflow(device, active, margins) == pytest.approx(expected)
