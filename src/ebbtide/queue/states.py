"""The job state machine: the one table of allowed transitions.

Every state change goes through :meth:`ebbtide.queue.store.Store.transition`, which checks
this table, changes the row only if it is still in the expected state, and records an
event in the same database transaction.  Anything else raises.
"""

from __future__ import annotations

from enum import StrEnum

from ebbtide.errors import InvalidTransition


class JobState(StrEnum):
    HELD = "held"  # kept out of scheduling by a user (qhold) or by policy
    WAITING = "waiting"  # dependencies not yet satisfied
    QUEUED = "queued"  # eligible; waits for a slice
    DISPATCHED = "dispatched"  # a slice is granted and the node agent told to start
    RUNNING = "running"  # the node agent started the attempt's process
    EVICTING = "evicting"  # warned; the slice is being taken back
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: States in which the job holds (or is about to hold) a slice.
ACTIVE_STATES = frozenset({JobState.DISPATCHED, JobState.RUNNING, JobState.EVICTING})
#: States a job never leaves.
FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

S = JobState

#: A final state as a sentence says it ("job 3 has succeeded", not "is succeeded").
_ENDED_SAID = {S.SUCCEEDED: "has succeeded", S.FAILED: "has failed", S.CANCELLED: "was cancelled"}


def state_said(state: str) -> str:
    """``state`` after a job's name in a sentence: "is queued", "has failed"."""
    return _ENDED_SAID.get(JobState(state), f"is {state}")


#: (from, to) pairs that are allowed.  ``None`` as the source means "a new job".
TRANSITIONS: frozenset[tuple[JobState | None, JobState]] = frozenset(
    {
        # submission
        (None, S.QUEUED),
        (None, S.WAITING),
        (None, S.HELD),
        # holds and releases
        (S.QUEUED, S.HELD),
        (S.WAITING, S.HELD),
        (S.HELD, S.QUEUED),
        (S.HELD, S.WAITING),
        # dependencies (met, or all taken away by qalter), and given by qalter
        (S.WAITING, S.QUEUED),
        (S.QUEUED, S.WAITING),
        # scheduling
        (S.QUEUED, S.DISPATCHED),
        (S.DISPATCHED, S.RUNNING),
        (S.DISPATCHED, S.QUEUED),  # start message lost, agent refused, or agent gone
        (S.DISPATCHED, S.FAILED),  # the process could not be started
        # running
        (S.RUNNING, S.SUCCEEDED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.QUEUED),  # failed with attempts left, or its agent stopped heartbeating
        (S.RUNNING, S.EVICTING),
        (S.RUNNING, S.CANCELLED),  # its agent is gone and a cancel was asked for
        # eviction
        (S.EVICTING, S.QUEUED),  # the normal end of an eviction: requeue
        (S.EVICTING, S.SUCCEEDED),  # finished during the warning
        (S.EVICTING, S.FAILED),
        (S.EVICTING, S.CANCELLED),  # eviction on behalf of qdel
        # cancellation of jobs that hold no slice
        (S.HELD, S.CANCELLED),
        (S.WAITING, S.CANCELLED),
        (S.QUEUED, S.CANCELLED),
        (S.DISPATCHED, S.CANCELLED),
    }
)


def check_transition(source: JobState | None, target: JobState) -> None:
    """Raise :class:`InvalidTransition` unless ``source → target`` is in the table."""
    if (source, target) not in TRANSITIONS:
        src = source.value if source else "(new)"
        raise InvalidTransition(f"a job may not go from {src} to {target.value}")


class AttemptOutcome(StrEnum):
    """How an attempt ended.  ``None`` while it runs."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EVICTED = "evicted"  # warned and gave its slice back; the job is requeued
    LOST = "lost"  # its agent stopped heartbeating or the start never happened
    CANCELLED = "cancelled"


class EventType(StrEnum):
    SUBMITTED = "submitted"
    HELD = "held"
    RELEASED = "released"
    #: its name, priority or resources were changed before it started (``qalter``)
    ALTERED = "altered"
    DEPENDENCIES_MET = "dependencies_met"
    DISPATCHED = "dispatched"
    STARTED = "started"
    CHECKPOINTED = "checkpointed"
    PROGRESS = "progress"
    #: the value a job gave as its result (``ebbtide.job.result``)
    RESULT = "result"
    PAUSED = "paused"
    THAWED = "thawed"
    EVICT_REQUESTED = "evict_requested"
    EVICTED = "evicted"
    REQUEUED = "requeued"
    LOST = "lost"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
