"""Wall time of ``ebb qsub`` and ``ebb qstat`` as a user meets them: a new process each
call, on SQLite and (when it answers) PostgreSQL, and Slurm's ``sbatch``/``squeue`` beside
them when they are on the machine.

For each store:

1. ``ebb qsub -h -- true`` ``--submits`` times (each a fresh ``ebb`` process);
2. the store filled to ``--jobs`` jobs (``--jobs`` single jobs, through the store, held),
   then ``ebb qstat`` ``--lists`` times, output to /dev/null;
3. one array of ``--jobs`` tasks, then ``ebb qstat`` (shown compressed as ``ID[1-N]``).

Each step twice: with the store opened by every ``ebb`` process, and through an ``ebb
server --socket`` on the same store (``EBBTIDE_URL=unix:///...``: the thin client, which
loads neither SQLAlchemy nor pydantic).

Usage (from the repository root)::

    python benchmarks/cli_latency.py [--submits 20] [--lists 5] [--jobs 10000] [--json]

Prints p50 / p99 / max per command and store; with ``--json`` one object with, per store,
``qsub_p50_s``, ``qsub_p99_s``, ``qsub_max_s``, ``qstat_p50_s``, ``qstat_p99_s``,
``qstat_array_p50_s``, and the same under ``socket`` (and ``slurm`` with
``sbatch_p50_s``/``squeue_p50_s``, or null).
Targets (issue: as fast as the tools it replaces): qsub ≤ 0.150 s, qstat of 10,000 jobs
≤ 0.300 s.  Measured on an idle machine; a busy one inflates every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_stores
from bench_cli import ebb_argv, serve_socket, stats

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return times


def _postgres_url(stack: contextlib.ExitStack) -> str | None:
    """A fresh database on the local PostgreSQL, dropped when ``stack`` closes; None when
    the server does not answer."""
    try:
        return stack.enter_context(bench_stores.postgres_url(PG_ADMIN_URL))
    except Exception:
        return None


def measure(db_url: str, home: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of one store: opened by each ``ebb`` process (``qsub_p50_s``, ...),
    and through ``ebb server`` on a Unix socket (``socket``: the thin client)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env.update({"EBBTIDE_HOME": str(home), "EBBTIDE_DB_URL": db_url})
    ebb = ebb_argv()
    home.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    via: dict[str, Any] = {}
    qsub = [*ebb, "qsub", "-h", "--", "true"]
    out.update(stats("qsub", _timed(qsub, env, args.submits)))
    thin = {**env, "EBBTIDE_URL": f"unix://{home / 'api.sock'}"}
    server = serve_socket(env, home / "api.sock")
    store = Store(db_url)
    try:
        via.update(stats("qsub", _timed(qsub, thin, args.submits)))
        chunk = [JobSpec(command=["true"], hold=True)] * 1000
        for _ in range(args.jobs // 1000):
            for spec in chunk:
                store.submit(spec, "bench", defaults_deadline_s=30)
        out["jobs"] = len(store.list_jobs())
        out.update(stats("qstat", _timed([*ebb, "qstat"], env, args.lists)))
        via.update(stats("qstat", _timed([*ebb, "qstat"], thin, args.lists)))
        store.submit(
            JobSpec(command=["true"], hold=True, array=f"1-{args.jobs}"),
            "bench",
            defaults_deadline_s=30,
        )
        out.update(stats("qstat_array", _timed([*ebb, "qstat"], env, args.lists)))
        via.update(stats("qstat_array", _timed([*ebb, "qstat"], thin, args.lists)))
    finally:
        store.close()
        server.terminate()
        server.wait(timeout=30)
    out["socket"] = via
    return out


def slurm(args: argparse.Namespace) -> dict[str, Any] | None:
    """Slurm beside ebbtide, when ``sbatch`` and a running controller are here."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        return None
    env = dict(os.environ)
    out: dict[str, Any] = {}
    out.update(stats("sbatch", _timed(["sbatch", "-H", "--wrap", "true"], env, args.submits)))
    out.update(stats("squeue", _timed(["squeue", "-r"], env, args.lists)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=20)
    parser.add_argument("--lists", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in the store for qstat")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"targets": {"qsub_p50_s": 0.150, "qstat_p50_s": 0.300}}
    with (
        tempfile.TemporaryDirectory(prefix="ebbtide-cli-latency-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        home = Path(tmp) / "home"
        results["sqlite"] = measure(f"sqlite:///{Path(tmp) / 'cli.db'}", home, args)
        pg = None if args.no_postgres else _postgres_url(stack)
        results["postgresql"] = measure(pg, Path(tmp) / "home-pg", args) if pg else None
    results["slurm"] = slurm(args)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for name in ("sqlite", "postgresql", "slurm"):
        figures = results[name]
        if figures is None:
            print(f"{name:>10}: not measured (not reachable here)")
            continue
        thin = figures.pop("socket", None)
        print(f"{name:>10}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
        if thin is not None:
            print(f"{'  socket':>10}: " + ", ".join(f"{k} {v}" for k, v in thin.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
