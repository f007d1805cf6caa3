"""Suspend to host in the simulator: a memory spike moves a job's memory to host rather than
evicting it, where the live node could (the copy fits the deadline and half the lease, the
host has room); it is restored when memory fits again, or moved after ``max_suspend_s``.

Delays are fixed (:class:`Fixed`): the agent sees a step 0.02 s after it; a copy of ``m``
MiB to or from host takes 0.5 + m / 10,000 s (the agent's own estimate); a paused job's
compute is free 0.05 s after the pause; a dispatched job runs 0.2 s after the 0.5 s tick.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ebbtide.config.policy import Policy
from ebbtide.preemption.enforcer import KILL_LEAD_S
from ebbtide.scheduling.snapshot import Margins, PauseRules
from ebbtide.sim.engine import Simulation
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.metrics import Tally
from ebbtide.sim.online import OnlineLoad
from ebbtide.sim.policies import SimPolicy, ebbtide_policy, from_policy_file
from ebbtide.workers.suspend import suspend_time_s
from tests.unit.sim_builders import Fixed, online

GIB = 1024.0
RULES = PauseRules(drain_s=0.05, min_pause_s=5.0, suspend=True, max_suspend_s=1800.0)
#: margins 0 for compute, 2 GiB for memory; no forecast; the built-in lease (5 s)
SUSPENDING = SimPolicy("suspending", margins=Margins(0.0, 2 * GIB), pause=RULES, lease_s=5.0)
#: online memory rises to 71 GiB at t=100 (an 8 GiB slice no longer fits within the
#: margin) and falls back at t=200
MEMORY_SPIKE = [(0.0, 10.0, 0.0), (100.0, 10.0, 71 * GIB), (200.0, 10.0, 0.0)]


def job(work: float = 1000.0, *, mem: int = 8 * 1024, ckpt_every: float = 1e9) -> SimJob:
    return SimJob(0, "test", 0.0, 50.0, 0, mem, work, ckpt_every, 1.0, 30.0)


def run(
    load: OnlineLoad, jobs: list[SimJob], policy: SimPolicy = SUSPENDING, **kwargs: Any
) -> Tally:
    kwargs.setdefault("backlogged", False)
    return Simulation(load, jobs, policy, latencies=Fixed(), debug=True, **kwargs).run()


def test_a_memory_spike_suspends_and_the_fall_restores_without_a_restart() -> None:
    """Seen at 100.02: suspended (paused at once, its 8 GiB off the GPU 1.32 s later).
    Seen to fall at 200.02: restored (its memory back at once), running again once the
    copy back is done at 201.34.  No eviction, no restart: 1,000 s of work done at
    0.7 + 1000 + (201.34 - 100.02)."""
    copy_s = suspend_time_s(8 * 1024)
    t = run(online(MEMORY_SPIKE, span=1500.0), [job()], restart_overhead_s=60.0)
    assert (t.suspensions, t.restores, t.evictions, t.pauses, t.dispatches) == (1, 1, 0, 0, 1)
    assert t.oom_events == 0
    assert t.jct_s == [pytest.approx(0.7 + 1000.0 + (200.02 + copy_s - 100.02))]
    assert t.restart_cs == 0.0
    assert t.paused_cs == pytest.approx(50.0 * (200.02 + copy_s - 100.02))


def test_without_suspend_the_same_spike_evicts() -> None:
    off = dataclasses.replace(SUSPENDING, pause=dataclasses.replace(RULES, suspend=False))
    t = run(online(MEMORY_SPIKE, span=1500.0), [job()], off)
    assert (t.suspensions, t.evictions, t.dispatches) == (0, 1, 2)


def test_a_job_whose_copy_would_outlast_half_the_lease_is_evicted() -> None:
    """24 GiB take 0.5 + 2.46 s to copy: more than half the 5 s lease."""
    assert suspend_time_s(24 * 1024) > 2.5
    spike = [(0.0, 10.0, 0.0), (100.0, 10.0, 55 * GIB), (200.0, 10.0, 0.0)]
    t = run(online(spike, span=1500.0), [job(mem=24 * 1024)])
    assert (t.suspensions, t.evictions) == (0, 1)


def test_a_host_without_room_for_it_evicts() -> None:
    """1 % of the device's 256 GiB share of host memory is less than the job's 8 GiB."""
    tight = dataclasses.replace(SUSPENDING, pause=dataclasses.replace(RULES, host_memory_pct=1.0))
    t = run(online(MEMORY_SPIKE, span=1500.0), [job()], tight)
    assert (t.suspensions, t.evictions) == (0, 1)


def test_a_job_suspended_past_max_suspend_is_killed_at_its_deadline_and_moved() -> None:
    """Online memory stays high on d0; d1 is free.  Suspended at 100.02, the agent looks
    again 60 s later and moves it: it cannot take the warning (its CUDA calls block), so it
    is killed at the deadline and resumes on d1 from its last checkpoint."""
    rules = dataclasses.replace(RULES, max_suspend_s=60.0)
    policy = dataclasses.replace(SUSPENDING, pause=rules)
    d0 = [(0.0, 10.0, 0.0), (100.0, 10.0, 71 * GIB)]
    d1 = [(0.0, 100.0, 80 * GIB), (50.0, 0.0, 0.0)]  # full until the job is placed on d0
    t = run(online(d0, d1, span=3000.0), [job(ckpt_every=40.0)], policy)
    assert (t.suspensions, t.restores, t.evictions_suspended, t.evictions_killed) == (1, 0, 1, 1)
    assert (t.deadline_misses, t.oom_events, t.jobs_completed, t.dispatches) == (0, 0, 1, 2)
    assert t.eviction_latency_s == [pytest.approx(30.0 - KILL_LEAD_S + 0.01)]


def test_the_policy_file_and_the_builtin_policy_say_whether_to_suspend() -> None:
    builtin = ebbtide_policy()
    assert not builtin.pause.suspend  # suspend_to_host: never, as the product's default
    assert builtin.lease_s == Policy().defaults.heartbeat_timeout_s / 2
    auto = Policy.model_validate(
        {"defaults": {"suspend_to_host": "auto", "heartbeat_timeout_s": "20s"}}
    )
    sim = from_policy_file(auto)
    assert sim.pause.suspend and sim.lease_s == 10.0


# -- traps a review found: each of these broke the bookkeeping or the agent's timing ----


def test_a_suspended_whole_gpu_job_stands_still_while_online_compute_moves() -> None:
    """A whole-GPU slice runs on what online work leaves, so an online compute step
    re-times it; suspended, it must not run (nor checkpoint) on that account: the day
    ends the same as with online compute steady meanwhile."""
    whole = dataclasses.replace(job(work=2000.0, ckpt_every=20.0), compute_pct=100.0, gpus=1)
    steady = [(0.0, 10.0, 0.0), (100.0, 10.0, 71 * GIB), (300.0, 10.0, 0.0)]
    moving = [*steady[:2], (150.0, 20.0, 71 * GIB), (200.0, 10.0, 71 * GIB), steady[2]]
    quiet = run(online(steady, span=4000.0), [whole])
    moved = run(online(moving, span=4000.0), [whole])
    assert (moved.suspensions, moved.restores, moved.evictions) == (1, 1, 0)
    assert moved.jct_s == quiet.jct_s
    assert moved.progress_cs == pytest.approx(quiet.progress_cs)


def test_a_job_freed_before_its_copy_to_host_ends_is_counted_off_the_gpu_once() -> None:
    """Suspended at 100.02 (its copy takes 1.32 s), it is moved when its device leaves
    at 100.05 and killed at its 1.4 s deadline, before the copy would have ended: the
    device's memory sums stay right (``debug`` checks them at every change)."""
    short = dataclasses.replace(job(), deadline_s=1.4)
    assert suspend_time_s(short.memory_mib) < short.deadline_s
    load = online(MEMORY_SPIKE, span=400.0)
    gone = dataclasses.replace(load.devices[0], end_s=100.05)
    t = run(dataclasses.replace(load, devices=(gone,)), [short])
    assert (t.suspensions, t.evictions_suspended, t.deadline_misses) == (1, 1, 0)


def test_the_agent_samples_again_once_a_copy_back_is_done() -> None:
    """Online memory falls at 200 (restored from 200.02, the copy done at 201.34) and
    rises again at 200.5, while the agent waits for the copy: its next sample, once the
    copy is done, suspends the job again, and the fall at 900 restores it."""
    spike = [*MEMORY_SPIKE, (200.5, 10.0, 71 * GIB), (900.0, 10.0, 0.0)]
    t = run(online(spike, span=3000.0), [job()])
    assert (t.suspensions, t.restores, t.evictions, t.oom_events) == (2, 2, 0, 0)


def test_a_suspension_the_host_has_no_room_for_any_more_evicts() -> None:
    """Two 8 GiB jobs on a device whose share of host memory takes one (4 % of 256 GiB):
    spike that needs both gone (63 GiB online, a 10 GiB margin) suspends the first and
    evicts the second."""
    one = dataclasses.replace(
        SUSPENDING,
        margins=Margins(0.0, 10 * GIB),
        pause=dataclasses.replace(RULES, host_memory_pct=4.0),
    )
    two = [dataclasses.replace(job(), compute_pct=40.0, key=k) for k in (0, 1)]
    spike = [(0.0, 10.0, 0.0), (100.0, 10.0, 63 * GIB), (200.0, 10.0, 0.0)]
    t = run(online(spike, span=2000.0), two, one)
    assert (t.suspensions, t.evictions, t.oom_events, t.deadline_misses) == (1, 1, 0, 0)
