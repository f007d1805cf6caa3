"""Node liveness through Redis: "this node is alive" twice a second, off the SQL store.

Every node agent offers a heartbeat every half second.  The SQL store takes those that
change what the scheduler decides (:mod:`ebbtide.workers.heartbeat`); the rest only say
the node is alive, and written to SQL they were most of a fleet's database writes (1,000
nodes: 400 a second at one write per node every 2.5 s).  In distributed mode they go to
Redis instead, one command each:

- ``<namespace>.alive``: a hash, node name → the wall time of its last heartbeat (the
  agent's clock, as the store's ``heartbeat_at`` is);
- ``<namespace>.alive.reader``: set by the *leading* scheduler after each read of the
  hash that succeeded (a pass reads it), expiring after :func:`reader_ttl_ms` (a quarter
  of the heartbeat timeout ``T``, at most ``READER_TTL_MS``): "a scheduler reads this
  hash".

Every process that reads nodes from the store (the scheduler, ``ebb nodes``, ``ebb
server``, the agent's node-name claim) takes each node's heartbeat as the later of the
store's and the hash's (:meth:`NodeLiveness.seen`, used by the SQL store's ``nodes()``).

The rule that keeps a node alive: an agent writes its heartbeat to SQL at most
``HeartbeatRules.period_s`` apart (a quarter of ``T``) *unless* its last touch of the
hash found the reader key there; then only for room that grew, and at least
``RELAYED_WRITE_PERIOD_S`` apart.  So a Redis that fails or restarts (it keeps nothing
on disk) sends agents back to writing SQL at the next offer; the scheduler keeps the
times it last read.

When the scheduler stops seeing the hash at ``t`` (its reads fail; a new leader whose
first read fails), its newest view of each node is from about ``t``, and the key it
last set is gone by ``t + T/4``; every agent's next offer then writes to SQL.  Until
``blind_grace_s`` after ``t`` it gives no node up as silent; by then each live node's
store heartbeat is current again.  An agent cut off from the store for more than a write
period stops touching the hash, so that the scheduler gives its node up (its attempts
fenced by then) rather than keeping alive a node that cannot run anything.

**Upgrading.**  Schema version 12 marks a store whose nodes may be alive in Redis only:
a scheduler older than it refuses to start against it.  One already running (an older
standby) would take the store's heartbeats, up to ``RELAYED_WRITE_PERIOD_S`` old, for
silence when it takes the lead: stop older schedulers before a scheduler of this
version leads.  Agents may be upgraded in any order.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.errors import first_line

log = logging.getLogger("ebbtide.liveness")

#: The longest an agent's heartbeat goes unwritten to the store while a scheduler reads
#: its liveness from Redis, in seconds (for what reads the store alone: history, a client
#: without the Redis URL, an admin's ``ebb node forget``).
RELAYED_WRITE_PERIOD_S = 30.0
#: How long the leading scheduler's "I read the hash" lasts without another pass, in ms,
#: at most: several passes (a pass every 0.5 s, slower at a large fleet), so that a slow
#: pass does not send every agent back to writing; and never over a quarter of the
#: heartbeat timeout (:func:`reader_ttl_ms`).
READER_TTL_MS = 2_500
#: Redis calls wait at most this long (less under a short heartbeat timeout: the agent
#: makes them on its store thread, whose silence fences its attempts), in seconds.
SOCKET_TIMEOUT_S = 1.0
#: After a call that failed, no call is made for this long, in seconds (a Redis that
#: does not answer costs each offer and each pass nothing more than the first timeout).
PAUSE_AFTER_FAILURE_S = 5.0
#: How often heartbeats are offered, in seconds (``workers.heartbeat.OFFER_PERIOD_S``).
_OFFER_PERIOD_S = 0.5


def reader_ttl_ms(heartbeat_timeout_s: float) -> int:
    """How long the reader key lasts under a heartbeat timeout, in ms (see above)."""
    return max(1, min(READER_TTL_MS, round(heartbeat_timeout_s * 1000 / 4)))


def blind_grace_s(heartbeat_timeout_s: float) -> float:
    """How long a scheduler that cannot see the hash gives no node up as silent, in
    seconds: until the reader key it (or the leader before it) last set is gone (``T/4``
    at most), every agent has offered again (an offer, and its Redis call's timeout) and
    written (its write period, ``T/4`` at most; 2 s more for a fleet's writes to land)."""
    return (
        reader_ttl_ms(heartbeat_timeout_s) / 1000
        + heartbeat_timeout_s / 4
        + (_OFFER_PERIOD_S + SOCKET_TIMEOUT_S + 2.0)
    )


def call_timeout_s(heartbeat_timeout_s: float) -> float:
    """How long an agent's Redis call may wait under a heartbeat timeout, in seconds: a
    small part of the half timeout at which the agent fences its attempts."""
    return min(SOCKET_TIMEOUT_S, heartbeat_timeout_s / 8)


class NodeLiveness(Protocol):
    """What the store, the node agent and the scheduler ask of node liveness."""

    def touch(self, node: str) -> bool | None:
        """Say ``node`` is alive now.  True: taken, and a scheduler reads it; False:
        taken, and no scheduler has said it reads it; None: not taken (no Redis)."""

    def seen(self) -> Mapping[str, float]:
        """Each node's latest liveness time (wall seconds) as last read (a copy); while
        this process leads, a read that succeeds also sets the reader key."""

    def blind_for_s(self) -> float | None:
        """How long the hash has not been read, in seconds: since the first read that
        failed, or since this process began to lead if that is later; None while the
        last read succeeded."""

    def lead(self, heartbeat_timeout_s: float) -> None:
        """This process leads (each pass says so): reads that succeed set the reader
        key, for :func:`reader_ttl_ms` under the policy's heartbeat timeout."""

    def stand_down(self) -> None:
        """This process no longer leads: no more marks, and the key is removed."""

    def forget(self, node: str) -> None:
        """Drop ``node`` (an admin forgot it)."""

    def close(self) -> None: ...


class RedisLiveness:
    """:class:`NodeLiveness` on a Redis server; errors are logged, never raised.  Safe to
    share between threads."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        """``client``: a ``redis.Redis``; or None and ``connect``, which makes one at
        first use."""
        self._client = client
        self._connect = connect
        self.key = f"{namespace}.alive"
        self.reader_key = f"{namespace}.alive.reader"
        self.clock = clock
        self._lock = threading.Lock()
        #: node → its time as last read from the hash (kept while Redis is away, and for a
        #: node the hash lost, as when Redis restarts empty)
        self._known: dict[str, float] = {}
        #: monotonic seconds of the first read that failed since the last that did not
        self._blind_since: float | None = None
        #: the reader key's life while this process leads (ms); None: it does not lead
        self._lead_ttl_ms: int | None = None
        #: monotonic seconds this process began to lead (a failed read before then says
        #: nothing of the agents this term: :meth:`blind_for_s`)
        self._term_began = -math.inf
        #: bumped at each stand-down: a mark sent by a read that began before it is undone
        self._term = 0
        #: monotonic seconds until which no call is made (after one that failed)
        self._paused_until = -math.inf
        self._failing = False

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        timeout_s: float = SOCKET_TIMEOUT_S,
    ) -> RedisLiveness:
        """One on its own connections, made at first use (a command that reads no node
        pays nothing), each call bounded by ``timeout_s`` and never retried (the next
        offer, or pass, is the retry)."""

        def connect() -> Any:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            from ebbtide.config.settings import redacted
            from ebbtide.errors import ConfigError

            try:
                return redis.Redis.from_url(
                    url,
                    socket_timeout=timeout_s,
                    socket_connect_timeout=timeout_s,
                    retry=Retry(NoBackoff(), 0),
                )
            except ValueError as exc:  # not a Redis URL: a mistake to name, not an outage
                raise ConfigError(f"EBBTIDE_REDIS_URL: {redacted(url)}: {exc}") from None

        return cls(None, namespace, clock=clock, connect=connect)

    def _redis(self) -> Any:
        """The client, or None while calls are paused after a failure."""
        if self.clock.monotonic() < self._paused_until:
            return None
        with self._lock:
            if self._client is None and self._connect is not None:
                self._client = self._connect()
            return self._client

    def touch(self, node: str) -> bool | None:
        client = self._redis()
        if client is None:
            return None
        try:
            pipe = client.pipeline(transaction=False)
            pipe.hset(self.key, node, repr(self.clock.time()))
            pipe.exists(self.reader_key)
            _, read = pipe.execute()
        except Exception as exc:
            self._failed("a heartbeat", exc)
            return None
        self._failing = False
        return bool(read)

    def seen(self) -> Mapping[str, float]:
        client = self._redis()
        raw = None
        if client is not None:
            try:
                raw = client.hgetall(self.key)
            except Exception as exc:
                self._failed("the nodes' heartbeats", exc)
        with self._lock:
            if raw is None:
                if self._blind_since is None:
                    self._blind_since = self.clock.monotonic()
                return dict(self._known)
            self._failing = False
            self._blind_since = None
            for name, value in raw.items():
                try:
                    node = name.decode() if isinstance(name, bytes) else str(name)
                    at = float(value)
                except (ValueError, UnicodeDecodeError):
                    continue
                if math.isfinite(at):
                    self._known[node] = at  # the latest, not the largest ever
            known = dict(self._known)
            ttl_ms, term = self._lead_ttl_ms, self._term
        if ttl_ms is not None:  # only after a read that succeeded: see the module's doc
            try:
                client.set(self.reader_key, b"1", px=ttl_ms)
                with self._lock:
                    stood_down = self._term != term
                if stood_down:  # a stand-down came in meanwhile: its removal stands
                    client.delete(self.reader_key)
            except Exception as exc:
                self._failed("the reader's mark", exc)
        return known

    def blind_for_s(self) -> float | None:
        since = self._blind_since
        if since is None:
            return None
        return self.clock.monotonic() - max(since, self._term_began)

    def lead(self, heartbeat_timeout_s: float) -> None:
        with self._lock:
            if self._lead_ttl_ms is None:  # a new term: the grace counts from here
                self._term_began = self.clock.monotonic()
            self._lead_ttl_ms = reader_ttl_ms(heartbeat_timeout_s)

    def stand_down(self) -> None:
        with self._lock:
            self._lead_ttl_ms = None
            self._term += 1
        client = self._redis()
        if client is not None:
            try:
                client.delete(self.reader_key)
            except Exception as exc:
                self._failed("the reader's mark", exc)

    def forget(self, node: str) -> None:
        with self._lock:
            self._known.pop(node, None)
        client = self._redis()
        if client is not None:
            try:
                client.hdel(self.key, node)
            except Exception as exc:
                self._failed("forgetting a node", exc)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()

    def _failed(self, what: str, exc: Exception) -> None:
        self._paused_until = self.clock.monotonic() + PAUSE_AFTER_FAILURE_S
        if not self._failing:  # once an outage, not twice a second
            log.warning(
                "Redis: could not read or write %s (%s); the store's heartbeats serve "
                "meanwhile, and Redis is tried again in %gs",
                what,
                first_line(exc),
                PAUSE_AFTER_FAILURE_S,
            )
        self._failing = True


#: Why a store's ``nodes()`` may show heartbeats older than their last
#: (:func:`heartbeat_lag`): no Redis URL to read liveness from, or Redis did not answer.
LAG_REDIS_UNSET = "redis_unset"
LAG_REDIS_UNREACHABLE = "redis_unreachable"


def heartbeat_lag(store: Any) -> tuple[float, str | None]:
    """How much older than its last heartbeat a live node's may look in ``store``'s
    ``nodes()``, in seconds, and why: ``(0, None)`` where they carry the liveness last
    read from Redis (or where no agent keeps alive in Redis: a SQLite or in-memory store
    with no Redis beside it); else ``RELAYED_WRITE_PERIOD_S`` with
    :data:`LAG_REDIS_UNREACHABLE` (the last read of Redis failed) or
    :data:`LAG_REDIS_UNSET` (a client of a fleet's PostgreSQL store without
    ``EBBTIDE_REDIS_URL``)."""
    liveness = getattr(store, "liveness", None)
    if liveness is not None:
        if liveness.blind_for_s() is None:
            return 0.0, None
        return RELAYED_WRITE_PERIOD_S, LAG_REDIS_UNREACHABLE
    engine = getattr(store, "engine", None)
    if engine is None or engine.dialect.name == "sqlite":
        return 0.0, None
    return RELAYED_WRITE_PERIOD_S, LAG_REDIS_UNSET


def heartbeat_slack_s(store: Any) -> float:
    """The seconds of :func:`heartbeat_lag`."""
    return heartbeat_lag(store)[0]


def lag_in_words(why: str | None) -> str:
    """Why heartbeats may look older than their last (:func:`heartbeat_lag`), in words."""
    if why == LAG_REDIS_UNREACHABLE:
        return "nodes' liveness is kept in Redis, which did not answer at EBBTIDE_REDIS_URL"
    return "nodes' liveness is kept in Redis, not read here (set EBBTIDE_REDIS_URL)"
