"""The online side of a simulation: per device, online compute and memory over time.

Two sources (``--online``):

- ``genai:DIR``: the Alibaba GenAI serving trace (GenTD26): ``DIR`` holds
  ``pod_gpu_duty_cycle_anon.csv`` and ``pod_gpu_memory_used_bytes_anon.csv`` (each may be
  gzipped).  Each ``container_ip`` is one online tenant on one device: compute = duty cycle
  (percent), memory = bytes used.  Devices are numbered in order of first appearance in the
  duty-cycle file.  A device is *present* from its pod's first duty sample until its last
  sample plus one sampling step (57 s); outside that span the GPU is not in the fleet (no
  capacity, no spare, nothing runs there).  Between samples usage holds (a step function,
  also across gaps in a pod's samples); memory before the pod's first memory sample is that
  first sample.
- ``trace:CSV``: the ``t_s,device,online_compute_pct,online_memory_mib`` format of the
  ``trace:`` headroom source; every device is present for the whole trace (usage 0 before
  its first row).

Time is in seconds from the start of the trace.  *The trace's local clock* (for windows
such as 22:00-07:00) is :attr:`OnlineLoad.clock_origin_s` seconds after local midnight at
``t = 0``.  The GenAI timestamps are Unix seconds (shifted by the dataset authors); we read
them in China Standard Time (UTC+8, where the cluster runs), which puts the trace's start at
09:12 and its quiet hours at night (busiest 10:00-19:00, quietest 02:00-08:00).
"""

from __future__ import annotations

import csv
import gzip
import itertools
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ebbtide.workers.headroom.trace import read_trace

#: Local time zone the GenAI timestamps are read in: hours east of UTC (China Standard Time).
GENAI_UTC_OFFSET_H = 8.0
#: The two GenAI files, without ``.gz``.
GENAI_DUTY_FILE = "pod_gpu_duty_cycle_anon.csv"
GENAI_MEMORY_FILE = "pod_gpu_memory_used_bytes_anon.csv"
#: Seconds in a day.
DAY_S = 86400.0
_BYTES_PER_MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class DeviceLoad:
    """One device's online usage: ``compute_pct[i]`` / ``memory_mib[i]`` hold from
    ``times_s[i]`` until the next time (or ``end_s``).  ``times_s[0]`` is when the device
    joins the fleet; consecutive equal samples are merged."""

    name: str
    times_s: tuple[float, ...]
    compute_pct: tuple[float, ...]
    memory_mib: tuple[float, ...]
    end_s: float

    @property
    def start_s(self) -> float:
        return self.times_s[0]


@dataclass(frozen=True)
class OnlineLoad:
    source: str
    devices: tuple[DeviceLoad, ...]
    #: memory of every device, in MiB
    device_memory_mib: float
    #: length of the simulated span, in seconds
    span_s: float
    #: local time of day at ``t = 0``, in seconds after midnight
    clock_origin_s: float
    #: typical spacing of the samples, in seconds
    step_s: float


def _open_text(path: Path) -> Iterator[dict[str, str]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            yield from csv.DictReader(f)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _find(directory: Path, name: str) -> Path:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise ValueError(f"--online genai:{directory}: no {name} or {name}.gz there")


def _read_series(
    path: Path, value_col: str, scale: float
) -> tuple[dict[str, list[tuple[float, float]]], list[str]]:
    series: dict[str, list[tuple[float, float]]] = {}
    order: list[str] = []
    for n, row in enumerate(_open_text(path), start=2):
        try:
            t = float(row["timestamp_anon"])
            v = float(row[value_col]) * scale
            key = row["container_ip"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path} line {n}: expected timestamp_anon, {value_col} and container_ip"
            ) from None
        if key not in series:
            series[key] = []
            order.append(key)
        series[key].append((t, v))
    if not series:
        raise ValueError(f"{path}: no samples")
    for s in series.values():
        s.sort()
    return series, order


def merge_steps(
    times: list[float], compute: list[float], memory: list[float]
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Drop samples that change nothing (the step function stays the same)."""
    ts, cs, ms = [times[0]], [compute[0]], [memory[0]]
    for t, c, m in zip(times[1:], compute[1:], memory[1:], strict=True):
        if c != cs[-1] or m != ms[-1]:
            ts.append(t)
            cs.append(c)
            ms.append(m)
    return tuple(ts), tuple(cs), tuple(ms)


def load_genai(
    directory: str | os.PathLike[str],
    *,
    device_memory_mib: float,
    max_devices: int | None = None,
    hours: float | None = None,
) -> OnlineLoad:
    """Read the two GenAI files from ``directory`` (see the module docstring)."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"--online genai:{root}: not a directory")
    duty, order = _read_series(_find(root, GENAI_DUTY_FILE), "value", 1.0)
    mem, _ = _read_series(_find(root, GENAI_MEMORY_FILE), "value", 1.0 / _BYTES_PER_MIB)
    all_times = sorted({t for s in duty.values() for t, _ in s})
    t0 = all_times[0]
    gaps = [b - a for a, b in itertools.pairwise(all_times)]
    step_s = statistics.median(gaps) if gaps else 60.0
    span_s = all_times[-1] + step_s - t0
    if hours is not None:
        span_s = min(span_s, hours * 3600.0)
    keys = [k for k in order if k in mem]
    if max_devices is not None:
        keys = keys[:max_devices]
    devices = []
    for key in keys:
        d, m = duty[key], mem[key]
        start, end = d[0][0] - t0, min(d[-1][0] + step_s - t0, span_s)
        if start >= span_s:
            continue
        points = sorted({t for t, _ in d} | {t for t, _ in m})
        times, comp, memv = [], [], []
        i = j = 0
        for t in points:
            rel = t - t0
            if rel < start or rel >= end:
                continue
            while i + 1 < len(d) and d[i + 1][0] <= t:
                i += 1
            while j + 1 < len(m) and m[j + 1][0] <= t:
                j += 1
            times.append(rel)
            comp.append(min(100.0, max(0.0, d[i][1])))
            memv.append(max(0.0, m[j][1]))
        ts, cs, ms = merge_steps(times, comp, memv)
        devices.append(DeviceLoad(key[:8], ts, cs, ms, end))
    if not devices:
        raise ValueError(f"--online genai:{root}: no device has samples in the span")
    origin = (t0 + GENAI_UTC_OFFSET_H * 3600.0) % DAY_S
    return OnlineLoad(
        source=f"genai:{root}",
        devices=tuple(devices),
        device_memory_mib=device_memory_mib,
        span_s=span_s,
        clock_origin_s=origin,
        step_s=step_s,
    )


def load_trace_csv(
    path: str | os.PathLike[str],
    *,
    device_memory_mib: float,
    max_devices: int | None = None,
    hours: float | None = None,
    clock_origin_s: float = 0.0,
) -> OnlineLoad:
    """Read a ``trace:`` CSV (see :mod:`ebbtide.workers.headroom.trace`)."""
    trace = read_trace(path, None)
    span_s = trace.duration_s if hours is None else min(trace.duration_s, hours * 3600.0)
    series = trace.series if max_devices is None else trace.series[:max_devices]
    devices = []
    for k, s in enumerate(series):
        times = [0.0] + [t for t in s.times_s if 0.0 < t < span_s]
        comp = [s.at(t)[0] for t in times]
        memv = [s.at(t)[1] for t in times]
        ts, cs, ms = merge_steps(times, comp, memv)
        devices.append(DeviceLoad(f"device {k}", ts, cs, ms, span_s))
    gaps = [b - a for a, b in zip(devices[0].times_s, devices[0].times_s[1:], strict=False)]
    return OnlineLoad(
        source=f"trace:{os.fspath(path)}",
        devices=tuple(devices),
        device_memory_mib=device_memory_mib,
        span_s=span_s,
        clock_origin_s=clock_origin_s % DAY_S,
        step_s=statistics.median(gaps) if gaps else span_s,
    )
