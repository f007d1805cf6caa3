"""End to end, embedded: ``ebb up`` on two simulated devices replaying a trace in which
online memory on device 0 jumps to leave no room a few seconds in."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import (
    ebb_env,
    events,
    job,
    start,
    stop,
    submit_count,
    wait_final,
    wait_for,
    write_trace,
)

pytestmark = pytest.mark.e2e

N = 200  # 200 steps of 0.05 s: about 10 s of work
SPIKE_AT_S = 8.0  # late enough for both jobs to be running on a loaded machine
COOPERATIVE_DEADLINE_S = 5.0
STUBBORN_DEADLINE_S = 2.0


def _spike_trace(tmp_path):  # type: ignore[no-untyped-def]
    return write_trace(
        tmp_path / "spike.csv",
        [
            (0, 0, 5, 1024),
            (0, 1, 5, 1024),
            (SPIKE_AT_S, 0, 30, 81000),  # 80 GiB device: no room left for offline slices
        ],
    )


def _evicted(evs: list[dict]) -> list[dict]:
    return [e for e in evs if e["type"] == "evicted"]


def test_spike_evicts_checkpoints_requeues_and_resumes(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path / "home")
    coop_out, stub_out = tmp_path / "coop.json", tmp_path / "stub.json"
    coop = submit_count(env, coop_out, N, name="coop", deadline=f"{COOPERATIVE_DEADLINE_S}s")
    stub = submit_count(
        env,
        stub_out,
        N,
        name="stubborn",
        deadline=f"{STUBBORN_DEADLINE_S}s",
        extra=("--ignore-warning",),
    )
    up = start(
        env,
        "up",
        "--node",
        "box",
        "--devices",
        "2x80GiB",
        "--headroom",
        f"trace:{_spike_trace(tmp_path)}",
        log=tmp_path / "up.log",
    )
    try:
        # both land on device 0 (best fit packs) before the spike
        wait_for(
            lambda: all(
                job(env, j)["device"] == "0" and job(env, j)["state"] == "running"
                for j in (coop, stub)
            ),
            10,
            "both jobs running on device 0",
        )
        jobs = wait_final(env, [coop, stub], timeout=90)
    finally:
        rc = stop(up)
    log = (tmp_path / "up.log").read_text()
    assert rc == 0, log
    assert jobs[coop]["state"] == "succeeded", log
    assert jobs[stub]["state"] == "succeeded", log

    # the cooperative job: warned, checkpointed, exited well within its deadline
    coop_evs = events(env, coop)
    [ev] = _evicted(coop_evs)
    assert ev["killed"] is False
    assert ev["checkpointed"] is True
    assert 0 < ev["latency_s"] < COOPERATIVE_DEADLINE_S
    assert ev["deadline_s"] == COOPERATIVE_DEADLINE_S
    assert [e["type"] for e in coop_evs].count("requeued") == 1
    # finished: where its last attempt ran stays on record
    assert jobs[coop]["attempts"] == 2 and jobs[coop]["device"] in ("0", "1")
    result = json.loads(coop_out.read_text())
    assert result["count"] == N
    assert result["attempts_seen"] == [1, 2]

    # the stubborn job: killed at its deadline, slice free by deadline + 0.5 s
    [ev] = _evicted(events(env, stub))
    assert ev["killed"] is True
    assert ev["latency_s"] <= STUBBORN_DEADLINE_S + 0.5
    assert ev["lost_work_s"] >= 0
    result = json.loads(stub_out.read_text())
    assert result["count"] == N, "resumed from its last periodic checkpoint, no step twice"
    assert result["attempts_seen"] == [1, 2]

    # the second attempts ran on device 1: device 0 had no room left
    for j in (coop, stub):
        dispatched = [e for e in events(env, j) if e["type"] == "dispatched"]
        assert [d["devices"] for d in dispatched] == [[0], [1]]
