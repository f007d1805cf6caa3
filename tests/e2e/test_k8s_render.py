"""``ebb k8s render`` and ``qsub --image`` / ``qstat -f`` under a kubernetes section, as
users run them: real ``ebb`` processes, every printed Pod valid against Kubernetes'
OpenAPI schema, strictly."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ebbtide.kube.profiles import PROFILES
from tests.e2e.helpers import ebb, ebb_env, ebb_json
from tests.unit.test_kube_pods import RESOURCES  # each profile's pod for 25%, 8GiB

pytestmark = pytest.mark.e2e

#: The newest Kubernetes version kubernetes-validate ships a schema for.
K8S_VERSION = "1.37.0"


def test_the_table_covers_every_profile() -> None:
    assert set(RESOURCES) == set(PROFILES)


@pytest.mark.parametrize("profile", sorted(RESOURCES))
def test_render_prints_a_valid_pod_in_each_profiles_units(tmp_path: Path, profile: str) -> None:
    env = ebb_env(tmp_path)
    out = ebb(
        env, "k8s", "render", "--profile", profile, "-l", "gpu=25%,gpumem=8GiB", "--",
        "python", "train.py",
    )  # fmt: skip
    pod = yaml.safe_load(out.stdout)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    [container] = pod["spec"]["containers"]
    assert container["resources"]["limits"] == RESOURCES[profile]
    assert container["resources"]["requests"] == RESOURCES[profile]
    assert container["command"] == ["python", "train.py"]
    assert pod["metadata"]["name"] == "ebb-0-1"
    assert "Traceback" not in out.stderr


def test_render_as_json_with_the_policys_section_and_overrides(tmp_path: Path) -> None:
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text(
        "kubernetes:\n  profile: koordinator\n  image: reg.example.com/ml/train:1\n"
        "  checkpoint_claim: ckpt\n  gpu_memory_mib: 40GiB\n"
        "queues:\n  default: {}\n  research:\n    deadline_s: 12s\n"
    )
    env = ebb_env(tmp_path / "home")
    out = ebb(
        env, "k8s", "render", "--json", "--policy", str(policy), "--namespace", "batch",
        "--node", "gpu-b-7", "-q", "research", "-N", "train", "-v", "A=1", "-d", "/work",
        "-l", "gpu=23%,gpumem=4500MiB", "--", "python", "train.py",
    )  # fmt: skip
    pod = json.loads(out.stdout)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == "batch"
    assert pod["metadata"]["labels"]["ebbtide.io/queue"] == "research"
    assert spec["schedulerName"] == "koord-scheduler"
    assert "nodeSelector" not in spec
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-b-7"]}]
    }
    assert spec["terminationGracePeriodSeconds"] == 12
    [container] = spec["containers"]
    assert container["image"] == "reg.example.com/ml/train:1"
    assert container["env"] == [
        {"name": "A", "value": "1"},
        {"name": "EBBTIDE_CHECKPOINT_DIR", "value": "/var/lib/ebbtide/checkpoints/0"},
    ]
    assert container["workingDir"] == "/work"
    assert container["resources"]["limits"] == {
        "koordinator.sh/gpu-core": "23",
        "koordinator.sh/gpu-memory-ratio": "11",  # 4500 MiB of a 40 GiB card, rounded up
    }
    assert {v["name"] for v in spec["volumes"]} == {"ebbtide-attempt", "ebbtide-checkpoints"}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--profile", "mig", "-l", "gpu=1"], "gpu: 1 whole GPU(s) cannot be given as a MIG"),
        (["--profile", "qgpu", "-l", "gpumem=100GiB"], "gpumem: 100GiB is more than one card"),
        (["--profile", "gpushare"], "unknown profile 'gpushare'; choose one of qgpu, hami"),
        (["--signal", "USR1"], "signal: the kubelet warns a pod with SIGTERM only"),
        (["--namespace", "Batch"], "--namespace: 'Batch' is not a DNS label"),
        (["-l", "gpu=200%"], "-l gpu: a percentage must be in (0, 100]"),
        (["-q", "nosuch"], "unknown queue 'nosuch'"),
    ],
)
def test_what_cannot_be_rendered_is_one_clear_line_and_exit_2(
    tmp_path: Path, args: list[str], words: str
) -> None:
    proc = ebb(ebb_env(tmp_path), "k8s", "render", *args, "--", "true", check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_qsub_under_a_kubernetes_section_rounds_and_qstat_shows_both(tmp_path: Path) -> None:
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text("kubernetes:\n  profile: qgpu\n")
    env = ebb_env(tmp_path / "home", EBBTIDE_POLICY=str(policy))
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#EBB --image reg.example.com/ml/train:7\npython train.py\n")
    job_id = ebb_json(env, "qsub", "-l", "gpu=23%,gpumem=4500MiB", str(script))["id"]
    full = ebb_json(env, "qstat", "-f", str(job_id))
    assert full["slice"] == {"compute_pct": 25.0, "gpus": 0, "memory_mib": 5120}
    assert full["slice_asked"] == {"compute_pct": 23.0, "gpus": 0, "memory_mib": 4500}
    assert full["slice_granted"]["profile"] == "qgpu"
    assert full["image"] == "reg.example.com/ml/train:7"
    text = ebb(env, "qstat", "-f", str(job_id)).stdout
    assert "slice asked: 23% 4500MiB" in text
    assert "slice granted: 25% 5GiB (qgpu)" in text
    assert "image: reg.example.com/ml/train:7" in text

    refused = ebb(env, "qsub", "--", "python", "train.py", check=False)
    assert refused.returncode == 1 and "image: the job names no image" in refused.stderr
    refused = ebb(env, "qsub", "--image", "x:1", "-l", "gpumem=90GiB", "--", "true", check=False)
    assert refused.returncode == 1 and "gpumem: 90GiB is more than one card" in refused.stderr
    assert [j["id"] for j in json.loads(ebb(env, "qstat", "--json").stdout)] == [job_id]


@pytest.mark.parametrize(
    ("args", "policy", "said"),
    [
        (("--profile", "mig"), None, "--profile mig: only for --executor kubernetes"),
        (
            ("--executor", "kubernetes"),
            "apiVersion: ebbtide/v1\nkubernetes:\n",
            "write `kubernetes: {}` for the defaults",
        ),
        (
            ("--executor", "kubernetes"),
            "apiVersion: ebbtide/v1\nkubernetes: {}\n",
            "cannot reach the Kubernetes API server at https://127.0.0.1:1",
        ),
    ],
)
def test_a_worker_set_up_wrong_for_kubernetes_says_so_in_one_line(
    tmp_path: Path, args: tuple[str, ...], policy: str | None, said: str, redis_url: str
) -> None:
    env = ebb_env(tmp_path / "home")
    env["EBBTIDE_REDIS_URL"] = redis_url
    env["EBBTIDE_NAMESPACE"] = f"k8s-wrong-{tmp_path.name}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    env["KUBECONFIG"] = str(kubeconfig)
    extra: tuple[str, ...] = ()
    if policy is not None:
        path = tmp_path / "ebbtide.yaml"
        path.write_text(policy)
        extra = ("--policy", str(path))
    proc = ebb(env, "worker", "--node", "n1", *args, *extra, check=False)
    assert proc.returncode != 0
    assert said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_whole_gpus_with_no_gpumem_ask_for_the_whole_cards(tmp_path: Path) -> None:
    """A trial's trap: ``-l gpu=2`` was annotated as asking for "2 GPUs 1GiB" (a share's
    default memory), while a submission gives whole GPUs the whole cards."""
    env = ebb_env(tmp_path)
    out = ebb(env, "k8s", "render", "--image", "x", "-l", "gpu=2", "--", "python", "t.py")
    annotations = yaml.safe_load(out.stdout)["metadata"]["annotations"]
    assert annotations["ebbtide.io/slice-asked"] == "2 GPUs 80GiB"
    out = ebb(env, "k8s", "render", "--image", "x", "-l", "gpu=2,gpumem=10GiB", "--", "t")
    annotations = yaml.safe_load(out.stdout)["metadata"]["annotations"]
    assert annotations["ebbtide.io/slice-asked"] == "2 GPUs 10GiB"  # as given
