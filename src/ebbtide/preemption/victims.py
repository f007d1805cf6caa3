"""Victim selection: pure, shared by the scheduler, the agent's fast path and the simulator.

When online usage plus offline slices on a device exceed capacity minus the margin, the
victims are taken in this order: lowest priority first; then the least work lost since
the last checkpoint; then the most recently started.  Attempts already being evicted
count as freed (an in-flight set: nobody is evicted twice), and after picking, any victim
the others already cover is spared, so the set is minimal in that order.

When only compute is short and the victims are to be paused (the graduated response, see
:mod:`ebbtide.preemption.relief`), :func:`pause_victims` picks instead: a pause loses no
work, but the compute it stops beyond the need stays idle until the thaw, so within a
priority it takes the set that covers the need with the least to spare.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import groupby

from ebbtide.queue.states import JobState
from ebbtide.scheduling.capacity import on_device, overflow
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins
from ebbtide.units import format_mib

#: Most steps :func:`pause_victims` takes per group looking for the smallest set of slices
#: that covers a shortfall; past it, the best set found so far stands.
PAUSE_SEARCH_STEPS = 2000
#: Float slack when a set of slices covers a shortfall, in percent.
_FIT_EPS = 1e-9


class EvictReason(StrEnum):
    ONLINE_MEMORY = "online_memory"
    ONLINE_COMPUTE = "online_compute"
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"
    WINDOW_CLOSING = "window_closing"  # drained so the slice is free by the close
    WINDOW_CLOSED = "window_closed"  # no open window admits it here any more
    SHARE = "offline_share"  # over the share the open windows allow
    GPU_FAULT = "gpu_fault"  # the device failed (an XID, off the bus): moved, not counted
    PAUSED_TOO_LONG = "paused_too_long"  # paused past max_pause_s: moved to run elsewhere
    SUSPENDED_TOO_LONG = "suspended_too_long"  # suspended past max_suspend_s: moved
    # taken back by the cluster, not by ebbtide (the Kubernetes executor observes these):
    KUBE_PREEMPTED = "kube_preempted"  # the kube-scheduler preempted it for a pod of its own
    NODE_PRESSURE = "node_pressure"  # the kubelet evicted it: the node ran short of memory


#: Evictions after which a device cools down (``eviction_cooldown_s``): online pressure.  A
#: cancel, a window's close, a move, a fault or a shutdown says nothing about the online
#: side's next spike.  The node agent and the simulator both apply it.
COOLDOWN_REASONS = frozenset({EvictReason.ONLINE_MEMORY, EvictReason.ONLINE_COMPUTE})


@dataclass(frozen=True)
class Eviction:
    """A decision to take an attempt's slice back."""

    job_id: int
    attempt: int
    node: str
    reason: EvictReason
    #: the longest time from now until the slice is free, in seconds
    deadline_s: float
    #: a sentence a person can act on
    message: str


def compute_used(a: ActiveAttempt) -> float:
    """The compute an attempt's slice uses, in percent: none for a whole-GPU slice (it
    yields to online work), a paused or a suspended one."""
    return a.compute_pct if a.gpus == 0 and not a.paused and not a.suspended else 0.0


def memory_used(a: ActiveAttempt) -> float:
    """The GPU memory an attempt's slice uses, in MiB: none for a suspended one (its
    memory is on the host)."""
    return 0.0 if a.suspended else float(a.memory_mib)


def victim_order_key(a: ActiveAttempt, now: float) -> tuple[int, float, float]:
    started = a.started_at or a.dispatched_at
    return (a.priority, a.lost_work_s(now), -started)


def select_victims(
    active: Sequence[ActiveAttempt],
    need_compute: float,
    need_memory: float,
    now: float,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
) -> list[ActiveAttempt]:
    """The attempts to evict so that ``need_compute`` % and ``need_memory`` MiB come free.

    Protected attempts (not preemptible, or inside their queue's min-runtime) are never
    taken for compute, and taken for memory only after every unprotected one.
    """
    need_c, need_m = need_compute, need_memory
    for a in active:
        if a.evicting:
            need_c -= compute_used(a)
            need_m -= memory_used(a)
    if need_c <= 0 and need_m <= 0:
        return []
    guarded = {id(a) for a in active if is_protected is not None and is_protected(a)}
    candidates = sorted(
        (a for a in active if not a.evicting),
        key=lambda a: (id(a) in guarded, *victim_order_key(a, now)),
    )
    picked: list[ActiveAttempt] = []
    got_c = got_m = 0.0
    for a in candidates:
        if got_c >= need_c and got_m >= need_m:
            break
        gives_c = compute_used(a)
        for_compute = got_c < need_c and gives_c > 0 and id(a) not in guarded
        useful = for_compute or (got_m < need_m and memory_used(a) > 0)
        if not useful:
            continue
        picked.append(a)
        got_c += gives_c
        got_m += memory_used(a)
    # spare, latest pick first, any victim the others already cover
    for a in list(reversed(picked)):
        rest = [p for p in picked if p is not a]
        c = sum(compute_used(p) for p in rest)
        m = sum(memory_used(p) for p in rest)
        if c >= need_c and m >= need_m:
            picked = rest
    return picked


def evictions_for_device(
    device: DeviceView,
    active: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
) -> list[Eviction]:
    """Evictions that bring ``device`` back within capacity minus the margin."""
    here = on_device(device, active)
    over_c, over_m = overflow(device, here, margins)
    if over_c <= 0 and over_m <= 0:
        return []
    where = f"{device.node}/{device.index}"
    parts = []
    if over_m > 0:
        parts.append(
            f"online memory on {where} rose to {format_mib(device.online_memory_mib)}; "
            f"offline slices must free {format_mib(over_m)} "
            f"(margin {format_mib(margins.memory_mib)})"
        )
    if over_c > 0:
        parts.append(
            f"online compute on {where} rose to {device.online_compute_pct:.0f}%; "
            f"offline slices must free {over_c:.1f}% (margin {margins.compute_pct:g}%)"
        )
    reason = EvictReason.ONLINE_MEMORY if over_m > 0 else EvictReason.ONLINE_COMPUTE
    message = "; and ".join(parts)
    return [
        Eviction(a.job_id, a.attempt, a.node, reason, a.deadline_s, message)
        for a in select_victims(here, over_c, over_m, now, is_protected)
    ]


def pause_victims(
    active: Sequence[ActiveAttempt],
    need_compute: float,
    now: float,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
) -> list[ActiveAttempt]:
    """The attempts to stop so that ``need_compute`` % of compute comes free, when only
    compute is short: lowest priority first, and within a priority those that may pause
    before those that would have to be evicted (the cheaper action); within each such
    pausable group the set whose compute covers what is still needed with the least to
    spare, then the fewest attempts, then the victim order (:func:`victim_order_key`);
    those to be evicted are taken in the victim order, as :func:`select_victims` takes
    them (work since the last checkpoint is lost).  Then, as there, any victim the others
    already cover is spared, latest pick first; with no pausable attempt the pick is
    :func:`select_victims`'s own.

    Unlike an eviction, a pause loses no work, so the work since the last checkpoint is
    no reason to pick one attempt over another; what a pause does cost is the compute it
    stops beyond the need: a paused slice keeps its compute reserved (it is thawed in
    place), so that surplus stays idle until the thaw.  Attempts already being evicted
    count as freed; protected attempts are never taken for compute; whole-GPU slices free
    none.
    """
    need = need_compute
    candidates = []
    evicting = JobState.EVICTING
    for a in active:  # (compute_used() and the state's properties, written out)
        used = (
            a.compute_pct if a.gpus == 0 and a.paused_at is None and a.suspended_at is None else 0.0
        )
        if a.state == evicting:
            need -= used
        elif used > 0 and (is_protected is None or not is_protected(a)):
            candidates.append(a)
    if need <= 0 or not candidates:
        return []
    if len(candidates) == 1:
        return candidates

    def order(a: ActiveAttempt) -> tuple[int, bool, float, float]:
        """(priority, not pausable, then the victim order), victim_order_key written out."""
        started = a.started_at or a.dispatched_at
        lost = now - (a.last_checkpoint_at or started)
        return (a.priority, not a.pausable, lost if lost > 0.0 else 0.0, -started)

    # every candidate uses compute, so what it gives is its compute_pct (compute_used)
    candidates.sort(key=order)
    picked: list[ActiveAttempt] = []
    left = need
    for (_, pausable), group in groupby(candidates, key=lambda a: (a.priority, a.pausable)):
        if left <= 0:
            break
        members = list(group)
        if pausable:
            chosen = _smallest_cover(members, left)
        else:  # evicted: in the victim order, as select_victims takes them
            chosen, got = [], 0.0
            for a in members:
                if got >= left:
                    break
                chosen.append(a)
                got += a.compute_pct
        picked += chosen
        left -= sum(a.compute_pct for a in chosen)
    # spare, latest pick first, any victim the others already cover (as select_victims)
    for a in list(reversed(picked)):
        rest = [p for p in picked if p is not a]
        if sum(p.compute_pct for p in rest) >= need:
            picked = rest
    return picked


def _smallest_cover(group: Sequence[ActiveAttempt], need: float) -> list[ActiveAttempt]:
    """The members of ``group`` (in victim order, each using compute) whose compute covers
    ``need`` with the least to spare, then the fewest, then the earliest in order; all of
    them when together they do not cover it.

    Slices of one size are interchangeable but for their order, so a set is how many of
    each size (the earliest ones of it).  A device holds a handful of slices of a few
    sizes, and the same handful at pause after pause while only ``need`` moves, so every
    such count and its compute is listed once per set of sizes (:func:`_covers`) and each
    pick reads the list; a group with more ways to choose than ``COVER_TABLE_MAX`` is
    searched instead (:func:`_search_cover`), which gives up improving on the victim
    order's own pick after ``PAUSE_SEARCH_STEPS`` steps.  Both pick the same set where
    the search would not give up (``tests/unit/test_sim_fast_paths.py``)."""
    sizes = [a.compute_pct for a in group]
    if len(group) == 1 or sum(sizes) <= need + _FIT_EPS:
        return list(group)
    by_size: dict[float, list[int]] = {}
    for i, size in enumerate(sizes):
        by_size.setdefault(size, []).append(i)
    kinds = sorted(by_size.items(), key=lambda kv: -kv[0])
    floor = need - _FIT_EPS
    # the victim order's pick: its first members until the need is covered
    total, first = 0.0, 0
    while total < floor:
        total += sizes[first]
        first += 1
    best = (round(total, 6), first, tuple(range(first)))
    covers = _covers(tuple((size, len(at)) for size, at in kinds))
    if covers is None:
        best = _search_cover(kinds, floor, best)
    else:
        best = _best_listed(covers, kinds, floor, best)
    return [group[i] for i in best[2]]


#: Most ways to choose (the product of each size's count + 1) for which :func:`_covers`
#: lists every choice; the search's steps never exceed twice that, so below
#: ``PAUSE_SEARCH_STEPS / 2`` the list and the search agree.
COVER_TABLE_MAX = PAUSE_SEARCH_STEPS // 2 - 1
#: Sets of sizes whose choices are kept (the oldest forgotten past it).
COVER_TABLES_KEPT = 4096


@dataclass(frozen=True)
class _Covers:
    """Every choice of how many slices of each size: ``rounded`` (its compute rounded to
    six places, ascending), with the choice in the same position of ``choices`` as
    (rounded compute, how many, compute, counts by size) sorted by the first two."""

    rounded: list[float]
    choices: list[tuple[float, int, float, tuple[int, ...]]]


_cover_tables: dict[tuple[tuple[float, int], ...], _Covers | None] = {}


def _covers(shape: tuple[tuple[float, int], ...]) -> _Covers | None:
    """The choices for ``shape`` ((size, how many of it), largest size first), each one's
    compute summed in that order as the search sums it; None when there are more than
    ``COVER_TABLE_MAX``."""
    try:
        return _cover_tables[shape]
    except KeyError:
        pass
    ways = 1
    for _, count in shape:
        ways *= count + 1
    table = None
    if ways <= COVER_TABLE_MAX:
        choices: list[tuple[float, int, tuple[int, ...]]] = [(0.0, 0, ())]
        for size, count in shape:
            choices = [
                (total + k * size, n + k, (*counts, k))
                for total, n, counts in choices
                for k in range(count + 1)
            ]
        listed = sorted(
            ((round(total, 6), n, total, counts) for total, n, counts in choices),
            key=lambda c: (c[0], c[1]),
        )
        table = _Covers([c[0] for c in listed], listed)
    if len(_cover_tables) >= COVER_TABLES_KEPT:
        del _cover_tables[next(iter(_cover_tables))]
    _cover_tables[shape] = table
    return table


def _best_listed(
    covers: _Covers,
    kinds: list[tuple[float, list[int]]],
    floor: float,
    best: tuple[float, int, tuple[int, ...]],
) -> tuple[float, int, tuple[int, ...]]:
    """The least (spare, how many, which members) of the listed choices whose compute
    reaches ``floor``, or ``best`` if it is less.  (Rounding is monotonic, so no choice
    that reaches ``floor`` lies before the first whose rounded compute reaches its
    rounding.)"""
    choices = covers.choices
    i = bisect_left(covers.rounded, round(floor, 6))
    end = len(choices)
    while i < end:
        spare, n, total, counts = choices[i]
        i += 1
        if total < floor:
            continue
        if (spare, n) > best[:2]:
            return best
        # the first choice that covers, and those that tie with it: the earliest members
        while True:
            members = tuple(
                sorted(j for (_, at), k in zip(kinds, counts, strict=True) for j in at[:k])
            )
            best = min(best, (spare, n, members))
            while i < end and choices[i][2] < floor and choices[i][:2] == (spare, n):
                i += 1
            if i == end or choices[i][:2] != (spare, n):
                return best
            counts = choices[i][3]
            i += 1
    return best


def _search_cover(
    kinds: list[tuple[float, list[int]]],
    floor: float,
    best: tuple[float, int, tuple[int, ...]],
) -> tuple[float, int, tuple[int, ...]]:
    """How many of each size, largest sizes first, with branch and bound, starting from
    ``best`` (the victim order's pick) and giving up improving on it after
    ``PAUSE_SEARCH_STEPS`` steps.  It keeps its running count and compares the keys'
    parts one by one rather than as tuples."""
    n_kinds = len(kinds)
    left = [0.0] * (n_kinds + 1)  # compute of the sizes from j on
    for j in range(n_kinds - 1, -1, -1):
        left[j] = left[j + 1] + kinds[j][0] * len(kinds[j][1])
    counts = [0] * n_kinds
    steps = 0

    def visit(j: int, total: float, how_many: int) -> None:
        nonlocal best, steps
        steps += 1
        if total >= floor:
            # compared as (spare, how many, which): the members are listed only when the
            # first two do not settle it already
            spare = round(total, 6)
            if spare > best[0] or (spare == best[0] and how_many > best[1]):
                return
            members = tuple(
                sorted(i for (_, at), k in zip(kinds, counts, strict=True) for i in at[:k])
            )
            best = min(best, (spare, how_many, members))
            return
        if j == n_kinds or total + left[j] < floor or steps > PAUSE_SEARCH_STEPS:
            return
        size, at = kinds[j]
        for k in range(len(at), -1, -1):
            more = total + k * size
            if k and round(more, 6) > best[0]:
                continue  # more of this size only spares more
            counts[j] = k
            visit(j + 1, more, how_many + k)
        counts[j] = 0

    visit(0, 0.0, 0)
    return best
