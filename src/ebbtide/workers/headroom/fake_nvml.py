"""An in-memory stand-in for the ``pynvml`` module, for tests and for machines without GPUs.

(Longer than our modules should be: it is a fake of one vendor API (the part of ``pynvml``
:class:`~ebbtide.workers.headroom.nvml.NvmlSource` calls), one file by nature, as the module
it stands in for is.)

It implements the functions :class:`~ebbtide.workers.headroom.nvml.NvmlSource` calls,
with the real signatures, returning the real ``pynvml`` structures (device and event-set
handles are real ``c_nvmlDevice_t`` / ``c_nvmlEventSet_t`` pointers, stable per device and
no more comparable with ``==`` than the real ones) and raising the real
``pynvml.NVMLError`` subclasses:

- ``NVMLError_Uninitialized`` before ``nvmlInit`` or after the matching ``nvmlShutdown``;
- ``NVMLError_InvalidArgument`` for a bad index or a handle of the wrong kind;
- ``NVMLError_NotFound`` when no per-process sample is newer than the timestamp asked for,
  and for an empty MIG slot;
- ``NVMLError_NotSupported`` where the device does not support a call (declared with
  :meth:`FakeNvml.set_supported`; utilisation on a MIG instance, or on a GPU in MIG mode);
- ``NVMLError_GpuIsLost`` on every call with a handle of a GPU that fell off the bus;
- ``NVMLError_Timeout`` when ``nvmlEventSetWait_v2`` sees no event within its timeout.

Per-process utilisation is sampled as the hardware does: once per ``sample_period_s``
(timestamps are multiples of the period, so a reader polling faster gets ``NotFound``
between periods), one sample per process that used SMs in that period, whose value is the
process's ``sm_util`` at that time.

Usage::

    nvml = FakeNvml()
    gpu = nvml.add_device(80 * 1024, name="NVIDIA H100 80GB HBM3")
    nvml.set_utilization(gpu, 35)
    nvml.add_process(gpu, pid=4242, memory_mib=20_000, sm_util=30)
    source = NvmlSource(nvml=nvml)
    nvml.inject_xid(gpu, 48)           # the source's watcher reports it from faults()
    nvml.fall_off_bus(gpu)             # every call on the GPU now raises GpuIsLost

``FakeNvml(call_cost_s=100e-6)`` makes every ``nvml*`` call take at least that long, as
the real library's do (for benchmarks of what sampling costs; ``None``, the default,
leaves the calls as they are): the call's own work counts towards it, and the rest is
spent busy (``call_wait="busy"``, on the CPU, as a call spent in the driver's ioctl is)
or asleep (``"sleep"``).  ``calls`` then counts the calls of each function.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

# The real error classes, so ``except nvml.NVMLError_NotSupported`` works on either module.
NVMLError = pynvml.NVMLError
NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
NVMLError_NotSupported = pynvml.NVMLError_NotSupported
NVMLError_NotFound = pynvml.NVMLError_NotFound
NVMLError_NoPermission = pynvml.NVMLError_NoPermission
NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
NVMLError_Timeout = pynvml.NVMLError_Timeout

_MIB_B = 1024 * 1024
_S_US = 1_000_000
#: what NVML reports as gpuInstanceId/computeInstanceId outside MIG
_NO_INSTANCE_ID = 0xFFFFFFFF
#: MIG devices one GPU can hold (``nvmlDeviceGetMaxMigDeviceCount``)
_MAX_MIG_DEVICES = 7
#: the XID NVML reports when a GPU falls off the bus
_XID_FELL_OFF_BUS = 79
_XID = pynvml.nvmlEventTypeXidCriticalError
#: event types a fake GPU reports, with and without XID events
_EVENTS_WITH_XID = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | _XID
    | pynvml.nvmlEventTypeClock
)
_EVENTS_WITHOUT_XID = pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeClock
#: a process's first ``sm_util`` holds from before it was added (a sample right away sees it)
_FOREVER_US = -(2**63)


@dataclass
class _Process:
    pid: int
    memory_b: int
    report_memory: bool
    graphics: bool
    gpu_instance: int | None
    #: (since µs, smUtil or None), oldest first
    sm_history: list[tuple[int, int | None]]
    ended_us: int | None = None

    def sm_util_at(self, t_us: int) -> int | None:
        value = self.sm_history[0][1]
        for since_us, util in self.sm_history:
            if since_us > t_us:
                break
            value = util
        return value


@dataclass
class _Instance:
    gpu_instance: int
    memory_b: int
    uuid: str
    address: int


@dataclass
class _Support:
    process_utilization: bool = True
    graphics_processes: bool = True
    recovery_action: bool = True
    events: bool = True
    mig: bool = True
    #: a GPU handle in MIG mode lists every instance's processes (else NoPermission)
    mig_aggregate_processes: bool = True


@dataclass
class _Gpu:
    index: int
    memory_b: int
    name: str
    uuid: str
    reserved_b: int
    address: int
    utilization_pct: int = 0
    processes: dict[int, _Process] = field(default_factory=dict)
    ended: list[_Process] = field(default_factory=list)
    #: ``None``: MIG disabled; else the MIG devices, in slot order
    instances: list[_Instance] | None = None
    lost: bool = False
    recovery_action: int = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    support: _Support = field(default_factory=_Support)


@dataclass
class _EventSet:
    #: GPU index → event types registered
    registered: dict[int, int] = field(default_factory=dict)
    #: (GPU index, event type, event data, GPU instance id), oldest first
    pending: deque[tuple[int, int, int, int]] = field(default_factory=deque)
    freed: bool = False


class FakeNvml:
    """A fake ``pynvml`` module.  Thread-safe.

    ``clock`` (Unix seconds; default ``time.time``) stamps the per-process utilisation
    samples and the field values, in microseconds as NVML does; ``sample_period_s`` is
    how often the fake hardware takes a per-process sample (1/6 s by default; real GPUs
    take one every 1/6 s to 1 s).  Waits on event sets use real time.  ``call_cost_s``
    and ``call_wait``: what each call costs (see the module's doc; none by default).
    """

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    nvmlEventTypeXidCriticalError = _XID

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        sample_period_s: float = 1 / 6,
        call_cost_s: float | None = None,
        call_wait: str = "busy",
    ) -> None:
        if sample_period_s <= 0:
            raise ValueError(f"sample_period_s must be positive, got {sample_period_s}")
        self._clock = clock
        self._period_us = max(1, round(sample_period_s * _S_US))
        self._gpus: list[_Gpu] = []
        self._init_count = 0
        self._lock = threading.Lock()
        self._events_changed = threading.Condition(self._lock)
        #: handle address → (GPU index, GPU instance id or None)
        self._handles: dict[int, tuple[int, int | None]] = {}
        self._event_sets: dict[int, _EventSet] = {}
        #: what handle addresses point at (kept alive so that addresses stay unique)
        self._buffers: list[Any] = []
        #: how many times nvmlInit / nvmlShutdown succeeded (for tests)
        self.init_calls = 0
        self.shutdown_calls = 0
        #: calls of each ``nvml*`` function (counted only with a ``call_cost_s``)
        self.calls: Counter[str] = Counter()
        if call_cost_s is not None:
            self._cost_calls(call_cost_s, call_wait)

    def _cost_calls(self, cost_s: float, wait: str) -> None:
        """Make every ``nvml*`` method take at least ``cost_s`` seconds, spent busy or
        asleep (``wait``), and count its calls."""
        if cost_s < 0:
            raise ValueError(f"call_cost_s must not be negative, got {cost_s}")
        if wait not in ("busy", "sleep"):
            raise ValueError(f"call_wait must be 'busy' or 'sleep', got {wait!r}")
        for name in dir(type(self)):
            if name.startswith("nvml") and callable(getattr(type(self), name)):
                setattr(self, name, self._costly(name, getattr(self, name), cost_s, wait))

    def _costly(
        self, name: str, fn: Callable[..., Any], cost_s: float, wait: str
    ) -> Callable[..., Any]:
        calls = self.calls

        def call(*args: Any, **kwargs: Any) -> Any:
            done_at = time.perf_counter() + cost_s
            calls[name] += 1  # (under the GIL; a lost count in a race does not matter)
            try:
                return fn(*args, **kwargs)
            finally:
                if wait == "busy":
                    while time.perf_counter() < done_at:
                        pass
                elif (left_s := done_at - time.perf_counter()) > 0:
                    time.sleep(left_s)

        return call

    # ---- declaring the fake machine (not part of pynvml) ----

    def add_device(self, memory_mib: int, name: str = "Fake GPU", *, reserved_mib: int = 0) -> int:
        """Add a GPU; return its index.  ``reserved_mib`` is memory no process owns
        (driver/context overhead) that still counts as used."""
        with self._lock:
            index = len(self._gpus)
            address = self._new_address()
            self._handles[address] = (index, None)
            self._gpus.append(
                _Gpu(
                    index=index,
                    memory_b=int(memory_mib * _MIB_B),
                    name=name,
                    uuid=f"GPU-fake0000-0000-0000-0000-{index:012d}",
                    reserved_b=int(reserved_mib * _MIB_B),
                    address=address,
                )
            )
            return index

    def set_utilization(self, index: int, pct: float) -> None:
        """Set the GPU utilisation (``nvmlDeviceGetUtilizationRates(...).gpu``)."""
        with self._lock:
            self._gpus[index].utilization_pct = round(pct)

    def add_process(
        self,
        index: int,
        pid: int,
        memory_mib: float,
        sm_util: float | None = None,
        *,
        graphics: bool = False,
        report_memory: bool = True,
        gpu_instance: int | None = None,
    ) -> None:
        """Start a process on GPU ``index`` using ``memory_mib`` (adding a running pid again
        changes it, and its ``sm_util`` from now on).

        ``sm_util`` is what per-process samples report for it (``None`` or 0: the process
        gets no samples, as when it is idle).  ``report_memory=False`` makes its
        ``usedGpuMemory`` ``None`` (as without permission, or under WDDM), though the memory
        still counts in the device's used memory.  ``graphics=True`` lists it as a graphics
        process instead of a compute one.  On a GPU in MIG mode, ``gpu_instance`` names
        the MIG instance it runs on (required there, refused elsewhere).
        """
        with self._lock:
            gpu = self._gpus[index]
            if (gpu.instances is None) != (gpu_instance is None):
                raise ValueError(
                    f"GPU {index}: a process names a gpu_instance exactly when MIG is enabled"
                )
            if gpu_instance is not None:
                self._instance(gpu, gpu_instance)
            util = None if sm_util is None else round(sm_util)
            old = gpu.processes.get(pid)
            history = [(_FOREVER_US, util)]
            if old is not None:
                history = [*old.sm_history, (self._now_us(), util)]
            gpu.processes[pid] = _Process(
                pid=pid,
                memory_b=int(memory_mib * _MIB_B),
                report_memory=report_memory,
                graphics=graphics,
                gpu_instance=gpu_instance,
                sm_history=history,
            )

    def set_sm_util(self, index: int, pid: int, sm_util: float | None) -> None:
        """Process ``pid`` uses ``sm_util`` percent of the SMs from now on."""
        with self._lock:
            process = self._gpus[index].processes[pid]
            util = None if sm_util is None else round(sm_util)
            process.sm_history.append((self._now_us(), util))

    def set_memory(self, index: int, pid: int, memory_mib: float) -> None:
        """Process ``pid`` holds ``memory_mib`` of GPU ``index`` from now on (it allocated
        or freed some)."""
        with self._lock:
            self._gpus[index].processes[pid].memory_b = int(memory_mib * _MIB_B)

    def remove_process(self, index: int, pid: int) -> None:
        """End process ``pid`` on GPU ``index`` (samples taken before now still name it)."""
        with self._lock:
            gpu = self._gpus[index]
            process = gpu.processes.pop(pid)
            process.ended_us = self._now_us()
            gpu.ended.append(process)

    def set_supported(
        self,
        index: int,
        *,
        process_utilization: bool | None = None,
        graphics_processes: bool | None = None,
        recovery_action: bool | None = None,
        events: bool | None = None,
        mig: bool | None = None,
        mig_aggregate_processes: bool | None = None,
    ) -> None:
        """Declare what GPU ``index`` supports (``None``: unchanged; all are by default).

        ``process_utilization``, ``graphics_processes``: those calls raise
        ``NotSupported`` when False.  ``recovery_action``: the recovery-action field
        answers ``NVML_ERROR_NOT_SUPPORTED``.  ``events``: no XID events (the supported
        event types lack them; registering them raises ``NotSupported``).  ``mig``: the GPU
        cannot do MIG (the MIG calls raise ``NotSupported``).  ``mig_aggregate_processes``:
        in MIG mode, the GPU handle's process lists raise ``NoPermission`` (as for a
        caller without the privilege) and only MIG handles list their processes.
        """
        with self._lock:
            support = self._gpus[index].support
            for name, value in (
                ("process_utilization", process_utilization),
                ("graphics_processes", graphics_processes),
                ("recovery_action", recovery_action),
                ("events", events),
                ("mig", mig),
                ("mig_aggregate_processes", mig_aggregate_processes),
            ):
                if value is not None:
                    setattr(support, name, value)

    def enable_mig(self, index: int, instances: Sequence[tuple[int, int]]) -> None:
        """Put GPU ``index`` in MIG mode with these instances: (GPU-instance id, memory in
        MiB) each, in slot order.  The GPU must run no process, as for ``nvidia-smi``."""
        with self._lock:
            gpu = self._gpus[index]
            if not gpu.support.mig:
                raise ValueError(f"GPU {index} cannot do MIG")
            if gpu.processes:
                raise ValueError(f"GPU {index} runs processes: MIG mode needs it idle")
            if len(instances) > _MAX_MIG_DEVICES:
                raise ValueError(f"a GPU holds at most {_MAX_MIG_DEVICES} MIG instances")
            if len({gi for gi, _ in instances}) != len(instances):
                raise ValueError("GPU-instance ids must be distinct")
            for instance in gpu.instances or ():
                del self._handles[instance.address]  # their handles are no longer valid
            gpu.instances = []
            for gi, memory_mib in instances:
                address = self._new_address()
                self._handles[address] = (index, gi)
                gpu.instances.append(
                    _Instance(
                        gpu_instance=gi,
                        memory_b=int(memory_mib * _MIB_B),
                        uuid=f"MIG-fake0000-0000-0000-{index:04d}-{gi:012d}",
                        address=address,
                    )
                )

    def set_recovery_action(self, index: int, code: int) -> None:
        """The driver's ``NVML_GPU_RECOVERY_ACTION_*`` for GPU ``index`` (0: none)."""
        with self._lock:
            self._gpus[index].recovery_action = int(code)

    def inject_xid(self, index: int, xid: int, *, gpu_instance: int | None = None) -> int:
        """An XID on GPU ``index`` (on one of its MIG instances with ``gpu_instance``);
        return to how many event sets registered for it it was delivered."""
        with self._lock:
            gpu = self._gpus[index]
            if gpu_instance is not None:
                self._instance(gpu, gpu_instance)
            gi = _NO_INSTANCE_ID if gpu_instance is None else gpu_instance
            return self._deliver(gpu, _XID, xid, gi)

    def fall_off_bus(self, index: int) -> int:
        """GPU ``index`` falls off the bus: every call with one of its handles raises
        ``NVMLError_GpuIsLost`` until :meth:`restore`, and an XID 79 goes to the event sets
        registered for it (return how many)."""
        with self._lock:
            gpu = self._gpus[index]
            gpu.lost = True
            return self._deliver(gpu, _XID, _XID_FELL_OFF_BUS, _NO_INSTANCE_ID)

    def restore(self, index: int) -> None:
        """GPU ``index`` answers again (after a reset)."""
        with self._lock:
            self._gpus[index].lost = False

    @property
    def initialized(self) -> bool:
        with self._lock:
            return self._init_count > 0

    # ---- the pynvml subset: library and devices ----

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
            self._events_changed.notify_all()

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._check_init()
            return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        with self._lock:
            self._check_init()
            if not 0 <= index < len(self._gpus):
                raise NVMLError_InvalidArgument()
            gpu = self._gpus[index]
            if gpu.lost:
                raise NVMLError_GpuIsLost()
            return _device_pointer(gpu.address)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        with self._lock:
            return self._gpu_only(handle, NVMLError_InvalidArgument).index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._lock:
            gpu, instance = self._resolve(handle)
            if instance is None:
                return gpu.name
            return f"{gpu.name} MIG {instance.memory_b // (1024 * _MIB_B)}gb"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._lock:
            gpu, instance = self._resolve(handle)
            return gpu.uuid if instance is None else instance.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        with self._lock:
            gpu, instance = self._resolve(handle)
            total, reserved = gpu.memory_b, gpu.reserved_b
            processes = list(gpu.processes.values())
            if instance is not None:
                total, reserved = instance.memory_b, 0
                processes = [p for p in processes if p.gpu_instance == instance.gpu_instance]
            used = min(total, reserved + sum(p.memory_b for p in processes))
            return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        with self._lock:
            gpu, instance = self._resolve(handle)
            if instance is not None or gpu.instances is not None:
                raise NVMLError_NotSupported()
            return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization_pct, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        with self._lock:
            return self._process_infos(*self._resolve(handle), graphics=False)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        with self._lock:
            gpu, instance = self._resolve(handle)
            if not gpu.support.graphics_processes:
                raise NVMLError_NotSupported()
            return self._process_infos(gpu, instance, graphics=True)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        """The latest hardware sample, if newer than ``timeStamp`` (µs): one entry per
        process that used SMs then; ``NVMLError_NotFound`` when there is none."""
        with self._lock:
            gpu, instance = self._resolve(handle)
            if (
                instance is not None
                or gpu.instances is not None
                or not gpu.support.process_utilization
            ):
                raise NVMLError_NotSupported()
            now_us = self._now_us()
            taken_us = now_us - now_us % self._period_us
            gpu.ended = [p for p in gpu.ended if p.ended_us is not None and p.ended_us > taken_us]
            if taken_us <= timeStamp:
                raise NVMLError_NotFound()
            samples = []
            for p in [*gpu.processes.values(), *gpu.ended]:
                util = p.sm_util_at(taken_us)
                if util:
                    samples.append(
                        pynvml.c_nvmlProcessUtilizationSample_t(
                            pid=p.pid, timeStamp=taken_us, smUtil=util, memUtil=0, encUtil=0
                        )
                    )
            if not samples:
                raise NVMLError_NotFound()
            return samples

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[Any]) -> Any:
        """Only ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` is known (on GPU handles); every
        other field answers ``NVML_ERROR_NOT_SUPPORTED`` in its entry."""
        with self._lock:
            gpu, instance = self._resolve(handle)
            values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
            for value, field_id in zip(values, fieldIds, strict=True):
                if isinstance(field_id, tuple):
                    value.fieldId, value.scopeId = field_id
                else:
                    value.fieldId = field_id
                value.timestamp = self._now_us()
                if (
                    value.fieldId == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
                    and instance is None
                    and gpu.support.recovery_action
                ):
                    value.nvmlReturn = pynvml.NVML_SUCCESS
                    value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                    value.value.uiVal = gpu.recovery_action
                else:
                    value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return values

    # ---- the pynvml subset: MIG ----

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        with self._lock:
            gpu = self._mig_capable(device)
            mode = pynvml.NVML_DEVICE_MIG_DISABLE
            if gpu.instances is not None:
                mode = pynvml.NVML_DEVICE_MIG_ENABLE
            return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        with self._lock:
            self._mig_capable(device)
            return _MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        with self._lock:
            gpu = self._mig_capable(device)
            if not 0 <= index < _MAX_MIG_DEVICES:
                raise NVMLError_InvalidArgument()
            if gpu.instances is None or index >= len(gpu.instances):
                raise NVMLError_NotFound()
            return _device_pointer(gpu.instances[index].address)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        with self._lock:
            _, instance = self._resolve(device)
            if instance is None:
                raise NVMLError_NotSupported()
            return instance.gpu_instance

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        """A ``c_uint``, as pynvml 13 returns (truthy for a MIG device)."""
        with self._lock:
            _, instance = self._resolve(device)
            return ctypes.c_uint(instance is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        with self._lock:
            gpu, instance = self._resolve(migDevice)
            if instance is None:
                raise NVMLError_InvalidArgument()
            return _device_pointer(gpu.address)

    # ---- the pynvml subset: events ----

    def nvmlEventSetCreate(self) -> Any:
        with self._lock:
            self._check_init()
            address = self._new_address()
            self._event_sets[address] = _EventSet()
            return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlEventSet_t)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        with self._lock:
            gpu = self._gpu_only(handle, NVMLError_NotSupported)
            return _EVENTS_WITH_XID if gpu.support.events else _EVENTS_WITHOUT_XID

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        with self._lock:
            gpu = self._gpu_only(handle, NVMLError_NotSupported)
            events = self._event_set(eventSet)
            supported = _EVENTS_WITH_XID if gpu.support.events else _EVENTS_WITHOUT_XID
            if eventTypes & ~supported:
                raise NVMLError_NotSupported()
            events.registered[gpu.index] = events.registered.get(gpu.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        """The next event of ``eventSet``, waiting up to ``timeoutms`` (real time) for one."""
        deadline = time.monotonic() + timeoutms / 1000
        with self._lock:
            events = self._event_set(eventSet)
            while not events.pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NVMLError_Timeout()
                self._events_changed.wait(remaining)
                events = self._event_set(eventSet)
            gpu_index, event_type, data, gi = events.pending.popleft()
            return pynvml.c_nvmlEventData_t(
                device=_device_pointer(self._gpus[gpu_index].address),
                eventType=event_type,
                eventData=data,
                gpuInstanceId=gi,
                computeInstanceId=_NO_INSTANCE_ID if gi == _NO_INSTANCE_ID else 0,
            )

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        with self._lock:
            self._event_set(eventSet).freed = True
            self._events_changed.notify_all()

    # ---- internals ----

    def _check_init(self) -> None:
        if self._init_count == 0:
            raise NVMLError_Uninitialized()

    def _now_us(self) -> int:
        return round(self._clock() * _S_US)

    def _new_address(self) -> int:
        buffer = ctypes.create_string_buffer(1)
        self._buffers.append(buffer)
        return ctypes.addressof(buffer)

    def _resolve(self, handle: Any) -> tuple[_Gpu, _Instance | None]:
        """The GPU (and MIG instance) ``handle`` points at; raises as NVML would."""
        self._check_init()
        address = _address(handle)
        where = self._handles.get(address) if address is not None else None
        if where is None:
            raise NVMLError_InvalidArgument()
        gpu = self._gpus[where[0]]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if where[1] is None:
            return gpu, None
        for instance in gpu.instances or ():
            if instance.address == address:
                return gpu, instance
        raise NVMLError_InvalidArgument()

    def _gpu_only(self, handle: Any, error: type[Exception]) -> _Gpu:
        gpu, instance = self._resolve(handle)
        if instance is not None:
            raise error()
        return gpu

    def _mig_capable(self, handle: Any) -> _Gpu:
        gpu = self._gpu_only(handle, NVMLError_InvalidArgument)
        if not gpu.support.mig:
            raise NVMLError_NotSupported()
        return gpu

    @staticmethod
    def _instance(gpu: _Gpu, gpu_instance: int) -> _Instance:
        for instance in gpu.instances or ():
            if instance.gpu_instance == gpu_instance:
                return instance
        raise ValueError(f"GPU {gpu.index} has no MIG instance {gpu_instance}")

    def _event_set(self, handle: Any) -> _EventSet:
        self._check_init()
        address = _address(handle)
        events = self._event_sets.get(address) if address is not None else None
        if events is None or events.freed:
            raise NVMLError_InvalidArgument()
        return events

    def _deliver(self, gpu: _Gpu, event_type: int, data: int, gi: int) -> int:
        delivered = 0
        for events in self._event_sets.values():
            if not events.freed and events.registered.get(gpu.index, 0) & event_type:
                events.pending.append((gpu.index, event_type, data, gi))
                delivered += 1
        self._events_changed.notify_all()
        return delivered

    @staticmethod
    def _process_infos(gpu: _Gpu, instance: _Instance | None, *, graphics: bool) -> list[Any]:
        mig = gpu.instances is not None
        if mig and instance is None and not gpu.support.mig_aggregate_processes:
            raise NVMLError_NoPermission()
        infos = []
        for p in gpu.processes.values():
            if p.graphics != graphics:
                continue
            if instance is not None and p.gpu_instance != instance.gpu_instance:
                continue
            obj = pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(
                    pid=p.pid,
                    usedGpuMemory=p.memory_b,
                    gpuInstanceId=_NO_INSTANCE_ID if p.gpu_instance is None else p.gpu_instance,
                    computeInstanceId=0 if mig else _NO_INSTANCE_ID,
                )
            )
            if not p.report_memory:
                obj.usedGpuMemory = None
            infos.append(obj)
        return infos


def _address(handle: Any) -> int | None:
    """The address a ctypes pointer holds (``None`` for anything else)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _device_pointer(address: int) -> Any:
    """A fresh ``c_nvmlDevice_t`` holding ``address``: equal handles are not ``==``, as
    with the real library."""
    return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlDevice_t)
