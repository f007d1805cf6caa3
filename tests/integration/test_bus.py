"""The dramatiq bus: commands reach the named node's agent, events reach the scheduler,
over the in-memory broker and over the real Redis."""

from __future__ import annotations

import time
import uuid

import dramatiq
import pytest

from ebbtide.messaging.bus import Bus
from ebbtide.messaging.messages import AttemptChanged, EvictAttempt, StartAttempt


def _roundtrip(bus: Bus) -> None:
    got: list[tuple[str, object]] = []
    bus.serve(
        nodes={"a": lambda m: got.append(("a", m)), "b": lambda m: got.append(("b", m))},
        events=lambda m: got.append(("sched", m)),
    )
    try:
        bus.send_to_node("a", StartAttempt(job_id=1, attempt=1))
        evict = EvictAttempt(job_id=2, attempt=3, reason="online_memory", spike_at=5.0)
        bus.send_to_node("b", evict)
        bus.send_to_node("nobody", StartAttempt(job_id=9, attempt=1))
        bus.notify_scheduler(AttemptChanged(job_id=1, node="a"))
        bus.broker.enqueue(  # not a command at all: logged and dropped
            dramatiq.Message(
                queue_name=bus.node_queue("a"),
                actor_name="ebbtide_node_command",
                args=({"op": "explode", "node": "a"},),
                kwargs={},
                options={},
            )
        )
        give_up = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < give_up:
            time.sleep(0.01)
        time.sleep(0.2)
    finally:
        bus.close()
    assert sorted(((who, m) for who, m in got), key=lambda x: x[0]) == [
        ("a", StartAttempt(job_id=1, attempt=1)),
        ("b", evict),
        ("sched", AttemptChanged(job_id=1, node="a")),
    ]


def test_memory_bus_roundtrip() -> None:
    _roundtrip(Bus.memory())


@pytest.mark.redis
def test_redis_bus_roundtrip(redis_url: str) -> None:
    _roundtrip(Bus.redis(redis_url, f"ebbtest-{uuid.uuid4().hex[:8]}"))


def test_unreachable_redis_is_a_clear_error() -> None:
    from ebbtide.errors import BrokerUnavailable

    with pytest.raises(BrokerUnavailable, match="cannot reach Redis"):
        Bus.redis("redis://127.0.0.1:1/0")


def test_a_redis_that_does_not_answer_is_a_clear_error_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker's client had no socket timeout: a Redis that accepts connections but
    never answers (hung, or a partition that drops packets) stalled its caller for ever."""
    import socket

    from ebbtide.errors import BrokerUnavailable
    from ebbtide.messaging import bus

    monkeypatch.setattr(bus, "BROKER_SOCKET_TIMEOUT_S", 0.2)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog; nothing ever answers
        began = time.monotonic()
        with pytest.raises(BrokerUnavailable, match=r"cannot reach Redis.*[Tt]imeout"):
            Bus.redis(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        assert time.monotonic() - began < 10


def test_a_url_that_is_not_redis_names_the_setting() -> None:
    """A trial's trap: ``EBBTIDE_REDIS_URL=http://...`` said only "Redis URL must specify
    one of the following schemes"."""
    from ebbtide.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^EBBTIDE_REDIS_URL: http://x:\*\*\*@h/0: .*scheme"):
        Bus.redis("http://x:secret@h/0")
