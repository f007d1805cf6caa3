"""Whether this process's loops go round: what ``/healthz`` and ``/readyz`` answer beside
``/metrics`` (:func:`ebbtide.metrics.serve_metrics`), for Kubernetes' probes.

A loop (the scheduler's, a node agent's) says it went round with :meth:`Probes.beat`, and
whether what it needed answered (the store, for a scheduler).  ``/healthz`` (liveness) is
200 while every loop has gone round within its stall limit: a process whose loop is stuck
is worth a restart, one whose store is down is not (a restart would not bring the store
back, and an agent's restart evicts its attempts).  ``/readyz`` (readiness) is 200 when,
besides, each loop's last round went well.  Probes run on real time, so the clock is the
monotonic one unless a test hands in another.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ebbtide.redaction import scrub


@dataclass
class _Loop:
    stall_s: float
    at: float
    ok: bool = True
    why: str = ""


class Probes:
    """The loops of one process and when each last went round."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._loops: dict[str, _Loop] = {}
        self._lock = threading.Lock()

    def watch(self, name: str, stall_s: float) -> None:
        """Expect ``name`` to go round at least every ``stall_s`` seconds from now on (its
        start counts as a round that went well)."""
        with self._lock:
            self._loops[name] = _Loop(stall_s, self._clock())

    def forget(self, name: str) -> None:
        """``name`` stopped on purpose: it no longer counts."""
        with self._lock:
            self._loops.pop(name, None)

    def beat(self, name: str, ok: bool = True, why: str = "") -> None:
        """``name`` went round; ``ok`` False (with ``why``) where what it needed did not
        answer (a password in it, a driver's error naming a URL, is masked: the probes
        answer whoever reaches the metrics port).  A loop not watched is ignored."""
        with self._lock:
            loop = self._loops.get(name)
            if loop is not None:
                loop.at, loop.ok, loop.why = self._clock(), ok, scrub(why) if why else ""

    def live(self) -> tuple[bool, str]:
        """Whether every loop goes round, and a line on each."""
        return self._answer(ready=False)

    def ready(self) -> tuple[bool, str]:
        """Whether every loop goes round and its last round went well, and a line on each."""
        return self._answer(ready=True)

    def _answer(self, ready: bool) -> tuple[bool, str]:
        now = self._clock()
        with self._lock:
            loops = sorted(self._loops.items())
        good, lines = True, []
        for name, loop in loops:
            ago = max(0.0, now - loop.at)
            if ago > loop.stall_s:
                good = False
                lines.append(
                    f"{name}: stalled, last went round {ago:.0f} s ago (limit {loop.stall_s:g} s)"
                )
            elif ready and not loop.ok:
                good = False
                lines.append(f"{name}: not ready, {loop.why or 'its last round failed'}")
            else:
                lines.append(f"{name}: ok, went round {ago:.1f} s ago")
        return good, "\n".join(lines or ["ok: no loop in this process"])
