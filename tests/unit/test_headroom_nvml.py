from __future__ import annotations

from typing import Any

import pynvml
import pytest

from ebbtide.errors import UserError
from ebbtide.workers.headroom.fake_nvml import FakeNvml
from ebbtide.workers.headroom.nvml import PROCESS_UTIL_WINDOW_US, NvmlSource, NvmlUnavailable

GIB = 1024

OFFLINE = 9001  # a pid ebbtide launched
ONLINE = 4242  # an online tenant


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def one_gpu(**kwargs: Any) -> FakeNvml:
    nvml = FakeNvml(**kwargs)
    nvml.add_device(80 * GIB, name="NVIDIA H100 80GB HBM3")
    return nvml


def online(source: NvmlSource, offline: set[int] | None = None) -> list[tuple[float, float]]:
    samples = source.sample(1.0, frozenset(offline or ()))
    return [(s.online_compute_pct, s.online_memory_mib) for s in samples]


# ---- the fake behaves like pynvml ----


def test_fake_raises_the_real_uninitialized_error() -> None:
    nvml = one_gpu()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 80 * GIB * 2**20
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetMemoryInfo(handle)


def test_fake_returns_pynvml_shapes() -> None:
    nvml = one_gpu(clock=Clock())
    nvml.add_process(0, ONLINE, 1024, sm_util=30)
    nvml.add_process(0, 77, 512, report_memory=False)
    nvml.set_utilization(0, 40)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.used, memory.free + memory.used) == (1536 * 2**20, memory.total)
    assert nvml.nvmlDeviceGetUtilizationRates(handle).gpu == 40
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(ONLINE, 1024 * 2**20), (77, None)]
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []
    [sample] = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert (sample.pid, sample.smUtil) == (ONLINE, 30)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(handle, sample.timeStamp)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.set_supported(0, process_utilization=False)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetProcessUtilization(handle, 0)


# ---- NvmlSource ----


def test_devices_come_from_nvml() -> None:
    nvml = one_gpu()
    nvml.add_device(40 * GIB, name="NVIDIA A100-SXM4-40GB")
    source = NvmlSource(nvml=nvml)
    devices = source.devices()
    assert [(d.index, d.memory_mib, d.name) for d in devices] == [
        (0, 80 * GIB, "NVIDIA H100 80GB HBM3"),
        (1, 40 * GIB, "NVIDIA A100-SXM4-40GB"),
    ]
    assert all(d.uuid and d.uuid.startswith("GPU-") for d in devices)
    assert [d.index for d in NvmlSource(nvml=nvml, indices=[1]).devices()] == [1]


def test_without_offline_processes_everything_is_online() -> None:
    nvml = one_gpu()
    nvml.set_utilization(0, 35)
    nvml.add_process(0, ONLINE, 20 * GIB, sm_util=30)
    nvml.add_process(0, 4343, 2 * GIB, graphics=True)
    source = NvmlSource(nvml=nvml)
    [sample] = source.sample(123.0)
    assert (sample.index, sample.time) == (0, 123.0)
    assert (sample.online_compute_pct, sample.online_memory_mib) == (35.0, 22 * GIB)


def test_offline_pids_are_excluded_from_online_usage() -> None:
    nvml = one_gpu()
    nvml.set_utilization(0, 90)
    nvml.add_process(0, ONLINE, 20 * GIB, sm_util=25)
    nvml.add_process(0, OFFLINE, 30 * GIB, sm_util=60)
    nvml.add_process(0, OFFLINE + 1, 1 * GIB, sm_util=5)
    source = NvmlSource(nvml=nvml)
    assert online(source, {OFFLINE, OFFLINE + 1}) == [(25.0, 20 * GIB)]
    # pids of ours on no device change nothing
    assert online(source, {12345}) == [(90.0, 51 * GIB)]


def test_a_pid_listed_as_compute_and_graphics_counts_once() -> None:
    nvml = one_gpu()
    nvml.add_process(0, ONLINE, 4 * GIB)
    nvml.add_process(0, OFFLINE, 1 * GIB)
    source = NvmlSource(nvml=nvml)
    original = nvml.nvmlDeviceGetGraphicsRunningProcesses
    nvml.nvmlDeviceGetGraphicsRunningProcesses = nvml.nvmlDeviceGetComputeRunningProcesses  # type: ignore[method-assign]
    try:
        assert online(source, {OFFLINE})[0][1] == 4 * GIB
    finally:
        nvml.nvmlDeviceGetGraphicsRunningProcesses = original  # type: ignore[method-assign]


def test_unknown_process_memory_falls_back_to_device_used_minus_offline() -> None:
    nvml = FakeNvml()
    nvml.add_device(80 * GIB, reserved_mib=500)
    nvml.add_process(0, ONLINE, 10 * GIB, report_memory=False)
    nvml.add_process(0, OFFLINE, 30 * GIB)
    source = NvmlSource(nvml=nvml)
    # used = 500 + 10 GiB + 30 GiB; minus our 30 GiB: the overhead counts as online
    assert online(source, {OFFLINE})[0][1] == 10 * GIB + 500


def test_unknown_offline_memory_counts_as_online() -> None:
    nvml = one_gpu()
    nvml.add_process(0, ONLINE, 10 * GIB)
    nvml.add_process(0, OFFLINE, 30 * GIB, report_memory=False)
    source = NvmlSource(nvml=nvml)
    assert online(source, {OFFLINE})[0][1] == 10 * GIB  # online is measured exactly


@pytest.mark.parametrize("why", ["not supported", "no samples"])
def test_without_per_process_samples_all_compute_counts_as_online(why: str) -> None:
    nvml = one_gpu()
    nvml.set_utilization(0, 70)
    nvml.add_process(0, ONLINE, 10 * GIB, sm_util=None if why == "no samples" else 10)
    nvml.add_process(0, OFFLINE, 10 * GIB, sm_util=None if why == "no samples" else 60)
    if why == "not supported":
        nvml.set_supported(0, process_utilization=False)
    source = NvmlSource(nvml=nvml)
    assert online(source, {OFFLINE}) == [(70.0, 10 * GIB)]


def test_graphics_processes_not_supported_is_fine() -> None:
    nvml = one_gpu()
    nvml.add_process(0, ONLINE, 3 * GIB)
    nvml.set_supported(0, graphics_processes=False)
    assert online(NvmlSource(nvml=nvml)) == [(0.0, 3 * GIB)]


def test_online_compute_is_capped_at_100() -> None:
    nvml = one_gpu()
    nvml.add_process(0, ONLINE, 1, sm_util=80)
    nvml.add_process(0, ONLINE + 1, 1, sm_util=70)
    nvml.add_process(0, OFFLINE, 1, sm_util=10)
    assert online(NvmlSource(nvml=nvml), {OFFLINE})[0][0] == 100.0


def test_per_process_samples_are_asked_since_the_last_seen_window() -> None:
    clock = Clock()
    nvml = one_gpu(clock=clock)
    nvml.add_process(0, ONLINE, GIB, sm_util=20)
    nvml.add_process(0, OFFLINE, GIB, sm_util=50)
    asked: list[int] = []
    real = nvml.nvmlDeviceGetProcessUtilization

    def spy(handle: Any, timeStamp: int) -> list[Any]:
        asked.append(timeStamp)
        return real(handle, timeStamp)

    nvml.nvmlDeviceGetProcessUtilization = spy  # type: ignore[method-assign]
    source = NvmlSource(nvml=nvml)
    assert online(source, {OFFLINE})[0][0] == 20.0
    clock.now += 0.1
    nvml.add_process(0, ONLINE, GIB, sm_util=45)
    assert online(source, {OFFLINE})[0][0] == 45.0
    first_stamp_us = int((clock.now - 0.1) * 1_000_000)
    assert asked == [0, first_stamp_us - PROCESS_UTIL_WINDOW_US]


def test_close_shuts_nvml_down_once() -> None:
    nvml = one_gpu()
    source = NvmlSource(nvml=nvml)
    assert nvml.initialized
    source.close()
    source.close()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)
    assert not nvml.initialized
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(RuntimeError, match="after close"):
        source.sample(0.0)


def test_bad_index_is_reported_and_nvml_shut_down() -> None:
    nvml = one_gpu()
    with pytest.raises(NvmlUnavailable, match="no GPU with index 3"):
        NvmlSource(nvml=nvml, indices=[3])
    assert not nvml.initialized
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        NvmlSource(nvml=FakeNvml())


def test_nvml_init_failure_is_a_user_error() -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError_DriverNotLoaded()

    with pytest.raises(UserError, match="cannot initialise NVML: Driver Not Loaded"):
        NvmlSource(nvml=NoDriver())
