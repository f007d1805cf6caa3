"""NVML's list queries (the processes on a device, their SM samples) in one call each.

pynvml's wrappers ask the driver twice for every list: once with no array for the size,
then with an array of that size.  On a GPU whose driver forwards queries to its system
processor (GSP), each call is a round trip to the GPU of about 100 µs, and the agent reads
these lists several times a second on every GPU.  :class:`ListReader` keeps one array per
query, as large as the longest answer so far (twice that and 5 more, as pynvml oversizes
its process arrays), and calls the library once with it; only an answer that outgrew it
takes a second call.  The answers are pynvml's: the same entry points (the process lists'
``_v3``), the same errors, ``None`` for a process memory NVML does not know, as plain
named tuples copied out of the array; no SM sample newer than asked for (NVML's
``NOT_FOUND``) is an empty list.

Over a stand-in module such as :class:`~ebbtide.workers.headroom.fake_nvml.FakeNvml`
(no function pointers to call), or one whose wrappers are not the bindings' own (a stand-in
that lends pynvml's constants and errors), it calls the module's own wrappers.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NamedTuple


class Process(NamedTuple):
    """A process NVML lists on a device (``usedGpuMemory`` None: NVML does not say)."""

    pid: int
    usedGpuMemory: int | None  # NVML's field names, as pynvml's objects'
    gpuInstanceId: int | None


class Sample(NamedTuple):
    """One per-process SM sample (``timeStamp`` in Unix microseconds)."""

    pid: int
    timeStamp: int
    smUtil: int


#: the entries an array holds before any answer came back
FIRST_SIZE = 8


class ListReader:
    """The list queries of one ``nvml`` module (``pynvml``, or a stand-in), one call each
    while an answer fits the array the last ones needed.  Not thread-safe: the source
    serialises its samples."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._direct = _own_bindings(nvml)
        #: query name → its array (kept: a list is read again and again)
        self._arrays: dict[str, Any] = {}

    def compute_processes(self, handle: Any) -> list[Process]:
        if not self._direct:
            return [_process(p) for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def graphics_processes(self, handle: Any) -> list[Process]:
        if not self._direct:
            return [_process(p) for p in self._nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)]
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)

    def process_utilization(self, handle: Any, since_us: int) -> list[Sample]:
        """The SM samples newer than ``since_us`` (none: ``[]``)."""
        nvml = self._nvml
        if not self._direct:
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
            except nvml.NVMLError_NotFound:
                return []
            return [Sample(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in samples]
        stamp = ctypes.c_ulonglong(since_us)
        ret, entries = self._read(
            "nvmlDeviceGetProcessUtilization",
            nvml.c_nvmlProcessUtilizationSample_t,
            lambda fn, array, count: fn(handle, array, count, stamp),
        )
        if ret == nvml.NVML_ERROR_NOT_FOUND:
            return []
        nvml._nvmlCheckReturn(ret)
        return [Sample(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in entries]

    def _processes(self, name: str, handle: Any) -> list[Process]:
        nvml = self._nvml
        ret, entries = self._read(
            name,
            nvml.c_nvmlProcessInfo_v3_t,
            lambda fn, array, count: fn(handle, count, array),
        )
        nvml._nvmlCheckReturn(ret)
        unknown = nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        return [
            Process(
                int(p.pid),
                None if p.usedGpuMemory == unknown else int(p.usedGpuMemory),
                int(p.gpuInstanceId),
            )
            for p in entries
        ]

    def _read(
        self, name: str, entry: Any, call: Callable[[Any, Any, Any], int]
    ) -> tuple[int, list[Any]]:
        """NVML's answer to ``name`` and the entries it filled: ``call(fn, array,
        byref(count))`` with the array kept for it, once more with a larger one when the
        answer outgrew it (``INSUFFICIENT_SIZE``, with the count needed)."""
        fn = self._nvml._nvmlGetFunctionPointer(name)
        count = ctypes.c_uint(0)
        for _ in range(2):
            array: Any = self._arrays.get(name)
            if array is None or len(array) < count.value:
                size = max(FIRST_SIZE, count.value * 2 + 5)
                array = self._arrays[name] = (entry * size)()
            count.value = len(array)
            ret = call(fn, array, ctypes.byref(count))
            if ret != self._nvml.NVML_ERROR_INSUFFICIENT_SIZE:
                break
        return ret, array[: count.value]


def _own_bindings(nvml: Any) -> bool:
    """Whether ``nvml`` is pynvml's bindings themselves: its list wrappers are defined
    beside the function pointers they call (a stand-in may lend it only the pointers)."""
    pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
    if pointer is None or not all(
        hasattr(nvml, name)
        for name in ("c_nvmlProcessInfo_v3_t", "c_nvmlProcessUtilizationSample_t")
    ):
        return False
    wrapper = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
    module = getattr(pointer, "__module__", None)
    return module is not None and getattr(wrapper, "__module__", None) == module


def _process(proc: Any) -> Process:
    used = proc.usedGpuMemory
    return Process(
        int(proc.pid), None if used is None else int(used), getattr(proc, "gpuInstanceId", None)
    )
