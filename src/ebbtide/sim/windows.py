"""A policy file's windows on the simulator's virtual clock (``ebb sim --policy FILE``).

The product's own :class:`~ebbtide.scheduling.windows.Gatekeeper` and
:class:`~ebbtide.scheduling.windows.LullTracker` decide; this module only maps the clocks
and keeps the answers between the instants they can change.

- **Clock.** Simulated time ``t`` (seconds from the trace's start) is the wall-clock instant
  :data:`SIM_DATE` at the trace's local clock origin (``--clock-start``) plus ``t``, in the
  timezone of the policy's first cron or blackout window (UTC when it has none): a window
  ``22:00-07:00 Europe/Berlin`` opens at 22:00 of the trace's local clock.  Gates go to the
  planner with their closing times on the simulated clock.
- **Devices.** Simulated device ``k`` is ``gpuK/0`` (what ``devices.pools`` patterns match).
- **Cron windows** change only at an opening or a close: the gates are computed again
  there (:attr:`SimWindows.valid_until`), and the instants at which drains are due
  (close − deadline − :data:`~ebbtide.scheduling.admission.DRAIN_LEAD_S`) are handed to the
  event loop so a planner pass runs then.
- **Lull windows** see what the scheduler hears: every report of a device's online usage
  is a sample (:meth:`SimWindows.observe`).  The trace holds usage between its steps, so
  a device that stays quiet sends no new sample; :meth:`SimWindows.observe` returns when
  its window would open if nothing changes, and the event loop samples again then.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import replace
from zoneinfo import ZoneInfo

from ebbtide.config.policy import Policy
from ebbtide.scheduling.admission import DRAIN_LEAD_S
from ebbtide.scheduling.snapshot import DeviceGates, QueueLimits
from ebbtide.scheduling.windows import Gatekeeper, LullTracker

#: The date the simulated day starts on (a Monday, for weekday schedules).
SIM_DATE = dt.date(2024, 1, 8)
#: Instants this close to a whole second are that second (window boundaries are whole).
_SNAP_S = 1e-3

Key = tuple[str, int]


class SimWindows:
    def __init__(self, policy: Policy, nodes: Sequence[str], clock_origin_s: float) -> None:
        self.policy = policy
        self.keeper = Gatekeeper(policy)
        scheduled = [*policy.cron_windows, *policy.blackouts]
        tz = ZoneInfo(scheduled[0].timezone) if scheduled else ZoneInfo("UTC")
        midnight = dt.datetime.combine(SIM_DATE, dt.time(), tz).timestamp()
        #: the Unix time of simulated time 0 (whole seconds, so boundaries map exactly)
        self.unix0 = float(round(midnight + clock_origin_s))
        self.keys: list[Key] = [(node, 0) for node in nodes]
        self.limits: dict[str, QueueLimits] = {n: q.limits for n, q in policy.queues.items()}
        #: per device, its lull trackers (one per lull window that applies to it)
        self.trackers: dict[str, list[LullTracker]] = {
            node: [
                LullTracker(w)
                for w in policy.lull_windows
                if w.pool is None or policy.devices.in_pool(w.pool, node, 0)
            ]
            for node in nodes
        }
        self._open: dict[tuple[str, str], bool] = {}
        #: per device, what the windows allow, with closing times on the simulated clock
        self.gates: dict[Key, DeviceGates] = {}
        #: the gates hold until this simulated time (the next cron opening or close)
        self.valid_until = -math.inf
        #: set by :meth:`observe` when a lull window opened or closed on the device
        self.changed = False

    @property
    def needs_full_view(self) -> bool:
        """Fleet-wide quotas count every device and attempt: plan on all of them."""
        return any(
            q.max_fleet_share is not None or q.max_user_share is not None or q.max_running
            for q in self.limits.values()
        )

    def _unix(self, t: float) -> float:
        u = self.unix0 + t
        r = round(u)
        return float(r) if abs(u - r) < _SNAP_S else u

    def lull_open(self, window: str, node: str, index: int) -> bool:
        return self._open.get((window, node), False)

    def _compute(self, now: float, keys: Sequence[Key]) -> None:
        for key, g in self.keeper.gates(self._unix(now), keys, self.lull_open).items():
            self.gates[key] = DeviceGates(
                open={
                    q: replace(qg, open_until=qg.open_until - self.unix0)
                    if math.isfinite(qg.open_until)
                    else qg
                    for q, qg in g.open.items()
                },
                closed=g.closed,
            )

    def refresh(self, now: float) -> list[float]:
        """Compute every device's gates at ``now`` and when they next change; returns the
        closing times of the open gates (see :meth:`closes`)."""
        self._compute(now, self.keys)
        u = self._unix(now)
        change = math.inf
        for schedule in self.keeper.schedules.values():
            occ = schedule.occurrence_at(u)
            if occ is not None:
                change = min(change, occ.end)
            nxt = schedule.next_start(u)
            if nxt is not None:
                change = min(change, nxt)
        self.valid_until = change - self.unix0
        return self.closes()

    def closes(self) -> list[float]:
        """The distinct finite closing times of the open gates, on the simulated clock."""
        return sorted(
            {q.open_until for g in self.gates.values() for q in g.open.values()} - {math.inf}
        )

    def observe(self, node: str, now: float, compute_pct: float, memory_mib: float) -> float | None:
        """Feed one sample of the device's online usage to its lull windows.  Recomputes
        the device's gates when a window opened or closed (then :attr:`changed` is set);
        returns the time a window would open if usage stays as it is (None: no such)."""
        self.changed = False
        again: float | None = None
        for tracker in self.trackers[node]:
            was = tracker.open
            now_open = tracker.observe(now, compute_pct, memory_mib)
            if now_open != was:
                self._open[(tracker.window.name, node)] = now_open
                self.changed = True
            elif not now_open and tracker.below_since is not None:
                at = tracker.below_since + tracker.window.for_
                again = at if again is None else min(again, at)
        if self.changed:
            self._compute(now, [(node, 0)])
        return again


def drain_due(close: float, deadline_s: float) -> float:
    """When a slice with this deadline must be warned to be free by ``close``."""
    return close - deadline_s - DRAIN_LEAD_S
