"""The node agent with the Kubernetes executor, end to end against the API emulator: a
real store, real processes started by the test kubelet as pods, a simulated online spike.

submit → pod → spike → delete with grace ≤ the deadline left → requeue → a new pod →
resume from the checkpoint; and what the cluster itself does to a pod (preemption for an
online pod, OOM) recorded with its reason.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ebbtide.kube.executor import KubernetesExecutor
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.static import StaticSource
from tests.k8s import KubeHarness
from tests.k8s.test_kube_executor import ALLOCATABLE, NODE, NS, settings

COUNT = Path(__file__).resolve().parents[2] / "examples" / "count.py"
#: steps of 0.05 s: long enough that a loaded machine's spike still finds the job running
#: (with 60, 3 s of work, it could finish before its warning and checkpoint none)
STEPS = 200


def wait_until(predicate, timeout=20.0):  # type: ignore[no-untyped-def]
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def node(kube: KubeHarness, tmp_path: Path) -> Iterator[tuple[Store, NodeAgent, StaticSource, Any]]:
    kube.core().patch_node_status(NODE, {"status": {"allocatable": ALLOCATABLE}})
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    deletes: list[Any] = []
    core = kube.core()
    real_delete = core.delete_namespaced_pod

    def recording_delete(name: str, namespace: str, **kw: Any) -> Any:
        deletes.append((time.monotonic(), name, kw.get("body")))
        return real_delete(name, namespace, **kw)

    core.delete_namespaced_pod = recording_delete  # type: ignore[method-assign]
    executor = KubernetesExecutor(
        core,
        settings(tmp_path, start_timeout_s=30.0),
        node=NODE,
        gone=lambda h: kube.kubelet.processes_gone(h.name, h.namespace),
    )
    agent = NodeAgent(NODE, store, source, home=tmp_path, executor=executor)
    agent.start()
    yield store, agent, source, deletes
    agent.shutdown(timeout_s=20)
    store.close()


def dispatch(store: Store, job_id: int, attempts: int) -> int:
    return store.dispatch(
        job_id, expected_attempts=attempts, node=NODE, devices=(0,), compute_pct=25, memory_mib=4096
    )


def test_a_job_runs_as_a_pod_is_evicted_with_grace_and_resumes_in_a_new_pod(
    node: Any, kube: KubeHarness, tmp_path: Path
) -> None:
    store, _agent, source, deletes = node
    out = tmp_path / "result.json"
    spec = JobSpec(
        command=[
            sys.executable,
            str(COUNT),
            str(STEPS),
            "--step-s",
            "0.05",
            "--every",
            "5",
            "--out",
            str(out),
        ],
        deadline_s=8,
        image="python:3.11-slim",
    )
    [job_id] = store.submit(spec, "alice", defaults_deadline_s=8)
    dispatch(store, job_id, 0)
    wait_until(lambda: store.get(job_id).state == "running")
    first = f"ebb-{job_id}-1"
    pod = kube.read_pod(first, NS)
    assert pod is not None and pod.metadata.labels["ebbtide.io/owner"] == "alice"
    wait_until(lambda: store.get(job_id).checkpoint_path)  # it checkpointed at least once

    spiked = time.monotonic()
    source.set(0, 10.0, 80_000)  # online memory leaves no room: the agent evicts
    wait_until(lambda: store.get(job_id).state == "queued")
    [(deleted_at, _, body)] = [d for d in deletes if d[1] == first][:1]
    # the warning is a delete whose grace is what is left of the deadline, less the margin
    assert body.grace_period_seconds <= 8 - (deleted_at - spiked)
    assert body.preconditions.uid == pod.metadata.uid
    [ev] = [e for e in store.events(job_id) if e["type"] == "evicted"]
    assert ev["reason_code"] == "online_memory"
    assert ev["killed"] is False and ev["checkpointed"] is True and not ev["deadline_missed"]
    kube.wait_pod_gone(first, namespace=NS)

    source.set(0, 0.0, 0)
    dispatch(store, job_id, 1)
    wait_until(lambda: store.get(job_id).state == "succeeded", timeout=30)
    result = json.loads(out.read_text())
    assert result["count"] == STEPS and result["attempts_seen"] == [1, 2]  # resumed, not redone
    log = (tmp_path / "logs" / str(job_id) / "2" / "stdout.log").read_text()
    assert "attempt 2: starting at" in log and "starting at 0 " not in log


def test_the_clusters_preemption_is_an_eviction_and_an_oom_a_failure(
    node: Any, kube: KubeHarness
) -> None:
    store, _agent, _source, _ = node
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    [preempted] = store.submit(JobSpec(command=sleeper), "bob", defaults_deadline_s=8)
    [oom] = store.submit(JobSpec(command=sleeper), "bob", defaults_deadline_s=8)
    dispatch(store, preempted, 0)
    dispatch(store, oom, 0)
    wait_until(lambda: store.get(preempted).state == store.get(oom).state == "running")
    wait_until(
        lambda: (
            kube.kubelet.pids(f"ebb-{preempted}-1", NS) and kube.kubelet.pids(f"ebb-{oom}-1", NS)
        )
    )
    kube.kubelet.preempt(f"ebb-{preempted}-1", NS)
    kube.kubelet.oom_kill(f"ebb-{oom}-1", NS)
    wait_until(lambda: store.get(preempted).state == "queued" and store.get(oom).state == "failed")
    [ev] = [e for e in store.events(preempted) if e["type"] == "evicted"]
    assert ev["reason_code"] == "kube_preempted" and "preempted by the cluster" in ev["reason"]
    failed = [e for e in store.events(oom) if e["type"] == "failed"]
    assert failed and "OOMKilled" in json.dumps(failed[-1])
    assert failed[-1]["reason_code"] == "oom"


def test_a_pod_whose_image_cannot_be_pulled_fails_after_the_start_timeout(
    kube: KubeHarness, tmp_path: Path
) -> None:
    kube.core().patch_node_status(NODE, {"status": {"allocatable": ALLOCATABLE}})
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    executor = KubernetesExecutor(
        kube.core(),
        settings(tmp_path, start_timeout_s=2.0),
        node=NODE,
        gone=lambda h: kube.kubelet.processes_gone(h.name, h.namespace),
    )
    agent = NodeAgent(
        NODE, store, StaticSource(parse_devices("1x80GiB")), home=tmp_path, executor=executor
    )
    agent.start()
    try:
        spec = JobSpec(command=["true"], image="registry.example/does-not-exist:1")
        [job_id] = store.submit(spec, "carol", defaults_deadline_s=8)
        dispatch(store, job_id, 0)
        wait_until(lambda: store.get(job_id).state == "failed", timeout=20)
        assert (
            "ImagePullBackOff" in store.get(job_id).reason
            or "ErrImagePull" in store.get(job_id).reason
        )
    finally:
        agent.shutdown(timeout_s=20)
        store.close()
