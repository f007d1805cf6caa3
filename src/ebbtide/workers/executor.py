"""Executors start an attempt's process and take it down.  The local one runs each attempt
as a process group of its own on this host.

Each attempt's process group is started with ``PR_SET_PDEATHSIG`` (Linux), so an agent
killed with ``kill -9`` takes its job leaders with it instead of leaving orphans that
would run on while the job is requeued elsewhere.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

#: How long to wait for the last members of a process group to vanish, in seconds.
GROUP_SWEEP_TIMEOUT_S = 1.0
_PR_SET_PDEATHSIG = 1


@dataclass
class Launch:
    """Everything needed to start one attempt."""

    job_id: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    stdout_path: Path
    stderr_path: Path


@dataclass
class Handle:
    pid: int
    pgid: int
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class Executor(Protocol):
    def start(self, launch: Launch) -> Handle: ...

    def poll(self, handle: Handle) -> int | None:
        """The exit code once the leader has exited (128 + N for signal N), else None."""
        ...

    def signal(self, handle: Handle, signum: int) -> None:
        """Send ``signum`` to the whole process group."""
        ...

    def sweep(self, handle: Handle) -> None:
        """Kill whatever is left of the group, reap it, and wait until it is gone."""
        ...


def _child_setup() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


class LocalExecutor:
    """Runs attempts as local process groups (``setsid``), logs to per-attempt files."""

    def start(self, launch: Launch) -> Handle:
        launch.stdout_path.parent.mkdir(parents=True, exist_ok=True)
        with open(launch.stdout_path, "ab") as out, open(launch.stderr_path, "ab") as err:
            popen = subprocess.Popen(
                launch.argv,
                env=launch.env,
                cwd=launch.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=_child_setup,
                close_fds=True,
            )
        return Handle(pid=popen.pid, pgid=popen.pid, popen=popen)

    def poll(self, handle: Handle) -> int | None:
        assert handle.popen is not None
        code = handle.popen.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def signal(self, handle: Handle, signum: int) -> None:
        try:
            os.killpg(handle.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def sweep(self, handle: Handle) -> None:
        self.signal(handle, signal.SIGKILL)
        give_up = time.monotonic() + GROUP_SWEEP_TIMEOUT_S
        while time.monotonic() < give_up:
            if handle.popen is not None:
                handle.popen.poll()  # reap the leader: a zombie still counts in its group
            try:
                os.killpg(handle.pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.005)
