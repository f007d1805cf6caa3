"""What only a real NVIDIA GPU can show about ebbtide, measured in under five minutes.

Run on a machine with an NVIDIA GPU, its driver, ``pynvml`` (nvidia-ml-py), PyTorch or
CuPy, and ebbtide installed (``make gpu-check-wheels`` on a machine with a network, then
``python3 -m pip install --no-index --find-links .gpu-wheels ebbtide`` on the GPU
machine).  It measures GPU 0:

1. ``nvml_samples_per_s``: NVML's per-process utilisation (the source of ebbtide's
   per-process compute) called at 20 Hz for 5 s, with the timestamp last seen, while an
   online process runs kernels: calls per second, how many brought new samples, the
   driver's sample period, and what each NVML query the agent makes costs (wall time
   and CPU time per call, ``queries``: what ``agent_overhead.py --nvml-call-us`` assumes);
2. ``attribution_correct``: ``ebb up --headroom nvml`` in a temporary ``EBBTIDE_HOME``;
   an online process holds 8 GiB and runs kernels; an offline job (a bash wrapper whose
   python child holds 12 GiB, runs kernels and checkpoints with ``ebbtide.job``) is
   submitted with ``ebb qsub``; once it runs, the online memory ``ebb nodes --json``
   reports must be the online process's 8 GiB (± 1 GiB of CUDA context), not 20 GiB;
3. ``evict_latency_s``: the online process allocates all free memory but 2 GiB at once,
   so the offline slice no longer fits; from that moment (the online process's clock) to
   the slice being free: the ``evicted`` event's ``latency_s`` (from the agent's sample
   that saw the spike), its ``freed_at`` (from the spike itself), and independently until
   NVML no longer lists the offline process; repeated ``--evictions`` times (the job
   resumes from its checkpoint each time) as the budget allows;
4. ``online_latency_ms``: a bursty online request loop (50 requests/s in bursts of 5,
   each 8 chained 4096² matmuls and a synchronise) for 20 s alone, then 20 s while an
   ebbtide job harvests the GPU with training-like steps: p50 / p99 / max per phase, the
   p99 ratio, and the harvest job's steps per second (``harvest_steps_per_s``);
5. ``pause_drain_s``: ``null`` until the agent can pause a job.

Usage (from the repository root)::

    python3 benchmarks/gpu_check.py [--json] [--out FILE] [--budget-s 270] [--evictions 5]

Prints one JSON object with ``--json`` (a table without).  Without a GPU, NVML or a CUDA
framework it prints ``{"gpu": false, "reason": ...}`` and exits 0.  A phase that fails
records ``{"error": ...}`` under its key and the check goes on; the phases share
``--budget-s`` and every process and the temporary directory are removed at the end,
Ctrl-C included.  Beside it: ``gpu_workload.py`` (the GPU workloads, run as processes of
their own), ``gpu_check_procs.py`` (NVML, those processes, ``ebb``) and
``gpu_check_report.py`` (the figures and the table, pure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_procs import (  # sibling scripts, not a package
    INSTALL_COMMAND,
    Budget,
    Ebb,
    Gpu,
    PhaseError,
    Workload,
    git_commit,
    kill_marked,
    probe_ebbtide,
    probe_frameworks,
    probe_nvml,
    tail,
)
from gpu_check_report import (
    ATTRIBUTION_TOLERANCE_MIB,
    attribution_verdict,
    eviction_figures,
    latency_summary,
    nvml_sampling_figures,
    rate_in_window,
    ratio,
    render,
)

BENCHMARKS = Path(__file__).resolve().parent
WORKLOAD = BENCHMARKS / "gpu_workload.py"
#: Time for all phases together, in seconds (cleaning up comes within it).
DEFAULT_BUDGET_S = 270.0
#: Budget kept back for cleaning up (stopping ``ebb up`` evicts within the deadline), in s.
CLEANUP_RESERVE_S = 30.0
#: GPU memory of the online process, in MiB.
ONLINE_ALLOC_MIB = 8 * 1024
#: GPU memory the offline job's python child holds, in MiB.
OFFLINE_ALLOC_MIB = 12 * 1024
#: What the offline job asks ebbtide for.
OFFLINE_RESOURCES = "gpu=30%,gpumem=20GiB"
#: What the harvest job asks for, and the memory it holds, in MiB.
HARVEST_RESOURCES = "gpu=30%,gpumem=8GiB"
HARVEST_ALLOC_MIB = 2 * 1024
#: Eviction deadline of both jobs, in seconds.
DEADLINE_S = 10
#: The online process's duty cycle while NVML is sampled, and while sharing, in percent.
NVML_PHASE_DUTY_PCT = 50.0
SHARED_DUTY_PCT = 10.0
#: The offline job's duty cycle, in percent (below its 30 % slice).
OFFLINE_DUTY_PCT = 20.0
#: NVML sampling: rate in Hz and duration in seconds.
NVML_RATE_HZ = 20.0
NVML_SECONDS = 5.0
#: The spike leaves this much memory free, in MiB.
SPIKE_LEAVE_MIB = 2 * 1024
#: The online request loop: rate, burst size, matmuls per request, seconds per phase.
REQUEST_RATE_PER_S = 50.0
REQUEST_BURST = 5
REQUEST_GEMMS = 8
LATENCY_PHASE_S = 20.0
#: How long the harvest job runs alone before the second request loop, in seconds.
HARVEST_ALONE_S = 3.0
#: Online-memory readings from ``ebb nodes --json`` while the offline job runs.
ATTRIBUTION_READINGS = 3

#: How long the online process may take to start (CUDA, 8 GiB), in seconds.
ONLINE_START_TIMEOUT_S = 120.0
#: How long a job may take from submission to running with its memory, in seconds.
JOB_START_TIMEOUT_S = 90.0
#: After the deadline, how long to wait for an eviction to show, in seconds.
EVICT_GRACE_S = 15.0
#: A round of the eviction phase needs about this long (deadline, restart), in seconds.
EVICT_ROUND_NEED_S = 35.0
#: The NVML queries the node agent makes (``NvmlSource``), each timed in phase 1: wall
#: time and the calling thread's CPU time, which ``agent_overhead.py --nvml-call-us``
#: stands for (the first is called with a timestamp, the others with the handle alone).
PROCESS_UTILIZATION = "nvmlDeviceGetProcessUtilization"
TICK_QUERIES = (
    PROCESS_UTILIZATION,
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
#: Beside its two request loops, the latency phase needs about this long (harvest start), in s.
LATENCY_PHASE_EXTRA_S = HARVEST_ALONE_S + 40.0

NODE = "gpucheck"

#: The check's policy: no forecast warm-up surprises, and evicted jobs come back at once.
POLICY = f"""\
apiVersion: ebbtide/v1
defaults:
  margin_compute_pct: 5
  margin_memory_mib: 2GiB
  deadline_s: {DEADLINE_S}s
  eviction_cooldown_s: 1s
  backoff_base_s: 1s
  backoff_max_s: 2s
  forecast_warmup_s: 1h
  forecast_cold_compute_pct: 10
  forecast_cold_memory_mib: 2GiB
"""

#: The offline job as users often write one: a shell wrapper around the real work.
WRAPPER = """\
#!/bin/bash
# ebbtide launched this shell; the GPU memory belongs to its python child.  The trap keeps
# the shell alive through the eviction warning (every process of the attempt gets it)
# until the child has checkpointed and exited; the shell then exits with its code.
trap 'echo "wrapper: eviction warning" >&2' TERM
{command}
code=$?
exit $code
"""

# -- the check ------------------------------------------------------------------------------


class Check:
    """One run: the temporary directory, the processes, the phases and the result."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.python = sys.executable
        self.budget = Budget(args.budget_s, CLEANUP_RESERVE_S)
        self.result: dict[str, Any] = {"gpu": None}
        self.tmp = Path(tempfile.mkdtemp(prefix="ebbtide-gpu-check-"))
        self.ready_dir = self.tmp / "ready"
        self.ready_dir.mkdir()
        self.home = self.tmp / "home"
        self.gpu: Gpu | None = None
        self.online: Workload | None = None
        self.ebb: Ebb | None = None
        self.ebb_error: str | None = None
        self.online_pid = 0
        self.others_mib = 0.0
        self.pids_visible = True
        self.offline_job: int | None = None
        self.offline_attempt = 0
        self.jobs: list[int] = []
        #: in the environment of every process this check starts, and of their children
        self.marker = f"GPU_CHECK_RUN={self.tmp}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
        env.update(
            {
                "EBBTIDE_HOME": str(self.home),
                "PYTHONUNBUFFERED": "1",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's device 0 is NVML's device 0
                "GPU_CHECK_RUN": str(self.tmp),
            }
        )
        return env

    # -- the run ----------------------------------------------------------------------

    def run(self) -> None:
        r = self.result
        r["commit"] = git_commit()
        nvml, no_nvml = probe_nvml()
        frameworks, no_cuda = probe_frameworks()
        r["ebbtide"] = probe_ebbtide(self.python)
        if not r["ebbtide"]["ok"]:
            print(
                f"gpu_check: ebbtide does not import; install it: {INSTALL_COMMAND}",
                file=sys.stderr,
            )
        if no_nvml or no_cuda:
            r["gpu"] = False
            r["reason"] = "; ".join(w for w in (no_nvml, no_cuda) if w)
            if nvml is not None:
                nvml.nvmlShutdown()
            return
        self.gpu = Gpu(nvml)
        r["device"] = self.gpu.info()
        baseline = self.gpu.processes_mib()
        self.others_mib = sum(v or 0.0 for v in baseline.values())
        r["device"]["other_processes"] = len(baseline)
        r["device"]["other_processes_mib"] = round(self.others_mib)
        if not self._start_online(frameworks):
            return
        self.phase("nvml_samples_per_s", self.phase_nvml)
        if r["ebbtide"]["ok"]:
            self._start_ebb()
        else:
            self.ebb_error = f"ebbtide does not import ({r['ebbtide']['error']}); {INSTALL_COMMAND}"
        self.phase("attribution", self.phase_attribution)
        r["attribution_correct"] = r["attribution"].pop("correct", None)
        self.phase("evict_latency_s", self.phase_evictions)
        self.phase("online_latency_ms", self.phase_latency)
        r["harvest_steps_per_s"] = r["online_latency_ms"].get("harvest_steps_per_s")
        r["pause_drain_s"] = None
        r["pause_drain_note"] = "not measured: the node agent has no pause feature yet"

    def phase(self, key: str, fn: Any) -> None:
        try:
            self.result[key] = fn()
        except PhaseError as exc:
            self.result[key] = {"error": str(exc)}
        except Exception as exc:  # a bug in the check itself: record it and go on
            self.result[key] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"gpu_check: {key} done at {self.budget.elapsed():.0f}s", file=sys.stderr)

    def _start_online(self, frameworks: list[str]) -> bool:
        env = self.env()
        env["CUDA_VISIBLE_DEVICES"] = "0"
        args = ["online", "--alloc-mib", str(ONLINE_ALLOC_MIB)]
        args += ["--duty-pct", str(NVML_PHASE_DUTY_PCT)]
        argv = [self.python, str(WORKLOAD), *args]
        self.online = Workload(argv, env, self.tmp / "online.log")
        try:
            ready = self.online.reply(ONLINE_START_TIMEOUT_S)
        except PhaseError as exc:
            self.result["gpu"] = False
            self.result["reason"] = f"the online process did not start: {exc}"
            return False
        if "error" in ready:
            self.result["gpu"] = False
            self.result["reason"] = str(ready["error"])
            return False
        self.result["gpu"] = True
        self.online_pid = int(ready["pid"])
        self.result["framework"] = {
            k: ready.get(k) for k in ("framework", "version", "cuda", "dtype", "device")
        }
        self.result["framework"]["installed"] = frameworks
        return True

    def _start_ebb(self) -> None:
        self.home.mkdir()
        policy = self.tmp / "policy.yaml"
        policy.write_text(POLICY)
        self.ebb = Ebb(self.python, self.env(), self.tmp / "up.log", NODE)
        try:
            devices = self.ebb.start(policy, self.budget)
        except PhaseError as exc:
            self.ebb_error = str(exc)
            return
        self.result["ebbtide"]["devices"] = devices

    def latency_need_s(self) -> float:
        return 2 * self.args.latency_s + LATENCY_PHASE_EXTRA_S

    def need_time(self, seconds: float, what: str) -> None:
        if self.budget.left() < seconds:
            raise PhaseError(f"no time left in the budget for {what} ({seconds:.0f}s)")

    def need_ebb(self) -> Ebb:
        if self.ebb is None or self.ebb_error:
            raise PhaseError(f"ebb up is not running: {self.ebb_error}")
        return self.ebb

    # -- phase 1: NVML ------------------------------------------------------------------

    def phase_nvml(self) -> dict[str, Any]:
        assert self.gpu is not None
        nvml, handle = self.gpu.nvml, self.gpu.handle
        time.sleep(1.0)  # the duty cycle has run a while: there are samples to read
        last_us = 0
        with contextlib.suppress(nvml.NVMLError):  # skip the history from before
            last_us = max(
                (int(s.timeStamp) for s in nvml.nvmlDeviceGetProcessUtilization(handle, 0)),
                default=0,
            )
        calls = calls_with_new = new_samples = 0
        # what each query the agent makes costs: (wall, this thread's CPU) per call, s
        queries: dict[str, tuple[list[float], list[float]]] = {q: ([], []) for q in TICK_QUERIES}

        # each query but the first (timed with its samples), with the handle alone; then
        # the lists as the agent reads them (one call each), where ebbtide is here
        def asking(name: str) -> Callable[[], object]:
            return lambda: getattr(nvml, name)(handle)

        timed = {q: asking(q) for q in TICK_QUERIES[1:]}
        lists = _list_reader(nvml)
        if lists is not None:
            timed["ListReader.compute_processes"] = lambda: lists.compute_processes(handle)
            timed["ListReader.process_utilization"] = lambda: lists.process_utilization(
                handle, last_us
            )
        queries.update({q: ([], []) for q in timed if q not in queries})
        stamps: list[int] = []
        sm_util: list[float] = []
        util_lat: list[float] = []
        procs_lat: list[float] = []
        errors: Counter[str] = Counter()
        visible = False
        period_s = 1.0 / NVML_RATE_HZ
        started = time.monotonic()
        tick = started
        while time.monotonic() - started < NVML_SECONDS:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(handle, last_us)
            except nvml.NVMLError as exc:
                errors[f"{type(exc).__name__}: {exc}"] += 1
                samples = []
            util_lat.append(time.perf_counter() - t0)
            queries[PROCESS_UTILIZATION][1].append(time.thread_time() - c0)
            queries[PROCESS_UTILIZATION][0].append(util_lat[-1])
            for query, read in timed.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    read()
                except nvml.NVMLError as exc:
                    errors[f"{query}: {type(exc).__name__}: {exc}"] += 1
                queries[query][0].append(time.perf_counter() - t0)
                queries[query][1].append(time.thread_time() - c0)
            calls += 1
            fresh = [s for s in samples if int(s.timeStamp) > last_us and s.pid != 0]
            if fresh:
                calls_with_new += 1
                new_samples += len(fresh)
                last_us = max(int(s.timeStamp) for s in fresh)
                for s in fresh:
                    if s.pid == self.online_pid:
                        stamps.append(int(s.timeStamp))
                        sm_util.append(float(s.smUtil))
            t0 = time.perf_counter()
            procs = self.gpu.processes_mib()
            procs_lat.append(time.perf_counter() - t0)
            visible = visible or self.online_pid in procs
            tick += period_s
            time.sleep(max(0.0, tick - time.monotonic()))
        self.pids_visible = visible
        return nvml_sampling_figures(
            duration_s=time.monotonic() - started,
            calls=calls,
            calls_with_new=calls_with_new,
            new_samples=new_samples,
            stamps_us=sorted(set(stamps)),
            sm_util_pct=sm_util,
            util_latency_s=util_lat,
            procs_latency_s=procs_lat,
            errors=errors,
            pid_visible=visible,
            queries=queries,
        )

    # -- phase 2: attribution -------------------------------------------------------------

    def phase_attribution(self) -> dict[str, Any]:
        ebb = self.need_ebb()
        assert self.online is not None and self.gpu is not None
        self.online.call({"cmd": "duty", "pct": SHARED_DUTY_PCT}, 10)
        wrapper = self.tmp / "offline.sh"
        command = [self.python, str(WORKLOAD), "offline", "--alloc-mib", str(OFFLINE_ALLOC_MIB)]
        command += ["--duty-pct", str(OFFLINE_DUTY_PCT), "--dir", str(self.ready_dir)]
        wrapper.write_text(WRAPPER.format(command=shlex.join(command)))
        job_id = self.submit("gpucheck-offline", OFFLINE_RESOURCES, ["/bin/bash", str(wrapper)])
        self.offline_job = job_id
        ready = self.wait_running("offline", job_id, 1)
        self.offline_attempt = int(ready["attempt"])
        visible = ready.get("cuda_visible_devices")
        if visible not in (None, "0", self.result["device"].get("uuid")):
            raise PhaseError(
                f"the offline job runs on CUDA_VISIBLE_DEVICES={visible}, not on GPU 0 "
                "(a machine with more GPUs: measure with one)"
            )
        time.sleep(1.5)  # a heartbeat (every 0.5 s) with the child's memory in it
        readings = []
        for _ in range(ATTRIBUTION_READINGS):
            readings.append(self.reading(int(ready["pid"]), float(ready["time"])))
            time.sleep(0.5)
        # a reading counts if its sample was taken while the child held its memory
        valid = [
            x
            for x in readings
            if x["sampled_after_ready_s"] >= 0 and (x["offline_in_nvml"] or not self.pids_visible)
        ]
        if not valid:
            raise PhaseError(
                f"no reading sampled while the offline job's process held its memory: {readings}"
            )
        expected = ONLINE_ALLOC_MIB + self.others_mib
        online = [x["online_memory_mib"] for x in valid]
        evicted = [e for e in ebb.json("events", str(job_id)) if e["type"] == "evicted"]
        online_nvml = [x["nvml_online_pid_mib"] for x in valid if x["nvml_online_pid_mib"]]
        return {
            "correct": attribution_verdict(online, expected),
            "online_memory_mib": online,
            "expected_online_mib": round(expected),
            "tolerance_mib": ATTRIBUTION_TOLERANCE_MIB,
            "online_alloc_mib": ONLINE_ALLOC_MIB,
            "online_context_mib": round(online_nvml[0] - ONLINE_ALLOC_MIB) if online_nvml else None,
            "offline_alloc_mib": OFFLINE_ALLOC_MIB,
            "offline_pid": ready["pid"],
            "wrapper_pid": ready["ppid"],
            "job_id": job_id,
            "readings": readings,
            "evictions_meanwhile": [e.get("reason") for e in evicted],
        }

    def reading(self, offline_pid: int, ready_at: float) -> dict[str, Any]:
        """One ``ebb nodes`` reading of GPU 0, beside what NVML says of our processes."""
        assert self.gpu is not None and self.ebb is not None
        node = next((n for n in self.ebb.json("nodes") if n["name"] == NODE), None)
        if node is None:
            raise PhaseError(f"ebb nodes does not list {NODE}")
        dev = next(d for d in node["devices"] if d["index"] == 0)
        procs = self.gpu.processes_mib()
        out = {
            "online_memory_mib": round(float(dev["online_memory_mib"]), 1),
            "online_compute_pct": round(float(dev["online_compute_pct"]), 1),
            "sampled_after_ready_s": round(float(dev.get("sampled_at") or 0.0) - ready_at, 3),
            "offline_in_nvml": offline_pid in procs,
            "nvml_online_pid_mib": _round(procs.get(self.online_pid)),
            "nvml_offline_pid_mib": _round(procs.get(offline_pid)),
            "nvml_processes": len(procs),
            "nvml_device_used_mib": round(self.gpu.used_mib(), 1),
        }
        for key in ("offline_memory_mib", "offline_compute_pct", "basis"):
            if key in dev:  # newer agents say how they told online and offline apart
                out[key] = dev[key]
        return out

    # -- phase 3: evictions ---------------------------------------------------------------

    def phase_evictions(self) -> dict[str, Any]:
        ebb = self.need_ebb()
        if self.offline_job is None:
            raise PhaseError("no offline job: the attribution phase did not start one")
        rounds: list[dict[str, Any]] = []
        error = None
        while len(rounds) < self.args.evictions:
            if self.budget.left() < self.latency_need_s() + EVICT_ROUND_NEED_S:
                error = f"stopped after {len(rounds)} rounds: time budget"
                break
            try:
                ready = self.wait_running("offline", self.offline_job, self.offline_attempt)
                rounds.append(self.evict_once(ebb, ready))
            except PhaseError as exc:
                error = str(exc)
                break
            self.offline_attempt = int(ready["attempt"]) + 1
        if not rounds:
            raise PhaseError(error or "no eviction measured")
        out = eviction_figures(rounds, DEADLINE_S)
        if error:
            out["error"] = error
        out["rounds"] = rounds
        return out

    def evict_once(self, ebb: Ebb, ready: dict[str, Any]) -> dict[str, Any]:
        """One spike: its eviction seen by the agent (the event) and by NVML."""
        assert self.online is not None and self.gpu is not None and self.offline_job is not None
        pid, attempt = int(ready["pid"]), int(ready["attempt"])
        give_up = self.budget.give_up(DEADLINE_S + EVICT_GRACE_S)
        spike_id = self.online.send({"cmd": "spike", "leave_mib": SPIKE_LEAVE_MIB})
        try:
            spike = None
            gone_at = None
            while time.monotonic() < give_up:
                spike = spike or self.online.poll_reply(spike_id)
                if gone_at is None and self.pids_visible and pid not in self.gpu.processes_mib():
                    gone_at = time.time()
                if spike is not None and (gone_at is not None or not self.pids_visible):
                    break
                time.sleep(0.01)  # NVML at 100 Hz: enough, and light on the driver
            if spike is None:
                raise PhaseError("the online process did not answer the spike")
            if "error" in spike:
                raise PhaseError(f"online process: {spike['error']}")
            event = self.wait_evicted(ebb, self.offline_job, attempt, give_up)
        finally:
            with contextlib.suppress(PhaseError):
                self.online.call({"cmd": "release"}, 30)
        spike_at = float(spike["spike_at"])

        def since_spike(t: Any) -> float | None:
            return None if t is None else round(float(t) - spike_at, 4)

        return {
            "attempt": attempt,
            "spike_mib": spike["spike_mib"],
            "spike_alloc_s": spike["alloc_s"],
            "agent_latency_s": event.get("latency_s"),
            "external_s": since_spike(event.get("freed_at")),
            "agent_saw_spike_after_s": since_spike(event.get("spike_at")),
            "warned_after_s": since_spike(event.get("warned_at")),
            "nvml_free_s": since_spike(gone_at),
            # an eviction the agent decided before this spike was for something else
            "caused_by_spike": float(event.get("spike_at") or spike_at) >= spike_at - 0.05,
            "killed": event.get("killed"),
            "checkpointed": event.get("checkpointed"),
            "deadline_missed": event.get("deadline_missed"),
            "reason": event.get("reason"),
        }

    def wait_evicted(self, ebb: Ebb, job_id: int, attempt: int, give_up: float) -> dict[str, Any]:
        while True:
            for e in ebb.json("events", str(job_id)):
                if e["type"] == "evicted" and e.get("attempt") == attempt:
                    return e
            if time.monotonic() > give_up:
                job = ebb.json("qstat", "-f", str(job_id))
                raise PhaseError(
                    f"job {job_id} attempt {attempt} not evicted {DEADLINE_S + EVICT_GRACE_S:g}s "
                    f"after the spike: {job.get('state')}, {job.get('reason')}"
                )
            time.sleep(0.2)

    # -- phase 4: online latency ------------------------------------------------------------

    def phase_latency(self) -> dict[str, Any]:
        assert self.online is not None
        self.online.call({"cmd": "duty", "pct": 0}, 10)
        if self.offline_job is not None:
            self.cancel(self.offline_job)
        out: dict[str, Any] = {
            "config": {
                "rate_per_s": REQUEST_RATE_PER_S,
                "burst": REQUEST_BURST,
                "seconds": self.args.latency_s,
                "request": f"{REQUEST_GEMMS} chained 4096x4096 matmuls + synchronise",
            }
        }
        self.need_time(self.args.latency_s + 5, "the request loop alone")
        time.sleep(1.0)  # whatever the cancelled job was doing has settled
        alone = self.requests()
        out["alone"] = latency_summary(alone["latency_ms"], alone["service_ms"])
        out["alone"]["late_bursts"] = alone["late_bursts"]
        try:
            self.harvested(out)
        except PhaseError as exc:
            out["harvested"] = {"error": str(exc)}
        out["p99_ratio"] = ratio(
            (out.get("harvested") or {}).get("p99_ms"), out["alone"].get("p99_ms")
        )
        return out

    def harvested(self, out: dict[str, Any]) -> None:
        ebb = self.need_ebb()
        self.need_time(self.args.latency_s + HARVEST_ALONE_S + 15, "the harvested request loop")
        command = [self.python, str(WORKLOAD), "harvest", "--alloc-mib", str(HARVEST_ALLOC_MIB)]
        command += ["--dir", str(self.ready_dir)]
        job_id = self.submit("gpucheck-harvest", HARVEST_RESOURCES, command)
        try:
            self.wait_running("harvest", job_id, 1)
            time.sleep(0.5 + HARVEST_ALONE_S)
            now = time.time()
            out["harvest_alone_steps_per_s"] = round(
                rate_in_window(self.progress(job_id), now - HARVEST_ALONE_S, now), 2
            )
            self.need_time(self.args.latency_s + 5, "the harvested request loop")
            shared = self.requests()
            out["harvested"] = latency_summary(shared["latency_ms"], shared["service_ms"])
            out["harvested"]["late_bursts"] = shared["late_bursts"]
            window = (float(shared["started_at"]), float(shared["ended_at"]))
            out["harvest_steps_per_s"] = round(rate_in_window(self.progress(job_id), *window), 2)
            events = ebb.json("events", str(job_id))
            out["harvest_evictions"] = sum(e["type"] == "evicted" for e in events)
            out["harvest_eviction_reasons"] = [
                e.get("reason") for e in events if e["type"] == "evicted"
            ]
        finally:
            self.cancel(job_id)

    def requests(self) -> dict[str, Any]:
        assert self.online is not None
        cmd = {
            "cmd": "requests",
            "seconds": self.args.latency_s,
            "rate_per_s": REQUEST_RATE_PER_S,
            "burst": REQUEST_BURST,
            "gemms": REQUEST_GEMMS,
        }
        return self.online.call(cmd, self.args.latency_s + 60)

    def progress(self, job_id: int) -> list[list[tuple[float, float]]]:
        runs = []
        for path in sorted(self.ready_dir.glob(f"harvest-{job_id}-*.jsonl")):
            points = []
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError):
                    rec = json.loads(line)
                    points.append((float(rec["t"]), float(rec["steps"])))
            runs.append(sorted(points))
        return runs

    # -- jobs ---------------------------------------------------------------------------

    def submit(self, name: str, resources: str, command: list[str]) -> int:
        ebb = self.need_ebb()
        args = ["-N", name, "-l", resources, "--deadline", f"{DEADLINE_S}s", "--", *command]
        job_id = int(ebb.json("qsub", *args)["id"])
        self.jobs.append(job_id)
        return job_id

    def wait_running(self, mode: str, job_id: int, min_attempt: int) -> dict[str, Any]:
        """The ready file of the job's newest attempt (≥ ``min_attempt``) once it runs."""
        ebb = self.need_ebb()
        give_up = self.budget.give_up(JOB_START_TIMEOUT_S)
        while True:
            ready = self._newest_ready(mode, job_id)
            job = ebb.json("qstat", "-f", str(job_id))
            if job["state"] in ("succeeded", "failed", "cancelled"):
                raise PhaseError(
                    f"job {job_id} ended {job['state']} (exit {job.get('exit_code')}): "
                    f"{self._job_logs(job_id)}"
                )
            if (
                ready is not None
                and int(ready["attempt"]) >= min_attempt
                and job["state"] == "running"
                and int(job["attempts"]) == int(ready["attempt"])
            ):
                return ready
            if time.monotonic() >= give_up:
                break
            time.sleep(0.5)
        waited = "the time budget ran out" if self.budget.left() <= 0 else "timed out"
        raise PhaseError(
            f"job {job_id} attempt ≥ {min_attempt} not running ({waited}): {job['state']}, "
            f"{job.get('reason')!r}; {self._job_logs(job_id)}"
        )

    def _newest_ready(self, mode: str, job_id: int) -> dict[str, Any] | None:
        newest = None
        for path in self.ready_dir.glob(f"{mode}-{job_id}-*.json"):
            with contextlib.suppress(ValueError, OSError):
                ready = json.loads(path.read_text())
                if newest is None or ready["attempt"] > newest["attempt"]:
                    newest = ready
        return newest

    def _job_logs(self, job_id: int) -> str:
        attempts = sorted((self.home / "logs" / str(job_id)).glob("*"), key=lambda p: p.name)
        if not attempts:
            return "no log yet"
        last = attempts[-1]
        return f"attempt {last.name} stderr: {tail(last / 'stderr.log', 600)!r}"

    def cancel(self, job_id: int) -> None:
        """Cancel the job and wait until it has ended (evicted within its deadline)."""
        if self.ebb is None or self.ebb_error:
            return
        with contextlib.suppress(PhaseError):
            self.ebb.json("qdel", str(job_id))
        give_up = self.budget.give_up(DEADLINE_S + 5)  # else stopping ebb up ends it
        while time.monotonic() < give_up:
            with contextlib.suppress(PhaseError):
                if self.ebb.json("qstat", "-f", str(job_id))["state"] in (
                    "succeeded",
                    "failed",
                    "cancelled",
                ):
                    return
            time.sleep(0.3)

    # -- the end ------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop every process started here (their groups), then remove the directory."""
        failed = any(isinstance(v, dict) and "error" in v for v in self.result.values())
        if failed or self.ebb_error:
            self.result["logs"] = self._logs()
        if self.online is not None:
            self.online.stop()
        if self.ebb is not None:
            self.ebb.stop(grace_s=DEADLINE_S + 5)
        # what is still running now was left behind by a stopped ebb up: an orphan
        left = kill_marked(self.marker, grace_s=2.0)
        if left:
            self.result["orphans_killed"] = left
        if self.gpu is not None:
            with contextlib.suppress(Exception):
                self.gpu.nvml.nvmlShutdown()
        if self.args.keep:
            print(f"gpu_check: kept {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _logs(self) -> dict[str, str]:
        logs = {name: tail(self.tmp / name) for name in ("up.log", "online.log")}
        for job_id in self.jobs:
            for attempt in sorted((self.home / "logs" / str(job_id)).glob("*"))[-2:]:
                logs[f"job {job_id} attempt {attempt.name}"] = tail(attempt / "stderr.log", 800)
        return {k: v for k, v in logs.items() if v}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", type=Path, help="also write the JSON object to this file")
    p.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="time for everything (270)"
    )
    p.add_argument("--evictions", type=int, default=5, help="eviction rounds, budget allowing (5)")
    p.add_argument(
        "--latency-s", type=float, default=LATENCY_PHASE_S, help="each request loop, seconds (20)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and logs")
    args = p.parse_args(argv)
    if args.evictions < 1:
        p.error("--evictions must be at least 1")
    return args


def _list_reader(nvml: Any) -> Any:
    """The agent's one-call list reader over ``nvml``, where ebbtide is importable here
    (None where only this script and pynvml are: pynvml's wrappers are timed alone)."""
    try:
        from ebbtide.workers.headroom.nvml_lists import ListReader
    except ImportError:
        return None
    return ListReader(nvml)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    check = Check(args)
    try:
        check.run()
    except KeyboardInterrupt:
        check.result["interrupted"] = True
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # cleaning up must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        check.cleanup()
    result = check.result
    result["budget_s"] = args.budget_s
    result["elapsed_s"] = round(check.budget.elapsed(), 1)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(render(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
