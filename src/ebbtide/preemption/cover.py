"""The smallest cover of a compute shortfall: which of a group of slices to pause.

:func:`~ebbtide.preemption.victims.pause_victims` pauses, within a priority, the set of
pausable slices whose compute covers what must be freed with the least to spare (a paused
slice keeps its compute reserved until its thaw, so what it stops beyond the need stays
idle), then the fewest, then the earliest in the victim order.  The node agent asks at
nearly every pause, and the simulator with it, so the choices for a set of slice sizes
are listed once and read at each pause; a group with too many choices is searched.

Pure: no clock, no I/O (the lists kept are a cache of a pure function).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from operator import itemgetter

from ebbtide.scheduling.snapshot import ActiveAttempt

__all__ = ["COVER_TABLE_MAX", "PAUSE_SEARCH_STEPS", "smallest_cover"]

#: Most steps :func:`smallest_cover` takes per group searching for the smallest set of
#: slices that covers a shortfall; past it, the best set found so far stands.
PAUSE_SEARCH_STEPS = 2000
#: Float slack when a set of slices covers a shortfall, in percent.
_FIT_EPS = 1e-9


def smallest_cover(group: Sequence[ActiveAttempt], need: float) -> list[ActiveAttempt]:
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
    choices = _covers(tuple((size, len(at)) for size, at in kinds))
    if choices is None:
        best = _search_cover(kinds, floor, best)
    else:
        best = _best_listed(choices, kinds, floor, best)
    return [group[i] for i in best[2]]


#: Most ways to choose (the product of each size's count + 1) for which :func:`_covers`
#: lists every choice; the search's steps never exceed twice that, so below
#: ``PAUSE_SEARCH_STEPS / 2`` the list and the search agree.
COVER_TABLE_MAX = PAUSE_SEARCH_STEPS // 2 - 1
#: Sets of sizes whose choices are kept (the oldest forgotten past it).
COVER_TABLES_KEPT = 4096


#: one choice of how many slices of each size: (its compute rounded to six places, how
#: many slices, its compute, the counts by size)
_Choice = tuple[float, int, float, tuple[int, ...]]
#: a choice's compute rounded (what the lists are bisected on)
_ROUNDED = itemgetter(0)
#: per set of sizes, every choice sorted by what it spares and how many it takes (None:
#: too many choices to list)
_cover_tables: dict[tuple[tuple[float, int], ...], list[_Choice] | None] = {}


def _covers(shape: tuple[tuple[float, int], ...]) -> list[_Choice] | None:
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
        table = sorted(
            ((round(total, 6), n, total, counts) for total, n, counts in choices),
            key=lambda c: (c[0], c[1]),
        )
    if len(_cover_tables) >= COVER_TABLES_KEPT:
        del _cover_tables[next(iter(_cover_tables))]
    _cover_tables[shape] = table
    return table


def _best_listed(
    choices: list[_Choice],
    kinds: list[tuple[float, list[int]]],
    floor: float,
    best: tuple[float, int, tuple[int, ...]],
) -> tuple[float, int, tuple[int, ...]]:
    """The least (spare, how many, which members) of the listed choices whose compute
    reaches ``floor``, or ``best`` if it is less: the first such choice and those that tie
    with it on the first two.  (Rounding is monotonic, so no choice that reaches ``floor``
    lies before the first whose rounded compute reaches its rounding.)"""
    first: tuple[float, int] | None = None
    for i in range(bisect_left(choices, round(floor, 6), key=_ROUNDED), len(choices)):
        spare, n, total, counts = choices[i]
        if first is not None and (spare, n) != first:
            break
        if total < floor:
            continue
        if first is None:
            first = (spare, n)
            if first > best[:2]:
                break
        best = min(best, (spare, n, _members(kinds, counts)))
    return best


def _members(kinds: list[tuple[float, list[int]]], counts: Sequence[int]) -> tuple[int, ...]:
    """The group's members a choice takes: the first ``counts[j]`` of each size ``j``, in
    the group's order."""
    return tuple(sorted(i for (_, at), k in zip(kinds, counts, strict=True) for i in at[:k]))


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
            best = min(best, (spare, how_many, _members(kinds, counts)))
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
