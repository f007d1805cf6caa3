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
  **failed**.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ebbtide.queue.spec import REQUEUE_EXIT_CODE
from ebbtide.queue.states import AttemptOutcome, EventType, JobState

#: The reason code of an eviction for a GPU fault (``EvictReason.GPU_FAULT``).
GPU_FAULT = "gpu_fault"
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
    fault = (eviction or {}).get("reason_code") == GPU_FAULT
    taken = (eviction or {}).get("reason_code") in PLATFORM_EVICTIONS
    if source == JobState.EVICTING or exit_code == REQUEUE_EXIT_CODE or fault or taken:
        reason = (eviction or {}).get("reason") or "the job asked to be requeued (exit 99)"
        counted = evictions if fault else evictions + 1
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


def hold_after_losses(losses: int, max_losses: int, why: str) -> str | None:
    """The reason to hold a job whose attempts were lost ``losses`` times (this one
    included) since it was last released, or None to requeue it as usual."""
    if losses < max_losses:
        return None
    return f"held: lost {losses} times (max_losses {max_losses}), last: {why}; qrls to try again"
