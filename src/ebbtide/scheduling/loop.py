"""The scheduler loop: snapshot the store, call the pure planner, apply its decisions.

(Longer than our modules should be: it is one class, the scheduler's cycle, whose steps
(snapshot, plan, apply, reconcile) and leadership share the same state; what is pure or
stands alone already does (``planner``, ``mirror``, ``leader``, ``retention``,
``policy_runtime``, ``preemption``).)

Applying is idempotent: a dispatch is a fenced store transition (``queued`` at the
attempt count the planner saw) followed by a message to the node; an eviction is a
fenced ``running → evicting`` followed by a message.  Losing a race is normal and skipped.

Each pass also reconciles: waiting jobs whose dependencies are met are queued; jobs
evicted more often than their queue allows are held; the attempts of nodes that stopped
heartbeating are requeued; dispatched attempts that never started are requeued; jobs
whose attempts keep being lost are held (``max_losses``, ``loss_window_s``).  Why each
queued job still waits (a closed window, a quota, a backoff, no room) is written to its
``reason`` for ``qstat``.  The policy's live side (reloads, lull state, wake-ups at cron
windows' openings) is :class:`~ebbtide.scheduling.policy_runtime.PolicyRuntime`; removing old
finished jobs (the policy's ``retention``) is :class:`~ebbtide.scheduling.retention.Retention`'s,
in a thread of its own while the scheduler leads.

The loop waits on its clock (:meth:`Clock.wait <ebbtide.clock.Clock.wait>`): ``PLAN_PERIOD_S``
between two passes, or until the instant the planner asked for if that comes sooner (a
drain before a window's close, the end of a backoff or a cooldown), and ``LEADER_RETRY_S``
between two tries to take the lead.  So on a :class:`~ebbtide.clock.FakeClock` it runs
pass by pass on fake time.

A pass reads what changed since the last one, not the whole queue: the queued jobs and
active attempts come from :class:`~ebbtide.scheduling.mirror.Mirror`, which applies the
jobs with new events and reads everything again when it must (its first pass, a new
leadership epoch, a store error, every few minutes).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.config.policy import Policy
from ebbtide.errors import NotLeader, StaleState, first_line
from ebbtide.messaging.liveness import NodeLiveness, blind_grace_s
from ebbtide.messaging.messages import (
    AttemptChanged,
    DeviceReport,
    EvictAttempt,
    StartAttempt,
    ValidationError,
)
from ebbtide.metrics import Metrics
from ebbtide.queue.drains import WHOLE_NODE
from ebbtide.queue.models import NodeRow
from ebbtide.queue.outcomes import NODE_SILENT, NOT_STARTED, TAKEN_BACK
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.queue.whose_jobs import singled_out
from ebbtide.scheduling.leader import LeaderLock
from ebbtide.scheduling.mirror import Mirror
from ebbtide.scheduling.planner import Dispatch, Plan, plan
from ebbtide.scheduling.policy_runtime import PolicyRuntime
from ebbtide.scheduling.retention import Retention
from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    DeviceView,
    GroupedJobs,
    QueuedJob,
    Snapshot,
)

log = logging.getLogger("ebbtide.scheduler")

#: How often the scheduler plans when nothing wakes it earlier (an event, or an instant
#: the planner asked for), in seconds.
PLAN_PERIOD_S = 0.5
#: How often a standby scheduler tries to become the active one, in seconds.
LEADER_RETRY_S = 1.0
#: How long the loop may go without a round before ``/healthz`` says it is stuck: far
#: more than a pass over a million jobs, or a standby's try for the lead, takes.
STALL_S = 120.0

Send = Callable[[str, StartAttempt | EvictAttempt], None]


class Scheduler:
    def __init__(
        self,
        store: Store,
        *,
        policy: Policy | None = None,
        policy_path: Path | None = None,
        send: Send | None = None,
        clock: Clock = SYSTEM_CLOCK,
        leader: LeaderLock | None = None,
        on_policy: Callable[[Policy], None] | None = None,
        wakeups: bool = True,
        metrics: Metrics | None = None,
        incremental: bool = True,
        liveness: NodeLiveness | None = None,
    ) -> None:
        """``liveness``: where nodes' heartbeats also arrive (Redis: each pass says
        that a scheduler reads them there, :mod:`ebbtide.messaging.liveness`; the store
        merges them into its nodes).
        ``incremental``: keep a copy of the queue that each pass brings up to date
        with what changed (:class:`~ebbtide.scheduling.mirror.Mirror`); False: read the
        whole queue every pass."""
        #: the store as this scheduler writes to it: fenced by its epoch while it leads
        self.store = store
        self._store = store
        self.runtime = PolicyRuntime(policy or Policy(), policy_path, on_change=on_policy)
        self._wakeups = wakeups
        self.send = send or (lambda node, cmd: None)
        self.clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the next instant the planner asked to plan again at (Unix seconds), if any
        self._wake_at: float | None = None
        self.leader = leader
        self.liveness = liveness
        #: the policy text and epoch last published (see :meth:`_publish_policy`)
        self._published: tuple[str | None, int | None] | None = None
        #: whether this scheduler plans now (it leads, or needs no lock)
        self.leading = False
        #: the last event looked at for lost attempts (None: none yet, see ``hold_lost``)
        self._losses_seen: int | None = None
        #: the queued jobs and active attempts as of the last pass (None: read each pass)
        self.mirror = Mirror() if incremental else None
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.watch_scheduler(self)
        self.metrics.leader.set(0)
        #: purges old finished jobs while this scheduler leads (the policy's retention)
        self.retention = Retention(
            lambda: self.store, lambda: self.policy, clock=clock, leading=lambda: self.leading
        )

    @property
    def policy(self) -> Policy:
        return self.runtime.policy

    def wake(self, _event: AttemptChanged | None = None) -> None:
        self._wake.set()

    # -- one pass -----------------------------------------------------------------------

    def snapshot(
        self,
        now: float,
        nodes: Sequence[NodeRow] | None = None,
        work: tuple[Sequence[QueuedJob], list[ActiveAttempt]] | None = None,
    ) -> Snapshot:
        """The planner's input now; ``nodes`` and ``work`` (the queued jobs and the active
        attempts): as this pass read them (None: read them)."""
        defaults = self.policy.defaults
        devices = []
        drains = {(d.node, d.device): d.describe() for d in self.store.drains.drained()}
        nodes = self.store.nodes() if nodes is None else nodes
        for node in nodes:
            if node.stopping or now - node.heartbeat_at > defaults.heartbeat_timeout_s:
                continue
            for d in node_devices(node.name, node.devices_json):
                self.runtime.observe(
                    node.name, d.index, d.sampled_at, d.online_compute_pct, d.online_memory_mib
                )
                evicted_at = d.last_eviction_at
                devices.append(
                    DeviceView(
                        node=node.name,
                        index=d.index,
                        memory_mib=d.memory_mib,
                        online_compute_pct=d.online_compute_pct,
                        online_memory_mib=d.online_memory_mib,
                        # expected online growth within the deadline guards admission
                        reserve_compute_pct=d.reserve_compute_pct,
                        reserve_memory_mib=d.reserve_memory_mib,
                        reserve_cold_for_s=d.reserve_cold_for_s,
                        sampled_at=d.sampled_at,
                        cooldown_until=(evicted_at + defaults.eviction_cooldown_s)
                        if evicted_at
                        else 0.0,
                        unavailable=unavailable(node.name, d, drains),
                        planning_only=not d.eviction_trigger,
                        runs_jobs_of=node.runs_jobs_of,
                    )
                )
        queued, active = self.work(now, nodes) if work is None else work
        gates = self.runtime.gates(now, [(d.node, d.index) for d in devices])
        return self.policy.plan_rules().snapshot(now, queued, active, devices, gates)

    def work(
        self, now: float, nodes: Sequence[NodeRow] | None = None
    ) -> tuple[Sequence[QueuedJob], list[ActiveAttempt]]:
        """The queued jobs (in scheduling order) and the active attempts now: the
        mirror's copy brought up to date (its groups telling apart the owners that a node
        of ``nodes`` singles out; None: read them), or the whole of both read."""
        if self.mirror is not None:
            epoch = self.leader.epoch if self.leader is not None else None
            told = frozenset(
                o
                for n in (self.store.nodes() if nodes is None else nodes)
                if (o := singled_out(n.runs_jobs_of)) is not None
            )
            return self.mirror.sync(self.store, now, epoch=epoch, singled_out=told)
        return self.store.queued_jobs(), self.store.active_attempts()

    def run_once(self) -> Plan:
        self._wake_at = None  # a pass that fails asks for nothing
        self.runtime.maybe_reload()
        self._publish_policy()
        if self.liveness is not None:
            # this pass's read of the nodes says so to the agents: they may write less
            self.liveness.lead(self.policy.defaults.heartbeat_timeout_s)
        now = self.clock.time()
        self.store.promote_waiting()
        for name, q in self.policy.queues.items():
            if q.max_preemptions is not None:
                for job_id in self.store.hold_overpreempted(name, q.max_preemptions):
                    log.info("job %s held: evicted %s times or more", job_id, q.max_preemptions)
        # read once a pass: reconciling and planning both go by them
        nodes = self.store.nodes()
        blind = self._blind()  # as of this read, whatever the rest of the pass takes
        queued, active = self.work(now, nodes)
        gone = self.reconcile(now, nodes, active, blind=blind)
        if gone:  # requeued: their slices are free; they are planned from the next pass
            active = [a for a in active if (a.job_id, a.attempt) not in gone]
        snapshot = self.snapshot(now, nodes, (queued, active))
        decisions = plan(snapshot, queued_in_order=True)  # the store gives it in order
        self.apply(decisions, now, snapshot.queued)
        self.store.set_reasons(decisions.blocked)
        self._wake_at = decisions.wake_at  # the loop's wait ends then (see _pause_s)
        return decisions

    def _publish_policy(self) -> None:
        """Publish the policy in effect for clients, once per change and per leadership
        epoch (a new leader publishes its own at its first pass)."""
        text = self.runtime.text
        key = (text, self.leader.epoch if self.leader is not None else None)
        if text is None or key == self._published:
            return
        source = str(self.runtime.path) if self.runtime.path else "the built-in defaults"
        self.store.publish_policy(text, source)
        self._published = key

    def apply(self, decisions: Plan, now: float, queued: Sequence[QueuedJob] = ()) -> None:
        """Carry out ``decisions``; ``queued`` (the snapshot's) times each dispatched
        job's admission wait for the metrics."""
        chosen = {d.job_id for d in decisions.dispatches}
        waiting: dict[int, QueuedJob] = {}
        if isinstance(queued, GroupedJobs):  # the copy's: each looked up by id
            waiting = {i: job for i in chosen if (job := queued.find(i)) is not None}
        else:
            for job in queued if chosen else ():
                # the jobs chosen are mostly near the head of the queue: read no further
                if job.id in chosen:
                    waiting[job.id] = job
                    if len(waiting) == len(chosen):
                        break
        # read now, not the snapshot's: an attempt may have started since it was taken
        active = (
            {(a.job_id, a.attempt): a for a in self.store.active_attempts()}
            if decisions.evictions
            else {}
        )
        for ev in decisions.evictions:
            a = active.get((ev.job_id, ev.attempt))
            if a is None:
                continue
            try:
                if a.state == JobState.DISPATCHED:
                    self.store.requeue_lost(
                        ev.job_id,
                        ev.attempt,
                        why=f"taken back before it started: {ev.message}",
                        reason_code=TAKEN_BACK,
                    )
                    self.send(ev.node, EvictAttempt(job_id=ev.job_id, attempt=ev.attempt))
                    continue
                # the deadline runs from when the decision is on record (a scheduler paused
                # between planning and writing must not eat the job's deadline)
                decided_at = self.clock.time()
                self.store.begin_eviction(
                    ev.job_id,
                    ev.attempt,
                    reason=ev.message,
                    reason_code=ev.reason.value,
                    deadline_s=ev.deadline_s,
                    spike_at=decided_at,
                    source="scheduler",
                )
            except StaleState:
                continue
            log.info("evict job %s attempt %s: %s", ev.job_id, ev.attempt, ev.message)
            self.send(
                ev.node,
                EvictAttempt(
                    job_id=ev.job_id,
                    attempt=ev.attempt,
                    reason=ev.reason.value,
                    message=ev.message,
                    spike_at=decided_at,
                    deadline_s=ev.deadline_s,
                ),
            )
        # one write for the pass's grants (a commit each took most of a busy pass), then
        # each agent told: a job no longer queued as planned is left out
        numbers = self._grant(decisions.dispatches)
        for d, number in zip(decisions.dispatches, numbers, strict=True):
            if number is None:
                continue
            log.info("dispatch job %s attempt %s to %s/%s", d.job_id, number, d.node, d.devices)
            q = waiting.get(d.job_id)
            if q is not None:
                since = q.requeued_at or q.submitted_at
                self.metrics.dispatched(q.queue, None if since is None else now - since)
            self.send(d.node, StartAttempt(job_id=d.job_id, attempt=number))

    def _grant(self, dispatches: Sequence[Dispatch]) -> list[int | None]:
        """The pass's grants in one write; if that write fails for a reason of one grant's
        own (not a lost race, not a lost leadership), one write each, so that one bad
        grant cannot keep every other from being granted pass after pass."""
        if not dispatches:
            return []
        try:
            return self.store.dispatch_many(dispatches)
        except NotLeader:
            raise
        except Exception:
            log.exception("granting %d slices at once failed; granting each alone", len(dispatches))
        numbers: list[int | None] = []
        for d in dispatches:
            try:
                numbers.extend(self.store.dispatch_many([d]))  # (a lost race: None)
            except NotLeader:
                raise
            except Exception:
                log.exception("granting job %s a slice failed; left for the next pass", d.job_id)
                numbers.append(None)
        return numbers

    def reconcile(
        self,
        now: float,
        nodes: Sequence[NodeRow] | None = None,
        active: Sequence[ActiveAttempt] | None = None,
        *,
        blind: bool | None = None,
    ) -> set[tuple[int, int]]:
        """Requeue attempts whose node is gone, or whose start never happened; return
        them as (job id, attempt).  ``nodes`` and ``active``: as this pass read them (None:
        read them); ``blind``: whether this scheduler could not tell a silent node when
        it read ``nodes`` (:meth:`_blind`; None: now)."""
        defaults = self.policy.defaults
        by_name = {n.name: n for n in (self.store.nodes() if nodes is None else nodes)}
        if blind is None:
            blind = self._blind()
        gone: set[tuple[int, int]] = set()
        for a in self.store.active_attempts() if active is None else active:
            node = by_name.get(a.node)
            why = code = seen = None
            silent = node is None or now - node.heartbeat_at > defaults.heartbeat_timeout_s
            if silent and node is not None and blind:
                pass  # its heartbeats may be in Redis, unread: wait (see _blind)
            elif silent:
                why, code = f"node {a.node} stopped heartbeating", NODE_SILENT
            elif (
                a.state == JobState.DISPATCHED
                and now - a.dispatched_at > defaults.dispatch_timeout_s
            ):
                why = f"node {a.node} did not start it within {defaults.dispatch_timeout_s:g}s"
                code = NOT_STARTED
                seen = JobState.DISPATCHED  # (not if it has started since it was read)
            if why is None:
                continue
            try:
                self.store.requeue_lost(
                    a.job_id,
                    a.attempt,
                    why=why,
                    reason_code=code,
                    max_losses=defaults.max_losses,
                    loss_window_s=defaults.loss_window_s,
                    state=seen,
                )
                gone.add((a.job_id, a.attempt))
                log.warning("job %s attempt %s lost: %s", a.job_id, a.attempt, why)
            except StaleState:
                pass
        # the losses node agents reported since the last pass: held before they are
        # planned again if they keep being lost
        held, self._losses_seen = self.store.hold_lost(
            defaults.max_losses, defaults.loss_window_s, after_event=self._losses_seen
        )
        for job_id in held:
            log.warning("job %s held: its attempts keep being lost", job_id)
        return gone

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        if self._wakeups:
            self.runtime.start_wakeups(self._wake.set)
        self._thread = threading.Thread(target=self.run, name="scheduler", daemon=True)
        self._thread.start()
        self.retention.start()

    def request_reload(self) -> None:
        self.runtime.request_reload()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.retention.stop()
        self._lead_as(False)
        if self.liveness is not None:
            self.liveness.stand_down()
        self.runtime.stop()
        if self.leader is not None:
            self.leader.release()

    def run(self) -> None:
        """The loop, in the calling thread, until :meth:`stop`: take the lead, plan pass
        after pass while leading, stand by when not.  :meth:`start` runs it in a thread
        of its own (with the window wake-ups and the retention thread); on a
        :class:`~ebbtide.clock.FakeClock` a test runs it in its own thread, pass by pass
        on fake time."""
        self.metrics.probes.watch("scheduler", STALL_S)
        try:
            while self._take_the_lead():
                self._lead()
        finally:
            self.metrics.probes.forget("scheduler")

    def _take_the_lead(self) -> bool:
        """Wait until this scheduler leads (at once without a leader lock); False when
        stopped first.  A store that cannot be reached is waited out, never fatal."""
        if self.leader is None:
            self._lead_as(not self._stop.is_set())
            return self.leading
        logged = False
        while not self._stop.is_set():
            try:
                took = self.leader.try_acquire()
                self.metrics.probes.beat("scheduler")
                if took:
                    assert self.leader.epoch is not None
                    self.store = self._store.fenced(self.leader.epoch)
                    self._lead_as(True)
                    log.info("this scheduler is the active one (epoch %s)", self.leader.epoch)
                    return True
                if not logged:
                    log.info("another scheduler is active; standing by")
                    logged = True
            except Exception as exc:
                why = first_line(exc)
                self.metrics.probes.beat(
                    "scheduler", ok=False, why=f"cannot reach the store: {why}"
                )
                log.warning("cannot reach the store to take the lead (%s); trying again", why)
            self.clock.wait(self._stop, LEADER_RETRY_S)
        return False

    def _lead(self) -> None:
        """Plan pass after pass while this scheduler leads; return when it does not."""
        while not self._stop.is_set():
            if self.leader is not None and not self.leader.still_held():
                self._stand_down("its lock or its epoch is gone")
                return
            started = self.clock.monotonic()
            try:
                self.run_once()
                self.metrics.pass_duration.observe(self.clock.monotonic() - started)
                self.metrics.probes.beat("scheduler")
            except NotLeader as exc:
                self._stand_down(str(exc))
                return
            except Exception as exc:
                why = first_line(exc)
                self.metrics.probes.beat("scheduler", ok=False, why=f"its last pass failed: {why}")
                log.exception("scheduler pass failed")
            self.clock.wait(self._wake, self._pause_s())
            self._wake.clear()

    def _pause_s(self) -> float:
        """How long to wait for the next pass: the period, or less when the planner asked
        to plan again sooner (a drain before a window's close, a backoff's end)."""
        if self._wake_at is None:
            return PLAN_PERIOD_S
        return max(0.0, min(PLAN_PERIOD_S, self._wake_at - self.clock.time()))

    def _lead_as(self, leading: bool) -> None:
        self.leading = leading
        self.metrics.leader.set(1 if leading else 0)

    def _blind(self) -> bool:
        """Whether this scheduler cannot tell a silent node yet: its reads of the nodes'
        liveness in Redis fail (or its first one did), for less than the grace in which
        every live agent is back to writing its heartbeats to the store
        (:func:`~ebbtide.messaging.liveness.blind_grace_s`)."""
        if self.liveness is None:
            return False
        blind_s = self.liveness.blind_for_s()
        return blind_s is not None and blind_s < blind_grace_s(
            self.policy.defaults.heartbeat_timeout_s
        )

    def _stand_down(self, why: str) -> None:
        log.error("this scheduler no longer leads (%s): standing by", why)
        self._lead_as(False)
        if self.liveness is not None:
            self.liveness.stand_down()
        if self.mirror is not None:
            self.mirror.reset()
        if self.leader is not None:
            self.leader.release()
        self.store = self._store


def node_devices(node: str, devices_json: str) -> list[DeviceReport]:
    """A node's heartbeat devices; one that does not validate is logged and left out
    (it takes no work until its agent reports it properly)."""
    out = []
    for raw in json.loads(devices_json or "[]"):
        try:
            out.append(DeviceReport.model_validate(raw))
        except ValidationError as exc:
            log.warning("node %s: malformed device report left out: %s", node, exc.errors()[:1])
    return out


def unavailable(node: str, device: DeviceReport, drains: dict[Any, str]) -> str:
    """Why nothing new may go to ``node``/``device``: a fault its agent reports, or an
    admin's drain of the device or the node; "" when it may take work."""
    if device.unhealthy:
        meaning = device.fault.meaning if device.fault else "a fault"
        return f"{node}/{device.index} is out of service: {meaning}"
    return drains.get((node, device.index)) or drains.get((node, WHOLE_NODE)) or ""
