"""``NvmlSource`` over the real nvidia-ml-py bindings, on ``benchmarks/nvml_stub.c`` (a
stand-in ``libnvidia-ml.so.1``): the samples are those it makes over ``FakeNvml`` for the
same machine, so the fake the rest of the suite uses answers as pynvml's own ctypes
structures, process lists and per-process samples do.

Each case runs in a child process: once loaded, the stub is the process's NVML, and the
other tests expect pynvml to find none.  Needs a C compiler (skips without one, fails
without one when ``CI=true``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI

REPO = Path(__file__).resolve().parents[2]
GIB = 1024

CHILD = textwrap.dedent(
    """
    import dataclasses, json, sys, time
    from pathlib import Path

    sys.path.insert(0, sys.argv[1])
    from nvml_stub import NvmlStub

    stub = NvmlStub.build(Path(sys.argv[2]))
    import pynvml

    from ebbtide.workers.headroom.base import KnownPids
    from ebbtide.workers.headroom.fake_nvml import FakeNvml
    from ebbtide.workers.headroom.nvml import NvmlSource

    case = json.loads(sys.argv[3])
    fake = FakeNvml()
    stub.reset(case["gpus"], case["memory_mib"], reserved_mib=case["reserved_mib"])
    for _ in range(case["gpus"]):
        fake.add_device(case["memory_mib"], reserved_mib=case["reserved_mib"])
    for gpu, pct in enumerate(case["utilization"]):
        stub.set_utilization(gpu, pct)
        fake.set_utilization(gpu, pct)
    for gpu, pid, memory_mib, sm in case["processes"]:
        stub.set_process(gpu, pid, memory_mib, sm)
        fake.add_process(gpu, pid, memory_mib=memory_mib, sm_util=sm)
    offline = KnownPids({int(k): v for k, v in case["owners"].items()})
    out = {}
    for name, nvml in (("stub", pynvml), ("fake", fake)):
        source = NvmlSource(nvml=nvml, utilization_period_s=0, process_list_period_s=0)
        try:
            began = time.perf_counter()
            samples = source.sample(time.time(), offline)
            took = time.perf_counter() - began
            if name == "stub" and case.get("call_cost_s"):
                stub.set_call_cost(case["call_cost_s"])
                def sampling_calls():  # not the XID watcher's waits, in its own thread
                    calls = stub.calls()
                    return sum(calls.values()) - calls.get("nvmlEventSetWait_v2", 0)

                before = sampling_calls()
                began = time.perf_counter()
                source.sample(time.time(), offline)
                took = time.perf_counter() - began
                out["costly_calls"] = sampling_calls() - before
                stub.set_call_cost(0)
            if name == "stub" and case.get("again"):  # what the same sample calls again
                again = []
                for _ in range(case["again"]):
                    before = stub.calls()
                    samples = source.sample(time.time(), offline)
                    after = stub.calls()
                    moved = {k: n - before.get(k, 0) for k, n in after.items()}
                    again.append({k: n for k, n in moved.items() if n})
                    again[-1].pop("nvmlEventSetWait_v2", None)
                out["again_calls"] = again
            out[name] = {
                "devices": [dataclasses.asdict(d) for d in source.devices()],
                "samples": [
                    {k: v for k, v in dataclasses.asdict(s).items() if k != "time"}
                    for s in samples
                ],
                "watching_xids": source.watching_xids,
                "took_s": took,
            }
        finally:
            source.close()
    out["calls"] = stub.calls()
    print(json.dumps(out))
    """
)


def _compiler() -> None:
    compiler = shlex.split(os.environ.get("CC") or "cc")
    if compiler and shutil.which(compiler[0]):
        return
    message = "no C compiler (cc) to build benchmarks/nvml_stub.c"
    if IN_CI:
        pytest.fail(f"{message}; CI=true requires it", pytrace=False)
    pytest.skip(message)


def _run(tmp_path: Path, case: dict[str, Any]) -> dict[str, Any]:
    _compiler()
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run(
        [sys.executable, str(script), str(REPO / "benchmarks"), str(tmp_path), json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _case(**changes: Any) -> dict[str, Any]:
    case: dict[str, Any] = {
        "gpus": 2,
        "memory_mib": 80 * GIB,
        "reserved_mib": 512,
        "utilization": [60, 15],
        # online 20 GiB at 30 % and a job's 6 GiB at 15 % on GPU 0; a job alone on GPU 1
        "processes": [[0, 4242, 20 * GIB, 30], [0, 5001, 6 * GIB, 15], [1, 5002, 6 * GIB, 15]],
        "owners": {"5001": 1, "5002": 2},
    }
    return {**case, **changes}


def test_samples_over_pynvml_are_those_over_the_fake(tmp_path: Path) -> None:
    out = _run(tmp_path, _case())
    stub, fake = out["stub"], out["fake"]
    assert stub["samples"] == fake["samples"]
    first, second = stub["samples"]
    assert first["online_pids"] == [4242] and first["online_memory_mib"] == 20 * GIB
    assert [u["job_id"] for u in first["offline_jobs"]] == [1]
    assert second["online_pids"] == [] and [u["job_id"] for u in second["offline_jobs"]] == [2]
    # the devices as NVML names them: only the name and the UUID are the stub's own
    strip = [{k: v for k, v in d.items() if k not in ("name", "uuid")} for d in stub["devices"]]
    assert strip == [
        {k: v for k, v in d.items() if k not in ("name", "uuid")} for d in fake["devices"]
    ]
    assert [d["memory_mib"] for d in stub["devices"]] == [80 * GIB, 80 * GIB]
    assert stub["watching_xids"] is True  # XID events registered on each GPU
    # pynvml's own calls reached the library: the process lists by their _v3 entry point
    calls = out["calls"]
    assert calls["nvmlDeviceGetMemoryInfo"] >= 2
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] >= 2
    assert calls["nvmlDeviceGetProcessUtilization"] >= 2
    assert calls["nvmlInitWithFlags"] == calls["nvmlShutdown"] == 1


def test_an_idle_machine_and_a_full_one(tmp_path: Path) -> None:
    """No process at all (NVML's empty lists: SUCCESS with no entry, per-process samples
    NOT_FOUND), and a long list (INSUFFICIENT_SIZE first, as pynvml asks for the size)."""
    idle = _run(tmp_path / "idle", _case(processes=[], owners={}, utilization=[0, 0]))
    assert idle["stub"]["samples"] == idle["fake"]["samples"]
    assert all(s["online_pids"] == [] for s in idle["stub"]["samples"])
    many = [[0, 6000 + k, 1 * GIB, 1] for k in range(40)]
    full = _run(
        tmp_path / "full",
        _case(processes=many, owners={str(6000 + k): 100 + k for k in range(0, 40, 2)}),
    )
    assert full["stub"]["samples"] == full["fake"]["samples"]
    assert len(full["stub"]["samples"][0]["online_pids"]) == 20


def test_a_call_costs_what_the_stub_is_told(tmp_path: Path) -> None:
    out = _run(tmp_path, _case(call_cost_s=0.002))
    assert out["costly_calls"] > 0
    assert out["stub"]["took_s"] >= out["costly_calls"] * 0.002


def test_a_list_is_read_in_one_call_once_its_array_holds_it(tmp_path: Path) -> None:
    """pynvml's wrappers ask for every list twice (its size, then its entries): over a
    GSP driver each call is a round trip to the GPU.  The source keeps an array per query
    and calls once; a list that outgrew it (40 processes, an array of 8 at first) takes a
    second call that once, and one call from then on."""
    many = [[0, 6000 + k, 1 * GIB, 1] for k in range(40)]
    out = _run(
        tmp_path,
        _case(
            processes=[*many, [1, 5002, 6 * GIB, 15]],
            owners={str(6000 + k): 100 + k for k in range(0, 40, 2)} | {"5002": 2},
            again=2,
        ),
    )
    assert out["stub"]["samples"] == out["fake"]["samples"]
    one_each = {
        "nvmlDeviceGetMemoryInfo": 2,
        "nvmlDeviceGetUtilizationRates": 2,
        "nvmlDeviceGetComputeRunningProcesses_v3": 2,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 2,
        "nvmlDeviceGetProcessUtilization": 2,
    }
    assert out["again_calls"] == [one_each, one_each]
    # the first sample: GPU 0's 40 processes and 40 SM samples outgrew the first arrays
    first = out["calls"]
    assert first["nvmlDeviceGetComputeRunningProcesses_v3"] == 2 + 1 + 2 * 2
    assert first["nvmlDeviceGetProcessUtilization"] == 2 + 1 + 2 * 2
