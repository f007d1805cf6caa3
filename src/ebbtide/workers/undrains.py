"""Admins' undrains as a node agent's store thread takes them in (``ebb node undrain``):
each one new since the agent started is posted to its loop, which lifts a fault it
holds against the device.  Read every ``UNDRAIN_PERIOD_S``, with a reconcile: an
admin's action is not worth a read every reconcile (on a fleet of 1,000 nodes, 2,000
reads a second)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: How often an agent reads admins' undrains, in seconds.
UNDRAIN_PERIOD_S = 2.0


@dataclass(frozen=True)
class Undrain:
    """Store → loop: an admin returned these devices to service (-1: every one)."""

    index: int


class UndrainWatch:
    """One node's undrains, read at most every ``UNDRAIN_PERIOD_S``."""

    def __init__(self, node: str, post: Callable[[Any], None]) -> None:
        self.node = node
        self._post = post
        self._seen: dict[int, float] = {}
        self._next_s = 0.0

    def take_if_due(self, store: Any, now_s: float, started_at: float) -> None:
        """Read ``store``'s undrains for this node if ``UNDRAIN_PERIOD_S`` has passed
        since the last read (``now_s``: monotonic seconds), and post the new ones (one
        from before the agent started, ``started_at`` in wall time, is not news)."""
        if now_s < self._next_s:
            return
        self._next_s = now_s + UNDRAIN_PERIOD_S
        try:
            undrains = store.drains.undrains(self.node)
        except Exception:
            return
        for index, at in undrains.items():
            if self._seen.get(index) == at:
                continue
            first = index not in self._seen
            self._seen[index] = at
            if first and at < started_at:
                continue
            self._post(Undrain(index))
