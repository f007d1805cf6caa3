"""``ebb top`` without a terminal: the snapshot built from what a (fake) client gives,
the frame drawn from it, and what each key does to the view."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from ebbtide.errors import UserError
from ebbtide.messaging.messages import DeviceReport
from ebbtide.queue.models import Job
from ebbtide.top.fetch import fetch_snapshot
from ebbtide.top.live import parse_keys
from ebbtide.top.render import FOOTER_EVICTIONS, frame_layout, page_rows, render
from ebbtide.top.snapshot import FleetSnapshot, build_snapshot
from ebbtide.top.view import (
    SORTS,
    ViewState,
    panel_rows,
    press,
    shown_attempts,
    visible_evictions,
    visible_gpus,
)

NOW = 1_700_000_000.0
GIB = 1024


def device(index: int, online: float = 0.0, **extra: Any) -> dict[str, Any]:
    d = {
        "index": index,
        "memory_mib": 80 * GIB,
        "online_compute_pct": online,
        "online_memory_mib": online / 100 * 40 * GIB,
        **extra,
    }
    DeviceReport.model_validate(d)  # what an agent could send
    # what Client.nodes() adds
    return {"health": "healthy", "drained": None, "cooldown_until": None, **d}


def node(name: str, *devices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "silent": False, "stopping": False, "devices": list(devices), **extra}


def job(job_id: int, owner: str, where: str, pct: float = 25, **extra: Any) -> Job:
    node_name, devices = where.split("/")
    fields: dict[str, Any] = {
        "id": job_id,
        "name": f"job{job_id}",
        "owner": owner,
        "queue": "default",
        "state": "running",
        "spec_json": "{}",
        "compute_pct": pct,
        "memory_mib": 4 * GIB,
        "deadline_s": 30.0,
        "signal": 15,
        "submitted_at": NOW - 100,
        "attempts": 1,
        "node": node_name,
        "devices": devices,
    }
    return Job(**(fields | extra))


def eviction(job_id: int, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": 1,
        "time": NOW - job_id,
        "owner": "carol",
        "queue": "batch",
        "node": "gpu-b",
        "devices": [0],
        "reason": "online compute rose to 97%",
        "reason_code": "online_compute",
        "latency_s": 0.84,
        "deadline_s": 30.0,
        "deadline_missed": False,
        "killed": False,
    } | extra


NODES = [
    node("gpu-10", device(0, 5)),
    node("gpu-2", device(0, 30), device(1, 60)),
    node("gpu-b", device(0, 10), device(1, 0, health="unhealthy", fault={"meaning": "XID 79"})),
]
JOBS = [
    job(1, "alice", "gpu-2/0", 25),
    job(2, "bob", "gpu-2/0", 20, paused_at=NOW - 5, queue="batch"),
    job(3, "carol", "gpu-2/1", 10, state="evicting"),
    job(4, "dave", "gpu-b/0", 100, gpus=1, queue="batch"),  # a whole GPU
]
STATS = {"default": {"running": 2, "evicting": 1, "queued": 7}, "batch": {"running": 2, "held": 3}}
EVICTIONS = [
    eviction(10),
    eviction(11, deadline_missed=True, latency_s=31.0, killed=True, owner="erin"),
    eviction(12, deadline_missed=None, latency_s=None, deadline_s=None, node=None, devices=[]),
]


def snapshot(**over: Any) -> FleetSnapshot:
    given = {"nodes": NODES, "jobs": JOBS, "queue_stats": STATS, "evictions": EVICTIONS}
    given |= over
    return build_snapshot(
        given["nodes"], given["jobs"], given["queue_stats"], given["evictions"], taken_at=NOW
    )


# -- the snapshot -----------------------------------------------------------------------


def test_each_attempt_is_on_its_devices_and_the_headroom_is_what_is_left() -> None:
    snap = snapshot()
    gpus = {g.name: g for g in snap.gpus}
    # node order is natural: gpu-2 before gpu-10
    assert list(gpus) == ["gpu-2/0", "gpu-2/1", "gpu-10/0", "gpu-b/0", "gpu-b/1"]
    a0 = gpus["gpu-2/0"]
    assert [a.job_id for a in a0.attempts] == [1, 2]
    assert [a.paused for a in a0.attempts] == [False, True]
    assert (a0.online_compute_pct, a0.offline_compute_pct, a0.headroom_compute_pct) == (
        30,
        45,
        25,
    )
    assert a0.offline_memory_mib == 8 * GIB
    assert a0.headroom_memory_mib == 80 * GIB - 12 * GIB - 8 * GIB
    # a whole-GPU job holds its GPU entirely
    assert gpus["gpu-b/0"].offline_compute_pct == 100
    assert gpus["gpu-b/0"].headroom_compute_pct == 0
    assert gpus["gpu-2/1"].attempts[0].state == "evicting"
    t = snap.totals
    assert (t.gpus, t.nodes, t.attempts, t.paused, t.unavailable) == (5, 3, 4, 1, 1)
    assert t.online_compute_pct == pytest.approx((5 + 30 + 60 + 10 + 0) / 5)
    # the device out of service offers no headroom, though no one uses it
    assert t.headroom_compute_pct == pytest.approx((95 + 25 + 30 + 0 + 0) / 5)


@pytest.mark.parametrize(
    ("node_extra", "device_extra", "state", "note"),
    [
        ({}, {}, "ok", ""),
        ({"silent": True}, {}, "silent", ""),
        ({}, {"health": "unhealthy", "fault": {"meaning": "XID 79"}}, "out", "XID 79"),
        ({}, {"drained": "gpu-x/0 drained by carol: fan"}, "drained", "by carol: fan"),
        ({"stopping": True}, {}, "stopping", ""),
        ({}, {"sample_ok": False}, "stale", ""),
        ({}, {"cooldown_until": NOW + 12}, "cooling", "cooling down 12s"),
        ({}, {"cooldown_until": NOW - 1}, "ok", ""),
    ],
)
def test_a_device_state_and_whether_it_offers_headroom(
    node_extra: dict[str, Any], device_extra: dict[str, Any], state: str, note: str
) -> None:
    d = {**device(0, 20), **device_extra}
    [gpu] = snapshot(nodes=[node("gpu-x", d, **node_extra)], jobs=[]).gpus
    assert gpu.state == state
    assert note in gpu.note
    takes_work = state in ("ok", "stale", "cooling")
    assert gpu.headroom_compute_pct == (80 if takes_work else 0)


def test_evictions_say_whether_they_met_their_deadline() -> None:
    met, missed, unknown = snapshot().evictions
    assert (met.met_deadline, missed.met_deadline, unknown.met_deadline) == (True, False, None)
    assert (met.where, unknown.where) == ("gpu-b/0", "-")
    late = build_snapshot(
        [], [], {}, [eviction(1, deadline_missed=None, latency_s=40.0)], taken_at=NOW
    )
    assert late.evictions[0].met_deadline is False  # from the figures, when not said


def test_the_json_shape_is_plain_and_complete() -> None:
    data = json.loads(json.dumps(snapshot().to_dict()))
    assert set(data) == {"taken_at", "totals", "queues", "gpus", "evictions", "notes"}
    assert data["queues"]["default"] == {"running": 2, "evicting": 1, "queued": 7, "active": 3}
    gpu = data["gpus"][0]
    assert gpu["node"] == "gpu-2" and gpu["headroom_compute_pct"] == 25
    assert [a["owner"] for a in gpu["attempts"]] == ["alice", "bob"]
    assert data["evictions"][1]["met_deadline"] is False


class FakeClient:
    """What ``fetch_snapshot`` asks of a client."""

    def __init__(self, evictions_error: Exception | None = None) -> None:
        self.evictions_error = evictions_error
        self.asked: dict[str, Any] = {}

    def nodes(self) -> list[dict[str, Any]]:
        return NODES

    def list(self, *, state: list[str]) -> list[Job]:
        self.asked["state"] = state
        return JOBS

    def queue_stats(self) -> dict[str, dict[str, int]]:
        return STATS

    def recent_evictions(self, limit: int) -> list[dict[str, Any]]:
        self.asked["limit"] = limit
        if self.evictions_error:
            raise self.evictions_error
        return EVICTIONS


def test_fetch_reads_active_jobs_and_the_latest_evictions() -> None:
    client = FakeClient()
    snap = fetch_snapshot(client, evictions=7, now=lambda: NOW)
    assert sorted(client.asked["state"]) == ["dispatched", "evicting", "running"]
    assert client.asked["limit"] == 7
    assert snap.taken_at == NOW and len(snap.gpus) == 5 and len(snap.evictions) == 3
    assert snap.notes == ()


def test_a_server_without_evictions_leaves_a_note_not_an_error() -> None:
    snap = fetch_snapshot(FakeClient(UserError("Not Found")), now=lambda: NOW)
    assert snap.evictions == () and len(snap.gpus) == 5
    assert snap.notes == ("evictions cannot be read here: Not Found",)


# -- the view ---------------------------------------------------------------------------


def names(snap: FleetSnapshot, state: ViewState) -> list[str]:
    return [g.name for g in visible_gpus(snap, state)]


def test_each_sort_puts_the_highest_first_and_keeps_node_order_in_ties() -> None:
    snap = snapshot()
    assert names(snap, ViewState(sort="online"))[:2] == ["gpu-2/1", "gpu-2/0"]
    assert names(snap, ViewState(sort="offline"))[:2] == ["gpu-b/0", "gpu-2/0"]
    assert names(snap, ViewState(sort="headroom")) == [
        "gpu-10/0",
        "gpu-2/1",
        "gpu-2/0",
        "gpu-b/0",
        "gpu-b/1",
    ]


def test_filters_match_any_part_of_a_name_in_any_case() -> None:
    snap = snapshot()
    assert names(snap, ViewState(node="GPU-B")) == ["gpu-b/0", "gpu-b/1"]
    by_bob = ViewState(user="bo")
    assert names(snap, by_bob) == ["gpu-2/0"]
    [gpu] = visible_gpus(snap, by_bob)
    assert [a.owner for a in shown_attempts(gpu, by_bob)] == ["bob"]  # alice's is hidden
    assert names(snap, ViewState(queue="batch")) == ["gpu-2/0", "gpu-b/0"]
    assert [e.job_id for e in visible_evictions(snap, ViewState(user="erin"))] == [11]
    assert names(snap, ViewState(node="nope")) == []


def keys(state: ViewState, *pressed: str, total: int = 100, page: int = 10) -> ViewState:
    for key in pressed:
        state = press(state, key, page=page, total=total)
    return state


@pytest.mark.parametrize(
    ("pressed", "expected"),
    [
        (["s"], {"sort": "online"}),
        (["s"] * len(SORTS), {"sort": "node"}),
        (["n", "g", "p", "u", "enter"], {"node": "gpu", "prompt": None}),
        (["n", "g", "p", "u"], {"node": "", "prompt": "node", "typed": "gpu"}),
        (["n", "a", "b", "backspace", "enter"], {"node": "a"}),
        (["u", "q", "enter"], {"user": "q", "quit": False}),  # q is text in a prompt
        (["Q", "b", "esc"], {"queue": "", "prompt": None}),
        (["u", "x", "enter", "u", "enter"], {"user": ""}),  # empty clears
        (["n", "a", "enter", "u", "b", "enter", "c"], {"node": "", "user": ""}),
        (["q"], {"quit": True}),
        (["n", "ctrl-c"], {"quit": True}),
        (["r"], {"refresh": True}),
        (["tab"], {"panel": "evictions", "offset": 0}),
        (["tab", "tab", "tab"], {"panel": "gpus"}),
        (["down", "j", "j"], {"offset": 3}),
        (["down", "up", "k", "k"], {"offset": 0}),
        (["pgdn", "pgdn", "pgup"], {"offset": 10}),
        (["end"], {"offset": 90}),
        (["G", "down", " "], {"offset": 90}),  # the last page stays full
        (["end", "home"], {"offset": 0}),
        (["pgdn", "s"], {"offset": 0}),  # a new order starts at the top
        (["pgdn", "n", "x", "enter"], {"offset": 0, "node": "x"}),
        (["x", "F", "left"], {}),  # unknown keys change nothing
    ],
)
def test_keys_change_the_view(pressed: list[str], expected: dict[str, Any]) -> None:
    state = keys(ViewState(), *pressed)
    for field, value in expected.items():
        assert getattr(state, field) == value, (pressed, field)
    if not expected:
        assert state == ViewState()


def test_a_short_panel_does_not_scroll() -> None:
    assert keys(ViewState(), "pgdn", "end", total=4, page=10).offset == 0


def test_filter_text_is_bounded() -> None:
    assert len(keys(ViewState(), "n", *["x"] * 200).typed) == 64


@pytest.mark.parametrize(
    ("sent", "pressed"),
    [
        ("q", ["q"]),
        ("\x1b[A\x1b[B\x1bOA\x1bOB", ["up", "down", "up", "down"]),
        ("\x1b[5~\x1b[6~", ["pgup", "pgdn"]),
        ("\x1b[H\x1b[F\x1b[1~\x1b[4~\x1bOH", ["home", "end", "home", "end", "home"]),
        ("ab\r\x7f\t\x08\n", ["a", "b", "enter", "backspace", "tab", "backspace", "enter"]),
        ("\x1b", ["esc"]),
        ("\x1b[1;5C\x1b[Zx", ["x"]),  # sequences it does not know are dropped
        ("\x03", ["ctrl-c"]),
        ("\x00\x1f", []),
        ("é", ["é"]),
    ],
)
def test_what_a_terminal_sends_as_keys(sent: str, pressed: list[str]) -> None:
    assert parse_keys(sent) == pressed


# -- the frame --------------------------------------------------------------------------


def draw(snap: FleetSnapshot, state: ViewState, width: int = 160, height: int | None = 24) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, height=height or 25, color_system=None)
    console.print(render(snap, state, width, height))
    return out.getvalue()


def many(count: int) -> FleetSnapshot:
    """``count`` GPUs on nodes of 8, each with one attempt."""
    nodes = [
        node(f"n{k:02d}", *(device(i, 10 * (i % 8)) for i in range(8))) for k in range(count // 8)
    ]
    jobs = [job(k + 1, f"user{k % 5}", f"n{k // 8:02d}/{k % 8}", 10) for k in range(count)]
    return snapshot(nodes=nodes, jobs=jobs)


def test_a_frame_shows_totals_queues_gpus_evictions_and_keys() -> None:
    text = draw(snapshot(), ViewState())
    lines = text.splitlines()
    assert lines[0].startswith("ebb top") and "5 GPUs on 3 nodes" in lines[0]
    assert "4 attempts (1 paused)" in lines[0] and "sort: node" in lines[0]
    assert "online 21%" in lines[1] and "1 GPUs take no work" in lines[1]
    assert (
        "default 3 running 7 queued" in lines[2] and "batch 2 running 0 queued 3 held" in lines[2]
    )
    row = next(line for line in lines if line.startswith("gpu-2/0"))
    assert "30%" in row and "45%" in row and "25%" in row
    assert "#1 alice/default, #2 bob/batch (paused)" in row
    assert "(evicting)" in next(line for line in lines if line.startswith("gpu-2/1"))
    out = next(line for line in lines if line.startswith("gpu-b/1"))
    assert "OUT" in out and "XID 79" in out and "×" in out
    assert any("met 30s" in line and "#10 carol/batch" in line for line in lines)
    assert any("MISSED 30s" in line and "killed at the deadline" in line for line in lines)
    assert lines[-1].startswith("gpus 1-5 of 5") and "q quit" in lines[-1]


def reserved() -> FleetSnapshot:
    """gpu-a/0 nearly idle but for a 72000 MiB reserve; gpu-a/1 on the cold one."""
    forecast = device(0, 3, reserve_compute_pct=5.0, reserve_memory_mib=72000.0)
    cold = device(
        1, 10, reserve_compute_pct=30.0, reserve_memory_mib=8 * GIB, reserve_cold_for_s=420
    )
    out = device(2, 0, reserve_compute_pct=9.0, reserve_memory_mib=GIB, drained="gpu-a/2 drained")
    return snapshot(nodes=[node("gpu-a", forecast, cold, out)], jobs=[])


def test_the_reserve_is_in_the_snapshot_and_not_taken_off_the_headroom() -> None:
    snap = reserved()
    idle, cold, _ = snap.gpus
    assert (idle.reserve_compute_pct, idle.reserve_memory_mib, idle.reserve_cold_for_s) == (
        5.0,
        72000.0,
        0.0,
    )
    assert idle.headroom_compute_pct == 97 and cold.reserve_cold_for_s == 420
    t = snap.totals
    # over every GPU, as the headroom; a drained one keeps nothing back for anyone
    assert t.reserve_compute_pct == pytest.approx((5 + 30) / 3)
    assert t.reserve_memory_mib == 72000 + 8 * GIB
    gpu = json.loads(json.dumps(snap.to_dict()))["gpus"][0]
    assert (gpu["reserve_memory_mib"], gpu["reserve_cold_for_s"]) == (72000.0, 0.0)


def test_a_row_shows_what_is_kept_back_beside_the_free_room() -> None:
    """An SRE's trap: ``ebb top --once`` showed a card nearly idle with no slices while a
    job waited on the forecast's 72000 MiB reserve, which only ``--json`` had."""
    lines = draw(reserved(), ViewState()).splitlines()
    assert "headroom 62% (kept 12%)" in lines[1] and "free 155 of 240 GiB (kept 78)" in lines[1]
    heading = next(line for line in lines if line.startswith("GPU"))
    idle = next(line for line in lines if line.startswith("gpu-a/0"))
    kept, kept_gib = heading.index("KEPT") + len("KEPT"), heading.index("KEPT GiB") + 8
    assert idle[kept - 3 : kept] == " 5%" and idle[kept_gib - 3 : kept_gib] == " 70"
    assert idle[heading.index("FREE") :].startswith(" 97%")
    cold = next(line for line in lines if line.startswith("gpu-a/1"))
    assert cold[kept - 3 : kept] == "30%" and cold.endswith(" ok     warming up (cold reserve)")
    # a drained GPU keeps nothing back from admission, as the totals count it
    out = next(line for line in lines if line.startswith("gpu-a/2"))
    assert out[kept - 4 : kept] == "   -" and out[kept_gib - 1 : kept_gib] == "-"
    narrow = draw(reserved(), ViewState(), width=80).splitlines()
    heading = next(line for line in narrow if line.startswith("GPU"))
    assert "KEPT" in heading and "KEPT GiB" not in heading
    assert all(len(line) <= 80 for line in narrow)


def test_warming_up_is_said_only_where_something_is_kept_back() -> None:
    nothing = device(0, 3, reserve_cold_for_s=420)  # a warm-up with no cold reserve set
    lines = draw(snapshot(nodes=[node("gpu-a", nothing)], jobs=[]), ViewState()).splitlines()
    row = next(line for line in lines if line.startswith("gpu-a/0"))
    assert "warming up" not in row


def test_only_the_rows_that_fit_are_drawn_and_scrolling_moves_them() -> None:
    snap = many(1000)
    text = draw(snap, ViewState(), height=30)
    lines = text.splitlines()
    assert len(lines) <= 30
    body = page_rows(30, snap, ViewState())
    assert body == 30 - 5 - (FOOTER_EVICTIONS - 2 + 1)  # 3 evictions to list
    assert sum(line.startswith("n") for line in lines) == body
    assert lines[-1].startswith(f"gpus 1-{body} of 1,000")
    scrolled = draw(snap, ViewState(offset=500), height=30).splitlines()
    assert scrolled[4].startswith("n62/4")  # row 501
    past = draw(snap, ViewState(offset=5000), height=30).splitlines()
    assert past[-1].startswith(f"gpus {1000 - body + 1}-1000 of 1,000")


def test_a_short_terminal_gives_up_the_footer_before_the_gpus() -> None:
    snap = many(64)
    for height in (6, 8, 12, 14):
        lines = draw(snap, ViewState(), height=height).splitlines()
        assert len(lines) <= height, height
        assert sum(line.startswith("n") for line in lines) >= 1
    assert frame_layout(9, snap, ViewState()).footer_evictions == 0
    assert frame_layout(40, snap, ViewState()).footer_evictions == 3
    assert frame_layout(None, snap, ViewState()).body is None


def test_without_a_height_every_row_is_drawn() -> None:
    lines = draw(many(64), ViewState(), height=None).splitlines()
    assert sum(line.startswith("n") for line in lines) == 64


def test_a_narrow_terminal_drops_the_memory_column_and_halves_the_bar() -> None:
    text = draw(snapshot(), ViewState(), width=80)
    assert "MEM GiB" not in text and "MEM GiB" in draw(snapshot(), ViewState())
    assert all(len(line) <= 80 for line in text.splitlines())


def test_the_prompt_and_the_filters_show() -> None:
    state = keys(ViewState(), "u", "b", "o", "enter", "n", "g", "p")
    text = draw(snapshot(), state)
    assert "user~bo" in text.splitlines()[0]
    assert "filter node: gp▏" in text.splitlines()[-1]
    assert "gpu-b" not in "\n".join(text.splitlines()[4:-4])  # bob is on gpu-2 only


def test_the_evictions_and_queues_panels() -> None:
    snap = snapshot()
    evictions = draw(snap, ViewState(panel="evictions")).splitlines()
    assert evictions[3].startswith("EVICTED") and "#10 carol/batch" in evictions[4]
    assert evictions[-1].startswith("evictions 1-3 of 3")
    assert sum("carol/batch" in line for line in evictions) == 2  # listed once, no footer
    queues = draw(snap, ViewState(panel="queues")).splitlines()
    assert queues[3].split()[:3] == ["QUEUE", "HELD", "WAITING"]
    assert queues[4].split()[:1] == ["batch"] and queues[-1].startswith("queues 1-2 of 2")
    assert panel_rows(snap, ViewState(panel="queues")) == 2


def test_a_failed_refresh_shows_in_the_title() -> None:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(
        render(snapshot(), ViewState(), 200, 24, status="cannot refresh (store gone)")
    )
    assert "cannot refresh (store gone)" in out.getvalue().splitlines()[0]


def test_an_empty_fleet_draws() -> None:
    text = draw(build_snapshot([], [], {}, [], taken_at=NOW), ViewState())
    assert "0 GPUs on 0 nodes" in text and "gpus 0 of 0" in text
