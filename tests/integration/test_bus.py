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


class _Proxy:
    """A TCP proxy to the real Redis that can stop answering (a hung server, a partition
    that drops packets) while its connections stay open."""

    def __init__(self, host: str, port: int) -> None:
        import socket
        import threading

        self.target = (host, port)
        self.hung = threading.Event()
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: object, dst: object) -> None:
        while True:
            try:
                data = src.recv(65536)  # type: ignore[attr-defined]
            except OSError:
                return
            if not data:
                return
            if not self.hung.is_set():  # hung: swallowed, never answered
                dst.sendall(data)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.closed = True
        self.server.close()


def test_sends_to_a_redis_that_stops_answering_fail_fast_then_pause(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A review's catch: with retries on timeouts, each send to a hung Redis waited about
    21 s and a pass's sends one after another; now one send waits out the timeout, is
    not retried, and the sends after it are dropped for a moment (reconciliation makes
    them good) rather than each waiting its own timeout."""
    from urllib.parse import urlsplit

    from ebbtide.messaging import bus as bus_module

    monkeypatch.setattr(bus_module, "BROKER_SOCKET_TIMEOUT_S", 0.3)
    parts = urlsplit(redis_url)
    proxy = _Proxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    bus = Bus.redis(f"redis://127.0.0.1:{proxy.port}/0", f"ebbtest-{uuid.uuid4().hex[:8]}")
    try:
        bus.send_to_node("a", StartAttempt(job_id=1, attempt=1))  # answered
        proxy.hung.set()
        began = time.monotonic()
        bus.send_to_node("a", StartAttempt(job_id=2, attempt=1))
        first = time.monotonic() - began
        for job_id in range(3, 13):  # a pass's further sends: dropped at once
            bus.send_to_node("a", StartAttempt(job_id=job_id, attempt=1))
        rest = time.monotonic() - began - first
        assert 0.25 <= first < 2.0, first  # one timeout, no retry after it
        assert rest < 0.2, rest
        assert "sends resume in 2s" in caplog.text
        # after the pause, sends are tried again (and answered once Redis is back)
        proxy.hung.clear()
        monkeypatch.setattr(bus, "_sends_paused_until", 0.0)
        bus.send_to_node("a", StartAttempt(job_id=13, attempt=1))
        queued = bus._redis.hkeys(f"{bus.namespace}:{bus.node_queue('a')}.msgs")
        assert len(queued) >= 2  # the first send and this one (the hung one may be too)
    finally:
        proxy.hung.clear()
        for key in bus._redis.scan_iter(match=f"{bus.namespace}*"):
            bus._redis.delete(key)
        bus.close()
        proxy.close()
