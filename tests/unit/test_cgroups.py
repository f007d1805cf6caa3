"""Pods from ``/proc/PID/cgroup``: one fixture per layout (cgroup v1 and v2, the cgroupfs
and systemd drivers, containerd, CRI-O and Docker, nested clusters, processes in no pod,
malformed files), the markers ownership matches by, and the names of online pods."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.workers.cgroups import (
    ONLINE_PODS_SHOWN,
    PodRef,
    canonical_uid,
    online_pods,
    parse_cgroup,
    pod_markers,
    pod_of,
    pod_uids,
)
from tests.unit.fuzz_support import fuzz

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"

CID = {
    "d0eb": "d0ebe89e1014f97e1db27a76ae1248ede2f4a4cd9e33d728e8323afe7f889f9d",
    "ced4": "ced47f44f1df47377a3fa159957f321bd2cbc8dd0e44d38010b006284f5e1ebf",
    "9903": "99031262f7fc9fb8d5f6ce844276699fc7280503194be848c4e13f7da65c9d55",
    "a75a": "a75a90aa9a5cc1e5275e09cb9606c321316ebb0f4adf7cdf32675e3fa229034e",
    "fc5f": "fc5fca9abd3591aff060391607bd4e2902da558ac71a28567c4deadd5dc1a03e",
    "f43c": "f43c7cbfcf3a9fb6bc3b06e7b8c8885f0111718d70e4927a5a57fe613d7394de",
    "6798": "679838c49e95a88f5f8fc5cf927076ad16f2e48e16a1352c298f96aca1da9944",
    "4cb8": "4cb84738e5f44b360b5b45c2cea3f108893e12e822627b4c153547b3b4bac214",
    "37e6": "37e69d6abe25bd6da3edf7449d56229d0e90071039ee6e35c7275a52e33a2a65",
    "48e3": "48e384c03a82d59c7a6f1ff9a772acb69dc283aa4157924b2f1f8775afd26160",
    "a078": "a078c0b7ee92cfbf2ef7871c9f61394b3f21d12cafa044de0dbef16adaef030a",
}

#: fixture file → the pod it names (None: in no pod)
LAYOUTS: dict[str, PodRef | None] = {
    "v1_cgroupfs_containerd_burstable.txt": PodRef(
        "ed4e5294-4cd4-45c5-92c3-a36a3c7866a8", CID["d0eb"], None, "burstable"
    ),
    "v1_systemd_docker_burstable.txt": PodRef(
        "46c729ba-e57e-4cdb-9069-b1873ee42eec", CID["ced4"], "docker", "burstable"
    ),
    "v1_cgroupfs_docker_guaranteed.txt": PodRef(
        "024a225c-cdd1-4669-b2ef-61d121123e97", CID["9903"], None, "guaranteed"
    ),
    "v2_systemd_containerd_besteffort.txt": PodRef(
        "59e5e59a-2385-462f-b364-c0cb5266ddc2", CID["a75a"], "containerd", "besteffort"
    ),
    "v2_systemd_containerd_burstable.txt": PodRef(
        "4375ca05-e132-42c4-855e-1aed006b4313", CID["fc5f"], "containerd", "burstable"
    ),
    "v2_systemd_containerd_guaranteed.txt": PodRef(
        "ee26f624-8be8-4a37-a384-6fa2dffc9f87", CID["f43c"], "containerd", "guaranteed"
    ),
    "v2_systemd_crio_burstable.txt": PodRef(
        "c2fd8e8d-48b1-4e0d-94d5-df63531dc00b", CID["6798"], "cri-o", "burstable"
    ),
    "v2_cgroupfs_containerd_besteffort.txt": PodRef(
        "c8a53ca3-5406-419c-9e55-5d4457ec5899", CID["4cb8"], None, "besteffort"
    ),
    "v2_systemd_containerd_static_pod.txt": PodRef(
        "5d1e0c7b9a8f6e4d3c2b1a0f9e8d7c6b", CID["37e6"], "containerd", "burstable"
    ),
    "nested_kind_v2.txt": PodRef(
        "a70f27dd-e669-41ef-bf10-731cc64d4479", CID["48e3"], "containerd", "burstable"
    ),
    "nested_kind_v1.txt": PodRef(
        "ad397f17-ea0d-473d-ac78-45d02db875b2", CID["a078"], None, "besteffort"
    ),
    "nested_containerd_service_v1.txt": PodRef(
        "38f57097-eedc-41ff-a00e-f0bfa8d5136c", CID["d0eb"], "containerd", "besteffort"
    ),
    "v2_seen_from_another_pod.txt": PodRef(
        "57b7eac3-bec3-4682-b0a7-3dd51b27cab3", CID["ced4"], "containerd", "besteffort"
    ),
    "host_systemd_service.txt": None,
    "host_user_session_v1.txt": None,
    "host_root.txt": None,
    "host_docker_container.txt": None,
    "malformed.txt": None,
}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_every_fixture_is_in_the_table() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.txt")) == sorted(LAYOUTS)


@pytest.mark.parametrize(("name", "expected"), list(LAYOUTS.items()), ids=list(LAYOUTS))
def test_layouts(name: str, expected: PodRef | None) -> None:
    text = fixture(name)
    assert parse_cgroup(text) == expected
    assert pod_uids(text) == (frozenset() if expected is None else {expected.uid})
    if expected is not None:
        # the markers a Tree carries are substrings of the file in every layout
        assert any(marker in text for marker in pod_markers(expected.uid))


POD = "4375ca05-e132-42c4-855e-1aed006b4313"
POD_ = POD.replace("-", "_")
OTHER = "59e5e59a-2385-462f-b364-c0cb5266ddc2"
C = CID["fc5f"]
SLICE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"0::{SLICE}/crio-conmon-{C}.scope\n",
            PodRef(POD, C, "cri-o", "burstable"),
            id="cri-o monitor",
        ),
        pytest.param(
            f"0::{SLICE}/crio-{C}.scope/container\n",
            PodRef(POD, C, "cri-o", "burstable"),
            id="cri-o sub-cgroup",
        ),
        pytest.param(
            f"0::/kubepods/burstable/pod{POD}/crio-{C}\n",
            PodRef(POD, C, "cri-o", "burstable"),
            id="cri-o cgroupfs",
        ),
        pytest.param(
            f"0::/kubepods-pod{POD_}.slice:docker:{C}\n",
            PodRef(POD, C, "docker", "guaranteed"),
            id="docker colon form",
        ),
        pytest.param(
            f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{POD_}.slice/"
            f"cri-containerd-{C}.scope\n",
            PodRef(POD, C, "containerd", "guaranteed"),
            id="kind guaranteed",
        ),
        pytest.param(f"0::{SLICE}\n", PodRef(POD, None, None, "burstable"), id="pod slice"),
        pytest.param(
            f"0::/kubepods/burstable/pod{POD.upper()}/{C.upper()}\n",
            PodRef(POD, C, None, "burstable"),
            id="upper-case hex",
        ),
        pytest.param(
            f"0::/pod{POD}/{C}\n", PodRef(POD, C, None, None), id="cgroupfs, no parent seen"
        ),
        pytest.param(
            f"0::{SLICE}/cri-containerd-ab.scope\n",
            PodRef(POD, "ab", "containerd", "burstable"),
            id="short container id",
        ),
        pytest.param(f"0::{SLICE}/init.scope\n", PodRef(POD, None, None, "burstable"), id="odd"),
        pytest.param(
            f"junk\n\x00\x01::\n0::{SLICE}/cri-containerd-{C}.scope\r\n",
            PodRef(POD, C, "containerd", "burstable"),
            id="garbage around a good line",
        ),
        pytest.param(
            f"2:memory:{SLICE}\n1:name=systemd:{SLICE}/cri-containerd-{C}.scope\n",
            PodRef(POD, C, "containerd", "burstable"),
            id="v1 lines that stop at the pod",
        ),
        pytest.param(
            f"2:memory:/kubepods/besteffort/pod{OTHER}/{C}\n1:name=systemd:{SLICE}\n",
            None,
            id="lines naming two pods",
        ),
        pytest.param(
            f"0::/kubepods/burstable/pod{OTHER}/{C}/kubepods/besteffort/pod{POD}/{CID['a75a']}\n",
            PodRef(POD, CID["a75a"], None, "besteffort"),
            id="a cluster in a pod: the inner pod",
        ),
        pytest.param("0::/machine.slice/libpod-" + C + ".scope\n", None, id="podman"),
        pytest.param(f"0::/system.slice/pod{POD}x.service\n", None, id="a service"),
        pytest.param("", None, id="empty"),
    ],
)
def test_more_layouts(text: str, expected: PodRef | None) -> None:
    assert parse_cgroup(text) == expected


def test_pod_uids_of_a_cluster_in_a_pod_are_both() -> None:
    text = f"0::/kubepods/burstable/pod{OTHER}/{C}/kubepods/besteffort/pod{POD}/{C}\n"
    assert pod_uids(text) == {OTHER, POD}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (POD, POD),
        (POD_, POD),
        (f"pod{POD_}", POD),
        (POD.upper(), POD),
        (" 5D1E0C7B9A8F6E4D3C2B1A0F9E8D7C6B ", "5d1e0c7b9a8f6e4d3c2b1a0f9e8d7c6b"),
        ("4375ca05", None),
        (POD + "0", None),
        ("", None),
    ],
)
def test_canonical_uid(text: str, expected: str | None) -> None:
    assert canonical_uid(text) == expected


def test_pod_markers() -> None:
    assert pod_markers(POD) == (f"pod{POD}", f"pod{POD_}")
    assert pod_markers(POD_.upper()) == pod_markers(POD)
    assert pod_markers("5d1e0c7b9a8f6e4d3c2b1a0f9e8d7c6b") == (
        "pod5d1e0c7b9a8f6e4d3c2b1a0f9e8d7c6b",
    )
    with pytest.raises(ValueError, match="not a pod UID"):
        pod_markers("my-pod")


# -- properties ----------------------------------------------------------------------------

#: pieces of cgroup files, to build the texts a parser trips over
PIECES = st.sampled_from(
    [
        "0:",
        "12:memory:",
        ":",
        "/",
        "\n",
        "..",
        "kubepods",
        "kubepods.slice",
        "kubepods-burstable-pod",
        "kubepods-pod",
        "besteffort",
        "pod",
        POD,
        POD_,
        ".slice",
        ".scope",
        ":cri-containerd:",
        "cri-containerd-",
        "crio-",
        "docker-",
        C,
        "-",
        "_",
        "\x00",
        "é",
    ]
)


@fuzz(400)
@given(st.one_of(st.text(), st.lists(PIECES, max_size=40).map("".join)))
def test_parse_never_raises(text: str) -> None:
    ref = parse_cgroup(text)
    uids = pod_uids(text)
    if ref is not None:
        assert canonical_uid(ref.uid) == ref.uid
        assert ref.uid in uids
        assert ref.qos in (None, "guaranteed", "burstable", "besteffort")
        assert ref.runtime in (None, "containerd", "cri-o", "docker")


@fuzz(200)
@given(
    uid=st.uuids(),
    qos=st.sampled_from(["guaranteed", "burstable", "besteffort"]),
    runtime=st.sampled_from(["cri-containerd", "crio", "docker"]),
    systemd=st.booleans(),
    v1=st.booleans(),
    prefix=st.sampled_from(["", "/system.slice/docker-" + C + ".scope", "/../..", "/docker/x"]),
)
def test_built_paths_round_trip(
    uid: uuid.UUID, qos: str, runtime: str, systemd: bool, v1: bool, prefix: str
) -> None:
    level = "" if qos == "guaranteed" else qos
    if systemd:
        u = str(uid).replace("-", "_")
        pod = f"kubepods-{level}-pod{u}.slice" if level else f"kubepods-pod{u}.slice"
        parent = "kubepods.slice/" + (f"kubepods-{level}.slice/" if level else "")
        path = f"{prefix}/{parent}{pod}/{runtime}-{C}.scope"
    else:
        path = f"{prefix}/kubepods/" + (f"{level}/" if level else "") + f"pod{uid}/{C}"
    text = f"4:memory:{path}\n3:pids:{path}\n1:rdma:/\n" if v1 else f"0::{path}\n"
    runtimes = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}
    assert parse_cgroup(text) == PodRef(str(uid), C, runtimes[runtime] if systemd else None, qos)


# -- reading /proc -------------------------------------------------------------------------


def fake_proc(root: Path, processes: dict[int, tuple[str | None, str | None]]) -> Path:
    """``root``/PID/{cgroup,comm} for each pid: (cgroup text, comm) (None: no such file)."""
    for pid, (cgroup, comm) in processes.items():
        (root / str(pid)).mkdir(parents=True)
        if cgroup is not None:
            (root / str(pid) / "cgroup").write_text(cgroup)
        if comm is not None:
            (root / str(pid) / "comm").write_text(comm + "\n")
    return root


def test_pod_of_reads_proc(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            10: (fixture("v2_systemd_containerd_burstable.txt"), "python3"),
            11: (fixture("host_systemd_service.txt"), "nvidia-persistenced"),
            12: (None, None),  # no access to its cgroup
        },
    )
    (proc / "13").mkdir()
    (proc / "13" / "cgroup").mkdir()  # not a file
    assert pod_of(10, proc) == LAYOUTS["v2_systemd_containerd_burstable.txt"]
    assert pod_of(11, proc) is None
    assert pod_of(12, proc) is None
    assert pod_of(13, proc) is None
    assert pod_of(99, proc) is None  # gone


def test_online_pods_names_pods_and_other_processes(tmp_path: Path) -> None:
    a = f"0::{SLICE}/cri-containerd-{C}.scope\n"
    a_sidecar = f"0::{SLICE}/cri-containerd-{CID['d0eb']}.scope\n"
    b = f"0::/kubepods/besteffort/pod{OTHER}/{CID['a75a']}\n"
    proc = fake_proc(
        tmp_path,
        {
            100: (fixture("host_user_session_v1.txt"), "python3"),
            101: (a, "vllm"),
            102: (a, "vllm"),  # the same container: once
            103: (b, "tritonserver"),
            104: (a_sidecar, "metrics"),
            105: (fixture("host_root.txt"), "Xorg"),
            106: (None, "no\tcgroup"),
        },
    )
    pids = [100, 101, 102, 103, 104, 105, 106, 107, 101]
    assert online_pods(pids, proc) == [
        f"pod:{POD}/{C[:12]}",
        f"pod:{OTHER}/{CID['a75a'][:12]}",
        f"pod:{POD}/{CID['d0eb'][:12]}",
        "pid:100 (python3)",
        "pid:105 (Xorg)",
        "pid:106 (no?cgroup)",
        "pid:107",  # gone
    ]
    names = {POD: "inference/vllm-0"}
    assert online_pods(pids, proc, names=names.get) == [
        "inference/vllm-0",
        f"pod:{OTHER}/{CID['a75a'][:12]}",  # not known to the resolver
        "pid:100 (python3)",
        "pid:105 (Xorg)",
        "pid:106 (no?cgroup)",
        "pid:107",
    ]

    def failing(uid: str) -> str | None:
        raise RuntimeError("the API server is away")

    assert online_pods([101], proc, names=failing) == [f"pod:{POD}/{C[:12]}"]
    assert online_pods([], proc) == []


def test_online_pods_are_bounded(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {pid: (None, f"worker{pid}") for pid in range(1, 13)})
    shown = online_pods(range(1, 13), proc)
    assert len(shown) == ONLINE_PODS_SHOWN + 1
    assert shown[:ONLINE_PODS_SHOWN] == [f"pid:{p} (worker{p})" for p in range(1, 9)]
    assert shown[-1] == "… and 4 more"
    assert online_pods(range(1, 9), proc) == [f"pid:{p} (worker{p})" for p in range(1, 9)]
    assert online_pods(range(1, 13), proc, limit=2) == [
        "pid:1 (worker1)",
        "pid:2 (worker2)",
        "… and 10 more",
    ]
