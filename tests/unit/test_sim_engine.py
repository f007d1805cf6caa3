"""The simulator's event loop on tiny hand-computed scenarios, one per metric, and the
baselines as defined.

Delays are fixed (:class:`Fixed`): the agent sees a step 0.02 s after it, a cooperative job
is out of the way 0.1 s after the warning (plus its checkpoint), a killed one is reaped in
0.01 s.  The scheduler plans on 0.5 s ticks, a dispatched job runs 0.2 s later (plus 30 s
to restore when resumed), and hears of a fall in online usage a heartbeat (0.5 s) late.
``PLAIN`` never pauses, so a compute spike evicts (pausing: ``test_sim_pause.py``).
"""

from __future__ import annotations

import gc
import math

import pytest

from ebbtide.scheduling.snapshot import Margins
from ebbtide.sim.engine import _STEP, RUN_GC_THRESHOLDS, Simulation
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.metrics import Tally
from ebbtide.sim.online import DeviceLoad, OnlineLoad
from ebbtide.sim.policies import ForecastSettings, SimPolicy, baselines, ebbtide_policy
from ebbtide.sim.record import Recorder
from tests.unit.sim_builders import Fixed, online

GIB = 1024.0
#: margins 0, no forecast, checkpoint-aware victims: the arithmetic stays visible
PLAIN = SimPolicy("plain", margins=Margins(0.0, 0.0))
EXCLUSIVE, STATIC_NIGHT, GREEDY = baselines()


def job(
    key: int = 0,
    c: float = 50.0,
    work: float = 100.0,
    *,
    mem: int = 1024,
    gpus: int = 0,
    at: float = 0.0,
    interval: float = 1e9,
    cost: float = 1.0,
    cooperative: bool = True,
) -> SimJob:
    return SimJob(key, "test", at, c, gpus, mem, work, interval, cost, 30.0, cooperative)


def run(
    load: OnlineLoad, jobs: list[SimJob], policy: SimPolicy = PLAIN, **kwargs: object
) -> tuple[Simulation, Tally]:
    kwargs.setdefault("backlogged", False)
    sim = Simulation(load, jobs, policy, latencies=Fixed(), debug=True, **kwargs)  # type: ignore[arg-type]
    return sim, sim.run()


def test_one_job_on_an_idle_device() -> None:
    """Dispatched at the 0.5 s tick, runs from 0.7 s, done 100 s later."""
    _, t = run(online([(0.0, 0.0, 0.0)], span=1000.0), [job(work=100.0)])
    f = t.figures(0.0)
    assert t.progress_cs == pytest.approx(100.0 * 50.0)
    assert t.spare_cs == pytest.approx(1000.0 * 100.0)
    assert f["harvest_efficiency"] == pytest.approx(0.05)
    assert f["utilization_before"] == 0.0
    assert f["utilization_after"] == pytest.approx(0.05)
    assert f["jobs_completed"] == 1
    assert f["jct_p50_s"] == f["jct_p99_s"] == pytest.approx(100.7)
    assert (f["evictions"], f["oom_events"], f["interference_compute_frac"]) == (0, 0, 0.0)


def test_compute_spike_evicts_checkpoints_and_resumes() -> None:
    """Online compute jumps to 90 % at t=100 over a 50 % slice, and back to 0 at t=200.

    The agent sees it at 100.02 and warns; the job stops computing at 100.12 (40 % of
    online demand did not fit for 0.12 s), checkpoints for 1 s and is free at 101.12.  The
    fall is heard at 200.52, the job dispatched again at the 201.0 tick and, after 30 s
    restoring (201.2-231.2), finishes its remaining 900.68 s at 1131.88.  Its 0.02 s of
    progress on compute the online side wanted (100-100.02, 40 % over) is not harvest.
    """
    load = online([(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (200.0, 0.0, 0.0)], span=1200.0)
    _, t = run(load, [job(work=1000.0, cost=1.0)])
    f = t.figures(0.0)
    assert t.interference_cs == pytest.approx(40.0 * 0.12)
    assert f["interference_compute_frac"] == pytest.approx(4.8 / 9000.0, rel=1e-4)
    assert f["evictions"] == 1
    assert t.eviction_latency_s == [pytest.approx(1.12)]
    assert f["deadline_misses"] == 0
    assert f["wasted_work_frac"] == 0.0
    assert f["jobs_completed"] == 1
    assert f["jct_p50_s"] == pytest.approx(1131.9, abs=0.05)
    assert t.progress_cs == pytest.approx(1000.0 * 50.0)
    assert f["harvest_efficiency"] == pytest.approx((50000.0 - 0.8) / (120000.0 - 9000.0))
    held_s = (101.12 - 0.5) + (1131.88 - 201.0)
    assert t.slice_cs == pytest.approx(50.0 * held_s)
    assert t.restart_cs == pytest.approx(50.0 * 30.0)
    assert f["restart_overhead_frac"] == pytest.approx(30.0 / held_s, rel=1e-5)
    assert (f["pauses"], f["paused_frac"]) == (0, 0.0)
    assert f["utilization_before"] == pytest.approx(9000.0 / 120000.0)
    assert f["utilization_after"] == pytest.approx((9000.0 - 4.8 + 50000.0) / 120000.0)


def test_stubborn_job_is_killed_at_the_deadline_and_loses_work() -> None:
    """It checkpoints at 50.7-51.7 (50 s saved), ignores the warning at 80.02, is killed at
    deadline − 0.15 s = 109.87 and reaped at 109.88: 28.32 s of progress lost, and its
    40 % of overflow held the online side back all that time.  Of what it kept, the 0.02 s
    run at 80-80.02 on compute the online side wanted (40 % over) is not harvest."""
    load = online([(0.0, 0.0, 0.0), (80.0, 90.0, 0.0)], span=300.0)
    _, t = run(load, [job(work=1000.0, interval=50.0, cost=1.0, cooperative=False)])
    f = t.figures(0.0)
    assert (f["evictions"], t.evictions_killed, f["deadline_misses"]) == (1, 1, 0)
    assert t.eviction_latency_s == [pytest.approx(29.88)]
    assert t.lost_cs == pytest.approx(28.32 * 50.0)
    assert t.progress_cs == pytest.approx(78.32 * 50.0)
    assert f["wasted_work_frac"] == pytest.approx(28.32 / 78.32, rel=1e-5)
    kept = 50.0 * 50.0 - 40.0 * 0.02
    assert f["harvest_efficiency"] == pytest.approx(kept / (30000.0 - 19800.0), rel=1e-5)
    assert t.interference_cs == pytest.approx(40.0 * 29.88)


def test_online_memory_that_does_not_fit_is_an_oom_unless_forecast() -> None:
    """Online memory 6 GiB, down to 2 GiB at t=50, back to 6 GiB at t=100, on a 10 GiB
    device; a 6 GiB job arrives at t=60.  Without a forecast it is placed and the online
    side's return is an OOM; the forecast keeps the way back to the peak in reserve."""
    load = online(
        [(0.0, 0.0, 6 * GIB), (50.0, 0.0, 2 * GIB), (100.0, 0.0, 6 * GIB)],
        span=200.0,
        memory_mib=10 * GIB,
    )
    jobs = [job(c=10.0, work=1000.0, mem=6 * 1024, at=60.0)]
    _, plain = run(load, jobs)
    assert (plain.oom_events, plain.evictions, plain.dispatches) == (1, 1, 1)
    forecast = SimPolicy("fc", margins=Margins(0.0, 0.0), forecast=ForecastSettings(warmup_s=0))
    _, careful = run(load, jobs, forecast)
    assert (careful.oom_events, careful.dispatches) == (0, 0)


def test_whole_gpu_job_yields_compute_and_progresses_on_what_is_left() -> None:
    """Online 40 %: a whole-GPU job progresses at 0.6 s per second and interferes with
    nothing; its 100 s of work take 166.67 s."""
    _, t = run(online([(0.0, 40.0, 0.0)], span=400.0), [job(c=100.0, gpus=1, work=100.0)])
    f = t.figures(0.0)
    assert f["jct_p50_s"] == pytest.approx(0.7 + 100.0 / 0.6, abs=0.05)
    assert t.interference_cs == 0.0
    assert t.progress_cs == pytest.approx(100.0 * 100.0)


def test_exclusive_harvests_nothing() -> None:
    load = online([(0.0, 10.0, 0.0), (100.0, 0.0, 0.0)], span=1000.0)
    _, t = run(load, [job()], EXCLUSIVE, backlogged=True)
    f = t.figures(0.0)
    assert (t.dispatches, f["harvest_efficiency"], f["jobs_completed"]) == (0, 0.0, 0)
    assert f["utilization_after"] == f["utilization_before"] == pytest.approx(1000.0 / 100000.0)


def test_static_night_runs_only_in_its_window_and_ignores_online_load() -> None:
    """The trace starts at 21:00; the window is 22:00-07:00, i.e. t = 3600 … 36000.
    Online compute at 90 % from t=10000 to 20000 evicts nothing (40 % of it does not fit
    beside the 50 % slice for those 10000 s); the window's close evicts the job."""
    load = online(
        [(0.0, 0.0, 0.0), (10000.0, 90.0, 0.0), (20000.0, 0.0, 0.0)],
        span=12 * 3600.0,
        origin=21 * 3600.0,
    )
    rec = Recorder.for_load(load, 0)
    _, t = run(load, [job(work=1e6)], STATIC_NIGHT, recorder=rec)
    busy = [p[0] for p in rec.device if p[2] > 0]
    assert min(busy) == pytest.approx(3600.5)
    idle_after = [p[0] for p in rec.device if p[0] > 36000.0]
    assert idle_after and all(p[2] == 0 for p in rec.device if p[0] >= 36000.0 + 2.0)
    assert t.progress_cs == pytest.approx((36000.0 - 3600.7) * 50.0)
    assert t.interference_cs == pytest.approx(40.0 * 10000.0)
    assert t.evictions == 1


def test_greedy_has_no_margin_and_ebbtide_keeps_one() -> None:
    """Online at 50 %: a 50 % job fits greedy's headroom exactly, not ebbtide's."""
    load = online([(0.0, 50.0, 0.0)], span=100.0)
    assert (GREEDY.margins, GREEDY.forecast) == (Margins(0.0, 0.0), None)
    assert run(load, [job()], GREEDY)[1].dispatches == 1
    assert run(load, [job()], ebbtide_policy())[1].dispatches == 0


def test_greedy_evicts_the_latest_started_blind_to_checkpoints() -> None:
    """Job 1 (from 0.7 s, checkpointing every 10 s) and job 2 (from 50.7 s, never) hold
    40 % each; online rises to 60 % at t=100 and one must go.  The checkpoint-aware policy
    takes job 1 (under 10 s lost), greedy takes job 2 (started last)."""
    load = online([(0.0, 0.0, 0.0), (100.0, 60.0, 0.0)], span=150.0)
    jobs = [
        job(0, c=40.0, work=1e6, interval=10.0, cost=0.1),
        job(1, c=40.0, work=1e6, at=50.0),
    ]
    aware, _ = run(load, jobs)
    blind, _ = run(load, jobs, GREEDY)
    assert [j.id for j in aware.backlog.heads(5)] == [1]
    assert [j.id for j in blind.backlog.heads(5)] == [2]


def test_backlogged_queue_never_runs_dry() -> None:
    """One 100 s job, repeated: the device runs copy after copy for the whole span."""
    _, t = run(online([(0.0, 0.0, 0.0)], span=1000.0), [job(work=100.0)], backlogged=True)
    assert t.jobs_completed == 2 * 9  # two 50 % slices at a time, 100.5 s per round
    assert t.figures(0.0)["harvest_efficiency"] > 0.9


def test_device_leaving_the_trace_evicts_its_slices() -> None:
    load = online([(0.0, 0.0, 0.0)], span=1000.0)
    short = OnlineLoad(
        "test", (DeviceLoad("d0", (0.0,), (0.0,), (0.0,), 300.0),), 80 * GIB, 1000.0, 0.0, 60.0
    )
    _, whole = run(load, [job(work=1e6)])
    _, cut = run(short, [job(work=1e6)])
    assert (whole.evictions, cut.evictions) == (0, 1)
    assert cut.spare_cs == pytest.approx(300.0 * 100.0)
    assert cut.progress_cs == pytest.approx((300.0 - 0.7) * 50.0)


def test_a_run_collects_garbage_less_often_and_restores_the_thresholds() -> None:
    """The run changes the collector's thresholds for its own length only."""
    seen: list[tuple[int, int, int]] = []
    before = gc.get_threshold()
    sim = Simulation(online([(0.0, 0.0, 0.0)], span=50.0), [job()], PLAIN, latencies=Fixed())
    sim._handlers[_STEP] = lambda *_: seen.append(gc.get_threshold())
    sim.run()
    assert seen == [RUN_GC_THRESHOLDS]
    assert gc.get_threshold() == before


def test_nothing_is_done_after_the_span() -> None:
    _, t = run(online([(0.0, 0.0, 0.0)], span=50.0), [job(work=1000.0)])
    assert t.jobs_completed == 0
    assert t.progress_cs == pytest.approx(49.3 * 50.0)
    assert math.isclose(t.capacity_cs, 5000.0)


def test_whole_gpu_rate_follows_online_load_changed_during_a_checkpoint() -> None:
    """Runs at full rate to its checkpoint at 50.7-60.7 (50 s saved); online compute rose
    to 50 % at t=55, so it resumes at half rate: 25 s more by its next checkpoint at
    110.7-120.7, and the last 25 s take 50 s: done at 170.7."""
    load = online([(0.0, 0.0, 0.0), (55.0, 50.0, 0.0)], span=400.0)
    _, t = run(load, [job(c=100.0, gpus=1, work=100.0, interval=50.0, cost=10.0)])
    assert t.jct_s == [pytest.approx(170.7)]
