"""The live side of the policy: reloads, lull state, and wake-ups at window boundaries.

- The policy file is reloaded when it changes (its modification time, checked each pass)
  or on request (SIGHUP).  An invalid new file keeps the old policy running and logs
  every error.
- Lull windows open and close on samples: :meth:`PolicyRuntime.observe` feeds one
  :class:`~ebbtide.scheduling.windows.LullTracker` per (window, device).
- APScheduler 3 wakes the scheduler at every cron window's opening (the window's own
  ``CronTrigger``), so no opening waits for the next polling pass.  The instants the
  planner asks for (drains before a close, a backoff's end) the scheduler's loop waits
  for itself, on its clock.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler

from ebbtide.config.loader import read_config
from ebbtide.config.policy import Policy, parse_policy
from ebbtide.errors import ConfigError
from ebbtide.scheduling.snapshot import DeviceGates
from ebbtide.scheduling.windows import Gatekeeper, LullTracker, Schedule

log = logging.getLogger("ebbtide.policy")


class PolicyRuntime:
    def __init__(
        self,
        policy: Policy,
        path: Path | None = None,
        *,
        on_change: Callable[[Policy], None] | None = None,
    ) -> None:
        self.path = path
        self.on_change = on_change
        self._mtime = self._stat()
        #: the text of the policy in effect, to publish for clients ("" for the built-in
        #: defaults; None when the policy was handed in without its file)
        self.text: str | None = _text_of(path) if path is not None else None
        if path is None and policy == Policy():
            self.text = ""
        self._reload_requested = threading.Event()
        self._wakeups: BackgroundScheduler | None = None
        self._wake: Callable[[], None] | None = None
        self._install(policy)

    def _install(self, policy: Policy) -> None:
        # a lull window whose definition did not change keeps its state across a reload
        previous: Policy | None = getattr(self, "policy", None)
        old = {w.name: w for w in previous.lull_windows} if previous is not None else {}
        new = {w.name: w for w in policy.lull_windows}
        kept = {
            key: tracker
            for key, tracker in getattr(self, "trackers", {}).items()
            if key[0] in new and new[key[0]] == old.get(key[0])
        }
        self.policy = policy
        self.keeper = Gatekeeper(policy)
        self.trackers: dict[tuple[str, str, int], LullTracker] = kept
        self._seen: dict[tuple[str, int], float] = {}
        if self._wakeups is not None:
            self._schedule_openings()

    # -- reloading ----------------------------------------------------------------------

    def _stat(self) -> float | None:
        try:
            return self.path.stat().st_mtime if self.path else None
        except OSError:
            return None

    def request_reload(self) -> None:
        """Reload at the next pass (the SIGHUP handler calls this)."""
        self._reload_requested.set()
        if self._wake is not None:
            self._wake()

    def maybe_reload(self) -> bool:
        """Reload if asked to or if the file changed; True when a new policy took effect."""
        if self.path is None:
            return False
        mtime = self._stat()
        if not self._reload_requested.is_set() and mtime == self._mtime:
            return False
        self._reload_requested.clear()
        self._mtime = mtime
        try:
            text = read_config(self.path, "policy file")
            policy = parse_policy(text, str(self.path))
        except ConfigError as exc:
            for line in str(exc).splitlines():
                log.error("policy not reloaded, keeping the old one: %s", line)
            return False
        self._install(policy)
        self.text = text
        log.info("policy reloaded from %s: %s", self.path, policy.summary())
        if self.on_change is not None:
            self.on_change(policy)
        return True

    # -- lull windows -------------------------------------------------------------------

    def observe(
        self, node: str, index: int, t: float, compute_pct: float, memory_mib: float
    ) -> None:
        """Feed one device sample to the lull windows that apply to the device."""
        if not self.policy.lull_windows or self._seen.get((node, index)) == t:
            return
        self._seen[(node, index)] = t
        for w in self.policy.lull_windows:
            if w.pool is not None and not self.policy.devices.in_pool(w.pool, node, index):
                continue
            tracker = self.trackers.get((w.name, node, index))
            if tracker is None:
                tracker = self.trackers[(w.name, node, index)] = LullTracker(w)
            tracker.observe(t, compute_pct, memory_mib)

    def lull_open(self, window: str, node: str, index: int) -> bool:
        tracker = self.trackers.get((window, node, index))
        return tracker is not None and tracker.open

    def lull_why(self, window: str, node: str, index: int) -> str:
        tracker = self.trackers.get((window, node, index))
        return tracker.closed_why if tracker is not None else ""

    def gates(
        self, now: float, devices: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], DeviceGates] | None:
        """What the windows allow per device and queue, or None when nothing restricts."""
        if not self.policy.windows:
            return None
        return self.keeper.gates(now, devices, self.lull_open, self.lull_why)

    # -- wake-ups -----------------------------------------------------------------------

    def start_wakeups(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._wakeups = BackgroundScheduler(timezone=dt.UTC)
        self._wakeups.start()
        self._schedule_openings()

    def _schedule_openings(self) -> None:
        assert self._wakeups is not None and self._wake is not None
        for job in self._wakeups.get_jobs():
            if job.id.startswith("open:"):
                job.remove()
        for name, schedule in self.keeper.schedules.items():
            self._add_opening(name, schedule)

    def _add_opening(self, name: str, schedule: Schedule) -> None:
        assert self._wakeups is not None and self._wake is not None
        self._wakeups.add_job(
            self._wake,
            trigger=schedule.trigger,
            id=f"open:{name}",
            replace_existing=True,
            misfire_grace_time=60,
            coalesce=True,
        )

    def stop(self) -> None:
        if self._wakeups is not None:
            self._wakeups.shutdown(wait=False)
            self._wakeups = None


def _text_of(path: Path) -> str | None:
    """The policy file's text, as loaded at the start (None if it cannot be read now)."""
    try:
        return read_config(path, "policy file")
    except ConfigError:
        return None
