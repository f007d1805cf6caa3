"""The headroom forecast: a time-weighted quantile of recent online rises over a window."""

from __future__ import annotations

import pytest

from ebbtide.scheduling.forecast import Forecaster


def fed(samples: list[tuple[float, float, float]], **kwargs: object) -> Forecaster:
    f = Forecaster(**kwargs)  # type: ignore[arg-type]
    for t, c, m in samples:
        f.observe(t, c, m)
    return f


#: 0 % until t=100, then 50 % (and 4 GiB more memory) until at least t=200.  With a 30 s
#: window the rise is 50 for 30 s of the 200 s seen, i.e. 15 % of the time.
STEP = [(0.0, 0.0, 1024.0), (100.0, 50.0, 5120.0), (200.0, 50.0, 5120.0)]


@pytest.mark.parametrize(
    ("quantile", "reserve"),
    [
        pytest.param(0.80, 0.0, id="below-the-rise-share"),
        pytest.param(0.85, 0.0, id="exactly-at-the-rise-share"),
        pytest.param(0.86, 50.0, id="into-the-rise"),
        pytest.param(1.0, 50.0, id="max"),
    ],
)
def test_compute_quantile_is_weighted_by_time(quantile: float, reserve: float) -> None:
    f = fed(STEP, windows_s=(30.0,), compute_quantile=quantile, memory_to_peak=False)
    assert f.reserve(30.0)[0] == reserve


def test_memory_quantile_is_separate() -> None:
    f = fed(STEP, compute_quantile=0.5, memory_quantile=1.0, memory_to_peak=False)
    assert f.reserve(30.0) == (0.0, 4096.0)


def test_no_samples_no_reserve() -> None:
    assert Forecaster().reserve() == (0.0, 0.0)


def test_cold_reserve_until_warm() -> None:
    f = Forecaster(warmup_s=150.0, cold_reserve=(30.0, 8192.0), compute_quantile=1.0)
    f.observe(0.0, 0.0, 0.0)
    f.observe(100.0, 10.0, 0.0)
    assert f.reserve(30.0) == (30.0, 8192.0)  # 100 s seen
    f.observe(200.0, 10.0, 0.0)
    assert f.reserve(30.0) == (10.0, 0.0)  # 200 s seen


def test_dense_and_sparse_sampling_agree() -> None:
    """The agent samples every 50 ms, the simulator only at changes: same forecast."""
    sparse = fed(STEP, compute_quantile=0.9)
    dense = Forecaster(compute_quantile=0.9)
    t = 0.0
    while t <= 200.0:
        dense.observe(t, 0.0 if t < 100.0 else 50.0, 1024.0 if t < 100.0 else 5120.0)
        t = round(t + 0.05, 2)
    assert dense.reserve(30.0) == sparse.reserve(30.0) == (50.0, 4096.0)


def test_rise_within_window_counts_a_climb_in_steps() -> None:
    """Two rises of 20 ten seconds apart are one rise of 40 over a 30 s window."""
    f = fed(
        [(0.0, 0.0, 0.0), (100.0, 20.0, 0.0), (110.0, 40.0, 0.0), (400.0, 40.0, 0.0)],
        compute_quantile=1.0,
    )
    assert f.reserve(30.0)[0] == 40.0
    g = fed(
        [(0.0, 0.0, 0.0), (100.0, 20.0, 0.0), (140.0, 40.0, 0.0), (400.0, 40.0, 0.0)],
        compute_quantile=1.0,
    )
    assert g.reserve(30.0)[0] == 20.0  # 40 s apart: never 40 within 30 s


def test_old_rises_age_out_of_the_history() -> None:
    f = fed(
        [(0.0, 0.0, 0.0), (100.0, 60.0, 0.0), (200.0, 60.0, 0.0)],
        compute_quantile=1.0,
        history_s=1200.0,
    )
    assert f.reserve(30.0)[0] == 60.0
    f.observe(2000.0, 60.0, 0.0)  # flat for 1800 s: the rise is older than the history
    assert f.reserve(30.0)[0] == 0.0


def test_deadline_picks_the_window_and_scales_beyond_the_longest() -> None:
    samples = [(0.0, 0.0, 0.0), (100.0, 10.0, 0.0), (120.0, 30.0, 0.0), (500.0, 30.0, 0.0)]
    f = fed(samples, windows_s=(10.0, 60.0), compute_quantile=1.0)
    assert f.reserve(5.0)[0] == 20.0  # 10 s window: the largest single step
    assert f.reserve(30.0)[0] == 30.0  # 60 s window: both steps
    assert f.reserve(120.0)[0] == 60.0  # twice the longest window: twice its reserve


def test_memory_reserve_covers_the_way_back_to_the_recent_peak() -> None:
    samples = [(0.0, 0.0, 30000.0), (100.0, 0.0, 10000.0), (5000.0, 0.0, 10000.0)]
    assert fed(samples, history_s=86400.0).reserve(30.0)[1] == 20000.0
    assert fed(samples, history_s=86400.0, memory_to_peak=False).reserve(30.0)[1] == 0.0
    # the peak ages out of a shorter history
    assert fed(samples, history_s=3600.0).reserve(30.0)[1] == 0.0


def test_samples_must_come_in_order() -> None:
    f = fed(STEP)
    with pytest.raises(ValueError, match="time order"):
        f.observe(150.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"windows_s": ()},
        {"windows_s": (0.0,)},
        {"compute_quantile": 0.0},
        {"memory_quantile": 1.5},
        {"history_s": 0.0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Forecaster(**kwargs)  # type: ignore[arg-type]


def test_state_stays_bounded() -> None:
    """A long day at agent speed keeps O(window + buckets) state, not O(samples)."""
    f = Forecaster(history_s=600.0)
    for i in range(200_000):  # 10 000 s at 50 ms, a slow sawtooth
        f.observe(i * 0.05, float(i % 2000) / 20.0, 0.0)
    tracker = f._compute[30.0]
    assert len(tracker.minima) <= 30.0 / 0.05 + 2
    assert len(tracker.hist.ring) <= 12
