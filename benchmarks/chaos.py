"""Chaos: real schedulers, workers and jobs on real Redis and PostgreSQL, under faults.

One run: a private Redis (``redis-server`` on a free port), a fresh PostgreSQL database
on the server at ``--pg`` (default ``127.0.0.1:5432``), two ``ebb scheduler`` processes
(one active, one standing by) and ``--workers`` ``ebb worker`` processes with two
simulated 80 GiB devices each, whose online load (a replayed trace) spikes every 25 s so
that evictions happen all along.  ``--jobs`` jobs (``benchmarks/chaos_job.py``: count to
N with checkpoints) are submitted: cooperative ones, bash wrappers whose Python child does
the work (and leaves a background process behind), stubborn ones that ignore the warning
and are killed at the deadline, and one that writes garbage to its status file.

For ``--duration-s`` seconds a fault is injected every ``--fault-every-s`` (seeded):

- ``kill9_scheduler`` (the active one) / ``kill9_standby``: ``kill -9``, restarted later;
- ``stop_scheduler``: SIGSTOP for 3 s, then SIGCONT;
- ``kill9_worker``: ``kill -9`` of a worker, restarted after 1 s;
- ``stop_worker``: SIGSTOP of a worker for longer than the heartbeat timeout, then
  SIGCONT (its jobs must be dead before they run elsewhere);
- ``kill_job``: ``kill -9`` of one running job process;
- ``redis_restart``: Redis killed and restarted empty;
- ``pg_terminate``: every PostgreSQL connection to the database terminated.

Then it waits (``--drain-s``) for every job to end and reports, from the store and from
the jobs' own records of when they were alive:

- ``lost``: jobs that did not succeed (failed, cancelled, or gone);
- ``double_run_s``: seconds during which two processes of one job were alive at once;
- ``wrong_results``: succeeded jobs whose count is not exactly N;
- ``deadline_misses``: evictions whose slice was freed after their deadline;
- ``stuck``: jobs not finished when the drain time ran out.

Required: all zero.  ``--json`` prints one JSON object; exit 1 if any is not zero.

    python benchmarks/chaos.py [--jobs 100] [--duration-s 90] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
JOB = Path(__file__).resolve().parent / "chaos_job.py"
EBB = [sys.executable, "-m", "ebbtide.cli.main"]

#: Seconds between two spikes of one device's online load, and how long one lasts.
SPIKE_EVERY_S = 25.0
SPIKE_FOR_S = 4.0
#: How long a stopped worker stays stopped: beyond the heartbeat timeout (4 s).
WORKER_STOP_S = 6.0
SCHEDULER_STOP_S = 3.0

FAULTS = (
    "kill9_scheduler",
    "kill9_standby",
    "stop_scheduler",
    "kill9_worker",
    "stop_worker",
    "kill_job",
    "redis_restart",
    "pg_terminate",
)

POLICY = """\
apiVersion: ebbtide/v1
defaults:
  deadline_s: 3s
  heartbeat_timeout_s: 4s
  dispatch_timeout_s: 8s
  eviction_cooldown_s: 1s
  backoff_base_s: 1s
  backoff_max_s: 4s
  forecast_warmup_s: 0s
  forecast_history_s: 10s
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spike_trace(path: Path, devices: int, duration_s: float) -> None:
    """Online load per device: quiet, with a memory spike every 25 s (offset per device)
    for the first ``duration_s`` seconds of the replay."""
    rows = ["t_s,device,online_compute_pct,online_memory_mib"]
    for d in range(devices):
        rows.append(f"0,{d},5,2048")
        t = 5.0 + d * SPIKE_EVERY_S / devices
        while t < duration_s:
            rows.append(f"{t:.1f},{d},30,79000")
            rows.append(f"{t + SPIKE_FOR_S:.1f},{d},5,2048")
            t += SPIKE_EVERY_S
    path.write_text("\n".join(rows) + "\n")


@dataclass
class Proc:
    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.args,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def stop(self, timeout_s: float = 30.0) -> None:
        if not self.alive():
            return
        assert self.popen is not None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait()


@dataclass
class Chaos:
    root: Path
    pg_admin: str
    workers: int
    seed: int
    duration_s: float
    fault_every_s: float
    log: Any = None
    rng: random.Random = field(init=False)
    faults: Counter[str] = field(default_factory=Counter)
    procs: dict[str, Proc] = field(default_factory=dict)
    pending: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.db = f"ebbtide_chaos_{uuid.uuid4().hex[:10]}"
        self.db_url = f"{self.pg_admin.rsplit('/', 1)[0]}/{self.db}"
        self.redis_port = free_port()
        self.redis: subprocess.Popen[bytes] | None = None
        (self.root / "live").mkdir(parents=True)
        (self.root / "logs").mkdir()
        (self.root / "ckpt").mkdir()

    # -- the cluster --------------------------------------------------------------------

    def say(self, text: str) -> None:
        if self.log is not None:
            print(f"{time.strftime('%H:%M:%S')} {text}", file=self.log, flush=True)

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.2),
            ):
                return
            time.sleep(0.05)
        raise SystemExit(f"chaos: redis-server did not start on port {self.redis_port}")

    def stop_redis(self) -> None:
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait()

    def create_db(self) -> None:
        admin = sa.create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.db}"'))
        admin.dispose()

    def drop_db(self) -> None:
        admin = sa.create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)'))
        admin.dispose()

    def env(self, home: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
        env.update(
            EBBTIDE_HOME=str(self.root / home),
            EBBTIDE_DB_URL=self.db_url,
            EBBTIDE_REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
            EBBTIDE_POLICY=str(self.root / "policy.yaml"),
            PYTHONUNBUFFERED="1",
        )
        return env

    def start_cluster(self) -> None:
        (self.root / "policy.yaml").write_text(POLICY)
        spike_trace(self.root / "online.csv", 2, self.duration_s)
        self.start_redis()
        self.create_db()
        for name in ("sched-a", "sched-b"):
            self.procs[name] = Proc(
                name, [*EBB, "scheduler"], self.env(name), self.root / "logs" / f"{name}.log"
            )
        for k in range(1, self.workers + 1):
            name = f"w{k}"
            args = [
                *EBB,
                "worker",
                "--node",
                name,
                "--devices",
                "2x80GiB",
                "--headroom",
                f"trace:{self.root / 'online.csv'}",
                # the jobs are this script's user's (root's, in CI): run them as the
                # workers' user, not refused as root jobs
                "--run-as",
                "agent",
            ]
            self.procs[name] = Proc(name, args, self.env(name), self.root / "logs" / f"{name}.log")
        self.procs["sched-a"].start()
        time.sleep(1.5)  # a leads, b stands by
        for name, p in self.procs.items():
            if name != "sched-a":
                p.start()

    def stop_cluster(self) -> None:
        for p in self.procs.values():
            p.signal(signal.SIGCONT)
        for name in [n for n in self.procs if n.startswith("w")]:
            self.procs[name].stop()
        for name in ("sched-a", "sched-b"):
            self.procs[name].stop()
        self.stop_redis()

    # -- faults -------------------------------------------------------------------------

    def active_scheduler(self) -> Proc | None:
        engine = sa.create_engine(self.db_url.replace("postgresql://", "postgresql+psycopg://"))
        try:
            with engine.connect() as conn:
                holder = conn.execute(sa.text("SELECT holder FROM leadership")).scalar() or ""
        except Exception:
            return None
        finally:
            engine.dispose()
        pid = holder.rpartition(":")[2]
        for name in ("sched-a", "sched-b"):
            p = self.procs[name]
            if p.alive() and str(p.pid) == pid:
                return p
        return None

    def inject(self, now: float) -> None:
        kind = self.rng.choice(FAULTS)
        schedulers = [self.procs["sched-a"], self.procs["sched-b"]]
        workers = [p for n, p in self.procs.items() if n.startswith("w") and p.alive()]
        active = self.active_scheduler()
        if kind in ("kill9_scheduler", "stop_scheduler") and active is None:
            kind = "kill_job"
        if kind == "kill9_scheduler" and active is not None:
            active.signal(signal.SIGKILL)
            self.later(now + 2.0, f"start:{active.name}")
        elif kind == "kill9_standby":
            standby = [p for p in schedulers if p.alive() and p is not active]
            if not standby:
                kind = "kill_job"
            else:
                standby[0].signal(signal.SIGKILL)
                self.later(now + 2.0, f"start:{standby[0].name}")
        elif kind == "stop_scheduler" and active is not None:
            active.signal(signal.SIGSTOP)
            self.later(now + SCHEDULER_STOP_S, f"cont:{active.name}")
        elif kind == "kill9_worker" and workers:
            victim = self.rng.choice(workers)
            victim.signal(signal.SIGKILL)
            self.later(now + 1.0, f"start:{victim.name}")
        elif kind == "stop_worker" and workers:
            victim = self.rng.choice(workers)
            victim.signal(signal.SIGSTOP)
            self.later(now + WORKER_STOP_S, f"cont:{victim.name}")
        elif kind == "redis_restart":
            self.stop_redis()
            self.start_redis()
        elif kind == "pg_terminate":
            admin = sa.create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": self.db},
                )
            admin.dispose()
        if kind == "kill_job" or (kind in ("kill9_worker", "stop_worker") and not workers):
            kind = "kill_job"
            jobs = job_processes()
            if jobs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.rng.choice(jobs), signal.SIGKILL)
        self.faults[kind] += 1
        self.say(f"fault: {kind}")

    def later(self, at: float, action: str) -> None:
        self.pending.append((at, action))

    def run_pending(self, now: float) -> None:
        due = [(t, a) for t, a in self.pending if t <= now]
        self.pending = [(t, a) for t, a in self.pending if t > now]
        for _, action in due:
            verb, _, name = action.partition(":")
            p = self.procs[name]
            if verb == "start" and not p.alive():
                p.start()
            elif verb == "cont":
                p.signal(signal.SIGCONT)

    def flush_pending(self) -> None:
        self.run_pending(float("inf"))


def job_processes() -> list[int]:
    """Pids of running chaos jobs (the Python processes doing the work)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"chaos_job.py") for part in cmd) and b"-I" not in cmd:
            out.append(int(entry))
    return out


# -- the jobs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobPlan:
    name: str
    kind: str  # cooperative, wrapper, stubborn, garbage
    steps: int


def plan_jobs(n: int, rng: random.Random) -> list[JobPlan]:
    plans = [JobPlan("garbage", "garbage", 60)]
    for k in range(n - 1):
        kind = rng.choices(["cooperative", "wrapper", "stubborn"], [0.6, 0.25, 0.15])[0]
        plans.append(JobPlan(f"j{k:03d}", kind, rng.randint(60, 160)))
    return plans


def submit(chaos: Chaos, plans: list[JobPlan]) -> dict[int, JobPlan]:
    from ebbtide.client import Client
    from ebbtide.config.settings import Settings
    from ebbtide.queue.spec import JobSpec

    settings = Settings.from_env(chaos.env("client"))
    ids = {}
    with Client(settings) as client:
        for p in plans:
            argv = [sys.executable, str(JOB), str(p.steps), str(chaos.root / "live"), p.name]
            if p.kind == "stubborn":
                argv.append("--stubborn")
            if p.kind == "garbage":
                argv.append("--garbage")
            command = (
                ["bash", "-c", "sleep 600 & " + " ".join(argv)] if p.kind == "wrapper" else argv
            )
            spec = JobSpec(
                name=p.name,
                command=command,
                gpu="20%",
                gpumem="8GiB",
                deadline="2s" if p.kind == "stubborn" else "3s",
                checkpoint_dir=str(chaos.root / "ckpt" / p.name),
                max_attempts=3,
            )
            ids[client.submit(spec)] = p
    return ids


def wait_done(chaos: Chaos, ids: dict[int, JobPlan], drain_s: float) -> dict[int, str]:
    engine = sa.create_engine(chaos.db_url.replace("postgresql://", "postgresql+psycopg://"))
    give_up = time.monotonic() + drain_s
    states: dict[int, str] = {}
    try:
        while time.monotonic() < give_up:
            chaos.flush_pending()
            with contextlib.suppress(Exception), engine.connect() as conn:
                states = dict(conn.execute(sa.text("SELECT id, state FROM jobs")).all())
            if states and all(s in ("succeeded", "failed", "cancelled") for s in states.values()):
                break
            time.sleep(1.0)
    finally:
        engine.dispose()
    return states


# -- the verdict ------------------------------------------------------------------------


def live_intervals(path: Path) -> list[tuple[int, float, float]]:
    """(pid, first, last) seen alive, per process of one job."""
    spans: dict[int, list[float]] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        parts = line.split()
        try:
            if parts[0] == "start":
                pid, t = int(parts[1]), float(parts[3])
            else:
                pid, t = int(parts[0]), float(parts[1])
        except (IndexError, ValueError):
            continue
        span = spans.setdefault(pid, [t, t])
        span[0], span[1] = min(span[0], t), max(span[1], t)
    return [(pid, a, b) for pid, (a, b) in spans.items()]


def overlap_s(intervals: list[tuple[int, float, float]]) -> float:
    """Seconds during which two of these processes were alive at once."""
    total = 0.0
    for i, (_, a1, b1) in enumerate(intervals):
        for _, a2, b2 in intervals[i + 1 :]:
            total += max(0.0, min(b1, b2) - max(a1, a2))
    return total


#: What the report says of an eviction that missed its deadline.
MISS_KEYS = (
    "reason_code",
    "deadline_s",
    "latency_s",
    "killed",
    "spike_at",
    "warned_at",
    "freed_at",
)


def verdict(chaos: Chaos, ids: dict[int, JobPlan], states: dict[int, str]) -> dict[str, Any]:
    engine = sa.create_engine(chaos.db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        events = conn.execute(
            sa.text("SELECT job_id, type, data_json FROM events WHERE type IN ('evicted', 'lost')")
        ).all()
    engine.dispose()
    missed = [
        {"job": ids[j].name if j in ids else j, **{k: json.loads(d).get(k) for k in MISS_KEYS}}
        for j, t, d in events
        if t == "evicted" and json.loads(d).get("deadline_missed")
    ]
    misses = len(missed)
    evictions = sum(1 for _, t, _ in events if t == "evicted")
    lost_attempts = sum(1 for _, t, _ in events if t == "lost")
    final = ("succeeded", "failed", "cancelled")
    lost = [ids[j].name for j in ids if states.get(j) in ("failed", "cancelled") or j not in states]
    stuck = [ids[j].name for j in ids if j in states and states[j] not in final]
    wrong, double = [], {}
    for job_id, plan in ids.items():
        live = chaos.root / "live"
        both = overlap_s(live_intervals(live / f"{plan.name}.live"))
        if both > 0:
            double[plan.name] = round(both, 3)
        if states.get(job_id) == "succeeded":
            try:
                count = json.loads((live / f"{plan.name}.result").read_text())["count"]
            except (OSError, ValueError, KeyError):
                count = None
            if count != plan.steps:
                wrong.append(plan.name)
    return {
        "jobs": len(ids),
        "lost": len(lost),
        "double_run_s": round(sum(double.values()), 3),
        "wrong_results": len(wrong),
        "deadline_misses": misses,
        "stuck": len(stuck),
        "evictions": evictions,
        "lost_attempts_requeued": lost_attempts,
        "faults": dict(sorted(chaos.faults.items())),
        "restarts": {n: p.starts - 1 for n, p in chaos.procs.items() if p.starts > 1},
        "detail": {
            "lost": lost,
            "stuck": stuck,
            "wrong": wrong,
            "double_runs": double,
            "deadline_misses": missed,
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ebbtide-chaos-"))
    log = sys.stderr if args.verbose else None
    chaos = Chaos(root, args.pg, args.workers, args.seed, args.duration_s, args.fault_every_s, log)
    started = time.monotonic()
    try:
        chaos.start_cluster()
        ids = submit(chaos, plan_jobs(args.jobs, random.Random(args.seed)))
        chaos.say(f"{len(ids)} jobs submitted; faults for {args.duration_s:g}s")
        end = time.monotonic() + args.duration_s
        next_fault = time.monotonic() + args.fault_every_s
        while time.monotonic() < end:
            now = time.monotonic()
            chaos.run_pending(now)
            if now >= next_fault:
                chaos.inject(now)
                next_fault = now + args.fault_every_s
            time.sleep(0.2)
        chaos.flush_pending()
        chaos.say("faults over; waiting for every job to end")
        states = wait_done(chaos, ids, args.drain_s)
        report = verdict(chaos, ids, states)
    finally:
        chaos.stop_cluster()
        with contextlib.suppress(Exception):
            chaos.drop_db()
        for pid in job_processes():  # nothing of ours may outlive the run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if args.keep:
            print(f"chaos: kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    report["config"] = {
        "jobs": args.jobs,
        "workers": args.workers,
        "duration_s": args.duration_s,
        "fault_every_s": args.fault_every_s,
        "seed": args.seed,
    }
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100, help="jobs to run (100)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--duration-s", type=float, default=90.0, help="fault phase (90)")
    p.add_argument("--fault-every-s", type=float, default=6.0, help="seconds between faults (6)")
    p.add_argument("--drain-s", type=float, default=240.0, help="time for jobs to end (240)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pg",
        default=os.environ.get(
            "EBBTIDE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
        help="an existing database on the PostgreSQL server (a new one is made beside it)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--keep", action="store_true", help="keep the run's directory")
    p.add_argument("--verbose", action="store_true", help="say what happens on stderr")
    args = p.parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("chaos: needs redis-server on PATH (it runs a private Redis)")
    args.pg = args.pg.replace("postgresql+psycopg://", "postgresql://")
    report = run(args)
    ok = all(
        report[k] == 0
        for k in ("lost", "double_run_s", "wrong_results", "deadline_misses", "stuck")
    )
    if args.json:
        print(json.dumps(report))
    else:
        for key in (
            "jobs",
            "lost",
            "double_run_s",
            "wrong_results",
            "deadline_misses",
            "stuck",
            "evictions",
            "lost_attempts_requeued",
            "elapsed_s",
        ):
            print(f"{key:>24}  {report[key]}")
        print(f"{'faults':>24}  {report['faults']}")
        if not ok:
            print(f"{'detail':>24}  {report['detail']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
