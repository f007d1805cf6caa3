"""What granting a pass's slices costs the store: ``Store.dispatch`` once a job (one
transaction each, as a scheduler's pass did) against ``Store.dispatch_many`` (one
transaction for the pass), on a fresh PostgreSQL database and on SQLite.

``--dispatches`` queued jobs are granted each way, ``--repeat`` times (each round
requeues them all first, so every round grants the same jobs at the next attempt).
Prints per backend the time per dispatch each way (p50 over the rounds); with ``--json``
exactly one JSON object: ``{"dispatches", "runs": [{"backend", "one_each_ms",
"one_for_all_ms", "speedup"}]}`` (milliseconds per dispatch).

Usage (from the repository root; PostgreSQL as the tests use it)::

    python benchmarks/dispatch_batch.py [--dispatches 300] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import bench_stores

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.planner import Dispatch

#: The server to make the database on (as the tests and ``pass_scale.py`` find it).
PG_ADMIN_URL = os.environ.get(
    "EBBTIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def measure(url: str, n: int, repeat: int) -> dict[str, Any]:
    store = Store(url)
    try:
        ids = [
            store.submit(JobSpec(command=["true"]), "bench", defaults_deadline_s=30)[0]
            for _ in range(2 * n)
        ]
        one_each: list[float] = []
        one_for_all: list[float] = []
        for attempt in range(repeat):
            half, other = ids[:n], ids[n:]
            if attempt % 2:  # each way on either half in turn
                half, other = other, half
            t = time.perf_counter()
            for job_id in half:
                store.dispatch(
                    job_id,
                    expected_attempts=attempt,
                    node="n1",
                    devices=(0,),
                    compute_pct=10.0,
                    memory_mib=1024,
                )
            one_each.append((time.perf_counter() - t) / n)
            t = time.perf_counter()
            numbers = store.dispatch_many(
                [Dispatch(j, attempt, "n1", (0,), 10.0, 1024) for j in other]
            )
            one_for_all.append((time.perf_counter() - t) / n)
            assert numbers == [attempt + 1] * n
            for job_id in ids:
                store.requeue_lost(job_id, attempt + 1, why="the next round")
    finally:
        store.close()
    each, batched = statistics.median(one_each) * 1e3, statistics.median(one_for_all) * 1e3
    return {
        "one_each_ms": round(each, 3),
        "one_for_all_ms": round(batched, 3),
        "speedup": round(each / batched, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatches", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    runs = []
    with bench_stores.postgres_url(PG_ADMIN_URL) as url:
        runs.append({"backend": "postgresql", **measure(url, args.dispatches, args.repeat)})
    with bench_stores.sqlite_url("ebbtide-dispatch-bench-") as url:
        runs.append({"backend": "sqlite", **measure(url, args.dispatches, args.repeat)})
    if args.json:
        print(json.dumps({"dispatches": args.dispatches, "runs": runs}))
        return 0
    for r in runs:
        print(
            f"{r['backend']:<11} {args.dispatches} dispatches: one transaction each "
            f"{r['one_each_ms']:.2f} ms a dispatch, one for all {r['one_for_all_ms']:.2f} ms "
            f"({r['speedup']:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
