"""The simulation's agenda gives events in the order one heap of ``(t, seq)`` does, with
pushes between pops as the event loop makes them: into the current bucket, onto its
edge, far ahead, at the instant just popped, and at infinity (never)."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from ebbtide.sim.agenda import BUCKET_S, Agenda


def _random_time(rng: random.Random, now: float) -> float:
    return rng.choice(
        [
            now,
            now + rng.uniform(0.0, 0.05),
            now + rng.uniform(0.0, 3.0),
            (math.floor(now / BUCKET_S) + rng.randint(1, 3)) * BUCKET_S,  # a bucket's edge
            now + rng.uniform(0.0, 700.0),
            math.inf,
        ]
    )


@pytest.mark.parametrize("seed", range(5))
def test_events_come_in_the_order_of_one_heap(seed: int) -> None:
    rng = random.Random(seed)
    agenda, heap, seq = Agenda(), [], 0
    now = 0.0
    for _ in range(200):
        t = _random_time(rng, now)
        agenda.push(t, 1, seq)
        heapq.heappush(heap, (t, seq, 1, seq, None))
        seq += 1
    end = 2000.0
    while True:
        got = agenda.pop_before(end)
        want = heapq.heappop(heap) if heap and heap[0][0] < end else None
        assert got == want
        if got is None:
            break
        now = got[0]
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            t = _random_time(rng, now)
            agenda.push(t, 2, seq, "aux")
            heapq.heappush(heap, (t, seq, 2, seq, "aux"))
            seq += 1
    assert all(t >= end for t, *_ in heap)


def test_nothing_at_or_past_the_end_comes_out() -> None:
    agenda = Agenda()
    agenda.push(5.0, 1)
    agenda.push(4.5, 1)
    assert agenda.pop_before(4.0) is None
    assert agenda.pop_before(5.0) == (4.5, 1, 1, None, None)
    assert agenda.pop_before(5.0) is None
    assert agenda.pop_before(5.5) == (5.0, 0, 1, None, None)
    assert len(agenda) == 0
