"""The terminal loop of ``ebb top``: keys in, frames out, a new snapshot every interval.

The terminal is put in cbreak mode (keys arrive one by one, unechoed; Ctrl-C still
interrupts) and the frame drawn on the alternate screen (``rich.live.Live`` with
``screen=True``); both are restored however the loop ends: ``q``, Ctrl-C, SIGTERM, the
end of input, or an error.  A refresh that fails keeps the last snapshot on screen and
says why in the title; the next interval tries again.
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import select
import signal
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from rich.console import Console
from rich.live import Live

from ebbtide.errors import EbbtideError
from ebbtide.top.render import page_rows, render
from ebbtide.top.snapshot import FleetSnapshot
from ebbtide.top.view import ViewState, panel_rows, press

#: How often the loop looks at the terminal's size between refreshes, in seconds.
RESIZE_POLL_S = 0.25
#: Most bytes read from the terminal at once.
READ_BYTES = 1024

#: Escape sequences of the keys ``ebb top`` knows (after ESC), as key names.
SEQUENCES = {
    "[A": "up",
    "[B": "down",
    "OA": "up",
    "OB": "down",
    "[5~": "pgup",
    "[6~": "pgdn",
    "[H": "home",
    "[F": "end",
    "OH": "home",
    "OF": "end",
    "[1~": "home",
    "[4~": "end",
    "[7~": "home",
    "[8~": "end",
}
#: Control characters of the keys ``ebb top`` knows, as key names.
CONTROLS = {
    "\r": "enter",
    "\n": "enter",
    "\x7f": "backspace",
    "\x08": "backspace",
    "\t": "tab",
    "\x03": "ctrl-c",
}


def parse_keys(text: str) -> list[str]:
    """What a terminal sent, as key names: printable characters as themselves, the
    :data:`CONTROLS` and :data:`SEQUENCES` by name, a lone ESC as ``esc``; anything
    else (other sequences, other control characters) is dropped."""
    keys: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            if i + 1 < len(text) and text[i + 1] == "[":
                j = i + 2
                while j < len(text) and "\x20" <= text[j] <= "\x3f":  # parameters
                    j += 1
                end = min(j + 1, len(text))  # and the final byte
            elif i + 2 < len(text) and text[i + 1] == "O":
                end = i + 3
            else:
                keys.append("esc")
                i += 1
                continue
            name = SEQUENCES.get(text[i + 1 : end])
            if name:
                keys.append(name)
            i = end
            continue
        if ch in CONTROLS:
            keys.append(CONTROLS[ch])
        elif ch.isprintable():
            keys.append(ch)
        i += 1
    return keys


class KeyReader:
    """Keys from the bytes a terminal sends (a character split across reads is kept)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> list[str]:
        return parse_keys(self._decoder.decode(data))


class Fetcher:
    """Reads snapshots in a thread of its own, so keys are answered while the store (or
    the server) is read; each result wakes the loop through a pipe.  The thread is a
    daemon: quitting never waits for a slow read (the thread closes the pipe's write
    end itself when it ends after :meth:`close`)."""

    def __init__(self, fetch: Callable[[], FleetSnapshot]) -> None:
        self._fetch = fetch
        self.wake_fd, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._running = False
        self._closed = False
        self._result: tuple[FleetSnapshot | None, BaseException | None] | None = None

    @property
    def busy(self) -> bool:
        return self._running or self._result is not None

    def start(self) -> None:
        if not self.busy:
            self._running = True
            threading.Thread(target=self._run, name="ebb-top-fetch", daemon=True).start()

    def _run(self) -> None:
        try:
            result: tuple[FleetSnapshot | None, BaseException | None] = (self._fetch(), None)
        except BaseException as exc:  # handed to the loop, which decides
            result = (None, exc)
        with self._lock:
            self._result, self._running = result, False
            if self._closed:
                os.close(self._wake_w)
            else:
                os.write(self._wake_w, b".")

    def take(self) -> tuple[FleetSnapshot | None, BaseException | None] | None:
        """The finished read (a snapshot, or what it raised), or None while it runs."""
        os.read(self.wake_fd, 64)
        with self._lock:
            result, self._result = self._result, None
        return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            os.close(self.wake_fd)
            if not self._running:
                os.close(self._wake_w)


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """The terminal at ``fd`` in cbreak mode, its settings restored on the way out."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextmanager
def signals_leave() -> Iterator[None]:
    """SIGTERM as ``SystemExit(143)`` and SIGINT (Ctrl-C) as ``KeyboardInterrupt``, so
    the terminal is restored before the end.  SIGINT's handler is set even where the
    process started with it ignored: a shell without job control (a script's) ignores it
    for the commands it starts with ``&``, the processes below them inherit that, and
    Python then leaves it ignored; but ``ebb top`` holds the terminal and says Ctrl-C
    quits."""

    def leave(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous_term = signal.signal(signal.SIGTERM, leave)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)


def run(
    fetch: Callable[[], FleetSnapshot],
    state: ViewState,
    *,
    interval_s: float,
    console: Console,
    fd: int,
    clock: Callable[[], float] = time.monotonic,
) -> ViewState:
    """Show the fleet until ``q`` (or Ctrl-C, or the end of input); return the last
    view.  ``fetch`` reads a snapshot; its first call happens here, before the screen
    changes, so an error there (no store, no server) is the caller's to print; later
    ones run in a thread (:class:`Fetcher`)."""
    snapshot = fetch()
    fetcher = Fetcher(fetch)
    try:
        with (
            signals_leave(),
            cbreak(fd),
            Live(console=console, screen=True, auto_refresh=False, redirect_stderr=False) as live,
        ):
            return _loop(snapshot, state, interval_s, console, fd, fetcher, live, clock)
    finally:
        fetcher.close()


def _loop(
    snapshot: FleetSnapshot,
    state: ViewState,
    interval_s: float,
    console: Console,
    fd: int,
    fetcher: Fetcher,
    live: Live,
    clock: Callable[[], float],
) -> ViewState:
    import sqlalchemy.exc

    keys = KeyReader()
    status: str | None = None
    next_read = clock() + interval_s
    size = console.size
    dirty = True
    while True:
        if dirty or console.size != size:
            size = console.size
            live.update(render(snapshot, state, size.width, size.height, status=status))
            live.refresh()
            dirty = False
        wait = RESIZE_POLL_S if fetcher.busy else min(RESIZE_POLL_S, next_read - clock())
        ready, _, _ = select.select([fd, fetcher.wake_fd], [], [], max(0.0, wait))
        if fetcher.wake_fd in ready and (done := fetcher.take()) is not None:
            fresh, error = done
            if fresh is not None:
                snapshot, status = fresh, None
            elif isinstance(error, EbbtideError | OSError | sqlalchemy.exc.SQLAlchemyError):
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                status = f"cannot refresh ({first}); showing the last figures"
            elif error is not None:
                raise error
            next_read = clock() + interval_s
            dirty = True
        if fd in ready:
            try:
                data = os.read(fd, READ_BYTES)
            except OSError:  # EIO: the terminal went away
                data = b""
            if not data:
                return state
            for key in keys.feed(data):
                page = page_rows(size.height, snapshot, state)
                state = press(state, key, page=page, total=panel_rows(snapshot, state))
                dirty = True
                if state.quit:
                    return state
        if (state.refresh or clock() >= next_read) and not fetcher.busy:
            fetcher.start()
            state = dataclasses.replace(state, refresh=False)
