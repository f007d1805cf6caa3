"""Whole simulations on small random workloads: deterministic, and never handing out
more than a device has (``debug=True`` checks it after every change, and checks that each
planner pass on the candidate devices decides what a pass on every device would)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ebbtide.scheduling.snapshot import Margins
from ebbtide.sim.engine import ConservationError, Simulation
from ebbtide.sim.jobs import synthetic
from ebbtide.sim.metrics import METRIC_KEYS
from ebbtide.sim.online import DeviceLoad, OnlineLoad
from ebbtide.sim.policies import baselines, ebbtide_policy
from ebbtide.sim.runner import run_policies

SPAN_S = 3 * 3600.0


def random_online(seed: int, devices: int = 4, step_s: float = 60.0) -> OnlineLoad:
    """Bursty online load: mostly idle, jumps in compute and memory, one device leaving."""
    rng = random.Random(seed)
    out = []
    for k in range(devices):
        times, comp, mem = [], [], []
        t = 0.0
        while t < SPAN_S:
            times.append(t)
            comp.append(rng.choice([0.0, 0.0, 0.0, 5.0, 20.0, rng.uniform(0, 100)]))
            mem.append(rng.choice([4096.0, 4096.0, 20000.0, rng.uniform(0, 60000)]))
            t += step_s
        end = SPAN_S if k else SPAN_S / 2
        out.append(DeviceLoad(f"r{k}", tuple(times), tuple(comp), tuple(mem), end))
    return OnlineLoad("random", tuple(out), 80 * 1024.0, SPAN_S, 20 * 3600.0, step_s)


def policies() -> list[Any]:
    return [ebbtide_policy(), *baselines()]


def figures(seed: int, backlogged: bool = True) -> dict[str, dict[str, Any]]:
    out, _ = run_policies(
        random_online(seed),
        synthetic(seed, span_s=SPAN_S),
        policies(),
        backlogged=backlogged,
        seed=seed,
    )
    for f in out.values():
        f.pop("sim_wall_s")
    return out


def test_same_inputs_and_seed_same_figures() -> None:
    assert figures(3) == figures(3)


def test_another_seed_other_figures() -> None:
    assert figures(3)["ebbtide"] != figures(4)["ebbtide"]


@pytest.mark.parametrize("backlogged", [True, False])
@pytest.mark.parametrize("policy", policies(), ids=lambda p: p.name)
def test_conservation_holds_throughout(policy: Any, backlogged: bool) -> None:
    sim = Simulation(
        random_online(7),
        synthetic(7, span_s=SPAN_S),
        policy,
        backlogged=backlogged,
        arrival_scale=2.0,
        seed=7,
        debug=True,
    )
    tally = sim.run()
    assert tally.deadline_misses == 0
    if policy.colocate:
        assert tally.dispatches > 0


def test_every_metric_is_reported_for_every_policy() -> None:
    out = figures(1, backlogged=False)
    assert list(out) == ["ebbtide", "exclusive", "static-night", "greedy"]
    for f in out.values():
        assert set(METRIC_KEYS) - {"sim_wall_s"} <= set(f)
    assert out["exclusive"]["harvest_efficiency"] == 0.0


@pytest.mark.parametrize("backlogged", [True, False])
def test_where_the_spare_went_adds_up(backlogged: bool) -> None:
    """Harvested, lost to evictions, idle beside pauses, held without progress, not held:
    every policy's split of the spare adds up to all of it."""
    split = ("spare_lost_frac", "spare_paused_frac", "spare_held_frac", "spare_unheld_frac")
    for name, f in figures(5, backlogged=backlogged).items():
        parts = [f["harvest_efficiency"], *(f[k] for k in split)]
        assert all(0.0 <= x <= 1.0 for x in parts), name
        assert sum(parts) == pytest.approx(1.0, abs=1e-5), name
    every = figures(5, backlogged=backlogged)
    ebbtide = every["ebbtide"]
    assert ebbtide["spare_unheld_frac"] > 0.0  # the margin alone keeps 5 % unheld
    for name, f in every.items():  # the named parts of what no slice held are parts of it
        named = f["spare_margin_frac"] + f["spare_reserve_frac"]
        assert 0.0 <= named <= f["spare_unheld_frac"] + 1e-6, name
    # the margin's part is at most the margin (5 of the at most 100 % spare per device) ...
    assert 0.0 < ebbtide["spare_margin_frac"] <= 0.05 / (1 - ebbtide["utilization_before"])
    # ... and nothing is put down to it where no offline work may run
    assert every["exclusive"]["spare_margin_frac"] == every["exclusive"]["spare_reserve_frac"] == 0
    assert every["greedy"]["spare_margin_frac"] == 0  # no margin, no forecast


def test_the_check_catches_a_device_over_capacity() -> None:
    sim = Simulation(random_online(1), synthetic(1, span_s=SPAN_S), ebbtide_policy(), debug=True)
    dev = sim.devices[0]
    dev.held_m = 1.0  # the held figures no longer match the (no) slices
    with pytest.raises(ConservationError):
        sim._check(dev)


def test_margins_are_the_products() -> None:
    assert ebbtide_policy().margins == Margins()
