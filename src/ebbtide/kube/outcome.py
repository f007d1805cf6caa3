"""How an attempt's pod ended, read off its status: pure, on the API's own JSON.

Kubernetes tells an attempt's end in several places, and this is where they become one
:class:`~ebbtide.workers.executor.Exit` with a cause the agent acts on:

- the container's ``state.terminated`` (exit code, ``OOMKilled``): the job's own exit,
  or a failure of its own (``oom``);
- a ``DisruptionTarget`` condition (Kubernetes ≥ 1.26 records why it took a pod, as
  Volcano and the kube-scheduler do): ``PreemptionByScheduler`` → ``preempted`` (an online
  pod needed the room; an eviction, requeued), ``TerminationByKubelet`` or the pod's
  ``status.reason: Evicted`` → ``node_pressure`` (the kubelet ran short), and
  ``DeletionByPodGC`` / ``DeletionByTaintManager`` → ``lost`` (its node is gone);
- a pod stuck ``Pending`` past the start timeout: ``image`` (``ErrImagePull``,
  ``ImagePullBackOff``, …: a failure, the image is the job's) or ``unschedulable`` (no room
  for it on the node: requeued, not counted);
- a pod gone from the API with none of the above: ``lost``, unless ebbtide itself was
  deleting it (then it ended as warned: ``128 + SIGTERM``).
"""

from __future__ import annotations

import signal
from datetime import datetime
from typing import Any

from ebbtide.kube.pods import CONTAINER_NAME
from ebbtide.workers.executor import (
    CAUSE_IMAGE,
    CAUSE_LOST,
    CAUSE_NODE_PRESSURE,
    CAUSE_OOM,
    CAUSE_PREEMPTED,
    CAUSE_UNSCHEDULABLE,
    Exit,
)
from ebbtide.workers.shim import CAUSE_JOB

#: ``DisruptionTarget`` reasons of a preemption for another pod (the second is the name
#: Kubernetes 1.26 used), and of an eviction through the Eviction API (a node drain, a
#: descheduler, Kueue or Koordinator taking it back): the cluster took it, requeue it.
PREEMPTION_REASONS = frozenset(
    {"PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI"}
)
#: ``DisruptionTarget`` reasons of a kubelet's eviction for node pressure.
PRESSURE_REASONS = frozenset({"TerminationByKubelet"})
#: ``DisruptionTarget`` reasons that mean the pod's node is gone.
NODE_GONE_REASONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager"})
#: A container waiting for these will not start by itself: its image cannot be had, or
#: its configuration is wrong.
IMAGE_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
#: The exit code reported for an attempt that never started (as a shell's "not found").
NOT_STARTED_EXIT = 127
_WARNED_EXIT = 128 + int(signal.SIGTERM)
_KILLED_EXIT = 128 + int(signal.SIGKILL)


def exit_of(
    pod: dict[str, Any] | None,
    *,
    gone: bool,
    deleting: bool,
    pending_s: float,
    start_timeout_s: float,
) -> Exit | None:
    """How the attempt whose pod is ``pod`` (its last state seen) ended; None while it
    runs or may still start.

    ``gone``: the pod is no longer in the API; ``deleting``: ebbtide asked for its
    deletion (a warning, a kill); ``pending_s``: how long it has existed without running.
    """
    pod = pod or {}
    status = pod.get("status") or {}
    phase = status.get("phase")
    terminated = _container_state(status).get("terminated")
    if phase in ("Succeeded", "Failed") or gone:
        return _ended(pod, status, terminated, gone=gone, deleting=deleting)
    if phase == "Pending" or phase is None:
        if pending_s < start_timeout_s:
            return None
        waiting = _container_state(status).get("waiting") or {}
        if waiting.get("reason") in IMAGE_REASONS:
            return Exit(
                NOT_STARTED_EXIT,
                cause=CAUSE_IMAGE,
                detail=f"its container did not start within {start_timeout_s:g}s: "
                f"{waiting.get('reason')}: {waiting.get('message') or 'no message'}",
            )
        scheduled = _condition(status, "PodScheduled")
        why = (
            f"{scheduled.get('reason')}: {scheduled.get('message') or 'no message'}"
            if scheduled and scheduled.get("status") == "False"
            else f"still {phase or 'unbound'}"
        )
        return Exit(
            NOT_STARTED_EXIT,
            cause=CAUSE_UNSCHEDULABLE,
            detail=f"pod {_name(pod)} did not start within {start_timeout_s:g}s ({why})",
        )
    return None


def _ended(
    pod: dict[str, Any],
    status: dict[str, Any],
    terminated: dict[str, Any] | None,
    *,
    gone: bool,
    deleting: bool,
) -> Exit:
    code = _code(terminated)
    at = _time((terminated or {}).get("finishedAt"))
    disruption = _condition(status, "DisruptionTarget")
    reason = disruption.get("reason") if disruption.get("status") == "True" else None
    message = disruption.get("message") or status.get("message") or ""
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    if not deleting and reason in NODE_GONE_REASONS:
        return Exit(
            _KILLED_EXIT if code is None else code,
            cause=CAUSE_LOST,
            detail=f"its node is gone ({reason}: {message})",
        )
    if not deleting and reason in PREEMPTION_REASONS:
        by = (
            "evicted through the Eviction API (a drain, a descheduler)"
            if reason == "EvictionByEvictionAPI"
            else "preempted by the cluster's scheduler for another pod"
        )
        return Exit(
            code if code is not None else _WARNED_EXIT,
            cause=CAUSE_PREEMPTED,
            detail=f"{by}: {message}".strip(),
            at=_time(disruption.get("lastTransitionTime")),
            grace_s=float(grace) if isinstance(grace, int | float) else None,
        )
    if status.get("reason") == "Evicted" or reason in PRESSURE_REASONS:
        return Exit(
            code if code is not None else _KILLED_EXIT,
            cause=CAUSE_NODE_PRESSURE,
            detail=f"evicted by the kubelet for node pressure: {message}".strip(),
            at=_time(disruption.get("lastTransitionTime")) or at,
            grace_s=0.0,
        )
    if terminated and terminated.get("reason") == "OOMKilled":
        return Exit(
            code if code is not None else _KILLED_EXIT,
            cause=CAUSE_OOM,
            detail="OOMKilled: it went over its container's memory limit",
            at=at,
        )
    if code is not None:
        return Exit(code, cause=CAUSE_JOB, at=at)
    if deleting:
        return Exit(_WARNED_EXIT, cause=CAUSE_JOB, detail="its pod was deleted as asked")
    if gone:
        why = f"pod {_name(pod)} was deleted by someone else" + (f" ({reason})" if reason else "")
    else:
        why = f"pod {_name(pod)} failed: {status.get('reason') or 'no reason'}: {message}"
    return Exit(_KILLED_EXIT, cause=CAUSE_LOST, detail=why.strip())


def _container_state(status: dict[str, Any]) -> dict[str, Any]:
    """The state of the job's container (``job``: the kubelet sorts statuses by name, and
    a sidecar a mesh injects may come first); the only one when none is named so."""
    statuses = status.get("containerStatuses") or []
    for entry in statuses:
        if entry.get("name") == CONTAINER_NAME:
            return entry.get("state") or {}
    return (statuses[0].get("state") or {}) if len(statuses) == 1 else {}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def _code(terminated: dict[str, Any] | None) -> int | None:
    if not terminated:
        return None
    code = terminated.get("exitCode")
    return int(code) if isinstance(code, int) else None


def _time(text: Any) -> float | None:
    """Unix seconds of an RFC 3339 timestamp (None when absent or unreadable)."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
