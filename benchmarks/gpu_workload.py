"""GPU workloads for ``benchmarks/gpu_check.py``: the online tenant and the offline jobs.

Each mode is a process of its own, started by ``gpu_check.py``:

- ``online``: an online inference server that ebbtide did not launch.  It holds
  ``--alloc-mib`` of GPU memory and runs kernels at a duty cycle, and answers JSON lines on
  stdin with JSON lines on stdout: ``{"cmd": "duty", "pct": P}`` (kernels P % of the
  time), ``{"cmd": "spike", "leave_mib": M}`` (allocate all free memory but M MiB at once:
  a new model loaded), ``{"cmd": "release"}`` (free the spike), ``{"cmd": "requests",
  "seconds", "rate_per_s", "burst", "gemms"}`` (serve a bursty request loop and return
  every latency) and ``{"cmd": "quit"}``.  Its first line is ``{"ready": true, ...}``.
- ``offline``: a checkpointable ebbtide job (``ebbtide.job``) that holds ``--alloc-mib``
  and runs kernels ``--duty-pct`` of the time; on the eviction warning it checkpoints and
  requeues.  ``gpu_check.py`` starts it below a bash wrapper, as users often do.
- ``harvest``: a training-like ebbtide job, chained matmuls flat out with a synchronise
  per step (like reading a loss), that logs its step count to a file four times a second.

The jobs write ``DIR/{mode}-{job}-{attempt}.json`` (pid, process group, memory) once their
memory is allocated and their kernels run.  PyTorch is used where it has CUDA (bf16
matmuls), else CuPy (fp16); with neither, a mode prints ``{"error": ..., "no_gpu": true}``
and exits :data:`NO_GPU_EXIT_CODE`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

_MIB_B = 1024 * 1024
#: Exit code of a mode that found no usable CUDA framework.
NO_GPU_EXIT_CODE = 3
#: Side of the square matrices of the online server's kernels (duty cycle and requests).
ONLINE_GEMM_N = 4096
#: Side of the square matrices of the harvest job's training-like steps.
HARVEST_GEMM_N = 8192
#: Matmuls per harvest step (one synchronise per step).
HARVEST_GEMMS_PER_STEP = 8
#: Period of the duty cycles, in seconds.
DUTY_PERIOD_S = 0.1
#: How often a job polls ``job.preempted()`` while idle in its duty cycle, in seconds.
POLL_S = 0.01
#: How often the harvest job logs its step count, in seconds.
PROGRESS_PERIOD_S = 0.25
#: Steps between periodic checkpoints of the jobs.
CHECKPOINT_EVERY_STEPS = 200


class NoGpu(Exception):
    """No CUDA framework with a usable GPU in this process."""


# -- the framework ------------------------------------------------------------------------


class TorchBackend:
    """PyTorch on ``cuda:0`` (bf16 matmuls)."""

    name = "torch"
    dtype = "bf16"

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise NoGpu(f"torch {torch.__version__}: CUDA is not available")
        self.torch = torch
        self.device = torch.device("cuda", 0)
        self.version = str(torch.__version__)
        self.cuda = str(torch.version.cuda)
        self._x: Any = None

    def device_name(self) -> str:
        return str(self.torch.cuda.get_device_name(self.device))

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes, as the CUDA driver sees it."""
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def alloc(self, nbytes: int) -> Any:
        """``nbytes`` of device memory (cudaMalloc commits it at once)."""
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def release(self) -> None:
        """Hand memory freed by dropped tensors back to the driver (and so to NVML)."""
        self.torch.cuda.empty_cache()

    def gemm_setup(self, n: int) -> None:
        t = self.torch
        self._x = t.randn(n, n, device=self.device, dtype=t.bfloat16)
        self._w = t.randn(n, n, device=self.device, dtype=t.bfloat16) / math.sqrt(n)
        self._y = t.empty_like(self._x)

    def gemms(self, count: int) -> None:
        """Queue ``count`` chained matmuls (values stay near unit scale)."""
        for _ in range(count):
            self.torch.matmul(self._x, self._w, out=self._y)
            self._x, self._y = self._y, self._x

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)


class CupyBackend:
    """CuPy on device 0 (fp16 matmuls: CuPy has no bf16)."""

    name = "cupy"
    dtype = "fp16"

    def __init__(self) -> None:
        import cupy

        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise NoGpu(f"cupy {cupy.__version__}: {exc}") from None
        if count < 1:
            raise NoGpu(f"cupy {cupy.__version__}: no CUDA device")
        self.cp = cupy
        self.version = str(cupy.__version__)
        self.cuda = str(cupy.cuda.runtime.runtimeGetVersion())
        cupy.cuda.Device(0).use()

    def device_name(self) -> str:
        name = self.cp.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def alloc(self, nbytes: int) -> Any:
        return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def release(self) -> None:
        self.cp.get_default_memory_pool().free_all_blocks()

    def gemm_setup(self, n: int) -> None:
        cp = self.cp
        self._x = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        w = cp.random.standard_normal((n, n), dtype=cp.float32) / math.sqrt(n)
        self._w = w.astype(cp.float16)
        self._y = cp.empty_like(self._x)

    def gemms(self, count: int) -> None:
        for _ in range(count):
            self.cp.matmul(self._x, self._w, out=self._y)
            self._x, self._y = self._y, self._x

    def sync(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()


Backend = TorchBackend | CupyBackend


def open_backend(framework: str = "auto") -> Backend:
    """PyTorch with CUDA if it can, else CuPy; :class:`NoGpu` naming why neither works."""
    why: list[str] = []
    kinds = [TorchBackend, CupyBackend]
    if framework != "auto":
        kinds = [k for k in kinds if k.name == framework]
    for kind in kinds:
        try:
            return kind()
        except ImportError as exc:
            why.append(f"{kind.name}: not installed ({exc})")
        except NoGpu as exc:
            why.append(str(exc))
        except Exception as exc:  # a broken CUDA install raises all sorts of things
            why.append(f"{kind.name}: {type(exc).__name__}: {exc}")
    raise NoGpu("no CUDA library: " + "; ".join(why or [f"unknown framework {framework!r}"]))


def describe(backend: Backend) -> dict[str, Any]:
    free, total = backend.mem_get_info()
    return {
        "framework": backend.name,
        "version": backend.version,
        "cuda": backend.cuda,
        "dtype": backend.dtype,
        "device": backend.device_name(),
        "memory_total_mib": round(total / _MIB_B),
        "memory_free_mib": round(free / _MIB_B),
    }


def duty_cycle(backend: Backend, pct: float, period_s: float = DUTY_PERIOD_S) -> float:
    """Run matmuls for ``pct`` % of one period (at least one when ``pct`` > 0); return the
    seconds left of the period."""
    started = time.perf_counter()
    if pct > 0:
        busy_s = period_s * pct / 100.0
        while True:
            backend.gemms(1)
            backend.sync()
            if time.perf_counter() - started >= busy_s:
                break
    return max(0.0, period_s - (time.perf_counter() - started))


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _write_json_atomically(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


# -- online -------------------------------------------------------------------------------


class OnlineServer:
    """The online tenant: memory, a duty cycle, spikes, and a bursty request loop."""

    def __init__(self, backend: Backend, alloc_mib: int, duty_pct: float) -> None:
        self.backend = backend
        self.duty_pct = duty_pct
        self.base = backend.alloc(alloc_mib * _MIB_B) if alloc_mib > 0 else None
        self.alloc_mib = alloc_mib
        backend.gemm_setup(ONLINE_GEMM_N)
        backend.gemms(2)  # load the matmul kernels before anything is timed
        backend.sync()
        self.spike: Any = None
        self._pending = b""

    def serve(self) -> None:
        fd = sys.stdin.fileno()
        _emit(
            {
                "ready": True,
                "pid": os.getpid(),
                "alloc_mib": self.alloc_mib,
                **describe(self.backend),
            }
        )
        while True:
            idle_s = duty_cycle(self.backend, self.duty_pct)
            readable, _, _ = select.select([fd], [], [], idle_s)
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return  # gpu_check went away
            self._pending += chunk
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                if line.strip() and not self.handle(json.loads(line)):
                    return

    def handle(self, cmd: dict[str, Any]) -> bool:
        """Run one command and answer it (with its ``id``); False to stop."""
        op = cmd.get("cmd")
        answer: dict[str, Any] = {"ok": True}
        try:
            if op == "duty":
                self.duty_pct = float(cmd["pct"])
            elif op == "spike":
                answer = self._spike(int(cmd.get("leave_mib", 2048)))
            elif op == "release":
                self.spike = None
                self.backend.release()
                free, _ = self.backend.mem_get_info()
                answer = {"released_at": time.time(), "memory_free_mib": round(free / _MIB_B)}
            elif op == "requests":
                answer = self._requests(cmd)
            elif op != "quit":
                answer = {"error": f"unknown command {op!r}"}
        except Exception as exc:  # answer, so gpu_check records it and goes on
            answer = {"error": f"{op}: {type(exc).__name__}: {exc}"}
        _emit({"id": cmd.get("id"), **answer})
        return op != "quit"

    def _spike(self, leave_mib: int) -> dict[str, Any]:
        if self.spike is not None:
            return {"error": "spike: already spiked"}
        free, _ = self.backend.mem_get_info()
        nbytes = free - leave_mib * _MIB_B
        if nbytes <= 0:
            return {"error": f"spike: only {free / _MIB_B:.0f} MiB free"}
        spike_at = time.time()
        self.spike = self.backend.alloc(nbytes)
        self.backend.sync()
        return {
            "spike_at": spike_at,
            "alloc_s": round(time.time() - spike_at, 6),
            "spike_mib": round(nbytes / _MIB_B),
        }

    def _requests(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """An open loop: ``burst`` requests arrive together every ``burst / rate_per_s``
        seconds; each is ``gemms`` matmuls and a synchronise, served one after another.
        Latency = done − arrival (queueing included); service = done − start."""
        seconds = float(cmd["seconds"])
        rate = float(cmd["rate_per_s"])
        burst = int(cmd["burst"])
        gemms = int(cmd["gemms"])
        period_s = burst / rate
        backend = self.backend
        for _ in range(3):  # warm-up, not timed
            backend.gemms(gemms)
            backend.sync()
        latency_ms: list[float] = []
        service_ms: list[float] = []
        late = 0
        started_at = time.time()
        t0 = time.perf_counter()
        arrival = t0
        while arrival < t0 + seconds:
            wait_s = arrival - time.perf_counter()
            if wait_s > 0:
                time.sleep(wait_s)
            elif arrival > t0:
                late += 1  # the previous burst ran past this one's arrival
            for _ in range(burst):
                start = time.perf_counter()
                backend.gemms(gemms)
                backend.sync()
                done = time.perf_counter()
                latency_ms.append(round((done - arrival) * 1000.0, 4))
                service_ms.append(round((done - start) * 1000.0, 4))
            arrival += period_s
        return {
            "started_at": started_at,
            "ended_at": time.time(),
            "latency_ms": latency_ms,
            "service_ms": service_ms,
            "late_bursts": late,
        }


def run_online(args: argparse.Namespace) -> int:
    backend = open_backend(args.framework)
    OnlineServer(backend, args.alloc_mib, args.duty_pct).serve()
    return 0


# -- offline jobs ---------------------------------------------------------------------------


def run_offline(args: argparse.Namespace) -> int:
    """Hold memory, run kernels ``--duty-pct`` of the time, checkpoint, requeue when warned."""
    import ebbtide.job as job  # first: the warning handler is in place before CUDA starts

    backend = open_backend(args.framework)
    state = job.restore({"steps": 0, "attempts": []})
    state["attempts"].append(job.attempt())
    hold = backend.alloc(args.alloc_mib * _MIB_B)
    backend.gemm_setup(ONLINE_GEMM_N)
    backend.gemms(1)
    backend.sync()
    _ready(args.dir, "offline", job, args.alloc_mib, backend)
    while True:
        idle_s = duty_cycle(backend, args.duty_pct)
        state["steps"] += 1
        if state["steps"] % CHECKPOINT_EVERY_STEPS == 0:
            job.checkpoint(state)
        idle_until = time.perf_counter() + idle_s
        while True:
            if job.preempted():
                job.checkpoint(state)
                print(f"warned after {state['steps']} steps: checkpointed, requeueing", flush=True)
                del hold
                job.requeue()
            left_s = idle_until - time.perf_counter()
            if left_s <= 0:
                break
            time.sleep(min(POLL_S, left_s))


def run_harvest(args: argparse.Namespace) -> int:
    """Training-like steps flat out; the step count goes to a file four times a second."""
    import ebbtide.job as job

    backend = open_backend(args.framework)
    state = job.restore({"steps": 0})
    hold = backend.alloc(args.alloc_mib * _MIB_B) if args.alloc_mib > 0 else None
    backend.gemm_setup(HARVEST_GEMM_N)
    backend.gemms(1)
    backend.sync()
    _ready(args.dir, "harvest", job, args.alloc_mib, backend)
    progress = Path(args.dir) / f"harvest-{job.job_id()}-{job.attempt()}.jsonl"
    steps = 0
    next_log = 0.0
    with open(progress, "a") as log:
        while True:
            backend.gemms(HARVEST_GEMMS_PER_STEP)
            backend.sync()
            steps += 1
            state["steps"] += 1
            now = time.perf_counter()
            if now >= next_log:
                log.write(json.dumps({"t": time.time(), "steps": steps}) + "\n")
                log.flush()
                next_log = now + PROGRESS_PERIOD_S
            if state["steps"] % (CHECKPOINT_EVERY_STEPS * 10) == 0:
                job.checkpoint(state)
            if job.preempted():
                log.write(json.dumps({"t": time.time(), "steps": steps}) + "\n")
                job.checkpoint(state)
                del hold
                job.requeue()


def _ready(directory: str, mode: str, job: Any, alloc_mib: int, backend: Backend) -> None:
    """Tell gpu_check this attempt holds its memory and runs kernels."""
    path = Path(directory) / f"{mode}-{job.job_id()}-{job.attempt()}.json"
    _write_json_atomically(
        path,
        {
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "ppid": os.getppid(),
            "job_id": job.job_id(),
            "attempt": job.attempt(),
            "alloc_mib": alloc_mib,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "framework": backend.name,
            "time": time.time(),
        },
    )
    print(f"{mode}: attempt {job.attempt()} ready, pid {os.getpid()}", flush=True)


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["online", "offline", "harvest"])
    p.add_argument("--framework", choices=["auto", "torch", "cupy"], default="auto")
    p.add_argument("--alloc-mib", type=int, default=0, help="GPU memory to hold (0)")
    p.add_argument("--duty-pct", type=float, default=0.0, help="kernels this %% of the time (0)")
    p.add_argument("--dir", default=".", help="where jobs write their ready and progress files")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = {"online": run_online, "offline": run_offline, "harvest": run_harvest}[args.mode]
    try:
        return run(args)
    except NoGpu as exc:
        _emit({"error": str(exc), "no_gpu": True})
        print(f"gpu_workload {args.mode}: {exc}", file=sys.stderr)
        return NO_GPU_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
