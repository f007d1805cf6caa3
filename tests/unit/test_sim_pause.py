"""The graduated response in the simulator: a compute spike pauses, memory still evicts, a
pause too long moves the job, a thaw costs no restart; and the figures built on it.

Delays are fixed (:class:`Fixed`): the agent sees a step 0.02 s after it, a cooperative job
is out of the way 0.1 s after the warning (plus its checkpoint).  A paused job's compute is
free ``drain_s`` (0.05 s) after the pause; the scheduler plans on 0.5 s ticks and a
dispatched job runs 0.2 s later (plus the restart overhead when resumed).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from ebbtide.scheduling.snapshot import Margins, PauseRules
from ebbtide.sim.engine import Simulation
from ebbtide.sim.jobs import SimJob, synthetic
from ebbtide.sim.metrics import Tally
from ebbtide.sim.online import DeviceLoad, OnlineLoad
from ebbtide.sim.policies import NO_PAUSE, SimPolicy, baselines, ebbtide_policy
from ebbtide.sim.runner import run_policies
from ebbtide.sim.state import CHECKPOINTING, RESTORING, STARTING, SimAttempt, SimDevice, SimJobState
from tests.unit.sim_builders import Fixed, online

GIB = 1024.0
RULES = PauseRules(drain_s=0.05, max_pause_s=600.0, thaw_hysteresis_pct=10.0, min_pause_s=5.0)
#: margins 0, no forecast: the arithmetic stays visible
PAUSING = SimPolicy("pausing", margins=Margins(0.0, 0.0), pause=RULES)
EVICTING = dataclasses.replace(PAUSING, name="evicting", pause=NO_PAUSE)


def job(work: float = 1000.0, *, c: float = 50.0, mem: int = 1024) -> SimJob:
    return SimJob(0, "test", 0.0, c, 0, mem, work, 1e9, 1.0, 30.0)


def run(
    load: OnlineLoad, jobs: list[SimJob], policy: SimPolicy = PAUSING, **kwargs: Any
) -> tuple[Simulation, Tally]:
    kwargs.setdefault("backlogged", False)
    sim = Simulation(load, jobs, policy, latencies=Fixed(), debug=True, **kwargs)
    return sim, sim.run()


def test_a_compute_spike_pauses_and_the_fall_thaws_without_a_restart() -> None:
    """Online compute 90 % from t=100 to 200 over a 50 % slice (memory steady).  The agent
    sees it at 100.02 and pauses the job; its compute is free at 100.07 (40 % of online
    demand did not fit for 0.07 s).  It sees the fall at 200.02 and thaws the job, which
    goes on at once (no restart) and finishes its 900.68 s left at 1100.70."""
    load = online([(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (200.0, 0.0, 0.0)], span=1200.0)
    _, t = run(load, [job()], restart_overhead_s=30.0)
    f = t.figures(0.0)
    assert (f["pauses"], t.thaws, f["evictions"], t.dispatches) == (1, 1, 0, 1)
    assert t.jct_s == [pytest.approx(1100.7)]
    assert t.interference_cs == pytest.approx(40.0 * 0.07)
    assert t.paused_cs == pytest.approx(50.0 * 100.0)
    assert t.slice_cs == pytest.approx(50.0 * 1100.2)
    assert f["paused_frac"] == pytest.approx(100.0 / 1100.2, rel=1e-5)
    assert (t.restart_cs, f["restart_overhead_frac"]) == (0.0, 0.0)
    # 0.02 s of progress (100-100.02) ran on compute the online side wanted
    assert t.harvest_cs == pytest.approx(50.0 * 1000.0 - 40.0 * 0.02)


def test_without_pausing_the_same_spike_evicts_and_the_resume_pays_the_restart() -> None:
    load = online([(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (200.0, 0.0, 0.0)], span=1200.0)
    _, t = run(load, [job()], EVICTING, restart_overhead_s=30.0)
    assert (t.pauses, t.evictions, t.dispatches) == (0, 1, 2)
    assert t.restart_cs == pytest.approx(50.0 * 30.0)
    assert t.jct_s == [pytest.approx(1131.88)]


def test_the_restart_overhead_is_a_parameter() -> None:
    load = online([(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (200.0, 0.0, 0.0)], span=1200.0)
    _, t = run(load, [job()], EVICTING, restart_overhead_s=60.0)
    assert t.jct_s == [pytest.approx(1161.88)]
    assert t.figures(0.0)["restart_overhead_frac"] == pytest.approx(
        60.0 / ((101.12 - 0.5) + (1161.88 - 201.0)), rel=1e-5
    )


def test_a_thaw_waits_for_room_with_the_hysteresis() -> None:
    """After the spike online compute falls to 45 %: 50 % of slice plus 10 % hysteresis do
    not fit beside it, so the job stays paused until online falls to 40 % at t=300."""
    load = online(
        [(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (200.0, 45.0, 0.0), (300.0, 40.0, 0.0)],
        span=1500.0,
    )
    _, t = run(load, [job()])
    assert (t.pauses, t.thaws, t.evictions) == (1, 1, 0)
    assert t.paused_cs == pytest.approx(50.0 * 200.0)


#: a 2 GiB memory margin: online memory can rise past it without an OOM
MEMORY_MARGIN = dataclasses.replace(PAUSING, margins=Margins(0.0, 2 * GIB))


def test_a_memory_spike_still_evicts() -> None:
    """Online memory rises to 71 GiB: the slice's 8 GiB no longer fit within the 2 GiB
    margin.  A pause would free no memory, so the job is evicted even with pausing on."""
    load = online([(0.0, 10.0, 0.0), (100.0, 10.0, 71 * GIB)], span=400.0)
    _, t = run(load, [job(mem=8 * 1024)], MEMORY_MARGIN)
    assert (t.pauses, t.evictions, t.oom_events) == (0, 1, 0)


def test_a_paused_job_keeps_its_memory_and_is_evicted_when_memory_runs_short() -> None:
    """Paused for compute at 100.02; at t=150 online memory rises to 71 GiB, past what
    its 8 GiB leave within the margin: it is thawed to take its warning and evicted."""
    load = online(
        [(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (150.0, 90.0, 71 * GIB)],
        span=400.0,
    )
    _, t = run(load, [job(mem=8 * 1024)], MEMORY_MARGIN)
    assert (t.pauses, t.evictions, t.evictions_paused, t.oom_events) == (1, 1, 1, 0)


def test_a_job_paused_past_max_pause_is_moved() -> None:
    """The job starts on d0, where online compute rises to 90 % at t=100 and stays; d1 is
    idle.  Paused at 100.02, the agent looks again 60 s (+0.02 s) later and evicts it; it
    checkpoints (1 s), is free at 161.14 and resumes at the 161.5 tick on d1 (d0 has no
    room), restoring 30 s, then runs undisturbed: done at 1092.38."""
    rules = dataclasses.replace(RULES, max_pause_s=60.0)
    load = online(
        [(0.0, 0.0, 0.0), (100.0, 90.0, 0.0)],
        [(0.0, 0.0, 0.0)],
        span=1500.0,
    )
    _, t = run(load, [job()], dataclasses.replace(PAUSING, pause=rules), restart_overhead_s=30.0)
    assert (t.pauses, t.evictions, t.evictions_paused, t.dispatches) == (1, 1, 1, 2)
    assert t.eviction_latency_s == [pytest.approx(1.1)]
    assert t.jct_s == [pytest.approx(1092.38)]
    assert t.restart_cs == pytest.approx(50.0 * 30.0)


def test_a_job_paused_past_max_pause_that_fits_again_runs_on_in_place() -> None:
    """Paused at 100.02; online compute falls to 45 % at t=130, where the 50 % slice fits
    but not with the 10 % hysteresis.  When its pause runs out (the agent looks at
    160.04) it is thawed where it is instead of moved: no eviction, no restart."""
    rules = dataclasses.replace(RULES, max_pause_s=60.0)
    load = online(
        [(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (130.0, 45.0, 0.0)],
        [(0.0, 0.0, 0.0)],
        span=1500.0,
    )
    _, t = run(load, [job()], dataclasses.replace(PAUSING, pause=rules), restart_overhead_s=30.0)
    assert (t.pauses, t.thaws, t.evictions, t.dispatches) == (1, 1, 0, 1)
    assert t.paused_cs == pytest.approx(50.0 * 60.02)
    assert t.restart_cs == 0.0


def spiky(seed: int, devices: int = 4, span_s: float = 3 * 3600.0) -> OnlineLoad:
    """Online compute that spikes every minute or so; memory steady at 20 GiB."""
    rng = random.Random(seed)
    out = []
    for k in range(devices):
        times, comp = [], []
        t = 0.0
        while t < span_s:
            times.append(t)
            comp.append(rng.choice([5.0, 10.0, 15.0, 20.0, rng.uniform(40.0, 95.0)]))
            t += rng.uniform(10.0, 90.0)
        out.append(DeviceLoad(f"s{k}", tuple(times), tuple(comp), (20 * GIB,) * len(times), span_s))
    return OnlineLoad("spiky", tuple(out), 80 * GIB, span_s, 0.0, 60.0)


def test_pausing_cuts_evictions_on_compute_spikes() -> None:
    load = spiky(1)
    stream = synthetic(1, span_s=load.span_s)
    figures, _ = run_policies(
        load,
        stream,
        [ebbtide_policy(), dataclasses.replace(ebbtide_policy(pause=NO_PAUSE), name="no-pause")],
        seed=1,
    )
    paused, evicting = figures["ebbtide"], figures["no-pause"]
    assert paused["pauses"] > 0 and evicting["pauses"] == 0
    assert evicting["evictions"] >= 10 * max(1, paused["evictions"])
    assert paused["restart_overhead_frac"] < evicting["restart_overhead_frac"]
    assert paused["harvest_efficiency"] > evicting["harvest_efficiency"]
    for f in figures.values():
        assert (f["oom_events"], f["deadline_misses"]) == (0, 0)


@pytest.mark.parametrize("backlogged", [True, False])
def test_conservation_holds_with_pausing(backlogged: bool) -> None:
    load = spiky(2)
    sim = Simulation(
        load,
        synthetic(2, span_s=load.span_s),
        ebbtide_policy(pause=dataclasses.replace(RULES, max_pause_s=120.0)),
        backlogged=backlogged,
        arrival_scale=2.0,
        seed=2,
        debug=True,
    )
    t = sim.run()
    assert t.pauses > 0 and t.evictions_paused > 0
    assert t.harvest_cs <= t.progress_cs + 1e-6


def test_same_seed_same_figures_with_pausing() -> None:
    def figures() -> dict[str, dict[str, Any]]:
        load = spiky(3)
        out, _ = run_policies(load, synthetic(3, span_s=load.span_s), [ebbtide_policy()], seed=3)
        for f in out.values():
            f.pop("sim_wall_s")
        return out

    first = figures()
    assert first["ebbtide"]["pauses"] > 0
    assert first == figures()


def test_harvest_never_exceeds_one_for_any_policy() -> None:
    """Online compute at 85 % all night: static-night runs its slices at full speed beside
    it regardless (its progress is several times what was spare); only what was spare
    counts, the rest is interference."""
    span = 4 * 3600.0
    heavy = OnlineLoad(
        "heavy",
        tuple(DeviceLoad(f"h{k}", (0.0,), (85.0,), (8 * GIB,), span) for k in range(3)),
        80 * GIB,
        span,
        23 * 3600.0,
        60.0,
    )
    stream = synthetic(4, span_s=span)
    figures, _ = run_policies(heavy, stream, [ebbtide_policy(), *baselines()], seed=4)
    for f in figures.values():
        assert 0.0 <= f["harvest_efficiency"] <= 1.0
    night = Simulation(heavy, stream, baselines()[1], seed=4).run()
    assert night.progress_cs > 2 * night.spare_cs  # the old figure: progress ÷ spare > 2
    assert night.harvest_cs <= night.spare_cs
    assert night.figures(0.0)["interference_compute_frac"] > 0.5


@pytest.mark.parametrize(
    ("phase", "field", "before", "after"),
    [
        pytest.param(STARTING, "up_at", 40.5, 100.5, id="starting"),
        pytest.param(RESTORING, "run_from", 50.0, 110.0, id="restoring"),
        pytest.param(CHECKPOINTING, "ckpt_end", 41.0, 101.0, id="checkpointing"),
    ],
)
def test_a_thaw_leaves_what_was_left_of_the_phase(
    phase: int, field: str, before: float, after: float
) -> None:
    """Paused at t=40 and thawed at t=100: the phase's end moves by the 60 s paused."""
    dev = SimDevice(0, DeviceLoad("d", (0.0,), (0.0,), (0.0,), 1.0), "n", 1024.0)
    att = SimAttempt(SimJobState(1, job(), 0.0), 2, dev, 40.3, 50.0, 0.0, 0.0, phase=phase)
    att.up_at, att.ckpt_end, att.paused_at = 40.5, 41.0, 40.0
    assert getattr(att, field) == before
    att.thaw(100.0)
    assert getattr(att, field) == pytest.approx(after)
    assert att.phase_end() == pytest.approx(after)
    assert att.paused_at is None


def test_a_pass_sees_a_pause_run_out_before_the_agent_does() -> None:
    """Paused at 100.02 with max_pause_s 60.47: the pause runs out at 160.49, the agent
    looks at 160.51, but a job arriving at 160.2 makes a pass at 160.5 first.  That pass
    evicts the paused job (the device is a candidate though nothing else is to be done
    there; ``debug`` checks it decides as a pass on every device would)."""
    rules = dataclasses.replace(RULES, max_pause_s=60.47)
    load = online([(0.0, 0.0, 0.0), (100.0, 90.0, 0.0)], [(0.0, 60.0, 0.0)], span=400.0)
    late = dataclasses.replace(job(c=30.0), key=1, arrival_s=160.2)
    _, t = run(load, [job(), late], dataclasses.replace(PAUSING, pause=rules))
    assert (t.pauses, t.evictions, t.evictions_paused) == (1, 1, 1)
    assert t.eviction_latency_s == [pytest.approx(0.1 + 1.0)]  # warned at 160.5


@pytest.mark.parametrize(
    ("yaml", "enabled", "max_pause_s", "drain_s"),
    [
        pytest.param("", True, RULES.max_pause_s, RULES.drain_s, id="defaults"),
        pytest.param("defaults: {pause: false}", False, 600.0, 0.05, id="off-for-all"),
        pytest.param(
            "queues: {default: {pause: false}}", False, 600.0, 0.05, id="off-for-the-queue"
        ),
        pytest.param(
            "defaults: {max_pause_s: 2m}\nqueues: {default: {pause_drain_s: 0.2}}",
            True,
            120.0,
            0.2,
            id="own-figures",
        ),
    ],
)
def test_a_policy_file_sets_the_pause_rules(
    yaml: str, enabled: bool, max_pause_s: float, drain_s: float
) -> None:
    from ebbtide.config.policy import parse_policy
    from ebbtide.sim.policies import from_policy_file

    rules = from_policy_file(parse_policy(f"apiVersion: ebbtide/v1\n{yaml}\n")).pause
    assert (rules.enabled, rules.max_pause_s, rules.drain_s) == (enabled, max_pause_s, drain_s)


@pytest.mark.parametrize(("cooldown_s", "jct_s"), [(0.0, 1011.88), (30.0, 1032.0)])
def test_an_eviction_for_online_pressure_cools_the_device_down_from_when_it_is_free(
    cooldown_s: float, jct_s: float
) -> None:
    """Evicted for the spike at 100.02, the job checkpoints and is free at 101.12; online
    compute falls at t=110.  Without a cooldown it is back at the 111.0 tick; with the
    agent's 30 s cooldown, counted from when the slice was free, at 131.12 (a pass when
    the cooldown ends)."""
    load = online([(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (110.0, 0.0, 0.0)], span=1500.0)
    policy = dataclasses.replace(EVICTING, cooldown_s=cooldown_s)
    _, t = run(load, [job()], policy, restart_overhead_s=0.0)
    assert (t.evictions, t.dispatches) == (1, 2)
    assert t.jct_s == [pytest.approx(jct_s)]


def test_a_move_after_a_long_pause_does_not_cool_the_device_down() -> None:
    """Paused past max_pause_s and moved: that says nothing about the next online spike,
    so (as the agent does) the device takes new work at once; d0 is back to 0 % at 170."""
    rules = dataclasses.replace(RULES, max_pause_s=60.0)
    load = online([(0.0, 0.0, 0.0), (100.0, 90.0, 0.0), (170.0, 0.0, 0.0)], span=1500.0)
    policy = dataclasses.replace(PAUSING, pause=rules, cooldown_s=600.0)
    sim, t = run(load, [job()], policy, restart_overhead_s=0.0)
    assert (t.pauses, t.evictions, t.dispatches) == (1, 1, 2)
    assert sim.devices[0].cooldown_until == 0.0
