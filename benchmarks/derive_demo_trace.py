"""Derive the demo trace ``src/ebbtide/data/genai_sample.csv`` from the real GenAI trace.

Takes two online inference pods of the Alibaba GenAI serving trace (GenTD26, SoCC'25;
cluster-trace-v2026-GenAI, CC BY 4.0) over 48 consecutive samples (57 s apart, 45.6
minutes), joins their GPU duty cycle and GPU memory on (pod, timestamp), and writes them
as devices 0 and 1 of a ``t_s,device,online_compute_pct,online_memory_mib`` trace with
time compressed 30× (one sample every 1.9 s: the sample spans 91.2 s).  Memory is in MiB.

Usage (from the repository root)::

    python benchmarks/derive_demo_trace.py [TRACES_DIR] [--out PATH]

``TRACES_DIR`` defaults to ``../shared/traces`` relative to the repository root.  Prints
a short summary of each device (compute and memory peaks) after writing.
"""

from __future__ import annotations

import argparse
import csv
import gzip
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

#: the two pods (``container_ip`` MD5 hashes), in device order
PODS = (
    "c602ea5b5d53cff36e7b1187097ad00f",
    "d9a22a02d2ceb58ec16737de30e46541",
)
#: anonymised timestamp of the first sample taken (Unix s in the trace's shifted clock)
FIRST_TIMESTAMP_S = 1662883230.0
#: how many consecutive samples to take
SAMPLE_COUNT = 48
#: trace seconds per demo second: 57 s between samples become 1.9 s
COMPRESSION = 30.0

DUTY_FILE = "pod_gpu_duty_cycle_anon.csv.gz"  # value,timestamp_anon,container_ip
MEMORY_FILE = "pod_gpu_memory_used_bytes_anon.csv.gz"  # timestamp_anon,value,container_ip
_MIB_B = 1024 * 1024


def _read(path: Path, pods: set[str]) -> dict[tuple[str, float], float]:
    """(pod, timestamp) → value for the rows of ``pods``."""
    values: dict[tuple[str, float], float] = {}
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            if row["container_ip"] in pods:
                values[(row["container_ip"], float(row["timestamp_anon"]))] = float(row["value"])
    return values


def derive(traces_dir: Path) -> list[tuple[float, int, float, float]]:
    """The demo rows ``(t_s, device, online_compute_pct, online_memory_mib)``."""
    pods = set(PODS)
    duty = _read(traces_dir / DUTY_FILE, pods)
    memory = _read(traces_dir / MEMORY_FILE, pods)
    times = sorted({t for (pod, t) in duty if pod == PODS[0] and t >= FIRST_TIMESTAMP_S})
    times = times[:SAMPLE_COUNT]
    if len(times) < SAMPLE_COUNT or times[0] != FIRST_TIMESTAMP_S:
        raise SystemExit(f"{traces_dir}: the expected samples are missing; wrong trace files?")
    rows = []
    for t in times:
        for device, pod in enumerate(PODS):
            if (pod, t) not in duty or (pod, t) not in memory:
                raise SystemExit(f"pod {pod} has no joined sample at {t:.0f}")
            rows.append(
                (
                    round((t - times[0]) / COMPRESSION, 3),
                    device,
                    round(duty[(pod, t)], 2),
                    round(memory[(pod, t)] / _MIB_B),
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces_dir", nargs="?", type=Path, default=REPO_ROOT / "../shared/traces")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "src/ebbtide/data/genai_sample.csv")
    args = parser.parse_args()
    rows = derive(args.traces_dir)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["t_s", "device", "online_compute_pct", "online_memory_mib"])
        for t_s, device, compute, memory in rows:
            writer.writerow([f"{t_s:g}", device, f"{compute:g}", memory])
    print(f"wrote {len(rows)} rows to {args.out}")
    for device, pod in enumerate(PODS):
        mine = [r for r in rows if r[1] == device]
        peak_c = max(mine, key=lambda r: r[2])
        peak_m = max(mine, key=lambda r: r[3])
        print(
            f"device {device} (pod {pod[:8]}): compute peak {peak_c[2]:g}% at t={peak_c[0]:g}s, "
            f"memory {min(r[3] for r in mine)}–{peak_m[3]} MiB (peak at t={peak_m[0]:g}s)"
        )


if __name__ == "__main__":
    main()
