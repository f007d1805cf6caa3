"""Figures and the readable table of ``benchmarks/gpu_check.py``: pure functions, no GPU.

Everything here takes what the check measured (plain lists and dicts) and returns what it
prints, so it is unit-tested without a GPU (``tests/e2e/test_gpu_check_smoke.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Online memory ebbtide reports may differ from the online tenant's allocation by this
#: much (its CUDA context, cuBLAS workspace), in MiB.
ATTRIBUTION_TOLERANCE_MIB = 1024


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0–100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def latency_summary(latency_ms: Sequence[float], service_ms: Sequence[float]) -> dict[str, Any]:
    """p50 / p99 / max / mean of request latencies (arrival → done) and service times
    (start → done), in milliseconds."""
    if not latency_ms:
        raise ValueError("no requests were served")
    return {
        "requests": len(latency_ms),
        "p50_ms": _r(percentile(latency_ms, 50)),
        "p99_ms": _r(percentile(latency_ms, 99)),
        "max_ms": _r(max(latency_ms)),
        "mean_ms": _r(sum(latency_ms) / len(latency_ms)),
        "service_p50_ms": _r(percentile(service_ms, 50)) if service_ms else None,
        "service_p99_ms": _r(percentile(service_ms, 99)) if service_ms else None,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded, or ``None`` when either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def steps_at(points: Sequence[tuple[float, float]], t: float) -> float:
    """Steps done at time ``t``, linearly interpolated between ``(time, steps)`` points
    (sorted by time) and held flat before the first and after the last."""
    if not points:
        return 0.0
    if t <= points[0][0]:
        return points[0][1]
    for (t0, s0), (t1, s1) in itertools.pairwise(points):
        if t <= t1:
            return s0 if t1 == t0 else s0 + (s1 - s0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def rate_in_window(runs: Iterable[Sequence[tuple[float, float]]], t0: float, t1: float) -> float:
    """Steps per second over ``[t0, t1]``, summed over runs (one per attempt: each counts
    its own steps from 0); a run that did not cover the whole window adds what it did."""
    if t1 <= t0:
        raise ValueError("empty window")
    done = sum(steps_at(points, t1) - steps_at(points, t0) for points in runs if points)
    return done / (t1 - t0)


def nvml_sampling_figures(
    *,
    duration_s: float,
    calls: int,
    calls_with_new: int,
    new_samples: int,
    stamps_us: Sequence[int],
    sm_util_pct: Sequence[float],
    util_latency_s: Sequence[float],
    procs_latency_s: Sequence[float],
    errors: Mapping[str, int],
    pid_visible: bool,
    queries: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> dict[str, Any]:
    """Figures of the NVML sampling phase.  ``stamps_us``: the distinct timestamps of the
    watched process's samples, in NVML microseconds, in the order seen; ``queries``: per
    NVML query, the wall and CPU seconds of each call."""
    periods_ms = [(b - a) / 1000.0 for a, b in itertools.pairwise(stamps_us)]
    periods_ms = [p for p in periods_ms if p > 0]

    def ms(values: Sequence[float], p: float) -> float | None:
        return _r(percentile(values, p) * 1000.0) if values else None

    return {
        "duration_s": _r(duration_s, 2),
        "calls_per_s": _r(calls / duration_s, 2),
        "calls_with_new_samples_per_s": _r(calls_with_new / duration_s, 2),
        "new_samples_per_s": _r(new_samples / duration_s, 2),
        "sample_period_ms_p50": _r(percentile(periods_ms, 50)) if periods_ms else None,
        "sample_period_ms_min": _r(min(periods_ms)) if periods_ms else None,
        "sample_period_ms_max": _r(max(periods_ms)) if periods_ms else None,
        "online_sm_util_pct_p50": percentile(sm_util_pct, 50) if sm_util_pct else None,
        "process_utilization_latency_ms_p50": ms(util_latency_s, 50),
        "process_utilization_latency_ms_p99": ms(util_latency_s, 99),
        "compute_processes_latency_ms_p50": ms(procs_latency_s, 50),
        "compute_processes_latency_ms_p99": ms(procs_latency_s, 99),
        "compute_processes_latency_ms_max": ms(procs_latency_s, 100),
        "errors": dict(errors),
        "online_pid_visible": pid_visible,
        "queries": {name: query_cost(*times) for name, times in (queries or {}).items()},
    }


def query_cost(wall_s: Sequence[float], cpu_s: Sequence[float]) -> dict[str, Any]:
    """What one NVML query cost per call, in µs: wall time p50 / p99, and the calling
    thread's CPU time p50 / mean (the figure ``agent_overhead.py --nvml-call-us`` takes;
    where it is well under the wall time, the driver waits asleep)."""

    def us(values: Sequence[float], p: float) -> float | None:
        return _r(percentile(values, p) * 1e6, 1) if values else None

    return {
        "calls": len(wall_s),
        "wall_us_p50": us(wall_s, 50),
        "wall_us_p99": us(wall_s, 99),
        "cpu_us_p50": us(cpu_s, 50),
        "cpu_us_mean": _r(sum(cpu_s) / len(cpu_s) * 1e6, 1) if cpu_s else None,
    }


def attribution_verdict(
    online_mib: Sequence[float],
    expected_mib: float,
    tolerance_mib: float = ATTRIBUTION_TOLERANCE_MIB,
) -> bool:
    """True when every online-memory reading is within ``tolerance_mib`` of what the
    online tenants hold (so none counts the offline job's memory as online)."""
    if not online_mib:
        raise ValueError("no readings")
    return all(abs(v - expected_mib) <= tolerance_mib for v in online_mib)


def eviction_figures(rounds: Sequence[Mapping[str, Any]], deadline_s: float) -> dict[str, Any]:
    """p50 / max of the eviction latencies of the rounds caused by the online spike, and
    counts of kills, checkpoints and missed deadlines."""
    ok = [r for r in rounds if "error" not in r and r.get("caused_by_spike", True)]

    def stat(key: str, p: float) -> float | None:
        values = [float(r[key]) for r in ok if r.get(key) is not None]
        return _r(percentile(values, p), 4) if values else None

    return {
        "evictions": len(ok),
        "deadline_s": deadline_s,
        "agent_p50_s": stat("agent_latency_s", 50),
        "agent_max_s": stat("agent_latency_s", 100),
        "external_p50_s": stat("external_s", 50),
        "external_max_s": stat("external_s", 100),
        "nvml_free_p50_s": stat("nvml_free_s", 50),
        "nvml_free_max_s": stat("nvml_free_s", 100),
        "spike_alloc_max_s": stat("spike_alloc_s", 100),
        "killed": sum(bool(r.get("killed")) for r in ok),
        "checkpointed": sum(bool(r.get("checkpointed")) for r in ok),
        "deadline_missed": sum(bool(r.get("deadline_missed")) for r in ok),
    }


# -- the readable table ---------------------------------------------------------------------


def _f(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _failed(value: Any) -> str | None:
    if isinstance(value, Mapping) and "error" in value and len(value) == 1:
        return str(value["error"])
    return None


def render(r: Mapping[str, Any]) -> list[str]:
    """The check's result as lines of text."""
    eb = r.get("ebbtide") or {}
    eb_text = eb.get("version") if eb.get("ok") else f"not importable ({eb.get('error')})"
    if not r.get("gpu"):
        lines = [f"gpu_check: no GPU measured: {r.get('reason')}", f"  ebbtide: {eb_text}"]
        if eb.get("install"):
            lines.append(f"  install ebbtide here: {eb['install']}")
        return lines
    dev = r.get("device") or {}
    fw = r.get("framework") or {}
    lines = [
        f"gpu_check: {dev.get('name')} ({dev.get('memory_mib')} MiB, driver "
        f"{dev.get('driver')}), {fw.get('framework')} {fw.get('version')} ({fw.get('dtype')}), "
        f"ebbtide {eb_text}, {r.get('elapsed_s')} s"
        + (" (interrupted)" if r.get("interrupted") else "")
    ]

    n = r.get("nvml_samples_per_s") or {}
    if _failed(n):
        lines.append(f"  NVML sampling: error: {_failed(n)}")
    elif n:
        lines.append(
            f"  NVML per-process utilisation at 20 Hz: {_f(n.get('calls_per_s'), '', 1)} calls/s, "
            f"{_f(n.get('calls_with_new_samples_per_s'), '', 1)} with new samples/s, sample "
            f"period p50 {_f(n.get('sample_period_ms_p50'), ' ms', 1)}; compute-process list "
            f"p50 {_f(n.get('compute_processes_latency_ms_p50'), ' ms')}, p99 "
            f"{_f(n.get('compute_processes_latency_ms_p99'), ' ms')}; online pid visible: "
            f"{n.get('online_pid_visible')}; errors {n.get('errors') or 'none'}"
        )
        for name, q in (n.get("queries") or {}).items():
            lines.append(
                f"    {name}: wall p50 {_f(q.get('wall_us_p50'), ' µs', 1)}, p99 "
                f"{_f(q.get('wall_us_p99'), ' µs', 1)}; CPU p50 "
                f"{_f(q.get('cpu_us_p50'), ' µs', 1)}, mean {_f(q.get('cpu_us_mean'), ' µs', 1)}"
            )

    a = r.get("attribution") or {}
    if _failed(a):
        lines.append(f"  attribution: error: {_failed(a)}")
    elif a:
        verdict = "correct" if r.get("attribution_correct") else "WRONG"
        seen = ", ".join(f"{v:.0f}" for v in a.get("online_memory_mib", []))
        lines.append(
            f"  attribution: {verdict}: online memory ebbtide reports {seen} MiB; expected "
            f"{a.get('expected_online_mib')} MiB ± {a.get('tolerance_mib')}; the offline job "
            f"holds {a.get('offline_alloc_mib')} MiB in pid {a.get('offline_pid')} below "
            f"wrapper pid {a.get('wrapper_pid')}"
        )

    e = r.get("evict_latency_s") or {}
    if _failed(e):
        lines.append(f"  eviction: error: {_failed(e)}")
    elif e:
        lines.append(
            f"  eviction (n={e.get('evictions')}, deadline {e.get('deadline_s')} s): agent p50 "
            f"{_f(e.get('agent_p50_s'), ' s')}, max {_f(e.get('agent_max_s'), ' s')}; from the "
            f"online spike p50 {_f(e.get('external_p50_s'), ' s')}, max "
            f"{_f(e.get('external_max_s'), ' s')}; gone from NVML p50 "
            f"{_f(e.get('nvml_free_p50_s'), ' s')}, max {_f(e.get('nvml_free_max_s'), ' s')}; "
            f"killed {e.get('killed')}, checkpointed {e.get('checkpointed')}, "
            f"missed {e.get('deadline_missed')}"
            + (f"; error: {e['error']}" if "error" in e else "")
        )

    o = r.get("online_latency_ms") or {}
    if _failed(o):
        lines.append(f"  online latency: error: {_failed(o)}")
    elif o:
        c = o.get("config") or {}
        lines.append(
            f"  online latency ({c.get('rate_per_s')} requests/s in bursts of {c.get('burst')}, "
            f"each {c.get('request')}), ms:"
        )
        for phase in ("alone", "harvested"):
            s = o.get(phase) or {}
            if "error" in s:
                lines.append(f"    {phase:<10} error: {s['error']}")
            elif s:
                lines.append(
                    f"    {phase:<10} p50 {_f(s.get('p50_ms'))}  p99 {_f(s.get('p99_ms'))}  "
                    f"max {_f(s.get('max_ms'))}  (service p50 {_f(s.get('service_p50_ms'))}, "
                    f"{s.get('requests')} requests)"
                )
        lines.append(
            f"    p99 ratio {_f(o.get('p99_ratio'), '×', 2)}; harvest "
            f"{_f(r.get('harvest_steps_per_s'), ' steps/s', 1)} beside the online loop, "
            f"{_f(o.get('harvest_alone_steps_per_s'), ' steps/s', 1)} alone; harvest "
            f"evictions {o.get('harvest_evictions')}"
        )
    note = r.get("pause_drain_note")
    drain = r.get("pause_drain_s")
    lines.append(f"  pause drain: {_f(drain, ' s') if drain is not None else note}")
    return lines
