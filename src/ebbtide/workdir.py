"""Where a job runs: the directory it was submitted from, as with ``PBS_O_WORKDIR``.

The SDK and the CLI submit from the caller's current directory; through ``ebb server``
the client sends that directory along (the server's own would be meaningless).
"""

from __future__ import annotations

import os
import socket

from ebbtide.errors import SpecError, UserError
from ebbtide.queue.spec import JobSpec
from ebbtide.units import shown


def with_workdir(spec: JobSpec, workdir: str | None, *, default_cwd: bool = True) -> JobSpec:
    """``spec`` as submitted from ``workdir``: a relative ``cwd`` or ``checkpoint_dir``
    is resolved against it and, with ``default_cwd``, a spec with no ``cwd`` gets it, so
    a job runs where it was submitted (as ``PBS_O_WORKDIR`` and Slurm have it).  With
    no ``workdir`` (an API request that sent none), relative paths are refused.  Paths
    that start with ``~`` are left for the node agent, as before."""
    base = None
    updates: dict[str, str] = {}
    for field in ("cwd", "checkpoint_dir"):
        value = getattr(spec, field)
        if value is None or os.path.isabs(value) or value.startswith("~"):
            continue
        if workdir is None:
            raise SpecError(
                field,
                f"{shown(value, 60)} is relative, and the server does not know the directory "
                "it was submitted from; give an absolute path (or the workdir)",
            )
        base = base or base_directory(workdir)
        updates[field] = os.path.normpath(os.path.join(base, value))
    if spec.cwd is None and default_cwd and workdir is not None:
        updates["cwd"] = base or base_directory(workdir)
    if not updates:
        return spec
    return JobSpec(**{**spec.model_dump(exclude_unset=True), **updates})


def base_directory(workdir: str) -> str:
    """``workdir`` as an absolute path (``"."``: the current directory)."""
    try:
        return os.path.abspath(workdir)
    except FileNotFoundError:  # the process's current directory was removed
        raise UserError(
            "the current directory no longer exists; cd to where the job should run, or "
            "give it a cwd"
        ) from None


def with_submit_host(spec: JobSpec, host: str | None = None) -> JobSpec:
    """``spec`` with the host it is submitted from (``PBS_O_HOST``,
    ``SLURM_SUBMIT_HOST``): ``host``, else this one's name, unless it names one."""
    if spec.submit_host is not None:
        return spec
    host = socket.gethostname() if host is None else host
    if not host or len(host) > 255:
        return spec
    try:
        return spec.model_copy(update={"submit_host": JobSpec._label(host)})
    except ValueError:
        return spec  # a host name a label cannot hold: left out
