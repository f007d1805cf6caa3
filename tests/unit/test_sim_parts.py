"""The simulator's smaller parts: the queue, one eviction's outcome, the periods it shares
with the live code, and the table it prints."""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.scheduling.planner import Dispatch, plan
from ebbtide.scheduling.snapshot import Margins, PauseRules, Snapshot
from ebbtide.sim.backlog import Backlog, EndlessStream
from ebbtide.sim.eviction import outcome
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.metrics import METRIC_KEYS, percentile
from ebbtide.sim.online import DeviceLoad, OnlineLoad
from ebbtide.sim.planning import device_view, surely_calm
from ebbtide.sim.record import most_eventful
from ebbtide.sim.report import render
from ebbtide.sim.state import CHECKPOINTING, RUNNING, STARTING, SimAttempt, SimDevice, SimJobState
from ebbtide.sim.timing import (
    EXIT_P50_S,
    EXIT_P99_S,
    HEARTBEAT_PERIOD_S,
    PLAN_PERIOD_S,
    SAMPLE_PERIOD_S,
    Latencies,
)


def spec(key: int, c: float = 50.0, cost: float = 1.0, cooperative: bool = True) -> SimJob:
    return SimJob(key, "t", 0.0, c, 0, 1024, 1000.0, 600.0, cost, 30.0, cooperative)


def test_endless_stream_hands_out_copies_in_id_order_per_shape() -> None:
    stream = EndlessStream([spec(0, 50.0), spec(1, 20.0), spec(2, 50.0)])
    big = (50.0, 1024, 0)
    assert [stream.take(big)[0] for _ in range(4)] == [1, 3, 4, 6]
    assert stream.take((20.0, 1024, 0))[0] == 2


def test_backlog_heads_and_saturation() -> None:
    backlog = Backlog()
    for job_id, c in [(5, 50.0), (1, 50.0), (3, 20.0), (9, 50.0)]:
        backlog.add(SimJobState(job_id, spec(0, c), 0.0).queued())
    assert [j.id for j in backlog.heads(2)] == [1, 5, 3]
    assert backlog.smallest_fraction() == (20.0, 1024.0)

    def d(job_id: int) -> Dispatch:
        return Dispatch(job_id, 0, "n", (0,), 50.0, 1024)

    assert backlog.saturated([d(1), d(5)], 2)  # both heads of 50 % placed, 9 waits
    assert not backlog.saturated([d(1)], 2)
    assert not backlog.saturated([d(3)], 1)  # no other 20 % job behind it
    backlog.remove(5)
    assert [j.id for j in backlog.heads(2)] == [1, 9, 3]


def attempt(phase: int, progress: float, saved: float, **kw: object) -> SimAttempt:
    dev = SimDevice(0, DeviceLoad("d", (0.0,), (0.0,), (0.0,), 1.0), "n", 1024.0)
    job = SimJobState(1, spec(0, **kw), 0.0)  # type: ignore[arg-type]
    return SimAttempt(job, 1, dev, 0.0, 0.2, progress, saved, phase=phase, ckpt_end=100.5)


class Fixed(Latencies):
    def __init__(self) -> None:
        super().__init__(0)

    def exit_latency(self) -> float:
        return 0.1

    def reap_latency(self) -> float:
        return 0.01


@pytest.mark.parametrize(
    ("att", "expected"),
    [
        pytest.param(attempt(STARTING, 0.0, 0.0), (100.1, 100.1, 0.0, False), id="not-started"),
        pytest.param(attempt(RUNNING, 80.0, 50.0), (100.1, 101.1, 80.0, False), id="checkpoints"),
        pytest.param(
            attempt(RUNNING, 80.0, 50.0, cost=29.8), (100.1, 100.1, 50.0, False), id="too-slow"
        ),
        pytest.param(attempt(RUNNING, 50.0, 50.0), (100.1, 100.1, 50.0, False), id="nothing-new"),
        pytest.param(
            attempt(CHECKPOINTING, 80.0, 50.0), (100.1, 100.6, 80.0, False), id="mid-checkpoint"
        ),
        pytest.param(
            attempt(RUNNING, 80.0, 50.0, cooperative=False),
            (129.86, 129.86, 50.0, True),
            id="stubborn-killed",
        ),
    ],
)
def test_eviction_outcome(att: SimAttempt, expected: tuple[float, float, float, bool]) -> None:
    out = outcome(att, att.phase, 100.0, Fixed())
    assert (out.release_at, out.free_at, out.saved_s, out.killed) == pytest.approx(expected)
    assert out.free_at - 100.0 <= 30.0  # never past the deadline


def test_periods_match_the_live_code() -> None:
    from ebbtide.scheduling import loop
    from ebbtide.workers import agent

    assert SAMPLE_PERIOD_S == agent.SAMPLE_PERIOD_S
    assert HEARTBEAT_PERIOD_S == agent.HEARTBEAT_PERIOD_S
    assert PLAN_PERIOD_S == loop.PLAN_PERIOD_S


def test_exit_latency_is_calibrated_and_never_zero() -> None:
    lat = Latencies(0)
    draws = sorted(lat.exit_latency() for _ in range(20000))
    assert draws[0] > 0
    assert percentile(draws, 0.5) == pytest.approx(EXIT_P50_S, rel=0.05)
    assert percentile(draws, 0.99) == pytest.approx(EXIT_P99_S, rel=0.1)
    assert all(0 < lat.sample_delay() <= SAMPLE_PERIOD_S for _ in range(100))


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_most_eventful_device() -> None:
    calm = DeviceLoad("calm", (0.0, 1.0), (0.0, 5.0), (0.0, 0.0), 2.0)
    busy = DeviceLoad("busy", (0.0, 1.0, 2.0, 3.0), (0.0, 50.0, 0.0, 50.0), (0.0,) * 4, 4.0)
    load = OnlineLoad("t", (calm, busy), 1024.0, 4.0, 0.0, 1.0)
    assert most_eventful(load) == 1


def _table(
    figures: dict[str, Any], policies: tuple[str, ...] = ("ebbtide",), **workload: Any
) -> str:
    return render(
        {
            "workload": {
                "online": "genai:x",
                "devices": 2,
                "device_memory_gib": 80,
                "span_h": 1.0,
                "clock_start": "09:12",
                "online_gpu_hours": 0.1,
                "spare_gpu_hours": 1.9,
                "jobs": "synthetic",
                "stream_jobs": 10,
                "stream_gpu_hours": 3.0,
                "load": "backlogged",
                "seed": 0,
                **workload,
            },
            "policies": dict.fromkeys(policies, figures),
        }
    )


def test_table_shows_suspensions_when_the_run_suspends_to_host() -> None:
    """A trial's trap: ``--suspend-to-host`` counted suspensions in ``--json`` only, and
    the header did not say it was on."""
    figures = dict.fromkeys(METRIC_KEYS, 0) | {
        "suspensions": 12,
        "restores": 11,
        "evictions_while_suspended": 1,
    }
    on = _table(figures, suspend_to_host=True)
    assert on.splitlines()[1].endswith("pausing on, suspend to host on")
    rows = on.splitlines()
    at = next(i for i, r in enumerate(rows) if r.startswith("slice time paused"))
    assert [r.split()[-1] for r in rows[at + 1 : at + 4]] == ["12", "11", "1"]
    assert rows[at + 1].startswith("suspensions to host")
    off = _table(figures)
    assert off.splitlines()[1].endswith("suspend to host off") and "suspensions" not in off


def test_interference_is_a_percentage_however_small() -> None:
    """A trial's trap: the row read ``3.15e-04`` among percentages."""
    small = _table(dict.fromkeys(METRIC_KEYS, 0) | {"interference_compute_frac": 3.15e-4})
    large = _table(dict.fromkeys(METRIC_KEYS, 0) | {"interference_compute_frac": 0.0123})
    row = next(r for r in small.splitlines() if r.startswith("online compute interfered"))
    assert row.split()[-1] == "0.032%"
    row = next(r for r in large.splitlines() if r.startswith("online compute interfered"))
    assert row.split()[-1] == "1.23%"
    tiny = _table(dict.fromkeys(METRIC_KEYS, 0) | {"interference_compute_frac": 1e-9})
    row = next(r for r in tiny.splitlines() if r.startswith("online compute interfered"))
    assert row.split()[-1] == "<0.0001%"


def test_table_shows_every_policy_and_metric() -> None:
    figures = dict.fromkeys(METRIC_KEYS, 0.5) | {"jct_p50_s": None, "eviction_latency_p99_s": 0.2}
    text = _table(figures, ("ebbtide", "greedy"))
    header = text.splitlines()[3]
    assert "ebbtide" in header and "greedy" in header
    for label in ("harvest efficiency", "online OOM events", "job completion time p50"):
        assert label in text


def test_plot_zooms_on_the_busiest_stretch() -> None:
    from ebbtide.sim.plot import busiest_window

    assert busiest_window([], 10.0) == 0.0
    assert busiest_window([1.0, 50.0, 52.0, 55.0, 80.0], 10.0) == 50.0


@pytest.mark.parametrize(
    ("online_c", "online_m", "sizes", "paused", "calm"),
    [
        pytest.param(10.0, 0.0, [], False, True, id="empty"),
        pytest.param(10.0, 0.0, [30.0, 40.0], False, True, id="room-left"),
        pytest.param(50.0, 0.0, [30.0, 40.0], False, False, id="compute-over"),
        pytest.param(10.0, 64_000.0, [30.0, 40.0], False, False, id="memory-over"),
        pytest.param(10.0, 0.0, [30.0], True, False, id="paused"),
    ],
)
def test_surely_calm_means_an_empty_pass_decides_nothing(
    online_c: float, online_m: float, sizes: list[float], paused: bool, calm: bool
) -> None:
    dev = SimDevice(0, DeviceLoad("d", (0.0,), (0.0,), (0.0,), 1.0), "n", 65_536.0)
    dev.seen_c, dev.seen_m = online_c, online_m
    for k, c in enumerate(sizes):
        job = SimJobState(k + 1, spec(k, c=c), 0.0)
        att = SimAttempt(job, 1, dev, 0.0, 0.2, 0.0, 0.0, phase=RUNNING)
        att.paused_at = 1.0 if paused else None
        dev.attempts[job.id] = att
    margins = Margins(5.0, 1024.0)
    view = device_view(dev, watch_compute=True, now=100.0)
    assert surely_calm(view, dev, margins) is calm
    decided = plan(
        Snapshot(
            now=100.0,
            queued=[],
            active=[a.active_view(True) for a in dev.attempts.values()],
            devices=[view],
            margins=margins,
            pause=PauseRules(enabled=False),
        )
    )
    assert not decided.dispatches
    if calm:
        assert not decided.evictions
    elif not paused:
        assert decided.evictions  # with pausing off, a shortfall evicts


def test_every_figure_of_the_json_is_named_in_the_readme() -> None:
    """A trial's trap: new ``--json`` figures were listed in the metrics module only."""
    from pathlib import Path

    from ebbtide.sim.metrics import Tally

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## Simulation (`ebb sim`)") :]
    missing = [k for k in Tally().figures(1.0) if f"`{k}`" not in section]
    assert missing == []
