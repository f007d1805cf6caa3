"""Time of one planner pass over a large queue and a large cluster.

Builds one realistic :class:`~ebbtide.scheduling.snapshot.Snapshot` from a seeded RNG
(``--seed``) and times ``--repeat`` calls of :func:`ebbtide.scheduling.planner.plan` on it
(``time.perf_counter`` around the call only; the snapshot is built once, the planner is
pure and never mutates it):

- ``--devices`` devices (1,000) on nodes of 8 GPUs; one node in five has 141 GiB devices,
  the others 80 GiB;
- online usage per device: a fifth idle, most lightly loaded, some busy, a few nearly full;
  the expected growth (reserve) is a few percent of compute and up to 4 GiB;
- active attempts, 1.5 per device (1,500): fractional slices placed where they fit, a few
  whole-GPU slices on empty devices, about 1 % placed over capacity as if online usage
  rose after dispatch (those devices need evictions), 2 % already evicting and a few with
  a cancellation asked for;
- ``--jobs`` queued jobs (100,000) in the store's order (priority, then id): fractional
  slices of 5–50 % and 1–40 GiB, mostly the round figures people type (``25%``,
  ``8GiB``), 2 % whole-GPU jobs of 1–8 GPUs, a third of the jobs in arrays (some with a
  limit on running tasks), priorities mostly 0, some higher, a few negative.

The queue is in the store's order, and the planner is told so (``queued_in_order``), as
the scheduler passes the list :meth:`Store.queued_jobs` returns; with ``--unordered`` the
planner sorts the queue itself, as for the simulator's snapshots.

Usage (from the repository root)::

    python benchmarks/plan_scale.py [--jobs 100000] [--devices 1000] [--repeat 20]
        [--unordered] [--json]

Prints median / p99 / max pass time (and the median CPU time of the pass, with the load
average: the machine may be shared), the dispatches and evictions one pass decides, and the
process's peak RSS (snapshot included); with ``--json`` exactly one JSON object of the
same figures, ``{"jobs", "devices", "active", "passes", "median_s", "p99_s", "max_s",
"cpu_median_s", "dispatches", "evictions", "peak_rss_mib", "target", "met", "machine"}``
(``machine``: where it ran, see ``bench_machine.py``).
``--check`` exits 1 unless the targets hold: median ≤ 100 ms, peak RSS ≤ 4 GiB.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import resource
import statistics
import sys
import time

from bench_machine import machine

from ebbtide.queue.states import JobState
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT
from ebbtide.scheduling.planner import plan
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins, QueuedJob, Snapshot

#: Target: median time of one planner pass, in seconds.
TARGET_MEDIAN_S = 0.100
#: Target: peak resident memory of the whole process (snapshot included), in MiB.
TARGET_PEAK_RSS_MIB = 4096
#: Devices per node.
GPUS_PER_NODE = 8
#: Device memory of the two kinds of node, in MiB (80 GiB and 141 GiB).
SMALL_DEVICE_MIB = 80 * 1024
LARGE_DEVICE_MIB = 141 * 1024
#: Active attempts per device.
ACTIVE_PER_DEVICE = 1.5
#: The snapshot's clock, in Unix seconds.
NOW = 1_700_000_000.0
GIB = 1024

#: Compute shares people ask for, in percent, and how often (the rest: any whole percent).
ROUND_COMPUTE_PCT = (5, 10, 10, 15, 20, 20, 25, 25, 30, 40, 50)
#: Memory people ask for, in GiB (the rest: any whole GiB from 1 to 40).
ROUND_MEMORY_GIB = (1, 2, 2, 4, 4, 8, 8, 12, 16, 16, 24, 32, 40)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0–100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


# -- the snapshot -------------------------------------------------------------------------


def fraction_shape(rng: random.Random) -> tuple[float, int]:
    """A fractional slice request: compute in percent, memory in MiB."""
    compute = rng.choice(ROUND_COMPUTE_PCT) if rng.random() < 0.75 else rng.randint(5, 50)
    memory_gib = rng.choice(ROUND_MEMORY_GIB) if rng.random() < 0.75 else rng.randint(1, 40)
    return float(compute), memory_gib * GIB


def whole_shape(rng: random.Random) -> tuple[int, int]:
    """A whole-GPU request: number of GPUs and memory per device in MiB."""
    return rng.choice((1, 1, 1, 2, 2, 4, 8)), rng.choice((20, 40, 60, 70)) * GIB


def build_devices(rng: random.Random, count: int) -> list[DeviceView]:
    devices = []
    for i in range(count):
        node_no, index = divmod(i, GPUS_PER_NODE)
        memory = LARGE_DEVICE_MIB if node_no % 5 == 4 else SMALL_DEVICE_MIB
        load = rng.random()
        if load < 0.2:  # no online tenant
            oc, om = 0.0, 0.0
        elif load < 0.75:  # lightly loaded inference
            oc = rng.uniform(2, 25)
            om = memory * rng.uniform(0.10, 0.35)
        elif load < 0.95:  # busy
            oc = rng.uniform(25, 60)
            om = memory * rng.uniform(0.30, 0.60)
        else:  # nearly full
            oc = rng.uniform(60, 92)
            om = memory * rng.uniform(0.55, 0.90)
        devices.append(
            DeviceView(
                node=f"gpu-{node_no:03d}",
                index=index,
                memory_mib=float(memory),
                online_compute_pct=round(oc, 1),
                online_memory_mib=float(round(om)),
                reserve_compute_pct=round(rng.uniform(0, 5), 1) if oc else 0.0,
                reserve_memory_mib=float(rng.randint(0, 4) * GIB) if om else 0.0,
                sampled_at=NOW - rng.uniform(0, 1),
            )
        )
    return devices


def build_active(
    rng: random.Random, devices: list[DeviceView], count: int, first_id: int, margins: Margins
) -> list[ActiveAttempt]:
    """``count`` attempts; mostly placed within headroom, about 1 % over capacity."""
    free = {
        d.key: [
            DEVICE_COMPUTE_PCT - d.online_compute_pct - margins.compute_pct,
            d.memory_mib - d.online_memory_mib - margins.memory_mib,
            0,  # slices on the device
        ]
        for d in devices
    }
    active: list[ActiveAttempt] = []
    job_id = first_id
    tries = 0
    while len(active) < count and tries < 50 * count:
        tries += 1
        d = rng.choice(devices)
        f = free[d.key]
        state = JobState.RUNNING
        if rng.random() < 0.01 and f[2] == 0 and f[0] >= 50:
            gpus, memory = 1, rng.choice((20, 40)) * GIB
            compute = DEVICE_COMPUTE_PCT
            if f[1] < memory:
                continue
            f[0], f[1], f[2] = 0.0, f[1] - memory, 1
        else:
            gpus = 0
            compute, memory = fraction_shape(rng)
            over = rng.random() < 0.01  # online usage rose after this slice was placed
            if not over and (f[0] < compute or f[1] < memory):
                continue
            f[0] -= compute
            f[1] -= memory
            f[2] += 1
        r = rng.random()
        if r < 0.02:
            state = JobState.EVICTING
        elif r < 0.05:
            state = JobState.DISPATCHED
        dispatched = NOW - rng.uniform(10, 6 * 3600)
        started = None if state == JobState.DISPATCHED else dispatched + rng.uniform(1, 10)
        ckpt = started + rng.uniform(0, NOW - started) if started and rng.random() < 0.6 else None
        active.append(
            ActiveAttempt(
                job_id=job_id,
                attempt=rng.choice((1, 1, 1, 2, 3)),
                state=state,
                priority=rng.choice((0, 0, 0, 0, 1, 5, -1)),
                queue=rng.choice(("default", "default", "train", "infer")),
                node=d.node,
                devices=(d.index,),
                compute_pct=compute,
                memory_mib=memory,
                deadline_s=rng.choice((10.0, 30.0, 60.0)),
                signal=15,
                dispatched_at=dispatched,
                started_at=started,
                last_checkpoint_at=ckpt,
                cancel_requested=rng.random() < 0.003,
                array_id=rng.randrange(1, 200) if rng.random() < 0.3 else None,
                gpus=gpus,
            )
        )
        job_id += 1
    return active


def build_queued(rng: random.Random, count: int, first_id: int) -> list[QueuedJob]:
    """``count`` queued jobs, in the store's order: priority (high first), then id."""
    jobs: list[QueuedJob] = []
    job_id = first_id
    while len(jobs) < count:
        priority = rng.choice((0,) * 16 + (1, 2, 5, 10) + (-1, -5))
        queue = rng.choice(("default", "default", "train", "infer"))
        owner = f"user{rng.randrange(40):02d}"
        if rng.random() < 0.02:
            gpus, memory = whole_shape(rng)
            compute = DEVICE_COMPUTE_PCT
        else:
            gpus = 0
            compute, memory = fraction_shape(rng)
        tasks, array_id, limit = 1, None, None
        if rng.random() < 0.02:  # an array: a third of all jobs end up in one
            tasks = rng.randint(50, 1500)
            array_id = job_id
            limit = rng.choice((None, 10, 50, 100))
        for _ in range(min(tasks, count - len(jobs))):
            jobs.append(
                QueuedJob(
                    id=job_id,
                    priority=priority,
                    queue=queue,
                    owner=owner,
                    compute_pct=compute,
                    gpus=gpus,
                    memory_mib=memory,
                    array_id=array_id,
                    array_limit=limit,
                    attempts=1 if rng.random() < 0.05 else 0,
                )
            )
            job_id += 1
    jobs.sort(key=lambda j: (-j.priority, j.id))
    return jobs


def build_snapshot(jobs: int, devices: int, seed: int, max_dispatches: int) -> Snapshot:
    rng = random.Random(seed)
    margins = Margins()
    views = build_devices(rng, devices)
    n_active = round(ACTIVE_PER_DEVICE * devices)
    active = build_active(rng, views, n_active, first_id=1, margins=margins)
    queued = build_queued(rng, jobs, first_id=len(active) + 1)
    return Snapshot(
        now=NOW,
        queued=queued,
        active=active,
        devices=views,
        margins=margins,
        max_dispatches=max_dispatches,
    )


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000, help="queued jobs (100000)")
    p.add_argument("--devices", type=int, default=1000, help="devices, 8 per node (1000)")
    p.add_argument("--repeat", type=int, default=20, help="planner passes to time (20)")
    p.add_argument(
        "--max-dispatches", type=int, default=1000, help="dispatches per pass at most (1000)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument(
        "--unordered",
        action="store_true",
        help="the planner sorts the queue itself (default: told it is in the store's order)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the target is met")
    args = p.parse_args(argv)
    if args.jobs < 0 or args.devices < 1 or args.repeat < 1 or args.max_dispatches < 0:
        p.error("--jobs ≥ 0, --devices ≥ 1, --repeat ≥ 1 and --max-dispatches ≥ 0 please")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    snapshot = build_snapshot(args.jobs, args.devices, args.seed, args.max_dispatches)
    in_order = not args.unordered
    times: list[float] = []
    # and the thread's own CPU time: what a pass costs on a machine that other work
    # shares (the target is on wall time)
    cpu_times: list[float] = []
    result = plan(snapshot, queued_in_order=in_order)  # warm-up, and the decisions
    for _ in range(args.repeat):
        gc.collect()
        started, cpu_started = time.perf_counter(), time.thread_time()
        plan(snapshot, queued_in_order=in_order)
        times.append(time.perf_counter() - started)
        cpu_times.append(time.thread_time() - cpu_started)
    median = statistics.median(times)
    p99 = percentile(times, 99)
    peak_rss_mib = peak_rss_kib() / 1024
    met = median <= TARGET_MEDIAN_S and peak_rss_mib <= TARGET_PEAK_RSS_MIB
    if args.json:
        print(
            json.dumps(
                {
                    "jobs": len(snapshot.queued),
                    "devices": len(snapshot.devices),
                    "active": len(snapshot.active),
                    "passes": args.repeat,
                    "median_s": round(median, 6),
                    "p99_s": round(p99, 6),
                    "max_s": round(max(times), 6),
                    "cpu_median_s": round(statistics.median(cpu_times), 6),
                    "dispatches": len(result.dispatches),
                    "evictions": len(result.evictions),
                    "peak_rss_mib": round(peak_rss_mib, 1),
                    "target": {
                        "median_s": TARGET_MEDIAN_S,
                        "peak_rss_mib": TARGET_PEAK_RSS_MIB,
                    },
                    "met": met,
                    "machine": machine(),
                }
            )
        )
    else:
        print(
            f"plan_scale: {len(snapshot.queued)} queued jobs, {len(snapshot.devices)} devices, "
            f"{len(snapshot.active)} active attempts, {args.repeat} passes, "
            f"{os.cpu_count()} CPUs, seed {args.seed}, "
            + ("the planner sorts the queue" if args.unordered else "queue in the store's order")
        )
        print(
            f"  pass time: median {median * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
            f"max {max(times) * 1e3:.1f} ms; CPU time: median "
            f"{statistics.median(cpu_times) * 1e3:.1f} ms (load average "
            f"{os.getloadavg()[0]:.1f})"
        )
        print(
            f"  one pass decides {len(result.dispatches)} dispatches "
            f"(at most {snapshot.max_dispatches}) and {len(result.evictions)} evictions"
        )
        print(f"  peak RSS: {peak_rss_mib:.0f} MiB (the snapshot included)")
        verdict = "met" if met else "NOT met"
        print(
            f"  targets (median ≤ {TARGET_MEDIAN_S * 1e3:g} ms, "
            f"peak RSS ≤ {TARGET_PEAK_RSS_MIB / 1024:g} GiB): {verdict}"
        )
    return 1 if args.check and not met else 0


def peak_rss_kib() -> float:
    """The process's peak resident set size so far, in KiB (macOS counts bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform == "darwin" else peak


if __name__ == "__main__":
    sys.exit(main())
