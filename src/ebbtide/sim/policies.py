"""The policies a simulation compares, side by side on the same workload.

- ``ebbtide``: the product.  The planner admits into headroom net of a safety margin and
  of the forecast online growth within the eviction deadline
  (:class:`~ebbtide.scheduling.forecast.Forecaster`); the node agent acts on its own
  sample (fast path) with the graduated response
  (:func:`~ebbtide.preemption.relief.relief_for_device`): a compute spike while memory
  fits pauses the checkpoint-aware victim policy's picks, anything else evicts them, and
  paused attempts are thawed when they fit again (``--no-pause``: every shortfall evicts).
  With ``suspend_to_host: auto`` in its policy file (or ``--suspend-to-host``), a memory
  shortage suspends a pausable attempt to host memory where its node could (see
  :mod:`ebbtide.sim.engine`) rather than evicting it.
- ``exclusive``: no colocation; offline work never runs on these GPUs.
- ``static-night``: a fixed window, 22:00-07:00 in the trace's local clock, and no headroom
  awareness: the planner sees online compute as zero (it still cannot place a slice in
  memory the online tenant holds), nothing watches online usage during the window, and
  every attempt is evicted when the window closes.
- ``greedy``: current headroom only: no forecast, no margin (``Margins(0, 0)``), and victims
  chosen blind to checkpoints (the victim policy sees no checkpoint, so it takes the most
  recently started first).

The baselines never pause: every shortfall evicts, as before the graduated response.

Without a policy file the ``ebbtide`` policy keeps the built-in policy's eviction cooldown
and backoff after repeated evictions.  With ``ebb sim --policy FILE`` it runs under a policy
file (:func:`from_policy_file`): its margins, eviction deadline, eviction cooldown, backoff,
forecast and pause rules come from the file's ``defaults`` (pausing only where queue
``default`` allows it), and the planner gets the file's windows and queue limits
(see :mod:`ebbtide.sim.windows`).  Either way the planner's snapshot is built through
:class:`~ebbtide.scheduling.snapshot.PlanRules`, as the live scheduler's is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ebbtide.config.policy import Policy
from ebbtide.scheduling.forecast import DEFAULT_HISTORY_S
from ebbtide.scheduling.snapshot import Margins, PauseRules, PlanRules, QueueLimits

#: Pause rules of a policy that never pauses (every shortfall evicts).
NO_PAUSE = PauseRules(enabled=False)

#: Window of ``static-night`` in the trace's local clock, in seconds after midnight.
NIGHT_OPENS_S = 22 * 3600.0
NIGHT_CLOSES_S = 7 * 3600.0


@dataclass(frozen=True)
class ForecastSettings:
    """How the ``ebbtide`` policy forecasts online growth (:mod:`ebbtide.scheduling.forecast`)."""

    #: the window rises are measured over, in seconds (the jobs' eviction deadline)
    window_s: float = 30.0
    compute_quantile: float = 0.9
    memory_quantile: float = 1.0
    history_s: float = DEFAULT_HISTORY_S
    #: until this much history is seen, keep ``cold_compute_pct`` / ``cold_memory_mib``
    warmup_s: float = 600.0
    cold_compute_pct: float = 30.0
    cold_memory_mib: float = 8192.0


@dataclass(frozen=True)
class SimPolicy:
    name: str
    #: offline work runs at all
    colocate: bool = True
    margins: Margins = field(default_factory=Margins)
    forecast: ForecastSettings | None = None
    #: online rises evict: the node agent's fast path, and the planner's evict phase
    evict_on_rise: bool = True
    #: the planner sees online compute (False: it sees 0)
    watch_compute: bool = True
    #: the victim policy sees checkpoints
    checkpoint_aware: bool = True
    #: offline work only between these local times of day, in seconds after midnight;
    #: every attempt is evicted when the window closes
    window: tuple[float, float] | None = None
    #: a policy file: its windows and queue limits go to the planner (None: no windows)
    rules: Policy | None = field(default=None, compare=False)
    #: the eviction deadline of every job, in seconds (None: each job's own)
    deadline_s: float | None = None
    #: after an eviction for online pressure on a device, nothing new goes there for this
    #: long from when the slice is free, in seconds (as the node agent reports it; a pause,
    #: a move after a long pause or a window's close starts none)
    cooldown_s: float = 0.0
    #: graduated response: when a compute spike pauses rather than evicts (off: never)
    pause: PauseRules = NO_PAUSE
    #: a job evicted k >= 2 times waits backoff_base_s x 2^(k-2), at most backoff_max_s
    backoff_base_s: float = 0.0
    backoff_max_s: float = 0.0
    #: the attempts' lease on their node, in seconds (half the heartbeat timeout): a
    #: suspension's copy to host runs on the agent's loop, so it must take at most half
    #: of it (and at most the job's deadline), as the live agent requires
    lease_s: float = 5.0

    @property
    def forecast_deadline_s(self) -> float:
        """The deadline the forecast reserve is asked for, in seconds."""
        return self.forecast.window_s if self.forecast else 0.0

    def plan_rules(self, queues: Mapping[str, QueueLimits] | None = None) -> PlanRules:
        """What the planner's passes take from this policy (``queues``: its queue limits),
        as :meth:`ebbtide.config.policy.Policy.plan_rules` gives the live scheduler's."""
        return PlanRules(
            margins=self.margins,
            pause=self.pause,
            queues=queues or {},
            backoff_base_s=self.backoff_base_s,
            backoff_max_s=self.backoff_max_s,
        )


#: Margins of the ``ebbtide`` policy: compute in percent, memory in MiB.
EBBTIDE_MARGINS = Margins(compute_pct=5.0, memory_mib=2048.0)


def ebbtide_policy(
    margins: Margins = EBBTIDE_MARGINS,
    forecast: ForecastSettings | None = None,
    pause: PauseRules | None = None,
) -> SimPolicy:
    """The product; ``pause``: its pause rules (None: the defaults, pausing on).  Its
    eviction cooldown and its backoff after repeated evictions are the built-in policy's
    (``Policy()``'s defaults), as the live scheduler applies them with no policy file."""
    builtin = Policy()
    rules = builtin.plan_rules()
    return SimPolicy(
        "ebbtide",
        margins=margins,
        forecast=forecast or ForecastSettings(),
        pause=PauseRules() if pause is None else pause,
        cooldown_s=builtin.defaults.eviction_cooldown_s,
        backoff_base_s=rules.backoff_base_s,
        backoff_max_s=rules.backoff_max_s,
        lease_s=builtin.defaults.heartbeat_timeout_s / 2,
    )


def pause_rules_of(policy: Policy) -> PauseRules:
    """The pause rules a policy file gives queue ``default``'s jobs: its ``defaults``
    (read where present, so that a file of any version works), off where the queue says
    ``pause: false``, with the queue's own drain time."""
    d = policy.defaults
    rules: PauseRules = d.pause_rules() if hasattr(d, "pause_rules") else PauseRules()
    queue = policy.queues.get("default")
    enabled = rules.enabled and bool(getattr(queue, "pause", True))
    drain_s = getattr(queue, "pause_drain_s", None)
    return replace(
        rules, enabled=enabled, drain_s=rules.drain_s if drain_s is None else float(drain_s)
    )


def from_policy_file(policy: Policy) -> SimPolicy:
    """The ``ebbtide`` policy as the file's ``defaults`` configure it, under its windows and
    queue limits.  The simulated jobs declare no deadline and all go to queue ``default``,
    so each gets that queue's deadline (or ``defaults.deadline_s``)."""
    d = policy.defaults
    deadline = policy.deadline_for("default")
    rules = policy.plan_rules()
    return SimPolicy(
        "ebbtide",
        margins=rules.margins,
        forecast=ForecastSettings(
            window_s=deadline,
            compute_quantile=d.forecast_compute_quantile,
            history_s=d.forecast_history_s,
            warmup_s=d.forecast_warmup_s,
            cold_compute_pct=d.forecast_cold_compute_pct,
            cold_memory_mib=float(d.forecast_cold_memory_mib),
        ),
        rules=policy,
        deadline_s=deadline,
        cooldown_s=d.eviction_cooldown_s,
        pause=pause_rules_of(policy),
        backoff_base_s=rules.backoff_base_s,
        backoff_max_s=rules.backoff_max_s,
        lease_s=d.heartbeat_timeout_s / 2,
    )


def baselines() -> list[SimPolicy]:
    return [
        SimPolicy("exclusive", colocate=False),
        SimPolicy(
            "static-night",
            evict_on_rise=False,
            watch_compute=False,
            window=(NIGHT_OPENS_S, NIGHT_CLOSES_S),
        ),
        SimPolicy("greedy", margins=Margins(0.0, 0.0), checkpoint_aware=False),
    ]


def in_window(window: tuple[float, float], local_s: float) -> bool:
    """Whether ``local_s`` (seconds after midnight) lies in ``[opens, closes)``, which may
    wrap past midnight."""
    opens, closes = window
    t = local_s % 86400.0
    if opens <= closes:
        return opens <= t < closes
    return t >= opens or t < closes
