"""The status lines a job writes for its node agent (the job's side of
:mod:`ebbtide.workers.status`): one JSON object a line, appended to
``EBBTIDE_STATUS_FILE`` in one write each, dropped when it is not set (a local run).

Progress may come at every step of a job's loop: a line is written at most every
:data:`PROGRESS_LINE_PERIOD_S`, the latest call's, and the one held back goes out before
the next checkpoint or result line, at ``job.requeue()`` and when the process exits (a
trial's trap: 20,000 calls in a loop were 20,000 lines for the agent to parse, on the
node the online service runs on).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import time
from typing import Any

#: The most often :func:`progress` writes a status line, in seconds.
PROGRESS_LINE_PERIOD_S = 0.5

#: the progress line held back (written later), and when the last one was written
_pending: dict[str, Any] | None = None
_written_at = -math.inf
_lock = threading.Lock()


def write(line: dict[str, Any]) -> None:
    """Append one JSON line to ``EBBTIDE_STATUS_FILE`` in one write; dropped if unset."""
    status_file = os.environ.get("EBBTIDE_STATUS_FILE")
    if not status_file:
        return
    data = (json.dumps(line, separators=(", ", ": ")) + "\n").encode()
    try:
        fd = os.open(status_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        # The checkpoint itself is safe; a later attempt still finds it in checkpoint_dir().
        print(f"ebbtide.job: cannot write status file {status_file}: {exc}", file=sys.stderr)


def progress(done: float, total: float | None = None) -> None:
    """A progress line now, or held back until a period after the last one."""
    global _pending, _written_at
    line = _progress_line(done, total)
    now = time.monotonic()
    with _lock:
        if now - _written_at < PROGRESS_LINE_PERIOD_S:
            _pending = line
            return
        _pending, _written_at = None, now
    write(line)


def checked_progress(done: Any, total: Any = None) -> tuple[float, float | None]:
    """``done`` and ``total`` as :func:`progress` takes them from a job's own code
    (finite numbers, a tensor's or NumPy's scalar too; done 0 or more, total more than 0
    or None), else an error that names the argument."""
    done_n = _number(done, "done")
    total_n = None if total is None else _number(total, "total")
    if done_n < 0:
        raise ValueError(f"progress: done must be 0 or more, got {done!r}")
    if total_n is not None and total_n <= 0:
        raise ValueError(f"progress: total must be more than 0 (None: not known), got {total!r}")
    return done_n, total_n


def _number(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"progress: {name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"progress: {name} must be a finite number, got {value!r}")
    return number


def write_progress(done: float, total: float | None = None) -> None:
    """A progress line written at once, for callers that throttle on their own
    (:mod:`ebbtide.integrations`), after any :func:`progress` held back."""
    flush_progress()
    write(_progress_line(done, total))


def flush_progress() -> None:
    """Write the progress line :func:`progress` held back, if any."""
    global _pending, _written_at
    with _lock:
        line, _pending = _pending, None
        if line is not None:
            _written_at = time.monotonic()
    if line is not None:
        write(line)


def _progress_line(done: float, total: float | None) -> dict[str, Any]:
    return {
        "type": "progress",
        "done": float(done),
        "total": None if total is None else float(total),
        "time": time.time(),
    }


atexit.register(flush_progress)
