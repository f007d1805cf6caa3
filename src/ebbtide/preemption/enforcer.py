"""Eviction enforcement on the node: warn, wait for a checkpointed exit, kill at the deadline.

The :class:`EvictionClock` of one attempt records the times an eviction is judged by:
spike observed → warning sent → slice free, whether the deadline forced a kill, and
whether a checkpoint was taken after the warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EvictionClock:
    reason: str
    message: str
    #: Unix seconds the spike (or the decision) was observed
    spike_at: float
    #: the eviction deadline, in seconds from ``spike_at``
    deadline_s: float
    warned_at: float | None = None
    killed: bool = False
    freed_at: float | None = None
    checkpoint_after_warning: bool = False

    @property
    def deadline_at(self) -> float:
        return self.spike_at + self.deadline_s

    def due(self, now: float) -> bool:
        """True when the deadline leaves no more time: kill now."""
        return not self.killed and now >= self.deadline_at - KILL_LEAD_S

    def report(self, *, last_checkpoint_at: float | None, started_at: float) -> dict[str, Any]:
        """The ``evicted`` event's data."""
        assert self.freed_at is not None
        since = max(last_checkpoint_at or started_at, started_at)
        return {
            "reason": self.message,
            "reason_code": self.reason,
            "deadline_s": self.deadline_s,
            "spike_at": self.spike_at,
            "warned_at": self.warned_at,
            "freed_at": self.freed_at,
            "latency_s": round(self.freed_at - self.spike_at, 6),
            "killed": self.killed,
            "checkpointed": self.checkpoint_after_warning,
            "lost_work_s": round(max(0.0, self.freed_at - since), 6),
            "deadline_missed": self.freed_at > self.deadline_at,
        }


#: Kill this long before the deadline so the slice is free *by* it, in seconds.
KILL_LEAD_S = 0.15
