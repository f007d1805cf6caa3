"""Speed of the simulator: the full GenAI day with the openb best-effort stream.

Runs what ``ebb sim --online genai:DIR --jobs openb:DIR/openb_pod_list_default.csv``
runs — ebbtide and the three baselines, 143 GPUs × 22.8 h, backlogged load, seed 0 —
in this one process (one core), with the restart overhead ``ebb sim`` defaults to (30 s)
and ebbtide pausing for compute spikes (``--no-pause``: evicting), and prints the wall time
of the whole run (reading the traces included) and of each policy, then the figures table.

Usage (from the repository root)::

    python benchmarks/sim_speed.py [--traces DIR] [--hours H] [--devices N]
        [--restart-overhead S] [--no-pause] [--json] [--check]

``--traces`` defaults to ``shared/traces`` beside the repository (``$EBBTIDE_TRACES``
overrides it).  With ``--json`` exactly one JSON object: ``{"wall_s", "target_s",
"read_s", "workload", "policies"}``.  ``--check`` exits 1 unless the whole run took less
than the target (60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ebbtide.sim.jobs import load_openb
from ebbtide.sim.online import load_genai
from ebbtide.sim.policies import NO_PAUSE, baselines, ebbtide_policy
from ebbtide.sim.report import render
from ebbtide.sim.runner import describe_workload, run_policies
from ebbtide.sim.timing import RESTART_OVERHEAD_S

#: Target: the whole run (all four policies, reading the traces included), in seconds.
TARGET_S = 60.0
REPO = Path(__file__).resolve().parents[1]
OPENB_FILE = "openb_pod_list_default.csv"


def default_traces() -> Path:
    return Path(os.environ.get("EBBTIDE_TRACES") or REPO.parent / "shared" / "traces")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=Path, default=None, help="the shared traces directory")
    p.add_argument("--hours", type=float, default=None, help="simulate at most H hours (all)")
    p.add_argument("--devices", type=int, default=None, help="only the first N devices (all)")
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument(
        "--restart-overhead",
        type=float,
        default=RESTART_OVERHEAD_S,
        metavar="S",
        help=f"seconds a resumed job restores before it progresses ({RESTART_OVERHEAD_S:g})",
    )
    p.add_argument("--no-pause", action="store_true", help="ebbtide evicts on every shortfall")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the target is met")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    traces = args.traces or default_traces()
    started = time.perf_counter()
    load = load_genai(
        traces, device_memory_mib=80 * 1024.0, max_devices=args.devices, hours=args.hours
    )
    stream = load_openb(traces / OPENB_FILE, seed=args.seed)
    read_s = time.perf_counter() - started
    product = ebbtide_policy(pause=NO_PAUSE if args.no_pause else None)
    figures, _ = run_policies(
        load,
        stream,
        [product, *baselines()],
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
    )
    workload["pause"] = product.pause.enabled
    return {
        "wall_s": round(wall_s, 3),
        "target_s": TARGET_S,
        "read_s": round(read_s, 3),
        "workload": workload,
        "policies": figures,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    traces = args.traces or default_traces()
    if not (traces / OPENB_FILE).is_file():
        print(f"sim_speed: no {OPENB_FILE} in {traces} (use --traces)", file=sys.stderr)
        return 2
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(render(out))
        per_policy = ", ".join(f"{n} {f['sim_wall_s']:.1f} s" for n, f in out["policies"].items())
        print(
            f"\nwall {out['wall_s']:.1f} s (target < {TARGET_S:g} s): reading the traces "
            f"{out['read_s']:.1f} s, {per_policy}"
        )
    if args.check and out["wall_s"] >= TARGET_S:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
