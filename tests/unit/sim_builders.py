"""Shared pieces for the simulator's unit tests."""

from __future__ import annotations

from ebbtide.sim.timing import Latencies


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
