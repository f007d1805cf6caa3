"""An in-memory stand-in for the ``pynvml`` module, for tests and for machines without GPUs.

It implements exactly the functions :class:`~ebbtide.workers.headroom.nvml.NvmlSource`
calls, with the real signatures, returning the real ``pynvml`` structures (and the same
friendly objects for process lists) and raising the real ``pynvml.NVMLError`` subclasses:
``NVMLError_Uninitialized`` before ``nvmlInit`` or after the matching ``nvmlShutdown``,
``NVMLError_InvalidArgument`` for a bad device index, ``NVMLError_NotFound`` when no
per-process utilization sample is newer than the timestamp asked for, and
``NVMLError_NotSupported`` where a test declares a call unsupported.

Usage::

    nvml = FakeNvml()
    gpu = nvml.add_device(80 * 1024, name="NVIDIA H100 80GB HBM3")
    nvml.set_utilization(gpu, 35)
    nvml.add_process(gpu, pid=4242, memory_mib=20_000, sm_util=30)
    source = NvmlSource(nvml=nvml)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

# The real error classes, so ``except nvml.NVMLError_NotSupported`` works on either module.
NVMLError = pynvml.NVMLError
NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
NVMLError_NotSupported = pynvml.NVMLError_NotSupported
NVMLError_NotFound = pynvml.NVMLError_NotFound

_MIB_B = 1024 * 1024
#: what NVML reports as gpuInstanceId/computeInstanceId outside MIG
_NO_INSTANCE_ID = 0xFFFFFFFF


@dataclass
class _Process:
    pid: int
    memory_b: int
    report_memory: bool
    sm_util: int | None
    graphics: bool


@dataclass
class _Device:
    memory_b: int
    name: str
    uuid: str
    reserved_b: int
    utilization_pct: int = 0
    processes: dict[int, _Process] = field(default_factory=dict)
    process_utilization_supported: bool = True
    graphics_supported: bool = True


@dataclass(frozen=True)
class FakeHandle:
    """An opaque device handle, like ``pynvml.c_nvmlDevice_t``."""

    index: int


class FakeNvml:
    """A fake ``pynvml`` module.  Thread-safe.

    ``clock`` (Unix seconds; default ``time.time``) stamps the per-process utilization
    samples, in microseconds as NVML does.
    """

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._devices: list[_Device] = []
        self._init_count = 0
        self._lock = threading.Lock()
        #: how many times nvmlInit / nvmlShutdown succeeded (for tests)
        self.init_calls = 0
        self.shutdown_calls = 0

    # ---- declaring the fake machine (not part of pynvml) ----

    def add_device(self, memory_mib: int, name: str = "Fake GPU", *, reserved_mib: int = 0) -> int:
        """Add a device; return its index.  ``reserved_mib`` is memory no process owns
        (driver/context overhead) that still counts as used."""
        with self._lock:
            index = len(self._devices)
            self._devices.append(
                _Device(
                    memory_b=int(memory_mib * _MIB_B),
                    name=name,
                    uuid=f"GPU-fake0000-0000-0000-0000-{index:012d}",
                    reserved_b=int(reserved_mib * _MIB_B),
                )
            )
            return index

    def set_utilization(self, index: int, pct: float) -> None:
        """Set the device utilization (``nvmlDeviceGetUtilizationRates(...).gpu``)."""
        with self._lock:
            self._devices[index].utilization_pct = round(pct)

    def add_process(
        self,
        index: int,
        pid: int,
        memory_mib: float,
        sm_util: float | None = None,
        *,
        graphics: bool = False,
        report_memory: bool = True,
    ) -> None:
        """Start a process on device ``index`` using ``memory_mib``.

        ``sm_util`` is what per-process utilization samples report for it (``None``: the
        process has no samples, as when it is idle).  ``report_memory=False`` makes its
        ``usedGpuMemory`` ``None`` (as without permission, or under WDDM), though the
        memory still counts in the device's used memory.  ``graphics=True`` lists it as a
        graphics process instead of a compute one.
        """
        with self._lock:
            self._devices[index].processes[pid] = _Process(
                pid=pid,
                memory_b=int(memory_mib * _MIB_B),
                report_memory=report_memory,
                sm_util=None if sm_util is None else round(sm_util),
                graphics=graphics,
            )

    def remove_process(self, index: int, pid: int) -> None:
        """End process ``pid`` on device ``index``."""
        with self._lock:
            del self._devices[index].processes[pid]

    def set_supported(
        self, index: int, *, process_utilization: bool = True, graphics_processes: bool = True
    ) -> None:
        """Declare calls the device does not support (they raise ``NVMLError_NotSupported``)."""
        with self._lock:
            device = self._devices[index]
            device.process_utilization_supported = process_utilization
            device.graphics_supported = graphics_processes

    @property
    def initialized(self) -> bool:
        with self._lock:
            return self._init_count > 0

    # ---- the pynvml subset ----

    def nvmlInit(self) -> None:
        with self._lock:
            self._init_count += 1
            self.init_calls += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count == 0:
                raise NVMLError_Uninitialized()
            self._init_count -= 1
            self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._check_init()
            return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        with self._lock:
            self._check_init()
            if not 0 <= index < len(self._devices):
                raise NVMLError_InvalidArgument()
            return FakeHandle(index)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        with self._lock:
            return self._device(handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        with self._lock:
            return self._device(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        with self._lock:
            device = self._device(handle)
            used = min(
                device.memory_b,
                device.reserved_b + sum(p.memory_b for p in device.processes.values()),
            )
            return pynvml.c_nvmlMemory_t(
                total=device.memory_b, free=device.memory_b - used, used=used
            )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        with self._lock:
            device = self._device(handle)
            return pynvml.c_nvmlUtilization_t(gpu=device.utilization_pct, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        with self._lock:
            return self._process_infos(self._device(handle), graphics=False)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        with self._lock:
            device = self._device(handle)
            if not device.graphics_supported:
                raise NVMLError_NotSupported()
            return self._process_infos(device, graphics=True)

    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, timeStamp: int) -> list[Any]:
        """Samples newer than ``timeStamp`` (µs); ``NVMLError_NotFound`` when there are none."""
        with self._lock:
            device = self._device(handle)
            if not device.process_utilization_supported:
                raise NVMLError_NotSupported()
            now_us = int(self._clock() * 1_000_000)
            samples = [
                pynvml.c_nvmlProcessUtilizationSample_t(
                    pid=p.pid, timeStamp=now_us, smUtil=p.sm_util, memUtil=0, encUtil=0, decUtil=0
                )
                for p in device.processes.values()
                if p.sm_util is not None and now_us > timeStamp
            ]
            if not samples:
                raise NVMLError_NotFound()
            return samples

    # ---- internals ----

    def _check_init(self) -> None:
        if self._init_count == 0:
            raise NVMLError_Uninitialized()

    def _device(self, handle: FakeHandle) -> _Device:
        self._check_init()
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self._devices):
            raise NVMLError_InvalidArgument()
        return self._devices[handle.index]

    @staticmethod
    def _process_infos(device: _Device, *, graphics: bool) -> list[Any]:
        infos = []
        for p in device.processes.values():
            if p.graphics != graphics:
                continue
            obj = pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(
                    pid=p.pid,
                    usedGpuMemory=p.memory_b,
                    gpuInstanceId=_NO_INSTANCE_ID,
                    computeInstanceId=_NO_INSTANCE_ID,
                )
            )
            if not p.report_memory:
                obj.usedGpuMemory = None
            infos.append(obj)
        return infos
