"""The readable form of a simulation's result: the workload, then one column per policy."""

from __future__ import annotations

from typing import Any

from ebbtide.sim.metrics import METRIC_KEYS

#: How each figure is shown: a label and a format.
_ROWS: dict[str, tuple[str, str]] = {
    "harvest_efficiency": ("harvest efficiency", "pct"),
    "utilization_before": ("GPU utilization before", "pct"),
    "utilization_after": ("GPU utilization after", "pct"),
    "interference_compute_frac": ("online compute interfered", "frac"),
    "oom_events": ("online OOM events", "int"),
    "evictions": ("evictions", "int"),
    "evictions_per_gpu_hour": ("evictions per GPU-hour", "rate"),
    "pauses": ("pauses", "int"),
    "paused_frac": ("slice time paused", "pct"),
    "suspensions": ("suspensions to host", "int"),
    "restores": ("restores from host", "int"),
    "evictions_while_suspended": ("evictions while suspended", "int"),
    "restart_overhead_frac": ("slice time restarting", "pct"),
    "deadline_misses": ("deadline misses", "int"),
    "wasted_work_frac": ("offline work wasted", "pct"),
    "jobs_completed": ("jobs completed", "int"),
    "jct_p50_s": ("job completion time p50", "dur"),
    "jct_p99_s": ("job completion time p99", "dur"),
    "sim_wall_s": ("simulation wall time", "s"),
    "eviction_latency_p99_s": ("eviction latency p99", "s"),
    "spare_paused_frac": ("spare idle beside pauses", "pct"),
    "spare_held_frac": ("spare held, no progress", "pct"),
    "spare_unheld_frac": ("spare no slice held", "pct"),
    "spare_margin_frac": ("  of it the margin", "pct"),
    "spare_reserve_frac": ("  of it the reserve", "pct"),
}
#: Rows beyond :data:`METRIC_KEYS`, after them: where the spare that was not harvested went.
_MORE = (
    "eviction_latency_p99_s",
    "spare_paused_frac",
    "spare_held_frac",
    "spare_unheld_frac",
    "spare_margin_frac",
    "spare_reserve_frac",
)
#: Rows after ``paused_frac`` when the run suspends to host (``--suspend-to-host``).
_SUSPEND = ("suspensions", "restores", "evictions_while_suspended")


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100.0 * value:.1f}%"
    if kind == "frac":  # a percentage, with two significant digits when it is small
        if 0 < value < 1e-6:
            return "<0.0001%"
        return f"{100.0 * value:.2g}%" if 0 < value < 0.001 else f"{100.0 * value:.2f}%"
    if kind == "int":
        return f"{value:,}"
    if kind == "rate":
        return f"{value:.2f}"
    if kind == "dur":
        return f"{value / 3600.0:.1f} h" if value >= 3600 else f"{value:.0f} s"
    return f"{value:.2f} s"


def _span_text(hours: float) -> str:
    """A run's span: hours, or minutes or seconds under an hour (a trial's trap: a 91 s
    trace was "0.0 h ..., 0 GPU-h online" beside a harvest of 65 %)."""
    if hours >= 1.0:
        return f"{hours:.1f} h"
    return f"{hours * 60:.0f} min" if hours * 60 >= 1.0 else f"{hours * 3600:.0f} s"


def _gpu_hours(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2f}"


def render(result: dict[str, Any]) -> str:
    """The table ``ebb sim`` prints without ``--json``."""
    w = result["workload"]
    tiled = f" ({w['tile']} shifted copies)" if w.get("tile", 1) > 1 else ""
    lines = [
        f"online:   {w['online']}{tiled}: {w['devices']:,} devices "
        f"of {w['device_memory_gib']:g} GiB, "
        f"{_span_text(w['span_h'])} from {w['clock_start']} local, "
        f"{_gpu_hours(w['online_gpu_hours'])} GPU-h online, "
        f"{_gpu_hours(w['spare_gpu_hours'])} GPU-h spare",
        f"offline:  {w['jobs']}: {w['stream_jobs']:,} jobs, "
        f"{_gpu_hours(w['stream_gpu_hours'])} GPU-h of work, load {w['load']}, "
        f"seed {w['seed']}, restart overhead "
        f"{w.get('restart_overhead_s', 0):g} s, pausing {'on' if w.get('pause', True) else 'off'}"
        f", suspend to host {'on' if w.get('suspend_to_host') else 'off'}",
        "",
    ]
    policies = result["policies"]
    names = list(policies)
    keys = [k for k in (*METRIC_KEYS, *_MORE) if k in _ROWS]
    if w.get("suspend_to_host"):
        at = keys.index("paused_frac") + 1
        keys[at:at] = _SUSPEND
    label_w = max(len(_ROWS[k][0]) for k in keys)
    cells = {n: [_cell(policies[n].get(k), _ROWS[k][1]) for k in keys] for n in names}
    col_w = {n: max(len(n), *(len(c) for c in cells[n])) for n in names}
    lines.append(" " * label_w + "".join(f"  {n:>{col_w[n]}}" for n in names))
    for i, k in enumerate(keys):
        row = f"{_ROWS[k][0]:<{label_w}}" + "".join(f"  {cells[n][i]:>{col_w[n]}}" for n in names)
        lines.append(row)
    return "\n".join(lines)
