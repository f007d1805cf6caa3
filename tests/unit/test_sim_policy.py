"""``ebb sim --policy FILE``: a policy file's windows on the simulator's virtual clock.

A cron window opens for one hour a day: offline work runs only inside it, and every slice
is free by the close (drained at close − deadline, the planner's WINDOW_CLOSING).  A lull
window opens only after online load stayed low for its sustained period.
"""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.config.policy import parse_policy
from ebbtide.sim.engine import Simulation
from ebbtide.sim.jobs import SimJob
from ebbtide.sim.metrics import Tally
from ebbtide.sim.online import OnlineLoad
from ebbtide.sim.policies import SimPolicy, from_policy_file
from ebbtide.sim.windows import SimWindows
from tests.unit.sim_builders import Fixed
from tests.unit.sim_builders import online as online_load

GIB = 1024.0
HOUR = 3600.0


class Logged(Simulation):
    """Records each attempt's [dispatch, free) interval and each eviction's instant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[list[float]] = []
        self.warned: list[float] = []
        self._open: dict[int, list[float]] = {}

    def _dispatch(self, d: Any) -> None:
        super()._dispatch(d)
        self._open[d.job_id] = [self.now, float("inf")]
        self.held.append(self._open[d.job_id])

    def _leave(self, att: Any) -> None:
        self._open.pop(att.job.id)[1] = self.now
        super()._leave(att)

    def _evict(self, att: Any, **kwargs: Any) -> None:
        self.warned.append(self.now)
        super()._evict(att, **kwargs)


def online(*steps: tuple[float, float, float], span: float, devices: int = 1) -> OnlineLoad:
    return online_load(*[list(steps)] * devices, span=span)


def long_job(key: int = 0, c: float = 25.0) -> SimJob:
    """10 h of work at ``c`` %, checkpointing every 10 min (1 s each)."""
    return SimJob(key, "test", 0.0, c, 0, 4096, 10 * HOUR, 600.0, 1.0, 30.0)


def simulate(load: OnlineLoad, policy_yaml: str, jobs: list[SimJob]) -> tuple[Logged, Tally]:
    policy = from_policy_file(parse_policy(policy_yaml))
    sim = Logged(load, jobs, policy, backlogged=True, latencies=Fixed(), debug=True)
    return sim, sim.run()


ONE_HOUR_A_DAY = """
apiVersion: ebbtide/v1
defaults: {eviction_cooldown_s: 0}
windows:
  - {name: hour, kind: cron, schedule: "0 1 * * *", duration: 1h, timezone: UTC}
"""


def test_cron_window_offline_work_only_inside_and_drained_by_the_close() -> None:
    """The trace starts at 00:00; the window is open 01:00-02:00 (t = 3600-7200)."""
    opens, closes = 1 * HOUR, 2 * HOUR
    load = online((0.0, 10.0, 8 * GIB), span=6 * HOUR, devices=2)
    sim, tally = simulate(load, ONE_HOUR_A_DAY, [long_job(0), long_job(1, 40.0)])
    assert sim.held, "nothing ran in the window"
    for start, end in sim.held:
        assert opens <= start < closes  # nothing dispatched outside the window
        assert end <= closes  # every slice is free by the close
    f = tally.figures(0.0)
    assert f["deadline_misses"] == 0 and f["wasted_work_frac"] == 0.0
    # drained: warned at close − deadline − lead, not earlier and not at the close
    drain = closes - 30.0 - 0.25
    assert sim.warned and all(w == pytest.approx(drain) for w in sim.warned)
    assert tally.progress_cs > 0


def test_cron_window_second_day() -> None:
    """Over 27 h the window opens twice; each opening's slices are free by its close."""
    load = online((0.0, 10.0, 8 * GIB), span=27 * HOUR)
    sim, _ = simulate(load, ONE_HOUR_A_DAY, [long_job()])
    windows = [(1 * HOUR, 2 * HOUR), (25 * HOUR, 26 * HOUR)]
    for start, end in sim.held:
        assert any(o <= start and end <= c for o, c in windows)
    assert {int(start // (24 * HOUR)) for start, _ in sim.held} == {0, 1}


LULL = """
apiVersion: ebbtide/v1
defaults: {eviction_cooldown_s: 0}
windows:
  - name: quiet
    kind: lull
    below: {compute_pct: 20, memory: 40GiB}
    for: 10m
    close_above: {compute_pct: 35, memory: 50GiB}
"""


def test_lull_window_opens_only_after_sustained_low_load() -> None:
    """Busy (60 %) until 1000 s, a 5-minute dip to 10 % (too short), busy again, then
    quiet from 2000 s on: the window opens at 2000 + heartbeat lag + 10 min, not before;
    the rise to 50 % at 5000 s closes it and the slices go."""
    load = online(
        (0.0, 60.0, 8 * GIB),
        (1000.0, 10.0, 8 * GIB),
        (1300.0, 60.0, 8 * GIB),
        (2000.0, 10.0, 8 * GIB),
        (5000.0, 50.0, 8 * GIB),
        span=6000.0,
    )
    sim, tally = simulate(load, LULL, [long_job()])
    starts = [s for s, _ in sim.held]
    heard = 2000.0 + 0.02 + 0.5  # the fall reaches the scheduler a heartbeat late
    assert starts and min(starts) >= heard + 600.0
    assert min(starts) <= heard + 600.0 + 1.0  # the next pass places it
    assert all(s < 5000.0 for s in starts)
    assert all(end <= 5000.0 + 2.0 for _, end in sim.held)  # gone once the window closed
    assert tally.figures(0.0)["deadline_misses"] == 0


def test_policy_defaults_configure_the_ebbtide_policy() -> None:
    p = from_policy_file(
        parse_policy(
            "apiVersion: ebbtide/v1\ndefaults: {margin_compute_pct: 7, margin_memory_mib: 1GiB,"
            " deadline_s: 12s, eviction_cooldown_s: 5s, forecast_compute_quantile: 0.8}\n"
        )
    )
    assert isinstance(p, SimPolicy) and p.name == "ebbtide"
    assert (p.margins.compute_pct, p.margins.memory_mib) == (7.0, 1024.0)
    assert p.deadline_s == 12.0 and p.cooldown_s == 5.0
    assert p.forecast is not None and p.forecast.window_s == 12.0
    assert p.forecast.compute_quantile == 0.8


def test_trace_clock_is_read_in_the_windows_timezone() -> None:
    policy = parse_policy(
        "apiVersion: ebbtide/v1\nwindows:\n  - {name: n, kind: cron, schedule: '0 22 * * *',"
        " until: '07:00', timezone: Asia/Shanghai}\n"
    )
    w = SimWindows(policy, ["gpu0"], clock_origin_s=21 * HOUR)
    w.refresh(0.0)
    assert "default" not in w.gates[("gpu0", 0)].open
    assert w.valid_until == pytest.approx(HOUR)  # opens at 22:00 local, t = 1 h
    w.refresh(w.valid_until)
    gate = w.gates[("gpu0", 0)].open["default"]
    assert gate.open_until == pytest.approx(10 * HOUR)  # closes 07:00, t = 10 h


def test_queue_protections_reach_the_agents_fast_path() -> None:
    """A compute spike with pausing off evicts the job, unless its queue protects it for
    its first hour (``min_runtime_s``): the simulated agent spares it, as the live one
    does (the spike then interferes with online work instead)."""
    load = online((0.0, 10.0, 8 * GIB), (600.0, 90.0, 8 * GIB), (900.0, 10.0, 8 * GIB), span=HOUR)
    job = SimJob(0, "test", 0.0, 50.0, 0, 4096, 10 * HOUR, 600.0, 1.0, 30.0)
    text = "apiVersion: ebbtide/v1\ndefaults: {{pause: false}}\nqueues: {{default: {queue}}}\n"
    tallies = {}
    for name, queue in (("plain", "{}"), ("protected", "{min_runtime_s: 1h}")):
        policy = from_policy_file(parse_policy(text.format(queue=queue)))
        sim = Logged(load, [job], policy, backlogged=False, latencies=Fixed(), debug=True)
        tallies[name] = sim.run()
    assert tallies["plain"].evictions >= 1
    assert tallies["protected"].evictions == 0
    assert tallies["protected"].interference_cs > tallies["plain"].interference_cs
