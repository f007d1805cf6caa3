"""What an attempt is started with: its command line, its environment, its directories.

The environment contract (``EBBTIDE_*``) is what :mod:`ebbtide.job` reads, and what a
job in any language can follow (``examples/count.sh``).  Whom the attempt runs as
(:mod:`ebbtide.workers.runas`) decides what else is in its environment and whose its
directories are (:mod:`ebbtide.workers.attempt_files`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebbtide.config.settings import PRIVATE_VARIABLES
from ebbtide.queue.spec import JobSpec
from ebbtide.units import signal_name
from ebbtide.workers import attempt_files
from ebbtide.workers.executor import Launch
from ebbtide.workers.headroom.base import DeviceInfo
from ebbtide.workers.runas import Identity, base_env, job_path


def argv_for(spec: JobSpec, attempt_dir: Path, identity: Identity | None = None) -> list[str]:
    """The command line: the spec's command, or its script written to the attempt's
    directory (its user's) and run by its ``#!`` line (``/bin/sh`` without one)."""
    if spec.command:
        return list(spec.command)
    script = attempt_files.write_script(attempt_dir / "job.script", spec.script or "", identity)
    if (spec.script or "").startswith("#!"):
        first = (spec.script or "").splitlines()[0][2:].strip()
        return [*shlex.split(first), str(script), *spec.args]
    return ["/bin/sh", str(script), *spec.args]


def env_for(
    spec: JobSpec,
    job: Any,
    attempt: int,
    *,
    node: str,
    devices: Sequence[DeviceInfo],
    ckpt_dir: Path,
    status_path: Path,
    mps: bool = False,
    inherit_env: bool = True,
    identity: Identity | None = None,
) -> dict[str, str]:
    """The attempt's environment: the agent's less its credentials and settings
    (``PRIVATE_VARIABLES``; with ``inherit_env`` False, as for a pod, nothing of the
    agent's), the spec's, then ebbtide's contract.  Run as its owner (``identity``): only
    what :func:`~ebbtide.workers.runas.base_env` passes on, the spec's and the owner's
    login variables, then the contract."""
    if identity is not None:
        env = base_env(identity, spec.env, os.environ)
    else:
        env = (
            {k: v for k, v in os.environ.items() if k not in PRIVATE_VARIABLES}
            if inherit_env
            else {}
        )
        env.update(spec.env)
    env.update(
        {
            "EBBTIDE_JOB_ID": str(job.id),
            "EBBTIDE_ATTEMPT": str(attempt),
            "EBBTIDE_NODE": node,
            "EBBTIDE_CHECKPOINT_DIR": str(ckpt_dir),
            "EBBTIDE_RESUME_FROM": job.checkpoint_path or "",
            "EBBTIDE_WARNING_SIGNAL": signal_name(job.signal),
            "EBBTIDE_STATUS_FILE": str(status_path),
            "EBBTIDE_DEADLINE_S": f"{job.deadline_s:g}",
            # devices named by index follow NVML's order, which is the PCI bus order
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(d.visible_id for d in devices),
        }
    )
    if job.array_index is not None:
        env["EBBTIDE_ARRAY_INDEX"] = str(job.array_index)
    if mps:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, int(job.compute_pct)))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={job.memory_mib}M" for i in range(len(devices))
        )
    return env


def launch_for(
    spec: JobSpec,
    job: Any,
    attempt: int,
    *,
    home: Path,
    node: str,
    devices: Sequence[DeviceInfo],
    lease_s: float,
    mps: bool = False,
    inherit_env: bool = True,
    identity: Identity | None = None,
) -> Launch:
    """Everything the executor needs to start ``attempt`` of ``job``; makes its log
    directory and its checkpoint directory, the job's user's (``identity``: None for the
    agent's).  A checkpoint directory the job named is made by the job's user: here when
    that is the agent's, else by the shim's child once it is that user (``make_dirs``)."""
    attempt_dir = attempt_files.attempt_dir(home, job.id, attempt, identity)
    make_dirs: tuple[str, ...] = ()
    if spec.checkpoint_dir is None:
        ckpt_dir = attempt_files.checkpoint_dir(home, job.id, identity)
    else:
        ckpt_dir = job_path(spec.checkpoint_dir, identity)
        if identity is not None and identity.switch:
            make_dirs = (str(ckpt_dir),)
        else:
            ckpt_dir.mkdir(parents=True, exist_ok=True, mode=attempt_files.PRIVATE_DIR_MODE)
    cwd = spec.cwd
    if cwd is not None and identity is not None:
        cwd = str(job_path(cwd, identity))
    return Launch(
        job_id=job.id,
        attempt=attempt,
        argv=argv_for(spec, attempt_dir, identity),
        env=env_for(
            spec,
            job,
            attempt,
            node=node,
            devices=devices,
            ckpt_dir=ckpt_dir,
            status_path=status_path_for(home, job.id, attempt),
            mps=mps,
            inherit_env=inherit_env,
            identity=identity,
        ),
        cwd=cwd,
        stdout_path=attempt_dir / "stdout.log",
        stderr_path=attempt_dir / "stderr.log",
        lease_s=lease_s,
        owner=str(job.owner),
        queue=str(job.queue),
        node=node,
        image=spec.image,
        deadline_s=float(job.deadline_s),
        compute_pct=float(job.compute_pct),
        gpus=int(job.gpus),
        memory_mib=int(job.memory_mib),
        device_uuids=tuple(d.uuid or d.visible_id for d in devices),
        identity=identity,
        make_dirs=make_dirs,
    )


def status_path_for(home: Path, job_id: int, attempt: int) -> Path:
    """The file the job appends status lines to (checkpoints, progress)."""
    return home / "logs" / str(job_id) / str(attempt) / "status.jsonl"
