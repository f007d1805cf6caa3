"""How a pod's status becomes an attempt's exit: every way Kubernetes ends a pod."""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.kube.outcome import exit_of
from ebbtide.workers.executor import (
    CAUSE_IMAGE,
    CAUSE_LOST,
    CAUSE_NODE_PRESSURE,
    CAUSE_OOM,
    CAUSE_PREEMPTED,
    CAUSE_UNSCHEDULABLE,
)
from ebbtide.workers.shim import CAUSE_JOB


def pod(
    phase: str | None = "Running",
    *,
    state: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    reason: str | None = None,
    message: str | None = None,
    grace: int = 30,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if state is not None:
        status["containerStatuses"] = [{"name": "job", "state": state}]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return {
        "metadata": {"name": "ebb-4-1", "namespace": "ebbtide-jobs", "uid": "u"},
        "spec": {"terminationGracePeriodSeconds": grace},
        "status": status,
    }


def terminated(code: int, reason: str = "Error") -> dict[str, Any]:
    return {
        "terminated": {"exitCode": code, "reason": reason, "finishedAt": "2026-11-30T10:00:05Z"}
    }


def ended(p: dict[str, Any] | None, *, gone: bool = False, deleting: bool = False):  # type: ignore[no-untyped-def]
    return exit_of(p, gone=gone, deleting=deleting, pending_s=0.0, start_timeout_s=300.0)


def test_a_running_pod_has_not_ended() -> None:
    assert ended(pod("Running", state={"running": {}})) is None
    assert ended(pod("Pending")) is None


@pytest.mark.parametrize(("phase", "code"), [("Succeeded", 0), ("Failed", 3), ("Failed", 99)])
def test_the_containers_exit_code_is_the_attempts(phase: str, code: int) -> None:
    e = ended(pod(phase, state=terminated(code, "Completed" if code == 0 else "Error")))
    assert e is not None and e.code == code and e.cause == CAUSE_JOB
    assert e.at == pytest.approx(1796032805.0)


def test_a_warned_pod_that_exited_during_its_grace_ended_as_the_job_did() -> None:
    e = ended(pod("Failed", state=terminated(143)), deleting=True)
    assert e is not None and (e.code, e.cause) == (143, CAUSE_JOB)


def test_a_pod_deleted_as_asked_before_its_exit_was_seen_ended_as_warned() -> None:
    e = ended(pod("Running", state={"running": {}}), gone=True, deleting=True)
    assert e is not None and (e.code, e.cause) == (143, CAUSE_JOB)


def test_a_pod_deleted_by_someone_else_is_lost() -> None:
    e = ended(pod("Running", state={"running": {}}), gone=True)
    assert e is not None and e.cause == CAUSE_LOST and "deleted by someone else" in e.detail


def test_oomkilled_is_a_failure_of_the_jobs_own() -> None:
    e = ended(pod("Failed", state=terminated(137, "OOMKilled")))
    assert e is not None and (e.code, e.cause) == (137, CAUSE_OOM) and "memory limit" in e.detail


def test_preemption_by_the_kube_scheduler_is_a_platform_eviction_with_its_grace() -> None:
    preempted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "Preempted in order to admit critical pod",
        "lastTransitionTime": "2026-11-30T10:00:00Z",
    }
    e = ended(pod("Failed", state=terminated(143), conditions=[preempted], grace=12), gone=True)
    assert e is not None and e.cause == CAUSE_PREEMPTED and e.code == 143
    assert e.grace_s == 12 and e.at == pytest.approx(1796032800.0)
    assert "admit critical pod" in e.detail
    # ebbtide's own eviction that raced it stays ebbtide's
    mine = ended(pod("Failed", state=terminated(0), conditions=[preempted]), deleting=True)
    assert mine is not None and mine.cause == CAUSE_JOB


def test_a_kubelet_eviction_for_node_pressure() -> None:
    e = ended(
        pod("Failed", reason="Evicted", message="The node was low on resource: memory."),
    )
    assert e is not None and e.cause == CAUSE_NODE_PRESSURE and e.code == 137
    assert "low on resource" in e.detail


def test_a_lost_node() -> None:
    gc = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}
    e = ended(pod("Running", state={"running": {}}, conditions=[gc]), gone=True)
    assert e is not None and e.cause == CAUSE_LOST and "node is gone" in e.detail


def test_a_pod_that_cannot_pull_its_image_fails_after_the_start_timeout() -> None:
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    p = pod("Pending", state=waiting)
    assert exit_of(p, gone=False, deleting=False, pending_s=299, start_timeout_s=300) is None
    e = exit_of(p, gone=False, deleting=False, pending_s=301, start_timeout_s=300)
    assert e is not None and e.cause == CAUSE_IMAGE and "ImagePullBackOff" in e.detail


def test_an_unschedulable_pod_is_given_back_after_the_start_timeout() -> None:
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 1 Insufficient nvidia.com/gpu.",
    }
    e = exit_of(
        pod("Pending", conditions=[unschedulable]),
        gone=False,
        deleting=False,
        pending_s=400,
        start_timeout_s=300,
    )
    assert e is not None and e.cause == CAUSE_UNSCHEDULABLE and "Insufficient" in e.detail


def test_garbage_status_never_raises() -> None:
    for junk in ({}, {"status": None}, {"status": {"containerStatuses": []}}, None):
        exit_of(junk, gone=True, deleting=False, pending_s=0, start_timeout_s=1)  # type: ignore[arg-type]


def test_the_jobs_container_is_read_by_name_whatever_sidecar_sorts_first() -> None:
    p = pod("Failed")
    p["status"]["containerStatuses"] = [
        {"name": "istio-proxy", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "job", "state": terminated(137, "OOMKilled")},
    ]
    e = ended(p)
    assert e is not None and (e.code, e.cause) == (137, CAUSE_OOM)


def test_a_drain_through_the_eviction_api_is_the_clusters_eviction() -> None:
    drained = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    e = ended(pod("Failed", state=terminated(143), conditions=[drained]), gone=True)
    assert e is not None and e.cause == CAUSE_PREEMPTED and "Eviction API" in e.detail


def test_a_node_taint_eviction_is_a_lost_node_even_with_an_exit_code() -> None:
    tainted = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    e = ended(pod("Failed", state=terminated(143), conditions=[tainted]), gone=True)
    assert e is not None and e.cause == CAUSE_LOST and "node is gone" in e.detail
