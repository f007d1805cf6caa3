"""The event loop of a simulation: a virtual clock that jumps from event to event.

(Longer than our modules should be: it is one event loop, and every handler below pushes
onto the same heap and changes the same devices and attempts; what stands alone already
does: the state (``state.py``), an eviction's outcome (``eviction.py``), what the planner is
handed (``planning.py``), the windows (``windows.py``), the latencies (``timing.py``), the
workload (``jobs.py``, ``online.py``, ``backlog.py``) and the measures (``metrics.py``,
``record.py``).)

It drives the product's own pure code: :func:`ebbtide.scheduling.planner.plan` on a
:class:`~ebbtide.scheduling.snapshot.Snapshot` built through the policy's
:class:`~ebbtide.scheduling.snapshot.PlanRules` (as the live scheduler builds its own: the
margins, pause rules, queue limits and backoff reach both), the node agent's decision step
(:func:`ebbtide.preemption.relief.respond`, sparing what the queues protect, as the live
agent's fast path calls it), the
:class:`~ebbtide.scheduling.forecast.Forecaster`, and the store's outcome policy
(:func:`ebbtide.queue.outcomes.decide`: what an eviction counts for, hence a job's
backoff).  Nothing sleeps.

Events, as in the live system:

- an **online step** changes a device's usage; the agent's next sample sees it within
  ``SAMPLE_PERIOD_S`` and, if online usage plus slices exceed capacity minus the margin,
  acts at once (the fast path): under the policy's
  :class:`~ebbtide.scheduling.snapshot.PauseRules` a compute shortfall *pauses* victims while
  memory fits, anything else *evicts* them; the same sample thaws paused attempts that fit
  again.  The scheduler hears of a rise at once and of a fall at the next heartbeat;
- a **pause** freezes an attempt in place (:mod:`ebbtide.sim.state`): it keeps its slice's
  memory, its compute is free ``drain_s`` later (the work in flight drains: an event of its
  own, so the interference of those milliseconds is counted), its phase makes no
  headway.  The agent samples the device again when the pause may end (``min_pause_s``
  later), when it must (``max_pause_s`` later: the relief evicts it to run elsewhere, or
  thaws it in place if it fits within the margin there again), and
  whenever a slice there frees compute; a thaw costs no restart.  A paused attempt that is
  evicted is thawed first, as the agent does, so that it can take its warning;
- a **suspension to host** (policy ``suspend_to_host: auto``): a memory shortage the
  relief would meet by evicting a pausable attempt suspends it instead where the live
  node could: the copy takes at most the job's deadline and half the attempts' lease
  (the agent's own estimate, :func:`~ebbtide.workers.suspend.suspend_time_s`), and the
  jobs suspended on the device stay within ``suspend_host_memory_pct`` of its share of
  host memory (:data:`~ebbtide.sim.timing.HOST_MIB_PER_DEVICE`).  It is paused at once;
  its memory leaves the GPU when the copy is done.  Restored when its memory and compute
  fit again (its memory is back at once, it runs once the copy back is done), or evicted
  after ``max_suspend_s``: its CUDA calls block, so it cannot take the warning and is
  killed at the deadline, keeping its last checkpoint.  While a copy runs the agent
  samples nothing on that device, and samples it again once the copy is done (the live
  agent's loop waits for the copy, so its other devices wait too: not modelled);
- the **scheduler plans** at the next ``PLAN_PERIOD_S`` tick after anything that could let
  a job in: a job arrived or was requeued, a slice came free, online usage or the forecast
  reserve fell, a window opened.  (A pass after a rise cannot place anything the last pass
  could not, so none is made; the fast path has already evicted.)
- **attempts** start, restore (a resumed attempt spends ``restart_overhead_s`` on the GPU,
  holding its slice, before it makes progress), run, checkpoint, finish, or are evicted:
  warning → checkpoint if it fits the deadline → exit → free (or kill at the deadline for
  a job that ignores it).

Under a policy file (``SimPolicy.rules``, see :mod:`ebbtide.sim.windows`) the planner also
gets the windows' gates and the queues' limits.  The gates are computed again at every cron
opening and close and whenever a lull window opens or closes on a device; a window opening
lets a pass place jobs; a pass also runs at every instant a drain falls due (close −
deadline) and at every :attr:`~ebbtide.scheduling.planner.Plan.wake_at` (a cooldown ending),
not only after trace steps.  Evictions the windows require (drains, closed windows,
shares) play out like any other, with the deadline the planner gave.

Between events nothing changes, so the metrics are exact integrals of step functions.
"""

from __future__ import annotations

import gc
import math
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ebbtide.preemption.relief import ActionKind, respond
from ebbtide.preemption.victims import COOLDOWN_REASONS, EvictReason
from ebbtide.queue.outcomes import decide
from ebbtide.queue.spec import REQUEUE_EXIT_CODE
from ebbtide.queue.states import JobState
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, headroom, overflow
from ebbtide.scheduling.forecast import Forecaster
from ebbtide.scheduling.planner import Dispatch, Plan, plan
from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    QueuedJob,
    Snapshot,
    protected,
)
from ebbtide.sim.agenda import Agenda
from ebbtide.sim.backlog import Backlog, EndlessStream
from ebbtide.sim.eviction import outcome
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.metrics import Tally
from ebbtide.sim.online import OnlineLoad
from ebbtide.sim.planning import (
    Candidates,
    device_view,
    placeable,
    surely_calm,
    window_bound,
)
from ebbtide.sim.policies import SimPolicy, in_window
from ebbtide.sim.state import (
    CHECKPOINTING,
    EVICTING,
    RESTORING,
    RUNNING,
    STARTING,
    SUM_SLACK,
    SimAttempt,
    SimDevice,
    SimJobState,
)
from ebbtide.sim.timing import (
    DISPATCH_LATENCY_S,
    HEARTBEAT_PERIOD_S,
    HOST_MIB_PER_DEVICE,
    PLAN_PERIOD_S,
    RESTART_OVERHEAD_S,
    Latencies,
)
from ebbtide.sim.windows import SimWindows, drain_due
from ebbtide.workers.suspend import host_refusal, suspend_time_s

(
    _STEP,
    _DEPART,
    _SAMPLE,
    _REPORT,
    _ATTEMPT,
    _RELEASE,
    _FREE,
    _ARRIVAL,
    _WINDOW,
    _PLAN,
    _RECORD,
    _GATES,
    _LULL,
    _WAKE,
    _DRAIN,
    _SUSPENDED,
    _RESTORED,
) = range(17)

#: Queued jobs of each shape handed to the planner at first (see :mod:`ebbtide.sim.backlog`).
PLAN_HEADS = 8
#: Float slack of the conservation checks, in percent or MiB.
_EPS = 1e-6
#: The cyclic garbage collector's thresholds while a run lasts (see :meth:`Simulation.run`).
RUN_GC_THRESHOLDS = (100_000, 10, 10)


class ConservationError(AssertionError):
    """The model handed out more than a device has (only checked with ``debug=True``)."""


class Simulation:
    """One policy over one workload.  ``run()`` returns the :class:`~ebbtide.sim.metrics.Tally`.

    ``backlogged``: the job stream repeated without end is queued at time 0 (the queue
    never runs dry, see :class:`~ebbtide.sim.backlog.EndlessStream`); otherwise each job
    arrives at its ``arrival_s / arrival_scale``.  ``debug`` checks after every change
    that no device's slices exceed its capacity, and that each planner pass on the
    candidate devices decides what one on every device would.  ``recorder`` (see
    :class:`ebbtide.sim.record.Recorder`) gets periodic samples for plots.  ``latencies``
    replaces the seeded random delays (tests pass fixed ones).  ``restart_overhead_s``:
    how long a resumed attempt restores on the GPU before it makes progress.
    """

    def __init__(
        self,
        load: OnlineLoad,
        stream: list[SimJob],
        policy: SimPolicy,
        *,
        backlogged: bool = True,
        arrival_scale: float = 1.0,
        seed: int = 0,
        debug: bool = False,
        recorder: Any = None,
        latencies: Latencies | None = None,
        restart_overhead_s: float = RESTART_OVERHEAD_S,
    ) -> None:
        if policy.deadline_s is not None:
            stream = [replace(spec, deadline_s=policy.deadline_s) for spec in stream]
        self.load = load
        self.stream = stream
        self.policy = policy
        self.backlogged = backlogged
        self.arrival_scale = arrival_scale
        self.debug = debug
        self.recorder = recorder
        self.lat = latencies or Latencies(seed)
        self.restart_overhead_s = restart_overhead_s
        self.tally = Tally()
        self.now = 0.0
        self.devices = [
            SimDevice(k, d, f"gpu{k}", load.device_memory_mib, forecaster=self._forecaster())
            for k, d in enumerate(load.devices)
        ]
        self._by_node = {d.node: d for d in self.devices}
        self._candidates = Candidates(self.devices)
        self.windows = (
            SimWindows(policy.rules, [d.node for d in self.devices], load.clock_origin_s)
            if policy.rules is not None and policy.colocate
            else None
        )
        #: the instants a pass is already due at (drains, wake-ups)
        self._wakes: set[float] = set()
        self.jobs: dict[int, SimJobState] = {}
        self.active: dict[int, SimAttempt] = {}
        #: what a pass takes from the policy, as the live scheduler's (see PlanRules)
        self.rules = policy.plan_rules(self.windows.limits if self.windows is not None else None)
        queue = policy.rules.queues.get("default") if policy.rules is not None else None
        #: a job evicted this often is held, not requeued (None: never)
        self.max_preemptions = queue.max_preemptions if queue is not None else None
        pause = policy.pause
        #: a slice paused this long may have to move: a pass looks at its device from then
        #: (a suspended slice is paused too, so the shorter of the two limits)
        self._pause_limit_s = (
            math.inf
            if not pause.enabled
            else min(pause.max_pause_s, pause.max_suspend_s)
            if pause.suspend
            else pause.max_pause_s
        )
        self.backlog = Backlog(self.rules)
        self._endless = EndlessStream(stream) if backlogged and policy.colocate else None
        self._agenda = Agenda()
        #: ``_push(t, kind, obj=None, aux=None)``: event ``kind`` at time ``t``
        self._push = self._agenda.push
        self._dirty = False
        self._plan_at: float | None = None
        self._window_open = policy.window is None
        self._handlers: dict[int, Callable[[Any, Any], None]] = {
            _STEP: self._on_step,
            _DEPART: self._on_depart,
            _SAMPLE: self._on_sample,
            _REPORT: self._on_report,
            _ATTEMPT: self._on_attempt,
            _RELEASE: self._on_release,
            _FREE: self._on_free,
            _ARRIVAL: self._on_arrival,
            _WINDOW: self._on_window,
            _PLAN: self._on_plan,
            _RECORD: self._on_record,
            _GATES: self._on_gates,
            _LULL: self._on_lull,
            _WAKE: self._on_wake,
            _DRAIN: self._on_drain,
            _SUSPENDED: self._on_suspended,
            _RESTORED: self._on_restored,
        }

    def _forecaster(self) -> Forecaster | None:
        f = self.policy.forecast
        if f is None:
            return None
        return Forecaster(
            (f.window_s,),
            history_s=f.history_s,
            compute_quantile=f.compute_quantile,
            memory_quantile=f.memory_quantile,
            warmup_s=f.warmup_s,
            cold_reserve=(f.cold_compute_pct, f.cold_memory_mib),
        )

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> Tally:
        span = self.load.span_s
        for dev in self.devices:
            self._push(dev.load.start_s, _STEP, dev)
            if dev.load.end_s < span:
                self._push(dev.load.end_s, _DEPART, dev)
        if self.policy.colocate:
            self._schedule_windows(span)
            if self.windows is not None:
                self._push(0.0, _GATES)
            if self._endless is not None:
                self._mark_dirty()
            else:
                for spec in self.stream:
                    t = spec.arrival_s / self.arrival_scale
                    if t < span:
                        self._push(t, _ARRIVAL, spec)
        if self.recorder is not None:
            self._push(0.0, _RECORD)
        handlers, pop = self._handlers, self._agenda.pop_before
        # Python's default thresholds (700, 10, 10) collect every 700 net allocations, and
        # most of a run's objects (views, heap entries) outlive a few hundred allocations,
        # so they reach the older generations and make full collections frequent; each
        # walks every live object (a million at ``--tile 70``): about a quarter of the
        # run's time there.  Collecting a hundred times less often frees the same garbage
        # (a little later) and decides nothing differently.
        thresholds = gc.get_threshold()
        gc.set_threshold(*RUN_GC_THRESHOLDS)
        try:
            while (event := pop(span)) is not None:
                t, _, kind, obj, aux = event
                self.now = t
                handlers[kind](obj, aux)
        finally:
            gc.set_threshold(*thresholds)
        self.now = span
        for dev in self.devices:
            self._account(dev)
        for att in self.active.values():
            self.tally.progress_cs += att.advance(span)
        return self.tally

    def _schedule_windows(self, span: float) -> None:
        window = self.policy.window
        if window is None:
            return
        origin = self.load.clock_origin_s
        self._window_open = in_window(window, origin)
        for day in range(math.ceil(span / 86400.0) + 1):
            for boundary, opens in ((window[0], True), (window[1], False)):
                t = (boundary - origin) % 86400.0 + day * 86400.0
                if 0.0 < t < span:
                    self._push(t, _WINDOW, None, opens)

    def _touch(self, dev: SimDevice) -> None:
        """What the scheduler sees of ``dev`` changed (its usage, its slices, its
        presence): the next pass judges again whether it could act there."""
        self._candidates.touch(dev)

    def _mark_dirty(self) -> None:
        self._dirty = True
        if self._plan_at is None:
            tick = (math.floor(self.now / PLAN_PERIOD_S) + 1) * PLAN_PERIOD_S
            self._plan_at = tick
            self._push(tick, _PLAN)

    # -- accounting -------------------------------------------------------------------------

    def _account(self, dev: SimDevice) -> None:
        """Integrate the device's metrics from where they stand up to now.

        It runs at nearly every event, so ``min`` and ``max`` of two are written out as
        conditionals that pick as they do (``min(a, b)``: ``b if b < a else a``)."""
        now = self.now
        dt = now - dev.accounted_to
        rec = self.recorder
        if rec is None:
            if dt <= 0:  # nothing to integrate since the last call
                dev.accounted_to = now
                return
        elif dev.k == rec.device_k and dev.present:
            rec.device_point(dev.accounted_to, dev.online_c, dev.offline_in_use())
        if dt > 0 and dev.present:
            c = dev.online_c
            t = self.tally
            spare = DEVICE_COMPUTE_PCT - c
            t.capacity_cs += DEVICE_COMPUTE_PCT * dt
            t.online_cs += c * dt
            t.spare_cs += spare * dt
            over = dev.held_c - spare
            if over > 0:
                t.interference_cs += (c if c < over else over) * dt  # min(over, c)
            unheld = spare
            if dev.attempts:
                # harvest: min(max(0.0, offline progress), spare), the progress of the
                # fractional slices running at their size and of the whole-GPU slices on
                # what online work leaves, max(0.0, spare)
                whole = dev.running_whole_c * (spare if spare > 0.0 else 0.0) / 100.0
                progress = dev.running_c + whole
                progress = progress if progress > 0.0 else 0.0
                harvest = spare if spare < progress else progress
                t.harvest_cs += harvest * dt
                paused_c = dev.paused_c
                t.slice_cs += dev.slice_c * dt
                t.paused_cs += paused_c * dt
                t.restart_cs += dev.restoring_c * dt
                # the spare not harvested: idle beside paused slices, then held by slices
                # making no progress (see ebbtide.sim.metrics)
                idle = spare - harvest
                unheld = 0.0
                if idle > 0:
                    paused = paused_c if paused_c < idle else idle  # min(idle, paused_c)
                    stalled = dev.slice_c - paused_c - dev.running_c - dev.running_whole_c
                    stalled = stalled if stalled > 0.0 else 0.0
                    rest = idle - paused
                    held = stalled if stalled < rest else rest  # min(rest, stalled)
                    t.idle_paused_cs += paused * dt
                    t.idle_held_cs += held * dt
                    unheld = idle - paused - held
            # of what no slice held where work may run: the margin first, then the reserve
            if unheld > 0 and self.policy.colocate and self._window_open:
                kept = self.policy.margins.compute_pct
                margin = kept if kept < unheld else unheld  # min(unheld, kept)
                rest = unheld - margin
                reserve = dev.reserve[0]
                t.idle_margin_cs += margin * dt
                t.idle_reserve_cs += (reserve if reserve < rest else rest) * dt
        dev.accounted_to = now

    def _check(self, dev: SimDevice) -> None:
        compute = sum(a.job.spec.compute_pct for a in dev.attempts.values())
        memory = sum(a.job.spec.memory_mib for a in dev.attempts.values())
        on_gpu = sum(a.job.spec.memory_mib for a in dev.attempts.values() if a.on_gpu)
        whole = sum(
            1
            for a in dev.attempts.values()
            if a.job.spec.gpus and a.phase == RUNNING and a.paused_at is None
        )
        if compute > DEVICE_COMPUTE_PCT + _EPS or memory > dev.memory_mib + _EPS:
            raise ConservationError(
                f"t={self.now:.3f} {dev.node}: slices hold {compute:g}% and {memory:g} MiB "
                f"of {DEVICE_COMPUTE_PCT:g}% and {dev.memory_mib:g} MiB"
            )
        if not (
            -_EPS <= dev.held_c <= compute + _EPS
            and abs(dev.held_m - memory) < _EPS
            and abs(dev.gpu_m - on_gpu) < _EPS
            and dev.running_whole_n == whole
        ):
            raise ConservationError(f"t={self.now:.3f} {dev.node}: held figures drifted")

    # -- the online side --------------------------------------------------------------------

    def _on_step(self, dev: SimDevice, _: Any) -> None:
        self._account(dev)
        load, i = dev.load, dev.next_step
        first = not dev.present
        dev.present = True
        old_c, old_m = dev.online_c, dev.online_m
        c, m = load.compute_pct[i], load.memory_mib[i]
        dev.online_c, dev.online_m = c, m
        dev.last_step_at = self.now
        dev.next_step = i + 1
        if dev.next_step < len(load.times_s):
            self._push(load.times_s[dev.next_step], _STEP, dev)
        if m > old_m and m <= dev.memory_mib < m + dev.gpu_m - _EPS:
            self.tally.oom_events += 1
        if c != old_c and dev.running_whole_n:
            for att in dev.attempts.values():
                if att.job.spec.gpus and att.phase == RUNNING and att.paused_at is None:
                    self.tally.progress_cs += att.advance(self.now)
                    self._run(att)
        if dev.forecaster is not None:
            dev.forecaster.observe(self.now, c, m)
        delay = self.lat.sample_delay()
        if self.policy.evict_on_rise and dev.attempts:
            self._push(self.now + delay, _SAMPLE, dev)
        fell = c < old_c or m < old_m
        lag = HEARTBEAT_PERIOD_S if fell and not first else 0.0
        self._push(self.now + delay + lag, _REPORT, dev, (c, m))

    def _on_depart(self, dev: SimDevice, _: Any) -> None:
        self._account(dev)
        dev.present = False
        self._touch(dev)
        for att in list(dev.attempts.values()):
            if att.phase != EVICTING:
                self._evict(att, spike_at=self.now)

    def _on_sample(self, dev: SimDevice, _: Any) -> None:
        """The agent's fast path: its sample shows online usage; it pauses or evicts at
        once if that is over, then thaws what fits again: what :func:`respond` says."""
        if not dev.present or not dev.attempts or self._agent_idle(dev):
            return
        aware, rules, margins = self.policy.checkpoint_aware, self.policy.pause, self.policy.margins
        views = [a.view or a.active_view(aware) for a in dev.attempts.values()]
        device = dev.view_with(
            online_compute_pct=dev.online_c, online_memory_mib=dev.online_m, sampled_at=self.now
        )
        if not dev.paused_n and overflow(device, views, margins) == (0.0, 0.0):
            return  # within capacity and nothing paused: the relief would do nothing
        if rules.suspend and any(a.toggle_until > self.now for a in dev.attempts.values()):
            return  # the agent waits for a copy to or from host (sampled again after it)
        can_suspend = self._can_suspend if rules.enabled and rules.suspend else None
        response = respond(device, views, margins, self.now, rules, self._guard(), can_suspend)
        refused = False
        for r in response.reliefs:
            att = self.active[r.job_id]
            if att.phase == EVICTING:
                continue
            if r.kind is ActionKind.PAUSE:
                if att.paused_at is None:
                    self._pause(att)
                continue
            if r.kind is ActionKind.SUSPEND:
                if self._suspend(att):
                    continue
                refused = True  # evicted instead, as the agent does
            moved = r.reason in (EvictReason.PAUSED_TOO_LONG, EvictReason.SUSPENDED_TOO_LONG)
            spike_at = self.now if moved else dev.last_step_at
            self._evict(att, spike_at=spike_at, reason=r.reason)
        if refused:  # the thaws counted on the suspension: left to the next sample
            self._push(self.now + self.lat.sample_delay(), _SAMPLE, dev)
            return
        for a in response.thaws:
            att = self.active[a.job_id]
            if att.paused_at is not None and att.phase != EVICTING:
                self._thaw(att)
        for a in response.restores:
            att = self.active[a.job_id]
            if att.suspended_at is not None and att.phase != EVICTING:
                self._restore(att)

    def _guard(self) -> Callable[[ActiveAttempt], bool] | None:
        """Which attempts the agent spares while only compute is short: its queue's
        protections (``preemptible: false``, ``min_runtime_s``), as the live agent's."""
        limits, now = self.rules.queues, self.now
        if not limits:
            return None
        return lambda a: protected(a, limits.get(a.queue), now)

    def _agent_idle(self, dev: SimDevice) -> bool:
        """Whether the agent's sample surely does nothing on ``dev`` now: within capacity
        minus the margin, no slice paused ``max_pause_s``, and none of those paused
        ``min_pause_s`` fits with ``thaw_hysteresis_pct`` to spare (so :func:`respond`
        would return nothing; on "not sure" the sample asks it)."""
        margins = self.policy.margins
        if not dev.surely_within(dev.online_c, dev.online_m, margins):
            return False
        if not dev.paused_n:
            return True
        rules, now = self.policy.pause, self.now
        room = DEVICE_COMPUTE_PCT - margins.compute_pct - dev.online_c - dev.awake_c + SUM_SLACK
        for a in dev.attempts.values():
            if a.paused_at is None:
                continue
            if a.suspended_at is not None:
                return False  # restored or moved by the relief's own reckoning
            paused_s = now - a.paused_at
            if paused_s >= rules.max_pause_s:
                return False
            need = 0.0 if a.job.spec.gpus else a.job.spec.compute_pct
            if paused_s >= rules.min_pause_s and need + rules.thaw_hysteresis_pct <= room:
                return False
        return True

    def _on_report(self, dev: SimDevice, usage: tuple[float, float]) -> None:
        """A heartbeat reaches the scheduler: the online usage and the forecast reserve."""
        if not dev.present:
            return
        c, m = usage
        watch = self.policy.watch_compute
        grew = not dev.reported or m < dev.seen_m or (watch and c < dev.seen_c)
        dev.seen_c, dev.seen_m = c, m
        if dev.forecaster is not None:
            reserve = dev.forecaster.reserve(self.policy.forecast_deadline_s)
            grew = grew or reserve[0] < dev.reserve[0] or reserve[1] < dev.reserve[1]
            dev.reserve = reserve
        if self.windows is not None:
            grew = self._observe_lulls(dev, c, m) or grew
        dev.view = None
        dev.reported = True
        self._touch(dev)
        if grew:  # headroom may have grown: a pass may place something
            self._mark_dirty()

    # -- the policy file's windows ----------------------------------------------------------

    def _on_gates(self, _: Any, __: Any) -> None:
        """A cron window opened or closed (or the run began): the gates change."""
        w = self.windows
        assert w is not None
        for close in w.refresh(self.now):
            self._drains_due(close)
        if w.valid_until < self.load.span_s:
            self._push(w.valid_until, _GATES)
        self._mark_dirty()

    def _drains_due(self, close: float) -> None:
        """A pass at the instant slices must be warned to be free by ``close``."""
        deadlines = {s.deadline_s for s in self.stream}
        for d in sorted(deadlines):
            self._wake_at(drain_due(close, d))

    def _observe_lulls(self, dev: SimDevice, c: float, m: float) -> bool:
        """The scheduler's sample of ``dev`` goes to its lull windows; True when one of
        them opened or closed (a pass may act)."""
        w = self.windows
        assert w is not None
        again = w.observe(dev.node, self.now, c, m)
        if again is not None and again > self.now:
            self._push(again, _LULL, dev, (c, m))
        return w.changed

    def _on_lull(self, dev: SimDevice, usage: tuple[float, float]) -> None:
        """No new sample since usage fell below a lull threshold: sample it again now."""
        if not dev.present or (dev.seen_c, dev.seen_m) != usage:
            return
        if self._observe_lulls(dev, *usage):
            self._mark_dirty()

    def _wake_at(self, t: float | None) -> None:
        if t is None or t <= self.now or t >= self.load.span_s or t in self._wakes:
            return
        self._wakes.add(t)
        self._push(t, _WAKE, None, t)

    def _on_wake(self, _: Any, t: float) -> None:
        """Time alone changes a decision now (a drain due, a cooldown ending): a pass."""
        self._wakes.discard(t)
        self._dirty = True
        self._pass()

    # -- the scheduler ----------------------------------------------------------------------

    def _on_plan(self, _: Any, __: Any) -> None:
        self._plan_at = None
        if not self._dirty:
            return
        self._pass()

    def _pass(self) -> None:
        self._dirty = False
        gated = self.windows is not None and bool(self.active)
        if not (
            self.policy.colocate and self._window_open and (self.backlog or self._endless or gated)
        ):
            return
        policy = self.policy
        heads = PLAN_HEADS
        self.backlog.ripen(self.now)
        while True:
            self._top_up(heads + 1)
            devs = self._planned_devices()
            queued = self.backlog.heads(heads, placeable(devs, self._headroom))
            snapshot = self._snapshot(devs, queued)
            # a pass sure to decide nothing is not made, only counted (debug makes it, and
            # checks that it decides nothing)
            idle = self._nothing_to_plan(snapshot, devs)
            decisions = Plan() if idle and not self.debug else plan(snapshot)
            self.tally.plan_passes += 1
            if self.debug:
                if idle and (decisions.dispatches or decisions.evictions):
                    raise ConservationError(
                        f"t={self.now:.3f}: a pass judged idle decided {decisions}"
                    )
                self._check_plan(decisions, self.backlog.heads(heads))
            if not self.backlog.saturated(decisions.dispatches, heads):
                break
            heads *= 4
        if policy.evict_on_rise or self.windows is not None:
            for ev in decisions.evictions:
                att = self.active[ev.job_id]
                if att.phase != EVICTING:
                    deadline = None if self.windows is None else ev.deadline_s
                    self._evict(att, spike_at=self.now, deadline_s=deadline, reason=ev.reason)
        for d in decisions.dispatches:
            self._dispatch(d)
        if len(decisions.dispatches) >= snapshot.max_dispatches:
            self._mark_dirty()
        self._wake_at(decisions.wake_at)
        self._wake_at(self.backlog.next_ready())  # a job's backoff ends: plan it then

    def _nothing_to_plan(self, snapshot: Snapshot, devs: list[SimDevice]) -> bool:
        """Whether the pass on ``snapshot`` surely decides nothing: no queued job fits
        anywhere, no window or quota evicts, and every device is calm (nothing paused,
        nothing over)."""
        if snapshot.queued or self.windows is not None:
            return False
        margins, watch = self.policy.margins, self.policy.watch_compute
        return all(
            surely_calm(device_view(d, watch_compute=watch, now=self.now), d, margins) for d in devs
        )

    def _planned_devices(self) -> list[SimDevice]:
        """The devices a pass plans on: those it could act on (see
        :mod:`ebbtide.sim.planning`), or every one when fleet-wide quotas count them all."""
        policy, w = self.policy, self.windows
        if w is not None and w.needs_full_view:
            return [d for d in self.devices if d.present and d.reported]
        devs = self._candidates.pick(
            policy.margins,
            smallest=self.backlog.smallest_fraction(),
            watch_compute=policy.watch_compute,
            checkpoint_aware=policy.checkpoint_aware,
            now=self.now,
            max_pause_s=self._pause_limit_s,
            pausing=policy.pause.enabled,
        )
        if w is None:
            return devs
        kept = set(map(id, devs))
        return [
            d
            for d in self.devices
            if id(d) in kept
            or (d.present and d.reported and window_bound(d, w.gates, "default", self.now))
        ]

    def _headroom(self, dev: SimDevice) -> tuple[float, float]:
        """``dev``'s headroom as the planner reckons it before it decides anything."""
        view = device_view(dev, watch_compute=self.policy.watch_compute, now=self.now)
        return headroom(view, dev.alloc_c(), dev.held_m, self.policy.margins)

    def _snapshot(self, devs: list[SimDevice], queued: list[QueuedJob]) -> Snapshot:
        aware, watch = self.policy.checkpoint_aware, self.policy.watch_compute
        return self.rules.snapshot(
            self.now,
            queued,
            [a.view or a.active_view(aware) for d in devs for a in d.attempts.values()],
            [device_view(d, watch_compute=watch, now=self.now) for d in devs],
            self.windows.gates if self.windows is not None else None,
        )

    def _check_plan(self, decisions: Plan, queued: list[QueuedJob]) -> None:
        """Debug: the pass on candidate devices and the jobs that fit one of them decides
        what a pass on all devices and all of ``queued`` would, with the jobs still in
        backoff too (the backlog hands them out only once their backoff ends)."""
        every = [d for d in self.devices if d.present and d.reported]
        full = plan(self._snapshot(every, [*queued, *self.backlog.waiting_heads(PLAN_HEADS)]))
        if full.dispatches != decisions.dispatches or [
            (e.job_id, e.attempt) for e in full.evictions
        ] != [(e.job_id, e.attempt) for e in decisions.evictions]:
            raise ConservationError(
                f"t={self.now:.3f}: a pass on candidate devices decided differently "
                f"({decisions}) from one on every device ({full})"
            )

    def _top_up(self, n: int) -> None:
        """Backlogged load: materialise the endless stream to ``n`` queued jobs a shape."""
        if self._endless is None:
            return
        for shape in self._endless.shapes():
            for _ in range(n - self.backlog.count(shape)):
                self._submit(*self._endless.take(shape), submitted_at=0.0)

    def _submit(self, job_id: int, spec: SimJob, submitted_at: float) -> None:
        job = SimJobState(job_id, spec, submitted_at=submitted_at)
        self.jobs[job_id] = job
        self.backlog.add(job.queued(self.windows is not None))

    def _on_arrival(self, spec: SimJob, _: Any) -> None:
        self._submit(spec.key + 1, spec, submitted_at=self.now)
        self._mark_dirty()

    def _on_window(self, _: Any, opens: bool) -> None:
        self._window_open = opens
        if opens:
            self._mark_dirty()
            return
        for att in list(self.active.values()):
            if att.phase != EVICTING:
                self._evict(att, spike_at=self.now)

    def _dispatch(self, d: Dispatch) -> None:
        job = self.jobs[d.job_id]
        self.backlog.remove(d.job_id)
        dev = self._by_node[d.node]
        self._account(dev)
        job.attempts += 1
        restart = self.restart_overhead_s if job.attempts > 1 else 0.0
        up_at = self.now + DISPATCH_LATENCY_S
        att = SimAttempt(
            job=job,
            number=job.attempts,
            dev=dev,
            dispatched_at=self.now,
            run_from=up_at + restart,
            progress_s=job.progress_s,
            saved_s=job.progress_s,
            updated_at=self.now,
            up_at=up_at,
            pausable=self.policy.pause.enabled,
        )
        spec = job.spec
        dev.attempts[job.id] = att
        dev.changed()
        dev.count(att, 1)
        self._touch(dev)
        self.active[job.id] = att
        if not spec.gpus:
            dev.held_c += spec.compute_pct
            att.holds_compute = True
        dev.held_m += spec.memory_mib
        dev.gpu_m += spec.memory_mib
        self.tally.dispatches += 1
        if self.debug:
            self._check(dev)
        self._push(up_at, _ATTEMPT, att, att.version)
        if self.policy.evict_on_rise:
            self._push(self.now + DISPATCH_LATENCY_S, _SAMPLE, dev)

    # -- attempts ---------------------------------------------------------------------------

    def _run(self, att: SimAttempt) -> None:
        """(Re)compute a running attempt's rate and schedule its next transition.  A
        whole-GPU slice yields to online compute: it runs on what online work leaves."""
        if att.job.spec.gpus:
            online = att.dev.online_c
            att.rate = max(0.0, DEVICE_COMPUTE_PCT - online) / DEVICE_COMPUTE_PCT
        att.version += 1
        t = att.next_transition(self.now)
        if t < math.inf:
            self._push(t, _ATTEMPT, att, att.version)

    def _on_attempt(self, att: SimAttempt, version: int) -> None:
        if att.version != version:
            return
        phase = att.phase
        # (a checkpoint's start and end are most of these events: tested first)
        if phase == RUNNING:
            self.tally.progress_cs += att.advance(self.now)
            if att.finished:
                self._complete(att)
                return
            self._set_phase(att, CHECKPOINTING)
            att.ckpt_progress_s = att.progress_s
            att.ckpt_end = self.now + att.job.spec.ckpt_cost_s
            att.version += 1
            self._push(att.ckpt_end, _ATTEMPT, att, att.version)
        elif phase == CHECKPOINTING:
            att.saved_s = att.ckpt_progress_s
            att.last_ckpt_at = self.now
            att.since_ckpt_s = 0.0
            self._set_phase(att, RUNNING)
            att.view = None
            att.updated_at = self.now
            self._run(att)
        elif phase == STARTING and att.run_from > self.now:
            self._set_phase(att, RESTORING)
            att.view = None
            self._push(att.run_from, _ATTEMPT, att, att.version)
        elif phase in (STARTING, RESTORING):
            self._set_phase(att, RUNNING)
            att.view = None
            att.updated_at = self.now
            self._run(att)

    def _set_phase(self, att: SimAttempt, phase: int) -> None:
        """Move ``att`` to ``phase``, with the device's metrics integrated up to now."""
        dev = att.dev
        self._account(dev)
        dev.count(att, -1)
        att.phase = phase
        dev.count(att, 1)

    def _complete(self, att: SimAttempt) -> None:
        self._leave(att)
        job = att.job
        job.progress_s = job.spec.work_s
        self.tally.jobs_completed += 1
        self.tally.jct_s.append(self.now - job.submitted_at)
        del self.jobs[job.id]
        self._mark_dirty()

    def _leave(self, att: SimAttempt) -> None:
        """The attempt's slice is free."""
        dev = att.dev
        self._account(dev)
        if att.holds_compute:
            dev.held_c -= att.job.spec.compute_pct
            att.holds_compute = False
        dev.held_m -= att.job.spec.memory_mib
        if att.on_gpu:
            dev.gpu_m -= att.job.spec.memory_mib
        del dev.attempts[att.job.id]
        dev.changed()
        dev.count(att, -1)
        self._touch(dev)
        del self.active[att.job.id]
        att.version += 1
        if self.debug:
            self._check(dev)
        self._resample(dev)

    def _evict(
        self,
        att: SimAttempt,
        *,
        spike_at: float,
        deadline_s: float | None = None,
        reason: EvictReason | None = None,
    ) -> None:
        """Warn the attempt (see :func:`ebbtide.sim.eviction.outcome` for what follows);
        ``deadline_s``: the eviction's deadline (None: the job's own); ``reason``: why (an
        eviction for online pressure cools the device down once the slice is free)."""
        spec = att.job.spec
        now = self.now
        att.pressure = reason in COOLDOWN_REASONS
        att.reason = reason
        att.restoring_state = False
        if att.suspended_at is not None:  # its CUDA calls block: killed at the deadline
            self.tally.evictions_suspended += 1
        elif att.paused_at is not None:  # a frozen job cannot take its warning: thaw it
            self.tally.evictions_paused += 1
            self._unfreeze(att)
        self.tally.progress_cs += att.advance(now)
        was = att.phase
        self._set_phase(att, EVICTING)
        att.view = None
        self._touch(att.dev)
        att.version += 1
        out = outcome(att, was, now, self.lat, deadline_s)
        lost = att.progress_s - out.saved_s
        t = self.tally
        if lost > 0:
            t.lost_cs += lost * spec.compute_pct
        att.saved_s = out.saved_s
        att.killed = out.killed
        t.evictions += 1
        t.evictions_killed += out.killed
        t.eviction_latency_s.append(out.free_at - spike_at)
        if out.free_at - now > (spec.deadline_s if deadline_s is None else deadline_s):
            t.deadline_misses += 1
        if out.release_at < out.free_at:
            self._push(out.release_at, _RELEASE, att)
        self._push(out.free_at, _FREE, att)
        if self.recorder is not None:
            self.recorder.eviction(att.dev.k, now, out.free_at - spike_at)

    def _on_release(self, att: SimAttempt, _: Any) -> None:
        """A cooperative job stopped computing; its memory stays until it exits."""
        if att.holds_compute:
            self._account(att.dev)
            att.dev.held_c -= att.job.spec.compute_pct
            att.holds_compute = False
            self._resample(att.dev)

    # -- pausing ----------------------------------------------------------------------------

    def _pause(self, att: SimAttempt) -> None:
        """Freeze ``att`` in place: it keeps its memory; its compute is free once its work
        in flight drained (``drain_s``); the agent looks again when the pause may end and
        when it must."""
        self._freeze(att)
        self.tally.pauses += 1
        rules = self.policy.pause
        self._sample_after(att.dev, rules.min_pause_s, rules.max_pause_s)

    def _freeze(self, att: SimAttempt) -> None:
        now, rules = self.now, self.policy.pause
        self.tally.progress_cs += att.advance(now)
        dev = att.dev
        self._account(dev)
        dev.count(att, -1)
        att.paused_at = now
        dev.count(att, 1)
        att.version += 1  # its phase makes no headway until thawed
        att.view = None
        self._pause_changed(dev)
        if rules.drain_s > 0:
            self._push(now + rules.drain_s, _DRAIN, att, now)
        else:
            self._on_drain(att, now)

    def _sample_after(self, dev: SimDevice, *delays_s: float) -> None:
        """The agent samples ``dev`` again each of ``delays_s`` from now."""
        for after_s in delays_s:
            t = self.now + after_s + self.lat.sample_delay()
            if t < self.load.span_s:
                self._push(t, _SAMPLE, dev)

    def _on_drain(self, att: SimAttempt, paused_at: float) -> None:
        """The paused attempt's work in flight is done: its compute is free."""
        if att.paused_at == paused_at and att.holds_compute:
            self._account(att.dev)
            att.dev.held_c -= att.job.spec.compute_pct
            att.holds_compute = False

    def _unfreeze(self, att: SimAttempt) -> None:
        """Let ``att`` run again where it stopped (no restart: it kept its context)."""
        dev = att.dev
        self._account(dev)
        dev.count(att, -1)
        att.thaw(self.now)
        dev.count(att, 1)
        if not att.holds_compute and not att.job.spec.gpus:
            dev.held_c += att.job.spec.compute_pct
            att.holds_compute = True
        self._pause_changed(dev)
        if self.debug:
            self._check(dev)

    def _pause_changed(self, dev: SimDevice) -> None:
        """Which slices on ``dev`` are paused changed, and nothing else the scheduler
        sees of it.  Where every slice may pause (the policy pauses), that moves neither
        its headroom nor its memory shortfall, so not whether a pass could act there
        (see :mod:`ebbtide.sim.planning`): only when a slice there may be paused too long
        is judged again.  (Nearly every pause and thaw: judging the device again each
        time was most of what keeping the candidates cost.)"""
        if self.policy.pause.enabled:
            self._candidates.pause_changed(dev)
        else:
            self._touch(dev)

    def _thaw(self, att: SimAttempt) -> None:
        """The agent thaws ``att``: its phase goes on from where it was paused."""
        self.tally.thaws += 1
        self._resume(att)

    def _resume(self, att: SimAttempt) -> None:
        self._unfreeze(att)
        if att.phase == RUNNING:
            self._run(att)
        else:
            self._push(att.phase_end(), _ATTEMPT, att, att.version)

    # -- suspending to host -----------------------------------------------------------------

    def _can_suspend(self, a: ActiveAttempt) -> bool:
        """Whether the node could suspend ``a`` to host, as the live agent judges it: the
        copy fits the job's deadline and half the attempts' lease, and the host has room."""
        limit_s = min(a.deadline_s, self.policy.lease_s / 2)
        if suspend_time_s(a.memory_mib) > limit_s:
            return False
        return self._host_refusal(self.active[a.job_id]) is None

    def _host_refusal(self, att: SimAttempt) -> str | None:
        """Why the host cannot hold ``att``'s memory beside what is suspended on its device
        already (None: it can); the same rule as the live agent's, on this device's share of
        host memory, which nothing else uses."""
        dev = att.dev
        held = sum(
            a.job.spec.memory_mib for a in dev.attempts.values() if a.suspended_at is not None
        )
        total = HOST_MIB_PER_DEVICE
        pct = self.policy.pause.host_memory_pct
        return host_refusal(att.job.spec.memory_mib, held, pct, total, total - held)

    def _suspend(self, att: SimAttempt) -> bool:
        """Suspend ``att`` to host: paused at once (if it is not already), its memory off
        the GPU once the copy is done; the agent looks again when it may be restored and
        when it must be moved.  False, and nothing done, when the host has no room for it
        now (suspensions earlier in the same sample took it): the caller evicts it."""
        if self._host_refusal(att) is not None:
            return False
        if att.paused_at is None:
            self._freeze(att)
        now, rules = self.now, self.policy.pause
        att.suspended_at = now
        att.view = None
        self._touch(att.dev)
        att.toggle_until = now + suspend_time_s(att.job.spec.memory_mib)
        self._push(att.toggle_until, _SUSPENDED, att, now)
        self.tally.suspensions += 1
        self._sample_after(att.dev, rules.min_pause_s, rules.max_suspend_s)
        return True

    def _on_suspended(self, att: SimAttempt, since: float) -> None:
        """The copy to host is done: the slice's memory is off the GPU."""
        dev = att.dev
        if att.suspended_at == since and att.on_gpu and dev.attempts.get(att.job.id) is att:
            att.on_gpu = False
            dev.gpu_m -= att.job.spec.memory_mib
            if self.debug:
                self._check(dev)
        self._sample_after_copy(dev)

    def _sample_after_copy(self, dev: SimDevice) -> None:
        """A copy to or from host is done: the agent samples ``dev`` again (it sampled
        nothing there meanwhile)."""
        if dev.present and dev.attempts:
            self._push(self.now + self.lat.sample_delay(), _SAMPLE, dev)

    def _restore(self, att: SimAttempt) -> None:
        """Bring ``att``'s memory back to its GPU: held there at once; it runs again once
        the copy is done (it stays paused until then)."""
        dev = att.dev
        att.suspended_at = None
        if not att.on_gpu:
            att.on_gpu = True
            dev.gpu_m += att.job.spec.memory_mib
        att.restoring_state = True
        att.view = None
        self._touch(dev)
        att.toggle_until = self.now + suspend_time_s(att.job.spec.memory_mib)
        self._push(att.toggle_until, _RESTORED, att)
        self.tally.restores += 1
        if self.debug:
            self._check(dev)

    def _on_restored(self, att: SimAttempt, _: Any) -> None:
        """The copy back is done: ``att`` runs on from where it was paused."""
        if not att.restoring_state:
            return  # evicted meanwhile
        att.restoring_state = False
        if att.paused_at is not None:
            self._resume(att)
        self._sample_after_copy(att.dev)

    def _resample(self, dev: SimDevice) -> None:
        """Compute came free on ``dev``: the agent's next sample may thaw a paused slice."""
        if dev.paused_n and dev.present:
            self._push(self.now + self.lat.sample_delay(), _SAMPLE, dev)

    def _on_free(self, att: SimAttempt, _: Any) -> None:
        if att.pressure and self.policy.cooldown_s > 0:
            # as the agent does: an eviction for online pressure keeps new work off the
            # device for the cooldown, from when its slice is free; a pass when it ends
            dev = att.dev
            dev.cooldown_until = max(dev.cooldown_until, self.now + self.policy.cooldown_s)
            dev.view = None
            self._wake_at(dev.cooldown_until)
        self._leave(att)
        job = att.job
        job.progress_s = att.saved_s
        # what the eviction counts for, by the store's own rule (a GPU fault counts none)
        verdict = decide(
            source=JobState.EVICTING,
            exit_code=None if att.killed else REQUEUE_EXIT_CODE,
            eviction={"reason_code": att.reason and att.reason.value, "killed": att.killed},
            cancel_requested=False,
            evictions=job.evictions,
            failures=0,
            max_attempts=job.attempts + 1,
            attempt=att.number,
            warning_signal=signal.SIGTERM,
        )
        job.evictions = verdict.evictions
        job.requeued_at = self.now
        if self.max_preemptions is not None and job.evictions >= self.max_preemptions:
            # the live scheduler holds it at its next pass (Store.hold_overpreempted)
            self.tally.jobs_held += 1
            del self.jobs[job.id]
        else:
            self.backlog.add(job.queued(self.windows is not None))
        self._mark_dirty()

    def _on_record(self, _: Any, __: Any) -> None:
        self.recorder.sample(self.now, self.devices)
        self._push(self.now + self.recorder.period_s, _RECORD)
