"""``ebb sim --plot out.png``: what was harvested and when it gave way, in one picture.

Three panels: the fleet's online load and the offline compute in use over the trace's
local clock, with evictions per 15 minutes; one device in detail (the one whose online
load jumps most often, over its two hours with the most evictions) with each eviction
marked; and the CDF of eviction latencies (online spike → slice free) per policy.
Needs matplotlib (``pip install 'ebbtide[plot]'``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ebbtide.errors import UserError
from ebbtide.sim.record import Recorder

#: Width of the fleet panel's eviction-count bins, in seconds.
EVICTION_BIN_S = 900.0
#: The device panel shows this long a stretch: the one with the most evictions, in seconds.
DEVICE_WINDOW_S = 2 * 3600.0


def busiest_window(times: list[float], width: float) -> float:
    """Start of the ``width``-long stretch holding the most of ``times`` (0 when empty)."""
    ordered = sorted(times)
    best, best_n, j = 0.0, 0, 0
    for i, start in enumerate(ordered):
        while j < len(ordered) and ordered[j] < start + width:
            j += 1
        if j - i > best_n:
            best, best_n = start, j - i
    return best


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            "--plot needs matplotlib: pip install 'ebbtide[plot]' (or pip install matplotlib)"
        ) from None
    return plt


#: the stacked bands: online below, offline on top of it, idle up to the capacity
ONLINE, OFFLINE, IDLE = "#d62728", "#1f77b4", "#e8e8e8"


def _legend_outside(ax: Any, extra: list[tuple[str, Any]] | None = None) -> None:
    """The axes' legend to the right of them, where it covers no data; ``extra`` adds
    (label, axes) entries drawn on other axes (a twin's markers)."""
    handles, labels = ax.get_legend_handles_labels()
    for label, other in extra or []:
        lines = other.get_lines()
        if lines:
            handles.append(lines[0])
            labels.append(label)
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=8)


def _device_title(name: str) -> str:
    """``device 0`` once, whether the trace names it ``0`` or ``device 0``."""
    return name if name.startswith("device") else f"device {name}"


def _hour_label(x: float, _pos: int) -> str:
    return f"{int(x) % 24:02d}:00"


def _clock_label(x: float, _pos: int) -> str:
    minutes = round(x * 60.0)
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"


def plot(
    path: str | os.PathLike[str],
    recordings: Mapping[str, Recorder],
    *,
    clock_origin_s: float,
    focus: str = "ebbtide",
) -> None:
    """Draw the recordings (``focus`` in the two load panels) into ``path`` (PNG, SVG, …)."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    rec = recordings.get(focus) or next(iter(recordings.values()))
    origin_h = clock_origin_s / 3600.0
    # legends go outside the axes (right), so they never cover data
    fig, (fleet_ax, dev_ax, cdf_ax) = plt.subplots(
        3, 1, figsize=(13, 11), gridspec_kw={"height_ratios": [3, 3, 2]}, layout="constrained"
    )

    t = [origin_h + s[0] / 3600.0 for s in rec.fleet]
    online = [s[1] / 100.0 for s in rec.fleet]
    offline = [s[2] / 100.0 for s in rec.fleet]
    capacity = [s[3] / 100.0 for s in rec.fleet]
    # one stack, bottom to top: online, offline on top of it, what is left idle up to the
    # capacity; opaque bands with edges, so each reads as a layer of the one below
    total = [a + b for a, b in zip(online, offline, strict=True)]
    fleet_ax.fill_between(t, 0, online, step="post", color=ONLINE, lw=0, label="online")
    fleet_ax.fill_between(
        t, online, total, step="post", color=OFFLINE, lw=0, label="offline (ebbtide slices)"
    )
    fleet_ax.fill_between(
        t,
        total,
        [max(c, x) for c, x in zip(capacity, total, strict=True)],
        step="post",
        color=IDLE,
        lw=0,
        label="idle",
    )
    fleet_ax.step(t, capacity, where="post", color="black", lw=1, label="capacity")
    fleet_ax.set_ylabel("GPUs busy (fleet)")
    fleet_ax.set_title(f"{focus}: fleet load, and evictions per 15 min")
    twin = fleet_ax.twinx()
    bins: dict[int, int] = {}
    for e in rec.evictions_t:
        bins[int(e // EVICTION_BIN_S)] = bins.get(int(e // EVICTION_BIN_S), 0) + 1
    if bins:
        xs = [origin_h + (b + 0.5) * EVICTION_BIN_S / 3600.0 for b in sorted(bins)]
        twin.plot(xs, [bins[b] for b in sorted(bins)], ".", color="tab:gray", ms=3)
    twin.set_ylabel("evictions / 15 min", color="tab:gray")
    fleet_ax.set_ylim(bottom=0)
    _legend_outside(fleet_ax, extra=[("evictions / 15 min", twin)])

    lo = busiest_window(rec.device_evictions, DEVICE_WINDOW_S)
    hi = lo + DEVICE_WINDOW_S
    before = [p for p in rec.device if p[0] <= lo][-1:]
    d = [(lo, p[1], p[2]) for p in before] + [p for p in rec.device if lo < p[0] < hi]
    marks = [e for e in rec.device_evictions if lo <= e < hi]
    dt = [origin_h + p[0] / 3600.0 for p in d]
    d_online = [p[1] for p in d]
    d_total = [p[1] + p[2] for p in d]
    dev_ax.fill_between(dt, 0, d_online, step="post", color=ONLINE, lw=0, label="online")
    dev_ax.fill_between(dt, d_online, d_total, step="post", color=OFFLINE, lw=0, label="offline")
    dev_ax.fill_between(
        dt, d_total, [100.0] * len(d_total), step="post", color=IDLE, lw=0, label="idle"
    )
    for e in marks:
        dev_ax.axvline(origin_h + e / 3600.0, color="black", lw=0.6, alpha=0.6)
    dev_ax.set_ylim(0, 105)
    dev_ax.set_ylabel("compute %")
    dev_ax.set_title(
        f"{_device_title(rec.device_name)}, its busiest {DEVICE_WINDOW_S / 3600:g} h: "
        f"{len(marks)} of its {len(rec.device_evictions)} evictions (vertical lines)"
    )
    _legend_outside(dev_ax)

    fleet_ax.xaxis.set_major_locator(MultipleLocator(2))
    fleet_ax.xaxis.set_major_formatter(FuncFormatter(_hour_label))
    dev_ax.xaxis.set_major_formatter(FuncFormatter(_clock_label))
    for ax in (fleet_ax, dev_ax):
        ax.set_xlabel("trace local time")

    # policies often share stretches of their CDFs (every one meets the same deadlines):
    # each gets its own dash pattern and marker, the widest line drawn first, so a curve
    # under another still shows
    styles = ["-", "--", "-.", ":"]
    markers = ["o", "s", "^", "D", "v", "x"]
    drawn = [(name, sorted(r.latencies)) for name, r in recordings.items() if r.latencies]
    for i, (name, lat) in enumerate(drawn):
        ys = [(k + 1) / len(lat) for k in range(len(lat))]
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        cdf_ax.step(
            lat,
            ys,
            where="post",
            linestyle=styles[i % len(styles)],
            lw=2.6 - 1.6 * i / max(1, len(drawn) - 1),
            marker=markers[i % len(markers)],
            markevery=max(1, len(lat) // 8),
            ms=4,
            label=f"{name} (n={len(lat):,}, p99 {p99:.2g}s)",
            zorder=2 + i,  # the thinner, later lines on top of the wider
        )
    cdf_ax.set_xscale("log")
    cdf_ax.set_xlabel("eviction latency, online spike → slice free (s)")
    cdf_ax.set_ylabel("CDF")
    cdf_ax.grid(True, which="both", alpha=0.3)
    _legend_outside(cdf_ax)

    fig.savefig(path, dpi=110)
    plt.close(fig)
