"""Admins' drains in memory: :class:`~ebbtide.queue.drains.Drains`' behaviour over a dict,
one row per node and device, kept after an undrain as the record of the last word."""

from __future__ import annotations

import threading

from ebbtide.clock import Clock
from ebbtide.queue.drains import DRAINED, UNDRAINED, Drain


class MemoryDrains:
    """The ``device_drains`` table as a dict keyed by ``(node, device)``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        #: (node, device) → (state, by, reason, at)
        self._rows: dict[tuple[str, int], tuple[str, str, str, float]] = {}

    def drain(self, node: str, device: int, *, by: str, reason: str = "") -> None:
        """Nothing new goes to ``node``/``device`` (:data:`WHOLE_NODE`: any device)."""
        with self._lock:
            self._rows[(node, device)] = (DRAINED, by, reason, self.clock.time())

    def undrain(self, node: str, device: int, *, by: str) -> None:
        """Back in service (for :data:`WHOLE_NODE`, the node's own drain only: a device
        drained on its own stays drained)."""
        with self._lock:
            self._rows[(node, device)] = (UNDRAINED, by, "", self.clock.time())

    def drained(self) -> list[Drain]:
        """Every drain in force, by node and device."""
        with self._lock:
            return [
                Drain(node, device, by, reason, at)
                for (node, device), (state, by, reason, at) in sorted(self._rows.items())
                if state == DRAINED
            ]

    def undrains(self, node: str) -> dict[int, float]:
        """When each device of ``node`` was last undrained (:data:`WHOLE_NODE` included)."""
        with self._lock:
            return {
                device: at
                for (name, device), (state, _, _, at) in self._rows.items()
                if name == node and state == UNDRAINED
            }
