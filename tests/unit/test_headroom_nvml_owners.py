"""A sample looks each GPU process's owner up once (a lookup reads ``/proc``), and the
second sample asks again (a process's owner can change between samples)."""

from __future__ import annotations

from collections import Counter

from ebbtide.workers.headroom.base import KnownPids
from ebbtide.workers.headroom.fake_nvml import FakeNvml
from ebbtide.workers.headroom.nvml import NvmlSource

GIB = 1024
ONLINE, JOB_A, JOB_B = 4242, 5001, 5002


class CountingOffline(KnownPids):
    """``KnownPids`` that counts the lookups of each pid."""

    asked: Counter[int]

    def __init__(self, pids: dict[int, int], granted: dict[int, tuple[float, float]]) -> None:
        super().__init__(pids, granted)
        object.__setattr__(self, "asked", Counter())

    def owner(self, pid: int) -> int | None:
        self.asked[pid] += 1
        return super().owner(pid)


def test_each_pid_is_looked_up_once_per_sample() -> None:
    now = 1_700_000_000.0
    nvml = FakeNvml(clock=lambda: now)
    for gpu in range(2):
        nvml.add_device(80 * GIB)
        nvml.set_utilization(gpu, 60)
    nvml.add_process(0, ONLINE, memory_mib=20 * GIB, sm_util=30)
    nvml.add_process(0, JOB_A, memory_mib=6 * GIB, sm_util=15)
    nvml.add_process(1, JOB_B, memory_mib=6 * GIB, sm_util=15)
    offline = CountingOffline({JOB_A: 1, JOB_B: 2}, {0: (20.0, 8192.0), 1: (20.0, 8192.0)})
    source = NvmlSource(nvml=nvml)
    try:
        first = source.sample(now, offline)
        assert offline.asked == {ONLINE: 1, JOB_A: 1, JOB_B: 1}
        assert first[0].online_pids == (ONLINE,) and first[0].online_memory_mib == 20 * GIB
        assert [u.job_id for s in first for u in s.offline_jobs or ()] == [1, 2]
        source.sample(now, offline)
        assert offline.asked == {ONLINE: 2, JOB_A: 2, JOB_B: 2}
    finally:
        source.close()
