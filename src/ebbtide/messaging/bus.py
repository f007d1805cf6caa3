"""The message bus: dramatiq queues between the scheduler and the node agents.

- ``<namespace>.node.<name>``: commands for one node agent (:class:`StartAttempt`,
  :class:`EvictAttempt`).
- ``<namespace>.events``: events back to the scheduler (:class:`AttemptChanged`: wake
  up and replan).

Both ends speak the typed models of :mod:`ebbtide.messaging.messages`; a payload that
does not validate is logged and dropped.

Messages are hints, never the truth: the SQL store is.  Handlers are idempotent and
short (they queue the command for the agent's loop and return), a lost message is made
good by the agent's and the scheduler's reconciliation against the store, and a message
older than ``MESSAGE_MAX_AGE_MS`` is dropped.  We never rely on dramatiq's redelivery.

``Bus.memory()`` uses dramatiq's in-memory ``StubBroker`` (embedded mode);
``Bus.redis(url)`` the ``RedisBroker`` (distributed mode).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import dramatiq
from dramatiq.broker import Broker
from dramatiq.brokers.stub import StubBroker
from dramatiq.message import Message

from ebbtide.errors import BrokerUnavailable, ConfigError
from ebbtide.messaging.liveness import SOCKET_TIMEOUT_S, RedisLiveness
from ebbtide.messaging.messages import (
    AttemptChanged,
    EvictAttempt,
    StartAttempt,
    ValidationError,
    parse_event,
    parse_node_command,
)

log = logging.getLogger("ebbtide.bus")

#: Commands older than this are dropped unread, in milliseconds.
MESSAGE_MAX_AGE_MS = 60_000
#: The longest an idle consumer waits before polling again, in milliseconds (dramatiq
#: backs off to it while a queue stays empty, and polls at once after a message).  On
#: Redis each poll is a few commands per queue: at 50 ms an idle agent cost about 190
#: commands a second, 240,000 for a fleet of 1,250; at 250 ms about 55.  Dispatch waits
#: up to this much longer (`benchmarks/fleet_scale.py`: p99 0.61 s → 0.69 s), and an
#: agent also finds its starts and evictions by reconciling with the store every 0.5 s.
WORKER_TIMEOUT_MS = 250

#: The longest the broker's Redis client waits on one connect, send or read, in
#: seconds: a Redis that stops answering (a hung server, a network partition that drops
#: packets) fails a call rather than stalling its caller for ever.  A consumer's fetch
#: is a short Lua script; no command of the broker's blocks.
BROKER_SOCKET_TIMEOUT_S = 5.0
#: Retries of a call that failed with a connection error (refused, reset or closed;
#: backing off up to 1 s between; a call that timed out is not retried): redis-py's
#: default of 10, with its backoff, held a pass up to a minute against a Redis that was
#: down.
BROKER_RETRIES = 3
#: After a send fails, the next sends in this many seconds are dropped unsent rather
#: than each waiting out its own failure: a scheduler pass sends one after another.
#: Reconciliation makes every dropped command good (agents read their starts and
#: evictions from the store every 0.5 s, and the scheduler passes every 0.5 s anyway).
SEND_PAUSE_AFTER_FAILURE_S = 2.0

_NODE_ACTOR = "ebbtide_node_command"
_EVENT_ACTOR = "ebbtide_scheduler_event"

NodeHandler = Callable[[StartAttempt | EvictAttempt], None]
EventHandler = Callable[[AttemptChanged], None]


class Bus:
    def __init__(self, broker: Broker, namespace: str = "ebbtide") -> None:
        self.broker = broker
        self.namespace = namespace
        self._node_handlers: dict[str, NodeHandler] = {}
        self._event_handler: EventHandler | None = None
        self._worker: dramatiq.Worker | None = None
        self._redis: Any = None
        self._url: str | None = None
        self._sends_paused_until = 0.0  # monotonic: sends are dropped until then
        register = dramatiq.actor(
            broker=broker, actor_name=_NODE_ACTOR, queue_name=self.node_queue("_"), max_retries=0
        )
        register(self._on_node_command)
        register = dramatiq.actor(
            broker=broker, actor_name=_EVENT_ACTOR, queue_name=self.events_queue, max_retries=0
        )
        register(self._on_event)

    @classmethod
    def memory(cls, namespace: str = "ebbtide") -> Bus:
        return cls(StubBroker(), namespace)

    @classmethod
    def redis(cls, url: str, namespace: str = "ebbtide") -> Bus:
        import redis
        from dramatiq.brokers.redis import RedisBroker
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.retry import Retry

        from ebbtide.config.settings import redacted

        try:
            client = redis.Redis.from_url(
                url,
                socket_timeout=BROKER_SOCKET_TIMEOUT_S,
                socket_connect_timeout=BROKER_SOCKET_TIMEOUT_S,
                retry=Retry(
                    ExponentialBackoff(cap=1.0, base=0.1),
                    BROKER_RETRIES,
                    supported_errors=(RedisConnectionError,),
                ),
            )
        except ValueError as exc:  # not a Redis URL: name the setting it came from
            raise ConfigError(f"EBBTIDE_REDIS_URL: {redacted(url)}: {exc}") from None
        try:
            client.ping()
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"cannot reach Redis at {redacted(url)}: {exc}") from None
        bus = cls(RedisBroker(client=client, namespace=namespace), namespace)
        bus._redis = client
        bus._url = url
        return bus

    def liveness(self, *, timeout_s: float = SOCKET_TIMEOUT_S) -> RedisLiveness | None:
        """Node liveness beside this bus (:mod:`ebbtide.messaging.liveness`), on
        connections of its own whose calls wait at most ``timeout_s``; None in embedded
        mode (there the store takes every heartbeat's liveness as it always did)."""
        if self._url is None:
            return None
        return RedisLiveness.from_url(self._url, self.namespace, timeout_s=timeout_s)

    # -- names --------------------------------------------------------------------------

    def node_queue(self, node: str) -> str:
        return f"{self.namespace}.node.{node}"

    @property
    def events_queue(self) -> str:
        return f"{self.namespace}.events"

    # -- sending ------------------------------------------------------------------------

    def _send(self, queue_name: str, actor: str, payload: dict[str, Any]) -> None:
        self.broker.declare_queue(queue_name)
        message: Message[Any] = Message(
            queue_name=queue_name,
            actor_name=actor,
            args=(payload,),
            kwargs={},
            options={"max_age": MESSAGE_MAX_AGE_MS, "max_retries": 0},
        )
        if time.monotonic() < self._sends_paused_until:  # failed a moment ago: drop it
            log.debug("not sending %s to %s: Redis failed a send", payload.get("op"), queue_name)
            return
        try:
            self.broker.enqueue(message)
        except Exception as exc:  # a lost message is made good by reconciliation
            self._sends_paused_until = time.monotonic() + SEND_PAUSE_AFTER_FAILURE_S
            log.warning(
                "could not send %s to %s: %s; sends resume in %gs, reconciliation makes "
                "up for those dropped",
                payload.get("op"),
                queue_name,
                exc,
                SEND_PAUSE_AFTER_FAILURE_S,
            )

    def send_to_node(self, node: str, command: StartAttempt | EvictAttempt) -> None:
        self._send(
            self.node_queue(node), _NODE_ACTOR, {**command.model_dump(mode="json"), "node": node}
        )

    def notify_scheduler(self, event: AttemptChanged) -> None:
        self._send(self.events_queue, _EVENT_ACTOR, event.model_dump(mode="json"))

    # -- receiving ----------------------------------------------------------------------

    def _on_node_command(self, payload: dict[str, Any]) -> None:
        handler = self._node_handlers.get(payload.get("node", ""))
        if handler is None:
            log.info("command for unknown node %s dropped", payload.get("node"))
            return
        try:
            command = parse_node_command(payload)
        except ValidationError as exc:
            log.warning("malformed node command dropped: %s", exc.errors()[:1])
            return
        handler(command)

    def _on_event(self, payload: dict[str, Any]) -> None:
        if self._event_handler is None:
            return
        try:
            event = parse_event(payload)
        except ValidationError as exc:
            log.warning("malformed scheduler event dropped: %s", exc.errors()[:1])
            return
        self._event_handler(event)

    def serve(
        self,
        *,
        nodes: Mapping[str, NodeHandler] | None = None,
        events: EventHandler | None = None,
    ) -> None:
        """Start consuming: the given nodes' command queues and, with ``events``, the
        scheduler's event queue.  One dramatiq worker per process."""
        self._node_handlers.update(nodes or {})
        self._event_handler = events
        queues = {self.node_queue(n) for n in self._node_handlers}
        if events is not None:
            queues.add(self.events_queue)
        for q in queues:
            self.broker.declare_queue(q)
        self._worker = dramatiq.Worker(
            self.broker, queues=queues, worker_threads=2, worker_timeout=WORKER_TIMEOUT_MS
        )
        self._worker.start()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self.broker.close()
        if self._redis is not None:
            self._redis.close()
            self._redis.connection_pool.disconnect()
