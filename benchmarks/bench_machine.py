"""What machine a benchmark ran on, for its ``--json`` (``"machine"``).

Two machines of the same size measure the same code differently: the node agent took
1.7 % of a core with free NVML calls on one 2-core virtual machine and 2.6 % on another,
a simulated day 888 s of CPU on one and 985 s on the other.  So a figure carries the
machine it was taken on, and only figures of one machine compare.  (Imported by the
benchmark scripts beside it, which run as ``python benchmarks/NAME.py``.)"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import psutil

CPUINFO = Path("/proc/cpuinfo")


def machine() -> dict[str, Any]:
    """The CPU model, the CPUs this process may use, the memory, the system and Python."""
    return {
        "cpu_model": cpu_model(),
        "cpus": cpus(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "system": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def cpus() -> int | None:
    """The CPUs this process may run on (its affinity where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """``/proc/cpuinfo``'s first ``model name`` (Linux); else what :mod:`platform` says,
    else ``"unknown"``."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
