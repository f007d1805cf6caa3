"""Headroom measured on real GPUs through NVML (``pynvml``, from nvidia-ml-py).

Per device and per sample:

- **online memory** is the sum of ``usedGpuMemory`` over the compute and graphics
  processes whose pid is not one of ``offline_pids``.  When NVML cannot tell some
  process's memory (``usedGpuMemory`` is ``None``: no permission, WDDM), it is the
  device's used memory minus the memory of the offline processes it could measure
  (driver overhead then counts as online: erring towards less headroom).
- **online compute** is the device utilization when no offline process runs on the
  device.  Otherwise it is the sum of the latest per-process ``smUtil`` samples
  (``nvmlDeviceGetProcessUtilization``) of the other processes; where the device does
  not keep those samples (``NotSupported``) or has none (``NotFound``), the whole device
  utilization counts as online.

Device indices are NVML's (the indices ``CUDA_VISIBLE_DEVICES`` uses by default).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any

from ebbtide.errors import UserError
from ebbtide.workers.headroom.base import DeviceInfo, DeviceSample

_MIB_B = 1024 * 1024

#: per-process utilization samples older than this, relative to the newest one, are ignored, in µs
PROCESS_UTIL_WINDOW_US = 1_000_000


class NvmlUnavailable(UserError):
    """NVML cannot be used on this machine (no ``pynvml``, no driver, no GPU)."""


class NvmlSource:
    """Samples online usage on this node's GPUs with NVML.

    ``nvml`` is the ``pynvml`` module (imported here when ``None``) or a stand-in such as
    :class:`~ebbtide.workers.headroom.fake_nvml.FakeNvml`.  ``indices`` limits the source
    to those NVML device indices (default: all).  Thread-safe: samples are serialised.
    """

    def __init__(self, nvml: Any = None, indices: Iterable[int] | None = None) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailable(
                    f"the nvml headroom source needs nvidia-ml-py ({exc}); "
                    "use --headroom static or trace:PATH on machines without GPUs"
                ) from None
            nvml = pynvml
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"cannot initialise NVML: {exc}; is the NVIDIA driver installed? "
                "use --headroom static or trace:PATH on machines without GPUs"
            ) from None
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._handles, self._devices = self._open_devices(indices)
        except BaseException:
            nvml.nvmlShutdown()
            raise
        #: per device: the newest per-process utilization timestamp seen, in NVML µs
        self._newest_us = [0] * len(self._devices)

    def _open_devices(self, indices: Iterable[int] | None) -> tuple[list[Any], list[DeviceInfo]]:
        nvml = self._nvml
        count = nvml.nvmlDeviceGetCount()
        wanted = list(range(count)) if indices is None else list(indices)
        if not wanted:
            raise NvmlUnavailable("NVML reports no GPU on this machine")
        handles: list[Any] = []
        devices: list[DeviceInfo] = []
        for index in wanted:
            if not 0 <= index < count:
                raise NvmlUnavailable(f"no GPU with index {index}: NVML reports {count}")
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                DeviceInfo(
                    index=index,
                    memory_mib=int(memory.total // _MIB_B),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                )
            )
            handles.append(handle)
        return handles, devices

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def sample(self, now: float, offline_pids: frozenset[int] = frozenset()) -> list[DeviceSample]:
        with self._lock:
            if self._closed:
                raise RuntimeError("NvmlSource.sample() called after close()")
            return [
                self._sample_device(pos, handle, now, offline_pids)
                for pos, handle in enumerate(self._handles)
            ]

    def _processes(self, handle: Any) -> dict[int, int | None]:
        """pid → usedGpuMemory in bytes (``None``: unknown), compute and graphics together."""
        nvml = self._nvml
        listed = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        with contextlib.suppress(nvml.NVMLError_NotSupported):
            listed += nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
        memory_b: dict[int, int | None] = {}
        for proc in listed:
            used = proc.usedGpuMemory
            if proc.pid in memory_b:  # listed as both compute and graphics: one allocation
                seen = memory_b[proc.pid]
                used = None if used is None or seen is None else max(used, seen)
            memory_b[proc.pid] = used
        return memory_b

    def _sample_device(
        self, pos: int, handle: Any, now: float, offline_pids: frozenset[int]
    ) -> DeviceSample:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization_pct = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        processes = self._processes(handle)

        offline_here = {pid for pid in processes if pid in offline_pids}
        online_b = [used for pid, used in processes.items() if pid not in offline_here]
        if any(used is None for used in online_b):
            offline_known_b = sum(processes[pid] or 0 for pid in offline_here)
            online_memory_b = max(0, int(memory.used) - offline_known_b)
        else:
            online_memory_b = sum(used or 0 for used in online_b)

        if offline_here:
            online_compute_pct = self._online_compute_pct(pos, handle, offline_pids)
            if online_compute_pct is None:
                online_compute_pct = utilization_pct
        else:
            online_compute_pct = utilization_pct

        return DeviceSample(
            index=self._devices[pos].index,
            time=now,
            online_compute_pct=min(100.0, max(0.0, online_compute_pct)),
            online_memory_mib=online_memory_b / _MIB_B,
        )

    def _online_compute_pct(
        self, pos: int, handle: Any, offline_pids: frozenset[int]
    ) -> float | None:
        """Sum of the latest ``smUtil`` of non-offline processes; ``None`` if NVML can't say."""
        nvml = self._nvml
        since_us = max(0, self._newest_us[pos] - PROCESS_UTIL_WINDOW_US)
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NotFound):
            return None
        if not samples:
            return None
        newest_us = max(int(s.timeStamp) for s in samples)
        self._newest_us[pos] = max(self._newest_us[pos], newest_us)
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            stamp = int(s.timeStamp)
            if stamp < newest_us - PROCESS_UTIL_WINDOW_US:
                continue
            if s.pid not in latest or stamp >= latest[s.pid][0]:
                latest[s.pid] = (stamp, float(s.smUtil))
        return sum(util for pid, (_, util) in latest.items() if pid not in offline_pids)

    def close(self) -> None:
        """Shut NVML down (once; later calls do nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    """NVML strings: ``str`` in recent pynvml, ``bytes`` in old releases."""
    return value.decode() if isinstance(value, bytes) else str(value)
