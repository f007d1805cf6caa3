"""The node agent (``ebb worker``): runs attempts on this node's devices and takes them
back when the online tenants need the room.

One loop thread does everything that touches processes, so handlers stay short (a
message only puts a command in the inbox and wakes the loop).  Each tick (``SAMPLE_PERIOD_S``):

1. sample the headroom source;
2. run the commands in the inbox (start, evict);
3. reap attempts whose process ended, read their status files (checkpoints, progress);
4. kill attempts whose eviction deadline has come (the whole process group);
5. the fast path: if the sample shows online usage plus offline slices above capacity
   minus the margin, pick victims with the same victim policy the scheduler uses and warn
   them at once, with no round trip to the scheduler;
6. every ``HEARTBEAT_PERIOD_S``: heartbeat with the latest sample, and reconcile with the
   store (start attempts dispatched here whose message was lost; kill attempts the store
   no longer gives to this node).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shlex
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.errors import EbbtideError, StaleState
from ebbtide.preemption.enforcer import EvictionClock
from ebbtide.preemption.victims import EvictReason, evictions_for_device
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.scheduling.forecast import Forecaster
from ebbtide.scheduling.snapshot import ActiveAttempt, DeviceView, Margins, QueueLimits, protected
from ebbtide.units import signal_name
from ebbtide.workers.executor import Executor, Handle, Launch, LocalExecutor
from ebbtide.workers.headroom.base import DeviceSample, HeadroomSource

log = logging.getLogger("ebbtide.agent")

#: How often the agent samples headroom and checks its attempts, in seconds (≥ 10 Hz).
SAMPLE_PERIOD_S = 0.05
#: How often the agent looks at attempts being evicted, in seconds.
EVICTING_PERIOD_S = 0.005
#: How often the agent heartbeats and reconciles with the store, in seconds.
HEARTBEAT_PERIOD_S = 0.5


@dataclass
class LocalAttempt:
    job_id: int
    attempt: int
    priority: int
    queue: str
    devices: tuple[int, ...]
    compute_pct: float
    memory_mib: int
    gpus: int
    deadline_s: float
    signal: int
    handle: Handle
    dispatched_at: float
    started_at: float
    status_path: Path
    status_offset: int = 0
    last_checkpoint_at: float | None = None
    eviction: EvictionClock | None = None
    walltime_s: float | None = None
    #: why the agent ended it, when it was not the job's own doing (walltime, fencing)
    ended_by: str | None = None

    def view(self, node: str) -> ActiveAttempt:
        return ActiveAttempt(
            job_id=self.job_id,
            attempt=self.attempt,
            state=JobState.EVICTING if self.eviction else JobState.RUNNING,
            priority=self.priority,
            queue=self.queue,
            node=node,
            devices=self.devices,
            compute_pct=self.compute_pct,
            memory_mib=self.memory_mib,
            deadline_s=self.deadline_s,
            signal=self.signal,
            dispatched_at=self.dispatched_at,
            started_at=self.started_at,
            last_checkpoint_at=self.last_checkpoint_at,
            gpus=self.gpus,
        )


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
    ) -> None:
        self.name = name
        self.store = store
        self.source = source
        self.home = home
        self.margins = margins or Margins()
        self.clock = clock
        self.executor = executor or LocalExecutor()
        self.notify = notify  # callable(dict) that wakes the scheduler, or None
        self.mps = mps
        #: per-queue protections (min-runtime, preemptible) for the fast path
        self.queues: Mapping[str, QueueLimits] = queues or {}
        #: Unix seconds a slice was last taken back on each device (eviction cooldown)
        self.last_eviction_at: dict[int, float] = {}
        self.devices = source.devices()
        self.attempts: dict[int, LocalAttempt] = {}
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.latest: list[DeviceSample] = []
        #: expected online growth per device (the admission reserve in the heartbeat)
        self.forecasts = {d.index: (forecast or Forecaster)() for d in self.devices}
        #: the reserve is for growth within this deadline, in seconds
        self.deadline_s = deadline_s
        #: the scheduler gives up on a node silent this long; we fence at half of it
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._last_heartbeat_ok = clock.monotonic()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started_at = clock.time()
        self._next_heartbeat = 0.0

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._started_at = self.clock.time()
        self._heartbeat()
        self._thread = threading.Thread(target=self._run, name=f"agent-{self.name}", daemon=True)
        self._thread.start()

    def command(self, cmd: dict[str, Any]) -> None:
        """Queue a command from the scheduler (called from a message handler: stays short)."""
        self.inbox.put(cmd)
        self._wake.set()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Graceful stop: evict every attempt within its deadline, wait, then leave."""
        self.inbox.put({"op": "shutdown"})
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def kill(self) -> None:
        """Stop the loop without touching attempts (tests simulate a crash with this)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the loop must survive a bad tick; the store stays the truth
                log.exception("agent tick failed")
            if self._stopping and not self.attempts:
                self._finish_shutdown()
                return
            # while a slice is being taken back, look at it more often
            evicting = any(a.eviction for a in self.attempts.values())
            self._wake.wait(EVICTING_PERIOD_S if evicting else SAMPLE_PERIOD_S)
            self._wake.clear()

    # -- one tick -----------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock.time()
        pids = frozenset(a.handle.pid for a in self.attempts.values())
        self.latest = self.source.sample(now, pids)
        for sample in self.latest:
            forecast = self.forecasts.get(sample.index)
            if forecast is not None:
                forecast.observe(sample.time, sample.online_compute_pct, sample.online_memory_mib)
        while True:
            try:
                cmd = self.inbox.get_nowait()
            except queue.Empty:
                break
            self._handle(cmd, now)
        for local in list(self.attempts.values()):
            self._read_status(local)
            code = self.executor.poll(local.handle)
            if code is not None:
                self._finish(local, code)
            elif local.eviction and local.eviction.due(self.clock.time()):
                local.eviction.killed = True
                log.info(
                    "job %s attempt %s: deadline reached, killing", local.job_id, local.attempt
                )
                self.executor.sweep(local.handle)  # free by the deadline, not a tick later
                self._finish(local, self.executor.poll(local.handle) or 128 + signal.SIGKILL)
            elif (
                local.walltime_s is not None
                and not local.eviction
                and now - local.started_at > local.walltime_s
            ):
                log.info("job %s attempt %s: walltime exceeded", local.job_id, local.attempt)
                local.ended_by = f"walltime {local.walltime_s:g}s exceeded, killed"
                self.executor.signal(local.handle, signal.SIGKILL)
        self._fast_path(now)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + HEARTBEAT_PERIOD_S
            self._heartbeat()
            self._reconcile(now)

    def device_views(self) -> list[DeviceView]:
        by_index = {s.index: s for s in self.latest}
        views = []
        for d in self.devices:
            s = by_index.get(d.index)
            views.append(
                DeviceView(
                    node=self.name,
                    index=d.index,
                    memory_mib=d.memory_mib,
                    online_compute_pct=s.online_compute_pct if s else 0.0,
                    online_memory_mib=s.online_memory_mib if s else 0.0,
                    sampled_at=s.time if s else 0.0,
                )
            )
        return views

    def _fast_path(self, now: float) -> None:
        if not self.attempts:
            return
        active = [a.view(self.name) for a in self.attempts.values()]

        def guarded(a: ActiveAttempt) -> bool:
            return protected(a, self.queues.get(a.queue), now)

        for device in self.device_views():
            for ev in evictions_for_device(device, active, self.margins, now, guarded):
                local = self.attempts.get(ev.job_id)
                if local and local.attempt == ev.attempt and not local.eviction:
                    self._evict(
                        local,
                        ev.reason.value,
                        ev.message,
                        spike_at=device.sampled_at or now,
                        deadline_s=local.deadline_s,
                        source="agent",
                    )
                    active = [a.view(self.name) for a in self.attempts.values()]
                    self._next_heartbeat = 0.0  # let the scheduler see the spike at once

    # -- commands -----------------------------------------------------------------------

    def _handle(self, cmd: dict[str, Any], now: float) -> None:
        op = cmd.get("op")
        if op == "start":
            self._start(int(cmd["job_id"]), int(cmd["attempt"]))
        elif op == "evict":
            local = self.attempts.get(int(cmd["job_id"]))
            if local and local.attempt == int(cmd["attempt"]) and not local.eviction:
                self._evict(
                    local,
                    cmd.get("reason", "scheduler"),
                    cmd.get("message", ""),
                    spike_at=float(cmd.get("spike_at", now)),
                    deadline_s=float(cmd.get("deadline_s", local.deadline_s)),
                    source="scheduler",
                    already_recorded=True,
                )
        elif op == "shutdown":
            self._begin_shutdown(now)
        else:
            log.warning("unknown command %r", cmd)

    def _start(self, job_id: int, attempt: int) -> None:
        if self._stopping or job_id in self.attempts:
            return  # duplicate message, or leaving
        try:
            job = self.store.get(job_id)
        except EbbtideError:
            return
        if job.attempts != attempt or job.state != JobState.DISPATCHED or job.node != self.name:
            log.info("job %s attempt %s: stale start ignored", job_id, attempt)
            return
        spec = JobSpec.model_validate_json(job.spec_json)
        devices = tuple(int(d) for d in (job.devices or "").split(",") if d)
        attempt_dir = self.home / "logs" / str(job_id) / str(attempt)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        ckpt_dir = Path(spec.checkpoint_dir or self.home / "checkpoints" / str(job_id)).expanduser()
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        status_path = attempt_dir / "status.jsonl"
        argv = self._argv(spec, attempt_dir)
        env = self._env(spec, job, attempt, devices, ckpt_dir, status_path)
        launch = Launch(
            job_id=job_id,
            attempt=attempt,
            argv=argv,
            env=env,
            cwd=spec.cwd,
            stdout_path=attempt_dir / "stdout.log",
            stderr_path=attempt_dir / "stderr.log",
        )
        try:
            handle = self.executor.start(launch)
        except OSError as exc:
            log.warning("job %s attempt %s: could not start: %s", job_id, attempt, exc)
            launch.stderr_path.write_text(f"ebbtide: could not start {argv!r}: {exc}\n")
            self._safe(self.store.finish_attempt, job_id, attempt, exit_code=127)
            self._notify(job_id)
            return
        now = self.clock.time()
        local = LocalAttempt(
            job_id=job_id,
            attempt=attempt,
            priority=job.priority,
            queue=job.queue,
            devices=devices,
            compute_pct=job.compute_pct,
            memory_mib=job.memory_mib,
            gpus=job.gpus,
            deadline_s=job.deadline_s,
            signal=job.signal,
            handle=handle,
            dispatched_at=now,
            started_at=now,
            status_path=status_path,
            walltime_s=spec.walltime_s,
        )
        self.attempts[job_id] = local
        try:
            self.store.mark_started(
                job_id,
                attempt,
                pid=handle.pid,
                stdout_path=str(launch.stdout_path),
                stderr_path=str(launch.stderr_path),
            )
        except StaleState:
            log.info("job %s attempt %s: given up on before it started; killing", job_id, attempt)
            self.executor.sweep(handle)
            del self.attempts[job_id]
            return
        log.info("job %s attempt %s started pid %s on %s", job_id, attempt, handle.pid, devices)

    def _argv(self, spec: JobSpec, attempt_dir: Path) -> list[str]:
        if spec.command:
            return list(spec.command)
        script = attempt_dir / "job.script"
        script.write_text(spec.script or "")
        script.chmod(0o755)
        if (spec.script or "").startswith("#!"):
            first = (spec.script or "").splitlines()[0][2:].strip()
            return [*shlex.split(first), str(script), *spec.args]
        return ["/bin/sh", str(script), *spec.args]

    def _env(
        self,
        spec: JobSpec,
        job: Any,
        attempt: int,
        devices: tuple[int, ...],
        ckpt_dir: Path,
        status_path: Path,
    ) -> dict[str, str]:
        env = dict(os.environ)
        env.update(spec.env)
        env.update(
            {
                "EBBTIDE_JOB_ID": str(job.id),
                "EBBTIDE_ATTEMPT": str(attempt),
                "EBBTIDE_NODE": self.name,
                "EBBTIDE_CHECKPOINT_DIR": str(ckpt_dir),
                "EBBTIDE_RESUME_FROM": job.checkpoint_path or "",
                "EBBTIDE_WARNING_SIGNAL": signal_name(job.signal),
                "EBBTIDE_STATUS_FILE": str(status_path),
                "EBBTIDE_DEADLINE_S": f"{job.deadline_s:g}",
                "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices),
            }
        )
        if job.array_index is not None:
            env["EBBTIDE_ARRAY_INDEX"] = str(job.array_index)
        if self.mps:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, int(job.compute_pct)))
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{i}={job.memory_mib}M" for i in range(len(devices))
            )
        return env

    # -- eviction -----------------------------------------------------------------------

    def _evict(
        self,
        local: LocalAttempt,
        reason: str,
        message: str,
        *,
        spike_at: float,
        deadline_s: float,
        source: str,
        already_recorded: bool = False,
    ) -> None:
        local.eviction = EvictionClock(
            reason=reason, message=message, spike_at=spike_at, deadline_s=deadline_s
        )
        self.executor.signal(local.handle, local.signal)
        local.eviction.warned_at = self.clock.time()
        log.info(
            "job %s attempt %s: warned (%s): %s",
            local.job_id,
            local.attempt,
            signal_name(local.signal),
            message,
        )
        if not already_recorded:
            try:
                self.store.begin_eviction(
                    local.job_id,
                    local.attempt,
                    reason=message,
                    deadline_s=deadline_s,
                    spike_at=spike_at,
                    source=source,
                )
            except StaleState:
                pass  # the scheduler got there first; the eviction goes on all the same

    def _begin_shutdown(self, now: float) -> None:
        self._stopping = True
        for local in self.attempts.values():
            if not local.eviction:
                self._evict(
                    local,
                    EvictReason.SHUTDOWN.value,
                    f"node agent {self.name} is shutting down",
                    spike_at=now,
                    deadline_s=local.deadline_s,
                    source="agent",
                )
        self._heartbeat()

    def _finish_shutdown(self) -> None:
        self._heartbeat()
        for a in self.store.active_attempts(node=self.name):
            if a.state == JobState.DISPATCHED:
                self._safe(
                    self.store.requeue_lost,
                    a.job_id,
                    a.attempt,
                    why=f"node agent {self.name} shut down before starting it",
                )
        self._stop.set()

    # -- reaping ------------------------------------------------------------------------

    def _read_status(self, local: LocalAttempt) -> None:
        try:
            with open(local.status_path, "rb") as f:
                f.seek(local.status_offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        if not chunk:
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        local.status_offset += end + 1
        for line in chunk[: end + 1].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "checkpoint":
                at = float(rec.get("time") or self.clock.time())
                local.last_checkpoint_at = at
                if local.eviction and at >= (local.eviction.warned_at or local.eviction.spike_at):
                    local.eviction.checkpoint_after_warning = True
                self._safe(
                    self.store.record_checkpoint,
                    local.job_id,
                    local.attempt,
                    path=str(rec.get("path")),
                    at=at,
                    size_bytes=rec.get("size_bytes"),
                    duration_s=rec.get("duration_s"),
                )
            elif rec.get("type") == "progress":
                self._safe(
                    self.store.record_progress,
                    local.job_id,
                    local.attempt,
                    float(rec.get("done") or 0),
                    rec.get("total"),
                )

    def _finish(self, local: LocalAttempt, code: int) -> None:
        self.executor.sweep(local.handle)
        freed_at = self.clock.time()
        self._read_status(local)
        del self.attempts[local.job_id]
        eviction = None
        if local.eviction:
            local.eviction.freed_at = freed_at
            for d in local.devices:
                self.last_eviction_at[d] = freed_at
            # the cooldown must be on record before the requeue can be seen
            self._heartbeat()
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
        self._safe(
            self.store.finish_attempt,
            local.job_id,
            local.attempt,
            exit_code=code,
            eviction=eviction,
            why=local.ended_by,
        )
        self._notify(local.job_id)

    # -- heartbeat and reconciliation ---------------------------------------------------

    def _heartbeat(self) -> None:
        views = []
        for d in self.device_views():
            reserve_c, reserve_m = self.forecasts[d.index].reserve(self.deadline_s)
            views.append(
                {
                    "index": d.index,
                    "memory_mib": d.memory_mib,
                    "online_compute_pct": d.online_compute_pct,
                    "online_memory_mib": d.online_memory_mib,
                    "reserve_compute_pct": reserve_c,
                    "reserve_memory_mib": reserve_m,
                    "sampled_at": d.sampled_at,
                    "last_eviction_at": self.last_eviction_at.get(d.index),
                }
            )
        try:
            self.store.heartbeat(
                self.name, started_at=self._started_at, devices=views, stopping=self._stopping
            )
            self._last_heartbeat_ok = self.clock.monotonic()
        except Exception:
            log.exception("heartbeat failed: the store is unreachable")
            self._fence_if_cut_off()

    def _fence_if_cut_off(self) -> None:
        """Cut off from the store for half the heartbeat timeout, this node is about to
        be given up on and its attempts requeued elsewhere: kill them first, so no job
        ever runs twice at once.  Their checkpoints are on disk; the requeue resumes them."""
        silent_s = self.clock.monotonic() - self._last_heartbeat_ok
        if silent_s < self.heartbeat_timeout_s / 2 or not self.attempts:
            return
        for local in list(self.attempts.values()):
            log.error(
                "job %s attempt %s: no heartbeat for %.1fs; killing it before the scheduler "
                "gives it to another node",
                local.job_id,
                local.attempt,
                silent_s,
            )
            self.executor.sweep(local.handle)
            del self.attempts[local.job_id]

    def _reconcile(self, now: float) -> None:
        try:
            assigned = {a.job_id: a for a in self.store.active_attempts(node=self.name)}
        except Exception:
            log.exception("reconcile: store unavailable")
            return
        for job_id, local in list(self.attempts.items()):
            a = assigned.get(job_id)
            if a is None or a.attempt != local.attempt:
                log.warning("job %s attempt %s is no longer ours; killing", job_id, local.attempt)
                self.executor.sweep(local.handle)
                del self.attempts[job_id]
            elif a.state == JobState.EVICTING and not local.eviction:
                self._evict(
                    local,
                    "scheduler",
                    "evicted by the scheduler",
                    spike_at=now,
                    deadline_s=local.deadline_s,
                    source="scheduler",
                    already_recorded=True,
                )
        for job_id, a in assigned.items():
            if job_id in self.attempts:
                continue
            if a.state == JobState.DISPATCHED:
                self._start(job_id, a.attempt)
            else:  # running here by the store's account, but no such process: lost
                self._safe(
                    self.store.requeue_lost,
                    job_id,
                    a.attempt,
                    why=f"its process is no longer running on node {self.name}",
                )
                self._notify(job_id)

    # -- helpers ------------------------------------------------------------------------

    def _notify(self, job_id: int) -> None:
        if self.notify is not None:
            try:
                self.notify({"op": "changed", "job_id": job_id, "node": self.name})
            except Exception:
                log.exception("could not notify the scheduler")

    def _safe(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StaleState as exc:
            log.info("stale report dropped: %s", exc)
        except Exception:
            log.exception("store call %s failed", getattr(fn, "__name__", fn))
        return None
