"""How the node agent feeds an attempt's usage summary from the samples: once a second,
per device, only where the source attributes GPU use, never while paused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ebbtide.queue.store import Store
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.attempt import LocalAttempt
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.executor import Handle
from ebbtide.workers.headroom.base import DeviceSample, JobUsage
from ebbtide.workers.headroom.static import StaticSource
from ebbtide.workers.ownership import Tree
from ebbtide.workers.status import StatusReader

from .builders import att

GIB = 1024
T0 = 1_700_000_000.0
JOB = 7


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    node = NodeAgent("n1", store, StaticSource(parse_devices("2x80GiB")), home=tmp_path)
    node.attempts[JOB] = LocalAttempt(
        slice=att(JOB, node="n1", devices=(0, 1), c=50.0, m=16 * GIB, dispatched=T0, started=T0),
        handle=Handle(pid=0, pgid=0),
        tree=Tree(JOB, 0, 0.0),
        status=StatusReader(tmp_path / "status"),
    )
    yield node
    node.journal.close()
    store.close()


def sample(index: int, *jobs: JobUsage, at: float = T0, attributed: bool = True) -> DeviceSample:
    return DeviceSample(
        index=index,
        time=at,
        online_compute_pct=0.0,
        online_memory_mib=0.0,
        offline_jobs=tuple(jobs) if attributed else None,
    )


def measure(agent: NodeAgent, now: float, *samples: DeviceSample) -> None:
    agent.latest = list(samples)
    agent._measure_usage(now)


def test_the_fullest_device_counts_and_a_device_without_it_holds_nothing(
    agent: NodeAgent,
) -> None:
    measure(agent, T0, sample(0, JobUsage(JOB, 30.0, 4 * GIB)), sample(1))
    measure(
        agent,
        T0 + 1,
        sample(0, JobUsage(JOB, 30.0, 4 * GIB), at=T0 + 1),
        sample(1, JobUsage(JOB, 45.0, 6 * GIB), JobUsage(8, 90.0, 60 * GIB), at=T0 + 1),
    )
    usage = agent.attempts[JOB].usage
    assert usage is not None and usage.samples == 2
    assert (usage.compute.peak, usage.memory.peak) == (45.0, 6 * GIB)
    assert usage.compute.total == 2 and usage.memory.total == 2
    assert len(usage.memory.counts) == 321  # sized by its devices (80 GiB), once


def test_at_most_once_a_second(agent: NodeAgent) -> None:
    for tick in range(41):  # two seconds at 20 Hz
        now = T0 + tick * 0.05
        measure(agent, now, sample(0, JobUsage(JOB, 10.0, GIB), at=now), sample(1, at=now))
    usage = agent.attempts[JOB].usage
    assert usage is not None and usage.samples == 3  # at 0 s, 1 s and 2 s


def test_no_sample_until_a_process_of_it_is_seen(agent: NodeAgent) -> None:
    """Started, no CUDA context yet (or its processes not told apart): no sample, never a
    peak of 0 that would recommend a 1 GiB slice."""
    measure(agent, T0, sample(0), sample(1))
    assert agent.attempts[JOB].usage is None
    measure(agent, T0 + 1, sample(0, JobUsage(JOB, 30.0, 4 * GIB)), sample(1))
    usage = agent.attempts[JOB].usage
    assert usage is not None and usage.samples == 1
    assert usage.memory.peak == 4 * GIB  # the device without its process counts 0 memory


@pytest.mark.parametrize(
    "case",
    ["one device not attributed", "a device did not answer", "stale", "paused"],
)
def test_no_sample_where_nothing_can_be_told(agent: NodeAgent, case: str) -> None:
    mine = JobUsage(JOB, 30.0, 4 * GIB)
    samples = [sample(0, mine), sample(1, mine)]
    if case == "one device not attributed":
        samples[1] = sample(1, attributed=False)
    elif case == "a device did not answer":
        samples[1] = DeviceSample(1, T0, 100.0, 80.0 * GIB, ok=False)
    elif case == "stale":
        samples = [sample(0, mine, at=T0 - 5), sample(1, mine, at=T0 - 5)]
    else:
        agent.attempts[JOB].paused_at = T0 - 1
    measure(agent, T0, *samples)
    assert agent.attempts[JOB].usage is None
