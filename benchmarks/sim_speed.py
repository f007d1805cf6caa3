"""Speed of the simulator: the full GenAI day with the openb best-effort stream.

Runs what ``ebb sim --online genai:DIR --jobs openb:DIR/openb_pod_list_default.csv``
runs — ebbtide and the three baselines, 143 GPUs × 22.8 h, backlogged load, seed 0 —
in this one process (one core), with the restart overhead ``ebb sim`` defaults to (30 s)
and ebbtide pausing for compute spikes (``--no-pause``: evicting), and prints the wall time
of the whole run (reading the traces included) and of each policy, then the figures table.

``--tile N`` runs ``ebb sim --tile N``: the 143 devices repeated N times with shifted
phases and the openb stream with them (``--tile 70``: 10,010 GPUs); ``--no-baselines``
runs ebbtide alone.

Usage (from the repository root)::

    python benchmarks/sim_speed.py [--traces DIR] [--hours H] [--devices N] [--tile N]
        [--restart-overhead S] [--no-pause] [--no-baselines] [--json] [--check]

``--traces`` defaults to ``shared/traces`` beside the repository (``$EBBTIDE_TRACES``
overrides it).  With ``--json`` exactly one JSON object: ``{"wall_s", "target_s",
"read_s", "sim_wall_s", "tile", "gpus", "peak_rss_mib", "workload", "policies",
"machine"}`` (``sim_wall_s``: the policies' runs, without reading the traces;
``peak_rss_mib``: the process's peak resident memory; ``machine``: where it ran, see
``bench_machine.py``).  ``--check`` exits 1 unless the whole run took less than
the target: 60 s at ``--tile 1``, 600 s (the ten minutes of issue 15 for a
10,000-GPU day) for a larger fleet.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench_machine import machine

from ebbtide.sim.jobs import load_openb
from ebbtide.sim.online import load_genai
from ebbtide.sim.policies import NO_PAUSE, baselines, ebbtide_policy
from ebbtide.sim.report import render
from ebbtide.sim.runner import describe_workload, run_policies
from ebbtide.sim.tile import TILE_MAX, tile_load, tile_stream
from ebbtide.sim.timing import RESTART_OVERHEAD_S

#: Target: the whole run (all four policies, reading the traces included), in seconds.
TARGET_S = 60.0
#: Target with ``--tile`` above 1 (a fleet of up to ~10,000 GPUs at ``--tile 70``), in
#: seconds.
TILE_TARGET_S = 600.0
REPO = Path(__file__).resolve().parents[1]
OPENB_FILE = "openb_pod_list_default.csv"


def default_traces() -> Path:
    return Path(os.environ.get("EBBTIDE_TRACES") or REPO.parent / "shared" / "traces")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=Path, default=None, help="the shared traces directory")
    p.add_argument("--hours", type=float, default=None, help="simulate at most H hours (all)")
    p.add_argument("--devices", type=int, default=None, help="only the first N devices (all)")
    p.add_argument(
        "--tile",
        type=int,
        default=1,
        metavar="N",
        help=f"the devices and the stream repeated N times, phases shifted (1; at most {TILE_MAX})",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument(
        "--restart-overhead",
        type=float,
        default=RESTART_OVERHEAD_S,
        metavar="S",
        help=f"seconds a resumed job restores before it progresses ({RESTART_OVERHEAD_S:g})",
    )
    p.add_argument("--no-pause", action="store_true", help="ebbtide evicts on every shortfall")
    p.add_argument("--no-baselines", action="store_true", help="run ebbtide alone")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the target is met")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    traces = args.traces or default_traces()
    started = time.perf_counter()
    load = load_genai(
        traces, device_memory_mib=80 * 1024.0, max_devices=args.devices, hours=args.hours
    )
    load = tile_load(load, args.tile, seed=args.seed)
    stream = tile_stream(load_openb(traces / OPENB_FILE, seed=args.seed), args.tile)
    read_s = time.perf_counter() - started
    product = ebbtide_policy(pause=NO_PAUSE if args.no_pause else None)
    figures, _ = run_policies(
        load,
        stream,
        [product] if args.no_baselines else [product, *baselines()],
        seed=args.seed,
        restart_overhead_s=args.restart_overhead,
    )
    wall_s = time.perf_counter() - started
    workload = describe_workload(
        load,
        f"genai:{traces}",
        f"openb:{traces / OPENB_FILE}",
        stream,
        backlogged=True,
        arrival_scale=1.0,
        seed=args.seed,
        restart_overhead_s=args.restart_overhead,
        tile=args.tile,
    )
    workload["pause"] = product.pause.enabled
    return {
        "wall_s": round(wall_s, 3),
        "target_s": target_s(args.tile),
        "read_s": round(read_s, 3),
        "sim_wall_s": round(wall_s - read_s, 3),
        "tile": args.tile,
        "gpus": len(load.devices),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "workload": workload,
        "policies": figures,
        "machine": machine(),
    }


def target_s(tile: int) -> float:
    return TARGET_S if tile == 1 else TILE_TARGET_S


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux counts in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    traces = args.traces or default_traces()
    if not (traces / OPENB_FILE).is_file():
        print(f"sim_speed: no {OPENB_FILE} in {traces} (use --traces)", file=sys.stderr)
        return 2
    if not 1 <= args.tile <= TILE_MAX:
        print(f"sim_speed: --tile {args.tile}: expected 1 to {TILE_MAX}", file=sys.stderr)
        return 2
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(render(out))
        per_policy = ", ".join(f"{n} {f['sim_wall_s']:.1f} s" for n, f in out["policies"].items())
        print(
            f"\n{out['gpus']:,} GPUs: wall {out['wall_s']:.1f} s (target < {out['target_s']:g} s): "
            f"reading the traces {out['read_s']:.1f} s, {per_policy}; "
            f"peak RSS {out['peak_rss_mib']:,.0f} MiB; {out['machine']['cpus']} CPUs "
            f"({out['machine']['cpu_model']})"
        )
    if args.check and out["wall_s"] >= out["target_s"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
