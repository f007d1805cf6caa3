"""``ebb sim``: parse the spellings of its options, run every policy, print the result.

The click command itself lives in :mod:`ebbtide.cli.run_cmd`; this module does the work so
the command line stays thin and the simulator does not load with every ``ebb`` call.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ebbtide.errors import UserError
from ebbtide.scheduling.snapshot import Margins
from ebbtide.shipped import shipped_or_path
from ebbtide.sim.in_effect import (
    header_line,
    in_effect,
    note,
    product_policy,
    trace_notes,
    window_notes,
)
from ebbtide.sim.jobs import SimJob, load_openb, synthetic
from ebbtide.sim.online import OnlineLoad, load_genai, load_trace_csv
from ebbtide.sim.policies import NO_PAUSE, ForecastSettings, SimPolicy, baselines
from ebbtide.sim.report import render
from ebbtide.sim.runner import describe_workload, run_policies
from ebbtide.sim.tile import TILE_MAX, tile_load, tile_stream
from ebbtide.units import parse_duration_s, parse_memory_mib

if TYPE_CHECKING:
    from ebbtide.config.policy import Policy

ONLINE_FORMS = "genai:DIR (the two GenAI files) or trace:CSV"
JOBS_FORMS = "openb:CSV (an openb pod list) or synthetic[:SEED]"
_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2})$")
T = TypeVar("T")


def _named(flag: str, exc: ValueError) -> str:
    """A parser's message, led by the flag whose value it refused (once)."""
    text = str(exc)
    return text if text.startswith(flag) else f"{flag}: {text}"


def _flag(flag: str, parse: Callable[[str], T], text: str) -> T:
    """``parse(text)``, a refusal named by ``flag``."""
    try:
        return parse(text)
    except ValueError as exc:
        raise UserError(_named(flag, exc)) from None


def parse_online(
    spec: str,
    *,
    device_memory_mib: float,
    devices: int | None,
    hours: float | None,
    clock_start: str | None,
) -> OnlineLoad:
    kind, _, arg = spec.partition(":")
    if not arg:
        raise UserError(f"--online {spec!r}: expected {ONLINE_FORMS}")
    try:
        if kind == "genai":
            load = load_genai(
                arg, device_memory_mib=device_memory_mib, max_devices=devices, hours=hours
            )
            if clock_start is not None:
                load = _with_clock(load, clock_start)
            return load
        if kind == "trace":
            return load_trace_csv(
                shipped_or_path(arg),  # a shipped sample by its name, as `ebb up` finds it
                device_memory_mib=device_memory_mib,
                max_devices=devices,
                hours=hours,
                clock_origin_s=parse_clock(clock_start or "00:00"),
            )
    except ValueError as exc:
        raise UserError(_named("--online", exc)) from None
    raise UserError(f"--online {spec!r}: expected {ONLINE_FORMS}")


def _with_clock(load: OnlineLoad, clock_start: str) -> OnlineLoad:
    return replace(load, clock_origin_s=parse_clock(clock_start))


def parse_clock(text: str) -> float:
    """``HH:MM`` → seconds after midnight."""
    m = _CLOCK_RE.match(text.strip())
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise UserError(f"--clock-start {text!r}: expected a time of day like 09:00")
    return int(m.group(1)) * 3600.0 + int(m.group(2)) * 60.0


def parse_jobs(
    spec: str, *, seed: int, span_s: float, job_gpu_memory_mib: float, stubborn_frac: float
) -> list[SimJob]:
    kind, _, arg = spec.partition(":")
    if kind == "synthetic":
        try:
            job_seed = int(arg) if arg else seed
        except ValueError:
            raise UserError(f"--jobs {spec!r}: the seed must be a whole number") from None
        return synthetic(job_seed, span_s=span_s)
    if kind == "openb" and arg:
        try:
            return load_openb(
                arg,
                job_gpu_memory_mib=job_gpu_memory_mib,
                stubborn_frac=stubborn_frac,
                seed=seed,
            )
        except ValueError as exc:
            raise UserError(_named("--jobs", exc)) from None
    raise UserError(f"--jobs {spec!r}: expected {JOBS_FORMS}")


def parse_margins(text: str) -> Margins:
    """``5%,2GiB`` → :class:`Margins`."""
    compute, _, memory = text.partition(",")
    try:
        c = float(compute.strip().rstrip("%"))
        m = float(parse_memory_mib(memory.strip() or "0"))
    except ValueError:
        raise UserError(f"--margins {text!r}: expected COMPUTE%,MEMORY like 5%,2GiB") from None
    if not 0 <= c < 100:
        raise UserError(f"--margins {text!r}: compute must be in [0, 100)")
    return Margins(compute_pct=c, memory_mib=m)


def parse_quantiles(text: str) -> tuple[float, float]:
    """``0.9,1`` → (compute, memory) quantiles."""
    try:
        c, m = (float(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--quantiles {text!r}: expected COMPUTE,MEMORY like 0.9,1") from None
    if not (0 < c <= 1 and 0 < m <= 1):
        raise UserError(f"--quantiles {text!r}: each must be in (0, 1]")
    return c, m


def parse_restart_overhead(text: str) -> float:
    """``60s``, ``2m`` or plain seconds → seconds."""
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise UserError(f"--restart-overhead {text!r}: {exc}") from None


def parse_tile(text: str) -> int:
    """``--tile N``: copies of the fleet, a whole number from 1 to :data:`TILE_MAX`."""
    try:
        copies = int(text)
    except ValueError:
        copies = 0
    if not 1 <= copies <= TILE_MAX:
        raise UserError(f"--tile {text!r}: expected a whole number of copies from 1 to {TILE_MAX}")
    return copies


def parse_history(text: str) -> float:
    """``--history``: a duration above 0, in seconds."""
    history_s = _flag("--history", parse_duration_s, text)
    if history_s <= 0:
        raise UserError(f"--history {text!r}: the forecast needs some history, like 1h")
    return history_s


def _size(flag: str, text: str) -> float:
    """A memory size above 0, in MiB, a refusal named by ``flag``."""
    mib = float(_flag(flag, parse_memory_mib, text))
    if mib <= 0:
        raise UserError(f"{flag} {text!r}: must be more than 0, like 80GiB")
    return mib


def _load_policy(policy_path: str) -> Policy:
    from pathlib import Path

    from ebbtide.config.policy import load_policy

    return load_policy(Path(policy_path))  # ConfigError names every problem


def _check_plot(plot_path: str) -> None:
    """Refuse a ``--plot`` path that cannot be drawn before a long run, not after it."""
    from ebbtide.plot_path import check_plot_path
    from ebbtide.sim.plot import _pyplot

    _pyplot()
    check_plot_path(plot_path)


def run_sim(
    *,
    online: str,
    jobs: str,
    load: str,
    arrival_scale: float,
    hours: float | None,
    devices: int | None,
    device_memory: str,
    job_gpu_memory: str,
    stubborn_frac: float,
    baselines_on: bool,
    margins: str,
    quantiles: str,
    history: str,
    clock_start: str | None,
    seed: int,
    as_json: bool,
    policy_path: str | None = None,
    plot_path: str | None,
    debug: bool,
    pause: bool = True,
    suspend_to_host: bool | None = None,
    restart_overhead: str = "30s",
    tile: str = "1",
    given: Collection[str] = (),
) -> None:
    """``ebb sim``; ``given``: which of ``margins``, ``quantiles`` and ``history`` were set
    on the command line (over a ``--policy`` file, only those apply)."""
    device_mib = _size("--device-memory", device_memory)
    job_mib = _size("--job-gpu-memory", job_gpu_memory)
    cq, mq = parse_quantiles(quantiles)
    forecast = ForecastSettings(
        compute_quantile=cq, memory_quantile=mq, history_s=parse_history(history)
    )
    margins_in = parse_margins(margins)
    restart_s = parse_restart_overhead(restart_overhead)
    copies = parse_tile(tile)
    rules = _load_policy(policy_path) if policy_path is not None else None
    if plot_path is not None:
        _check_plot(plot_path)
    started = time.perf_counter()
    online_load = parse_online(
        online,
        device_memory_mib=device_mib,
        devices=devices,
        hours=hours,
        clock_start=clock_start,
    )
    online_load = tile_load(online_load, copies, seed=seed)
    for text in trace_notes(online_load, hours) + (
        window_notes(rules, online_load) if rules is not None else []
    ):
        note(text)
    stream = parse_jobs(
        jobs,
        seed=seed,
        span_s=online_load.span_s,
        job_gpu_memory_mib=job_mib,
        stubborn_frac=stubborn_frac,
    )
    stream = tile_stream(stream, copies)
    product = product_policy(rules, margins_in, forecast, given)
    if suspend_to_host is not None:
        product = replace(product, pause=replace(product.pause, suspend=suspend_to_host))
    if not pause:
        product = replace(product, pause=NO_PAUSE)
    policies: list[SimPolicy] = [product]
    if baselines_on:
        policies += baselines()
    backlogged = load == "backlogged"
    figures, recordings = run_policies(
        online_load,
        stream,
        policies,
        backlogged=backlogged,
        arrival_scale=arrival_scale,
        seed=seed,
        debug=debug,
        record=plot_path is not None,
        restart_overhead_s=restart_s,
    )
    result: dict[str, Any] = {
        "workload": describe_workload(
            online_load,
            online,
            jobs,
            stream,
            backlogged=backlogged,
            arrival_scale=arrival_scale,
            seed=seed,
            restart_overhead_s=restart_s,
            tile=copies,
        ),
        "policies": figures,
    }
    workload = result["workload"]
    workload["pause"] = product.pause.enabled
    workload["suspend_to_host"] = product.pause.enabled and product.pause.suspend
    workload.update(in_effect(product, policy_path, given))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        table = render(result)
        if policy_path is not None:  # the header names the file, after online: and offline:
            head, _, rest = table.partition("\n\n")
            table = f"{head}\n{header_line(workload)}\n\n{rest}"
        click.echo(table)
        click.echo(f"\n(total {time.perf_counter() - started:.1f} s)")
    if plot_path is not None:  # after the results, which a failure here must not lose
        from ebbtide.plot_path import plot_failed
        from ebbtide.sim.plot import plot

        try:
            plot(plot_path, recordings, clock_origin_s=online_load.clock_origin_s)
        except OSError as exc:
            raise plot_failed(plot_path, exc) from None
        click.echo(f"plot: {plot_path}", err=as_json)
