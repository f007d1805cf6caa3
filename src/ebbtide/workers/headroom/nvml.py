"""Headroom measured on real GPUs through NVML (``pynvml``, from nvidia-ml-py).

(Longer than our modules should be: it is one source over one vendor API (NVML), and every
part of it (devices and MIG instances, per-process use, XID events) reads the same handles
through the same error handling.)

**Devices.**  A GPU is offered whole, unless it is in MIG mode: then each of its MIG
instances is a device of its own (named by its ``MIG-…`` UUID in ``CUDA_VISIBLE_DEVICES``).
Devices are numbered 0, 1, … across the node in NVML order, whole GPUs and MIG instances
together, whatever GPUs ``indices`` selects: a device's index is ebbtide's, not NVML's, and
is the same in every agent of the node (on a node without MIG, it is the NVML index).

**Ownership.**  A GPU process is ebbtide's when ``offline.owner(pid)`` names a job; every
other process is online.

**Online processes**: each sample lists the host pids of the online processes it saw on
the device (``online_pids``), for people to tell which online tenants use which device.

**Per job** (``offline_jobs``, what right-sizing is measured from): for each job with a
process on the device, its processes' ``usedGpuMemory`` summed, and under the ``process``
basis the sum of their fresh SM samples (a process without one was idle: 0, never the
slice it was granted); ``None`` where NVML does not say (compute under ``slices`` and on
MIG instances, memory a process does not report).

**Online memory** is the sum of ``usedGpuMemory`` over the online compute and graphics
processes.  When NVML cannot tell some online process's memory (``None``: no permission,
WDDM), it is the device's used memory minus the memory of ebbtide's processes it could
measure (driver overhead then counts as online: erring towards less headroom).
``offline_memory_mib`` is what ebbtide's processes hold (``None`` when NVML cannot tell).

**Online compute**, by :class:`~ebbtide.workers.headroom.base.ComputeBasis`:

- ``device``: no process of ebbtide's on the GPU: its whole utilisation (the share of
  time a kernel ran) is online.
- ``process``: per-process SM samples (``nvmlDeviceGetProcessUtilization``).  The GPU
  takes one every 1/6 s to 1 s, one per process that used SMs in that period; ebbtide
  keeps the latest per process and asks only for newer ones, so polling faster than the
  GPU samples reuses them.  A sample older than :data:`PROCESS_SAMPLE_MAX_AGE_S` (or as
  far in the future: clocks disagree) is dropped, and a process without one counts as
  idle; when the clock steps back past the newest sample seen, the cache starts over.
  Offline share = the sum of ebbtide's processes' samples (at least the compute granted to
  ebbtide's slices on the device while some job has no sampled process yet: its first
  sample is up to a period away, and its first kernels must not look like an online
  spike), online share = that of the others; online compute = max(utilisation − offline
  share, online share).  The first
  term catches online processes without samples, the second the time both ran at once.
  A process that stops using SMs gets no more samples, so its last one counts for up to
  :data:`PROCESS_SAMPLE_MAX_AGE_S`.
- ``slices``: the GPU keeps no per-process samples (``NotSupported``, ``NoPermission``).
  Online compute = utilisation − the compute granted to ebbtide's slices on the device.
  This assumes ebbtide's jobs use no more than their slices (with MPS the slice is also
  their cap).  It errs towards less online compute by whatever part of their slices
  ebbtide's jobs leave unused (and by the time online and offline kernels overlap): the
  sum online + slices is the utilisation, so a device is never planned past what it
  really ran, but online growth into a slice its job idles in goes unseen until the job
  uses it again.  A job that overruns an uncapped slice makes online look larger:
  erring towards eviction.
- ``instance``: a MIG instance reports no utilisation.  It counts as fully busy (100) as
  soon as an online process runs on it, else idle: ebbtide shares a MIG instance only with
  its own jobs.

**Rates.**  Memory is read at every sample: a memory spike is what an eviction must
follow at once.  Utilisation and per-process SM samples, which the driver refreshes every
1/6 s to 1 s, are read together once :data:`UTILIZATION_PERIOD_S` old.  A GPU's process
list (and whose each process is) is read again when the device's used memory moved (a
process came, went, grew or shrank: a CUDA context alone holds memory), and at least
every :data:`PROCESS_LIST_PERIOD_S`; so a new process, an offline job's new child
included, is told apart in the next sample, except when another process freed exactly
what it took in the same tick: then for at most that period.  Ownership verdicts are
kept with the list while the ``offline``'s ``epoch`` stays the same
(:class:`~ebbtide.workers.ownership.ProcessOwnership`).  A sample nothing of which was
read again repeats the last figures at the new time.

**Faults.**  A thread waits for XID events (:mod:`~ebbtide.workers.headroom.nvml_events`)
and turns each into a :class:`~ebbtide.workers.headroom.base.DeviceFault` with the
driver's recovery action; an XID of the whole GPU is a fault of each of its MIG instances.
A device whose sample fails does not fail :meth:`NvmlSource.sample`: its sample is the
worst case (``ok=False``, all of it online) and one fault is queued when it goes from
answering to not (a ``GPU is lost`` one when NVML says so); one reported by an XID 79 is
not reported again by the sample.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ebbtide.errors import UserError
from ebbtide.workers.headroom.base import (
    NO_OFFLINE,
    ComputeBasis,
    DeviceFault,
    DeviceInfo,
    DeviceSample,
    Offline,
    RecoveryAction,
)
from ebbtide.workers.headroom.nvml_events import (
    EVENT_WAIT_MS,
    HandleIndex,
    XidWatcher,
    read_recovery_action,
)
from ebbtide.workers.headroom.nvml_figures import (
    MIB_B,
    PROCESS_SAMPLE_MAX_AGE_S,
    Listed,
    OwnersOnce,
    ProcessSamples,
    Readings,
    by_job,
    figures,
    fresh_at,
    memory_split,
)
from ebbtide.workers.headroom.nvml_lists import ListReader
from ebbtide.workers.headroom.xid import LOST_XIDS, disables_device, xid_meaning

log = logging.getLogger("ebbtide.headroom.nvml")

__all__ = [
    "GPU_LOST_MEANING",
    "PROCESS_LIST_PERIOD_S",
    "PROCESS_SAMPLE_MAX_AGE_S",
    "UTILIZATION_PERIOD_S",
    "NvmlSource",
    "NvmlUnavailable",
]

#: Device utilisation and per-process SM samples are read again once this old, in seconds:
#: the driver refreshes them every 1/6 s to 1 s, so at 20 Hz most reads would repeat.
UTILIZATION_PERIOD_S = 0.125
#: A GPU's process list is read again whenever the device's used memory differs from what
#: it was when the list was read (a process came, went, grew or shrank), and at least this
#: often, in seconds (what memory alone cannot show: one process freeing what another
#: allocated in the same tick).
PROCESS_LIST_PERIOD_S = 1.0

#: What a device that NVML reports lost is, in words.
GPU_LOST_MEANING = "GPU is lost: NVML can no longer reach it"


class NvmlUnavailable(UserError):
    """NVML cannot be used on this machine (no ``pynvml``, no driver, no GPU)."""


def gpus_here(nvml: Any = None) -> int:
    """How many GPUs NVML sees on this host: 0 where it cannot be used (no nvidia-ml-py,
    no driver).  For the agent's start, to refuse simulating devices where real ones are
    (they would put offline jobs beside online load nothing measures)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return 0
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError, or a library that does not load: no GPU to measure
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


@dataclass
class _Slot:
    """One device offered: a whole GPU or a MIG instance."""

    info: DeviceInfo
    #: the device's own handle (the MIG device handle for an instance)
    handle: Any
    #: NVML index and handle of the GPU (the parent, for an instance)
    gpu: int
    gpu_handle: Any
    #: per-process samples (whole GPUs only)
    samples: ProcessSamples | None
    #: what was read less often than memory (whole GPUs only)
    readings: Readings | None = None

    @property
    def mig(self) -> bool:
        return self.info.mig_gpu_instance is not None


class NvmlSource:
    """Samples online usage on this node's GPUs with NVML, and watches their faults.

    ``nvml`` is the ``pynvml`` module (imported here when ``None``) or a stand-in such as
    :class:`~ebbtide.workers.headroom.fake_nvml.FakeNvml`.  ``indices`` limits the source
    to those NVML GPU indices, MIG instances included (default: all).  ``clock`` (Unix
    seconds) stamps the faults the XID watcher sees; ``event_wait_ms`` is how long one
    wait for an XID event lasts (``close`` waits about that long).  Thread-safe: samples
    are serialised.

    Memory is read at every sample; a GPU's utilisation and per-process samples once
    ``utilization_period_s`` old, its process list when the used memory moved or once
    ``process_list_period_s`` old (0: everything at every sample).  A sample's ``now``
    is the clock these ages count on (one that steps back reads everything again).
    """

    def __init__(
        self,
        nvml: Any = None,
        indices: Iterable[int] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        event_wait_ms: int = EVENT_WAIT_MS,
        utilization_period_s: float = UTILIZATION_PERIOD_S,
        process_list_period_s: float = PROCESS_LIST_PERIOD_S,
    ) -> None:
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
        self._lists = ListReader(nvml)
        self._clock = clock
        self._utilization_period_s = utilization_period_s
        self._process_list_period_s = process_list_period_s
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"cannot initialise NVML: {exc}; is the NVIDIA driver installed? "
                "use --headroom static or trace:PATH on machines without GPUs"
            ) from None
        self._lock = threading.Lock()
        self._closed = False
        self._faults_lock = threading.Lock()
        self._faults: list[DeviceFault] = []
        try:
            self._slots = self._open_devices(indices)
            #: per slot: None while it answers; else whether the fault it is down for is `lost`
            self._down: list[bool | None] = [None] * len(self._slots)
            self._position = {slot.info.index: pos for pos, slot in enumerate(self._slots)}
            handles = HandleIndex()
            gpus: dict[int, Any] = {}
            for slot in self._slots:
                handles.add(slot.handle, slot.info.uuid, (slot.gpu, slot.info.mig_gpu_instance))
                gpus[slot.gpu] = slot.gpu_handle
            for gpu, handle in gpus.items():
                handles.add(handle, None, (gpu, None))
            self._watcher = XidWatcher(
                nvml, list(gpus.items()), handles, self._on_xid, wait_ms=event_wait_ms
            )
        except BaseException:
            nvml.nvmlShutdown()
            raise

    # -- devices ------------------------------------------------------------------------

    def _open_devices(self, indices: Iterable[int] | None) -> list[_Slot]:
        nvml = self._nvml
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise NvmlUnavailable("NVML reports no GPU on this machine")
        wanted = set(range(count)) if indices is None else set(indices)
        for gpu in sorted(wanted):
            if not 0 <= gpu < count:
                raise NvmlUnavailable(f"no GPU with index {gpu}: NVML reports {count}")
        if not wanted:
            raise NvmlUnavailable("no GPU selected")
        slots: list[_Slot] = []
        index = 0  # ebbtide's numbering runs over every GPU of the node, selected or not
        for gpu in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
                carved = self._carve(handle)
            except nvml.NVMLError as exc:
                if gpu in wanted:
                    raise NvmlUnavailable(f"cannot open GPU {gpu}: {exc}") from None
                log.warning("nvml: GPU %d (not used) cannot be read: %s; counted as one", gpu, exc)
                index += 1
                continue
            if gpu in wanted:
                if not carved:
                    log.warning("nvml: GPU %d is in MIG mode with no MIG instance: unused", gpu)
                for device_handle, gi in carved:
                    slots.append(self._slot(index, gpu, handle, device_handle, gi))
                    index += 1
            else:
                index += len(carved)
        if not slots:
            raise NvmlUnavailable("no GPU or MIG instance to offer on this machine")
        return slots

    def _carve(self, handle: Any) -> list[tuple[Any, int | None]]:
        """The devices one GPU offers: itself, or its MIG instances (handle, GPU-instance id)."""
        nvml = self._nvml
        try:
            mig_mode = nvml.nvmlDeviceGetMigMode(handle)[0]
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            mig_mode = None
        if mig_mode != nvml.NVML_DEVICE_MIG_ENABLE:
            return [(handle, None)]
        carved: list[tuple[Any, int | None]] = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue
            carved.append((mig, int(nvml.nvmlDeviceGetGpuInstanceId(mig))))
        return carved

    def _slot(self, index: int, gpu: int, gpu_handle: Any, handle: Any, gi: int | None) -> _Slot:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        info = DeviceInfo(
            index=index,
            memory_mib=int(memory.total // MIB_B),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            mig_parent=None if gi is None else gpu,
            mig_gpu_instance=gi,
        )
        if gi is not None:
            return _Slot(info, handle, gpu, gpu_handle, None)
        return _Slot(info, handle, gpu, gpu_handle, ProcessSamples(), Readings())

    def devices(self) -> list[DeviceInfo]:
        return [slot.info for slot in self._slots]

    @property
    def watching_xids(self) -> bool:
        """Whether XID events are watched (False: no GPU here reports them)."""
        return self._watcher.active

    # -- samples ------------------------------------------------------------------------

    def sample(self, now: float, offline: Offline = NO_OFFLINE) -> list[DeviceSample]:
        owners = OwnersOnce(offline)
        with self._lock:
            if self._closed:
                raise RuntimeError("NvmlSource.sample() called after close()")
            gpu_processes: dict[int, Any] = {}  # one process list per GPU and sample
            samples = []
            for pos, slot in enumerate(self._slots):
                try:
                    if slot.mig:
                        sample = self._sample_instance(slot, now, owners, gpu_processes)
                    else:
                        sample = self._sample_gpu(slot, now, owners)
                except self._nvml.NVMLError as exc:
                    sample = self._worst_case(pos, slot, now, exc)
                else:
                    self._answered(pos)
                samples.append(sample)
            return samples

    def _sample_gpu(self, slot: _Slot, now: float, offline: OwnersOnce) -> DeviceSample:
        nvml = self._nvml
        readings, samples = slot.readings, slot.samples
        assert readings is not None and samples is not None
        used_b = int(nvml.nvmlDeviceGetMemoryInfo(slot.handle).used)
        listed = self._listed(slot, readings, used_b, now, offline)
        utilization_due = not fresh_at(readings.utilization_at, now, self._utilization_period_s)
        if utilization_due:
            readings.utilization_pct = float(nvml.nvmlDeviceGetUtilizationRates(slot.handle).gpu)
            readings.utilization_at = now
        # per-process samples are read with the utilisation they are subtracted from (or
        # at once when ebbtide's processes appear), so that ebbtide's own kernels do not
        # look like online ones
        if (
            listed.ours
            and readings.shares_supported
            and (utilization_due or readings.shares_at < readings.utilization_at)
        ):
            readings.shares_at = now
            try:
                samples.read(self._lists, slot.handle, now)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission):
                readings.shares_supported = False
        index = slot.info.index
        shares = None
        if listed.ours and readings.shares_supported:
            shares = samples.fresh(listed.processes, now)
        made_from = (
            readings.utilization_pct,
            readings.shares_supported,
            shares,
            offline.granted_compute_pct(index),
        )
        last = readings.last
        if (
            last is not None
            and readings.last_listed is listed
            and readings.last_from == made_from
            and last.time <= now
        ):
            # the same processes, utilisation and samples: the same figures, at ``now``
            return last.at(now)
        sample = figures(index, now, listed, *made_from)
        readings.last, readings.last_listed, readings.last_from = sample, listed, made_from
        return sample

    def _listed(
        self, slot: _Slot, readings: Readings, used_b: int, now: float, offline: OwnersOnce
    ) -> Listed:
        """The GPU's process list and whose each process is: read again when the used
        memory moved or the list is ``process_list_period_s`` old; the owners asked again
        when the list was read again or ``offline`` says its answers may have changed."""
        listed = readings.listed
        if (
            listed is None
            or listed.used_b != used_b
            or not fresh_at(listed.at, now, self._process_list_period_s)
        ):
            processes = self._processes(slot.handle, readings=readings)
            listed = Listed(at=now, used_b=used_b, processes=processes)
        elif listed.epoch is not None and (
            listed.offline is offline.inner and listed.epoch == offline.epoch
        ):
            return listed  # the same processes, the same owners
        owners = {pid: job for pid in listed.processes if (job := offline.owner(pid)) is not None}
        online_mib, offline_mib = memory_split(listed.processes, owners, used_b)
        readings.listed = listed = Listed(
            at=listed.at,
            used_b=used_b,
            processes=listed.processes,
            offline=offline.inner,
            epoch=offline.epoch,
            ours=frozenset(owners),
            online_pids=tuple(sorted(pid for pid in listed.processes if pid not in owners)),
            online_mib=online_mib,
            offline_mib=offline_mib,
            owners=owners,
        )
        return listed

    def _sample_instance(
        self, slot: _Slot, now: float, offline: OwnersOnce, gpu_processes: dict[int, Any]
    ) -> DeviceSample:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(slot.handle)
        if slot.gpu not in gpu_processes:
            try:
                gpu_processes[slot.gpu] = self._processes(slot.gpu_handle, by_instance=True)
            except nvml.NVMLError_NoPermission:  # only root sees all instances' processes
                gpu_processes[slot.gpu] = None
            except nvml.NVMLError as exc:
                gpu_processes[slot.gpu] = exc
        listed = gpu_processes[slot.gpu]
        if isinstance(listed, Exception):
            raise listed
        if listed is None:
            processes = self._processes(slot.handle)
        else:
            gi = slot.info.mig_gpu_instance
            processes = {pid: used for pid, (used, on) in listed.items() if on == gi}
        owners = {pid: job for pid in processes if (job := offline.owner(pid)) is not None}
        online_mib, offline_mib = memory_split(processes, owners, int(memory.used))
        online_pids = tuple(sorted(pid for pid in processes if pid not in owners))
        return DeviceSample(
            index=slot.info.index,
            time=now,
            online_compute_pct=100.0 if online_pids else 0.0,
            online_memory_mib=online_mib,
            offline_compute_pct=None,
            offline_memory_mib=offline_mib,
            basis=ComputeBasis.INSTANCE.value,
            online_pids=online_pids,
            offline_jobs=by_job(processes, owners, None),
        )

    def _processes(
        self, handle: Any, *, by_instance: bool = False, readings: Readings | None = None
    ) -> Any:
        """pid → usedGpuMemory in bytes (``None``: unknown), compute and graphics together;
        with ``by_instance``, pid → (that, GPU-instance id).  ``readings``: a GPU that
        said once that it lists no graphics processes is not asked again."""
        nvml = self._nvml
        listed = self._lists.compute_processes(handle)
        if readings is None or readings.graphics:
            try:
                listed += self._lists.graphics_processes(handle)
            except nvml.NVMLError_NotSupported:
                if readings is not None:
                    readings.graphics = False
        memory_b: dict[int, int | None] = {}
        instance: dict[int, int | None] = {}
        for proc in listed:
            used = proc.usedGpuMemory
            if proc.pid in memory_b:  # listed as both compute and graphics: one allocation
                seen = memory_b[proc.pid]
                used = None if used is None or seen is None else max(used, seen)
            memory_b[proc.pid] = used
            instance[proc.pid] = proc.gpuInstanceId
        if by_instance:
            return {pid: (used, instance[pid]) for pid, used in memory_b.items()}
        return memory_b

    # -- faults -------------------------------------------------------------------------

    def _worst_case(self, pos: int, slot: _Slot, now: float, exc: Exception) -> DeviceSample:
        lost = isinstance(exc, self._nvml.NVMLError_GpuIsLost)
        meaning = GPU_LOST_MEANING if lost else f"NVML cannot read the device: {exc}"
        fault = DeviceFault(slot.info.index, now, None, meaning, lost=lost, disabling=True)
        if self._went_down(pos, fault):
            log.error("nvml: device %d does not answer: %s", slot.info.index, meaning)
        basis = ComputeBasis.INSTANCE if slot.mig else ComputeBasis.DEVICE
        return DeviceSample(
            index=slot.info.index,
            time=now,
            online_compute_pct=100.0,
            online_memory_mib=float(slot.info.memory_mib),
            basis=basis.value,
            ok=False,
        )

    def _went_down(self, pos: int, fault: DeviceFault) -> bool:
        """Queue ``fault`` unless the device is already down for one at least as bad."""
        with self._faults_lock:
            down = self._down[pos]
            if down is not None and (down or not fault.lost):
                return False
            self._down[pos] = fault.lost
            self._faults.append(fault)
            return True

    def _answered(self, pos: int) -> None:
        if self._down[pos] is None:  # the common case, without the lock
            return
        with self._faults_lock:
            if self._down[pos] is not None:
                self._down[pos] = None
                log.info("nvml: device %d answers again", self._slots[pos].info.index)

    def _on_xid(self, gpu: int, gpu_instance: int | None, xid: int) -> None:
        """An XID on GPU ``gpu`` (the watcher thread): a fault for each device it hits."""
        now = self._clock()
        hit = [pos for pos, slot in enumerate(self._slots) if slot.gpu == gpu]
        if gpu_instance is not None and any(self._slots[p].mig for p in hit):
            mine = [p for p in hit if self._slots[p].info.mig_gpu_instance == gpu_instance]
            if mine:
                hit = mine
            else:  # an instance made since ebbtide started: the whole GPU, to be safe
                log.warning(
                    "nvml: XID %d on MIG instance %d of GPU %d, unknown here: "
                    "taken as a fault of the whole GPU",
                    xid,
                    gpu_instance,
                    gpu,
                )
        if not hit:
            return
        action = read_recovery_action(self._nvml, self._slots[hit[0]].gpu_handle)
        lost = xid in LOST_XIDS
        for pos in hit:
            fault = DeviceFault(
                index=self._slots[pos].info.index,
                time=now,
                xid=xid,
                meaning=xid_meaning(xid),
                recovery_action=action.value,
                lost=lost,
                disabling=disables_device(xid, action),
            )
            if lost:
                self._went_down(pos, fault)
            else:
                with self._faults_lock:
                    self._faults.append(fault)
        log.warning(
            "nvml: %s on device(s) %s (recovery action: %s)",
            xid_meaning(xid),
            ", ".join(str(self._slots[p].info.index) for p in hit),
            action.value,
        )

    def faults(self) -> list[DeviceFault]:
        with self._faults_lock:
            faults, self._faults = self._faults, []
        return faults

    def check(self, index: int) -> str | None:
        """``None`` when device ``index`` answers (memory, and utilisation for a whole GPU)
        and the driver asks for no recovery action; else why not, in a few words."""
        if index not in self._position:
            raise ValueError(f"no device with index {index} here")
        slot = self._slots[self._position[index]]
        nvml = self._nvml
        with self._lock:
            if self._closed:
                raise RuntimeError("NvmlSource.check() called after close()")
        try:
            nvml.nvmlDeviceGetMemoryInfo(slot.handle)
            if not slot.mig:
                nvml.nvmlDeviceGetUtilizationRates(slot.handle)
        except nvml.NVMLError_GpuIsLost:
            return GPU_LOST_MEANING
        except nvml.NVMLError as exc:
            return f"NVML cannot read the device: {exc}"
        action = read_recovery_action(nvml, slot.gpu_handle)
        if action not in (RecoveryAction.NONE, RecoveryAction.UNKNOWN):
            return f"the driver asks for a recovery action: {action.value.replace('_', ' ')}"
        return None

    def close(self) -> None:
        """Stop the XID watcher and shut NVML down (once; later calls do nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._watcher.close()
        self._nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    """NVML strings: ``str`` in recent pynvml, ``bytes`` in old releases."""
    return value.decode() if isinstance(value, bytes) else str(value)
