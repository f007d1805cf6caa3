"""The transition table: what it allows, what it forbids, and that final states are final."""

from __future__ import annotations

import pytest

from ebbtide.errors import InvalidTransition
from ebbtide.queue.states import (
    ACTIVE_STATES,
    FINAL_STATES,
    TRANSITIONS,
    JobState,
    check_transition,
)

S = JobState


def _label(pair: tuple[JobState | None, JobState]) -> str:
    source, target = pair
    return f"{source.value if source else 'new'}->{target.value}"


ALLOWED = sorted(TRANSITIONS, key=_label)


@pytest.mark.parametrize("pair", ALLOWED, ids=[_label(p) for p in ALLOWED])
def test_every_listed_transition_is_allowed(pair: tuple[JobState | None, JobState]) -> None:
    check_transition(*pair)


FORBIDDEN = [
    (S.SUCCEEDED, S.QUEUED),
    (S.FAILED, S.QUEUED),
    (S.CANCELLED, S.QUEUED),
    (S.QUEUED, S.RUNNING),
    (S.RUNNING, S.DISPATCHED),
    (None, S.RUNNING),
    (None, S.DISPATCHED),
    (None, S.SUCCEEDED),
    (S.EVICTING, S.RUNNING),
    (S.WAITING, S.DISPATCHED),
    (S.HELD, S.DISPATCHED),
    (S.QUEUED, S.SUCCEEDED),
    (S.QUEUED, S.QUEUED),
    (S.RUNNING, S.RUNNING),
]


@pytest.mark.parametrize("pair", FORBIDDEN, ids=[_label(p) for p in FORBIDDEN])
def test_forbidden_transition_raises(pair: tuple[JobState | None, JobState]) -> None:
    source, target = pair
    with pytest.raises(InvalidTransition) as info:
        check_transition(source, target)
    # the message names both ends so a person can tell what was attempted
    assert target.value in str(info.value)
    assert (source.value if source else "new") in str(info.value)


@pytest.mark.parametrize("state", sorted(FINAL_STATES), ids=str)
def test_final_states_have_no_outgoing_transitions(state: JobState) -> None:
    assert [t for s, t in TRANSITIONS if s == state] == []
    for target in JobState:
        with pytest.raises(InvalidTransition):
            check_transition(state, target)


def test_every_state_is_reachable_from_submission() -> None:
    reached: set[JobState | None] = {None}
    frontier: list[JobState | None] = [None]
    while frontier:
        source = frontier.pop()
        for s, t in TRANSITIONS:
            if s == source and t not in reached:
                reached.add(t)
                frontier.append(t)
    assert reached - {None} == set(JobState)


@pytest.mark.parametrize("state", sorted(set(JobState) - FINAL_STATES), ids=str)
def test_every_live_state_can_end(state: JobState) -> None:
    """From any state that is not final, some path leads to a final state."""
    seen = {state}
    frontier = [state]
    while frontier:
        source = frontier.pop()
        for s, t in TRANSITIONS:
            if s == source and t not in seen:
                seen.add(t)
                frontier.append(t)
    assert seen & FINAL_STATES


def test_active_and_final_states_are_disjoint() -> None:
    assert not ACTIVE_STATES & FINAL_STATES
