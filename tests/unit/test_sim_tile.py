"""``ebb sim --tile N``: the fleet repeated with shifted phases, the stream with it, and a
whole simulation on a tiled fleet (its candidate devices checked against every device)."""

from __future__ import annotations

import bisect
from dataclasses import replace

import pytest

from ebbtide.errors import UserError
from ebbtide.scheduling.snapshot import Margins
from ebbtide.sim.cli import parse_tile
from ebbtide.sim.engine import Simulation
from ebbtide.sim.jobs import SimJob, synthetic
from ebbtide.sim.online import DeviceLoad
from ebbtide.sim.planning import Candidates
from ebbtide.sim.policies import ebbtide_policy
from ebbtide.sim.runner import describe_workload
from ebbtide.sim.state import EVICTING, RUNNING, STARTING, SimAttempt, SimDevice, SimJobState
from ebbtide.sim.tile import (
    TILE_MAX,
    TILE_MAX_PHASE_S,
    shift_device,
    tile_load,
    tile_phases,
    tile_stream,
)
from tests.unit.test_sim_runs import SPAN_S, random_online


def usage_at(dev: DeviceLoad, t: float) -> tuple[float, float]:
    i = bisect.bisect_right(dev.times_s, t) - 1
    return dev.compute_pct[i], dev.memory_mib[i]


def integral(dev: DeviceLoad) -> tuple[float, float]:
    """Online compute and memory × time while the device is present."""
    ends = (*dev.times_s[1:], dev.end_s)
    spans = [max(0.0, min(e, dev.end_s) - t) for t, e in zip(dev.times_s, ends, strict=True)]
    return (
        sum(c * s for c, s in zip(dev.compute_pct, spans, strict=True)),
        sum(m * s for m, s in zip(dev.memory_mib, spans, strict=True)),
    )


def test_tile_two_doubles_the_fleet_with_a_shifted_copy() -> None:
    load = random_online(3)
    tiled = tile_load(load, 2, seed=0)
    n = len(load.devices)
    assert len(tiled.devices) == 2 * n
    assert tiled.devices[:n] == load.devices  # copy 0 is the recorded fleet as it is
    (phase,) = tile_phases(2, seed=0)[1:]
    assert 0 < phase < TILE_MAX_PHASE_S
    for orig, copy in zip(load.devices, tiled.devices[n:], strict=True):
        assert copy.name == f"{orig.name}/1"
        assert (copy.start_s, copy.end_s) == (orig.start_s, orig.end_s)  # same presence
        assert copy.times_s != orig.times_s  # not in lockstep
        assert integral(copy) == pytest.approx(integral(orig))  # the same online work
        life = orig.end_s - orig.start_s
        for x in (0.0, 17.0, 1234.5, life / 2, life - 1.0):
            shifted = orig.start_s + (x + phase) % life
            assert usage_at(copy, shifted) == usage_at(orig, orig.start_s + x)


def test_tile_is_reproducible_and_seeded() -> None:
    load = random_online(3)
    assert tile_load(load, 3, seed=5) == tile_load(load, 3, seed=5)
    assert tile_phases(3, seed=5) != tile_phases(3, seed=6)
    assert tile_phases(4, seed=5)[:3] == tile_phases(3, seed=5)  # a copy keeps its phase
    assert tile_load(load, 1, seed=5) is load


def test_a_shift_wraps_within_the_devices_presence() -> None:
    dev = DeviceLoad("d", (100.0, 160.0, 220.0), (10.0, 50.0, 20.0), (1.0, 2.0, 3.0), 300.0)
    copy = shift_device(dev, 60.0 + 200.0 * 5, "d/1")  # 60 s once the 200 s life wraps
    # the last step (220-300) is cut by the wrap: its last 60 s first, its first 20 s last
    assert copy.times_s == (100.0, 160.0, 220.0, 280.0)
    assert copy.compute_pct == (20.0, 10.0, 50.0, 20.0)
    assert copy.memory_mib == (3.0, 1.0, 2.0, 3.0)
    assert shift_device(dev, 200.0, "d/2").compute_pct == dev.compute_pct


def test_tile_stream_repeats_the_jobs_with_unique_keys() -> None:
    stream = synthetic(2, span_s=3600.0)
    tiled = tile_stream(stream, 3)
    assert len(tiled) == 3 * len(stream)
    assert sorted(j.key for j in tiled) == list(range(3 * len(stream)))
    assert [j.arrival_s for j in tiled] == sorted(j.arrival_s for j in tiled)
    assert tile_stream(stream, 1) is stream


def test_workload_says_how_many_copies() -> None:
    load = tile_load(random_online(3), 2, seed=0)
    w = describe_workload(load, "x", "y", [], backlogged=True, arrival_scale=1.0, seed=0, tile=2)
    assert (w["tile"], w["devices"]) == (2, 2 * len(random_online(3).devices))


@pytest.mark.parametrize("text", ["0", "-3", str(TILE_MAX + 1), "two", "1.5", ""])
def test_bad_tile_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError, match="--tile"):
        parse_tile(text)
    assert parse_tile(" 70 ") == 70


@pytest.mark.parametrize("seed", [7, 11])
def test_a_tiled_fleet_simulates_within_capacity(seed: int) -> None:
    """Three copies: conservation after every change, and every pass on the candidate
    devices decides what a pass on every device would (``debug``), devices short of
    compute where slices pause left out."""
    load = tile_load(random_online(seed), 3, seed=seed)
    stream = synthetic(seed, span_s=SPAN_S)
    sim = Simulation(load, stream, ebbtide_policy(), seed=seed, debug=True)
    tally = sim.run()
    assert tally.deadline_misses == 0
    assert tally.pauses > 0 and tally.dispatches > 0
    again = Simulation(load, stream, ebbtide_policy(), seed=seed).run()
    assert again.figures(0.0) == tally.figures(0.0)


def test_candidates_take_a_device_once_its_pause_ran_too_long() -> None:
    """A packed device joins the candidates when a slice there has been paused
    ``max_pause_s`` (the planner moves it), without being touched again, and leaves them
    once the slice is thawed."""
    dev = SimDevice(0, DeviceLoad("d", (0.0,), (90.0,), (0.0,), 1e6), "gpu0", 81920.0)
    dev.present = dev.reported = True
    dev.seen_c = 90.0  # 100 − 90 online − 5 margin − 10 held: no room for a 5 % job
    spec = SimJob(0, "t", 0.0, 10.0, 0, 1024, 1e5, 600.0, 1.0, 30.0)
    att = SimAttempt(SimJobState(1, spec, 0.0), 1, dev, 0.0, 0.0, 0.0, 0.0, paused_at=100.0)
    dev.attempts[1] = att
    dev.held_m = 1024.0
    dev.count(att, 1)
    candidates = Candidates([dev])

    def pick(now: float) -> list[SimDevice]:
        return candidates.pick(
            Margins(),
            smallest=(5.0, 1024.0),
            watch_compute=True,
            checkpoint_aware=True,
            now=now,
            max_pause_s=600.0,
        )

    assert pick(650.0) == []
    assert pick(699.0) == []
    assert pick(700.0) == [dev]
    assert pick(800.0) == [dev]
    dev.count(att, -1)
    att.thaw(801.0)  # online compute fell to 82 %: it runs again, with no room beside it
    dev.count(att, 1)
    dev.seen_c, dev.view = 82.0, None
    candidates.touch(dev)
    assert pick(801.0) == []


def packed_device(online_c: float, online_m: float = 0.0) -> SimDevice:
    """A device with one running 10 % slice, the scheduler having heard of its usage."""
    dev = SimDevice(0, DeviceLoad("d", (0.0,), (online_c,), (online_m,), 1e6), "gpu0", 81920.0)
    dev.present = dev.reported = True
    dev.online_c = dev.seen_c = online_c
    dev.online_m = dev.seen_m = online_m
    spec = SimJob(0, "t", 0.0, 10.0, 0, 1024, 1e5, 600.0, 1.0, 30.0)
    att = SimAttempt(SimJobState(1, spec, 0.0), 1, dev, 0.0, 0.0, 0.0, 0.0, phase=RUNNING)
    dev.attempts[1] = att
    dev.held_c, dev.held_m, dev.gpu_m = 10.0, 1024.0, 1024.0
    dev.count(att, 1)
    return dev


@pytest.mark.parametrize(
    ("online_c", "online_m", "pausing", "candidate"),
    [
        (90.0, 0.0, True, False),  # compute short: the agent pauses, the planner does nothing
        (90.0, 0.0, False, True),  # compute short, no pausing: the planner evicts
        (90.0, 80000.0, True, True),  # memory short: the planner evicts
        (50.0, 80000.0, True, True),
        (80.0, 0.0, True, False),  # within capacity, no room for a 15 % job
    ],
)
def test_a_device_short_of_compute_alone_is_a_candidate_unless_its_slices_pause(
    online_c: float, online_m: float, pausing: bool, candidate: bool
) -> None:
    dev = packed_device(online_c, online_m)
    picked = Candidates([dev]).pick(
        Margins(),
        smallest=(15.0, 1024.0),
        watch_compute=True,
        checkpoint_aware=True,
        now=10.0,
        pausing=pausing,
    )
    assert picked == ([dev] if candidate else [])


def test_an_attempts_view_made_again_is_the_view_made_afresh() -> None:
    """After a pause, a checkpoint, a thaw and the eviction's start, the view made from
    the attempt's first one equals the one a fresh attempt in that state makes."""
    dev = packed_device(0.0)
    att = dev.attempts[1]
    att.phase, att.pausable = STARTING, True
    first = att.active_view(True)
    for change in (
        {"phase": RUNNING},
        {"paused_at": 40.0},
        {"last_ckpt_at": 55.0},
        {"paused_at": None, "run_from": 12.5},
        {"suspended_at": 60.0, "paused_at": 60.0},
        {"phase": EVICTING},
    ):
        for name, value in change.items():
            setattr(att, name, value)
        att.view = None
        again = att.active_view(True)
        fresh = replace(att, view=None, _view_base=None).active_view(True)
        assert again == fresh and vars(again) == vars(fresh)
        assert again != first
    assert replace(att, view=None, _view_base=None).active_view(False).last_checkpoint_at is None
