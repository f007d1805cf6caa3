"""When offline work may run: the policy's windows evaluated at an instant.  Pure.

:func:`gates` answers, for every device and queue, whether offline work may run there now,
until when (so slices are drained by the close), and what share of the device it may
hold; and, where it may not, why.  The rules (see :mod:`ebbtide.config.windows`):

- offline work may run where any window that admits its queue is open (union);
- a blackout open on the device always wins;
- a policy with no cron or lull windows admits every queue always (blackouts still apply);
- a cron window's close is a promise: ``open_until`` is the end of the chain of admitting
  cron windows covering now, cut at the next blackout; a lull window has no known end
  (``math.inf``): eviction covers it.

Lull windows need history, so their state lives in :class:`LullTracker` objects fed with
samples by the caller (the scheduler, or the simulator) and passed in as ``lull_open``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from apscheduler.triggers.cron import CronTrigger

from ebbtide.scheduling.cron import next_fire, parse_cron
from ebbtide.scheduling.snapshot import DeviceGates, QueueGate
from ebbtide.units import format_mib

if TYPE_CHECKING:
    from ebbtide.config.policy import Policy
    from ebbtide.config.windows import LullWindow, _Scheduled

#: How far ahead to look for a window's next opening, in seconds (a bit over a year).
HORIZON_S = 400 * 86400.0
#: At most this many openings are examined to find the one covering an instant.
_MAX_SCAN = 2000
#: Chained windows are followed at most this many times.
_MAX_CHAIN = 50


@dataclass(frozen=True)
class Occurrence:
    """One opening of a scheduled window: ``[start, end)`` in Unix seconds."""

    start: float
    end: float


class Schedule:
    """A cron or blackout window's openings, with its except dates and timezone."""

    def __init__(self, window: _Scheduled) -> None:
        self.window = window
        self.tz = window.tz
        self.trigger: CronTrigger = parse_cron(window.schedule, self.tz)
        self.except_dates = frozenset(window.except_)
        self._until = window.until_time()
        #: the longest an opening can last, in seconds
        self.max_len_s = window.duration if window.duration is not None else 86400.0 + 3600.0

    def end_of(self, start: float) -> float:
        """When the opening that starts at ``start`` closes.

        ``until`` is a local wall-clock time: the next time the clock reads it.  On the
        nights the clocks change: after a fall-back repeat of the start time, the close is
        the same wall time later that night; an opening that lay wholly inside a
        spring-forward gap (02:30 until 03:00) has no length at all.
        """
        if self.window.duration is not None:
            return start + self.window.duration
        assert self._until is not None
        local = dt.datetime.fromtimestamp(start, self.tz)
        wall = local.replace(tzinfo=None)
        until = dt.datetime.combine(local.date(), self._until)
        offset = local.utcoffset() or dt.timedelta(0)
        before = dt.datetime.fromtimestamp(start - 3600, self.tz).utcoffset() or dt.timedelta(0)
        if offset > before and wall - (offset - before) < until <= wall:
            return start  # spring forward: the whole opening fell in the gap
        if until <= wall:
            until += dt.timedelta(days=1)
        if local.fold:  # the repeated hour after a fall back: count wall time from here
            return start + (until - wall).total_seconds()
        return until.replace(tzinfo=self.tz).timestamp()

    def _skipped(self, start: float) -> bool:
        return dt.datetime.fromtimestamp(start, self.tz).date() in self.except_dates

    def _fires(self, after: float, until: float) -> Iterable[float]:
        """Fire times in ``[after, until]``, except dates skipped.  A wall time the clocks
        repeat when they fall back fires once, as in crontab (the first time)."""
        t = after
        for _ in range(_MAX_SCAN):
            fire = next_fire(self.trigger, t, self.tz)
            if fire is None or fire > until:
                return
            local = dt.datetime.fromtimestamp(fire, self.tz)
            repeat = local.fold == 1 and local.replace(fold=0).timestamp() != fire
            if not self._skipped(fire) and not repeat:
                yield fire
            t = fire + 1.0

    def occurrence_at(self, t: float) -> Occurrence | None:
        """The earliest opening that covers ``t``, if any."""
        for start in self._fires(t - self.max_len_s, t):
            end = self.end_of(start)
            if start <= t < end:
                return Occurrence(start, end)
        return None

    def next_start(self, after: float) -> float | None:
        """The first opening strictly after ``after``, within :data:`HORIZON_S`."""
        for start in self._fires(math.floor(after) + 1.0, after + HORIZON_S):
            return start
        return None


class LullTracker:
    """Whether one lull window is open on one device, from that device's samples.

    Opens once online compute and memory have both stayed below ``below`` for ``for``
    seconds; closes as soon as either rises above ``close_above``.  Between the two
    thresholds it keeps its state, so a signal flapping around one threshold does not
    flap the window.
    """

    def __init__(self, window: LullWindow) -> None:
        self.window = window
        self.open = False
        self.below_since: float | None = None
        #: why it last closed, in words ("online compute rose to 52% (it closes above
        #: 40%)"); empty while open or never opened
        self.closed_why = ""

    def observe(self, t: float, compute_pct: float, memory_mib: float) -> bool:
        w = self.window
        if self.open:
            if compute_pct > w.close_above.compute_pct:
                self._close(
                    f"online compute rose to {compute_pct:.0f}% "
                    f"(it closes above {w.close_above.compute_pct:g}%)"
                )
            elif memory_mib > w.close_above.memory:
                self._close(
                    f"online memory rose to {format_mib(memory_mib)} "
                    f"(it closes above {format_mib(w.close_above.memory)})"
                )
            return self.open
        if compute_pct < w.below.compute_pct and memory_mib < w.below.memory:
            if self.below_since is None:
                self.below_since = t
            if t - self.below_since >= w.for_:
                self.open = True
                self.closed_why = ""
        else:
            self.below_since = None
        return self.open

    def _close(self, why: str) -> None:
        self.open = False
        self.below_since = None
        self.closed_why = why

    def describe(self) -> str:
        w = self.window
        return (
            f"online below {w.below.compute_pct:g}% and {format_mib(w.below.memory)} "
            f"for {w.for_:g}s"
        )


LullState = Callable[[str, str, int], bool]
#: Why a lull window last closed on a device, in words ("" when it is open or never was).
LullWhy = Callable[[str, str, int], str]


class Gatekeeper:
    """Evaluates one policy's windows; build once per policy, call :meth:`gates` often."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.schedules = {w.name: Schedule(w) for w in (*policy.cron_windows, *policy.blackouts)}
        self.unrestricted = not policy.cron_windows and not policy.lull_windows

    def applies(self, pool: str | None, node: str, index: int) -> bool:
        return pool is None or self.policy.devices.in_pool(pool, node, index)

    def gates(
        self,
        now: float,
        devices: Sequence[tuple[str, int]],
        lull_open: LullState | None = None,
        lull_why: LullWhy | None = None,
    ) -> dict[tuple[str, int], DeviceGates]:
        occ: dict[tuple[str, float], Occurrence | None] = {}

        def occurrence(name: str, t: float) -> Occurrence | None:
            key = (name, t)
            if key not in occ:
                occ[key] = self.schedules[name].occurrence_at(t)
            return occ[key]

        nexts = {name: s.next_start(now) for name, s in self.schedules.items()}
        return {
            (node, index): self._device(now, node, index, occurrence, nexts, lull_open, lull_why)
            for node, index in devices
        }

    def _device(
        self,
        now: float,
        node: str,
        index: int,
        occurrence: Callable[[str, float], Occurrence | None],
        nexts: dict[str, float | None],
        lull_open: LullState | None,
        lull_why: LullWhy | None = None,
    ) -> DeviceGates:
        out = DeviceGates()
        blackouts = [b for b in self.policy.blackouts if self.applies(b.pool, node, index)]
        for b in blackouts:
            o = occurrence(b.name, now)
            if o is not None:
                why = f"blackout {b.name!r} until {_local(o.end, b.tz)}"
                out.closed = {q: why for q in self.policy.queues}
                return out
        cut = min((t for b in blackouts if (t := nexts[b.name]) is not None), default=math.inf)
        crons = [w for w in self.policy.cron_windows if self.applies(w.pool, node, index)]
        lulls = [w for w in self.policy.lull_windows if self.applies(w.pool, node, index)]
        for queue in self.policy.queues:
            if self.unrestricted:
                out.open[queue] = QueueGate(cut, 1.0)
                continue
            q_crons = [w for w in crons if w.queues is None or queue in w.queues]
            q_lulls = [w for w in lulls if w.queues is None or queue in w.queues]
            shares = [
                w.max_offline_share
                for w in q_lulls
                if lull_open is not None and lull_open(w.name, node, index)
            ]
            until = math.inf if shares else now
            open_crons = [w for w in q_crons if occurrence(w.name, now) is not None]
            shares += [w.max_offline_share for w in open_crons]
            if not shares:
                out.closed[queue] = self._why_closed(
                    queue, now, q_crons, q_lulls, nexts, node, index, lull_why
                )
                continue
            closing = ""
            if until != math.inf:
                until, closing = self._chain(now, q_crons, occurrence)
            if cut < until:
                until, closing = cut, next(b.name for b in blackouts if nexts[b.name] == cut)
            out.open[queue] = QueueGate(until, max(shares), closing)
        return out

    def _chain(
        self, now: float, crons: list, occurrence: Callable[[str, float], Occurrence | None]
    ) -> tuple[float, str]:
        """The end of the run of admitting cron openings that covers ``now``, and the
        window that ends it."""
        end, name = now, ""
        for _ in range(_MAX_CHAIN):
            ends = [(o.end, w.name) for w in crons if (o := occurrence(w.name, end)) is not None]
            if not ends or max(ends)[0] <= end:
                return end, name
            end, name = max(ends)
        return end, name

    def _why_closed(
        self,
        queue: str,
        now: float,
        crons: list,
        lulls: list,
        nexts: dict[str, float | None],
        node: str,
        index: int,
        lull_why: LullWhy | None = None,
    ) -> str:
        if not crons and not lulls:
            return f"no window admits queue {queue!r}"
        upcoming = [(t, w) for w in crons if (t := nexts[w.name]) is not None]
        parts = []
        if upcoming:
            t, w = min(upcoming, key=lambda x: x[0])
            parts.append(f"window {w.name!r} opens {_local(t, w.tz, now)} {w.timezone}")
        where = f"{node}/{index}" if node else "a device"  # no device: policy explain
        for w in lulls:
            opens = (
                f"opens on {where} after online below "
                f"{w.below.compute_pct:g}%/{format_mib(w.below.memory)} for {w.for_:g}s"
            )
            closed = lull_why(w.name, node, index) if lull_why is not None else ""
            if closed:  # it was open and closed: say why first (an eviction's reason)
                parts.append(f"lull {w.name!r} closed on {node}/{index}: {closed}; it {opens}")
            else:
                parts.append(f"lull {w.name!r} {opens}")
        return "; or ".join(parts) if parts else f"no window admits queue {queue!r}"


def _local(t: float, tz: dt.tzinfo, now: float | None = None) -> str:
    """``22:00`` today, ``Mon 22:00`` within a week, ``2026-12-24 22:00`` beyond."""
    when = dt.datetime.fromtimestamp(t, tz)
    if now is None:
        return when.strftime("%H:%M")
    today = dt.datetime.fromtimestamp(now, tz).date()
    if when.date() == today:
        return when.strftime("%H:%M")
    if (when.date() - today).days < 7:
        return when.strftime("%a %H:%M")
    return when.strftime("%Y-%m-%d %H:%M")
