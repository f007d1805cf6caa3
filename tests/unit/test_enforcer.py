"""EvictionClock: the figures an eviction is judged by, and when the kill is due."""

from __future__ import annotations

import pytest

from ebbtide.preemption.enforcer import KILL_LEAD_S, EvictionClock

SPIKE = 1000.0
DEADLINE_S = 10.0


MESSAGE = "online memory on n/0 rose to 78GiB; offline slices must free 1GiB"


def clock(
    *,
    deadline_s: float = DEADLINE_S,
    warned_at: float | None = None,
    killed: bool = False,
    freed_at: float | None = None,
    checkpoint_after_warning: bool = False,
) -> EvictionClock:
    return EvictionClock(
        reason="online_memory",
        message=MESSAGE,
        spike_at=SPIKE,
        deadline_s=deadline_s,
        warned_at=warned_at,
        killed=killed,
        freed_at=freed_at,
        checkpoint_after_warning=checkpoint_after_warning,
    )


def test_kill_lead_is_small_and_positive() -> None:
    assert 0 < KILL_LEAD_S < 1


def test_report_all_fields() -> None:
    c = clock(warned_at=SPIKE + 0.01, freed_at=SPIKE + 0.4, checkpoint_after_warning=True)
    assert c.report(last_checkpoint_at=SPIKE + 0.3, started_at=SPIKE - 100) == {
        "reason": MESSAGE,
        "reason_code": "online_memory",
        "deadline_s": DEADLINE_S,
        "spike_at": SPIKE,
        "warned_at": SPIKE + 0.01,
        "freed_at": SPIKE + 0.4,
        "latency_s": pytest.approx(0.4),
        "killed": False,
        "checkpointed": True,
        "lost_work_s": pytest.approx(0.1),
        "deadline_missed": False,
    }


@pytest.mark.parametrize(
    ("freed_at", "ckpt", "started", "killed", "expected"),
    [
        pytest.param(
            SPIKE + 0.25,
            SPIKE - 30,
            SPIKE - 100,
            False,
            {"latency_s": 0.25, "lost_work_s": 30.25, "killed": False, "deadline_missed": False},
            id="cooperative-from-checkpoint",
        ),
        pytest.param(
            SPIKE + 2,
            None,
            SPIKE - 100,
            False,
            {"latency_s": 2.0, "lost_work_s": 102.0, "killed": False, "deadline_missed": False},
            id="no-checkpoint-from-start",
        ),
        pytest.param(
            SPIKE + 1,
            SPIKE - 500,
            SPIKE - 100,
            False,
            {"latency_s": 1.0, "lost_work_s": 101.0, "killed": False, "deadline_missed": False},
            id="checkpoint-before-start-counts-from-start",
        ),
        pytest.param(
            SPIKE + DEADLINE_S - KILL_LEAD_S,
            SPIKE - 5,
            SPIKE - 100,
            True,
            {
                "latency_s": DEADLINE_S - KILL_LEAD_S,
                "lost_work_s": DEADLINE_S - KILL_LEAD_S + 5,
                "killed": True,
                "deadline_missed": False,
            },
            id="killed-in-time",
        ),
        pytest.param(
            SPIKE + DEADLINE_S,
            SPIKE - 5,
            SPIKE - 100,
            True,
            {
                "latency_s": DEADLINE_S,
                "lost_work_s": 15.0,
                "killed": True,
                "deadline_missed": False,
            },
            id="freed-exactly-at-deadline",
        ),
        pytest.param(
            SPIKE + DEADLINE_S + 0.5,
            SPIKE - 5,
            SPIKE - 100,
            True,
            {"latency_s": 10.5, "lost_work_s": 15.5, "killed": True, "deadline_missed": True},
            id="deadline-missed",
        ),
    ],
)
def test_report(
    freed_at: float, ckpt: float | None, started: float, killed: bool, expected: dict[str, object]
) -> None:
    c = clock(warned_at=SPIKE, freed_at=freed_at, killed=killed)
    report = c.report(last_checkpoint_at=ckpt, started_at=started)
    got = {k: report[k] for k in expected}
    assert got == {k: pytest.approx(v) if isinstance(v, float) else v for k, v in expected.items()}


def test_report_needs_freed_at() -> None:
    with pytest.raises(AssertionError):
        clock().report(last_checkpoint_at=None, started_at=SPIKE)


def test_deadline_at() -> None:
    assert clock().deadline_at == SPIKE + DEADLINE_S


@pytest.mark.parametrize(
    ("now", "killed", "due"),
    [
        pytest.param(SPIKE, False, False, id="at-spike"),
        pytest.param(SPIKE + DEADLINE_S - KILL_LEAD_S - 0.01, False, False, id="just-before-lead"),
        pytest.param(SPIKE + DEADLINE_S - KILL_LEAD_S, False, True, id="at-lead"),
        pytest.param(SPIKE + DEADLINE_S, False, True, id="at-deadline"),
        pytest.param(SPIKE + DEADLINE_S + 5, False, True, id="past-deadline"),
        pytest.param(SPIKE + DEADLINE_S + 5, True, False, id="already-killed"),
    ],
)
def test_due(now: float, killed: bool, due: bool) -> None:
    assert clock(killed=killed).due(now) is due


def test_zero_deadline_is_due_at_once() -> None:
    assert clock(deadline_s=0.0).due(SPIKE)
