"""Device health on a node: faults take a device out of service; passing checks bring it back.

A device is ``healthy`` until a disabling fault (an XID the driver wants a reset for, a
GPU off the bus, a device that stops answering: see :mod:`ebbtide.workers.headroom.xid`).
It is then ``unhealthy``: the agent evicts its slices and the scheduler admits nothing
there.  It returns when its health checks have passed without a break for
``recovery_s`` (a check fails while the driver still asks for a recovery action, or while
NVML cannot reach the device), or at once when an admin undrains it.

Pure: the caller passes the time; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ebbtide.workers.headroom.base import DeviceFault

#: How often the agent checks an unhealthy device, in seconds.
HEALTH_CHECK_PERIOD_S = 1.0


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass
class DeviceHealth:
    index: int
    state: Health = Health.HEALTHY
    #: the fault that took the device out of service
    fault: DeviceFault | None = None
    #: the last fault seen on the device, disabling or not
    last_fault: DeviceFault | None = None
    #: Unix seconds since which health checks have passed without a break
    passing_since: float | None = None
    #: the last failed check, in words
    failing: str | None = None


class HealthTracker:
    """The health of one node's devices.  ``recovery_s``: how long checks must pass."""

    def __init__(self, indices: Iterable[int], recovery_s: float) -> None:
        self.recovery_s = recovery_s
        self.devices = {i: DeviceHealth(i) for i in indices}

    def unhealthy(self, index: int) -> bool:
        d = self.devices.get(index)
        return d is not None and d.state == Health.UNHEALTHY

    def fault_on(self, indices: Iterable[int]) -> DeviceFault | None:
        """The fault that disabled one of ``indices``, if any of them is unhealthy."""
        for i in indices:
            d = self.devices.get(i)
            if d is not None and d.state == Health.UNHEALTHY:
                return d.fault
        return None

    def fault(self, f: DeviceFault) -> bool:
        """Record a fault; True when it takes the device out of service (again, or worse:
        a lost device after a milder fault)."""
        d = self.devices.get(f.index)
        if d is None:
            return False
        d.last_fault = f
        if not f.disabling:
            return False
        worse = d.state == Health.HEALTHY or (f.lost and not (d.fault and d.fault.lost))
        if d.state == Health.HEALTHY or worse:
            d.fault = f
        d.state = Health.UNHEALTHY
        d.passing_since = None
        d.failing = f.meaning
        return worse

    def checked(self, index: int, why_not: str | None, now: float) -> bool:
        """Record a health check (``why_not`` None: it passed); True when the device
        returns to service."""
        d = self.devices.get(index)
        if d is None or d.state == Health.HEALTHY:
            return False
        if why_not is not None:
            d.passing_since = None
            d.failing = why_not
            return False
        if d.passing_since is None:
            d.passing_since = now
            d.failing = None
        if now - d.passing_since >= self.recovery_s:
            self._restore(d)
            return True
        return False

    def undrain(self, index: int) -> bool:
        """An admin returns the device to service; True if it was out."""
        d = self.devices.get(index)
        if d is None or d.state == Health.HEALTHY:
            return False
        self._restore(d)
        return True

    @staticmethod
    def _restore(d: DeviceHealth) -> None:
        d.state = Health.HEALTHY
        d.fault = None
        d.passing_since = None
        d.failing = None

    def report(self, index: int, now: float) -> dict[str, Any]:
        """The device's health for the heartbeat (and ``ebb nodes``)."""
        d = self.devices.get(index)
        if d is None:
            return {"health": Health.HEALTHY.value}
        out: dict[str, Any] = {"health": d.state.value}
        if d.state == Health.UNHEALTHY and d.fault is not None:
            out["fault"] = _fault_dict(d.fault)
            out["failing"] = d.failing
            out["healthy_in_s"] = (
                None
                if d.passing_since is None
                else round(max(0.0, self.recovery_s - (now - d.passing_since)), 3)
            )
        if d.last_fault is not None:
            out["last_fault"] = _fault_dict(d.last_fault)
        return out


def _fault_dict(f: DeviceFault) -> dict[str, Any]:
    return {
        "xid": f.xid,
        "meaning": f.meaning,
        "recovery_action": f.recovery_action,
        "lost": f.lost,
        "at": f.time,
    }


def fault_message(node: str, fault: DeviceFault) -> str:
    """Why a fault moved a job, in words a person can act on."""
    action = (
        f"; the driver asks for: {fault.recovery_action.replace('_', ' ')}"
        if fault.recovery_action not in ("none", "unknown")
        else ""
    )
    how = "killed at once (the GPU is gone)" if fault.lost else "warned to checkpoint"
    return (
        f"GPU fault on {node}/{fault.index}: {fault.meaning}{action}; the job was {how} and "
        "requeued on another device; a fault does not count against the job"
    )
