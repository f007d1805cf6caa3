"""What an attempt is started with: its command line, its environment, its directories.

The environment contract (``EBBTIDE_*``) is what :mod:`ebbtide.job` reads, and what a
job in any language can follow (``examples/count.sh``).  Whom the attempt runs as
(:mod:`ebbtide.workers.runas`) decides what else is in its environment and whose its
directories are (:mod:`ebbtide.workers.attempt_files`).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ebbtide.attempt_logs import JOINED_LOG
from ebbtide.config.settings import PRIVATE_VARIABLES
from ebbtide.queue.spec import JobSpec
from ebbtide.units import signal_name
from ebbtide.workers import attempt_files
from ebbtide.workers.executor import Launch
from ebbtide.workers.headroom.base import DeviceInfo
from ebbtide.workers.runas import Identity, base_env, job_path, trims_path


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


def _activate_own_environment(env: dict[str, str]) -> None:
    """Put the virtual environment the agent runs from first on ``env``'s ``PATH``, as
    activating it would (and set ``VIRTUAL_ENV``), unless it is on it already.

    On one box (``ebb up``) the agent and the jobs share a user and an install: a job
    that runs ``python job.py`` means the Python that has ebbtide (the SDK), even when
    ``ebb up`` was started as ``.venv/bin/ebb up`` without activating anything."""
    if sys.prefix == sys.base_prefix:
        return  # not a virtual environment: PATH already says what the user means
    own_bin = os.path.join(sys.prefix, "bin")
    path = env.get("PATH") or os.defpath  # (no PATH: the shell's own search, kept)
    if own_bin in path.split(os.pathsep):
        return
    env["PATH"] = os.pathsep.join((own_bin, path))
    env["VIRTUAL_ENV"] = sys.prefix
    env.pop("PYTHONHOME", None)


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
    nodefile: Path | None = None,
    own_python: bool = False,
) -> dict[str, str]:
    """The attempt's environment: the agent's less its credentials and settings
    (``PRIVATE_VARIABLES``; with ``inherit_env`` False, as for a pod, nothing of the
    agent's; with ``own_python``, as under ``ebb up``, the agent's virtual environment
    first on ``PATH`` unless the spec brings its own ``PATH``: ``-V``, ``-v PATH``), the
    spec's, then ebbtide's contract.
    Run as its owner (``identity``): only what :func:`~ebbtide.workers.runas.base_env`
    passes on, the spec's and the owner's login variables, then the contract and the
    variables of PBS or Slurm the spec asks for (:func:`scheduler_env`)."""
    if identity is not None:
        env = base_env(identity, spec.env, os.environ)
    else:
        env = (
            {k: v for k, v in os.environ.items() if k not in PRIVATE_VARIABLES}
            if inherit_env
            else {}
        )
        if own_python and inherit_env and "PATH" not in spec.env:
            _activate_own_environment(env)
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
    env.update(scheduler_env(spec, job, attempt, node=node, devices=devices, nodefile=nodefile))
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
    own_python: bool = False,
) -> Launch:
    """Everything the executor needs to start ``attempt`` of ``job``; makes its log
    directory and its checkpoint directory, the job's user's (``identity``: None for the
    agent's).  A checkpoint directory the job named is made by the job's user: here when
    that is the agent's, else by the shim's child once it is that user (``make_dirs``)."""
    attempt_dir = attempt_files.attempt_dir(home, job.id, attempt, identity)
    make_dirs: tuple[str, ...] = ()
    if spec.checkpoint_dir is None:
        ckpt_dir = attempt_files.checkpoint_dir(home, job.id, identity)
    else:  # the fields of an output path filled in: ckpt/%a keeps an array's tasks apart
        ckpt_dir = job_path(
            _OUTPUT_FIELD.sub(_fields(spec, job, node), spec.checkpoint_dir), identity
        )
        if identity is not None and identity.switch:
            make_dirs = (str(ckpt_dir),)
        else:
            ckpt_dir.mkdir(parents=True, exist_ok=True, mode=attempt_files.PRIVATE_DIR_MODE)
    cwd = spec.cwd
    if cwd is not None and identity is not None:
        cwd = str(job_path(cwd, identity))
    nodefile = None
    if spec.compat == "pbs" and spec.image is None:
        nodefile = attempt_files.write_file(
            attempt_dir / "nodefile", f"{node}\n", identity, attempt_files.LOG_MODE
        )
    # -j oe (eo): both streams in the attempt's stdout (stderr) log, as in a file named
    logs = {name: JOINED_LOG.get(spec.join or "", name) for name in ("stdout", "stderr")}
    outputs = {
        name: output_path(template, spec, job, node=node, cwd=cwd, identity=identity)
        for name, template in (("stdout", spec.stdout), ("stderr", spec.stderr))
        if template is not None
    }
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
            own_python=own_python,
            nodefile=nodefile,
        ),
        cwd=cwd,
        stdout_path=attempt_dir / f"{logs['stdout']}.log",
        stderr_path=attempt_dir / f"{logs['stderr']}.log",
        lease_s=lease_s,
        owner=str(job.owner),
        queue=str(job.queue),
        node=node,
        image=spec.image,
        deadline_s=float(job.deadline_s),
        compute_pct=float(job.compute_pct),
        gpus=int(job.gpus),
        memory_mib=int(job.memory_mib),
        cpus=spec.cpus,
        host_memory_mib=spec.host_memory_mib,
        device_uuids=tuple(d.uuid or d.visible_id for d in devices),
        identity=identity,
        trim_path=trims_path(identity, spec.env),
        make_dirs=make_dirs,
        job_stdout=outputs.get("stdout"),
        job_stderr=outputs.get("stderr"),
        truncate_output=attempt == 1,
        signal_shell_only=spec.signal_shell_only,
    )


def scheduler_env(
    spec: JobSpec,
    job: Any,
    attempt: int,
    *,
    node: str,
    devices: Sequence[DeviceInfo],
    nodefile: Path | None = None,
) -> dict[str, str]:
    """The variables PBS (``spec.compat`` ``pbs``) or Slurm (``slurm``) sets in a job,
    for scripts written for them: its id, name, queue, submit directory and host, array
    index, node.  An array task's Slurm id is its own (as Slurm's ``SLURM_JOB_ID`` is);
    its PBS id is PBS's subjob id, ``12[3]`` (task 3 of array 12, which ``ebb qstat`` and
    ``qdel`` take too); the array's id is its first task's."""
    job_id, name, queue = str(job.id), spec.display_name(), str(job.queue)
    workdir, host = spec.cwd or "", spec.submit_host or ""
    env: dict[str, str]
    if spec.compat == "slurm":
        env = {
            "SLURM_JOB_ID": job_id,
            "SLURM_JOBID": job_id,
            "SLURM_JOB_NAME": name,
            "SLURM_JOB_USER": str(job.owner),
            "SLURM_SUBMIT_DIR": workdir,
            "SLURM_SUBMIT_HOST": host,
            "SLURM_JOB_PARTITION": queue,
            "SLURM_JOB_NODELIST": node,
            "SLURM_NODELIST": node,
            "SLURMD_NODENAME": node,
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_NNODES": "1",
            "SLURM_RESTART_COUNT": str(attempt - 1),
        }
        if spec.account:
            env["SLURM_JOB_ACCOUNT"] = spec.account
        if spec.cpus:
            env["SLURM_CPUS_PER_TASK"] = env["SLURM_CPUS_ON_NODE"] = str(spec.cpus)
        if job.gpus:
            env["SLURM_GPUS_ON_NODE"] = str(len(devices))
        if job.array_index is not None and spec.array is not None:
            indices = spec.array.indices()
            env.update(
                {
                    "SLURM_ARRAY_JOB_ID": str(job.array_id or job.id),
                    "SLURM_ARRAY_TASK_ID": str(job.array_index),
                    "SLURM_ARRAY_TASK_MIN": str(indices[0]),
                    "SLURM_ARRAY_TASK_MAX": str(indices[-1]),
                    "SLURM_ARRAY_TASK_STEP": str(spec.array.step),
                    "SLURM_ARRAY_TASK_COUNT": str(len(indices)),
                }
            )
        return env
    pbs_id = job_id if job.array_index is None else f"{job.array_id or job.id}[{job.array_index}]"
    env = {
        "PBS_JOBID": pbs_id,
        "PBS_JOBNAME": name,
        "PBS_QUEUE": queue,
        "PBS_O_QUEUE": queue,
        "PBS_O_WORKDIR": workdir,
        "PBS_O_HOST": host,
        "PBS_O_LOGNAME": str(job.owner),
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_NUM_NODES": "1",
    }
    if nodefile is not None:
        env["PBS_NODEFILE"] = str(nodefile)
    if spec.cpus:
        env["NCPUS"] = env["PBS_NUM_PPN"] = str(spec.cpus)
    if job.array_index is not None:
        env["PBS_ARRAY_INDEX"] = env["PBS_ARRAYID"] = str(job.array_index)
        env["PBS_ARRAY_ID"] = f"{job.array_id or job.id}[]"
    return env


_OUTPUT_FIELD = re.compile(r"%(%|[jJAaxuNst])")


def output_path(
    template: str,
    spec: JobSpec,
    job: Any,
    *,
    node: str,
    cwd: str | None,
    identity: Identity | None = None,
) -> str:
    """Where an output template (``spec.stdout``/``stderr``) points for this attempt:
    ``%j`` (and ``%J``) the job id, ``%A`` the array's id, ``%a`` the index, ``%x`` the
    name, ``%u`` the owner, ``%N`` the node, ``%s``/``%t`` 0, ``%%`` a ``%``; relative to
    the job's directory (else its user's home, or the agent's directory)."""
    path = _OUTPUT_FIELD.sub(_fields(spec, job, node), template)
    path = str(job_path(path, identity)) if path.startswith("~") else path
    if not os.path.isabs(path):
        base = cwd or (identity.home if identity is not None else os.getcwd())
        path = os.path.join(base, path)
    return os.path.normpath(path)


def _fields(spec: JobSpec, job: Any, node: str) -> Callable[[re.Match[str]], str]:
    """What each ``%`` field of an output path or a checkpoint directory stands for."""
    values = {
        "%": "%",
        "j": str(job.id),
        "J": str(job.id),
        "A": str(job.array_id or job.id),
        "a": str(job.array_index if job.array_index is not None else 0),
        "x": spec.display_name(),
        "u": str(job.owner),
        "N": node,
        "s": "0",
        "t": "0",
    }
    return lambda m: values[m.group(1)]


def status_path_for(home: Path, job_id: int, attempt: int) -> Path:
    """The file the job appends status lines to (checkpoints, progress)."""
    return home / "logs" / str(job_id) / str(attempt) / "status.jsonl"
