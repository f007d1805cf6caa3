"""``ebb sim``: the ebbtide policy it runs, from the flags and a ``--policy`` file, and the
notes that explain an empty or short run before it starts.

- **Flags over the file.**  ``--margins``, ``--quantiles`` and ``--history`` given on the
  command line apply on top of a policy file's ``defaults`` (as ``--no-pause`` and
  ``--suspend-to-host`` do); left at their defaults, the file's values stand.
- **Notes** (``ebb sim: note: ...`` on stderr) where a policy's windows cannot admit the
  simulated jobs: a window whose device pool matches no simulated device (``gpuK/0``), one
  that admits no queue ``default`` (where every simulated job is), no cron window opening
  in the simulated span (read on :data:`~ebbtide.sim.windows.SIM_DATE`, a Monday); and a
  trace shorter than ``--hours``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from ebbtide.scheduling.snapshot import Margins
from ebbtide.sim.policies import ForecastSettings, SimPolicy, ebbtide_policy, from_policy_file
from ebbtide.units import format_mib

if TYPE_CHECKING:
    from ebbtide.config.policy import Policy
    from ebbtide.sim.online import OnlineLoad

#: The flags that a policy file's ``defaults`` also set, with the fields they override.
POLICY_FLAGS = {
    "margins": "margin_compute_pct, margin_memory_mib",
    "quantiles": "forecast_compute_quantile",
    "history": "forecast_history_s",
}
#: The queue every simulated job is in.
SIM_QUEUE = "default"


def note(text: str) -> None:
    """One ``ebb sim: note:`` line on stderr."""
    click.echo(f"ebb sim: note: {text}", err=True)


def product_policy(
    rules: Policy | None, margins: Margins, forecast: ForecastSettings, given: Collection[str]
) -> SimPolicy:
    """The ``ebbtide`` policy: the built-in one with the flags' margins and forecast, or
    the policy file's, with the flags named in ``given`` (``margins``, ``quantiles``,
    ``history``: the ones set on the command line) on top."""
    if rules is None:
        return ebbtide_policy(margins, forecast)
    product = from_policy_file(rules)
    if "margins" in given:
        product = replace(product, margins=margins)
    if product.forecast is not None:
        fc = product.forecast
        if "quantiles" in given:
            q = forecast
            fc = replace(fc, compute_quantile=q.compute_quantile, memory_quantile=q.memory_quantile)
        if "history" in given:
            fc = replace(fc, history_s=forecast.history_s)
        product = replace(product, forecast=fc)
    return product


def in_effect(
    product: SimPolicy, policy_path: str | None, given: Collection[str]
) -> dict[str, Any]:
    """For ``--json``'s workload: the policy file (None: the built-in policy), the margins
    and forecast ebbtide ran with, and which of them flags set over the file."""
    fc = product.forecast
    return {
        "policy": policy_path,
        "margins": {
            "compute_pct": product.margins.compute_pct,
            "memory_mib": product.margins.memory_mib,
        },
        "forecast": None
        if fc is None
        else {
            "compute_quantile": fc.compute_quantile,
            "memory_quantile": fc.memory_quantile,
            "history_s": fc.history_s,
        },
        "flags_over_policy": sorted(f"--{n}" for n in given if n in POLICY_FLAGS)
        if policy_path is not None
        else [],
    }


def header_line(workload: dict[str, Any]) -> str:
    """The table's header line naming the policy ebbtide ran under."""
    m, fc = workload["margins"], workload["forecast"]
    forecast = (
        f", forecast quantiles {fc['compute_quantile']:g},{fc['memory_quantile']:g} over "
        f"{fc['history_s']:g} s"
        if fc
        else ""
    )
    over = workload.get("flags_over_policy") or []
    by = f" ({', '.join(over)} over the file)" if over else ""
    return (
        f"policy:   {workload['policy']}: margins {m['compute_pct']:g}%, "
        f"{m['memory_mib']:g} MiB{forecast}{by}"
    )


def trace_notes(load: OnlineLoad, hours: float | None) -> list[str]:
    """A trace shorter than ``--hours`` (the rates are over what it holds), and one whose
    online memory alone is more than a device holds (a trial's trap: 195 GiB on an
    80 GiB device was taken without a word, with 0 online OOM events: those count only
    what offline slices caused)."""
    notes = []
    if hours is not None and load.span_s < hours * 3600.0 - 1e-6:
        notes.append(
            f"the trace is {_span(load.span_s)} long, shorter than --hours {hours:g}: "
            f"the figures are over its {_span(load.span_s)}"
        )
    over = [
        m for d in load.devices if (m := max(d.memory_mib, default=0.0)) > load.device_memory_mib
    ]
    if over:
        notes.append(
            f"the online memory of {len(over)} of {len(load.devices)} devices is more than "
            f"a device holds ({format_mib(load.device_memory_mib)}; at most "
            f"{format_mib(max(over))}): there is no room there then, and the online OOM "
            "events count only those offline slices caused (--device-memory sets the size)"
        )
    return notes


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 3600.0 else f"{seconds / 3600.0:.2f} h"


def window_notes(policy: Policy, load: OnlineLoad) -> list[str]:
    """Why a policy's windows may admit nothing in this simulation (empty: no reason)."""
    from ebbtide.sim.windows import SIM_DATE, SimWindows

    if not policy.windows:
        return []
    nodes = [f"gpu{k}" for k in range(len(load.devices))]
    names = f"gpu0/0 to gpu{len(nodes) - 1}/0" if len(nodes) > 1 else "gpu0/0"
    notes, admitting = [], []
    for w in policy.windows:
        if w.pool is not None and not any(policy.devices.in_pool(w.pool, n, 0) for n in nodes):
            patterns = ", ".join(policy.devices.pools.get(w.pool, []))
            notes.append(
                f"window {w.name}: its pool {w.pool} ({patterns}) matches no simulated "
                f"device (they are {names})"
            )
            continue
        queues = getattr(w, "queues", None)
        if w.kind != "blackout" and queues is not None and SIM_QUEUE not in queues:
            notes.append(
                f"window {w.name} admits queue(s) {', '.join(queues)}; every simulated job "
                f"is in queue {SIM_QUEUE}"
            )
            continue
        if w.kind != "blackout":
            admitting.append(w)
    if any(w.kind == "lull" for w in admitting):
        return notes  # whether one opens depends on the online load: the run tells
    sim = SimWindows(policy, nodes, load.clock_origin_s)
    start, end = sim.unix0, sim.unix0 + load.span_s
    for w in admitting:
        schedule = sim.keeper.schedules[w.name]
        nxt = schedule.next_start(start)
        if schedule.occurrence_at(start) is not None or (nxt is not None and nxt < end):
            return notes
    if policy.cron_windows or policy.lull_windows:  # (else every queue is admitted)
        tz = sim.keeper.schedules[admitting[0].name].tz if admitting else dt.UTC
        first = dt.datetime.fromtimestamp(start, tz)
        last = dt.datetime.fromtimestamp(end, tz)
        notes.append(
            f"no window of the policy opens for the simulated jobs from "
            f"{first:%a %Y-%m-%d %H:%M} to {last:%a %H:%M %Z}, so ebbtide harvests nothing "
            f"(windows are read on the simulated day, {SIM_DATE:%a %Y-%m-%d}; "
            "--clock-start sets the trace's time of day)"
        )
    return notes
