"""What a simulation keeps for its plot: fleet load over time, one device in detail, and
every eviction's latency."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ebbtide.sim.online import OnlineLoad

if TYPE_CHECKING:
    from ebbtide.sim.state import SimDevice

#: How often the fleet aggregate is sampled, in simulated seconds.
RECORD_PERIOD_S = 60.0
#: A rise of online compute at least this large counts as eventful, in percent.
EVENTFUL_RISE_PCT = 10.0


def most_eventful(load: OnlineLoad) -> int:
    """The device whose online compute rises sharply most often (ties: the lowest index)."""

    def rises(k: int) -> int:
        c = load.devices[k].compute_pct
        return sum(1 for a, b in itertools.pairwise(c) if b - a >= EVENTFUL_RISE_PCT)

    return max(range(len(load.devices)), key=lambda k: (rises(k), -k))


@dataclass
class Recorder:
    device_k: int
    device_name: str
    period_s: float = RECORD_PERIOD_S
    #: fleet samples: time (s), online compute, offline compute in use, capacity (all in %)
    fleet: list[tuple[float, float, float, float]] = field(default_factory=list)
    #: the chosen device's step function: from time (s), online %, offline % in use
    device: list[tuple[float, float, float]] = field(default_factory=list)
    #: evictions on the chosen device: decision time (s)
    device_evictions: list[float] = field(default_factory=list)
    #: every eviction's decision time (s) and latency, spike (or decision) → free (s)
    evictions_t: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @classmethod
    def for_load(cls, load: OnlineLoad, device_k: int | None = None) -> Recorder:
        k = most_eventful(load) if device_k is None else device_k
        return cls(device_k=k, device_name=load.devices[k].name)

    def sample(self, now: float, devices: Sequence[SimDevice]) -> None:
        online = offline = capacity = 0.0
        for d in devices:
            if d.present:
                online += d.online_c
                offline += d.offline_in_use()
                capacity += 100.0
        self.fleet.append((now, online, offline, capacity))

    def device_point(self, t: float, online: float, offline: float) -> None:
        if self.device and self.device[-1][1:] == (online, offline):
            return
        self.device.append((t, online, offline))

    def eviction(self, k: int, t: float, latency_s: float) -> None:
        self.evictions_t.append(t)
        self.latencies.append(latency_s)
        if k == self.device_k:
            self.device_evictions.append(t)
