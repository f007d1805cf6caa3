"""Jobs per second the store accepts: array submits and single submits, SQLite and PostgreSQL.

Calls :meth:`ebbtide.queue.store.Store.submit` directly (no CLI, no network hop besides the
database's own), with a :class:`~ebbtide.queue.spec.JobSpec` like ``qsub`` builds:

- **array**: ``--arrays`` arrays (3) of ``--array`` tasks each (10,000), one ``submit``
  call per array; jobs per second = tasks / total time of those calls;
- **single**: ``--single`` submits (2,000) of one job each, one call (and one database
  transaction) per job; jobs per second = jobs / total time.

SQLite: a new database file in a temporary directory (WAL, as the store sets it up).
PostgreSQL: a fresh database created on the server of ``--postgres-url`` (default
``$EBBTIDE_TEST_POSTGRES_URL`` or ``postgresql+psycopg://postgres@127.0.0.1:5432/test``)
and dropped at the end; ``--skip-postgres`` on machines without one.  Every submitted row
is counted afterwards, so a fast but lossy submit cannot pass unnoticed.

Usage (from the repository root)::

    python benchmarks/submit_throughput.py [--array 10000] [--arrays 3] [--single 2000]
        [--skip-postgres] [--json]

Prints jobs per second per backend; with ``--json`` exactly one JSON object,
``{"sqlite": {"array_per_s", "single_per_s"}, "postgres": {...}}`` (``"postgres": null``
when skipped).  ``--check`` exits 1 unless the target holds: array submit ≥ 5,000 jobs/s
on every backend measured (Slurm documents about 500 jobs/s sustained).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import bench_stores
import sqlalchemy as sa

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store

#: Target: jobs per second accepted through an array submit.
TARGET_ARRAY_PER_S = 5000.0
#: The eviction deadline the store fills in when a spec has none, in seconds.
DEFAULT_DEADLINE_S = 30.0
POSTGRES_ADMIN_URL = os.environ.get(
    "EBBTIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
OWNER = "bench"


def spec(array_tasks: int | None = None) -> JobSpec:
    """What ``ebb qsub -J 1-N --gpu 25% --gpumem 4GiB python train.py`` submits."""
    fields: dict[str, Any] = {
        "name": "train",
        "command": ["python", "train.py", "--lr", "3e-4"],
        "gpu": "25%",
        "gpumem": "4GiB",
        "env": {"WANDB_MODE": "offline"},
        "checkpoint_interval": "10m",
    }
    if array_tasks is not None:
        fields["array"] = {"start": 1, "end": array_tasks}
    return JobSpec(**fields)


def measure(url: str, arrays: int, array_tasks: int, singles: int) -> dict[str, float]:
    """Jobs per second through array submits and single submits on a fresh store at ``url``."""
    store = Store(url)
    try:
        store.submit(spec(), OWNER, defaults_deadline_s=DEFAULT_DEADLINE_S)  # warm-up
        array_spec = spec(array_tasks)
        started = time.perf_counter()
        for _ in range(arrays):
            ids = store.submit(array_spec, OWNER, defaults_deadline_s=DEFAULT_DEADLINE_S)
            assert len(ids) == array_tasks
        array_s = time.perf_counter() - started

        single_spec = spec()
        started = time.perf_counter()
        for _ in range(singles):
            store.submit(single_spec, OWNER, defaults_deadline_s=DEFAULT_DEADLINE_S)
        single_s = time.perf_counter() - started

        expected = 1 + arrays * array_tasks + singles
        with store.engine.connect() as conn:
            jobs = conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one()
            events = conn.execute(sa.text("SELECT count(*) FROM events")).scalar_one()
        if jobs != expected or events != expected:
            raise SystemExit(f"{url}: expected {expected} jobs and events, found {jobs}, {events}")
    finally:
        store.close()
    return {
        "array_per_s": round(arrays * array_tasks / array_s, 1),
        "single_per_s": round(singles / single_s, 1) if singles else 0.0,
    }


def sqlite_url() -> AbstractContextManager[str]:
    return bench_stores.sqlite_url("ebbtide-submit-bench-")


postgres_url = bench_stores.postgres_url


def run(
    database: Callable[[], AbstractContextManager[str]], args: argparse.Namespace
) -> dict[str, float]:
    """Measure on the store URL ``database()`` yields while it exists."""
    with database() as url:
        return measure(url, args.arrays, args.array, args.single)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--array", type=int, default=10_000, help="tasks per array (10000)")
    p.add_argument("--arrays", type=int, default=3, help="array submits (3)")
    p.add_argument("--single", type=int, default=2000, help="single submits (2000)")
    p.add_argument("--skip-postgres", action="store_true", help="measure SQLite only")
    p.add_argument(
        "--postgres-url",
        default=POSTGRES_ADMIN_URL,
        help="a PostgreSQL server URL whose user may create databases",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the target is met")
    args = p.parse_args(argv)
    if not 1 <= args.array <= 100_000 or args.arrays < 1 or args.single < 0:
        p.error("--array must be 1-100000 (an array's limit), --arrays ≥ 1, --single ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, dict[str, float] | None] = {
        "sqlite": run(sqlite_url, args),
        "postgres": None
        if args.skip_postgres
        else run(lambda: postgres_url(args.postgres_url), args),
    }
    measured = [r for r in result.values() if r is not None]
    met = all(r["array_per_s"] >= TARGET_ARRAY_PER_S for r in measured)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"submit_throughput: {args.arrays} arrays of {args.array} tasks, "
            f"{args.single} single submits, {os.cpu_count()} CPUs"
        )
        for name, r in result.items():
            if r is None:
                print(f"  {name:<9} skipped")
                continue
            print(
                f"  {name:<9} array {r['array_per_s']:>9.0f} jobs/s"
                f"   single {r['single_per_s']:>7.0f} jobs/s"
            )
        verdict = "met" if met else "NOT met"
        print(f"  target (array ≥ {TARGET_ARRAY_PER_S:,.0f} jobs/s): {verdict}")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
