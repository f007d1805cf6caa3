"""Run one workload under every policy and gather the figures (the ``--json`` shape).

``{"workload": {...}, "policies": {"ebbtide": {metrics}, "exclusive": ..., ...}}``.  The
same inputs and seed give the same object, except each policy's ``sim_wall_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ebbtide.sim.engine import Simulation
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.online import OnlineLoad
from ebbtide.sim.policies import SimPolicy
from ebbtide.sim.record import Recorder
from ebbtide.sim.timing import RESTART_OVERHEAD_S


@dataclass
class SimResult:
    workload: dict[str, Any]
    policies: dict[str, dict[str, Any]]
    #: per policy, what the plot needs (only when recording was asked for)
    recordings: dict[str, Recorder] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "policies": self.policies}


def _gpu_hours(cs: float) -> float:
    return round(cs / 100.0 / 3600.0, 3)


def describe_workload(
    load: OnlineLoad,
    online_spec: str,
    jobs_spec: str,
    stream: list[SimJob],
    *,
    backlogged: bool,
    arrival_scale: float,
    seed: int,
    restart_overhead_s: float = RESTART_OVERHEAD_S,
    tile: int = 1,
) -> dict[str, Any]:
    """What was simulated; ``tile``: copies of the recorded fleet in ``load`` (see
    :mod:`ebbtide.sim.tile`)."""
    present_s = sum(d.end_s - d.start_s for d in load.devices)
    online_cs = 0.0
    for d in load.devices:
        ends = (*d.times_s[1:], d.end_s)
        online_cs += sum(
            c * (e - t) for t, e, c in zip(d.times_s, ends, d.compute_pct, strict=True)
        )
    origin = load.clock_origin_s
    return {
        "online": online_spec,
        "jobs": jobs_spec,
        "load": "backlogged" if backlogged else "trace",
        "arrival_scale": arrival_scale,
        "seed": seed,
        "restart_overhead_s": restart_overhead_s,
        "devices": len(load.devices),
        "tile": tile,
        "device_memory_gib": round(load.device_memory_mib / 1024.0, 3),
        "span_h": round(load.span_s / 3600.0, 4),
        "clock_start": f"{int(origin // 3600):02d}:{int(origin % 3600 // 60):02d}",
        "device_hours": round(present_s / 3600.0, 3),
        "online_gpu_hours": _gpu_hours(online_cs),
        "spare_gpu_hours": _gpu_hours(100.0 * present_s - online_cs),
        "stream_jobs": len(stream),
        "stream_gpu_hours": round(
            sum(j.work_s * j.compute_pct / 100.0 for j in stream) / 3600.0, 3
        ),
    }


def run_policies(
    load: OnlineLoad,
    stream: list[SimJob],
    policies: list[SimPolicy],
    *,
    backlogged: bool = True,
    arrival_scale: float = 1.0,
    seed: int = 0,
    debug: bool = False,
    record: bool = False,
    restart_overhead_s: float = RESTART_OVERHEAD_S,
) -> tuple[dict[str, dict[str, Any]], dict[str, Recorder]]:
    """Each policy's figures (and recordings when ``record``), in the order given;
    ``restart_overhead_s``: how long a resumed attempt restores before it progresses."""
    figures: dict[str, dict[str, Any]] = {}
    recordings: dict[str, Recorder] = {}
    for policy in policies:
        recorder = Recorder.for_load(load) if record else None
        started = time.perf_counter()
        tally = Simulation(
            load,
            stream,
            policy,
            backlogged=backlogged,
            arrival_scale=arrival_scale,
            seed=seed,
            debug=debug,
            recorder=recorder,
            restart_overhead_s=restart_overhead_s,
        ).run()
        figures[policy.name] = tally.figures(time.perf_counter() - started)
        if recorder is not None:
            recordings[policy.name] = recorder
    return figures, recordings
