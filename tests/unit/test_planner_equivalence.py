"""The planner decides exactly as a straightforward planner would, on random snapshots.

:func:`reference_plan` is the planner written the plain way (one sort on a key tuple, a
scan of every device for each fractional job); :func:`ebbtide.scheduling.planner.plan`
finds the same best fit through an index of free headroom.  The snapshots are small and
seeded, drawn from few values so that exact fits, equal scores, full devices, misfits and
array limits all happen often; a few carry values outside the index's range, where the
planner falls back to the scan.

What the planner keeps to be fast at fleet scale is checked on its own too: the best fits
the index keeps per shape for the next job of that shape, the nomination order sorted a
priority at a time (or taken as given), the check that spares a calm device the relief
reckoning, and the reasons for unplaced jobs worked out once per queue and timing.

Each node says whose jobs it runs (anyone's, every user's but root's, one user's, or
nothing, as an older agent), and each job has an owner: the reference places a job only
on the nodes :func:`~ebbtide.queue.whose_jobs.refuses` lets it go to.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable
from itertools import islice
from typing import Any

import pytest

from ebbtide.preemption.relief import relief_for_device
from ebbtide.preemption.victims import Eviction, EvictReason, evictions_for_device
from ebbtide.queue.states import JobState
from ebbtide.queue.whose_jobs import refuses, singled_out
from ebbtide.scheduling import fit, planner
from ebbtide.scheduling.admission import Unplaced
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, headroom
from ebbtide.scheduling.planner import MIN_WHOLE_GPU_HEADROOM_PCT, Dispatch, Plan, plan
from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    DeviceGates,
    DeviceView,
    GroupedJobs,
    Margins,
    PauseRules,
    QueuedJob,
    QueueGate,
    QueueLimits,
    Snapshot,
    plan_group,
    queue_order,
)

from .builders import NOW, att, counted, dev, job

EPS = 1e-6

# -- the reference -------------------------------------------------------------------------


class Free:
    def __init__(self, device: DeviceView, compute: float, memory: float, slices: int) -> None:
        self.device, self.compute, self.memory, self.slices = device, compute, memory, slices


def reference_plan(snapshot: Snapshot) -> Plan:
    """The planner's documented behaviour, written the plain way."""
    out = Plan()
    by_device: dict[tuple[str, int], list[ActiveAttempt]] = {}
    for a in snapshot.active:
        for d in a.devices:
            by_device.setdefault((a.node, d), []).append(a)
    chosen: set[tuple[int, int]] = set()
    for device in snapshot.devices:
        here = by_device.get(device.key, [])
        for ev in evictions_for_device(device, here, snapshot.margins, snapshot.now):
            if (ev.job_id, ev.attempt) not in chosen:
                chosen.add((ev.job_id, ev.attempt))
                out.evictions.append(ev)
    for a in snapshot.active:
        if a.cancel_requested and not a.evicting and (a.job_id, a.attempt) not in chosen:
            chosen.add((a.job_id, a.attempt))
            out.evictions.append(
                Eviction(
                    a.job_id,
                    a.attempt,
                    a.node,
                    EvictReason.CANCELLED,
                    a.deadline_s,
                    "cancelled by its owner",
                )
            )
    if not snapshot.offline_allowed:
        return out

    free: dict[tuple[str, int], Free] = {}
    for device in snapshot.devices:
        here = by_device.get(device.key, [])
        c, m = headroom(
            device,
            sum(a.compute_pct for a in here),
            sum(a.memory_mib for a in here),
            snapshot.margins,
        )
        if any(a.evicting or (a.job_id, a.attempt) in chosen for a in here):
            c = m = 0.0
        free[device.key] = Free(device, c, m, len(here))
    by_node: dict[str, list[Free]] = {}
    for f in free.values():
        by_node.setdefault(f.device.node, []).append(f)
    running = Counter(a.array_id for a in snapshot.active if a.array_id is not None)
    runs = {d.node: d.runs_jobs_of for d in snapshot.devices}

    misfits: set[tuple[float, int, int, str]] = set()
    for j in sorted(snapshot.queued, key=lambda j: (-j.priority, j.id)):
        if len(out.dispatches) >= snapshot.max_dispatches:
            break
        shape = (j.compute_pct, j.memory_mib, j.gpus, j.owner)
        if shape in misfits:
            continue
        if (
            j.array_id is not None
            and j.array_limit is not None
            and running[j.array_id] >= j.array_limit
        ):
            continue
        # only the nodes that would run the job for its owner
        takers = {n: fs for n, fs in by_node.items() if refuses(runs[n], j.owner) is None}
        placed = (
            whole_fit(j, takers)
            if j.gpus >= 1
            else best_fit(j, [f for f in free.values() if f.device.node in takers])
        )
        if placed is None:
            misfits.add(shape)
            continue
        node, devices = placed
        out.dispatches.append(
            Dispatch(j.id, j.attempts, node, devices, j.compute_pct, j.memory_mib)
        )
        if j.array_id is not None:
            running[j.array_id] += 1
    return out


def best_fit(j: QueuedJob, frees: list[Free]) -> tuple[str, tuple[int, ...]] | None:
    """Scan every device; the lowest score wins, the first of equal scores."""
    best: Free | None = None
    best_score = 0.0
    for f in frees:
        if f.compute + EPS < j.compute_pct or f.memory + EPS < j.memory_mib:
            continue
        score = (f.compute - j.compute_pct) / DEVICE_COMPUTE_PCT + (f.memory - j.memory_mib) / max(
            f.device.memory_mib, 1.0
        )
        if best is None or score < best_score:
            best, best_score = f, score
    if best is None:
        return None
    best.compute -= j.compute_pct
    best.memory -= j.memory_mib
    best.slices += 1
    return best.device.node, (best.device.index,)


def whole_fit(j: QueuedJob, by_node: dict[str, list[Free]]) -> tuple[str, tuple[int, ...]] | None:
    best: list[Free] | None = None
    best_score = 0.0
    for frees in by_node.values():
        fit = [
            f
            for f in frees
            if f.slices == 0
            and f.compute + EPS >= MIN_WHOLE_GPU_HEADROOM_PCT
            and f.memory + EPS >= j.memory_mib
        ]
        if len(fit) < j.gpus:
            continue
        fit.sort(key=lambda f: (f.memory, f.device.index))
        pick = fit[: j.gpus]
        score = sum(f.memory - j.memory_mib for f in pick)
        if best is None or score < best_score:
            best, best_score = pick, score
    if best is None:
        return None
    for f in best:
        f.compute = 0.0
        f.memory -= j.memory_mib
        f.slices += 1
    return best[0].device.node, tuple(sorted(f.device.index for f in best))


# -- random snapshots ----------------------------------------------------------------------

#: Few distinct values, so that equal scores and exact fits are common.
DEVICE_MIB = (81920.0, 81920.0, 40960.0, 147456.0, 0.5)
#: Whose jobs a node runs (mostly anyone's; None: an older agent that does not say) ...
RUNS = (None, "any", "any", "any", "users", "user:alice", "user:bob", "from-a-newer-agent")
#: ... and whose the jobs are.
OWNERS = ("alice", "alice", "bob", "carol", "root")
ONLINE_COMPUTE = (0.0, 0.0, 10.0, 25.0, 50.0, 70.7, 90.0, 33.3)
ONLINE_MEMORY = (0.0, 0.0, 8192.0, 20000.0, 40960.0, 70000.0, 12345.6, 75776.0000001)
JOB_COMPUTE = (5.0, 10.0, 10.0, 24.3, 25.0, 30.0, 45.0, 50.0, 95.0, 0.5, 12.5, 0.0)
JOB_MEMORY = (1024, 1024, 2048, 4096, 8192, 16384, 40960, 79872, 1)
#: Outside the index's range: the planner must fall back to the scan and agree.
HUGE = 2.0**60


def random_snapshot(rng: random.Random, *, huge: bool = False) -> Snapshot:
    nodes = [f"n{i}" for i in range(rng.randint(1, 4))]
    # a fleet of nodes that all run anyone's, or one whose nodes each say their own
    mixed = rng.random() < 0.6
    devices = []
    for node in nodes:
        runs = rng.choice(RUNS) if mixed else "any"
        for i in range(rng.randint(1, 5)):
            devices.append(
                dev(
                    node=node,
                    i=i,
                    mem=rng.choice(DEVICE_MIB),
                    oc=rng.choice(ONLINE_COMPUTE),
                    om=rng.choice(ONLINE_MEMORY),
                    rc=rng.choice((0.0, 0.0, 5.0)),
                    rm=rng.choice((0.0, 0.0, 1024.0)),
                    runs=runs,
                )
            )
    if huge:
        k = rng.randrange(len(devices))
        d = devices[k]
        devices[k] = dev(
            node=d.node, i=d.index, mem=rng.choice((HUGE, float("inf"))), runs=d.runs_jobs_of
        )
    active = []
    for n in range(rng.randint(0, 2 * len(devices))):
        d = rng.choice(devices)
        whole = rng.random() < 0.1
        active.append(
            att(
                1000 + n,
                node=d.node,
                devices=(d.index,),
                c=100 if whole else rng.choice(JOB_COMPUTE),
                m=rng.choice(JOB_MEMORY),
                gpus=1 if whole else 0,
                prio=rng.randint(-1, 2),
                state=rng.choice((JobState.RUNNING,) * 8 + (JobState.EVICTING,)),
                cancel=rng.random() < 0.05,
                array=rng.choice((None, None, 1, 2)),
                ckpt=rng.choice((None, NOW - 100, NOW - 10)),
            )
        )
    queued = []
    for n in range(rng.randint(0, 40)):
        gpus = rng.choice((0,) * 9 + (1, 2, 3))
        array = rng.choice((None, None, None, 1, 2, 3))
        queued.append(
            job(
                rng.randint(1, 60),  # repeated ids: equal nomination keys keep their order
                prio=rng.randint(-2, 3),
                c=100 if gpus else rng.choice(JOB_COMPUTE),
                m=rng.choice(JOB_MEMORY) if not (huge and n == 0) else int(HUGE),
                gpus=gpus,
                array=array,
                limit=rng.choice((None, 1, 2, 3)) if array is not None else None,
                attempts=rng.randint(0, 2),
                owner=rng.choice(OWNERS),
            )
        )
    return Snapshot(
        now=NOW,
        queued=queued,
        active=active,
        devices=devices,
        margins=rng.choice((Margins(), Margins(compute_pct=0.0, memory_mib=0.0))),
        offline_allowed=rng.random() < 0.95,
        max_dispatches=rng.choice((1000, 1000, 3, 0)),
    )


def large_snapshot(rng: random.Random, *, mixed: bool = False) -> Snapshot:
    """Hundreds of devices and jobs: deep buckets, many placements per pass; ``mixed``:
    nodes that each say whose jobs they run, and jobs of several owners."""
    runs = [rng.choice(RUNS) if mixed else None for _ in range(40)]
    devices = [
        dev(
            node=f"n{i // 8}",
            i=i % 8,
            mem=rng.choice((81920.0, 147456.0)),
            oc=round(rng.uniform(0, 90), rng.choice((0, 1))),
            om=float(rng.randrange(0, 60000, 512)),
            runs=runs[i // 8],
        )
        for i in range(rng.randint(50, 300))
    ]
    queued = [
        job(
            i,
            prio=rng.randint(0, 2),
            c=rng.choice((5, 10, 15, 20, 25, 33, 50, rng.randint(1, 60))),
            m=rng.choice((1, 2, 4, 8, 16, 24, 40)) * 1024,
            gpus=rng.choice((0,) * 30 + (1, 2)),
            array=rng.choice((None,) * 5 + (7,)),
            limit=50,
        )
        for i in range(1, rng.randint(200, 3000))
    ]
    queued = [q if not q.gpus else job(q.id, c=100, m=q.memory_mib, gpus=q.gpus) for q in queued]
    if mixed:
        queued = [dataclasses.replace(q, owner=rng.choice(OWNERS)) for q in queued]
    active = [
        att(
            10_000 + n,
            node=(d := rng.choice(devices)).node,
            devices=(d.index,),
            c=rng.choice((5, 10, 20, 25)),
            m=rng.choice((1, 4, 8)) * 1024,
        )
        for n in range(len(devices))
    ]
    return Snapshot(now=NOW, queued=queued, active=active, devices=devices)


# -- the tests -----------------------------------------------------------------------------


def as_plain(p: Plan) -> tuple[list[Any], list[Any]]:
    return list(p.dispatches), list(p.evictions)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts how often the planner fell back to scanning every device."""
    calls: Counter[str] = Counter()
    scan: Callable[..., Any] = fit.best_fit_scan

    def counting(*args: Any) -> Any:
        calls["scan"] += 1
        return scan(*args)

    monkeypatch.setattr(fit, "best_fit_scan", counting)
    return calls


@pytest.mark.parametrize("seed", range(20))
def test_small_snapshots_plan_as_the_reference(seed: int, scans: Counter[str]) -> None:
    rng = random.Random(seed)
    dispatched = 0
    for case in range(150):
        s = random_snapshot(rng)
        assert as_plain(plan(s)) == as_plain(reference_plan(s)), f"seed {seed} case {case}"
        dispatched += len(reference_plan(s).dispatches)
    assert dispatched > 100  # the cases do place jobs
    assert scans["scan"] == 0  # ordinary values: every best fit came from the index


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the index's queries and the searches they needed (the rest reused picks)."""
    calls: Counter[str] = Counter()
    search: Callable[..., Any] = fit.FitIndex._search
    best_fit: Callable[..., Any] = fit.FitIndex.best_fit

    def counting_search(*args: Any) -> Any:
        calls["search"] += 1
        return search(*args)

    def counting_best_fit(*args: Any) -> Any:
        calls["query"] += 1
        return best_fit(*args)

    monkeypatch.setattr(fit.FitIndex, "_search", counting_search)
    monkeypatch.setattr(fit.FitIndex, "best_fit", counting_best_fit)
    return calls


@pytest.mark.parametrize("mixed", [False, True], ids=["anyones", "mixed-fleet"])
@pytest.mark.parametrize("seed", range(5))
def test_large_snapshots_plan_as_the_reference(
    seed: int, mixed: bool, scans: Counter[str], searches: Counter[str]
) -> None:
    s = large_snapshot(random.Random(1000 + seed), mixed=mixed)
    expected = reference_plan(s)
    assert len(expected.dispatches) > 50
    assert as_plain(plan(s)) == as_plain(expected)
    assert scans["scan"] == 0
    assert searches["search"] < searches["query"]  # jobs of a shape come back


@pytest.mark.parametrize("seed", range(5))
def test_values_beyond_the_index_fall_back_to_the_scan(seed: int, scans: Counter[str]) -> None:
    rng = random.Random(2000 + seed)
    for case in range(50):
        s = random_snapshot(rng, huge=True)
        assert as_plain(plan(s)) == as_plain(reference_plan(s)), f"seed {seed} case {case}"
    assert scans["scan"] > 0


def test_equal_scores_go_to_the_first_device_in_snapshot_order() -> None:
    devices = [dev(node=n, i=i) for n in ("b", "a") for i in (1, 0)]
    s = Snapshot(now=NOW, queued=[job(1, c=10)], active=[], devices=devices)
    assert [(d.node, d.devices) for d in plan(s).dispatches] == [("b", (1,))]
    assert as_plain(plan(s)) == as_plain(reference_plan(s))


@pytest.mark.parametrize(
    "prefix", [0, 1], ids=["tie-is-the-shelfs-least-memory", "less-memory-on-shelf"]
)
def test_equal_score_on_a_later_shelf_goes_to_the_earlier_device(prefix: int) -> None:
    """Device 1 (40 GiB) and device 2 (80 GiB) leave the same headroom, each a quarter of
    its memory and 40 % compute; device 1 comes first in the snapshot but its shelf is
    searched second (device 0 opened the 80 GiB shelf).  A bound equal to the best score
    must not end the search."""
    full = dev(i=0, oc=95)  # no compute left
    devices = [
        full,
        dev(i=1, mem=40960, oc=45, om=40960 - 2048 - 11264),  # 50 %, 11264 MiB free
        dev(i=2, oc=45, om=81920 - 2048 - 21504),  # 50 %, 21504 MiB free
    ]
    if prefix:  # a 40 GiB device with less memory free, but no compute
        devices.append(dev(i=3, mem=40960, oc=95, om=40960 - 2048 - 2048))
    s = Snapshot(now=NOW, queued=[job(1, c=10, m=1024)], active=[], devices=devices)
    assert [d.devices for d in plan(s).dispatches] == [(1,)]
    assert as_plain(plan(s)) == as_plain(reference_plan(s))


def test_memory_short_by_float_noise_still_fits() -> None:
    """4095.9999999 MiB free fits a 4096 MiB job (the 1e-6 slack), as in the scan."""
    s = Snapshot(now=NOW, queued=[job(1, c=10, m=4096)], active=[], devices=[dev(om=75776.0000001)])
    assert [d.job_id for d in plan(s).dispatches] == [1]
    assert as_plain(plan(s)) == as_plain(reference_plan(s))


def test_first_fit_matches_its_definition_at_rounding_edges() -> None:
    """Just below ``need - 1e-6`` a value may still fit once 1e-6 is added and rounded."""
    rng = random.Random(7)
    for exp in range(-20, 40):
        for need in (2.0**exp + 1e-6, 2.0**exp + 5e-7, 2.0**exp, float(rng.randrange(1, 10**6))):
            near = [need - 1e-6]
            for _ in range(4):
                near.append(math.nextafter(near[-1], -math.inf))
            values = sorted([*near, need, need - 1, need + 1, 0.0])
            expected = next((i for i, v in enumerate(values) if not v + EPS < need), len(values))
            assert fit.first_fit(values, need) == expected, (need, values)


def in_order(s: Snapshot) -> Snapshot:
    """``s`` with its queue in the store's order: priority (high first), then id."""
    return dataclasses.replace(s, queued=sorted(s.queued, key=lambda j: (-j.priority, j.id)))


@pytest.mark.parametrize("seed", range(10))
def test_a_queue_in_order_is_taken_as_it_comes(seed: int) -> None:
    """Told that the queue is in nomination order already, the planner decides as it does
    when it sorts the queue itself, reasons and wake-up included."""
    rng = random.Random(5000 + seed)
    for case in range(100):
        s = random_snapshot(rng)
        decided = plan(in_order(s), queued_in_order=True)
        assert decided == plan(s), f"seed {seed} case {case}"
        assert as_plain(decided) == as_plain(reference_plan(s)), f"seed {seed} case {case}"
    s = large_snapshot(rng)
    assert plan(in_order(s), queued_in_order=True) == plan(s)


def test_nomination_sorts_a_priority_at_a_time_as_one_sort_would() -> None:
    """By priority, then id, and jobs equal in both in their given order: one stable sort
    on ``(-priority, id)``."""
    rng = random.Random(6)
    for _ in range(300):
        queued = [
            job(rng.randint(1, 30), prio=rng.randint(-2, 3)) for _ in range(rng.randint(0, 60))
        ]
        expected = sorted(queued, key=lambda j: (-j.priority, j.id))
        got = [j for run in planner._nominated(queued) for j in run]
        assert len(got) == len(expected)
        assert all(a is b for a, b in zip(got, expected, strict=True))


def backlogged(rng: random.Random, s: Snapshot) -> Snapshot:
    """``s`` with its queue three times over and some jobs in a backoff (a wake-up each)."""
    queued = [
        dataclasses.replace(
            j, evictions=rng.choice((0, 0, 0, 2, 3)), requeued_at=NOW - rng.choice((1, 100))
        )
        for j in s.queued
    ]
    return dataclasses.replace(
        s, queued=queued * rng.choice((1, 3)), backoff_base_s=30.0, backoff_max_s=600.0
    )


@pytest.mark.parametrize("seed", range(10))
def test_shapes_known_to_fit_nowhere_are_passed_over_once_the_reasons_are_full(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the reasons full (three here), the jobs of shapes known to fit nowhere are
    passed over in bulk; the plan is the one a pass job by job makes, reasons and
    wake-up included."""
    monkeypatch.setattr(planner, "MAX_REASONS", 3)
    rng = random.Random(7000 + seed)
    cases = [backlogged(rng, random_snapshot(rng)) for _ in range(100)]
    skips: Counter[str] = Counter()
    next_unknown = planner._next_unknown

    def counting(*args: Any) -> int:
        found: int = next_unknown(*args)
        skips["jobs"] += found - args[2]
        return found

    monkeypatch.setattr(planner, "_next_unknown", counting)
    bulk = [(plan(s), plan(in_order(s), queued_in_order=True)) for s in cases]

    def one_by_one(ahead: Any, behind: int, start: int, *_: Any) -> int:
        next(islice(ahead, behind + 1, behind + 1), None)
        return start

    monkeypatch.setattr(planner, "_next_unknown", one_by_one)
    for case, (s, decided) in enumerate(zip(cases, bulk, strict=True)):
        assert decided == (plan(s), plan(in_order(s), queued_in_order=True)), f"case {case}"
    assert skips["jobs"] > 100  # jobs were passed over
    assert any(p.wake_at is not None for p, _ in bulk)  # and backoffs waited


def grouped(s: Snapshot, *, by_owner: bool = True) -> Snapshot:
    """``s`` with its queue as the scheduler's copy hands it over: by planning group, each
    group in scheduling order (``s`` has one job per id, as a store does), owners told
    apart as its nodes single them out (``by_owner`` False: not at all, as a copy that
    has not heard of the nodes yet)."""
    told = frozenset(
        o for d in s.devices if by_owner and (o := singled_out(d.runs_jobs_of)) is not None
    )
    by_group: dict[Any, list[QueuedJob]] = {}
    for j in sorted(s.queued, key=queue_order):
        by_group.setdefault(plan_group(j, told), []).append(j)
    groups = list(by_group.values())
    return dataclasses.replace(s, queued=GroupedJobs(groups, len(s.queued), singled_out=told))


def renumbered(rng: random.Random, s: Snapshot) -> Snapshot:
    """``s`` with one job per id, in a shuffled order (so that the jobs of one group
    interleave with the others')."""
    jobs = list(s.queued)
    rng.shuffle(jobs)
    return dataclasses.replace(
        s, queued=[dataclasses.replace(j, id=n) for n, j in enumerate(jobs, 1)]
    )


def windowed(rng: random.Random, s: Snapshot) -> Snapshot:
    """``s`` under windows: its jobs in two queues with declared timings, queue ``train``
    closed on some devices and open with a share on the others."""
    queued = [
        dataclasses.replace(
            j,
            queue=rng.choice(("default", "train")),
            deadline_s=rng.choice((30.0, 60.0)),
            first_checkpoint_s=rng.choice((None, 10.0, 300.0)),
        )
        for j in s.queued
    ]
    soon = QueueGate(open_until=NOW + rng.choice((100.0, 1000.0)), share=rng.choice((0.5, 1.0)))
    gates = {
        d.key: DeviceGates(
            open={"default": QueueGate(open_until=math.inf, share=1.0)}
            | ({"train": soon} if rng.random() < 0.5 else {}),
            closed={} if rng.random() < 0.5 else {"train": "window 'night' is closed"},
        )
        for d in s.devices
    }
    return dataclasses.replace(s, queued=queued, gates=gates)


def under_quotas(rng: random.Random, s: Snapshot) -> Snapshot:
    """``s`` with its jobs and attempts in two queues and of two owners, and quotas drawn
    from few values on the queues (often spent by the attempts already running)."""
    queues, owners = ("default", "train"), ("alice", "bob")
    queued = [
        dataclasses.replace(j, queue=rng.choice(queues), owner=rng.choice(owners)) for j in s.queued
    ]
    active = [
        dataclasses.replace(a, queue=rng.choice(queues), owner=rng.choice(owners)) for a in s.active
    ]
    limits = {
        q: QueueLimits(
            max_running=rng.choice((None, 0, 1, 3, 8)),
            max_fleet_share=rng.choice((None, None, 0.05, 0.3)),
            max_user_share=rng.choice((None, None, 0.1, 0.5)),
        )
        for q in queues
        if rng.random() < 0.8
    }
    return dataclasses.replace(s, queued=queued, active=active, queues=limits)


@pytest.mark.parametrize("seed", range(10))
def test_a_queue_by_planning_group_plans_as_the_queue_in_order(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's copy hands the queue over by planning group; merged as the pass
    reads, with a group left unread once none of its jobs can start (it fits nowhere, its
    array is at its limit, its queue's quota is spent) and the reasons are full (three
    here), it decides what the queue in order decides: dispatches, reasons, wake-up,
    with windows (groups finer than shapes), quotas and backoffs, and without; in fleets
    whose nodes refuse some owners' jobs, with the groups told apart by owner and not."""
    monkeypatch.setattr(planner, "MAX_REASONS", 3)
    rng = random.Random(9000 + seed)
    left_behind = 0
    for case in range(150):
        s = renumbered(rng, backlogged(rng, random_snapshot(rng)))
        if rng.random() < 0.5:
            s = under_quotas(rng, s)
        if rng.random() < 0.4:
            s = windowed(rng, s)
        decided = plan(grouped(s, by_owner=rng.random() < 0.8))
        assert decided == plan(in_order(s), queued_in_order=True), f"case {case}"
        left_behind += len(s.queued) - len(decided.dispatches) - len(decided.blocked)
    assert left_behind > 100  # jobs were left unread
    for mixed in (False, True):
        s = renumbered(rng, large_snapshot(rng, mixed=mixed))
        assert plan(grouped(s)) == plan(in_order(s), queued_in_order=True)
        s = under_quotas(rng, s)
        assert plan(grouped(s)) == plan(in_order(s), queued_in_order=True)


def test_a_group_that_fits_nowhere_is_left_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand jobs of a shape that fits nowhere behind two that fit: the pass reads
    the first of them and the jobs it needed for its reasons, not the rest."""
    monkeypatch.setattr(planner, "MAX_REASONS", 3)
    read: list[int] = []
    Counted = counted(read)

    small = Counted([job(1, c=10), job(2, c=10)])
    huge = Counted(job(i, c=10, m=10**6) for i in range(3, 1003))
    s = Snapshot(now=NOW, queued=GroupedJobs([small, huge], 1002), active=[], devices=[dev()])
    decided = plan(s)
    assert [d.job_id for d in decided.dispatches] == [1, 2]
    assert len(decided.blocked) == 3 and len(read) < 10


def test_groups_of_a_spent_array_or_quota_are_left_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand tasks of an array at its limit, a thousand jobs of a queue at its
    ``max_running``, and a thousand of a queue past its ``max_fleet_share``, all ahead of
    a job that fits: the pass reads the jobs it needed for its reasons, not the rest; a
    group whose jobs may be in a backoff is read on (each end is a wake-up)."""
    monkeypatch.setattr(planner, "MAX_REASONS", 3)
    read: list[int] = []
    Counted = counted(read)

    tasks = Counted(job(i, prio=3, array=7, limit=1) for i in range(1, 1001))
    capped = Counted(job(i, prio=2, queue="capped") for i in range(1001, 2001))
    shared = Counted(job(i, prio=1, c=30, queue="shared") for i in range(2001, 3001))
    last = Counted([job(3001)])
    running = [
        att(9001, array=7),
        att(9002, queue="capped"),
        att(9003, c=40, queue="shared", devices=(1,)),
    ]
    limits = {
        "default": QueueLimits(),
        "capped": QueueLimits(max_running=1),
        "shared": QueueLimits(max_fleet_share=0.3),
    }
    s = Snapshot(
        now=NOW,
        queued=GroupedJobs([tasks, capped, shared, last], 3001),
        active=running,
        devices=[dev(i=0), dev(i=1)],
        queues=limits,
    )
    decided = plan(s)
    assert [d.job_id for d in decided.dispatches] == [3001]
    assert len(decided.blocked) == 3 and len(read) < 20
    backing_off = [
        dataclasses.replace(j, evictions=2, requeued_at=NOW - 1) for j in list(capped)[:20]
    ]
    read.clear()
    s = dataclasses.replace(
        s,
        queued=GroupedJobs([Counted(backing_off), last], 21),
        backoff_base_s=30.0,
        backoff_max_s=600.0,
    )
    assert plan(s).wake_at == NOW + 29  # every job of the group read: its backoff's end
    assert len(read) == 21


# -- the fit index, query after query ------------------------------------------------------


def random_frees(rng: random.Random) -> list[fit.Free]:
    """Devices with free headroom drawn from few values (equal scores, exact fits, none
    left) and a few from anywhere."""
    frees = []
    for pos in range(rng.randint(1, 60)):
        device = dev(node=f"n{pos // 4}", i=pos % 4, mem=rng.choice(DEVICE_MIB[:4]))
        compute = rng.choice(
            (0.0, 5.0, 10.0, 24.999999, 25.0, 33.3, 50.0, 70.7, 95.0, rng.uniform(-5, 95))
        )
        memory = rng.choice(
            (0.0, 1024.0, 4095.9999999, 8192.0, 40960.0, 79872.0, rng.uniform(-100, 80000))
        )
        frees.append(fit.Free(device, compute, memory, 0, pos))
    return frees


@pytest.mark.parametrize("seed", range(30))
def test_the_index_picks_what_the_scan_picks_as_devices_fill(
    seed: int, searches: Counter[str]
) -> None:
    """Jobs of a few shapes, each pick spent, and now and then another device spent (as a
    whole-GPU placement does): every query, whether searched or answered from the picks
    kept for its shape, returns the device the scan returns."""
    rng = random.Random(3000 + seed)
    frees = random_frees(rng)
    index = fit.FitIndex(frees)
    shapes = [(rng.choice(JOB_COMPUTE), rng.choice(JOB_MEMORY)) for _ in range(rng.randint(1, 5))]
    for step in range(300):
        compute, memory = rng.choice(shapes)
        j = job(step, c=compute, m=memory)
        expected = fit.best_fit_scan(j, frees)
        assert index.best_fit(j) is expected, f"seed {seed} step {step}"
        if expected is not None:
            expected.compute -= compute
            expected.memory -= memory
            index.refile(expected)
        if rng.random() < 0.2:
            other = rng.choice(frees)
            other.compute -= rng.choice((0.0, 1.0, 30.0))
            other.memory -= rng.choice((0.0, 512.0))
            index.refile(other)
    assert searches["search"] < searches["query"]


def scan_nodes(frees: list[fit.Free], j: QueuedJob) -> list[fit.Free] | None:
    """The whole-GPU pick, written the plain way: on each node, in order, the devices with
    no slice, the compute and the memory, least memory first; the node whose pick leaves
    the least memory over, the first among equals."""
    by_node: dict[str, list[fit.Free]] = {}
    for f in frees:
        by_node.setdefault(f.device.node, []).append(f)
    best: list[fit.Free] | None = None
    best_left = 0.0
    for node in by_node.values():
        ok = [
            f
            for f in node
            if f.offline_slices == 0
            and f.compute + EPS >= MIN_WHOLE_GPU_HEADROOM_PCT
            and f.memory + EPS >= j.memory_mib
        ]
        pick = sorted(ok, key=lambda f: (f.memory, f.device.index))[: j.gpus]
        left = sum(f.memory - j.memory_mib for f in pick)
        if len(pick) == j.gpus and (best is None or left < best_left):
            best, best_left = pick, left
    return best


def test_whole_gpu_jobs_go_where_the_scan_of_every_node_sends_them() -> None:
    """Whole-GPU jobs of a few shapes, each pick spent, and fractional slices spent on
    other devices now and then: the node scores kept per shape pick what a scan picks."""
    placed = 0
    for seed in range(30):
        rng = random.Random(8000 + seed)
        frees = random_frees(rng)
        by_node: dict[str, list[fit.Free]] = {}
        for f in frees:
            by_node.setdefault(f.device.node, []).append(f)
        index = fit.FitIndex(frees)
        wholes = fit.WholeFit(by_node, index)
        shapes = [(rng.choice((1, 1, 2, 3)), rng.choice(JOB_MEMORY)) for _ in range(3)]
        for step in range(200):
            gpus, memory = rng.choice(shapes)
            j = job(step, c=100, m=memory, gpus=gpus)
            expected = scan_nodes(frees, j)
            assert wholes.best(j) == expected, f"seed {seed} step {step}"
            for f in expected or ():
                f.compute, f.memory, f.offline_slices = 0.0, f.memory - memory, 1
                index.refile(f)
                placed += 1
            if rng.random() < 0.3:
                other = rng.choice(frees)
                other.compute -= rng.choice((0.0, 10.0, 60.0))
                other.offline_slices += rng.choice((0, 1))
                index.refile(other)
    assert placed > 100


# -- calm devices --------------------------------------------------------------------------


def random_slices(rng: random.Random, device: DeviceView) -> list[ActiveAttempt]:
    slices = []
    for n in range(rng.randint(1, 4)):
        whole = rng.random() < 0.15
        a = att(
            100 + n,
            node=device.node,
            devices=(device.index,),
            c=100 if whole else rng.choice(JOB_COMPUTE),
            m=rng.choice(JOB_MEMORY),
            gpus=1 if whole else 0,
            state=rng.choice((JobState.RUNNING,) * 6 + (JobState.EVICTING,)),
        )
        a = dataclasses.replace(
            a,
            paused_at=rng.choice((NOW - 5, NOW - 3600)) if rng.random() < 0.1 else None,
            suspended_at=NOW - rng.choice((5, 7200)) if rng.random() < 0.05 else None,
            pausable=rng.random() < 0.5,
        )
        slices.append(a)
    return slices


@pytest.mark.parametrize("seed", range(10))
def test_a_calm_device_needs_no_relief(seed: int) -> None:
    """Where the planner skips the relief reckoning, relief_for_device has nothing to do
    (no pause, suspension or eviction), with pausing on or off and suspension allowed."""
    rng = random.Random(4000 + seed)
    calm = restless = 0
    for _ in range(300):
        device = dev(
            mem=rng.choice(DEVICE_MIB[:4]),
            oc=rng.choice(ONLINE_COMPUTE),
            om=rng.choice(ONLINE_MEMORY),
        )
        here = random_slices(rng, device)
        margins = rng.choice((Margins(), Margins(compute_pct=0.0, memory_mib=0.0)))
        if not planner._calm(device, here, margins):
            restless += 1
            continue
        calm += 1
        for rules in (PauseRules(), PauseRules(enabled=False), PauseRules(suspend=True)):
            relief = relief_for_device(device, here, margins, NOW, rules, None, lambda a: True)
            assert relief == [], (device, here, rules)
    assert calm > 50 and restless > 50


# -- reasons -------------------------------------------------------------------------------


def test_reasons_worked_out_once_per_queue_and_timing_are_each_jobs_own() -> None:
    """One :class:`Unplaced` for a whole pass says for each job what a fresh one says:
    the queue, the first checkpoint and the deadline change what the devices say."""
    devices = [
        dev(i=0, rc=5, rm=1024),
        dataclasses.replace(dev(i=1, oc=20), cooldown_until=NOW + 60),
        dataclasses.replace(dev(i=2), unavailable="drained by an admin"),
    ]
    night = QueueGate(open_until=NOW + 40, share=0.5, window="night")
    gates = {
        d.key: DeviceGates(open={"default": night}, closed={"train": "window 'day' is closed"})
        for d in devices
    }
    jobs = [
        job(1, c=50),
        job(2, c=10, m=90000),
        job(3, c=100, gpus=2),
        dataclasses.replace(job(4), deadline_s=60.0),
        dataclasses.replace(job(5), deadline_s=5.0, first_checkpoint_s=60.0),
        dataclasses.replace(job(6), deadline_s=5.0, first_checkpoint_s=10.0),
        job(7, c=50, queue="train"),
    ]
    for s in (
        Snapshot(now=NOW, queued=[], active=[], devices=devices),
        Snapshot(now=NOW, queued=[], active=[], devices=devices, gates=gates),
    ):
        shared = Unplaced(s, devices)
        said = [shared.reason(j) for j in jobs + jobs[::-1]]
        assert said == [Unplaced(s, devices).reason(j) for j in jobs + jobs[::-1]]
        if s.gates is not None:  # each timing and queue says something of its own
            assert len(set(said)) == len(jobs)
    cooling = Snapshot(now=NOW, queued=[], active=[], devices=devices[1:2])
    assert (
        Unplaced(cooling, cooling.devices)
        .reason(jobs[0])
        .startswith("waiting: devices cooling down")
    )
