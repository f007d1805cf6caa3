"""The agent's hot paths, written for speed (the simulator runs them at nearly every
sample), decide what their plain versions did: :func:`pause_victims` (and its search) and
:func:`overflow` against the straightforward code they replaced, kept here, over random
devices: priorities, pausable or not, paused, suspended, evicting, whole-GPU and
protected slices, slices on other devices, and groups large enough that the search gives
up after ``PAUSE_SEARCH_STEPS``."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from itertools import groupby

import pytest

from ebbtide.preemption.cover import _FIT_EPS, PAUSE_SEARCH_STEPS
from ebbtide.preemption.victims import (
    compute_used,
    pause_victims,
    victim_order_key,
)
from ebbtide.queue.states import JobState
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, on_device, overflow
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins

from .builders import NOW, att, dev


def _pause_victims_as_before(
    active: Sequence[ActiveAttempt],
    need_compute: float,
    now: float,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
) -> list[ActiveAttempt]:
    need = need_compute
    candidates = []
    for a in active:
        if a.evicting:
            need -= compute_used(a)
        elif compute_used(a) > 0 and (is_protected is None or not is_protected(a)):
            candidates.append(a)
    if need <= 0 or not candidates:
        return []
    if len(candidates) == 1:
        return candidates
    candidates.sort(key=lambda a: (a.priority, not a.pausable, *victim_order_key(a, now)))
    picked: list[ActiveAttempt] = []
    left = need
    for (_, pausable), group in groupby(candidates, key=lambda a: (a.priority, a.pausable)):
        if left <= 0:
            break
        members = list(group)
        if pausable:
            chosen = _smallest_cover_as_before(members, left)
        else:
            chosen, got = [], 0.0
            for a in members:
                if got >= left:
                    break
                chosen.append(a)
                got += compute_used(a)
        picked += chosen
        left -= sum(compute_used(a) for a in chosen)
    for a in list(reversed(picked)):
        rest = [p for p in picked if p is not a]
        if sum(compute_used(p) for p in rest) >= need:
            picked = rest
    return picked


def _smallest_cover_as_before(group: Sequence[ActiveAttempt], need: float) -> list[ActiveAttempt]:
    sizes = [compute_used(a) for a in group]
    if len(group) == 1 or sum(sizes) <= need + _FIT_EPS:
        return list(group)
    by_size: dict[float, list[int]] = {}
    for i, size in enumerate(sizes):
        by_size.setdefault(size, []).append(i)
    kinds = sorted(by_size.items(), key=lambda kv: -kv[0])
    left = [0.0] * (len(kinds) + 1)
    for j in range(len(kinds) - 1, -1, -1):
        left[j] = left[j + 1] + kinds[j][0] * len(kinds[j][1])
    total, first = 0.0, 0
    while total < need - _FIT_EPS:
        total += sizes[first]
        first += 1
    best = (round(total, 6), first, tuple(range(first)))
    counts = [0] * len(kinds)
    steps = 0

    def visit(j: int, total: float) -> None:
        nonlocal best, steps
        steps += 1
        if total >= need - _FIT_EPS:
            key = (round(total, 6), sum(counts))
            if key > best[:2]:
                return
            members = tuple(
                sorted(i for (_, at), k in zip(kinds, counts, strict=True) for i in at[:k])
            )
            best = min(best, (*key, members))
            return
        if j == len(kinds) or total + left[j] < need - _FIT_EPS or steps > PAUSE_SEARCH_STEPS:
            return
        size, at = kinds[j]
        for k in range(len(at), -1, -1):
            if round(total + k * size, 6) > best[0] and k:
                continue
            counts[j] = k
            visit(j + 1, total + k * size)
        counts[j] = 0

    visit(0, 0.0)
    return [group[i] for i in best[2]]


def _overflow_as_before(
    device: DeviceView, active: Sequence[ActiveAttempt], margins: Margins
) -> tuple[float, float]:
    compute = memory = 0.0
    for a in on_device(device, active):
        if not a.suspended:
            memory += a.memory_mib
            if a.gpus == 0 and not a.paused:
                compute += a.compute_pct
    over_c = device.online_compute_pct + compute - (DEVICE_COMPUTE_PCT - margins.compute_pct)
    over_m = device.online_memory_mib + memory - (device.memory_mib - margins.memory_mib)
    return (max(0.0, over_c) if compute > 0 else 0.0), max(0.0, over_m)


def _random_slice(rng: random.Random, i: int, sizes: Sequence[float]) -> ActiveAttempt:
    a = att(
        i,
        node=rng.choice(["n", "n", "n", "other"]),
        devices=rng.choice([(0,), (0,), (1,)]),
        c=rng.choice(sizes),
        m=rng.choice([1024, 4096, 20480]),
        prio=rng.choice([0, 0, 0, 5]),
        gpus=rng.choice([0] * 9 + [1]),
        state=rng.choice([JobState.RUNNING] * 9 + [JobState.EVICTING]),
        started=rng.choice([None, NOW - rng.randint(0, 900)]),
        ckpt=rng.choice([None, NOW - rng.randint(0, 900)]),
    )
    paused = NOW - rng.randint(1, 60) if rng.random() < 0.2 else None
    suspended = paused if paused is not None and rng.random() < 0.3 else None
    return dataclasses.replace(
        a, pausable=rng.random() < 0.8, paused_at=paused, suspended_at=suspended
    )


@pytest.mark.parametrize("seed", range(6))
def test_pause_victims_pick_as_before(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [0.5, 5, 10, 11, 16, 22, 23, 25, 32, 33.3, 47, 50]
    for _ in range(400):
        active = [_random_slice(rng, i, sizes) for i in range(rng.randint(1, 11))]
        need = rng.uniform(-5, 1.1 * sum(a.compute_pct for a in active) + 1)
        guard = rng.choice([None, lambda a: a.job_id % 4 == 0])
        got = pause_victims(active, need, NOW, guard)
        assert got == _pause_victims_as_before(active, need, NOW, guard)


@pytest.mark.parametrize("seed", range(4))
def test_overflow_as_before(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        active = [_random_slice(rng, i, [5, 12.5, 25, 33.3, 50]) for i in range(rng.randint(0, 12))]
        device = dev(oc=rng.uniform(0, 100), om=rng.choice([0, 40000, 70000]))
        margins = Margins(rng.choice([0, 5, 10]), rng.choice([0, 2048]))
        assert overflow(device, active, margins) == _overflow_as_before(device, active, margins)


@pytest.mark.parametrize("seed", range(3))
def test_the_search_gives_up_where_it_did(seed: int) -> None:
    """Dozens of slices of as many sizes: the search stops after ``PAUSE_SEARCH_STEPS``
    steps, at the same step as before (so with the same best set)."""
    rng = random.Random(seed)
    for _ in range(100):
        active = [
            dataclasses.replace(
                att(i, c=round(rng.uniform(0.5, 50), 1), ckpt=NOW - rng.randint(0, 900)),
                pausable=True,
            )
            for i in range(rng.randint(20, 40))
        ]
        need = rng.uniform(10, 0.6 * sum(a.compute_pct for a in active))
        assert pause_victims(active, need, NOW) == _pause_victims_as_before(active, need, NOW)


@pytest.mark.parametrize("seed", range(4))
def test_the_listed_choices_pick_as_the_search(seed: int) -> None:
    """Slices of a few round sizes, as a device holds them, and needs on the sums of some
    of them (where choices tie on what they spare, and the float edge of covering): the
    listed choices pick what the search picked, for the same set of sizes in any order,
    asked again and again (the list is made once)."""
    rng = random.Random(seed)
    for _ in range(300):
        sizes = rng.sample([5, 10, 12.5, 20, 25, 30, 33.3, 50], rng.randint(1, 4))
        active = [
            dataclasses.replace(
                att(i, c=rng.choice(sizes), ckpt=NOW - rng.randint(0, 900)), pausable=True
            )
            for i in range(rng.randint(2, 12))
        ]
        for _ in range(5):
            rng.shuffle(active)
            some = rng.sample(active, rng.randint(1, len(active)))
            exact = sum(a.compute_pct for a in some)
            need = rng.choice([exact, exact - 1e-9, exact + 1e-9, exact - 0.4, rng.uniform(0, 60)])
            got = pause_victims(active, need, NOW)
            assert got == _pause_victims_as_before(active, need, NOW)
