"""The planner and devices out of service (a fault, an admin's drain) or measured by a
planning-only source: nothing new goes to the first, no online eviction on the second."""

from __future__ import annotations

import dataclasses

from ebbtide.scheduling.planner import plan

from .builders import att, dev, job, snap


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
