"""Messages and heartbeats are typed models shared by sender and receiver."""

from __future__ import annotations

import json

import pytest

from ebbtide.messaging.messages import (
    AttemptChanged,
    DeviceReport,
    EvictAttempt,
    StartAttempt,
    ValidationError,
    parse_event,
    parse_node_command,
)
from ebbtide.scheduling.loop import node_devices, unavailable


@pytest.mark.parametrize(
    "command",
    [
        StartAttempt(job_id=1, attempt=2),
        EvictAttempt(job_id=1, attempt=2),
        EvictAttempt(job_id=3, attempt=1, reason="online_memory", message="m", spike_at=1.5),
    ],
)
def test_node_commands_round_trip_through_their_wire_form(command: object) -> None:
    wire = json.loads(json.dumps({**command.model_dump(mode="json"), "node": "n1"}))  # type: ignore[attr-defined]
    assert parse_node_command(wire) == command


def test_both_evict_senders_build_the_same_message() -> None:
    # the scheduler taking back a dispatched attempt sends only the ids; the defaults
    # say what the agent then does (the job's own deadline, from when it gets it)
    bare = parse_node_command({"op": "evict", "job_id": 4, "attempt": 1})
    assert bare == EvictAttempt(job_id=4, attempt=1, reason="scheduler", spike_at=None)
    assert bare.deadline_s is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "payload",
    [
        {"op": "explode", "job_id": 1, "attempt": 1},
        {"op": "start", "job_id": "one", "attempt": 1},
        {"op": "start"},
        {"job_id": 1, "attempt": 1},
        "start 1 1",
    ],
)
def test_malformed_commands_do_not_validate(payload: object) -> None:
    with pytest.raises(ValidationError):
        parse_node_command(payload)


def test_events() -> None:
    assert parse_event({"op": "changed", "job_id": 7, "node": "n"}) == AttemptChanged(
        job_id=7, node="n"
    )
    with pytest.raises(ValidationError):
        parse_event({"op": "changed"})


def test_heartbeat_devices_are_validated_and_a_bad_one_left_out() -> None:
    good = DeviceReport(index=0, memory_mib=81920, online_compute_pct=12.5).model_dump()
    broken = {"index": "zero", "memory_mib": 1}
    faulty = {
        "index": 1,
        "memory_mib": 81920,
        "health": "unhealthy",
        "fault": {"xid": 79, "meaning": "XID 79: GPU has fallen off the bus", "lost": True},
    }
    devices = node_devices("n1", json.dumps([good, broken, faulty]))
    assert [d.index for d in devices] == [0, 1]
    assert devices[0].online_compute_pct == 12.5 and devices[0].eviction_trigger
    assert unavailable("n1", devices[0], {}) == ""
    assert unavailable("n1", devices[0], {("n1", -1): "n1 drained by root"}) == (
        "n1 drained by root"
    )
    assert unavailable("n1", devices[1], {}) == (
        "n1/1 is out of service: XID 79: GPU has fallen off the bus"
    )
