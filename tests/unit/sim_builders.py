"""Shared pieces for the simulator's unit tests."""

from __future__ import annotations

from ebbtide.sim.online import DeviceLoad, OnlineLoad
from ebbtide.sim.timing import Latencies

GIB = 1024.0


class Fixed(Latencies):
    """Latencies without randomness: sampling 20 ms, exit 100 ms, reaping 10 ms."""

    def __init__(self) -> None:
        super().__init__(0)

    def sample_delay(self) -> float:
        return 0.02

    def exit_latency(self) -> float:
        return 0.1

    def reap_latency(self) -> float:
        return 0.01


def online(
    *steps: list[tuple[float, float, float]],
    span: float,
    memory_mib: float = 80 * GIB,
    origin: float = 0.0,
) -> OnlineLoad:
    """Devices (one a list of steps) whose online (compute %, memory MiB) steps at the
    given times."""
    devices = tuple(
        DeviceLoad(
            f"d{k}",
            tuple(t for t, _, _ in s),
            tuple(c for _, c, _ in s),
            tuple(m for _, _, m in s),
            span,
        )
        for k, s in enumerate(steps)
    )
    return OnlineLoad("test", devices, memory_mib, span, origin, 60.0)
