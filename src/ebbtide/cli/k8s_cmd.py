"""``ebb k8s render``: the Pod an attempt of a job would get, without a cluster."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ebbtide.errors import UserError

#: The job id a rendered pod shows: the real one is known only once the job is stored.
PLACEHOLDER_JOB_ID = 0
#: The attempt a rendered pod shows.
RENDERED_ATTEMPT = 1
#: The image shown when neither --image nor the policy names one.
PLACEHOLDER_IMAGE = "IMAGE"
#: The device UUID shown under ``direct`` when no --device-uuid is given.
PLACEHOLDER_DEVICE_UUID = "GPU-UUID-CHOSEN-AT-DISPATCH"
#: The node shown when no --node is given.
PLACEHOLDER_NODE = "NODE"
#: Exit status of a refused render (a usage error, as click's own).
EXIT_REFUSED = 2


@click.group("k8s")
def k8s_group() -> None:
    """The Kubernetes executor: what its pods look like."""


def _profiles_help() -> str:
    from ebbtide.kube.profiles import PROFILES

    lines = "\n".join(f"  {p.name:<12} {p.summary}" for p in PROFILES.values())
    return f"\b\nProfiles:\n{lines}"


@k8s_group.command(
    "render",
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    epilog=_profiles_help(),
)
@click.option(
    "--profile",
    help="Resource profile of the nodes (default: the policy's kubernetes.profile, else whole).",
)
@click.option(
    "--node",
    default=PLACEHOLDER_NODE,
    show_default=True,
    help="Node the pod is pinned to (a Kubernetes node name, like gpu-a-7).",
)
@click.option("--namespace", help="Namespace (default: the policy's, else ebbtide-jobs).")
@click.option("--image", help="Container image (default: the queue's, else the policy's).")
@click.option(
    "--device-uuid",
    "device_uuids",
    multiple=True,
    help="GPU UUID handed to a direct pod (chosen at dispatch; repeatable).",
)
@click.option("-N", "name", help="Job name.")
@click.option("-q", "queue", help="Queue (default: default).")
@click.option(
    "-l",
    "resources",
    multiple=True,
    help="Resources, as qsub takes them: gpu=25%|0.25|1|2, gpumem=8GiB, deadline=30s.",
)
@click.option("-v", "env", multiple=True, help="Environment: VAR=val,VAR2 (bare: copied).")
@click.option("-d", "--cwd", help="Working directory of the job.")
@click.option("--deadline", help="Eviction deadline, 1s..1h: the pod's grace period.")
@click.option("--signal", "signal_", help="Warning signal (only TERM under Kubernetes).")
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False),
    help="Policy file (default: $EBBTIDE_POLICY, else built-in defaults).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def render(ctx: click.Context, command: Sequence[str], **opts: Any) -> None:
    """Print the Pod an attempt of `-- CMD ARGS` would run in, as YAML.

    The job's slice is sized by the resource profile (--profile, else the policy's
    kubernetes section) as a submission would be: the pod asks for what the nodes
    really grant, and a slice the profile cannot express is refused (exit 2). The job
    id is shown as 0 and the attempt as 1; variables the node agent adds at dispatch
    are not shown.

    \b
    ebb k8s render --profile qgpu -l gpu=23%,gpumem=4500MiB -- python train.py
    ebb k8s render --policy ebbtide.yaml -q research --json -- python train.py
    """
    try:
        manifest = build_render(list(command), **opts)
    except UserError as exc:
        click.echo(f"ebb: error: {exc}", err=True)
        ctx.exit(EXIT_REFUSED)
    if opts["as_json"]:
        click.echo(json.dumps(manifest, indent=2))
    else:
        from ebbtide.kube.pods import render_yaml

        click.echo(render_yaml(manifest), nl=False)


def build_render(command: list[str], **opts: Any) -> dict[str, Any]:
    """The manifest ``ebb k8s render`` prints for ``command`` and its options."""
    import dataclasses

    from ebbtide.client import kubernetes_grant
    from ebbtide.config.policy import KubernetesSettings, Policy, load_policy
    from ebbtide.kube.pods import PodRequest, pod_manifest
    from ebbtide.kube.profiles import profile_named
    from ebbtide.queue.qsub import QsubOptions, build_spec_kwargs
    from ebbtide.queue.spec import JobSpec

    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("render needs a command: ebb k8s render [opts] -- CMD ARGS")
    node = _node_name(opts["node"])
    notes: list[str] = []
    spec = JobSpec(
        **build_spec_kwargs(
            QsubOptions(
                name=opts["name"],
                queue=opts["queue"],
                resources=list(opts["resources"]),
                env=list(opts["env"]),
                cwd=opts["cwd"],
                deadline=opts["deadline"],
                signal=opts["signal_"],
                image=opts["image"],
                command=command,
            ),
            notes=notes,
        )
    )
    for note in notes:  # -l resources accepted without effect, as ebb qsub says them
        click.echo(f"ebb: note: {note}", err=True)
    chosen = opts["policy_path"] or os.environ.get("EBBTIDE_POLICY")
    policy = load_policy(Path(chosen)) if chosen else Policy()
    spec = spec.model_copy(update={"queue": policy.queue_named(spec.queue)})
    overrides = {key: opts[key] for key in ("profile", "namespace") if opts[key] is not None}
    if "profile" in overrides:
        profile_named(overrides["profile"])  # an unknown name: the choices, not pydantic's
    base = policy.kubernetes or KubernetesSettings()
    try:
        settings = KubernetesSettings.model_validate({**base.model_dump(), **overrides})
    except ValueError as exc:
        raise UserError(_first_problem(exc)) from None
    policy = policy.model_copy(update={"kubernetes": settings})
    image = policy.image_for(spec.queue, spec.image)
    grant = kubernetes_grant(spec.model_copy(update={"image": image or PLACEHOLDER_IMAGE}), policy)
    if grant is None:  # pragma: no cover - the policy has a kubernetes section now
        raise UserError("kubernetes: the policy has no kubernetes section")
    if spec.gpus and "memory_mib" not in spec.model_fields_set:
        # whole GPUs with no gpumem ask for the whole cards, as a submission makes them
        # (not the 1GiB a share gets by default: "2 GPUs 1GiB" was shown)
        asked = dataclasses.replace(grant.asked, memory_mib=grant.memory_mib)
        grant = dataclasses.replace(grant, asked=asked)
    if image is None:
        click.echo(
            "ebb: note: no image is named (--image, or kubernetes.image in the policy); the "
            f"pod shows {PLACEHOLDER_IMAGE}",
            err=True,
        )
    request = PodRequest(
        job_id=PLACEHOLDER_JOB_ID,
        attempt=RENDERED_ATTEMPT,
        owner=_owner(),
        queue=spec.queue,
        node=node,
        argv=[*(spec.command or []), *spec.args],
        env=dict(spec.env),
        cwd=spec.cwd,
        image=image or PLACEHOLDER_IMAGE,
        deadline_s=spec.deadline_s or policy.deadline_for(spec.queue),
        grant=grant,
        profile=settings.profile,
        device_uuids=tuple(opts["device_uuids"]) or (PLACEHOLDER_DEVICE_UUID,),
        checkpoint_claim=policy.checkpoint_claim_for(spec.queue),
        tolerations=tuple(policy.tolerations_for(spec.queue)),
        cpus=spec.cpus,
        host_memory_mib=spec.host_memory_mib,
    )
    return pod_manifest(request, settings)


def _node_name(node: str) -> str:
    """``--node`` checked as the API server checks a node's name (a DNS subdomain)."""
    from pydantic import TypeAdapter

    from ebbtide.config.policy import KubeName

    if node == PLACEHOLDER_NODE:
        return node
    try:
        TypeAdapter(KubeName).validate_python(node)
    except ValueError:
        raise UserError(
            f"--node: {node!r} is not a Kubernetes node name: at most 253 lowercase "
            "letters, digits, '-' and '.', starting and ending with a letter or digit"
        ) from None
    return node


def _owner() -> str:
    import os

    from ebbtide.identity import user_name

    return os.environ.get("EBBTIDE_USER") or user_name(os.geteuid())


def _first_problem(exc: ValueError) -> str:
    """A pydantic error about an override flag as ``--namespace: ...``."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    err = errors()[0]
    field = ".".join(str(p) for p in err["loc"])
    return f"--{field}: {err['msg'].removeprefix('Value error, ')}"
