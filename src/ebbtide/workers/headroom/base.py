"""The interface every headroom source implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DeviceInfo:
    """One device (GPU or MIG instance): compute capacity is always 100 units."""

    index: int
    memory_mib: int
    name: str = "simulated"
    uuid: str | None = None


@dataclass(frozen=True)
class DeviceSample:
    """What the online tenants use on one device at one instant.

    ``online_*`` counts only processes ebbtide did not launch (every GPU process whose
    pid is not one of ours is online).
    """

    index: int
    #: Unix seconds at which the sample was taken
    time: float
    #: online compute, in percent of the device's SMs (0–100)
    online_compute_pct: float
    #: online GPU memory, in MiB
    online_memory_mib: float


class HeadroomSource(Protocol):
    """Samples online usage on the devices of one node."""

    def devices(self) -> list[DeviceInfo]:
        """The devices this node offers, in index order."""
        ...

    def sample(self, now: float, offline_pids: frozenset[int] = frozenset()) -> list[DeviceSample]:
        """One sample per device at ``now`` (Unix seconds).

        ``offline_pids`` are the processes ebbtide launched on this node (whole process
        groups); a source that measures per process excludes them from online usage.
        """
        ...

    def close(self) -> None: ...
