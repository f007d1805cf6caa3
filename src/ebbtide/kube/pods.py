"""The Pod an attempt runs in: a plain, JSON-able manifest the executor hands to
``CoreV1Api.create_namespaced_pod``.

One container, ``job``, runs the job's argv in its image with the grant's resources as
limits (requests equal them).  The pod is pinned to its node by required node affinity on
the node's name (``matchFields`` ``metadata.name``, as the DaemonSet controller pins its
pods), not by ``nodeName``: HAMi, Volcano and Koordinator bind through their own
scheduler, and the kube-scheduler must see the pod to preempt it for an online pod; nor
by the ``kubernetes.io/hostname`` label, which need not be the node's name.  It carries
the policy's tolerations (GPU nodes are often tainted).  It runs at a low
PriorityClass, never restarts, gets no service links and no service account token (no
credential reaches a job), and its grace period is the job's eviction deadline.  The
node agent's state directory is mounted at the same path as on the host, so the status
file and the attempt directories resolve in the pod and in the agent; a checkpoint
PersistentVolumeClaim is mounted when one is set.

Which card a pod sees is the profile's to decide (the device plugin's, or ebbtide's own
``NVIDIA_VISIBLE_DEVICES`` under ``direct``): a job's own device-selecting NVIDIA
variables are dropped.  Pure: no clock, no I/O.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Final

import yaml

from ebbtide.config.policy import KubernetesSettings, Toleration
from ebbtide.kube.profiles import PROFILES, Grant

#: The job's id.
LABEL_JOB: Final = "ebbtide.io/job-id"
#: The attempt's number.
LABEL_ATTEMPT: Final = "ebbtide.io/attempt"
#: Who submitted the job (as a label value: see :func:`label_value`).
LABEL_OWNER: Final = "ebbtide.io/owner"
#: The job's queue.
LABEL_QUEUE: Final = "ebbtide.io/queue"
#: The node the attempt was dispatched to: each node agent watches its own pods by it.
LABEL_NODE: Final = "ebbtide.io/node"
#: Kubernetes' recommended label for the tool that manages an object.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
#: ... and its value.
MANAGED_BY: Final = "ebbtide"
#: The owner as given (a label value may not hold every user name).
ANNOTATION_OWNER: Final = "ebbtide.io/owner"
#: The slice the job asked for, in words (``23% 4500MiB``).
ANNOTATION_ASKED: Final = "ebbtide.io/slice-asked"
#: The slice the node grants, in words (``25% 5GiB (qgpu)``).
ANNOTATION_GRANTED: Final = "ebbtide.io/slice-granted"
#: What the profile rounded, in words (only when it rounded).
ANNOTATION_NOTE: Final = "ebbtide.io/slice-note"
#: The node field a pod is pinned to its node by (required node affinity, ``matchFields``).
NODE_NAME_FIELD: Final = "metadata.name"
#: The one container of an attempt's pod.
CONTAINER_NAME: Final = "job"
#: The volume of the attempt's own directory below the agent's state directory (a hostPath).
STATE_VOLUME: Final = "ebbtide-attempt"
#: The volume of the job's checkpoints: the checkpoint claim, else a hostPath below the
#: agent's state directory.
CHECKPOINT_VOLUME: Final = "ebbtide-checkpoints"
#: What ``direct`` pods may do with the card: CUDA and nvidia-smi.
DRIVER_CAPABILITIES: Final = "compute,utility"
#: Variables that choose which GPUs the NVIDIA runtime hands a container: the profile
#: decides, never the job.
DEVICE_VARIABLES: Final = frozenset(
    {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"}
)
#: Longest label value Kubernetes takes, in characters.
MAX_LABEL_VALUE: Final = 63
#: A valid label value: empty, or alphanumerics at both ends and ``-_.`` between.
LABEL_VALUE_RE: Final = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")

_NOT_IN_LABEL = re.compile(r"[^-A-Za-z0-9_.]+")
_HASH_CHARS = 8


def label_value(text: str) -> str:
    """``text`` as a valid label value: characters a label cannot hold become ``-``, the
    ends are trimmed to alphanumerics, and a value past 63 characters is cut and given
    a short hash of the whole, so two long values stay apart (``alice@example.com`` →
    ``alice-example.com``)."""
    value = _NOT_IN_LABEL.sub("-", text).strip("-_.")
    if len(value) > MAX_LABEL_VALUE:
        digest = hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]
        value = value[: MAX_LABEL_VALUE - _HASH_CHARS - 1].rstrip("-_.") + "-" + digest
    return value


def pod_name(job_id: int, attempt: int) -> str:
    """The name of attempt ``attempt`` of job ``job_id``'s pod: ``ebb-42-3`` (DNS-1123)."""
    if job_id < 0 or attempt < 0:
        raise ValueError(f"job id and attempt must not be negative, got {job_id}, {attempt}")
    return f"ebb-{job_id}-{attempt}"


@dataclass(frozen=True)
class PodRequest:
    """One attempt, as its pod needs it.

    ``env`` is the job's environment with what the agent adds; ``deadline_s`` the
    eviction deadline in seconds (the pod's grace period, rounded up); ``device_uuids``
    the GPUs of the attempt (``direct`` hands them to the NVIDIA runtime);
    ``checkpoint_claim`` the queue's claim (None: the ``kubernetes`` section's);
    ``tolerations`` the queue's (None: the ``kubernetes`` section's).
    """

    job_id: int
    attempt: int
    owner: str
    queue: str
    node: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    image: str
    deadline_s: float
    grant: Grant
    profile: str
    device_uuids: tuple[str, ...] = ()
    checkpoint_claim: str | None = None
    tolerations: tuple[Toleration, ...] | None = None
    #: the CPUs and host memory (MiB) the job asked for (``-l ncpus=8,mem=32gb``): the
    #: pod's requests (None: none, a BestEffort pod where the grant asks no more)
    cpus: int | None = None
    host_memory_mib: int | None = None


def _requests(req: PodRequest) -> dict[str, str]:
    """The container's requests: the grant's, and the CPUs and host memory the job asked
    for (requested, not limited: a job may burst as a process under the local executor
    may; a namespace's ResourceQuota or LimitRange counts them)."""
    requests = dict(req.grant.resources)
    if req.cpus is not None:
        requests["cpu"] = str(req.cpus)
    if req.host_memory_mib is not None:
        requests["memory"] = f"{req.host_memory_mib}Mi"
    return requests


def node_affinity(node: str) -> dict[str, Any]:
    """The ``affinity`` that lets a pod run on the node named ``node`` only."""
    term = {"matchFields": [{"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def pod_manifest(req: PodRequest, settings: KubernetesSettings) -> dict[str, Any]:
    """The Pod for ``req`` under the ``kubernetes`` section ``settings``."""
    profile = PROFILES.get(req.profile)
    if profile is None:
        raise ValueError(f"unknown profile {req.profile!r}; choose one of {', '.join(PROFILES)}")
    if not req.argv:
        raise ValueError("argv must hold the command to run")
    if not math.isfinite(req.deadline_s) or req.deadline_s < 0:
        raise ValueError(f"deadline_s must be a finite number of seconds, got {req.deadline_s}")
    env = {k: v for k, v in req.env.items() if k not in DEVICE_VARIABLES}
    if req.profile == "direct":
        if not req.device_uuids:
            raise ValueError("the direct profile needs the attempt's device UUIDs")
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(req.device_uuids)
        env["NVIDIA_DRIVER_CAPABILITIES"] = DRIVER_CAPABILITIES

    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": req.image,
        "command": list(req.argv),
        "resources": {"limits": dict(req.grant.resources), "requests": _requests(req)},
        "volumeMounts": [],
        # a job needs no privilege: none to gain, no capability, the runtime's seccomp
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    if req.cwd:
        container["workingDir"] = req.cwd
    # only this attempt's own directory (its status file) and its job's checkpoints, at
    # the paths the node agent uses: a job sees nothing of other jobs' on the node
    volumes: list[dict[str, Any]] = []
    claim = req.checkpoint_claim or settings.checkpoint_claim
    own = [(STATE_VOLUME, attempt_dir(settings.state_dir, req.job_id, req.attempt))]
    if not claim:
        own.append((CHECKPOINT_VOLUME, checkpoint_dir(settings.state_dir, req.job_id)))
    for name, path in own:
        container["volumeMounts"].append({"name": name, "mountPath": path})
        volumes.append({"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}})
    if claim:
        # the job checkpoints to the claim, which every node mounts: it resumes anywhere
        ckpt_env = f"{settings.checkpoint_mount.rstrip('/')}/{req.job_id}"
        container.setdefault("env", []).append(
            {"name": "EBBTIDE_CHECKPOINT_DIR", "value": ckpt_env}
        )
        container["env"] = sorted(
            {e["name"]: e for e in container["env"]}.values(), key=lambda e: e["name"]
        )
        container["volumeMounts"].append(
            {"name": CHECKPOINT_VOLUME, "mountPath": settings.checkpoint_mount}
        )
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})

    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "affinity": node_affinity(req.node),
        "terminationGracePeriodSeconds": math.ceil(req.deadline_s),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
    }
    # never root unless the policy says uid 0: with no uid named, the kubelet refuses an
    # image that would run as root (Pod Security's restricted profile asks the same)
    spec["securityContext"] = {
        k: v
        for k, v in (
            ("runAsNonRoot", settings.run_as_user != 0),
            ("runAsUser", settings.run_as_user),
            ("runAsGroup", settings.run_as_group),
        )
        if v is not None
    }
    scheduler = settings.scheduler_name or profile.default_scheduler
    if scheduler:
        spec["schedulerName"] = scheduler
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    if req.profile == "direct":
        spec["runtimeClassName"] = settings.runtime_class
    tolerations = settings.tolerations if req.tolerations is None else req.tolerations
    if tolerations:
        spec["tolerations"] = [t.manifest() for t in tolerations]

    annotations = {
        ANNOTATION_OWNER: req.owner,
        ANNOTATION_ASKED: req.grant.asked.words(),
        ANNOTATION_GRANTED: req.grant.words(),
    }
    if req.grant.note:
        annotations[ANNOTATION_NOTE] = req.grant.note
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(req.job_id, req.attempt),
            "namespace": settings.namespace,
            "labels": {
                LABEL_JOB: str(req.job_id),
                LABEL_ATTEMPT: str(req.attempt),
                LABEL_OWNER: label_value(req.owner),
                LABEL_QUEUE: label_value(req.queue),
                LABEL_NODE: label_value(req.node),
                LABEL_MANAGED_BY: MANAGED_BY,
            },
            "annotations": annotations,
        },
        "spec": spec,
    }


def attempt_dir(state_dir: str, job_id: int, attempt: int) -> str:
    """The attempt's directory on the node (its status file, its logs), as the node agent
    lays it out (``workers/launch.py``)."""
    return f"{state_dir.rstrip('/')}/logs/{job_id}/{attempt}"


def checkpoint_dir(state_dir: str, job_id: int) -> str:
    """The job's default checkpoint directory on the node (without a checkpoint claim)."""
    return f"{state_dir.rstrip('/')}/checkpoints/{job_id}"


def render_yaml(manifest: dict[str, Any]) -> str:
    """``manifest`` as YAML, in the order it was built (``kubectl apply -f`` takes it)."""
    return yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True, default_flow_style=False)
