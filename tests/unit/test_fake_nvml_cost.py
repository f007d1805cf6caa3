"""The fake ``pynvml``'s call cost (for benchmarks): each call takes at least what it is
told, busy or asleep, and is counted; without one the calls are left as they are."""

from __future__ import annotations

import time

import pynvml
import pytest

from ebbtide.workers.headroom.fake_nvml import FakeNvml

GIB = 1024
COST_S = 0.002


def test_no_cost_by_default_leaves_the_methods_alone() -> None:
    nvml = FakeNvml()
    assert "nvmlInit" not in vars(nvml)
    nvml.nvmlInit()
    assert nvml.calls == {}


@pytest.mark.parametrize("wait", ["busy", "sleep"])
def test_every_call_takes_at_least_its_cost_and_is_counted(wait: str) -> None:
    nvml = FakeNvml(call_cost_s=COST_S, call_wait=wait)
    gpu = nvml.add_device(80 * GIB)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
    started = time.perf_counter()
    for _ in range(3):
        assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 80 * GIB * 1024 * 1024
    assert time.perf_counter() - started >= 3 * COST_S
    with pytest.raises(pynvml.NVMLError_NotFound):  # errors still come through, costed
        nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert nvml.calls == {
        "nvmlInit": 1,
        "nvmlDeviceGetHandleByIndex": 1,
        "nvmlDeviceGetMemoryInfo": 3,
        "nvmlDeviceGetProcessUtilization": 1,
    }


def test_a_bad_cost_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        FakeNvml(call_cost_s=-1.0)
    with pytest.raises(ValueError, match="busy"):
        FakeNvml(call_cost_s=0.0, call_wait="spin")
