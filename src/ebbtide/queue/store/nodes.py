"""Nodes and the published policy: node agents' heartbeats, the nodes known, and the
policy the leading scheduler runs with, published for clients to check jobs against."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.models import NodeRow
from ebbtide.queue.store.base import LEADERSHIP, NODES, StoreBase


class NodeMixin(StoreBase):
    """:meth:`heartbeat`, :meth:`nodes`, :meth:`forget_node`, and the published policy."""

    # -- nodes --------------------------------------------------------------------------

    def heartbeat(
        self,
        node: str,
        *,
        started_at: float,
        devices: list[dict[str, Any]],
        stopping: bool = False,
        runs_jobs_of: str | None = None,
    ) -> None:
        now = self.clock.time()
        values = {
            "heartbeat_at": now,
            "devices_json": json.dumps(devices),
            "stopping": stopping,
            "runs_jobs_of": runs_jobs_of,
        }
        with self._tx() as conn:
            result = conn.execute(
                NODES.update().where(NODES.c.name == node).values(started_at=started_at, **values)
            )
            if result.rowcount == 0:
                conn.execute(NODES.insert().values(name=node, started_at=started_at, **values))

    def nodes(self) -> list[NodeRow]:
        """Every node, each with its latest heartbeat: the store's, or the one
        :attr:`liveness` has where that is later."""
        with self._read() as conn:
            rows = conn.execute(sa.select(NODES).order_by(NODES.c.name)).mappings().all()
        seen = self.liveness.seen() if self.liveness is not None else None
        if not seen:
            return [NodeRow(**r) for r in rows]
        out = []
        for r in rows:
            at = seen.get(r["name"])
            if at is not None and at > r["heartbeat_at"]:
                out.append(NodeRow(**{**r, "heartbeat_at": at}))
            else:
                out.append(NodeRow(**r))
        return out

    def forget_node(self, node: str) -> None:
        with self._tx() as conn:
            conn.execute(NODES.delete().where(NODES.c.name == node))
        if self.liveness is not None:
            self.liveness.forget(node)

    # -- the published policy -----------------------------------------------------------

    def publish_policy(self, text: str, source: str) -> None:
        """The leading scheduler's policy (its file's text; "" for the built-in defaults),
        for clients to check jobs against; fenced like every leader's write."""
        with self._tx() as conn:
            conn.execute(
                LEADERSHIP.update()
                .where(LEADERSHIP.c.id == 1)
                .values(policy_text=text, policy_source=source, policy_at=self.clock.time())
            )

    def published_policy(self) -> tuple[str, str, float] | None:
        """``(text, source, published at)`` of the policy the leading scheduler (or the
        last one) runs with; None when no scheduler has published one."""
        stmt = sa.select(
            LEADERSHIP.c.policy_text, LEADERSHIP.c.policy_source, LEADERSHIP.c.policy_at
        ).where(LEADERSHIP.c.id == 1)
        with self._read() as conn:
            row = conn.execute(stmt).first()
        if row is None or row[0] is None:
            return None
        return str(row[0]), str(row[1] or "the scheduler's policy"), float(row[2] or 0.0)
