"""The node agent (``ebb worker``): runs attempts on this node's devices and takes them
back when the online tenants need the room.

One loop thread does everything that touches processes, and it never waits for the
store: what it has to say goes to a local journal that a store thread delivers
(:mod:`ebbtide.workers.sync`), and what it needs from the store arrives in its inbox, so a
store that is slow, locked or gone never delays a warning or a kill.  Handlers stay short
(a message only puts a command in an inbox).  Each tick (``SAMPLE_PERIOD_S``):

1. about once a second (``RENEW_PERIOD_S``, at most a quarter of the lease), renew every
   attempt's lease (its shim kills it when the renewals stop);
2. sample the headroom source, telling the attempts' processes (their whole trees) from
   the online tenants'; about once a second, note what each attempt used where the
   source attributes GPU use per process (:mod:`~ebbtide.workers.usage`, recorded with
   the attempt's end for ``ebb recommend``);
3. take in device faults (XIDs, a GPU off the bus): a device out of service has its
   slices evicted (killed at once when the GPU is gone) and takes nothing new;
4. run what is in the inbox: starts the store thread prepared, evictions, kills of
   attempts the store gave away, undrains;
5. reap attempts whose processes ended, read their status files (checkpoints; progress,
   the latest at most every ``PROGRESS_REPORT_PERIOD_S``): an attempt being taken back
   every tick, the others every ``WATCH_EVERY_TICKS`` ticks, spread over them;
6. kill attempts whose eviction deadline has come (every process of the attempt);
7. the fast path: if the sample shows online usage plus offline slices above capacity
   minus the margin, pick victims with the same victim policy the scheduler uses and warn
   them at once, with no round trip to the scheduler;
8. every ``HEARTBEAT_PERIOD_S``: journal a heartbeat with the latest sample and device
   health (the store thread writes what the scheduler must act on at once, the rest
   once a write period: :mod:`~ebbtide.workers.heartbeat`); cut off from the store for
   half the heartbeat timeout, kill every attempt (the scheduler is about to give them
   to another node).

(Longer than our modules should be: it is the one loop that owns the attempts' processes,
and every step above changes them.  What can stand alone already does: the attempt's
record (``attempt.py``), launching (``launch.py``), whom it runs as and its files
(``runas.py``, ``attempt_files.py``), process trees (``executor.py``,
``shim.py``, ``ownership.py``), status files (``status.py``), device health
(``health.py``), talking to the store (``sync.py``, ``journal.py``).)
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.errors import ConfigError
from ebbtide.identity import user_name
from ebbtide.messaging.messages import DeviceReport, EvictAttempt, StartAttempt
from ebbtide.metrics import Metrics
from ebbtide.preemption.enforcer import KILL_LEAD_S, EvictionClock
from ebbtide.preemption.relief import (
    NOTHING,
    ActionKind,
    Relief,
    Response,
    respond,
)
from ebbtide.preemption.victims import COOLDOWN_REASONS, EvictReason
from ebbtide.queue.drains import WHOLE_NODE
from ebbtide.queue.outcomes import GPU_FAULT, START_DEFERRED, WALLTIME
from ebbtide.queue.spec import REQUEUE_EXIT_CODE, JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.scheduling.capacity import on_device, overflow
from ebbtide.scheduling.forecast import Forecaster
from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    DeviceView,
    Margins,
    PauseRules,
    QueueLimits,
    protected,
)
from ebbtide.units import signal_name
from ebbtide.workers import attempt_files
from ebbtide.workers.attempt import LocalAttempt
from ebbtide.workers.cgroups import online_pods
from ebbtide.workers.claim import NodeClaim, NodeTaken
from ebbtide.workers.executor import (
    CAUSE_IMAGE,
    CAUSE_LOST,
    CAUSE_NODE_PRESSURE,
    CAUSE_OOM,
    CAUSE_PREEMPTED,
    CAUSE_UNSCHEDULABLE,
    Executor,
    Exit,
    Leftover,
    LocalExecutor,
    StartDeferred,
)
from ebbtide.workers.forecasts import DeviceForecasts
from ebbtide.workers.headroom.base import DeviceFault, DeviceInfo, DeviceSample, HeadroomSource
from ebbtide.workers.health import HEALTH_CHECK_PERIOD_S, HealthTracker, fault_message
from ebbtide.workers.heartbeat import HeartbeatRules, Toucher
from ebbtide.workers.journal import Journal
from ebbtide.workers.launch import launch_for
from ebbtide.workers.ownership import ProcessOwnership, Tree
from ebbtide.workers.runas import (
    RUN_AS_AGENT,
    RUN_AS_OWNER,
    Identity,
    RunAsRefused,
    jobs_run_here,
    resolve,
)
from ebbtide.workers.shim import tree as shim_tree
from ebbtide.workers.status import Checkpoint, Result, StatusReader
from ebbtide.workers.suspend import CudaCheckpoint, SuspendError, host_memory_mib, host_refusal
from ebbtide.workers.sync import Kill, Prepared, StoreSync, View
from ebbtide.workers.undrains import Undrain
from ebbtide.workers.usage import USAGE_SAMPLE_PERIOD_S, UsageSummary

log = logging.getLogger("ebbtide.agent")

#: Evictions for online pressure: only these start a device's eviction cooldown.

#: The platform's evictions (an executor's exit cause → the eviction's reason code).
PLATFORM_EVICTIONS = {
    CAUSE_PREEMPTED: EvictReason.KUBE_PREEMPTED.value,
    CAUSE_NODE_PRESSURE: EvictReason.NODE_PRESSURE.value,
}

#: The inbox's own command: leave gracefully (evict everything within its deadline).
SHUTDOWN = object()

#: How often the agent samples headroom and checks its attempts, in seconds (≥ 10 Hz).
SAMPLE_PERIOD_S = 0.05
#: How often the agent looks at attempts being evicted, in seconds.
EVICTING_PERIOD_S = 0.005
#: How long the loop may go without a tick before ``/healthz`` says it is stuck (an agent
#: that does not tick evicts nothing): a thousand ticks' time, and the liveness probe's
#: failures on top, so that a slow node is not restarted (a restart evicts its attempts).
STALL_S = 60.0
#: An attempt the agent is not taking back is looked at (has it ended? what did it
#: write?) every this many ticks, not every tick: 4 Hz at 20 Hz.  It frees its slice up
#: to 0.2 s later than it could, which no dispatch notices; an attempt being evicted, or
#: past its walltime, is looked at every tick.
WATCH_EVERY_TICKS = 5
#: How often the agent renews its attempts' leases, in seconds (at most a quarter of the
#: lease, which is half the heartbeat timeout).
RENEW_PERIOD_S = 1.0
#: How often the agent heartbeats (the store thread delivers it), in seconds.
HEARTBEAT_PERIOD_S = 0.5
#: Who a device's online processes are (read from ``/proc``) is looked up again once this
#: old while they stay the same pids, in seconds (it is for people to read).
ONLINE_PODS_REFRESH_S = 5.0


class NodeAgent:
    def __init__(
        self,
        name: str,
        store: Store,
        source: HeadroomSource,
        *,
        home: Path,
        margins: Margins | None = None,
        clock: Clock = SYSTEM_CLOCK,
        executor: Executor | None = None,
        notify: Any = None,
        mps: bool = False,
        queues: Mapping[str, QueueLimits] | None = None,
        forecast: Callable[[], Forecaster] | None = None,
        deadline_s: float = 30.0,
        heartbeat_timeout_s: float = 10.0,
        device_recovery_s: float = 600.0,
        planning_margin: Margins | None = None,
        pause: PauseRules | None = None,
        cuda_checkpoint: CudaCheckpoint | None = None,
        run_as: str = RUN_AS_AGENT,
        allow_root_jobs: bool = False,
        others_as_agent: bool = True,
        metrics: Metrics | None = None,
        own_python: bool = False,
        liveness: Toucher | None = None,
    ) -> None:
        """``liveness``: where each heartbeat also says the node is alive (Redis, in
        distributed mode: :mod:`ebbtide.messaging.liveness`)."""
        self.name = name
        self.store = store
        self.source = source
        self.home = home
        self.margins = margins or Margins()
        self.clock = clock
        self.executor = executor or LocalExecutor(run_dir=home / "run" / name)
        self.notify = notify  # callable(dict) that wakes the scheduler, or None
        #: graduated response: when a compute spike pauses rather than evicts
        self.pause_rules = pause or PauseRules()
        #: suspend to host (``pause.suspend`` on): the utility, where the executor is local
        #: and the utility is installed; None: memory shortage evicts
        self.cuda_checkpoint = (
            cuda_checkpoint
            if cuda_checkpoint is not None
            and isinstance(self.executor, LocalExecutor)
            and cuda_checkpoint.available()
            else None
        )
        self.mps = mps
        #: whom attempts run as: ``owner`` or ``agent`` (:mod:`ebbtide.workers.runas`);
        #: ``agent`` here, as before, for the library and tests; ``ebb worker`` says owner
        self.run_as = run_as
        #: the policy's ``allow_root_jobs``: whether root's jobs run as root (owner mode)
        self.allow_root_jobs = allow_root_jobs
        #: in agent mode as root, run other users' jobs as root too (the library's
        #: default, for tests); the CLI says False: then only root's jobs run
        self.others_as_agent = others_as_agent
        #: jobs run as the agent's user find the agent's virtual environment first on
        #: their PATH (``ebb up``: one box, one install; see ``workers.launch``)
        self.own_python = own_python
        #: per-queue protections (min-runtime, preemptible) for the fast path
        self.queues: Mapping[str, QueueLimits] = queues or {}
        #: Unix seconds a slice was last taken back on each device (eviction cooldown)
        self.last_eviction_at: dict[int, float] = {}
        self.devices = source.devices()
        self.attempts: dict[int, LocalAttempt] = {}
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.latest: list[DeviceSample] = []
        #: which GPU process is whose: the attempts' trees, for the headroom source
        self.ownership = ProcessOwnership()
        #: what ``ownership`` was last told of the attempts (their trees and slices)
        self._owned: tuple[tuple[Tree, ActiveAttempt], ...] | None = None
        #: the :func:`calm_key` of the fast path's last tick that found every device calm
        #: (None: the last tick found some device that was not)
        self._all_calm_at: tuple[Any, ...] | None = None
        #: device faults and recovery
        self.health = HealthTracker([d.index for d in self.devices], device_recovery_s)
        #: extra headroom kept back where the source is for planning only (DCGM)
        self.planning_margin = planning_margin or Margins(15.0, 8192.0)
        #: expected online growth per device (the admission reserve in the heartbeat)
        self.forecasts = DeviceForecasts(
            [d.index for d in self.devices], _steady(forecast or Forecaster, source)
        )
        #: the reserve is for growth within this deadline, in seconds
        self.deadline_s = deadline_s
        #: the scheduler gives up on a node silent this long; we fence at half of it
        self.heartbeat_timeout_s = heartbeat_timeout_s
        #: this agent's claim on its name (one agent per node name)
        self.claim = NodeClaim(home / "run" / name, name)
        #: reports for the store, delivered in order by the store thread
        self.journal = Journal(home / "run" / name / "journal.jsonl")
        self.sync = StoreSync(
            name,
            store,
            self.journal,
            post=self._post,
            view=self._get_view,
            heartbeat=self._get_heartbeat,
            notify=notify,
            heartbeat_rules=HeartbeatRules.for_timeout(heartbeat_timeout_s),
            clock=clock,
            liveness=liveness,
        )
        self._shared = threading.Lock()
        # what a previous run journaled is delivered before the first reconcile
        self._view: View = (self.journal.seq, {})
        self._heartbeat_payload: dict[str, Any] = {}
        #: per device: the online pids last named, when (monotonic seconds), and their names
        self._online_pods: dict[int, tuple[tuple[int, ...], float, list[str]]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started_at = clock.time()
        self._next_heartbeat = 0.0
        #: ticks so far (which attempts are looked at, ``_watch_due``)
        self._ticks = 0
        self._next_health_check = 0.0
        self._next_renewal = 0.0  # real monotonic seconds: the leases are renewed then
        #: Prometheus metrics (the process's, when it serves them)
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.watch_agent(
            name,
            heartbeat_age=lambda: self.clock.monotonic() - self.sync.last_heartbeat_ok,
            running=lambda: len(self.attempts),
        )
        self.metrics.known_queues(name, ["default", *self.queues])
        self._samples_taken = self.metrics.samples.labels(name)

    @property
    def lease_s(self) -> float:
        """An attempt's shim kills it after this long without a renewal, in seconds: half
        the heartbeat timeout, so it is dead before the scheduler gives its job away."""
        return self.heartbeat_timeout_s / 2

    # -- lifecycle ----------------------------------------------------------------------

    def claim_name(self) -> None:
        """Claim this agent's node name (:mod:`~ebbtide.workers.claim`; the lock on this
        host is taken when the agent is made), before anything is served to it: raises
        :class:`~ebbtide.workers.claim.NodeTaken` when another agent has it."""
        if self.claim.acquired:
            return
        self._started_at = self.clock.time()
        self.sync.started_at = self._started_at
        try:
            self.claim.acquire(
                self.store,
                started_at=self._started_at,
                heartbeat_timeout_s=self.heartbeat_timeout_s,
            )
        except NodeTaken:
            self.journal.close()  # refused: this agent never runs
            raise

    def start(self) -> None:
        self.claim_name()
        try:
            self._start_claimed()
        except BaseException:
            self.claim.release()
            raise

    def _start_claimed(self) -> None:
        self._prepare_run_as()
        # what a previous incarnation left dies (or has its end delivered) before anything
        # is requeued
        for leftover in self.executor.reap_leftovers():
            self._deliver_leftover(leftover)
        self._post_heartbeat()
        try:  # be on record at once; later heartbeats go through the store thread
            self.sync.write_heartbeat()
        except Exception as exc:
            log.warning("first heartbeat failed (%s); the store thread will retry", exc)
        self.sync.start()
        self._thread = threading.Thread(target=self.run, name=f"agent-{self.name}", daemon=True)
        self._thread.start()

    def _prepare_run_as(self) -> None:
        """In owner mode, say what this node runs; as root, let other users' jobs pass
        through the home to their own directories (0711: see ``attempt_files``)."""
        if not self._switches_users():
            return
        if os.geteuid() != 0:
            me = user_name(os.geteuid())
            log.info("running as %s, not root: only %s's jobs run on node %s", me, me, self.name)
            return
        try:
            warnings = attempt_files.share_home(self.home)
        except OSError as exc:  # another user's home, a file: jobs could not be kept apart
            raise ConfigError(f"EBBTIDE_HOME {self.home}: {exc}") from None
        if warnings and not self.allow_root_jobs:
            # a trial's trap: the agent only warned, then every job failed at its start
            raise ConfigError(
                f"EBBTIDE_HOME {self.home}: {warnings[0]}. No job could run here: root's are "
                "refused (allow_root_jobs is false) and every other user's needs its files "
                "under it; set EBBTIDE_HOME to a directory others can pass through (e.g. "
                "/var/lib/ebbtide), or --run-as agent"
            )
        for warning in warnings:
            log.warning("%s", warning)

    def _runs_processes(self) -> bool:
        """Whether this node's executor runs attempts as local processes (pods run as
        their pod spec says, whatever this agent runs as)."""
        return bool(getattr(self.executor, "runs_as_owner", False))

    def _switches_users(self) -> bool:
        """Whether attempts run as their owners here."""
        return self.run_as == RUN_AS_OWNER and self._runs_processes()

    def _identity(self, owner: str) -> Identity | None:
        """Whom ``owner``'s attempt runs as on this node (None: the agent's user)."""
        return resolve(
            owner,
            run_as=self.run_as if self._switches_users() else RUN_AS_AGENT,
            node=self.name,
            allow_root_jobs=self.allow_root_jobs,
            others_as_agent=self.others_as_agent or not self._runs_processes(),
        )

    def _runs_jobs_of(self) -> str:
        """Whose jobs :meth:`_identity` lets run here, as the heartbeat says it (the
        policy's ``allow_root_jobs`` may change on a reload)."""
        return jobs_run_here(
            self.run_as if self._switches_users() else RUN_AS_AGENT,
            agent_uid=os.geteuid(),
            allow_root_jobs=self.allow_root_jobs,
            others_as_agent=self.others_as_agent,
            runs_processes=self._runs_processes(),
        )

    def command(self, cmd: StartAttempt | EvictAttempt) -> None:
        """Queue a command from the scheduler (called from a message handler: stays short).
        A start goes to the store thread first, which reads the job."""
        if isinstance(cmd, StartAttempt):
            self.sync.request_start(cmd)
        else:
            self._post(cmd)

    def _post(self, item: Any) -> None:
        """Put ``item`` in the loop's inbox and wake the loop (any thread)."""
        self.inbox.put(item)
        self._wake.set()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Graceful stop: evict every attempt within its deadline, wait, deliver every
        report, then leave."""
        self._post(SHUTDOWN)
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.sync.finish(timeout_s)
        self.journal.close()
        self._close_executor()
        self.claim.release()

    def kill(self) -> None:
        """Stop without touching attempts or delivering anything more (tests simulate a
        crash with this; the journal keeps what was not delivered)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.sync.kill()
        self.journal.close()
        self._close_executor()
        self.claim.release()  # as the kernel would for a process that died

    def _close_executor(self) -> None:
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()

    def run(self) -> None:
        """The loop, in the calling thread, tick after tick on the agent's clock, until
        :meth:`kill`, or until a :meth:`shutdown` has seen every attempt leave.
        :meth:`start` runs it in a thread of its own (with the store thread); on a
        :class:`~ebbtide.clock.FakeClock` a test runs it in its own thread, tick by tick on
        fake time."""
        loop = f"agent {self.name}"
        self.metrics.probes.watch(loop, STALL_S)
        try:
            self._tick_until_stopped(loop)
        finally:
            self.metrics.probes.forget(loop)

    def _tick_until_stopped(self, loop: str) -> None:
        while not self._stop.is_set():
            began = self.clock.monotonic()
            try:
                self.tick()
                self.metrics.probes.beat(loop)
            except Exception as exc:  # the loop must survive a bad tick; the store stays the truth
                self.metrics.probes.beat(loop, ok=False, why=f"its last tick failed: {exc!r:.200}")
                log.exception("agent tick failed")
            if self._stopping and not self.attempts:
                self._post_heartbeat()  # "stopping", with nothing left here
                return
            # while a slice is being taken back, look at it more often; a tick is due one
            # period after the last one began (a fixed rate), or at once when woken
            evicting = any(a.eviction for a in self.attempts.values())
            period_s = EVICTING_PERIOD_S if evicting else SAMPLE_PERIOD_S
            self.clock.wait(self._wake, max(0.0, began + period_s - self.clock.monotonic()))
            self._wake.clear()

    # -- one tick -----------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock.time()
        # the leases follow real time whatever the agent's clock: the attempts' shims are
        # real processes that kill after ``lease_s`` of real time without a renewal, and
        # a fake clock may stand still (or crawl) while real time passes
        mono = time.monotonic()
        if mono >= self._next_renewal:  # a write and a shim wake-up per attempt: not per tick
            self._next_renewal = mono + min(RENEW_PERIOD_S, self.lease_s / 4)
            for local in self.attempts.values():
                self.executor.renew(local.handle)
        try:
            self._update_ownership()
            self.latest = self.source.sample(now, self.ownership)
            self._samples_taken.inc()
            self.forecasts.observe(self.latest)
            self._take_faults(now)
        except Exception:  # a broken source must not stop deadlines from being kept
            log.exception("sampling the headroom source failed; keeping the last sample")
        try:
            self._measure_usage(now)
        except Exception:  # right-sizing figures never stop the tick
            log.exception("measuring the attempts' GPU use failed")
        while True:
            try:
                cmd = self.inbox.get_nowait()
            except queue.Empty:
                break
            try:
                self._handle(cmd, now)
            except Exception:  # one bad command never stops the tick
                log.exception("command %r failed", cmd)
        self._kill_all_due()
        self._ticks += 1
        for local in list(self.attempts.values()):
            if not self._watch_due(local):
                continue
            try:
                self._watch(local, now)
            except Exception:  # one attempt's trouble never stops the tick for the others
                log.exception("job %s attempt %s: watching it failed", local.job_id, local.attempt)
        self._fast_path(now)
        if now >= self._next_health_check:
            self._next_health_check = now + HEALTH_CHECK_PERIOD_S
            self._check_health(now)
        if now >= self._next_heartbeat:
            # on a fixed schedule (counted from the tick, a 50 ms tick's rounding made it
            # every 0.55 s); from now after an early one asked for, or when far behind
            on_time = now - self._next_heartbeat < HEARTBEAT_PERIOD_S
            self._next_heartbeat = (self._next_heartbeat if on_time else now) + HEARTBEAT_PERIOD_S
            self._post_heartbeat()
            self._fence_if_cut_off()
            self._export_devices()

    def _export_devices(self) -> None:
        """Each device's figures for the metrics: offline use as the source measured it,
        else as granted (a paused slice holds no compute, a suspended one no memory)."""
        for s in self.latest:
            here = [a for a in self.attempts.values() if s.index in a.slice.devices]
            compute = s.offline_compute_pct
            if compute is None:
                compute = sum(a.slice.compute_pct for a in here if a.paused_at is None)
            memory = s.offline_memory_mib
            if memory is None:
                memory = sum(a.slice.memory_mib for a in here if a.suspended_at is None)
            info = next((d for d in self.devices if d.index == s.index), None)
            self.metrics.device_sample(
                self.name,
                s.index,
                memory_mib=info.memory_mib if info else 0.0,
                online_compute_pct=s.online_compute_pct,
                online_memory_mib=s.online_memory_mib,
                offline_compute_pct=compute,
                offline_memory_mib=memory,
                healthy=not self.health.unhealthy(s.index),
            )

    def _measure_usage(self, now: float) -> None:
        """Feed each attempt's usage summary from the latest sample, at most once per
        ``USAGE_SAMPLE_PERIOD_S``, where the source attributes GPU use per process (NVML):
        the figures ``ebb recommend`` right-sizes slices from.  A source that cannot
        attribute (static, trace, Prometheus) records nothing, and a paused attempt is
        not measured (frozen, it uses less than it needs).

        Per sample: memory is the most its processes hold on any of its devices (0 where
        it has none: the driver lists every process with a context); compute the most
        they use on a device where it has processes, measured per process (unknown where
        it has none: a device that cannot sample per process would read as idle)."""
        by_index: dict[int, DeviceSample] | None = None  # made once some attempt is due
        for local in self.attempts.values():
            if now < local.usage_due_at or local.paused_at is not None or not local.slice.devices:
                continue
            local.usage_due_at = now + USAGE_SAMPLE_PERIOD_S  # measured or not: next second
            if by_index is None:
                by_index = {s.index: s for s in self.latest}
            samples = [by_index.get(d) for d in local.slice.devices]
            compute: list[float | None] = []
            memory: list[float | None] = []
            seen = False  # a process of the job on one of its devices at least
            for s in samples:
                if (
                    s is None
                    or not s.ok
                    or s.offline_jobs is None
                    or now - s.time > USAGE_SAMPLE_PERIOD_S
                ):
                    break  # not attributed (or stale) on one of its devices: no sample
                mine = next((u for u in s.offline_jobs if u.job_id == local.job_id), None)
                memory.append(0.0 if mine is None else mine.memory_mib)
                if mine is not None:
                    seen = True
                    compute.append(mine.compute_pct)
            else:
                if not seen:  # none of its processes seen (yet): no sample, never a 0
                    continue
                if local.usage is None:
                    sizes = [d.memory_mib for d in self.devices if d.index in local.slice.devices]
                    local.usage = UsageSummary(max(sizes, default=0))
                local.usage.add(_most(compute), _most(memory))

    def _watch_due(self, local: LocalAttempt) -> bool:
        """Is ``local`` to be looked at this tick?  Every tick while it is being taken
        back or its walltime ran out; else one tick in ``WATCH_EVERY_TICKS``, the
        attempts spread over them by job id."""
        return (
            local.eviction is not None
            or local.walltime_kill_at is not None
            or (self._ticks + local.job_id) % WATCH_EVERY_TICKS == 0
        )

    def _watch(self, local: LocalAttempt, now: float) -> None:
        """Reap ``local`` if it ended, kill it at its deadline or walltime."""
        self._read_status(local)
        ended = self.executor.poll(local.handle)
        if ended is not None:
            self._finish(local, ended)
        elif local.eviction and local.eviction.due(self.clock.time()):
            self._kill_now(local)
        elif (
            local.walltime_s is not None
            and not local.eviction
            and now - local.started_at > local.walltime_s
        ):
            self._walltime_ran_out(local, now)

    def _walltime_ran_out(self, local: LocalAttempt, now: float) -> None:
        """Warn an attempt past its walltime, as PBS and Slurm do, and kill it its
        deadline later if it still runs (a paused one cannot take the warning: at once).
        It fails, whatever it exits with but 0 (a trial's trap: it was killed with no
        warning at all)."""
        wall, grace = local.walltime_s, local.slice.deadline_s
        if local.walltime_kill_at is None:
            if local.paused_at is not None:
                local.walltime_kill_at = now
                local.ended_by = f"walltime {wall:g}s exceeded while paused, killed"
            else:
                local.walltime_kill_at = now + grace
                local.ended_by = f"walltime {wall:g}s exceeded"
                log.info(
                    "job %s attempt %s: walltime exceeded; warned (%s), killed in %gs",
                    local.job_id,
                    local.attempt,
                    signal_name(local.slice.signal),
                    grace,
                )
                self.executor.kill_at(local.handle, time.monotonic() + grace)
                self.executor.signal(local.handle, local.slice.signal)
                return
        if now >= local.walltime_kill_at:
            if local.ended_by == f"walltime {wall:g}s exceeded":
                local.ended_by += f", killed {grace:g}s after the warning"
            self.executor.signal(local.handle, signal.SIGKILL)

    def _kill_all_due(self) -> None:
        """Every local attempt whose eviction deadline has come is killed at once, before
        any is swept: a sweep waits for its supervisor to report, and attempts with the
        same deadline (one spike, several victims) must not wait behind each other."""
        if not self._runs_processes():
            return
        now = self.clock.time()
        for local in list(self.attempts.values()):
            if local.eviction is None or not local.eviction.due(now):
                continue
            try:
                self.executor.signal(local.handle, signal.SIGKILL)
            except Exception:  # _watch sweeps it the usual way
                log.exception("job %s attempt %s: killing it failed", local.job_id, local.attempt)
                continue
            # killed by its deadline (not a crash): _watch reaps and sweeps it as it ends
            local.eviction.killed = True
            log.info("job %s attempt %s: deadline reached, killed", local.job_id, local.attempt)

    def _kill_now(self, local: LocalAttempt) -> None:
        """The eviction deadline has come (or the GPU is gone): free the slice now."""
        assert local.eviction is not None
        local.eviction.killed = True
        log.info("job %s attempt %s: deadline reached, killing", local.job_id, local.attempt)
        self.executor.sweep(local.handle)  # free by the deadline, not a tick later
        self._finish(local, self.executor.poll(local.handle) or Exit(128 + signal.SIGKILL))

    def _update_ownership(self) -> None:
        # an attempt's tree and slice are made once (the same objects tick after tick,
        # compared by identity first): its job, attempt, devices and what it was granted
        running = tuple((a.tree, a.slice) for a in self.attempts.values())
        if running == self._owned:  # the same attempts: the same trees and slices
            self.ownership.tick()
            return
        self._owned = running
        granted: dict[int, tuple[float, float]] = {}
        for a in self.attempts.values():
            for d in a.slice.devices:
                c, m = granted.get(d, (0.0, 0.0))
                granted[d] = (
                    c + (100.0 if a.slice.gpus else a.slice.compute_pct),
                    m + a.slice.memory_mib,
                )
        self.ownership.update([a.tree for a in self.attempts.values()], granted)

    def device_views(self) -> list[DeviceView]:
        return device_views(self.name, self.devices, self.latest)

    def _fast_path(self, now: float) -> None:
        if not self.attempts:
            return
        active = [a.view() for a in self.attempts.values()]
        key = calm_key(self.latest, active, self.margins)
        if key == self._all_calm_at:
            return  # every device was calm with the same figures and attempts: it still is
        self._all_calm_at = None

        def guarded(a: ActiveAttempt) -> bool:
            return protected(a, self.queues.get(a.queue), now)

        rules = self.pause_rules
        all_calm = True
        for device in self.device_views():
            if device.planning_only:
                continue  # seconds-old device figures never trigger an eviction
            if calm(device, active, self.margins):
                continue  # nothing to pause, evict, thaw or restore here
            all_calm = False
            response = respond(device, active, self.margins, now, rules, guarded, self._can_suspend)
            if response is NOTHING:
                continue
            if self._carry_out(response, device, now):
                # (stale figures are the worst case: they never end a pause)
                for a in response.thaws:
                    local = self._current(a.job_id, a.attempt)
                    if local is not None:
                        self._thaw(local, now)
                for a in response.restores:
                    local = self._current(a.job_id, a.attempt)
                    if local is not None:
                        self._restore(local, now)
            active = [a.view() for a in self.attempts.values()]
        if all_calm:
            self._all_calm_at = key

    def _current(self, job_id: int, attempt: int) -> LocalAttempt | None:
        """Attempt ``attempt`` of job ``job_id``, unless it has ended or is being evicted."""
        local = self.attempts.get(job_id)
        if local is None or local.attempt != attempt or local.eviction:
            return None
        return local

    def _carry_out(self, response: Response, device: DeviceView, now: float) -> bool:
        """Pause, suspend or evict as ``response`` says; False when a suspension failed
        (it evicted instead, so the thaws that counted on it are left to the next tick)."""
        ok = True
        for r in response.reliefs:
            local = self._current(r.job_id, r.attempt)
            if local is None:
                continue
            failed = None
            if r.kind is ActionKind.SUSPEND:
                failed = self._suspend(local, r, now)
            if r.kind is ActionKind.PAUSE:
                self._pause(local, r, now)
            elif r.kind is ActionKind.EVICT or failed is not None:
                message = r.message
                if failed is not None:
                    message += f"; but suspending it to host failed ({failed}), so evicted"
                    ok = False
                self._evict(local, r.reason.value, message, spike_at=device.sampled_at or now)
            self._next_heartbeat = 0.0  # let the scheduler see the spike at once
        return ok

    # -- pausing ------------------------------------------------------------------------

    def _pause(self, local: LocalAttempt, relief: Relief, now: float) -> None:
        """Freeze ``local`` where it is: it keeps its GPU memory and issues no more work;
        its compute is free once the work in flight drains (``pause_drain_s``)."""
        if local.paused_at is not None:
            return
        self.executor.pause(local.handle)
        local.paused_at = now
        limits = self.queues.get(local.slice.queue)
        drain_s = self.pause_rules.drain_s
        if limits is not None and limits.pause_drain_s is not None:
            drain_s = limits.pause_drain_s
        self._record_pause(local, relief, now, "paused", drain_s=drain_s)

    def _thaw(self, local: LocalAttempt, now: float) -> None:
        """Let a paused attempt run again."""
        if local.paused_at is None:
            return
        self.executor.thaw(local.handle)
        self._record_thaw(local, now, "thawed")

    def _record_pause(
        self, local: LocalAttempt, relief: Relief, now: float, verb: str, **extra: Any
    ) -> None:
        """Log, show and journal that ``local`` was paused (or suspended) at ``now``:
        what it wrote before it froze first (it is looked at one tick in five), so that
        nothing it did is recorded after its pause."""
        self._read_status(local)
        log.info("job %s attempt %s: %s: %s", local.job_id, local.attempt, verb, relief.message)
        self._publish_view()
        self.journal.append(
            "record_pause",
            job_id=local.job_id,
            attempt=local.attempt,
            at=now,
            reason=relief.message,
            reason_code=relief.reason.value,
            **extra,
        )
        self.metrics.pauses.labels(self.name, local.slice.queue, extra.get("kind", "pause")).inc()

    def _record_thaw(self, local: LocalAttempt, now: float, verb: str, **extra: Any) -> None:
        """Clear ``local``'s pause; log, show and journal how long it was."""
        assert local.paused_at is not None
        paused_s = now - local.paused_at
        local.paused_at = None
        log.info("job %s attempt %s: %s after %.1fs", local.job_id, local.attempt, verb, paused_s)
        self._publish_view()
        self.journal.append(
            "record_thaw",
            job_id=local.job_id,
            attempt=local.attempt,
            at=now,
            paused_s=paused_s,
            **extra,
        )

    # -- suspending to host ---------------------------------------------------------------

    def _can_suspend(self, a: ActiveAttempt) -> bool:
        """This node can suspend ``a`` to host: suspending is on and the utility is here,
        the move fits its deadline, and the host has room for it (:meth:`_host_refusal`)."""
        cc = self.cuda_checkpoint
        if cc is None or not self.pause_rules.suspend:
            return False
        move_s = cc.suspend_time_s(a.memory_mib)
        # the move runs on this loop: it must fit the deadline, and half the attempts'
        # lease too (no shim is renewed meanwhile)
        limit_s = min(a.deadline_s, self.lease_s / 2)
        if move_s > limit_s:
            why: str | None = (
                f"moving its memory would take about {move_s:.1f}s, over {limit_s:g}s "
                "(its deadline, and half the attempts' lease)"
            )
        else:
            why = self._host_refusal(a.memory_mib * max(1, len(a.devices)))
        if why is not None:
            log.info("job %s attempt %s: not suspended to host: %s", a.job_id, a.attempt, why)
        return why is None

    def _host_refusal(self, memory_mib: float) -> str | None:
        """Why this host cannot hold ``memory_mib`` more of suspended CUDA state (the
        policy's ``suspend_host_memory_pct`` for all attempts suspended here, what is
        available with a reserve); None when it can.  Asked again just before a move: the
        attempts suspended in the same pass count then."""
        held = sum(
            s.slice.memory_mib * max(1, len(s.slice.devices))
            for s in self.attempts.values()
            if s.suspended_at is not None
        )
        total_mib, available_mib = host_memory_mib()
        return host_refusal(
            memory_mib, held, self.pause_rules.host_memory_pct, total_mib, available_mib
        )

    def _suspend(self, local: LocalAttempt, relief: Relief, now: float) -> str | None:
        """Move ``local``'s CUDA state to host memory, then freeze it: its GPU memory is
        free and it is not ended.  When the utility fails, everything is put back as it
        was and the error returned: the caller evicts instead."""
        cc = self.cuda_checkpoint
        assert cc is not None
        cc.timeout_s = min(cc.timeout_s, self.lease_s / 2)  # a hung utility: not the lease
        refused = self._host_refusal(local.slice.memory_mib * max(1, len(local.slice.devices)))
        if refused is not None:  # attempts suspended earlier in this pass took the room
            return refused
        was_paused = local.paused_at is not None
        if was_paused:  # the utility works through a thread of the process: let it run
            self.executor.thaw(local.handle)
        pids: list[int] = []
        try:
            pids = cc.cuda_pids(shim_tree(local.handle.pid))
            if not pids:
                raise SuspendError("no process of the attempt holds a CUDA context")
            cc.suspend(pids)
        except SuspendError as exc:
            log.warning("job %s attempt %s: suspend failed: %s", local.job_id, local.attempt, exc)
            try:
                cc.restore(pids)
            except SuspendError as again:
                log.warning("job %s attempt %s: %s", local.job_id, local.attempt, again)
            if was_paused:
                self.executor.pause(local.handle)
            return str(exc)
        self.executor.pause(local.handle)
        if local.paused_at is None:
            local.paused_at = now
        local.suspended_at = now
        local.suspended_pids = tuple(pids)
        self._record_pause(local, relief, now, "suspended", kind="suspend")
        return None

    def _restore(self, local: LocalAttempt, now: float) -> None:
        """Bring a suspended attempt's CUDA state back to its GPU and let it run again.  A
        failed restore evicts it (its CUDA calls would block for ever)."""
        cc = self.cuda_checkpoint
        if local.suspended_at is None or local.paused_at is None or cc is None:
            return
        cc.timeout_s = min(cc.timeout_s, self.lease_s / 2)
        self.executor.thaw(local.handle)  # its CUDA calls block until the state is back
        try:
            tree = shim_tree(local.handle.pid)
            # the pids suspended, while they are still the attempt's (a pid can be reused)
            cc.restore([p for p in local.suspended_pids if p in tree] or tree)
        except SuspendError as exc:
            self._evict(
                local,
                EvictReason.ONLINE_MEMORY.value,
                f"restoring it from host memory failed: {exc}",
                spike_at=now,
            )
            return
        local.suspended_at = None
        local.suspended_pids = ()
        self._record_thaw(local, now, "restored", kind="restore")

    # -- device health ------------------------------------------------------------------

    def _take_faults(self, now: float) -> None:
        for fault in self.source.faults():
            where = f"{self.name}/{fault.index}"
            if not self.health.fault(fault):
                level = logging.WARNING if fault.disabling else logging.INFO
                log.log(level, "device %s: %s (device stays as it is)", where, fault.meaning)
                continue
            log.error(
                "device %s out of service: %s (recovery action: %s)",
                where,
                fault.meaning,
                fault.recovery_action,
            )
            self._evict_for_fault(fault, now)
            self._next_heartbeat = 0.0  # the scheduler stops admitting there at once

    def _evict_for_fault(self, fault: DeviceFault, now: float) -> None:
        for local in list(self.attempts.values()):
            if fault.index not in local.slice.devices:
                continue
            message = fault_message(self.name, fault)
            if local.eviction is None:
                self._evict(
                    local,
                    EvictReason.GPU_FAULT.value,
                    message,
                    spike_at=now,
                    deadline_s=0.0 if fault.lost else None,
                )
            elif local.eviction.reason != EvictReason.GPU_FAULT.value:
                # already leaving for another reason: the fault is what it will be known by
                local.eviction.reason = EvictReason.GPU_FAULT.value
                local.eviction.message = message
            if fault.lost and local.job_id in self.attempts:
                self._kill_now(local)  # a GPU that is gone cannot be checkpointed from

    def _check_health(self, now: float) -> None:
        broken = {s.index for s in self.latest if not s.ok}
        for index in list(self.health.devices):
            if not self.health.unhealthy(index):
                continue
            why = "the device did not answer the last sample" if index in broken else None
            if why is None:
                try:
                    why = self.source.check(index)
                except Exception as exc:
                    why = f"health check failed: {exc}"
            if self.health.checked(index, why, now):
                log.info("device %s/%s passed its health checks: back in service", self.name, index)
                self._next_heartbeat = 0.0

    # -- commands -----------------------------------------------------------------------

    def _handle(self, cmd: Any, now: float) -> None:
        if isinstance(cmd, Prepared):
            self._launch(cmd.job, cmd.spec)
        elif isinstance(cmd, EvictAttempt):
            local = self.attempts.get(cmd.job_id)
            if local and local.attempt == cmd.attempt and not local.eviction:
                self._evict(
                    local,
                    cmd.reason,
                    cmd.message,
                    spike_at=now if cmd.spike_at is None else cmd.spike_at,
                    deadline_s=cmd.deadline_s,
                    source="scheduler",
                    already_recorded=True,
                )
        elif isinstance(cmd, Kill):
            local = self.attempts.get(cmd.job_id)
            if local and local.attempt == cmd.attempt:
                log.warning("job %s attempt %s: %s; killing", cmd.job_id, cmd.attempt, cmd.why)
                self.executor.sweep(local.handle)
                del self.attempts[cmd.job_id]
                self._publish_view()
        elif isinstance(cmd, Undrain):
            for i in self.health.devices if cmd.index == WHOLE_NODE else [cmd.index]:
                if self.health.undrain(i):
                    log.info("device %s/%s undrained by an admin: back in service", self.name, i)
                    self._next_heartbeat = 0.0
        elif cmd is SHUTDOWN:
            self._begin_shutdown(now)

    def _launch(self, job: Any, spec: JobSpec) -> None:
        """Start a dispatched attempt the store thread prepared."""
        job_id, attempt = int(job.id), int(job.attempts)
        if self._stopping or job_id in self.attempts:
            return  # a duplicate, or leaving
        devices = tuple(int(d) for d in (job.devices or "").split(",") if d)
        fault = self.health.fault_on(devices)
        if fault is not None:
            why = f"device {self.name}/{fault.index} is out of service ({fault.meaning})"
            log.warning("job %s attempt %s not started: %s", job_id, attempt, why)
            self.journal.append(
                "requeue_lost", job_id=job_id, attempt=attempt, why=why, reason_code=GPU_FAULT
            )
            return
        by_index = {d.index: d for d in self.devices}
        try:
            identity = self._identity(str(job.owner))
            launch = launch_for(
                spec,
                job,
                attempt,
                home=self.home,
                node=self.name,
                devices=[by_index[d] for d in devices if d in by_index],
                lease_s=self.lease_s,
                mps=self.mps,
                inherit_env=self.executor.inherit_env,
                identity=identity,
                own_python=self.own_python,
            )
            handle = self.executor.start(launch)
        except StartDeferred as exc:
            why = f"could not be started on node {self.name}: {exc}"
            log.warning("job %s attempt %s %s", job_id, attempt, why)
            self.journal.append(
                "requeue_lost", job_id=job_id, attempt=attempt, why=why, reason_code=START_DEFERRED
            )
            return
        except (OSError, ValueError, RunAsRefused) as exc:
            why = f"could not start: {exc}"
            log.warning("job %s attempt %s: %s", job_id, attempt, why)
            self.journal.append(
                "finish_attempt", job_id=job_id, attempt=attempt, exit_code=127, why=why, final=True
            )
            return
        now = self.clock.time()
        self.attempts[job_id] = LocalAttempt(
            slice=ActiveAttempt(
                job_id=job_id,
                attempt=attempt,
                state=JobState.RUNNING,
                priority=job.priority,
                queue=job.queue,
                node=self.name,
                devices=devices,
                compute_pct=job.compute_pct,
                memory_mib=job.memory_mib,
                deadline_s=job.deadline_s,
                signal=job.signal,
                dispatched_at=now,
                started_at=now,
                last_checkpoint_at=None,
                gpus=job.gpus,
                owner=str(job.owner),
                pausable=bool(getattr(job, "pausable", False))
                and self.executor.can_pause
                and self.pause_rules.enabled,
            ),
            handle=handle,
            tree=self.executor.tree(job_id, handle),
            status=StatusReader(Path(launch.env["EBBTIDE_STATUS_FILE"])),
            walltime_s=spec.walltime_s,
        )
        self._publish_view()  # the attempt is here before its start is reported
        # a pod's output is its log, kept as the attempt's: -o/--output are not followed
        named = self._runs_processes()
        self.journal.append(
            "mark_started",
            job_id=job_id,
            attempt=attempt,
            pid=handle.pid or None,
            # where ebb logs finds its output: the files the job named, else the attempt's
            stdout_path=str((named and launch.job_stdout) or launch.stdout_path),
            stderr_path=str((named and launch.job_stderr) or launch.stderr_path),
        )
        where = self.executor.describe(handle)
        if identity is not None and identity.switch:
            where += f", as {identity.user}"
        log.info("job %s attempt %s started (%s) on %s", job_id, attempt, where, devices)

    # -- eviction -----------------------------------------------------------------------

    def _evict(
        self,
        local: LocalAttempt,
        reason: str,
        message: str,
        *,
        spike_at: float,
        deadline_s: float | None = None,
        source: str = "agent",
        already_recorded: bool = False,
    ) -> None:
        """Warn ``local`` and start its eviction clock: ``deadline_s`` from ``spike_at``
        (default: the attempt's own deadline), decided by ``source``."""
        local.eviction = EvictionClock(
            reason=reason,
            message=message,
            spike_at=spike_at,
            deadline_s=local.slice.deadline_s if deadline_s is None else deadline_s,
        )
        # the attempt's supervisor kills it at the deadline even if this agent cannot; told
        # before the warning, it lets a child outlive a wrapper the warning ends
        left_s = local.eviction.deadline_at - KILL_LEAD_S - self.clock.time()
        self.executor.kill_at(local.handle, time.monotonic() + max(0.0, left_s))
        # the warning counts from when it is sent: a job quick to checkpoint may answer
        # before a slow delivery (a delete with grace through a busy API server) returns
        local.eviction.warned_at = self.clock.time()
        self.executor.signal(local.handle, local.slice.signal)
        if local.paused_at is not None:  # a frozen job cannot handle its warning
            # (a suspended one stays on the host: its memory does not fit, so its CUDA
            # calls block and it is killed at the deadline; it resumes from its last
            # checkpoint)
            self._thaw(local, self.clock.time())
        log.info(
            "job %s attempt %s: warned (%s): %s",
            local.job_id,
            local.attempt,
            signal_name(local.slice.signal),
            message,
        )
        self._publish_view()
        if not already_recorded:  # a lost race (the scheduler got there first) is dropped
            self.journal.append(
                "begin_eviction",
                job_id=local.job_id,
                attempt=local.attempt,
                reason=message,
                reason_code=reason,
                deadline_s=deadline_s,
                spike_at=spike_at,
                source=source,
            )

    def _begin_shutdown(self, now: float) -> None:
        self._stopping = True
        for local in self.attempts.values():
            if not local.eviction:
                self._evict(
                    local,
                    EvictReason.SHUTDOWN.value,
                    f"node agent {self.name} is shutting down",
                    spike_at=now,
                )
        self._post_heartbeat()

    # -- reaping ------------------------------------------------------------------------

    def _read_status(self, local: LocalAttempt) -> None:
        for rec in local.status.read():
            if isinstance(rec, Checkpoint):
                at = rec.time or self.clock.time()
                local.last_checkpoint_at = at
                if local.eviction and at >= (local.eviction.warned_at or local.eviction.spike_at):
                    local.eviction.checkpoint_after_warning = True
                self.journal.append(
                    "record_checkpoint",
                    job_id=local.job_id,
                    attempt=local.attempt,
                    path=rec.path,
                    at=at,
                    size_bytes=rec.size_bytes,
                    duration_s=rec.duration_s,
                )
            elif isinstance(rec, Result):
                self.journal.append(
                    "record_result", job_id=local.job_id, attempt=local.attempt, value=rec.value
                )
            else:  # the latest wins: reported at most once a period (see below)
                local.progress = (rec.done, rec.total)
        self._report_progress(local)

    def _report_progress(self, local: LocalAttempt, *, final: bool = False) -> None:
        if local.progress is None:  # most ticks: nothing new (no clock read per attempt)
            return
        progress = local.progress_to_report(self.clock.time(), final=final)
        if progress is not None:
            done, total = progress
            self.journal.append(
                "record_progress",
                job_id=local.job_id,
                attempt=local.attempt,
                done=done,
                total=total,
            )

    def _finish(self, local: LocalAttempt, ended: Exit) -> None:
        self.executor.sweep(local.handle)
        # free when its supervisor says its last process was gone, if it says
        freed_at = min(self.clock.time(), ended.at or float("inf"))
        if ended.cause == "deadline" and local.eviction is not None:
            local.eviction.killed = True
        self._read_status(local)
        self._report_progress(local, final=True)
        del self.attempts[local.job_id]
        code = ended.code
        if ended.cause in ("lease", "agent_gone", CAUSE_LOST, CAUSE_UNSCHEDULABLE):
            why = (
                f"its lease ran out on node {self.name}: {ended.detail}"
                if ended.cause in ("lease", "agent_gone")
                else ended.detail
            )
            log.warning("job %s attempt %s: %s", local.job_id, local.attempt, why)
            self.journal.append(
                "requeue_lost",
                job_id=local.job_id,
                attempt=local.attempt,
                why=why,
                reason_code=ended.cause,
                usage=local.usage.report() if local.usage else None,
            )
            self._publish_view()
            self.metrics.attempt_ended(self.name, local.slice.queue, "lost")
            return
        reason_code = None
        if ended.cause in (CAUSE_OOM, CAUSE_IMAGE):  # a failure of the job's own
            local.ended_by = ended.detail
            reason_code = ended.cause
        elif local.walltime_kill_at is not None:
            reason_code = WALLTIME
        if ended.cause in PLATFORM_EVICTIONS and local.eviction is None:
            # the cluster took it back (an online pod's preemption, node pressure): an
            # eviction with the platform's grace as its deadline, requeued like ours
            local.eviction = EvictionClock(
                reason=PLATFORM_EVICTIONS[ended.cause],
                message=ended.detail,
                spike_at=min(ended.at or freed_at, freed_at),
                deadline_s=ended.grace_s or 0.0,
                killed=ended.code == 128 + signal.SIGKILL,
            )
        if ended.cause == "start":
            log.warning("job %s attempt %s: %s", local.job_id, local.attempt, ended.detail)
            self.journal.append(
                "finish_attempt",
                job_id=local.job_id,
                attempt=local.attempt,
                exit_code=code,
                why=ended.detail,
                final=True,
            )
            self._publish_view()
            self.metrics.attempt_ended(self.name, local.slice.queue, "failed")
            return
        fault = self.health.fault_on(local.slice.devices)
        if local.eviction is None and fault is not None and code not in (0, REQUEUE_EXIT_CODE):
            # it died of the fault before it could be warned: a move, not a failure
            local.eviction = EvictionClock(
                reason=EvictReason.GPU_FAULT.value,
                message=fault_message(self.name, fault),
                spike_at=fault.time,
                deadline_s=0.0,
            )
        eviction = None
        if local.eviction:
            local.eviction.freed_at = freed_at
            if local.eviction.reason in COOLDOWN_REASONS:  # online pressure
                for d in local.slice.devices:
                    self.last_eviction_at[d] = freed_at
            # the cooldown and the device's health must be on record before the requeue
            # can be seen, or the job could be placed right back where it was
            self._post_heartbeat()
            eviction = local.eviction.report(
                last_checkpoint_at=local.last_checkpoint_at, started_at=local.started_at
            )
        log.info(
            "job %s attempt %s exited %s%s",
            local.job_id,
            local.attempt,
            code,
            f" (evicted in {eviction['latency_s']:.3f}s)" if eviction else "",
        )
        self.journal.append(
            "finish_attempt",
            job_id=local.job_id,
            attempt=local.attempt,
            exit_code=code,
            eviction=eviction,
            why=local.ended_by,
            reason_code=reason_code,
            # what it used, evicted or not (it ran): right-sizing's figures
            usage=local.usage.report() if local.usage else None,
        )
        self._publish_view()  # gone from the view only once its end is journaled
        self.metrics.attempt_ended(
            self.name, local.slice.queue, _outcome(code, eviction, local.ended_by), eviction
        )

    def _deliver_leftover(self, leftover: Leftover) -> None:
        """Journal the end of an attempt a previous agent here left, if it had one."""
        ended = leftover.ended
        if ended is None:
            return  # killed: the store requeues it as lost
        job_id, attempt = leftover.job_id, leftover.attempt
        if ended.cause in (CAUSE_LOST, CAUSE_UNSCHEDULABLE, *PLATFORM_EVICTIONS):
            why = f"ended while no agent watched it on node {self.name}: {ended.detail}"
            self.journal.append(
                "requeue_lost", job_id=job_id, attempt=attempt, why=why, reason_code=ended.cause
            )
            return
        log.info(
            "job %s attempt %s ended (%s) while no agent watched it", job_id, attempt, ended.code
        )
        self.journal.append(
            "finish_attempt",
            job_id=job_id,
            attempt=attempt,
            exit_code=ended.code,
            why=ended.detail or None,
        )

    # -- what the store thread sees -----------------------------------------------------

    def _publish_view(self) -> None:
        """Show the store thread the attempts here, with the journal position they match:
        an attempt appears before its start is journaled and leaves after its end is."""
        view = {a.job_id: (a.attempt, a.eviction is not None) for a in self.attempts.values()}
        with self._shared:
            self._view = (self.journal.seq, view)

    def _get_view(self) -> View:
        with self._shared:
            return self._view

    def _post_heartbeat(self) -> None:
        """Journal a heartbeat with the devices as they are now."""
        now = self.clock.time()
        payload = {
            "started_at": self._started_at,
            "devices": self._device_reports(now),
            "stopping": self._stopping,
            "runs_jobs_of": self._runs_jobs_of(),
        }
        with self._shared:
            self._heartbeat_payload = payload
        self.journal.append("heartbeat")
        advertise = getattr(self.executor, "advertise", None)
        if advertise is not None:  # the executor tells its platform (pods: the node status)
            advertise(payload["devices"])

    def _get_heartbeat(self) -> dict[str, Any]:
        with self._shared:
            return self._heartbeat_payload

    def _device_reports(self, now: float) -> list[dict[str, Any]]:
        # the executor may know the pods' names (Kubernetes): else pods are named by UID
        names = getattr(self.executor, "pod_name_of", None)
        by_index = {s.index: s for s in self.latest}
        infos = {d.index: d for d in self.devices}
        views = []
        for d in self.device_views():
            reserve_c, reserve_m = self.forecasts.reserve(d.index, self.deadline_s)
            if d.planning_only:  # seconds-old figures: keep more back
                reserve_c += self.planning_margin.compute_pct
                reserve_m += self.planning_margin.memory_mib
            s = by_index.get(d.index)
            views.append(
                {
                    "index": d.index,
                    "memory_mib": d.memory_mib,
                    "mig_parent": infos[d.index].mig_parent,
                    "online_compute_pct": d.online_compute_pct,
                    "online_memory_mib": d.online_memory_mib,
                    "offline_compute_pct": s.offline_compute_pct if s else None,
                    "offline_memory_mib": s.offline_memory_mib if s else None,
                    "basis": s.basis if s else None,
                    "sample_ok": s.ok if s else True,
                    "online_pods": self._online_pods_of(s, names) if s else [],
                    "eviction_trigger": not d.planning_only,
                    "reserve_compute_pct": reserve_c,
                    "reserve_memory_mib": reserve_m,
                    "reserve_cold_for_s": self.forecasts.warmup_left_s(d.index, self.deadline_s),
                    "sampled_at": d.sampled_at,
                    "last_eviction_at": self.last_eviction_at.get(d.index),
                    **self.health.report(d.index, now),
                }
            )
        return [DeviceReport.model_validate(v).model_dump(mode="json") for v in views]

    def _online_pods_of(
        self, sample: DeviceSample, names: Callable[[str], str | None] | None
    ) -> list[str]:
        """Who the online processes of ``sample`` are (the same pids' names are reused
        for up to ``ONLINE_PODS_REFRESH_S``)."""
        mono = self.clock.monotonic()
        known = self._online_pods.get(sample.index)
        if (
            known is not None
            and known[0] == sample.online_pids
            and mono - known[1] < (ONLINE_PODS_REFRESH_S)
        ):
            return list(known[2])
        labels = online_pods(sample.online_pids, names=names)
        self._online_pods[sample.index] = (sample.online_pids, mono, labels)
        return list(labels)

    def _fence_if_cut_off(self) -> None:
        """Cut off from the store for half the heartbeat timeout, this node is about to
        be given up on and its attempts requeued elsewhere: kill them first, so no job
        ever runs twice at once.  Their checkpoints are on disk; the requeue resumes them."""
        silent_s = self.sync.silence_s()
        if silent_s < self.heartbeat_timeout_s / 2 or not self.attempts:
            return
        # a trial's trap: an agent thawed after a long stop said "before the scheduler
        # gives it to another node" of a job given away long before
        late = silent_s >= self.heartbeat_timeout_s
        why = (
            f"past the heartbeat timeout ({self.heartbeat_timeout_s:g}s): the scheduler "
            "may have given it to another node already; killing this copy"
            if late
            else "killing it before the scheduler gives it to another node"
        )
        for local in list(self.attempts.values()):
            log.error(
                "job %s attempt %s: cut off from the store for %.1fs; %s",
                local.job_id,
                local.attempt,
                silent_s,
                why,
            )
            self.executor.sweep(local.handle)
            del self.attempts[local.job_id]
        self._publish_view()


def device_views(
    node: str, devices: list[DeviceInfo], latest: list[DeviceSample]
) -> list[DeviceView]:
    """Node ``node``'s ``devices`` as the victim policy sees them, with the figures of
    ``latest`` (a device without a sample: no online usage)."""
    by_index = {s.index: s for s in latest}
    views = []
    for d in devices:
        s = by_index.get(d.index)
        views.append(
            DeviceView(
                node=node,
                index=d.index,
                memory_mib=d.memory_mib,
                online_compute_pct=s.online_compute_pct if s else 0.0,
                online_memory_mib=s.online_memory_mib if s else 0.0,
                sampled_at=s.time if s else 0.0,
                planning_only=bool(s and not s.eviction_trigger),
            )
        )
    return views


def calm_key(
    latest: list[DeviceSample], active: list[ActiveAttempt], margins: Margins
) -> tuple[Any, ...]:
    """Everything :func:`calm` and ``planning_only`` of the fast path's devices depend on
    besides the node's devices, which stay the same: each sample's figures but its time,
    the attempts as the victim policy sees them (:meth:`LocalAttempt.view`, the same
    objects while nothing changes) and the margins.  Both are pure: with the key of a tick
    that found every device calm or planning-only, a tick finds that again, and the fast
    path skips its devices (``tests/unit/test_agent_fast_path_calm.py``)."""
    figures = tuple(
        (s.index, s.online_compute_pct, s.online_memory_mib, s.eviction_trigger) for s in latest
    )
    return figures, tuple(active), margins


def calm(device: DeviceView, active: list[ActiveAttempt], margins: Margins) -> bool:
    """Whether ``device`` certainly needs no action of the fast path: none of its
    attempts is paused or suspended (nothing to thaw, restore or time out) and its slices
    fit beside the online usage with the margin (nothing to pause or evict).  Then
    :func:`~ebbtide.preemption.relief.respond` returns nothing; this only says so
    sooner."""
    here = on_device(device, active)
    if any(a.paused_at is not None or a.suspended_at is not None for a in here):
        return False
    return overflow(device, here, margins) == (0.0, 0.0)


def _most(values: list[float | None]) -> float | None:
    """The largest of ``values``; None when there is none, or one is unknown."""
    if not values or any(v is None for v in values):
        return None
    return max(v for v in values if v is not None)


def _outcome(code: int | None, eviction: dict[str, Any] | None, ended_by: str | None) -> str:
    """How an attempt ended, for ``ebbtide_attempts_ended_total``."""
    if eviction is not None:
        return "evicted"
    if code == 0:
        return "succeeded"
    if code == REQUEUE_EXIT_CODE:
        return "requeued"
    return "killed" if ended_by else "failed"


def _steady(make: Callable[[], Forecaster], source: Any) -> Callable[[], Forecaster]:
    """``make``, or where ``source`` says its online usage never changes (``steady``:
    ``--headroom static``) forecasters that keep no warm-up reserve: there is nothing to
    learn, and the cold reserve would keep a whole-GPU job waiting ``forecast_warmup_s``
    on a box with no online load at all."""
    if not getattr(source, "steady", False):
        return make

    def warm() -> Forecaster:
        forecaster = make()
        forecaster.warmup_s = 0.0
        return forecaster

    return warm
