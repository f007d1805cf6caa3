"""``ebb qstat`` and ``ebb qstat -f`` against a long history in PostgreSQL: by default
1,000,000 jobs (all but 10,000 of them finished) and 10,000,000 events.

The store is made by ebbtide (``Store(url)``: its tables and indexes), one job of each
kind is submitted through it, and PostgreSQL copies those rows server side
(``INSERT ... SELECT ... FROM generate_series``), so loading takes a minute or two rather
than hours.  Then, with ``time.perf_counter`` around each call:

- ``table``: what ``ebb qstat`` asks of the store (``Client.table`` over the unfinished
  jobs, the default listing), in process;
- ``describe``: what ``ebb qstat -f ID`` asks (``Client.describe``), in process, for
  random jobs, finished or not;
- ``thin``: ``ebb qstat`` as a user runs it through ``ebb server --socket`` (a new
  process each time: the thin client, start-up included), every unfinished job listed;
  ``thin_mine``: ``ebb qstat -u user1``, one user's unfinished jobs (1 in 100).

Usage (from the repository root)::

    python benchmarks/qstat_scale.py [--jobs 1000000] [--active 10000] [--events 10000000]
        [--repeat 20] [--keep] [--json]

``--json`` keys: ``jobs``, ``active``, ``events``, ``load_s``, ``table_p50_s``,
``table_p99_s``, ``describe_p50_s``, ``describe_p99_s``, ``thin_p50_s``, ``thin_p99_s``,
``thin_mine_p50_s``, ``thin_mine_p99_s`` (and a ``_max_s`` beside each p99), ``machine``
(where it ran, see ``bench_machine.py``).
Targets (issue: fleet scale): ``qstat`` ≤ 0.200 s, ``qstat -f`` ≤ 0.050 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_stores
from bench_cli import ebb_argv, serve_socket, stats
from bench_machine import machine

from ebbtide.client import TABLE_COLUMNS, Client
from ebbtide.identity import Caller
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import FINAL_STATES, JobState
from ebbtide.queue.store import Store

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
UNFINISHED = [s for s in JobState if s not in FINAL_STATES]


def load(url: str, jobs: int, active: int, events: int) -> float:
    """``jobs`` jobs (the last ``active`` queued, the rest succeeded; owners ``user0`` to
    ``user99``) and ``events`` events spread over them, copied from one job submitted
    through the store; seconds it took."""
    return bench_stores.fill_jobs(
        url,
        JobSpec(command=["python", "train.py"], env={"K": "v"}),
        jobs=jobs,
        varying={
            "state": "CASE WHEN g <= :finished THEN 'succeeded' ELSE 'queued' END",
            "finished_at": "CASE WHEN g <= :finished THEN 1.7e9 + g ELSE NULL END",
            "submitted_at": "1.7e9 + g",
            "owner": "'user' || (g % 100)",
            "name": "'job-' || g",
        },
        events_insert=(
            "INSERT INTO events (job_id, attempt, type, time, data_json) "
            "SELECT 1 + (g % :jobs), e.attempt, e.type, 1.7e9 + g, e.data_json "
            "FROM generate_series(1, :events) g, etpl e"
        ),
        params={"finished": jobs - active, "events": events},
        last_id=max(jobs, events),
    )


def _timed(call: Any, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def measure(url: str, args: argparse.Namespace, home: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    store = Store(url)
    rng = random.Random(0)
    try:
        client = Client(store=store, caller=Caller("user1"))
        listed = client.table(TABLE_COLUMNS, state=UNFINISHED)
        out["listed"] = len(listed)
        out.update(
            stats(
                "table", _timed(lambda: client.table(TABLE_COLUMNS, state=UNFINISHED), args.repeat)
            )
        )
        ids = [rng.randint(1, args.jobs) for _ in range(args.repeat)]
        out.update(stats("describe", _timed(lambda: client.describe(ids.pop()), args.repeat)))
    finally:
        store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env.update({"EBBTIDE_HOME": str(home), "EBBTIDE_DB_URL": url})
    sock = home / "api.sock"
    server = serve_socket(env, sock)
    try:
        thin = {**env, "EBBTIDE_URL": f"unix://{sock}"}

        def qstat(*flags: str) -> None:
            argv = [*ebb_argv(), "qstat", *flags]
            subprocess.run(argv, env=thin, stdout=subprocess.DEVNULL, check=True)

        runs = max(3, args.repeat // 4)
        out.update(stats("thin", _timed(qstat, runs)))
        out.update(stats("thin_mine", _timed(lambda: qstat("-u", "user1"), runs)))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--active", type=int, default=10_000, help="jobs not finished")
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {"jobs": args.jobs, "active": args.active, "events": args.events}
    result["targets"] = {"table_p50_s": 0.200, "describe_p50_s": 0.050}
    with bench_stores.postgres_url(PG_ADMIN_URL, keep=args.keep) as url:
        if args.keep:
            print(f"the database is kept: {url}", file=sys.stderr)
        result["load_s"] = round(load(url, args.jobs, args.active, args.events), 1)
        with tempfile.TemporaryDirectory(prefix="ebbtide-qstat-scale-") as tmp:
            result.update(measure(url, args, Path(tmp)))
    if args.json:
        print(json.dumps({**result, "machine": machine()}, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
