"""A headroom source with a fixed online usage, changeable at runtime to fake a spike."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from ebbtide.workers.headroom.base import NO_OFFLINE, DeviceFault, DeviceInfo, DeviceSample, Offline


def check_usage(compute_pct: float, memory_mib: float) -> tuple[float, float]:
    """Validate one online usage; return it as floats.  Raises ``ValueError``."""
    compute = float(compute_pct)
    memory = float(memory_mib)
    if not (math.isfinite(compute) and 0.0 <= compute <= 100.0):
        raise ValueError(f"online compute must be a percentage in [0, 100], got {compute_pct!r}")
    if not (math.isfinite(memory) and memory >= 0.0):
        raise ValueError(f"online memory must be a non-negative number of MiB, got {memory_mib!r}")
    return compute, memory


class StaticSource:
    """Every device reports the same online usage until :meth:`set` changes it.

    Thread-safe: a test or benchmark may call :meth:`set` from one thread while the node
    agent samples from another.
    """

    def __init__(
        self,
        devices: Sequence[DeviceInfo],
        online_compute_pct: float = 0.0,
        online_memory_mib: float = 0.0,
        *,
        steady: bool = False,
    ) -> None:
        if not devices:
            raise ValueError("a static headroom source needs at least one device")
        usage = check_usage(online_compute_pct, online_memory_mib)
        #: nothing will change the usage (no :meth:`set`: ``--headroom static``), so there
        #: is nothing for a forecast to learn: the node agent keeps no warm-up reserve
        self.steady = steady
        self._devices = list(devices)
        self._position = {d.index: pos for pos, d in enumerate(self._devices)}
        self._usage = [usage] * len(self._devices)
        self._lock = threading.Lock()
        self._faults: list[DeviceFault] = []
        self._failing: dict[int, str] = {}

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def set(self, index: int, compute_pct: float, memory_mib: float) -> None:
        """Set the online usage of device ``index`` (compute in %, memory in MiB)."""
        if index not in self._position:
            known = ", ".join(str(i) for i in self._position)
            raise ValueError(f"no device with index {index} (devices: {known})")
        usage = check_usage(compute_pct, memory_mib)
        with self._lock:
            self._usage[self._position[index]] = usage

    def sample(self, now: float, offline: Offline = NO_OFFLINE) -> list[DeviceSample]:
        with self._lock:
            usage = list(self._usage)
        return [
            DeviceSample(
                index=device.index,
                time=now,
                online_compute_pct=compute,
                online_memory_mib=memory,
            )
            for device, (compute, memory) in zip(self._devices, usage, strict=True)
        ]

    def inject_fault(self, fault: DeviceFault, *, failing: str | None = None) -> None:
        """Report ``fault`` at the next :meth:`faults` (tests, demos).  ``failing`` makes
        the device fail its health checks with that reason until :meth:`heal`."""
        with self._lock:
            self._faults.append(fault)
            if failing is not None:
                self._failing[fault.index] = failing

    def heal(self, index: int) -> None:
        """Device ``index`` passes its health checks again."""
        with self._lock:
            self._failing.pop(index, None)

    def faults(self) -> list[DeviceFault]:
        with self._lock:
            out, self._faults = self._faults, []
        return out

    def check(self, index: int) -> str | None:
        with self._lock:
            return self._failing.get(index)

    def close(self) -> None:
        """Nothing to release."""
