"""``ebb report``'s figures (:mod:`ebbtide.report`), on hand-built attempts and events.

The window is two hours, [1000, 8200), seen at 8300.  What happens in it (times in
seconds; the window's edges marked |):

- job 1 (batch, alice): submitted 900, dispatched 1100, started 1110 on 50 %; evicted
  2110 (online_compute, 1.5 s, 60 s of work lost); requeued, dispatched 2410, started
  2420, paused 3000-3600, succeeded 4420.
- job 2 (dev, bob): submitted 1200, dispatched 1210, started 1215 on two whole GPUs;
  still running.
- job 3 (batch, bob): started 600 on 25 %, before the window; ends 9000, after it.
- job 4 (batch, alice): submitted 1300, dispatched and started 1400 on 20 %; evicted 1500
  (online_memory, killed at its deadline, 31.5 s, 120 s lost); cancelled 1600 while queued.
- job 5 (dev, alice): submitted 1000; attempt 1 fails 1160 and is requeued; attempt 2
  dispatched 1200, fails for good 1300.
- job 6 (batch, carol): all of it before the window.
- job 7 (batch, carol): submitted 9000, after it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

from ebbtide.report import (
    AttemptRow,
    EventRow,
    NodeRow,
    build_report,
    parse_when,
    percentile,
    report_from_rows,
    timeline_bin_s,
    window_error,
)

SINCE, UNTIL, NOW = 1000.0, 8200.0, 8300.0
JOBS = {
    1: ("batch", "alice"),
    2: ("dev", "bob"),
    3: ("batch", "bob"),
    4: ("batch", "alice"),
    5: ("dev", "alice"),
    6: ("batch", "carol"),
    7: ("batch", "carol"),
}


def _ids() -> Iterator[int]:
    n = 0
    while True:
        n += 1
        yield n


_next_id = _ids()


def ev(job: int, type_: str, t: float, attempt: int | None = None, **data: Any) -> EventRow:
    queue, owner = JOBS[job]
    return EventRow(
        id=next(_next_id),
        job_id=job,
        attempt=attempt,
        type=type_,
        time=t,
        queue=queue,
        owner=owner,
        data=data,
    )


def att(
    job: int,
    number: int,
    *,
    pct: float,
    dispatched: float,
    started: float | None,
    ended: float | None,
    devices: tuple[int, ...] = (0,),
    memory_mib: int = 4096,
    outcome: str | None = None,
    node: str = "gpu-a",
) -> AttemptRow:
    queue, owner = JOBS[job]
    return AttemptRow(
        job_id=job,
        number=number,
        queue=queue,
        owner=owner,
        node=node,
        devices=devices,
        compute_pct=pct,
        memory_mib=memory_mib,
        dispatched_at=dispatched,
        started_at=started,
        ended_at=ended,
        outcome=outcome,
    )


def evicted(job: int, t: float, attempt: int, code: str, **figures: Any) -> EventRow:
    return ev(job, "evicted", t, attempt, reason=f"{code} rose", reason_code=code, **figures)


ATTEMPTS = [
    att(1, 1, pct=50, dispatched=1100, started=1110, ended=2110, outcome="evicted"),
    att(1, 2, pct=50, dispatched=2410, started=2420, ended=4420, outcome="succeeded"),
    att(2, 1, pct=100, dispatched=1210, started=1215, ended=None, devices=(0, 1), memory_mib=1024),
    att(3, 1, pct=25, dispatched=500, started=600, ended=9000, node="gpu-b"),
    att(4, 1, pct=20, dispatched=1400, started=1400, ended=1500, outcome="evicted"),
    att(5, 1, pct=10, dispatched=1050, started=1060, ended=1160, outcome="failed"),
    att(5, 2, pct=10, dispatched=1200, started=1200, ended=1300, outcome="failed"),
]
EVENTS = [
    ev(6, "submitted", 100, state="queued"),
    ev(6, "dispatched", 200, 1),
    ev(6, "succeeded", 800, 1),
    ev(3, "submitted", 450, state="queued"),
    ev(3, "dispatched", 500, 1),
    ev(1, "submitted", 900, state="queued"),
    ev(5, "submitted", 1000, state="queued"),
    ev(5, "dispatched", 1050, 1),
    ev(1, "dispatched", 1100, 1),
    ev(5, "failed", 1160, 1, final=False),
    ev(5, "requeued", 1160, 1),
    ev(2, "submitted", 1200, state="queued"),
    ev(5, "dispatched", 1200, 2),
    ev(2, "dispatched", 1210, 1),
    ev(5, "failed", 1300, 2, final=True),
    ev(4, "submitted", 1300, state="queued"),
    ev(4, "dispatched", 1400, 1),
    evicted(
        4,
        1500,
        1,
        "online_memory",
        latency_s=31.5,
        deadline_s=30.0,
        lost_work_s=120.0,
        deadline_missed=True,
        killed=True,
    ),
    ev(4, "requeued", 1500, 1),
    ev(4, "cancelled", 1600),
    evicted(
        1,
        2110,
        1,
        "online_compute",
        latency_s=1.5,
        deadline_s=30.0,
        lost_work_s=60.0,
        deadline_missed=False,
        killed=False,
    ),
    ev(1, "requeued", 2110, 1),
    ev(1, "dispatched", 2410, 2),
    ev(1, "paused", 3000, 2, kind="pause", reason_code="online_compute"),
    ev(1, "thawed", 3600, 2, paused_s=600.0, kind="thaw"),
    ev(1, "succeeded", 4420, 2),
    ev(7, "submitted", 9000, state="queued"),
]
NODES = [
    NodeRow(name="gpu-a", started_at=0.0, heartbeat_at=NOW, devices=2),
    NodeRow(name="gpu-b", started_at=5000.0, heartbeat_at=NOW - 1, devices=1),
]


def report(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(since=SINCE, until=UNTIL, now=NOW)
    args.update(kw)
    return build_report(ATTEMPTS, EVENTS, NODES, **args)


# the expected GPU-seconds of each attempt inside the window
JOB1 = 0.5 * (2110 - 1110) + 0.5 * ((4420 - 2420) - 600)
JOB2 = 2 * 1.0 * (8200 - 1215)
JOB3 = 0.25 * (8200 - 1000)
JOB4 = 0.2 * (1500 - 1400)
JOB5 = 0.1 * (1160 - 1060) + 0.1 * (1300 - 1200)


def test_jobs_are_counted_by_the_time_of_their_events_in_the_window() -> None:
    jobs = report()["overall"]["jobs"]
    # 5 at the window's first second counts; 1 before it and 7 after it do not
    assert jobs == {"submitted": 3, "succeeded": 1, "failed": 1, "cancelled": 1}


def test_gpu_hours_are_run_time_in_the_window_less_pauses_times_the_slice() -> None:
    overall = report()["overall"]
    expected = (JOB1 + JOB2 + JOB3 + JOB4 + JOB5) / 3600
    assert overall["gpu_hours"] == pytest.approx(expected, abs=1e-4)
    assert overall["attempts"] == 7
    # memory: paused time counts (a paused job keeps its memory), per device held
    memory_s = 4 * (1000 + 2000) + 2 * 1 * (8200 - 1215) + 4 * 7200 + 4 * 100 + 4 * 200
    assert overall["gpu_memory_gib_hours"] == pytest.approx(memory_s / 3600, abs=1e-4)


def test_an_attempt_that_still_runs_counts_to_the_report_time_not_past_it() -> None:
    # seen at 5000, the window's end has not come: job 2 has run 5000 - 1215 s
    dev = report(now=5000.0)["queues"]["dev"]
    assert dev["gpu_hours"] == pytest.approx((2 * (5000 - 1215) + JOB5) / 3600, abs=1e-4)


def test_per_queue_and_per_user_add_up_to_the_whole() -> None:
    r = report()
    assert sorted(r["queues"]) == ["batch", "dev"]
    assert sorted(r["users"]) == ["alice", "bob"]  # carol did nothing in the window
    assert r["queues"]["batch"]["gpu_hours"] == pytest.approx((JOB1 + JOB3 + JOB4) / 3600, 1e-4)
    assert r["users"]["bob"]["gpu_hours"] == pytest.approx((JOB2 + JOB3) / 3600, abs=1e-4)
    for key in ("gpu_hours", "attempts"):
        for side in ("queues", "users"):
            total = sum(g[key] for g in r[side].values())
            assert total == pytest.approx(r["overall"][key], abs=1e-3)
    assert r["users"]["alice"]["jobs"] == {
        "submitted": 2,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
    }


def test_evictions_by_reason_with_latency_misses_and_lost_work() -> None:
    ev_ = report()["overall"]["evictions"]
    assert ev_["count"] == 2 and ev_["deadline_misses"] == 1 and ev_["killed"] == 1
    assert (ev_["latency_p50_s"], ev_["latency_p99_s"], ev_["latency_max_s"]) == (1.5, 31.5, 31.5)
    assert ev_["lost_work_s"] == 180.0
    lost_gpu_s = 60 * 0.5 + 120 * 0.2
    assert ev_["lost_work_gpu_hours"] == pytest.approx(lost_gpu_s / 3600, abs=1e-6)
    harvest_s = JOB1 + JOB2 + JOB3 + JOB4 + JOB5
    assert ev_["lost_share_of_harvest"] == pytest.approx(lost_gpu_s / harvest_s, abs=1e-6)
    assert list(ev_["by_reason"]) == ["online_compute", "online_memory"]
    memory = ev_["by_reason"]["online_memory"]
    assert memory == {
        "count": 1,
        "latency_p50_s": 31.5,
        "latency_p99_s": 31.5,
        "latency_max_s": 31.5,
        "deadline_misses": 1,
        "killed": 1,
        "lost_work_s": 120.0,
    }
    # job 3's eviction at 9000 is after the window
    assert report()["queues"]["dev"]["evictions"]["count"] == 0


def test_an_eviction_without_a_reason_code_is_unspecified() -> None:
    extra = [ev(6, "evicted", 1500, 1, reason="the job asked to be requeued (exit 99)")]
    r = build_report(ATTEMPTS, EVENTS + extra, NODES, since=SINCE, until=UNTIL, now=NOW)
    unspecified = r["overall"]["evictions"]["by_reason"]["unspecified"]
    assert unspecified["count"] == 1 and unspecified["latency_p50_s"] is None


def test_lost_attempts_are_counted_by_reason_apart_from_evictions() -> None:
    """A trial's trap: an attempt lost when its node's agent was killed was in neither
    the report nor its --json; only a window's close showed, as an eviction."""
    extra = [
        ev(6, "lost", 1500, 1, reason="node gpu-b stopped heartbeating", reason_code="node_silent"),
        ev(6, "lost", 1600, 2, reason_code="node_silent"),
        ev(1, "lost", 1700, 1, reason="the start never happened"),
        ev(1, "lost", UNTIL + 10, 2, reason_code="node_silent"),  # after the window
    ]
    r = build_report(ATTEMPTS, EVENTS + extra, NODES, since=SINCE, until=UNTIL, now=NOW)
    assert r["overall"]["lost_attempts"] == {
        "count": 3,
        "by_reason": {"node_silent": 2, "unspecified": 1},
    }
    assert r["overall"]["evictions"]["count"] == report()["overall"]["evictions"]["count"]
    queue6, queue1 = JOBS[6][0], JOBS[1][0]
    assert r["queues"][queue6]["lost_attempts"]["by_reason"].get("node_silent", 0) >= 2
    assert r["queues"][queue1]["lost_attempts"]["count"] >= 1
    assert report()["overall"]["lost_attempts"] == {"count": 0, "by_reason": {}}


def test_pauses_count_and_their_seconds_inside_the_window() -> None:
    assert report()["overall"]["pauses"] == {"count": 1, "suspended": 0, "paused_s": 600.0}
    # a window that ends mid-pause counts the part inside it, and the harvest before it
    r = report(until=3300.0)
    assert r["overall"]["pauses"]["paused_s"] == 300.0
    assert r["users"]["alice"]["gpu_hours"] == pytest.approx(
        (0.5 * 1000 + 0.5 * (3000 - 2420) + JOB4 + JOB5) / 3600, abs=1e-4
    )


def test_a_pause_begun_before_the_window_or_never_thawed_is_clipped() -> None:
    attempts = [att(1, 1, pct=50, dispatched=100, started=100, ended=3000, outcome="evicted")]
    events = [
        ev(1, "paused", 500, 1, kind="pause"),
        ev(1, "thawed", 1500, 1, paused_s=1000.0, kind="thaw"),
        ev(1, "paused", 2000, 1, kind="pause"),
        ev(1, "paused", 2500, 1, kind="suspend"),  # moved to host while paused
    ]
    r = build_report(attempts, events, [], since=SINCE, until=UNTIL, now=NOW)
    overall = r["overall"]
    # ran 1500-2000 inside the window; paused 1000-1500 and 2000-3000
    assert overall["gpu_hours"] == pytest.approx(0.5 * 500 / 3600, abs=1e-6)
    assert overall["pauses"] == {"count": 2, "suspended": 1, "paused_s": 1500.0}
    # memory is held until the suspension at 2500
    assert overall["gpu_memory_gib_hours"] == pytest.approx(4 * 1500 / 3600, abs=1e-6)


def test_queue_wait_runs_from_when_the_job_last_became_queued() -> None:
    wait = report()["overall"]["queue_wait"]
    # 1: 200 and 300 (after its requeue); 2: 10; 4: 100; 5: 50 and 40
    assert wait["count"] == 6
    assert (wait["p50_s"], wait["p99_s"], wait["max_s"]) == (50.0, 300.0, 300.0)


def test_time_held_is_not_queue_wait() -> None:
    events = [
        ev(1, "submitted", 1000, state="held"),
        ev(1, "released", 1500),
        ev(1, "dispatched", 1600, 1),
    ]
    r = build_report([], events, [], since=SINCE, until=UNTIL, now=NOW)
    assert r["overall"]["queue_wait"]["max_s"] == 100.0


def test_filters_keep_one_queue_or_one_user() -> None:
    r = report(queue="dev")
    assert list(r["queues"]) == ["dev"] and sorted(r["users"]) == ["alice", "bob"]
    assert r["overall"]["gpu_hours"] == pytest.approx((JOB2 + JOB5) / 3600, abs=1e-4)
    assert r["filters"] == {"queue": "dev", "user": None}
    r = report(user="alice", queue="batch")
    assert list(r["users"]) == ["alice"] and r["overall"]["jobs"]["succeeded"] == 1
    assert r["overall"]["evictions"]["count"] == 2
    assert report(user="nobody")["overall"]["gpu_hours"] == 0


def test_the_timeline_bins_the_harvest_by_queue() -> None:
    timeline = report()["timeline"]
    assert timeline["bin_s"] == 300.0 and timeline["start"] == SINCE
    assert len(timeline["gpu_hours"]["batch"]) == 24
    for queue, expected in (("batch", JOB1 + JOB3 + JOB4), ("dev", JOB2 + JOB5)):
        assert sum(timeline["gpu_hours"][queue]) == pytest.approx(expected / 3600, abs=1e-3)
    # 1000-1300: job 3 (25 %), job 1 from 1110 (50 %), job 2 from 1215 (2 GPUs)
    assert timeline["gpu_hours"]["batch"][0] == pytest.approx(
        (0.25 * 300 + 0.5 * 190) / 3600, abs=1e-6
    )


@pytest.mark.parametrize(
    ("span_s", "bin_s"),
    [(120, 10), (2 * 3600, 300), (86400, 3600), (7 * 86400, 6 * 3600), (366 * 86400, 7 * 86400)],
)
def test_timeline_bins_are_hourly_for_a_day(span_s: float, bin_s: float) -> None:
    assert timeline_bin_s(span_s) == bin_s


def test_the_fleet_seen_and_the_harvest_per_device_hour() -> None:
    fleet = report()["fleet"]
    # gpu-a: 2 devices the whole window; gpu-b: 1 device from its first attempt's start
    # (600, before its agent's restart at 5000), so the whole window too
    assert fleet["nodes"] == 2 and fleet["devices"] == 3
    assert fleet["device_hours"] == pytest.approx(3 * 2.0)
    harvest_h = (JOB1 + JOB2 + JOB3 + JOB4 + JOB5) / 3600
    assert fleet["harvested_gpu_hours_per_device_hour"] == pytest.approx(harvest_h / 6, abs=1e-4)
    assert "ebbtide_online_compute_ratio" in fleet["online_utilisation"]


def test_a_silent_node_is_seen_while_its_attempts_ran() -> None:
    # gpu-a's agent last heartbeated at 2000, but job 2 ran there to the window's end:
    # its harvest is never more than the devices seen could give
    nodes = [NodeRow(name="gpu-a", started_at=0.0, heartbeat_at=2000.0, devices=2)]
    fleet = build_report(ATTEMPTS[2:3], [], nodes, since=SINCE, until=UNTIL, now=NOW)["fleet"]
    assert fleet["device_hours"] == pytest.approx(2 * 2.0)
    assert fleet["harvested_gpu_hours_per_device_hour"] == pytest.approx(JOB2 / 3600 / 4, 1e-4)


def test_the_counting_is_said_in_the_report() -> None:
    r = report()
    assert "compute_pct" in r["counting"]["gpu_hours"] and "paused" in r["counting"]["gpu_hours"]
    assert r["window"] == {"since": SINCE, "until": UNTIL, "measured_until": UNTIL}


def test_the_latency_cdf_and_the_deadlines_for_the_plot() -> None:
    r = report()
    cdf = r["eviction_latency_cdf_s"]
    assert len(cdf) == 101 and cdf[0] == 1.5 and cdf[50] == 1.5 and cdf[100] == 31.5
    assert r["eviction_deadlines_s"] == [30.0]


def test_an_empty_window_is_zero_and_none() -> None:
    r = build_report([], [], [], since=SINCE, until=UNTIL, now=NOW)
    overall = r["overall"]
    assert overall["gpu_hours"] == 0 and overall["attempts"] == 0
    assert overall["evictions"]["latency_p50_s"] is None
    assert overall["evictions"]["lost_share_of_harvest"] is None
    assert overall["queue_wait"] == {"count": 0, "p50_s": None, "p99_s": None, "max_s": None}
    assert r["fleet"]["harvested_gpu_hours_per_device_hour"] is None
    assert r["queues"] == {} and r["eviction_latency_cdf_s"] == []


def test_the_report_is_json_and_deterministic() -> None:
    a = json.dumps(report(), sort_keys=False)
    assert a == json.dumps(
        build_report(ATTEMPTS, list(reversed(EVENTS)), NODES, since=SINCE, until=UNTIL, now=NOW)
    )


def test_rows_from_the_store_shape() -> None:
    # as JSON gives them: lists, not tuples
    rows = {
        "attempts": [{**asdict(ATTEMPTS[0]), "devices": list(ATTEMPTS[0].devices)}],
        "events": [asdict(EVENTS[5]), asdict(EVENTS[8])],  # job 1 submitted, dispatched
        "nodes": [asdict(NODES[0])],
    }
    r = report_from_rows(rows, since=SINCE, until=UNTIL, now=NOW)
    assert r["overall"]["attempts"] == 1 and r["overall"]["queue_wait"]["count"] == 1


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [([], 50, None), ([3.0], 99, 3.0), ([1, 2, 3, 4], 50, 2), ([1, 2, 3, 4], 99, 4)],
)
def test_percentiles_are_nearest_rank(values: list[float], p: float, expected: Any) -> None:
    assert percentile(sorted(values), p) == expected


def test_when_is_a_time_ago_an_iso_timestamp_or_now() -> None:
    now = 1_700_000_000.0
    assert parse_when("24h", now) == now - 86400
    assert parse_when("7d", now) == now - 7 * 86400
    assert parse_when(" 90m ", now) == now - 5400
    assert parse_when("now", now) == now
    assert parse_when("2023-11-14T22:13:20+00:00", now) == now
    assert parse_when("2023-11-14T22:13:20Z", now) == now
    local = dt.datetime(2024, 5, 1, 9, 0).astimezone().timestamp()
    assert parse_when("2024-05-01T09:00", now) == local
    assert parse_when("2024-05-01 09:00", now) == local


@pytest.mark.parametrize("text", ["yesterday", "10:00", "90", "-1h", "", "2024-13-01", "400d"])
def test_when_refuses_what_it_cannot_read_saying_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"ISO timestamp|at most 366 days"):
        parse_when(text, 1_700_000_000.0)


def test_window_errors_say_what_is_wrong() -> None:
    assert window_error(1.0, 2.0) is None
    assert "before" in (window_error(2.0, 1.0) or "")
    assert "before" in (window_error(2.0, 2.0) or "")
    assert "finite" in (window_error(math.nan, 2.0) or "")
    assert "366 days" in (window_error(0.0, 400 * 86400.0) or "")
