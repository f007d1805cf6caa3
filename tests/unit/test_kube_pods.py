"""The attempt's Pod: names, labels, resources per profile, volumes, the direct runtime,
and every manifest valid against the Kubernetes OpenAPI schema, strictly."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.config.policy import KubernetesSettings, Toleration
from ebbtide.kube.pods import (
    CHECKPOINT_VOLUME,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_NODE,
    LABEL_OWNER,
    LABEL_QUEUE,
    LABEL_VALUE_RE,
    MAX_LABEL_VALUE,
    STATE_VOLUME,
    PodRequest,
    label_value,
    pod_manifest,
    pod_name,
    render_yaml,
)
from ebbtide.kube.profiles import PROFILES, profile_named

#: The newest Kubernetes version kubernetes-validate ships a schema for, at the time of
#: writing; every manifest must validate against it strictly (no unknown field).
K8S_VERSION = "1.37.0"
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
UUID = "GPU-5f3c6a1e-0d2b-4c55-9a77-3e1f0b8c2d41"


def _request(
    profile: str = "whole", settings: KubernetesSettings | None = None, **kw: Any
) -> PodRequest:
    settings = settings or KubernetesSettings()
    fields: dict[str, Any] = {
        "job_id": 42,
        "attempt": 3,
        "owner": "alice",
        "queue": "default",
        "node": "gpu-a-1",
        "argv": ["python", "train.py", "--lr", "0.1"],
        "env": {"EBBTIDE_JOB_ID": "42", "B": "2", "A": "1"},
        "cwd": "/work",
        "image": "registry.example.com/ml/train:1.4",
        "deadline_s": 9.2,
        "grant": profile_named(profile, settings).grant(25, 0, 8192),
        "profile": profile,
        "device_uuids": (UUID,),
    }
    fields.update(kw)
    return PodRequest(**fields)


def _pod(profile: str = "whole", settings: KubernetesSettings | None = None, **kw: Any) -> Any:
    settings = settings or KubernetesSettings()
    return pod_manifest(_request(profile, settings, **kw), settings)


def _valid(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])}


# -- names and labels --------------------------------------------------------------------


@pytest.mark.parametrize(("job", "attempt", "name"), [(42, 3, "ebb-42-3"), (0, 1, "ebb-0-1")])
def test_pod_name(job: int, attempt: int, name: str) -> None:
    assert pod_name(job, attempt) == name
    assert DNS_1123_SUBDOMAIN.fullmatch(name)


def test_pod_name_of_the_largest_job_id_is_a_valid_name() -> None:
    name = pod_name(2**63 - 1, 100)
    assert DNS_1123_SUBDOMAIN.fullmatch(name) and len(name) <= 63


def test_pod_name_refuses_negative_numbers() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        pod_name(-1, 1)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("alice", "alice"),
        ("alice@example.com", "alice-example.com"),
        ("DOMAIN\\bob smith", "DOMAIN-bob-smith"),
        ("-_.x._-", "x"),
        ("", ""),
        ("@@@", ""),
    ],
)
def test_label_values(text: str, value: str) -> None:
    assert label_value(text) == value


def test_a_long_label_value_is_cut_with_a_hash_so_two_stay_apart() -> None:
    a, b = label_value("x" * 100 + "a"), label_value("x" * 100 + "b")
    assert a != b
    assert len(a) <= MAX_LABEL_VALUE and LABEL_VALUE_RE.fullmatch(a)


@given(st.text(max_size=300))
def test_every_label_value_is_valid(text: str) -> None:
    value = label_value(text)
    assert len(value) <= MAX_LABEL_VALUE
    assert LABEL_VALUE_RE.fullmatch(value)


def test_labels_and_annotations() -> None:
    pod = _pod("qgpu", owner="alice@example.com", queue="q" * 64, node="gpu-a-1.example.com")
    meta = pod["metadata"]
    assert meta["name"] == "ebb-42-3"
    assert meta["namespace"] == "ebbtide-jobs"
    labels = meta["labels"]
    assert labels[LABEL_JOB] == "42" and labels[LABEL_ATTEMPT] == "3"
    assert labels[LABEL_OWNER] == "alice-example.com"
    assert labels[LABEL_NODE] == "gpu-a-1.example.com"
    assert labels[LABEL_MANAGED_BY] == "ebbtide"
    assert len(labels[LABEL_QUEUE]) <= MAX_LABEL_VALUE
    for value in labels.values():
        assert LABEL_VALUE_RE.fullmatch(value) and len(value) <= MAX_LABEL_VALUE
    assert meta["annotations"]["ebbtide.io/owner"] == "alice@example.com"
    assert meta["annotations"]["ebbtide.io/slice-asked"] == "25% 8GiB"
    assert meta["annotations"]["ebbtide.io/slice-granted"] == "25% 8GiB (qgpu)"
    assert "ebbtide.io/slice-note" not in meta["annotations"]
    _valid(pod)


def test_a_rounded_grant_is_noted_on_the_pod() -> None:
    settings = KubernetesSettings()
    grant = profile_named("qgpu", settings).grant(23, 0, 4500)
    annotations = _pod("qgpu", grant=grant)["metadata"]["annotations"]
    assert annotations["ebbtide.io/slice-asked"] == "23% 4500MiB"
    assert annotations["ebbtide.io/slice-granted"] == "25% 5GiB (qgpu)"
    assert "qGPU steps of 5%" in annotations["ebbtide.io/slice-note"]


# -- the spec ------------------------------------------------------------------------------


def test_the_pod_spec() -> None:
    pod = _pod("whole")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert "nodeSelector" not in spec  # the hostname label need not be the node's name
    assert spec["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["gpu-a-1"]}
                        ]
                    }
                ]
            }
        }
    }
    # GPU node pools are tainted: the pods tolerate the usual taint by default
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "nodeName" not in spec  # the scheduler binds: it must see the pod to preempt it
    assert spec["priorityClassName"] == "ebbtide-offline"
    assert spec["terminationGracePeriodSeconds"] == 10  # ceil(9.2 s)
    assert spec["enableServiceLinks"] is False
    assert spec["automountServiceAccountToken"] is False
    assert "schedulerName" not in spec and "runtimeClassName" not in spec
    [container] = spec["containers"]
    assert container["name"] == "job"
    assert container["image"] == "registry.example.com/ml/train:1.4"
    assert container["command"] == ["python", "train.py", "--lr", "0.1"]
    assert "args" not in container
    assert container["workingDir"] == "/work"
    assert [e["name"] for e in container["env"]] == ["A", "B", "EBBTIDE_JOB_ID"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert json.loads(json.dumps(pod)) == pod  # plain JSON-able data
    _valid(pod)


def test_no_working_directory_no_env_and_no_priority_class() -> None:
    settings = KubernetesSettings(priority_class=None)
    pod = _pod("hami", settings, cwd=None, env={})
    [container] = pod["spec"]["containers"]
    assert "workingDir" not in container and "env" not in container
    assert "priorityClassName" not in pod["spec"]
    _valid(pod)


def test_only_the_attempts_own_directories_are_mounted_at_their_own_paths() -> None:
    settings = KubernetesSettings(state_dir="/srv/ebbtide")
    pod = _pod("whole", settings)
    attempt, ckpt = "/srv/ebbtide/logs/42/3", "/srv/ebbtide/checkpoints/42"
    assert pod["spec"]["volumes"] == [
        {"name": STATE_VOLUME, "hostPath": {"path": attempt, "type": "DirectoryOrCreate"}},
        {"name": CHECKPOINT_VOLUME, "hostPath": {"path": ckpt, "type": "DirectoryOrCreate"}},
    ]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [
        {"name": STATE_VOLUME, "mountPath": attempt},
        {"name": CHECKPOINT_VOLUME, "mountPath": ckpt},
    ]
    _valid(pod)


@pytest.mark.parametrize(
    ("section_claim", "queue_claim", "mounted"),
    [(None, None, None), ("ckpt", None, "ckpt"), ("ckpt", "research-ckpt", "research-ckpt")],
)
def test_the_checkpoint_claim(
    section_claim: str | None, queue_claim: str | None, mounted: str | None
) -> None:
    settings = KubernetesSettings(checkpoint_claim=section_claim, checkpoint_mount="/ckpt")
    pod = _pod("whole", settings, checkpoint_claim=queue_claim)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    if mounted is None:  # the node's own disk
        assert "hostPath" in volumes[CHECKPOINT_VOLUME]
    else:
        assert volumes[CHECKPOINT_VOLUME]["persistentVolumeClaim"] == {"claimName": mounted}
        assert mounts[CHECKPOINT_VOLUME]["mountPath"] == "/ckpt"
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["EBBTIDE_CHECKPOINT_DIR"] == "/ckpt/42"  # the job checkpoints to the claim
    _valid(pod)


GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POOL = {"key": "pool", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}
GONE = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}


@pytest.mark.parametrize(
    ("section", "queue", "carried"),
    [
        (None, None, [GPU_TAINT]),  # the default
        (
            [POOL, {**GONE, "tolerationSeconds": 30}],
            None,
            [POOL, {**GONE, "tolerationSeconds": 30}],
        ),
        ([POOL], [GPU_TAINT], [GPU_TAINT]),  # a queue's replace the section's
        ([POOL], [], None),  # a queue may carry none
        ([], None, None),
    ],
)
def test_the_tolerations(
    section: list[dict[str, Any]] | None,
    queue: list[dict[str, Any]] | None,
    carried: list[dict[str, Any]] | None,
) -> None:
    settings = KubernetesSettings.model_validate(
        {} if section is None else {"tolerations": section}
    )
    tolerations = None if queue is None else tuple(Toleration.model_validate(t) for t in queue)
    pod = _pod("hami", settings, tolerations=tolerations)
    assert pod["spec"].get("tolerations") == carried
    _valid(pod)


def test_direct_hands_the_cards_to_the_nvidia_runtime() -> None:
    second = "GPU-00000000-1111-2222-3333-444444444444"
    pod = _pod("direct", device_uuids=(UUID, second), env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    env = _env(pod)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{UUID},{second}"  # never the job's "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "CUDA_VISIBLE_DEVICES" not in env
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"ebbtide.io/gpu-core": "25", "ebbtide.io/gpu-memory": "8192"}
    _valid(pod)


def test_direct_needs_the_device_uuids() -> None:
    with pytest.raises(ValueError, match="device UUIDs"):
        _pod("direct", device_uuids=())


@pytest.mark.parametrize("profile", sorted(set(PROFILES) - {"direct"}))
def test_the_device_plugin_chooses_the_card_never_the_jobs_env(profile: str) -> None:
    env = {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "CUDA_VISIBLE_DEVICES": "1",
        "NVIDIA_MIG_CONFIG_DEVICES": "all",
    }
    pod = _pod(profile, env=env)
    assert _env(pod) == {"CUDA_VISIBLE_DEVICES": "1"}  # the job's own CUDA mapping stays
    assert "runtimeClassName" not in pod["spec"]


# -- every profile -------------------------------------------------------------------------

RESOURCES = {
    "qgpu": {"tke.cloud.tencent.com/qgpu-core": "25", "tke.cloud.tencent.com/qgpu-memory": "8"},
    "hami": {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "25",
        "nvidia.com/gpumem": "8192",
        "nvidia.com/priority": "1",
    },
    "volcano": {
        "volcano.sh/vgpu-number": "1",
        "volcano.sh/vgpu-cores": "25",
        "volcano.sh/vgpu-memory": "8192",
    },
    "koordinator": {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory-ratio": "10"},
    "mig": {"nvidia.com/mig-2g.20gb": "1"},
    "whole": {"nvidia.com/gpu": "1"},
    "direct": {"ebbtide.io/gpu-core": "25", "ebbtide.io/gpu-memory": "8192"},
}
SCHEDULERS = {"hami": "hami-scheduler", "volcano": "volcano", "koordinator": "koord-scheduler"}


@pytest.mark.parametrize("profile", ["hami", "volcano"])
@pytest.mark.parametrize("card", ["80GiB", "81559MiB", "40GiB"])
def test_whole_cards_ask_for_all_their_memory_as_a_percent(profile: str, card: str) -> None:
    # an H100 80GB registers 81559 MiB: an absolute 80GiB would never find room
    settings = KubernetesSettings(profile=profile, gpu_memory_mib=card)
    grant = profile_named(profile, settings).grant(100, 2, 1024)
    limits = _pod(profile, settings, grant=grant)["spec"]["containers"][0]["resources"]["limits"]
    percent = {
        "hami": "nvidia.com/gpumem-percentage",
        "volcano": "volcano.sh/vgpu-memory-percentage",
    }
    assert limits[percent[profile]] == "100"
    assert not {"nvidia.com/gpumem", "volcano.sh/vgpu-memory"} & set(limits)
    assert limits.get("nvidia.com/gpucores", limits.get("volcano.sh/vgpu-cores")) == "100"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_asks_for_its_own_units_and_validates(profile: str) -> None:
    pod = _pod(profile)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == RESOURCES[profile]
    assert resources["requests"] == RESOURCES[profile]
    assert pod["spec"].get("schedulerName") == SCHEDULERS.get(profile)
    _valid(pod)
    assert yaml.safe_load(render_yaml(pod)) == pod


@pytest.mark.parametrize("profile", sorted(set(PROFILES) - {"mig"}))
def test_every_profile_validates_with_whole_gpus(profile: str) -> None:
    grant = profile_named(profile, KubernetesSettings()).grant(100, 2, 40960)
    _valid(_pod(profile, grant=grant))


def test_the_scheduler_setting_wins_over_the_profiles() -> None:
    settings = KubernetesSettings(scheduler_name="default-scheduler")
    assert _pod("volcano", settings)["spec"]["schedulerName"] == "default-scheduler"


def test_strict_validation_would_catch_a_field_kubernetes_does_not_know() -> None:
    pod = _pod("whole")
    pod["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        _valid(pod)


def test_a_request_that_cannot_be_a_pod() -> None:
    with pytest.raises(ValueError, match="argv"):
        _pod("whole", argv=[])
    with pytest.raises(ValueError, match="unknown profile"):
        pod_manifest(replace(_request(), profile="gpushare"), KubernetesSettings())
    with pytest.raises(ValueError, match="deadline_s"):
        _pod("whole", deadline_s=float("nan"))


def test_the_request_is_frozen() -> None:
    request = _request()
    assert replace(request, attempt=4).attempt == 4
    with pytest.raises(AttributeError):
        request.attempt = 4  # type: ignore[misc]


def test_render_yaml_keeps_the_order_it_was_built_in() -> None:
    text = render_yaml(_pod("hami"))
    assert text.startswith("apiVersion: v1\nkind: Pod\nmetadata:\n  name: ebb-42-3\n")
    assert "nvidia.com/gpumem: '8192'" in text  # quantities stay strings


@pytest.mark.parametrize(
    ("uid", "gid", "context"),
    [
        (None, None, {"runAsNonRoot": True}),
        (10001, 10001, {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001}),
        (0, None, {"runAsNonRoot": False, "runAsUser": 0}),  # root, because the policy says
    ],
)
def test_a_pod_never_runs_as_root_unless_the_policy_says_uid_0(
    uid: int | None, gid: int | None, context: dict[str, Any]
) -> None:
    """A trial's trap: with no ``run_as_user`` the pod ran as whatever user its image
    set, root included, though the README says attempt pods are never root by default."""
    pod = _pod(settings=KubernetesSettings(run_as_user=uid, run_as_group=gid))
    assert pod["spec"]["securityContext"] == context
    _valid(pod)
