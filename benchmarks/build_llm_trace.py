"""Build ``src/ebbtide/data/azure_code_llm_load.csv`` from the Azure LLM inference trace 2023.

Reads the *code* service's request log (``TIMESTAMP,ContextTokens,GeneratedTokens``; Patel
et al., "Splitwise", ISCA 2024; github.com/Azure/AzurePublicDataset, CC BY 4.0) and turns it
into per-GPU online load, one row per GPU per second, with the model of
:mod:`ebbtide.sim.llm_load` at its defaults: 8 GPUs of 80 GiB, each a 13B fp16 replica,
least-loaded assignment, no time compression, the whole hour.  The output is the
``t_s,device,online_compute_pct,online_memory_mib`` format of ``--online trace:CSV`` and
regenerates byte for byte.

Usage (from the repository root)::

    python benchmarks/build_llm_trace.py [LOG_CSV] [--out PATH] [--gpus N] [--minutes M]

``LOG_CSV`` defaults to ``../shared/traces/azure_llm_inference_2023_code.csv`` relative to
the repository root.  Prints, after writing: the size of the file, per GPU and for the fleet
the mean / p50 / p99 of online compute, bursts (a rise from at most 50 % to at least 80 %)
per GPU-minute, and memory min / p50 / max.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "src"))

from ebbtide.sim.llm_load import (  # noqa: E402
    DEFAULT_GPUS,
    LlmFleet,
    Row,
    format_rows,
    load_rows,
    read_requests,
)

DEFAULT_LOG = REPO_ROOT / "../shared/traces/azure_llm_inference_2023_code.csv"
DEFAULT_OUT = REPO_ROOT / "src/ebbtide/data/azure_code_llm_load.csv"
#: a burst starts when compute reaches this after having been at or below BURST_FROM_PCT
BURST_TO_PCT = 80.0
BURST_FROM_PCT = 50.0
#: the shipped file must stay well under this
SIZE_LIMIT_B = 5_000_000


def build(log: Path, gpus: int = DEFAULT_GPUS, minutes: float | None = None) -> list[Row]:
    """The rows of the trace built from the request log at ``log``."""
    duration_s = None if minutes is None else minutes * 60.0
    return load_rows(read_requests(log), LlmFleet(gpus=gpus), duration_s=duration_s)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of already sorted values."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def bursts(compute_pct: Sequence[float]) -> int:
    """Rises from at most ``BURST_FROM_PCT`` to at least ``BURST_TO_PCT`` (with hysteresis)."""
    count, armed = 0, True
    for pct in compute_pct:
        if armed and pct >= BURST_TO_PCT:
            count, armed = count + 1, False
        elif pct <= BURST_FROM_PCT:
            armed = True
    return count


def figures(rows: Sequence[Row]) -> list[str]:
    """Lines describing the trace: per GPU, then the fleet."""
    by_device: dict[int, list[Row]] = {}
    for row in rows:
        by_device.setdefault(row[1], []).append(row)
    lines = []
    all_compute: list[float] = []
    all_memory: list[int] = []
    total_bursts = 0
    minutes = 0.0
    for device, mine in sorted(by_device.items()):
        compute = [r[2] for r in mine]
        memory = sorted(r[3] for r in mine)
        n = bursts(compute)
        span_min = len(mine) / 60.0
        total_bursts += n
        minutes += span_min
        all_compute += compute
        all_memory += memory
        c = sorted(compute)
        lines.append(
            f"gpu {device}: compute mean {statistics.fmean(c):5.1f}% p50 {quantile(c, 0.5):5.1f}% "
            f"p99 {quantile(c, 0.99):5.1f}%, idle {sum(x == 0 for x in c) / len(c):4.0%}, "
            f"bursts {n / span_min:4.2f}/min, "
            f"memory {memory[0]}/{quantile(memory, 0.5)}/{memory[-1]} MiB (min/p50/max)"
        )
    c = sorted(all_compute)
    m = sorted(all_memory)
    lines.append(
        f"fleet: compute mean {statistics.fmean(c):.1f}% p50 {quantile(c, 0.5):.1f}% "
        f"p99 {quantile(c, 0.99):.1f}% max {c[-1]:.1f}%, "
        f"{sum(x == 0 for x in c) / len(c):.0%} of GPU-seconds idle, "
        f"{sum(x >= BURST_TO_PCT for x in c) / len(c):.1%} at {BURST_TO_PCT:g}% or more; "
        f"bursts ({BURST_FROM_PCT:g}%→{BURST_TO_PCT:g}%) {total_bursts} = "
        f"{total_bursts / minutes:.2f} per GPU-minute; "
        f"memory min {m[0]} p50 {quantile(m, 0.5)} p99 {quantile(m, 0.99)} max {m[-1]} MiB"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("log", nargs="?", type=Path, default=DEFAULT_LOG)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--gpus", type=int, default=DEFAULT_GPUS)
    parser.add_argument("--minutes", type=float, default=None, help="Keep the first M minutes.")
    args = parser.parse_args()
    try:
        rows = build(args.log, args.gpus, args.minutes)
    except ValueError as exc:
        raise SystemExit(f"build_llm_trace: {exc}") from None
    text = format_rows(rows)
    with open(args.out, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    size_b = len(text.encode())
    seconds = len(rows) // args.gpus
    print(
        f"wrote {len(rows)} rows ({args.gpus} GPUs × {seconds} s) to {args.out}: "
        f"{size_b / 1e6:.2f} MB"
    )
    if size_b >= SIZE_LIMIT_B:
        print(f"warning: over {SIZE_LIMIT_B / 1e6:g} MB; use --minutes or --gpus")
    for line in figures(rows):
        print(line)


if __name__ == "__main__":
    main()
