"""The planner under a policy: windows (gates), drains before a close, shares, quotas,
protections, cooldown and backoff.  Table-driven where it reads well."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ebbtide.preemption.victims import EvictReason
from ebbtide.scheduling.admission import DRAIN_LEAD_S
from ebbtide.scheduling.planner import plan
from ebbtide.scheduling.snapshot import DeviceGates, QueueGate, QueueLimits, Snapshot
from tests.unit.builders import NOW, att, dev, job, snap


def gated(s: Snapshot, **per_device: DeviceGates) -> Snapshot:
    gates = {(d.node, d.index): per_device.get(f"d{d.index}", DeviceGates()) for d in s.devices}
    return dataclasses.replace(s, gates=gates)


def open_gate(until: float = math.inf, share: float = 1.0, queue: str = "default") -> DeviceGates:
    return DeviceGates(open={queue: QueueGate(until, share)})


def closed_gate(why: str = "window 'nights' opens 22:00 UTC") -> DeviceGates:
    return DeviceGates(closed={"default": why})


def test_a_closed_queue_gets_nothing_and_says_why() -> None:
    s = gated(snap([job(1)], devices=[dev(i=0)]), d0=closed_gate())
    p = plan(s)
    assert p.dispatches == []
    assert p.blocked[1] == "waiting: window 'nights' opens 22:00 UTC"


def test_only_devices_whose_gate_is_open_take_the_queue() -> None:
    s = gated(snap([job(1)], devices=[dev(i=0), dev(i=1)]), d0=closed_gate(), d1=open_gate())
    assert [d.devices for d in plan(s).dispatches] == [(1,)]


@pytest.mark.parametrize(
    ("first_ckpt", "until_in", "placed"),
    [
        (None, 100.0, True),  # unknown: admitted (eviction covers it)
        (None, 20.0, False),  # ... unless it would be drained at once (30 s deadline)
        (60.0, 100.0, True),  # 60 s to the first checkpoint + 30 s deadline fits in 100 s
        (80.0, 100.0, False),  # 80 + 30 > 100: it could not checkpoint before the drain
        (3600.0, math.inf, True),  # no known close
    ],
)
def test_admission_needs_the_first_checkpoint_before_the_close(first_ckpt, until_in, placed):  # type: ignore[no-untyped-def]
    j = dataclasses.replace(job(1), first_checkpoint_s=first_ckpt, deadline_s=30.0)
    s = gated(snap([j], devices=[dev()]), d0=open_gate(until=NOW + until_in))
    p = plan(s)
    assert bool(p.dispatches) is placed
    if not placed:
        assert "would not fit before" in p.blocked[1]
        assert ("first checkpoint" in p.blocked[1]) is (first_ckpt is not None)


def test_drain_warns_at_close_minus_deadline_so_the_slice_is_free_by_the_close() -> None:
    close = NOW + 20.0
    active = [att(1, deadline=30.0), att(2, deadline=10.0)]
    s = gated(snap(active=active, devices=[dev()]), d0=open_gate(until=close))
    p = plan(s)
    [ev] = p.evictions
    assert ev.job_id == 1 and ev.reason == EvictReason.WINDOW_CLOSING
    assert ev.deadline_s == pytest.approx(20.0)  # free by the close, not 30 s from now
    # job 2 (10 s deadline) is warned later: the planner asks to be woken then
    assert p.wake_at == pytest.approx(close - 10.0 - DRAIN_LEAD_S)


def test_an_attempt_whose_queue_is_no_longer_admitted_is_evicted() -> None:
    s = gated(snap(active=[att(1)], devices=[dev()]), d0=closed_gate("blackout 'x' until 05:00"))
    [ev] = plan(s).evictions
    assert ev.reason == EvictReason.WINDOW_CLOSED and "blackout 'x'" in ev.message


def test_share_caps_what_offline_work_may_hold_on_a_device() -> None:
    s = gated(snap([job(1, c=60), job(2, c=40)], devices=[dev()]), d0=open_gate(share=0.5))
    p = plan(s)
    assert [d.job_id for d in p.dispatches] == [2]
    assert "share" in p.blocked[1]


def test_over_the_share_evicts_down_to_it() -> None:
    active = [att(1, c=40), att(2, c=30, started=NOW - 10)]
    s = gated(snap(active=active, devices=[dev()]), d0=open_gate(share=0.5))
    [ev] = plan(s).evictions
    assert ev.job_id == 2 and ev.reason == EvictReason.SHARE


@pytest.mark.parametrize(
    ("limits", "active", "queued", "dispatched", "words"),
    [
        (QueueLimits(max_running=1), [att(9)], [job(1)], [], "max_running 1"),
        (QueueLimits(max_running=2), [att(9)], [job(1), job(2)], [1], "max_running 2"),
        # two devices: 200 compute units; 25 % of the fleet = 50 units
        (
            QueueLimits(max_fleet_share=0.25),
            [att(9, c=40)],
            [job(1, c=20), job(2, c=10)],
            [2],
            "max_fleet_share",
        ),
        (
            QueueLimits(max_user_share=0.1),
            [att(9, c=15)],
            [job(1, c=10, owner="alice"), job(2, c=10, owner="bob")],
            [2],
            "max_user_share",
        ),
    ],
)
def test_queue_quotas(limits, active, queued, dispatched, words):  # type: ignore[no-untyped-def]
    active = [dataclasses.replace(a, owner="alice") for a in active]
    s = dataclasses.replace(
        snap(queued, active, devices=[dev(i=0), dev(i=1)]), queues={"default": limits}
    )
    p = plan(s)
    assert [d.job_id for d in p.dispatches] == dispatched
    blocked = [j.id for j in queued if j.id not in dispatched]
    for job_id in blocked:
        assert words in p.blocked[job_id]


def test_backoff_after_repeated_evictions() -> None:
    once = dataclasses.replace(job(1), evictions=1, requeued_at=NOW - 1)
    thrice = dataclasses.replace(job(2), evictions=3, requeued_at=NOW - 10)  # waits 60 s
    s = dataclasses.replace(
        snap([once, thrice], devices=[dev()]), backoff_base_s=30.0, backoff_max_s=600.0
    )
    p = plan(s)
    assert [d.job_id for d in p.dispatches] == [1]
    assert "backoff" in p.blocked[2] and "evicted 3 times" in p.blocked[2]
    assert p.wake_at == pytest.approx(NOW + 50.0)


def test_cooldown_keeps_new_work_off_a_device_that_just_evicted() -> None:
    cooling = dataclasses.replace(dev(i=0), cooldown_until=NOW + 20)
    p = plan(snap([job(1)], devices=[cooling, dev(i=1)]))
    assert [d.devices for d in p.dispatches] == [(1,)]
    p = plan(snap([job(1)], devices=[cooling]))
    assert p.dispatches == [] and "cooling down" in p.blocked[1]
    assert p.wake_at == pytest.approx(NOW + 20)


@pytest.mark.parametrize(
    ("limits", "online", "evicted"),
    [
        (QueueLimits(min_runtime_s=600), dict(oc=99), []),  # compute: protected
        (QueueLimits(min_runtime_s=600), dict(om=81000), [1]),  # memory short: anyone
        (QueueLimits(preemptible=False), dict(oc=99), []),
        (QueueLimits(preemptible=False), dict(om=81000), [1]),
        (QueueLimits(min_runtime_s=30), dict(oc=99), [1]),  # ran 60 s: past its protection
    ],
)
def test_protections_yield_only_to_memory_shortage(limits, online, evicted):  # type: ignore[no-untyped-def]
    a = att(1, c=20, m=4096, started=NOW - 60)
    s = dataclasses.replace(snap(active=[a], devices=[dev(**online)]), queues={"default": limits})
    assert [e.job_id for e in plan(s).evictions] == evicted


def test_no_policy_means_no_reasons_and_no_wakeups_needed() -> None:
    p = plan(snap([job(1)], devices=[dev()]))
    assert [d.job_id for d in p.dispatches] == [1]
    assert p.blocked == {} and p.wake_at is None
