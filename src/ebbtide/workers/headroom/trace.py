"""Replay of a recorded online-usage trace (CSV, optionally gzip-compressed).

The file has the header ``t_s,device,online_compute_pct,online_memory_mib`` (any column
order).  A row sets that device's online usage from ``t_s`` seconds after the start of the
replay until that device's next row: a step function.  Before a device's first row its
online usage is 0.  After the last row every device keeps its last value, unless the
source loops (as ``ebb demo``'s does; ``--headroom trace:`` holds, so that a spike
replayed in a test stays).  Either way the source logs once when the trace first ends.

Replay time is ``(now - origin) * speedup`` where the origin is ``start_time`` or the
``now`` of the first :meth:`TraceSource.sample` call.  Lookups are ``O(log n)`` (bisect).
"""

from __future__ import annotations

import bisect
import csv
import gzip
import itertools
import logging
import math
import os
import statistics
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ebbtide.workers.devices import DEFAULT_DEVICE_MEMORY_MIB
from ebbtide.workers.headroom.base import NO_OFFLINE, DeviceFault, DeviceInfo, DeviceSample, Offline

log = logging.getLogger("ebbtide.headroom")

TRACE_COLUMNS = ("t_s", "device", "online_compute_pct", "online_memory_mib")

#: how long the last row lasts in a looping trace whose rows all share one time, in trace seconds
SINGLE_STEP_S = 1.0


@dataclass
class DeviceSeries:
    """One device's step function: ``compute_pct[i]``/``memory_mib[i]`` hold from ``times_s[i]``."""

    times_s: list[float] = field(default_factory=list)
    compute_pct: list[float] = field(default_factory=list)
    memory_mib: list[float] = field(default_factory=list)

    def at(self, t_s: float) -> tuple[float, float]:
        """Online ``(compute_pct, memory_mib)`` at trace time ``t_s``; 0 before the first row."""
        i = bisect.bisect_right(self.times_s, t_s) - 1
        if i < 0:
            return 0.0, 0.0
        return self.compute_pct[i], self.memory_mib[i]


@dataclass(frozen=True)
class Trace:
    """A parsed trace: one series per device, and its length in trace seconds."""

    series: list[DeviceSeries]
    #: when the trace ends: the last row's time plus one typical step (the median gap
    #: between consecutive row times), so that the last row lasts as long as the others
    duration_s: float


def _number(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {column}: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: {column}: expected a finite number, got {text!r}")
    return value


def parse_trace(lines: Iterable[str], name: str, device_count: int | None) -> Trace:
    """Parse trace CSV text (no I/O).  ``name`` labels error messages (usually the path).

    ``device_count`` is how many devices rows may name (``None``: any; the trace then
    has one series per index up to the highest named).

    Raises ``ValueError`` naming the file, the line and the field of the first bad value.
    """
    reader = csv.reader(lines)
    header = next(reader, None)
    expected = ",".join(TRACE_COLUMNS)
    if header is None:
        raise ValueError(f"{name}: empty file; expected the header {expected}")
    columns = [c.strip() for c in header]
    if sorted(columns) != sorted(TRACE_COLUMNS):
        raise ValueError(f"{name} line 1: expected the header {expected}, got {','.join(columns)}")
    col = {c: columns.index(c) for c in TRACE_COLUMNS}

    rows: list[tuple[float, int, float, float]] = []
    for record in reader:
        if not record or all(not cell.strip() for cell in record):
            continue
        where = f"{name} line {reader.line_num}"
        if len(record) != len(columns):
            raise ValueError(f"{where}: expected {len(columns)} fields, got {len(record)}")
        cell = {c: record[col[c]].strip() for c in TRACE_COLUMNS}
        t_s = _number(cell["t_s"], where, "t_s")
        if t_s < 0:
            raise ValueError(f"{where}: t_s: must not be negative, got {cell['t_s']!r}")
        if not cell["device"].isdigit():
            raise ValueError(
                f"{where}: device: expected a device index (0, 1, …), got {cell['device']!r}"
            )
        device = int(cell["device"])
        if device_count is not None and device >= device_count:
            raise ValueError(
                f"{where}: device: index {device} is not one of the {device_count} device(s) "
                f"(0..{device_count - 1}); declare more with --devices"
            )
        compute = _number(cell["online_compute_pct"], where, "online_compute_pct")
        if not 0.0 <= compute <= 100.0:
            raise ValueError(
                f"{where}: online_compute_pct: expected a percentage in [0, 100], got {compute:g}"
            )
        memory = _number(cell["online_memory_mib"], where, "online_memory_mib")
        if memory < 0:
            raise ValueError(f"{where}: online_memory_mib: must not be negative, got {memory:g}")
        rows.append((t_s, device, compute, memory))
    if not rows:
        raise ValueError(f"{name}: the trace has a header but no rows")

    rows.sort(key=lambda row: row[0])  # stable: rows with the same time keep file order
    if device_count is None:
        device_count = 1 + max(row[1] for row in rows)
    series = [DeviceSeries() for _ in range(device_count)]
    for t_s, device, compute, memory in rows:
        s = series[device]
        s.times_s.append(t_s)
        s.compute_pct.append(compute)
        s.memory_mib.append(memory)

    times = sorted({row[0] for row in rows})
    gaps = [b - a for a, b in itertools.pairwise(times)]
    step_s = statistics.median(gaps) if gaps else SINGLE_STEP_S
    return Trace(series=series, duration_s=times[-1] + step_s)


def read_trace(path: str | os.PathLike[str], device_count: int | None) -> Trace:
    """Read and parse a trace file (``.csv`` or ``.csv.gz``)."""
    name = os.fspath(path)
    try:
        if name.endswith(".gz"):
            with gzip.open(name, "rt", encoding="utf-8-sig", newline="") as f:
                return parse_trace(f, name, device_count)
        with open(name, encoding="utf-8-sig", newline="") as f:
            return parse_trace(f, name, device_count)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name}: not a text CSV file ({exc.reason})") from None
    except OSError as exc:
        raise ValueError(f"{name}: cannot read the trace: {exc.strerror or exc}") from None


class TraceSource:
    """Replays a trace file as the online usage of ``devices`` (row ``device`` k is ``devices[k]``).

    ``devices=None`` means as many devices of
    :data:`~ebbtide.workers.devices.DEFAULT_DEVICE_MEMORY_MIB` as the trace names.
    ``speedup`` compresses time: with 10, trace second 100 is reached 10 s after the origin.
    ``loop=True`` starts over after :attr:`duration_s` trace seconds.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        devices: Sequence[DeviceInfo] | None,
        speedup: float = 1.0,
        start_time: float | None = None,
        loop: bool = False,
    ) -> None:
        if devices is not None and not devices:
            raise ValueError("a trace headroom source needs at least one device")
        if not (math.isfinite(speedup) and speedup > 0):
            raise ValueError(f"speedup must be a positive number, got {speedup!r}")
        self.path = Path(path)
        self.speedup = float(speedup)
        self.loop = loop
        self._trace = read_trace(path, None if devices is None else len(devices))
        self._devices = (
            list(devices)
            if devices is not None
            else [
                DeviceInfo(index=k, memory_mib=DEFAULT_DEVICE_MEMORY_MIB)
                for k in range(len(self._trace.series))
            ]
        )
        self._origin = start_time
        self._lock = threading.Lock()
        #: whether the end of the trace was reached (and said) yet
        self._ended = False

    @property
    def duration_s(self) -> float:
        """Length of the trace in trace seconds (divide by ``speedup`` for wall seconds)."""
        return self._trace.duration_s

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def trace_time_s(self, now: float) -> float:
        """The trace time replayed at ``now`` (sets the origin on the first call if unset)."""
        with self._lock:
            if self._origin is None:
                self._origin = now
            origin = self._origin
            t_s = (now - origin) * self.speedup
            ended = not self._ended and t_s >= self._trace.duration_s
            self._ended = self._ended or ended
        if ended:
            self._say_ended()
        if self.loop and t_s >= 0:
            t_s %= self._trace.duration_s
        return t_s

    def _say_ended(self) -> None:
        length = f"{self._trace.duration_s:g} s of trace"
        if self.speedup != 1:
            length += f", {self._trace.duration_s / self.speedup:g} s at {self.speedup:g}x"
        if self.loop:
            log.info("headroom trace %s ended (%s): starting it over", self.path, length)
        else:
            log.warning(
                "headroom trace %s ended (%s): holding its last values from now on",
                self.path,
                length,
            )

    def sample(self, now: float, offline: Offline = NO_OFFLINE) -> list[DeviceSample]:
        t_s = self.trace_time_s(now)
        samples = []
        for device, series in zip(self._devices, self._trace.series, strict=True):
            compute, memory = series.at(t_s)
            samples.append(
                DeviceSample(
                    index=device.index,
                    time=now,
                    online_compute_pct=compute,
                    online_memory_mib=memory,
                )
            )
        return samples

    def faults(self) -> list[DeviceFault]:
        """A replayed trace has no faults."""
        return []

    def check(self, index: int) -> str | None:
        """A replayed device always passes."""
        return None

    def close(self) -> None:
        """Nothing to release: the trace is read whole at construction."""
