"""Time of one ``ebb top`` frame over a 1,000-GPU fleet.

Builds one synthetic :class:`~ebbtide.top.snapshot.FleetSnapshot` from a seeded RNG
(``--seed``) with :func:`~ebbtide.top.snapshot.build_snapshot`, fed what the client
would give (``Client.nodes()``, the active jobs, ``queue_stats()``,
``recent_evictions()``):

- ``--gpus`` GPUs (1,000) on nodes of 8 (125 nodes), 80 GiB each; online load mostly
  light, some busy, a few full; a few devices out of service, drained or stale, one
  node silent;
- ``--attempts`` active attempts (3,000) of 40 users in 6 queues, fractional slices of
  5–40 % placed where they fit, a few whole-GPU jobs, some paused or evicting;
- 50 recent evictions, a few that missed their deadline.

Then times ``--frames`` frames (200), each :func:`~ebbtide.top.render.render` and
``Console.print`` into a ``StringIO`` of ``--width`` × ``--height`` (200 × 60) with
colours on, as a terminal gets it; frame after frame the view changes as a person's
keys would change it (every sort, a node, user or queue filter, scrolled pages, the
other panels).  ``time.perf_counter`` around render and print only.

Usage (from the repository root)::

    python benchmarks/top_render.py [--gpus 1000] [--attempts 3000] [--frames 200] [--json]

Prints p50 / p99 / max time per frame, with the time to build the snapshot, to render
every row at once (what ``--once`` into a file does) and to dump the snapshot as
``ebb top --json`` does; with ``--json`` exactly one JSON object.  ``--check`` exits 1
unless the target holds: p99 ≤ 200 ms per frame.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import json
import math
import random
import statistics
import sys
import time
from typing import Any

from rich.console import Console

from ebbtide.top.render import render
from ebbtide.top.snapshot import build_snapshot
from ebbtide.top.view import PANELS, SORTS, ViewState

#: Target: p99 time of one frame, in seconds.
TARGET_P99_S = 0.200
#: Devices per node, and each one's memory in MiB (80 GiB).
GPUS_PER_NODE = 8
DEVICE_MIB = 80 * 1024
#: Users and queues the attempts belong to.
USERS = [f"user{i:02d}" for i in range(40)]
QUEUES = ["default", "batch", "train", "infer", "research", "urgent"]
#: Evictions the snapshot carries.
EVICTIONS = 50
#: The snapshot's clock, in Unix seconds.
NOW = 1_700_000_000.0


@dataclasses.dataclass
class FakeJob:
    """What ``build_snapshot`` reads of a job row."""

    id: int
    name: str
    owner: str
    queue: str
    state: str
    node: str
    devices: str
    compute_pct: float
    gpus: int
    memory_mib: int
    paused_at: float | None = None
    suspended_at: float | None = None


def fleet(gpus: int, attempts: int, seed: int) -> tuple[Any, ...]:
    """What the client would give of the synthetic fleet (see the module doc):
    ``build_snapshot``'s arguments."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    free: list[tuple[str, int, float]] = []  # node, device, compute left
    for n in range(math.ceil(gpus / GPUS_PER_NODE)):
        name = f"gpu-{n:03d}"
        devices = []
        for i in range(min(GPUS_PER_NODE, gpus - n * GPUS_PER_NODE)):
            online = rng.choice([0.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 85.0, 98.0])
            device: dict[str, Any] = {
                "index": i,
                "memory_mib": DEVICE_MIB,
                "online_compute_pct": online,
                "online_memory_mib": round(online / 100 * DEVICE_MIB * rng.uniform(0.5, 1.0)),
                "reserve_compute_pct": 5.0,
                "health": "healthy",
            }
            roll = rng.random()
            if roll < 0.01:
                device["health"] = "unhealthy"
                device["fault"] = {"xid": 79, "meaning": "GPU has fallen off the bus"}
            elif roll < 0.02:
                device["drained"] = f"{name}/{i} drained by admin: fan"
            elif roll < 0.03:
                device["sample_ok"] = False
            devices.append(device)
            free.append((name, i, 100.0 - online))
        nodes.append({"name": name, "silent": n == 7, "stopping": False, "devices": devices})
    jobs = []
    for job_id in range(1, attempts + 1):
        node, index, left = free[rng.randrange(len(free))]
        whole = rng.random() < 0.02
        share = 100.0 if whole else float(rng.choice([5, 10, 10, 20, 25, 25, 40]))
        if share > left:
            share = max(1.0, left)
        roll = rng.random()
        jobs.append(
            FakeJob(
                id=job_id,
                name=f"job-{job_id}",
                owner=rng.choice(USERS),
                queue=rng.choice(QUEUES),
                state="evicting" if roll < 0.02 else "dispatched" if roll < 0.05 else "running",
                node=node,
                devices=str(index),
                compute_pct=share,
                gpus=1 if whole else 0,
                memory_mib=rng.choice([2048, 4096, 8192, 16384]),
                paused_at=NOW - 5 if 0.05 <= roll < 0.10 else None,
            )
        )
    stats = {
        q: {"queued": rng.randrange(5000), "running": 0, "held": rng.randrange(50)} for q in QUEUES
    }
    for j in jobs:
        stats[j.queue][j.state] = stats[j.queue].get(j.state, 0) + 1
    evictions = [
        {
            "job_id": attempts + k,
            "attempt": 1,
            "time": NOW - 10 * k,
            "owner": rng.choice(USERS),
            "queue": rng.choice(QUEUES),
            "node": f"gpu-{rng.randrange(len(nodes)):03d}",
            "devices": [rng.randrange(GPUS_PER_NODE)],
            "reason": "online compute on the device rose to 97%, above its 90% threshold",
            "reason_code": "online_compute",
            "latency_s": rng.uniform(0.05, 2.0),
            "deadline_s": 30.0,
            "deadline_missed": rng.random() < 0.05,
            "killed": rng.random() < 0.1,
        }
        for k in range(EVICTIONS)
    ]
    return nodes, jobs, stats, evictions


def views(frames: int) -> list[ViewState]:
    """What a person's keys would show, frame after frame."""
    out = []
    filters: list[dict[str, str]] = [{}, {"node": "gpu-01"}, {"user": "user07"}, {"queue": "train"}]
    for k in range(frames):
        out.append(
            ViewState(
                sort=SORTS[k % len(SORTS)],
                offset=(k * 47) % 1000,
                panel=PANELS[0] if k % 10 else PANELS[(k // 10) % len(PANELS)],
                **filters[(k // 4) % len(filters)],
            )
        )
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--attempts", type=int, default=3000)
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--width", type=int, default=200)
    p.add_argument("--height", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the target is met")
    args = p.parse_args(argv)

    given = fleet(args.gpus, args.attempts, args.seed)
    started = time.perf_counter()
    snapshot = build_snapshot(*given, taken_at=NOW)
    build_s = time.perf_counter() - started
    out = io.StringIO()
    console = Console(
        file=out,
        width=args.width,
        height=args.height,
        force_terminal=True,
        color_system="truecolor",
        highlight=False,
    )
    times = []
    gc.collect()
    for state in views(args.frames):
        out.seek(0)
        out.truncate()
        t0 = time.perf_counter()
        console.print(render(snapshot, state, args.width, args.height))
        times.append(time.perf_counter() - t0)
        lines = out.getvalue().count("\n")
        assert lines <= args.height, f"a frame of {lines} lines on a {args.height}-line screen"
    out.seek(0)
    out.truncate()
    t0 = time.perf_counter()
    console.print(render(snapshot, ViewState(), args.width, None))
    every_row_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dumped = json.dumps(snapshot.to_dict(), indent=2, default=str)
    json_s = time.perf_counter() - t0

    figures = {
        "gpus": len(snapshot.gpus),
        "attempts": snapshot.totals.attempts,
        "frames": len(times),
        "width": args.width,
        "height": args.height,
        "frame_p50_s": round(statistics.median(times), 5),
        "frame_p99_s": round(percentile(times, 0.99), 5),
        "frame_max_s": round(max(times), 5),
        "build_snapshot_s": round(build_s, 5),
        "every_row_once_s": round(every_row_s, 5),
        "json_s": round(json_s, 5),
        "json_bytes": len(dumped),
        "target_p99_s": TARGET_P99_S,
        "met": percentile(times, 0.99) <= TARGET_P99_S,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"ebb top, {figures['gpus']:,} GPUs, {figures['attempts']:,} attempts, "
            f"{args.width}x{args.height}, {len(times)} frames"
        )
        for key in ("frame_p50_s", "frame_p99_s", "frame_max_s"):
            print(f"  {key[:-2].replace('_', ' '):<12} {figures[key] * 1e3:8.2f} ms")
        print(f"  build snapshot   {build_s * 1e3:8.2f} ms (from what the client gives)")
        print(f"  every row once   {every_row_s * 1e3:8.2f} ms (--once into a file)")
        print(f"  --json dump      {json_s * 1e3:8.2f} ms ({len(dumped):,} bytes)")
        verdict = "met" if figures["met"] else "MISSED"
        print(f"  target (frame p99 ≤ {TARGET_P99_S * 1e3:g} ms): {verdict}")
    return 0 if figures["met"] or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
