"""A Redis that stops answering made each of an agent's two dramatiq consumers log a
CRITICAL record with a long traceback every second; now each says it once, as a warning
of ours, and any other error of a consumer is still said in full."""

from __future__ import annotations

import logging
import time
import uuid
from urllib.parse import urlsplit

import redis

from ebbtide.messaging import bus as bus_module
from ebbtide.messaging.broker_logs import REPEAT_S, BrokerOutageFilter
from ebbtide.messaging.bus import Bus
from tests.integration.test_bus import _Proxy

CONSUMER = "dramatiq.worker.ConsumerThread(ebb.node.n1)"


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _record(name: str, exc: BaseException) -> logging.LogRecord:
    message = "Consumer encountered an unexpected error."
    try:
        raise exc
    except BaseException as raised:
        info = (type(raised), raised, raised.__traceback__)
    return logging.LogRecord(name, logging.CRITICAL, __file__, 1, message, None, info)


def test_a_consumers_outage_is_one_warning_a_minute_and_a_bug_stays_critical() -> None:
    now = [0.0]
    flt = BrokerOutageFilter(clock=lambda: now[0])
    timeout = redis.exceptions.TimeoutError("Timeout reading from socket")
    first = _record(CONSUMER, timeout)
    assert flt.filter(first)
    assert first.levelno == logging.WARNING and first.exc_info is None
    text = first.getMessage()
    assert "the message broker does not answer (TimeoutError: Timeout reading" in text
    assert "consumer of ebb.node.n1" in text
    for _ in range(5):  # the consumer restarts every second
        now[0] += 1
        assert not flt.filter(_record(CONSUMER, timeout))
    now[0] = REPEAT_S + 1
    again = _record(CONSUMER, timeout)
    assert flt.filter(again) and "(and 5 times more in 60s)" in again.getMessage()
    # the other consumer says it too, once
    other = _record("dramatiq.worker.ConsumerThread(ebb.events)", timeout)
    assert flt.filter(other) and other.levelno == logging.WARNING
    # a bug of a consumer: as dramatiq said it, traceback and all
    bug = _record(CONSUMER, KeyError("oops"))
    assert flt.filter(bug) and bug.levelno == logging.CRITICAL and bug.exc_info is not None
    # anyone else's records pass untouched
    mine = _record("ebbtide.agent", timeout)
    assert flt.filter(mine) and mine.levelno == logging.CRITICAL


def test_a_hung_redis_makes_no_critical_record(redis_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(bus_module, "BROKER_SOCKET_TIMEOUT_S", 0.3)
    kept = Kept()
    kept.addFilter(BrokerOutageFilter())
    dramatiq_logger = logging.getLogger("dramatiq")
    dramatiq_logger.addHandler(kept)
    parts = urlsplit(redis_url)
    proxy = _Proxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    bus = Bus.redis(f"redis://127.0.0.1:{proxy.port}/0", f"ebbtest-{uuid.uuid4().hex[:8]}")
    try:
        bus.serve(nodes={"n1": lambda _command: None})
        time.sleep(0.5)
        proxy.hung.set()
        time.sleep(3.0)  # several timeouts and restarts of each consumer
        proxy.hung.clear()
        time.sleep(0.5)
    finally:
        bus.close()
        proxy.close()
        dramatiq_logger.removeHandler(kept)
    said = [r for r in kept.records if r.levelno >= logging.WARNING]
    assert said, "the outage was not said at all"
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in said), [
        (r.levelname, r.getMessage()) for r in said
    ]
    assert any("the message broker does not answer" in r.getMessage() for r in said)
