"""The attempt lifecycle (dispatch to the end of an attempt's process) is the shared
:class:`~ebbtide.queue.lifecycle.attempts.AttemptLogic`; the SQL store reads here what an
eviction request said."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.lifecycle.attempts import AttemptLogic
from ebbtide.queue.states import EventType
from ebbtide.queue.store.base import EVENTS
from ebbtide.queue.store.queries import QueryMixin


class AttemptMixin(QueryMixin, AttemptLogic):
    """From a granted slice to the end of the attempt's process; every report fenced by
    the attempt's number."""

    def eviction_request(self, job_id: int, attempt: int) -> dict[str, Any] | None:
        """What the last ``evict_requested`` of this attempt said (reason, reason code,
        deadline, spike time), or None."""
        stmt = (
            sa.select(EVENTS.c.data_json)
            .where(
                EVENTS.c.job_id == job_id,
                EVENTS.c.attempt == attempt,
                EVENTS.c.type == EventType.EVICT_REQUESTED.value,
            )
            .order_by(EVENTS.c.id.desc())
            .limit(1)
        )
        with self._read() as conn:
            row = conn.execute(stmt).scalar()
        return json.loads(row) if row else None
