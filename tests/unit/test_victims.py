"""Victim selection: order, minimal set, in-flight evictions, compute vs memory needs."""

from __future__ import annotations

import pytest

from ebbtide.preemption.victims import select_victims, victim_order_key
from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt

from .builders import NOW, att

EVICTING = JobState.EVICTING


def ids(victims: list[ActiveAttempt]) -> list[int]:
    return [v.job_id for v in victims]


@pytest.mark.parametrize(
    ("active", "need", "expected"),
    [
        pytest.param(
            [att(1, prio=5, ckpt=NOW - 10), att(2, prio=0, ckpt=NOW - 3000)],
            (0, 1000),
            [2],
            id="lowest-priority-first-despite-more-lost-work",
        ),
        pytest.param(
            [att(1, ckpt=NOW - 100), att(2, ckpt=NOW - 10), att(3, ckpt=NOW - 50)],
            (0, 1000),
            [2],
            id="least-lost-work",
        ),
        pytest.param(
            [att(1, started=NOW - 50, ckpt=None), att(2, started=NOW - 3600, ckpt=NOW - 100)],
            (0, 1000),
            [1],
            id="lost-work-counts-from-start-without-checkpoint",
        ),
        pytest.param(
            [
                att(1, started=NOW - 500, ckpt=NOW - 10),
                att(2, started=NOW - 100, ckpt=NOW - 10),
                att(3, started=NOW - 300, ckpt=NOW - 10),
            ],
            (0, 1000),
            [2],
            id="most-recently-started-breaks-ties",
        ),
        pytest.param(
            [att(1, prio=1, ckpt=NOW - 1), att(2, prio=0, ckpt=NOW - 60), att(3, prio=0)],
            (0, 2000),
            [2, 3],
            id="two-needed-in-order",
        ),
        pytest.param(
            [att(1, dispatched=NOW - 20, started=None), att(2, ckpt=NOW - 60)],
            (0, 1000),
            [1],
            id="not-started-measured-from-dispatch",
        ),
    ],
)
def test_victim_order(
    active: list[ActiveAttempt], need: tuple[float, float], expected: list[int]
) -> None:
    assert ids(select_victims(active, need[0], need[1], NOW)) == expected


def test_victim_order_key() -> None:
    a = att(1, prio=2, started=NOW - 100, ckpt=NOW - 40)
    assert victim_order_key(a, NOW) == (2, 40.0, -(NOW - 100))


@pytest.mark.parametrize(
    ("attempt", "expected_s"),
    [
        pytest.param(att(1, dispatched=NOW - 90, started=NOW - 80, ckpt=NOW - 5), 5.0, id="ckpt"),
        pytest.param(att(1, dispatched=NOW - 90, started=NOW - 80), 80.0, id="start"),
        pytest.param(att(1, dispatched=NOW - 90, started=None), 90.0, id="dispatch"),
        pytest.param(att(1, started=NOW + 5), 0.0, id="never-negative"),
    ],
)
def test_lost_work_s(attempt: ActiveAttempt, expected_s: float) -> None:
    assert attempt.lost_work_s(NOW) == pytest.approx(expected_s)


@pytest.mark.parametrize(
    ("active", "need", "expected"),
    [
        pytest.param(
            [att(1, m=2048), att(2, m=2048), att(3, prio=1, m=16384)],
            (0, 10000),
            [3],
            id="big-victim-alone-spares-small-ones",
        ),
        pytest.param(
            [att(1, m=2048), att(2, prio=1, m=2048), att(3, prio=2, m=16384)],
            (0, 2048),
            [1],
            id="exact-cover-by-first",
        ),
        pytest.param(
            [att(1, c=5), att(2, prio=1, c=20)],
            (15, 0),
            [2],
            id="compute-earlier-pick-spared",
        ),
        pytest.param(
            [att(1, c=10, m=0), att(2, prio=1, c=10, m=4096)],
            (10, 4000),
            [2],
            id="one-covers-both-dimensions",
        ),
        pytest.param(
            [att(1, m=2048), att(2, prio=1, m=1024), att(3, prio=2, m=4096)],
            (0, 3000),
            [1, 2],
            id="two-small-kept-when-both-needed",
        ),
        pytest.param(
            [att(1, m=2048)],
            (0, 10000),
            [1],
            id="not-enough-takes-what-there-is",
        ),
    ],
)
def test_minimal_set(
    active: list[ActiveAttempt], need: tuple[float, float], expected: list[int]
) -> None:
    assert ids(select_victims(active, need[0], need[1], NOW)) == expected


@pytest.mark.parametrize(
    ("active", "need", "expected"),
    [
        pytest.param(
            [att(1, m=4096, state=EVICTING), att(2, m=4096)],
            (0, 3000),
            [],
            id="in-flight-covers-memory",
        ),
        pytest.param(
            [att(1, c=20, state=EVICTING), att(2, c=20)],
            (15, 0),
            [],
            id="in-flight-covers-compute",
        ),
        pytest.param(
            [att(1, m=2048, state=EVICTING), att(2, prio=1, m=1024), att(3, prio=2, m=1024)],
            (0, 3000),
            [2],
            id="in-flight-reduces-need",
        ),
        pytest.param(
            [att(1, prio=-5, m=1024, state=EVICTING), att(2, m=1024), att(3, m=1024)],
            (0, 5000),
            [2, 3],
            id="in-flight-never-picked-again",
        ),
        pytest.param(
            [att(1, c=100, m=0, gpus=1, state=EVICTING), att(2, c=20, m=0)],
            (15, 0),
            [2],
            id="in-flight-whole-gpu-frees-no-compute",
        ),
    ],
)
def test_in_flight(
    active: list[ActiveAttempt], need: tuple[float, float], expected: list[int]
) -> None:
    assert ids(select_victims(active, need[0], need[1], NOW)) == expected


@pytest.mark.parametrize(
    ("active", "need", "expected"),
    [
        pytest.param(
            [att(1, c=100, m=8192, gpus=1), att(2, prio=5, c=20, m=1024)],
            (10, 0),
            [2],
            id="compute-only-skips-whole-gpu",
        ),
        pytest.param(
            [att(1, c=50, m=0), att(2, prio=1, c=5, m=2048)],
            (0, 1000),
            [2],
            id="memory-only-skips-memoryless",
        ),
        pytest.param(
            [att(1, c=0, m=1024), att(2, prio=1, c=20, m=1024)],
            (10, 0),
            [2],
            id="compute-only-skips-computeless",
        ),
        pytest.param(
            [att(1, c=100, m=8192, gpus=1), att(2, prio=5, c=20, m=1024)],
            (0, 4096),
            [1],
            id="memory-only-takes-whole-gpu",
        ),
    ],
)
def test_compute_vs_memory(
    active: list[ActiveAttempt], need: tuple[float, float], expected: list[int]
) -> None:
    assert ids(select_victims(active, need[0], need[1], NOW)) == expected


@pytest.mark.parametrize(
    "need",
    [
        pytest.param((0, 0), id="zero"),
        pytest.param((-5, -100), id="negative"),
        pytest.param((0, -1), id="zero-and-negative"),
    ],
)
def test_no_need_no_victims(need: tuple[float, float]) -> None:
    active = [att(1, c=50, m=4096), att(2, c=100, m=4096, gpus=1)]
    assert select_victims(active, need[0], need[1], NOW) == []


def test_no_candidates() -> None:
    assert select_victims([], 10, 1000, NOW) == []
