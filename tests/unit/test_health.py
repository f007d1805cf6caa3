"""Device health on a node: faults take a device out of service, checks bring it back."""

from __future__ import annotations

import pytest

from ebbtide.workers.headroom.base import DeviceFault
from ebbtide.workers.health import HealthTracker

RECOVERY_S = 60.0


def fault(index: int = 0, xid: int | None = 48, *, lost: bool = False, disabling: bool = True):  # type: ignore[no-untyped-def]
    return DeviceFault(
        index=index,
        time=100.0,
        xid=xid,
        meaning=f"XID {xid}",
        recovery_action="gpu_reset",
        lost=lost,
        disabling=disabling,
    )


@pytest.fixture
def health() -> HealthTracker:
    return HealthTracker([0, 1], RECOVERY_S)


def test_a_disabling_fault_takes_only_its_device_out(health: HealthTracker) -> None:
    assert health.fault(fault(0)) is True
    assert health.unhealthy(0) and not health.unhealthy(1)
    assert health.fault_on((1, 0)) is not None and health.fault_on((1,)) is None
    report = health.report(0, now=100.0)
    assert report["health"] == "unhealthy"
    assert report["fault"]["xid"] == 48 and report["fault"]["recovery_action"] == "gpu_reset"


def test_an_application_error_is_recorded_but_changes_nothing(health: HealthTracker) -> None:
    assert health.fault(fault(0, xid=13, disabling=False)) is False
    assert not health.unhealthy(0)
    assert health.report(0, now=100.0)["last_fault"]["xid"] == 13


def test_a_second_fault_only_counts_when_it_is_worse(health: HealthTracker) -> None:
    assert health.fault(fault(0, xid=48)) is True
    assert health.fault(fault(0, xid=63)) is False
    assert health.fault(fault(0, xid=79, lost=True)) is True  # now the GPU is gone
    assert health.fault_on((0,)).lost  # type: ignore[union-attr]


def test_checks_must_pass_without_a_break_for_the_recovery_time(health: HealthTracker) -> None:
    health.fault(fault(0))
    assert health.checked(0, None, now=200.0) is False
    assert health.checked(0, None, now=200.0 + RECOVERY_S / 2) is False
    assert health.report(0, now=230.0)["healthy_in_s"] == pytest.approx(RECOVERY_S - 30)
    assert health.checked(0, "recovery action pending: gpu_reset", now=250.0) is False
    assert health.report(0, now=250.0)["healthy_in_s"] is None  # the clock starts over
    assert health.checked(0, None, now=300.0) is False
    assert health.checked(0, None, now=300.0 + RECOVERY_S) is True
    assert not health.unhealthy(0)


def test_undrain_returns_the_device_at_once(health: HealthTracker) -> None:
    health.fault(fault(1, lost=True))
    assert health.undrain(1) is True
    assert not health.unhealthy(1)
    assert health.undrain(1) is False  # nothing to do twice


def test_unknown_devices_are_ignored(health: HealthTracker) -> None:
    assert health.fault(fault(7)) is False
    assert health.checked(7, None, now=0.0) is False
    assert health.report(7, now=0.0) == {"health": "healthy"}
