"""The simulation's events to come, in time order: a small heap for the current second
and a bucket a second for the rest.

A day of ``--tile 70`` (10,010 GPUs) is some 45 million events, and about 130,000 wait at
any instant (online steps a minute ahead, checkpoints, the agent's look at a pause ten
minutes on).  One heap of them all costs each push and pop some 17 levels of tuple
comparisons scattered over a large array; most events, though, fall within the next
second (the agent's samples, drains, reports).  So events of the current bucket
(``BUCKET_S`` wide) are kept in a heap, and those later in a list per bucket, made a
heap only when the clock reaches it.  The order is exactly that of one heap of
``(t, seq)``: every event of a bucket comes before every event of a later one, and within
a bucket the heap orders them as one heap would.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

#: Width of one bucket, in seconds (a power of two: ``t // BUCKET_S`` is exact).
BUCKET_S = 1.0

#: one event: (time, sequence number, kind, object, extra)
Event = tuple[float, int, int, Any, Any]


class Agenda:
    """Events in ``(t, seq)`` order; ``seq`` counts pushes, so that events of one instant
    come out in the order they went in."""

    def __init__(self) -> None:
        #: the current bucket's events (a heap), all before ``_near_end``
        self._near: list[Event] = []
        self._near_end = 0.0
        #: later events by bucket (plain lists), and the buckets held (a heap)
        self._far: dict[int, list[Event]] = {}
        self._far_keys: list[int] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._near) + sum(len(b) for b in self._far.values())

    def push(self, t: float, kind: int, obj: Any = None, aux: Any = None) -> None:
        """Event ``kind`` on ``obj`` (with ``aux``) at time ``t``, in seconds (one at
        infinity never comes, and is not kept)."""
        event = (t, self._seq, kind, obj, aux)
        self._seq += 1
        if t < self._near_end:
            heapq.heappush(self._near, event)
            return
        if t == math.inf:
            return
        b = int(t // BUCKET_S)
        bucket = self._far.get(b)
        if bucket is None:
            self._far[b] = [event]
            heapq.heappush(self._far_keys, b)
        else:
            bucket.append(event)

    def pop_before(self, end: float) -> Event | None:
        """The next event if it comes before ``end`` (taken off), else None (left)."""
        near = self._near
        if not near:
            if not self._far_keys:
                return None
            b = self._far_keys[0]
            if b * BUCKET_S >= end:
                return None
            heapq.heappop(self._far_keys)
            near = self._near = self._far.pop(b)
            heapq.heapify(near)
            self._near_end = (b + 1) * BUCKET_S
        if near[0][0] >= end:
            return None
        return heapq.heappop(near)
