"""How often ``NvmlSource`` asks NVML, and what that costs in truth.

Memory is read at every sample.  Utilisation and per-process SM samples are read once
``UTILIZATION_PERIOD_S`` old, together.  A GPU's process list is read again when its used
memory moved, and at least every ``PROCESS_LIST_PERIOD_S``: a process that comes (a CUDA
context holds memory) or grows is in the next sample; only one process freeing exactly
what another allocates between two samples goes unseen, for at most that period.  A
sample that read nothing new repeats the last figures (``DeviceSample.at``: checked against
``dataclasses.replace`` on random samples), and the fresh per-process SM samples it asked
for last (``ProcessSamples.fresh``: checked against a copy that works them out anew).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from ebbtide.workers.headroom.base import DeviceSample, JobUsage, KnownPids
from ebbtide.workers.headroom.fake_nvml import FakeNvml, NVMLError_NotFound
from ebbtide.workers.headroom.nvml import (
    PROCESS_LIST_PERIOD_S,
    PROCESS_SAMPLE_MAX_AGE_S,
    UTILIZATION_PERIOD_S,
    NvmlSource,
)
from ebbtide.workers.headroom.nvml_figures import ProcessSamples
from ebbtide.workers.headroom.nvml_lists import ListReader

GIB = 1024
ONLINE, JOB, CHILD, OTHER = 4242, 9001, 9002, 4343
TICK_S = 0.05  # the agent's sampling period


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class Owners(KnownPids):
    """An ``Offline`` with an epoch (as ``ProcessOwnership``): its answers change only
    when the epoch does.  Counts the lookups of each pid."""

    epoch: int
    asked: Counter[int]

    def __init__(self, pids: dict[int, int], granted: dict[int, tuple[float, float]]) -> None:
        super().__init__(pids, granted)
        object.__setattr__(self, "epoch", 0)
        object.__setattr__(self, "asked", Counter())

    def owner(self, pid: int) -> int | None:
        self.asked[pid] += 1
        return super().owner(pid)

    def change(self, pid: int, job: int) -> None:
        dict.__setitem__(self.pids, pid, job)  # type: ignore[index]
        object.__setattr__(self, "epoch", self.epoch + 1)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def nvml(clock: Clock) -> FakeNvml:
    nvml = FakeNvml(clock=clock, call_cost_s=0.0)  # no cost: the calls are counted
    nvml.add_device(80 * GIB)
    nvml.set_utilization(0, 50)
    nvml.add_process(0, ONLINE, 20 * GIB, sm_util=30)
    nvml.add_process(0, JOB, 6 * GIB, sm_util=20)
    return nvml


@pytest.fixture
def source(nvml: FakeNvml, clock: Clock) -> Iterator[NvmlSource]:
    source = NvmlSource(nvml=nvml, clock=clock, event_wait_ms=10)
    yield source
    source.close()


def job_owners() -> Owners:
    return Owners({JOB: 7, CHILD: 7}, {0: (20.0, 8 * GIB)})


def calls(nvml: FakeNvml) -> dict[str, int]:
    counted = {k.removeprefix("nvmlDevice"): v for k, v in nvml.calls.items()}
    nvml.calls.clear()
    return counted


def test_memory_every_sample_the_rest_at_their_own_rate(
    nvml: FakeNvml, source: NvmlSource, clock: Clock
) -> None:
    offline = job_owners()
    nvml.calls.clear()
    started = clock.now
    ticks = round(PROCESS_LIST_PERIOD_S / TICK_S)
    for tick in range(ticks):
        clock.now = started + tick * TICK_S
        [s] = source.sample(clock.now, offline)
        assert (s.online_memory_mib, s.online_compute_pct) == (20 * GIB, 30.0)
    counted = calls(nvml)
    assert counted["GetMemoryInfo"] == ticks
    reads = counted["GetUtilizationRates"]
    assert reads == counted["GetProcessUtilization"]
    assert reads <= ticks * TICK_S / UTILIZATION_PERIOD_S + 1
    assert (counted["GetComputeRunningProcesses"], counted["GetGraphicsRunningProcesses"]) == (1, 1)
    # the owners are asked once per list read, not per sample (the epoch did not change)
    assert offline.asked == {ONLINE: 1, JOB: 1}
    clock.now = started + PROCESS_LIST_PERIOD_S
    [s] = source.sample(clock.now, offline)  # the list is a period old: read again
    assert calls(nvml)["GetComputeRunningProcesses"] == 1
    assert offline.asked == {ONLINE: 2, JOB: 2}


def test_a_new_online_process_is_in_the_next_sample(
    nvml: FakeNvml, source: NvmlSource, clock: Clock
) -> None:
    offline = job_owners()
    source.sample(clock.now, offline)
    clock.now += TICK_S
    nvml.add_process(0, OTHER, 30 * GIB)  # an online spike by a new process
    [s] = source.sample(clock.now, offline)
    assert s.online_memory_mib == 50 * GIB
    assert s.online_pids == (ONLINE, OTHER)
    clock.now += TICK_S
    nvml.set_memory(0, ONLINE, 25 * GIB)  # and one that grows
    [s] = source.sample(clock.now, offline)
    assert s.online_memory_mib == 55 * GIB


def test_a_jobs_new_child_is_never_online_load(
    nvml: FakeNvml, source: NvmlSource, clock: Clock
) -> None:
    """The child's CUDA context moves the used memory: the list is read at once, so its
    kernels never count as online compute (its job is taken to use its slice until the
    child has a sample)."""
    offline = job_owners()
    source.sample(clock.now, offline)
    clock.now += TICK_S
    nvml.add_process(0, CHILD, 2 * GIB, sm_util=40)
    nvml.set_utilization(0, 90)
    [s] = source.sample(clock.now, offline)
    assert s.online_memory_mib == 20 * GIB
    assert s.online_pids == (ONLINE,)
    assert s.online_compute_pct <= 30.0
    assert [(u.job_id, u.memory_mib) for u in s.offline_jobs or ()] == [(7, 8 * GIB)]


def test_worst_case_one_process_frees_what_another_takes(
    nvml: FakeNvml, source: NvmlSource, clock: Clock
) -> None:
    """Between two samples the job's process frees exactly what its new child takes:
    the used memory does not move, so the old list serves until it is
    ``PROCESS_LIST_PERIOD_S`` old.  Meanwhile the child's kernels count as online
    compute (its memory was the job's and still is); never longer."""
    offline = job_owners()
    source.sample(clock.now, offline)
    started = clock.now
    clock.now += TICK_S
    nvml.set_memory(0, JOB, 4 * GIB)
    nvml.add_process(0, CHILD, 2 * GIB, sm_util=40)
    nvml.set_utilization(0, 90)  # online 30, the job's process 20, the child 40
    online_seen = []
    while clock.now < started + PROCESS_LIST_PERIOD_S + TICK_S / 2:
        [s] = source.sample(clock.now, offline)
        assert s.online_memory_mib == 20 * GIB  # memory is right all along
        online_seen.append((clock.now - started, s.online_compute_pct))
        clock.now += TICK_S
    wrong = [at for at, pct in online_seen if pct > 30.0]
    assert wrong and max(wrong) < PROCESS_LIST_PERIOD_S  # it happened, and it ended
    [s] = source.sample(clock.now, offline)
    assert s.online_compute_pct == 30.0 and s.online_pids == (ONLINE,)
    assert s.offline_compute_pct == 60.0


def test_worst_case_an_online_process_takes_what_a_job_frees(
    nvml: FakeNvml, source: NvmlSource, clock: Clock
) -> None:
    """The mirror case: online memory reads low for at most ``PROCESS_LIST_PERIOD_S``."""
    offline = job_owners()
    source.sample(clock.now, offline)
    started = clock.now
    clock.now += TICK_S
    nvml.set_memory(0, JOB, 2 * GIB)
    nvml.add_process(0, OTHER, 4 * GIB)
    while True:
        [s] = source.sample(clock.now, offline)
        if s.online_memory_mib == 24 * GIB:
            break
        assert s.online_memory_mib == 20 * GIB
        clock.now += TICK_S
    assert clock.now - started <= PROCESS_LIST_PERIOD_S + TICK_S


def test_a_new_epoch_asks_the_owners_again(
    nvml: FakeNvml, source: NvmlSource, clock: Clock
) -> None:
    offline = Owners({}, {})
    [s] = source.sample(clock.now, offline)
    assert s.online_memory_mib == 26 * GIB
    clock.now += TICK_S
    offline.change(JOB, 7)  # an attempt started: JOB is its process
    [s] = source.sample(clock.now, offline)
    assert (s.online_memory_mib, s.offline_memory_mib) == (20 * GIB, 6 * GIB)
    assert offline.asked == {ONLINE: 2, JOB: 2}
    # another Offline (KnownPids: no epoch) is asked at every sample
    plain = KnownPids({JOB: 7})
    for _ in range(2):
        clock.now += TICK_S
        [s] = source.sample(clock.now, plain)
        assert s.online_memory_mib == 20 * GIB


def test_a_sample_ages_out_though_nothing_is_read_again(nvml: FakeNvml, clock: Clock) -> None:
    source = NvmlSource(
        nvml=nvml, clock=clock, event_wait_ms=10, utilization_period_s=10 * PROCESS_SAMPLE_MAX_AGE_S
    )
    try:
        offline = job_owners()
        assert source.sample(clock.now, offline)[0].offline_compute_pct == 20.0
        clock.now += PROCESS_SAMPLE_MAX_AGE_S / 2
        assert source.sample(clock.now, offline)[0].offline_compute_pct == 20.0
        clock.now += PROCESS_SAMPLE_MAX_AGE_S
        [s] = source.sample(clock.now, offline)
        assert s.offline_compute_pct == 0.0 and s.time == clock.now
    finally:
        source.close()


def test_a_clock_stepped_back_reads_everything_again(
    nvml: FakeNvml, source: NvmlSource, clock: Clock
) -> None:
    offline = job_owners()
    source.sample(clock.now, offline)
    calls(nvml)
    clock.now -= 3600
    nvml.set_utilization(0, 80)
    [s] = source.sample(clock.now, offline)
    counted = calls(nvml)
    assert counted["GetUtilizationRates"] == counted["GetComputeRunningProcesses"] == 1
    assert s.time == clock.now and s.online_compute_pct == 60.0


def test_every_sample_reads_everything_when_asked_to(nvml: FakeNvml, clock: Clock) -> None:
    source = NvmlSource(
        nvml=nvml,
        clock=clock,
        event_wait_ms=10,
        utilization_period_s=0,
        process_list_period_s=0,
    )
    try:
        calls(nvml)
        for _ in range(3):
            source.sample(clock.now, job_owners())
            clock.now += TICK_S
        counted = calls(nvml)
        assert counted["GetUtilizationRates"] == counted["GetComputeRunningProcesses"] == 3
        assert counted["GetProcessUtilization"] == 3
    finally:
        source.close()


def random_sample(rng: random.Random) -> DeviceSample:
    return DeviceSample(
        index=rng.randrange(8),
        time=rng.uniform(0, 2e9),
        online_compute_pct=rng.choice([0.0, 12.5, 100.0]),
        online_memory_mib=rng.choice([0.0, 20 * GIB, 80 * GIB]),
        offline_compute_pct=rng.choice([None, 0.0, 30.0]),
        offline_memory_mib=rng.choice([None, 0.0, 6 * GIB]),
        basis=rng.choice(["device", "process", "slices", "instance"]),
        eviction_trigger=rng.random() < 0.8,
        ok=rng.random() < 0.9,
        online_pids=tuple(sorted(rng.sample(range(1, 100), rng.randint(0, 3)))),
        offline_jobs=rng.choice(
            [None, (), (JobUsage(job_id=rng.randint(1, 9), compute_pct=None, memory_mib=1.0),)]
        ),
    )


@pytest.mark.parametrize("seed", range(10))
def test_a_repeated_sample_is_the_last_one_made_again_at_its_time(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        last = random_sample(rng)
        was = dataclasses.asdict(last)
        now = last.time + rng.choice([0.0, TICK_S, 1.0])
        again = last.at(now)
        made = dataclasses.replace(last, time=now)
        assert again == made and hash(again) == hash(made) and type(again) is type(made)
        assert again is not last and dataclasses.asdict(last) == was
        with pytest.raises(dataclasses.FrozenInstanceError):
            again.time = 0.0  # type: ignore[misc]


class SmSamples:
    """``nvmlDeviceGetProcessUtilization`` alone: what ``ProcessSamples.read`` is handed
    next (a few pids, stamps around ``now``), or ``NotFound``."""

    NVMLError_NotFound = NVMLError_NotFound

    def __init__(self) -> None:
        self.next: list[SimpleNamespace] = []

    def nvmlDeviceGetProcessUtilization(self, handle: object, since_us: int) -> list[object]:
        if not self.next:
            raise NVMLError_NotFound()
        return [s for s in self.next if s.timeStamp > since_us]


@pytest.mark.parametrize("seed", range(10))
def test_fresh_samples_asked_for_again_are_those_worked_out_anew(seed: int) -> None:
    rng = random.Random(seed)
    nvml, samples = SmSamples(), ProcessSamples()
    now = 1_700_000_000.0
    pids: dict[int, int | None] = {1: None, 2: None}
    again = 0
    for _ in range(400):
        now += rng.choice([TICK_S, TICK_S, TICK_S, 0.5, 3.0, -5.0])  # and a clock that steps back
        if rng.random() < 0.3:
            nvml.next = [
                SimpleNamespace(
                    pid=rng.randint(1, 4),
                    timeStamp=round((now + rng.uniform(-3, 3)) * 1_000_000),
                    smUtil=rng.randint(0, 100),
                )
                for _ in range(rng.randint(0, 3))
            ]
            samples.read(ListReader(nvml), None, now)
        if rng.random() < 0.1:  # the process list was read again
            pids = {pid: None for pid in rng.sample(range(1, 5), rng.randint(0, 4))}
        plain = ProcessSamples(
            latest=dict(samples.latest),
            newest_us=samples.newest_us,
            pruned_at_us=samples.pruned_at_us,
            prune_at_us=samples.prune_at_us,
        )
        before = samples._fresh
        fresh = samples.fresh(pids, now)
        again += before is not None and fresh is before[2]
        assert fresh == plain.fresh(pids, now)
        assert samples.latest == plain.latest
    assert again > 100  # most were asked for again
