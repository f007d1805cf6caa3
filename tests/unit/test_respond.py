"""``respond``: the node agent's decision step at one sample of one device, which the live
agent and the simulator both carry out.  Checked against the step done by hand (relieve,
look at the attempts again, thaw, look again, restore) on random devices and attempts,
and on the cases where doing the reliefs first changes what may be thawed."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ebbtide.preemption import relief
from ebbtide.preemption.relief import (
    NOTHING,
    ActionKind,
    relief_for_device,
    respond,
    restores_for_device,
    thaws_for_device,
)
from ebbtide.queue.states import JobState
from ebbtide.scheduling.snapshot import ActiveAttempt, Margins, PauseRules

from .builders import NOW, att, dev
from .test_agent_fast_path_calm import random_attempts, random_device

MARGINS = Margins(compute_pct=5, memory_mib=2048)


def by_hand(
    device, active: list[ActiveAttempt], rules: PauseRules, can_suspend
) -> tuple[list, list, list]:
    """The step as the agent used to take it: act on each relief, read the attempts
    again, then thaw, read again, then restore."""
    state = {(a.job_id, a.attempt): a for a in active}
    reliefs = relief_for_device(device, active, MARGINS, NOW, rules, None, can_suspend)
    for r in reliefs:
        key = (r.job_id, r.attempt)
        a = state[key]
        if r.kind is ActionKind.PAUSE:
            if a.paused_at is None:
                state[key] = dataclasses.replace(a, paused_at=NOW)
        elif r.kind is ActionKind.SUSPEND:
            state[key] = dataclasses.replace(a, paused_at=a.paused_at or NOW, suspended_at=NOW)
        else:  # evicted: a paused one is thawed to take its warning (on the host too)
            state[key] = dataclasses.replace(a, state=JobState.EVICTING, paused_at=None)
    thaws = thaws_for_device(device, list(state.values()), MARGINS, NOW, rules)
    for a in thaws:
        state[(a.job_id, a.attempt)] = dataclasses.replace(a, paused_at=None)
    restores = restores_for_device(device, list(state.values()), MARGINS, NOW, rules)
    return reliefs, thaws, restores


def keys(attempts: list[ActiveAttempt]) -> list[tuple[int, int]]:
    return [(a.job_id, a.attempt) for a in attempts]


@pytest.mark.parametrize("seed", range(20))
def test_respond_is_the_step_done_by_hand(seed: int) -> None:
    rng = random.Random(seed)
    relieved_and_thawed = 0
    for _ in range(300):
        device = random_device(rng)
        active = random_attempts(rng)
        rules = rng.choice(
            [
                PauseRules(),
                PauseRules(enabled=False),
                PauseRules(suspend=True, min_pause_s=5),
                PauseRules(min_pause_s=0, thaw_hysteresis_pct=0),
            ]
        )
        can_suspend = rng.choice([None, lambda a: True, lambda a: a.job_id % 2 == 0])
        reliefs, thaws, restores = by_hand(device, active, rules, can_suspend)
        got = respond(device, active, MARGINS, NOW, rules, None, can_suspend)
        assert got.reliefs == reliefs
        assert keys(got.thaws) == keys(thaws)
        assert keys(got.restores) == keys(restores)
        relieved_and_thawed += bool(reliefs and (thaws or restores))
    assert relieved_and_thawed > 0  # the order mattered somewhere


def paused(a: ActiveAttempt, at: float) -> ActiveAttempt:
    return dataclasses.replace(a, paused_at=at, pausable=True)


def test_an_attempt_evicted_for_pausing_too_long_takes_its_compute_back() -> None:
    """Evicted after ``max_pause_s``, a paused slice is thawed to take its warning: its
    compute runs until it exits, so a younger paused slice that would fit beside an idle
    one stays paused."""
    rules = PauseRules(max_pause_s=600, min_pause_s=5, thaw_hysteresis_pct=0)
    old = paused(att(1, c=40), NOW - 700)  # too long, and too big to thaw here
    young = paused(att(2, c=30), NOW - 10)
    device = dev(oc=60)
    # by itself, the young one fits: 100 - 5 - 60 = 35 >= 30
    assert keys(thaws_for_device(device, [young], MARGINS, NOW, rules)) == [(2, 1)]
    got = respond(device, [old, young], MARGINS, NOW, rules)
    assert [(r.job_id, r.kind) for r in got.reliefs] == [(1, ActionKind.EVICT)]
    assert got.thaws == []  # 35 - 40 running while it leaves < 30


def test_a_slice_paused_now_is_not_thawed_in_the_same_step() -> None:
    rules = PauseRules(min_pause_s=5)
    a = dataclasses.replace(att(1, c=30), pausable=True)
    got = respond(dev(oc=80), [a], MARGINS, NOW, rules)
    assert [r.kind for r in got.reliefs] == [ActionKind.PAUSE]
    assert got.thaws == [] and got.restores == []


def test_stale_figures_and_empty_devices_ask_for_nothing() -> None:
    a = dataclasses.replace(att(1, c=30), pausable=True)
    stale = dataclasses.replace(dev(oc=100), planning_only=True)
    assert respond(stale, [a], MARGINS, NOW, PauseRules()) is NOTHING
    assert respond(dev(oc=100), [], MARGINS, NOW, PauseRules()) is NOTHING
    assert respond(dev(oc=100, i=1), [a], MARGINS, NOW, PauseRules()) is NOTHING


def test_the_agent_and_the_simulator_carry_out_the_same_step() -> None:
    """One decision step: both sides call this module's ``respond`` (so a change to it
    shows in ``ebb sim`` with no change to the simulator)."""
    from ebbtide.sim import engine
    from ebbtide.workers import agent

    assert agent.respond is relief.respond
    assert engine.respond is relief.respond
