"""The Kubernetes API emulator and the test kubelet, driven only through the official client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kmock
import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.k8s import KubeHarness

NS = "default"
Event = dict[str, Any]


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def pod_body(
    name: str,
    command: list[str],
    *,
    node: str | None = "gpu-0",
    grace: int | None = None,
    labels: Mapping[str, str] | None = None,
    image: str = "busybox:1.36",
    node_selector: Mapping[str, str] | None = None,
    gpu_cores: int | None = None,
    env: Mapping[str, str] | None = None,
    args: list[str] | None = None,
    working_dir: str | None = None,
    finalizers: list[str] | None = None,
) -> client.V1Pod:
    resources = None
    if gpu_cores is not None:
        amounts = {"ebbtide.io/gpu-core": str(gpu_cores)}
        resources = client.V1ResourceRequirements(requests=amounts, limits=amounts)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {}), finalizers=finalizers),
        spec=client.V1PodSpec(
            node_name=node,
            node_selector=dict(node_selector) if node_selector else None,
            restart_policy="Never",
            termination_grace_period_seconds=grace,
            containers=[
                client.V1Container(
                    name="main",
                    image=image,
                    command=command,
                    args=args,
                    env=[client.V1EnvVar(name=k, value=v) for k, v in (env or {}).items()],
                    working_dir=working_dir,
                    resources=resources,
                )
            ],
        ),
    )


def body_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def terminated(pod: client.V1Pod) -> client.V1ContainerStateTerminated | None:
    statuses = pod.status.container_statuses or []
    return statuses[0].state.terminated if statuses else None


def condition(pod: client.V1Pod, type_: str) -> client.V1PodCondition | None:
    return next((c for c in pod.status.conditions or [] if c.type == type_), None)


def replay(
    core: client.CoreV1Api,
    since: str,
    until: Callable[[Event], bool],
    *,
    timeout_s: int = 8,
    **kwargs: Any,
) -> list[Event]:
    """Watch pods from resourceVersion ``since`` until ``until(event)``, or until the server
    ends the watch after ``timeout_s`` seconds."""
    stream = watch.Watch()
    seen: list[Event] = []
    for event in stream.stream(
        core.list_namespaced_pod, NS, resource_version=since, timeout_seconds=timeout_s, **kwargs
    ):
        seen.append(event)
        if until(event):
            stream.stop()
    return seen


def is_deleted(name: str) -> Callable[[Event], bool]:
    return lambda e: e["type"] == "DELETED" and e["raw_object"]["metadata"]["name"] == name


def start_running(kube: KubeHarness, body: client.V1Pod) -> client.V1Pod:
    kube.core().create_namespaced_pod(NS, body)
    name = body.metadata.name
    return kube.wait_for_pod(name, lambda p: p.status.phase == "Running")


def rv(obj: Any) -> int:
    return int(obj.metadata.resource_version)


LOOP_FOREVER = "while :; do sleep 0.05; done"


# -- store, versions, selectors -----------------------------------------------------------------


def test_create_get_list_patch_bump_a_global_resource_version(kube: KubeHarness) -> None:
    core = kube.core()
    start = int(core.list_namespaced_pod(NS).metadata.resource_version)
    first = core.create_namespaced_pod(NS, pod_body("a", sh("true"), node="elsewhere"))
    second = core.create_namespaced_pod(NS, pod_body("b", sh("true"), node="elsewhere"))
    assert start < rv(first) < rv(second)
    assert first.metadata.uid and first.metadata.uid != second.metadata.uid
    assert first.metadata.namespace == NS and first.metadata.creation_timestamp is not None
    assert first.status.phase == "Pending"
    assert first.spec.termination_grace_period_seconds == 30
    assert first.spec.scheduler_name == "default-scheduler"

    fetched = core.read_namespaced_pod("a", NS)
    assert rv(fetched) == rv(first)
    listed = core.list_namespaced_pod(NS)
    assert int(listed.metadata.resource_version) == rv(second)
    assert [p.metadata.name for p in listed.items] == ["a", "b"]

    patched = core.patch_namespaced_pod("a", NS, {"metadata": {"labels": {"x": "1"}}})
    assert patched.metadata.labels == {"x": "1"} and rv(patched) > rv(second)
    assert int(core.list_namespaced_pod(NS).metadata.resource_version) == rv(patched)

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod_body("a", sh("true"), node="elsewhere"))
    assert caught.value.status == 409
    assert body_of(caught.value)["kind"] == "Status"
    assert body_of(caught.value)["reason"] == "AlreadyExists"

    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("nope", NS)
    assert caught.value.status == 404 and body_of(caught.value)["reason"] == "NotFound"


def test_invalid_pods_are_rejected(kube: KubeHarness) -> None:
    core = kube.core()
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, {"metadata": {"name": "x"}, "spec": {"containers": []}})
    assert caught.value.status == 422 and body_of(caught.value)["reason"] == "Invalid"
    bad_type = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "y"},
        "spec": {"containers": [{"name": "main", "image": "i", "command": "not-a-list"}]},
    }
    # The client checks types itself; what reaches the server is checked against the schema.
    api = kube.api_client()
    answer = api.call_api(
        "POST",
        f"{kube.emulator.url}/api/v1/namespaces/{NS}/pods",
        header_params={"Content-Type": "application/json"},
        body=bad_type,
    )
    answer.read()
    assert answer.status == 422
    assert "spec.containers.0.command" in json.loads(answer.data)["message"]


def test_label_and_field_selectors_on_list(kube: KubeHarness) -> None:
    core = kube.core()
    for name, node, labels in [
        ("p1", "n1", {"app": "a", "tier": "gpu"}),
        ("p2", "n1", {"app": "b"}),
        ("p3", "n2", {"app": "c", "tier": "cpu"}),
    ]:
        core.create_namespaced_pod(NS, pod_body(name, sh("true"), node=node, labels=labels))

    def names(**selectors: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(NS, **selectors).items]

    assert names(label_selector="app=a") == ["p1"]
    assert names(label_selector="app==b") == ["p2"]
    assert names(label_selector="app!=a") == ["p2", "p3"]
    assert names(label_selector="tier") == ["p1", "p3"]
    assert names(label_selector="!tier") == ["p2"]
    assert names(label_selector="app in (a, c)") == ["p1", "p3"]
    assert names(label_selector="app notin (a),tier") == ["p3"]
    assert names(label_selector="app,tier=gpu") == ["p1"]
    assert names(field_selector="spec.nodeName=n1") == ["p1", "p2"]
    assert names(field_selector="metadata.name=p3") == ["p3"]
    assert names(field_selector="spec.nodeName=n1,metadata.name!=p1") == ["p2"]
    assert names(field_selector="spec.nodeName=n1", label_selector="app=b") == ["p2"]
    all_namespaces = core.list_pod_for_all_namespaces(field_selector="status.phase=Pending")
    assert len(all_namespaces.items) == 3
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod(NS, field_selector="spec.bogus=1")
    assert caught.value.status == 400


# -- watch ---------------------------------------------------------------------------------------


def test_watch_from_a_list_sees_later_changes_in_order_then_bookmarks(kube: KubeHarness) -> None:
    core = kube.core()
    since = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod_body("w", sh("true"), node="elsewhere"))
    core.patch_namespaced_pod("w", NS, {"metadata": {"labels": {"step": "2"}}})
    core.delete_namespaced_pod("w", NS)

    seen = replay(core, since, lambda e: e["type"] == "BOOKMARK", allow_watch_bookmarks=True)
    types = [e["type"] for e in seen]
    assert types == ["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    versions = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in seen]
    assert versions[:3] == sorted(versions[:3]) and int(since) < versions[0]
    assert versions[3] == versions[2]  # the bookmark carries the latest version
    assert seen[1]["object"].metadata.labels == {"step": "2"}
    assert seen[3]["raw_object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(versions[2])},
    }


def test_watch_streams_live_changes(kube: KubeHarness) -> None:
    core = kube.core()
    since = core.list_namespaced_pod(NS).metadata.resource_version
    seen: list[Event] = []
    done = threading.Event()

    def consume() -> None:
        succeeded = lambda e: e["raw_object"]["status"]["phase"] == "Succeeded"  # noqa: E731
        seen.extend(replay(core, since, succeeded))
        done.set()

    thread = threading.Thread(target=consume)
    thread.start()
    kube.wait_until(lambda: kube.emulator.live_stream_count() == 1)
    core.create_namespaced_pod(NS, pod_body("live", sh("exit 0")))
    thread.join(10)
    assert done.is_set()
    phases = [e["raw_object"]["status"]["phase"] for e in seen]
    assert [e["type"] for e in seen] == ["ADDED"] + ["MODIFIED"] * (len(seen) - 1)
    assert phases[0] == "Pending" and "Running" in phases and phases[-1] == "Succeeded"


def test_watch_with_no_version_starts_with_what_exists(kube: KubeHarness) -> None:
    core = kube.core()
    core.create_namespaced_pod(NS, pod_body("old", sh("true"), node="elsewhere"))
    seen = replay(core, "0", lambda e: True)
    assert [(e["type"], e["object"].metadata.name) for e in seen] == [("ADDED", "old")]


def test_watch_from_a_compacted_version_gets_410_expired(kube: KubeHarness) -> None:
    core = kube.core()
    old = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod_body("c", sh("true"), node="elsewhere"))
    kube.emulator.compact()

    # On the wire: HTTP 200 and an ERROR event carrying a 410 Status, as the API server sends.
    response = core.list_namespaced_pod(
        NS, watch=True, resource_version=old, timeout_seconds=2, _preload_content=False
    )
    try:
        assert response.status == 200
        lines = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    finally:
        response.release_conn()
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    assert lines[0]["object"]["code"] == 410 and lines[0]["object"]["reason"] == "Expired"

    # The client's Watch turns it into ApiException(410): at once with timeout_seconds...
    with pytest.raises(ApiException) as caught:
        replay(core, old, lambda e: True)
    assert caught.value.status == 410 and "Expired" in caught.value.reason
    # ...and, without it, after retrying once from the same (still expired) version.
    with pytest.raises(ApiException) as caught:
        for _ in watch.Watch().stream(
            core.list_namespaced_pod, NS, resource_version=old, _request_timeout=5
        ):
            pass
    assert caught.value.status == 410

    # A watch from the version of a fresh list works.
    fresh = core.list_namespaced_pod(NS).metadata.resource_version
    core.delete_namespaced_pod("c", NS)
    assert [e["type"] for e in replay(core, fresh, is_deleted("c"))] == ["DELETED"]


def test_broken_watch_reconnects_from_its_last_version(kube: KubeHarness) -> None:
    core = kube.core()
    since = core.list_namespaced_pod(NS).metadata.resource_version
    seen: list[str] = []
    failure: list[BaseException] = []

    def consume() -> None:
        stream = watch.Watch()
        try:
            for event in stream.stream(
                core.list_namespaced_pod, NS, resource_version=since, _request_timeout=10
            ):
                seen.append(event["object"].metadata.name)
                if event["object"].metadata.name == "second":
                    stream.stop()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    core.create_namespaced_pod(NS, pod_body("first", sh("true"), node="elsewhere"))
    kube.wait_until(lambda: seen == ["first"])
    assert kube.emulator.break_watches() == 1
    kube.wait_until(lambda: kube.emulator.live_stream_count() == 1)  # the client came back
    core.create_namespaced_pod(NS, pod_body("second", sh("true"), node="elsewhere"))
    thread.join(10)
    assert not failure and seen == ["first", "second"]
    assert len(list(kube.emulator[kmock.action.WATCH])) == 2


def test_aborted_watch_connection_raises_in_the_client(kube: KubeHarness) -> None:
    core = kube.core()
    since = core.list_namespaced_pod(NS).metadata.resource_version
    failure: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in watch.Watch().stream(
                core.list_namespaced_pod, NS, resource_version=since, _request_timeout=10
            ):
                pass
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    kube.wait_until(lambda: kube.emulator.live_stream_count() == 1)
    assert kube.emulator.break_watches(abrupt=True) == 1
    thread.join(10)
    assert len(failure) == 1 and isinstance(failure[0], urllib3.exceptions.ProtocolError)


def test_watch_with_a_selector_sees_objects_leave_and_enter_it(kube: KubeHarness) -> None:
    core = kube.core()
    since = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod_body("s", sh("true"), node="elsewhere", labels={"q": "1"}))
    core.create_namespaced_pod(NS, pod_body("t", sh("true"), node="elsewhere", labels={"q": "2"}))
    core.patch_namespaced_pod("s", NS, {"metadata": {"labels": {"q": "2"}}})
    core.patch_namespaced_pod("s", NS, {"metadata": {"labels": {"q": "1"}}})
    core.patch_namespaced_pod("s", NS, {"metadata": {"labels": {"extra": "x"}}})
    core.delete_namespaced_pod("s", NS)
    removed = lambda e: e["type"] == "DELETED" and "extra" in e["object"].metadata.labels  # noqa: E731
    seen = replay(core, since, removed, label_selector="q=1")
    assert [(e["type"], e["object"].metadata.name) for e in seen] == [
        ("ADDED", "s"),
        ("DELETED", "s"),  # left the selector
        ("ADDED", "s"),  # came back
        ("MODIFIED", "s"),
        ("DELETED", "s"),
    ]
    by_field = replay(core, since, is_deleted("s"), field_selector="metadata.name=t", timeout_s=1)
    assert [(e["type"], e["object"].metadata.name) for e in by_field] == [("ADDED", "t")]


# -- patches, nodes -----------------------------------------------------------------------------


def test_node_status_patch_advertises_extended_resources(kube: KubeHarness) -> None:
    core = kube.core()
    node = core.read_node("gpu-0")
    assert node.metadata.labels["kubernetes.io/hostname"] == "gpu-0"
    assert condition(node, "Ready").status == "True"  # type: ignore[arg-type]
    resources = {"ebbtide.io/gpu-core": "4", "ebbtide.io/gpu-memory": "81920"}
    patched = core.patch_node_status(
        "gpu-0", {"status": {"capacity": resources, "allocatable": resources}}
    )
    assert rv(patched) > rv(node)
    assert patched.status.allocatable["ebbtide.io/gpu-core"] == "4"
    assert patched.status.capacity["ebbtide.io/gpu-memory"] == "81920"
    assert patched.status.allocatable["cpu"] == node.status.allocatable["cpu"]  # merged
    # The status subresource ignores everything but status.
    again = core.patch_node_status("gpu-0", {"metadata": {"labels": {"x": "y"}}})
    assert "x" not in again.metadata.labels
    # Strategic merge patch merges conditions by type.
    merged = core.patch_node_status(
        "gpu-0", {"status": {"conditions": [{"type": "GPUHealthy", "status": "True"}]}}
    )
    assert {c.type for c in merged.status.conditions} == {"Ready", "GPUHealthy"}
    kube.add_node("gpu-1", labels={"pool": "spare"}, kubelet=False)
    assert core.read_node("gpu-1").metadata.labels["pool"] == "spare"
    assert [n.metadata.name for n in core.list_node().items] == ["gpu-0", "gpu-1"]


def test_pod_patch_rules(kube: KubeHarness) -> None:
    core = kube.core()
    pod = core.create_namespaced_pod(NS, pod_body("r", sh("true"), node="elsewhere"))
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod(
            "r", NS, {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
        )
    assert caught.value.status == 409 and body_of(caught.value)["reason"] == "Conflict"
    ok = core.patch_namespaced_pod(
        "r",
        NS,
        {"metadata": {"resourceVersion": pod.metadata.resource_version, "labels": {"a": "b"}}},
    )
    assert rv(ok) > rv(pod)
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("r", NS, {"spec": {"restartPolicy": "Always"}})
    assert caught.value.status == 422
    ignored = core.patch_namespaced_pod("r", NS, {"status": {"phase": "Running"}})
    assert ignored.status.phase == "Pending"
    status = core.patch_namespaced_pod_status("r", NS, {"status": {"message": "hi"}})
    assert status.status.message == "hi" and status.status.phase == "Pending"
    json_patch = [{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}]
    assert core.patch_namespaced_pod("r", NS, json_patch).metadata.annotations == {"k": "v"}


# -- deletion ------------------------------------------------------------------------------------


def test_delete_preconditions_and_missing_objects(kube: KubeHarness) -> None:
    core = kube.core()
    pod = core.create_namespaced_pod(NS, pod_body("d", sh("true"), node="elsewhere"))
    wrong = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("d", NS, body=wrong)
    assert caught.value.status == 409 and body_of(caught.value)["reason"] == "Conflict"
    assert "Precondition failed: UID" in body_of(caught.value)["message"]
    right = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.metadata.uid))
    deleted = core.delete_namespaced_pod("d", NS, body=right)
    assert deleted.metadata.name == "d"
    assert kube.read_pod("d") is None  # not bound to a kubelet: removed at once
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("d", NS, body=right)
    assert caught.value.status == 404


def test_graceful_delete_sends_sigterm_then_removes_after_the_process_ends(
    kube: KubeHarness, tmp_path: Path
) -> None:
    core = kube.core()
    marker = tmp_path / "got-term"
    script = f"trap 'echo term > {marker}; exit 0' TERM; {LOOP_FOREVER}"
    pod = start_running(kube, pod_body("g", sh(script), grace=20))
    assert kube.kubelet.pids("g")
    options = client.V1DeleteOptions(
        grace_period_seconds=20, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
    )
    started = time.monotonic()
    answer = core.delete_namespaced_pod("g", NS, body=options)
    assert answer.metadata.deletion_timestamp is not None
    assert answer.metadata.deletion_grace_period_seconds == 20
    kube.wait_pod_gone("g")
    assert time.monotonic() - started < 3  # not the 20 s grace: the process ended on SIGTERM
    assert marker.read_text().strip() == "term"
    assert kube.kubelet.processes_gone("g")

    seen = replay(core, pod.metadata.resource_version, is_deleted("g"))
    assert [e["type"] for e in seen] == ["MODIFIED", "MODIFIED", "DELETED"]
    marking, final, gone = (e["object"] for e in seen)
    assert marking.metadata.deletion_timestamp is not None and marking.status.phase == "Running"
    assert final.status.phase == "Succeeded"
    state = terminated(final)
    assert state is not None and state.exit_code == 0 and state.reason == "Completed"
    assert gone.metadata.uid == pod.metadata.uid


def test_sigterm_ignored_means_sigkill_when_the_shortened_grace_ends(kube: KubeHarness) -> None:
    core = kube.core()
    start_running(kube, pod_body("stubborn", sh(f"trap '' TERM; {LOOP_FOREVER}"), grace=30))
    first = core.delete_namespaced_pod("stubborn", NS)  # the pod's own grace: 30 s
    assert first.metadata.deletion_grace_period_seconds == 30
    time.sleep(0.3)
    assert kube.kubelet.pids("stubborn")  # SIGTERM ignored
    assert kube.read_pod("stubborn") is not None

    shorter = core.delete_namespaced_pod("stubborn", NS, grace_period_seconds=1)
    assert shorter.metadata.deletion_grace_period_seconds == 1
    assert shorter.metadata.deletion_timestamp < first.metadata.deletion_timestamp
    started = time.monotonic()
    kube.wait_pod_gone("stubborn", timeout_s=5)
    waited = time.monotonic() - started
    assert 0.7 < waited < 4  # SIGKILL once the shortened grace (1 s) ends, not after 30 s
    assert kube.kubelet.processes_gone("stubborn")
    seen = replay(core, first.metadata.resource_version, is_deleted("stubborn"))
    final = seen[-2]["object"]
    state = terminated(final)
    assert state is not None and state.exit_code == 137 and state.reason == "Error"
    assert final.status.phase == "Failed"


def test_immediate_deletion_cases(kube: KubeHarness) -> None:
    core = kube.core()
    start_running(kube, pod_body("now", sh(LOOP_FOREVER)))
    since = core.list_namespaced_pod(NS).metadata.resource_version
    core.delete_namespaced_pod("now", NS, grace_period_seconds=0)
    assert kube.read_pod("now") is None  # grace 0: gone at once
    kube.wait_until(lambda: kube.kubelet.processes_gone("now"))  # the kubelet still kills
    assert [e["type"] for e in replay(core, since, is_deleted("now"))] == ["DELETED"]

    core.create_namespaced_pod(NS, pod_body("finished", sh("exit 0")))
    kube.wait_for_pod("finished", lambda p: p.status.phase == "Succeeded")
    core.delete_namespaced_pod("finished", NS)
    assert kube.read_pod("finished") is None  # terminal phase: gone at once


def test_finalizers_hold_removal(kube: KubeHarness) -> None:
    core = kube.core()
    core.create_namespaced_pod(
        NS, pod_body("f", sh("true"), node="elsewhere", finalizers=["example.com/hold"])
    )
    marked = core.delete_namespaced_pod("f", NS)
    assert marked.metadata.deletion_timestamp is not None
    assert kube.read_pod("f") is not None
    core.patch_namespaced_pod("f", NS, {"metadata": {"finalizers": None}})
    assert kube.read_pod("f") is None


# -- the kubelet ----------------------------------------------------------------------------------


def test_exit_codes_and_phases(kube: KubeHarness) -> None:
    core = kube.core()
    # "$$$$": the kubelet turns "$$" into "$", so the shell sees "$$".
    scripts = {"zero": "exit 0", "three": "exit 3", "signal": "kill -s USR1 $$$$"}
    for name, script in scripts.items():
        core.create_namespaced_pod(NS, pod_body(name, sh(script)))
    pods = {
        name: kube.wait_for_pod(name, lambda p: p.status.phase in ("Succeeded", "Failed"))
        for name in scripts
    }
    expected = {
        "zero": ("Succeeded", 0, "Completed"),
        "three": ("Failed", 3, "Error"),
        "signal": ("Failed", 128 + 10, "Error"),  # SIGUSR1 is 10
    }
    for name, (phase, code, reason) in expected.items():
        pod = pods[name]
        state = terminated(pod)
        assert pod.status.phase == phase
        assert state is not None and (state.exit_code, state.reason) == (code, reason)
        assert state.started_at is not None and state.finished_at is not None
        assert pod.status.start_time is not None and pod.status.host_ip == "127.0.0.1"
        assert condition(pod, "Ready").status == "False"  # type: ignore[union-attr]
        assert pod.status.container_statuses[0].container_id.startswith("containerd://")


def test_running_status_shape(kube: KubeHarness) -> None:
    pod = start_running(kube, pod_body("up", sh(LOOP_FOREVER)))
    status = pod.status.container_statuses[0]
    assert status.ready and status.started and status.restart_count == 0
    assert status.state.running.started_at is not None
    assert pod.status.pod_ip == "127.0.0.1" and pod.status.start_time is not None
    for type_ in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        assert condition(pod, type_).status == "True"  # type: ignore[union-attr]
    pgid = kube.kubelet.pgid("up")
    assert pgid is not None and pgid in kube.kubelet.pids("up")


def test_pod_log_env_working_dir_and_follow(kube: KubeHarness, tmp_path: Path) -> None:
    core = kube.core()
    script = 'echo "$0 $GREETING in $(pwd)"; echo oops >&2; echo last'
    body = pod_body(
        "talk",
        sh(script),
        args=["$(WHO)"],
        env={"GREETING": "hello", "WHO": "world"},
        working_dir=str(tmp_path),
    )
    core.create_namespaced_pod(NS, body)
    kube.wait_for_pod("talk", lambda p: p.status.phase == "Succeeded")
    text = core.read_namespaced_pod_log("talk", NS)
    assert text == f"world hello in {tmp_path}\noops\nlast\n"
    assert core.read_namespaced_pod_log("talk", NS, tail_lines=1) == "last\n"

    slow = "for i in 1 2 3; do echo line$i; sleep 0.1; done"
    core.create_namespaced_pod(NS, pod_body("slow", sh(slow)))
    kube.wait_for_pod("slow", lambda p: p.status.phase != "Pending")
    lines = list(watch.Watch().stream(core.read_namespaced_pod_log, "slow", NS, follow=True))
    assert lines == ["line1", "line2", "line3"]


def test_image_pull_failures(kube: KubeHarness) -> None:
    core = kube.core()
    core.create_namespaced_pod(
        NS, pod_body("pull", sh("true"), image="registry.example/does-not-exist:1")
    )

    def waiting(reason: str) -> Callable[[client.V1Pod], bool]:
        def check(pod: client.V1Pod) -> bool:
            statuses = pod.status.container_statuses or []
            state = statuses[0].state.waiting if statuses else None
            return state is not None and state.reason == reason

        return check

    pod = kube.wait_for_pod("pull", waiting("ErrImagePull"))
    assert "does-not-exist" in pod.status.container_statuses[0].state.waiting.message
    pod = kube.wait_for_pod("pull", waiting("ImagePullBackOff"))
    assert pod.status.phase == "Pending" and kube.kubelet.pgid("pull") is None
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod_log("pull", NS)
    assert caught.value.status == 400 and "waiting to start" in body_of(caught.value)["message"]

    kube.kubelet.fail_image("marked")
    core.create_namespaced_pod(NS, pod_body("marked", sh("true")))
    kube.wait_for_pod("marked", waiting("ImagePullBackOff"))
    core.delete_namespaced_pod("marked", NS)  # graceful, but nothing runs: the kubelet removes it
    kube.wait_pod_gone("marked")


def test_unschedulable_until_a_kubelet_serves_the_node(kube: KubeHarness) -> None:
    core = kube.core()
    body = pod_body(
        "lost", sh("exit 0"), node=None, node_selector={"kubernetes.io/hostname": "gpu-7"}
    )
    core.create_namespaced_pod(NS, body)

    def unschedulable(pod: client.V1Pod) -> bool:
        scheduled = condition(pod, "PodScheduled")
        return scheduled is not None and scheduled.reason == "Unschedulable"

    pod = kube.wait_for_pod("lost", unschedulable)
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None and scheduled.status == "False"
    assert scheduled.message == (
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    )
    assert pod.status.phase == "Pending" and pod.spec.node_name is None

    kube.add_node("gpu-7")
    pod = kube.wait_for_pod("lost", lambda p: p.status.phase == "Succeeded")
    assert pod.spec.node_name == "gpu-7"
    assert condition(pod, "PodScheduled").status == "True"  # type: ignore[union-attr]


def test_extended_resources_are_scheduled_and_admitted(kube: KubeHarness) -> None:
    core = kube.core()
    resources = {"ebbtide.io/gpu-core": "2"}
    core.patch_node_status("gpu-0", {"status": {"capacity": resources, "allocatable": resources}})
    pinned = {"kubernetes.io/hostname": "gpu-0"}
    core.create_namespaced_pod(
        NS, pod_body("big", sh(LOOP_FOREVER), node=None, node_selector=pinned, gpu_cores=2)
    )
    kube.wait_for_pod("big", lambda p: p.status.phase == "Running")
    core.create_namespaced_pod(
        NS, pod_body("waits", sh("exit 0"), node=None, node_selector=pinned, gpu_cores=1)
    )
    pod = kube.wait_for_pod("waits", lambda p: condition(p, "PodScheduled") is not None)
    assert condition(pod, "PodScheduled").message == (  # type: ignore[union-attr]
        "0/1 nodes are available: 1 Insufficient ebbtide.io/gpu-core."
    )
    # Bound directly, the kubelet's admission rejects it.
    core.create_namespaced_pod(NS, pod_body("direct", sh("exit 0"), gpu_cores=1))
    rejected = kube.wait_for_pod("direct", lambda p: p.status.phase == "Failed")
    assert rejected.status.reason == "OutOfebbtide.io/gpu-core"
    assert rejected.status.message.startswith("Pod was rejected: Node didn't have enough")

    core.delete_namespaced_pod("big", NS, grace_period_seconds=5)
    pod = kube.wait_for_pod("waits", lambda p: p.status.phase == "Succeeded")
    assert pod.spec.node_name == "gpu-0"


def test_oom_kill(kube: KubeHarness) -> None:
    start_running(kube, pod_body("hog", sh(LOOP_FOREVER)))
    kube.kubelet.oom_kill("hog")
    pod = kube.wait_for_pod("hog", lambda p: p.status.phase == "Failed")
    state = terminated(pod)
    assert state is not None and (state.exit_code, state.reason) == (137, "OOMKilled")
    assert kube.kubelet.processes_gone("hog")


def test_node_pressure_eviction(kube: KubeHarness) -> None:
    start_running(kube, pod_body("evicted", sh(LOOP_FOREVER)))
    kube.kubelet.evict_for_pressure("evicted")
    pod = kube.wait_for_pod("evicted", lambda p: p.status.phase == "Failed")
    assert pod.status.reason == "Evicted"
    assert pod.status.message.startswith("The node was low on resource: memory.")
    disruption = condition(pod, "DisruptionTarget")
    assert disruption is not None and disruption.status == "True"
    assert disruption.reason == "TerminationByKubelet"
    assert pod.metadata.deletion_timestamp is None  # evicted pods stay
    assert terminated(pod).exit_code == 143  # type: ignore[union-attr]  # SIGTERM first
    assert kube.kubelet.processes_gone("evicted")


def test_active_deadline_exceeded(kube: KubeHarness) -> None:
    body = pod_body("late", sh(LOOP_FOREVER))
    body.spec.active_deadline_seconds = 1
    kube.core().create_namespaced_pod(NS, body)
    pod = kube.wait_for_pod("late", lambda p: p.status.phase == "Failed")
    assert pod.status.reason == "DeadlineExceeded"
    assert kube.kubelet.processes_gone("late")


def test_preemption_marks_then_deletes_gracefully(kube: KubeHarness, tmp_path: Path) -> None:
    core = kube.core()
    marker = tmp_path / "term"
    script = f"trap 'echo term > {marker}; exit 0' TERM; {LOOP_FOREVER}"
    pod = start_running(kube, pod_body("victim", sh(script), grace=7))
    kube.kubelet.preempt("victim", preemptor="default/urgent")
    kube.wait_pod_gone("victim")
    assert marker.exists()
    seen = replay(core, pod.metadata.resource_version, is_deleted("victim"))
    marked = seen[0]["object"]
    disruption = condition(marked, "DisruptionTarget")
    assert disruption is not None and disruption.reason == "PreemptionByScheduler"
    assert disruption.message == "default/urgent: preempting to accommodate a higher priority pod"
    assert marked.metadata.deletion_timestamp is None
    deleting = seen[1]["object"]
    assert deleting.metadata.deletion_grace_period_seconds == 7
    assert seen[-1]["type"] == "DELETED"


def test_node_loss(kube: KubeHarness) -> None:
    core = kube.core()
    pod = start_running(kube, pod_body("orphan", sh(LOOP_FOREVER)))
    pids = kube.kubelet.pids("orphan")
    assert pids
    kube.kubelet.lose_node("gpu-0")
    assert kube.read_pod("orphan") is None
    kube.wait_until(lambda: kube.kubelet.processes_gone("orphan"))
    with pytest.raises(ApiException) as caught:
        core.read_node("gpu-0")
    assert caught.value.status == 404
    seen = replay(core, pod.metadata.resource_version, is_deleted("orphan"))
    assert [e["type"] for e in seen] == ["MODIFIED", "DELETED"]
    marked = seen[0]["object"]
    disruption = condition(marked, "DisruptionTarget")
    assert disruption is not None and disruption.reason == "DeletionByPodGC"
    assert marked.status.phase == "Failed"


def test_an_injected_reaction_wins_over_the_emulation(kube: KubeHarness) -> None:
    core = kube.core()
    kube.emulator["post /api/v1/namespaces/default/pods"][:1] << 503
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod_body("i", sh("true"), node="elsewhere"))
    assert caught.value.status == 503
    assert kube.read_pod("i") is None  # the failed request wrote nothing
    core.create_namespaced_pod(NS, pod_body("i", sh("true"), node="elsewhere"))
    assert kube.read_pod("i") is not None
