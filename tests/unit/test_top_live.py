"""``ebb top``'s terminal loop in this process, on a pseudo-terminal: a refresh that
fails keeps the last frame and says why, a bug still ends it, and the terminal is
restored every time."""

from __future__ import annotations

import fcntl
import os
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from rich.console import Console

from ebbtide.errors import StoreUnavailable
from ebbtide.top.live import run
from ebbtide.top.snapshot import FleetSnapshot, build_snapshot
from ebbtide.top.view import ViewState

NODES = [
    {
        "name": "gpu-a",
        "silent": False,
        "stopping": False,
        "devices": [{"index": 0, "memory_mib": 81920, "online_compute_pct": 40}],
    }
]


def fleet() -> FleetSnapshot:
    return build_snapshot(NODES, [], {"default": {"queued": 2}}, [], taken_at=time.time())


@dataclass
class Terminal:
    """A pseudo-terminal: the loop reads and writes ``slave``, the test ``master``."""

    master: int
    slave: int
    console: Console
    seen: bytearray = field(default_factory=bytearray)

    def reader(self, until: Callable[[bytes], bool], then: bytes) -> threading.Thread:
        """A thread that reads what the loop draws and, once ``until`` holds (or after
        20 s), types ``then``."""

        def read() -> None:
            give_up = time.monotonic() + 20
            sent = False
            while time.monotonic() < give_up + 5:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    return
                self.seen.extend(chunk)
                if not sent and (until(bytes(self.seen)) or time.monotonic() > give_up):
                    os.write(self.master, then)
                    sent = True
                if b"\x1b[?1049l" in self.seen:  # left the alternate screen
                    return

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        return thread


@contextmanager
def terminal() -> Iterator[Terminal]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    out = open(os.dup(slave), "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    console = Console(file=out, force_terminal=True, width=120, height=24, color_system=None)
    try:
        yield Terminal(master, slave, console)
    finally:
        out.close()
        os.close(slave)
        os.close(master)


def test_a_failed_refresh_keeps_the_frame_and_says_why_then_recovers() -> None:
    calls: list[int] = []

    def fetch() -> FleetSnapshot:
        calls.append(1)
        if len(calls) == 2:
            raise StoreUnavailable("the store at /x is gone")
        return fleet()

    with terminal() as t:
        before = termios.tcgetattr(t.slave)
        said = b"cannot refresh (the store at /x is gone); showing the last figures"
        # then a later refresh that works clears it
        thread = t.reader(lambda seen: said in seen and len(calls) >= 4, b"q")
        state = run(fetch, ViewState(), interval_s=0.2, console=t.console, fd=t.slave)
        thread.join(10)
        assert state.quit
        assert said in t.seen, bytes(t.seen[-2000:])
        assert b"gpu-a/0" in t.seen
        assert termios.tcgetattr(t.slave) == before  # echo and line mode are back
        assert t.seen.rstrip().endswith(b"\x1b[?25h\x1b[?1049l")  # cursor, main screen


def test_a_bug_in_a_refresh_ends_the_loop_with_the_terminal_restored() -> None:
    calls: list[int] = []

    def fetch() -> FleetSnapshot:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("a bug")
        return fleet()

    with terminal() as t:
        before = termios.tcgetattr(t.slave)
        thread = t.reader(lambda seen: False, b"")
        with pytest.raises(RuntimeError, match="a bug"):
            run(fetch, ViewState(), interval_s=0.2, console=t.console, fd=t.slave)
        thread.join(10)
        assert termios.tcgetattr(t.slave) == before
        assert b"\x1b[?1049l" in t.seen


def test_the_first_read_fails_before_the_screen_changes() -> None:
    def fetch() -> FleetSnapshot:
        raise StoreUnavailable("no store")

    with terminal() as t:
        before = termios.tcgetattr(t.slave)
        with pytest.raises(StoreUnavailable):
            run(fetch, ViewState(), interval_s=0.2, console=t.console, fd=t.slave)
        assert termios.tcgetattr(t.slave) == before
        os.set_blocking(t.master, False)
        with pytest.raises(BlockingIOError):
            os.read(t.master, 100)  # nothing was drawn


def test_keys_are_answered_while_a_slow_refresh_runs() -> None:
    release = threading.Event()
    calls: list[float] = []

    def fetch() -> FleetSnapshot:
        calls.append(time.monotonic())
        if len(calls) == 2:
            release.wait(20)  # a store that takes its time
        return fleet()

    with terminal() as t:
        # while the second read hangs, a sort key still redraws the frame
        thread = t.reader(lambda seen: len(calls) >= 2 and b"sort: online" in seen, b"q")
        started = threading.Timer(0.5, lambda: os.write(t.master, b"s"))
        started.start()
        try:
            state = run(fetch, ViewState(), interval_s=0.2, console=t.console, fd=t.slave)
        finally:
            release.set()
            started.cancel()
        thread.join(10)
        assert state.quit and state.sort == "online"
        assert len(calls) == 2  # the slow read never finished while the loop ran
