"""The planner and devices out of service (a fault, an admin's drain) or measured by a
planning-only source: nothing new goes to the first, no online eviction on the second."""

from __future__ import annotations

import dataclasses

from ebbtide.scheduling.planner import plan

from .builders import NOW, att, dev, job, snap


def test_no_dispatch_to_a_device_out_of_service() -> None:
    broken = dataclasses.replace(dev(i=0), unavailable="n/0 is out of service: XID 79")
    p = plan(snap([job(1), job(2, gpus=1)], devices=[broken, dev(i=1, oc=40)]))
    assert [(d.job_id, d.devices) for d in p.dispatches] == [(1, (1,))]
    assert "no device" in p.blocked[2] or "headroom" in p.blocked[2]


def test_every_device_out_of_service_says_why() -> None:
    drained = dataclasses.replace(dev(i=0), unavailable="n drained by root: upgrade")
    p = plan(snap([job(1)], devices=[drained]))
    assert p.dispatches == []
    assert p.blocked[1] == "waiting: no device takes work (n drained by root: upgrade)"


def test_an_unavailable_device_keeps_its_running_slices() -> None:
    # out of service means no new work; taking running slices back is the agent's job
    broken = dataclasses.replace(dev(i=0), unavailable="n/0 is out of service")
    p = plan(snap([], [att(1)], [broken]))
    assert p.evictions == []


def test_planning_only_figures_never_evict_but_still_bound_admission() -> None:
    slow = dataclasses.replace(dev(i=0, om=80_000, oc=99), planning_only=True)
    p = plan(snap([job(2)], [att(1, m=20_000)], [slow]))
    assert p.evictions == []
    assert p.dispatches == []  # no headroom on the figures it has


def test_a_drained_device_is_named_when_the_others_have_no_room() -> None:
    drained = dataclasses.replace(dev(i=0), unavailable="n/0 drained by alice: fan")
    full = dev(i=1, om=80_000)
    p = plan(snap([job(1)], devices=[drained, full]))
    assert p.blocked[1] == (
        "waiting for headroom: no device has 10% and 1GiB free (margin included); "
        "not taking work: n/0 drained by alice: fan"
    )


def test_a_cooling_device_is_named_when_the_others_have_no_room() -> None:
    cooling = dataclasses.replace(dev(i=0), cooldown_until=NOW + 20)
    full = dev(i=1, om=80_000)
    p = plan(snap([job(1)], devices=[cooling, full]))
    assert p.blocked[1].startswith("waiting for headroom: no device has 10%")
    assert "cooling down after an eviction: n/0 until" in p.blocked[1]


def test_every_cause_is_listed_when_no_device_takes_work() -> None:
    devices = [
        dataclasses.replace(dev(i=0), unavailable="n/0 is out of service: XID 79"),
        dataclasses.replace(dev(i=1), unavailable="n/1 drained by bob: fan"),
    ]
    p = plan(snap([job(1)], devices=devices))
    assert p.blocked[1] == (
        "waiting: no device takes work (n/0 is out of service: XID 79, n/1 drained by bob: fan)"
    )


def test_the_reserve_kept_back_is_named_and_the_cold_one_says_so() -> None:
    """A fresh box is idle, yet an 80% job waits: the reason says what is kept back."""
    idle = dataclasses.replace(
        dev(i=0), reserve_compute_pct=30, reserve_memory_mib=8192, reserve_cold_for_s=420
    )
    p = plan(snap([job(1, c=80)], devices=[idle]))
    assert p.blocked[1] == (
        "waiting for headroom: no device has 80% and 1GiB free (margin included); "
        "n/0 keeps 30% and 8GiB back for the online side's growth (the cold reserve, "
        "while its agent learns the online load: defaults.forecast_warmup_s)"
    )
    warm = dataclasses.replace(idle, reserve_cold_for_s=0)
    p = plan(snap([job(1, c=80)], devices=[warm]))
    assert p.blocked[1].endswith("n/0 keeps 30% and 8GiB back for the online side's growth")


def test_a_whole_gpu_job_is_told_when_other_jobs_hold_every_device() -> None:
    """Both devices run whole-GPU jobs: the reason says so, not only what the online side
    keeps back (a new user's trial read it as an online problem)."""
    held = [att(1, devices=(0,), gpus=1, c=100), att(2, devices=(1,), gpus=1, c=100)]
    p = plan(snap([job(3, gpus=1)], held, [dev(i=0), dev(i=1)]))
    assert p.dispatches == []
    assert p.blocked[3] == (
        "waiting for headroom: no device has 1 whole GPU(s) and 1GiB free (margin included); "
        "every device runs other jobs' slices"
    )
    # one device free of other jobs: no such note
    p = plan(snap([job(3, gpus=1, m=90_000)], held[:1], [dev(i=0), dev(i=1)]))
    assert "other jobs" not in p.blocked[3]
