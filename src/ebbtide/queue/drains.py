"""Admins' drains: nodes and devices that take no new work, and their undrains.

A drain keeps new attempts off a device (or a whole node: device ``-1``); what runs
there goes on.  An undrain returns it to service, and also clears a fault the node agent
holds against the device (the agent reads undrains every heartbeat).  A node's drain and
its devices' own drains are separate decisions: undraining the node lifts the node's
drain only, and a device drained on its own stays drained until it is undrained itself.
Rows are kept, so the last word on each device — who, when, why — stays on record.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from ebbtide.clock import Clock
from ebbtide.queue.engine import reading
from ebbtide.queue.models import DeviceDrain

DRAINS: sa.Table = DeviceDrain.__table__  # type: ignore[attr-defined]

#: The device number that stands for every device of a node.
WHOLE_NODE = -1

DRAINED = "drained"
UNDRAINED = "undrained"


@dataclass(frozen=True)
class Drain:
    node: str
    #: the device index, or :data:`WHOLE_NODE`
    device: int
    by: str
    reason: str
    #: Unix seconds
    at: float

    def describe(self) -> str:
        what = self.node if self.device == WHOLE_NODE else f"{self.node}/{self.device}"
        why = f": {self.reason}" if self.reason else ""
        return f"{what} drained by {self.by}{why}"


class Drains:
    """The ``device_drains`` table."""

    def __init__(self, engine: sa.Engine, clock: Clock) -> None:
        self.engine = engine
        self.clock = clock

    def _set(self, node: str, device: int, state: str, by: str, reason: str) -> None:
        values = {"state": state, "by": by, "reason": reason, "at": self.clock.time()}
        with self.engine.begin() as conn:
            changed = conn.execute(
                DRAINS.update()
                .where(DRAINS.c.node == node, DRAINS.c.device == device)
                .values(**values)
            ).rowcount
            if not changed:
                conn.execute(DRAINS.insert().values(node=node, device=device, **values))

    def drain(self, node: str, device: int, *, by: str, reason: str = "") -> None:
        """Nothing new goes to ``node``/``device`` (:data:`WHOLE_NODE`: any device)."""
        self._set(node, device, DRAINED, by, reason)

    def undrain(self, node: str, device: int, *, by: str) -> None:
        """Back in service: the drain of ``node``/``device`` is lifted, and a fault the
        agent holds is cleared (for :data:`WHOLE_NODE`, on every device of the node).
        For :data:`WHOLE_NODE` only the node's drain is lifted: a device an admin
        drained on its own stays drained."""
        self._set(node, device, UNDRAINED, by, "")

    def drained(self) -> list[Drain]:
        """Every drain in force."""
        stmt = (
            sa.select(DRAINS)
            .where(DRAINS.c.state == DRAINED)
            .order_by(DRAINS.c.node, DRAINS.c.device)
        )
        with reading(self.engine) as conn:
            rows = conn.execute(stmt).mappings().all()
        return [Drain(r["node"], r["device"], r["by"], r["reason"], r["at"]) for r in rows]

    def undrains(self, node: str) -> dict[int, float]:
        """When each device of ``node`` was last undrained (:data:`WHOLE_NODE` included)."""
        stmt = sa.select(DRAINS.c.device, DRAINS.c.at).where(
            DRAINS.c.node == node, DRAINS.c.state == UNDRAINED
        )
        with reading(self.engine) as conn:
            return {int(d): float(at) for d, at in conn.execute(stmt)}
