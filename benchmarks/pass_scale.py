"""Time of the live scheduler's pass (``Scheduler.run_once``) on PostgreSQL against the
size of the queue, with the scheduler's copy of the queue (``Mirror``: a pass reads what
changed) and without it (a pass reads every queued job).

For each ``--jobs`` size (10,000, 100,000 and 1,000,000 by default), in a fresh database
(``bench_stores.postgres_url``): one job is submitted through the store and PostgreSQL
copies it server side (``INSERT ... SELECT ... FROM generate_series``, as
``qstat_scale.py`` does) into that many queued jobs (priorities 0 to 2, slices of 25 % and
4 GiB) with a ``submitted`` event each.  A fixed small fleet (``--nodes`` nodes of 8
devices, 80 GiB each, idle) heartbeats before every pass, and between two passes a steady
trickle of changes comes in: ``--trickle`` submissions, the attempts the last pass
dispatched start, and as many running ones end, so every pass has work to dispatch.

``--blocked`` says what keeps the bulk of the queue waiting: ``room`` (the default: the
fleet is full), ``misfit`` (its jobs ask for more memory than a device has; the trickle,
behind them at priority 0, fits), ``array`` (they are the tasks of one array that may run
2 at once) or ``quota`` (their queue, ``bulk``, may run 2 attempts at once).

Each pass is timed with ``time.perf_counter`` around ``run_once`` alone (the trickle and
the heartbeats are not timed): ``--repeat`` passes without the copy (none with
``--copy-only``), then as many with it (its first pass, which reads everything, is
``rebuild_s`` and not in its percentiles).

Usage (from the repository root; PostgreSQL as the tests use it)::

    python benchmarks/pass_scale.py [--jobs 10000 100000 1000000] [--repeat 30]
        [--trickle 5] [--nodes 4] [--blocked room|misfit|array|quota] [--copy-only]
        [--json]

Prints, per size, p50 / p99 pass time with and without the copy; with ``--json`` exactly
one JSON object: ``{"devices", "trickle", "blocked", "runs": [{"jobs", "load_s",
"full_p50_s", "full_p99_s", "mirror_p50_s", "mirror_p99_s", "rebuild_s"}, ...],
"machine"}`` (the ``full_`` figures null with ``--copy-only``; ``machine``: where it ran,
see ``bench_machine.py``).  Target (issue: fleet scale): with the copy, the pass time is
flat in the size of the queue.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import bench_stores
from bench_cli import stats
from bench_machine import machine

from ebbtide.config.policy import Policy, parse_policy
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.scheduling.loop import Scheduler

PG_ADMIN_URL = os.environ.get(
    "EBBTIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
GPUS_PER_NODE = 8
DEVICE_MIB = 80 * 1024
#: The queued jobs' slice: compute in percent, memory in MiB.
SLICE_PCT, SLICE_MIB = 25.0, 4096
#: What keeps the bulk of the queue waiting (``--blocked``): its columns' SQL.
BLOCKED = {
    "room": {},
    "misfit": {"memory_mib": str(2 * DEVICE_MIB)},
    "array": {"array_id": "1", "array_limit": "2"},
    "quota": {"queue": "'bulk'"},
}
#: The policy of ``--blocked quota``: the bulk's queue runs 2 attempts at once.
QUOTA_POLICY = "queues:\n  bulk: {max_running: 2}\n"


def load(url: str, jobs: int, blocked: str = "room") -> float:
    """``jobs`` queued jobs with a ``submitted`` event each, copied from one submitted
    through the store, waiting for what ``blocked`` names; seconds it took."""
    return bench_stores.fill_jobs(
        url,
        JobSpec(command=["python", "train.py"], compute_pct=SLICE_PCT, memory_mib=SLICE_MIB),
        jobs=jobs,
        varying={
            "priority": "g % 3",
            "submitted_at": "1.7e9 + g",
            "owner": "'user' || (g % 100)",
            "name": "'job-' || g",
            **BLOCKED[blocked],
        },
        events_insert=(
            "INSERT INTO events (id, job_id, attempt, type, time, data_json) "
            "SELECT g, g, e.attempt, e.type, 1.7e9 + g, e.data_json "
            "FROM generate_series(1, :jobs) g, etpl e"
        ),
        params={},
        last_id=jobs,
    )


class Fleet:
    """The fixed small fleet and the trickle of changes between two passes."""

    def __init__(self, store: Store, nodes: int, trickle: int) -> None:
        self.store = store
        self.nodes = [f"node{i}" for i in range(nodes)]
        self.trickle = trickle
        self.started_at = time.time()

    def heartbeat(self) -> None:
        now = time.time()
        devices = [
            {"index": i, "memory_mib": DEVICE_MIB, "sampled_at": now} for i in range(GPUS_PER_NODE)
        ]
        for node in self.nodes:
            self.store.heartbeat(node, started_at=self.started_at, devices=devices)

    def changes(self) -> None:
        """Submissions, starts of what was dispatched, and as many ends of running jobs
        (so about as many dispatches each pass)."""
        store = self.store
        spec = JobSpec(command=["python", "train.py"], compute_pct=SLICE_PCT, memory_mib=SLICE_MIB)
        for _ in range(self.trickle):
            store.submit(spec, "user1", defaults_deadline_s=30)
        for a in store.active_attempts():
            if a.state == JobState.DISPATCHED:
                store.mark_started(a.job_id, a.attempt, pid=1, stdout_path="o", stderr_path="e")
        running = [a for a in store.active_attempts() if a.state == JobState.RUNNING]
        for a in running[: self.trickle]:
            store.finish_attempt(a.job_id, a.attempt, exit_code=0, max_attempts=1)


def passes(
    store: Store, fleet: Fleet, *, incremental: bool, repeat: int, policy: Policy
) -> list[float]:
    """``repeat`` + 1 timed passes of a new scheduler (the first: its start)."""
    scheduler = Scheduler(store, policy=policy, wakeups=False, incremental=incremental)
    times = []
    for _ in range(repeat + 1):
        fleet.changes()
        fleet.heartbeat()
        started = time.perf_counter()
        scheduler.run_once()
        times.append(time.perf_counter() - started)
    return times


def measure(jobs: int, args: argparse.Namespace) -> dict[str, Any]:
    policy = parse_policy(QUOTA_POLICY) if args.blocked == "quota" else Policy()
    full: list[float] = []
    with bench_stores.postgres_url(PG_ADMIN_URL) as url:
        load_s = load(url, jobs, args.blocked)
        store = Store(url)
        try:
            fleet = Fleet(store, args.nodes, args.trickle)
            if not args.copy_only:
                full = passes(store, fleet, incremental=False, repeat=args.repeat, policy=policy)
            mirror = passes(store, fleet, incremental=True, repeat=args.repeat, policy=policy)
        finally:
            store.close()
    out: dict[str, Any] = {"jobs": jobs, "load_s": round(load_s, 2)}
    for name, times in (("full", full[1:]), ("mirror", mirror[1:])):
        figures = stats(name, times) if times else {}
        out[f"{name}_p50_s"] = figures.get(f"{name}_p50_s")
        out[f"{name}_p99_s"] = figures.get(f"{name}_p99_s")
    out["rebuild_s"] = round(mirror[0], 4)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Time of the live scheduler's pass on PostgreSQL against the size of "
        "the queue, with and without the scheduler's copy of the queue."
    )
    parser.add_argument(
        "--jobs",
        type=int,
        nargs="+",
        default=[10_000, 100_000, 1_000_000],
        help="queue sizes to measure (10000 100000 1000000)",
    )
    parser.add_argument("--repeat", type=int, default=30, help="timed passes each way (30)")
    parser.add_argument("--trickle", type=int, default=5, help="submissions between two passes (5)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes of 8 idle devices (4)")
    parser.add_argument(
        "--blocked",
        choices=sorted(BLOCKED),
        default="room",
        help="what keeps the bulk of the queue waiting (room)",
    )
    parser.add_argument(
        "--copy-only", action="store_true", help="no passes that read the whole queue"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    runs = []
    for jobs in args.jobs:
        run = measure(jobs, args)
        runs.append(run)
        if not args.json:
            full = (
                f"full read p50 {run['full_p50_s'] * 1e3:8.1f} ms p99 "
                f"{run['full_p99_s'] * 1e3:8.1f} ms  |  "
                if run["full_p50_s"] is not None
                else ""
            )
            print(
                f"{jobs:>9,} queued  load {run['load_s']:.1f}s  {full}with the copy p50 "
                f"{run['mirror_p50_s'] * 1e3:6.1f} ms p99 {run['mirror_p99_s'] * 1e3:6.1f} ms "
                f"(its first pass {run['rebuild_s'] * 1e3:.0f} ms)",
                flush=True,
            )
    if args.json:
        devices = args.nodes * GPUS_PER_NODE
        print(
            json.dumps(
                {
                    "devices": devices,
                    "trickle": args.trickle,
                    "blocked": args.blocked,
                    "runs": runs,
                    "machine": machine(),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
