"""The simulator takes the backoff after repeated evictions from the policy, as the live
scheduler does: both build the planner's snapshot through
:class:`~ebbtide.scheduling.snapshot.PlanRules`, the planner refuses a job until its backoff
ends, and the eviction's count comes from the store's outcome policy
(:func:`ebbtide.queue.outcomes.decide`).

One job on one device whose online memory spikes for 30 s every 1,000 s: each spike leaves
no room for the job's slice, so it is evicted and requeued.
"""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.config.policy import parse_policy
from ebbtide.scheduling.snapshot import PlanRules, QueuedJob
from ebbtide.sim.backlog import Backlog
from ebbtide.sim.engine import Simulation
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.online import OnlineLoad
from ebbtide.sim.policies import from_policy_file
from tests.unit.sim_builders import Fixed, online

GIB = 1024.0
SPAN_S = 12_000.0
SPIKE_S = 30.0


def spiky() -> OnlineLoad:
    """8 GiB online, 78 GiB for 30 s at every 1,000 s (an 80 GiB device)."""
    steps = [(0.0, 10.0, 8 * GIB)]
    for t in range(1000, int(SPAN_S), 1000):
        steps += [(float(t), 10.0, 78 * GIB), (t + SPIKE_S, 10.0, 8 * GIB)]
    return online(steps, span=SPAN_S)


class Logged(Simulation):
    """Records each dispatch's instant and each requeue's (instant, evictions so far)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatched: list[float] = []
        self.requeued: list[tuple[float, int]] = []

    def _dispatch(self, d: Any) -> None:
        super()._dispatch(d)
        self.dispatched.append(self.now)

    def _on_free(self, att: Any, aux: Any) -> None:
        super()._on_free(att, aux)
        self.requeued.append((self.now, att.job.evictions))


def simulate(defaults: str) -> Logged:
    # the forecast forgets a spike at once: the job may come back after every one
    text = f"apiVersion: ebbtide/v1\ndefaults: {{forecast_history_s: 1, {defaults}}}\n"
    policy = from_policy_file(parse_policy(text))
    job = SimJob(0, "test", 0.0, 25.0, 0, 4096, 100 * SPAN_S, 600.0, 1.0, 30.0)
    sim = Logged(spiky(), [job], policy, backlogged=False, latencies=Fixed(), debug=True)
    sim.run()
    return sim


def test_policy_backoff_changes_the_simulated_decisions() -> None:
    free = simulate("eviction_cooldown_s: 0, backoff_base_s: 0")
    backoff = simulate("eviction_cooldown_s: 0, backoff_base_s: 1500, backoff_max_s: 86400")
    # without a backoff the job comes back after every spike
    assert len(free.dispatched) == 12
    assert [n for _, n in free.requeued] == list(range(1, 12))
    # with one, it waits 1500 s after its 2nd eviction, 3000 s after its 3rd...
    assert len(backoff.dispatched) < len(free.dispatched)
    for (requeued_at, evictions), dispatched_at in zip(
        backoff.requeued, backoff.dispatched[1:], strict=False
    ):
        wait = 1500.0 * 2 ** (evictions - 2) if evictions >= 2 else 0.0
        assert dispatched_at >= requeued_at + wait
    # ...and a pass runs when the backoff ends (the planner's wake_at), not at the next
    # online step: requeued at 2000 s + latencies, ready 1500 s later, no step then
    requeued_at, evictions = backoff.requeued[1]
    assert evictions == 2
    assert backoff.dispatched[2] == pytest.approx(requeued_at + 1500.0, abs=1.0)


def test_the_policy_files_backoff_reaches_the_simulation() -> None:
    text = "apiVersion: ebbtide/v1\ndefaults: {backoff_base_s: 45, backoff_max_s: 900}\n"
    policy = from_policy_file(parse_policy(text))
    assert (policy.backoff_base_s, policy.backoff_max_s) == (45.0, 900.0)
    rules = policy.plan_rules()
    live = parse_policy(text).plan_rules()
    assert (rules.backoff_base_s, rules.backoff_max_s) == (live.backoff_base_s, live.backoff_max_s)
    assert rules.margins == live.margins


def queued(job_id: int, *, evictions: int = 0, requeued_at: float | None = None) -> QueuedJob:
    return QueuedJob(
        id=job_id,
        priority=0,
        queue="default",
        owner="sim",
        compute_pct=25.0,
        gpus=0,
        memory_mib=4096,
        array_id=None,
        array_limit=None,
        attempts=1,
        requeued_at=requeued_at,
        evictions=evictions,
    )


def test_backlog_groups_jobs_in_backoff_apart_from_their_shape() -> None:
    """A job in backoff is kept apart from the ready jobs of its shape (so that refusing it
    cannot hide a ready job behind it) and handed to the planner once its backoff ends,
    besides the first ``n`` ready jobs of its shape; the ready group's count is what the
    endless stream tops up."""
    backlog = Backlog(PlanRules(backoff_base_s=100.0, backoff_max_s=1000.0))
    backlog.add(queued(1, evictions=3, requeued_at=50.0))  # ready at 250 s
    for i in (2, 3, 4):
        backlog.add(queued(i))
    backlog.ripen(100.0)
    assert [j.id for j in backlog.heads(1)] == [2]  # the planner would only refuse it
    assert backlog.next_ready() == 250.0
    backlog.ripen(250.0)
    assert sorted(j.id for j in backlog.heads(1)) == [1, 2]  # (the planner sorts them)
    assert backlog.next_ready() is None
    assert backlog.count((25.0, 4096, 0)) == 3
    backlog.remove(1)
    assert [j.id for j in backlog.heads(2)] == [2, 3]


def test_the_backlog_keeps_no_group_it_emptied() -> None:
    """A trap: each job evicted twice waits in a group of its own (its backoff ends at its
    own time), and an emptied group stayed, so that every pass read more of them the
    longer a run evicted (``ebb sim --no-pause`` on the GenAI day: 460 s against 30 s)."""
    backlog = Backlog(PlanRules(backoff_base_s=100.0, backoff_max_s=1000.0))
    for i in range(1, 1001):
        backlog.add(queued(i, evictions=2, requeued_at=float(i)))
    backlog.add(queued(5000))
    backlog.ripen(50.0)
    assert [j.id for j in backlog.heads(4)] == [5000]
    assert backlog.next_ready() == 101.0
    backlog.ripen(2000.0)
    assert len(backlog.heads(4)) == 1001 and backlog.next_ready() is None
    for i in range(1, 1001):
        backlog.remove(i)
    assert [j.id for j in backlog.heads(4)] == [5000]
    assert len(backlog._by_group) == len(backlog._ready) == 1
    assert backlog.smallest_fraction() == (25.0, 4096.0)
    # a group emptied while it waited is not handed out when its time comes
    backlog.add(queued(6000, evictions=2, requeued_at=2500.0))
    backlog.remove(6000)
    assert backlog.next_ready() is None
    backlog.ripen(5000.0)
    assert [j.id for j in backlog.heads(4)] == [5000]


def test_queue_max_preemptions_holds_the_job() -> None:
    """Queue ``default`` allows 3 evictions: the job is held after its 3rd, as the live
    scheduler holds it, and never dispatched again."""
    text = (
        "apiVersion: ebbtide/v1\ndefaults: {forecast_history_s: 1, eviction_cooldown_s: 0,"
        " backoff_base_s: 0}\nqueues: {default: {max_preemptions: 3}}\n"
    )
    job = SimJob(0, "test", 0.0, 25.0, 0, 4096, 100 * SPAN_S, 600.0, 1.0, 30.0)
    sim = Logged(spiky(), [job], from_policy_file(parse_policy(text)), backlogged=False)
    tally = sim.run()
    assert len(sim.dispatched) == 3 and tally.evictions == 3
    assert tally.jobs_held == 1 and not sim.jobs
