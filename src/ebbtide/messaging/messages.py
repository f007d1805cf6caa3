"""What crosses between processes: commands to node agents, events to the scheduler, and
what a node agent reports of each device in its heartbeat.

Typed models shared by sender and receiver.  On the wire they are JSON objects with an
``op`` (messages) — receivers validate them, and a message that does not validate is
logged and dropped (messages are hints; the store is the truth).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

__all__ = [
    "AttemptChanged",
    "DeviceReport",
    "EvictAttempt",
    "FaultReport",
    "NodeCommand",
    "StartAttempt",
    "ValidationError",
    "parse_event",
    "parse_node_command",
]


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class StartAttempt(_Message):
    """Scheduler → agent: start ``attempt`` of ``job_id`` (dispatched to this node)."""

    op: Literal["start"] = "start"
    job_id: int
    attempt: int


class EvictAttempt(_Message):
    """Scheduler → agent: take ``attempt``'s slice back within ``deadline_s`` of
    ``spike_at``.  Also what the agent rebuilds from the store's ``evict_requested``
    record when it learns of an eviction before the message arrives."""

    op: Literal["evict"] = "evict"
    job_id: int
    attempt: int
    #: the reason code (``EvictReason``)
    reason: str = "scheduler"
    #: in words a person can act on
    message: str = "evicted by the scheduler"
    #: Unix seconds the decision was taken (None: when the agent gets it)
    spike_at: float | None = None
    #: seconds from ``spike_at`` to the slice being free (None: the job's own)
    deadline_s: float | None = None


NodeCommand = Annotated[StartAttempt | EvictAttempt, Field(discriminator="op")]


class AttemptChanged(_Message):
    """Agent → scheduler: an attempt on ``node`` changed state; plan again."""

    op: Literal["changed"] = "changed"
    job_id: int
    node: str


_NODE_COMMAND: TypeAdapter[StartAttempt | EvictAttempt] = TypeAdapter(NodeCommand)


def parse_node_command(payload: Any) -> StartAttempt | EvictAttempt:
    """A node command from its wire form; raises :class:`ValidationError`."""
    return _NODE_COMMAND.validate_python(payload)


def parse_event(payload: Any) -> AttemptChanged:
    """A scheduler event from its wire form; raises :class:`ValidationError`."""
    return AttemptChanged.model_validate(payload)


# -- heartbeats ---------------------------------------------------------------------------


class FaultReport(_Message):
    """A device fault as a heartbeat carries it."""

    xid: int | None = None
    meaning: str = ""
    recovery_action: str = "unknown"
    lost: bool = False
    #: Unix seconds it was seen
    at: float | None = None


class DeviceReport(_Message):
    """One device in a node agent's heartbeat (stored as the node's ``devices_json``)."""

    index: int
    memory_mib: float
    #: a MIG instance: the index of the GPU it is carved from (``None``: a whole GPU)
    mig_parent: int | None = None
    #: online usage: compute in percent, memory in MiB
    online_compute_pct: float = 0.0
    online_memory_mib: float = 0.0
    #: what ebbtide's own processes use, when the source can tell
    offline_compute_pct: float | None = None
    offline_memory_mib: float | None = None
    #: how online compute was told apart (``ComputeBasis``)
    basis: str | None = None
    #: False: planning-only figures (never an eviction trigger)
    eviction_trigger: bool = True
    #: expected online growth within the deadline, kept back from admission
    reserve_compute_pct: float = 0.0
    reserve_memory_mib: float = 0.0
    #: the reserve is the cold one (the agent is still learning the online load) for
    #: this many more seconds; 0: it is the forecast
    reserve_cold_for_s: float = 0.0
    #: Unix seconds of the sample
    sampled_at: float = 0.0
    #: False: the device did not answer, or its figures are stale (they are the worst case)
    sample_ok: bool = True
    #: Unix seconds a slice was last taken back here (the eviction cooldown counts from it)
    last_eviction_at: float | None = None
    #: ``healthy`` or ``unhealthy``
    health: str = "healthy"
    #: the fault that took it out of service, while unhealthy
    fault: FaultReport | None = None
    #: the last failed health check, in words
    failing: str | None = None
    #: seconds until passing checks return it to service (None: a check is failing)
    healthy_in_s: float | None = None
    #: the last fault seen, disabling or not
    last_fault: FaultReport | None = None
    #: who the online processes on the device are: pods (``namespace/name``, or
    #: ``pod:<uid>/<container>``) and processes in no pod (``pid:<n> (<comm>)``), a few
    online_pods: list[str] = Field(default_factory=list)

    @property
    def unhealthy(self) -> bool:
        return self.health == "unhealthy"
