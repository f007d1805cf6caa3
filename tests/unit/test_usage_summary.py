"""An attempt's usage summary: exact peaks, p95 to its bin, and a size that does not grow."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.workers.usage import MEMORY_BIN_MIB, Histogram, UsageSummary

GIB = 1024


def nearest_rank(values: list[float], pct: float) -> float:
    """The nearest-rank percentile, by sorting (what the histogram approximates)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


@pytest.mark.parametrize(
    ("values", "p95", "peak"),
    [
        pytest.param([30.0] * 100, 30.0, 30.0, id="constant"),
        pytest.param([10.0] * 95 + [90.0] * 5, 10.0, 90.0, id="5 % spikes: p95 below them"),
        pytest.param([10.0] * 94 + [90.0] * 6, 90.0, 90.0, id="6 % spikes: p95 on them"),
        pytest.param(list(range(1, 101)), 95.0, 100.0, id="1..100"),
        pytest.param([0.0, 0.0, 0.0], 0.0, 0.0, id="idle"),
        pytest.param([42.0], 42.0, 42.0, id="one sample"),
    ],
)
def test_compute_p95_and_peak_are_exact_on_whole_percents(
    values: list[float], p95: float, peak: float
) -> None:
    h = Histogram(1.0, 100.0)
    for v in random.Random(7).sample(values, len(values)):  # order does not matter
        h.add(v)
    assert (h.percentile(95), h.peak, h.total) == (p95, peak, len(values))
    assert h.percentile(95) == nearest_rank(values, 95)


def test_memory_p95_is_the_top_of_its_bin_and_never_past_the_peak() -> None:
    h = Histogram(MEMORY_BIN_MIB, 80 * GIB)
    for v in [1000.0] * 19 + [3000.5]:  # p95 is 1000 MiB, in the bin (768, 1024]
        h.add(v)
    assert (h.percentile(95), h.peak) == (1024.0, 3000.5)
    one = Histogram(MEMORY_BIN_MIB, 80 * GIB)
    one.add(1000.0)
    assert one.percentile(95) == 1000.0  # capped at the peak, not 1024
    on_edge = Histogram(MEMORY_BIN_MIB, 80 * GIB)
    for v in (512.0, 768.0, 768.0):
        on_edge.add(v)
    assert on_edge.percentile(95) == 768.0  # a value on a bin's top edge is in that bin


def test_values_past_the_top_count_in_the_last_bin_and_p95_there_is_the_peak() -> None:
    h = Histogram(MEMORY_BIN_MIB, 1024.0)
    for v in (100.0, 5000.0, 9000.0):
        h.add(v)
    assert len(h.counts) == 5
    assert (h.percentile(95), h.peak) == (9000.0, 9000.0)


def test_the_size_is_fixed_however_long_it_runs() -> None:
    summary = UsageSummary(80 * GIB)
    sizes = (len(summary.compute.counts), len(summary.memory.counts))
    assert sizes == (101, 321)  # 1 % bins over 0-100, 256 MiB bins up to 80 GiB
    rng = random.Random(1)
    for _ in range(100_000):  # a day at one sample a second
        summary.add(rng.uniform(0, 100), rng.uniform(0, 80 * GIB))
    assert (len(summary.compute.counts), len(summary.memory.counts)) == sizes
    assert summary.samples == 100_000


@given(
    st.lists(st.integers(0, 100), min_size=1, max_size=300),
    st.lists(st.floats(0, 80 * GIB), min_size=1, max_size=300),
)
def test_p95_is_within_a_bin_above_the_true_one(compute: list[int], memory: list[float]) -> None:
    c, m = Histogram(1.0, 100.0), Histogram(MEMORY_BIN_MIB, 80 * GIB)
    for v in compute:
        c.add(float(v))
    for v in memory:
        m.add(v)
    assert c.percentile(95) == nearest_rank([float(v) for v in compute], 95)
    true = nearest_rank(memory, 95)
    got = m.percentile(95)
    assert got is not None and true <= got <= min(true + MEMORY_BIN_MIB, max(memory))
    assert (c.peak, m.peak) == (max(compute), max(memory))


def test_the_report_names_the_stores_columns_and_says_what_was_not_measured() -> None:
    from ebbtide.queue.models import USAGE_COLUMNS

    summary = UsageSummary(80 * GIB)
    assert summary.report() is None  # nothing measured: nothing to record
    summary.add(None, None)  # a sample that told nothing is no sample
    assert summary.report() is None
    for memory in (2 * GIB, 4 * GIB, 3 * GIB):
        summary.add(None, float(memory))  # compute not measured per process (MIG)
    report = summary.report()
    assert report is not None and tuple(report) == USAGE_COLUMNS
    assert report == {
        "usage_samples": 3,
        "used_compute_p95_pct": None,
        "used_compute_peak_pct": None,
        "used_memory_p95_mib": 4.0 * GIB,
        "used_memory_peak_mib": 4.0 * GIB,
    }
    summary.add(150.0, -5.0)  # clamped to what a device can hold
    report = summary.report()
    assert report is not None
    assert report["used_compute_peak_pct"] == 100.0 and report["usage_samples"] == 4
