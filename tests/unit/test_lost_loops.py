"""When a job whose attempts keep being lost is held rather than restarted
(:func:`ebbtide.queue.outcomes.hold_after_losses`): pure, table-driven."""

from __future__ import annotations

import pytest

from ebbtide.queue.outcomes import (
    AGENT_RESTARTED,
    GONE,
    NODE_SILENT,
    TAKEN_BACK,
    Loss,
    hold_after_losses,
)

WINDOW_S = 60.0


def lost(attempt: int, at: float, code: str | None = GONE) -> Loss:
    return Loss(attempt=attempt, at=at, reason=f"reason {attempt}", reason_code=code)


@pytest.mark.parametrize(
    ("losses", "held"),
    [
        ([], False),
        ([lost(1, 0)], False),
        # two attempts that vanished from a node that stayed up, within the window
        ([lost(1, 0), lost(2, 0.4)], True),
        ([lost(1, 0), lost(2, 59.9)], True),
        ([lost(1, 0), lost(2, 60.0)], False),  # a minute apart: not a loop
        # one worker crash, then another: the node explains both (chaos's faults)
        ([lost(1, 0, NODE_SILENT), lost(2, 5, NODE_SILENT)], False),
        ([lost(1, 0, AGENT_RESTARTED), lost(2, 2, AGENT_RESTARTED)], False),
        ([lost(1, 0, "lease"), lost(2, 3, "agent_gone"), lost(3, 4, "gpu_fault")], False),
        ([lost(1, 0, "start_deferred"), lost(2, 1, "not_started")], False),
        ([lost(1, 0, "kube_preempted"), lost(2, 1, "node_pressure")], False),
        # one explained, one not: no pair of unexplained losses
        ([lost(1, 0, NODE_SILENT), lost(2, 1)], False),
        ([lost(1, 0), lost(2, 1, NODE_SILENT)], False),  # the latest is explained
        ([lost(1, 0), lost(2, 1, NODE_SILENT), lost(3, 2)], True),
        # the scheduler's take-backs are its decisions: not counted
        ([lost(1, 0, TAKEN_BACK), lost(2, 1, TAKEN_BACK)], False),
        ([lost(1, 0), lost(2, 1, TAKEN_BACK)], False),
        # an unknown (older) reason code counts as unexplained
        ([lost(1, 0, None), lost(2, 1, None)], True),
        # kubernetes: a pod deleted by someone else, twice in a minute
        ([lost(1, 0, "lost"), lost(2, 30, "lost")], True),
    ],
)
def test_two_unexplained_losses_within_the_window_hold(losses: list[Loss], held: bool) -> None:
    assert (hold_after_losses(losses, 10, WINDOW_S) is not None) == held


def test_the_reason_says_which_attempts_how_far_apart_and_why() -> None:
    why = hold_after_losses([lost(3, 100.0), lost(4, 100.4)], 10, WINDOW_S)
    assert why == (
        "held: attempts 3 and 4 were lost 0.4s apart (loss_window_s 60) while their node "
        "stayed up, last: reason 4; qrls to try again"
    )


def test_every_loss_but_a_take_back_counts_toward_max_losses() -> None:
    losses = [lost(n, 100.0 * n, NODE_SILENT) for n in range(1, 4)]
    assert hold_after_losses(losses[:2], 3, WINDOW_S) is None
    assert hold_after_losses(losses, 3, WINDOW_S) == (
        "held: lost 3 times (max_losses 3), last: reason 3; qrls to try again"
    )
    with_take_back = [*losses[:2], lost(3, 300.0, TAKEN_BACK)]
    assert hold_after_losses(with_take_back, 3, WINDOW_S) is None


def test_a_window_of_zero_leaves_only_max_losses() -> None:
    assert hold_after_losses([lost(1, 0), lost(2, 0.1)], 10, 0.0) is None
    assert hold_after_losses([lost(1, 0), lost(2, 0.1)], 2, 0.0) is not None
