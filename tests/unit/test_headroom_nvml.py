from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from ebbtide.errors import UserError
from ebbtide.workers.headroom.base import (
    NO_OFFLINE,
    ComputeBasis,
    DeviceFault,
    DeviceSample,
    JobUsage,
    KnownPids,
    RecoveryAction,
)
from ebbtide.workers.headroom.fake_nvml import FakeNvml
from ebbtide.workers.headroom.nvml import (
    GPU_LOST_MEANING,
    PROCESS_SAMPLE_MAX_AGE_S,
    NvmlSource,
    NvmlUnavailable,
)
from ebbtide.workers.headroom.nvml_events import HandleIndex

GIB = 1024

OFFLINE = 9001  # a pid ebbtide launched
ONLINE = 4242  # an online tenant


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0  # a multiple of the sample periods used here

    def __call__(self) -> float:
        return self.now


Open = Callable[..., NvmlSource]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_source(clock: Clock) -> Iterator[Open]:
    """``open_source(nvml, **kwargs)``: an NvmlSource on ``clock``, closed after the test."""
    opened: list[NvmlSource] = []

    def make(nvml: FakeNvml, **kwargs: Any) -> NvmlSource:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("event_wait_ms", 10)
        source = NvmlSource(nvml=nvml, **kwargs)
        opened.append(source)
        return source

    yield make
    for source in opened:
        source.close()


def one_gpu(clock: Clock, **kwargs: Any) -> FakeNvml:
    nvml = FakeNvml(clock=clock, **kwargs)
    nvml.add_device(80 * GIB, name="NVIDIA H100 80GB HBM3")
    return nvml


def ours(*pids: int) -> KnownPids:
    return KnownPids.of(set(pids), job_id=7)


def sample_one(source: NvmlSource, clock: Clock, offline: KnownPids = NO_OFFLINE) -> DeviceSample:
    [sample] = source.sample(clock.now, offline)
    return sample


def online(
    source: NvmlSource, clock: Clock, offline: KnownPids = NO_OFFLINE
) -> list[tuple[float, float]]:
    return [(s.online_compute_pct, s.online_memory_mib) for s in source.sample(clock.now, offline)]


def wait_for_faults(source: NvmlSource, count: int, timeout_s: float = 10.0) -> list[DeviceFault]:
    """Faults until there are ``count`` (the XID watcher runs in a thread of its own)."""
    faults: list[DeviceFault] = []
    deadline = time.monotonic() + timeout_s
    while True:
        faults += source.faults()
        if len(faults) >= count or time.monotonic() > deadline:
            return faults
        time.sleep(0.001)


# ---- devices ----


def test_devices_come_from_nvml(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_device(40 * GIB, name="NVIDIA A100-SXM4-40GB")
    devices = open_source(nvml).devices()
    assert [(d.index, d.memory_mib, d.name) for d in devices] == [
        (0, 80 * GIB, "NVIDIA H100 80GB HBM3"),
        (1, 40 * GIB, "NVIDIA A100-SXM4-40GB"),
    ]
    assert all(d.uuid and d.uuid.startswith("GPU-") for d in devices)
    assert len({d.uuid for d in devices}) == 2
    assert all(d.mig_parent is None and d.mig_gpu_instance is None for d in devices)
    assert [d.index for d in open_source(nvml, indices=[1]).devices()] == [1]


def mig_node(clock: Clock) -> FakeNvml:
    """GPU 0 whole, GPU 1 in MIG mode (instances 3 and 5), GPU 2 whole."""
    nvml = one_gpu(clock)
    nvml.add_device(80 * GIB, name="NVIDIA A100-SXM4-80GB")
    nvml.add_device(40 * GIB)
    nvml.enable_mig(1, [(3, 20 * GIB), (5, 40 * GIB)])
    return nvml


def test_mig_instances_are_devices_numbered_across_the_node(
    clock: Clock, open_source: Open
) -> None:
    nvml = mig_node(clock)
    devices = open_source(nvml).devices()
    assert [(d.index, d.memory_mib, d.mig_parent, d.mig_gpu_instance) for d in devices] == [
        (0, 80 * GIB, None, None),
        (1, 20 * GIB, 1, 3),
        (2, 40 * GIB, 1, 5),
        (3, 40 * GIB, None, None),
    ]
    assert [(d.uuid or "")[:4] for d in devices] == ["GPU-", "MIG-", "MIG-", "GPU-"]
    assert len({d.uuid for d in devices}) == 4
    assert "MIG" in devices[1].name
    # indices are NVML's GPUs; the numbering stays the node's
    assert [d.index for d in open_source(nvml, indices=[2]).devices()] == [3]
    assert [d.mig_gpu_instance for d in open_source(nvml, indices=[1]).devices()] == [3, 5]


def test_a_mig_gpu_without_instances_offers_nothing(clock: Clock, open_source: Open) -> None:
    nvml = mig_node(clock)
    nvml.enable_mig(1, [])
    with pytest.raises(NvmlUnavailable, match="no GPU or MIG instance"):
        open_source(nvml, indices=[1])
    assert not nvml.initialized
    assert [d.index for d in open_source(nvml).devices()] == [0, 1]


def test_a_gpu_that_cannot_do_mig_is_offered_whole(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_supported(0, mig=False)
    assert [d.mig_parent for d in open_source(nvml).devices()] == [None]


# ---- ownership and memory ----


def test_without_offline_processes_everything_is_online(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 35)
    nvml.add_process(0, ONLINE, 20 * GIB, sm_util=30)
    nvml.add_process(0, 4343, 2 * GIB, graphics=True)
    source = open_source(nvml)
    [sample] = source.sample(123.0)
    assert (sample.index, sample.time, sample.ok) == (0, 123.0, True)
    assert (sample.online_compute_pct, sample.online_memory_mib) == (35.0, 22 * GIB)
    assert (sample.offline_compute_pct, sample.offline_memory_mib) == (0.0, 0.0)
    assert sample.basis == ComputeBasis.DEVICE


def test_offline_pids_are_excluded_from_online_usage(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 90)
    nvml.add_process(0, ONLINE, 20 * GIB, sm_util=25)
    nvml.add_process(0, OFFLINE, 30 * GIB, sm_util=60)
    nvml.add_process(0, OFFLINE + 1, 1 * GIB, sm_util=5)
    source = open_source(nvml)
    sample = sample_one(source, clock, KnownPids({OFFLINE: 7, OFFLINE + 1: 8}))
    assert (sample.online_compute_pct, sample.online_memory_mib) == (25.0, 20 * GIB)
    assert (sample.offline_compute_pct, sample.offline_memory_mib) == (65.0, 31 * GIB)
    assert sample.basis == ComputeBasis.PROCESS
    # pids of ours on no device change nothing
    assert online(source, clock, ours(12345)) == [(90.0, 51 * GIB)]


def test_a_pid_listed_as_compute_and_graphics_counts_once(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_process(0, ONLINE, 4 * GIB)
    nvml.add_process(0, OFFLINE, 1 * GIB)
    source = open_source(nvml)
    original = nvml.nvmlDeviceGetGraphicsRunningProcesses
    nvml.nvmlDeviceGetGraphicsRunningProcesses = nvml.nvmlDeviceGetComputeRunningProcesses  # type: ignore[method-assign]
    try:
        assert online(source, clock, ours(OFFLINE))[0][1] == 4 * GIB
    finally:
        nvml.nvmlDeviceGetGraphicsRunningProcesses = original  # type: ignore[method-assign]


def test_unknown_process_memory_falls_back_to_device_used_minus_offline(
    clock: Clock, open_source: Open
) -> None:
    nvml = FakeNvml(clock=clock)
    nvml.add_device(80 * GIB, reserved_mib=500)
    nvml.add_process(0, ONLINE, 10 * GIB, report_memory=False)
    nvml.add_process(0, OFFLINE, 30 * GIB)
    source = open_source(nvml)
    # used = 500 + 10 GiB + 30 GiB; minus our 30 GiB: the overhead counts as online
    sample = sample_one(source, clock, ours(OFFLINE))
    assert (sample.online_memory_mib, sample.offline_memory_mib) == (10 * GIB + 500, 30 * GIB)


def test_unknown_offline_memory_counts_as_online(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_process(0, ONLINE, 10 * GIB)
    nvml.add_process(0, OFFLINE, 30 * GIB, report_memory=False)
    sample = sample_one(open_source(nvml), clock, ours(OFFLINE))
    assert sample.online_memory_mib == 10 * GIB  # online is measured exactly
    assert sample.offline_memory_mib is None  # ours cannot be told


def test_graphics_processes_not_supported_is_fine(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_process(0, ONLINE, 3 * GIB)
    nvml.set_supported(0, graphics_processes=False)
    assert online(open_source(nvml), clock) == [(0.0, 3 * GIB)]


# ---- compute: per-process samples ----


@pytest.mark.parametrize(
    ("utilization", "online_sm", "offline_sm", "expected"),
    [
        pytest.param(90, [25], [60, 5], (25.0, 65.0), id="exact split"),
        pytest.param(80, [None], [30], (50.0, 30.0), id="online without samples"),
        pytest.param(60, [50], [40], (50.0, 40.0), id="overlap: online share wins"),
        pytest.param(40, [40], [None], (40.0, 0.0), id="ours idle"),
        pytest.param(30, [None], [50], (0.0, 50.0), id="never below zero"),
        pytest.param(0, [80, 70], [10], (100.0, 10.0), id="capped at 100"),
    ],
)
def test_per_process_split(
    clock: Clock,
    open_source: Open,
    utilization: int,
    online_sm: list[int | None],
    offline_sm: list[int | None],
    expected: tuple[float, float],
) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, utilization)
    for i, util in enumerate(online_sm):
        nvml.add_process(0, ONLINE + i, GIB, sm_util=util)
    for i, util in enumerate(offline_sm):
        nvml.add_process(0, OFFLINE + i, GIB, sm_util=util)
    offline = ours(*(OFFLINE + i for i in range(len(offline_sm))))
    sample = sample_one(open_source(nvml), clock, offline)
    assert (sample.online_compute_pct, sample.offline_compute_pct) == expected
    assert sample.basis == ComputeBasis.PROCESS


def spy_process_utilization(nvml: FakeNvml) -> list[tuple[int, str]]:
    """Records (timestamp asked, "samples" or "NotFound") for each call."""
    asked: list[tuple[int, str]] = []
    real = nvml.nvmlDeviceGetProcessUtilization

    def spy(handle: Any, timeStamp: int) -> list[Any]:
        try:
            samples = real(handle, timeStamp)
        except pynvml.NVMLError_NotFound:
            asked.append((timeStamp, "NotFound"))
            raise
        asked.append((timeStamp, "samples"))
        return samples

    nvml.nvmlDeviceGetProcessUtilization = spy  # type: ignore[method-assign]
    return asked


def test_polling_faster_than_the_gpu_samples_reuses_the_last_samples(
    clock: Clock, open_source: Open
) -> None:
    nvml = one_gpu(clock, sample_period_s=0.25)
    nvml.set_utilization(0, 70)
    nvml.add_process(0, ONLINE, GIB, sm_util=20)
    nvml.add_process(0, OFFLINE, GIB, sm_util=50)
    asked = spy_process_utilization(nvml)
    source = open_source(nvml, utilization_period_s=0)  # NVML asked at every sample
    stamp = round(clock.now * 1e6)
    assert online(source, clock, ours(OFFLINE))[0][0] == 20.0
    clock.now += 0.05  # a 20 Hz agent, the GPU sampling at 4 Hz: nothing newer
    nvml.set_sm_util(0, OFFLINE, 10)
    nvml.set_utilization(0, 80)
    sample = sample_one(source, clock, ours(OFFLINE))
    assert (sample.online_compute_pct, sample.offline_compute_pct) == (30.0, 50.0)
    clock.now += 0.2  # the GPU's next sample
    sample = sample_one(source, clock, ours(OFFLINE))
    assert (sample.online_compute_pct, sample.offline_compute_pct) == (70.0, 10.0)
    assert asked == [(0, "samples"), (stamp, "NotFound"), (stamp, "samples")]


def test_stale_samples_are_dropped(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 80)
    nvml.add_process(0, ONLINE, GIB, sm_util=20)
    nvml.add_process(0, OFFLINE, GIB, sm_util=60)
    source = open_source(nvml)
    assert sample_one(source, clock, ours(OFFLINE)).offline_compute_pct == 60.0
    nvml.set_sm_util(0, OFFLINE, 0)  # ours goes idle: the GPU sends no more samples of it
    nvml.set_utilization(0, 30)
    clock.now += PROCESS_SAMPLE_MAX_AGE_S / 2
    sample = sample_one(source, clock, ours(OFFLINE))
    assert (sample.online_compute_pct, sample.offline_compute_pct) == (20.0, 60.0)
    clock.now += PROCESS_SAMPLE_MAX_AGE_S
    sample = sample_one(source, clock, ours(OFFLINE))
    assert (sample.online_compute_pct, sample.offline_compute_pct) == (30.0, 0.0)


def test_a_process_that_leaves_between_the_list_and_the_samples(
    clock: Clock, open_source: Open
) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 90)
    nvml.add_process(0, ONLINE, GIB, sm_util=20)
    nvml.add_process(0, OFFLINE, GIB, sm_util=40)
    nvml.add_process(0, OFFLINE + 1, GIB, sm_util=30)
    real = nvml.nvmlDeviceGetProcessUtilization

    def churn(handle: Any, timeStamp: int) -> list[Any]:
        nvml.remove_process(0, OFFLINE + 1)  # listed, then gone
        nvml.add_process(0, 5555, GIB, sm_util=15)  # not listed, yet in the samples
        nvml.nvmlDeviceGetProcessUtilization = real  # type: ignore[method-assign]
        return real(handle, timeStamp)

    nvml.nvmlDeviceGetProcessUtilization = churn  # type: ignore[method-assign]
    # the list is read at every sample (one process leaving as another of the same size
    # comes is also what memory alone does not show: see test_headroom_nvml_rates.py)
    source = open_source(nvml, process_list_period_s=0)
    offline = ours(OFFLINE, OFFLINE + 1)
    sample = sample_one(source, clock, offline)
    assert (sample.online_compute_pct, sample.offline_compute_pct) == (20.0, 70.0)
    clock.now += 0.5
    sample = sample_one(source, clock, offline)
    assert (sample.online_compute_pct, sample.offline_compute_pct) == (50.0, 40.0)
    assert sample.online_memory_mib == 2 * GIB


@pytest.mark.parametrize(
    ("agent_behind_s", "offline_pct"),
    [
        pytest.param(0.0, 60.0, id="same clock"),
        pytest.param(0.05, 60.0, id="a little ahead: fresh"),
        pytest.param(10 * PROCESS_SAMPLE_MAX_AGE_S, 0.0, id="far ahead: not trusted"),
    ],
)
def test_samples_from_the_future(
    clock: Clock, open_source: Open, agent_behind_s: float, offline_pct: float
) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 80)
    nvml.add_process(0, OFFLINE, GIB, sm_util=60)
    source = open_source(nvml)
    [sample] = source.sample(clock.now - agent_behind_s, ours(OFFLINE))
    assert (sample.offline_compute_pct, sample.online_compute_pct) == (
        offline_pct,
        80.0 - offline_pct,
    )
    # a stamp far ahead does not stop the asking: once the clocks agree, it counts
    assert sample_one(source, clock, ours(OFFLINE)).offline_compute_pct == 60.0


def test_a_clock_stepped_back_starts_the_samples_over(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 80)
    nvml.add_process(0, OFFLINE, GIB, sm_util=60)
    source = open_source(nvml)
    assert sample_one(source, clock, ours(OFFLINE)).offline_compute_pct == 60.0
    clock.now -= 3600  # the wall clock steps back an hour: the GPU's stamps follow it
    nvml.set_sm_util(0, OFFLINE, 30)
    clock.now += 0.5
    assert sample_one(source, clock, ours(OFFLINE)).offline_compute_pct == 30.0


# ---- compute: fallbacks ----


@pytest.mark.parametrize(
    ("granted_pct", "expected"),
    [(30.0, 40.0), (0.0, 70.0), (90.0, 0.0)],
)
def test_without_per_process_samples_the_slices_are_subtracted(
    clock: Clock, open_source: Open, granted_pct: float, expected: float
) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 70)
    nvml.add_process(0, ONLINE, 10 * GIB, sm_util=10)
    nvml.add_process(0, OFFLINE, 10 * GIB, sm_util=60)
    nvml.set_supported(0, process_utilization=False)
    offline = KnownPids({OFFLINE: 7}, granted={0: (granted_pct, 10 * GIB)})
    sample = sample_one(open_source(nvml), clock, offline)
    assert (sample.online_compute_pct, sample.online_memory_mib) == (expected, 10 * GIB)
    assert (sample.basis, sample.offline_compute_pct) == (ComputeBasis.SLICES, None)


def test_a_mig_instance_is_busy_when_an_online_process_is_on_it(
    clock: Clock, open_source: Open
) -> None:
    nvml = mig_node(clock)
    nvml.add_process(1, ONLINE, 3 * GIB, gpu_instance=3)
    nvml.add_process(1, OFFLINE, 5 * GIB, gpu_instance=3)
    nvml.add_process(1, OFFLINE + 1, 7 * GIB, gpu_instance=5)
    nvml.add_process(0, 77, 1 * GIB)
    samples = open_source(nvml).sample(clock.now, ours(OFFLINE, OFFLINE + 1))
    assert [
        (s.index, s.basis, s.online_compute_pct, s.online_memory_mib, s.offline_memory_mib)
        for s in samples
    ] == [
        (0, ComputeBasis.DEVICE, 0.0, 1 * GIB, 0.0),
        (1, ComputeBasis.INSTANCE, 100.0, 3 * GIB, 5 * GIB),
        (2, ComputeBasis.INSTANCE, 0.0, 0.0, 7 * GIB),
        (3, ComputeBasis.DEVICE, 0.0, 0.0, 0.0),
    ]
    assert [s.offline_compute_pct for s in samples[1:3]] == [None, None]


def test_mig_processes_without_the_privilege_come_from_each_instance(
    clock: Clock, open_source: Open
) -> None:
    nvml = mig_node(clock)
    nvml.set_supported(1, mig_aggregate_processes=False)
    nvml.add_process(1, ONLINE, 3 * GIB, gpu_instance=5)
    samples = open_source(nvml).sample(clock.now)
    assert [(s.online_compute_pct, s.online_memory_mib, s.ok) for s in samples[1:3]] == [
        (0.0, 0.0, True),
        (100.0, 3 * GIB, True),
    ]


# ---- faults: XID events ----


@pytest.mark.parametrize(
    ("xid", "action", "supported", "expected"),
    [
        pytest.param(48, 1, True, (RecoveryAction.GPU_RESET, False, True), id="reset asked"),
        pytest.param(48, 0, True, (RecoveryAction.NONE, False, False), id="driver: none"),
        pytest.param(48, 0, False, (RecoveryAction.UNKNOWN, False, True), id="unsupported"),
        pytest.param(13, 0, False, (RecoveryAction.UNKNOWN, False, False), id="application"),
        pytest.param(31, 0, True, (RecoveryAction.NONE, False, False), id="application: none"),
        pytest.param(79, 2, True, (RecoveryAction.NODE_REBOOT, True, True), id="off the bus"),
        pytest.param(999, 99, True, (RecoveryAction.UNKNOWN, False, True), id="unknown codes"),
    ],
)
def test_an_xid_is_a_fault_with_the_drivers_recovery_action(
    clock: Clock,
    open_source: Open,
    xid: int,
    action: int,
    supported: bool,
    expected: tuple[RecoveryAction, bool, bool],
) -> None:
    nvml = one_gpu(clock)
    nvml.add_device(40 * GIB)
    nvml.set_recovery_action(1, action)
    nvml.set_supported(1, recovery_action=supported)
    source = open_source(nvml)
    assert source.watching_xids
    assert nvml.inject_xid(1, xid) == 1
    [fault] = wait_for_faults(source, 1)
    assert (fault.index, fault.time, fault.xid) == (1, clock.now, xid)
    assert fault.meaning.startswith(f"XID {xid}: ")
    assert (fault.recovery_action, fault.lost, fault.disabling) == expected


def test_xids_come_in_order_and_once(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    source = open_source(nvml)
    for xid in (13, 48, 94):
        nvml.inject_xid(0, xid)
    assert [f.xid for f in wait_for_faults(source, 3)] == [13, 48, 94]
    assert source.faults() == []


@pytest.mark.parametrize(
    ("gpu_instance", "hit"),
    [
        pytest.param(5, [2], id="one instance"),
        pytest.param(None, [1, 2], id="the whole GPU"),
        pytest.param(9, [1, 2], id="an instance unknown here: the whole GPU"),
    ],
)
def test_an_xid_on_a_mig_gpu_hits_its_instance_or_all(
    clock: Clock, open_source: Open, gpu_instance: int | None, hit: list[int]
) -> None:
    nvml = mig_node(clock)
    source = open_source(nvml)
    if gpu_instance == 9:  # made after the source opened the GPU
        nvml.enable_mig(1, [(3, 20 * GIB), (5, 40 * GIB), (9, 10 * GIB)])
    nvml.inject_xid(1, 48, gpu_instance=gpu_instance)
    assert [f.index for f in wait_for_faults(source, len(hit))] == hit


def test_gpus_without_xid_events_are_skipped(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_device(40 * GIB)
    nvml.add_device(40 * GIB)
    nvml.set_supported(0, events=False)
    real = nvml.nvmlDeviceRegisterEvents

    def refuse_gpu_1(handle: Any, eventTypes: int, eventSet: Any) -> None:
        if nvml.nvmlDeviceGetIndex(handle) == 1:
            raise pynvml.NVMLError_NotSupported()
        real(handle, eventTypes, eventSet)

    nvml.nvmlDeviceRegisterEvents = refuse_gpu_1  # type: ignore[method-assign]
    source = open_source(nvml)
    assert source.watching_xids
    assert [nvml.inject_xid(i, 48) for i in range(3)] == [0, 0, 1]
    assert [f.index for f in wait_for_faults(source, 1)] == [2]


def test_no_xid_events_anywhere_means_no_thread(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_supported(0, events=False)
    assert not open_source(nvml).watching_xids


@pytest.mark.parametrize(
    ("known_by", "expected"),
    [("address", (1, None)), ("uuid", (1, 7)), ("nvml index", (1, None))],
)
def test_a_handle_is_found_without_comparing_pointers(
    clock: Clock, known_by: str, expected: tuple[int, int | None]
) -> None:
    nvml = one_gpu(clock)
    nvml.add_device(40 * GIB)
    nvml.nvmlInit()
    handle, again = nvml.nvmlDeviceGetHandleByIndex(1), nvml.nvmlDeviceGetHandleByIndex(1)
    assert handle != again  # what an event carries is a pointer of its own
    index = HandleIndex()
    if known_by == "address":
        index.add(handle, None, (1, None))
    elif known_by == "uuid":
        index.add(None, nvml.nvmlDeviceGetUUID(handle), (1, 7))
    else:
        index.add(None, None, (1, None))
    assert index.find(nvml, again) == expected
    assert index.find(nvml, nvml.nvmlDeviceGetHandleByIndex(0)) is None
    assert index.find(nvml, object()) is None


# ---- faults: a device that does not answer ----


def test_a_gpu_off_the_bus_is_one_fault_and_a_worst_case_sample(
    clock: Clock, open_source: Open
) -> None:
    nvml = one_gpu(clock)
    nvml.add_device(40 * GIB)
    nvml.set_supported(0, events=False)  # the sample alone sees it
    nvml.set_utilization(1, 10)
    source = open_source(nvml)
    nvml.fall_off_bus(0)
    broken, fine = source.sample(clock.now)
    assert (broken.ok, broken.online_compute_pct, broken.online_memory_mib) == (
        False,
        100.0,
        80 * GIB,
    )
    assert (fine.ok, fine.online_compute_pct) == (True, 10.0)
    [fault] = source.faults()
    assert (fault.index, fault.time, fault.xid, fault.meaning) == (
        0,
        clock.now,
        None,
        GPU_LOST_MEANING,
    )
    assert (fault.lost, fault.disabling) == (True, True)
    clock.now += 1
    assert not source.sample(clock.now)[0].ok
    assert source.faults() == []  # one fault per fall
    assert source.check(0) == GPU_LOST_MEANING

    nvml.restore(0)
    assert source.check(0) is None
    assert source.sample(clock.now)[0].ok
    assert source.faults() == []
    nvml.fall_off_bus(0)
    source.sample(clock.now)
    assert [f.lost for f in source.faults()] == [True]  # it fell again


def test_an_xid_79_is_not_reported_again_by_the_sample(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    source = open_source(nvml)
    assert nvml.fall_off_bus(0) == 1
    [fault] = wait_for_faults(source, 1)
    assert (fault.xid, fault.lost, fault.recovery_action) == (79, True, RecoveryAction.UNKNOWN)
    assert not sample_one(source, clock).ok
    assert source.faults() == []


def test_a_lost_gpu_after_a_milder_failure_is_reported(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_supported(0, events=False)
    source = open_source(nvml)
    real = nvml.nvmlDeviceGetUtilizationRates

    def unknown_error(handle: Any) -> Any:
        raise pynvml.NVMLError_Unknown()

    nvml.nvmlDeviceGetUtilizationRates = unknown_error  # type: ignore[method-assign]
    assert not sample_one(source, clock).ok
    [fault] = source.faults()
    assert (fault.lost, fault.disabling) == (False, True)
    assert fault.meaning == "NVML cannot read the device: Unknown Error"
    assert source.check(0) == fault.meaning
    nvml.nvmlDeviceGetUtilizationRates = real  # type: ignore[method-assign]
    nvml.fall_off_bus(0)
    assert not sample_one(source, clock).ok
    assert [f.lost for f in source.faults()] == [True]


def test_mig_instances_of_a_lost_gpu_each_report_it(clock: Clock, open_source: Open) -> None:
    nvml = mig_node(clock)
    nvml.set_supported(1, events=False)
    source = open_source(nvml)
    nvml.fall_off_bus(1)
    samples = source.sample(clock.now)
    assert [s.ok for s in samples] == [True, False, False, True]
    assert [(s.basis, s.online_memory_mib) for s in samples[1:3]] == [
        (ComputeBasis.INSTANCE, 20 * GIB),
        (ComputeBasis.INSTANCE, 40 * GIB),
    ]
    assert [(f.index, f.lost) for f in source.faults()] == [(1, True), (2, True)]
    assert source.check(2) == GPU_LOST_MEANING


@pytest.mark.parametrize(
    ("action", "why"),
    [
        (0, None),
        (1, "the driver asks for a recovery action: gpu reset"),
        (4, "the driver asks for a recovery action: drain and reset"),
    ],
)
def test_check_asks_the_driver(
    clock: Clock, open_source: Open, action: int, why: str | None
) -> None:
    nvml = mig_node(clock)
    nvml.set_recovery_action(1, action)
    source = open_source(nvml)
    assert [source.check(i) for i in range(4)] == [None, why, why, None]
    with pytest.raises(ValueError, match="no device with index 4"):
        source.check(4)


def test_check_passes_where_the_driver_reports_no_action(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_recovery_action(0, 1)
    nvml.set_supported(0, recovery_action=False)
    assert open_source(nvml).check(0) is None


# ---- life cycle ----


def xid_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ebbtide-xid-watcher"]


def test_close_stops_the_watcher_and_shuts_nvml_down_once(clock: Clock) -> None:
    nvml = one_gpu(clock)
    source = NvmlSource(nvml=nvml, clock=clock, event_wait_ms=10)
    assert nvml.initialized and source.watching_xids
    assert len(xid_threads()) == 1
    source.close()
    source.close()
    assert not source.watching_xids and xid_threads() == []
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)
    assert not nvml.initialized
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(RuntimeError, match="after close"):
        source.sample(0.0)
    with pytest.raises(RuntimeError, match="after close"):
        source.check(0)


def test_the_watcher_survives_a_failing_wait(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    real = nvml.nvmlEventSetWait_v2
    failures = iter([pynvml.NVMLError_Unknown(), pynvml.NVMLError_GpuIsLost()])

    def flaky(eventSet: Any, timeoutms: int) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real(eventSet, timeoutms)

    nvml.nvmlEventSetWait_v2 = flaky  # type: ignore[method-assign]
    source = open_source(nvml)
    nvml.inject_xid(0, 48)
    assert [f.xid for f in wait_for_faults(source, 1)] == [48]
    assert source.watching_xids


def test_bad_index_is_reported_and_nvml_shut_down(clock: Clock) -> None:
    nvml = one_gpu(clock)
    with pytest.raises(NvmlUnavailable, match="no GPU with index 3"):
        NvmlSource(nvml=nvml, indices=[3])
    assert not nvml.initialized
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        NvmlSource(nvml=FakeNvml())


def test_a_gpu_that_cannot_be_opened_is_a_user_error(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_device(40 * GIB)
    nvml.fall_off_bus(0)
    with pytest.raises(NvmlUnavailable, match="cannot open GPU 0: GPU is lost"):
        NvmlSource(nvml=nvml)
    assert not nvml.initialized
    # another agent's GPU that is lost counts as one device: the numbering holds
    assert [d.index for d in open_source(nvml, indices=[1]).devices()] == [1]


def test_nvml_init_failure_is_a_user_error() -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError_DriverNotLoaded()

    with pytest.raises(UserError, match="cannot initialise NVML: Driver Not Loaded"):
        NvmlSource(nvml=NoDriver())


# ---- per job: what right-sizing is measured from ----


def test_each_jobs_processes_are_summed_per_job(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 90)
    nvml.add_process(0, ONLINE, 20 * GIB, sm_util=30)
    nvml.add_process(0, OFFLINE, 3 * GIB, sm_util=20)  # job 7: a launcher's two workers
    nvml.add_process(0, OFFLINE + 1, 5 * GIB, sm_util=25)
    nvml.add_process(0, OFFLINE + 2, 2 * GIB)  # job 8: idle (no SM sample)
    offline = KnownPids({OFFLINE: 7, OFFLINE + 1: 7, OFFLINE + 2: 8})
    sample = sample_one(open_source(nvml), clock, offline)
    assert sample.basis == ComputeBasis.PROCESS
    assert sample.offline_jobs == (
        JobUsage(job_id=7, compute_pct=45.0, memory_mib=8.0 * GIB),
        JobUsage(job_id=8, compute_pct=0.0, memory_mib=2.0 * GIB),
    )


def test_a_job_whose_first_sample_is_not_in_yet_is_measured_idle_not_as_granted(
    clock: Clock, open_source: Open
) -> None:
    nvml = one_gpu(clock)
    nvml.set_utilization(0, 50)  # its first kernels, not sampled per process yet
    nvml.add_process(0, OFFLINE, GIB)
    offline = KnownPids({OFFLINE: 7}, granted={0: (40.0, GIB)})
    sample = sample_one(open_source(nvml), clock, offline)
    assert sample.online_compute_pct == 10.0  # taken to use its slice, against a spike...
    assert sample.offline_jobs == (JobUsage(7, 0.0, 1.0 * GIB),)  # ...but measured: 0


def test_what_nvml_does_not_say_per_job_is_none(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_process(0, OFFLINE, 4 * GIB, sm_util=60)
    nvml.add_process(0, OFFLINE + 1, 1 * GIB, sm_util=10, report_memory=False)
    nvml.set_supported(0, process_utilization=False)
    offline = KnownPids({OFFLINE: 7, OFFLINE + 1: 8})
    sample = sample_one(open_source(nvml), clock, offline)
    assert sample.basis == ComputeBasis.SLICES
    assert sample.offline_jobs == (JobUsage(7, None, 4.0 * GIB), JobUsage(8, None, None))


def test_no_job_on_the_device_is_an_empty_attribution(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.add_process(0, ONLINE, 4 * GIB, sm_util=60)
    assert sample_one(open_source(nvml), clock).offline_jobs == ()


def test_a_mig_instance_attributes_memory_only(clock: Clock, open_source: Open) -> None:
    nvml = mig_node(clock)
    nvml.add_process(1, ONLINE, 3 * GIB, gpu_instance=3)
    nvml.add_process(1, OFFLINE, 5 * GIB, gpu_instance=3)
    samples = open_source(nvml).sample(clock.now, ours(OFFLINE))
    assert samples[1].offline_jobs == (JobUsage(7, None, 5.0 * GIB),)
    assert samples[2].offline_jobs == ()


def test_a_device_that_does_not_answer_attributes_nothing(clock: Clock, open_source: Open) -> None:
    nvml = one_gpu(clock)
    nvml.set_supported(0, events=False)
    nvml.add_process(0, OFFLINE, 4 * GIB, sm_util=60)
    source = open_source(nvml)
    nvml.fall_off_bus(0)
    [sample] = source.sample(clock.now, ours(OFFLINE))
    assert not sample.ok and sample.offline_jobs is None
