"""Suspend to host: move an attempt's CUDA state off the GPU without ending it.

NVIDIA's ``cuda-checkpoint`` utility (driver 550 or later) toggles one process's CUDA
state between the GPU and host memory: ``--toggle --pid PID`` locks the process's CUDA
API (waiting for the calls in flight), copies its device memory to host memory and
releases its GPU memory; the same command brings it back.  ``--get-state --pid PID`` prints
``running``, ``locked`` or ``checkpointed``.  It acts on one process that holds a CUDA
context, so an attempt's processes are toggled one by one.

While its state is on the host, a process's CUDA calls block until it is restored: the
process itself needs no help.  The agent toggles before it freezes the tree (SIGSTOP) and
thaws it before it toggles back, because the utility works through a thread inside the
target process, which a stopped process cannot run.

This module is the only one that runs the binary; the decision to suspend is pure
(:func:`ebbtide.preemption.relief.relief_for_device`).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import psutil

from ebbtide.errors import EbbtideError
from ebbtide.units import format_mib

_MIB = 1024 * 1024

#: Host-copy bandwidth assumed when estimating a suspension, in MiB/s.  A guess (PCIe 4
#: x16 moves about 20 GiB/s at best; pageable host memory halves that), to be measured on
#: a GPU before it is trusted for deadlines.
DEFAULT_HOST_COPY_MIB_S = 10_000.0
#: What a toggle costs besides copying memory (locking the CUDA API, releasing the
#: context), in seconds.  Also a guess to be measured.
TOGGLE_OVERHEAD_S = 0.5
#: How long one toggle of one process may take before it counts as failed, in seconds.
TOGGLE_TIMEOUT_S = 30.0
#: How long ``--get-state`` may take, in seconds.
STATE_TIMEOUT_S = 5.0
#: Host memory that must stay available after a suspension, in MiB, at least (the
#: online tenants, the agent and the jobs' own host memory keep growing) ...
HOST_RESERVE_MIB = 4096.0
#: ... or this share of the host's physical memory, in percent, where that is more.
HOST_RESERVE_PCT = 5.0

#: The states ``--get-state`` reports.
RUNNING = "running"
LOCKED = "locked"
CHECKPOINTED = "checkpointed"


class SuspendError(EbbtideError):
    """``cuda-checkpoint`` failed for a process (or is not installed); the message says
    which process, what was asked and what the utility said."""


def suspend_time_s(memory_mib: float, bandwidth_mib_s: float = DEFAULT_HOST_COPY_MIB_S) -> float:
    """How long moving ``memory_mib`` of GPU memory to the host is expected to take, in
    seconds (the copy at ``bandwidth_mib_s`` plus :data:`TOGGLE_OVERHEAD_S`)."""
    if bandwidth_mib_s <= 0:
        raise ValueError(f"bandwidth_mib_s must be positive, not {bandwidth_mib_s}")
    return TOGGLE_OVERHEAD_S + max(0.0, memory_mib) / bandwidth_mib_s


def host_memory_mib() -> tuple[float, float]:
    """This host's physical memory and the memory available now, in MiB."""
    vm = psutil.virtual_memory()
    return vm.total / _MIB, vm.available / _MIB


def host_refusal(
    memory_mib: float,
    suspended_mib: float,
    budget_pct: float,
    total_mib: float,
    available_mib: float,
) -> str | None:
    """Why this host cannot take ``memory_mib`` more of suspended CUDA state, in words a
    person can act on; None when it can.  The attempts suspended here hold
    ``suspended_mib`` already; together they may hold ``budget_pct`` of the host's
    ``total_mib`` (the policy's ``suspend_host_memory_pct``), and the host must have the
    memory available with a reserve to spare (:data:`HOST_RESERVE_MIB`,
    :data:`HOST_RESERVE_PCT`).  Pure."""
    budget = total_mib * budget_pct / 100
    if suspended_mib + memory_mib > budget:
        return (
            f"its {format_mib(memory_mib)} and the {format_mib(suspended_mib)} already "
            f"suspended on this host would pass suspend_host_memory_pct {budget_pct:g}% "
            f"of its {format_mib(total_mib)} ({format_mib(budget)})"
        )
    reserve = max(HOST_RESERVE_MIB, total_mib * HOST_RESERVE_PCT / 100)
    if available_mib < memory_mib + reserve:
        return (
            f"the host has {format_mib(available_mib)} available, less than its "
            f"{format_mib(memory_mib)} and a {format_mib(reserve)} reserve"
        )
    return None


class CudaCheckpoint:
    """The ``cuda-checkpoint`` binary: found on ``PATH`` unless ``path`` names it."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        timeout_s: float = TOGGLE_TIMEOUT_S,
        bandwidth_mib_s: float = DEFAULT_HOST_COPY_MIB_S,
    ) -> None:
        found = str(path) if path is not None else shutil.which("cuda-checkpoint")
        self.path: str | None = found
        #: a toggle of one process taking longer than this fails, in seconds
        self.timeout_s = timeout_s
        #: host-copy bandwidth for :meth:`suspend_time_s`, in MiB/s
        self.bandwidth_mib_s = bandwidth_mib_s

    def available(self) -> bool:
        """Whether the binary is there and executable."""
        return self.path is not None and shutil.which(self.path) is not None

    def suspend_time_s(self, memory_mib: float) -> float:
        """The expected time to move ``memory_mib`` to the host, in seconds."""
        return suspend_time_s(memory_mib, self.bandwidth_mib_s)

    def state(self, pid: int) -> str:
        """``running``, ``locked`` or ``checkpointed``."""
        return self._run(pid, "--get-state", timeout_s=STATE_TIMEOUT_S)

    def cuda_pids(self, pids: Iterable[int]) -> list[int]:
        """Those of ``pids`` that hold a CUDA context: the utility answers ``--get-state``
        for them and refuses the others."""
        out = []
        for pid in pids:
            try:
                self.state(pid)
            except SuspendError:
                continue
            out.append(pid)
        return out

    def suspend(self, pids: Iterable[int]) -> None:
        """Move the CUDA state of every process in ``pids`` to host memory (those already
        there are left alone).  Raises :class:`SuspendError` at the first failure: the
        caller restores what was moved (:meth:`restore` skips the rest)."""
        for pid in pids:
            if self.state(pid) != CHECKPOINTED:
                self._toggle(pid, to=CHECKPOINTED)

    def restore(self, pids: Iterable[int]) -> None:
        """Bring the CUDA state of every process in ``pids`` back to its GPU (those
        running already are left alone, and those that have ended need nothing back).
        Tries them all; raises :class:`SuspendError` naming every live process that
        failed."""
        failed = []
        for pid in pids:
            try:
                if self.state(pid) == CHECKPOINTED:
                    self._toggle(pid, to=RUNNING)
            except SuspendError as exc:
                if psutil.pid_exists(pid):
                    failed.append(str(exc))
        if failed:
            raise SuspendError("; ".join(failed))

    def _toggle(self, pid: int, *, to: str) -> None:
        self._run(pid, "--toggle", timeout_s=self.timeout_s)
        now = self.state(pid)
        if now != to:
            raise SuspendError(f"cuda-checkpoint --toggle --pid {pid}: state is {now}, not {to}")

    def _run(self, pid: int, action: str, *, timeout_s: float) -> str:
        if self.path is None:
            raise SuspendError("cuda-checkpoint is not installed (not found on PATH)")
        cmd = [self.path, action, "--pid", str(pid)]
        what = f"cuda-checkpoint {action} --pid {pid}"
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise SuspendError(f"{what}: no answer within {timeout_s:g}s") from None
        except OSError as exc:
            raise SuspendError(f"{what}: could not run {self.path}: {exc}") from exc
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip() or "no message"
            raise SuspendError(f"{what}: exit status {done.returncode}: {said}")
        return done.stdout.strip()
