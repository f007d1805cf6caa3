"""What ``benchmarks/gpu_check.py`` drives: NVML, the online process, and ``ebb``.

- :class:`Gpu`: GPU 0 through ``pynvml``;
- :class:`Workload`: a ``gpu_workload.py online`` process, spoken to in JSON lines;
- :class:`Ebb`: the ``ebb`` command line against one ``EBBTIDE_HOME``, and ``ebb up``;
- :class:`Budget`: the check's time, which every wait is cut to;
- the probes that decide whether there is anything to measure at all.

Every process is started in a session of its own and taken down with its whole process
group.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

#: How to install ebbtide on the GPU machine from the wheels ``make gpu-check-wheels`` fetched.
INSTALL_COMMAND = "python3 -m pip install --no-index --find-links .gpu-wheels ebbtide"
#: How long one ``ebb`` command may take, in seconds.
CLI_TIMEOUT_S = 30.0
#: How long ``ebb up`` may take to report its node, in seconds.
EBB_UP_TIMEOUT_S = 60.0
_MIB_B = 1024 * 1024

EBBTIDE_PROBE = (
    "import importlib.metadata as m, ebbtide.cli.main, ebbtide.runtime, ebbtide.job; "
    "print(m.version('ebbtide'))"
)


class PhaseError(Exception):
    """A phase could not finish; the message says why, for the JSON."""


class Budget:
    """``seconds`` for the whole check, of which the last ``reserve_s`` are for cleaning up."""

    def __init__(self, seconds: float, reserve_s: float) -> None:
        self.started = time.monotonic()
        self.end = self.started + seconds - reserve_s

    def left(self) -> float:
        """Seconds the phases may still use."""
        return self.end - time.monotonic()

    def give_up(self, wanted_s: float) -> float:
        """A ``time.monotonic()`` deadline ``wanted_s`` ahead, cut to the budget."""
        return time.monotonic() + max(0.0, min(wanted_s, self.left()))

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def tail(path: Path, chars: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def marked_pids(marker: str) -> list[int]:
    """Processes (not this one) whose environment holds ``marker`` (``NAME=value``)."""
    needle = marker.encode()
    found = []
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or a zombie
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(marker: str, grace_s: float) -> list[int]:
    """Wait up to ``grace_s`` for the processes holding ``marker`` to end, then kill the
    rest; return the pids that were left."""
    give_up = time.monotonic() + grace_s
    while (left := marked_pids(marker)) and time.monotonic() < give_up:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# -- probes -------------------------------------------------------------------------------


def probe_nvml() -> tuple[Any, str | None]:
    """``(pynvml, None)`` once NVML is initialised with at least one GPU, else ``(None, why)``."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"NVML: pynvml (nvidia-ml-py) is not installed ({exc})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return None, f"NVML: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        pynvml.nvmlShutdown()
        return None, f"NVML: {exc}"
    if count < 1:
        pynvml.nvmlShutdown()
        return None, "NVML: no GPU"
    return pynvml, None


def probe_frameworks() -> tuple[list[str], str | None]:
    """The CUDA frameworks installed (not yet imported), or why there is none."""
    found = [name for name in ("torch", "cupy") if importlib.util.find_spec(name) is not None]
    return found, None if found else "no CUDA library: neither torch nor cupy is installed"


def probe_ebbtide(python: str) -> dict[str, Any]:
    """Whether ebbtide and its dependencies import in ``python`` (a separate process)."""
    try:
        proc = subprocess.run(
            [python, "-c", EBBTIDE_PROBE], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "error": "importing ebbtide took over 60 s",
            "install": INSTALL_COMMAND,
        }
    if proc.returncode == 0:
        return {"ok": True, "version": proc.stdout.strip()}
    lines = proc.stderr.strip().splitlines()
    return {
        "ok": False,
        "error": lines[-1] if lines else f"exit {proc.returncode}",
        "install": INSTALL_COMMAND,
    }


def git_commit() -> str | None:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


# -- the GPU through NVML -----------------------------------------------------------------


class Gpu:
    """GPU 0 through ``pynvml``."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(0)

    def info(self) -> dict[str, Any]:
        nvml, h = self.nvml, self.handle

        def ask(fn: str, *args: Any) -> Any:
            try:
                value = getattr(nvml, fn)(*args)
            except Exception:
                return None
            return value.decode() if isinstance(value, bytes) else value

        mig = ask("nvmlDeviceGetMigMode", h)
        return {
            "name": ask("nvmlDeviceGetName", h),
            "uuid": ask("nvmlDeviceGetUUID", h),
            "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(h).total // _MIB_B),
            "count": nvml.nvmlDeviceGetCount(),
            "driver": ask("nvmlSystemGetDriverVersion"),
            "nvml": ask("nvmlSystemGetNVMLVersion"),
            "cuda_driver": ask("nvmlSystemGetCudaDriverVersion"),
            "mig_mode": None if mig is None else list(mig),
        }

    def used_mib(self) -> float:
        """The device's used memory in MiB (every process, and what the driver keeps)."""
        return float(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used) / _MIB_B

    def processes_mib(self) -> dict[int, float | None]:
        """pid → GPU memory in MiB (``None``: NVML can't say) of the compute processes."""
        listed = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        return {
            p.pid: None if p.usedGpuMemory is None else p.usedGpuMemory / _MIB_B for p in listed
        }


# -- processes ------------------------------------------------------------------------------


class Workload:
    """A ``gpu_workload.py online`` process: JSON lines in on stdin, out on stdout; its
    stderr goes to ``log``."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        self.log = log
        self._next_id = 0
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            with contextlib.suppress(ValueError):
                self.lines.put(json.loads(raw))
        self.lines.put(None)

    def send(self, cmd: dict[str, Any]) -> int:
        """Send a command; return its id (its answer carries it)."""
        assert self.proc.stdin is not None
        self._next_id += 1
        try:
            self.proc.stdin.write((json.dumps({"id": self._next_id, **cmd}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            raise PhaseError(f"the online process is gone: {tail(self.log, 600)}") from None
        return self._next_id

    def _take(self, line: dict[str, Any] | None) -> dict[str, Any]:
        if line is None:
            self.lines.put(None)  # stays closed for later calls
            raise PhaseError(f"the online process exited: {tail(self.log, 600)}")
        return line

    def reply(self, timeout_s: float, cmd_id: int | None = None) -> dict[str, Any]:
        """The next line (the answer to ``cmd_id``: older answers are dropped)."""
        give_up = time.monotonic() + timeout_s
        while True:
            try:
                line = self._take(self.lines.get(timeout=max(0.0, give_up - time.monotonic())))
            except queue.Empty:
                raise PhaseError(
                    f"the online process did not answer within {timeout_s:.0f}s"
                ) from None
            if cmd_id is None or line.get("id") == cmd_id:
                return line

    def poll_reply(self, cmd_id: int) -> dict[str, Any] | None:
        """The answer to ``cmd_id`` if it has come, else ``None`` (without waiting)."""
        while True:
            try:
                line = self._take(self.lines.get_nowait())
            except queue.Empty:
                return None
            if line.get("id") == cmd_id:
                return line

    def call(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        answer = self.reply(timeout_s, self.send(cmd))
        if "error" in answer:
            raise PhaseError(f"online process: {answer['error']}")
        return answer

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(PhaseError):
                self.send({"cmd": "quit"})
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


class Ebb:
    """The ``ebb`` command line against one ``EBBTIDE_HOME`` (in ``env``), and ``ebb up``
    itself, whose node is ``node`` and whose output goes to ``log``."""

    def __init__(self, python: str, env: dict[str, str], log: Path, node: str) -> None:
        self.python = python
        self.env = env
        self.log = log
        self.node = node
        self.up: subprocess.Popen[bytes] | None = None

    def json(self, *args: str) -> Any:
        command, rest = args[0], args[1:]
        try:
            proc = subprocess.run(
                [self.python, "-m", "ebbtide.cli.main", command, "--json", *rest],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise PhaseError(f"ebb {command} took over {CLI_TIMEOUT_S:g}s") from None
        if proc.returncode != 0:
            raise PhaseError(f"ebb {' '.join(args)}: exit {proc.returncode}: {proc.stderr[-600:]}")
        return json.loads(proc.stdout)

    def start(self, policy: Path, budget: Budget) -> list[dict[str, Any]]:
        """Start ``ebb up --headroom nvml`` and wait until its node reports its devices."""
        argv = [self.python, "-m", "ebbtide.cli.main", "up", "--headroom", "nvml"]
        argv += ["--node", self.node, "--policy", str(policy)]
        with open(self.log, "ab") as out:
            self.up = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        give_up = budget.give_up(EBB_UP_TIMEOUT_S)
        while time.monotonic() < give_up:
            if self.up.poll() is not None:
                raise PhaseError(f"ebb up exited {self.up.returncode}: {tail(self.log, 800)}")
            with contextlib.suppress(PhaseError):
                for node in self.json("nodes"):
                    if node["name"] == self.node and node["devices"]:
                        return list(node["devices"])
            time.sleep(0.5)
        raise PhaseError(f"ebb up: node {self.node} not up after {EBB_UP_TIMEOUT_S:g}s")

    def stop(self, grace_s: float) -> None:
        """Graceful first (running attempts are evicted within their deadline: give
        ``grace_s`` for it), then kill the process group."""
        if self.up is None:
            return
        if self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.up.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.up.wait(5)
