"""``benchmarks/gpu_check.py`` without a GPU: what it says, and that it runs end to end.

- On this machine (no NVIDIA driver) it prints ``{"gpu": false, "reason": ...}`` and
  exits 0.
- On a simulated GPU (a ``pynvml`` and a ``torch`` written below into a temporary
  directory put first on ``PYTHONPATH``, sharing one registry of "GPU processes") every
  phase runs against a real ``ebb up --headroom nvml``: a check that the orchestration,
  the ``ebb`` commands it reads and the cleanup still work.  The figures mean nothing.
- The pure helpers of ``benchmarks/gpu_check_report.py``, table-driven.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.e2e.helpers import REPO

GPU_CHECK = REPO / "benchmarks" / "gpu_check.py"


def _load_report() -> ModuleType:
    """``benchmarks/gpu_check_report.py``: a script beside the others, not a package."""
    path = REPO / "benchmarks" / "gpu_check_report.py"
    spec = importlib.util.spec_from_file_location("gpu_check_report", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _load_report()


def _run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GPU_CHECK), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def _no_nvidia_driver() -> bool:
    return not any(Path(p).exists() for p in ("/dev/nvidiactl", "/proc/driver/nvidia"))


@pytest.mark.e2e
@pytest.mark.skipif(not _no_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_it_says_so_and_exits_0() -> None:
    proc = _run(["--json"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert result["gpu"] is False
    assert result["reason"].startswith("NVML: "), result
    assert result["ebbtide"]["ok"] is True


@pytest.mark.e2e
@pytest.mark.skipif(not _no_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_the_table_says_so() -> None:
    proc = _run([])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpu_check: no GPU measured: NVML: ")


# -- a simulated GPU ------------------------------------------------------------------------

REGISTRY = '''
"""The simulated GPU: one JSON file per process using it, in $SIMGPU_DIR."""
import json, os

DIR = os.environ["SIMGPU_DIR"]
TOTAL_B = 143771 * 1024 * 1024
CONTEXT_B = 512 * 1024 * 1024


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def processes():
    out = {}
    for name in os.listdir(DIR):
        if name.endswith(".json"):
            try:
                with open(os.path.join(DIR, name)) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                continue
            if alive(rec["pid"]):
                out[rec["pid"]] = rec
    return out


def used_b(rec):
    return rec["reserved_b"] + CONTEXT_B


def write(rec):
    path = os.path.join(DIR, f"{rec['pid']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(path + ".tmp", path)
'''

PYNVML = '''
"""pynvml on the simulated GPU; error classes and constants from the real module."""
import importlib.util, os, sys, time
import simgpu

_spec = importlib.util.spec_from_file_location("_real_pynvml", os.environ["REAL_PYNVML"])
_real = importlib.util.module_from_spec(_spec)
sys.modules["_real_pynvml"] = _real
_spec.loader.exec_module(_real)
NVMLError = _real.NVMLError
SAMPLE_US = 166_667


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i):
    if i != 0:
        raise _real.NVMLError_InvalidArgument()
    return _Obj(index=0)
def nvmlDeviceGetIndex(h): return 0
def nvmlDeviceGetName(h): return "Simulated H200"
def nvmlDeviceGetUUID(h): return "GPU-00000000-0000-0000-0000-000000000000"
def nvmlSystemGetDriverVersion(): return "simulated"
def nvmlDeviceGetMemoryInfo(h, version=None):
    used = sum(simgpu.used_b(p) for p in simgpu.processes().values())
    return _Obj(total=simgpu.TOTAL_B, used=used, free=simgpu.TOTAL_B - used)
def nvmlDeviceGetUtilizationRates(h):
    util = sum(p["util"] for p in simgpu.processes().values())
    return _Obj(gpu=min(100, round(util)), memory=0)
def nvmlDeviceGetComputeRunningProcesses(h):
    return [
        _Obj(pid=pid, usedGpuMemory=simgpu.used_b(p), gpuInstanceId=0xFFFFFFFF,
             computeInstanceId=0xFFFFFFFF)
        for pid, p in simgpu.processes().items()
    ]
def nvmlDeviceGetGraphicsRunningProcesses(h): return []
def nvmlDeviceGetProcessUtilization(h, since_us):
    now_us = int(time.time() * 1e6) // SAMPLE_US * SAMPLE_US
    out = [
        _Obj(pid=pid, timeStamp=now_us, smUtil=round(p["util"]), memUtil=0, encUtil=0, decUtil=0)
        for pid, p in simgpu.processes().items()
        if p["util"] > 0 and now_us > since_us
    ]
    if not out:
        raise _real.NVMLError_NotFound()
    return out


def __getattr__(name):
    if name.startswith("nvml"):  # anything else NVML has: not on this device
        def unsupported(*args, **kwargs):
            raise _real.NVMLError_NotSupported()
        return unsupported
    return getattr(_real, name)
'''

TORCH = '''
"""torch on the simulated GPU: just what benchmarks/gpu_workload.py uses."""
import os, time
import simgpu
from . import cuda, version

__version__ = "0.0+simulated"
uint8 = ("uint8", 1)
bfloat16 = ("bfloat16", 2)


class device:
    def __init__(self, kind, index=0):
        self.kind, self.index = kind, index


class _State:
    live_b = cached_b = 0
    pending_s = 0.0
    busy = []
    published = 0.0


S = _State()


def publish(force=False):
    now = time.time()
    if force or now - S.published > 0.05:
        S.busy = [(a, b) for a, b in S.busy if b > now - 1.0]
        busy_s = sum(b - max(a, now - 1.0) for a, b in S.busy)
        S.published = now
        simgpu.write({"pid": os.getpid(), "reserved_b": S.live_b + S.cached_b,
                      "util": 100.0 * min(1.0, busy_s)})


class Tensor:
    def __init__(self, nbytes, shape):
        others = sum(simgpu.used_b(p) for pid, p in simgpu.processes().items()
                     if pid != os.getpid())
        free = simgpu.TOTAL_B - others - simgpu.CONTEXT_B - S.live_b - S.cached_b
        reuse = min(S.cached_b, nbytes)
        if nbytes - reuse > free:
            raise cuda.OutOfMemoryError(f"cannot allocate {nbytes} bytes: {free} free")
        S.cached_b -= reuse
        S.live_b += nbytes
        self.nbytes, self.shape = nbytes, shape
        publish(force=True)

    def __del__(self):
        S.live_b -= self.nbytes
        S.cached_b += self.nbytes

    def __truediv__(self, other):
        return Tensor(self.nbytes, self.shape)


def empty(n, dtype=uint8, device=None): return Tensor(n * dtype[1], (n,))
def randn(*shape, device=None, dtype=bfloat16): return Tensor(shape[0] * shape[1] * dtype[1], shape)
def empty_like(x): return Tensor(x.nbytes, x.shape)
def matmul(a, b, out=None):
    S.pending_s += 0.2e-3 * (a.shape[0] / 4096) ** 3
    return out
'''

TORCH_CUDA = """
import time
import simgpu


class OutOfMemoryError(RuntimeError):
    pass


def is_available(): return True
def get_device_name(d=None): return "Simulated H200"
def mem_get_info(d=None):
    used = sum(simgpu.used_b(p) for p in simgpu.processes().values())
    return simgpu.TOTAL_B - used, simgpu.TOTAL_B
def synchronize(d=None):
    import torch
    if torch.S.pending_s > 0:
        start = time.time()
        time.sleep(torch.S.pending_s)
        torch.S.busy.append((start, time.time()))
        torch.S.pending_s = 0.0
    torch.publish()
def empty_cache():
    import torch
    torch.S.cached_b = 0
    torch.publish(force=True)
"""


def _simulated_gpu(tmp_path: Path) -> dict[str, str]:
    lib = tmp_path / "lib"
    (lib / "torch").mkdir(parents=True)
    (lib / "simgpu.py").write_text(REGISTRY)
    (lib / "pynvml.py").write_text(PYNVML)
    (lib / "torch" / "__init__.py").write_text(TORCH)
    (lib / "torch" / "cuda.py").write_text(TORCH_CUDA)
    (lib / "torch" / "version.py").write_text('cuda = "12.4+simulated"\n')
    (tmp_path / "gpu").mkdir()
    real = importlib.util.find_spec("pynvml")
    assert real is not None and real.origin is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env.update(
        {
            "PYTHONPATH": str(lib),
            "SIMGPU_DIR": str(tmp_path / "gpu"),
            "REAL_PYNVML": real.origin,
            "TMPDIR": str(tmp_path),
        }
    )
    return env


def _ours_running(env: dict[str, str]) -> list[int]:
    """Processes still running with this test's simulated GPU in their environment."""
    needle = f"SIMGPU_DIR={env['SIMGPU_DIR']}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.e2e
def test_every_phase_runs_on_a_simulated_gpu(tmp_path: Path) -> None:
    env = _simulated_gpu(tmp_path)
    out = tmp_path / "result.json"
    args = ["--json", "--evictions", "2", "--latency-s", "2", "--out", str(out)]
    proc = _run(args, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == result
    assert result["gpu"] is True, result
    errors = {k: v for k, v in result.items() if isinstance(v, dict) and "error" in v}
    assert not errors, (errors, result.get("logs"))

    assert result["framework"]["framework"] == "torch"
    assert result["nvml_samples_per_s"]["calls_per_s"] > 10
    assert result["nvml_samples_per_s"]["online_pid_visible"] is True
    # what each query the agent makes costs, wall and CPU (agent_overhead's figure)
    queries = result["nvml_samples_per_s"]["queries"]
    assert set(queries) == {
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        # the lists as the agent reads them (one call each over pynvml)
        "ListReader.compute_processes",
        "ListReader.process_utilization",
    }
    for q in queries.values():
        assert q["calls"] > 10 and q["wall_us_p50"] > 0 and q["cpu_us_mean"] is not None

    # the bash wrapper's python child holds the offline memory; ebbtide must not count it
    assert result["attribution_correct"] is True, result["attribution"]
    assert result["attribution"]["wrapper_pid"] != result["attribution"]["offline_pid"]

    ev = result["evict_latency_s"]
    assert ev["evictions"] == 2
    assert ev["checkpointed"] == 2 and ev["killed"] == 0 and ev["deadline_missed"] == 0
    assert [r["attempt"] for r in ev["rounds"]] == [1, 2]
    assert all(r["caused_by_spike"] for r in ev["rounds"])
    assert ev["agent_max_s"] < ev["deadline_s"]
    assert ev["nvml_free_max_s"] is not None

    lat = result["online_latency_ms"]
    assert lat["alone"]["requests"] > 0 and lat["harvested"]["requests"] > 0
    assert lat["p99_ratio"] is not None
    assert result["harvest_steps_per_s"] > 0
    assert lat["harvest_evictions"] == 0
    assert result["pause_drain_s"] is None and result["pause_drain_note"]

    assert "orphans_killed" not in result
    assert not _ours_running(env)
    assert not list(tmp_path.glob("ebbtide-gpu-check-*")), "the temporary directory is left"


# -- pure helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([5.0], 50, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 99, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
        (list(map(float, range(1, 101))), 99, 99.0),
        ([1.0, 2.0], 0, 1.0),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], p: float, expected: float) -> None:
    assert report.percentile(values, p) == expected


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        report.percentile([], 50)


@pytest.mark.parametrize(
    ("points", "t", "expected"),
    [
        ([], 5.0, 0.0),
        ([(10.0, 0.0), (20.0, 100.0)], 5.0, 0.0),  # before the first point: flat
        ([(10.0, 0.0), (20.0, 100.0)], 15.0, 50.0),
        ([(10.0, 0.0), (20.0, 100.0)], 25.0, 100.0),  # after the last: flat
        ([(10.0, 0.0), (10.0, 4.0), (20.0, 14.0)], 10.0, 0.0),
    ],
)
def test_steps_at_interpolates(
    points: list[tuple[float, float]], t: float, expected: float
) -> None:
    assert report.steps_at(points, t) == pytest.approx(expected)


def test_rate_in_window_sums_attempts_and_counts_downtime() -> None:
    first = [(0.0, 0.0), (4.0, 40.0)]  # 10 steps/s, evicted at t=4
    second = [(6.0, 0.0), (10.0, 40.0)]  # resumed at t=6, counts from 0 again
    assert report.rate_in_window([first, second], 0.0, 10.0) == pytest.approx(8.0)
    assert report.rate_in_window([first], 1.0, 3.0) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        report.rate_in_window([first], 3.0, 3.0)


@pytest.mark.parametrize(
    ("online", "expected_mib", "correct"),
    [
        ([8704.0, 8710.0], 8192.0, True),  # the online process and its CUDA context
        ([8192.0 + 1024.0], 8192.0, True),
        ([8704.0, 8704.0 + 12288.0], 8192.0, False),  # one reading counts the offline job
        ([7000.0], 8192.0, False),  # less than the online process holds is wrong too
    ],
)
def test_attribution_verdict(online: list[float], expected_mib: float, correct: bool) -> None:
    assert report.attribution_verdict(online, expected_mib) is correct


def test_eviction_figures_leave_out_rounds_the_spike_did_not_cause() -> None:
    rounds = [
        {
            "agent_latency_s": 0.2,
            "external_s": 0.3,
            "nvml_free_s": 0.35,
            "spike_alloc_s": 0.05,
            "killed": False,
            "checkpointed": True,
            "deadline_missed": False,
            "caused_by_spike": True,
        },
        {
            "agent_latency_s": 0.4,
            "external_s": 0.5,
            "nvml_free_s": None,
            "spike_alloc_s": 0.07,
            "killed": True,
            "checkpointed": False,
            "deadline_missed": False,
            "caused_by_spike": True,
        },
        {"agent_latency_s": 9.0, "external_s": -1.0, "caused_by_spike": False},
    ]
    f = report.eviction_figures(rounds, deadline_s=10)
    assert f["evictions"] == 2
    assert (f["agent_p50_s"], f["agent_max_s"]) == (0.2, 0.4)
    assert (f["external_p50_s"], f["external_max_s"]) == (0.3, 0.5)
    assert (f["nvml_free_p50_s"], f["nvml_free_max_s"]) == (0.35, 0.35)
    assert (f["killed"], f["checkpointed"], f["deadline_missed"]) == (1, 1, 0)
    empty = report.eviction_figures([], deadline_s=10)
    assert empty["evictions"] == 0 and empty["agent_p50_s"] is None


def test_latency_summary_and_ratio() -> None:
    s = report.latency_summary([float(v) for v in range(1, 101)], [1.0] * 100)
    assert (s["requests"], s["p50_ms"], s["p99_ms"], s["max_ms"]) == (100, 50.0, 99.0, 100.0)
    assert s["mean_ms"] == 50.5 and s["service_p99_ms"] == 1.0
    assert report.ratio(3.0, 2.0) == 1.5
    assert report.ratio(None, 2.0) is None and report.ratio(1.0, 0.0) is None
    with pytest.raises(ValueError):
        report.latency_summary([], [])


def test_nvml_sampling_figures() -> None:
    f = report.nvml_sampling_figures(
        duration_s=5.0,
        calls=100,
        calls_with_new=30,
        new_samples=31,
        stamps_us=[0, 166_000, 333_000, 500_000],
        sm_util_pct=[40.0, 50.0, 60.0],
        util_latency_s=[0.001] * 100,
        procs_latency_s=[0.0005] * 99 + [0.01],
        errors={"NVMLError_NotFound: Not Found": 70},
        pid_visible=True,
        queries={"nvmlDeviceGetMemoryInfo": ([20e-6] * 99 + [300e-6], [15e-6] * 50 + [5e-6] * 50)},
    )
    assert f["queries"] == {
        "nvmlDeviceGetMemoryInfo": {
            "calls": 100,
            "wall_us_p50": 20.0,
            "wall_us_p99": 20.0,
            "cpu_us_p50": 5.0,
            "cpu_us_mean": 10.0,
        }
    }
    assert (f["calls_per_s"], f["calls_with_new_samples_per_s"]) == (20.0, 6.0)
    assert f["sample_period_ms_p50"] == 167.0 and f["sample_period_ms_min"] == 166.0
    assert f["compute_processes_latency_ms_p50"] == 0.5
    assert f["compute_processes_latency_ms_max"] == 10.0
    assert f["online_sm_util_pct_p50"] == 50.0


def test_render_names_errors_and_the_verdict() -> None:
    no_gpu = {
        "gpu": False,
        "reason": "NVML: Driver Not Loaded",
        "ebbtide": {
            "ok": False,
            "error": "ModuleNotFoundError: No module named 'sqlmodel'",
            "install": "pip ...",
        },
    }
    lines = report.render(no_gpu)
    assert lines[0] == "gpu_check: no GPU measured: NVML: Driver Not Loaded"
    assert any("install ebbtide here: pip ..." in line for line in lines)

    r = {
        "gpu": True,
        "ebbtide": {"ok": True, "version": "0.1.0"},
        "attribution": {"online_memory_mib": [21000.0], "expected_online_mib": 8192},
        "attribution_correct": False,
        "evict_latency_s": {"error": "job 1 attempt 1 not evicted 25s after the spike"},
        "online_latency_ms": {
            "alone": {"p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 3.0},
            "harvested": {"error": "job 2 not running"},
        },
        "pause_drain_s": None,
        "pause_drain_note": "not measured",
    }
    text = "\n".join(report.render(r))
    assert "attribution: WRONG: online memory ebbtide reports 21000 MiB" in text
    assert "eviction: error: job 1 attempt 1 not evicted" in text
    assert "harvested  error: job 2 not running" in text
    assert "pause drain: not measured" in text
