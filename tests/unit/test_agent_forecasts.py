"""The agent feeds its forecasters only the samples that change the figures (and the
latest one before a forecast is read): the same reserves as feeding every sample."""

from __future__ import annotations

import random

import pytest

from ebbtide.scheduling.forecast import Forecaster
from ebbtide.workers.forecasts import DeviceForecasts
from ebbtide.workers.headroom.base import DeviceSample

DEADLINES_S = (5.0, 30.0, 120.0)


def make() -> Forecaster:
    return Forecaster((10.0, 30.0), history_s=600.0, warmup_s=60.0, cold_reserve=(25.0, 4096.0))


@pytest.mark.parametrize("seed", range(3))
def test_held_samples_give_the_same_reserve_as_every_sample(seed: int) -> None:
    rng = random.Random(seed)
    dense = {i: make() for i in (0, 1)}
    held = DeviceForecasts([0, 1], make)
    figures = {0: (30.0, 20_480.0), 1: (0.0, 0.0)}
    t = 1_700_000_000.0
    for tick in range(15_000):  # 12.5 minutes at 20 Hz
        t = round(t + 0.05, 2)
        for i in (0, 1):
            if rng.random() < 0.01:  # usage changes now and then, in steps
                figures[i] = (float(rng.randrange(0, 101, 5)), float(rng.randrange(0, 65536, 512)))
        ok = rng.random() > 0.001  # a device that did not answer is left out
        samples = [
            DeviceSample(index=i, time=t, online_compute_pct=c, online_memory_mib=m, ok=ok or i)
            for i, (c, m) in figures.items()
        ]
        for s in samples:
            if s.ok:
                dense[s.index].observe(s.time, s.online_compute_pct, s.online_memory_mib)
        held.observe(samples)
        if tick % 10 == 0 or rng.random() < 0.01:  # the heartbeat reads them (2 Hz)
            for i in (0, 1):
                for d in DEADLINES_S:
                    assert held.reserve(i, d) == dense[i].reserve(d)
                    assert held.warmup_left_s(i, d) == pytest.approx(dense[i].warmup_left_s(d))


def test_a_sample_older_than_one_taken_in_is_left_out() -> None:
    held = DeviceForecasts([0], Forecaster)
    held.observe([DeviceSample(index=0, time=100.0, online_compute_pct=10, online_memory_mib=0)])
    held.observe([DeviceSample(index=0, time=100.5, online_compute_pct=10, online_memory_mib=0)])
    # the clock stepped back: the forecaster (in time order only) never sees it
    held.observe([DeviceSample(index=0, time=50.0, online_compute_pct=90, online_memory_mib=0)])
    assert held.reserve(0, 30.0) == (0.0, 0.0)


def test_a_steady_source_keeps_no_warm_up_reserve(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A trial's trap: on ``ebb up --devices 2x80GiB`` (no online load, ever) a whole GPU
    waited the 10 minutes of the cold reserve, for a forecast with nothing to learn."""
    from ebbtide.config.policy import Defaults
    from ebbtide.queue.store import Store
    from ebbtide.workers.agent import NodeAgent
    from ebbtide.workers.devices import parse_devices
    from ebbtide.workers.headroom.factory import open_source
    from ebbtide.workers.headroom.static import StaticSource

    defaults = Defaults()
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    try:
        for n, (source, reserve) in enumerate(
            [
                (open_source("static", parse_devices("1x80GiB")), (0.0, 0.0)),
                (open_source("static:20%,8GiB", parse_devices("1x80GiB")), (0.0, 0.0)),
                # a source a test or a benchmark moves (set()) is learnt as any other
                (StaticSource(parse_devices("1x80GiB")), (30.0, 8192.0)),
            ]
        ):
            agent = NodeAgent(f"n{n}", store, source, home=tmp_path, forecast=defaults.forecaster)
            agent.tick()
            assert agent.forecasts.reserve(0, defaults.deadline_s) == reserve
            agent.journal.close()
    finally:
        store.close()
