"""``ebb report``: what the fleet harvested over a time window, and what it cost
(:mod:`ebbtide.report` computes it; :mod:`ebbtide.report_plot` draws it)."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Mapping
from typing import Any

import click

from ebbtide.cli.common import _client, _echo_json, _note_unknown_queue
from ebbtide.errors import UserError

#: Width the text report's prose is wrapped to, in characters.
TEXT_WIDTH = 100


@click.command("report")
@click.option(
    "--since",
    default="24h",
    show_default=True,
    metavar="WHEN",
    help="The window's start: a time ago (30m, 24h, 7d), an ISO timestamp (local time "
    "unless it gives an offset: 2024-05-01T09:00, 2024-05-01) or now.",
)
@click.option(
    "--until",
    default="now",
    show_default=True,
    metavar="WHEN",
    help="The window's end (excluded), in the same forms.",
)
@click.option("--queue", "-q", metavar="QUEUE", help="Only this queue's jobs.")
@click.option("--user", "-u", metavar="USER", help="Only this user's jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also draw it as a PNG (needs matplotlib: pip install 'ebbtide[plot]').",
)
def report(
    since: str,
    until: str,
    queue: str | None,
    user: str | None,
    as_json: bool,
    plot_path: str | None,
) -> None:
    """What the fleet harvested in a time window (default the last 24 hours) and what it
    cost: GPU-hours harvested and per device-hour of the fleet, jobs, attempts, evictions
    by reason with their latency, deadline misses and lost work, pauses and queue waits;
    for everything, then per queue and per user.

    \b
      ebb report                                  the last 24 hours
      ebb report --since 7d --queue batch         one queue's week
      ebb report --since 2024-05-01 --until 2024-05-02 --plot may1.png

    GPU-hours are each attempt's run time inside the window, less the time it was
    paused, times its granted slice (compute % of each device it held); --json says how
    every figure is counted ("counting"). Online utilisation before and after is not in
    the store: Prometheus has it (ebbtide_online_compute_ratio), and `ebb sim` compares
    it against baselines. Anyone may read a report, as qstat.
    """
    from ebbtide.report import window_error

    now = time.time()
    start, end = _when("--since", since, now), _when("--until", until, now)
    error = window_error(start, end)
    if error:
        raise UserError(f"--since {since} --until {until}: {error}")
    if plot_path is not None:
        from ebbtide.plot_path import check_plot_path
        from ebbtide.report_plot import pyplot

        pyplot()  # say matplotlib is missing before reading anything
        check_plot_path(plot_path)
    client = _client()
    try:
        data = client.report(start, end, queue=queue, user=user)
        _note_unknown_queue(client, queue)  # (once the value was found well formed)
    finally:
        client.close()
    if plot_path is not None:
        from ebbtide.plot_path import plot_failed
        from ebbtide.report_plot import plot

        try:
            plot(plot_path, data)
        except OSError as exc:
            raise plot_failed(plot_path, exc) from None
    if as_json:
        _echo_json(data)
    else:
        click.echo(render(data))
    if plot_path is not None:
        click.echo(f"plot: {plot_path}", err=as_json)


def _when(flag: str, text: str, now: float) -> float:
    from ebbtide.report import parse_when

    try:
        return parse_when(text, now)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


# -- the text ---------------------------------------------------------------------------


def _s(seconds: float | None) -> str:
    """A duration for people: ``0.84s``, ``12.5m``, ``3.2h``; ``-`` for none."""
    if seconds is None:
        return "-"
    if seconds < 100:
        return f"{seconds:.2f}s"
    if seconds < 6000:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _h(hours: float) -> str:
    """Hours (GPU-hours, device-hours) for people: 3 decimals, or 3 significant digits
    below 1 (a short window's harvest is small)."""
    return f"{hours:.3f}" if hours >= 1 or hours == 0 else f"{hours:.3g}"


def _span(seconds: float) -> str:
    days, rest = divmod(round(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d" * bool(days), f"{hours}h" * bool(hours), f"{minutes}m" * bool(minutes)]
    return "".join(parts) + (f"{secs}s" if secs or not any(parts) else "")


def _line(label: str, text: str) -> str:
    lead = f"  {label:<24} "
    return textwrap.fill(text, TEXT_WIDTH, initial_indent=lead, subsequent_indent=" " * len(lead))


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def render(report: Mapping[str, Any]) -> str:
    """The report as text: a summary, evictions by reason, then a table per queue and
    one per user, and how the harvest is counted."""
    from ebbtide.report import stamp

    w, o, fleet = report["window"], report["overall"], report["fleet"]
    ev, wait, pauses = o["evictions"], o["queue_wait"], o["pauses"]
    filters = [f"{k} {v}" for k, v in report["filters"].items() if v]
    lines = [
        f"ebb report: {stamp(w['since'])} to {stamp(w['until'])} "
        f"({_span(w['until'] - w['since'])})" + (f", {', '.join(filters)}" if filters else "")
    ]
    if w["measured_until"] < w["until"]:
        lines.append(f"  (measured until {stamp(w['measured_until'])}, the report's time)")
    per_device = fleet["harvested_gpu_hours_per_device_hour"]
    fleet_text = (
        f"{_plural(fleet['nodes'], 'node')}, {_plural(fleet['devices'], 'device')}, "
        f"{_h(fleet['device_hours'])} device-hours"
        + (f": {_h(per_device)} GPU-hours harvested per device-hour" if per_device else "")
    )
    lost_share = ev["lost_share_of_harvest"]
    lines += [
        "",
        "harvest",
        _line("GPU-hours harvested", _h(o["gpu_hours"])),
        _line("GPU memory held", f"{_h(o['gpu_memory_gib_hours'])} GiB-hours"),
        _line("fleet seen", fleet_text),
        _line("online utilisation", fleet["online_utilisation"]),
        "jobs",
        _line(
            "submitted, ended",
            f"{o['jobs']['submitted']} submitted, {o['jobs']['succeeded']} succeeded, "
            f"{o['jobs']['failed']} failed, {o['jobs']['cancelled']} cancelled; "
            f"{_plural(o['attempts'], 'attempt')}",
        ),
        _line(
            "queue wait",
            f"p50 {_s(wait['p50_s'])}, p99 {_s(wait['p99_s'])}, max {_s(wait['max_s'])} "
            f"({_plural(wait['count'], 'dispatch', 'dispatches')})",
        ),
        "evictions",
        _line(
            "evicted",
            f"{ev['count']}: {_plural(ev['deadline_misses'], 'deadline miss', 'deadline misses')}"
            f", {ev['killed']} killed at the deadline",
        ),
        _line(
            "latency",
            f"p50 {_s(ev['latency_p50_s'])}, p99 {_s(ev['latency_p99_s'])}, "
            f"max {_s(ev['latency_max_s'])}",
        ),
        _line(
            "lost work",
            f"{_s(ev['lost_work_s'])} = {_h(ev['lost_work_gpu_hours'])} GPU-hours"
            + (f", {100 * lost_share:.2f}% of the harvest" if lost_share is not None else ""),
        ),
    ]
    if ev["by_reason"]:
        lines.append(
            f"  {'REASON':<24} {'COUNT':>6} {'P50':>8} {'P99':>8} {'MAX':>8} {'MISSED':>7} "
            f"{'KILLED':>7} {'LOST':>8}"
        )
        for code, r in ev["by_reason"].items():
            lines.append(
                f"  {code[:24]:<24} {r['count']:>6} {_s(r['latency_p50_s']):>8} "
                f"{_s(r['latency_p99_s']):>8} {_s(r['latency_max_s']):>8} "
                f"{r['deadline_misses']:>7} {r['killed']:>7} {_s(r['lost_work_s']):>8}"
            )
    lost = o["lost_attempts"]
    lines.append(
        _line(
            "attempts lost",
            f"{lost['count']}"
            + (
                " (" + ", ".join(f"{c} {n}" for c, n in lost["by_reason"].items()) + "): "
                "not evictions"
                if lost["count"]
                else ""
            ),
        )
    )
    lines += [
        "pauses",
        _line(
            "paused",
            f"{pauses['count']} ({pauses['suspended']} suspended to host memory), "
            f"{_s(pauses['paused_s'])} in all",
        ),
    ]
    for title, key in (("QUEUE", "queues"), ("USER", "users")):
        lines += ["", f"by {key[:-1]}", *_table(title, report[key])]
    lines += ["", "counted", _line("GPU-hours", report["counting"]["gpu_hours"])]
    return "\n".join(lines)


def _table(title: str, groups: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not groups:
        return ["  (none in this window)"]
    rows = [
        f"{title:<16} {'GPU-H':>9} {'MEM GiB-H':>10} {'SUBM':>5} {'SUCC':>5} {'FAIL':>5} "
        f"{'CANC':>5} {'ATT':>5} {'EVICT':>6} {'MISS':>5} {'LAT P99':>8} {'LOST':>8} "
        f"{'PAUSES':>6} {'WAIT P50':>9} {'WAIT P99':>9}"
    ]
    for name, g in groups.items():
        jobs, ev, wait = g["jobs"], g["evictions"], g["queue_wait"]
        rows.append(
            f"{name[:16]:<16} {_h(g['gpu_hours']):>9} {_h(g['gpu_memory_gib_hours']):>10} "
            f"{jobs['submitted']:>5} {jobs['succeeded']:>5} {jobs['failed']:>5} "
            f"{jobs['cancelled']:>5} {g['attempts']:>5} {ev['count']:>6} "
            f"{ev['deadline_misses']:>5} {_s(ev['latency_p99_s']):>8} "
            f"{_s(ev['lost_work_s']):>8} {g['pauses']['count']:>6} "
            f"{_s(wait['p50_s']):>9} {_s(wait['p99_s']):>9}"
        )
    return rows
