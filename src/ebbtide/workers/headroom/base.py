"""The interface every headroom source implements, and the values it returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


@dataclass(frozen=True)
class DeviceInfo:
    """One device (GPU or MIG instance): compute capacity is always 100 units."""

    index: int
    memory_mib: int
    name: str = "simulated"
    uuid: str | None = None
    #: a MIG instance: the NVML index of the GPU it is carved from (``None``: a whole GPU)
    mig_parent: int | None = None
    #: a MIG instance: its GPU-instance id (what NVML's process list names it by)
    mig_gpu_instance: int | None = None

    @property
    def visible_id(self) -> str:
        """How ``CUDA_VISIBLE_DEVICES`` names this device: by its UUID when known
        (``GPU-…``, a MIG instance's ``MIG-…``: immune to CUDA's own device order), else
        by its index (simulated devices)."""
        return self.uuid or str(self.index)


class ComputeBasis(StrEnum):
    """How a sample told online compute apart from ebbtide's own."""

    #: no ebbtide process on the device: all of its utilisation is online
    DEVICE = "device"
    #: per-process SM samples: online = device utilisation − ebbtide's processes' share
    PROCESS = "process"
    #: no per-process samples: online = device utilisation − compute granted to slices
    SLICES = "slices"
    #: a MIG instance (no utilisation there): busy whenever an online process is on it
    INSTANCE = "instance"
    #: a planning-only source (DCGM through Prometheus): device level, seconds old
    PLANNING = "planning"
    #: a declared online usage (static, trace replay): nothing measured
    DECLARED = "declared"


@dataclass(frozen=True)
class JobUsage:
    """What one job's processes used of one device at one sample, as the source measured
    it (never as granted)."""

    job_id: int
    #: the sum of its processes' per-process SM samples, in percent of the device (a
    #: process without a fresh sample was idle); None: the source cannot tell per process
    compute_pct: float | None
    #: GPU memory its processes hold, in MiB; None: some process's is not reported
    memory_mib: float | None


@dataclass(frozen=True)
class DeviceSample:
    """What the online tenants use on one device at one instant.

    ``online_*`` counts only processes ebbtide did not launch (a GPU process is
    ebbtide's when it belongs to an attempt's process tree or cgroup; every other
    process is online).
    """

    index: int
    #: Unix seconds at which the sample was taken
    time: float
    #: online compute, in percent of the device's SMs (0–100)
    online_compute_pct: float
    #: online GPU memory, in MiB
    online_memory_mib: float
    #: what ebbtide's own processes use, in percent, when the source can tell (else None)
    offline_compute_pct: float | None = None
    #: GPU memory ebbtide's own processes hold, in MiB, when the source can tell
    offline_memory_mib: float | None = None
    #: how online compute was told apart (:class:`ComputeBasis`)
    basis: str = ComputeBasis.DECLARED.value
    #: False: too coarse or too late to trigger an eviction (used for planning only)
    eviction_trigger: bool = True
    #: False: the device did not answer this sample; the figures are then the worst case
    ok: bool = True
    #: host pids of the online processes seen on the device, ascending, when the source
    #: lists processes (NVML); what :func:`~ebbtide.workers.cgroups.online_pods` names
    online_pids: tuple[int, ...] = ()
    #: what each of ebbtide's jobs with a process on the device used, when the source
    #: attributes GPU use per process (NVML): a job not listed held nothing here.  None:
    #: the source cannot attribute (static, trace, Prometheus, a device that did not
    #: answer), and nothing may be inferred per job
    offline_jobs: tuple[JobUsage, ...] | None = None

    def at(self, time: float) -> DeviceSample:
        """The same figures at ``time``: ``dataclasses.replace(self, time=time)``, made
        without ``__init__`` (a tenth of its cost: a source that read nothing new repeats
        a sample per device 20 times a second, and the figures were checked when made)."""
        again = object.__new__(type(self))
        again.__dict__.update(self.__dict__, time=time)
        return again


class Offline(Protocol):
    """What ebbtide runs on a node, as a headroom source needs to tell it from online."""

    def owner(self, pid: int) -> int | None:
        """The job id of the attempt that owns process ``pid``; ``None``: online."""
        ...

    def granted_compute_pct(self, index: int) -> float:
        """Compute granted to offline slices on device ``index``, in percent."""
        ...

    def granted_memory_mib(self, index: int) -> float:
        """GPU memory granted to offline slices on device ``index``, in MiB."""
        ...


@dataclass(frozen=True)
class KnownPids:
    """An :class:`Offline` from plain tables: ``pids`` maps pid → job id, ``granted``
    maps device index → (compute %, memory MiB) granted (tests, and sources that need
    no more)."""

    pids: Mapping[int, int] = field(default_factory=dict)
    granted: Mapping[int, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, pids: set[int] | frozenset[int], job_id: int = 0) -> KnownPids:
        return cls({pid: job_id for pid in pids})

    def owner(self, pid: int) -> int | None:
        return self.pids.get(pid)

    def granted_compute_pct(self, index: int) -> float:
        return self.granted.get(index, (0.0, 0.0))[0]

    def granted_memory_mib(self, index: int) -> float:
        return self.granted.get(index, (0.0, 0.0))[1]


#: Nothing of ebbtide's runs here.
NO_OFFLINE = KnownPids()


class RecoveryAction(StrEnum):
    """What the driver says a faulty GPU needs (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``)."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    BUS_RESET = "bus_reset"
    SYSTEM_REBOOT = "system_reboot"
    #: the driver does not report one (older than R550, or not supported here)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class DeviceFault:
    """A fault seen on one device: an XID event, or the GPU gone from the bus."""

    index: int
    #: Unix seconds it was seen
    time: float
    #: the XID number, if the fault came as one
    xid: int | None
    #: in words, e.g. ``XID 79: GPU has fallen off the bus``
    meaning: str
    recovery_action: str = RecoveryAction.UNKNOWN.value
    #: True: the device is gone (off the bus, "GPU is lost"): slices are freed by killing
    lost: bool = False
    #: False: an error of the application that hit it (XID 13, 31, 43, …): logged, and
    #: the device stays in service
    disabling: bool = True


class HeadroomSource(Protocol):
    """Samples online usage on the devices of one node, and reports their faults."""

    def devices(self) -> list[DeviceInfo]:
        """The devices this node offers, in index order."""
        ...

    def sample(self, now: float, offline: Offline = NO_OFFLINE) -> list[DeviceSample]:
        """One sample per device at ``now`` (Unix seconds).

        ``offline`` tells ebbtide's processes apart; a source that measures per process
        excludes them from online usage.  A device that does not answer yields a sample
        with ``ok=False`` and a fault from :meth:`faults`; ``sample`` itself does not raise
        for one broken device.
        """
        ...

    def faults(self) -> list[DeviceFault]:
        """Faults seen since the last call, oldest first (thread-safe; each is returned once)."""
        ...

    def check(self, index: int) -> str | None:
        """A health check of device ``index`` now: ``None`` if it passes, else why not."""
        ...

    def close(self) -> None: ...
