"""Clocks.  Everything that decides takes a clock so tests and the simulator control time.

A loop waits through its clock (:meth:`Clock.wait`) as well as reading it, so that the
same loop runs on real time in production and on fake time, deterministically, in tests.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock time in Unix seconds."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds, for measuring intervals."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` have passed; whether it is set."""
        ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


class FakeClock:
    """A clock that moves only when told to (``advance``, ``sleep``, or a ``wait`` in the
    thread that made it).

    :meth:`wait` in the thread that made the clock (a test's) is deterministic: it
    returns at once, True if the event is set; otherwise it moves the time on by
    ``seconds``, running the callbacks of :meth:`call_at` that fall due on the way, and
    stops early at the one that sets the event.  So a loop run in that thread goes
    pass by pass on fake time, and :meth:`call_at` is how things happen in the middle of
    it.  A wait in any other thread (a loop started in a thread of its own) waits on the
    event in real time and leaves the fake time alone: such a loop neither spins nor
    moves the time the test reads.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._owner = threading.get_ident()
        self._timers: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.time()

    def call_at(self, when: float, callback: Callable[[], object]) -> None:
        """Run ``callback`` when the time reaches ``when`` (Unix seconds), in the thread
        that moves it there; callbacks due at one instant run in the order given."""
        with self._lock:
            heapq.heappush(self._timers, (when, next(self._order), callback))

    def advance(self, seconds: float) -> None:
        self._move_to(self.time() + seconds)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if threading.get_ident() != self._owner:
            return event.wait(seconds)
        if event.is_set():
            return True
        return self._move_to(self.time() + max(0.0, seconds), until=event)

    def _move_to(self, deadline: float, until: threading.Event | None = None) -> bool:
        """Move the time to ``deadline``, running the callbacks due by then; stop at the
        first one after which ``until`` is set.  Whether ``until`` is set."""
        while True:
            with self._lock:
                if not self._timers or self._timers[0][0] > deadline:
                    self._now = deadline
                    return until is not None and until.is_set()
                when, _, callback = heapq.heappop(self._timers)
                self._now = max(self._now, when)
            callback()
            if until is not None and until.is_set():
                return True


SYSTEM_CLOCK = SystemClock()
