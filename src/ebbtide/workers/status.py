"""An attempt's status file: the JSON lines a job appends (``ebbtide.job`` writes them).

``{"type": "checkpoint", "path": …, "time": …, "size_bytes": …, "duration_s": …}``,
``{"type": "progress", "done": …, "total": …}`` and ``{"type": "result", "value": …}``
(what ``JobHandle.result()`` returns).  The file is the job's to write, so it
is read defensively: at most ``MAX_READ_BYTES`` a tick, lines longer than
``MAX_LINE_BYTES`` skipped, and anything that is not one of the records above counted
as garbage and ignored.  A job that writes nonsense harms nobody but its own record.
The file is in a directory its job's user owns, so the agent (root, perhaps) opens it
only as what it must be: a regular file, not a link (which could lead it to a file the
user may not read), nor a FIFO (which could stall its loop).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: The most the agent reads of one status file in one tick, in bytes.
MAX_READ_BYTES = 64 * 1024
#: Longer lines are skipped, in bytes.
MAX_LINE_BYTES = 4096


@dataclass(frozen=True)
class Checkpoint:
    path: str
    #: Unix seconds the checkpoint was taken (``None``: the job did not say)
    time: float | None
    size_bytes: int | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class Progress:
    done: float
    total: float | None = None


@dataclass(frozen=True)
class Result:
    """A small JSON value the job gives as its result (a line holds at most
    ``MAX_LINE_BYTES``)."""

    value: object


Record = Checkpoint | Progress | Result


class StatusReader:
    """Reads new complete lines of one status file, tick by tick."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        #: lines that were not a record this reader understands
        self.garbage = 0
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES

    def read(self) -> list[Record]:
        try:  # one look first: most ticks, nothing was written since the last
            st = os.lstat(self.path)
        except OSError:
            return []
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size <= self.offset:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # not there (yet), a link, ...
            return []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return []
            chunk = os.pread(fd, MAX_READ_BYTES, self.offset)
        except OSError:
            return []
        finally:
            os.close(fd)
        if not chunk:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) >= MAX_READ_BYTES:  # one enormous line: skip what we read
                self.offset += len(chunk)
                if not self._skipping:
                    self.garbage += 1
                self._skipping = True
            return []
        self.offset += end + 1
        out: list[Record] = []
        for line in chunk[: end + 1].split(b"\n")[:-1]:
            if self._skipping:  # the tail of an enormous line
                self._skipping = False
                continue
            record = parse(line) if len(line) <= MAX_LINE_BYTES else None
            if record is None:
                if line.strip():
                    self.garbage += 1
                continue
            out.append(record)
        return out


def parse(line: bytes) -> Record | None:
    """One status line, or ``None`` when it is not a well-formed record."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict):
        return None
    kind = rec.get("type")
    if kind == "checkpoint":
        path = rec.get("path")
        at = _number(rec.get("time"))
        size = rec.get("size_bytes")
        if not isinstance(path, str) or not path or len(path) > 4096 or "\0" in path:
            return None
        if at is False:
            return None
        size_ok = size is None or (isinstance(size, int) and not isinstance(size, bool))
        duration = _number(rec.get("duration_s"))
        return Checkpoint(
            path=path,
            time=at or None,
            size_bytes=size if size_ok and (size is None or size >= 0) else None,
            duration_s=duration if isinstance(duration, float) else None,
        )
    if kind == "progress":
        done, total = _number(rec.get("done")), _number(rec.get("total"))
        if not isinstance(done, float):
            return None
        return Progress(done=done, total=total if isinstance(total, float) else None)
    if kind == "result" and "value" in rec:
        return Result(value=rec["value"])
    return None


def _number(value: object) -> float | bool | None:
    """A finite, non-negative number as a float; ``None`` if absent; ``False`` if bad."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    number = float(value)
    if not math.isfinite(number) or number < 0:
        return False
    return number
