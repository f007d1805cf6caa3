"""What the broker's consumers log while Redis does not answer, in our words.

dramatiq's consumer threads log a CRITICAL record with a traceback each time a fetch fails
(Redis down, restarting, or hung past the socket timeout) and restart the consumer a
second later: a minute's outage was some sixty critical tracebacks per consumer, and an
agent has two — paging whoever alerts on CRITICAL for what ebbtide rides out by design
(messages are hints; agents and the scheduler reconcile with the store).
:class:`BrokerOutageFilter` rewrites such a record as one WARNING line without the
traceback, and drops the same complaint from the same consumer for
:data:`REPEAT_S`, then says how many it dropped.  Any other error of a consumer keeps
its level and traceback: that one is a bug.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from dramatiq.errors import BrokerConnectionError

#: The same complaint from one consumer is said once in this many seconds.
REPEAT_S = 60.0
#: The errors of a broker that does not answer (others are bugs, said in full).
TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
             BrokerConnectionError, ConnectionError, TimeoutError)  # fmt: skip
_CONSUMER = "dramatiq.worker.ConsumerThread"


class BrokerOutageFilter(logging.Filter):
    """Put on a handler: a consumer's complaint that the broker does not answer becomes a
    WARNING of ours, at most once per :data:`REPEAT_S` per consumer and error."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        #: (consumer, error) → (when last said, how many dropped since)
        self._said: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_CONSUMER):
            return True
        exc = _transient_error(record)
        if exc is None:
            return True
        key = (record.name, type(exc).__name__)
        now = self._clock()
        said = self._said.get(key)
        if said is not None and now - said[0] < REPEAT_S:
            self._said[key] = (said[0], said[1] + 1)
            return False
        dropped = f" (and {said[1]} times more in {REPEAT_S:g}s)" if said and said[1] else ""
        self._said[key] = (now, 0)
        queue = record.name[len(_CONSUMER) :].strip("()") or "?"
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = (
            "the message broker does not answer (%s: %s); the consumer of %s tries again "
            "every second, and the store stays the truth meanwhile%s"
        )
        record.args = (type(exc).__name__, str(exc) or "no detail", queue, dropped)
        record.exc_info, record.exc_text = None, None
        return True


def _transient_error(record: logging.LogRecord) -> BaseException | None:
    """The broker's error a consumer's record is about, if it is one of :data:`TRANSIENT`."""
    if record.levelno < logging.ERROR:
        return None
    candidates: list[Any] = []
    if record.exc_info and record.exc_info[1] is not None:
        candidates.append(record.exc_info[1])
    if isinstance(record.args, tuple):
        candidates += [a for a in record.args if isinstance(a, BaseException)]
    for exc in candidates:
        if isinstance(exc, TRANSIENT):
            return exc
    return None


def install(logger: logging.Logger | None = None) -> BrokerOutageFilter:
    """Put a :class:`BrokerOutageFilter` on every handler of ``logger`` (the root logger)."""
    flt = BrokerOutageFilter()
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(flt)
    return flt
