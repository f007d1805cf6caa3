"""``ListReader``: which path it takes over which module, and the wrappers' answers in its
own shapes (the one-call path over pynvml's bindings is in
``tests/integration/test_nvml_stub.py``, over a stand-in ``libnvidia-ml.so.1``)."""

from __future__ import annotations

import types
from typing import Any

import pynvml

from ebbtide.workers.headroom.fake_nvml import FakeNvml
from ebbtide.workers.headroom.nvml_lists import ListReader, Process, Sample

GIB = 1024


def _fake() -> tuple[FakeNvml, Any]:
    nvml = FakeNvml()
    nvml.add_device(80 * GIB)
    nvml.add_process(0, 4242, memory_mib=2 * GIB, sm_util=30)
    nvml.nvmlInit()
    return nvml, nvml.nvmlDeviceGetHandleByIndex(0)


def test_over_the_fake_it_calls_the_wrappers() -> None:
    nvml, handle = _fake()
    lists = ListReader(nvml)
    assert lists.compute_processes(handle) == [Process(4242, 2 * GIB * 1024 * 1024, 0xFFFFFFFF)]
    assert lists.graphics_processes(handle) == []
    [sample] = lists.process_utilization(handle, 0)
    assert isinstance(sample, Sample) and (sample.pid, sample.smUtil) == (4242, 30)
    # none newer than the newest seen: NVML's NOT_FOUND, an empty list here
    assert lists.process_utilization(handle, sample.timeStamp) == []


def test_a_stand_in_lent_pynvml_s_pointers_is_not_taken_for_the_bindings() -> None:
    """A stand-in module whose wrappers are its own, lending pynvml's constants, errors
    (and so its function pointers) through ``__getattr__``, as a simulated GPU's does: its
    wrappers are called, never a library it did not load."""
    nvml, handle = _fake()
    proxy = types.ModuleType("pynvml")
    vars(proxy).update(
        nvmlDeviceGetComputeRunningProcesses=nvml.nvmlDeviceGetComputeRunningProcesses,
        nvmlDeviceGetGraphicsRunningProcesses=nvml.nvmlDeviceGetGraphicsRunningProcesses,
        nvmlDeviceGetProcessUtilization=nvml.nvmlDeviceGetProcessUtilization,
        NVMLError_NotFound=nvml.NVMLError_NotFound,
        __getattr__=lambda name: getattr(pynvml, name),
    )
    assert proxy._nvmlGetFunctionPointer is pynvml._nvmlGetFunctionPointer
    lists = ListReader(proxy)
    assert [p.pid for p in lists.compute_processes(handle)] == [4242]
    assert [s.pid for s in lists.process_utilization(handle, 0)] == [4242]
