"""End to end: a cron window closes while two jobs run.  Both are warned at
close − deadline and their slices are free by the close; a job whose first checkpoint
would not fit before the close is not started."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from tests.e2e.helpers import EXAMPLES, ebb_env, ebb_json, events, jobs_by_id, start, stop, wait_for

pytestmark = pytest.mark.e2e

DEADLINE_S = 4.0
CLOSE_IN_S = 14.0


def _window_closing_in(seconds: float) -> tuple[str, float]:
    """A policy whose one window opened at this minute's start and closes in ``seconds``."""
    now = dt.datetime.now(dt.UTC)
    opened = now.replace(second=0, microsecond=0)
    duration = (now - opened).total_seconds() + seconds
    policy = f"""\
apiVersion: ebbtide/v1
windows:
  - name: lunch
    kind: cron
    schedule: "{opened.minute} {opened.hour} * * *"
    duration: {duration:.3f}s
    timezone: UTC
"""
    return policy, opened.timestamp() + duration


def _submit(env, out, *extra: str) -> int:  # type: ignore[no-untyped-def]
    import sys

    return int(
        ebb_json(
            env,
            "qsub",
            "-l",
            "gpu=20%,gpumem=4GiB",
            "--deadline",
            f"{DEADLINE_S:g}s",
            *extra,
            "--",
            sys.executable,
            str(EXAMPLES / "count.py"),
            "100000",
            "--step-s",
            "0.05",
            "--every",
            "10",
            "--out",
            str(out),
        )["id"]
    )


def test_window_close_drains_by_the_close_and_admission_respects_it(tmp_path):  # type: ignore[no-untyped-def]
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text("apiVersion: ebbtide/v1\n")
    env = ebb_env(tmp_path / "home", EBBTIDE_POLICY=str(policy))
    a = _submit(env, tmp_path / "a.json")
    b = _submit(env, tmp_path / "b.json")
    late = _submit(env, tmp_path / "late.json", "-l", "checkpoint_interval=60s")
    # the window is timed from here: on a loaded machine the three submissions above can
    # take seconds, which must not eat the window (its jobs would never be admitted)
    policy_text, close_at = _window_closing_in(CLOSE_IN_S)
    policy.write_text(policy_text)
    up = start(env, "up", "--node", "box", "--devices", "1x80GiB", log=tmp_path / "up.log")
    try:
        wait_for(
            lambda: all(jobs_by_id(env)[j]["state"] == "running" for j in (a, b)),
            15,
            "both jobs running",
        )
        waiting = wait_for(lambda: jobs_by_id(env)[late]["reason"], 5, "a reason for the late job")
        assert "first checkpoint" in waiting and "lunch" in waiting
        wait_for(lambda: time.time() > close_at + 2, CLOSE_IN_S + 5, "the close")
        jobs = jobs_by_id(env)
    finally:
        stop(up)
    log = (tmp_path / "up.log").read_text()
    for j in (a, b):
        evs = events(env, j)
        [warn] = [e for e in evs if e["type"] == "evict_requested"]
        [ev] = [e for e in evs if e["type"] == "evicted"]
        assert ev["reason_code"] == "window_closing", log
        # warned at close − deadline (a fraction of a second early, never late) ...
        assert close_at - DEADLINE_S - 1.0 <= warn["time"] <= close_at - DEADLINE_S + 0.05
        # ... and free by the close
        assert ev["freed_at"] <= close_at + 0.05, (ev, close_at)
        assert jobs[j]["state"] == "queued"
        assert "window 'lunch' opens" in jobs[j]["reason"]
    assert [e["type"] for e in events(env, late)] == ["submitted"]
    assert jobs[late]["state"] == "queued"
