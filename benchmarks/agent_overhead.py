"""What the node agent costs its node: CPU and memory of one ``NodeAgent`` on 8 GPUs with
16 attempts running, sampling at 20 Hz through NVML (a stand-in NVML whose calls cost what
real ones do).

The agent runs in a child process of this script, so that its CPU and memory are its own:

1. the child declares ``--gpus`` 80 GiB GPUs, each with an online tenant (a ``sleep``
   process listed on the GPU with 20 GiB and 30 % of the SMs), in a stand-in NVML
   (``--nvml``): by default ``stub``, the real nvidia-ml-py bindings over
   ``nvml_stub.c``, a stand-in ``libnvidia-ml.so.1`` this script compiles (``cc``; see
   ``nvml_stub.py``), so that pynvml's own Python (its ctypes structures and function
   pointers; the agent reads the lists through them in one call each, see
   ``ebbtide.workers.headroom.nvml_lists``) is the agent's, as on a GPU host; or
   ``fake``, the
   :class:`~ebbtide.workers.headroom.fake_nvml.FakeNvml` the tests use, whose own Python
   stands for pynvml's.  Then an :class:`~ebbtide.workers.headroom.nvml.NvmlSource` over
   it, a store (SQLite in a temporary directory; ``--db-url`` for another, e.g.
   PostgreSQL) and a :class:`~ebbtide.workers.agent.NodeAgent`, as the tests do;
2. it submits ``--attempts`` jobs and dispatches them round-robin over the GPUs through
   the store (then a ``start`` command to the agent; no scheduler).  Each runs
   ``examples/count.py``, one step every 0.5 s, a checkpoint and a progress line every
   10 steps, under its shim; once it runs, its process is listed on its GPU (6 GiB, 15 %
   of the SMs) as the driver would, so every sample attributes GPU use per process;
3. after ``--warmup-s`` (5) this script reads the child's CPU time (user + system, every
   thread; ``psutil``), waits ``--seconds`` (60) and reads it again: ``cpu_core_frac`` is
   CPU seconds over wall seconds.  With ``--windows N`` it does so N times one after the
   other and reports the figures of the median window (by ``cpu_core_frac``), every
   window's ``cpu_core_frac`` in ``cpu_core_frac_windows``.  ``rss_mib`` and ``threads``
   are read at the end of the window; ticks come from the agent's
   ``ebbtide_agent_samples`` counter, NVML calls from the stand-in's count (the stub
   counts the library's entry points, the fake pynvml's functions), and the CPU of
   each of the child's threads (the agent's loop, its store thread, the XID watcher, the
   idle main thread) from ``/proc``.  The attempts' shims are separate processes: their
   CPU is reported beside the agent's, not in it.

**What an NVML call costs** (``--nvml-call-us``, 100 by default).  The figure is an
assumption, not a measurement: NVIDIA's NVML reference gives no latency for its queries
(``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetUtilizationRates``,
``nvmlDeviceGetComputeRunningProcesses``, ``nvmlDeviceGetProcessUtilization``, ...), and
no published measurement of them was found (NVML's and DCGM's documentation, nvidia-ml-py,
the issue trackers of GPU monitoring tools; searched 2026-12); nearby figures are (see
benchmarks/README.md): RPCs to the GPU's system processor of 93–138 µs in a driver's
dump, ``cudaMemGetInfo`` at 7–12 µs on recent GPUs.  Each is an ioctl into the
driver, which passes it on to the GPU's system processor as an RPC where the driver runs
there (GSP: Hopper's default), and a process list grows with the processes;
``benchmarks/gpu_check.py`` measures each of them on a real GPU, wall and CPU time a
call (``queries`` in its phase 1; not run yet).  Each call into
the library takes at least that long: the stub's entry points spend it in C, on top of
pynvml's Python; the fake pads each of its functions, its own Python work included.  The
time is spent **busy** by default (``--nvml-wait busy``): a real call is mostly an ioctl,
kernel time that counts as the caller's CPU, and GSP RPCs are polled; busy overcounts what
part of a call a driver spends asleep.  ``--nvml-wait sleep`` undercounts instead (a call
then costs only its Python work).  The real ``libnvidia-ml.so`` mapped into the agent is
not in ``rss_mib`` (the stub is a few kilobytes).

**What NVML may cost** for the target to hold: ``own_core_frac`` is the agent's CPU less
its NVML calls' padded time (with ``--nvml-wait busy``), and ``nvml_break_even_us`` the
cost of a call at which the agent would spend exactly 2 % of a core with the calls it
made (0 when it is over even with free calls): set it beside ``gpu_check.py``'s figures.

``--profile``: a separate run with cProfile (CPU time of each thread,
``time.thread_time``) around every tick of the agent's loop and every step of its store
thread during the windows; prints the top 15 functions by cumulative and by own time.
Profiling slows everything down: its CPU figures are not the agent's.

Usage (from the repository root)::

    python benchmarks/agent_overhead.py [--gpus 8] [--attempts 16] [--seconds 60]
        [--windows 1] [--nvml stub|fake] [--nvml-call-us 100] [--nvml-wait busy|sleep]
        [--db-url URL]
        [--json] [--profile] [--check]

Prints the figures and whether the targets hold (the issue's: ≤ 2 % of one core and ≤ 100
MiB RSS, for 8 GPUs, 20 Hz, 16 attempts); with ``--json`` one JSON object with ``gpus``,
``attempts``, ``sample_hz``, ``cpu_core_frac``, ``cpu_per_tick_ms``, ``rss_mib``,
``threads``, ``own_core_frac``, ``nvml_break_even_us``, ``machine`` (where it ran, see
``bench_machine.py``) and more.  ``--check`` exits 1
unless the targets hold.  Measure on an idle machine: a busy one stretches ticks and
inflates every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import itertools
import json
import logging
import math
import os
import pstats
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import psutil
from bench_machine import cpu_model, machine

#: Targets (issue 15): the agent's CPU as a fraction of one core, and its resident memory.
TARGET_CPU_CORE_FRAC = 0.02
TARGET_RSS_MIB = 100.0
#: What one NVML call costs by default, in microseconds (an assumption: see the doc).
DEFAULT_NVML_CALL_US = 100.0
NODE = "bench"
OWNER = "bench"
REPO = Path(__file__).resolve().parents[1]
COUNT = REPO / "examples" / "count.py"
#: Each fake GPU, in MiB, and its online tenant: memory in MiB, SM share in percent.
GPU_MEMORY_MIB = 80 * 1024
RESERVED_MIB = 512  # what no process owns (the driver's, the contexts')
ONLINE_MEMORY_MIB = 20 * 1024
ONLINE_SM_PCT = 30.0
#: What each attempt's process uses of its GPU: memory in MiB, SM share in percent.
JOB_MEMORY_MIB = 6 * 1024
JOB_SM_PCT = 15.0
#: Each job's step in seconds, and steps between checkpoints (with a progress line).
JOB_STEP_S = 0.5
JOB_CHECKPOINT_EVERY = 10
#: How long the child may take to get every attempt running, and to leave, in seconds.
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
#: Functions the profile lists.
PROFILE_TOP = 15


# -- the child: the agent ------------------------------------------------------------------


class _Child:
    """The agent's process: a fake node, its agent, and a line protocol on stdin/stdout
    (``mark`` → counters; ``stop`` → shut down, then the profile if asked for)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ebbtide.queue.store import Store
        from ebbtide.workers.agent import NodeAgent
        from ebbtide.workers.headroom.fake_nvml import FakeNvml
        from ebbtide.workers.headroom.nvml import NvmlSource

        self.args = args
        self.home = Path(args.home)
        nvml: Any
        if args.nvml == "stub":  # pynvml itself, over a stand-in libnvidia-ml.so.1
            from nvml_stub import NvmlStub, StubUnavailable

            try:
                self.stub = NvmlStub.build(self.home / "nvml-stub")
            except StubUnavailable as exc:
                raise SystemExit(f"agent_overhead: {exc}; or run with --nvml fake") from None
            self.stub.reset(args.gpus, GPU_MEMORY_MIB, reserved_mib=RESERVED_MIB)
            self.stub.set_call_cost(args.nvml_call_us / 1e6, args.nvml_wait)
            import pynvml

            nvml = pynvml
            self.list_process, self.set_utilization = (
                self.stub.set_process,
                self.stub.set_utilization,
            )
            self.nvml_calls = self.stub.calls
        else:
            fake = FakeNvml(call_cost_s=args.nvml_call_us / 1e6, call_wait=args.nvml_wait)
            for _ in range(args.gpus):
                fake.add_device(
                    GPU_MEMORY_MIB, name="Fake H100 80GB HBM3", reserved_mib=RESERVED_MIB
                )
            nvml = fake
            self.list_process, self.set_utilization = fake.add_process, fake.set_utilization
            self.nvml_calls = lambda: dict(fake.calls)
        self.online: list[subprocess.Popen[bytes]] = []
        for gpu in range(args.gpus):
            tenant = subprocess.Popen(["sleep", "infinity"])
            self.online.append(tenant)
            self.list_process(gpu, tenant.pid, ONLINE_MEMORY_MIB, ONLINE_SM_PCT)
            self.set_utilization(gpu, ONLINE_SM_PCT)
        self.source = NvmlSource(nvml=nvml)
        self.store = Store(args.db_url or f"sqlite:///{self.home / 'ebbtide.db'}")
        self.agent = NodeAgent(NODE, self.store, self.source, home=self.home)
        self.profiles: dict[int, cProfile.Profile] = {}
        self.profiling = False
        if args.profile:
            self._wrap_for_profile()

    def _wrap_for_profile(self) -> None:
        """cProfile (thread CPU time) around each tick and each store step, while on."""
        lock = threading.Lock()

        def profiled(fn: Any) -> Any:
            def call() -> None:
                if not self.profiling:
                    fn()
                    return
                ident = threading.get_ident()
                with lock:
                    prof = self.profiles.setdefault(ident, cProfile.Profile(time.thread_time))
                prof.enable()
                try:
                    fn()
                finally:
                    prof.disable()

            return call

        self.agent.tick = profiled(self.agent.tick)  # type: ignore[method-assign]
        self.agent.sync._step = profiled(self.agent.sync._step)  # type: ignore[method-assign]

    def run(self) -> int:
        self.agent.start()
        try:
            ready = self._start_attempts()
            _say({"ready": True, **ready, "threads": _thread_names()})
            for line in sys.stdin:
                if line.strip() == "mark":
                    self.profiling = True  # from the first mark to the stop
                    _say(self._counters())
                elif line.strip() == "stop":
                    break
        finally:
            self.profiling = False
            self.agent.shutdown(timeout_s=30)
            self.source.close()
            self.store.close()
            for tenant in self.online:
                tenant.kill()
                tenant.wait()
        if self.profiles:
            stats = pstats.Stats(*self.profiles.values())
            stats.dump_stats(str(self.home / "profile.pstats"))
        _say({"stopped": True})
        return 0

    def _start_attempts(self) -> dict[str, Any]:
        from ebbtide.messaging.messages import StartAttempt
        from ebbtide.queue.spec import JobSpec
        from ebbtide.queue.states import JobState

        a = self.args
        per_gpu = math.ceil(a.attempts / a.gpus)
        compute_pct = min(20.0, 60.0 / per_gpu)  # online 30 % + slices + margins ≤ 100 %
        memory_mib = min(8192, (50 * 1024) // per_gpu)
        device_of: dict[int, int] = {}
        for k in range(a.attempts):
            spec = JobSpec(
                name=f"count-{k}",
                command=[
                    sys.executable,
                    str(COUNT),
                    str(10**9),
                    *("--step-s", f"{JOB_STEP_S:g}", "--every", str(JOB_CHECKPOINT_EVERY)),
                ],
                compute_pct=compute_pct,
                memory_mib=memory_mib,
                deadline_s=5.0,
            )
            (job_id,) = self.store.submit(spec, OWNER, defaults_deadline_s=5.0)
            device = k % a.gpus
            attempt = self.store.dispatch(
                job_id,
                expected_attempts=0,
                node=NODE,
                devices=(device,),
                compute_pct=compute_pct,
                memory_mib=memory_mib,
            )
            self.agent.command(StartAttempt(job_id=job_id, attempt=attempt))
            device_of[job_id] = device
        # as the driver: each attempt's process appears on its GPU once it runs
        listed: dict[int, int] = {}
        shims: dict[int, int] = {}
        give_up = time.monotonic() + READY_TIMEOUT_S
        while len(listed) < len(device_of) or any(
            self.store.get(j).state != JobState.RUNNING for j in device_of
        ):
            if time.monotonic() > give_up:
                raise SystemExit(
                    f"agent_overhead: {len(listed)} of {len(device_of)} attempts running "
                    f"after {READY_TIMEOUT_S:g}s; see {self.home}/logs"
                )
            for local in list(self.agent.attempts.values()):
                if local.job_id in listed:
                    continue
                with contextlib.suppress(psutil.Error):
                    kids = psutil.Process(local.handle.pid).children()
                    if kids:
                        gpu = device_of[local.job_id]
                        self.list_process(gpu, kids[0].pid, JOB_MEMORY_MIB, JOB_SM_PCT)
                        listed[local.job_id] = kids[0].pid
                        shims[local.job_id] = local.handle.pid
            time.sleep(0.05)
        for gpu in range(a.gpus):
            on_it = sum(1 for d in device_of.values() if d == gpu)
            self.set_utilization(gpu, min(100.0, ONLINE_SM_PCT + on_it * JOB_SM_PCT))
        return {
            "shims": sorted(shims.values()),
            "jobs": sorted(listed.values()),
            "slice_compute_pct": compute_pct,
            "slice_memory_mib": memory_mib,
        }

    def _counters(self) -> dict[str, Any]:
        samples = self.agent.metrics.registry.get_sample_value(
            "ebbtide_agent_samples_total", {"node": NODE}
        )
        return {
            "at": time.monotonic(),
            "ticks": int(samples or 0),
            "nvml_calls": sum((calls := self.nvml_calls()).values()),
            "nvml_by_call": calls,
            "running": len(self.agent.attempts),
        }


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _thread_names() -> dict[str, str]:
    return {str(t.native_id): t.name for t in threading.enumerate() if t.native_id}


# -- the parent: measuring ------------------------------------------------------------------


class _Lines:
    """The child's stdout, a JSON object a line, read with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def next(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise SystemExit(
                f"agent_overhead: no {what} from the agent after {timeout_s:g}s"
            ) from None
        if line is None:
            raise SystemExit(f"agent_overhead: the agent's process ended before {what}")
        return dict(json.loads(line))


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _threads_cpu_s(proc: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def _shims_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += _cpu_s(psutil.Process(pid))
    return total


class _Mark(NamedTuple):
    """What the parent reads at a window's edge: wall clock, the agent's CPU (all
    threads, and each thread), the shims' CPU, and the child's own counters."""

    wall: float
    cpu: float
    threads: dict[int, float]
    shims: float
    counters: dict[str, Any]


def measure(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--home", str(home)]
    argv += ["--gpus", str(args.gpus), "--attempts", str(args.attempts)]
    argv += ["--nvml", args.nvml, "--nvml-call-us", f"{args.nvml_call_us:g}"]
    argv += ["--nvml-wait", args.nvml_wait]
    argv += ["--db-url", args.db_url] if args.db_url else []
    argv += ["--profile"] if args.profile else []
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert child.stdin is not None
    lines = _Lines(child)
    try:
        ready = lines.next(READY_TIMEOUT_S + 30, "word that every attempt runs")
        proc = psutil.Process(child.pid)
        time.sleep(args.warmup_s)

        def mark() -> _Mark:
            cpu, threads, shims = _cpu_s(proc), _threads_cpu_s(proc), _shims_cpu_s(ready["shims"])
            assert child.stdin is not None
            child.stdin.write("mark\n")
            child.stdin.flush()
            return _Mark(time.monotonic(), cpu, threads, shims, lines.next(30, "counters"))

        marks = [mark()]
        for _ in range(args.windows):
            time.sleep(args.seconds)
            marks.append(mark())
        memory = proc.memory_info()
        thread_count = proc.num_threads()
        child.stdin.write("stop\n")
        child.stdin.flush()
        lines.next(STOP_TIMEOUT_S, "word that the agent stopped")
        child.wait(STOP_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    windows = [_window(args, ready["threads"], a, b) for a, b in itertools.pairwise(marks)]
    # the median window's figures (by the agent's CPU): one slow or busy moment on the
    # machine moves the spread, not the figure
    median = sorted(windows, key=lambda w: w["cpu_core_frac"])[(len(windows) - 1) // 2]
    result: dict[str, Any] = {
        "gpus": args.gpus,
        "attempts": args.attempts,
        **median,
        "windows": len(windows),
        "cpu_core_frac_windows": [w["cpu_core_frac"] for w in windows],
        "rss_mib": round(memory.rss / 2**20, 1),
        "threads": thread_count,
        "nvml": args.nvml,
        "nvml_call_us": args.nvml_call_us,
        "nvml_wait": args.nvml_wait,
        "store": "postgresql" if (args.db_url or "").startswith("postgres") else "sqlite",
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "profiled": bool(args.profile),
        "targets": {"cpu_core_frac": TARGET_CPU_CORE_FRAC, "rss_mib": TARGET_RSS_MIB},
    }
    result["targets"]["cpu_met"] = result["cpu_core_frac"] <= TARGET_CPU_CORE_FRAC
    result["targets"]["rss_met"] = result["rss_mib"] <= TARGET_RSS_MIB
    profile = home / "profile.pstats"
    if profile.exists():
        result["profile"] = _profile_text(profile)
    return result


def _window(args: argparse.Namespace, names: dict[str, str], a: _Mark, b: _Mark) -> dict[str, Any]:
    """One window's figures, from the marks at its edges."""
    wall_s = b.wall - a.wall
    ticks = b.counters["ticks"] - a.counters["ticks"]
    nvml_calls = b.counters["nvml_calls"] - a.counters["nvml_calls"]
    cpu_s = b.cpu - a.cpu
    by_thread: dict[str, float] = {}
    for tid, spent in b.threads.items():
        name = names.get(str(tid), "other")
        for prefix, short in (("agent-", "loop"), ("store-", "store"), ("ebbtide-xid", "xid")):
            if name.startswith(prefix):
                name = short
        by_thread[name] = by_thread.get(name, 0.0) + spent - a.threads.get(tid, 0.0)
    nvml_busy_s = nvml_calls * args.nvml_call_us / 1e6 if args.nvml_wait == "busy" else 0.0
    # the agent's CPU but for its NVML calls' padded time, and the cost of a call at which
    # the agent would spend exactly the target (0 when it is over even with free calls)
    own_frac = max(0.0, cpu_s - nvml_busy_s) / wall_s
    calls_per_s = nvml_calls / wall_s
    spare_frac = max(0.0, TARGET_CPU_CORE_FRAC - own_frac)
    break_even_us = round(spare_frac / calls_per_s * 1e6, 1) if calls_per_s else None
    return {
        "running": b.counters["running"],
        "seconds": round(wall_s, 2),
        "sample_hz": round(ticks / wall_s, 2),
        "cpu_core_frac": round(cpu_s / wall_s, 4),
        "cpu_per_tick_ms": round(1000 * cpu_s / max(1, ticks), 3),
        "threads_cpu_core_frac": {k: round(v / wall_s, 4) for k, v in sorted(by_thread.items())},
        "nvml_calls_per_tick": round(nvml_calls / max(1, ticks), 1),
        "nvml_by_call_per_tick": {
            k: round((v - a.counters["nvml_by_call"].get(k, 0)) / max(1, ticks), 2)
            for k, v in sorted(b.counters["nvml_by_call"].items())
            if v - a.counters["nvml_by_call"].get(k, 0) > 0
        },
        "nvml_floor_core_frac": round(nvml_busy_s / wall_s, 4),
        "own_core_frac": round(own_frac, 4),
        "nvml_break_even_us": break_even_us,
        "shims_cpu_core_frac": round((b.shims - a.shims) / wall_s, 4),
    }


def _profile_text(path: Path) -> str:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out).strip_dirs()
    out.write("by cumulative CPU time:\n")
    stats.sort_stats("cumulative").print_stats(PROFILE_TOP)
    out.write("by own CPU time:\n")
    stats.sort_stats("tottime").print_stats(PROFILE_TOP)
    out.write("what a tick of the loop, a step of the store thread and a sample of one GPU call:\n")
    stats.sort_stats("cumulative").print_callees(r"\((tick|_step|_sample_gpu)\)$")
    return out.getvalue()


_NVML_TEXT = {"stub": "pynvml over nvml_stub.c", "fake": "FakeNvml"}


def _short(call: str) -> str:
    """``nvmlDeviceGetMemoryInfo`` → ``GetMemoryInfo``."""
    return call.removeprefix("nvml").removeprefix("Device")


def _windows_text(r: dict[str, Any]) -> str:
    if r["windows"] == 1:
        return f"{r['seconds']:g}s window"
    spread = ", ".join(f"{100 * f:.2f}" for f in r["cpu_core_frac_windows"])
    return f"median of {r['windows']} {r['seconds']:g}s windows (agent CPU {spread} %)"


def print_summary(r: dict[str, Any]) -> None:
    t = r["targets"]
    print(
        f"agent_overhead: {r['gpus']} GPUs, {r['attempts']} attempts ({r['running']} running), "
        f"{_windows_text(r)}, {r['store']}, NVML {_NVML_TEXT[r['nvml']]}, a call "
        f"{r['nvml_call_us']:g} µs ({r['nvml_wait']}), {r['cpus']} CPUs ({cpu_model()}), "
        f"load {r['load_avg_1m']:g}"
        + (" — PROFILED: CPU figures inflated" if r["profiled"] else "")
    )
    print(
        f"  ticks {r['sample_hz']:g} Hz; agent CPU {100 * r['cpu_core_frac']:.2f} % of a core, "
        f"{r['cpu_per_tick_ms']:.3f} ms per tick; RSS {r['rss_mib']:g} MiB; "
        f"{r['threads']} threads"
    )
    threads = ", ".join(f"{k} {100 * v:.2f} %" for k, v in r["threads_cpu_core_frac"].items())
    print(f"  by thread: {threads}")
    print(
        f"  NVML: {r['nvml_calls_per_tick']:g} calls per tick "
        f"({', '.join(f'{_short(k)} {v:g}' for k, v in r['nvml_by_call_per_tick'].items())}); "
        f"their padded time {100 * r['nvml_floor_core_frac']:.2f} % of a core"
    )
    own, even, target = 100 * r["own_core_frac"], r["nvml_break_even_us"], TARGET_CPU_CORE_FRAC
    if even is None:
        verdict = "no NVML calls were made"
    elif even > 0:
        verdict = f"{100 * target:g} % holds while a call costs ≤ {even:g} µs"
    else:
        verdict = f"over {100 * target:g} % even with free calls"
    print(f"  without NVML's time: {own:.2f} % of a core; {verdict}")
    shims = 100 * r["shims_cpu_core_frac"]
    print(f"  the attempts' shims (not in the agent's figures): {shims:.2f} % of a core")
    cpu = "met" if t["cpu_met"] else "NOT met"
    rss = "met" if t["rss_met"] else "NOT met"
    print(
        f"  targets: CPU ≤ {100 * TARGET_CPU_CORE_FRAC:g} % of one core: {cpu}; "
        f"RSS ≤ {TARGET_RSS_MIB:g} MiB: {rss}"
    )
    if "profile" in r:
        print(r["profile"])


# -- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=8, help="fake GPUs (8)")
    p.add_argument("--attempts", type=int, default=16, help="attempts running (16)")
    p.add_argument("--seconds", type=float, default=60.0, help="measured window (60)")
    p.add_argument("--warmup-s", type=float, default=5.0, help="before the window (5)")
    p.add_argument(
        "--windows",
        type=int,
        default=1,
        help="windows of --seconds one after the other; the median one's figures (1)",
    )
    p.add_argument(
        "--nvml",
        choices=("stub", "fake"),
        default="stub",
        help="what the agent's NVML is: pynvml over a stand-in libnvidia-ml.so.1 built "
        "from nvml_stub.c (needs a C compiler), or the Python FakeNvml (stub)",
    )
    p.add_argument(
        "--nvml-call-us",
        type=float,
        default=DEFAULT_NVML_CALL_US,
        help=f"what one NVML call costs, in µs ({DEFAULT_NVML_CALL_US:g})",
    )
    p.add_argument(
        "--nvml-wait",
        choices=("busy", "sleep"),
        default="busy",
        help="spend a call's cost busy (CPU, as an ioctl) or asleep (busy)",
    )
    p.add_argument("--db-url", help="store URL (default: SQLite in a temporary directory)")
    p.add_argument("--profile", action="store_true", help="cProfile the windows (separate run)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the targets hold")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--home", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.gpus < 1 or args.attempts < 1:
        p.error("--gpus and --attempts must be at least 1")
    if args.attempts > 7 * args.gpus:
        p.error("at most 7 attempts per GPU fit beside the online tenant")
    if args.seconds <= 0 or args.warmup_s < 0 or args.nvml_call_us < 0:
        p.error("--seconds must be positive, --warmup-s and --nvml-call-us not negative")
    if args.windows < 1:
        p.error("--windows must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    if args.child:
        return _Child(args).run()
    home = Path(tempfile.mkdtemp(prefix="ebbtide-agent-overhead-"))
    try:
        result = measure(args, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps({**result, "machine": machine()}))
    else:
        print_summary(result)
    met = result["targets"]["cpu_met"] and result["targets"]["rss_met"]
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
