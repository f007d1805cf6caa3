"""What the end of an attempt means for its job: the outcome policy, pure.

The store records the end of an attempt (:meth:`~ebbtide.queue.store.Store.finish_attempt`)
by asking :func:`decide` what it means and writing that down; no policy lives in SQL.

- exit 0: the job **succeeded** (also when it finished during an eviction);
- a cancellation was asked for: **cancelled**;
- an eviction — the attempt was being evicted, or it asked to be requeued (exit 99), or
  its GPU failed, or the cluster took it (a Kubernetes preemption for another pod, a
  kubelet's eviction for node pressure) — **requeues** the job.  It counts as an
  eviction (backoff, ``max_preemptions``) unless it was a GPU fault.  An attempt that
  *crashed* while being evicted (an exit that is neither 0, 99, the warning signal's nor
  a kill at the deadline: say a traceback in its checkpoint code) counts as a failure
  too, and fails
  the job once it has used up ``max_attempts``;
- any other exit is a **failure**: the job is requeued while failures remain below
  ``max_attempts`` (never when ``final``: a job that cannot be started at all), else it
  **failed**.  So is any exit but 0 of an attempt that ran past its walltime
  (``ran_out``): warned of its limit, not evicted, its exit 99 is no requeue of its own.

A *lost* attempt (its node went silent, its process vanished, its start never happened)
is none of these: the job is requeued, and held when :func:`hold_after_losses` says it
keeps being lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ebbtide.queue.spec import REQUEUE_EXIT_CODE
from ebbtide.queue.states import AttemptOutcome, EventType, JobState

#: The reason code of an eviction for a GPU fault (``EvictReason.GPU_FAULT``).
GPU_FAULT = "gpu_fault"
#: The reason code of an eviction because its node agent stopped gracefully
#: (``EvictReason.SHUTDOWN``: a restart or an upgrade of ebbtide): requeued and, like a
#: GPU fault, not counted (no backoff, no ``max_preemptions``): not the job's doing.
SHUTDOWN = "shutdown"
#: How a running job's reason starts while its cancellation waits for its attempt to end
#: (then "cancelled by …", as for a job cancelled before it ran).
CANCEL_ASKED = "cancel requested by "
#: The reason code of an attempt that ran past its walltime (warned, then killed at its
#: deadline if still running): a failure whatever it exited with, but 0.
WALLTIME = "walltime"
#: The reason codes of evictions the cluster made itself, seen after the fact
#: (``EvictReason.KUBE_PREEMPTED``, ``EvictReason.NODE_PRESSURE``): requeued, counted.
PLATFORM_EVICTIONS = frozenset({"kube_preempted", "node_pressure"})


@dataclass(frozen=True)
class Verdict:
    """What to write down for one attempt's end."""

    target: JobState
    #: the event of the job's transition
    event: EventType
    outcome: AttemptOutcome
    evictions: int
    failures: int
    #: the job's ``reason``
    reason: str
    #: record an ``evicted`` event (with the eviction's figures) before the transition
    evicted: bool = False
    #: record a non-final ``failed`` event before a requeue
    failed_before_requeue: bool = False
    #: the failure ends the job
    final: bool = False
    #: in words, for the events: why it was requeued or failed
    why: str | None = None


def decide(
    *,
    source: JobState,
    exit_code: int | None,
    eviction: dict[str, Any] | None,
    cancel_requested: bool,
    evictions: int,
    failures: int,
    max_attempts: int,
    attempt: int,
    warning_signal: int,
    why: str | None = None,
    final: bool = False,
    ran_out: bool = False,
) -> Verdict:
    """The verdict on an attempt that ended with ``exit_code`` (see the module doc)."""
    if exit_code == 0:
        return Verdict(
            JobState.SUCCEEDED,
            EventType.SUCCEEDED,
            AttemptOutcome.SUCCEEDED,
            evictions,
            failures,
            reason="",
        )
    if cancel_requested:
        return Verdict(
            JobState.CANCELLED,
            EventType.CANCELLED,
            AttemptOutcome.CANCELLED,
            evictions,
            failures,
            reason="cancelled",
        )
    code = (eviction or {}).get("reason_code")
    fault = code == GPU_FAULT
    taken = code in PLATFORM_EVICTIONS
    evicted = source == JobState.EVICTING or exit_code == REQUEUE_EXIT_CODE or fault or taken
    if evicted and not ran_out:
        reason = (eviction or {}).get("reason") or "the job asked to be requeued (exit 99)"
        counted = evictions if fault or code == SHUTDOWN else evictions + 1
        crashed = (
            source == JobState.EVICTING
            and not fault
            and exit_code is not None  # unknown: not the job's doing, as far as we know
            and exit_code not in (REQUEUE_EXIT_CODE, 128 + warning_signal)
            and not (eviction or {}).get("killed")
        )
        if not crashed:
            return Verdict(
                JobState.QUEUED,
                EventType.REQUEUED,
                AttemptOutcome.EVICTED,
                counted,
                failures,
                reason=f"requeued: {reason}",
                evicted=True,
                why=reason,
            )
        text = (
            f"attempt {attempt} crashed while being evicted (exit {exit_code}); "
            f"{failures + 1} of {max_attempts} failures"
        )
        if failures + 1 < max_attempts:
            return Verdict(
                JobState.QUEUED,
                EventType.REQUEUED,
                AttemptOutcome.EVICTED,
                counted,
                failures + 1,
                reason=f"requeued: {reason}; {text}",
                evicted=True,
                why=reason,
            )
        return Verdict(
            JobState.FAILED,
            EventType.FAILED,
            AttemptOutcome.FAILED,
            counted,
            failures + 1,
            reason=f"{text} (exit code {exit_code})",
            evicted=True,
            final=True,
            why=text,
        )
    failures += 1
    if failures < max_attempts and not final:
        text = (
            f"attempt {attempt} failed ({why or f'exit {exit_code}'}); "
            f"{failures} of {max_attempts} failures"
        )
        return Verdict(
            JobState.QUEUED,
            EventType.REQUEUED,
            AttemptOutcome.FAILED,
            evictions,
            failures,
            reason=f"requeued: {text}",
            failed_before_requeue=True,
            why=text,
        )
    return Verdict(
        JobState.FAILED,
        EventType.FAILED,
        AttemptOutcome.FAILED,
        evictions,
        failures,
        reason=f"{why} (exit code {exit_code})" if why else f"exit code {exit_code}",
        final=True,
        why=why,
    )


# Why an attempt was lost: ``requeue_lost``'s ``reason_code``, kept in the ``lost`` event.
#: its node stopped heartbeating (the scheduler's)
NODE_SILENT = "node_silent"
#: its node did not start it within ``dispatch_timeout_s`` (the scheduler's)
NOT_STARTED = "not_started"
#: its node's agent restarted and found it gone (an attempt of the agent before)
AGENT_RESTARTED = "agent_restarted"
#: its node's agent shut down before starting it
AGENT_LEFT = "agent_left"
#: the platform could not start it (the Kubernetes API did not answer)
START_DEFERRED = "start_deferred"
#: The scheduler took back an attempt it had dispatched, before it started (to evict it):
#: its decision, not a loss of the job's; not counted at all.
TAKEN_BACK = "taken_back"
#: A live agent that started after the attempt was dispatched has no such process: the
#: attempt is simply gone (counted, and unexplained).
GONE = "gone"
#: The losses a node explains: it went silent, its agent restarted or left or stopped
#: renewing the attempt's lease (the shim's causes ``lease``, ``agent_gone``), it did not
#: start the attempt in time, a device failed, the platform could not start it or took it
#: back (:data:`PLATFORM_EVICTIONS`, seen by an agent that restarted).  Such a loss
#: counts toward ``max_losses`` only: a node that crashes twice in a minute is bad luck
#: for the jobs on it, not a loop of theirs.
NODE_LOSSES = frozenset(
    {
        NODE_SILENT,
        NOT_STARTED,
        AGENT_RESTARTED,
        AGENT_LEFT,
        START_DEFERRED,
        GPU_FAULT,
        "lease",
        "agent_gone",
    }
    | PLATFORM_EVICTIONS
)


@dataclass(frozen=True)
class Loss:
    """One lost attempt of a job, as its ``lost`` event recorded it."""

    attempt: int
    #: Unix seconds it was recorded
    at: float
    reason: str
    reason_code: str | None = None

    @property
    def counted(self) -> bool:
        """It counts toward ``max_losses`` (everything but a take-back)."""
        return self.reason_code != TAKEN_BACK

    @property
    def unexplained(self) -> bool:
        """Its node does not explain it: the node stayed up and the attempt is gone."""
        return self.counted and self.reason_code not in NODE_LOSSES


def hold_after_losses(losses: Sequence[Loss], max_losses: int, window_s: float) -> str | None:
    """The reason to hold a job whose attempts were lost as ``losses`` say (since it was
    last released, oldest first, the latest included), or None to let it run again:

    - ``max_losses`` losses of any kind but a take-back hold it;
    - so do two unexplained losses (:attr:`Loss.unexplained`) less than ``window_s``
      apart (0: never): an attempt that vanishes from a node that stays up, again and
      again, is a loop that only a person can end (two agents under one node name did
      it: 34 restarts in 15 s).
    """
    counted = [x for x in losses if x.counted]
    if not counted:
        return None
    last = counted[-1]
    if len(counted) >= max_losses:
        return (
            f"held: lost {len(counted)} times (max_losses {max_losses}), last: {last.reason}; "
            "qrls to try again"
        )
    odd = [x for x in counted if x.unexplained]
    if window_s > 0 and len(odd) >= 2 and odd[-1] is last and last.at - odd[-2].at < window_s:
        return (
            f"held: attempts {odd[-2].attempt} and {last.attempt} were lost "
            f"{last.at - odd[-2].at:.1f}s apart (loss_window_s {window_s:g}) while their node "
            f"stayed up, last: {last.reason}; qrls to try again"
        )
    return None
