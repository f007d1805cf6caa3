"""When a node agent's heartbeat is written to the store.

The agent journals a heartbeat every ``HEARTBEAT_PERIOD_S`` (half a second) with its
devices as they are; writing each to the store would cost a fleet of 1,250 nodes 2,500
SQL writes a second, nearly all saying "nothing changed".  The store thread writes one
(:class:`HeartbeatWriter`) only when the scheduler must act on it:

- the first one, and whenever the node starts or starts stopping;
- a device came or went, or its health, fault, sample quality, eviction trigger or last
  eviction (the cooldown) changed;
- a device's free room *shrank* by more than a small deadband (online use plus the
  reserve kept for its growth rose by more than ``SHRINK_DEADBAND_COMPUTE_PCT`` or
  ``SHRINK_DEADBAND_MEMORY_MIB`` since the last write, or half the policy's margin where
  that is less: :meth:`HeartbeatRules.for_policy`): admission into room that is gone
  would only be taken back;

and otherwise once every write period (:func:`write_period_s`: ``HEARTBEAT_WRITE_PERIOD_S``,
at most a quarter of the heartbeat timeout), which keeps the node alive in the
scheduler's eyes.  Heartbeats are offered every ``offer_period_s`` (the agent's 0.5 s),
so one is written as soon as waiting for the next offer would pass the period: writes are
never further apart than the period.  Room that *grew* waits for that periodic write: a
little lost opportunity, never a risk.  A shrink within the deadband is one half the
policy's margin already absorbs.

In distributed mode every offer also touches the node's liveness in Redis
(:mod:`ebbtide.messaging.liveness`).  While the touch finds that the leading scheduler
reads liveness there, the periodic write is only for room that *grew* by more than the
deadband (as promptly as before), and otherwise once every ``RELAYED_WRITE_PERIOD_S``
(for what reads the store alone): the SQL store sees the node's changes, not that it is
alive.  A touch that fails, or finds no such scheduler, brings the write period back at
once.

The timing this keeps: the scheduler gives a node up a heartbeat timeout ``T`` after its
last heartbeat it has (written, or touched while it reads them); an agent that stops
(paused, hung) gave one at most a period (``T/4``) before, and its attempts' shims kill
them half a timeout after its last lease renewal: by ``3T/4`` after the last heartbeat, a
quarter of ``T`` before the scheduler may move them.

So the store's figures for a node are at most a write period old for growth and for
what is shown only (offline use, online pods), and current for everything that makes the
scheduler admit less or evict.  The agent fences its attempts by its contact with the
store (:meth:`~ebbtide.workers.sync.StoreSync.silence_s`), not by the last write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ebbtide.messaging.liveness import RELAYED_WRITE_PERIOD_S

#: The longest a node's heartbeat goes unwritten while nothing the scheduler acts on
#: changes, in seconds (shorter under a short heartbeat timeout: :func:`write_period_s`).
HEARTBEAT_WRITE_PERIOD_S = 3.0
#: The write period is at most this fraction of the policy's heartbeat timeout.
WRITE_PERIOD_FRACTION = 0.25
#: How often the agent offers a heartbeat (``agent.HEARTBEAT_PERIOD_S``), in seconds.
OFFER_PERIOD_S = 0.5
#: A device's room shrinking by less than this much compute is not written at once, in %.
SHRINK_DEADBAND_COMPUTE_PCT = 2.0
#: A device's room shrinking by less than this much memory is not written at once, in MiB.
SHRINK_DEADBAND_MEMORY_MIB = 256.0

#: A device's fields whose every change is written at once.
_STATE_KEYS = (
    "memory_mib",
    "eviction_trigger",
    "sample_ok",
    "health",
    "fault",
    "last_eviction_at",
)


def write_period_s(heartbeat_timeout_s: float) -> float:
    """The write period under a policy's heartbeat timeout, in seconds."""
    return min(HEARTBEAT_WRITE_PERIOD_S, WRITE_PERIOD_FRACTION * heartbeat_timeout_s)


@dataclass(frozen=True)
class HeartbeatRules:
    """What makes a heartbeat worth writing."""

    #: the longest a heartbeat goes unwritten, in seconds
    period_s: float = HEARTBEAT_WRITE_PERIOD_S
    #: room shrinking by more than these is written at once (compute in %, memory in MiB)
    deadband_compute_pct: float = SHRINK_DEADBAND_COMPUTE_PCT
    deadband_memory_mib: float = SHRINK_DEADBAND_MEMORY_MIB
    #: write every heartbeat (the behaviour before these rules; benchmarks compare)
    every: bool = False
    #: how often heartbeats are offered, in seconds: a write is due one offer early
    offer_period_s: float = OFFER_PERIOD_S
    #: the longest a heartbeat goes unwritten while a scheduler reads the node's
    #: liveness from Redis, in seconds
    relayed_period_s: float = RELAYED_WRITE_PERIOD_S

    @classmethod
    def for_timeout(cls, heartbeat_timeout_s: float) -> HeartbeatRules:
        return cls(period_s=write_period_s(heartbeat_timeout_s))

    @classmethod
    def for_policy(
        cls, heartbeat_timeout_s: float, margin_compute_pct: float, margin_memory_mib: float
    ) -> HeartbeatRules:
        """The rules under a policy: its timeout's period, and deadbands of at most half
        its margins (a policy with no margin has every shrink written at once)."""
        return cls(
            period_s=write_period_s(heartbeat_timeout_s),
            deadband_compute_pct=min(SHRINK_DEADBAND_COMPUTE_PCT, margin_compute_pct / 2),
            deadband_memory_mib=min(SHRINK_DEADBAND_MEMORY_MIB, margin_memory_mib / 2),
        )


def why_write(
    written: Mapping[str, Any] | None,
    payload: Mapping[str, Any],
    age_s: float,
    rules: HeartbeatRules,
    *,
    relayed: bool = False,
) -> str | None:
    """Why ``payload`` must be written, given the heartbeat ``written`` last, ``age_s``
    seconds ago; None when it may wait.  ``relayed``: a scheduler reads the node's
    liveness elsewhere (the write period is ``rules.relayed_period_s``).  Pure."""
    if rules.every:
        return "every heartbeat is written"
    if written is None:
        return "first heartbeat"
    if payload.get("stopping") != written.get("stopping"):
        return "the node is stopping" if payload.get("stopping") else "the node runs again"
    if payload.get("started_at") != written.get("started_at"):
        return "the agent restarted"
    if payload.get("runs_jobs_of") != written.get("runs_jobs_of"):
        return "whose jobs it runs changed"  # submissions are checked against it
    old = {d["index"]: d for d in written.get("devices", [])}
    new = {d["index"]: d for d in payload.get("devices", [])}
    if old.keys() != new.keys():
        return "the devices changed"
    for index, now in new.items():
        was = old[index]
        for key in _STATE_KEYS:
            if now.get(key) != was.get(key):
                return f"device {index}: {key} changed"
        if _taken_compute(now) - _taken_compute(was) > rules.deadband_compute_pct:
            return f"device {index}: compute room shrank"
        if _taken_memory(now) - _taken_memory(was) > rules.deadband_memory_mib:
            return f"device {index}: memory room shrank"
    due = age_s + rules.offer_period_s  # the next offer would come this much later
    if due > rules.period_s and (not relayed or _grew(old, new, rules)):
        return "write period"
    if relayed and due > rules.relayed_period_s:
        return "write period (liveness in Redis)"
    return None


def _grew(
    old: Mapping[int, Mapping[str, Any]],
    new: Mapping[int, Mapping[str, Any]],
    rules: HeartbeatRules,
) -> bool:
    """Whether some device's room grew by more than the deadband since ``old``."""
    for index, now in new.items():
        was = old[index]
        if _taken_compute(was) - _taken_compute(now) > rules.deadband_compute_pct:
            return True
        if _taken_memory(was) - _taken_memory(now) > rules.deadband_memory_mib:
            return True
    return False


def _taken_compute(device: Mapping[str, Any]) -> float:
    return float(device.get("online_compute_pct") or 0.0) + float(
        device.get("reserve_compute_pct") or 0.0
    )


def _taken_memory(device: Mapping[str, Any]) -> float:
    return float(device.get("online_memory_mib") or 0.0) + float(
        device.get("reserve_memory_mib") or 0.0
    )


class HeartbeatStore(Protocol):
    def heartbeat(
        self,
        node: str,
        *,
        started_at: float,
        devices: list[dict[str, Any]],
        stopping: bool = False,
        runs_jobs_of: str | None = None,
    ) -> None: ...


class Toucher(Protocol):
    def touch(self, node: str) -> bool | None: ...


#: What :meth:`HeartbeatWriter.offer` did with a heartbeat.
WRITTEN = "written"
TOUCHED = "touched"


class HeartbeatWriter:
    """Writes one node's heartbeats to the store by :func:`why_write`'s rules, and
    touches its liveness in Redis (``liveness``: :mod:`ebbtide.messaging.liveness`) with
    each.  Store errors propagate (the caller retries); a heartbeat that failed stays
    due."""

    def __init__(
        self,
        node: str,
        store: HeartbeatStore,
        rules: HeartbeatRules | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        liveness: Toucher | None = None,
    ) -> None:
        self.node = node
        self.store = store
        self.rules = rules or HeartbeatRules()
        self._monotonic = monotonic
        self.liveness = liveness
        #: the heartbeat last written, and when (monotonic seconds)
        self.written: Mapping[str, Any] | None = None
        self.written_at = monotonic()
        #: heartbeats written, offered and read by a scheduler from Redis, for figures
        self.writes = 0
        self.offers = 0
        self.relayed = 0

    def offer(self, payload: Mapping[str, Any], *, touch: bool = True) -> str | None:
        """Touch the node's liveness (unless not ``touch``), and write ``payload`` if it
        is due.  ``WRITTEN``: the store took it; ``TOUCHED``: only Redis did, and a
        scheduler reads it there; None: no scheduler has it."""
        self.offers += 1
        read = self.liveness.touch(self.node) if touch and self.liveness is not None else None
        age_s = self._monotonic() - self.written_at
        if why_write(self.written, payload, age_s, self.rules, relayed=bool(read)) is None:
            if read:
                self.relayed += 1
                return TOUCHED
            return None
        self.write(payload)
        return WRITTEN

    def write(self, payload: Mapping[str, Any]) -> None:
        """Write ``payload`` now, whatever the rules say."""
        self.store.heartbeat(
            self.node,
            started_at=payload["started_at"],
            devices=payload["devices"],
            stopping=bool(payload.get("stopping", False)),
            runs_jobs_of=payload.get("runs_jobs_of"),
        )
        self.written = payload
        self.written_at = self._monotonic()
        self.writes += 1
