"""The outcome policy, pure: what an attempt's end means for its job, table-driven."""

from __future__ import annotations

import pytest

from ebbtide.queue.outcomes import GPU_FAULT, SHUTDOWN, decide
from ebbtide.queue.states import AttemptOutcome, JobState

S = JobState
TERM = 15
EVICTION = {"reason": "online spike", "reason_code": "online_memory"}
KILLED = {**EVICTION, "killed": True}
FAULT = {"reason": "XID 79", "reason_code": GPU_FAULT, "killed": True}
STOPPED = {"reason": "node agent vm is shutting down", "reason_code": SHUTDOWN}
PREEMPTED = {"reason": "preempted by the cluster's scheduler", "reason_code": "kube_preempted"}
PRESSURE = {"reason": "evicted by the kubelet", "reason_code": "node_pressure", "killed": True}


@pytest.mark.parametrize(
    ("source", "code", "eviction", "cancel", "max_attempts", "final", "expected"),
    [
        # (target, outcome, evictions, failures) from evictions=2, failures=0
        pytest.param(
            S.RUNNING, 0, None, False, 3, False, (S.SUCCEEDED, "succeeded", 2, 0), id="ok"
        ),
        pytest.param(
            S.EVICTING,
            0,
            EVICTION,
            False,
            3,
            False,
            (S.SUCCEEDED, "succeeded", 2, 0),
            id="ok-while-warned",
        ),
        pytest.param(
            S.RUNNING, 1, None, True, 3, False, (S.CANCELLED, "cancelled", 2, 0), id="cancel"
        ),
        pytest.param(
            S.RUNNING, 99, None, False, 3, False, (S.QUEUED, "evicted", 3, 0), id="exit-99"
        ),
        # the cluster took it while ebbtide was not evicting it: requeued and counted
        pytest.param(
            S.RUNNING, 143, PREEMPTED, False, 1, False, (S.QUEUED, "evicted", 3, 0), id="kube"
        ),
        pytest.param(
            S.RUNNING, 137, PRESSURE, False, 1, False, (S.QUEUED, "evicted", 3, 0), id="kubelet"
        ),
        pytest.param(
            S.EVICTING,
            128 + TERM,
            EVICTION,
            False,
            1,
            False,
            (S.QUEUED, "evicted", 3, 0),
            id="by-warning",
        ),
        pytest.param(
            S.EVICTING,
            137,
            KILLED,
            False,
            1,
            False,
            (S.QUEUED, "evicted", 3, 0),
            id="killed-at-deadline",
        ),
        pytest.param(
            S.EVICTING,
            None,
            EVICTION,
            False,
            1,
            False,
            (S.QUEUED, "evicted", 3, 0),
            id="unknown-exit",
        ),
        pytest.param(
            S.EVICTING,
            1,
            EVICTION,
            False,
            3,
            False,
            (S.QUEUED, "evicted", 3, 1),
            id="crash-while-evicting",
        ),
        pytest.param(
            S.EVICTING,
            1,
            EVICTION,
            False,
            1,
            False,
            (S.FAILED, "failed", 3, 1),
            id="crash-uses-last-attempt",
        ),
        pytest.param(
            S.RUNNING,
            134,
            FAULT,
            False,
            1,
            False,
            (S.QUEUED, "evicted", 2, 0),
            id="gpu-fault-not-counted",
        ),
        pytest.param(
            S.EVICTING, 1, FAULT, False, 1, False, (S.QUEUED, "evicted", 2, 0), id="gpu-fault-crash"
        ),
        # a trial's trap: two restarts of `ebb up` held a job (max_preemptions 2) or put it
        # in backoff, as if the online side had taken its slice twice
        pytest.param(
            S.EVICTING,
            99,
            STOPPED,
            False,
            3,
            False,
            (S.QUEUED, "evicted", 2, 0),
            id="agent-shutdown-not-counted",
        ),
        pytest.param(
            S.EVICTING,
            TERM + 128,
            {**STOPPED, "killed": True},
            False,
            3,
            False,
            (S.QUEUED, "evicted", 2, 0),
            id="agent-shutdown-killed-not-counted",
        ),
        pytest.param(
            S.RUNNING, 3, None, False, 3, False, (S.QUEUED, "failed", 2, 1), id="failure-retried"
        ),
        pytest.param(
            S.RUNNING, 3, None, False, 1, False, (S.FAILED, "failed", 2, 1), id="failure-final"
        ),
        pytest.param(
            S.DISPATCHED, 127, None, False, 5, True, (S.FAILED, "failed", 2, 1), id="cannot-start"
        ),
    ],
)
def test_verdicts(source, code, eviction, cancel, max_attempts, final, expected) -> None:  # type: ignore[no-untyped-def]
    v = decide(
        source=source,
        exit_code=code,
        eviction=eviction,
        cancel_requested=cancel,
        evictions=2,
        failures=0,
        max_attempts=max_attempts,
        attempt=4,
        warning_signal=TERM,
        final=final,
    )
    assert (v.target, v.outcome, v.evictions, v.failures) == (
        expected[0],
        AttemptOutcome(expected[1]),
        expected[2],
        expected[3],
    )
    assert v.final == (v.target == S.FAILED)


def test_a_crash_while_evicting_says_so() -> None:
    v = decide(
        source=S.EVICTING,
        exit_code=1,
        eviction=EVICTION,
        cancel_requested=False,
        evictions=0,
        failures=1,
        max_attempts=3,
        attempt=2,
        warning_signal=TERM,
    )
    assert v.reason == (
        "requeued: online spike; attempt 2 crashed while being evicted (exit 1); 2 of 3 failures"
    )
    assert v.evicted and not v.failed_before_requeue


def test_the_warning_signal_is_the_jobs_own() -> None:
    # a job warned with USR1 (10) that dies of TERM (15) did not take the warning
    v = decide(
        source=S.EVICTING,
        exit_code=128 + TERM,
        eviction=EVICTION,
        cancel_requested=False,
        evictions=0,
        failures=0,
        max_attempts=5,
        attempt=1,
        warning_signal=10,
    )
    assert v.failures == 1
