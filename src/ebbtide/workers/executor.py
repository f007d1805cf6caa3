"""Executors start an attempt's processes and take them down.

(Longer than our modules should be: the interface every executor implements and
:class:`LocalExecutor`, its implementation for processes on this host, are read together;
the process tree (``shim.py``, ``ownership.py``), launching (``launch.py``) and whom an
attempt runs as (``runas.py``) already stand alone.)

:class:`Executor` is the whole interface an attempt's life needs — start, warn, kill,
observe the exit and its cause, where its logs are — and the node agent's deadline logic
is the same whatever runs behind it: the deadline runs from the decision to evict until
the executor says the attempt's processes are gone.  Two executors implement it:

- :class:`LocalExecutor` (here) runs each attempt on this host below an attempt shim
  (:mod:`ebbtide.workers.shim`): bare-metal hosts and the embedded ``ebb up``;
- :class:`~ebbtide.kube.executor.KubernetesExecutor` runs each attempt as a pod on this
  node and watches it through the Kubernetes API.

The shim is the leader of a new session and a child subreaper, so every process the job
starts — through a shell script, a launcher with workers, a daemon that ``setsid``\\ s
away — stays below it: the attempt's processes are exactly the shim's descendants.  The
agent renews the shim's lease about once a second; a shim whose agent is gone or silent kills the
attempt by itself.  Each shim is also recorded under ``run_dir`` so that a restarted agent
kills whatever its previous incarnation left (:meth:`LocalExecutor.reap_leftovers`).

An attempt that runs as its owner (``Launch.identity``, :mod:`ebbtide.workers.runas`) has
a shim that stays the agent's user (root), so that it can always kill the tree and write
how it ended; the job is that user from its ``exec`` on.  The shim's status file is then
in ``run_dir``, where no job can write (:mod:`ebbtide.workers.attempt_files`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from ebbtide.workers import shim
from ebbtide.workers.attempt_files import open_log
from ebbtide.workers.ownership import Tree
from ebbtide.workers.runas import Identity

log = logging.getLogger("ebbtide.executor")

#: How long to wait for an attempt's last processes to vanish, in seconds.
GROUP_SWEEP_TIMEOUT_S = 1.0
#: How long the shim gets to kill its attempt when told to, before the agent does, in s.
SHIM_KILL_WAIT_S = 0.5
#: The default lease of an attempt: the shim kills it after this long without renewal, in s.
DEFAULT_LEASE_S = 5.0


#: Causes an executor reports besides the shim's (``shim.CAUSE_*``): the platform's own
#: ends of an attempt, as the Kubernetes executor observes them.
CAUSE_OOM = "oom"  # killed for going over its container's memory limit
CAUSE_PREEMPTED = "preempted"  # preempted by the cluster's scheduler for a pod of its own
CAUSE_NODE_PRESSURE = "node_pressure"  # evicted by the kubelet: the node ran short
CAUSE_IMAGE = "image"  # its image could not be pulled within the start timeout
CAUSE_UNSCHEDULABLE = "unschedulable"  # no room for it on the node within the timeout
CAUSE_LOST = "lost"  # gone without an exit: deleted by someone else, its node lost


class StartDeferred(Exception):
    """An attempt could not be started for a reason not the job's (the platform's API
    did not answer): requeued, not counted as a failure."""


@dataclass
class Launch:
    """Everything needed to start one attempt, whatever runs it."""

    job_id: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    stdout_path: Path
    stderr_path: Path
    #: the shim kills the attempt when its lease is not renewed for this long, in seconds
    lease_s: float = DEFAULT_LEASE_S
    #: what executors that build a container need besides the command (pods)
    owner: str = ""
    queue: str = "default"
    node: str = ""
    image: str | None = None
    #: the eviction deadline, in seconds
    deadline_s: float = 30.0
    #: the slice granted: compute in percent of one GPU, whole GPUs, memory in MiB
    compute_pct: float = 0.0
    gpus: int = 0
    memory_mib: int = 0
    #: the CPUs and host memory (MiB) the job asked for (``ncpus``, ``mem``); None: none
    cpus: int | None = None
    host_memory_mib: int | None = None
    #: the devices' UUIDs (``DeviceInfo.uuid``), in the order of ``CUDA_VISIBLE_DEVICES``
    device_uuids: tuple[str, ...] = ()
    #: whom the job runs as; None: the agent's user (see :mod:`ebbtide.workers.runas`)
    identity: Identity | None = None
    #: ``env``'s ``PATH`` is the agent's, not the job's: the job keeps only the directories
    #: its user can search, which that user's process decides just before the exec
    #: (:func:`~ebbtide.workers.runas.trims_path`)
    trim_path: bool = False
    #: directories the job's user makes before the job starts (a checkpoint directory it
    #: named, where the agent is not that user: never made by the agent)
    make_dirs: tuple[str, ...] = ()
    #: files the job's own stdout and stderr go to (``-o``/``--output``), opened by the
    #: job's user; None: the attempt's logs above.  The same path for both joins them
    job_stdout: str | None = None
    job_stderr: str | None = None
    #: start those files afresh (the first attempt) rather than append to them
    truncate_output: bool = False
    #: the warning signal goes to the job's leader (its script's shell) alone
    signal_shell_only: bool = False


@dataclass(frozen=True)
class Exit:
    """How an attempt's processes ended."""

    #: the exit code, 128 + N for signal N
    code: int
    #: ``job`` (its own exit, or a signal ebbtide sent), ``lease`` (the agent stopped
    #: renewing), ``agent_gone``, ``start`` (it could not be started), ``killed`` (the
    #: supervisor itself was killed: by ebbtide at a deadline, or from outside)
    cause: str = shim.CAUSE_JOB
    #: in words, when there is more to say (why it could not start)
    detail: str = ""
    #: Unix seconds its last process was gone, when the supervisor says (else None)
    at: float | None = None
    #: for a platform's eviction (``preempted``, ``node_pressure``): the grace it gave, in s
    grace_s: float | None = None


@dataclass
class Handle:
    """A started attempt, as its executor knows it (executors may extend it)."""

    #: the attempt's supervisor (the shim): leader of its session and process group;
    #: 0 where the attempt is not a process of this host's (a pod)
    pid: int
    pgid: int
    #: the supervisor's start time (``/proc/PID/stat`` field 22), against pid reuse
    start_ticks: int = 0
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    lease_fd: int | None = field(default=None, repr=False)
    status_path: Path | None = None
    record_path: Path | None = None
    #: ebbtide killed it (a deadline, a sweep): that, not the shim's report, is how it ended
    swept: bool = False
    #: a warning goes to the job's leader alone (Slurm's ``--signal=B:``)
    signal_shell_only: bool = False


@dataclass(frozen=True)
class Leftover:
    """An attempt a previous agent on this node left behind, found when an agent starts."""

    job_id: int
    attempt: int
    #: how it ended, if it had ended by itself (its outcome is delivered); None: it was
    #: still running and has been killed (the store requeues it as lost)
    ended: Exit | None = None


class Executor(Protocol):
    #: whether attempts inherit the agent's environment (a local process does; a pod gets
    #: only the job's environment and ebbtide's contract)
    inherit_env: bool
    #: whether it can pause an attempt in place (:meth:`pause`, :meth:`thaw`)
    can_pause: bool

    def start(self, launch: Launch) -> Handle: ...

    def tree(self, job_id: int, handle: Handle) -> Tree:
        """The ownership record of the attempt's processes (see :mod:`.ownership`)."""
        ...

    def describe(self, handle: Handle) -> str:
        """The attempt in words, for logs (``pid 123``, ``pod ebbtide-jobs/ebb-4-1``)."""
        ...

    def poll(self, handle: Handle) -> Exit | None:
        """How the attempt ended, once it has; else None."""
        ...

    def signal(self, handle: Handle, signum: int) -> None:
        """Send ``signum`` to every process of the attempt (not to its supervisor)."""
        ...

    def renew(self, handle: Handle) -> None:
        """Renew the attempt's lease (about once a second, at most a quarter of it)."""
        ...

    def pause(self, handle: Handle) -> None:
        """Freeze every process of the attempt where it is (it keeps its memory)."""
        ...

    def thaw(self, handle: Handle) -> None:
        """Let a paused attempt's processes run again."""
        ...

    def kill_at(self, handle: Handle, monotonic_s: float) -> None:
        """Have the attempt killed at ``monotonic_s`` (``time.monotonic``) unless it has
        ended, by its supervisor: kept even if the agent is paused or gone by then."""
        ...

    def sweep(self, handle: Handle) -> None:
        """Kill whatever is left of the attempt, reap it, and wait until it is gone."""
        ...

    def reap_leftovers(self) -> list[Leftover]:
        """Deal with the attempts a previous agent on this node left: called once when an
        agent starts, before it reconciles with the store."""
        ...


def start_ticks(pid: int) -> int:
    """A process's start time in clock ticks since boot (0 if it is gone)."""
    fields = shim.stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else 0


#: The attempt shim's own environment: nothing a job chose, so nothing the dynamic loader
#: or Python would act on in a process that may be root (the job's goes by pipe).
SHIM_ENV: dict[str, str] = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


def _send_env(fd: int, env: dict[str, str]) -> None:
    """Write the job's environment to the shim's pipe and close it.  The shim reads it at
    once on start; should it have died first, its exit says why, not this."""
    try:
        data = json.dumps(env).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


class LocalExecutor:
    """Runs attempts as local process trees below an attempt shim; logs to per-attempt
    files.  ``run_dir`` (default: none) is where shims are recorded for
    :meth:`reap_leftovers`, and where their status files are; without one (tests, one
    user's scripts) a status file is beside the attempt's logs, and no attempt may run as
    another user."""

    inherit_env = True
    can_pause = True
    #: the agent's ``run_as owner`` applies: attempts can run as their owners
    runs_as_owner = True

    def __init__(self, run_dir: Path | None = None) -> None:
        self.run_dir = run_dir
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _status_path(self, launch: Launch) -> Path:
        """Where the shim writes how the attempt ended: in the run directory, where no job
        can plant a link for it to follow."""
        if self.run_dir is not None:
            return self.run_dir / f"{launch.job_id}.{launch.attempt}.status"
        if launch.identity is not None and launch.identity.switch:
            raise ValueError("an attempt runs as another user only below an agent's run_dir")
        return launch.stdout_path.parent / "shim.json"

    def start(self, launch: Launch) -> Handle:
        identity = launch.identity
        if identity is None or not identity.switch:  # else made for its user (launch_for)
            launch.stdout_path.parent.mkdir(parents=True, exist_ok=True)
        status_path = self._status_path(launch)
        with contextlib.suppress(FileNotFoundError):
            status_path.unlink()
        argv = [
            sys.executable,
            "-I",  # the job's PYTHONPATH and friends are not the shim's business
            shim.__file__,
            "--lease-s",
            f"{launch.lease_s:g}",
            "--status",
            str(status_path),
            *(["--cwd", launch.cwd] if launch.cwd else []),
            *(identity.shim_args() if identity is not None else []),
            *(["--trim-path"] if launch.trim_path else []),
            *(arg for d in launch.make_dirs for arg in ("--mkdir", d)),
            *(["--stdout", launch.job_stdout] if launch.job_stdout else []),
            *(["--stderr", launch.job_stderr] if launch.job_stderr else []),
            *(["--truncate-output"] if launch.truncate_output else []),
        ]
        fds = [open_log(launch.stdout_path, identity)]
        lease_w = env_w = None
        try:
            fds.append(open_log(launch.stderr_path, identity))
            lease_r, lease_w = os.pipe()
            fds.append(lease_r)
            os.set_blocking(lease_w, False)
            env_r, env_w = os.pipe()
            fds.append(env_r)
            # the shim (root, when jobs run as their owners) gets an environment of its
            # own: the job's (LD_PRELOAD, LD_LIBRARY_PATH, ...) would act on it before it
            # drops to the job's user; the job's goes through a pipe, for the job alone
            popen = subprocess.Popen(
                [*argv, "--lease-fd", str(lease_r), "--env-fd", str(env_r), "--", *launch.argv],
                env=SHIM_ENV,
                stdin=subprocess.DEVNULL,
                stdout=fds[0],
                stderr=fds[1],
                start_new_session=True,
                pass_fds=(lease_r, env_r),
                close_fds=True,
            )
            os.close(fds.pop())  # env_r: the shim's now
            sending, env_w = env_w, None
            _send_env(sending, launch.env)
        except BaseException:
            for w in (lease_w, env_w):
                if w is not None:
                    os.close(w)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        handle = Handle(
            pid=popen.pid,
            pgid=popen.pid,
            start_ticks=start_ticks(popen.pid),
            popen=popen,
            lease_fd=lease_w,
            status_path=status_path,
            signal_shell_only=launch.signal_shell_only,
        )
        if self.run_dir is not None:
            handle.record_path = self.run_dir / f"{launch.job_id}.{launch.attempt}.json"
            handle.record_path.write_text(
                json.dumps({"pid": handle.pid, "start_ticks": handle.start_ticks})
            )
        return handle

    def tree(self, job_id: int, handle: Handle) -> Tree:
        try:
            created = psutil.Process(handle.pid).create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            created = 0.0
        return Tree(job_id=job_id, root_pid=handle.pid, root_created=created)

    def describe(self, handle: Handle) -> str:
        return f"pid {handle.pid}"

    def poll(self, handle: Handle) -> Exit | None:
        assert handle.popen is not None
        code = handle.popen.poll()
        if code is None:
            return None
        return self._exit(handle, 128 - code if code < 0 else code)

    @staticmethod
    def _exit(handle: Handle, code: int) -> Exit:
        """The shim's report, or — when the shim itself was killed — a plain ``killed``."""
        if handle.swept:
            return Exit(128 + signal.SIGKILL, cause=shim.CAUSE_KILLED)
        try:
            report = json.loads(handle.status_path.read_text()) if handle.status_path else None
        except (OSError, ValueError):
            report = None
        if not isinstance(report, dict):
            return Exit(code, cause="killed")
        at = report.get("time")
        return Exit(
            int(report.get("exit_code", code)),
            cause=str(report.get("cause", shim.CAUSE_JOB)),
            detail=str(report.get("error") or ""),
            at=float(at) if isinstance(at, int | float) else None,
        )

    def signal(self, handle: Handle, signum: int) -> None:
        if not self._unreaped(handle):
            return
        # a warning to the script's shell alone (it passes it on with a trap), or, once it
        # ended, to what it left behind; anything else (a kill, a pause) to every process
        shell_only = handle.signal_shell_only and signum in shim.FORWARDED
        pids = shim.children(handle.pid) if shell_only else shim.tree(handle.pid)
        if not pids and signum in shim.FORWARDED:
            # the job is not forked yet (a warning right after the start): the shim
            # forwards a warning signal to it once it is
            pids = [handle.pid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def pause(self, handle: Handle) -> None:
        """SIGSTOP to every process below the shim (the shim itself runs on: it keeps the
        lease and the deadline)."""
        self.signal(handle, signal.SIGSTOP)

    def thaw(self, handle: Handle) -> None:
        self.signal(handle, signal.SIGCONT)

    def renew(self, handle: Handle) -> None:
        if handle.lease_fd is None:
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(handle.lease_fd, shim.RENEW)

    def kill_at(self, handle: Handle, monotonic_s: float) -> None:
        if handle.lease_fd is None:
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(handle.lease_fd, shim.DEADLINE + f"{monotonic_s:.6f}\n".encode())

    def sweep(self, handle: Handle) -> None:
        handle.swept = True
        if self._unreaped(handle) and self._tell_shim_to_kill(handle):
            self._release(handle)
            return
        if self._unreaped(handle):
            # the shim holds the tree together (a subreaper) while its members die; then
            # the shim and its group go.  Once the shim is reaped its pid may be reused:
            # then there is nothing of ours left to kill (it took its tree with it).
            shim.kill_tree(handle.pid, reap=False)  # the shim reaps them, not the agent
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle.pgid, signal.SIGKILL)
        give_up = time.monotonic() + GROUP_SWEEP_TIMEOUT_S
        while time.monotonic() < give_up:
            if handle.popen is not None:
                handle.popen.poll()  # reap the shim: a zombie still counts in its group
            try:
                os.killpg(handle.pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.005)
        self._release(handle)

    @staticmethod
    def _tell_shim_to_kill(handle: Handle) -> bool:
        """Ask the shim to kill and reap its attempt; True once it has and has exited."""
        if handle.lease_fd is None or handle.popen is None:
            return False
        try:
            os.write(handle.lease_fd, shim.KILL)
        except OSError:
            return False
        give_up = time.monotonic() + SHIM_KILL_WAIT_S
        while handle.popen.poll() is None:
            if time.monotonic() > give_up:
                return False  # stopped or hung: the agent kills it all itself
            time.sleep(0.001)
        return True

    @staticmethod
    def _unreaped(handle: Handle) -> bool:
        """Whether the supervisor's pid is still its own (running, or a zombie not yet
        reaped), so that its descendants and group are the attempt's."""
        if handle.popen is not None:
            return handle.popen.returncode is None
        return bool(handle.start_ticks) and start_ticks(handle.pid) == handle.start_ticks

    def _release(self, handle: Handle) -> None:
        if handle.lease_fd is not None:
            with contextlib.suppress(OSError):
                os.close(handle.lease_fd)
            handle.lease_fd = None
        for path in (handle.record_path, handle.status_path):
            # a status file beside the logs is the job user's to keep (or remove)
            if path is not None and self.run_dir is not None and path.parent == self.run_dir:
                path.unlink(missing_ok=True)

    def reap_leftovers(self) -> list[Leftover]:
        """Kill the attempts a previous agent on this node left running (the store
        requeues them as lost: a shim that outlived its agent has no exit to tell)."""
        if self.run_dir is None:
            return []
        for status in self.run_dir.glob("*.status"):  # its attempt was requeued as lost
            status.unlink(missing_ok=True)
        killed = []
        for record in sorted(self.run_dir.glob("*.json")):
            try:
                data = json.loads(record.read_text())
                pid, ticks = int(data["pid"]), int(data["start_ticks"])
                job_id, attempt = (int(x) for x in record.stem.split("."))
            except (OSError, ValueError, KeyError, TypeError):
                record.unlink(missing_ok=True)
                continue
            if ticks and start_ticks(pid) == ticks:
                log.warning(
                    "killing attempt %s left by a previous agent (pid %s)", record.stem, pid
                )
                self.sweep(Handle(pid=pid, pgid=pid, start_ticks=ticks))
                killed.append(Leftover(job_id, attempt))
            record.unlink(missing_ok=True)
        return killed
