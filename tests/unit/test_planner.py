"""The planner: snapshot → dispatches and evictions.  Table-driven, no store, no clock.

Default device: 80 GiB on node ``n``, margins 5 % and 2 GiB, so an idle device offers
95 % compute and 79872 MiB.
"""

from __future__ import annotations

import pytest

from ebbtide.preemption.victims import Eviction, EvictReason
from ebbtide.queue.states import JobState
from ebbtide.scheduling.planner import MIN_WHOLE_GPU_HEADROOM_PCT, Dispatch, Plan, plan
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, QueuedJob, Snapshot

from .builders import NOW, att, dev, job, snap

Placement = tuple[int, str, tuple[int, ...]]


def placed(p: Plan) -> list[Placement]:
    """(job id, node, devices) of each dispatch, in decision order."""
    return [(d.job_id, d.node, d.devices) for d in p.dispatches]


def evicted(p: Plan) -> list[tuple[int, EvictReason]]:
    return [(e.job_id, e.reason) for e in p.evictions]


# -- packing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "queued", "expected"),
    [
        pytest.param(
            [dev(i=0), dev(i=1, oc=50)], [job(1, c=10)], [(1, "n", (1,))], id="tighter-compute"
        ),
        pytest.param(
            [dev(i=0), dev(i=1, om=60000)], [job(1)], [(1, "n", (1,))], id="tighter-memory"
        ),
        pytest.param(
            [dev(i=0, mem=81920), dev(i=1, mem=40960)],
            [job(1)],
            [(1, "n", (1,))],
            id="smaller-device-is-tighter",
        ),
        # compute free 15 % vs memory free 19872 MiB: compute leftover (5 %) is tighter
        pytest.param(
            [dev(i=0, oc=80), dev(i=1, om=60000)],
            [job(1, c=10)],
            [(1, "n", (0,))],
            id="together-compute-wins",
        ),
        # compute free 15 % vs memory free 9872 MiB: memory leftover is tighter
        pytest.param(
            [dev(i=0, oc=80), dev(i=1, om=70000)],
            [job(1, c=10)],
            [(1, "n", (1,))],
            id="together-memory-wins",
        ),
        pytest.param(
            [dev(i=0, om=78000), dev(i=1)],
            [job(1, c=10, m=4096)],
            [(1, "n", (1,))],
            id="compute-fits-memory-does-not",
        ),
        pytest.param(
            [dev(i=0, oc=90), dev(i=1)],
            [job(1, c=10)],
            [(1, "n", (1,))],
            id="memory-fits-compute-does-not",
        ),
        pytest.param(
            [dev(i=0), dev(i=1)],
            [job(1, c=60), job(2, c=30)],
            [(1, "n", (0,)), (2, "n", (0,))],
            id="second-job-packs-onto-first",
        ),
        pytest.param(
            [dev(i=0), dev(i=1)],
            [job(1, c=60), job(2, c=60)],
            [(1, "n", (0,)), (2, "n", (1,))],
            id="headroom-spent-within-a-pass",
        ),
        pytest.param(
            [dev()],
            [job(1, c=40), job(2, c=40), job(3, c=40)],
            [(1, "n", (0,)), (2, "n", (0,))],
            id="third-does-not-fit",
        ),
        pytest.param(
            [dev(node="a"), dev(node="b", oc=40)],
            [job(1)],
            [(1, "b", (0,))],
            id="across-nodes",
        ),
    ],
)
def test_packing(
    devices: list[DeviceView], queued: list[QueuedJob], expected: list[Placement]
) -> None:
    assert placed(plan(snap(queued, devices=devices))) == expected


def test_existing_slices_reduce_headroom() -> None:
    s = snap([job(1, c=50)], [att(9, devices=(0,), c=50)], [dev(i=0), dev(i=1)])
    assert placed(plan(s)) == [(1, "n", (1,))]


def test_evicting_slices_still_count_until_free() -> None:
    s = snap([job(1, c=50)], [att(9, c=50, state=JobState.EVICTING)], [dev()])
    assert plan(s).dispatches == []


def test_dispatch_carries_slice_and_attempt_fence() -> None:
    s = snap([job(4, c=25, m=3000, attempts=2)], devices=[dev(node="gpu-1", i=3)])
    assert plan(s).dispatches == [
        Dispatch(
            job_id=4,
            expected_attempts=2,
            node="gpu-1",
            devices=(3,),
            compute_pct=25.0,
            memory_mib=3000,
        )
    ]


# -- order ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queued", "expected"),
    [
        pytest.param([job(2, prio=5, c=60), job(1, prio=0, c=60)], [2], id="priority"),
        pytest.param([job(1, c=60), job(2, c=60)], [1], id="submission-order"),
        pytest.param(
            [job(3, prio=1, c=40), job(1, prio=1, c=40), job(2, prio=0, c=40)],
            [1, 3],
            id="id-order-within-priority",
        ),
    ],
)
def test_priority_then_submission_order(queued: list[QueuedJob], expected: list[int]) -> None:
    assert [d.job_id for d in plan(snap(queued, devices=[dev()])).dispatches] == expected


@pytest.mark.parametrize(
    ("queued", "expected"),
    [
        pytest.param([job(1, prio=0, c=60), job(2, prio=5, c=60)], [2], id="low-listed-first"),
        pytest.param([job(7, c=60), job(3, c=60, attempts=1)], [3], id="requeued-keeps-its-place"),
    ],
)
def test_nominates_by_priority_then_submission_whatever_the_input_order(
    queued: list[QueuedJob], expected: list[int]
) -> None:
    """The planner's docstring: nominate by priority (high first), then submission order."""
    assert [d.job_id for d in plan(snap(queued, devices=[dev()])).dispatches] == expected


# -- margins -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "queued", "fits"),
    [
        pytest.param(dev(), job(1, c=95), True, id="compute-exact"),
        pytest.param(dev(), job(1, c=96), False, id="compute-only-without-margin"),
        pytest.param(dev(), job(1, m=79872), True, id="memory-exact"),
        pytest.param(dev(), job(1, m=79873), False, id="memory-only-without-margin"),
        pytest.param(dev(oc=70.7), job(1, c=24.3), True, id="compute-exact-float-noise"),
        pytest.param(dev(rc=10), job(1, c=85), True, id="reserve-exact"),
        pytest.param(dev(rc=10), job(1, c=86), False, id="reserve-refuses"),
        pytest.param(dev(rm=4096), job(1, m=75776), True, id="memory-reserve-exact"),
        pytest.param(dev(rm=4096), job(1, m=75777), False, id="memory-reserve-refuses"),
    ],
)
def test_margin_respected_exactly(device: DeviceView, queued: QueuedJob, fits: bool) -> None:
    assert bool(plan(snap([queued], devices=[device])).dispatches) is fits


# -- backfill and misfits ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queued", "expected"),
    [
        pytest.param([job(1, prio=9, c=100), job(2, c=10)], [2], id="compute-backfill"),
        pytest.param([job(1, prio=9, m=90000), job(2)], [2], id="memory-backfill"),
        pytest.param(
            [job(1, c=60), job(2, c=60), job(3, c=60), job(4, c=20)],
            [1, 4],
            id="same-shape-skipped-smaller-goes",
        ),
        pytest.param(
            [job(1, c=60, m=1024), job(2, c=60, m=1024), job(3, c=30, m=1024)],
            [1, 3],
            id="different-shape-still-tried",
        ),
    ],
)
def test_backfill(queued: list[QueuedJob], expected: list[int]) -> None:
    assert [d.job_id for d in plan(snap(queued, devices=[dev()])).dispatches] == expected


# -- arrays --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("active", "queued", "expected"),
    [
        pytest.param(
            [], [job(i, array=7, limit=2) for i in (1, 2, 3)], [1, 2], id="cap-within-pass"
        ),
        pytest.param(
            [att(9, array=7)],
            [job(i, array=7, limit=2) for i in (1, 2, 3)],
            [1],
            id="running-task-counts",
        ),
        pytest.param(
            [att(8, array=7), att(9, array=7)],
            [job(1, array=7, limit=2), job(2, array=5, limit=1)],
            [2],
            id="capped-array-skipped-other-goes",
        ),
        pytest.param(
            [att(9, array=7)],
            [job(i, array=7) for i in (1, 2, 3)],
            [1, 2, 3],
            id="no-limit",
        ),
        pytest.param(
            [att(9, array=5), att(8, array=5)],
            [job(1, array=7, limit=1), job(2, array=7, limit=1)],
            [1],
            id="other-array-not-counted",
        ),
    ],
)
def test_array_limit(
    active: list[ActiveAttempt], queued: list[QueuedJob], expected: list[int]
) -> None:
    s = snap(queued, active, [dev(i=0), dev(i=1)])
    assert [d.job_id for d in plan(s).dispatches] == expected


# -- whole GPUs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "active", "queued", "expected"),
    [
        pytest.param(
            [dev(i=0), dev(i=1)], [], [job(1, c=100, gpus=2)], [(1, "n", (0, 1))], id="two-free"
        ),
        pytest.param(
            [dev(node="a", i=0), dev(node="a", i=1), dev(node="b", i=0), dev(node="b", i=1)],
            [att(9, node="a", devices=(1,), c=5, m=512)],
            [job(1, c=100, gpus=2)],
            [(1, "b", (0, 1))],
            id="slice-on-one-device-sends-it-elsewhere",
        ),
        pytest.param(
            [dev(node="a"), dev(node="b")],
            [],
            [job(1, c=100, gpus=2)],
            [],
            id="never-across-nodes",
        ),
        pytest.param(
            [dev()], [att(9, c=5, m=512)], [job(1, c=100, gpus=1)], [], id="not-beside-a-slice"
        ),
        pytest.param(
            [dev()],
            [att(9, c=5, m=512, state=JobState.EVICTING)],
            [job(1, c=100, gpus=1)],
            [],
            id="not-beside-an-evicting-slice",
        ),
        pytest.param(
            [dev(i=0), dev(i=1)],
            [att(9, devices=(0,), c=5, m=512)],
            [job(1, c=100, gpus=1)],
            [(1, "n", (1,))],
            id="picks-the-empty-device",
        ),
        pytest.param(
            [dev(i=0), dev(i=1, om=40000), dev(i=2, om=50000)],
            [],
            [job(1, c=100, m=8192, gpus=2)],
            [(1, "n", (1, 2))],
            id="tightest-memory",
        ),
        pytest.param(
            [dev(node="a", i=0, om=75000), dev(node="a", i=1), dev(node="b", i=0)],
            [],
            [job(1, c=100, m=8192, gpus=1)],
            [(1, "a", (1,))],
            id="memory-per-device",
        ),
        pytest.param(
            [dev(oc=100 - 5 - MIN_WHOLE_GPU_HEADROOM_PCT)],
            [],
            [job(1, c=100, gpus=1)],
            [(1, "n", (0,))],
            id="min-compute-headroom-exact",
        ),
        pytest.param(
            [dev(oc=100 - 5 - MIN_WHOLE_GPU_HEADROOM_PCT + 1)],
            [],
            [job(1, c=100, gpus=1)],
            [],
            id="min-compute-headroom-refused",
        ),
        pytest.param(
            [dev()],
            [],
            [job(1, c=100, gpus=1), job(2, c=5)],
            [(1, "n", (0,))],
            id="fraction-not-beside-new-whole",
        ),
        pytest.param(
            [dev()],
            [att(9, c=100, m=4096, gpus=1)],
            [job(1, c=5)],
            [],
            id="fraction-not-beside-running-whole",
        ),
        pytest.param(
            [dev(i=0), dev(i=1)],
            [],
            [job(1, c=5), job(2, c=100, gpus=1), job(3, c=100, gpus=1)],
            [(1, "n", (0,)), (2, "n", (1,))],
            id="whole-after-fraction-in-same-pass",
        ),
    ],
)
def test_whole_gpus(
    devices: list[DeviceView],
    active: list[ActiveAttempt],
    queued: list[QueuedJob],
    expected: list[Placement],
) -> None:
    assert placed(plan(snap(queued, active, devices))) == expected


# -- gates ---------------------------------------------------------------------------------


def test_offline_not_allowed_still_evicts() -> None:
    s = snap(
        [job(1)],
        [att(9, c=20)],
        [dev(i=0, oc=90), dev(i=1)],
        offline_allowed=False,
    )
    p = plan(s)
    assert p.dispatches == []
    assert evicted(p) == [(9, EvictReason.ONLINE_COMPUTE)]


def test_offline_not_allowed_still_cancels() -> None:
    p = plan(snap([job(1)], [att(9, cancel=True)], [dev()], offline_allowed=False))
    assert p.dispatches == []
    assert evicted(p) == [(9, EvictReason.CANCELLED)]


@pytest.mark.parametrize(("limit", "expected"), [(0, 0), (1, 1), (3, 3), (5, 5), (1000, 5)])
def test_max_dispatches(limit: int, expected: int) -> None:
    queued = [job(i, c=5) for i in range(1, 6)]
    assert len(plan(snap(queued, devices=[dev()], max_dispatches=limit)).dispatches) == expected


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param([dev(i=0)], [], id="only-device-blocked"),
        # device 0 would be the tighter fit, but an eviction was just decided there
        pytest.param([dev(i=0), dev(i=1, mem=163840)], [(1, "n", (1,))], id="goes-elsewhere"),
    ],
)
def test_no_dispatch_where_an_eviction_was_decided(
    devices: list[DeviceView], expected: list[Placement]
) -> None:
    s = snap([job(1, c=5)], [att(9, devices=(0,), c=10, cancel=True)], devices)
    p = plan(s)
    assert evicted(p) == [(9, EvictReason.CANCELLED)]
    assert placed(p) == expected


# -- cancellation --------------------------------------------------------------------------


def test_cancel_requested_evicts_with_reason() -> None:
    s = snap(active=[att(9, attempt=3, node="gpu-2", cancel=True, deadline=12.5)])
    assert plan(s).evictions == [
        Eviction(9, 3, "gpu-2", EvictReason.CANCELLED, 12.5, "cancelled by its owner")
    ]


def test_cancel_of_an_evicting_attempt_is_not_repeated() -> None:
    s = snap(active=[att(9, cancel=True, state=JobState.EVICTING)], devices=[dev()])
    assert plan(s).evictions == []


def test_cancelled_victim_evicted_once() -> None:
    s = snap(active=[att(9, c=20, cancel=True)], devices=[dev(oc=90)])
    assert evicted(plan(s)) == [(9, EvictReason.ONLINE_COMPUTE)]


# -- evictions when online load rises ------------------------------------------------------


def test_online_memory_rise() -> None:
    s = snap(
        active=[att(9, node="gpu-7", devices=(3,), m=12288, deadline=20.0)],
        devices=[dev(node="gpu-7", i=3, om=71680)],
    )
    (ev,) = plan(s).evictions
    assert (ev.job_id, ev.attempt, ev.node, ev.reason, ev.deadline_s) == (
        9,
        1,
        "gpu-7",
        EvictReason.ONLINE_MEMORY,
        20.0,
    )
    assert ev.message == (
        "online memory on gpu-7/3 rose to 70GiB; offline slices must free 4GiB (margin 2GiB)"
    )


def test_online_compute_rise() -> None:
    s = snap(active=[att(9, c=20)], devices=[dev(oc=90)])
    (ev,) = plan(s).evictions
    assert ev.reason == EvictReason.ONLINE_COMPUTE
    assert ev.message == (
        "online compute on n/0 rose to 90%; offline slices must free 15.0% (margin 5%)"
    )


@pytest.mark.parametrize(
    ("devices", "active", "expected"),
    [
        pytest.param([dev(oc=80, om=70000)], [att(9, c=15, m=9872)], [], id="at-the-margin"),
        pytest.param(
            [dev(rc=50, rm=40000)], [att(9, c=90, m=70000)], [], id="reserve-does-not-evict"
        ),
        pytest.param(
            [dev(oc=100)], [att(9, c=100, m=8192, gpus=1)], [], id="whole-gpu-yields-compute"
        ),
        pytest.param(
            [dev(om=75000)],
            [att(9, c=100, m=8192, gpus=1)],
            [(9, EvictReason.ONLINE_MEMORY)],
            id="whole-gpu-memory",
        ),
        pytest.param(
            [dev(om=78000)],
            [att(8, prio=1, m=1024), att(9, prio=0, m=1024)],
            [(9, EvictReason.ONLINE_MEMORY)],
            id="lowest-priority-only",
        ),
        pytest.param(
            [dev(om=78000)],
            [att(8, m=1024, state=JobState.EVICTING), att(9, m=1024)],
            [],
            id="in-flight-covers",
        ),
        pytest.param(
            [dev(i=0, om=78000), dev(i=1, om=78000)],
            [att(9, devices=(0, 1), c=100, m=4096, gpus=2)],
            [(9, EvictReason.ONLINE_MEMORY)],
            id="multi-device-evicted-once",
        ),
        pytest.param(
            [dev(node="a", oc=90), dev(node="b")],
            [att(8, node="a", c=20), att(9, node="b", c=20)],
            [(8, EvictReason.ONLINE_COMPUTE)],
            id="only-the-hot-node",
        ),
        pytest.param(
            [dev(i=0, oc=90), dev(i=1, om=78000)],
            [att(8, devices=(0,), c=20), att(9, devices=(1,), m=4096)],
            [(8, EvictReason.ONLINE_COMPUTE), (9, EvictReason.ONLINE_MEMORY)],
            id="two-devices",
        ),
        pytest.param(
            [dev(oc=100, om=80000)],
            [att(9, c=20, m=1024)],
            [(9, EvictReason.ONLINE_MEMORY)],
            id="memory-reason-wins-when-both",
        ),
        pytest.param([], [att(9, c=20)], [], id="device-not-in-snapshot"),
    ],
)
def test_evictions(
    devices: list[DeviceView],
    active: list[ActiveAttempt],
    expected: list[tuple[int, EvictReason]],
) -> None:
    assert evicted(plan(snap(active=active, devices=devices))) == expected


# -- determinism ---------------------------------------------------------------------------


def _busy_snapshot() -> Snapshot:
    devices = [dev(node=node, i=i, oc=10 * i, om=4096 * i) for node in ("a", "b") for i in range(4)]
    active = [
        att(100, node="a", devices=(3,), c=20, m=4096),
        att(101, node="a", devices=(2,), c=60, m=60000, prio=-1),
        att(102, node="b", devices=(1,), c=30, m=2048, cancel=True),
    ]
    queued = [
        job(i, prio=i % 3, c=5 + (i * 7) % 40, m=512 * (i % 9 + 1), gpus=1 if i % 11 == 0 else 0)
        for i in range(1, 60)
    ]
    return snap(queued, active, devices)


def test_same_snapshot_same_plan() -> None:
    s = _busy_snapshot()
    first = plan(s)
    assert first.dispatches
    assert first.evictions
    assert plan(s) == first
    assert plan(_busy_snapshot()) == first


def test_plan_does_not_mutate_the_snapshot() -> None:
    s = _busy_snapshot()
    before = (list(s.queued), list(s.active), list(s.devices))
    plan(s)
    assert (list(s.queued), list(s.active), list(s.devices)) == before


def test_empty_snapshot() -> None:
    assert plan(snap(now=NOW)) == Plan()
