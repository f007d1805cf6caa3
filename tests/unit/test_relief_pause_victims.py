"""Which attempts a compute spike pauses: priority first, pausable before evicted, then the
smallest compute that covers the need (a paused slice keeps its compute reserved, so every
percent paused beyond the need stays idle until the thaw)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from ebbtide.preemption.relief import relief_for_device
from ebbtide.preemption.victims import pause_victims, select_victims, victim_order_key
from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt, Margins, PauseRules

from .builders import NOW, att, dev


def pausable(a: ActiveAttempt) -> ActiveAttempt:
    return dataclasses.replace(a, pausable=True)


def ids(victims: list[ActiveAttempt]) -> list[int]:
    return sorted(v.job_id for v in victims)


@pytest.mark.parametrize(
    ("active", "need", "expected"),
    [
        pytest.param(
            [pausable(att(1, c=81, ckpt=NOW - 1)), pausable(att(2, c=11, ckpt=NOW - 500))],
            6,
            [2],
            id="the-small-slice-covers-it-though-more-work-since-its-checkpoint",
        ),
        pytest.param(
            [pausable(att(1, c=47)), pausable(att(2, c=32)), pausable(att(3, c=16))],
            48,
            [2, 3],
            id="two-small-spare-less-than-one-big",
        ),
        pytest.param(
            [pausable(att(1, c=47)), pausable(att(2, c=32)), pausable(att(3, c=16))],
            50,
            [1, 3],
            id="least-to-spare",
        ),
        pytest.param(
            [pausable(att(1, c=20)), pausable(att(2, c=10)), pausable(att(3, c=10))],
            20,
            [1],
            id="equal-compute-fewest-attempts",
        ),
        pytest.param(
            [pausable(att(1, c=30, prio=5)), pausable(att(2, c=81, prio=0))],
            10,
            [2],
            id="lowest-priority-first-whatever-its-size",
        ),
        pytest.param(
            [pausable(att(1, c=10, prio=0)), pausable(att(2, c=30, prio=5))],
            20,
            [2],
            id="one-that-covers-it-alone-spares-the-others-as-for-evictions",
        ),
        pytest.param(
            [att(1, c=10), pausable(att(2, c=50))],
            5,
            [2],
            id="a-pause-before-an-eviction",
        ),
        pytest.param(
            [att(1, c=10), pausable(att(2, c=50))],
            55,
            [1, 2],
            id="evicted-only-for-what-pauses-cannot-free",
        ),
        pytest.param(
            [pausable(att(1, c=30)), pausable(att(2, c=30, state=JobState.EVICTING))],
            25,
            [],
            id="an-attempt-being-evicted-counts-as-freed",
        ),
        pytest.param(
            [pausable(att(1, c=100, gpus=1)), pausable(att(2, c=30))],
            10,
            [2],
            id="a-whole-gpu-slice-frees-no-compute",
        ),
        pytest.param(
            [pausable(att(1, c=30)), pausable(att(2, c=20))],
            80,
            [1, 2],
            id="all-when-together-they-do-not-cover-it",
        ),
        pytest.param([pausable(att(1, c=30))], 0, [], id="no-need"),
    ],
)
def test_pause_victims(active: list[ActiveAttempt], need: float, expected: list[int]) -> None:
    assert ids(pause_victims(active, need, NOW)) == expected


def test_protected_attempts_are_never_taken() -> None:
    active = [pausable(att(1, c=10)), pausable(att(2, c=50))]
    got = pause_victims(active, 5, NOW, is_protected=lambda a: a.job_id == 1)
    assert ids(got) == [2]


def test_a_spike_pauses_the_slice_that_leaves_least_idle() -> None:
    """Online compute rises to 20 % beside an 81 % and an 11 % slice: 7 % must go.  The
    11 % slice is paused, not the 81 % one (which would leave 74 % idle for the pause)."""
    active = [pausable(att(1, c=81, ckpt=NOW - 1)), pausable(att(2, c=11, ckpt=NOW - 500))]
    got = relief_for_device(dev(oc=10), active, Margins(5, 0), NOW, PauseRules())
    assert [(r.job_id, r.kind.value) for r in got] == [(2, "pause")]


def brute_force(active: list[ActiveAttempt], need: float) -> set[int]:
    """The set of least compute that covers ``need``, then fewest, then earliest in the
    victim order (one priority, all pausable)."""
    order = sorted(active, key=lambda a: victim_order_key(a, NOW))
    if sum(a.compute_pct for a in order) <= need:
        return {a.job_id for a in order}
    best: tuple[float, int, tuple[int, ...]] | None = None
    for r in range(1, len(order) + 1):
        for picked in itertools.combinations(range(len(order)), r):
            total = sum(order[i].compute_pct for i in picked)
            if total >= need - 1e-9:
                key = (round(total, 6), r, picked)
                best = key if best is None else min(best, key)
    assert best is not None
    return {order[i].job_id for i in best[2]}


@pytest.mark.parametrize("seed", range(4))
def test_the_search_finds_what_trying_every_set_finds(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [5, 11, 16, 22, 23, 32, 47, 33.3, 0.5]
    for _ in range(300):
        active = [
            pausable(att(i, c=rng.choice(sizes), ckpt=NOW - rng.randint(0, 100)))
            for i in range(rng.randint(1, 9))
        ]
        need = rng.uniform(0.1, 1.1 * sum(a.compute_pct for a in active))
        assert {a.job_id for a in pause_victims(active, need, NOW)} == brute_force(active, need)


@pytest.mark.parametrize("seed", range(4))
def test_with_no_pausable_attempt_the_pick_is_the_eviction_order(seed: int) -> None:
    """Attempts that may not pause are evicted, which loses their work since their last
    checkpoint: the pick is select_victims' own, priorities and all."""
    rng = random.Random(seed)
    for _ in range(300):
        active = [
            att(
                i,
                c=rng.choice([5, 10, 22, 47, 81]),
                prio=rng.choice([0, 0, 5]),
                ckpt=NOW - rng.randint(0, 100),
                state=JobState.EVICTING if rng.random() < 0.1 else JobState.RUNNING,
            )
            for i in range(rng.randint(1, 8))
        ]
        need = rng.uniform(0.1, 1.1 * sum(a.compute_pct for a in active))
        assert ids(pause_victims(active, need, NOW)) == ids(select_victims(active, need, 0, NOW))
