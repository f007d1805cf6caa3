"""``ebb report --plot FILE``: a report (:mod:`ebbtide.report`) as one picture.

Five panels under a title that gives the window and the headline figures: GPU-hours
harvested per queue and per user (bars, the largest first), evictions by reason (bars,
the deadline misses in red), the eviction latency CDF with each deadline marked, and the
harvest over time in the report's bins, stacked by queue (a queue has the same colour
everywhere).  Legends sit outside the axes, so they hide no data.  Needs matplotlib
(``pip install 'ebbtide[plot]'``).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Any

from ebbtide.errors import UserError

#: The most bars a per-queue or per-user panel shows; the rest are summed as "others".
MAX_BARS = 12
#: Colours of the queues, in order of their names: matplotlib's tab10, or tab20 for more
#: queues than it has colours (its neighbours are two shades of one hue).
QUEUE_CMAPS = ("tab10", "tab20")
MET_COLOUR, MISSED_COLOUR = "tab:blue", "tab:red"
#: How the deadlines are drawn on the latency CDF, one style each (at most four shown).
DEADLINE_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))
#: Bar panels are drawn as if they had at least this many bars (one bar is not a slab).
MIN_BAR_SLOTS = 4


def _slots(ax: Any, bars: int) -> None:
    pad = max(0, MIN_BAR_SLOTS - bars) / 2
    ax.set_ylim(-0.5 - pad, bars - 0.5 + pad)


def pyplot() -> Any:
    """matplotlib's pyplot on a backend that needs no display, or a :class:`UserError`
    saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            "--plot needs matplotlib: pip install 'ebbtide[plot]' (or pip install matplotlib)"
        ) from None
    return plt


def _top(values: Mapping[str, float]) -> list[tuple[str, float]]:
    ordered = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ordered) <= MAX_BARS:
        return ordered
    rest = sum(v for _, v in ordered[MAX_BARS - 1 :])
    return [*ordered[: MAX_BARS - 1], (f"{len(ordered) - MAX_BARS + 1} others", rest)]


def _empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _bars(
    ax: Any,
    title: str,
    values: Mapping[str, float],
    colours: Mapping[str, Any],
    default: str = "tab:gray",
) -> None:
    ax.set_title(title, loc="left")
    shown = _top(values)
    if not shown or all(v == 0 for _, v in shown):
        _empty(ax, "nothing harvested in this window")
        return
    names = [n for n, _ in shown][::-1]
    heights = [v for _, v in shown][::-1]
    bars = ax.barh(names, heights, color=[colours.get(n, default) for n in names])
    ax.bar_label(bars, labels=[f"{v:.3g}" for v in heights], padding=3, fontsize=8)
    ax.set_xlabel("GPU-hours")
    ax.set_xlim(0, max(heights) * 1.15)
    _slots(ax, len(names))


def _evictions(ax: Any, by_reason: Mapping[str, Mapping[str, Any]]) -> None:
    ax.set_title("Evictions by reason", loc="left")
    if not by_reason:
        _empty(ax, "no evictions in this window")
        return
    reasons = sorted(by_reason, key=lambda r: (by_reason[r]["count"], r))
    missed = [by_reason[r]["deadline_misses"] for r in reasons]
    met = [by_reason[r]["count"] - m for r, m in zip(reasons, missed, strict=True)]
    ax.barh(reasons, met, color=MET_COLOUR, label="slice free by its deadline")
    bars = ax.barh(reasons, missed, left=met, color=MISSED_COLOUR, label="deadline missed")
    ax.bar_label(bars, labels=[str(by_reason[r]["count"]) for r in reasons], padding=3)
    ax.set_xlabel("evictions")
    ax.xaxis.get_major_locator().set_params(integer=True)
    # the stacked bars' edges are sticky: room for the labels is made by hand
    ax.set_xlim(0, max(by_reason[r]["count"] for r in reasons) * 1.15 + 0.2)
    _slots(ax, len(reasons))
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2, frameon=False)


def _latency(ax: Any, cdf: list[float], deadlines: list[float]) -> None:
    ax.set_title("Eviction latency: spike or decision to slice free (CDF)", loc="left")
    if not cdf:
        _empty(ax, "no evictions in this window")
        return
    share = [k / (len(cdf) - 1) for k in range(len(cdf))]
    ax.step(cdf, share, where="post", color=MET_COLOUR, label="evictions")
    for deadline, style in zip(deadlines, DEADLINE_STYLES, strict=False):
        ax.axvline(deadline, color=MISSED_COLOUR, linestyle=style, label=f"deadline {deadline:g} s")
    positive = [v for v in cdf + deadlines if v > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_xscale("log")
    else:
        ax.set_xlim(left=0)
    ax.set_xlabel("seconds")
    ax.set_ylabel("share of evictions")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=3, frameon=False)


def _timeline(ax: Any, timeline: Mapping[str, Any], colours: Mapping[str, Any]) -> None:
    bin_s = float(timeline["bin_s"])
    width = _bin_words(bin_s)
    ax.set_title(f"GPU-hours harvested per {width}, stacked by queue", loc="left")
    lines: Mapping[str, list[float]] = timeline["gpu_hours"]
    if not lines or not any(any(v > 0 for v in line) for line in lines.values()):
        _empty(ax, "nothing harvested in this window")
        return
    n = len(next(iter(lines.values())))
    starts = [
        dt.datetime.fromtimestamp(timeline["start"] + k * bin_s).astimezone() for k in range(n)
    ]
    bottom = [0.0] * n
    for queue, line in lines.items():
        ax.bar(
            starts,
            line,
            width=bin_s / 86400.0,
            bottom=bottom,
            align="edge",
            color=colours[queue],
            edgecolor="white",
            linewidth=0.5,
            label=queue,
        )
        bottom = [b + v for b, v in zip(bottom, line, strict=True)]
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_ylabel(f"GPU-hours per {width}")
    ax.set_ylim(0, max(bottom) * 1.08)
    ax.legend(title="queue", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _bin_words(bin_s: float) -> str:
    for unit, seconds in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0)):
        if bin_s >= seconds and bin_s % seconds == 0:
            count = int(bin_s // seconds)
            return unit if count == 1 else f"{count} {unit}s"
    return f"{bin_s:g} s"


def _headline(report: Mapping[str, Any]) -> str:
    o, fleet = report["overall"], report["fleet"]
    ev = o["evictions"]
    per_device = fleet["harvested_gpu_hours_per_device_hour"]
    parts = [
        f"{o['gpu_hours']:.3g} GPU-hours harvested"
        + (f" ({per_device:.3g} per device-hour of the fleet seen)" if per_device else ""),
        f"{o['jobs']['succeeded']} jobs succeeded",
        f"{ev['count']} evictions, {ev['deadline_misses']} past their deadline",
    ]
    if ev["latency_p99_s"] is not None:
        parts.append(f"p99 latency {ev['latency_p99_s']:.3g} s")
    return ", ".join(parts)


def plot(path: str | os.PathLike[str], report: Mapping[str, Any]) -> None:
    """Draw ``report`` into ``path`` (PNG, or what its suffix says)."""
    plt = pyplot()
    queues = sorted({*report["queues"], *report["timeline"]["gpu_hours"]})
    cmap = plt.get_cmap(QUEUE_CMAPS[len(queues) > 10])
    colours = {q: cmap(k % cmap.N) for k, q in enumerate(queues)}
    fig = plt.figure(figsize=(14, 12), layout="constrained")
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 1.15])
    window = report["window"]
    since = dt.datetime.fromtimestamp(window["since"]).astimezone()
    until = dt.datetime.fromtimestamp(window["until"]).astimezone()
    filters = [f"{k} {v}" for k, v in report["filters"].items() if v]
    fig.suptitle(
        f"ebbtide report: {since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M %Z}"
        + (f" ({', '.join(filters)})" if filters else "")
        + f"\n{_headline(report)}",
        fontsize=13,
    )
    _bars(
        fig.add_subplot(grid[0, 0]),
        "GPU-hours harvested per queue",
        {q: g["gpu_hours"] for q, g in report["queues"].items()},
        colours,
    )
    _bars(
        fig.add_subplot(grid[0, 1]),
        "GPU-hours harvested per user",
        {u: g["gpu_hours"] for u, g in report["users"].items()},
        {},
        default="tab:purple",
    )
    _evictions(fig.add_subplot(grid[1, 0]), report["overall"]["evictions"]["by_reason"])
    _latency(
        fig.add_subplot(grid[1, 1]),
        report["eviction_latency_cdf_s"],
        report["eviction_deadlines_s"],
    )
    _timeline(fig.add_subplot(grid[2, :]), report["timeline"], colours)
    fig.savefig(path, dpi=110)
    plt.close(fig)
