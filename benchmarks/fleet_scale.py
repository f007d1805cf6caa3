"""A fleet against one real scheduler: how hard PostgreSQL and Redis work, and how fast
the scheduler passes and dispatches, with ``--agents`` simulated node agents (8 GPUs
each) in this process.

What is real: one :class:`~ebbtide.scheduling.loop.Scheduler` with its loop, leader lock
and store on a fresh PostgreSQL database (``bench_stores.postgres_url``), in a process of
its own, sending its commands on dramatiq queues in Redis (a private key namespace,
removed afterwards), woken by the agents' events and reading their liveness from Redis
(:mod:`ebbtide.messaging.liveness`; ``--no-liveness``: from the store alone, as before);
each simulated agent's store work is a real :class:`~ebbtide.workers.sync.StoreSync`
(its journal, deliveries, heartbeat rules and touches, starts and reconciliation),
driven by :meth:`~ebbtide.workers.sync.StoreSync.pump` from a few driver threads instead
of a thread of its own.

What is simulated: each device's online load (a seeded mean-reverting random walk, and
now and then a spike that lasts ``--spike-s``: the scheduler sees the room shrink and
evicts), the jobs (they run ``--job-s`` seconds, report a checkpoint and progress every
``--checkpoint-s``, and free their slice a moment after an eviction's warning), and the
agents' command consumers.  A real agent's dramatiq worker polls its queue and the
queue's delay queue, backing off to ``WORKER_TIMEOUT_MS`` while idle; a thread per
consumer for a thousand agents does not fit one process, so one poller, in a process of
its own, keeps each agent's two consumers' schedules (dramatiq's ``compute_backoff``,
capped as the bus caps it, or by ``--poll-cap-ms``) and runs the due fetches (the
broker's own Lua ``fetch``, one broker id per agent) pipelined.  Redis sees the
commands a fleet of agents sends; if the poller falls behind, the fetch rate it reached
is below the due one (``fetches_per_s`` against ``fetches_due_per_s``).  The agents'
ticks are what this process does; how late they came (``agent_tick_late_p99_s``) says
whether the machine kept up with the fleet it simulates: ``harness_kept_up`` is false
(and a warning says so) when they came later than the reader mark lives (2.5 s), as
then agents miss it and write to the store as if Redis were not read.

A steady stream of ``--submit-rate`` jobs a second (slices of 10-40 % and 4-16 GiB) is
submitted through the store.  After ``--warmup`` seconds, ``--seconds`` are measured:

- pass time: ``run_once`` timed in the scheduler's own loop (p50, p99);
- dispatch latency: submission to the agent holding its start: its command taken off its
  queue, or the start found by its reconciliation, whichever is first (p50, p99);
- SQL writes per second: INSERT/UPDATE/DELETE statements sent by every engine of the
  agents, the clients and the scheduler (counted at the cursor), with
  ``pg_stat_database``'s transactions and rows written for the database beside them;
- Redis commands per second: ``INFO stats`` ``total_commands_processed`` (the server's:
  another user of the same Redis counts too; commands inside Lua scripts count one each).

Usage (from the repository root; PostgreSQL and Redis as the tests use them)::

    python benchmarks/fleet_scale.py [--agents 1000] [--seconds 60] [--warmup 30]
        [--submit-rate 5] [--every-heartbeat] [--no-liveness] [--poll-cap-ms MS] [--json]

``--every-heartbeat`` writes every heartbeat as before (for a before/after).  Prints a
table; with ``--json`` exactly one JSON object (keys include ``agents``, ``pass_p50_s``,
``pass_p99_s``, ``dispatch_p99_s``, ``sql_writes_per_s``, ``redis_ops_per_s``, and
``machine``: where it ran, see ``bench_machine.py``).  Targets (issue: fleet scale): pass
p99 ≤ 1 s, dispatch p99 ≤ 2 s, SQL writes ≤ 500/s.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import queue
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_stores
import redis
import sqlalchemy as sa
from bench_cli import stats
from bench_machine import machine
from dramatiq.common import compute_backoff, dq_name
from dramatiq.message import Message

from ebbtide.config.policy import Policy
from ebbtide.messaging.bus import WORKER_TIMEOUT_MS, Bus
from ebbtide.messaging.liveness import READER_TTL_MS, RedisLiveness
from ebbtide.messaging.messages import (
    DeviceReport,
    EvictAttempt,
    StartAttempt,
    parse_node_command,
)
from ebbtide.preemption.enforcer import EvictionClock
from ebbtide.preemption.victims import EvictReason
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.leader import LeaderLock
from ebbtide.scheduling.loop import Scheduler
from ebbtide.workers.heartbeat import HeartbeatRules
from ebbtide.workers.journal import Journal
from ebbtide.workers.sync import Kill, Prepared, StoreSync

PG_ADMIN_URL = os.environ.get(
    "EBBTIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("EBBTIDE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
GPUS_PER_NODE = 8
DEVICE_MIB = 80 * 1024
#: How often a simulated agent heartbeats and looks at its attempts, in seconds.
TICK_S = 0.5
#: Threads that run the simulated agents.
DRIVERS = 4
#: Memory spikes are a share of the device.
PRESSURE = {EvictReason.ONLINE_MEMORY.value, EvictReason.ONLINE_COMPUTE.value}


@dataclass
class Running:
    job_id: int
    attempt: int
    devices: tuple[int, ...]
    started_at: float
    ends_at: float
    next_checkpoint: float
    last_checkpoint_at: float | None = None
    eviction: EvictionClock | None = None
    frees_at: float = 0.0


class Figures:
    """What the run measured, shared by every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.submitted: dict[int, float] = {}
        self.dispatch_s: list[float] = []
        self.passes: list[float] = []
        self.measuring = False
        self.counts: collections.Counter[str] = collections.Counter()
        self.tick_late_s: list[float] = []

    def count(self, what: str, n: int = 1) -> None:
        if self.measuring:
            with self.lock:
                self.counts[what] += n

    def started(self, job_id: int) -> None:
        with self.lock:
            at = self.submitted.pop(job_id, None)
            if at is not None and self.measuring:
                self.dispatch_s.append(time.time() - at)


class SimAgent:
    def __init__(
        self,
        name: str,
        store: Store,
        bus: Bus,
        rules: HeartbeatRules,
        rng: random.Random,
        args: argparse.Namespace,
        figures: Figures,
        liveness: RedisLiveness | None,
    ) -> None:
        self.name = name
        self.rng = rng
        self.args = args
        self.figures = figures
        self.base = [(rng.uniform(5, 40), rng.uniform(4096, 32768)) for _ in range(GPUS_PER_NODE)]
        self.online = list(self.base)
        self.spike_until = [0.0] * GPUS_PER_NODE
        self.last_eviction_at: dict[int, float] = {}
        self.attempts: dict[int, Running] = {}
        self.inbox: collections.deque[Any] = collections.deque()
        self.journal = Journal(None)
        self.started_at = time.time()
        self.payload: dict[str, Any] = {}
        self.templates = [
            DeviceReport(index=i, memory_mib=DEVICE_MIB).model_dump(mode="json")
            for i in range(GPUS_PER_NODE)
        ]
        self.sync = StoreSync(
            name,
            store,
            self.journal,
            post=self.inbox.append,
            view=self.view,
            heartbeat=lambda: self.payload,
            notify=bus.notify_scheduler,
            heartbeat_rules=rules,
            liveness=liveness,
        )
        self.sync.started_at = self.started_at
        self.next_tick = time.monotonic() + rng.uniform(0, TICK_S)

    def view(self) -> tuple[int, dict[int, tuple[int, bool]]]:
        return self.journal.seq, {
            r.job_id: (r.attempt, r.eviction is not None) for r in self.attempts.values()
        }

    def command(self, cmd: StartAttempt | EvictAttempt) -> None:
        """A command from this node's queue (the poller's thread)."""
        if isinstance(cmd, StartAttempt):
            self.figures.started(cmd.job_id)
            self.sync.request_start(cmd)
        else:
            self.inbox.append(cmd)
        self.next_tick = time.monotonic()  # a real agent's store thread takes it at once

    def tick(self, now: float) -> None:
        while self.inbox:
            self.take(self.inbox.popleft(), now)
        for r in list(self.attempts.values()):
            self.watch(r, now)
        self.walk(now)
        self.payload = {
            "started_at": self.started_at,
            "devices": self.devices(now),
            "stopping": False,
        }
        self.journal.append("heartbeat")
        self.sync.pump()
        while self.inbox:  # starts the store work just prepared
            self.take(self.inbox.popleft(), now)

    def take(self, item: Any, now: float) -> None:
        if isinstance(item, Prepared):
            job = item.job
            if job.id in self.attempts:
                return
            self.figures.started(job.id)
            devices = tuple(int(d) for d in (job.devices or "").split(",") if d)
            run_s = self.rng.uniform(*self.args.job_s)
            self.attempts[job.id] = Running(
                job.id, job.attempts, devices, now, now + run_s, now + self.args.checkpoint_s
            )
            self.journal.append(
                "mark_started",
                job_id=job.id,
                attempt=job.attempts,
                pid=None,
                stdout_path="/dev/null",
                stderr_path="/dev/null",
            )
        elif isinstance(item, EvictAttempt):
            r = self.attempts.get(item.job_id)
            if r is None or r.attempt != item.attempt or r.eviction is not None:
                return
            r.eviction = EvictionClock(
                reason=item.reason,
                message=item.message,
                spike_at=item.spike_at or now,
                deadline_s=item.deadline_s if item.deadline_s is not None else 30.0,
                warned_at=now,
            )
            r.frees_at = now + self.rng.uniform(0.2, 2.0)  # it checkpoints and exits
            self.figures.count("evictions")
        elif isinstance(item, Kill):
            self.attempts.pop(item.job_id, None)

    def watch(self, r: Running, now: float) -> None:
        if r.eviction is not None:
            if now < r.frees_at:
                return
            r.eviction.freed_at = now
            r.eviction.checkpoint_after_warning = True
            if r.eviction.reason in PRESSURE:
                for d in r.devices:
                    self.last_eviction_at[d] = now
            eviction = r.eviction.report(
                last_checkpoint_at=r.last_checkpoint_at, started_at=r.started_at
            )
            self.end(r, eviction=eviction)
        elif now >= r.ends_at:
            self.end(r, eviction=None)
            self.figures.count("finished")
        elif now >= r.next_checkpoint:
            r.next_checkpoint = now + self.args.checkpoint_s
            r.last_checkpoint_at = now
            kw = {"job_id": r.job_id, "attempt": r.attempt}
            self.journal.append("record_checkpoint", **kw, path=f"/ckpt/{r.job_id}", at=now)
            done = now - r.started_at
            self.journal.append("record_progress", **kw, done=done, total=r.ends_at - r.started_at)

    def end(self, r: Running, eviction: dict[str, Any] | None) -> None:
        del self.attempts[r.job_id]
        self.journal.append(
            "finish_attempt",
            job_id=r.job_id,
            attempt=r.attempt,
            exit_code=0 if eviction is None else -15,
            eviction=eviction,
        )

    def walk(self, now: float) -> None:
        """Each device's online load: back towards its base, a little noise, a spike
        now and then (its probability per tick from ``--spikes-per-node-h``)."""
        rng = self.rng
        p_spike = self.args.spikes_per_node_h / 3600 * TICK_S / GPUS_PER_NODE
        for i, ((c, m), (bc, bm)) in enumerate(zip(self.online, self.base, strict=True)):
            if self.spike_until[i] and now >= self.spike_until[i]:
                self.spike_until[i] = 0.0
                c, m = bc, bm
            elif not self.spike_until[i] and rng.random() < p_spike:
                self.spike_until[i] = now + self.args.spike_s
                c, m = (
                    min(100.0, c + rng.uniform(40, 70)),
                    min(DEVICE_MIB, m + rng.uniform(3e4, 5e4)),
                )
            elif not self.spike_until[i]:
                c += 0.2 * (bc - c) + rng.gauss(0, self.args.noise_pct)
                m += 0.2 * (bm - m) + rng.gauss(0, self.args.noise_mib)
            self.online[i] = (max(0.0, min(100.0, c)), max(0.0, min(DEVICE_MIB, m)))

    def devices(self, now: float) -> list[dict[str, Any]]:
        out = []
        for i, (c, m) in enumerate(self.online):
            d = dict(self.templates[i])
            d["online_compute_pct"] = round(c, 1)
            d["online_memory_mib"] = round(m)
            d["sampled_at"] = now
            d["last_eviction_at"] = self.last_eviction_at.get(i)
            out.append(d)
        return out


class Poller:
    """Every agent's two dramatiq consumers (its queue and the delay queue), on their
    backoff schedules, fetching with the broker's script, pipelined; a command fetched
    is acked and handed to ``deliver`` (the agent's index and the command's payload)."""

    def __init__(
        self,
        bus: Bus,
        names: list[str],
        cap_ms: int,
        figures: Figures,
        deliver: Callable[[int, dict[str, Any]], None],
    ) -> None:
        self.bus = bus
        self.broker: Any = bus.broker
        self.client: redis.Redis = self.broker.client
        self.cap_ms = cap_ms
        self.figures = figures
        self._deliver = deliver
        self.script = self.broker.scripts["dispatch"]
        #: per consumer: (agent's index, queue, broker id, misses, due at)
        self.consumers: list[list[Any]] = []
        for i, name in enumerate(names):
            queue_name = bus.node_queue(name)
            broker_id = str(uuid.uuid4())
            for q in (queue_name, dq_name(queue_name)):
                self.consumers.append([i, q, broker_id, 0, time.monotonic()])

    def _args(self, command: str, queue_name: str, broker_id: str, *rest: Any) -> list[Any]:
        b = self.broker
        return [
            command,
            int(time.time() * 1000),
            queue_name,
            broker_id,
            b.heartbeat_timeout,
            b.dead_message_ttl,
            b._should_do_maintenance(command),
            b._max_unpack_size(),
            *rest,
        ]

    def run(self, stop: Any) -> None:
        keys = [self.broker.namespace]
        while not stop.is_set():
            now = time.monotonic()
            due = [c for c in self.consumers if c[4] <= now]
            if not due:
                time.sleep(0.002)
                continue
            self.figures.count("fetches_due", len(due))
            pipe = self.client.pipeline(transaction=False)
            for c in due:
                self.script(keys=keys, args=self._args("fetch", c[1], c[2], 4), client=pipe)
            results = pipe.execute()
            self.figures.count("fetches", len(due))
            later = time.monotonic()
            for c, got in zip(due, results, strict=True):
                if got:
                    c[3] = 0
                    c[4] = later
                    for data in got:
                        self.deliver(c, data)
                else:
                    c[3], backoff_ms = compute_backoff(c[3], max_backoff=self.cap_ms)
                    c[4] = later + backoff_ms / 1000

    def deliver(self, consumer: list[Any], data: bytes) -> None:
        message = Message.decode(data)
        keys = [self.broker.namespace]
        self.script(
            keys=keys,
            args=self._args("ack", consumer[1], consumer[2], message.options["redis_message_id"]),
        )
        self._deliver(consumer[0], message.args[0])


def poller_process(
    namespace: str,
    names: list[str],
    cap_ms: int,
    measuring: Any,
    done: Any,
    commands: Any,
    out: Any,
) -> None:
    """The agents' consumers, in a process of their own (in a fleet each agent's are
    threads of its own process, on its own host): commands go to ``commands``; the
    fetches counted while ``measuring`` go to ``out`` when ``done``."""
    figures = Figures()
    bus = Bus.redis(REDIS_URL, namespace)
    poller = Poller(bus, names, cap_ms, figures, lambda i, payload: commands.put((i, payload)))
    threading.Thread(target=measure_window, args=(figures, measuring, done), daemon=True).start()
    poller.run(done)
    bus.close()
    out.put({"counts": dict(figures.counts)})


def take_commands(agents: list[SimAgent], commands: Any, stop: threading.Event) -> None:
    """Hand the commands the poller fetched to their agents."""
    while not stop.is_set():
        try:
            i, payload = commands.get(timeout=0.2)
        except queue.Empty:
            continue
        agents[i].command(parse_node_command(payload))


def drive(agents: list[SimAgent], stop: threading.Event, figures: Figures) -> None:
    while not stop.is_set():
        now_mono = time.monotonic()
        soonest = now_mono + TICK_S
        for a in agents:
            if a.next_tick <= now_mono:
                late = now_mono - a.next_tick
                a.next_tick += TICK_S
                if a.next_tick < now_mono:  # behind: do not pile up ticks
                    a.next_tick = now_mono + TICK_S
                try:
                    a.tick(time.time())
                except Exception as exc:  # one agent's trouble does not stop the run
                    print(f"{a.name}: {exc!r}", file=sys.stderr)
                if figures.measuring:
                    figures.tick_late_s.append(late)
                now_mono = time.monotonic()
            soonest = min(soonest, a.next_tick)
        stop.wait(max(0.0, soonest - time.monotonic()))


def submit(store: Store, rate: float, stop: threading.Event, figures: Figures, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        spec = JobSpec(
            command=["python", "train.py"],
            compute_pct=rng.choice([10, 20, 25, 40]),
            memory_mib=rng.choice([4096, 8192, 16384]),
            checkpoint_interval_s=30,
        )
        at = time.time()
        [job_id] = store.submit(spec, "user1", defaults_deadline_s=30)
        with figures.lock:
            figures.submitted[job_id] = at
        stop.wait(rng.expovariate(rate))


def count_writes(engine: sa.Engine, figures: Figures) -> None:
    def before(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        verb = statement.lstrip()[:6].upper()
        if verb in ("INSERT", "UPDATE", "DELETE"):
            figures.count("sql_writes")
            if "nodes" in statement[:40] and verb == "UPDATE":
                figures.count("heartbeat_writes")

    sa.event.listen(engine, "before_cursor_execute", before)


def pg_counters(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted "
                    "FROM pg_stat_database WHERE datname = current_database()"
                )
            ).one()
    finally:
        engine.dispose()
    return {"xact": row[0], "rows": row[1] + row[2] + row[3]}


def redis_commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def measure_window(figures: Figures, measuring: Any, done: Any) -> None:
    """A child process's figures count from ``measuring`` until ``done`` (the parent's
    window); returns at ``done``."""
    measuring.wait()
    figures.measuring = True
    done.wait()
    figures.measuring = False


def scheduler_process(
    url: str,
    namespace: str,
    home: str,
    liveness_in_redis: bool,
    measuring: Any,
    done: Any,
    out: Any,
) -> None:
    """The scheduler, in a process of its own as in a fleet (its passes would otherwise
    share one interpreter lock with a thousand agents): times its passes and counts its
    SQL writes while ``measuring`` is set, until ``done``; puts them on ``out``."""
    figures = Figures()
    store = Store(url)
    count_writes(store.engine, figures)
    bus = Bus.redis(REDIS_URL, namespace)
    liveness = bus.liveness() if liveness_in_redis else None
    store.liveness = liveness
    scheduler = Scheduler(
        store,
        policy=Policy(),
        send=bus.send_to_node,
        leader=LeaderLock(store.engine, Path(home)),
        liveness=liveness,
    )
    timed_pass = scheduler.run_once

    def run_once() -> Any:
        began = time.perf_counter()
        try:
            return timed_pass()
        finally:
            if figures.measuring:
                figures.passes.append(time.perf_counter() - began)

    scheduler.run_once = run_once  # type: ignore[method-assign]
    bus.serve(events=scheduler.wake)
    scheduler.start()
    measure_window(figures, measuring, done)
    scheduler.stop()
    bus.close()
    store.close()
    out.put({"passes": figures.passes, "counts": dict(figures.counts)})


class ChildDied(RuntimeError):
    """A child process (the scheduler or the poller) ended or hung before its figures came."""


def alive_or_fail(children: dict[str, Any]) -> None:
    """Raise :class:`ChildDied` naming the first of ``children`` (name → process) that has
    ended: the parent would otherwise wait out its queue reads without saying why."""
    for name, proc in children.items():
        if not proc.is_alive():
            raise ChildDied(f"the {name} process ended early (exit code {proc.exitcode})")


def collect(results: Any, name: str, proc: Any, timeout_s: float) -> dict[str, Any]:
    """The figures ``proc`` (the ``name`` process) puts on ``results``; fails at once when
    it ends without them, and after ``timeout_s`` when it hangs."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got: dict[str, Any] = results.get(timeout=0.5)
            return got
        except queue.Empty:
            if not proc.is_alive():
                try:  # it may have put them just before it ended
                    late: dict[str, Any] = results.get(timeout=1.0)
                    return late
                except queue.Empty:
                    pass
                raise ChildDied(
                    f"the {name} process ended without its figures (exit code {proc.exitcode})"
                ) from None
            if time.monotonic() > deadline:
                raise ChildDied(f"the {name} process sent no figures in {timeout_s:g}s") from None


def sleep_watching(seconds: float, children: dict[str, Any]) -> None:
    """Sleep ``seconds``, failing as soon as one of ``children`` ends."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        alive_or_fail(children)


def end_child(proc: Any, timeout_s: float) -> None:
    """Join ``proc``; terminate it if it has not ended by ``timeout_s``, kill it after 5 s."""
    proc.join(timeout_s)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    figures = Figures()
    rules = HeartbeatRules(every=True) if args.every_heartbeat else HeartbeatRules.for_timeout(10.0)
    namespace = f"ebbtide-bench-{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix="ebbtide-fleet-"))
    spawn = multiprocessing.get_context("spawn")
    measuring, done, out = spawn.Event(), spawn.Event(), spawn.Queue()
    with bench_stores.postgres_url(PG_ADMIN_URL) as url:
        Store(url).close()  # the schema, before either process opens it
        agent_store, client_store = Store(url), Store(url)
        for s in (agent_store, client_store):
            count_writes(s.engine, figures)
        bus = Bus.redis(REDIS_URL, namespace)
        # the agents' touches share one client here; each real agent has its own
        liveness = None if args.no_liveness else bus.liveness()
        sched = spawn.Process(
            target=scheduler_process,
            args=(url, namespace, str(home), liveness is not None, measuring, done, out),
            daemon=True,
        )
        sched.start()
        rng = random.Random(args.seed)
        agents = [
            SimAgent(
                f"sim{i:05d}",
                agent_store,
                bus,
                rules,
                random.Random(rng.random()),
                args,
                figures,
                liveness,
            )
            for i in range(args.agents)
        ]
        commands, polled = spawn.Queue(), spawn.Queue()
        poller = spawn.Process(
            target=poller_process,
            args=(
                namespace,
                [a.name for a in agents],
                args.poll_cap_ms,
                measuring,
                done,
                commands,
                polled,
            ),
            daemon=True,
        )
        poller.start()
        stop = threading.Event()
        threads = [
            threading.Thread(target=drive, args=(agents[k::DRIVERS], stop, figures), daemon=True)
            for k in range(DRIVERS)
        ]
        threads.append(
            threading.Thread(target=take_commands, args=(agents, commands, stop), daemon=True)
        )
        threads.append(
            threading.Thread(
                target=submit,
                args=(client_store, args.submit_rate, stop, figures, args.seed),
                daemon=True,
            )
        )
        for t in threads:
            t.start()
        children = {"scheduler": sched, "poller": poller}
        try:
            sleep_watching(args.warmup, children)
            r0, pg0, t0 = redis_commands(bus._redis), pg_counters(url), time.monotonic()
            figures.measuring = True
            measuring.set()
            sleep_watching(args.seconds, children)
            figures.measuring = False
            done.set()
            r1, pg1, t1 = redis_commands(bus._redis), pg_counters(url), time.monotonic()
            scheduled = collect(out, "scheduler", sched, 60)
            scheduled["counts"].update(collect(polled, "poller", poller, 60)["counts"])
        finally:
            done.set()
            stop.set()
            for t in threads:
                t.join(10)
            end_child(poller, 30)
            end_child(sched, 30)
            bus.close()
            if liveness is not None:
                liveness.close()
            for s in (agent_store, client_store):
                s.close()
            cleanup = redis.Redis.from_url(REDIS_URL)
            for key in cleanup.scan_iter(match=f"{namespace}*", count=1000):
                cleanup.delete(key)
            cleanup.close()
    figures.passes = scheduled["passes"]
    figures.counts.update(scheduled["counts"])
    span = t1 - t0
    c = figures.counts
    out: dict[str, Any] = {
        "agents": args.agents,
        "gpus": args.agents * GPUS_PER_NODE,
        "seconds": round(span, 1),
        "every_heartbeat": bool(args.every_heartbeat),
        "liveness_in_redis": not args.no_liveness,
        "poll_cap_ms": args.poll_cap_ms,
        "passes": len(figures.passes),
    }
    out.update(stats("pass", figures.passes or [0.0]))
    dispatch = stats("dispatch", figures.dispatch_s or [0.0])
    out["dispatches"] = len(figures.dispatch_s)
    out.update(dispatch)
    out["sql_writes_per_s"] = round(c["sql_writes"] / span, 1)
    out["heartbeat_writes_per_s"] = round(c["heartbeat_writes"] / span, 1)
    out["pg_xact_per_s"] = round((pg1["xact"] - pg0["xact"]) / span, 1)
    out["pg_rows_written_per_s"] = round((pg1["rows"] - pg0["rows"]) / span, 1)
    out["redis_ops_per_s"] = round((r1 - r0) / span, 1)
    out["fetches_per_s"] = round(c["fetches"] / span, 1)
    out["fetches_due_per_s"] = round(c["fetches_due"] / span, 1)
    out["evictions"] = c["evictions"]
    out["finished"] = c["finished"]
    late = sorted(figures.tick_late_s) or [0.0]
    out["agent_tick_late_p99_s"] = round(late[min(len(late) - 1, round(0.99 * (len(late) - 1)))], 3)
    # ticks later than the reader mark lives miss it: agents write to the store as if the
    # scheduler did not read Redis, and the figures are the saturated harness's
    out["harness_kept_up"] = out["agent_tick_late_p99_s"] <= READER_TTL_MS / 1000
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description="One real scheduler against many simulated node agents on real "
        "PostgreSQL and Redis: pass time, dispatch latency, SQL writes, Redis commands."
    )
    parser.add_argument("--agents", type=int, default=1000, help="simulated node agents (1000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window (60)")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before it (30)")
    parser.add_argument("--submit-rate", type=float, default=5.0, help="jobs a second (5)")
    parser.add_argument(
        "--job-s", type=float, nargs=2, default=[20.0, 90.0], help="job length range (20 90)"
    )
    parser.add_argument(
        "--checkpoint-s", type=float, default=10.0, help="seconds between checkpoints (10)"
    )
    parser.add_argument(
        "--spikes-per-node-h", type=float, default=6.0, help="online spikes a node an hour (6)"
    )
    parser.add_argument("--spike-s", type=float, default=20.0, help="a spike's length (20)")
    parser.add_argument(
        "--noise-pct", type=float, default=0.5, help="online compute's random walk step (0.5)"
    )
    parser.add_argument(
        "--noise-mib", type=float, default=64.0, help="online memory's random walk step (64)"
    )
    parser.add_argument(
        "--poll-cap-ms",
        type=int,
        default=WORKER_TIMEOUT_MS,
        help=f"an idle consumer's longest wait between fetches ({WORKER_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--every-heartbeat", action="store_true", help="write every heartbeat (the old rule)"
    )
    parser.add_argument(
        "--no-liveness",
        action="store_true",
        help="keep nodes alive by store writes alone (as before liveness in Redis)",
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed (7)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    try:
        result = run(args)
    except ChildDied as e:
        print(f"fleet_scale: {e}; its traceback, if any, is above", file=sys.stderr)
        return 1
    if not result["harness_kept_up"]:
        print(
            f"fleet_scale: warning: the simulated agents' ticks were up to "
            f"{result['agent_tick_late_p99_s']:.1f}s late (p99), past the reader mark's "
            f"{READER_TTL_MS / 1000:g}s: this machine did not keep up with the fleet it "
            "simulates, and every figure is that of a saturated box (fewer --agents)",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps({**result, "machine": machine()}))
        return 0
    print(
        f"{result['agents']} agents ({result['gpus']} GPUs), {result['seconds']}s measured, "
        f"heartbeats {'every one' if result['every_heartbeat'] else 'by the write rules'}"
        f"{', liveness in Redis' if result['liveness_in_redis'] else ''}, "
        f"consumers' poll cap {result['poll_cap_ms']} ms"
    )
    rows = [
        ("pass p50 / p99", f"{result['pass_p50_s']:.3f}s / {result['pass_p99_s']:.3f}s"),
        (
            "dispatch p50 / p99",
            f"{result['dispatch_p50_s']:.3f}s / {result['dispatch_p99_s']:.3f}s",
        ),
        ("SQL writes", f"{result['sql_writes_per_s']:.0f}/s"),
        ("  of which heartbeats", f"{result['heartbeat_writes_per_s']:.0f}/s"),
        ("PostgreSQL transactions", f"{result['pg_xact_per_s']:.0f}/s"),
        ("PostgreSQL rows written", f"{result['pg_rows_written_per_s']:.0f}/s"),
        ("Redis commands", f"{result['redis_ops_per_s']:.0f}/s"),
        (
            "consumer fetches done / due",
            f"{result['fetches_per_s']:.0f} / {result['fetches_due_per_s']:.0f} per s",
        ),
        (
            "dispatches, evictions, finished",
            f"{result['dispatches']}, {result['evictions']}, {result['finished']}",
        ),
        ("agent tick late p99", f"{result['agent_tick_late_p99_s']:.3f}s"),
    ]
    for name, value in rows:
        print(f"  {name:<34} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
