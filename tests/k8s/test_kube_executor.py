"""The Kubernetes executor against the API emulator and its test kubelet: real HTTP, the
official client, real processes started as pods."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ebbtide.config.policy import KubernetesSettings
from ebbtide.kube.executor import KubernetesExecutor, PodHandle, spare_capacity
from ebbtide.workers.executor import CAUSE_LOST, CAUSE_OOM, CAUSE_PREEMPTED, Launch
from ebbtide.workers.shim import CAUSE_JOB
from tests.k8s import KubeHarness

NS = "ebbtide-jobs"
NODE = "gpu-0"

TRAP_AND_REQUEUE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(99))\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def settings(tmp_path: Path, **over: Any) -> KubernetesSettings:
    fields: dict[str, Any] = {
        "namespace": NS,
        "image": "python:3.11-slim",
        "state_dir": str(tmp_path),
        "start_timeout_s": 2.0,
        "grace_margin_s": 1.0,
    }
    fields.update(over)
    return KubernetesSettings(**fields)


#: What node gpu-0 offers: the resources of the profiles these tests use.
ALLOCATABLE = {
    "nvidia.com/gpu": "8",
    "tke.cloud.tencent.com/qgpu-core": "800",
    "tke.cloud.tencent.com/qgpu-memory": "640",
    "pods": "110",
}


def executor(kube: KubeHarness, tmp_path: Path, **over: Any) -> KubernetesExecutor:
    kube.core().patch_node_status(NODE, {"status": {"allocatable": ALLOCATABLE}})
    ex = KubernetesExecutor(
        kube.core(),
        settings(tmp_path, **over),
        node=NODE,
        gone=lambda h: kube.kubelet.processes_gone(h.name, h.namespace),
    )
    ex.watcher.retry_s = 0.05
    return ex


def launch(tmp_path: Path, code: str, *, attempt: int = 1, **over: Any) -> Launch:
    fields: dict[str, Any] = {
        "job_id": 4,
        "attempt": attempt,
        "argv": [sys.executable, "-c", code],
        "env": {"EBBTIDE_JOB_ID": "4"},
        "cwd": None,
        "stdout_path": tmp_path / "logs" / "4" / str(attempt) / "stdout.log",
        "stderr_path": tmp_path / "logs" / "4" / str(attempt) / "stderr.log",
        "owner": "alice",
        "queue": "default",
        "node": NODE,
        "deadline_s": 10.0,
        "compute_pct": 25.0,
        "memory_mib": 4096,
    }
    fields.update(over)
    return Launch(**fields)


def wait_exit(ex: KubernetesExecutor, handle: PodHandle, timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    give_up = time.monotonic() + timeout_s
    while (ended := ex.poll(handle)) is None:
        assert time.monotonic() < give_up, "the attempt did not end in time"
        time.sleep(0.02)
    return ended


def test_an_attempt_runs_as_a_labelled_pod_with_its_slice_and_its_log_is_kept(
    kube: KubeHarness, tmp_path: Path
) -> None:
    ex = executor(kube, tmp_path, profile="qgpu")
    try:
        handle = ex.start(launch(tmp_path, "print('hello from a pod')", compute_pct=23.0))
        pod = kube.read_pod(handle.name, NS)
        assert pod is not None
        assert pod.metadata.labels["ebbtide.io/job-id"] == "4"
        assert pod.metadata.labels["ebbtide.io/attempt"] == "1"
        assert pod.metadata.labels["ebbtide.io/owner"] == "alice"
        assert pod.metadata.labels["ebbtide.io/node"] == NODE
        assert pod.spec.restart_policy == "Never"
        assert pod.spec.node_selector is None  # pinned by the node's name, not a label
        [term] = (
            pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
        )
        assert [(f.key, f.operator, f.values) for f in term.match_fields] == [
            ("metadata.name", "In", [NODE])
        ]
        tolerations = [(t.key, t.operator, t.effect) for t in pod.spec.tolerations]
        assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerations
        limits = pod.spec.containers[0].resources.limits
        assert limits == {
            "tke.cloud.tencent.com/qgpu-core": "25",
            "tke.cloud.tencent.com/qgpu-memory": "4",
        }
        # nothing of the agent's environment reaches the pod
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert "EBBTIDE_DB_URL" not in env and env["EBBTIDE_JOB_ID"] == "4"
        ended = wait_exit(ex, handle)
        assert (ended.code, ended.cause) == (0, CAUSE_JOB)
        ex.sweep(handle)
        out = handle.stdout_path
        assert out is not None
        # the log is copied on a thread of its own (the agent's loop never waits for it)
        kube.wait_until(lambda: out.exists() and "hello from a pod" in out.read_text())
        kube.wait_pod_gone(handle.name, namespace=NS)
    finally:
        ex.close()


def test_a_warning_deletes_the_pod_with_the_grace_left_and_the_job_exits_as_it_chose(
    kube: KubeHarness, tmp_path: Path
) -> None:
    ex = executor(kube, tmp_path)
    try:
        handle = ex.start(launch(tmp_path, TRAP_AND_REQUEUE))
        kube.wait_until(lambda: kube.kubelet.pids(handle.name, NS))
        time.sleep(0.3)  # its SIGTERM handler is in place
        ex.kill_at(handle, time.monotonic() + 6.0)
        ex.signal(handle, signal.SIGTERM)
        pod = kube.read_pod(handle.name, NS)
        if pod is not None:  # still terminating: the grace is what was left, less the margin
            assert pod.metadata.deletion_grace_period_seconds <= 5
        ended = wait_exit(ex, handle)
        assert (ended.code, ended.cause) == (99, CAUSE_JOB)
        ex.sweep(handle)
    finally:
        ex.close()


def test_a_kill_deletes_at_once_and_frees_the_slice_before_returning(
    kube: KubeHarness, tmp_path: Path
) -> None:
    ex = executor(kube, tmp_path)
    try:
        ignore = (
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
        )
        handle = ex.start(launch(tmp_path, ignore))
        kube.wait_until(lambda: kube.kubelet.pids(handle.name, NS))
        started = time.monotonic()
        ex.sweep(handle)
        assert kube.kubelet.processes_gone(handle.name, NS)
        assert time.monotonic() - started < 2.0
    finally:
        ex.close()


def test_the_clusters_own_ends_become_causes(kube: KubeHarness, tmp_path: Path) -> None:
    ex = executor(kube, tmp_path)
    try:
        sleeper = "import time\ntime.sleep(60)\n"
        oom = ex.start(launch(tmp_path, sleeper, attempt=1))
        preempted = ex.start(launch(tmp_path, sleeper, attempt=2))
        deleted = ex.start(launch(tmp_path, sleeper, attempt=3))
        for h in (oom, preempted, deleted):
            kube.wait_until(lambda h=h: kube.kubelet.pids(h.name, NS))
        kube.kubelet.oom_kill(oom.name, NS)
        kube.kubelet.preempt(preempted.name, NS)
        kube.core().delete_namespaced_pod(deleted.name, NS, grace_period_seconds=0)
        assert wait_exit(ex, oom).cause == CAUSE_OOM
        p = wait_exit(ex, preempted)
        assert p.cause == CAUSE_PREEMPTED and p.grace_s == 10
        d = wait_exit(ex, deleted)
        assert d.cause == CAUSE_LOST and "someone else" in d.detail
    finally:
        ex.close()


def test_a_watch_that_breaks_or_expires_loses_no_outcome(kube: KubeHarness, tmp_path: Path) -> None:
    ex = executor(kube, tmp_path)
    try:
        handle = ex.start(launch(tmp_path, "import time\ntime.sleep(60)\n", attempt=1))
        kube.wait_until(lambda: ex.watcher.watches >= 1)
        # a broken stream: the watch resumes from where it was
        kube.emulator.break_watches(abrupt=True)
        kube.kubelet.oom_kill(handle.name, NS)
        assert wait_exit(ex, handle).cause == CAUSE_OOM
        ex.sweep(handle)

        # the watcher down while a pod ends and the history is compacted: on its restart
        # its resourceVersion is too old (410 Gone), it lists again and sees the end
        short = ex.start(launch(tmp_path, "raise SystemExit(3)", attempt=2))
        ex.watcher.stop()
        lists = ex.watcher.lists
        kube.wait_for_pod(short.name, lambda p: p.status.phase == "Failed", namespace=NS)
        kube.emulator.compact()
        ex.watcher.start()
        ended = wait_exit(ex, short)
        assert (ended.code, ended.cause) == (3, CAUSE_JOB)
        assert ex.watcher.lists == lists + 1  # one relist, after the 410
    finally:
        ex.close()


def test_a_restarted_agent_delivers_what_its_pods_did_and_deletes_what_still_runs(
    kube: KubeHarness, tmp_path: Path
) -> None:
    before = executor(kube, tmp_path)
    done = before.start(launch(tmp_path, "print('done')", attempt=1))
    running = before.start(launch(tmp_path, "import time\ntime.sleep(60)\n", attempt=2))
    kube.wait_until(lambda: kube.kubelet.pids(running.name, NS))
    before.close()  # the agent "crashed": its pods carry on without it
    kube.wait_for_pod(done.name, lambda p: p.status.phase == "Succeeded", namespace=NS)
    after = executor(kube, tmp_path)
    try:
        leftovers = {(lo.job_id, lo.attempt): lo.ended for lo in after.reap_leftovers()}
        assert set(leftovers) == {(4, 1), (4, 2)}
        assert leftovers[(4, 1)] is not None and leftovers[(4, 1)].code == 0  # delivered
        assert leftovers[(4, 2)] is None  # killed: requeued as lost
        assert kube.kubelet.processes_gone(running.name, NS)
        assert after.reap_leftovers() == []
    finally:
        after.close()


def test_the_api_refusing_a_pod_is_the_jobs_error_but_an_outage_only_defers_it(
    kube: KubeHarness, tmp_path: Path
) -> None:
    from ebbtide.workers.executor import StartDeferred

    ex = executor(kube, tmp_path)
    try:
        kube.emulator[f"post /api/v1/namespaces/{NS}/pods"] << 503
        with pytest.raises(StartDeferred):
            ex.start(launch(tmp_path, "pass"))
    finally:
        ex.close()


def test_spare_capacity_is_what_online_and_the_reserve_leave_on_healthy_devices() -> None:
    devices = [
        {"memory_mib": 81920, "online_compute_pct": 30, "online_memory_mib": 20480,
         "reserve_compute_pct": 10, "reserve_memory_mib": 1024},
        {"memory_mib": 81920, "online_compute_pct": 0, "online_memory_mib": 0,
         "health": "unhealthy"},
    ]  # fmt: skip
    assert spare_capacity(devices) == {
        "ebbtide.io/gpu-core": "60",
        "ebbtide.io/gpu-memory": "60416",
    }


def test_the_online_pods_on_the_node_are_named_and_direct_spare_capacity_is_advertised(
    kube: KubeHarness, tmp_path: Path
) -> None:
    online = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llm-0", "namespace": "serving"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "s", "image": "x", "command": ["sleep", "60"]}],
        },
    }
    created = kube.core().create_namespaced_pod("serving", online)
    kube.wait_for_pod("llm-0", lambda p: p.spec.node_name == NODE, namespace="serving")
    ex = executor(kube, tmp_path, profile="direct")
    try:
        ex.refresh_pod_names()
        assert ex.pod_name_of(created.metadata.uid) == "serving/llm-0"
        ex.advertise([{"memory_mib": 81920, "online_compute_pct": 40, "online_memory_mib": 30720}])
        ex.advertise_now()
        node = kube.core().read_node(NODE)
        assert node.status.allocatable["ebbtide.io/gpu-core"] == "60"
        assert node.status.allocatable["ebbtide.io/gpu-memory"] == "51200"
    finally:
        ex.close()


#: An H100 80GB as its agent reports it: NVML's 81559 MiB, less than 80GiB (81920).
H100_MIB = 81559


@pytest.mark.parametrize(
    ("gpus", "row_memory_mib", "online_pct", "online_mib"),
    [
        (1, H100_MIB - 2048, 0, 0),  # no gpumem: the smallest card less the margin, idle
        (2, H100_MIB - 2048, 0, 0),
        (1, 40960, 40, 20480),  # gpumem=40GiB beside an online tenant: the planner fits it
    ],
)
def test_a_direct_whole_card_pod_fits_what_its_node_advertises_when_the_planner_placed_it(
    kube: KubeHarness,
    tmp_path: Path,
    gpus: int,
    row_memory_mib: int,
    online_pct: int,
    online_mib: int,
) -> None:
    """Under ``direct`` the node advertises its spare (capacity less online less the
    reserve), and a whole-card pod asked for the cards' nominal size (81920 MiB and 100 %
    each): no H100 ever had that spare, so it sat Pending until ``start_timeout_s`` and was
    requeued for ever.  It asks what the planner packed, so the kube-scheduler's fit agrees."""
    ex = executor(kube, tmp_path, profile="direct")
    try:
        device = {
            "memory_mib": H100_MIB,
            "online_compute_pct": online_pct,
            "online_memory_mib": online_mib,
        }
        ex.advertise([device] * gpus)
        ex.advertise_now()
        uuids = tuple(f"GPU-{i}" for i in range(gpus))
        handle = ex.start(
            launch(
                tmp_path,
                "print('whole', flush=True)",
                compute_pct=100.0,
                gpus=gpus,
                memory_mib=row_memory_mib,
                device_uuids=uuids,
            )
        )
        ended = wait_exit(ex, handle)
        assert ended.code == 0, ended
    finally:
        ex.close()


def test_a_pod_no_attempt_holds_is_swept_and_a_name_clash_defers_the_start(
    kube: KubeHarness, tmp_path: Path
) -> None:
    from ebbtide.workers.executor import StartDeferred

    ex = executor(kube, tmp_path)
    try:
        handle = ex.start(launch(tmp_path, "import time\ntime.sleep(60)\n"))
        kube.wait_until(lambda: kube.kubelet.pids(handle.name, NS))
        # the agent lost track of it (a create that timed out on the way back looks so)
        ex._live.discard(handle.name)
        with pytest.raises(StartDeferred):  # a pod of that attempt exists: not the job's fault
            ex.start(launch(tmp_path, "pass"))
        assert ex.sweep_orphans(now=0.0) == []  # seen for the first time: not yet
        assert ex.sweep_orphans(now=31.0) == [handle.name]
        kube.wait_pod_gone(handle.name, namespace=NS)
    finally:
        ex.close()


def test_a_list_older_than_a_pod_just_created_does_not_make_it_gone(
    kube: KubeHarness, tmp_path: Path
) -> None:
    from ebbtide.kube.watch import PodWatcher

    core = kube.core()
    kube.core().patch_node_status(NODE, {"status": {"allocatable": ALLOCATABLE}})
    stale = core.list_namespaced_pod(NS)  # made before the pod exists
    ex = executor(kube, tmp_path)
    try:
        handle = ex.start(launch(tmp_path, "import time\ntime.sleep(60)\n"))
        watcher = PodWatcher(core, NS, "ebbtide.io/node=gpu-0")
        watcher.note(
            kube.core().api_client.sanitize_for_serialization(kube.read_pod(handle.name, NS))
        )
        real = core.list_namespaced_pod
        core.list_namespaced_pod = lambda *a, **k: stale  # type: ignore[method-assign]
        try:
            watcher.sync()
        finally:
            core.list_namespaced_pod = real  # type: ignore[method-assign]
        seen = watcher.get(handle.name)
        assert seen is not None and not seen.gone
    finally:
        ex.close()


@pytest.mark.parametrize(
    "layout",
    [
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice",
        "kubepods.slice/kubepods-pod{us}.slice",  # guaranteed QoS
        "kubepods/besteffort/pod{dash}",  # cgroupfs driver
    ],
)
def test_a_pod_is_paused_by_its_cgroup_freezer(
    kube: KubeHarness, tmp_path: Path, layout: str
) -> None:
    from ebbtide.kube.executor import find_pod_cgroup

    ex = executor(kube, tmp_path)
    try:
        handle = ex.start(launch(tmp_path, "import time\ntime.sleep(60)\n"))
        root = tmp_path / "cgroup"
        pod_dir = root / layout.format(us=handle.uid.replace("-", "_"), dash=handle.uid)
        pod_dir.mkdir(parents=True)
        (pod_dir / "cgroup.freeze").write_text("0")
        (root / "kubepods.slice" / "kubepods-besteffort.slice").mkdir(parents=True, exist_ok=True)
        assert find_pod_cgroup(handle.uid, root) == pod_dir
        ex.cgroup_root = root
        ex.pause(handle)
        assert (pod_dir / "cgroup.freeze").read_text() == "1"
        ex.thaw(handle)
        assert (pod_dir / "cgroup.freeze").read_text() == "0"
        assert find_pod_cgroup("0" * 8 + "-0000-0000-0000-" + "0" * 12, root) is None
        ex.sweep(handle)
    finally:
        ex.close()


def test_an_api_server_that_cannot_be_reached_is_said_in_one_line_not_a_traceback(
    tmp_path: Path,
) -> None:
    import kubernetes.client

    from ebbtide.errors import PlatformUnavailable
    from ebbtide.workers.executor import StartDeferred

    configuration = kubernetes.client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    configuration.retries = 0
    with kubernetes.client.ApiClient(configuration) as api:
        ex = KubernetesExecutor(kubernetes.client.CoreV1Api(api), settings(tmp_path), node=NODE)
        with pytest.raises(PlatformUnavailable, match=r"cannot reach the Kubernetes API server at "
                           r"http://127\.0\.0\.1:1"):  # fmt: skip
            ex.reap_leftovers()  # what an agent does first
        with pytest.raises(StartDeferred):  # a start is requeued, not failed
            ex.start(launch(tmp_path, "pass"))
        ex.close()


def test_handing_directories_to_the_pod_user_never_follows_a_planted_link(tmp_path: Path) -> None:
    """A pod (as run_as_user) could leave a link where its checkpoint directory was; the
    root agent handing the directory over must change the link, not what it points to.
    A checkpoint directory the job named is never handed over at all."""
    from types import SimpleNamespace

    precious = tmp_path / "precious"
    precious.mkdir()
    attempt = tmp_path / "logs" / "1" / "2"
    attempt.mkdir(parents=True)
    (tmp_path / "checkpoints").mkdir()
    planted = tmp_path / "checkpoints" / "1"
    planted.symlink_to(precious)
    before = precious.stat()
    fake = SimpleNamespace(
        settings=KubernetesSettings(profile="whole", run_as_user=4242, run_as_group=4242)
    )

    def hand_over(ckpt: Path) -> None:
        launch = SimpleNamespace(
            stdout_path=attempt / "stdout.log", env={"EBBTIDE_CHECKPOINT_DIR": str(ckpt)}
        )
        KubernetesExecutor._hand_over(fake, launch)  # type: ignore[arg-type]

    hand_over(planted)
    hand_over(precious)  # a directory of the node's that the job named
    after = precious.stat()
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    if os.geteuid() == 0:
        assert attempt.stat().st_uid == 4242
