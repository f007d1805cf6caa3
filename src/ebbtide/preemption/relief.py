"""Graduated response: for each shortfall on a device, the cheapest actions that end it.

Online load rising on a device leaves the offline slices there too little room.  What
has to be given back decides what is done, cheapest first:

- **pause** — online *compute* rose and memory still fits: freeze the attempt (SIGSTOP to
  its process tree, or its cgroup's freezer).  It keeps its GPU memory and issues no more
  GPU work; its compute is free once the work in flight drains (``pause_drain_s``).
  Nothing is lost: no checkpoint to restore, no CUDA context to rebuild.  AntMan (OSDI'20)
  and TGS (NSDI'23) throttle opportunistic jobs for the same reason.
- **suspend** — memory is short and the attempt can be suspended to host (pausing is on
  for it, ``suspend`` is on, and the node says it can: ``cuda-checkpoint`` is there,
  moving its memory fits its deadline, and the host has the memory within
  ``host_memory_pct``): pause it and move its CUDA state to host memory,
  which frees its GPU memory without ending it.  A suspended attempt uses neither compute
  nor GPU memory; it is restored when both fit again (``thaw_hysteresis_pct`` and
  ``restore_hysteresis_mib`` to spare), or evicted after ``max_suspend_s``.
- **evict** — memory is short (a paused job still holds its memory) and the attempt
  cannot be suspended, it may not be paused (``--no-pause``, its queue, an executor that
  cannot), or it has been paused longer than ``max_pause_s`` and does not fit here again,
  or suspended longer than ``max_suspend_s`` (moved so it can run elsewhere): warn,
  checkpoint, requeue, as before.

For a compute spike the attempts paused are the cheapest set (:func:`pause_victims`):
lowest priority first, pausable before evicted, then the least compute that covers the
shortfall.  A pause loses no work, so the work since the last checkpoint (which orders
evictions) does not matter; the compute paused beyond the shortfall does, because a paused
slice keeps its compute reserved until its thaw.

A paused attempt is thawed when the device has room for its compute again with a margin to
spare (``thaw_hysteresis_pct``) and it has been paused at least ``min_pause_s``, so a
flapping online signal does not flap the job; once paused ``max_pause_s`` it is thawed as
soon as it fits within the margin alone, rather than moved (a move costs a restart).

Pure: no clock, no I/O.  :func:`respond` is the node agent's whole decision at one sample
of one device (the reliefs, then the thaws and restores that fit once they are done): the
live agent's fast path and the simulator's agent both carry out what it returns, so a
change here shows in ``ebb sim`` as it does on a node.  The scheduler's planner calls
:func:`relief_for_device` for the devices it must relieve itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ebbtide.preemption.victims import EvictReason, evictions_for_device, pause_victims
from ebbtide.queue.states import JobState
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, on_device, overflow
from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    DeviceView,
    Margins,
    PauseRules,
)

__all__ = [
    "NOTHING",
    "ActionKind",
    "Relief",
    "Response",
    "relief_for_device",
    "respond",
    "restores_for_device",
    "thaws_for_device",
]


class ActionKind(StrEnum):
    PAUSE = "pause"
    SUSPEND = "suspend"
    EVICT = "evict"


@dataclass(frozen=True)
class Relief:
    """One action on one attempt, with why."""

    job_id: int
    attempt: int
    node: str
    kind: ActionKind
    reason: EvictReason
    #: for an eviction: the longest time from now until the slice is free, in seconds
    deadline_s: float
    #: a sentence a person can act on
    message: str


@dataclass(frozen=True)
class Response:
    """What the node agent does on one device at one sample, in this order."""

    #: pauses, suspensions and evictions, cheapest first (:func:`relief_for_device`)
    reliefs: list[Relief]
    #: paused attempts to run again, once the reliefs are done (:func:`thaws_for_device`)
    thaws: list[ActiveAttempt]
    #: suspended attempts to bring back, once the thaws are done
    #: (:func:`restores_for_device`)
    restores: list[ActiveAttempt]


NOTHING = Response([], [], [])


def respond(
    device: DeviceView,
    active: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    rules: PauseRules,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
    can_suspend: Callable[[ActiveAttempt], bool] | None = None,
) -> Response:
    """The node agent's decision step for ``device`` at a sample taken ``now``: relieve
    it (:func:`relief_for_device`), then thaw what fits once the reliefs are done
    (:func:`thaws_for_device`), then restore what fits once the thaws are done
    (:func:`restores_for_device`).  Figures seconds old (``planning_only``) trigger
    nothing.  A caller whose suspension fails (and evicts instead) should leave the
    thaws and restores to its next sample: they counted that attempt's compute free."""
    if device.planning_only:
        return NOTHING
    here = on_device(device, active)
    if not here:
        return NOTHING
    reliefs = _relief(device, here, margins, now, rules, is_protected, can_suspend)
    if reliefs:
        here = _after(here, reliefs, now)
    thaws = _thaws(device, here, margins, now, rules)
    if thaws:
        thawed = {(a.job_id, a.attempt) for a in thaws}
        here = [_changed(a, paused_at=None) if (a.job_id, a.attempt) in thawed else a for a in here]
    restores = _restores(device, here, margins, now, rules)
    if not (reliefs or thaws or restores):
        return NOTHING
    return Response(reliefs, thaws, restores)


def _after(here: list[ActiveAttempt], reliefs: list[Relief], now: float) -> list[ActiveAttempt]:
    """The attempts on a device as they are once ``reliefs`` are carried out."""
    kinds = {(r.job_id, r.attempt): r.kind for r in reliefs}
    out = []
    for a in here:
        kind = kinds.get((a.job_id, a.attempt))
        if kind is ActionKind.EVICT:  # thawed to take its warning (on the host too)
            a = _changed(a, state=JobState.EVICTING, paused_at=None)
        elif kind is ActionKind.PAUSE and a.paused_at is None:
            a = _changed(a, paused_at=now)
        elif kind is ActionKind.SUSPEND:
            a = _changed(a, paused_at=now if a.paused_at is None else a.paused_at, suspended_at=now)
        out.append(a)
    return out


def _changed(a: ActiveAttempt, **changes: object) -> ActiveAttempt:
    """``dataclasses.replace(a, **changes)``, in a tenth of the time (the simulator asks
    for one at every pause): the fields are copied, not validated again."""
    b = object.__new__(ActiveAttempt)
    b.__dict__.update(a.__dict__)
    b.__dict__.update(changes)
    return b


def relief_for_device(
    device: DeviceView,
    active: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    rules: PauseRules,
    is_protected: Callable[[ActiveAttempt], bool] | None = None,
    can_suspend: Callable[[ActiveAttempt], bool] | None = None,
) -> list[Relief]:
    """The actions that bring ``device`` back within capacity minus the margin, cheapest
    first: pauses while only compute is short; for memory, suspensions of the attempts
    ``can_suspend`` allows (the node's say: the utility is there, the move fits the
    deadline and the host's memory; ``None``: none) and evictions of the rest; evictions
    for attempts that may not pause, for those paused past ``max_pause_s`` that do not
    fit here again (:func:`thaws_for_device` thaws those that do), and for those
    suspended past ``max_suspend_s``."""
    return _relief(
        device, on_device(device, active), margins, now, rules, is_protected, can_suspend
    )


def _relief(
    device: DeviceView,
    here: list[ActiveAttempt],
    margins: Margins,
    now: float,
    rules: PauseRules,
    is_protected: Callable[[ActiveAttempt], bool] | None,
    can_suspend: Callable[[ActiveAttempt], bool] | None,
) -> list[Relief]:
    out: list[Relief] = []
    where = f"{device.node}/{device.index}"
    thawing: set[tuple[int, int]] | None = None
    for a in here:
        if a.suspended_at is not None:
            since, limit, knob = a.suspended_at, rules.max_suspend_s, "max_suspend_s"
            reason, what = EvictReason.SUSPENDED_TOO_LONG, "suspended to host"
        elif a.paused_at is not None:
            since, limit, knob = a.paused_at, rules.max_pause_s, "max_pause_s"
            reason, what = EvictReason.PAUSED_TOO_LONG, "paused"
        else:
            continue  # (most slices run: this test comes before the one of their state)
        if a.evicting:
            continue
        if now - since >= limit:
            if a.suspended_at is None:
                if thawing is None:  # it fits here again now: thawed, not moved
                    thawing = {
                        (t.job_id, t.attempt) for t in _thaws(device, here, margins, now, rules)
                    }
                if (a.job_id, a.attempt) in thawing:
                    continue
            message = (
                f"{what} on {where} for {now - since:.1f}s, "
                f"longer than {knob} {limit:g}s: moved to run elsewhere"
            )
            out.append(
                Relief(a.job_id, a.attempt, a.node, ActionKind.EVICT, reason, a.deadline_s, message)
            )
    if out:
        leaving = {(r.job_id, r.attempt) for r in out}
        rest = [
            dataclasses.replace(a, state=JobState.EVICTING)
            if (a.job_id, a.attempt) in leaving
            else a
            for a in here
        ]
    else:
        rest = here
    over_c, over_m = overflow(device, rest, margins)
    if over_m > 0 or not rules.enabled:
        # memory is short (a pause would free none), or pausing is off: suspend what can
        # be (it frees the memory and the compute an eviction would), evict the rest
        by_key = {(a.job_id, a.attempt): a for a in rest}
        for e in evictions_for_device(device, rest, margins, now, is_protected):
            a = by_key[(e.job_id, e.attempt)]
            suspend = (
                over_m > 0
                and rules.enabled
                and rules.suspend
                and a.pausable
                and can_suspend is not None
                and can_suspend(a)
            )
            kind, message = ActionKind.EVICT, e.message
            if suspend:
                kind = ActionKind.SUSPEND
                message += "; suspended to host until its memory fits again"
            out.append(Relief(e.job_id, e.attempt, e.node, kind, e.reason, e.deadline_s, message))
        return out
    if over_c <= 0:
        return out
    for a in pause_victims([a for a in rest if a.paused_at is None], over_c, now, is_protected):
        kind = ActionKind.PAUSE if a.pausable else ActionKind.EVICT
        message = (
            f"online compute on {where} rose to {device.online_compute_pct:.0f}%; "
            f"offline slices must free {over_c:.1f}% (margin {margins.compute_pct:g}%)"
        )
        if kind is ActionKind.PAUSE:
            message += "; memory fits, so paused until compute is free again"
        out.append(
            Relief(
                a.job_id, a.attempt, a.node, kind, EvictReason.ONLINE_COMPUTE, a.deadline_s, message
            )
        )
    return out


def thaws_for_device(
    device: DeviceView,
    active: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    rules: PauseRules,
) -> list[ActiveAttempt]:
    """The paused attempts on ``device`` to run again now: highest priority first, then
    the longest paused, while their compute fits with ``thaw_hysteresis_pct`` to spare,
    once they have been paused ``min_pause_s``.  One paused ``max_pause_s`` or longer
    needs no hysteresis, only the margin: it would otherwise be evicted to run elsewhere
    (:func:`relief_for_device`), and running here costs at most another pause, where a
    move costs a restart.  (Suspended attempts are :func:`restores_for_device`'s.)"""
    if device.planning_only:
        return []
    here = on_device(device, active)
    return _thaws(device, here, margins, now, rules)


def _thaws(
    device: DeviceView,
    here: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    rules: PauseRules,
) -> list[ActiveAttempt]:
    paused = [
        a
        for a in here
        if a.paused_at is not None and a.suspended_at is None and a.state != JobState.EVICTING
    ]
    if not paused:
        return []
    running = sum(a.compute_pct for a in here if a.gpus == 0 and a.paused_at is None)
    room = DEVICE_COMPUTE_PCT - margins.compute_pct - device.online_compute_pct - running
    out = []
    for a in sorted(paused, key=lambda a: (-a.priority, a.paused_at)):
        assert a.paused_at is not None
        paused_s = now - a.paused_at
        if paused_s < rules.min_pause_s:
            continue
        need = a.compute_pct if a.gpus == 0 else 0.0
        spare = 0.0 if paused_s >= rules.max_pause_s else rules.thaw_hysteresis_pct
        if need + spare <= room:
            out.append(a)
            room -= need
    return out


def restores_for_device(
    device: DeviceView,
    active: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    rules: PauseRules,
) -> list[ActiveAttempt]:
    """The suspended attempts on ``device`` to bring back to their GPU and run again now:
    highest priority first, then the longest suspended, while both their memory and their
    compute fit with ``restore_hysteresis_mib`` and ``thaw_hysteresis_pct`` to spare, and
    once they have been suspended ``min_pause_s``."""
    if device.planning_only:
        return []
    return _restores(device, on_device(device, active), margins, now, rules)


def _restores(
    device: DeviceView,
    here: Sequence[ActiveAttempt],
    margins: Margins,
    now: float,
    rules: PauseRules,
) -> list[ActiveAttempt]:
    suspended = [a for a in here if a.suspended_at is not None and not a.evicting]
    if not suspended:
        return []
    awake = [a for a in here if not a.suspended]
    room_c = (
        DEVICE_COMPUTE_PCT
        - margins.compute_pct
        - rules.thaw_hysteresis_pct
        - device.online_compute_pct
        - sum(a.compute_pct for a in awake if a.gpus == 0 and not a.paused)
    )
    room_m = (
        device.memory_mib
        - margins.memory_mib
        - rules.restore_hysteresis_mib
        - device.online_memory_mib
        - sum(a.memory_mib for a in awake)
    )
    out = []
    for a in sorted(suspended, key=lambda a: (-a.priority, a.suspended_at)):
        assert a.suspended_at is not None
        if now - a.suspended_at < rules.min_pause_s:
            continue
        need_c = a.compute_pct if a.gpus == 0 else 0.0
        if need_c <= room_c and a.memory_mib <= room_m:
            out.append(a)
            room_c -= need_c
            room_m -= a.memory_mib
    return out
