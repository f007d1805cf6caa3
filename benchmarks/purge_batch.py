"""Time of one retention batch (``Store.purge``), on SQLite and PostgreSQL.

Builds a store with a long history: ``--history`` finished jobs (20,000; one in ten a
task of a finished 100-task array), each with one attempt and six events (submitted,
dispatched, started, two checkpoints, the end), finished over the last 60 days; beside
them ``--active`` queued jobs (2,000), one in ten held with a dependency on a finished
job (which must stay).  Then purges everything older than 30 days, ``--batch`` jobs
(1,000) per transaction, and times each batch: the read that chooses it and the
transaction that removes it (the one a scheduler's write may wait for).  Meanwhile a
thread writes a node heartbeat every 10 ms, as an agent does, and records how long each
waited: the longest wait is what a purge costs the rest of the system.

SQLite: a new database file in a temporary directory.  PostgreSQL: a fresh database on
the server of ``--postgres-url`` (default ``$EBBTIDE_TEST_POSTGRES_URL`` or
``postgresql+psycopg://postgres@127.0.0.1:5432/test``), dropped at the end;
``--skip-postgres`` without one.

Usage (from the repository root)::

    python benchmarks/purge_batch.py [--history 20000] [--active 2000] [--batch 1000]
        [--skip-postgres] [--json]

Prints, per backend, the batches, the p50 and max time of one batch's removing
transaction and of its choosing read, the whole purge, and the longest heartbeat wait;
with ``--json`` exactly one JSON object.  ``--check`` exits 1 unless one batch's
transaction takes at most 1 s (p50 and max) on every backend.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import bench_stores
import sqlalchemy as sa

from ebbtide.clock import FakeClock
from ebbtide.queue.purge import PURGE_PAUSE_S
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.queue.store.purge import ATTEMPTS, EVENTS, JOBS, Purger

#: Target: one batch's removing transaction, in seconds.
TARGET_BATCH_S = 1.0
DAY_S = 86400.0
#: The store's clock at the end of the history (Unix seconds).
NOW = 1_700_000_000.0 + 60 * DAY_S
#: Events each finished job has.
EVENT_TYPES = ("submitted", "dispatched", "started", "checkpointed", "checkpointed", "succeeded")
ARRAY_TASKS = 100
OWNER = "bench"
POSTGRES_ADMIN_URL = os.environ.get(
    "EBBTIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def sqlite_url() -> AbstractContextManager[str]:
    return bench_stores.sqlite_url("ebbtide-purge-bench-")


postgres_url = bench_stores.postgres_url


def build(store: Store, history: int, active: int) -> list[int]:
    """The history and the active jobs (see the module doc); the ids the held jobs need."""
    spec = JobSpec(name="train", command=["python", "train.py"], gpu="25%", gpumem="4GiB")
    chunk = 10_000
    ids: list[int] = []
    while len(ids) < history:
        n = min(chunk, history - len(ids))
        array = JobSpec(**spec.model_dump(exclude_unset=True), array={"start": 1, "end": n})
        ids += store.submit(array, OWNER, defaults_deadline_s=30.0)
    arrays = [ids[i : i + ARRAY_TASKS] for i in range(0, history // 10, ARRAY_TASKS)]
    in_array = {task for tasks in arrays for task in tasks}
    assert ids == list(range(ids[0], ids[0] + history))  # one range of ids
    step = 60 * DAY_S / history
    with store.engine.begin() as conn:
        conn.execute(
            JOBS.update()
            .where(JOBS.c.id.between(ids[0], ids[-1]))
            .values(state="succeeded", attempts=1, array_id=None, array_index=None)
        )
        for tasks in arrays:
            conn.execute(
                JOBS.update()
                .where(JOBS.c.id.in_(tasks))
                .values(array_id=tasks[0], array_limit=None)
            )
        finished = [
            {"id_": job_id, "at": NOW - 60 * DAY_S + i * step} for i, job_id in enumerate(ids)
        ]
        conn.execute(
            JOBS.update()
            .where(JOBS.c.id == sa.bindparam("id_"))
            .values(finished_at=sa.bindparam("at"), submitted_at=sa.bindparam("at")),
            finished,
        )
        conn.execute(EVENTS.delete().where(EVENTS.c.job_id.between(ids[0], ids[-1])))
        conn.execute(
            ATTEMPTS.insert(),
            [
                {
                    "job_id": f["id_"],
                    "number": 1,
                    "node": "gpu-a",
                    "devices": "0",
                    "compute_pct": 25.0,
                    "memory_mib": 4096,
                    "dispatched_at": f["at"] - 3600,
                    "started_at": f["at"] - 3590,
                    "ended_at": f["at"],
                    "outcome": "succeeded",
                    "exit_code": 0,
                }
                for f in finished
            ],
        )
        conn.execute(
            EVENTS.insert(),
            [
                {
                    "job_id": f["id_"],
                    "attempt": None if kind == "submitted" else 1,
                    "type": kind,
                    "time": f["at"] - 3600 + k,
                    "data_json": json.dumps({"by": OWNER} if kind == "submitted" else {}),
                }
                for f in finished
                for k, kind in enumerate(EVENT_TYPES)
            ],
        )
    singles = ids[len(in_array) :]
    held = max(1, active // 10)
    needed = singles[:: max(1, len(singles) // held)][:held]
    for dep in needed:
        depends = [{"kind": "afterok", "job_id": dep}]
        store.submit(
            JobSpec(command=["x"], hold=True, depends=depends), OWNER, defaults_deadline_s=30
        )
    queued = JobSpec(command=["x"], array={"start": 1, "end": active - len(needed)})
    store.submit(queued, OWNER, defaults_deadline_s=30.0)
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))
    return needed


def measure(url: str, history: int, active: int, batch: int) -> dict[str, Any]:
    store = Store(url, clock=FakeClock(NOW))
    try:
        build(store, history, active)
        with store.engine.connect() as conn:
            before = {
                t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in (JOBS, ATTEMPTS, EVENTS)
            }
        waits: list[float] = []
        stop = threading.Event()
        beats = Store(url, clock=FakeClock(NOW), migrate=False)

        def heartbeat() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                beats.heartbeat("gpu-a", started_at=0.0, devices=[])
                waits.append(time.perf_counter() - started)
                stop.wait(0.01)

        beating = threading.Thread(target=heartbeat)
        beating.start()
        time.sleep(0.2)
        quiet = list(waits)
        purger = Purger(
            NOW - 30 * DAY_S,
            batch=batch,
            dry_run=False,
            postgres=store.engine.dialect.name == "postgresql",
        )
        reads: list[float] = []
        removes: list[float] = []
        jobs = attempts = events = 0
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            with store._read() as conn:
                more = purger.select(conn)
            reads.append(time.perf_counter() - t0)
            if not more:
                break
            t0 = time.perf_counter()
            with store._tx() as conn:
                step = purger.remove(conn)
            removes.append(time.perf_counter() - t0)
            jobs, attempts, events = (
                jobs + step.jobs,
                attempts + step.attempts,
                events + step.events,
            )
            time.sleep(PURGE_PAUSE_S)
        total_s = time.perf_counter() - started
        stop.set()
        beating.join()
        beats.close()
        during = waits[len(quiet) :]
    finally:
        store.close()
    return {
        "jobs_before": before["jobs"],
        "events_before": before["events"],
        "purged": {"jobs": jobs, "attempts": attempts, "events": events},
        "batch": batch,
        "batches": len(removes),
        "batch_p50_s": round(statistics.median(removes), 4),
        "batch_max_s": round(max(removes), 4),
        "choose_p50_s": round(statistics.median(reads), 4),
        "choose_max_s": round(max(reads), 4),
        "purge_s": round(total_s, 3),
        "heartbeat_quiet_max_s": round(max(quiet), 4) if quiet else None,
        "heartbeat_during_max_s": round(max(during), 4) if during else None,
        "heartbeat_during_p50_s": round(statistics.median(during), 4) if during else None,
    }


def run(
    database: Callable[[], AbstractContextManager[str]], args: argparse.Namespace
) -> dict[str, Any]:
    with database() as url:
        return measure(url, args.history, args.active, args.batch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--history", type=int, default=20_000, help="finished jobs (20000)")
    p.add_argument("--active", type=int, default=2000, help="queued and held jobs (2000)")
    p.add_argument("--batch", type=int, default=1000, help="jobs per batch (1000)")
    p.add_argument("--skip-postgres", action="store_true", help="measure SQLite only")
    p.add_argument(
        "--postgres-url",
        default=POSTGRES_ADMIN_URL,
        help="a PostgreSQL server URL whose user may create databases",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the target is met")
    args = p.parse_args(argv)
    if args.history < 1000 or args.active < 10 or not 1 <= args.batch <= 10_000:
        p.error("--history ≥ 1000, --active ≥ 10, --batch 1-10000")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {
        "sqlite": run(sqlite_url, args),
        "postgres": None
        if args.skip_postgres
        else run(lambda: postgres_url(args.postgres_url), args),
    }
    measured = [r for r in result.values() if r is not None]
    met = all(r["batch_max_s"] <= TARGET_BATCH_S for r in measured)
    if args.json:
        print(json.dumps(result))
        return 1 if args.check and not met else 0
    print(
        f"purge_batch: {args.history} finished jobs (6 events, 1 attempt each), "
        f"{args.active} active, older than 30 days purged {args.batch} per batch, "
        f"{os.cpu_count()} CPUs"
    )
    for name, r in result.items():
        if r is None:
            print(f"  {name:<9} skipped")
            continue
        p = r["purged"]
        print(
            f"  {name:<9} {p['jobs']} jobs, {p['attempts']} attempts, {p['events']} events in "
            f"{r['batches']} batches, {r['purge_s']:.2f}s"
        )
        print(
            f"  {'':<9} one batch's transaction p50 {r['batch_p50_s'] * 1000:.0f} ms, max "
            f"{r['batch_max_s'] * 1000:.0f} ms; choosing it p50 {r['choose_p50_s'] * 1000:.0f} ms"
        )
        print(
            f"  {'':<9} a heartbeat's longest wait: {r['heartbeat_during_max_s'] * 1000:.0f} ms "
            f"during the purge, {r['heartbeat_quiet_max_s'] * 1000:.0f} ms before it"
        )
    print(f"  target (one batch ≤ {TARGET_BATCH_S:g} s): {'met' if met else 'NOT met'}")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
