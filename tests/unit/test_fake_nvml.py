"""The fake ``pynvml`` behaves as the real one: shapes, errors, sampling, MIG, events."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from ebbtide.workers.headroom.fake_nvml import FakeNvml

GIB = 1024
ONLINE = 4242


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0  # a multiple of every sample period used here

    def __call__(self) -> float:
        return self.now


def started(nvml: FakeNvml) -> FakeNvml:
    nvml.nvmlInit()
    return nvml


def one_gpu(**kwargs: Any) -> FakeNvml:
    nvml = FakeNvml(**kwargs)
    nvml.add_device(80 * GIB, name="NVIDIA H100 80GB HBM3")
    return nvml


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
    assert {p.gpuInstanceId for p in procs} == {0xFFFFFFFF}
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []
    [sample] = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert isinstance(sample, pynvml.c_nvmlProcessUtilizationSample_t)
    assert (sample.pid, sample.smUtil) == (ONLINE, 30)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(handle, sample.timeStamp)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.set_supported(0, process_utilization=False)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetProcessUtilization(handle, 0)


def test_handles_are_real_pointers_equal_only_by_address() -> None:
    nvml = started(one_gpu())
    first, again = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(first, pynvml.c_nvmlDevice_t)
    assert first != again  # as with the real library: compare what they point at
    as_address = ctypes.cast(first, ctypes.c_void_p).value
    assert as_address == ctypes.cast(again, ctypes.c_void_p).value
    assert nvml.nvmlDeviceGetIndex(again) == 0
    for junk in (object(), 12345, None):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetUUID(junk)


def test_set_supported_changes_only_what_it_names() -> None:
    nvml = started(one_gpu())
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.set_supported(0, process_utilization=False)
    nvml.set_supported(0, graphics_processes=False)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)


# ---- per-process samples follow the hardware period ----


def test_samples_come_once_per_period_with_the_value_of_then() -> None:
    clock = Clock()
    nvml = started(one_gpu(clock=clock, sample_period_s=0.25))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.add_process(0, ONLINE, GIB, sm_util=30)
    nvml.add_process(0, 77, GIB, sm_util=0)  # idle: no sample, as on a GPU
    [first] = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert (first.pid, first.smUtil, first.timeStamp) == (ONLINE, 30, round(clock.now * 1e6))
    clock.now += 0.1
    nvml.set_sm_util(0, ONLINE, 80)
    clock.now += 0.1  # still the same period: nothing newer
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(handle, first.timeStamp)
    # asked again from before: the period's sample still has the value it had then
    [same] = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert (same.smUtil, same.timeStamp) == (30, first.timeStamp)
    clock.now += 0.1  # the next period
    [second] = nvml.nvmlDeviceGetProcessUtilization(handle, first.timeStamp)
    assert (second.smUtil, second.timeStamp) == (80, first.timeStamp + 250_000)


def test_a_process_ended_after_a_sample_is_still_in_it() -> None:
    clock = Clock()
    nvml = started(one_gpu(clock=clock, sample_period_s=0.25))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.add_process(0, ONLINE, GIB, sm_util=30)
    clock.now += 0.1
    nvml.remove_process(0, ONLINE)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    assert [s.pid for s in nvml.nvmlDeviceGetProcessUtilization(handle, 0)] == [ONLINE]
    clock.now += 0.2
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(handle, 0)


def test_a_process_can_grow_and_shrink_its_memory() -> None:
    nvml = started(one_gpu())
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.add_process(0, ONLINE, GIB, sm_util=30)
    nvml.set_memory(0, ONLINE, 6 * GIB)
    [proc] = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert proc.usedGpuMemory == 6 * GIB * 2**20
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used == 6 * GIB * 2**20
    nvml.set_memory(0, ONLINE, 512)
    [proc] = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert proc.usedGpuMemory == 512 * 2**20
    assert [s.smUtil for s in nvml.nvmlDeviceGetProcessUtilization(handle, 0)] == [30]


def test_sample_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        FakeNvml(sample_period_s=0)


# ---- MIG ----


def mig_node() -> FakeNvml:
    nvml = one_gpu()
    nvml.enable_mig(0, [(3, 20 * GIB), (5, 40 * GIB)])
    nvml.add_process(0, ONLINE, 2 * GIB, gpu_instance=3)
    nvml.add_process(0, 77, 4 * GIB, gpu_instance=5)
    return started(nvml)


def test_mig_instances_are_devices_of_their_own() -> None:
    nvml = mig_node()
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(gpu) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i) for i in range(2)]
    assert [nvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [3, 5]
    assert all(nvml.nvmlDeviceGetUUID(m).startswith("MIG-") for m in migs)
    assert [nvml.nvmlDeviceGetMemoryInfo(m).total for m in migs] == [20 * 2**30, 40 * 2**30]
    assert [nvml.nvmlDeviceGetMemoryInfo(m).used for m in migs] == [2 * 2**30, 4 * 2**30]
    assert [bool(nvml.nvmlDeviceIsMigDeviceHandle(h)) for h in (gpu, migs[0])] == [False, True]
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migs[1])
    assert nvml.nvmlDeviceGetUUID(parent) == nvml.nvmlDeviceGetUUID(gpu)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(gpu)
    assert [(p.pid, p.gpuInstanceId) for p in procs] == [(ONLINE, 3), (77, 5)]
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(migs[1])] == [77]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda n, g, m: n.nvmlDeviceGetMigDeviceHandleByIndex(g, 2), pynvml.NVMLError_NotFound),
        (
            lambda n, g, m: n.nvmlDeviceGetMigDeviceHandleByIndex(g, 7),
            pynvml.NVMLError_InvalidArgument,
        ),
        (lambda n, g, m: n.nvmlDeviceGetUtilizationRates(m), pynvml.NVMLError_NotSupported),
        (lambda n, g, m: n.nvmlDeviceGetUtilizationRates(g), pynvml.NVMLError_NotSupported),
        (lambda n, g, m: n.nvmlDeviceGetProcessUtilization(m, 0), pynvml.NVMLError_NotSupported),
        (lambda n, g, m: n.nvmlDeviceGetGpuInstanceId(g), pynvml.NVMLError_NotSupported),
        (
            lambda n, g, m: n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(g),
            pynvml.NVMLError_InvalidArgument,
        ),
        (lambda n, g, m: n.nvmlDeviceGetMigMode(m), pynvml.NVMLError_InvalidArgument),
    ],
)
def test_mig_calls_fail_as_nvml_does(
    call: Callable[[FakeNvml, Any, Any], Any], error: type[Exception]
) -> None:
    nvml = mig_node()
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    with pytest.raises(error):
        call(nvml, gpu, mig)


def test_mig_declarations_are_checked() -> None:
    nvml = one_gpu()
    nvml.add_device(24 * GIB)
    nvml.set_supported(1, mig=False)
    nvml.add_process(0, ONLINE, GIB)
    with pytest.raises(ValueError, match="MIG mode needs it idle"):
        nvml.enable_mig(0, [(1, GIB)])
    with pytest.raises(ValueError, match="cannot do MIG"):
        nvml.enable_mig(1, [(1, GIB)])
    with pytest.raises(ValueError, match="exactly when MIG is enabled"):
        nvml.add_process(1, 5, GIB, gpu_instance=1)
    nvml.remove_process(0, ONLINE)
    nvml.enable_mig(0, [(1, GIB)])
    with pytest.raises(ValueError, match="no MIG instance 2"):
        nvml.add_process(0, 5, GIB, gpu_instance=2)
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(1))


def test_without_the_privilege_only_mig_handles_list_processes() -> None:
    nvml = mig_node()
    nvml.set_supported(0, mig_aggregate_processes=False)
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        nvml.nvmlDeviceGetComputeRunningProcesses(gpu)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [ONLINE]


# ---- field values ----


@pytest.mark.parametrize(
    ("supported", "field", "expected"),
    [
        (True, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, (pynvml.NVML_SUCCESS, 2)),
        (False, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, (pynvml.NVML_ERROR_NOT_SUPPORTED, 0)),
        (True, (pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0), (pynvml.NVML_SUCCESS, 2)),
        (True, pynvml.NVML_FI_DEV_ECC_CURRENT, (pynvml.NVML_ERROR_NOT_SUPPORTED, 0)),
    ],
)
def test_field_values_report_the_recovery_action(
    supported: bool, field: Any, expected: tuple[int, int]
) -> None:
    nvml = started(one_gpu())
    nvml.set_recovery_action(0, pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    nvml.set_supported(0, recovery_action=supported)
    [value] = nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), [field])
    assert isinstance(value, pynvml.c_nvmlFieldValue_t)
    assert (value.nvmlReturn, value.value.uiVal) == expected


# ---- events ----


def xid_set(nvml: FakeNvml, index: int = 0) -> Any:
    events = nvml.nvmlEventSetCreate()
    xid = pynvml.nvmlEventTypeXidCriticalError
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    assert nvml.nvmlDeviceGetSupportedEventTypes(handle) & xid
    nvml.nvmlDeviceRegisterEvents(handle, xid, events)
    return events


def test_an_xid_reaches_the_event_sets_registered_for_it() -> None:
    nvml = started(one_gpu())
    nvml.add_device(40 * GIB)
    assert nvml.inject_xid(0, 48) == 0  # nobody listens yet: lost, as on a real node
    events = xid_set(nvml, 0)
    assert nvml.inject_xid(1, 48) == 0
    assert nvml.inject_xid(0, 31) == 1
    data = nvml.nvmlEventSetWait_v2(events, 1000)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 31)
    assert data.gpuInstanceId == 0xFFFFFFFF
    assert nvml.nvmlDeviceGetUUID(data.device) == nvml.nvmlDeviceGetUUID(
        nvml.nvmlDeviceGetHandleByIndex(0)
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(events, 5)
    nvml.nvmlEventSetFree(events)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait_v2(events, 5)


def test_an_xid_of_a_mig_instance_names_it() -> None:
    nvml = mig_node()
    events = xid_set(nvml)
    nvml.inject_xid(0, 43, gpu_instance=5)
    assert nvml.nvmlEventSetWait_v2(events, 1000).gpuInstanceId == 5
    with pytest.raises(ValueError, match="no MIG instance 9"):
        nvml.inject_xid(0, 43, gpu_instance=9)


def test_a_waiter_is_woken_by_an_event() -> None:
    nvml = started(one_gpu())
    events = xid_set(nvml)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(nvml.nvmlEventSetWait_v2(events, 10_000)))
    waiter.start()
    nvml.inject_xid(0, 94)
    waiter.join(10)
    assert [d.eventData for d in got] == [94]


def test_events_can_be_declared_unsupported() -> None:
    nvml = started(one_gpu())
    nvml.set_supported(0, events=False)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    xid = pynvml.nvmlEventTypeXidCriticalError
    assert not nvml.nvmlDeviceGetSupportedEventTypes(handle) & xid
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceRegisterEvents(handle, xid, nvml.nvmlEventSetCreate())


# ---- a GPU off the bus ----


@pytest.mark.parametrize(
    "call",
    [
        lambda n, h: n.nvmlDeviceGetMemoryInfo(h),
        lambda n, h: n.nvmlDeviceGetUtilizationRates(h),
        lambda n, h: n.nvmlDeviceGetComputeRunningProcesses(h),
        lambda n, h: n.nvmlDeviceGetProcessUtilization(h, 0),
        lambda n, h: n.nvmlDeviceGetUUID(h),
        lambda n, h: n.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]),
        lambda n, h: n.nvmlDeviceGetMigMode(h),
        lambda n, h: n.nvmlDeviceGetHandleByIndex(0),
    ],
)
def test_a_gpu_off_the_bus_is_lost_to_every_call(call: Callable[[FakeNvml, Any], Any]) -> None:
    nvml = started(one_gpu())
    nvml.add_process(0, ONLINE, GIB, sm_util=10)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.fall_off_bus(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        call(nvml, handle)
    nvml.restore(0)
    call(nvml, handle)


def test_falling_off_the_bus_sends_xid_79_and_loses_mig_handles_too() -> None:
    nvml = mig_node()
    events = xid_set(nvml)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 1)
    assert nvml.fall_off_bus(0) == 1
    assert nvml.nvmlEventSetWait_v2(events, 1000).eventData == 79
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(mig)
