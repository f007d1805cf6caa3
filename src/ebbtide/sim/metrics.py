"""What a simulation measures, and the figures it reports per policy.

Compute is counted in percent-seconds (one whole GPU busy for one second is 100), only
while a device is present in the fleet.

- ``harvest_efficiency``: useful offline compute ÷ physically spare compute, where spare
  is Σ (100 − online compute) × time and useful is the offline progress kept: the progress
  made *within what was spare* (on each device, in each interval, at most 100 − online
  compute; progress beyond that ran on compute the online side wanted and is counted as
  interference, not harvest), less the progress lost to evictions (work since the last
  checkpoint of a job that could not checkpoint in time).  So it never exceeds 1.
  Progress of attempts still running at the end counts.
- ``utilization_before``: online compute ÷ capacity.
- ``utilization_after``: (online compute served + offline progress made, kept or not) ÷
  capacity, i.e. what ``nvidia-smi`` would have shown.
- ``interference_compute_frac``: online compute that did not fit (online demand above
  capacity minus the compute offline slices held at that moment) ÷ online compute.
- ``oom_events``: online memory steps that did not fit beside the offline slices' memory.
- ``evictions``; ``evictions_per_gpu_hour``: evictions ÷ device-hours in the fleet;
  ``deadline_misses``: slices freed later than their deadline after the decision;
  ``wasted_work_frac``: progress lost to evictions ÷ progress made.
- ``pauses``: attempts frozen in place for a compute spike (graduated response);
  ``paused_frac``: paused slice-time ÷ offline slice-time, where slice-time is a slice's
  compute (percent) × the time it is held, from dispatch until it is free.
- ``suspensions``, ``restores``, ``evictions_while_suspended``: attempts suspended to host
  for a memory shortage (policy ``suspend_to_host: auto``), brought back, and evicted while
  on the host (past ``max_suspend_s``); a suspended slice's time counts as paused.
- ``restart_overhead_frac``: slice-time resumed attempts spent restoring (the restart
  overhead, ``--restart-overhead``) ÷ offline slice-time.
- ``jobs_completed``; ``jct_p50_s``, ``jct_p99_s``: completion − submission (``null`` when
  nothing completed); ``sim_wall_s``: wall-clock seconds the simulation of the policy took.
- ``jobs_held``: jobs held, not requeued, once evicted as often as queue ``default``'s
  ``max_preemptions`` allows (``--policy``), as the live scheduler holds them.
- Where the spare went, as shares of it that add up to 1 with ``harvest_efficiency``:
  ``spare_lost_frac`` (progress evictions threw away), ``spare_paused_frac`` (left idle
  beside the running slices, up to the compute of the paused ones: a paused slice keeps
  its compute reserved until its thaw), ``spare_held_frac`` (then held by slices making no
  progress: starting, restoring, checkpointing, leaving) and ``spare_unheld_frac`` (the
  rest, which no slice held: the safety margin, the forecast reserve, pieces no queued job
  fits, the moments before a pass).  Offline progress beyond the spare is interference,
  not harvest, and takes no part in this split.  Two parts of ``spare_unheld_frac`` are
  named, where and while the policy lets offline work run: ``spare_margin_frac`` (up to
  the policy's compute margin on each device) and ``spare_reserve_frac`` (then up to the
  device's forecast reserve); the rest of it is room too small for any queued job, time
  outside the policy's window, and the moments before a pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: The figures every policy reports, in the order the table shows them.
METRIC_KEYS = (
    "harvest_efficiency",
    "utilization_before",
    "utilization_after",
    "interference_compute_frac",
    "oom_events",
    "evictions",
    "evictions_per_gpu_hour",
    "pauses",
    "paused_frac",
    "restart_overhead_frac",
    "deadline_misses",
    "wasted_work_frac",
    "jobs_completed",
    "jct_p50_s",
    "jct_p99_s",
    "sim_wall_s",
)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Tally:
    """Running sums of one simulation, in percent-seconds unless named otherwise."""

    capacity_cs: float = 0.0
    online_cs: float = 0.0
    spare_cs: float = 0.0
    interference_cs: float = 0.0
    progress_cs: float = 0.0
    #: progress made within what was spare (see ``harvest_efficiency``)
    harvest_cs: float = 0.0
    lost_cs: float = 0.0
    #: slice-time: every slice held, paused ones, resumed ones restoring
    slice_cs: float = 0.0
    paused_cs: float = 0.0
    restart_cs: float = 0.0
    #: spare not harvested: left idle by paused slices, held by slices making no progress
    #: (the rest, spare_cs − harvest_cs − these, no slice held)
    idle_paused_cs: float = 0.0
    idle_held_cs: float = 0.0
    #: of the spare no slice held: up to the policy's compute margin, then up to the
    #: device's forecast reserve (as the scheduler last heard it)
    idle_margin_cs: float = 0.0
    idle_reserve_cs: float = 0.0
    oom_events: int = 0
    evictions: int = 0
    evictions_killed: int = 0
    #: evictions of paused attempts (memory short, or paused past max_pause_s)
    evictions_paused: int = 0
    pauses: int = 0
    thaws: int = 0
    #: attempts suspended to host for a memory shortage, restored, and evicted while
    #: suspended (past max_suspend_s, mostly)
    suspensions: int = 0
    restores: int = 0
    evictions_suspended: int = 0
    deadline_misses: int = 0
    jobs_completed: int = 0
    jobs_held: int = 0
    dispatches: int = 0
    plan_passes: int = 0
    jct_s: list[float] = field(default_factory=list)
    #: spike (or decision) → slice free, one per eviction, in seconds
    eviction_latency_s: list[float] = field(default_factory=list)

    def figures(self, wall_s: float) -> dict[str, Any]:
        useful = max(0.0, self.harvest_cs - self.lost_cs)
        device_h = self.capacity_cs / 100.0 / 3600.0
        return {
            "harvest_efficiency": _ratio(useful, self.spare_cs),
            "utilization_before": _ratio(self.online_cs, self.capacity_cs),
            "utilization_after": _ratio(
                self.online_cs - self.interference_cs + self.progress_cs, self.capacity_cs
            ),
            "interference_compute_frac": _ratio(self.interference_cs, self.online_cs),
            "oom_events": self.oom_events,
            "evictions": self.evictions,
            "evictions_per_gpu_hour": _ratio(self.evictions, device_h),
            "pauses": self.pauses,
            "paused_frac": _ratio(self.paused_cs, self.slice_cs),
            "restart_overhead_frac": _ratio(self.restart_cs, self.slice_cs),
            "deadline_misses": self.deadline_misses,
            "wasted_work_frac": _ratio(self.lost_cs, self.progress_cs),
            "jobs_completed": self.jobs_completed,
            "jct_p50_s": _round(percentile(self.jct_s, 0.50)),
            "jct_p99_s": _round(percentile(self.jct_s, 0.99)),
            "sim_wall_s": round(wall_s, 3),
            # beyond the list: what the figures above rest on
            "evictions_killed": self.evictions_killed,
            "evictions_while_paused": self.evictions_paused,
            "thaws": self.thaws,
            "suspensions": self.suspensions,
            "restores": self.restores,
            "evictions_while_suspended": self.evictions_suspended,
            "jobs_held": self.jobs_held,
            "eviction_latency_p50_s": _round(percentile(self.eviction_latency_s, 0.50), 4),
            "eviction_latency_p99_s": _round(percentile(self.eviction_latency_s, 0.99), 4),
            "useful_gpu_hours": round(useful / 100.0 / 3600.0, 3),
            "dispatches": self.dispatches,
            "spare_lost_frac": _ratio(min(self.lost_cs, self.harvest_cs), self.spare_cs),
            "spare_paused_frac": _ratio(self.idle_paused_cs, self.spare_cs),
            "spare_held_frac": _ratio(self.idle_held_cs, self.spare_cs),
            "spare_unheld_frac": _ratio(
                max(0.0, self.spare_cs - self.harvest_cs - self.idle_paused_cs - self.idle_held_cs),
                self.spare_cs,
            ),
            "spare_margin_frac": _ratio(self.idle_margin_cs, self.spare_cs),
            "spare_reserve_frac": _ratio(self.idle_reserve_cs, self.spare_cs),
        }


def _ratio(a: float, b: float) -> float:
    """``a / b`` to six significant digits (0 when ``b`` is 0)."""
    return float(f"{a / b:.6g}") if b > 0 else 0.0


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)
