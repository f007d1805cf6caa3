"""Pods on a GPU: an attempt pod's processes are the attempt's by their cgroup, whatever its
layout; every other pod's are online; NVML samples list the online processes, the agent's
heartbeat names their pods, and ``ebb nodes -f`` shows them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ebbtide.cli import nodes_cmd
from ebbtide.messaging.messages import DeviceReport
from ebbtide.workers.cgroups import online_pods, pod_markers
from ebbtide.workers.headroom.base import KnownPids
from ebbtide.workers.headroom.fake_nvml import FakeNvml
from ebbtide.workers.headroom.nvml import NvmlSource
from ebbtide.workers.ownership import ProcessOwnership, Tree

GIB = 1024
ATTEMPT = "1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718"  # the attempt pod of job 9
SECOND = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"  # the attempt pod of job 10
ONLINE = "59e5e59a-2385-462f-b364-c0cb5266ddc2"  # an inference server's pod
CID = "fc5fca9abd3591aff060391607bd4e2902da558ac71a28567c4deadd5dc1a03e"


def systemd(uid: str, qos: str = "burstable") -> str:
    u = uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/"
        f"cri-containerd-{CID}.scope\n"
    )


def cgroupfs_v1(uid: str) -> str:
    path = f"/kubepods/besteffort/pod{uid}/{CID}"
    return f"11:memory:{path}\n5:pids:{path}\n1:name=systemd:{path}\n0::/\n"


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """Real processes (ownership asks psutil about them), whose /proc is faked below."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(5)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def fake_proc(root: Path, cgroups: dict[int, tuple[str, str]]) -> Path:
    """``root``/PID/cgroup and comm for each pid: (cgroup text, comm)."""
    for pid, (cgroup, comm) in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(cgroup)
        (root / str(pid) / "comm").write_text(comm + "\n")
    return root


def test_an_attempt_pods_processes_are_its_and_other_pods_online(
    tmp_path: Path, sleepers: list[int]
) -> None:
    mine, mine_v1, second, theirs, host = sleepers
    proc = fake_proc(
        tmp_path,
        {
            mine: (systemd(ATTEMPT), "train"),  # UID with underscores in the slice
            mine_v1: (cgroupfs_v1(ATTEMPT), "train"),  # UID with dashes
            second: (systemd(SECOND, "besteffort"), "train"),
            theirs: (systemd(ONLINE), "vllm"),
            host: ("0::/system.slice/nvidia-persistenced.service\n", "nvidia-persiste"),
        },
    )
    ownership = ProcessOwnership(proc=proc)
    # pods' attempts have no supervisor on the host: several of them at once
    ownership.update(
        [
            Tree(9, 0, 0.0, cgroup_markers=pod_markers(ATTEMPT)),
            Tree(10, 0, 0.0, cgroup_markers=pod_markers(SECOND)),
        ]
    )
    assert [ownership.owner(p) for p in sleepers] == [9, 9, 10, None, None]
    # the first attempt ended
    ownership.update([Tree(10, 0, 0.0, cgroup_markers=pod_markers(SECOND))])
    assert [ownership.owner(p) for p in sleepers] == [None, None, 10, None, None]


def test_uid_markers_match_by_pod_not_by_substring(tmp_path: Path, sleepers: list[int]) -> None:
    nested, unknown = sleepers[:2]
    u = ATTEMPT.replace("-", "_")
    proc = fake_proc(
        tmp_path,
        {
            # the attempt's UID inside another pod's container name: not the attempt's pod
            nested: (f"0::/kubepods/burstable/pod{ONLINE}/pod{u}-sidecar\n", "x"),
            # a layout not understood: the markers are looked for as substrings
            unknown: (f"0::/custom/tree/pod{u}_x/worker\n", "x"),
        },
    )
    ownership = ProcessOwnership(proc=proc)
    ownership.update([Tree(9, 0, 0.0, cgroup_markers=pod_markers(ATTEMPT))])
    assert ownership.owner(nested) is None
    assert ownership.owner(unknown) == 9
    # partial markers and other substrings match as before
    ownership.update([Tree(9, 0, 0.0, cgroup_markers=("pod1f2e3d4c_5b6a",))])
    assert ownership.owner(unknown) == 9
    ownership.update([Tree(9, 0, 0.0, cgroup_markers=("/custom/tree/",))])
    assert ownership.owner(nested) is None and ownership.owner(unknown) == 9


# -- which online processes use which card --------------------------------------------------


def test_nvml_samples_list_the_online_pids() -> None:
    nvml = FakeNvml()
    nvml.add_device(80 * GIB)
    nvml.add_device(80 * GIB)
    nvml.add_device(40 * GIB)
    nvml.enable_mig(2, [(3, 20 * GIB), (5, 20 * GIB)])
    nvml.set_utilization(0, 70)
    nvml.add_process(0, 4343, 2 * GIB, sm_util=10)
    nvml.add_process(0, 4242, 20 * GIB, sm_util=30)
    nvml.add_process(0, 9001, 30 * GIB, sm_util=30)
    nvml.add_process(0, 4242, 20 * GIB, graphics=True)  # compute and graphics: once
    nvml.add_process(1, 9002, 1 * GIB)
    nvml.add_process(2, 77, 3 * GIB, gpu_instance=3)
    nvml.add_process(2, 9003, 3 * GIB, gpu_instance=3)
    nvml.add_process(2, 9004, 3 * GIB, gpu_instance=5)
    source = NvmlSource(nvml=nvml, event_wait_ms=10)
    try:
        samples = source.sample(1_700_000_000.0, KnownPids.of({9001, 9002, 9003, 9004}))
        assert [(s.index, s.online_pids) for s in samples] == [
            (0, (4242, 4343)),
            (1, ()),
            (2, (77,)),
            (3, ()),
        ]
        nvml.fall_off_bus(1)
        # a device that does not answer: nobody is known to be on it
        assert source.sample(1_700_000_001.0)[1].online_pids == ()
    finally:
        source.close()


def test_the_pods_on_a_card_from_nvml_to_ebb_nodes(
    tmp_path: Path, sleepers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, theirs, host = sleepers[:3]
    proc = fake_proc(
        tmp_path,
        {
            mine: (systemd(ATTEMPT), "train"),
            theirs: (systemd(ONLINE), "vllm"),
            host: ("0::/user.slice/user-1000.slice/session-4.scope\n", "python3"),
        },
    )
    nvml = FakeNvml()
    nvml.add_device(80 * GIB)
    nvml.add_device(80 * GIB)
    nvml.set_utilization(0, 80)
    for pid, mib in ((mine, 30 * GIB), (theirs, 20 * GIB), (host, 1 * GIB)):
        nvml.add_process(0, pid, mib, sm_util=25)
    ownership = ProcessOwnership(proc=proc)
    ownership.update([Tree(9, 0, 0.0, cgroup_markers=pod_markers(ATTEMPT))])
    source = NvmlSource(nvml=nvml, event_wait_ms=10)
    try:
        samples = source.sample(1_700_000_000.0, ownership)
    finally:
        source.close()
    assert samples[0].online_pids == tuple(sorted((theirs, host)))
    assert samples[0].online_memory_mib == 21 * GIB  # the attempt's 30 GiB are not online

    # the agent's heartbeat: names from the API where it knows them
    names = {ONLINE: "inference/vllm-0"}
    reports = [
        DeviceReport(
            index=s.index,
            memory_mib=80 * GIB,
            online_compute_pct=s.online_compute_pct,
            online_memory_mib=s.online_memory_mib,
            online_pods=online_pods(s.online_pids, proc, names=names.get),
        ).model_dump(mode="json")
        for s in samples
    ]
    assert reports[0]["online_pods"] == ["inference/vllm-0", f"pid:{host} (python3)"]
    assert reports[1]["online_pods"] == []
    assert DeviceReport.model_validate({"index": 0, "memory_mib": 1.0}).online_pods == []

    rows = [{"name": "gpu-a", "heartbeat_age_s": 1.0, "stopping": False, "devices": reports}]
    shown = run_nodes(monkeypatch, rows, "-f")
    assert f"online: inference/vllm-0, pid:{host} (python3)" in shown
    assert "online: -" in shown  # device 1
    assert "online:" not in run_nodes(monkeypatch, rows)
    assert "MIG" not in shown
    reports[1]["mig_parent"] = 0
    assert "a MIG instance of the GPU NVML numbers 0" in run_nodes(monkeypatch, rows, "-f")


def test_nodes_json_always_has_online_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    old = {"index": 0, "memory_mib": 1024.0, "online_compute_pct": 0, "online_memory_mib": 0}
    rows = [{"name": "gpu-a", "heartbeat_age_s": 1.0, "stopping": False, "devices": [old]}]
    [node] = json.loads(run_nodes(monkeypatch, rows, "--json"))
    assert node["devices"][0]["online_pods"] == []  # an agent that does not report them


def run_nodes(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]], *args: str) -> str:
    class FakeClient:
        def nodes(self) -> list[dict[str, Any]]:
            return [{**n, "devices": [dict(d) for d in n["devices"]]} for n in rows]

    monkeypatch.setattr(nodes_cmd, "_client", FakeClient)
    result = CliRunner().invoke(nodes_cmd.nodes, list(args))
    assert result.exit_code == 0, result.output
    return result.output
